"""Where a llama.cpp verify pass's growth τ(n) − τ(1) goes, read from llama.cpp's own graph, beside the
terms the chain times alone (issue 51: why the terms timed alone add up to more than the pass grows).

llama.cpp's scheduler asks an eval callback about every node of a pass; a node the callback observes ends
a split, so observing every node computes the pass one node at a time on the file's own tensors, in
llama.cpp's own graph, at the model's threads. The wall time between two observations is one node's
compute plus a fixed cost per split (a graph launch and the callback), which cancels in τ(n) − τ(1). Each
node's time is filed under its kind:

  experts    MUL_MAT_ID and the nodes `build_moe_ffn` names ffn_moe_* (the routed experts, their router)
  dense      MUL_MAT against a weight (every other product: projections, shared experts, the output head)
  attention  FLASH_ATTN_EXT (or, without flash attention, the products with the cache and their softmax)
  rest       everything else: norms, RoPE, the cache writes, adds, activations, views' copies

and beside them, on the same file: the whole pass without the callback; R_d(n) (`bench.ggml_rest_op`)
computed right after each pass ("beside"), so that it shares the passes' moments; and, after all the
passes, the chain's own terms timed alone as the characterization times them (`bench.ggml_dense_op`
D(n), R_d(n), 15 interleaved rounds, flush before each compute). A pass's tokens are seeded
random ids at `depth` (what the expert kinds see depends on the text; the kinds compared with R do not).
Run it on a quiet machine:

    python benchmarks/pass_profile.py --model FILE.gguf --depths 512 4096 --out benchmarks/results/pass_profile/NAME.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # benchmarks/llama_cpp.py is not llama_cpp

KINDS = ("experts", "dense", "attention", "rest")


class NodeClock:
    """An eval callback that observes every node and files the time since the last observation under
    the node's kind; `take()` returns {kind: seconds} of the pass since the last take."""

    def __init__(self):
        from moespec.backends import llama_lib

        self._lib, self._g = llama_lib, llama_lib.ggml()
        self.callback = llama_lib.bindings().ggml_backend_sched_eval_callback(self._observe)
        self.spent = dict.fromkeys(KINDS, 0.0)
        self._last = time.perf_counter()

    def start(self) -> None:
        self.spent, self._last = dict.fromkeys(KINDS, 0.0), time.perf_counter()

    def _observe(self, tensor: int, ask: bool, user_data) -> bool:
        if ask:
            return True
        now = time.perf_counter()
        t = ctypes.cast(tensor, ctypes.POINTER(self._lib.GgmlTensor)).contents
        self.spent[self.kind(tensor, t)] += now - self._last
        self._last = time.perf_counter()  # the callback's own time falls outside every node
        return True

    def kind(self, tensor: int, t) -> str:
        op, name = self._g.ggml_op_desc(tensor).decode(), t.name.decode()
        if op == "MUL_MAT_ID" or name.startswith("ffn_moe_"):
            return "experts"
        if op == "FLASH_ATTN_EXT" or name.startswith(("kq-", "kq_soft_max", "kqv-")):
            return "attention"
        if op == "MUL_MAT":
            return "dense"
        return "rest"

    def take(self) -> dict[str, float]:
        return dict(self.spent)


