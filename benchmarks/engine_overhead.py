"""Engine overhead on olmoe-shaped: moespec's own cost, and moespec against transformers' generate.

Three figures, side by side in one run (issue 2), each the median over --reps repetitions after one
warm-up; every repetition runs all five decodings in a rotating order, and a speedup is the median of
the ratios taken within each repetition:

1. share of wall time outside the target's and the draft's forward passes, oracle draft a = 0.8,
   k = 4, greedy (goal < 2%);
2. moespec plain decoding against transformers `generate` (greedy) on the same model (goal >= 1.0x);
3. moespec with a dense-tiny draft against transformers assisted generation (`assistant_model`, the
   same k, constant schedule, greedy), tokens checked identical (goal >= 1.1x).

    python benchmarks/engine_overhead.py --out results/engine_overhead.json
    python benchmarks/engine_overhead.py --layers 1 --tokens 16 --reps 1 --out /tmp/eo.json  # smoke
"""

from __future__ import annotations

import argparse
import statistics

import torch
from rich.console import Console
from rich.table import Table

from moespec import artifacts
from moespec.bench.timing import Timing, measure
from moespec.engine.decode import generate
from moespec.engine.proposers import OracleDraft
from moespec.models import synthetic
from moespec.models.tokenizer import ByteTokenizer

REAL = ByteTokenizer.vocab_size  # ids >= this are output-layer padding
PROMPT = "Speculative decoding drafts several tokens and verifies them in one pass of the target. "


def _hf_generate(model, ids: torch.Tensor, n: int, assistant=None) -> list[int]:
    out = model.generate(
        ids, do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None,
        suppress_tokens=list(range(REAL, synthetic.VOCAB)), assistant_model=assistant,
    )
    return out[0, ids.shape[1]:].tolist()


def side_by_side(runs: dict, reps: int) -> tuple[dict[str, Timing], dict[str, list]]:
    """Time every run once per repetition, in an order that rotates by one each repetition, so that
    drift and neighbours' load fall on all alike; one untimed warm-up of each first."""
    for fn in runs.values():
        fn()
    names, samples, results = list(runs), {name: [] for name in runs}, {name: [] for name in runs}
    for rep in range(reps):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            t = measure(lambda: results[name].append(runs[name]()), reps=1, warmup=0, device="cpu")
            samples[name].extend(t.samples)
    return {name: Timing(tuple(s)) for name, s in samples.items()}, results


def paired(slow: Timing, fast: Timing) -> float:
    """Median over repetitions of slow/fast, each ratio taken within one repetition: on a shared
    machine whole repetitions run 20% apart, which a ratio of two medians would carry."""
    return statistics.median(s / f for s, f in zip(slow.samples, fast.samples))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per run")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--acceptance", type=float, default=0.8)
    ap.add_argument("--out", required=True)
    ap.add_argument("--plain-only", action="store_true",
                    help="only figure 2: moespec plain decoding and transformers generate, alternating")
    args = ap.parse_args()

    target, tok = synthetic.build("olmoe-shaped", seed=0, layers=args.layers)
    draft, _ = synthetic.build("dense-tiny", seed=1)
    draft.generation_config.num_assistant_tokens = args.k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0  # no early stop: exactly k drafts
    ids = torch.tensor([tok.encode(PROMPT, add_bos=True)])
    n, k, reps = args.tokens, args.k, args.reps

    runs = {
        "oracle": lambda: generate(target, ids, draft=OracleDraft(args.acceptance, seed=0), k=k, max_new_tokens=n,
                                   vocab_limit=REAL),
        "plain": lambda: generate(target, ids, k=0, max_new_tokens=n, vocab_limit=REAL),
        "hf": lambda: _hf_generate(target, ids, n),
        "spec": lambda: generate(target, ids, draft=draft, k=k, max_new_tokens=n, vocab_limit=REAL),
        "hfa": lambda: _hf_generate(target, ids, n, assistant=draft),
    }
    if args.plain_only:
        times, results = side_by_side({name: runs[name] for name in ("plain", "hf")}, reps)
        ratio = paired(times["hf"], times["plain"])
        artifacts.write(args.out, "engine_overhead", {"config": {"tokens": n, "reps": reps, "plain_only": True},
                                                      "plain_vs_transformers": {"value": ratio,
                                                      "moespec_s": times["plain"].to_dict(),
                                                      "transformers_s": times["hf"].to_dict(),
                                                      "identical_tokens": results["plain"][0].tokens == results["hf"][0]}})
        Console().print(f"plain decoding, {reps} alternating pairs: moespec over transformers generate {ratio:.3f}x")
        return
    times, results = side_by_side(runs, reps)
    oracle_t, plain_t, hf_t, spec_t, hfa_t = (times[name] for name in runs)
    oracle_runs, plain_runs, hf_runs, spec_runs, hfa_runs = (results[name] for name in runs)

    share = statistics.median(r.stats.overhead_share for r in oracle_runs)
    rows = {
        "oracle_overhead_share": {"value": share, "goal": "< 0.02", "met": share < 0.02,
                                  "geometric_acceptance": statistics.median(r.stats.geometric_acceptance for r in oracle_runs),
                                  "moespec_s": oracle_t.to_dict()},
        "plain_vs_transformers": {"value": paired(hf_t, plain_t), "goal": ">= 1.0", "met": paired(hf_t, plain_t) >= 1.0,
                                  "identical_tokens": plain_runs[0].tokens == hf_runs[0],
                                  "moespec_s": plain_t.to_dict(), "transformers_s": hf_t.to_dict()},
        "draft_vs_assisted": {"value": paired(hfa_t, spec_t), "goal": ">= 1.1", "met": paired(hfa_t, spec_t) >= 1.1,
                              "identical_tokens": spec_runs[0].tokens == hfa_runs[0],
                              "acceptance": spec_runs[0].stats.acceptance,
                              "moespec_s": spec_t.to_dict(), "transformers_s": hfa_t.to_dict()},
    }
    config = {"model": "synthetic:olmoe-shaped", "layers": args.layers, "draft": "synthetic:dense-tiny",
              "tokens": n, "reps": reps, "k": k, "acceptance": args.acceptance, "threads": torch.get_num_threads()}
    artifacts.write(args.out, "engine_overhead", {"config": config, "results": rows})

    table = Table("figure", "value", "goal", "met", "identical tokens",
                  title=f"engine overhead, olmoe-shaped x{args.layers} layers, {n} tokens, {reps} paired repetitions")
    table.add_row("time outside forward passes (oracle a=0.8, k=4)", f"{100 * share:.2f}%", "< 2%", str(share < 0.02), "-")
    for key, label in (("plain_vs_transformers", "plain: moespec speedup over transformers"),
                       ("draft_vs_assisted", f"dense-tiny draft, k={k}: speedup over assisted generation")):
        r = rows[key]
        table.add_row(label, f"{r['value']:.3f}x", r["goal"] + "x", str(r["met"]), str(r["identical_tokens"]))
    Console().print(table)


if __name__ == "__main__":
    main()
