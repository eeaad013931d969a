"""Speculative decoding of B sequences at once: `generate_batch` (engine paper Algorithm 1 per
sequence; the cost model at batch size B is `costmodel.batch`).

Each round drafts one k for the whole batch (as vLLM and llama-server run it): every live sequence's
proposal, then one pass of the target that verifies them all (`BatchModel.argmax_parts` /
`extend_parts`: each sequence's last committed token and drafts at its own positions), then each
sequence's own accept walk with its own sampler (seed + i). So each sequence is lossless on its own:
its tokens follow the target's distribution, and under greedy decoding with exact passes (flash
attention and the tiled kernel off, `load(..., exact=True)`) they are its own plain decoding's.

Sequences and slots: sequence i (its prompt's index, its result's) lives in a slot, the sequence id
of its caches in the target (and a batched draft model). A sequence leaves at its EOS or token budget;
the live sequence in the highest slot then moves into the freed one (`BatchModel.move`), so the live
slots stay 0..B'-1 and each pass one ubatch of llama.cpp's.

Invariant per sequence (as `engine.round`): the target's cache of its slot holds s[:L - 1]; the
prefill feeds each prompt but its last token, so every pass verifies k + 1 tokens of every sequence.

The policy prices k at the round's batch size: one policy per live count B (a fixed k is one policy
for all), from k, max_k and step_times ({B: V_B(0..max_k)}, or one V for every B).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from moespec.backends.protocol import GreedyByLogits, output_rows
from moespec.device import peak_rss_bytes
from moespec.engine.decode import _as_prompt, _eos_ids
from moespec.engine.policy import Policy, make_policy
from moespec.engine.proposers import Proposal, Proposer
from moespec.engine.round import Round, greedy_walk, until_eos
from moespec.engine.sampling import Sampler, SamplingConfig
from moespec.engine.stats import BatchStats, GenerationResult, RoundLog

Part = tuple[int, Sequence[int]]


@runtime_checkable
class BatchModel(Protocol):
    """A model holding several sequences' caches, fed together (`backends.llama_batch.LlamaBatch`)."""

    sequences: int
    batch: int  # the most tokens one pass holds
    n_vocab: int
    vocab_limit: int | None
    forward_s: float

    def reset(self) -> None: ...

    def seq_length(self, seq: int) -> int: ...

    def truncate_seq(self, seq: int, n: int) -> None: ...

    def move(self, src: int, dst: int) -> None: ...

    def extend_parts(self, parts: Sequence[Part]) -> list[torch.Tensor]: ...

    def argmax_parts(self, parts: Sequence[Part], limit: int) -> list[list[int]]: ...


def _prefill(model: BatchModel, slot: int, prompt: torch.Tensor) -> None:
    """Every token of `prompt` but its last into `slot`'s cache, in passes of the model's batch (the
    invariant of `engine.round`: each round verifies from the last committed token on)."""
    ids = prompt[:-1].tolist()
    for a in range(0, len(ids), model.batch):
        model.extend_parts([(slot, ids[a: a + model.batch])])


class SlotView(GreedyByLogits):
    """One slot of a BatchModel as a single-sequence SpecModel (the oracle re-decodes its reference
    on it); `slot` follows the sequence when it moves."""

    def __init__(self, model: BatchModel, slot: int):
        self.model, self.slot = model, slot
        self.forward_s = 0.0
        self.vocab_limit = model.vocab_limit

    @property
    def length(self) -> int:
        return self.model.seq_length(self.slot)

    @property
    def width(self) -> int:
        return self.model.n_vocab

    def reset(self) -> None:
        self.model.truncate_seq(self.slot, 0)

    def truncate(self, n: int) -> None:
        self.model.truncate_seq(self.slot, n)

    def extend(self, tokens: torch.Tensor, outputs: int | None = None) -> torch.Tensor:
        ids = torch.as_tensor(tokens).reshape(-1).tolist()
        return self.model.extend_parts([(self.slot, ids)])[0][-output_rows(len(ids), outputs):]

    def identity(self) -> None:
        return None


