"""Effective bandwidth of the expert kernels at OLMoE widths, side by side (cost-model paper, Sec. 2).

One experts module of OLMoE's widths (hidden 2048, 64 experts x intermediate 1024, top-8), in
float32 and bfloat16 (`--dtypes`), pass sizes n = 1..9, two kinds of expert ids: random routing
(each token m distinct experts drawn uniformly) and chosen ids with repeats
(`moespec.bench.expert_op.chosen_passes`: U from m to min(N, nm)). Every kernel runs on the same
passes in one run, alternating within each pass: moespec's per-slot and dedup (slot, dedup: the
compiled kernels the engine runs, `moespec.moe.compiled`), its torch ones (torch_slot, torch_dedup),
and transformers' eager, grouped_mm and batched_mm.

Effective bandwidth beta_p(n) = requested bytes / time, bytes and median times summed over the
passes of each n (as Table 1): nmb for per-slot kernels (and batched_mm, which gathers one copy per
slot), Ub for the others, in the weights' own dtype (bf16 bytes for bf16). The roof is this
machine's streaming read bandwidth (a sum over >= 512 MB), printed as beta / roof. Recorded:
r(n) = beta_dedup(n) / beta_slot(n) on random routing, for the torch pair and the compiled pair.

    python benchmarks/expert_kernels.py --out results/expert_kernels.json
    python benchmarks/expert_kernels.py --smoke --out /tmp/ek.json   # a minute: n 1 2 9, one rep
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
from moespec.moe import compiled
from moespec.moe.experts import expert_bytes, expert_views

KERNELS = ("torch_slot", "torch_dedup", "slot", "dedup", "eager", "grouped_mm", "batched_mm")
PAIRS = {"torch": ("torch_slot", "torch_dedup"), "compiled": ("slot", "dedup")}  # (per-slot, dedup) -> r(n)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def random_passes(n_values, m: int, N: int, count: int, seed: int) -> list[expert_op.Pass]:
    """`count` passes per n with independent uniform routing: each token m distinct experts of N."""
    rng = np.random.default_rng(seed)
    return [
        expert_op.Pass("random", n, "uniform", i, tuple(tuple(rng.permutation(N)[:m].tolist()) for _ in range(n)))
        for n in n_values
        for i in range(count)
    ]


def summarize(records: list[dict], read_bw: float) -> list[dict]:
    """One row per (dtype, source, n, kernel): summed bytes over summed median times (Table 1's rule)."""
    sums: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for r in records:
        s = sums[(r["dtype"], r["source"], r["n"], r["kernel"])]
        s[0] += r["bytes"]
        s[1] += r["timing"]["median"]
        s[2] += 1
    rows = []
    for (dtype, source, n, kernel), (nbytes, seconds, passes) in sorted(sums.items()):
        beta = nbytes / seconds
        rows.append(
            dict(dtype=dtype, source=source, n=n, kernel=kernel, passes=passes, bytes=nbytes, seconds=seconds,
                 beta=beta, beta_over_read=beta / read_bw)
        )
    return rows


def ratios(rows: list[dict]) -> dict[str, dict[str, dict[int, dict[str, float]]]]:
    """Per dtype, source and n: r(n) of each pair in PAIRS, and each moespec kernel's time and beta
    over grouped_mm's."""
    by = {(r["dtype"], r["source"], r["n"], r["kernel"]): r for r in rows}
    out: dict = defaultdict(lambda: defaultdict(dict))
    for dtype, source, n in {k[:3] for k in by}:
        entry = {}
        for pair, (slot, dedup) in PAIRS.items():
            if (dtype, source, n, slot) in by and (dtype, source, n, dedup) in by:
                entry[f"r_{pair}"] = by[(dtype, source, n, dedup)]["beta"] / by[(dtype, source, n, slot)]["beta"]
        g = by.get((dtype, source, n, "grouped_mm"))
        for k in (k for pair in PAIRS.values() for k in pair):
            if g is not None and (dtype, source, n, k) in by:
                entry[f"{k}_time_over_grouped"] = by[(dtype, source, n, k)]["seconds"] / g["seconds"]
                entry[f"{k}_beta_over_grouped"] = by[(dtype, source, n, k)]["beta"] / g["beta"]
        out[dtype][source][n] = entry
    return {d: {s: dict(sorted(v.items())) for s, v in srcs.items()} for d, srcs in out.items()}


def print_table(rows: list[dict], rat: dict, read_bw: float, dtype: str, source: str, kernels) -> None:
    table = Table(title=f"expert kernels, OLMoE widths, {dtype}, {source} ids: beta GB/s, beta/roof "
                        f"(median ms per pass); roof {read_bw / 1e9:.1f} GB/s")
    table.add_column("n", justify="right")
    for k in kernels:
        table.add_column(k, justify="right")
    pairs = [p for p, ks in PAIRS.items() if set(ks) <= set(kernels)]
    for p in pairs:
        table.add_column(f"r(n) {p}", justify="right")
    by = {(r["n"], r["kernel"]): r for r in rows if r["source"] == source and r["dtype"] == dtype}
    for n in sorted({n for n, _ in by}):
        cells = []
        for k in kernels:
            r = by.get((n, k))
            cells.append("-" if r is None else
                         f"{r['beta'] / 1e9:.1f} {r['beta_over_read']:.0%} ({1e3 * r['seconds'] / r['passes']:.1f})")
        entry = rat.get(dtype, {}).get(source, {}).get(n, {})
        table.add_row(str(n), *cells, *(f"{entry[f'r_{p}']:.2f}" if f"r_{p}" in entry else "-" for p in pairs))
    Console().print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON artifact to write")
    parser.add_argument("--n", type=int, nargs="+", default=list(range(1, 10)), help="pass sizes (default 1..9)")
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--reps", type=int, default=20, help="timed repetitions per point")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--random", type=int, default=3, help="random-routing passes per n")
    parser.add_argument("--u-points", type=int, default=3, help="U values per n for chosen ids (m..min(N, nm))")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--read-bytes", type=int, default=512_000_000, help="buffer of the read-bandwidth sum")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true",
                        help="check that it runs: n 1 2 9, one rep, no warm-up, one pass of each kind, no batched_mm")
    args = parser.parse_args()
    if args.smoke:
        args.n, args.reps, args.warmup, args.random, args.u_points = [1, 2, 9], 1, 0, 1, 2
        args.kernels = [k for k in args.kernels if k != "batched_mm"]
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    console = Console()
    if {"slot", "dedup"} & set(args.kernels):  # build before timing; say what the compiled columns ran
        console.print(f"compiled kernels: {compiled.isa() if compiled.available() else compiled.unavailable_reason()}")
    read_bw = read_bandwidth(args.read_bytes, reps=5)
    model, _ = build("olmoe-shaped", layers=1)
    experts = expert_op.layer_experts(model, 0).requires_grad_(False)
    views = expert_views(experts)
    m, N = model.config.num_experts_per_tok, views.num_experts
    passes = random_passes(args.n, m, N, args.random, args.seed) + expert_op.chosen_passes(
        args.n, m, N, u_points=args.u_points, seed=args.seed
    )
    flush = CacheFlusher()
    records, expert_sizes = [], {}
    for dtype in args.dtypes:
        experts.to(DTYPES[dtype])
        expert_sizes[dtype] = b = expert_bytes(experts)
        console.print(
            f"{dtype}: {len(passes)} passes x {len(args.kernels)} kernels, b = {b / 1e6:.1f} MB per expert, "
            f"{torch.get_num_threads()} threads, read bandwidth {read_bw / 1e9:.1f} GB/s"
        )
        timed = expert_op.run(
            experts, passes, args.kernels, layer=0, reps=args.reps, warmup=args.warmup, flush=flush, seed=args.seed
        )
        records += [dict(r, dtype=dtype) for r in timed]
    rows = summarize(records, read_bw)
    rat = ratios(rows)
    payload = {
        "benchmark": "expert_kernels",
        "widths": {"hidden": views.hidden_size, "intermediate": views.intermediate_size, "N": N, "m": m},
        "dtypes": args.dtypes,
        "expert_bytes": expert_sizes,
        "compiled_isa": compiled.isa() if compiled.available() else None,
        "threads": torch.get_num_threads(),
        "reps": args.reps,
        "warmup": args.warmup,
        "smoke": args.smoke,
        "read_bandwidth": read_bw,
        "summary": rows,
        "ratios": rat,
        "r": {d: {p: {n: e.get(f"r_{p}") for n, e in srcs.get("random", {}).items()} for p in PAIRS}
              for d, srcs in rat.items()},
        "records": records,
    }
    artifacts.write(args.out, "expert_kernels_benchmark", payload)
    for dtype in args.dtypes:
        for source in ("random", "chosen"):
            print_table(rows, rat, read_bw, dtype, source, args.kernels)
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
