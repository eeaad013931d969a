"""A third backend: deterministic table models, for the engine's tests and the gate's level 2.

Its logits are cheap and exact, and depend on the position, so a misaligned cache shows at once.
"""

from __future__ import annotations

import torch

from moespec.backends.protocol import GreedyByLogits, output_rows


class TableLM(GreedyByLogits):
    """A mock causal LM speaking the SpecModel protocol: the logits at position t are A[x_t] + B[t % 3].

    A: [V, W], B: [3, W] seeded normals times `scale`; padded columns V..W-1 (width W >= V) get a
    large logit, so a sampler that ignored the vocabulary limit would emit them. Logits depend on the
    position, so a misaligned cache changes them. The engine's tests use it too.
    """

    def __init__(self, V: int = 48, seed: int = 0, *, width: int | None = None, scale: float = 1.0):
        W = width or V
        g = torch.Generator().manual_seed(seed)
        self.A = torch.randn(V, W, generator=g) * scale  # [V, W]
        self.B = torch.randn(3, W, generator=g) * scale * 0.5  # [3, W]
        self.A[:, V:] = 8.0
        self.tokens = torch.zeros(0, dtype=torch.long)  # [length]
        self.forward_s, self.device, self.extends = 0.0, torch.device("cpu"), 0

    @property
    def width(self) -> int:
        return self.A.shape[1]

    @property
    def length(self) -> int:
        return self.tokens.shape[0]

    def reset(self) -> None:
        self.tokens, self.forward_s = self.tokens[:0], 0.0

    @property
    def vocab_limit(self) -> None:
        return None

    def extend(self, tokens: torch.Tensor, outputs: int | None = None) -> torch.Tensor:
        """tokens [n] -> logits [n, W] (the last `outputs` rows)."""
        rows = output_rows(tokens.numel(), outputs)
        pos = torch.arange(self.length, self.length + tokens.numel())
        self.tokens = torch.cat((self.tokens, tokens.reshape(-1)))
        self.extends += 1
        return (self.A[tokens.reshape(-1)] + self.B[pos % 3])[-rows:]

    def truncate(self, n: int) -> None:
        self.tokens = self.tokens[:n]

    def identity(self) -> None:
        """None: a test table's passes take no time worth remembering; k="auto" decodes cold."""
        return None

    def fresh_logits(self) -> torch.Tensor:
        """Logits of every cached position recomputed from the tokens, [length, W]."""
        return self.A[self.tokens] + self.B[torch.arange(self.length) % 3]