class BatchDraft:
    """A draft model holding the batch's sequences (a BatchModel, slots as the target's): each draft
    step is one pass over every live sequence."""

    def __init__(self, model: BatchModel):
        self.model = model

    def begin(self, prompts: Sequence[torch.Tensor], views: Sequence[SlotView], max_new_tokens: int,
              samplers: Sequence[Sampler]) -> None:
        """Each prompt but its last token into the draft's slot of its sequence, as the target's prefill."""
        self.model.reset()
        for prompt, view in zip(prompts, views):
            _prefill(self.model, view.slot, prompt)

    def propose(self, live: Sequence[tuple[int, int, torch.Tensor]], k: int,
                samplers: Sequence[Sampler]) -> dict[int, Proposal]:
        """{i: up to k drafts} for live [(i, slot, committed tokens)]: k passes of one token per sequence
        (the first feeds what each slot's cache lacks), greedy or sampled by each sequence's sampler."""
        m, slots = self.model, {slot: i for i, slot, _ in live}
        feed = {slot: ctx[m.seq_length(slot):].tolist() for _, slot, ctx in live}
        drafts = {slot: [] for slot in feed}
        qs = {slot: [] for slot in feed}
        greedy = all(samplers[i].greedy for i in slots.values())
        limit = min(samplers[i].vocab_limit for i in slots.values())
        for _ in range(k):
            parts = list(feed.items())
            if greedy:
                nxt = {slot: rows[-1] for (slot, _), rows in zip(parts, m.argmax_parts(parts, limit))}
            else:
                nxt = {}
                for (slot, _), logits in zip(parts, m.extend_parts(parts)):
                    s = samplers[slots[slot]]
                    q = s.prepare(logits[-1:])
                    nxt[slot] = int(s.sample(q)[0])
                    qs[slot].append(q)
            for slot, x in nxt.items():
                drafts[slot].append(x)
            feed = {slot: [x] for slot, x in nxt.items()}
        return {slots[slot]: Proposal(torch.tensor(d, dtype=torch.long), None if greedy or not d else torch.cat(qs[slot]))
                for slot, d in drafts.items()}

    def commit(self, i: int, slot: int, keep: int) -> None:
        self.model.truncate_seq(slot, keep)

    def move(self, src: int, dst: int) -> None:
        self.model.move(src, dst)


class PerSequence:
    """One `Proposer` per sequence (prompt lookup, the oracle given its reference), each proposing for
    its own sequence on its own slot's view of the target."""

    def __init__(self, proposers: Sequence[Proposer]):
        self.proposers = list(proposers)

    def begin(self, prompts: Sequence[torch.Tensor], views: Sequence[SlotView], max_new_tokens: int,
              samplers: Sequence[Sampler]) -> None:
        for p, prompt, view, sampler in zip(self.proposers, prompts, views, samplers):
            p.begin(target=view, prompt=prompt, max_new_tokens=max_new_tokens, sampler=sampler)

    def propose(self, live: Sequence[tuple[int, int, torch.Tensor]], k: int,
                samplers: Sequence[Sampler]) -> dict[int, Proposal]:
        return {i: self.proposers[i].propose(ctx, k) if k else Proposal(ctx[:0]) for i, _, ctx in live}

    def commit(self, i: int, slot: int, keep: int) -> None:
        self.proposers[i].commit(keep)

    def move(self, src: int, dst: int) -> None:
        """Its proposers keep no cache of their own."""


@dataclass
class _Sequence:
    """One sequence of the batch: its committed tokens seq[:length] (prompt first), its slot, sampler and log."""

    i: int
    seq: torch.Tensor  # [P + max_new_tokens + max_k + 1] int64
    prompt_tokens: int
    length: int
    sampler: Sampler
    log: RoundLog
    view: SlotView
    stop: str | None = None

    @property
    def slot(self) -> int:
        return self.view.slot

    @property
    def new_tokens(self) -> int:
        return self.length - self.prompt_tokens


class _Policies:
    """The policy of each batch size: one for all when k is fixed, else one per live count, each
    seeded by its own step times."""

    def __init__(self, k, max_k: int, step_times):
        self.k, self.max_k, self.step_times = k, max_k, step_times
        self.by_size: dict[int, Policy] = {}
        self._shared = None if k == "auto" else make_policy(k, max_k)

    def at(self, B: int) -> Policy:
        if self._shared is not None:
            return self._shared
        if B not in self.by_size:
            V = self.step_times.get(B) if isinstance(self.step_times, Mapping) else self.step_times
            self.by_size[B] = make_policy("auto", self.max_k, V)
        return self.by_size[B]

    @property
    def max_draft(self) -> int:
        return (self._shared or make_policy("auto", self.max_k)).max_k

    def state(self) -> dict:
        if self._shared is not None:
            return self._shared.state()
        return {"policy": "auto per batch size", "by_size": {str(B): p.state() for B, p in sorted(self.by_size.items())}}


def _batch_proposer(draft, B: int):
    """The batch's proposer: None, a BatchDraft for a model holding >= B sequences, PerSequence for a
    list of B proposers or one prompt lookup shared by all (it keeps no state)."""
    from moespec.engine.proposers import PromptLookup

    if draft is None:
        return None
    if isinstance(draft, BatchModel):
        if draft.sequences < B:
            raise ValueError(f"the draft model holds {draft.sequences} sequences, the batch {B}; load it with "
                             f"sequences={B}")
        return BatchDraft(draft)
    if isinstance(draft, PromptLookup):
        return PerSequence([draft] * B)
    if isinstance(draft, Sequence) and len(draft) == B and all(isinstance(p, Proposer) for p in draft):
        return PerSequence(draft)
    raise TypeError(f"draft must be None, a model loaded with sequences >= {B}, a PromptLookup, or a list of {B} "
                    f"proposers (one per prompt, e.g. OracleDraft with its reference); got {type(draft).__name__}")


