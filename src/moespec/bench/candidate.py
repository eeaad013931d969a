"""A candidate draft on the user's prompts: its acceptance by position and its own cost h(k) (issue 50).

A candidate is any `Proposer` (a draft model as `DraftModel`, `PromptLookup`, llama.cpp's n-gram
drafters in `engine.ngram`, the oracle). On the calibration half of the prompts:

- `measure_acceptance`: decoding that is not timed, at the fixed draft length kmax, through the
  engine's own `generate`; each call's rounds give the counts by position (`positional.counts_from_rounds`).
- `measure_draft_cost`: h(k) for k = 0..kmax on this machine, through `bench.timing.measure`: the
  proposer's round at k (`propose` and `commit`) from the state a round starts in, without and with
  one token of catch-up (a draft model feeds the last accepted token after a round that accepted
  every draft); `expected_draft_cost` weights the two by the chance that a round at k accepted all.

Also what comes before anything is timed: the prompts file (`read_prompts`, `encode_prompts`,
`split_prompts`) and the refusals of a draft file (`check_draft_file`, `check_vocabulary`).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from moespec.backends.llama_lib import check_gguf
from moespec.bench import timing
from moespec.costmodel.positional import (
    PositionalAcceptance,
    counts_from_rounds,
    offered_from_rounds,
    pooled,
)
from moespec.engine.decode import generate
from moespec.engine.proposers import Proposer
from moespec.engine.sampling import Sampler, SamplingConfig
from moespec.backends.gguf_header import read_metadata

TOKENS_KEY = "tokenizer.ggml.tokens"  # the GGUF metadata key of the vocabulary, one string per id
# llama.cpp's pairing rule (common/speculative.cpp, common_speculative_are_compatible): sizes within
# 128 ids, token texts equal from id 5 up, the same tokenizer model and the same BOS/EOS handling
VOCAB_MAX_SIZE_DIFFERENCE, VOCAB_CHECK_START_TOKEN_ID = 128, 5
SPECIAL_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token")


def read_prompts(path: str | Path) -> list:
    """The prompts of `path`: one per non-empty line, or, in a JSONL file (first line starts with "[" or
    "{"), per line a chat: a list of {"role", "content"} messages or {"messages": [...]}."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"prompts file {path} does not exist; give a file with one prompt per line")
    lines = [line for line in path.read_text("utf-8").splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"prompts file {path} is empty; put one prompt per line (or one JSON chat per line)")
    if lines[0].lstrip()[:1] not in ("[", "{"):
        return lines
    return [chat_messages(path, n, line) for n, line in enumerate(lines, 1)]


def chat_messages(path: Path, n: int, line: str) -> list[dict]:
    """Line n of a JSONL prompts file as a list of chat messages; ValueError naming the line otherwise."""
    try:
        chat = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} line {n} is not JSON ({e.msg}); write one chat per line") from None
    messages = chat.get("messages") if isinstance(chat, dict) else chat
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and {"role", "content"} <= m.keys() for m in messages):
        raise ValueError(f"{path} line {n} holds no chat: give a list of {{\"role\", \"content\"}} messages "
                         "or {\"messages\": [...]}")
    return messages


def encode_prompts(tokenizer, prompts: Sequence) -> list[list[int]]:
    """Token ids of each prompt: a text through `tokenizer.encode`, a chat through its chat template."""
    out = []
    for p in prompts:
        if isinstance(p, str):
            out.append([int(i) for i in tokenizer.encode(p)])
            continue
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(f"{tokenizer!r} has no chat template for the JSONL chats; "
                             "give plain prompts, one per line")
        ids = tokenizer.apply_chat_template(p, add_generation_prompt=True)
        out.append([int(i) for i in (ids if isinstance(ids, list) else ids["input_ids"])])
    return out


