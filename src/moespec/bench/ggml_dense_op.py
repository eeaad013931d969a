"""The products of a GGUF model outside its experts, run alone on ggml: the growth with n of a
llama.cpp verify pass that the expert operation does not explain (cost-model paper, Sec. 4's g(n)).

On torch the calibrated version of (22) reads o(n), a verify pass's time outside its experts
modules, inside the passes themselves. A llama.cpp graph has no such split, so here the part of
o(n) that grows with n is timed as the expert operation is (`ggml_expert_op`): the model's dense
matrix products, each `ggml_mul_mat` of one of the file's weights, in its own type, by n rows of
activations, at the model's thread count, with nothing else of the model:

- every 2-D weight of a block that is not an expert tensor: attention q, k, v and output
  projections (or the fused qkv, or DeepSeek's low-rank q/kv projections), the router
  (`ffn_gate_inp`), the dense FFN of leading dense blocks and the shared experts (`ffn_*_shexp`,
  which every token of a pass runs, so a pass reads them once);
- the output head (`output.weight`, or `token_embd.weight` when the file ties them), which a
  verify pass runs on all n rows, since every position's logits are needed.

Left out: the token embedding's row lookup, norms, RoPE, biases, 3-D per-head products (DeepSeek's
`attn_k_b`/`attn_v_b`) and attention's scores over the context, whose cost is small next to these
products and grows with n as little. D(n), the time of all the products at n rows, gives
g(n) = D(n) − D(1) (`chain.prediction`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from moespec.backends import llama_lib
from moespec.bench.ggml_graph import GGML_TYPE_F32, GraphOwner, Plan, read_f32, write
from moespec.models import gguf_info

BLOCK_WEIGHT = re.compile(r"blk\.\d+\.[A-Za-z0-9_]+\.weight")


def dense_tensors(path: str | Path) -> list:
    """The GGUF tensors a pass multiplies rows by, besides the experts (module docstring)."""
    tensors = gguf_info.tensors(path)
    picked = [t for name, t in tensors.items() if BLOCK_WEIGHT.fullmatch(name) and len(t.shape) == 2
              and not gguf_info.EXPERT_TENSOR.fullmatch(name)]
    head = tensors.get("output.weight", tensors.get("token_embd.weight"))
    if head is None:
        raise ValueError(f"{path} has neither output.weight nor token_embd.weight; it is not a language model")
    return picked + [head]


class DenseOps(GraphOwner):
    """The dense products of a GGUF file on ggml-cpu, with explicit lifetime (`close()`, or use as a
    context manager). names: the tensors, in order; nbytes: their bytes in the file's own types."""

    def __init__(self, gguf_path: str | Path, *, threads: int = 1):
        path = llama_lib.check_gguf(gguf_path)
        found = dense_tensors(path)
        super().__init__(path, found, threads=threads)
        self.names = [t.name for t in found]
        self._shapes = [(self.weights[t.name], int(t.shape[0]), int(t.shape[1])) for t in found]  # (tensor, k, rows)

    def _graph(self, n: int) -> "_Graph":
        if n < 1:
            raise ValueError(f"a pass holds n >= 1 tokens, got n = {n}")
        return self.graph(n, lambda: _Graph(self, n))

    def run(self, n: int, *, seed: int = 0) -> list[np.ndarray]:
        """The products at n rows of seeded standard-normal activations: one [n, rows] f32 array per tensor."""
        graph = self._graph(n)
        graph.fill(seed)
        graph.compute()
        return graph.read()

    def time(self, n: int, *, reps: int = 20, warmup: int = 1, flush: Callable[[], None] | None = None) -> list[float]:
        """Seconds of each of `reps` computes of every product at n rows, after `warmup` untimed
        ones; `flush` (a `bench.timing.CacheFlusher`) runs before every call, outside the timing."""
        graph = self._graph(n)
        graph.fill(0)
        return graph.time(reps=reps, warmup=warmup, flush=flush)

    def __repr__(self) -> str:
        return f"DenseOps({self.path.name!r}, {len(self.names)} tensors, {self.nbytes / 2**20:.1f} MiB, threads={self.threads})"


class _Graph(Plan):
    """One graph of every product at n rows: an f32 input [n, k] per distinct inner size k."""

    def __init__(self, ops: DenseOps, n: int):
        weights = ops._shapes
        inner = sorted({k for _, k, _ in weights})
        floats = n * (sum(inner) + sum(rows for _, _, rows in weights))
        count = len(inner) + len(weights)
        super().__init__(ops._g, 4 * floats, count, count + 16)
        g, self.n = self.g, n
        xs = {k: g.ggml_new_tensor_2d(self.ctx, GGML_TYPE_F32, k, n) for k in inner}
        self.inputs = [(g.ggml_get_data(x), k) for k, x in xs.items()]
        self.outputs = [(g.ggml_get_data(self.expand(g.ggml_mul_mat(self.ctx, tensor, xs[k]))), rows)  # [n, rows]
                        for tensor, k, rows in weights]
        self.finish(ops.threads)

    def fill(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        for ptr, k in self.inputs:
            write(ptr, rng.standard_normal((self.n, k)).astype(np.float32))

    def read(self) -> list[np.ndarray]:
        return [read_f32(p, (self.n, rows)) for p, rows in self.outputs]
