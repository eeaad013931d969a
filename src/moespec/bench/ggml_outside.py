"""A llama.cpp verify pass's time outside its expert operation, o(n) = D(n) + R_d(n), timed beside
each pass: the calibrated (22)'s g(n) = o(n) − o(1) (cost-model paper, Sec. 4) on an engine whose graph
has no split at its experts modules.

D(n) is the file's dense products (`ggml_dense_op`), R_d(n) the rest of the pass at depth d
(`ggml_rest_op`). The characterization times them alone, minutes before the verify passes; a pass's
growth τ(n) − τ(1) moves by 54–72 ms minute to minute on a drifting host (benchmarks/pass_profile.py,
BENCHMARKS "llama.cpp's own graph, node by node"), so a term timed apart misses the passes it is added
to by that drift, while R_d computed right after each pass grew as llama.cpp's own attention and rest
to 0–2.5%. `OutsideOfPass` is called by `verify.time_passes` right after each pass, so every o(n)
sample shares its pass's moment, as the expert operation timed between passes does on torch.

Both terms read the file's weights in place (`ggml_graph.GraphOwner`), the same pages the llama.cpp
model maps: timing them beside the passes holds no second copy of the file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from moespec.bench.ggml_dense_op import DenseOps
from moespec.bench.ggml_rest_op import MAX_N, RestOfPass

TERMS = ("dense", "rest")  # D(n), R_d(n): the keys of a pass's outside times (`VerifyTimes.outside`)


class OutsideOfPass:
    """f(n, depth) -> {"dense": D(n), "rest": R_d(n)}, seconds of one compute each, `flush` before
    each (as the passes are flushed before); close() frees both graphs' owners."""

    def __init__(self, gguf_path: str | Path, *, threads: int, max_n: int,
                 flush: Callable[[], None] | None = None, seed: int = 0):
        self.flush, self.seed = flush, seed
        self.dense = DenseOps(gguf_path, threads=threads)
        try:
            self.rest = RestOfPass(gguf_path, threads=threads, max_n=max(MAX_N, int(max_n)))
        except BaseException:
            self.dense.close()
            raise

    def __call__(self, n: int, depth: int, *, warmup: int = 0) -> dict[str, float]:
        """One timed compute of D(n) and of R_d(n) after `warmup` untimed ones (a graph's first
        compute allocates and first touches its buffers: warm each (n, depth) once before timing)."""
        return {"dense": self.dense.time(n, reps=1, warmup=warmup, flush=self.flush)[0],
                "rest": self.rest.time(n, depth, reps=1, warmup=warmup, flush=self.flush, seed=self.seed)[0]}

    def close(self) -> None:
        self.dense.close()
        self.rest.close()

    def __enter__(self) -> "OutsideOfPass":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
