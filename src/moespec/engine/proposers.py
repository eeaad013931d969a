"""Proposers: where the K draft tokens of a round come from.

A proposer has three methods, called by the decode loop:

- `begin(target, prompt, max_new_tokens, sampler)` once, before the clock starts (the oracle
  computes its reference continuation here);
- `propose(context, k) -> (x, q)`: up to k drafted tokens x ([k'] int64, k' <= k) for the committed
  `context` ([L] int64), and q, the [k', W] distributions they were sampled from, or None when each
  draft is one-hot (a deterministic proposal);
- `commit(keep)`: the first `keep` tokens the proposer last saw (context + its accepted drafts)
  are committed; it drops any state beyond them.

`DraftModel` samples from a second causal LM, `PromptLookup` copies an n-gram continuation from the
context, `OracleDraft` is the cost-model paper's oracle (Sec. 4, App. D.2).
"""

from __future__ import annotations

import math

import torch

from moespec.engine.cached import CachedModel
from moespec.engine.sampling import Sampler


class DraftModel:
    """A second causal LM with its own KV cache; q is exactly the distribution each draft came from.

    Between rounds its cache holds a prefix of the committed sequence. A round feeds the uncached
    suffix (one token after a rejection; two after a full acceptance, since x_K was sampled but
    never fed), then K-1 more single-token steps.
    """

    def __init__(self, model):
        self.cached = model if hasattr(model, "extend") else CachedModel(model)
        self.sampler: Sampler | None = None

    @property
    def width(self) -> int:
        return self.cached.width

    def begin(self, *, target, prompt: torch.Tensor, max_new_tokens: int, sampler: Sampler) -> None:
        self.cached.reset()
        self.sampler = sampler

    def propose(self, context: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        s = self.sampler
        logits = self.cached.extend(context[self.cached.length:])[-1:]  # [1, V]
        xs, qs = [], []
        for i in range(k):
            q = s.prepare(logits)  # [1, W]
            x = s.sample(q)  # [1]
            xs.append(x)
            qs.append(q)
            if i + 1 < k:
                logits = self.cached.extend(x)
        return torch.cat(xs), (None if s.greedy else torch.cat(qs))

    def commit(self, keep: int) -> None:
        self.cached.truncate(keep)


class PromptLookup:
    """Copies the continuation of the latest earlier match of the context's last n tokens (one-hot q).

    Tries n-gram sizes n, n-1, ..., 1 and proposes nothing when no suffix recurs.
    """

    def __init__(self, n: int = 3):
        if n < 1:
            raise ValueError(f"PromptLookup needs an n-gram size >= 1, got {n}")
        self.n = n

    def begin(self, *, target, prompt: torch.Tensor, max_new_tokens: int, sampler: Sampler) -> None:
        pass

    def propose(self, context: torch.Tensor, k: int) -> tuple[torch.Tensor, None]:
        L = context.shape[0]
        for n in range(min(self.n, L - 1), 0, -1):
            windows = context[: L - 1].unfold(0, n, 1)  # [L-n, n], every n-gram that has a successor
            hits = (windows == context[L - n:]).all(-1).nonzero()
            if hits.numel():
                start = int(hits[-1]) + n
                return context[start: start + k], None
        return context[:0], None

    def commit(self, keep: int) -> None:
        pass


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
    """The oracle draft: the target's own greedy token, marked wrong with probability 1 - a.

    Following the cost-model paper (Sec. 4, App. D.2, App. E: "seeded flags that mark drafts
    wrong"), each draft is the target's batch-one greedy token, and a seeded draw marks the drafts
    that are wrong, each with probability 1 - a. `generate` rejects a step's drafts from the first
    marked one on (`marked`): draft i is accepted iff drafts 1..i are unmarked (and match the
    verify pass), so acceptance is geometric at rate a, and proposing costs next to nothing.

    A marked draft keeps its token. Under greedy verification the target's token at that position
    is the draft itself, so the committed text is the target's greedy text whatever is marked, and
    every verify pass reads k + 1 tokens of that text: the window the cost model's V(k) prices, with
    no a in it. Replacing the marked draft by another token, as this class did before, made the
    step time depend on a: a wrong token names experts of its own, and where the synthetic presets'
    greedy text repeats one id (qwen3moe-shaped's first demo prompt), every wrong token added a
    second token's experts to the window (BENCHMARKS.md, "Marked, not replaced").

    One draw per step: a step's run of right drafts is j = floor(log u / log a) for one uniform u
    (`geometric_run`: P(j >= i) = a^i, exactly the law of drafts right with probability a each, in
    a row), and draft j + 1, if the step has it, is marked. Drafts after it are never examined.
    So runs with the same seed share the step outcomes at every k and a (common random numbers: a
    step accepts min(j, k)). `offset` starts the sequence later, so that several runs of one sweep
    cell read consecutive stretches of one sequence; `draws` says how many a run took.

    The uniforms are stratified in blocks of `block` steps (`stratified_uniforms`): each step's run
    still has exactly the geometric law, but a block's runs follow its quantiles, so a cell's tokens
    per step stay at G_a(k) instead of wandering with the luck of independent draws. A sweep makes
    the block one cell's steps: at 40 steps, k = 7, a = 0.85, tokens per step over G_a(k) have a
    standard deviation of 0.5% (simulated; 8.9% with independent draws, more than the 5% tolerance
    of the speedup against G_a(k)V(0)/V(k); one draw per examined draft, stratified in blocks of
    128, left a demo's cells at 0.91-1.08 of G_a(k)). The price is a correlation
    of -1/(block - 1) between two steps of a block; tests/engine/test_oracle.py checks the runs
    against the geometric law.

    The greedy tokens come from a reference continuation: in `begin`, before the clock starts, the
    oracle decodes the prompt greedily one token at a time on the target's own cache (then rolls the
    cache back). A verify pass whose batched argmax differs from the batch-one token (a near-tie)
    makes the committed text leave the reference; the oracle then re-anchors, decoding a fresh
    reference from the committed text on the target's cache, inside the clock, counted in
    `reanchors`. Only greedy decoding is supported (temperature 0).

    `reference` ([>= P + max_new_tokens] int64: the prompt, then the target's greedy tokens) skips
    the decoding in `begin` where a sweep already has it: it depends only on the model and prompt,
    not on k or a. After `begin`, `.reference` holds the one in use, to pass to the next oracle.
    """

    def __init__(self, acceptance: float, seed: int = 0, reference: torch.Tensor | None = None, offset: int = 0,
                 block: int = STEP_BLOCK):
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
        self.reanchors = 0
        self.draws = 0
        self.marked: int | None = None  # the first draft of the last proposal marked wrong (0-based)
        self._target: CachedModel | None = None
        self._ref: torch.Tensor = torch.zeros(0, dtype=torch.long)  # [P + max_new_tokens] prompt + greedy tokens
        self._end = 0

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
        self.reanchors = 0
        self.draws = 0
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
            logits = t.extend(context[t.length:])[-1:]
            for j in range(L, self._end):
                ref[j] = self._sampler.sample(self._sampler.prepare(logits))[0]
                if j + 1 < self._end:
                    logits = t.extend(ref[j: j + 1])
            t.truncate(min(before, L - 1))
        return ref

    def propose(self, context: torch.Tensor, k: int) -> tuple[torch.Tensor, None]:
        L = context.shape[0]
        if L > self._ref.shape[0] or context[L - 1] != self._ref[L - 1]:
            self.reanchors += 1
            self._ref = self._greedy_from(context)
        g = self._ref[L: L + k].clone()  # [k'] the target's greedy tokens
        j = geometric_run(self._u[self.draws], self.a)  # right drafts before the first wrong one
        # draft j + 1 is marked; verification stops there, so later ones need no mark
        self.marked = int(j) if j < g.shape[0] else None
        self.draws += 1
        return g, None

    def commit(self, keep: int) -> None:
        pass
