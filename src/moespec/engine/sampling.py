"""The accept/resample rule of speculative sampling (engine paper Sec. 3.1, eqs. (1)-(2)).

Terms, for one round that verifies K drafted tokens x_1..x_K:

- *accepted tokens*: the longest prefix x_1..x_a whose every token passed the test (1),
  r_i < min(1, p_i(x_i) / q_i(x_i)), with r_i ~ Uniform(0, 1).
- *recovered token*: at the first rejection (position a+1 <= K), the one replacement token drawn
  from the residual p'(x) = max(0, p_{a+1}(x) - q_{a+1}(x)) / sum_y max(0, p_{a+1}(y) - q_{a+1}(y)), eq. (2).
- *bonus token*: when all K drafts are accepted, one extra token drawn from p_{K+1}, the last row
  of the verify pass.

A round therefore emits a + 1 tokens (1 <= a + 1 <= K + 1), distributed exactly as target sampling
(Proposition 1). p is the target's distribution, q the draft's; both come from `Sampler.prepare`, so
temperature, top-k and top-p are applied identically to both. All arithmetic is float32 on the CPU
with the sampler's explicit `torch.Generator`. Temperature 0 is greedy: accept iff x_i = argmax p_i,
else emit argmax p_i; it consumes no randomness.

Shapes: W is the shared width (the smaller of the two models' logit widths); ids at or beyond
`vocab_limit` (padding rows of the output layer, or ids one model lacks) get probability 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class SamplingConfig:
    """Temperature, top-k and top-p, applied identically to target and draft."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        if not (self.temperature >= 0.0):
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {self.top_k}")
        if self.top_p is not None and not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def accept_mask(px: torch.Tensor, qx: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Eq. (1): accept iff r < min(1, p(x)/q(x)), written r * q(x) < p(x) so q(x) = 0 needs no division.

    px, qx, r: [...] float32 (p and q at the drafted token, and the uniform draw). Exact for
    q(x) > 0 because r < 1; for q(x) = 0 (x could not have come from q) it accepts iff p(x) > 0,
    so a token the target gives probability 0 is never emitted.
    """
    return r * qx < px


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Eq. (2): p' = max(0, p - q) normalized over the last axis; p, q: [..., W] -> [..., W].

    A row whose residual is all zero (p == q there, so rejection had probability 0 in exact
    arithmetic and only rounding got here) falls back to p itself.
    """
    r = (p - q).clamp_(min=0.0)
    total = r.sum(-1, keepdim=True)  # [..., 1]
    return torch.where(total > 0, r / total.clamp(min=torch.finfo(r.dtype).tiny), p)


def no_distribution(what: str, row: int, position: int | None) -> str:
    """The message for logits row `row` that holds `what` and so gives no distribution; position: the
    sequence position row 0 predicts, when known."""
    where = f"row {row}" if position is None else f"row {row} (predicting sequence position {position + row})"
    return f"the model returned logits with {what} at {where}; check its weights and dtype (try dtype=float32)"


def _no_distribution(z: torch.Tensor, top: torch.Tensor, position: int | None) -> None:
    """Raise for the first row of z [n, W] whose maximum `top` [n] is not finite."""
    i = int((~torch.isfinite(top)).nonzero()[0])
    row = z[i]
    what = "NaN" if torch.isnan(row).any() else "+inf" if torch.isposinf(row).any() else "-inf at every allowed id"
    raise ValueError(no_distribution(what, i, position))


class Sampler:
    """Turns logits into distributions and runs the accept/resample walk of one round.

    width: W, the shared sampling width; vocab_limit: ids >= this are never produced.
    """

    def __init__(self, config: SamplingConfig, *, width: int, vocab_limit: int | None = None, seed: int = 0):
        if width < 1:
            raise ValueError(f"sampling width must be >= 1, got {width}")
        limit = width if vocab_limit is None else int(vocab_limit)
        if not 1 <= limit <= width:
            raise ValueError(f"vocab_limit must be in 1..{width} (the logit width), got {vocab_limit}")
        self.config = config
        self.width = width
        self.vocab_limit = limit
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self._rows = self._argmax = None  # prepare's last greedy rows and their argmax
        self._mask = None if limit == width else torch.zeros(width, dtype=torch.bool)
        if self._mask is not None:
            self._mask[limit:] = True

    @property
    def greedy(self) -> bool:
        return self.config.greedy

    def prepare(self, logits: torch.Tensor, position: int | None = None) -> torch.Tensor:
        """Distributions from logits: [n, V >= W] -> [n, W] float32 on the CPU.

        Probabilities when sampling; when greedy, the logits themselves: only their argmax over the
        first `vocab_limit` ids is used, taken here once, in numpy (a decode step's only arithmetic,
        and numpy's is the lighter call right after a backend's pass has filled the caches).
        position: the sequence position the first row predicts, named when a row has no distribution.
        """
        if logits.shape[-1] < self.width:
            raise ValueError(f"logits have width {logits.shape[-1]}, below the shared width {self.width}")
        z = logits
        if z.shape[-1] != self.width or z.dtype != torch.float32 or z.device.type != "cpu":
            z = z[..., : self.width].to(device="cpu", dtype=torch.float32)
        cfg = self.config
        if cfg.greedy:
            allowed = z.detach().numpy()[:, : self.vocab_limit]  # [n, vocab_limit]
            arg = allowed.argmax(-1)  # the first maximum; a NaN counts as the maximum
            if not np.isfinite(allowed[np.arange(len(arg)), arg]).all():
                masked = z if self._mask is None else z.masked_fill(self._mask, float("-inf"))
                _no_distribution(masked, masked.amax(-1), position)
            self._rows, self._argmax = z, torch.from_numpy(arg)
            return z
        if self._mask is not None:
            z = z.masked_fill(self._mask, float("-inf"))
        top = z.amax(-1)  # [n]; NaN or +inf anywhere in a row, or a row all -inf, leaves no distribution
        if not torch.isfinite(top).all():
            _no_distribution(z, top, position)
        z = z / cfg.temperature
        if cfg.top_k is not None and cfg.top_k < self.vocab_limit:
            kth = torch.topk(z, cfg.top_k, dim=-1).values[..., -1:]  # [n, 1]
            z = z.masked_fill(z < kth, float("-inf"))
        probs = torch.softmax(z, dim=-1)
        if cfg.top_p is not None and cfg.top_p < 1.0:
            sorted_p, order = torch.sort(probs, dim=-1, descending=True)
            # keep a token if the mass strictly before it is below top_p (the top token is always kept)
            drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= cfg.top_p
            drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
            probs = probs.masked_fill(drop, 0.0)
            probs = probs / probs.sum(-1, keepdim=True)
        return probs

    def _greedy(self, z: torch.Tensor) -> torch.Tensor:
        """[n] the first maximal id below vocab_limit of each row of z (prepare's greedy rows): the
        argmax prepare already took when z is its last result."""
        return self._argmax if z is self._rows else z[..., : self.vocab_limit].max(-1).indices

    def sample(self, dist: torch.Tensor) -> torch.Tensor:
        """One token per row of `dist` ([n, W] from `prepare`) -> [n] int64."""
        if self.greedy:
            return self._greedy(dist)
        return torch.multinomial(dist, 1, generator=self.generator).squeeze(-1)

    def _draw(self, weights: torch.Tensor) -> int:
        """One id from a distribution [W]."""
        return int(torch.multinomial(weights, 1, generator=self.generator))

    def verify(self, p: torch.Tensor, x: torch.Tensor, q: torch.Tensor | None) -> tuple[int, int]:
        """The accept walk of Algorithm 1: (a, next token).

        p: [K+1, W] target rows from `prepare` (row i predicts x_{i+1}; row K is the bonus row).
        x: [K] int64 drafted tokens. q: [K, W] the draft's distributions, or None for one-hot drafts
        (a proposer that sampled nothing). a is the number of accepted drafts; the next token is the
        recovered token (a < K) or the bonus token (a = K).
        """
        K = x.shape[0]
        if self.greedy:
            g = self._greedy(p)  # [K+1]
            a = int((g[:K] == x).cumprod(0).sum()) if K else 0
            return a, int(g[a])
        if K == 0:
            return 0, self._draw(p[0])
        rows = torch.arange(K)
        px = p[rows, x]  # [K]
        qx = torch.ones(K) if q is None else q[rows, x]
        r = torch.rand(K, generator=self.generator)
        a = int(accept_mask(px, qx, r).cumprod(0).sum())
        if a == K:
            return K, self._draw(p[K])
        if q is None:  # the one-hot draft at x_{a+1}
            qa = torch.zeros(self.width)
            qa[x[a]] = 1.0
        else:
            qa = q[a]
        return a, self._draw(residual_distribution(p[a], qa))