def _check_target(target, B: int) -> BatchModel:
    if not isinstance(target, BatchModel):
        raise TypeError(f"generate_batch decodes on a model holding several sequences' caches: load the GGUF file "
                        f"with moespec.models.load(path, backend='llama.cpp', sequences={B}); got "
                        f"{type(target).__name__} (on torch, decode each prompt with generate)")
    if target.sequences < B:
        raise ValueError(f"the target holds {target.sequences} sequences, the batch {B}; load it with sequences={B}")
    return target


def generate_batch(target, prompts: Sequence[Sequence[int]], *, draft=None, k: int | str = 4, max_k: int = 8,
                   step_times: Sequence[float] | Mapping[int, Sequence[float]] | None = None, temperature: float = 0.0,
                   top_k: int | None = None, top_p: float | None = None, max_new_tokens: int = 128,
                   eos_token_id: int | Sequence[int] | None = None, seed: int = 0,
                   vocab_limit: int | None = None) -> list[GenerationResult]:
    """Lossless speculative decoding of B prompts at once on `target`, a model holding >= B sequences
    (`load(path, backend="llama.cpp", sequences=B)`); one result per prompt, in order, each with the
    batch's figures (`GenerationResult.batch`).

    draft: None (plain batched decoding), a draft model holding >= B sequences, a PromptLookup, or B
    proposers (OracleDraft given its reference). k: one draft length per round for the batch (0 =
    plain), or "auto": per round the k with the most expected tokens per second at the round's batch
    size (`policy.AutoK`, one per batch size; step_times: {B: V_B} or one V). Sampling as `generate`,
    sequence i with seed + i; max_new_tokens and eos_token_id per sequence. The torch backend decodes
    one sequence at a time (`generate`).
    """
    if not prompts:
        raise ValueError("generate_batch needs at least one prompt")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    B = len(prompts)
    model = _check_target(target, B)
    policies = _Policies(k, max_k, step_times)
    proposer = _batch_proposer(draft, B) if policies.max_draft > 0 and k != 0 else None
    config = SamplingConfig(temperature=float(temperature), top_k=top_k, top_p=top_p)
    limit = vocab_limit or model.vocab_limit or model.n_vocab
    if proposer is not None and isinstance(proposer, BatchDraft):
        limit = min(limit, proposer.model.vocab_limit or proposer.model.n_vocab)
    model.reset()
    seqs = [_sequence(i, _as_prompt(p), model, config, limit, seed, max_new_tokens, policies.max_draft)
            for i, p in enumerate(prompts)]
    for s in seqs:
        _prefill(model, s.slot, s.seq[: s.length])
    if proposer is not None:
        proposer.begin([s.seq[: s.length] for s in seqs], [s.view for s in seqs], max_new_tokens,
                       [s.sampler for s in seqs])
    return _decode_batch(model, proposer, policies, seqs, max_new_tokens=max_new_tokens, eos=_eos_ids(eos_token_id),
                         limit=limit, clock=time.perf_counter)


def _sequence(i: int, prompt: torch.Tensor, model: BatchModel, config: SamplingConfig, limit: int, seed: int,
              max_new_tokens: int, max_k: int) -> _Sequence:
    P = prompt.shape[0]
    seq = torch.empty(P + max_new_tokens + max_k + 1, dtype=torch.long)
    seq[:P] = prompt
    sampler = Sampler(config, width=model.n_vocab, vocab_limit=limit, seed=seed + i)
    return _Sequence(i, seq, P, P, sampler, RoundLog(max_k, start=0.0), SlotView(model, i))


