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
for all), from k, max_k and step_times ({B: V_B(0..max_k)}, or one V for every B); under k="auto"
a live count step_times leaves unseeded starts from the step-time store (`engine.batch_warm_start`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import torch

from moespec.backends.protocol import BatchModel, NoMaximum
from moespec.device import peak_rss_bytes
from moespec.engine.batch_proposers import BatchProposer, SlotView, batch_proposer, prefill_slot
from moespec.engine.batch_warm_start import BatchWarmStart, resolve_batch_mode
from moespec.engine.decode import PLAIN_RUN_MIN, as_prompt, eos_ids
from moespec.engine.policy import Policy, make_policy, record_plain_run
from moespec.engine.proposers import Proposal
from moespec.engine.round import Round, greedy_walk, until_eos
from moespec.engine.sampling import Sampler, SamplingConfig
from moespec.engine.stats import BatchStats, GenerationResult, RoundLog
from moespec.engine.step_store import store_key


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
    seeded by its own step times, else by the warm start (`engine.batch_warm_start`) where given."""

    def __init__(self, k, max_k: int, step_times, warm: BatchWarmStart | None = None):
        self.k, self.max_k, self.step_times, self.warm = k, max_k, step_times, warm
        self.by_size: dict[int, Policy] = {}
        self._shared = None if k == "auto" else make_policy(k, max_k)

    def at(self, B: int) -> Policy:
        if self._shared is not None:
            return self._shared
        if B not in self.by_size:
            V = self.step_times.get(B) if isinstance(self.step_times, Mapping) else self.step_times
            policy = make_policy("auto", self.max_k, V)
            if self.warm is not None and policy.wants_seed:
                seed = self.warm.seed(B, self.by_size)
                policy.start(V=seed.V, anchors=seed.anchors, acceptance=seed.acceptance)
            self.by_size[B] = policy
        return self.by_size[B]

    @property
    def auto(self) -> bool:
        """One AutoK per live count (k="auto"), which probes drafting while plain decoding is its choice."""
        return self._shared is None

    @property
    def max_draft(self) -> int:
        return (self._shared or make_policy("auto", self.max_k)).max_k

    def remember(self) -> None:
        """What each warm-started live count measured, into the store (after the call's time)."""
        if self.warm is not None:
            self.warm.remember(self.by_size)

    def state(self) -> dict:
        if self._shared is not None:
            return self._shared.state()
        state = {"policy": "auto per batch size", "by_size": {str(B): p.state() for B, p in sorted(self.by_size.items())}}
        if self.warm is not None:
            state["warm_start"] = self.warm.state()
        return state


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
                   vocab_limit: int | None = None, warm_start: bool | str = True) -> list[GenerationResult]:
    """Lossless speculative decoding of B prompts at once on `target`, a model holding >= B sequences
    (`load(path, backend="llama.cpp", sequences=B)`); one result per prompt, in order, each with the
    batch's figures (`GenerationResult.batch`).

    draft: None (plain batched decoding), a draft model holding >= B sequences, a PromptLookup, or B
    proposers (OracleDraft given its reference). k: one draft length per round for the batch (0 =
    plain), or "auto": per round the k with the most expected tokens per second at the round's batch
    size (`policy.AutoK`, one per batch size; step_times: {B: V_B} or one V). Sampling as `generate`,
    sequence i with seed + i; max_new_tokens and eos_token_id per sequence. The torch backend decodes
    one sequence at a time (`generate`).
    warm_start: for k="auto", True or "store" seeds each live count's AutoK that step_times leaves
    unseeded from the step-time store (`engine.batch_warm_start`: that count's entry, else the other
    counts' and this call's, by the rule stated there) and writes what each measured back; False: none,
    each live count opens cold. `batch.policy["warm_start"]` gives each count's seed.
    """
    if not prompts:
        raise ValueError("generate_batch needs at least one prompt")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    B = len(prompts)
    model = _check_target(target, B)
    mode = resolve_batch_mode(warm_start)
    policies = _Policies(k, max_k, step_times)
    proposer = batch_proposer(draft, B) if policies.max_draft > 0 and k != 0 else None
    key = store_key(model, proposer) if mode == "store" and k == "auto" and proposer is not None else None
    policies.warm = None if key is None else BatchWarmStart(key, range(1, B + 1), max_k)
    config = SamplingConfig(temperature=float(temperature), top_k=top_k, top_p=top_p)
    limit = vocab_limit or model.vocab_limit or model.n_vocab
    if proposer is not None and proposer.vocab_limit is not None:
        limit = min(limit, proposer.vocab_limit)
    model.reset()
    seqs = [_sequence(i, as_prompt(p), model, config, limit, seed, max_new_tokens, policies.max_draft)
            for i, p in enumerate(prompts)]
    for s in seqs:
        prefill_slot(model, s.slot, s.seq[: s.length])
    if proposer is not None:
        proposer.begin([s.seq[: s.length] for s in seqs], [s.view for s in seqs], max_new_tokens,
                       [s.sampler for s in seqs])
    return _decode_batch(model, proposer, policies, seqs, max_new_tokens=max_new_tokens, eos=eos_ids(eos_token_id),
                         limit=limit, clock=time.perf_counter)


def _sequence(i: int, prompt: torch.Tensor, model: BatchModel, config: SamplingConfig, limit: int, seed: int,
              max_new_tokens: int, max_k: int) -> _Sequence:
    P = prompt.shape[0]
    seq = torch.empty(P + max_new_tokens + max_k + 1, dtype=torch.long)
    seq[:P] = prompt
    sampler = Sampler(config, width=model.n_vocab, vocab_limit=limit, seed=seed + i)
    return _Sequence(i, seq, P, P, sampler, RoundLog(max_k, start=0.0), SlotView(model, i))


def _decode_batch(model: BatchModel, proposer: BatchProposer | None, policies: _Policies, seqs: list[_Sequence], *,
                  max_new_tokens: int, eos: set[int], limit: int, clock: Callable[[], float]) -> list[GenerationResult]:
    """Rounds until every sequence has its tokens or its EOS (module docstring)."""
    start = clock()
    for s in seqs:
        s.log.start = start
    live = list(seqs)
    ks, lives, round_s, pass_s = [], [], [], []
    while live:
        policy = policies.at(len(live))
        if proposer is not None and policies.auto:  # a probe's cost includes the draft's catch-up (`AutoK`)
            policy.catch_up_s = proposer.catch_up_s([(s.i, s.slot, s.seq[: s.length]) for s in live])
        plain = _plain_run(model, policy, live, max_new_tokens)
        if plain:
            for step_s in _plain_rounds(model, policy, live, plain, eos, limit, max_new_tokens, clock):
                ks.append(0)
                lives.append(len(live))
                round_s.append(step_s)
                pass_s.append(step_s)
            live = _compact(model, proposer, live)
            continue
        chosen = policy.choose()
        k = min(chosen, *(max_new_tokens - s.new_tokens - 1 for s in live))  # never past a sequence's budget
        t0 = clock()
        rounds = _batch_round(model, proposer, live, k, chosen, eos, limit, clock)
        now = clock()
        ks.append(chosen)
        lives.append(len(live))
        round_s.append(now - t0)
        pass_s.append(rounds[0].verify_s)
        filled = proposer.filled_s if proposer is not None and k else 0.0  # priced apart: not a drafting step
        for n, (s, r) in enumerate(zip(live, rounds)):
            s.log.add(r, now)
            policy.update(drafted=r.drafted, accepted=r.accepted, tested=r.tested,
                          seconds=r.seconds - filled if n == 0 else None)
            if r.eos or s.new_tokens >= max_new_tokens:
                s.stop = "eos" if r.eos else "max_new_tokens"
        live = _compact(model, proposer, live)
    total_s = clock() - start
    policies.remember()  # after the decode's time: the store's write is for the next call
    batch = BatchStats(sequences=len(seqs), new_tokens=sum(s.new_tokens for s in seqs), total_s=total_s,
                       k_per_round=tuple(ks), live_per_round=tuple(lives), round_s=tuple(round_s),
                       policy=policies.state(), pass_s=tuple(pass_s))
    rss = peak_rss_bytes()
    return [GenerationResult(tokens=s.seq[s.prompt_tokens: s.length].tolist(), batch=batch, stats=s.log.stats(
        prompt_tokens=s.prompt_tokens, stop_reason=s.stop or "max_new_tokens", total_s=total_s,
        target_forward_s=model.forward_s, draft_forward_s=0.0, peak_rss_bytes=rss, policy=batch.policy))
        for s in seqs]


def _plain_run(model: BatchModel, policy: Policy, live: list[_Sequence], max_new_tokens: int) -> int:
    """How many plain rounds to run in one compiled call (`LlamaBatch.batch_greedy_steps`): the policy's
    plain run cut to every live sequence's budget, when all are greedy and the model runs them that
    way (`compiled_steps`); 0 for a normal round."""
    if not model.compiled_steps:
        return 0
    if not all(s.sampler.greedy for s in live):
        return 0
    run = min(policy.plain_run(), *(max_new_tokens - s.new_tokens for s in live))
    return run if run >= PLAIN_RUN_MIN else 0


def _plain_rounds(model: BatchModel, policy: Policy, live: list[_Sequence], run: int, eos: set[int], limit: int,
                  max_new_tokens: int, clock: Callable[[], float]) -> list[float]:
    """Up to `run` plain greedy rounds of every live sequence in one compiled call; each sequence commits
    its token of each round (a proposer sees none of them, as `engine.round.plain_rounds`). Returns
    each round's seconds."""
    start = clock()
    try:
        produced, seconds = model.batch_greedy_steps([(s.slot, int(s.seq[s.length - 1])) for s in live], run, limit,
                                                     eos)
    except NoMaximum as e:
        raise ValueError(f"plain round {e.row} of a batch: {e.what} in a row of the target's logits") from None
    ends = list(accumulate(seconds, initial=start))[1:]
    for n, s in enumerate(live):
        got = produced[:, n]
        s.seq[s.length: s.length + len(got)] = torch.from_numpy(got.astype(np.int64))
        taken = []  # the rounds this sequence took, as the policy's update reads them
        for token, step_s, end in zip(got.tolist(), seconds, ends):
            s.length += 1
            r = Round(chosen=0, drafted=0, tested=0, accepted=0, new_tokens=1, eos=token in eos, timed=True,
                      draft_s=0.0, verify_s=step_s, sampling_s=0.0, seconds=step_s)
            s.log.add(r, end)
            taken.append(step_s if n == 0 else None)
            if r.eos or s.new_tokens >= max_new_tokens:
                s.stop = "eos" if r.eos else "max_new_tokens"
                break
        record_plain_run(policy, taken)
    return seconds


def _batch_round(model: BatchModel, proposer: BatchProposer | None, live: list[_Sequence], k: int, chosen: int,
                 eos: set[int], limit: int, clock: Callable[[], float]) -> list[Round]:
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
        walks.append(p.settle(accepted, token))  # the oracle's mark or verdict (`Proposal.settle`)
    t3 = clock()
    return [_commit(model, proposer, s, proposals[s.i], accepted, token, chosen, eos, (t1 - t0, t2 - t1, t3 - t2, t0),
                    clock) for s, (accepted, token) in zip(live, walks)]


def _commit(model: BatchModel, proposer: BatchProposer | None, s: _Sequence, proposal: Proposal, accepted: int,
            token: int, chosen: int, eos: set[int], times: tuple, clock) -> Round:
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


def _compact(model: BatchModel, proposer: BatchProposer | None, live: list[_Sequence]) -> list[_Sequence]:
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