def split_prompts(prompts: Sequence) -> tuple[list, list]:
    """(calibration, held_out): the prompts ordered by the SHA-256 of their JSON, the first ceil(n/2)
    calibrate; each half keeps the file's order. The same prompts split the same way in any order."""
    if len(prompts) < 2:
        raise ValueError(f"{len(prompts)} prompt(s) cannot be split into a calibration and a held-out half; "
                         "give at least 2")
    digest = lambda i: hashlib.sha256(json.dumps(prompts[i], sort_keys=True).encode()).hexdigest()  # noqa: E731
    first = set(sorted(range(len(prompts)), key=lambda i: (digest(i), i))[: (len(prompts) + 1) // 2])
    return ([p for i, p in enumerate(prompts) if i in first], [p for i, p in enumerate(prompts) if i not in first])


def check_draft_file(path: str | Path) -> Path:
    """The draft's path, after a one-line ValueError unless it is a GGUF file."""
    return check_gguf(path)


PAIRING_KEYS = (TOKENS_KEY,) + SPECIAL_KEYS + tuple(f"tokenizer.ggml.{s}_token_id" for s in ("bos", "eos"))


def pairing_metadata(path: str | Path) -> dict:
    """The keys llama.cpp's pairing rule reads, from the file's metadata alone (no weights, no mapping)."""
    found = read_metadata(path, PAIRING_KEYS)
    if TOKENS_KEY not in found:
        raise ValueError(f"{path} has no {TOKENS_KEY} in its metadata; convert it again with its tokenizer")
    return found


def vocabulary_difference(target: str | Path, draft: str | Path) -> str | None:
    """Why llama.cpp would refuse to pair the two GGUF files (its rule, read from their metadata), or None.

    A setting only one file states is not compared (llama.cpp would fill the other from its defaults)."""
    mt, md = pairing_metadata(target), pairing_metadata(draft)
    t, d = mt[TOKENS_KEY], md[TOKENS_KEY]
    if abs(len(t) - len(d)) > VOCAB_MAX_SIZE_DIFFERENCE:
        return f"{len(d)} tokens against the target's {len(t)}, more than {VOCAB_MAX_SIZE_DIFFERENCE} apart"
    where = next((i for i in range(VOCAB_CHECK_START_TOKEN_ID, min(len(t), len(d))) if t[i] != d[i]), None)
    if where is not None:
        return f"id {where} is {d[where]!r} in the draft, {t[where]!r} in the target"
    keys = list(SPECIAL_KEYS)
    for special in ("bos", "eos"):  # its id matters only where the target adds it
        if mt.get(f"tokenizer.ggml.add_{special}_token"):
            keys.append(f"tokenizer.ggml.{special}_token_id")
    for key in keys:
        a, b = mt.get(key), md.get(key)
        if a is not None and b is not None and a != b:
            return f"{key} is {b!r} in the draft, {a!r} in the target"
    return None


def check_vocabulary(target: str | Path, draft: str | Path) -> None:
    """A one-line ValueError, before anything is timed, unless llama.cpp would pair the two GGUF files."""
    check_draft_file(draft)
    why = vocabulary_difference(check_gguf(target), draft)
    if why is not None:
        raise ValueError(f"draft {draft} does not share the vocabulary of target {target} ({why}); "
                         "pair a draft made with the target's tokenizer")


@dataclass(frozen=True)
class CandidateAcceptance:
    """A candidate's acceptance by position on some prompts: counts pooled over them, and how they were
    made; by_prompt: each prompt's own counts (the answer's band resamples them), () where not kept.
    at_k: [kmax] the pooled counts of the runs at each draft length k = 1..kmax (at_k[k - 1], the last
    `acceptance` itself), at_k_by_prompt: [kmax][prompts] each prompt's; () where not measured. A round
    at k meets other contexts than one at kmax (a run at k = 1 tests a copy that holds token by token,
    one at kmax tests it once), so E(k) is read from the run at k (`costmodel.positional.answer`)."""

    candidate: dict  # the proposer's identity()
    acceptance: PositionalAcceptance
    prompts: int
    new_tokens: int
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float | None = None
    by_prompt: tuple[PositionalAcceptance, ...] = ()
    at_k: tuple[PositionalAcceptance, ...] = ()
    at_k_by_prompt: tuple[tuple[PositionalAcceptance, ...], ...] = ()

    def to_dict(self) -> dict:
        return {"candidate": self.candidate, "acceptance": self.acceptance.to_dict(), "prompts": self.prompts,
                "new_tokens": self.new_tokens, "max_new_tokens": self.max_new_tokens,
                "temperature": self.temperature, "top_p": self.top_p,
                "by_prompt": [{"at_risk": list(p.at_risk), "accepted": list(p.accepted)} for p in self.by_prompt],
                "at_k": [c.to_dict() for c in self.at_k],
                "at_k_by_prompt": [[c.to_dict() for c in row] for row in self.at_k_by_prompt]}

    @classmethod
    def from_dict(cls, d: dict) -> "CandidateAcceptance":
        parts = tuple(PositionalAcceptance(tuple(p["at_risk"]), tuple(p["accepted"])) for p in d.get("by_prompt", ()))
        at_k = tuple(PositionalAcceptance.from_dict(c) for c in d.get("at_k", ()))
        rows = tuple(tuple(PositionalAcceptance.from_dict(c) for c in row) for row in d.get("at_k_by_prompt", ()))
        return cls(**{**d, "acceptance": PositionalAcceptance.from_dict(d["acceptance"]), "by_prompt": parts,
                      "at_k": at_k, "at_k_by_prompt": rows})


def measure_acceptance(target, proposer: Proposer | Callable[[], Proposer], prompts: Sequence[Sequence[int]], *,
                       kmax: int, max_new_tokens: int = 64, temperature: float = 0.0, top_p: float | None = None,
                       seed: int = 0, eos_token_id=None, vocab_limit: int | None = None,
                       texts: list | None = None, at_k: Callable[[int], Proposer] | None = None) -> CandidateAcceptance:
    """The proposer's acceptance by position at draft length kmax on `prompts` ([P_i] ids each), from
    untimed `generate` calls (greedy by default; temperature/top-p otherwise, prompt i seeded seed + i),
    with the rounds that offered each position and those whose proposal reached it (s_j).
    proposer: one Proposer for every prompt (an n-gram pool then carries across them), or a function
    that makes a fresh one for each prompt.
    texts: a list that receives (prompt, its continuation) per prompt (`draft_confidence` reads them).
    at_k: a function making a fresh proposer at draft length k: the prompts are decoded at every
    k = 1..kmax - 1 as well, each run counted (`CandidateAcceptance.at_k`)."""
    if kmax < 1:
        raise ValueError(f"kmax = {kmax}: the acceptance by position needs a draft length >= 1")
    if not prompts:
        raise ValueError("no prompts to measure the acceptance on; give at least one")
    fresh = proposer if callable(proposer) and not hasattr(proposer, "propose") else lambda: proposer
    run = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
               eos_token_id=eos_token_id, vocab_limit=vocab_limit)
    parts, new_tokens, draft = decoded_counts(target, fresh, prompts, k=kmax, texts=texts, **run)
    rows = [decoded_counts(target, lambda k=k: at_k(k), prompts, k=k, **run)[0] for k in range(1, kmax)] + [parts] \
        if at_k is not None else []
    return CandidateAcceptance(candidate=draft.identity() or {"proposer": type(draft).__name__},
                               acceptance=pooled(parts), prompts=len(prompts), new_tokens=new_tokens,
                               max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                               by_prompt=tuple(PositionalAcceptance(p.at_risk, p.accepted) for p in parts),
                               at_k=tuple(pooled(row) for row in rows), at_k_by_prompt=tuple(map(tuple, rows)))


def decoded_counts(target, fresh: Callable[[], Proposer], prompts: Sequence[Sequence[int]], *, k: int,
                   max_new_tokens: int, seed: int, texts: list | None = None,
                   **sampling) -> tuple[list[PositionalAcceptance], int, Proposer]:
    """([prompts] each prompt's counts at draft length k, new tokens in all, the last proposer) from an
    untimed `generate` call per prompt at k, a fresh proposer each, prompt i seeded seed + i."""
    parts, new_tokens, draft = [], 0, None
    for i, prompt in enumerate(prompts):
        draft = fresh()
        out = generate(target, prompt, draft=draft, k=k, max_new_tokens=max_new_tokens, seed=seed + i, **sampling)
        s = out.stats
        if texts is not None:
            texts.append((list(prompt), list(out.tokens)))
        rounds = dict(max_new_tokens=max_new_tokens, kmax=k)
        parts.append(PositionalAcceptance(*counts_from_rounds(s.tokens_per_round, s.k_per_round, **rounds),
                                          offered=offered_from_rounds(s.k_per_round, s.tokens_per_round, **rounds),
                                          drafted=tuple(s.drafted_by_position[:k])))
        new_tokens += s.new_tokens
    return parts, new_tokens, draft


def draft_confidence(draft, texts: Sequence[tuple[Sequence[int], Sequence[int]]],
                     vocab_limit: int | None = None) -> tuple[list[float], list[bool]]:
    """For every token of each greedy continuation in `texts` [(prompt, continuation)]: the draft
    model's top-token probability given the text before it, and whether its top token is that token
    (where a verify pass tests a greedy draft token, the text before it is committed, and the draft is
    accepted exactly then). One teacher-forced pass of the draft per text; `costmodel.confidence`
    turns the pairs into llama.cpp's p-min."""
    from moespec.backends.protocol import as_spec_model

    draft = as_spec_model(draft)
    probability, accepted = [], []
    for prompt, continuation in texts:
        if not continuation:
            continue
        ids = [*prompt, *continuation]
        draft.reset()
        rows = draft.extend(torch.tensor(ids[:-1]), outputs=len(continuation))[:, :vocab_limit]
        top = torch.softmax(rows.float(), dim=-1).max(dim=-1)
        probability += top.values.tolist()
        accepted += (top.indices == torch.tensor(continuation)).tolist()
    draft.reset()
    return probability, accepted


@dataclass(frozen=True)
class DraftCost:
    """The proposer's cost of a round at k = 0..kmax, medians of `reps` timings, seconds.

    plain: [kmax + 1] from the state after a round that rejected a draft (nothing to catch up);
    catch_up: [kmax + 1] after a round that accepted every draft (one more token to feed first).
    Index 0 is 0: a round at k = 0 does not call the proposer.
    """

    plain: tuple[float, ...]
    catch_up: tuple[float, ...]
    reps: int
    context_tokens: int

    @property
    def kmax(self) -> int:
        return len(self.plain) - 1

    def to_dict(self) -> dict:
        return {"plain": list(self.plain), "catch_up": list(self.catch_up), "reps": self.reps,
                "context_tokens": self.context_tokens}

    @classmethod
    def from_dict(cls, d: dict) -> "DraftCost":
        return cls(plain=tuple(d["plain"]), catch_up=tuple(d["catch_up"]), reps=d["reps"],
                   context_tokens=d["context_tokens"])


def time_round(proposer: Proposer, context: torch.Tensor, k: int, catch_up: int, *, reps: int, warmup: int,
               device, between=None) -> float:
    """Median seconds of the proposer's part of one round at k: propose on `context` ([L] ids), then
    commit as if every draft was accepted; before each (untimed) its state is cut back to L - 1 - catch_up
    and `between(k)` runs (the target's pass of the round before, `measure_draft_cost`)."""
    L = context.shape[0]

    def one_round():
        n = proposer.propose(context, k).tokens.shape[0]
        proposer.commit(L + n)

    def reset():
        proposer.commit(L - 1 - catch_up)  # a draft model's cache: the round's start
        if between is not None:
            between(k)

    return timing.measure(one_round, reps=reps, warmup=warmup, flush=reset, device=device).median


def target_pass(target, context: torch.Tensor):
    """f(k): the target's pass of k + 1 tokens after `context` ([L] ids), its cache cut back after it, as
    the verify pass before a draft's round runs; the target is begun on `context` here."""
    target.reset()
    target.extend(context[:-1], outputs=1)
    base = target.length

    def run(k: int) -> None:
        target.extend(context[torch.arange(k + 1) % context.shape[0]], outputs=1)
        target.truncate(base)

    return run


def measure_draft_cost(proposer: Proposer, *, target, context: Sequence[int], kmax: int, reps: int = 20,
                       warmup: int = 3, temperature: float = 0.0, width: int | None = None,
                       vocab_limit: int | None = None, device="cpu", alternate: bool = False) -> DraftCost:
    """h(k) for k = 0..kmax of the proposer on this machine, at the depth of `context` ([L] ids, L >= 2).

    The proposer is begun on `context` (as `generate` begins it: untimed), then each k is timed with
    `time_round`, without and with one token of catch-up. width: the sampler's width (default the
    target's). warmup >= 1: the first call fills a draft model's cache with the context.
    alternate: before each timed round the target runs its verify pass of k + 1 tokens (`target_pass`,
    untimed), as in decoding: a draft model then finds its weights where the target's pass left the
    caches, and on llama.cpp the target's threads just stopped (on 2 cores a draft round so timed cost
    SmolLM2's draft 16% more than one timed alone).
    """
    context = torch.as_tensor(list(context), dtype=torch.long)  # [L]
    if context.shape[0] < 2 or kmax < 0 or warmup < 1:
        raise ValueError(f"need a context of >= 2 tokens (got {context.shape[0]}), kmax >= 0 (got {kmax}) and "
                         f"warmup >= 1 (got {warmup}: the first call fills the draft's cache)")
    sampler = Sampler(SamplingConfig(temperature=temperature), width=width or target.width, vocab_limit=vocab_limit)
    proposer.begin(target=target, prompt=context, max_new_tokens=kmax + 1, sampler=sampler)
    between = target_pass(target, context) if alternate else None
    plain, caught = [0.0], [0.0]
    for k in range(1, kmax + 1):
        plain.append(time_round(proposer, context, k, 0, reps=reps, warmup=warmup, device=device, between=between))
        caught.append(time_round(proposer, context, k, 1, reps=reps, warmup=warmup, device=device, between=between))
    return DraftCost(plain=tuple(plain), catch_up=tuple(caught), reps=reps, context_tokens=int(context.shape[0]))


def expected_draft_cost(cost: DraftCost, alpha: Sequence, at_k: Sequence = ()) -> list:
    """h_hat(k) = (1 - P(k)) plain(k) + P(k) catch_up(k), P(k) = prod_{i<=k} alpha_i the chance that the
    previous round at k accepted all its drafts, so that this one feeds one more token. [kmax + 1].
    at_k: [>= kmax] the counts of the runs at each k (`CandidateAcceptance.at_k`): P(k) then from the
    run at k's own alphas, as E(k) is (`costmodel.positional.answer`)."""
    if len(alpha) < cost.kmax or (at_k and len(at_k) < cost.kmax):
        raise ValueError(f"{len(alpha)} alphas and {len(at_k)} runs at each k for a draft cost to kmax = "
                         f"{cost.kmax}; give one per position")
    out, survive = [cost.plain[0]], 1
    for k in range(1, cost.kmax + 1):
        survive = math.prod(at_k[k - 1].alpha[:k]) if at_k else survive * alpha[k - 1]
        out.append((1 - survive) * cost.plain[k] + survive * cost.catch_up[k])
    return out
