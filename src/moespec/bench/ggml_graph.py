"""One operation of a GGUF model run alone on ggml-cpu: the shared helper of `ggml_expert_op` (the
expert operation) and `ggml_dense_op` (the dense products).

A `GraphOwner` holds copies of some of the file's tensors, byte for byte in their own types
(`copy_tensors`), in one ggml context, and the graphs built on them (`Plan`: a graph, its work
buffer and its thread count), freed together. Computes are timed by `bench.timing.measure`, the
project's one timer. Weights sit in plain context memory, as `LlamaModel` runs them by default
(repacking off; see its module docstring). Nothing here loads torch.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self

import numpy as np

from moespec.backends import llama_lib
from moespec.bench.timing import measure

GGML_TYPE_F32, GGML_TYPE_I32 = 0, 26  # enum ggml_type (ggml.h)
GGML_MEM_ALIGN = 16  # ggml.h: every object of a context is padded to it


def context(g, nbytes: int, tensors: int, graph_nodes: int = 0) -> int:
    """A ggml context holding `tensors` tensors of `nbytes` data in all (and a graph of `graph_nodes`)."""
    size = nbytes + tensors * (g.ggml_tensor_overhead() + GGML_MEM_ALIGN)
    if graph_nodes:
        size += g.ggml_graph_overhead_custom(graph_nodes, False)
    ctx = g.ggml_init(llama_lib.InitParams(size, None, False))
    if not ctx:
        raise MemoryError(f"ggml could not allocate a context of {size} bytes")
    return ctx


class Plan:
    """A graph of `nodes` nodes in a context of `nbytes` (of `tensors` objects) and, once `finish` has
    planned it for `threads` threads, its work buffer; compute() runs it. close() frees it."""

    def __init__(self, g, nbytes: int, tensors: int, nodes: int):
        self.g, self.nodes = g, nodes
        self.ctx = context(g, nbytes, tensors, nodes)
        self.graph = g.ggml_new_graph_custom(self.ctx, nodes, False)
        self.plan = None

    def expand(self, tensor: int) -> int:
        self.g.ggml_build_forward_expand(self.graph, tensor)
        return tensor

    def finish(self, threads: int) -> None:
        self.plan = self.g.ggml_graph_plan(self.graph, threads, None)
        self._work = np.empty(self.plan.work_size + 64, dtype=np.uint8)  # kept alive with the plan
        self.plan.work_data = -self._work.ctypes.data % 64 + self._work.ctypes.data

    def compute(self) -> None:
        status = self.g.ggml_graph_compute(self.graph, ctypes.byref(self.plan))
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute failed with status {status}: {llama_lib.last_log()}")

    def time(self, *, reps: int, warmup: int, flush: Callable[[], None] | None = None) -> list[float]:
        """Seconds of each of `reps` computes after `warmup` untimed ones, `flush` before each."""
        return list(measure(self.compute, reps=reps, warmup=warmup, flush=flush, device="cpu").samples)

    def close(self) -> None:
        if self.ctx:
            self.g.ggml_free(self.ctx)
            self.ctx = None


def write(ptr: int, a: np.ndarray) -> None:
    """Copy a C-contiguous array into a tensor's data."""
    ctypes.memmove(ptr, a.ctypes.data, a.nbytes)


def read_f32(ptr: int, shape: Sequence[int]) -> np.ndarray:
    """A copy of the f32 tensor data at `ptr`, numpy shape `shape` (row-major: ggml's ne reversed)."""
    count = int(np.prod(shape))
    return np.ctypeslib.as_array((ctypes.c_float * count).from_address(ptr)).reshape(shape).copy()


def check_threads(threads: int) -> None:
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be >= 1 (an int), got {threads!r}; use the thread count the model runs with")


class GraphOwner:
    """Copies of a GGUF file's tensors in one ggml context, and the graphs built on them (`Plan`s),
    freed together: close(), or use as a context manager."""

    def __init__(self, path: str | Path, found: Sequence, *, threads: int):
        check_threads(threads)
        self.path, self.threads = Path(path), threads
        self._g = llama_lib.ggml()
        self._graphs: dict = {}
        self._ctx = context(self._g, sum(int(t.n_bytes) for t in found), len(found))
        self.weights = {t.name: self._copy(t) for t in found}  # name -> ggml tensor
        self.nbytes = sum(int(t.n_bytes) for t in found)

    def _copy(self, t) -> int:
        """A tensor of the context holding the GGUF tensor `t` byte for byte, in its own type."""
        g, kind, dims = self._g, int(t.tensor_type), [int(d) for d in t.shape]
        if not 1 <= len(dims) <= 3:
            raise ValueError(f"{self.path}: {t.name} has {len(dims)} dimensions; only 1 to 3 are copied")
        new = {1: g.ggml_new_tensor_1d, 2: g.ggml_new_tensor_2d, 3: g.ggml_new_tensor_3d}[len(dims)]
        tensor = new(self._ctx, kind, *dims)
        data = np.ascontiguousarray(t.data)
        if g.ggml_nbytes(tensor) != data.nbytes:
            raise ValueError(f"{self.path}: {t.name} holds {data.nbytes} bytes, but ggml sizes its type {kind} at "
                             f"{g.ggml_nbytes(tensor)}; the file is damaged or newer than this llama.cpp")
        write(g.ggml_get_data(tensor), data)
        return tensor

    def graph(self, key, build: Callable[[], Plan]) -> Plan:
        """The graph for `key`, built once by `build`; refused once closed."""
        if self._ctx is None:
            raise ValueError(f"the {type(self).__name__} of {self.path} is closed; open a new one")
        if key not in self._graphs:
            self._graphs[key] = build()
        return self._graphs[key]

    def ggml_type(self, name: str) -> str:
        """ggml's name of the type of the copied tensor `name` ("f32", "q8_0", "q4_K", ...)."""
        kind = ctypes.cast(self.weights[name], ctypes.POINTER(ctypes.c_int))[0]  # ggml_tensor's first field
        return self._g.ggml_type_name(kind).decode()

    def close(self) -> None:
        """Free the graphs and the weights (idempotent)."""
        for graph in self._graphs.values():
            graph.close()
        self._graphs = {}
        if self._ctx:
            self._g.ggml_free(self._ctx)
            self._ctx = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: the bindings may already be gone
            self.close()
