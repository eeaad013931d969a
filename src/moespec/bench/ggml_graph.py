"""One operation of a GGUF model run alone on ggml-cpu: the shared helper of `ggml_expert_op` (the
expert operation) and `ggml_dense_op` (the dense products).

A `GraphOwner` holds some of the file's tensors in their own types, in one ggml context, and the
graphs built on them (`Plan`: a graph, its work buffer and its thread count), freed together.
Computes are timed by `bench.timing.measure`, the project's one timer. The tensors' data are the
file's own bytes where the file maps them (a ggml CPU buffer over the pages of the file's memory
map), as `LlamaModel` runs them by default (llama.cpp maps its file, repacking off; see its module
docstring): no copy, so a process that runs the file with llama.cpp and times its operations beside
holds each weight page once. Nothing here loads torch.
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
TENSOR_ALIGNMENT = 32  # ggml-impl.h: a CPU buffer over foreign memory must start at a multiple of it


def context(g, nbytes: int, tensors: int, graph_nodes: int = 0, *, no_alloc: bool = False) -> int:
    """A ggml context holding `tensors` tensors of `nbytes` data in all (and a graph of `graph_nodes`);
    no_alloc: the tensors' headers only, their data placed later (`GraphOwner`)."""
    size = nbytes + tensors * (g.ggml_tensor_overhead() + GGML_MEM_ALIGN)
    if graph_nodes:
        size += g.ggml_graph_overhead_custom(graph_nodes, False)
    ctx = g.ggml_init(llama_lib.InitParams(size, None, no_alloc))
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


def _mapped_span(found: Sequence) -> tuple[int, int] | None:
    """(first byte, byte count) of the map's range that holds every tensor of `found`, where each is
    a contiguous view of one memory map starting at a multiple of TENSOR_ALIGNMENT; else None."""
    arrays = [t.data for t in found]
    if not arrays or not all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in arrays):
        return None
    maps = [_map_of(a) for a in arrays]
    if maps[0] is None or any(m is not maps[0] for m in maps):
        return None
    starts = [a.ctypes.data for a in arrays]
    if any(s % TENSOR_ALIGNMENT for s in starts):
        return None
    end = max(s + int(t.n_bytes) for s, t in zip(starts, found))
    return min(starts), end - min(starts)


def _map_of(a: np.ndarray) -> np.memmap | None:
    """The np.memmap over the whole file that `a` views (the root of its bases), else None."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a if isinstance(a, np.memmap) else None


class GraphOwner:
    """A GGUF file's tensors in one ggml context, and the graphs built on them (`Plan`s), freed
    together: close(), or use as a context manager. The tensors' data are the file's memory-mapped
    bytes (`gguf_info.reader`'s map, kept open here) where each tensor starts at a multiple of
    TENSOR_ALIGNMENT, as a GGUF file's data section aligns them; otherwise copies (`mapped` says which)."""

    def __init__(self, path: str | Path, found: Sequence, *, threads: int):
        check_threads(threads)
        self.path, self.threads = Path(path), threads
        self._g = llama_lib.ggml()
        self._graphs: dict = {}
        self._buffer = None
        self.nbytes = sum(int(t.n_bytes) for t in found)
        span = _mapped_span(found)
        self.mapped = span is not None
        if span is None:
            self._ctx = context(self._g, self.nbytes, len(found))
            self.weights = {t.name: self._copy(t) for t in found}  # name -> ggml tensor
            return
        start, size = span
        self._pages = [t.data for t in found]  # the map's views: the map stays open while the tensors read it
        self._ctx = context(self._g, 0, len(found), no_alloc=True)
        self._buffer = self._g.ggml_backend_cpu_buffer_from_ptr(start, size)
        self.weights = {t.name: self._place(t, start, size) for t in found}

    def _new(self, t) -> int:
        g, kind, dims = self._g, int(t.tensor_type), [int(d) for d in t.shape]
        if not 1 <= len(dims) <= 3:
            raise ValueError(f"{self.path}: {t.name} has {len(dims)} dimensions; only 1 to 3 are read")
        new = {1: g.ggml_new_tensor_1d, 2: g.ggml_new_tensor_2d, 3: g.ggml_new_tensor_3d}[len(dims)]
        tensor = new(self._ctx, kind, *dims)
        if g.ggml_nbytes(tensor) != int(t.n_bytes):
            raise ValueError(f"{self.path}: {t.name} holds {int(t.n_bytes)} bytes, but ggml sizes its type {kind} at "
                             f"{g.ggml_nbytes(tensor)}; the file is damaged or newer than this llama.cpp")
        return tensor

    def _copy(self, t) -> int:
        """A tensor of the context holding the GGUF tensor `t` byte for byte, in its own type."""
        tensor = self._new(t)
        write(self._g.ggml_get_data(tensor), np.ascontiguousarray(t.data))
        return tensor

    def _place(self, t, start: int, size: int) -> int:
        """A tensor of the context whose data are `t`'s bytes in the file's map, inside the buffer
        [start, start + size)."""
        tensor = self._new(t)
        status = self._g.ggml_backend_tensor_alloc(self._buffer, tensor, t.data.ctypes.data)
        if status != 0:
            raise RuntimeError(f"ggml could not place {t.name} of {self.path} in its map (status {status})")
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
        if self._buffer:  # a buffer over foreign memory: freeing it frees nothing of the map
            self._g.ggml_backend_buffer_free(self._buffer)
            self._buffer, self._pages = None, []  # the map may close once no tensor reads it
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
