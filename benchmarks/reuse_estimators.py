"""Time of the reuse analysis (App. D.2 estimators with a 2000-resample bootstrap) on a large trace.

Builds a synthetic sticky-router trace — by default 1M tokens x 16 layers x m = 8 of N = 64, in
documents of 2,000 tokens — and times, with `moespec.bench.timing.measure`: building the validated
RoutingTrace plus `analyze` (rho_l(n), U_l(n), u_bar, rho_bar_k, U/(nm) for n = 1..9, bootstrap
over documents), and the Parquet save and load of the same trace. Goal: the analysis under a minute.

    python benchmarks/reuse_estimators.py --out results/reuse_estimators.json
    python benchmarks/reuse_estimators.py --tokens 100000 --reps 1 --out /tmp/re.json   # smoke run
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from moespec import artifacts
from moespec.bench.timing import measure
from moespec.moe import synthetic_routing as sr
from moespec.moe.reuse import analyze
from moespec.moe.traces import RoutingTrace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1_000_000)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--m", type=int, default=8)
    ap.add_argument("--N", type=int, default=64)
    ap.add_argument("--doc-tokens", type=int, default=2000)
    ap.add_argument("--rho2", type=float, default=0.4, help="next-token reuse of the sticky router")
    ap.add_argument("--n-max", type=int, default=9)
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    routing = sr.sticky(args.tokens, args.layers, args.m, args.N, args.rho2, rng)
    docs = [routing[a : a + args.doc_tokens] for a in range(0, args.tokens, args.doc_tokens)]
    w = [3 * 2048 * 1024 * 4] * args.layers  # OLMoE-width float32 experts
    result = {}

    def run_analysis():
        result["a"] = analyze(RoutingTrace(docs, args.N, w), args.n_max, resamples=args.resamples, seed=args.seed)

    timings = {"trace + analyze": measure(run_analysis, reps=args.reps, warmup=0, device="cpu")}
    trace = RoutingTrace(docs, args.N, w)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.parquet"
        timings["save (Parquet)"] = measure(lambda: trace.save(path), reps=args.reps, warmup=0, device="cpu")
        timings["load + validate"] = measure(lambda: RoutingTrace.load(path), reps=args.reps, warmup=0, device="cpu")
        file_bytes = path.stat().st_size

    a = result["a"]
    truth = sr.sticky_reuse(args.n_max, args.m, args.N, args.rho2)
    table = Table("stage", "median s", "Mtokens/s", title=f"{args.tokens} tokens x {args.layers} layers x m={args.m}, "
                  f"N={args.N}, {len(docs)} documents, {args.resamples} resamples")
    for name, t in timings.items():
        table.add_row(name, f"{t.median:.2f}", f"{args.tokens / t.median / 1e6:.2f}")
    Console().print(table)
    Console().print(f"rho(n) layer mean {np.round(a.rho_mean.value, 4).tolist()}; truth {np.round(truth, 4).tolist()}; "
                    f"file {file_bytes / 1e6:.1f} MB")
    artifacts.write(args.out, "bench-reuse-estimators", {
        "config": vars(args) | {"out": str(args.out), "documents": len(docs)},
        "timings": {k: t.to_dict() for k, t in timings.items()},
        "file_bytes": file_bytes, "rho_mean": list(a.rho_mean.value), "rho_truth": truth.tolist(),
    })


if __name__ == "__main__":
    main()
