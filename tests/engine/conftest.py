"""Deterministic mock models at the CachedModel level, shared by the engine tests."""

import pytest
import torch


class TableLM:
    """A mock causal LM with fixed tables: logits at position t are A[token_t] + B[t % 3].

    A: [V, W], B: [3, W] seeded normals times `scale`; columns >= V (padding) get a large logit so a
    sampler that forgets the vocabulary limit would emit them. Implements CachedModel's interface
    (extend, truncate, length, width, reset, forward_s, device); logits depend on the position, so a
    misaligned cache changes them.
    """

    def __init__(self, V: int = 48, seed: int = 0, *, width: int | None = None, scale: float = 1.0):
        W = width or V
        g = torch.Generator().manual_seed(seed)
        self.A = torch.randn(V, W, generator=g) * scale  # [V, W]
        self.B = torch.randn(3, W, generator=g) * scale * 0.5  # [3, W]
        self.A[:, V:] = 8.0
        self.tokens = torch.zeros(0, dtype=torch.long)
        self.forward_s = 0.0
        self.device = torch.device("cpu")
        self.extends = 0

    @property
    def width(self) -> int:
        return self.A.shape[1]

    @property
    def length(self) -> int:
        return self.tokens.shape[0]

    def reset(self) -> None:
        self.tokens = self.tokens[:0]
        self.forward_s = 0.0

    def extend(self, tokens: torch.Tensor) -> torch.Tensor:
        assert tokens.numel() > 0
        pos = torch.arange(self.length, self.length + tokens.shape[0])
        self.tokens = torch.cat((self.tokens, tokens.reshape(-1)))
        self.extends += 1
        return self.A[tokens.reshape(-1)] + self.B[pos % 3]  # [n, W]

    def truncate(self, n: int) -> None:
        self.tokens = self.tokens[:n]

    def fresh_logits(self) -> torch.Tensor:
        """Logits of every cached position recomputed from the tokens, [length, W]."""
        return self.A[self.tokens] + self.B[torch.arange(self.length) % 3]


@pytest.fixture
def table_lm():
    """Factory: table_lm(V=48, seed=0, width=None, scale=1.0) -> TableLM."""
    return TableLM


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors gain nothing from intra-op threads, and on a shared, loaded machine an OpenMP
    barrier per op can cost milliseconds; run the engine tests single-threaded."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
