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


FLAG_BLOCK = 128  # draws per block of the oracle's stratified sequence (`stratified_uniforms`)


def stratified_uniforms(n: int, generator: torch.Generator, block: int = FLAG_BLOCK) -> torch.Tensor:
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


class OracleDraft:
    """The oracle draft: the target's own greedy token, corrupted with probability 1 - a.

    Following the cost-model paper (Sec. 4, App. D.2), each draft is the target's batch-one greedy
    token, replaced by another real-vocabulary id where a seeded draw marks it wrong (probability
    1 - a). Under greedy verification draft i is then accepted iff drafts 1..i are unmarked, so
    acceptance is geometric at rate a, and proposing costs next to nothing.

    The draws are consumed in the order drafts are examined: a round takes draws until the first
    wrong one (which greedy verification rejects, ending the round) or until its k drafts are
    spent; drafts after a wrong one are never examined and take none. So every examined draft has
    its own draw, and runs with the same seed share the sequence of outcomes at every k and a
    (common random numbers: the nth examination is wrong at a exactly when u_n >= a). `offset`
    starts the sequence later, so that several runs of one sweep cell read consecutive stretches of
    one sequence; `examined` says how many draws a run took.

    The sequence is stratified in blocks of 128 draws (`stratified_uniforms`): each draw is still
    wrong with probability exactly 1 - a, but each block holds 128(1 - a) wrong draws to within
    one, so a cell's realized acceptance does not wander with the luck of independent draws (at
    a = 0.9 and ~300 examined drafts that luck alone moves G_a(8) by ~6%, more than the tolerance
    of the sweep's speedup against G_a(k)V(0)/V(k); with blocks of 256, the first block of this
    sequence at a = 0.8 still gave cells of ~150 drafts 9% more tokens per step than G_a(k)). The
    price is a correlation of -1/127 between two draws of a block; tests/engine/test_oracle.py
    checks the run lengths against the geometric law (blocks of 64 fail that test).

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

    def __init__(self, acceptance: float, seed: int = 0, reference: torch.Tensor | None = None, offset: int = 0):
        if not 0.0 <= acceptance <= 1.0:
            raise ValueError(f"OracleDraft acceptance must be in [0, 1], got {acceptance}")
        if offset < 0:
            raise ValueError(f"OracleDraft offset must be >= 0 draws, got {offset}")
        self.a = float(acceptance)
        self.seed = seed
        self.offset = int(offset)
        self._given = reference
        self.reanchors = 0
        self.examined = 0
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
        # a round takes at most one draw per token it emits, so max_new_tokens + 1 draws suffice
        need = self.offset + max_new_tokens + 1
        self._u = stratified_uniforms(need, torch.Generator(device="cpu").manual_seed(self.seed))[self.offset:]
        gen = torch.Generator(device="cpu").manual_seed(self.seed + 1)
        self._shift = torch.randint(1, max(sampler.vocab_limit, 2), (need,), generator=gen)[self.offset:]
        self.reanchors = 0
        self.examined = 0
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
        m = g.shape[0]
        start = self.examined
        wrong = (self._u[start: start + m] >= self.a).nonzero()
        if wrong.numel():  # the first wrong draft ends the round: later drafts are never examined
            j = int(wrong[0])
            g[j] = (g[j] + self._shift[start + j]) % self._sampler.vocab_limit  # any other real id
            self.examined += j + 1
        else:
            self.examined += m
        return g, None

    def commit(self, keep: int) -> None:
        pass
