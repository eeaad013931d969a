"""The rest of a llama.cpp verify pass, run alone on ggml: R_d(n), the work of a pass of n tokens at
context depth d outside the weight products (`ggml_dense_op`'s D(n)) and the routed experts
(`ggml_expert_op`), a named term of the calibrated (22) (cost-model paper, Sec. 4's g(n)).

On a CPU more of a pass grows with n than on a GPU: attention reads the KV cache once per query
row, and every elementwise op touches n rows. The graph holds, per block of the file, with the
shapes its GGUF header gives (heads, kv heads, key and value head sizes, RoPE dimensions, ε, the
sliding window) and the same ops llama.cpp's graph runs (src/llama-graph.cpp `build_attn_mha`,
`build_moe_ffn`, `build_norm`; src/models/*.cpp):

- every RMS norm of the block: `rms_norm` then `mul` by the file's own norm weight, over the rows
  that norm sees (n, or n per head for per-head q/k norms);
- RoPE (`rope_ext`) on q [head_k, heads, n] and k [head_k, kv_heads, n] at positions d..d+n−1;
- the KV cache writes (`set_rows` of k and v into the block's f16 cache, llama.cpp's default type);
- attention against d + n positions: `flash_attn_ext`, which llama.cpp runs by default on the CPU
  (flash_attn_type AUTO resolves to enabled: ggml-cpu supports it), over the cells llama.cpp reads
  (`llama_kv_cache::get_n_kv`: padded to a multiple of 256, at least 256) with its causal mask, f32
  accumulation; gpt-oss's sliding-window blocks over their own smaller cache and window;
- DeepSeek's absorbed multi-head latent attention where the file has it (`attn_k_b`, `attn_v_b`):
  those two per-head products around attention, and one cache of keys whose first columns are the
  values (llama.cpp's `build_attn` on a keys-only cache);
- the biases of the products (`blk.*.bias`, the experts' own excepted), the two residual adds
  (three with shared experts), the router's `soft_max`, `argsort_top_k` and weight `get_rows`, and
  the SwiGLU of a dense FFN or of shared experts;
- the final norm. Inputs are seeded random activations; the caches hold random f16 values.

Left out: the token embedding's rows, attention sinks, the routing weights' normalization, MLA's
concatenations, the copy of the logits out of the graph, and the context's own size where it caps
the cells read below the padding. Nothing here loads torch.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from moespec.backends import llama_lib
from moespec.bench.ggml_graph import GGML_TYPE_F32, GGML_TYPE_I32, GraphOwner, Plan, context, write
from moespec.bench.pass_shape import PassShape, pass_shape, rest_tensors

GGML_TYPE_F16, GGML_TYPE_I64, GGML_PREC_F32 = 1, 27, 10  # ggml.h
KV_PAD = 256  # llama_kv_cache::get_n_kv: the cells attention reads, padded to this, at least this
UBATCH = 512  # llama.cpp's n_ubatch: a sliding-window cache holds window + n_ubatch cells
MAX_N = 64  # the largest pass the caches leave room for


def kv_cells(positions: int) -> int:
    """The cache cells llama.cpp's attention reads when `positions` are filled (get_n_kv)."""
    return max(KV_PAD, -(-positions // KV_PAD) * KV_PAD)


class RestOfPass(GraphOwner):
    """The rest of a pass of a GGUF file on ggml-cpu (module docstring), with explicit lifetime
    (`close()`, or use as a context manager). shape: its `PassShape`; max_n: the largest pass."""

    def __init__(self, gguf_path: str | Path, *, threads: int = 1, max_n: int = MAX_N):
        path = llama_lib.check_gguf(gguf_path)
        self.shape = pass_shape(path)
        self.max_n = int(max_n)
        self._caches: dict[int, tuple[int, list[tuple[int, int]]]] = {}  # depth -> (context, [(k, v)] per block)
        super().__init__(path, rest_tensors(path), threads=threads)

    def cells(self, n: int, depth: int, swa: bool = False) -> int:
        """The cache cells a block's attention reads on a pass of n tokens at `depth`."""
        full = kv_cells(depth + n)
        return min(full, self.shape.window + UBATCH) if swa else full

    def norm_weight(self, block: int, name: str) -> int:
        return self.weights["output_norm.weight" if block < 0 else f"blk.{block}.{name}.weight"]

    def cache(self, depth: int) -> list[tuple[int, int | None]]:
        """Each block's (K, V) f16 cache at `depth` (room for max_n more), filled with seeded random
        values; V is None under absorbed MLA, whose values are a view of the keys."""
        if depth not in self._caches:
            s, g = self.shape, self._g
            rows = [self.cells(self.max_n, depth, b in s.swa_blocks) for b in range(s.blocks)]
            widths = (s.head_k * s.kv_heads,) if s.mla else (s.head_k * s.kv_heads, s.head_v * s.kv_heads)
            ctx = context(g, 2 * sum(r * sum(widths) for r in rows), len(widths) * s.blocks)
            made = [tuple(g.ggml_new_tensor_2d(ctx, GGML_TYPE_F16, w, r) for w in widths) for r in rows]
            rng = np.random.default_rng(depth)
            fill = [rng.standard_normal(w * max(rows)).astype(np.float16) for w in widths]
            for tensors, r in zip(made, rows):
                for tensor, values, w in zip(tensors, fill, widths):
                    write(g.ggml_get_data(tensor), values[: w * r])
            self._caches[depth] = (ctx, [(*kv, None)[:2] for kv in made])
        return self._caches[depth][1]

    def _graph(self, n: int, depth: int) -> "_Graph":
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= self.max_n:
            raise ValueError(f"a pass holds 1 <= n <= {self.max_n} tokens, got n = {n!r}; give RestOfPass a larger "
                             "max_n for larger passes")
        if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 0:
            raise ValueError(f"depth must be a token count >= 0, got {depth!r}")
        return self.graph((int(n), int(depth)), lambda: _Graph(self, int(n), int(depth)))

    def time(self, n: int, depth: int, *, reps: int = 20, warmup: int = 1,
             flush: Callable[[], None] | None = None, seed: int = 0) -> list[float]:
        """Seconds of each of `reps` computes of the rest of a pass of n tokens at `depth`, after
        `warmup` untimed ones; `flush` (a `bench.timing.CacheFlusher`) runs before every call."""
        graph = self._graph(n, depth)
        graph.fill(seed)
        return graph.time(reps=reps, warmup=warmup, flush=flush)

    def attention(self, n: int, depth: int, block: int = 0) -> dict[str, list[int]]:
        """ggml's ne of block `block`'s flash-attention node and its q, k, v, mask: {name: ne}."""
        node = self._graph(n, depth).attention[block]
        read = lambda p: list(llama_lib.GgmlTensor.from_address(p).ne)  # noqa: E731
        src = llama_lib.GgmlTensor.from_address(node).src
        return {"out": read(node), **{name: read(src[i]) for i, name in enumerate(("q", "k", "v", "mask"))}}

    def run_attention(self, n: int, depth: int, block: int = 0, *, seed: int = 0) -> dict[str, np.ndarray]:
        """One compute at n rows and `depth`, then block `block`'s attention as numpy arrays: q [n, heads,
        head_k] after RoPE, k [cells, kv_heads, head_k] and v [cells, kv_heads, head_v] as cached (f16
        values), mask [n, cells] and out [n, heads, head_v]; for checking against a direct computation."""
        graph, s = self._graph(n, depth), self.shape
        graph.fill(seed)
        graph.compute()
        cells = graph.cells[block in s.swa_blocks]
        k, v = self.cache(depth)[block]

        def read(tensor: int, shape: tuple, kind=ctypes.c_float, dtype=np.float32) -> np.ndarray:
            count = int(np.prod(shape))
            raw = (kind * count).from_address(self._g.ggml_get_data(tensor))
            return np.ctypeslib.as_array(raw).view(dtype).reshape(shape).astype(np.float32)

        half = dict(kind=ctypes.c_uint16, dtype=np.float16)
        keys = read(k, (cells, s.kv_heads, s.head_k), **half)
        values = keys[..., : s.head_v] if v is None else read(v, (cells, s.kv_heads, s.head_v), **half)
        return {"q": read(graph.queries[block], (n, s.heads, s.head_k)), "k": keys, "v": values,
                "mask": read(graph.mask[block in s.swa_blocks], (n, cells), **half),
                "out": read(graph.attention[block], (n, s.heads, s.head_v))}

    def close(self) -> None:
        super().close()
        for ctx, _ in self._caches.values():
            self._g.ggml_free(ctx)
        self._caches = {}

    def __repr__(self) -> str:
        s = self.shape
        return (f"RestOfPass({self.path.name!r}, {s.architecture}, {s.blocks} blocks, heads={s.heads}/{s.kv_heads}, "
                f"head={s.head_k}/{s.head_v}, threads={self.threads})")


def _budget(s: PassShape, n: int, cells: Sequence[int]) -> tuple[int, int]:
    """(data bytes, objects) that bound a graph's context: every op's f32 result over n rows, twice
    over (ggml aborts the process on a context too small), plus masks and index tables."""
    per_block = (8 * s.hidden + 3 * (s.heads + s.kv_heads) * s.head_k + 3 * s.kv_heads * s.head_v
                 + 2 * s.heads * s.head_v + 4 * s.experts + (3 * s.heads * sum(s.mla) if s.mla else 0))
    floats = n * (s.blocks * per_block + 3 * sum(w for _, w in s.ffn) + 3 * sum(w * r for _, _, w, r in s.norms)
                  + 2 * sum(w for _, _, w in s.biases))
    objects = 56 * s.blocks + 3 * len(s.norms) + 3 * len(s.ffn) + 2 * len(s.biases) + 64
    return 8 * floats + sum(2 * n * c for c in cells) + 64 * n + (1 << 20), objects


class _Graph(Plan):
    """One graph of the rest of a pass of n tokens at `depth`: every block's ops, then the final norm.
    Inputs are shared by shape across blocks (read only); `attention` holds each block's node."""

    def __init__(self, ops: RestOfPass, n: int, depth: int):
        s, self.n, self.depth, self.eps = ops.shape, n, depth, ops.shape.eps
        caches = ops.cache(depth)
        self.cells = {swa: ops.cells(n, depth, swa) for swa in ((False, True) if s.swa_blocks else (False,))}
        data, objects = _budget(s, n, list(self.cells.values()))
        super().__init__(ops._g, data, objects, objects)
        self.inputs: dict[tuple, int] = {}
        self.attention: list[int] = []
        self.queries: list[int] = []  # each block's q after RoPE, [head_k, heads, n]
        self._tables(s)
        for block in range(s.blocks):
            for b, name, width, rows in s.norms:
                if b == block:
                    self._norm(ops.norm_weight(b, name), width, rows)
            self._attention(ops, block, caches[block])
            self._ffn(s, block)
        for b, name, width, rows in s.norms:
            if b < 0:
                self._norm(ops.norm_weight(b, name), width, rows)
        self.finish(ops.threads)

    def input(self, *ne: int) -> int:
        """The f32 input of ggml shape `ne` (made once, filled by `fill`)."""
        if ne not in self.inputs:
            new = {1: self.g.ggml_new_tensor_1d, 2: self.g.ggml_new_tensor_2d, 3: self.g.ggml_new_tensor_3d}[len(ne)]
            self.inputs[ne] = new(self.ctx, GGML_TYPE_F32, *ne)
        return self.inputs[ne]

    def _table(self, kind: int, values: np.ndarray) -> int:
        """A constant input holding `values` (numpy row-major, ggml's ne reversed)."""
        new = {1: self.g.ggml_new_tensor_1d, 2: self.g.ggml_new_tensor_2d}[values.ndim]
        tensor = new(self.ctx, kind, *reversed(values.shape))
        write(self.g.ggml_get_data(tensor), np.ascontiguousarray(values))
        return tensor

    def _tables(self, s: PassShape) -> None:
        """Positions d..d+n−1, and per cache kind the rows the pass writes and llama.cpp's mask [n, cells]:
        0 where a query sees a cell (causal; within the window on sliding-window blocks), else −inf."""
        n, d = self.n, self.depth
        query = np.arange(d, d + n)
        self.pos = self._table(GGML_TYPE_I32, query.astype(np.int32))
        self.rows, self.mask = {}, {}
        for swa, cells in self.cells.items():
            base = max(0, d + n - cells)  # the position of a sliding-window cache's first cell
            seen = base + np.arange(cells)[None, :] <= query[:, None]
            if swa:
                seen &= query[:, None] - (base + np.arange(cells)[None, :]) < s.window
            self.rows[swa] = self._table(GGML_TYPE_I64, (query - base).astype(np.int64))
            self.mask[swa] = self._table(GGML_TYPE_F16, np.where(seen, 0.0, -np.inf).astype(np.float16))

    def _norm(self, weight: int, width: int, rows: int) -> None:
        g, ctx = self.g, self.ctx
        self.expand(g.ggml_mul(ctx, g.ggml_rms_norm(ctx, self.input(width, rows * self.n), self.eps), weight))

    def _rope(self, s: PassShape, heads: int) -> int:
        g, ctx, n = self.g, self.ctx, self.n
        x = g.ggml_reshape_3d(ctx, self.input(s.head_k * heads, n), s.head_k, heads, n)
        return self.expand(g.ggml_rope_ext(ctx, x, self.pos, None, s.rope_dims, s.rope_mode, 0, s.freq_base, 1.0, 0.0,
                                           1.0, 32.0, 1.0))

    def _attention(self, ops: RestOfPass, block: int, cache: tuple[int, int | None]) -> None:
        """RoPE, the cache writes and flash attention over the cells llama.cpp reads (`build_attn_mha`);
        under absorbed MLA one cache of keys, the values a view of their first head_v columns."""
        s, g, ctx, n, swa = ops.shape, self.g, self.ctx, self.n, block in ops.shape.swa_blocks
        cells = self.cells[swa]
        q, k = self._rope(s, s.heads), self._rope(s, s.kv_heads)
        self.queries.append(q)
        kc, vc = cache
        width_k, width_v = s.head_k * s.kv_heads, s.head_v * s.kv_heads
        self.expand(g.ggml_set_rows(ctx, kc, g.ggml_view_2d(ctx, k, width_k, n, 4 * width_k, 0), self.rows[swa]))
        if vc is not None:
            self.expand(g.ggml_set_rows(ctx, vc, self.input(width_v, n), self.rows[swa]))

        def heads(c: int, head: int, row: int) -> int:  # [head, cells, kv_heads] of a cache of rows `row` wide
            view = g.ggml_view_3d(ctx, c, head, s.kv_heads, cells, 2 * (row // s.kv_heads), 2 * row, 0)
            return g.ggml_permute(ctx, view, 0, 2, 1, 3)

        K = heads(kc, s.head_k, width_k)
        V = heads(kc, s.head_v, width_k) if vc is None else heads(vc, s.head_v, width_v)
        out = g.ggml_flash_attn_ext(ctx, g.ggml_permute(ctx, q, 0, 2, 1, 3), K, V, self.mask[swa],
                                    1.0 / float(np.sqrt(s.head_k)), 0.0, 0.0)
        g.ggml_prec_set_acc(out, GGML_PREC_F32)
        self.attention.append(self.expand(out))
        if s.mla:
            self._absorbed(ops, block, out)
        for b, name, width in s.biases:
            if b == block:
                self.expand(g.ggml_add(ctx, self.input(width, n), ops.weights[f"blk.{b}.{name}.bias"]))

    def _absorbed(self, ops: RestOfPass, block: int, out: int) -> None:
        """DeepSeek's absorbed MLA around attention (src/models/deepseek2.cpp): the query's no-RoPE part
        into kv_lora_rank per head (`attn_k_b`), attention's output back to each head's values (`attn_v_b`)."""
        s, g, ctx, n = ops.shape, self.g, self.ctx, self.n
        nope = s.mla[0]
        self.expand(g.ggml_mul_mat(ctx, ops.weights[f"blk.{block}.attn_k_b.weight"], self.input(nope, n, s.heads)))
        up = g.ggml_mul_mat(ctx, ops.weights[f"blk.{block}.attn_v_b.weight"], g.ggml_permute(ctx, out, 0, 2, 1, 3))
        self.expand(g.ggml_cont(ctx, g.ggml_permute(ctx, up, 0, 2, 1, 3)))

    def _ffn(self, s: PassShape, block: int) -> None:
        """The residual adds, the router's softmax, top-k and weights, and the SwiGLU of a dense FFN
        or of shared experts (`build_moe_ffn`, `build_ffn`)."""
        g, ctx, n, H = self.g, self.ctx, self.n, s.hidden
        ffn_in = self.expand(g.ggml_add(ctx, self.input(H, n), self.input(H, n)))
        if block in s.moe_blocks and s.experts:
            probs = self.expand(g.ggml_soft_max(ctx, self.input(s.experts, n)))
            chosen = g.ggml_argsort_top_k(ctx, probs, s.top_k)
            self.expand(g.ggml_get_rows(ctx, g.ggml_reshape_3d(ctx, probs, 1, s.experts, n), chosen))
        widths = [w for b, w in s.ffn if b == block]
        for width in widths:
            self.expand(g.ggml_swiglu_split(ctx, self.input(width, n), self.input(width, n)))
        if widths and block in s.moe_blocks:  # the shared experts' output joins the routed experts'
            ffn_in = self.expand(g.ggml_add(ctx, ffn_in, self.input(H, n)))
        self.expand(g.ggml_add(ctx, ffn_in, self.input(H, n)))

    def fill(self, seed: int) -> None:
        """Seeded standard-normal activations in every f32 input."""
        rng = np.random.default_rng(seed)
        for ne, tensor in self.inputs.items():
            write(self.g.ggml_get_data(tensor), rng.standard_normal(int(np.prod(ne))).astype(np.float32))


REST_REPS = 15  # timed computes per (depth, n), as the dense products'


def rest_times(path: str | Path, ns: Sequence[int], depths: Sequence[int], threads: int, *, reps: int = REST_REPS,
               warmup: int = 1, flush: Callable[[], None] | None = None, seed: int = 0) -> dict:
    """R_d(n) of a GGUF file at each n of `ns` and depth d of `depths`: `reps` rounds over every
    (d, n), each round in a fresh seeded order (drift falls on all alike), `flush` before every
    compute; medians and every sample in seconds, {str(d): {str(n): ...}}, and the shape timed."""
    depths, ns = sorted({int(d) for d in depths}), sorted({int(n) for n in ns})
    pairs = [(d, n) for d in depths for n in ns]
    samples: dict[tuple[int, int], list[float]] = {p: [] for p in pairs}
    rng = np.random.default_rng(seed)
    with RestOfPass(path, threads=threads, max_n=max(MAX_N, *ns)) as ops:
        for d, n in pairs:  # each graph's first compute (allocation, first touch) is not timed
            ops.time(n, d, reps=1, warmup=warmup, seed=seed)
        for _ in range(reps):
            for i in rng.permutation(len(pairs)):
                d, n = pairs[i]
                samples[d, n] += ops.time(n, d, reps=1, warmup=0, flush=flush, seed=seed)
        shape = ops.shape.to_dict()
    return {"depths": depths, "threads": threads, "shape": shape,
            "median": {str(d): {str(n): float(np.median(samples[d, n])) for n in ns} for d in depths},
            "samples": {str(d): {str(n): samples[d, n] for n in ns} for d in depths}}
