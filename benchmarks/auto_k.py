"""k="auto" against plain decoding and the best fixed k in hindsight, oracle draft, olmoe-shaped.

For each oracle acceptance a, every method decodes the same prompt greedily: plain decoding (k = 0),
each fixed k of --ks, and k="auto" (max_k = max of --ks, no step-time seed); every oracle gets the
target's greedy tokens, decoded once before timing (`reference`). Side by side in one
process: one untimed warm-up of each (first case only), then --reps repetitions, each running all
methods of the case in an order that rotates by one per repetition; tokens/s is new tokens over the
median wall time. The best fixed k is the fastest of --ks in hindsight; auto may also choose k = 0,
so where plain decoding beats every fixed k, auto/best can exceed 1. Greedy
tokens must be identical across all methods of a case (asserted).

    python benchmarks/auto_k.py --out benchmarks/results/auto_k.json
    python benchmarks/auto_k.py --layers 1 --tokens 16 --reps 1 --out /tmp/ak.json  # smoke
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch
from rich.console import Console
from rich.table import Table

from moespec import OracleDraft, artifacts, generate
from moespec.bench.timing import Timing, measure
from moespec.models import load

PROMPT = "Speculative decoding drafts several tokens and verifies them in one pass of the target. "


def side_by_side(runs: dict, reps: int, warmup: bool) -> tuple[dict[str, Timing], dict[str, list]]:
    """Time every run once per repetition in a rotating order, after one untimed warm-up of each
    when `warmup` (the first case: later cases run the same code paths, already warm)."""
    for fn in runs.values() if warmup else ():
        fn()
    names, samples, results = list(runs), {name: [] for name in runs}, {name: [] for name in runs}
    for rep in range(reps):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            t = measure(lambda name=name: results[name].append(runs[name]()), reps=1, warmup=0, device="cpu")
            samples[name].extend(t.samples)
    return {name: Timing(tuple(s)) for name, s in samples.items()}, results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per run")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--acceptances", type=float, nargs="+", default=[0.2, 0.6, 0.9])
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8], help="fixed draft lengths")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    target, tok = load("synthetic:olmoe-shaped", layers=args.layers)
    ids = tok.encode(PROMPT, add_bos=True)
    n, max_k = args.tokens, max(args.ks)
    common = dict(max_new_tokens=n, vocab_limit=len(tok), eos_token_id=None)

    # the target's greedy tokens, given to every oracle so no timed run decodes them again
    reference = torch.tensor(ids + generate(target, ids, k=0, **common).tokens)

    def run(a: float, k):
        def decode():  # a fresh oracle each run, so every run sees the same draws
            draft = None if k == 0 else OracleDraft(acceptance=a, seed=0, reference=reference)
            return generate(target, ids, draft=draft, k=k, max_k=max_k, **common)

        return decode

    cases = []
    for i, a in enumerate(args.acceptances):
        methods = {"plain": 0, **{f"k={k}": k for k in args.ks}, "auto": "auto"}
        times, results = side_by_side({name: run(a, k) for name, k in methods.items()}, args.reps, i == 0)
        plain = results["plain"][0].tokens
        assert all(r.tokens == plain for rs in results.values() for r in rs), f"a={a}: greedy tokens differ"
        tps = {name: len(plain) / times[name].median for name in methods}
        best = max((f"k={k}" for k in args.ks), key=tps.get)
        chosen = Counter(c for r in results["auto"] for c in r.stats.k_per_round)
        cases.append({
            "acceptance": a, "tokens_per_s": tps, "best_fixed": best, "auto_over_best": tps["auto"] / tps[best],
            "auto_over_plain": tps["auto"] / tps["plain"], "auto_most_chosen_k": chosen.most_common(1)[0][0],
            "auto_k_counts": {str(k): c for k, c in sorted(chosen.items())},
            "auto_policy_last": results["auto"][-1].stats.policy,
            "seconds": {name: t.to_dict() for name, t in times.items()},
        })
    config = {"model": "synthetic:olmoe-shaped", "layers": args.layers, "tokens": n, "reps": args.reps,
              "ks": args.ks, "max_k": max_k, "threads": torch.get_num_threads(), "greedy": True}
    artifacts.write(args.out, "auto_k", {"config": config, "cases": cases})

    table = Table("oracle a", "plain", "best fixed k", "best", "auto", "auto/best", "auto/plain", "auto's top k",
                  title=f"tokens/s, k=auto, olmoe-shaped x{args.layers} layers, {n} tokens, median of {args.reps}")
    for c in cases:
        t = c["tokens_per_s"]
        table.add_row(f"{c['acceptance']}", f"{t['plain']:.1f}", c["best_fixed"], f"{t[c['best_fixed']]:.1f}",
                      f"{t['auto']:.1f}", f"{c['auto_over_best']:.2f}x", f"{c['auto_over_plain']:.2f}x",
                      str(c["auto_most_chosen_k"]))
    Console().print(table)


if __name__ == "__main__":
    main()
