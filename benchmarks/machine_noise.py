"""How steady this machine's clock is for whole-model verify passes: the noise floor of every timed figure.

The chain's fidelity goals compare times measured minutes apart: the calibrated version subtracts a
saving Ŝ(n) from the characterization (one stretch of time) from a per-slot verify time measured in
another, and is scored against a deduplicated verify time from that second stretch. Where the
machine's speed itself moves between stretches by more than a goal allows, the goal cannot be met or
missed by the prediction, only by the machine. This benchmark measures that movement.

It times verify passes of n = 1, 5, 9 tokens with both kernels on one prompt at depth 512 (the
chain's `bench.verify.time_passes`: kernels alternate call by call, repetitions run in rounds over
n, the cache flushed before each pass), in `--blocks` blocks of `--reps` rounds, alternating the
thread counts block by block. Per thread count, kernel and n: the median pass, the spread of single
passes (robust: 1.4826 x MAD over the median) and the spread of the blocks' medians (standard
deviation over the median), what a median of `--reps` passes taken in another stretch moves by. Per
thread count, the spread of the blocks' saving S(9) = τ_slot(9) − τ_dedup(9) over τ_dedup(9): how far
an exact Ŝ(9) from one block lands from another block's measured τ_dedup(9), the calibrated
version's verify-time error (goal <= 10%) that no prediction can remove.

    python benchmarks/machine_noise.py --out benchmarks/results/machine_noise.json
    python benchmarks/machine_noise.py --model synthetic:olmoe-tiny --blocks 2 --reps 2 --out /tmp/mn.json  # smoke
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from moespec import artifacts
from moespec.texts import prompt_ids
from moespec.bench.verify import default_flusher, time_passes
from moespec.kernel_names import DEDUP, SLOT, ENGINE_KERNELS as KERNELS
from moespec.models import load

NS = (1, 5, 9)
DEPTH = 512


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="synthetic:olmoe-shaped")
    ap.add_argument("--threads", default=f"{torch.get_num_threads()},1",
                    help="comma-separated torch thread counts, alternated block by block")
    ap.add_argument("--blocks", type=int, default=6, help="blocks per thread count (>= 2)")
    ap.add_argument("--reps", type=int, default=8, help="rounds over n and kernels per block (>= 2)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    if args.blocks < 2 or args.reps < 2 or min(threads) < 1:
        raise SystemExit(f"need --blocks >= 2, --reps >= 2 and thread counts >= 1; got {args.blocks}, {args.reps}, "
                         f"{threads}")

    model, tok = load(args.model, seed=0)
    ids = prompt_ids(tok, DEPTH + max(NS), count=1)[0]
    flush = default_flusher(True)
    blocks: dict[int, list[dict]] = {t: [] for t in threads}
    started = time.time()
    for b in range(args.blocks):
        for t in threads:
            torch.set_num_threads(t)
            blocks[t].append(time_passes(model, ids, DEPTH, NS, KERNELS, reps=args.reps, warmup=1, flush=flush))
            print(f"block {b + 1}/{args.blocks}, {t} thread(s), {time.time() - started:.0f} s", flush=True)

    rows = []
    for t in threads:
        for kernel in KERNELS:
            for n in NS:
                per_block = [np.asarray(blk[kernel][str(n)]) for blk in blocks[t]]
                passes = np.concatenate(per_block)
                med = float(np.median(passes))
                rows.append(dict(threads=t, kernel=kernel, n=n, median_ms=1e3 * med,
                                 pass_spread=float(1.4826 * np.median(np.abs(passes - med)) / med),
                                 block_spread=float(np.std([np.median(p) for p in per_block]) / med)))
    saving = []
    for t in threads:
        s9 = [np.median(blk[SLOT]["9"]) - np.median(blk[DEDUP]["9"]) for blk in blocks[t]]
        d9 = [np.median(blk[DEDUP]["9"]) for blk in blocks[t]]
        rel = np.asarray(s9) / np.median(d9)
        saving.append(dict(threads=t, S9_ms=[1e3 * float(s) for s in s9], spread_over_tau_dedup=float(np.std(rel)),
                           range_over_tau_dedup=float(rel.max() - rel.min())))
    config = dict(model=args.model, threads=threads, blocks=args.blocks, reps=args.reps, ns=NS, depth=DEPTH,
                  seconds=time.time() - started)
    artifacts.write(args.out, "machine_noise", {"config": config, "passes": rows, "saving": saving})

    table = Table("threads", "kernel", "n", "median pass", "single pass ±", "block median ±",
                  title=f"verify passes on {args.model}, depth {DEPTH}: {args.blocks} blocks x {args.reps} rounds")
    for r in rows:
        table.add_row(str(r["threads"]), r["kernel"], str(r["n"]), f"{r['median_ms']:.1f} ms",
                      f"{100 * r['pass_spread']:.1f}%", f"{100 * r['block_spread']:.1f}%")
    Console().print(table)
    table = Table("threads", "S(9) per block (ms)", "spread / τ_dedup(9)", "range / τ_dedup(9)",
                  title="the saving at n = 9, block by block: the calibrated version's irreducible error")
    for s in saving:
        table.add_row(str(s["threads"]), " ".join(f"{x:.1f}" for x in s["S9_ms"]),
                      f"{100 * s['spread_over_tau_dedup']:.1f}%", f"{100 * s['range_over_tau_dedup']:.1f}%")
    Console().print(table)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
