"""Whether the expert operation's times, taken between the verify passes, predict the saving better.

The measured-time version's saving Ŝ(n) = Σ_l (t̄_slot,l(n) − t̄_dedup,l(n)) (cost-model paper, (22))
comes from the operation times of the verify passes' own windows, which `moespec characterize` takes
minutes before `moespec measure` times the whole-model passes; the calibrated version's verify time
with deduplication on, τ_slot(n) measured − Ŝ(n), inherits any drift of the machine in between. This
benchmark times, on one model and the chain's demo setting (depth 512, 2 prompts, n = 1..9), the
same windows' operation in three stretches: a block before the whole-model passes, right after each
whole-model pass (the same prompt, n and kernel), and a block after; and reports each Ŝ(n)'s largest
distance from the measured S(n) = τ_slot(n) − τ_dedup(n), over τ_dedup(n), n = 2..9: the calibrated
version's verify-time error (goal <= 10%) under each way of timing.

    python benchmarks/interleaved_saving.py --out benchmarks/results/interleaved_saving.json
    python benchmarks/interleaved_saving.py --model synthetic:olmoe-tiny --reps 2 --out /tmp/is.json  # smoke
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from moespec import artifacts
from moespec.bench import expert_op
from moespec.bench.timing import measure
from moespec.bench.verify import (
    DEDUP, KERNELS, PREFILL_CHUNK, SLOT, avoid_slot_prefill, default_flusher, prompt_ids, verified_routing,
)
from moespec.engine.cached import CachedModel
from moespec.models.load import load

DEPTH, NS, PROMPTS = 512, tuple(range(1, 10)), 2
OP = {SLOT: "slot", DEDUP: "dedup"}  # whole-model kernel -> the same kernel on the operation alone
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
    layers = range(windows.num_layers)
    flush = default_flusher(True)
    avoid_slot_prefill(model)
    caches = []
    for ids in prompt_ids(tok, DEPTH + max(NS), count=PROMPTS):
        cached, ids = CachedModel(model), torch.as_tensor(ids)
        for s in range(0, DEPTH, PREFILL_CHUNK):
            cached.extend(ids[s : min(s + PREFILL_CHUNK, DEPTH)])
        caches.append((cached, ids))
    experts = [expert_op.layer_experts(model, l) for l in layers]
    param = next(experts[0].parameters())
    H = param.shape[1] if getattr(experts[0], "is_transposed", False) else param.shape[-1]
    inputs = {(l, p.n, p.index): expert_op.pass_inputs(p, H, param.dtype, param.device)
              for l in layers for p in expert_op.verified_passes(windows, l, NS)}

    def op_time(n: int, prompt: int, kernel: str) -> float:
        """The operation of every layer on the prompt's window of n tokens: the sum of their times."""
        total = 0.0
        for l in layers:
            hidden, index, weights = inputs[(l, n, prompt)]
            fn = expert_op.kernel_fn(OP[kernel], experts[l])
            with torch.inference_mode():
                total += measure(lambda: fn(experts[l], hidden, index, weights), reps=1, warmup=0,
                                 flush=flush).samples[0]
        return total

    def verify_time(n: int, prompt: int, kernel: str) -> float:
        cached, ids = caches[prompt]
        model.set_experts_implementation(kernel)

        def cut_back() -> None:
            cached.truncate(DEPTH)
            flush()

        return measure(lambda: cached.extend(ids[DEPTH : DEPTH + n]), reps=1, warmup=0, flush=cut_back).samples[0]

    def rounds():  # n rotates by one each round, as `bench.verify.time_passes` does
        for r in range(args.reps):
            for n in NS[r % len(NS):] + NS[: r % len(NS)]:
                for prompt in range(PROMPTS):
                    for kernel in KERNELS:
                        yield n, prompt, kernel

    def empty() -> dict:
        return {k: {n: [] for n in NS} for k in KERNELS}

    for n, prompt, kernel in [(n, p, k) for n in NS for p in range(PROMPTS) for k in KERNELS]:  # warm-up
        verify_time(n, prompt, kernel)
        op_time(n, prompt, kernel)
    started = time.time()
    ops = {s: empty() for s in STRETCHES}
    verify = empty()
    for n, prompt, kernel in rounds():
        ops["block before"][kernel][n].append(op_time(n, prompt, kernel))
    print(f"block before: {time.time() - started:.0f} s", flush=True)
    for n, prompt, kernel in rounds():
        verify[kernel][n].append(verify_time(n, prompt, kernel))
        ops["with each pass"][kernel][n].append(op_time(n, prompt, kernel))
    print(f"with each pass: {time.time() - started:.0f} s", flush=True)
    for n, prompt, kernel in rounds():
        ops["block after"][kernel][n].append(op_time(n, prompt, kernel))

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
