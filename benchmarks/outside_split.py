"""The time outside the expert operation, read inside each verify pass, with deduplication off and on.

The calibrated version of the prediction adds g(n) = o(n) − o(1), the growth with n of the time a
verify pass spends outside its experts modules (attention, the dense projections, the router, the
logits), taken from the per-slot passes (cost-model paper, Sec. 4). Its premise: that time does not
depend on the experts kernel. This benchmark checks it. It times verify passes of n = 1..9 tokens
with both kernels (the chain's `bench.verify.time_passes`: the target's greedy continuation of each
prompt at depth 512, kernels alternating pass by pass, repetitions in rounds over n, the cache
flushed before each pass, repetition r's window 2r tokens in), and splits each pass into its time
inside the experts modules and the rest (`bench.timing.ModuleClock`). Per n and kernel: the median
pass, the median time inside, the median of pass − inside, o_p(n), and the spread of that
difference over the passes; and o_dedup(n) − o_slot(n), which the calibrated version takes to be 0.

    python benchmarks/outside_split.py --model synthetic:qwen3moe-shaped --out benchmarks/results/outside_split_qwen3moe.json
    python benchmarks/outside_split.py --model synthetic:olmoe-tiny --reps 2 --depth 16 --out /tmp/os.json  # smoke
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from moespec import artifacts
from moespec.bench.verified_text import verified_texts
from moespec.bench.verify import default_flusher, time_passes
from moespec.kernel_names import DEDUP, SLOT, ENGINE_KERNELS as KERNELS
from moespec.models import load

NS = tuple(range(1, 10))
STRIDE = 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="synthetic:olmoe-shaped")
    ap.add_argument("--depth", type=int, default=512)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--reps", type=int, default=8, help="rounds over n and kernels per prompt (>= 2)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.reps < 2 or args.prompts < 1 or args.depth < 1:
        raise SystemExit(f"need --reps >= 2, --prompts >= 1 and --depth >= 1; got {args.reps}, {args.prompts}, "
                         f"{args.depth}")

    model, tok = load(args.model, seed=0)
    started = time.time()
    texts = verified_texts(model, tok, args.depth, args.prompts, max(NS) + STRIDE * args.reps)
    flush = default_flusher(True)
    runs = []
    for i, ids in enumerate(texts):
        runs.append(time_passes(model, ids, args.depth, NS, KERNELS, reps=args.reps, warmup=1, flush=flush,
                                stride=STRIDE))
        print(f"prompt {i + 1}/{len(texts)}, {time.time() - started:.0f} s", flush=True)

    rows = []
    for n in NS:
        row: dict = {"n": n}
        for kernel in KERNELS:
            passes = np.concatenate([r[kernel][str(n)] for r in runs])
            inside = np.concatenate([r["inside"][kernel][str(n)] for r in runs])
            rest = passes - inside
            row[kernel] = dict(pass_ms=1e3 * float(np.median(passes)), inside_ms=1e3 * float(np.median(inside)),
                               outside_ms=1e3 * float(np.median(rest)), outside_sd_ms=1e3 * float(np.std(rest)))
        rows.append(row)
    config = dict(model=args.model, depth=args.depth, prompts=args.prompts, reps=args.reps, ns=NS, stride=STRIDE,
                  seconds=time.time() - started)
    artifacts.write(args.out, "outside_split", {"config": config, "rows": rows})

    table = Table("n", "τ_slot", "inside", "o_slot ± sd", "τ_dedup", "inside", "o_dedup ± sd", "o_dedup − o_slot",
                  title=f"verify passes on {args.model}, depth {args.depth}: {args.prompts} prompts x {args.reps} "
                        "rounds, ms (medians)")
    for r in rows:
        s, d = r[SLOT], r[DEDUP]
        table.add_row(str(r["n"]), f"{s['pass_ms']:.1f}", f"{s['inside_ms']:.1f}",
                      f"{s['outside_ms']:.1f} ± {s['outside_sd_ms']:.1f}", f"{d['pass_ms']:.1f}",
                      f"{d['inside_ms']:.1f}", f"{d['outside_ms']:.1f} ± {d['outside_sd_ms']:.1f}",
                      f"{d['outside_ms'] - s['outside_ms']:+.1f}")
    Console().print(table)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