def _decode_batch(model: BatchModel, proposer, policies: _Policies, seqs: list[_Sequence], *, max_new_tokens: int,
                  eos: set[int], limit: int, clock: Callable[[], float]) -> list[GenerationResult]:
    """Rounds until every sequence has its tokens or its EOS (module docstring)."""
    start = clock()
    for s in seqs:
        s.log.start = start
    live = list(seqs)
    ks, lives, round_s = [], [], []
    while live:
        policy = policies.at(len(live))
        chosen = policy.choose()
        k = min(chosen, *(max_new_tokens - s.new_tokens - 1 for s in live))  # never past a sequence's budget
        t0 = clock()
        rounds = _batch_round(model, proposer, live, k, chosen, eos, limit, clock)
        now = clock()
        ks.append(chosen)
        lives.append(len(live))
        round_s.append(now - t0)
        for n, (s, r) in enumerate(zip(live, rounds)):
            s.log.add(r, now)
            policy.update(drafted=r.drafted, accepted=r.accepted, tested=r.tested, seconds=r.seconds if n == 0 else None)
            if r.eos or s.new_tokens >= max_new_tokens:
                s.stop = "eos" if r.eos else "max_new_tokens"
        live = _compact(model, proposer, live)
    total_s = clock() - start
    batch = BatchStats(sequences=len(seqs), new_tokens=sum(s.new_tokens for s in seqs), total_s=total_s,
                       k_per_round=tuple(ks), live_per_round=tuple(lives), round_s=tuple(round_s),
                       policy=policies.state())
    rss = peak_rss_bytes()
    return [GenerationResult(tokens=s.seq[s.prompt_tokens: s.length].tolist(), batch=batch, stats=s.log.stats(
        prompt_tokens=s.prompt_tokens, stop_reason=s.stop or "max_new_tokens", total_s=total_s,
        target_forward_s=model.forward_s, draft_forward_s=0.0, peak_rss_bytes=rss, policy=batch.policy))
        for s in seqs]


def _batch_round(model: BatchModel, proposer, live: list[_Sequence], k: int, chosen: int, eos: set[int], limit: int,
                 clock: Callable[[], float]) -> list[Round]:
    """One round of the batch: propose for every live sequence, verify all in one pass, run each
    sequence's accept walk, commit, roll back; one Round per live sequence (the times are the batch's)."""
    t0 = clock()
    samplers = {s.i: s.sampler for s in live}
    if proposer is not None and k > 0:
        proposals = proposer.propose([(s.i, s.slot, s.seq[: s.length]) for s in live], k, samplers)
    else:
        proposals = {s.i: Proposal(s.seq[:0]) for s in live}
    t1 = clock()
    parts = [(s.slot, [int(s.seq[s.length - 1]), *proposals[s.i].tokens.tolist()]) for s in live]
    greedy = all(s.sampler.greedy for s in live)
    rows = model.argmax_parts(parts, limit) if greedy else model.extend_parts(parts)
    t2 = clock()
    walks = []
    for s, row in zip(live, rows):
        p = proposals[s.i]
        if greedy:
            accepted, token = greedy_walk(row, p.tokens.tolist())
        else:
            accepted, token = s.sampler.verify(s.sampler.prepare(row, position=s.length), p.tokens, p.q)
        if p.marked_from is not None and p.marked_from < accepted:  # the oracle's drafts from the mark on
            accepted, token = p.marked_from, int(p.tokens[p.marked_from])
        walks.append((accepted, token))
    t3 = clock()
    return [_commit(model, proposer, s, proposals[s.i], accepted, token, chosen, eos, (t1 - t0, t2 - t1, t3 - t2, t0),
                    clock) for s, (accepted, token) in zip(live, walks)]


def _commit(model: BatchModel, proposer, s: _Sequence, proposal: Proposal, accepted: int, token: int, chosen: int,
            eos: set[int], times: tuple, clock) -> Round:
    """Write sequence s's accepted drafts and next token, stop at an EOS, roll both caches back."""
    drafts, L = proposal.tokens, s.length
    s.seq[L: L + accepted] = drafts[:accepted]
    s.seq[L + accepted] = token
    new = accepted + 1
    hit = until_eos(s.seq[L: L + new].tolist(), eos) if eos else None
    if hit is not None:
        new, accepted = hit + 1, min(accepted, hit)
    s.length = L + new
    model.truncate_seq(s.slot, s.length - 1)
    if proposer is not None:
        proposer.commit(s.i, s.slot, L + accepted)
    draft_s, verify_s, sampling_s, t0 = times
    n = drafts.shape[0]
    return Round(chosen=chosen, drafted=n, tested=min(accepted + 1, n), accepted=accepted, new_tokens=new,
                 eos=hit is not None, timed=True, draft_s=draft_s, verify_s=verify_s, sampling_s=sampling_s,
                 seconds=clock() - t0)


def _compact(model: BatchModel, proposer, live: list[_Sequence]) -> list[_Sequence]:
    """The sequences still live, each finished one's slot taken by the live one in the highest slot."""
    still = [s for s in live if s.stop is None]
    for gone in sorted((s for s in live if s.stop is not None), key=lambda s: s.slot):
        highest = max(still, key=lambda s: s.slot, default=None)
        if highest is None or highest.slot < gone.slot:
            continue
        model.move(highest.slot, gone.slot)
        if proposer is not None:
            proposer.move(highest.slot, gone.slot)
        highest.view.slot, gone.view.slot = gone.slot, highest.slot
    return sorted(still, key=lambda s: s.slot)
