"""llama.cpp's expert operation of one MoE layer, run alone on a GGUF file's own weights (cost-model
paper, Sec. 2 "Effective bandwidth", Table 1, App. E eq. (E.1)).

The paper measures an engine's effective bandwidth on the expert operation of one layer, run with
no other part of the model, on passes of n tokens whose expert ids are given. On llama.cpp that
operation is ggml's `mul_mat_id`, so `ExpertLayer` builds, with ggml's C API through ctypes, the
ops llama.cpp's `build_moe_ffn` (src/llama-graph.cpp) adds after the router for olmoe and qwen3moe:

    up = mul_mat_id(ffn_up_exps, x, ids); gate = mul_mat_id(ffn_gate_exps, x, ids)
    down = mul_mat_id(ffn_down_exps, swiglu_split(gate, up), ids)
    out = sum over the m slots of (down * weights)         (views and adds, as llama.cpp does)

and runs them with the same ggml-cpu kernels and thread count as the model, on the layer's three
expert tensors copied byte for byte from the file (f32, f16, q8_0, q4_K ...: never dequantized).
No attention, no router: ids [n, m] and routing weights [n, m] are inputs. Weights sit in plain
context memory, as `LlamaModel` runs them by default (repacking off; see its module docstring).

Two kernels, in the paper's terms:
- grouped (deduplicating): one `mul_mat_id` over the pass's n rows; ggml-cpu groups the rows by
  expert, so each distinct expert is read once per pass;
- per-slot: n independent one-row chains in one graph, so each selected expert is read once per
  (token, slot), the paper's per-slot reference.

`mul_mat_id` aborts the process on an expert id out of range, so ids are checked here first.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Self

import numpy as np

from moespec.backends import llama_lib
from moespec.bench.timing import measure

# n = tokens of a pass, m = experts per token (top_k), N = experts of the layer, H = hidden size,
# F = expert FFN size; numpy shapes are row-major, the reverse of ggml's ne order
GGML_TYPE_F32, GGML_TYPE_I32 = 0, 26  # enum ggml_type (ggml.h)
GGML_MEM_ALIGN = 16  # ggml.h: every object of a context is padded to it
PARTS = ("gate", "up", "down")
GGUF_HINT = "pip install gguf (the GGUF reader of llama.cpp's gguf-py)"


class _InitParams(ctypes.Structure):
    """struct ggml_init_params (ggml.h)."""

    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class _CPlan(ctypes.Structure):
    """struct ggml_cplan (ggml-cpu.h): the work buffer and threads of one graph compute."""

    _fields_ = [("work_size", ctypes.c_size_t), ("work_data", ctypes.c_void_p), ("n_threads", ctypes.c_int),
                ("threadpool", ctypes.c_void_p), ("abort_callback", ctypes.c_void_p),
                ("abort_callback_data", ctypes.c_void_p), ("use_ref", ctypes.c_bool)]


_P, _I64, _SZ, _INT, _BOOL = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t, ctypes.c_int, ctypes.c_bool
_SIGNATURES = {  # name: (library, result type, argument types), as declared in ggml.h and ggml-cpu.h
    "ggml_init": ("base", _P, [_InitParams]),
    "ggml_free": ("base", None, [_P]),
    "ggml_tensor_overhead": ("base", _SZ, []),
    "ggml_graph_overhead_custom": ("base", _SZ, [_SZ, _BOOL]),
    "ggml_type_name": ("base", ctypes.c_char_p, [_INT]),
    "ggml_new_tensor_2d": ("base", _P, [_P, _INT, _I64, _I64]),
    "ggml_new_tensor_3d": ("base", _P, [_P, _INT, _I64, _I64, _I64]),
    "ggml_get_data": ("base", _P, [_P]),
    "ggml_nbytes": ("base", _SZ, [_P]),
    "ggml_mul_mat": ("base", _P, [_P, _P, _P]),
    "ggml_mul_mat_id": ("base", _P, [_P, _P, _P, _P]),
    "ggml_swiglu_split": ("base", _P, [_P, _P, _P]),
    "ggml_mul": ("base", _P, [_P, _P, _P]),
    "ggml_add": ("base", _P, [_P, _P, _P]),
    "ggml_cont": ("base", _P, [_P, _P]),
    "ggml_view_2d": ("base", _P, [_P, _P, _I64, _I64, _SZ, _SZ]),
    "ggml_new_graph_custom": ("base", _P, [_P, _SZ, _BOOL]),
    "ggml_build_forward_expand": ("base", None, [_P, _P]),
    "ggml_cpu_init": ("cpu", None, []),
    "ggml_graph_plan": ("cpu", _CPlan, [_P, _INT, _P]),
    "ggml_graph_compute": ("cpu", _INT, [_P, ctypes.POINTER(_CPlan)]),
}


def _load(llama_cpp, stem: str) -> ctypes.CDLL:
    """The copy of lib{stem} that llama.cpp itself loaded: by its soname first (glibc hands back the
    loaded object), else from llama-cpp-python's lib folder. Loading `libggml-base.so` by path would
    map a second copy of ggml (the .so and .so.0 files are copies, not links)."""
    folder = Path(llama_cpp.__file__).parent / "lib"
    tried = []
    for name in (f"lib{stem}.so.0", *(str(folder / f"lib{stem}{ext}") for ext in (".so.0", ".so", ".dylib"))):
        try:
            return ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            tried.append(f"{name}: {e}")
    raise ValueError(f"cannot load ggml's lib{stem} from llama-cpp-python ({'; '.join(tried)}); "
                     f"reinstall it: {llama_lib.INSTALL_HINT}")


@cache
def ggml():
    """ggml's functions (a namespace of ctypes functions), with ggml-cpu initialized once."""
    llama_cpp = llama_lib.bindings()
    libs = {"base": _load(llama_cpp, "ggml-base"), "cpu": _load(llama_cpp, "ggml-cpu")}

    class Functions:
        pass

    for name, (lib, restype, argtypes) in _SIGNATURES.items():
        fn = getattr(libs[lib], name)
        fn.restype, fn.argtypes = restype, argtypes
        setattr(Functions, name, staticmethod(fn))
    Functions.ggml_cpu_init()
    return Functions


