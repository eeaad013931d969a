"""Proposers: where the drafts of a round come from.

`Proposer` is the protocol the decode loop calls and `Proposal` what it returns each round.
`DraftModel` samples from a second causal LM, `PromptLookup` copies an n-gram continuation from the
context, `OracleDraft` is the cost-model paper's oracle (Sec. 4, App. D.2).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch

from moespec.backends.protocol import SpecModel, StepStop, as_spec_model
from moespec.engine.sampling import Sampler


@dataclass(frozen=True)
class Proposal:
    """One round's drafts, as `Proposer.propose` returns them.

    tokens: [k'] int64, the drafts x_1..x_k' (k' <= k; k' = 0 proposes nothing).
    q: [k', W] float32, row i the distribution x_{i+1} was sampled from (`Sampler.prepare`), or None
        when every draft is one-hot (a deterministic proposal; also any draft under greedy decoding).
    marked_from: the index in [0, k') of the first draft marked wrong (`OracleDraft`; None for real
        proposers): the loop treats drafts from there on as rejected, and commits that draft where
        the target matched it.
    verdict: (drafts accepted, next token) that the round commits whatever its verify pass computes
        (`OracleDraft(honour=True)`, a measurement run), else None; `on_overrule` is called when the
        pass disagreed with it.
    """

    tokens: torch.Tensor
    q: torch.Tensor | None = None
    marked_from: int | None = None
    verdict: tuple[int, int] | None = None
    on_overrule: Callable[[], None] | None = field(default=None, compare=False)

    def __post_init__(self):
        if self.tokens.dim() != 1 or self.tokens.dtype != torch.long:
            raise ValueError(f"Proposal tokens must be [k'] int64, got {self.tokens.dtype} {tuple(self.tokens.shape)}")
        n = self.tokens.shape[0]
        if self.q is not None and (self.q.dim() != 2 or self.q.shape[0] != n):
            raise ValueError(f"Proposal q must be [{n}, W] for {n} drafts (or None), got {tuple(self.q.shape)}")
        if self.marked_from is not None and not 0 <= self.marked_from < n:
            raise ValueError(f"Proposal marked_from must be in [0, {n}) or None, got {self.marked_from}")
        if self.verdict is not None and not 0 <= self.verdict[0] <= n:
            raise ValueError(f"Proposal verdict must accept 0..{n} drafts (or be None), got {self.verdict}")

    def settle(self, accepted: int, token: int) -> tuple[int, int]:
        """The round's (drafts accepted, next token), from the accept walk's: the verdict where one is
        given; else the walk's, cut at the mark (drafts from `marked_from` on are rejected, and the
        draft there, the target's token, committed where the target matched it)."""
        if self.verdict is not None:
            j, next_token = self.verdict
            if self.on_overrule is not None and (accepted < j or (accepted == j and int(token) != next_token)):
                self.on_overrule()  # the pass rejected a right draft, or its next token differs
            return self.verdict
        if self.marked_from is not None and self.marked_from < accepted:
            return self.marked_from, int(self.tokens[self.marked_from])
        return accepted, token


@runtime_checkable
class Proposer(Protocol):
    """What `generate` calls on a draft source: `begin` once, then `propose` and `commit` each round."""

    @property
    def cache(self) -> SpecModel | None:
        """The proposer's own model cache (it bounds the sampling width and vocabulary, and its forward
        time is reported as `draft_forward_s`), or None when it runs no model."""

    def begin(self, *, target: SpecModel, prompt: torch.Tensor, max_new_tokens: int, sampler: Sampler) -> None:
        """Called before the clock starts; prompt: [P] int64; sampler: the one that verifies the drafts."""

    def propose(self, context: torch.Tensor, k: int) -> Proposal:
        """Up to k drafts continuing the committed `context` ([L] int64)."""

    def commit(self, keep: int) -> None:
        """The first `keep` tokens of the last context and its drafts are committed; drop state beyond."""

    def identity(self) -> dict | None:
        """What sets its drafts and their cost, for the warm start's store (`engine.step_store`):
        {"proposer": its kind, "options": what sets its drafts, "draft": its model's
        `SpecModel.identity()` or None}; None: no key, k="auto" decodes cold."""


class DraftModel:
    """A second causal LM with its own KV cache (any backend); q is exactly the distribution each draft came from.

    Between rounds its cache holds a prefix of the committed sequence. A round feeds the uncached
    suffix (one token after a rejection; two after a full acceptance, since x_K was sampled but
    never fed), then K-1 more single-token steps.
    """

    def __init__(self, model):
        self._cache = as_spec_model(model)
        self.sampler: Sampler | None = None

    @property
    def cache(self) -> SpecModel:
        return self._cache

    def begin(self, *, target, prompt: torch.Tensor, max_new_tokens: int, sampler: Sampler) -> None:
        self._cache.reset()
        self.sampler = sampler

    def propose(self, context: torch.Tensor, k: int) -> Proposal:
        s, cache = self.sampler, self._cache
        if s.greedy:  # the draft's own greedy steps, in one call to its backend
            suffix = context[cache.length:]
            if suffix.shape[0] > 1:
                cache.extend(suffix[:-1], outputs=1)
            drafts, _ = cache.greedy_steps(int(suffix[-1]), k, s.vocab_limit)
            return Proposal(torch.tensor(drafts, dtype=torch.long))
        logits = cache.extend(context[cache.length:], outputs=1)  # [1, V]
        xs, qs = [], []
        for i in range(k):
            q = s.prepare(logits)  # [1, W]
            x = s.sample(q)  # [1]
            xs.append(x)
            qs.append(q)
            if i + 1 < k:
                logits = cache.extend(x)
        return Proposal(torch.cat(xs), None if s.greedy else torch.cat(qs))

    def commit(self, keep: int) -> None:
        self._cache.truncate(keep)

    def identity(self) -> dict | None:
        """Its model's identity; None when the model has none."""
        model = self._cache.identity()
        return None if model is None else {"proposer": type(self).__name__, "options": {}, "draft": model}


class Quiet(NamedTuple):
    """A run of rounds in which a host drafter proposes nothing (`HostDrafter.quiet`): it proposes
    nothing from the context it was asked about, nor from the context each later token ends until
    `stop` fires on that token or `steps` tokens have been produced."""

    stop: StepStop
    steps: int


class HostDrafter:
    """A proposer without a draft model (prompt lookup, llama.cpp's n-gram rules): no cache to keep,
    nothing to set up per call nor to roll back; it drafts from the context alone, on the host."""

    @property
    def cache(self) -> None:
        return None

    def quiet(self, context: torch.Tensor, width: int) -> Quiet | None:
        """Where it would propose nothing from `context` ([L] int64) and, until a token fires the rule,
        from the contexts the next tokens end: the decode loop then runs those rounds as plain greedy
        steps in one call (`round.quiet_rounds`; the same tokens and the same round records, without a
        Python round each). None: it may propose now (the default: no such rule). width: the ids a
        token may take. A rule may fire where the drafter would still propose nothing (the round then
        asks it), never the other way round."""
        return None

    def begin(self, *, target, prompt: torch.Tensor, max_new_tokens: int, sampler: Sampler) -> None:
        pass

    def commit(self, keep: int) -> None:
        pass


class PromptLookup(HostDrafter):
    """Copies the continuation of the latest earlier match of the context's last n tokens (one-hot q).

    Tries n-gram sizes n, n-1, ..., 1 and proposes nothing when no suffix recurs.
    """

    def __init__(self, n: int = 3):
        if n < 1:
            raise ValueError(f"PromptLookup needs an n-gram size >= 1, got {n}")
        self.n = n

    def quiet(self, context: torch.Tensor, width: int) -> Quiet | None:
        """It proposes nothing exactly while the last token is new to the context (every n falls back
        to n = 1): quiet until a token already in the context comes."""
        return quiet_until_repeat(context, width)

    def propose(self, context: torch.Tensor, k: int) -> Proposal:
        L = context.shape[0]
        for n in range(min(self.n, L - 1), 0, -1):
            windows = context[: L - 1].unfold(0, n, 1)  # [L-n, n], every n-gram that has a successor
            hits = (windows == context[L - n:]).all(-1).nonzero()
            if hits.numel():
                start = int(hits[-1]) + n
                return Proposal(context[start: start + k])
        return Proposal(context[:0])

    def identity(self) -> dict:
        """Its n-gram size: another n drafts other tokens, with an acceptance of its own."""
        return {"proposer": type(self).__name__, "options": {"n": self.n}, "draft": None}


def until_repeat(context: torch.Tensor, width: int) -> Quiet:
    """The rule that fires on the first new token already in the context (or produced before it)."""
    ids = context.numpy()
    seen = np.zeros(max(width, int(ids.max()) + 1), dtype=np.uint8)
    seen[ids] = 1
    return Quiet(StepStop(seen=seen), sys.maxsize)


def quiet_until_repeat(context: torch.Tensor, width: int) -> Quiet | None:
    """Quiet while each new token is new to the context: None when the last token already occurs
    before it (or the context is one token), else `until_repeat`."""
    if context.shape[0] < 2 or bool((context[:-1] == context[-1]).any()):
        return None
    return until_repeat(context, width)


STEP_BLOCK = 128  # draws per block of the oracle's stratified sequence (`stratified_uniforms`)


def stratified_uniforms(n: int, generator: torch.Generator, block: int = STEP_BLOCK) -> torch.Tensor:
    """[n] draws, each exactly uniform on [0, 1), stratified in blocks of `block` positions.

    In each block, position j gets (π(j) + U_j) / block for a random permutation π and independent
    uniforms U: every position is marginally U(0, 1), and each block has exactly one draw in each
    interval [i/block, (i+1)/block), so the share of draws below any a is a within 1/block. Two
    positions of one block are dependent only through π: their indicators {u >= a} correlate by
    -1/(block - 1) (sampling without replacement). Blocks are drawn in order from `generator`, so
    the first n draws do not depend on how many more are drawn.
    """
    if n < 0 or block < 1:
        raise ValueError(f"n={n} must be >= 0 and block={block} >= 1")
    blocks = [(torch.randperm(block, generator=generator) + torch.rand(block, generator=generator)) / block
              for _ in range(-(-n // block))]
    return torch.cat(blocks)[:n] if blocks else torch.zeros(0)


def geometric_run(u: float, a: float) -> float:
    """The drafts a step accepts before its first wrong one, from one uniform u: floor(log u / log a).

    P(run >= i) = P(u <= a^i) = a^i, the law of i drafts each right with probability a in a row
    (inverse transform); inf where no draft is ever wrong (a = 1, or u = 0).
    """
    if a >= 1 or u <= 0:
        return math.inf
    if a <= 0:
        return 0
    return math.floor(math.log(u) / math.log(a))


class OracleDraft:
    """The cost-model paper's oracle draft (Sec. 4, App. D.2: "seeded flags that mark drafts wrong").

    Each draft is the target's own greedy token; one seeded draw per round marks the first wrong one
    (`Proposal.marked_from`), each draft being wrong with probability 1 - a, so acceptance is
    geometric at rate a and proposing costs next to nothing. Greedy decoding only.
    acceptance: a in [0, 1]. seed: seeds the draws. offset: draws to skip, to continue one sequence
    over several runs. block: steps per stratified block (`stratified_uniforms`). reference:
    [>= P + max_new_tokens] int64, the prompt then the target's greedy tokens, reused instead of
    decoding them in `begin`. honour: each round commits the oracle's verdict, the drafts before
    the mark and the reference's token after them, whatever the verify pass computes
    (`Proposal.verdict`): the pass and its cost are the same, and the acceptance is a even where the
    (k+1)-token pass and the one-token passes that decoded the reference break a near tie apart
    (docs/methodology.md, "The oracle's verdict"); the output is then the reference. After a run:
    `reference` (the one used), `draws`, `reanchors`, `overruled` (rounds whose pass disagreed with
    the verdict).
    """

    def __init__(self, acceptance: float, seed: int = 0, reference: torch.Tensor | None = None, offset: int = 0,
                 block: int = STEP_BLOCK, honour: bool = False):
        if not 0.0 <= acceptance <= 1.0:
            raise ValueError(f"OracleDraft acceptance must be in [0, 1], got {acceptance}")
        if offset < 0:
            raise ValueError(f"OracleDraft offset must be >= 0 draws, got {offset}")
        if block < 1:
            raise ValueError(f"OracleDraft block must be >= 1 steps, got {block}")
        self.a = float(acceptance)
        self.seed = seed
        self.offset = int(offset)
        self.block = int(block)
        self._given = reference
        self.honour = bool(honour)
        self.reanchors = 0
        self.draws = 0
        self.overruled = 0
        self._target: SpecModel | None = None
        self._ref: torch.Tensor = torch.zeros(0, dtype=torch.long)  # [P + max_new_tokens] prompt + greedy tokens
        self._end = 0

    @property
    def cache(self) -> None:
        """None: the oracle runs no model of its own (it decodes on the target's cache)."""
        return None

    def begin(self, *, target, prompt: torch.Tensor, max_new_tokens: int, sampler: Sampler) -> None:
        if not sampler.greedy:
            raise ValueError(
                f"OracleDraft models acceptance under greedy verification; use temperature=0 "
                f"(got {sampler.config.temperature})"
            )
        self._target, self._sampler = target, sampler
        self._end = prompt.shape[0] + max_new_tokens
        # one draw per round, and a round emits at least one token: max_new_tokens + 1 draws suffice
        need = self.offset + max_new_tokens + 1
        gen = torch.Generator(device="cpu").manual_seed(self.seed)
        self._u = stratified_uniforms(need, gen, block=self.block)[self.offset:].tolist()
        self.reanchors = self.draws = self.overruled = 0
        ref, P = self._given, prompt.shape[0]
        if ref is not None and ref.shape[0] >= self._end and torch.equal(ref[:P], prompt):
            self._ref = ref[: self._end]
        else:
            self._ref = self._greedy_from(prompt)

    @property
    def reference(self) -> torch.Tensor:
        """[P + max_new_tokens] the prompt and the target's greedy continuation, as of `begin`."""
        return self._ref

    def _greedy_from(self, context: torch.Tensor) -> torch.Tensor:
        """context [L] followed by target greedy tokens up to length self._end, via the target's cache."""
        t, L = self._target, context.shape[0]
        before = t.length
        ref = torch.empty(max(self._end, L), dtype=torch.long)
        ref[:L] = context
        if L < self._end:
            t.truncate(min(before, L - 1))
            logits = t.extend(context[t.length:], outputs=1)
            for j in range(L, self._end):
                ref[j] = self._sampler.sample(self._sampler.prepare(logits))[0]
                if j + 1 < self._end:
                    logits = t.extend(ref[j: j + 1])
            t.truncate(min(before, L - 1))
        return ref

    def propose(self, context: torch.Tensor, k: int) -> Proposal:
        L = context.shape[0]
        if L > self._ref.shape[0] or context[L - 1] != self._ref[L - 1]:
            self.reanchors += 1
            self._ref = self._greedy_from(context)
        g = self._ref[L: L + k].clone()  # [k'] the target's greedy tokens
        j = geometric_run(self._u[self.draws], self.a)  # right drafts before the first wrong one
        self.draws += 1
        n = g.shape[0]
        # draft j + 1 is marked; verification stops there, so later ones need no mark
        mark = int(j) if j < n else None
        right = n if mark is None else mark
        if not self.honour or L + right >= self._ref.shape[0]:
            return Proposal(g, marked_from=mark)
        return Proposal(g, marked_from=mark, verdict=(right, int(self._ref[L + right])), on_overrule=self._overrule)

    def _overrule(self) -> None:
        self.overruled += 1

    def commit(self, keep: int) -> None:
        pass

    def identity(self) -> dict:
        """Its acceptance a: the drafts are the target's own, marked wrong at rate 1 - a."""
        return {"proposer": type(self).__name__, "options": {"acceptance": self.a}, "draft": None}
