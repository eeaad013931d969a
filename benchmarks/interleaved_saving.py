"""Whether the expert operation's times, taken between the verify passes, predict the saving better.

The measured-time version's saving Ŝ(n) = Σ_l (t̄_slot,l(n) − t̄_dedup,l(n)) (cost-model paper, (22))
comes from the operation times of the verify passes' own windows. Timed in a stretch of its own (as
`moespec characterize` does, minutes before `moespec measure` times the whole-model passes), the
calibrated version's verify time with deduplication on, τ_slot(n) measured − Ŝ(n), inherits any
drift of the machine in between. This benchmark times, on one model and the chain's demo setting
(depth 512, 2 prompts, n = 1..9), the same windows' operation with the chain's own timer
(`bench.verify`) in three stretches: a block before the whole-model passes, right after each
whole-model pass (the same prompt, n and kernel: what `measure --verified` does), and a block
after; and reports each Ŝ(n)'s largest
distance from the measured S(n) = τ_slot(n) − τ_dedup(n), over τ_dedup(n), n = 2..9: the calibrated
version's verify-time error (goal <= 10%) under each way of timing.

    python benchmarks/interleaved_saving.py --out benchmarks/results/interleaved_saving.json
    python benchmarks/interleaved_saving.py --model synthetic:olmoe-tiny --reps 2 --out /tmp/is.json  # smoke
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from moespec import artifacts
from moespec.texts import prompt_ids
from moespec.bench.verify import default_flusher, operation_timer, time_passes, verified_routing
from moespec.kernel_names import DEDUP, SLOT, ENGINE_KERNELS as KERNELS
from moespec.models import load

DEPTH, NS, PROMPTS = 512, tuple(range(1, 10)), 2
STRETCHES = ("block before", "with each pass", "block after")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="synthetic:olmoe-shaped")
    ap.add_argument("--reps", type=int, default=10, help="rounds over n, prompts and kernels (the demo's 10)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.reps < 2:
        raise SystemExit(f"--reps {args.reps}: give at least 2 rounds")

    model, tok = load(args.model, seed=0)
    windows = verified_routing(model, tok, depths=(DEPTH,), prompts=PROMPTS, n_max=max(NS), model_spec=args.model)
    layers = list(range(windows.num_layers))
    flush = default_flusher(True)
    prompts = prompt_ids(tok, DEPTH + max(NS), count=PROMPTS)
    # the chain's own timer (`run_verify`): each layer's operation on the prompt's window of n tokens
    timers = [operation_timer(model, windows, f"d{DEPTH}/p{i}", layers, NS, flush) for i in range(PROMPTS)]

    def op_block() -> dict:
        """The operation alone, in rounds over n (rotating), prompts and kernels, as the passes run."""
        out = {k: {n: [] for n in NS} for k in KERNELS}
        for r in range(args.reps):
            for n in NS[r % len(NS):] + NS[: r % len(NS)]:
                for timer in timers:
                    for kernel in KERNELS:
                        out[kernel][n].append(sum(timer(n, kernel)))
        return out

    for timer in timers:  # warm-up
        for n in NS:
            for kernel in KERNELS:
                timer(n, kernel)
    started = time.time()
    ops = {"block before": op_block()}
    print(f"block before: {time.time() - started:.0f} s", flush=True)
    passes = [time_passes(model, ids, DEPTH, NS, KERNELS, reps=args.reps, flush=flush, between=timer)
              for ids, timer in zip(prompts, timers)]
    verify = {k: {n: [t for p in passes for t in p[k][str(n)]] for n in NS} for k in KERNELS}
    ops["with each pass"] = {k: {n: [sum(t) for p in passes for t in p["ops"][k][str(n)]] for n in NS}
                             for k in KERNELS}
    print(f"with each pass: {time.time() - started:.0f} s", flush=True)
    ops["block after"] = op_block()

    def saving(times: dict) -> np.ndarray:
        return np.array([np.median(times[SLOT][n]) - np.median(times[DEDUP][n]) for n in NS])

    S = saving(verify)
    tau_dedup = np.array([np.median(verify[DEDUP][n]) for n in NS])
    rows = []
    for stretch in STRETCHES:
        S_hat = saving(ops[stretch])
        err = np.abs(S_hat - S)[1:] / tau_dedup[1:]  # n = 2..9
        rows.append(dict(stretch=stretch, S_hat_ms=(1e3 * S_hat).tolist(), error=err.tolist(),
                         max_error=float(err.max()), at_n=int(NS[1 + int(err.argmax())])))
    config = dict(model=args.model, depth=DEPTH, prompts=PROMPTS, ns=NS, reps=args.reps, seconds=time.time() - started)
    artifacts.write(args.out, "interleaved_saving", {"config": config, "S_ms": (1e3 * S).tolist(),
                                                     "tau_dedup_ms": (1e3 * tau_dedup).tolist(), "stretches": rows})

    table = Table("operation timed", "Ŝ(n), n = 1..9 (ms)", "largest |Ŝ − S| / τ_dedup", "at n",
                  title=f"{args.model}, d = {DEPTH}: measured S(n) = "
                        + " ".join(f"{1e3 * s:.1f}" for s in S) + " ms")
    for r in rows:
        table.add_row(r["stretch"], " ".join(f"{x:.1f}" for x in r["S_hat_ms"]), f"{100 * r['max_error']:.1f}%",
                      str(r["at_n"]))
    Console().print(table)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