def _context(g, nbytes: int, tensors: int, graph_nodes: int = 0) -> int:
    """A ggml context holding `tensors` tensors of `nbytes` data in all (and a graph of `graph_nodes`)."""
    size = nbytes + tensors * (g.ggml_tensor_overhead() + GGML_MEM_ALIGN)
    if graph_nodes:
        size += g.ggml_graph_overhead_custom(graph_nodes, False)
    ctx = g.ggml_init(_InitParams(size, None, False))
    if not ctx:
        raise MemoryError(f"ggml could not allocate a context of {size} bytes")
    return ctx


def _moe_ffn(g, ctx, graph, exps, x, ids, w, rows: int, m: int, hidden: int) -> int:
    """llama.cpp's `build_moe_ffn` after the router, for `rows` tokens: x [rows, 1, H] f32,
    ids [rows, m] i32, w [rows, m, 1] f32 -> the output tensor [rows, H] f32."""
    gate_exps, up_exps, down_exps = exps
    up = g.ggml_mul_mat_id(ctx, up_exps, x, ids)  # [rows, m, F]
    gate = g.ggml_mul_mat_id(ctx, gate_exps, x, ids)  # [rows, m, F]
    act = g.ggml_swiglu_split(ctx, gate, up)  # silu(gate) * up, [rows, m, F]
    experts = g.ggml_mul(ctx, g.ggml_mul_mat_id(ctx, down_exps, act, ids), w)  # [rows, m, H]
    g.ggml_build_forward_expand(graph, experts)
    row = hidden * 4  # bytes of one f32 slot row
    views = [g.ggml_view_2d(ctx, experts, hidden, rows, m * row, i * row) for i in range(m)]  # [rows, H] each
    for view in views:
        g.ggml_build_forward_expand(graph, view)
    out = views[0]
    for view in views[1:]:
        out = g.ggml_add(ctx, out, view)
        g.ggml_build_forward_expand(graph, out)
    return g.ggml_cont(ctx, out) if m == 1 else out


