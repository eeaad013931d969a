"""Engine overhead on olmoe-shaped: moespec's own cost, and moespec against transformers' generate.

Three figures, side by side in one run (issue 2), each the median over --reps repetitions after one
warm-up; every repetition runs all five decodings in a rotating order, and a speedup is the median of
the ratios taken within each repetition:

1. share of wall time outside the target's and the draft's forward passes, oracle draft a = 0.8,
   k = 4, greedy (goal < 2%);
2. moespec plain decoding against transformers `generate` (greedy) on the same model (goal >= 1.0x);
3. moespec with a dense-tiny draft against transformers assisted generation (`assistant_model`, the
   same k, constant schedule, greedy), tokens checked identical (goal >= 1.1x).

moespec runs as a user runs it: the target's experts on "moespec_auto" (the compiled kernels:
per-slot one-token passes, deduplicated verify passes; `moespec generate --experts`, default) and
the target's and draft's linear layers compiled (`moespec.fast_linear`, `moespec generate`'s
default; `--torch-linear` keeps F.linear). transformers runs with the
model's default experts implementation (grouped_mm). Two more decodings separate the loop from the
kernel: moespec's loop on transformers' kernel ("loop only" rows), so a reader sees how much of each
speedup is the kernel and how much the loop.

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
from moespec.moe import dense

REAL = ByteTokenizer.vocab_size  # ids >= this are output-layer padding
PROMPT = "Speculative decoding drafts several tokens and verifies them in one pass of the target. "


def _hf_generate(model, ids: torch.Tensor, n: int, assistant=None) -> list[int]:
    out = model.generate(
        ids, do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None,
        suppress_tokens=list(range(REAL, synthetic.VOCAB)), assistant_model=assistant,
    )
    return out[0, ids.shape[1]:].tolist()


def side_by_side(model, runs: dict, reps: int, draft=None) -> tuple[dict[str, Timing], dict[str, list]]:
    """Time every run once per repetition, in an order that rotates by one each repetition, so that
    drift and neighbours' load fall on all alike; one untimed warm-up of each first. A run is
    (experts implementation of `model`, compiled linear layers or not, decode function); both are
    set outside the timing, the linear layers on `model` and `draft`."""

    def setup(kernel: str, fast: bool) -> None:
        model.set_experts_implementation(kernel)
        for m in (model, draft):
            if m is not None:
                (dense.fast_linear if fast else dense.restore_linear)(m)

    for kernel, fast, fn in runs.values():
        setup(kernel, fast)
        fn()
    names, samples, results = list(runs), {name: [] for name in runs}, {name: [] for name in runs}
    for rep in range(reps):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            kernel, fast, fn = runs[name]
            setup(kernel, fast)
            t = measure(lambda: results[name].append(fn()), reps=1, warmup=0, device="cpu")
            samples[name].extend(t.samples)
    return {name: Timing(tuple(s)) for name, s in samples.items()}, results


def _tokens(result) -> list[int]:
    return result.tokens if hasattr(result, "tokens") else result


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
    ap.add_argument("--kernel", default="moespec_auto", help="moespec's experts implementation")
    ap.add_argument("--torch-linear", action="store_true", help="moespec's runs keep F.linear (default: fast_linear)")
    args = ap.parse_args()

    target, tok = synthetic.build("olmoe-shaped", seed=0, layers=args.layers)
    draft, _ = synthetic.build("dense-tiny", seed=1)
    draft.generation_config.num_assistant_tokens = args.k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0  # no early stop: exactly k drafts
    ids = torch.tensor([tok.encode(PROMPT, add_bos=True)])
    n, k, reps = args.tokens, args.k, args.reps

    hf_kernel = target.config._experts_implementation  # transformers' default for this model
    ours, fast = args.kernel, not args.torch_linear
    runs = {
        "oracle": (ours, fast, lambda: generate(target, ids, draft=OracleDraft(args.acceptance, seed=0), k=k,
                                          max_new_tokens=n, vocab_limit=REAL)),
        "plain": (ours, fast, lambda: generate(target, ids, k=0, max_new_tokens=n, vocab_limit=REAL)),
        "hf": (hf_kernel, False, lambda: _hf_generate(target, ids, n)),
        "spec": (ours, fast, lambda: generate(target, ids, draft=draft, k=k, max_new_tokens=n, vocab_limit=REAL)),
        "hfa": (hf_kernel, False, lambda: _hf_generate(target, ids, n, assistant=draft)),
        "plain_loop": (hf_kernel, False, lambda: generate(target, ids, k=0, max_new_tokens=n, vocab_limit=REAL)),
        "spec_loop": (hf_kernel, False, lambda: generate(target, ids, draft=draft, k=k, max_new_tokens=n, vocab_limit=REAL)),
    }
    if args.plain_only:
        runs = {name: runs[name] for name in ("plain", "hf", "plain_loop")}
    times, results = side_by_side(target, runs, reps, draft=draft)

    def row(ours_name: str, theirs_name: str, goal: float | None) -> dict:
        value = paired(times[theirs_name], times[ours_name])
        out = {"value": value, "identical_tokens": _tokens(results[ours_name][0]) == _tokens(results[theirs_name][0]),
               "moespec_s": times[ours_name].to_dict(), "transformers_s": times[theirs_name].to_dict()}
        if goal is not None:
            out.update(goal=f">= {goal}", met=value >= goal)
        return out

    rows = {"plain_vs_transformers": row("plain", "hf", 1.0),
            "plain_vs_transformers_loop_only": row("plain_loop", "hf", None)}
    if not args.plain_only:
        share = statistics.median(r.stats.overhead_share for r in results["oracle"])
        rows = {"oracle_overhead_share": {"value": share, "goal": "< 0.02", "met": share < 0.02,
                                          "geometric_acceptance": statistics.median(
                                              r.stats.geometric_acceptance for r in results["oracle"]),
                                          "moespec_s": times["oracle"].to_dict()},
                **rows,
                "draft_vs_assisted": {**row("spec", "hfa", 1.1), "acceptance": results["spec"][0].stats.acceptance},
                "draft_vs_assisted_loop_only": row("spec_loop", "hfa", None)}
    config = {"model": "synthetic:olmoe-shaped", "layers": args.layers, "draft": "synthetic:dense-tiny",
              "tokens": n, "reps": reps, "k": k, "acceptance": args.acceptance, "fast_linear": fast, "threads": torch.get_num_threads(),
              "moespec_experts": ours, "transformers_experts": hf_kernel, "plain_only": args.plain_only}
    artifacts.write(args.out, "engine_overhead", {"config": config, "results": rows})

    table = Table("figure", "value", "goal", "met", "identical tokens",
                  title=f"engine overhead, olmoe-shaped x{args.layers} layers, {n} tokens, {reps} paired repetitions")
    labels = {"oracle_overhead_share": f"time outside forward passes (oracle a={args.acceptance}, k={k})",
              "plain_vs_transformers": f"plain: moespec ({ours}) over transformers generate ({hf_kernel})",
              "plain_vs_transformers_loop_only": f"  loop only: moespec ({hf_kernel}) over generate ({hf_kernel})",
              "draft_vs_assisted": f"dense-tiny draft, k={k}: moespec ({ours}) over assisted generation",
              "draft_vs_assisted_loop_only": f"  loop only: moespec ({hf_kernel}) over assisted generation"}
    for key, r in rows.items():
        shown = f"{100 * r['value']:.2f}%" if key == "oracle_overhead_share" else f"{r['value']:.3f}x"
        table.add_row(labels[key], shown, r.get("goal", "-"), str(r.get("met", "-")), str(r.get("identical_tokens", "-")))
    Console().print(table)


if __name__ == "__main__":
    main()
