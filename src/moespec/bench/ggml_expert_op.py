"""llama.cpp's expert operation of one MoE layer, run alone on a GGUF file's own weights (cost-model
paper, Sec. 2 "Effective bandwidth", Table 1, App. E eq. (E.1)).

The paper measures an engine's effective bandwidth on the expert operation of one layer, run with
no other part of the model, on passes of n tokens whose expert ids are given. On llama.cpp that
operation is ggml's `mul_mat_id`, so `ExpertLayer` builds, with ggml's C API through ctypes, the
ops llama.cpp's `build_moe_ffn` (src/llama-graph.cpp) adds after the router, in the layout the file
holds (`models.gguf_info.layout`):

    up = mul_mat_id(ffn_up_exps, x, ids); gate = mul_mat_id(ffn_gate_exps, x, ids)
        (or one mul_mat_id of a merged ffn_gate_up_exps, split into two views; each + its bias by
        add_id where the file has expert biases, as gpt-oss does)
    act = swiglu(gate, up) (silu(gate) * up; gpt-oss: swiglu_oai, alpha 1.702, limit 7; grok: geglu)
    down = mul_mat_id(ffn_down_exps, act, ids) (+ bias)
    out = sum over the m slots of (down * weights)         (views and adds, as llama.cpp does)

and runs them with the same ggml-cpu kernels and thread count as the model, on the layer's expert
tensors read in place from the file's map (`ggml_graph.GraphOwner`; f32, f16, q8_0, q4_K ...: never
dequantized). No
attention, no router, no shared expert (a dense product, `ggml_dense_op`): ids [n, m] and routing
weights [n, m] are inputs.

Two kernels, in the paper's terms:
- grouped (deduplicating): one `mul_mat_id` over the pass's n rows; ggml-cpu groups the rows by
  expert, so each distinct expert is read once per pass;
- per-slot: n independent one-row chains in one graph, so each selected expert is read once per
  (token, slot), the paper's per-slot reference.

`mul_mat_id` aborts the process on an expert id out of range, so ids are checked here first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from moespec.backends import llama_lib
from moespec.bench.ggml_graph import GGML_TYPE_F32, GGML_TYPE_I32, GraphOwner, Plan, read_f32, write
from moespec.models import gguf_info

# n = tokens of a pass, m = experts per token (top_k), N = experts of the layer, H = hidden size,
# F = expert FFN size; numpy shapes are row-major, the reverse of ggml's ne order
PARTS = ("gate", "up", "down")
SWIGLU_OAI = (1.702, 7.0)  # llama.cpp's alpha and limit of gpt-oss's activation (LLM_FFN_SWIGLU_OAI_MOE)


def _in_range(layer: int, blocks: int, path: Path, arch: str) -> None:
    if not 0 <= layer < blocks:
        raise ValueError(f"layer {layer} is out of range for {path} ({arch}, {blocks} layers); pick one of "
                         f"0..{blocks - 1}")


class ExpertLayer(GraphOwner):
    """The expert operation of block `layer` of a GGUF file on ggml-cpu (module docstring), with
    explicit lifetime (`close()`, or use as a context manager).

    num_experts N, top_k m (`{arch}.expert_used_count`), hidden H, ffn F; expert_bytes: the bytes of
    one expert over its tensors (biases included) in the file's own types, what one read of an
    expert moves (w_l of Sec. 2); type_name: ggml's name of the tensors' type (per part if mixed).
    """

    def __init__(self, gguf_path: str | Path, layer: int, *, threads: int = 1):
        path = llama_lib.check_gguf(gguf_path)
        self.layer = layer
        self._ctx, self._graphs = None, {}
        arch = gguf_info.field(path, "general.architecture")
        blocks = gguf_info.field(path, f"{arch}.block_count")
        if blocks is not None:
            _in_range(layer, int(blocks), path, arch)
        self.layout = lay = gguf_info.layout(path)
        _in_range(layer, lay.blocks, path, arch)
        if layer not in lay.moe_layers:
            raise ValueError(f"{path} ({arch}) has no expert tensors in block {layer}: its MoE layers are "
                             f"{list(lay.moe_layers)}; give one of them")
        found = [t for name, t in gguf_info.tensors(path).items()
                 if (hit := gguf_info.EXPERT_TENSOR.fullmatch(name)) and int(hit.group(1)) == layer]
        super().__init__(path, found, threads=threads)
        self.num_experts, self.top_k, self.hidden, self.ffn = lay.num_experts, lay.top_k, lay.hidden, lay.expert_ffn
        self.expert_bytes = self.nbytes // self.num_experts
        weights = [name for name in self.weights if name.endswith(".weight")]
        names = [self.ggml_type(name) for name in weights]
        self.type_name = names[0] if len(set(names)) == 1 else ",".join(
            f"{n.split('.')[2].removeprefix('ffn_').removesuffix('_exps')}={t}" for n, t in zip(weights, names))

    def _tensor(self, part: str, kind: str = "weight") -> int | None:
        return self.weights.get(f"blk.{self.layer}.ffn_{part}_exps.{kind}")

    def _ffn(self, step: Plan, x: int, ids: int, w: int, rows: int) -> int:
        """llama.cpp's `build_moe_ffn` after the router for `rows` tokens: x [rows, 1, H] f32,
        ids [rows, m] i32, w [rows, m, 1] f32 -> the output tensor [rows, H] f32."""
        g, ctx, m, F, H = step.g, step.ctx, self.top_k, self.ffn, self.hidden

        def product(part: str, a: int) -> int:  # mul_mat_id, then the part's bias where the file has one
            out = g.ggml_mul_mat_id(ctx, self._tensor(part), a, ids)
            bias = self._tensor(part, "bias")
            return out if bias is None else g.ggml_add_id(ctx, out, bias, ids)

        if self.layout.merged_gate_up:
            both = product("gate_up", x)  # [rows, m, 2F]
            gate, up = (g.ggml_view_3d(ctx, both, F, m, rows, 2 * F * 4, 2 * F * m * 4, off * F * 4) for off in (0, 1))
        else:
            up = product("up", x)  # [rows, m, F]
            gate = product("gate", x) if self._tensor("gate") is not None else None
        if self.layout.activation == "swiglu_oai":
            act = g.ggml_swiglu_oai(ctx, gate, up, *SWIGLU_OAI)
        elif gate is None:
            act = g.ggml_silu(ctx, up)
        else:
            act = (g.ggml_geglu_split if self.layout.activation == "gelu" else g.ggml_swiglu_split)(ctx, gate, up)
        experts = step.expand(g.ggml_mul(ctx, product("down", act), w))  # [rows, m, H]
        views = [step.expand(g.ggml_view_2d(ctx, experts, H, rows, m * H * 4, i * H * 4)) for i in range(m)]
        out = views[0]
        for view in views[1:]:
            out = step.expand(g.ggml_add(ctx, out, view))
        return g.ggml_cont(ctx, out) if m == 1 else out

    def _pass(self, n: int, grouped: bool) -> "_Pass":
        return self.graph((n, grouped), lambda: _Pass(self, n, grouped))

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
        return step.time(reps=reps, warmup=warmup, flush=flush)

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


class _Pass(Plan):
    """The built graph for passes of n tokens of an ExpertLayer: its inputs and outputs.
    grouped: one chain of n rows; per-slot: n chains of one row."""

    def __init__(self, layer: ExpertLayer, n: int, grouped: bool):
        m, H, F = layer.top_k, layer.hidden, layer.ffn
        self.n, self.hidden = n, H
        self.rows = n if grouped else 1
        chains = n // self.rows
        per_chain = 3 * m + 16  # inputs, products, biases, views, activation, weighting, m views, m - 1 adds
        floats = self.rows * (H + 2 * m + 6 * F * m + 4 * H * m)
        super().__init__(layer._g, chains * 4 * floats, chains * per_chain, chains * per_chain + 16)
        g = self.g
        self.inputs, self.outputs = [], []  # per chain: data pointers of (x, ids, w); of out
        for _ in range(chains):
            x = g.ggml_new_tensor_3d(self.ctx, GGML_TYPE_F32, H, 1, self.rows)
            ids = g.ggml_new_tensor_2d(self.ctx, GGML_TYPE_I32, m, self.rows)
            w = g.ggml_new_tensor_3d(self.ctx, GGML_TYPE_F32, 1, m, self.rows)
            out = self.expand(layer._ffn(self, x, ids, w, self.rows))
            self.inputs.append(tuple(g.ggml_get_data(t) for t in (x, ids, w)))
            self.outputs.append(g.ggml_get_data(out))
        self.finish(layer.threads)

    def set(self, x: np.ndarray, ids: np.ndarray, w: np.ndarray) -> None:
        """Write one pass's inputs: x [n, H] f32, ids [n, m] i32, w [n, m] f32 (C-contiguous)."""
        for c, pointers in enumerate(self.inputs):
            rows = slice(c * self.rows, (c + 1) * self.rows)
            for ptr, a in zip(pointers, (x[rows], ids[rows], w[rows])):
                write(ptr, np.ascontiguousarray(a))

    def read(self) -> np.ndarray:
        """[n, H] f32: the outputs of the last compute, copied."""
        return np.concatenate([read_f32(p, (self.rows, self.hidden)) for p in self.outputs])