class _Pass:
    """The built graph for passes of n tokens: its input tensors, output tensors and work buffer.
    grouped: one chain of n rows; per-slot: n chains of one row."""

    def __init__(self, g, exps, n: int, m: int, hidden: int, ffn: int, grouped: bool, threads: int):
        self.g, self.n, self.m, self.hidden = g, n, m, hidden
        self.rows = n if grouped else 1
        chains = n // self.rows
        per_chain = 2 * m + 9  # x, ids, w, up, gate, act, down, weighted, m views, m - 1 adds, cont
        floats = self.rows * (hidden + 2 * m + 3 * ffn * m + 2 * hidden * m + m * hidden)
        nodes = chains * per_chain + 16
        self.ctx = _context(g, chains * 4 * floats, chains * per_chain, nodes)
        self.graph = g.ggml_new_graph_custom(self.ctx, nodes, False)
        self.inputs, self.outputs = [], []  # per chain: data pointers of (x, ids, w); of out
        for _ in range(chains):
            x = g.ggml_new_tensor_3d(self.ctx, GGML_TYPE_F32, hidden, 1, self.rows)
            ids = g.ggml_new_tensor_2d(self.ctx, GGML_TYPE_I32, m, self.rows)
            w = g.ggml_new_tensor_3d(self.ctx, GGML_TYPE_F32, 1, m, self.rows)
            out = _moe_ffn(g, self.ctx, self.graph, exps, x, ids, w, self.rows, m, hidden)
            g.ggml_build_forward_expand(self.graph, out)
            self.inputs.append(tuple(g.ggml_get_data(t) for t in (x, ids, w)))
            self.outputs.append(g.ggml_get_data(out))
        self.plan = g.ggml_graph_plan(self.graph, threads, None)
        self._work = np.empty(self.plan.work_size + 64, dtype=np.uint8)  # kept alive with the plan
        self.plan.work_data = -self._work.ctypes.data % 64 + self._work.ctypes.data

    def set(self, x: np.ndarray, ids: np.ndarray, w: np.ndarray) -> None:
        """Write one pass's inputs: x [n, H] f32, ids [n, m] i32, w [n, m] f32 (C-contiguous)."""
        for c, pointers in enumerate(self.inputs):
            rows = slice(c * self.rows, (c + 1) * self.rows)
            for ptr, a in zip(pointers, (x[rows], ids[rows], w[rows])):
                ctypes.memmove(ptr, a.ctypes.data, a.nbytes)

    def compute(self) -> None:
        status = self.g.ggml_graph_compute(self.graph, ctypes.byref(self.plan))
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute failed with status {status}: {llama_lib.last_log()}")

    def read(self) -> np.ndarray:
        """[n, H] f32: the outputs of the last compute, copied."""
        count = self.rows * self.hidden
        parts = [np.ctypeslib.as_array((ctypes.c_float * count).from_address(p)) for p in self.outputs]
        return np.concatenate(parts).reshape(self.n, self.hidden).copy()

    def close(self) -> None:
        if self.ctx:
            self.g.ggml_free(self.ctx)
            self.ctx = None


def _gguf_reader(path: Path):
    try:
        import gguf
    except ImportError as e:
        raise ValueError(f"reading {path} needs the gguf package ({e}); install it with: {GGUF_HINT}") from None
    return gguf.GGUFReader(str(path))


def _meta(reader, key: str, path: Path):
    field = reader.fields.get(key)
    if field is None:
        raise ValueError(f"{path} has no metadata key {key!r}; export the model with it (convert_hf_to_gguf.py "
                         "or `moespec export-gguf` write it for MoE architectures)")
    return field.contents()


