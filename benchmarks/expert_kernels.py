"""Effective bandwidth of the expert kernels at OLMoE widths, side by side (cost-model paper, Sec. 2).

One experts module of OLMoE's widths (hidden 2048, 64 experts x intermediate 1024, top-8), float32,
pass sizes n = 1..9, two kinds of expert ids: random routing (each token m distinct experts drawn
uniformly) and chosen ids with repeats (`moespec.bench.expert_op.chosen_passes`: U from m to
min(N, nm)). Every kernel runs on the same passes in one run, alternating within each pass:
moespec's per-slot and dedup beside transformers' eager, grouped_mm and batched_mm.

Effective bandwidth beta_p(n) = requested bytes / time, bytes and median times summed over the
passes of each n (as Table 1): nmb for per-slot (and batched_mm, which gathers one copy per slot),
Ub for dedup, eager and grouped_mm. The roof is this machine's streaming read bandwidth (a sum over
>= 512 MB). Recorded: r(n) = beta_dedup(n) / beta_slot(n) on random routing.

    python benchmarks/expert_kernels.py --out results/expert_kernels.json
    python benchmarks/expert_kernels.py --n 1 2 5 9 --reps 3 --out /tmp/ek.json   # smoke run
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from moespec import artifacts
from moespec.bench import expert_op
from moespec.bench.timing import CacheFlusher, read_bandwidth
from moespec.models.synthetic import build
from moespec.moe.experts import expert_bytes, expert_views

KERNELS = ("slot", "dedup", "eager", "grouped_mm", "batched_mm")


def random_passes(n_values, m: int, N: int, count: int, seed: int) -> list[expert_op.Pass]:
    """`count` passes per n with independent uniform routing: each token m distinct experts of N."""
    rng = np.random.default_rng(seed)
    return [
        expert_op.Pass("random", n, "uniform", i, tuple(tuple(rng.permutation(N)[:m].tolist()) for _ in range(n)))
        for n in n_values
        for i in range(count)
    ]


def summarize(records: list[dict], read_bw: float) -> list[dict]:
    """One row per (source, n, kernel): summed bytes over summed median times (Table 1's rule)."""
    sums: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for r in records:
        s = sums[(r["source"], r["n"], r["kernel"])]
        s[0] += r["bytes"]
        s[1] += r["timing"]["median"]
        s[2] += 1
    rows = []
    for (source, n, kernel), (nbytes, seconds, passes) in sorted(sums.items()):
        beta = nbytes / seconds
        rows.append(
            dict(source=source, n=n, kernel=kernel, passes=passes, bytes=nbytes, seconds=seconds, beta=beta,
                 beta_over_read=beta / read_bw)
        )
    return rows


def ratios(rows: list[dict]) -> dict[str, dict[int, dict[str, float]]]:
    """Per source and n: r(n) = beta_dedup/beta_slot and each kernel's time and beta over grouped_mm's."""
    by = {(r["source"], r["n"], r["kernel"]): r for r in rows}
    out: dict[str, dict[int, dict[str, float]]] = defaultdict(dict)
    for source, n, _ in by:
        if (source, n, "grouped_mm") not in by or n in out[source]:
            continue
        g = by[(source, n, "grouped_mm")]
        entry = {}
        if (source, n, "slot") in by and (source, n, "dedup") in by:
            entry["r"] = by[(source, n, "dedup")]["beta"] / by[(source, n, "slot")]["beta"]
        for k in ("slot", "dedup"):
            if (source, n, k) in by:
                entry[f"{k}_time_over_grouped"] = by[(source, n, k)]["seconds"] / g["seconds"]
                entry[f"{k}_beta_over_grouped"] = by[(source, n, k)]["beta"] / g["beta"]
        out[source][n] = entry
    return {s: dict(v) for s, v in out.items()}


def print_table(rows: list[dict], rat: dict, read_bw: float, source: str, kernels) -> None:
    table = Table(title=f"expert kernels, OLMoE widths, fp32, {source} ids: beta GB/s (median ms); read {read_bw / 1e9:.1f} GB/s")
    table.add_column("n", justify="right")
    for k in kernels:
        table.add_column(k, justify="right")
    table.add_column("r(n)", justify="right")
    by = {(r["n"], r["kernel"]): r for r in rows if r["source"] == source}
    for n in sorted({r["n"] for r in rows if r["source"] == source}):
        cells = []
        for k in kernels:
            r = by.get((n, k))
            cells.append("-" if r is None else f"{r['beta'] / 1e9:.1f} ({1e3 * r['seconds'] / r['passes']:.1f})")
        r_n = rat.get(source, {}).get(n, {}).get("r")
        table.add_row(str(n), *cells, "-" if r_n is None else f"{r_n:.2f}")
    Console().print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON artifact to write")
    parser.add_argument("--n", type=int, nargs="+", default=list(range(1, 10)), help="pass sizes (default 1..9)")
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    parser.add_argument("--reps", type=int, default=20, help="timed repetitions per point")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--random", type=int, default=3, help="random-routing passes per n")
    parser.add_argument("--u-points", type=int, default=3, help="U values per n for chosen ids (m..min(N, nm))")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--read-bytes", type=int, default=512_000_000, help="buffer of the read-bandwidth sum")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    read_bw = read_bandwidth(args.read_bytes, reps=5)
    model, _ = build("olmoe-shaped", layers=1)
    experts = expert_op.layer_experts(model, 0)
    views = expert_views(experts)
    m, N, b = model.config.num_experts_per_tok, views.num_experts, expert_bytes(experts)
    passes = random_passes(args.n, m, N, args.random, args.seed) + expert_op.chosen_passes(
        args.n, m, N, u_points=args.u_points, seed=args.seed
    )
    console = Console()
    console.print(
        f"{len(passes)} passes x {len(args.kernels)} kernels, b = {b / 1e6:.1f} MB per expert, "
        f"{torch.get_num_threads()} threads, read bandwidth {read_bw / 1e9:.1f} GB/s"
    )
    records = expert_op.run(
        experts, passes, args.kernels, layer=0, reps=args.reps, warmup=args.warmup, flush=CacheFlusher(), seed=args.seed
    )
    rows = summarize(records, read_bw)
    rat = ratios(rows)
    payload = {
        "benchmark": "expert_kernels",
        "widths": {"hidden": views.hidden_size, "intermediate": views.intermediate_size, "N": N, "m": m},
        "dtype": str(views.dtype).replace("torch.", ""),
        "expert_bytes": b,
        "threads": torch.get_num_threads(),
        "reps": args.reps,
        "warmup": args.warmup,
        "read_bandwidth": read_bw,
        "summary": rows,
        "ratios": rat,
        "r": {n: e.get("r") for n, e in rat.get("random", {}).items()},
        "records": records,
    }
    artifacts.write(args.out, "expert_kernels_benchmark", payload)
    for source in ("random", "chosen"):
        print_table(rows, rat, read_bw, source, args.kernels)
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
