"""Batched lossless decoding on llama.cpp (`moespec.generate_batch`) at B = 1, 2, 4, 8, in one run.

The trained pair's q8_0 exports (trained:olmoe drafted by trained:draft, as `benchmarks/llama_cpp.py`
makes them) on 8 held-out code prompts of 256 bytes; each B decodes the first B prompts as one batch,
64 new tokens each, greedy, 2 threads. Methods, side by side (a rotating order per repetition, medians
of --reps): B requests one after another (`generate`, plain: what a server without batching does),
plain batched decoding (`generate_batch`, k = 0: one llama_decode of B tokens per round, llama.cpp's
own batched decoding), and batched speculation at each --ks and at k = "auto" (priced per live batch
size). Total tokens/s = new tokens of all B sequences over the wall time of the call. Greedy tokens
are recorded against each sequence's own plain decoding.

    python benchmarks/batch_decode.py --out benchmarks/results/batch_decode.json
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # keep llama_cpp.py off `import llama_cpp`
_spec = importlib.util.spec_from_file_location("llama_cpp_bench", HERE / "llama_cpp.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

NEW = 64


def main() -> None:
    from rich.console import Console
    from rich.table import Table

    from moespec import artifacts
    from moespec.backends.llama_batch import LlamaBatch
    from moespec.engine.batch import generate_batch
    from moespec.engine.decode import generate
    from moespec.models.tokenizer import ByteTokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "batch_decode.json")
    args = ap.parse_args()
    f = bench.files({"trained-olmoe-q8_0", "trained-draft-q8_0"})
    tok = ByteTokenizer()
    prompts = [tok.encode(t, add_bos=True) for t in bench.byte_prompts("code", count=max(args.sizes))]
    top = max(args.sizes)
    target = LlamaBatch(f["trained-olmoe-q8_0"], sequences=top, threads=bench.THREADS, n_ctx=512)
    draft = LlamaBatch(f["trained-draft-q8_0"], sequences=top, threads=bench.THREADS, n_ctx=512)
    limit = len(tok)

    def sequential(ps):
        return [generate(target, p, k=0, max_new_tokens=NEW, vocab_limit=limit).tokens for p in ps]

    def batched(ps, k):
        return [r.tokens for r in generate_batch(target, ps, draft=None if k == 0 else draft, k=k,
                                                 max_new_tokens=NEW, vocab_limit=limit)]

    result = {"new_tokens": NEW, "threads": bench.THREADS, "sizes": {}}
    console = Console(width=200)
    for B in args.sizes:
        ps = prompts[:B]
        methods = {"one by one": lambda: sequential(ps), "plain batched": lambda: batched(ps, 0),
                   **{f"k={k}": (lambda k=k: batched(ps, k)) for k in args.ks}, "k=auto": lambda: batched(ps, "auto")}
        names = list(methods)
        want = sequential(ps)
        samples = {n: [] for n in names}
        same = {}
        for n in names:  # one untimed call each
            same[n] = sum(a == b for a, b in zip(methods[n](), want))
        for rep in range(args.reps):
            for n in names[rep % len(names):] + names[: rep % len(names)]:
                t0 = time.perf_counter()
                methods[n]()
                samples[n].append(B * NEW / (time.perf_counter() - t0))
        med = {n: statistics.median(s) for n, s in samples.items()}
        result["sizes"][str(B)] = {"samples": samples, "tokens_per_s": med, "same_tokens_as_plain": same,
                                   "best_fixed": max((n for n in names if n.startswith("k=") and n != "k=auto"),
                                                     key=med.get)}
        print(B, {n: round(v, 1) for n, v in med.items()}, same, flush=True)
    table = Table("B", "one by one", "plain batched", *(f"k={k}" for k in args.ks), "k=auto",
                  "batched ÷ one by one", "auto ÷ plain batched", "sequences = own plain",
                  title=f"total tokens/s, trained pair q8_0, {NEW} new tokens each, {bench.THREADS} threads")
    for B, r in result["sizes"].items():
        m = r["tokens_per_s"]
        table.add_row(B, *(f"{m[n]:.0f}" for n in ["one by one", "plain batched", *(f"k={k}" for k in args.ks),
                                                    "k=auto"]),
                      f"{m['plain batched'] / m['one by one']:.2f}", f"{m['k=auto'] / m['plain batched']:.2f}",
                      ", ".join(f"{n} {v}/{B}" for n, v in r["same_tokens_as_plain"].items() if v != int(B)) or "all")
    console.print(table)
    artifacts.write(args.out, "benchmark", result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
