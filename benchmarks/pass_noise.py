"""How far the prices of a candidate's rounds move when the candidates' passes step is timed again.

The answer for a user's draft prices a round at k with the target's passes timed on the calibration
prompts (`bench.target_passes.measure_target_passes`, the demo's `cost_reps` = 20 repetitions). On a
model whose passes take a millisecond or two, what decides k̂* is the ratio of a pass of two tokens to a
plain step. This times that step again and again on one run folder's calibration prompts, at 20 and at
200 repetitions in alternation, and reports each timing's plain step, its pass of n = 2 after one of the
same size (warm) and their ratio: the spread of the ratio over timings is the price's own noise. Each
timing's blocks (`TargetPasses.blocks`, the quarters of every prompt's repetitions in time order) give
the same ratio per block: the spread the answer reads within one timing (`positional.paying`).

    python benchmarks/pass_noise.py --model ~/.cache/moespec/candidates/trained-olmoe-q8_0.gguf \
        --run-dir ~/.cache/moespec/candidates/demo-trained --out benchmarks/results/pass_noise.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # keep llama_cpp.py off `import llama_cpp`

from moespec import artifacts, run_files  # noqa: E402
from moespec.bench.target_passes import measure_target_passes  # noqa: E402
from moespec.chain.candidate_steps import passes_ahead  # noqa: E402
from moespec.chain.demo_config import CANDIDATE_KNOBS  # noqa: E402
from moespec.models import load  # noqa: E402
from moespec.texts import vocab_limit  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="the run folder's target, a .gguf file")
    parser.add_argument("--run-dir", type=Path, required=True, help="a demo folder with prompts.json")
    parser.add_argument("--reps", type=int, nargs="+", default=[20, 200])
    parser.add_argument("--timings", type=int, default=8, help="timings of the step at each --reps")
    parser.add_argument("--kmax", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    prompts = args.run_dir / run_files.PROMPTS
    if not prompts.is_file() or not args.model.is_file():
        parser.error(f"need {prompts} (run the demo with a draft first) and the model file {args.model}")
    if min(args.reps) < 1 or args.timings < 1 or args.kmax < 1:
        parser.error(f"--reps {args.reps}, --timings {args.timings}, --kmax {args.kmax}: each must be >= 1")
    ids = artifacts.load(prompts, run_files.KINDS[run_files.PROMPTS])["payload"]["calibration"]
    model, tok = load(str(args.model), backend="llama.cpp", threads=args.threads,
                      n_ctx=max(map(len, ids)) + CANDIDATE_KNOBS["new_tokens"] + args.kmax + 2)
    ahead = passes_ahead(CANDIDATE_KNOBS)
    rows = []
    print(f"{'reps':>5s} {'timing':>6s} {'plain ms':>9s} {'warm n=2 ms':>12s} {'ratio':>6s} {'blocks max/min':>15s}")
    for t in range(args.timings):
        for reps in args.reps:  # alternate, so a drift of the machine spreads over both
            p = measure_target_passes(model, ids, kmax=args.kmax, reps=reps, vocab_limit=vocab_limit(tok), ahead=ahead)
            blocks = [b.warm[1] / b.plain for b in p.blocks]
            rows.append({"reps": reps, "timing": t, "plain": p.plain, "warm": list(p.warm), "cold": list(p.cold),
                         "block_ratios": blocks})
            print(f"{reps:5d} {t:6d} {p.plain * 1e3:9.3f} {p.warm[1] * 1e3:12.3f} {p.warm[1] / p.plain:6.3f} "
                  f"{max(blocks) / min(blocks):15.3f}", flush=True)
    summary = {}
    for reps in args.reps:
        ratios = sorted(r["warm"][1] / r["plain"] for r in rows if r["reps"] == reps)
        plains = sorted(r["plain"] * 1e3 for r in rows if r["reps"] == reps)
        spreads = sorted(max(r["block_ratios"]) / min(r["block_ratios"]) for r in rows if r["reps"] == reps)
        summary[str(reps)] = {"ratio_min": ratios[0], "ratio_max": ratios[-1], "plain_ms_min": plains[0],
                              "plain_ms_max": plains[-1], "block_spread_min": spreads[0],
                              "block_spread_max": spreads[-1]}
        print(f"reps {reps}: warm(2)/plain {ratios[0]:.3f}-{ratios[-1]:.3f}, plain {plains[0]:.3f}-{plains[-1]:.3f} "
              f"ms, max/min over a timing's blocks {spreads[0]:.3f}-{spreads[-1]:.3f}, over {len(ratios)} timings")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": str(args.model), "run_dir": str(args.run_dir), "prompts": len(ids), "ahead": ahead, "kmax": args.kmax,
                                    "threads": args.threads, "rows": rows, "summary": summary}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
