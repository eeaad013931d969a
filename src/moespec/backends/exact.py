"""One target function for every pass: `exact=True` (`moespec generate --exact`).

Speculative decoding is lossless when the verify pass computes the same function as the plain
decoding it replaces. On llama.cpp it does not: a token's logits depend on how many tokens its pass
holds (`benchmarks/llama_cpp.py`, README). A one-token pass takes other kernels than a longer one
(llamafile's sgemm from two rows on, flash attention's split-KV path for one query), and on K-quant
weights a pass of eight or more rows takes the tiled kernel; flash attention tiles passes of 64 or
more queries. With flash attention off (`load_llama(exact=True)` opens the model so) and the tiled
kernel off (`exact_llama_environment`), passes of two or more tokens, with two or more output rows,
agree bit for bit: every size 2..64, every prefill chunking, 1 or 2 threads, on nine files measured.

`ExactPasses` therefore never runs a one-token pass nor asks for one output row: a plain round
feeds two tokens, re-feeding the last committed one after removing it from the cache, and a prefill
returns its last two rows. Greedy output is then the same tokens at every k ("auto" included) and
in plain decoding under exact, and the sampling law is that function's; it costs a two-token pass
per plain step (`benchmarks/llama_cpp.py` measures it against llama.cpp's one-token step).
"""

from __future__ import annotations

import os

import torch

from moespec.backends.protocol import GreedyByLogits, SpecModel, output_rows

MIN_PASS = 2  # tokens, and output rows, of every pass


class ExactPasses(GreedyByLogits):
    """A SpecModel whose passes all hold >= 2 tokens and >= 2 output rows (a one-token prompt aside)."""

    def __init__(self, inner: SpecModel):
        self.inner = inner
        self._last: list[int] = []  # the tokens the cache holds

    forward_s = property(lambda self: self.inner.forward_s, lambda self, v: setattr(self.inner, "forward_s", v))
    length = property(lambda self: self.inner.length)
    width = property(lambda self: self.inner.width)
    vocab_limit = property(lambda self: self.inner.vocab_limit)
    capacity = property(lambda self: getattr(self.inner, "capacity", None))
    device = property(lambda self: getattr(self.inner, "device", None))

    def reset(self) -> None:
        self.inner.reset()
        self._last = []

    def truncate(self, n: int) -> None:
        self.inner.truncate(n)
        del self._last[n:]

    def extend(self, tokens: torch.Tensor, outputs: int | None = None) -> torch.Tensor:
        tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        n = tokens.shape[0]
        rows = output_rows(n, outputs)
        if n == 1 and self._last:  # re-feed the last cached token with it
            held = len(self._last)
            self.inner.truncate(held - 1)
            logits = self.inner.extend(torch.tensor([self._last[-1], int(tokens[0])]), outputs=MIN_PASS)[1:]
        else:
            logits = self.inner.extend(tokens, outputs=min(max(rows, MIN_PASS), n))[-rows:]
        self._last.extend(tokens.tolist())
        return logits

    def identity(self) -> dict | None:
        """The inner model's, marked: this wrapper runs other passes than its model (None stays None)."""
        inner = self.inner.identity()
        return None if inner is None else {**inner, "wrapper": type(self).__name__}

    def __repr__(self) -> str:
        return f"ExactPasses({self.inner!r})"


def exact_llama_environment() -> None:
    """Turn llama.cpp's tiled K-quant kernel off (GGML_CPU_TILED_MM=0), so that passes of 2..7 rows and
    of 8 or more compute alike. ggml reads the variable once, at its first matrix product in the
    process; a process that already decoded with it on raises."""
    from moespec.backends import llama_lib

    if os.environ.get("GGML_CPU_TILED_MM") != "0" and llama_lib.decoded():
        raise ValueError("exact=True needs GGML_CPU_TILED_MM=0 before llama.cpp's first pass in this process; set "
                         "it in the environment, or load the exact model before any other llama.cpp decoding")
    os.environ["GGML_CPU_TILED_MM"] = "0"
