"""The dense layers' matrix products against the rows they get: a verify pass of n tokens has n.

Outside its experts, a verify pass runs the attention projections and the logits (and the router,
which transformers keeps in a module of its own): one product of [n, H] rows with each weight
matrix. BLAS does not take the same time per row at every
row count: on this machine's CPU build (MKL, 2 threads) 8 rows ran faster than 7 and 3 slower than
4, which is the step the calibrated version's time outside the operation shows and a line through
it would smooth away (`benchmarks/outside_split.py`). This times, for n = 1..10 rows, every
`torch.nn.Linear` of the model outside its experts modules (each once per pass, after a cache
flush, repetitions in rounds over n) and prints the median per n and its effective bandwidth on
the weights' bytes.

    python benchmarks/dense_rows.py --model synthetic:qwen3moe-shaped --out benchmarks/results/dense_rows_qwen3moe.json
    python benchmarks/dense_rows.py --model synthetic:olmoe-tiny --reps 2 --out /tmp/dr.json  # smoke
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from moespec import artifacts
from moespec.bench.timing import CacheFlusher
from moespec.models import load
from moespec.moe.experts import find_experts

NS = tuple(range(1, 11))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="synthetic:olmoe-shaped")
    ap.add_argument("--reps", type=int, default=25, help="rounds over n (>= 1)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.reps < 1:
        raise SystemExit(f"need --reps >= 1, got {args.reps}")

    model, _ = load(args.model, seed=0)
    inside = {id(p) for e in find_experts(model) for p in e.parameters()}
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and id(m.weight) not in inside]
    if not linears:
        raise SystemExit(f"{args.model} has no dense linear layers outside its experts")
    nbytes = sum(m.weight.numel() * m.weight.element_size() for m in linears)
    hidden = {m.in_features for m in linears}
    flush = CacheFlusher()
    rows = {n: {h: torch.randn(n, h, dtype=linears[0].weight.dtype) for h in hidden} for n in NS}
    times: dict[int, list[float]] = {n: [] for n in NS}
    started = time.time()
    with torch.inference_mode():
        for rep in range(args.reps):
            for n in NS[rep % len(NS):] + NS[: rep % len(NS)]:
                flush()
                t0 = time.perf_counter()
                for m in linears:
                    m(rows[n][m.in_features])
                times[n].append(time.perf_counter() - t0)
    med = {n: float(np.median(t)) for n, t in times.items()}
    shapes = sorted({tuple(m.weight.shape) for m in linears})
    config = dict(model=args.model, reps=args.reps, ns=NS, linears=len(linears), weight_bytes=nbytes,
                  shapes=shapes, threads=torch.get_num_threads(), seconds=time.time() - started)
    artifacts.write(args.out, "dense_rows", {"config": config, "median_s": {str(n): t for n, t in med.items()},
                                             "samples": {str(n): t for n, t in times.items()}})

    table = Table("rows n", "median ms", "vs n − 1", "GB/s on the weights",
                  title=f"{len(linears)} dense linear layers of {args.model} ({nbytes / 1e6:.0f} MB, shapes "
                        f"{', '.join('x'.join(map(str, s)) for s in shapes)}), {args.reps} rounds")
    for n in NS:
        step = f"{1e3 * (med[n] - med[n - 1]):+.2f}" if n > 1 else ""
        table.add_row(str(n), f"{1e3 * med[n]:.2f}", step, f"{nbytes / med[n] / 1e9:.1f}")
    Console().print(table)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
