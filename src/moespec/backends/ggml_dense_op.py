"""The products of a GGUF model outside its experts, run alone on ggml: the growth with n of a
llama.cpp verify pass that the expert operation does not explain (cost-model paper, Sec. 4's g(n)).

On torch the calibrated version of (22) reads o(n), a verify pass's time outside its experts
modules, inside the passes themselves. A llama.cpp graph has no such split, so here the part of
o(n) that grows with n is timed as the expert operation is (`ggml_expert_op`): the model's dense
matrix products, each `ggml_mul_mat` of one of the file's weights, in its own type, by n rows of
activations, at the model's thread count, with nothing else of the model:

- every 2-D weight of a block that is not an expert tensor: attention q, k, v and output
  projections (or the fused qkv), the router (`ffn_gate_inp`), dense and shared-expert FFNs;
- the output head (`output.weight`, or `token_embd.weight` when the file ties them), which a
  verify pass runs on all n rows, since every position's logits are needed.

Left out: the token embedding's row lookup, norms, RoPE and attention's scores over the context,
whose cost is small next to these products and grows with n as little. D(n), the time of all the
products at n rows, gives g(n) = D(n) − D(1) (`bench.prediction`).
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from moespec.backends import llama_lib
from moespec.backends.ggml_expert_op import GGML_TYPE_F32, GraphOwner, _context, _gguf_reader, ggml
from moespec.bench.timing import measure

BLOCK_WEIGHT = re.compile(r"blk\.\d+\.[A-Za-z0-9_]+\.weight")


def dense_tensors(reader) -> list:
    """The GGUF tensors a pass multiplies rows by, besides the experts (module docstring)."""
    tensors = {t.name: t for t in reader.tensors}
    picked = [t for name, t in tensors.items() if BLOCK_WEIGHT.fullmatch(name) and len(t.shape) == 2
              and "_exps" not in name]
    head = tensors.get("output.weight", tensors.get("token_embd.weight"))
    if head is None:
        raise ValueError("the file has neither output.weight nor token_embd.weight; it is not a language model")
    return picked + [head]


class DenseOps(GraphOwner):
    """The dense products of a GGUF file on ggml-cpu, with explicit lifetime (`close()`, or use as a
    context manager). names: the tensors, in order; nbytes: their bytes in the file's own types."""

    def __init__(self, gguf_path: str | Path, *, threads: int = 1):
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}; use the thread count the model runs with")
        path = llama_lib.check_gguf(gguf_path)
        self.path, self.threads = path, threads
        self._graphs: dict[int, _Graph] = {}
        found = dense_tensors(_gguf_reader(path))
        g = self._g = ggml()
        self._ctx = _context(g, sum(int(t.n_bytes) for t in found), len(found))
        self._weights, self.names = [], [t.name for t in found]
        for t in found:
            kind, (k, rows) = int(t.tensor_type), (int(d) for d in t.shape)
            tensor = g.ggml_new_tensor_2d(self._ctx, kind, k, rows)
            data = np.ascontiguousarray(t.data)
            if g.ggml_nbytes(tensor) != data.nbytes:
                raise ValueError(f"{path}: {t.name} holds {data.nbytes} bytes, but ggml sizes its type {kind} at "
                                 f"{g.ggml_nbytes(tensor)}; the file is damaged or newer than this llama.cpp")
            ctypes.memmove(g.ggml_get_data(tensor), data.ctypes.data, data.nbytes)
            self._weights.append((tensor, k, rows))
        self.nbytes = sum(int(t.n_bytes) for t in found)

    def _graph(self, n: int) -> _Graph:
        if self._ctx is None:
            raise ValueError(f"the DenseOps of {self.path} are closed; open new ones")
        if n < 1:
            raise ValueError(f"a pass holds n >= 1 tokens, got n = {n}")
        if n not in self._graphs:
            self._graphs[n] = _Graph(self._g, self._weights, n, self.threads)
        return self._graphs[n]

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
        return list(measure(graph.compute, reps=reps, warmup=warmup, flush=flush, device="cpu").samples)

    def __repr__(self) -> str:
        return f"DenseOps({self.path.name!r}, {len(self.names)} tensors, {self.nbytes / 2**20:.1f} MiB, threads={self.threads})"


class _Graph:
    """One graph of every product at n rows: an f32 input [n, k] per distinct inner size k."""

    def __init__(self, g, weights, n: int, threads: int):
        self.g, self.n = g, n
        inner = sorted({k for _, k, _ in weights})
        floats = n * (sum(inner) + sum(rows for _, _, rows in weights))
        count = len(inner) + len(weights)
        self.ctx = _context(g, 4 * floats, count, count + 16)
        self.graph = g.ggml_new_graph_custom(self.ctx, count + 16, False)
        xs = {k: g.ggml_new_tensor_2d(self.ctx, GGML_TYPE_F32, k, n) for k in inner}
        self.inputs = [(g.ggml_get_data(x), k) for k, x in xs.items()]
        self.outputs = []
        for tensor, k, rows in weights:
            y = g.ggml_mul_mat(self.ctx, tensor, xs[k])  # [n, rows]
            g.ggml_build_forward_expand(self.graph, y)
            self.outputs.append((g.ggml_get_data(y), rows))
        self.plan = g.ggml_graph_plan(self.graph, threads, None)
        self._work = np.empty(self.plan.work_size + 64, dtype=np.uint8)
        self.plan.work_data = -self._work.ctypes.data % 64 + self._work.ctypes.data

    def fill(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        for ptr, k in self.inputs:
            x = rng.standard_normal((self.n, k)).astype(np.float32)
            ctypes.memmove(ptr, x.ctypes.data, x.nbytes)

    def compute(self) -> None:
        status = self.g.ggml_graph_compute(self.graph, ctypes.byref(self.plan))
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute failed with status {status}: {llama_lib.last_log()}")

    def read(self) -> list[np.ndarray]:
        return [np.ctypeslib.as_array((ctypes.c_float * (self.n * rows)).from_address(p)).reshape(self.n, rows).copy()
                for p, rows in self.outputs]

    def close(self) -> None:
        if self.ctx:
            self.g.ggml_free(self.ctx)
            self.ctx = None
