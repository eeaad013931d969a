"""k="auto" against plain decoding, the best fixed k in hindsight and transformers' assisted generation.

Cases (issue 23), each decoded greedily by every method, side by side in one process:
- oracle: synthetic:olmoe-shaped with the oracle draft at each --acceptances a;
- drift: the oracle at a = 0.9 for the first half of the tokens, 0.3 after;
- random: a random-weight draft (synthetic:dense-tiny, never accepted) on olmoe-shaped;
- trained: trained:draft and prompt lookup (n = 3) on trained:olmoe, on held-out code and prose.
Methods: plain (k = 0), each fixed k of --ks, k="auto" (max_k = max of --ks, learned online from
nothing in every call), "carried" (one AutoK passed as k to every call of the case, warm-up included,
so it starts each call from what the earlier calls taught it, as a session decoding many requests
would), and
for a model draft transformers' assisted generation with its "heuristic" schedule (+2 after a full
acceptance, -1 otherwise; confidence threshold off) and with its confidence threshold (0.4,
adaptive, constant 20-token cap); for prompt lookup, transformers' prompt lookup (10 tokens).
One untimed warm-up of each method per case, then --reps repetitions in an order that rotates by
one per repetition; tokens/s is new tokens over the median wall time. Greedy tokens are asserted
identical across all methods of a case. The best fixed k is the fastest of --ks in hindsight; auto
may also choose k = 0, so auto/best can exceed 1 where plain decoding beats every fixed k.

    python benchmarks/auto_k.py --out benchmarks/results/auto_k.json
    python benchmarks/auto_k.py --layers 1 --tokens 16 --reps 1 --cases oracle trained --out /tmp/ak.json  # smoke
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch
from rich.console import Console
from rich.table import Table

from moespec import AutoK, OracleDraft, PromptLookup, artifacts, generate
from moespec.bench.timing import Timing, measure
from moespec.kernel_names import AUTO
from moespec.models import load
from moespec.texts import training_text

PROMPT = "Speculative decoding drafts several tokens and verifies them in one pass of the target. "


class DriftingOracle(OracleDraft):
    """The oracle at acceptance `first` until `switch` tokens are committed, `then` after."""

    def __init__(self, first: float, then: float, switch: int, **kw):
        super().__init__(first, **kw)
        self.first, self.then, self.switch = first, then, switch

    def begin(self, *, target, prompt, max_new_tokens, sampler):
        self._prompt_len = prompt.shape[0]
        super().begin(target=target, prompt=prompt, max_new_tokens=max_new_tokens, sampler=sampler)

    def propose(self, context, k):
        self.a = self.first if context.shape[0] - self._prompt_len < self.switch else self.then
        return super().propose(context, k)


def side_by_side(runs: dict, reps: int) -> tuple[dict[str, Timing], dict[str, list]]:
    """One untimed warm-up of each run, then every run once per repetition in a rotating order."""
    for fn in runs.values():
        fn()
    names, samples, results = list(runs), {name: [] for name in runs}, {name: [] for name in runs}
    for rep in range(reps):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            t = measure(lambda name=name: results[name].append(runs[name]()), reps=1, warmup=0, device="cpu")
            samples[name].extend(t.samples)
    return {name: Timing(tuple(s)) for name, s in samples.items()}, results


def hf_assisted(target, ids: list[int], n: int, vocab: int, *, draft=None, schedule: str = "heuristic",
                lookup: int | None = None):
    """A transformers greedy `generate` run: assisted by `draft` with `schedule` ("heuristic" or
    "confidence"), or by prompt lookup of `lookup` tokens; returns a decode function."""
    def decode():
        if draft is not None:  # transformers keeps the schedule's state on the assistant: reset it each run
            g = draft.generation_config
            g.num_assistant_tokens_schedule = "heuristic" if schedule == "heuristic" else "constant"
            g.num_assistant_tokens = 5 if schedule == "heuristic" else 20
            g.assistant_confidence_threshold = 0.0 if schedule == "heuristic" else 0.4
        out = target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, min_new_tokens=n,
                              eos_token_id=None, suppress_tokens=list(range(vocab, target.config.vocab_size)),
                              assistant_model=draft, prompt_lookup_num_tokens=lookup)
        return out[0, len(ids):].tolist()
    return decode


def run_case(name: str, target, ids: list[int], proposer_for, args, vocab: int, hf: dict) -> dict:
    """Every method on one case; proposer_for() makes a fresh proposer (None: no draft)."""
    n, max_k = args.tokens, max(args.ks)
    common = dict(max_new_tokens=n, vocab_limit=vocab, eos_token_id=None)

    def ours(k):
        return lambda: generate(target, ids, draft=proposer_for() if k else None, k=k, max_k=max_k, **common)

    carried = AutoK(max_k)
    methods = {"plain": ours(0), **{f"k={k}": ours(k) for k in args.ks}, "auto": ours("auto"), "carried": ours(carried),
               **hf}
    times, results = side_by_side(methods, args.reps)
    plain = results["plain"][0].tokens
    for method, rs in results.items():
        for r in rs:
            assert (r if isinstance(r, list) else r.tokens) == plain, f"{name}: {method}'s greedy tokens differ"
    tps = {m: n / times[m].median for m in methods}
    best = max((f"k={k}" for k in args.ks), key=tps.get)
    chosen = Counter(c for r in results["auto"] for c in r.stats.k_per_round)
    case = {"case": name, "tokens_per_s": tps, "best_fixed": best, "auto_over_best": tps["auto"] / tps[best],
            "auto_over_plain": tps["auto"] / tps["plain"],
            "carried_over_best": tps["carried"] / tps[best], "carried_over_plain": tps["carried"] / tps["plain"],
            "auto_k_counts": {str(k): c for k, c in sorted(chosen.items())},
            "carried_k_counts": {str(k): c for k, c in sorted(Counter(
                c for r in results["carried"] for c in r.stats.k_per_round).items())},
            "auto_policy_last": results["auto"][-1].stats.policy,
            "seconds": {m: t.to_dict() for m, t in times.items()}}
    for m in hf:
        case[f"auto_over_{m}"] = tps["auto"] / tps[m]
        case[f"carried_over_{m}"] = tps["carried"] / tps[m]
    return case


def held_out_prompt(kind: str, length: int = 256) -> list[int]:
    docs = [d for d in training_text().held_out if d.kind == kind and len(d.ids) > 2 * length]
    d = docs[len(docs) // 2]
    return d.ids[len(d.ids) // 2:][:length].tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=2, help="layers of olmoe-shaped")
    ap.add_argument("--tokens", type=int, default=96, help="new tokens per run")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--acceptances", type=float, nargs="+", default=[0.2, 0.4, 0.6, 0.8, 0.9, 0.98])
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8], help="fixed draft lengths")
    ap.add_argument("--cases", nargs="+", default=["oracle", "drift", "random", "trained"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(2)
    cases = []
    if {"oracle", "drift", "random"} & set(args.cases):
        target, tok = load("synthetic:olmoe-shaped", layers=args.layers, experts_implementation=AUTO)
        ids, vocab = tok.encode(PROMPT, add_bos=True), len(tok)
        reference = torch.tensor(ids + generate(target, ids, k=0, max_new_tokens=args.tokens, vocab_limit=vocab,
                                                eos_token_id=None).tokens)
        for a in args.acceptances if "oracle" in args.cases else ():
            cases.append(run_case(f"oracle a={a}", target, ids,
                                  lambda a=a: OracleDraft(a, seed=0, reference=reference), args, vocab, {}))
        if "drift" in args.cases:
            cases.append(run_case("drift 0.9 -> 0.3", target, ids, lambda: DriftingOracle(
                0.9, 0.3, args.tokens // 2, seed=0, reference=reference), args, vocab, {}))
        if "random" in args.cases:
            draft, _ = load("synthetic:dense-tiny")
            hf = {f"hf {s}": hf_assisted(target, ids, args.tokens, vocab, draft=draft, schedule=s)
                  for s in ("heuristic", "confidence")}
            cases.append(run_case("random draft", target, ids, lambda: draft, args, vocab, hf))
    if "trained" in args.cases:
        target, tok = load("trained:olmoe", experts_implementation=AUTO)
        draft, _ = load("trained:draft")
        vocab = len(tok)
        for kind in ("code", "prose"):
            ids = held_out_prompt(kind)
            hf = {f"hf {s}": hf_assisted(target, ids, args.tokens, vocab, draft=draft, schedule=s)
                  for s in ("heuristic", "confidence")}
            cases.append(run_case(f"trained draft, {kind}", target, ids, lambda: draft, args, vocab, hf))
            hf = {"hf lookup": hf_assisted(target, ids, args.tokens, vocab, lookup=10)}
            cases.append(run_case(f"prompt lookup, {kind}", target, ids, lambda: PromptLookup(3), args, vocab, hf))
    config = {"layers": args.layers, "tokens": args.tokens, "reps": args.reps, "ks": args.ks,
              "max_k": max(args.ks), "threads": torch.get_num_threads(), "greedy": True, "experts": AUTO}
    artifacts.write(args.out, "auto_k", {"config": config, "cases": cases})
    report(cases, args)


def report(cases: list[dict], args) -> None:
    table = Table("case", "plain", "best fixed k", "auto", "auto/best", "auto/plain", "carried", "carried/best",
                  "carried/plain", "hf", "auto/hf", "carried/hf", "auto's k (rounds)",
                  title=f"tokens/s, greedy, {args.tokens} tokens, median of {args.reps}")
    for c in cases:
        t = c["tokens_per_s"]
        hf = [m for m in t if m.startswith("hf")]
        table.add_row(c["case"], f"{t['plain']:.1f}", f"{c['best_fixed']}: {t[c['best_fixed']]:.1f}",
                      f"{t['auto']:.1f}", f"{c['auto_over_best']:.2f}", f"{c['auto_over_plain']:.2f}",
                      f"{t['carried']:.1f}", f"{c['carried_over_best']:.2f}", f"{c['carried_over_plain']:.2f}",
                      " ".join(f"{m[3:]}: {t[m]:.1f}" for m in hf),
                      " ".join(f"{c[f'auto_over_{m}']:.2f}" for m in hf),
                      " ".join(f"{c[f'carried_over_{m}']:.2f}" for m in hf),
                      " ".join(f"{k}:{n}" for k, n in c["auto_k_counts"].items()))
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
