"""A table model whose batched passes break near ties otherwise than its one-token passes, as llama.cpp's
CPU kernels do on near-tie files (issue 55): the fake backend of the oracle's acceptance tests."""

from __future__ import annotations

import torch

from moespec.backends.table_model import TableLM

PERIOD = 97  # positions of the position term: the greedy text runs long before it repeats


class NearTieLM(TableLM):
    """A table model, logits A[x_t] + C[t % PERIOD], whose passes of two or more tokens swap the two
    largest logits (of the first V) of every row where they lie within `margin` of each other: its
    one-token passes, which decode the oracle's reference, and the (k+1)-token passes that verify
    the reference disagree there, as llama.cpp's one-token and batched kernels do on near ties."""

    def __init__(self, V: int, seed: int = 0, *, margin: float = 0.1):
        super().__init__(V, seed)
        self.C = torch.randn(PERIOD, V, generator=torch.Generator().manual_seed(seed + 1))  # [PERIOD, V]
        self.margin = margin

    def extend(self, tokens: torch.Tensor, outputs: int | None = None) -> torch.Tensor:
        tokens = tokens.reshape(-1)
        n = tokens.numel()
        logits = super().extend(tokens)  # keeps the cache, counts the pass
        logits = self.A[tokens] + self.C[torch.arange(self.length - n, self.length) % PERIOD]
        if n >= 2:
            top = logits.topk(2, dim=-1)  # [n, 2]
            near = (top.values[:, 0] - top.values[:, 1] < self.margin).nonzero().flatten()
            first, second = top.indices[near, 0], top.indices[near, 1]
            logits[near, first], logits[near, second] = top.values[near, 1], top.values[near, 0]
        return logits[-(outputs or n):]

    def flips(self, text: torch.Tensor) -> float:
        """The share of `text`'s positions whose greedy token a pass over all of it (from position 0)
        gives otherwise than one-token passes do; the cache is left empty."""
        self.reset()
        batched = self.extend(text).argmax(-1)
        self.reset()
        single = torch.stack([self.extend(text[j: j + 1])[0].argmax() for j in range(text.numel())])
        self.reset()
        return float((batched != single).float().mean())
