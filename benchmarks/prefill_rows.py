"""What a sweep run pays for its prefilled prompt's logit rows: every row kept against the last alone.

An oracle run starts by asking its prefilled prompt for the prompt's last logit row, then times one
verify pass. Until 786752b, the target kept every row ([depth, vocabulary] float32) and built that one
row by concatenating them all (`torch.cat(parts)[-rows:]`), right before the timed pass; now it slices
the rows asked for and keeps the last alone (`PrefilledTarget(keep=1)`). This benchmark runs the same
one-step plain run on one prefilled prompt both ways, interleaved rep by rep on the same cache: "before"
makes the old concatenation of every kept row first, then the run; "now" the run alone on the target
keeping its last row. Per way: the median wall time of the whole run (the copy included), the median
of its timed pass, and the ratio between ways.

    python benchmarks/prefill_rows.py --model ~/.cache/moespec/olmoe-1b-7b/olmoe-1b-7b-shaped-q4_k.gguf \
        --depth 4096 --out benchmarks/results/prefill_rows.json
    python benchmarks/prefill_rows.py --model synthetic:olmoe-tiny --depth 64 --reps 3 --out /tmp/pr.json  # smoke
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # keep llama_cpp.py off `import llama_cpp`

from moespec import artifacts
from moespec.bench.prefilled import PrefilledTarget
from moespec.engine.decode import generate
from moespec.models import load
from moespec.texts import prompt_ids, vocab_limit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="synthetic:olmoe-tiny")
    ap.add_argument("--depth", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.depth < 2 or args.reps < 1:
        ap.error(f"--depth {args.depth} (>= 2 tokens) and --reps {args.reps} (>= 1) out of range")
    gguf = args.model.endswith(".gguf")
    model, tok = load(args.model, **(dict(backend="llama.cpp", threads=args.threads, n_ctx=args.depth + 64)
                                     if gguf else {}))
    ids = list(prompt_ids(tok, args.depth, 1)[0])
    every = PrefilledTarget(model, torch.tensor(ids[:-1]))  # all but the last token: the run feeds it
    last = copy.copy(every)  # the same prompt on the same cache, its last row alone
    last.keep, last.logits = 1, every.logits[-1:].clone()
    runs = {"before": [], "now": []}
    for rep in range(args.reps):
        for name in (list(runs) if rep % 2 == 0 else list(runs)[::-1]):
            target = every if name == "before" else last
            target.reset()
            t0 = time.perf_counter()
            if name == "before":  # the old extend's concatenation of every kept row, for the last one
                torch.cat([every.logits])[-1:]
            result = generate(target, ids, k=0, max_new_tokens=1, max_steps=1, prefill_last=False,
                              vocab_limit=vocab_limit(tok))
            runs[name].append({"run_s": time.perf_counter() - t0, "pass_s": result.stats.round_s[0]})
    rows = {name: {"run_ms": 1000 * statistics.median(r["run_s"] for r in rs),
                   "pass_ms": 1000 * statistics.median(r["pass_s"] for r in rs)} for name, rs in runs.items()}
    ratio = rows["before"]["run_ms"] / rows["now"]["run_ms"]
    table = Table(title=f"a one-step run on a prefilled prompt of {args.depth} tokens, {args.reps} reps each, interleaved")
    for col in ("way", "run ms (median)", "timed pass ms (median)"):
        table.add_column(col)
    for name, r in rows.items():
        table.add_row(name, f"{r['run_ms']:.1f}", f"{r['pass_ms']:.1f}")
    Console().print(table)
    Console().print(f"run time, before ÷ now: {ratio:.2f}x; vocabulary {every.logits.shape[1]}")
    artifacts.write(args.out, "prefill_rows", {"config": vars(args), "vocabulary": int(every.logits.shape[1]),
                                                "rows": rows, "ratio": ratio, "samples": runs})


if __name__ == "__main__":
    main()