class WindowTimer:
    """llama.cpp's expert operation of some MoE layers (indices into `gguf_info.expert_layers`) timed on
    the verified windows right after each verify pass, the ggml counterpart of
    `verify.operation_timer`: `for_document(doc)` gives f(n, kernel, start) -> [L] seconds, one timed
    call per layer on rows [start, start + n) of the document's routing, `flush` before each. The
    per-slot kernel runs n one-token reads, the deduplicating one llama.cpp's grouped `mul_mat_id`
    (`ExpertLayer`). close() frees the layers."""

    def __init__(self, gguf_path: str | Path, layers: Sequence[int], *, threads: int,
                 flush: Callable[[], None] | None = None):
        blocks = gguf_info.expert_layers(gguf_path)
        self.flush, self.layers = flush, {}
        try:
            for l in layers:
                self.layers[int(l)] = ExpertLayer(gguf_path, blocks[int(l)], threads=threads)
        except BaseException:
            self.close()
            raise

    def for_document(self, doc: np.ndarray) -> Callable[[int, str, int], list[float]]:
        """doc: one verified continuation's routing [T, L, m]."""
        from moespec.bench.timing import measure
        from moespec.kernel_names import COST_DEDUP, TO_COST

        def timed(n: int, kernel: str, start: int = 0) -> list[float]:
            if start + n > doc.shape[0]:
                raise ValueError(f"the verified continuation has {doc.shape[0]} tokens, the pass reads "
                                 f"[{start}, {start + n}); record it longer (`moespec trace-verified`)")
            grouped = TO_COST[kernel] == COST_DEDUP
            return [measure(layer.prepare(np.asarray(doc[start:start + n, l]), grouped=grouped), reps=1, warmup=0,
                            flush=self.flush, device="cpu").samples[0]
                    for l, layer in self.layers.items()]

        return timed

    def close(self) -> None:
        for layer in self.layers.values():
            layer.close()

    def __enter__(self) -> "WindowTimer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
