"""The experts each token selected in each MoE layer, read from llama.cpp itself while it evaluates a
GGUF file: the routing the user's file really computes, in its own quantization, in about the
memory llama.cpp needs for the file.

llama.cpp's `build_moe_ffn` (src/llama-graph.cpp) names the router's choice `ffn_moe_topk-<block>`:
I32, ggml shape [m, n] (n tokens, m experts each), a view of the argsort whose rows are not
contiguous, so it is read by its strides. It is taken after the expert-group mask and the selection
bias, so DeepSeek's grouped routing and bias-corrected routers read alike. The scheduler's eval
callback (`llama_context_params.cb_eval`) is asked, node by node, whether to observe it; observing
a node splits the graph there and the callback reads the node once it is computed. Only the top-k
nodes (and, when asked, the scores they were chosen from) are observed.

Two rules follow from how llama.cpp builds its graph:
- every position asks for logits, because the last block computes only the output rows otherwise;
- a `RoutingModel` is never timed: the Python callback runs for every node and the splits cost
  time, so it is a model of its own, beside the one a benchmark times.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from moespec.backends import llama_lib
from moespec.backends.llama_model import DEFAULT_BATCH, LlamaModel

TOPK = re.compile(rb"ffn_moe_topk-(\d+)")
# the scores top-k chose from, most specific first (`build_moe_ffn`): group-masked, biased, plain
SCORES = (re.compile(rb"ffn_moe_probs_masked-(\d+)"), re.compile(rb"ffn_moe_probs_biased-(\d+)"),
          re.compile(rb"ffn_moe_probs-(\d+)"))
GGML_I32, GGML_F32 = 26, 0  # enum ggml_type (ggml.h)


def read_rows(t: llama_lib.GgmlTensor, dtype: type) -> np.ndarray:
    """A copy of a 2-D ggml tensor as numpy [ne1, ne0], read through its byte strides nb."""
    if t.ne[2] != 1 or t.ne[3] != 1:
        raise RuntimeError(f"{t.name.decode()} has ggml shape {list(t.ne)}; expected a 2-D tensor")
    cols, rows = int(t.ne[0]), int(t.ne[1])
    item = np.dtype(dtype).itemsize
    if rows == 0:
        return np.empty((0, cols), dtype)
    size = (rows - 1) * int(t.nb[1]) + (cols - 1) * int(t.nb[0]) + item
    buffer = (ctypes.c_char * size).from_address(t.data)
    return np.ndarray((rows, cols), dtype=dtype, buffer=buffer, strides=(int(t.nb[1]), int(t.nb[0]))).copy()


class RoutingModel:
    """A GGUF file on llama.cpp whose passes report the routing of every MoE block.

    `read(ids)` appends ids to the cache (chunks of `batch` tokens, logits at every position) and
    returns {block: [n, m] int32} of the experts each token selected; with `scores=True`,
    `last_scores` holds {block: [n, N] float32}, the scores top-k chose from (for margins).
    Free it with `close()` or a `with` block.
    """

    def __init__(self, path: str | Path, *, threads: int | None = None, n_ctx: int | None = None,
                 batch: int = DEFAULT_BATCH, scores: bool = False):
        self._topk: dict[int, list[np.ndarray]] = {}  # block -> [n, m] per llama_decode call
        self._scores: dict[int, dict[int, list[np.ndarray]]] = {}  # block -> rank in SCORES -> [n, N] per call
        self._error: BaseException | None = None  # raised by read(): ctypes would print and drop it
        self._want_scores = scores
        self.last_scores: dict[int, np.ndarray] = {}
        self._callback = llama_lib.bindings().ggml_backend_sched_eval_callback(self._observe)
        self.model = LlamaModel(path, threads=threads, n_ctx=n_ctx, batch=batch, eval_callback=self._callback)

    def _observe(self, tensor: int, ask: bool, user_data) -> bool:
        try:
            return self._take(ctypes.cast(tensor, ctypes.POINTER(llama_lib.GgmlTensor)).contents, ask)
        except BaseException as e:  # noqa: BLE001  (handed to read(); returning False stops the pass)
            self._error = e
            return False

    def _take(self, t: llama_lib.GgmlTensor, ask: bool) -> bool:
        """Whether to observe node t (ask), else read it; True lets the pass go on."""
        name = t.name
        if not name.startswith(b"ffn_moe_"):
            return False if ask else True
        hit = TOPK.fullmatch(name)
        ranked = [(rank, h) for rank, p in enumerate(SCORES) if self._want_scores and (h := p.fullmatch(name))]
        if ask:
            return bool(hit or ranked)
        if hit:
            if t.type != GGML_I32:
                raise RuntimeError(f"{name.decode()} has ggml type {t.type}, not I32")
            self._topk.setdefault(int(hit.group(1)), []).append(read_rows(t, np.int32))
        for rank, h in ranked:
            block = self._scores.setdefault(int(h.group(1)), {})
            block.setdefault(rank, []).append(read_rows(t, np.float32))
        return True

    @property
    def length(self) -> int:
        return self.model.length

    @property
    def capacity(self) -> int:
        return self.model.capacity

    def read(self, ids: Sequence[int]) -> dict[int, np.ndarray]:
        """{block: [n, m] int32}: the experts each of the n tokens `ids` selected, the cache extended by them."""
        ids = [int(t) for t in ids]
        self._topk, self._scores, self._error = {}, {}, None
        self.model.decode(ids, first_out=0, keep=False)
        if self._error is not None:
            raise RuntimeError(f"reading the routing of {self.model.path.name} failed: {self._error}") from self._error
        out = {block: np.concatenate(parts) for block, parts in sorted(self._topk.items())}
        short = {b: len(a) for b, a in out.items() if len(a) != len(ids)}
        if short:  # a block that saw fewer rows than the pass held would misalign the trace
            raise RuntimeError(f"llama.cpp reported the routing of {short} rows in blocks {sorted(short)} for a "
                               f"pass of {len(ids)} tokens")
        self.last_scores = {b: np.concatenate(ranks[min(ranks)]) for b, ranks in sorted(self._scores.items())}
        return out

    def truncate(self, n: int) -> None:
        self.model.truncate(n)

    def reset(self) -> None:
        self.model.reset()

    def close(self) -> None:
        self.model.close()

    def __enter__(self) -> "RoutingModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def top_margin(scores: np.ndarray, m: int) -> np.ndarray:
    """[n]: the gap between each row's m-th and (m+1)-th largest score of scores [n, N], how near the
    router was to choosing otherwise."""
    ranked = -np.sort(-scores, axis=1)
    return ranked[:, m - 1] - ranked[:, m]
