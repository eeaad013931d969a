"""Effective bandwidth of the dense layers at n = 1..16 rows: torch's F.linear against moespec's
compiled `moespec.moe.dense.linear`, side by side in one run (issue 24, "small-n dense layers").

Weights of OLMoE-like shapes [out, in]: the attention projections (2048x2048), a 2048x1024 matrix
(an expert's down projection), the router (64x2048), the synthetic presets' output head (272x2048)
and a 50k-vocabulary head (49152x2048), in float32 and bfloat16, no bias. In a decode pass every
weight comes from memory (the model is far larger than the cache), so each timed call runs the
layer over enough distinct copies of the weight to exceed the last-level cache four times over,
from the first copy to the last, as a pass runs its layers; no flush is needed between calls. The
two implementations alternate call by call at every point.

beta = weight bytes read (in the weights' own dtype, all copies) / median time per call; the roof
is this machine's streaming read bandwidth (`bench.timing.read_bandwidth`), measured at the start
and the end of the run (the larger is the roof).

    python benchmarks/dense_kernels.py --out benchmarks/results/dense_kernels.json
    python benchmarks/dense_kernels.py --smoke --out /tmp/dk.json   # n 1 2 16, two reps
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from moespec import artifacts
from moespec.bench.timing import measure, read_bandwidth
from moespec.device import last_level_cache_bytes
from moespec.moe import dense

SHAPES = {  # name -> weight [out, in]
    "attn": (2048, 2048),
    "down": (2048, 1024),
    "router": (64, 2048),
    "head272": (272, 2048),
    "head49k": (49152, 2048),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
IMPLS = {"torch": F.linear, "compiled": dense.linear}


def time_point(weights: list[torch.Tensor], x: torch.Tensor, reps: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per call of each implementation over all `weights` ([out, in] each) with x [n, in];
    the implementations alternate call by call, their order flipping every repetition."""
    calls = {name: (lambda fn=fn: [fn(x, w) for w in weights]) for name, fn in IMPLS.items()}
    for fn in calls.values():
        measure(fn, reps=1, warmup=warmup)
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for rep in range(reps):
        for name in list(calls)[:: 1 if rep % 2 == 0 else -1]:
            samples[name] += measure(calls[name], reps=1, warmup=0).samples
    return samples


def run(shapes, dtypes, ns, reps: int, warmup: int, working_set: int, seed: int) -> list[dict]:
    """One record per (dtype, shape, n, implementation)."""
    gen = torch.Generator().manual_seed(seed)
    records = []
    with torch.inference_mode():
        for dtype in dtypes:
            for shape in shapes:
                out_f, in_f = SHAPES[shape]
                nbytes = out_f * in_f * DTYPES[dtype].itemsize
                copies = max(1, math.ceil(working_set / nbytes))
                weights = [(torch.randn(out_f, in_f, generator=gen) / in_f**0.5).to(DTYPES[dtype])
                           for _ in range(copies)]
                for n in ns:
                    x = torch.randn(n, in_f, generator=gen).to(DTYPES[dtype])
                    for impl, s in time_point(weights, x, reps, warmup).items():
                        median = statistics.median(s)
                        records.append({"dtype": dtype, "shape": shape, "out": out_f, "in": in_f, "n": n,
                                        "impl": impl, "copies": copies, "bytes": copies * nbytes, "samples": s,
                                        "median": median, "beta": copies * nbytes / median})
                del weights
    return records


def print_table(records: list[dict], roof: float, dtype: str, title: str) -> None:
    by = {(r["shape"], r["n"], r["impl"]): r for r in records if r["dtype"] == dtype}
    shapes = list(dict.fromkeys(s for s, _, _ in by))
    table = Table(title=f"{title}, {dtype}: GB/s torch -> compiled (compiled/roof); roof {roof / 1e9:.1f} GB/s")
    table.add_column("n", justify="right")
    for s in shapes:
        table.add_column(f"{s} {SHAPES[s][0]}x{SHAPES[s][1]}", justify="right")
    for n in sorted({n for _, n, _ in by}):
        cells = []
        for s in shapes:
            t, c = by.get((s, n, "torch")), by.get((s, n, "compiled"))
            cells.append("-" if t is None or c is None else
                         f"{t['beta'] / 1e9:.1f} -> {c['beta'] / 1e9:.1f} ({c['beta'] / roof:.0%})")
        table.add_row(str(n), *cells)
    Console().print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON artifact to write")
    parser.add_argument("--n", type=int, nargs="+", default=list(range(1, 17)), help="rows (default 1..16)")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=SHAPES)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--reps", type=int, default=15, help="timed calls per point and implementation")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--working-set", type=int, default=None,
                        help="weight bytes per timed call (default: 4x the last-level cache, >= 128 MB)")
    parser.add_argument("--read-bytes", type=int, default=512_000_000, help="buffer of the read-bandwidth sum")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="check that it runs: n 1 2 16, two reps, one warm-up")
    args = parser.parse_args()
    if args.smoke:
        args.n, args.reps, args.warmup = [1, 2, 16], 2, 1
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    working_set = args.working_set or max(4 * (last_level_cache_bytes() or 0), 128 * 1024**2)

    console = Console()
    isa = dense._ops().isa() if dense.available() else None  # build before timing
    console.print(f"compiled dense layers: {isa or dense.unavailable_reason()}; {torch.get_num_threads()} threads, "
                  f"{working_set / 1e6:.0f} MB of weights per timed call")
    roofs = [read_bandwidth(args.read_bytes, reps=5)]
    records = run(args.shapes, args.dtypes, args.n, args.reps, args.warmup, working_set, args.seed)
    roofs.append(read_bandwidth(args.read_bytes, reps=5))
    roof = max(roofs)
    for r in records:
        r["beta_over_roof"] = r["beta"] / roof
    by = {(r["dtype"], r["shape"], r["n"], r["impl"]): r for r in records}
    speedup = {f"{d}/{s}/{n}": by[(d, s, n, "torch")]["median"] / by[(d, s, n, "compiled")]["median"]
               for d, s, n in sorted({k[:3] for k in by})}
    payload = {
        "benchmark": "dense_kernels",
        "shapes": {s: SHAPES[s] for s in args.shapes},
        "dtypes": args.dtypes,
        "n": args.n,
        "compiled_isa": isa,
        "threads": torch.get_num_threads(),
        "reps": args.reps,
        "warmup": args.warmup,
        "working_set": working_set,
        "smoke": args.smoke,
        "read_bandwidth": roofs,
        "roof": roof,
        "speedup": speedup,  # torch time / compiled time, per dtype/shape/n
        "records": records,
    }
    artifacts.write(args.out, "dense_kernels_benchmark", payload)
    for dtype in args.dtypes:
        print_table(records, roof, dtype, "dense layers")
    console.print(f"read bandwidth {', '.join(f'{r / 1e9:.1f}' for r in roofs)} GB/s (start, end); wrote {args.out}")


if __name__ == "__main__":
    main()