def profile(path: Path, depths: list[int], ns: list[int], threads: int, reps: int, seed: int) -> dict:
    from moespec.backends.llama_model import LlamaModel
    from moespec.bench.characterize import dense_times
    from moespec.bench.ggml_rest_op import MAX_N, RestOfPass, rest_times
    from moespec.bench.timing import CacheFlusher

    clock, flush = NodeClock(), CacheFlusher()
    n_ctx = max(depths) + max(ns) + 8
    rng = np.random.default_rng(seed)
    split = {str(d): {str(n): {k: [] for k in KINDS} for n in ns} for d in depths}
    whole = {str(d): {str(n): [] for n in ns} for d in depths}
    beside = {str(d): {str(n): [] for n in ns} for d in depths}  # R_d timed right after each pass
    with LlamaModel(path, threads=threads, n_ctx=n_ctx, eval_callback=clock.callback) as observed, \
            LlamaModel(path, threads=threads, n_ctx=n_ctx) as plain, \
            RestOfPass(path, threads=threads, max_n=max(MAX_N, *ns)) as rest:
        vocab = min(observed.n_vocab, plain.n_vocab)
        for d in depths:
            for n in ns:  # each graph's first compute is not timed
                rest.time(n, d, reps=1, warmup=1, seed=seed)
        for d in depths:
            context = rng.integers(0, vocab, d).tolist()
            for model in (observed, plain):
                model.reset()
                model.decode(context, first_out=d, keep=False)
            for _ in range(reps):
                for n in rng.permutation(ns).tolist():
                    ids = rng.integers(0, vocab, n).tolist()
                    clock.start()
                    observed.decode(ids, first_out=0, keep=False)
                    for k, s in clock.take().items():
                        split[str(d)][str(n)][k].append(s)
                    observed.truncate(d)
                    t0 = time.perf_counter()
                    plain.decode(ids, first_out=0, keep=False)
                    whole[str(d)][str(n)].append(time.perf_counter() - t0)
                    plain.truncate(d)
                    beside[str(d)][str(n)] += rest.time(n, d, reps=1, warmup=0, flush=flush, seed=seed)
    alone = {"dense": dense_times(str(path), ns, threads, reps=reps, flush=flush)["median"],
             "rest": rest_times(path, ns, depths, threads, reps=reps, flush=flush)["median"]}
    med = lambda xs: float(np.median(xs))  # noqa: E731
    return {"model": str(path), "threads": threads, "reps": reps, "ns": ns, "depths": depths,
            "split_median": {d: {n: {k: med(v) for k, v in kv.items()} for n, kv in dn.items()} for d, dn in split.items()},
            "whole_median": {d: {n: med(v) for n, v in dn.items()} for d, dn in whole.items()},
            "alone_median": alone, "beside_median": {d: {n: med(v) for n, v in dn.items()} for d, dn in beside.items()},
            "split_samples": split, "whole_samples": whole, "beside_samples": beside}


def table(result: dict) -> list[str]:
    ns = result["ns"]
    a, b = str(ns[0]), str(ns[-1])
    lines = [f"growth n = {a} -> {b}, ms (llama.cpp's own graph node by node; the chain's terms timed alone)"]
    for d in map(str, result["depths"]):
        s, w = result["split_median"][d], result["whole_median"][d]
        grow = {k: 1e3 * (s[b][k] - s[a][k]) for k in KINDS}
        dense = 1e3 * (result["alone_median"]["dense"][b] - result["alone_median"]["dense"][a])
        rest = 1e3 * (result["alone_median"]["rest"][d][b] - result["alone_median"]["rest"][d][a])
        near = result.get("beside_median", {}).get(d)
        near = f", R beside the passes {1e3 * (near[b] - near[a]):.1f}" if near else ""
        lines.append(f"d = {d}: whole pass {1e3 * (w[b] - w[a]):.1f} (τ({a}) {1e3 * w[a]:.1f}, τ({b}) {1e3 * w[b]:.1f}); "
                     f"node by node {sum(grow.values()):.1f} = " + ", ".join(f"{k} {v:.1f}" for k, v in grow.items())
                     + f"; alone: D {dense:.1f}, R {rest:.1f}{near} (against llama.cpp's attention + rest "
                     f"{grow['attention'] + grow['rest']:.1f})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--depths", type=int, nargs="+", default=[512])
    parser.add_argument("--ns", type=int, nargs="+", default=[1, 9])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result = profile(args.model, args.depths, sorted(set(args.ns)), args.threads, args.reps, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print("\n".join(table(result)))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
