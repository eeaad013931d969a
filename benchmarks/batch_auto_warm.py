"""k="auto" with a warm store against plain batched decoding and every fixed k, at B = 1, 2, 4, 8, one run
(issue 50's last goal: auto >= 0.97x plain where drafting does not pay, >= 0.95x the best fixed k where it does).

The trained pair's q8_0 exports (trained:olmoe drafted by trained:draft, made as `benchmarks/llama_cpp.py`
makes them), loaded once with sequences = the largest B; 8 held-out code prompts of 256 bytes, the
first B at each B; --new-tokens (64) each, greedy, no EOS, 2 threads. Methods per B: plain batched
decoding (`generate_batch`, k = 0), each fixed k = 1..--max-k, and k = "auto" (max_k = --max-k) as a
user gets it: each call's live counts seeded from the step-time store (`engine.batch_warm_start`).
The store is a temporary file ($MOESPEC_STEP_TIMES, never the user's), warmed before anything is
timed by --warm k="auto" calls at every B on other held-out prompts; the timed auto calls read it
and average their own times in, as a user's calls do.

Each method runs once untimed (its tokens checked against plain's: lossless), then --reps
repetitions in an order rotated by one per repetition. Rate: B x new tokens over the call's wall
time (prefill and the store's read and write included). Side by side per B: the median rates, and
the paired ratios (per repetition auto's rate over plain's and over the best fixed k's, the best
fixed k being the one of highest median rate), medians. Drafting pays at B when the best fixed k's
median rate is above plain's; the goal column reads auto / plain >= 0.97 where it does not, auto /
best fixed >= 0.95 where it does. Also kept: the k of the auto calls' first rounds and the source
of each live count's seed. Run it on an otherwise idle machine:

    python benchmarks/batch_auto_warm.py --out benchmarks/results/batch_auto_warm.json
    python benchmarks/batch_auto_warm.py --quick    # B = 1, 2; 8 tokens; k <= 2; 1 repetition: a check that it runs
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # keep llama_cpp.py off `import llama_cpp`
_spec = importlib.util.spec_from_file_location("llama_cpp_bench", HERE / "llama_cpp.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

PROMPTS = 8  # timed prompts; as many others warm the store
PLAIN, AUTO = "plain", "k=auto"
NOT_PAYING, PAYING = 0.97, 0.95  # the goal's bounds: auto / plain, auto / best fixed k


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--max-k", type=int, default=8, help="auto's max_k; fixed k = 1..max_k")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--warm", type=int, default=3, help="k=\"auto\" calls per B that fill the store, untimed")
    ap.add_argument("--quick", action="store_true", help="B = 1, 2; 8 tokens; max k 2; 1 repetition, 1 warm call")
    ap.add_argument("--out", type=Path, default=None, help="the JSON (default: benchmarks/results/batch_auto_warm.json; "
                                                            "--quick: a temporary file)")
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.new_tokens, args.max_k, args.reps, args.warm = [1, 2], 8, 2, 1, 1
    if args.out is None:
        args.out = (Path(tempfile.gettempdir()) / "batch_auto_warm-quick.json" if args.quick
                    else HERE / "results" / "batch_auto_warm.json")
    if max(args.sizes) > PROMPTS:
        raise SystemExit(f"--sizes up to {PROMPTS}: the run has {PROMPTS} timed prompts")
    return args


def call(target, draft, prompts, k, args, limit: int) -> dict:
    """generate_batch once: its rate (B x new tokens over the call's wall time), tokens, and, for auto,
    the k of its rounds and each live count's seed."""
    from moespec.engine.batch import generate_batch

    t0 = time.perf_counter()
    out = generate_batch(target, prompts, draft=None if k == 0 else draft, k=k, max_k=args.max_k,
                         max_new_tokens=args.new_tokens, vocab_limit=limit)
    wall = time.perf_counter() - t0
    b = out[0].batch
    got = {"rate": b.new_tokens / wall, "decode_rate": b.new_tokens / b.total_s, "tokens": [r.tokens for r in out]}
    if k == "auto":
        got["k_per_round"], got["live_per_round"] = list(b.k_per_round), list(b.live_per_round)
        got["seeds"] = {B: s["source"] for B, s in b.policy.get("warm_start", {}).items()}
    return got


def rotate(methods: dict, reps: int) -> tuple[dict[str, list[dict]], dict[str, list]]:
    """Each method once untimed (its tokens kept), then `reps` rounds in an order rotated by one per round."""
    names = list(methods)
    tokens = {n: methods[n]()["tokens"] for n in names}
    samples = {n: [] for n in names}
    for rep in range(reps):
        for n in names[rep % len(names):] + names[: rep % len(names)]:
            got = methods[n]()
            got.pop("tokens")
            samples[n].append(got)
    return samples, tokens


def summary(samples: dict[str, list[dict]], tokens: dict[str, list], fixed: list[str]) -> dict:
    """Median rates, the best fixed k, paired ratios, whether drafting pays, and the goal."""
    med = {n: statistics.median(s["rate"] for s in v) for n, v in samples.items()}
    best = max(fixed, key=med.get)
    paired = lambda other: statistics.median(a["rate"] / b["rate"] for a, b in zip(samples[AUTO], samples[other]))  # noqa: E731
    pays = med[best] > med[PLAIN]
    ratio = paired(best) if pays else paired(PLAIN)
    bound = PAYING if pays else NOT_PAYING
    first = [s["k_per_round"][:3] for s in samples[AUTO]]
    return {"tokens_per_s": med, "decode_tokens_per_s": {n: statistics.median(s["decode_rate"] for s in v)
                                                         for n, v in samples.items()},
            "best_fixed": best, "drafting_pays": pays, "auto_over_plain": paired(PLAIN), "auto_over_best": paired(best),
            "goal": {"bound": bound, "against": best if pays else PLAIN, "ratio": ratio,
                     "met": ratio >= bound},
            "auto_first_rounds_k": first, "auto_seeds": samples[AUTO][0]["seeds"] if samples[AUTO] else None,
            "lossless": {n: t == tokens[PLAIN] for n, t in tokens.items()}, "samples": samples}


def warm_store(target, draft, calibration, args, limit: int) -> None:
    """--warm k="auto" calls at every B on the calibration prompts: the store then holds each live count."""
    for B in args.sizes:
        for _ in range(args.warm):
            call(target, draft, calibration[:B], "auto", args, limit)


def table(result: dict, args) -> None:
    from rich.console import Console
    from rich.table import Table

    fixed = [f"k={k}" for k in range(1, args.max_k + 1)]
    t = Table("B", PLAIN, *fixed, AUTO, "best fixed", "pays", "auto/plain", "auto/best", "goal", "auto's first k",
              "lossless", title=f"total tokens/s, trained pair q8_0, {args.new_tokens} new tokens each, "
                                f"{bench.THREADS} threads, warm store")
    for B, r in result["sizes"].items():
        m, g = r["tokens_per_s"], r["goal"]
        goal = f"{g['ratio']:.2f} {'>=' if g['met'] else '<'} {g['bound']} x {g['against']}: " \
               f"{'met' if g['met'] else 'missed'}"
        t.add_row(str(B), *(f"{m[n]:.0f}" for n in [PLAIN, *fixed, AUTO]), r["best_fixed"],
                  "yes" if r["drafting_pays"] else "no", f"{r['auto_over_plain']:.2f}", f"{r['auto_over_best']:.2f}",
                  goal, " ".join(str(ks) for ks in r["auto_first_rounds_k"][:2]),
                  "all" if all(r["lossless"].values()) else ", ".join(n for n, ok in r["lossless"].items() if not ok))
    Console(width=260).print(t)


def main() -> None:
    from moespec import artifacts
    from moespec.backends.llama_batch import LlamaBatch
    from moespec.models.tokenizer import ByteTokenizer

    args = arguments()
    f = bench.files({"trained-olmoe-q8_0", "trained-draft-q8_0"})
    tok, top = ByteTokenizer(), max(args.sizes)
    ids = [tok.encode(t, add_bos=True) for t in bench.byte_prompts("code", count=2 * PROMPTS)]
    prompts, calibration = ids[:PROMPTS], ids[PROMPTS:]
    target = LlamaBatch(f["trained-olmoe-q8_0"], sequences=top, threads=bench.THREADS, n_ctx=512)
    draft = LlamaBatch(f["trained-draft-q8_0"], sequences=top, threads=bench.THREADS, n_ctx=512)
    limit = len(tok)
    with tempfile.TemporaryDirectory() as folder:
        os.environ["MOESPEC_STEP_TIMES"] = str(Path(folder) / "step-times.json")  # never the user's store
        warm_store(target, draft, calibration, args, limit)
        result = {"target": f["trained-olmoe-q8_0"], "draft": f["trained-draft-q8_0"], "new_tokens": args.new_tokens,
                  "max_k": args.max_k, "reps": args.reps, "warm_calls": args.warm, "threads": bench.THREADS,
                  "sizes": {}}
        fixed = [f"k={k}" for k in range(1, args.max_k + 1)]
        for B in args.sizes:
            ps = prompts[:B]
            methods = {PLAIN: lambda: call(target, draft, ps, 0, args, limit),
                       **{n: (lambda k=k: call(target, draft, ps, k, args, limit))
                          for n, k in zip(fixed, range(1, args.max_k + 1))},
                       AUTO: lambda: call(target, draft, ps, "auto", args, limit)}
            samples, tokens = rotate(methods, args.reps)
            result["sizes"][str(B)] = summary(samples, tokens, fixed)
            print(f"B={B}", {n: round(v, 1) for n, v in result["sizes"][str(B)]["tokens_per_s"].items()}, flush=True)
    table(result, args)
    artifacts.write(args.out, "benchmark", result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