class GraphOwner:
    """Weights in one ggml context (`_ctx`, of the bindings `_g`) and the graphs built on them
    (`_graphs`, each with a close()), freed together: close(), or use as a context manager."""

    _ctx = None
    _graphs: dict

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


class ExpertLayer(GraphOwner):
    """The expert operation of layer `layer` of a GGUF file on ggml-cpu (module docstring), with
    explicit lifetime (`close()`, or use as a context manager).

    num_experts N, top_k m (`{arch}.expert_used_count`), hidden H, ffn F; expert_bytes: the bytes of
    one expert over its gate, up and down tensors in the file's own types, what one read of an
    expert moves (w_l of Sec. 2); type_name: ggml's name of the tensors' type (per part if mixed).
    """

    def __init__(self, gguf_path: str | Path, layer: int, *, threads: int = 1):
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}; use the thread count the model runs with")
        path = llama_lib.check_gguf(gguf_path)
        self.path, self.layer, self.threads = path, layer, threads
        self._ctx, self._graphs = None, {}
        reader = _gguf_reader(path)
        arch = _meta(reader, "general.architecture", path)
        blocks = int(_meta(reader, f"{arch}.block_count", path))
        if not 0 <= layer < blocks:
            raise ValueError(f"layer {layer} is out of range for {path} ({arch}, {blocks} layers); pick one of "
                             f"0..{blocks - 1}")
        tensors = {t.name: t for t in reader.tensors}
        found = [tensors.get(f"blk.{layer}.ffn_{part}_exps.weight") for part in PARTS]
        if any(t is None for t in found):
            moe = sorted({int(name.split(".")[1]) for name in tensors if name.endswith("_exps.weight")})
            where = f"its MoE layers are {moe}" if moe else "it is a dense model, with no expert tensors"
            raise ValueError(f"{path} ({arch}) has no blk.{layer}.ffn_{{gate,up,down}}_exps.weight tensors: {where}; "
                             "give an MoE model's file and one of its MoE layers")
        self.top_k = int(_meta(reader, f"{arch}.expert_used_count", path))
        (self.hidden, self.ffn, self.num_experts) = (int(d) for d in found[0].shape)
        want = {"gate": (self.hidden, self.ffn), "up": (self.hidden, self.ffn), "down": (self.ffn, self.hidden)}
        for part, t in zip(PARTS, found):
            if tuple(int(d) for d in t.shape) != (*want[part], self.num_experts):
                raise ValueError(f"{path} layer {layer}: ffn_{part}_exps has shape {list(t.shape)} (ggml order), "
                                 f"not {[*want[part], self.num_experts]}; the file is not an olmoe/qwen3moe-style MoE")
        self._load(found)

    def _load(self, found) -> None:
        """Copy the three expert tensors, in their own type, into a ggml context of their own."""
        g = ggml()
        self._g = g
        self._ctx = _context(g, sum(int(t.n_bytes) for t in found), len(found))
        self._exps, names, self.part_bytes = [], [], {}
        for part, t in zip(PARTS, found):
            kind = int(t.tensor_type)
            tensor = g.ggml_new_tensor_3d(self._ctx, kind, *(int(d) for d in t.shape))
            data = np.ascontiguousarray(t.data)
            if g.ggml_nbytes(tensor) != data.nbytes:
                raise ValueError(f"{self.path} layer {self.layer}: ffn_{part}_exps holds {data.nbytes} bytes, but ggml "
                                 f"sizes its type {kind} at {g.ggml_nbytes(tensor)}; the file is damaged or newer "
                                 "than this llama.cpp")
            ctypes.memmove(g.ggml_get_data(tensor), data.ctypes.data, data.nbytes)
            self._exps.append(tensor)
            names.append(g.ggml_type_name(kind).decode())
            self.part_bytes[part] = data.nbytes
        self.type_name = names[0] if len(set(names)) == 1 else ",".join(f"{p}={n}" for p, n in zip(PARTS, names))
        self.expert_bytes = sum(self.part_bytes.values()) // self.num_experts

    def inputs(self, ids, weights=None, x=None, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Checked (x [n, H] f32, ids [n, m] i32, weights [n, m] f32); weights default to 1/m, x to a
        standard normal activation drawn with `seed`."""
        ids = np.asarray(ids)
        if ids.ndim != 2 or ids.shape[0] < 1 or ids.shape[1] != self.top_k or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"ids must be integers of shape [n, m={self.top_k}] with n >= 1, got {ids.dtype} "
                             f"{list(ids.shape)}; give each token's top_k expert ids")
        if ids.min() < 0 or ids.max() >= self.num_experts:
            bad = ids[(ids < 0) | (ids >= self.num_experts)][0]
            raise ValueError(f"expert id {bad} is outside 0..{self.num_experts - 1} (layer {self.layer} of {self.path}); "
                             "ggml would abort the process on it")
        n = ids.shape[0]
        weights = np.full((n, self.top_k), 1.0 / self.top_k) if weights is None else np.asarray(weights)
        x = np.random.default_rng(seed).standard_normal((n, self.hidden)) if x is None else np.asarray(x)
        for name, a, shape in (("weights", weights, (n, self.top_k)), ("x", x, (n, self.hidden))):
            if a.shape != shape:
                raise ValueError(f"{name} has shape {list(a.shape)}, but ids {list(ids.shape)} need {list(shape)}")
        as_c = np.ascontiguousarray
        return as_c(x, dtype=np.float32), as_c(ids, dtype=np.int32), as_c(weights, dtype=np.float32)

    def _pass(self, n: int, grouped: bool) -> _Pass:
        if self._ctx is None:
            raise ValueError(f"the ExpertLayer of {self.path} is closed; open a new one")
        key = (n, grouped)
        if key not in self._graphs:
            self._graphs[key] = _Pass(self._g, self._exps, n, self.top_k, self.hidden, self.ffn, grouped, self.threads)
        return self._graphs[key]

    def run(self, ids, weights=None, x=None, grouped: bool = True) -> np.ndarray:
        """[n, H] f32: the expert operation on ids [n, m], weights [n, m] (default 1/m), x [n, H]
        (default: seeded random); grouped=False runs the per-slot read (n one-row chains)."""
        x, ids, weights = self.inputs(ids, weights, x)
        step = self._pass(ids.shape[0], grouped)
        step.set(x, ids, weights)
        step.compute()
        return step.read()

    def time(self, ids, *, grouped: bool = True, reps: int = 20, warmup: int = 1,
             flush: Callable[[], None] | None = None) -> list[float]:
        """Seconds of each of `reps` graph computes on ids [n, m] (default weights and x), after
        `warmup` untimed ones; the graph is built and its inputs written outside the timed interval.
        `flush` (a `bench.timing.CacheFlusher`) runs before every call, as App. D does."""
        x, ids, weights = self.inputs(ids)
        step = self._pass(ids.shape[0], grouped)
        step.set(x, ids, weights)
        return list(measure(step.compute, reps=reps, warmup=warmup, flush=flush, device="cpu").samples)

    def prepare(self, ids, *, grouped: bool = True, seed: int = 0) -> Callable[[], None]:
        """A call of the operation on ids [n, m] (default weights, x drawn with `seed`) for a benchmark
        that interleaves many passes (`bench.expert_op.run`): each call writes its pass's inputs into
        the graph of its size, then computes. The write is n(H + 2m) floats, microseconds against
        the milliseconds of the expert reads."""
        x, ids, weights = self.inputs(ids, seed=seed)
        step = self._pass(ids.shape[0], grouped)

        def call() -> None:
            step.set(x, ids, weights)
            step.compute()

        return call

    def __repr__(self) -> str:
        return (f"ExpertLayer({self.path.name!r}, layer={self.layer}, N={self.num_experts}, m={self.top_k}, "
                f"H={self.hidden}, F={self.ffn}, {self.type_name}, threads={self.threads})")
