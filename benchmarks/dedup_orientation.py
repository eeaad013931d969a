"""Why `dedup` puts the expert on the left: X W^T against (W X^T)^T at OLMoE's gate/up width.

One distinct expert's product over its g tokens, for g = 1..9, over all 64 experts of a layer in
turn (so no expert stays in cache), both orientations interleaved in one run. Prints effective
bandwidth on the union bytes and writes JSON.

    python benchmarks/dedup_orientation.py --threads 2 --out results/dedup_orientation.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--rows", type=int, default=2048, help="R: gate/up width 2I of one expert")
    ap.add_argument("--cols", type=int, default=2048, help="C: hidden size H")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--groups", type=int, nargs="+", default=list(range(1, 10)))
    ap.add_argument("--out", type=Path, default=Path("results/dedup_orientation.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    W = torch.randn(args.experts, args.rows, args.cols, generator=gen)  # N experts [R, C]
    nbytes = W.numel() * W.element_size()
    def tiles(x, out, width):  # (W X^T)^T over chunks of `width` tokens, the last padded with zeros
        g = x.shape[0]
        xp = torch.cat((x, x.new_zeros((-g) % width, x.shape[1]))) if g % width else x
        for e in range(args.experts):
            for lo in range(0, g, width):
                hi = min(lo + width, g)
                out[lo:hi].copy_(torch.mm(W[e], xp[lo:lo + width].t()).t()[: hi - lo])

    ways = {
        "X W^T": lambda x, out: [torch.mm(x, W[e].t(), out=out) for e in range(args.experts)],
        "(W X^T)^T": lambda x, out: [out.copy_(torch.mm(W[e], x.t()).t()) for e in range(args.experts)],
        "tiles of 4": lambda x, out: tiles(x, out, 4),
    }
    rows = []
    for g in args.groups:
        x = torch.randn(g, args.cols, generator=gen)
        out = torch.empty(g, args.rows)
        times = {name: [] for name in ways}
        for rep in range(args.reps + 1):
            for name, fn in ways.items():
                t0 = time.perf_counter()
                fn(x, out)
                if rep:  # the first round warms up
                    times[name].append(time.perf_counter() - t0)
        med = {name: statistics.median(t) for name, t in times.items()}
        rows.append({"g": g, "median_s": med, "GB_per_s": {k: nbytes / v / 1e9 for k, v in med.items()},
                     "ratio": med["X W^T"] / med["(W X^T)^T"], "samples": times})
    table = Table("tokens per expert g", *[f"{k} GB/s" for k in ways], "speedup of (W X^T)^T",
                  title=f"one expert product over {args.experts} experts, {args.threads} threads")
    for r in rows:
        table.add_row(str(r["g"]), *[f"{r['GB_per_s'][k]:.1f}" for k in ways], f"{r['ratio']:.2f}x")
    Console().print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"threads": args.threads, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
