"""The chain on llama.cpp at the paper's two depths, d = 512 and d = 4096 (issue 51, item 2), each scored.

`moespec demo`'s chain on a GGUF file with the demo's knobs but the verify passes and the oracle sweep
at both depths (the paper's `--full` protocol names the same two; its 6 prompts and 256 new tokens
take hours on this CPU, these minutes): the characterization times the rest of the pass R_d(n) at
both depths, and the score judges each depth's prediction on the sweep at that depth, out of sample.
Default file: trained:olmoe exported to q8_0 (`benchmarks/candidates.py` makes it). Each row: per
depth and version, k̂* within one, the throughput lost at k̂* with its floor, the verify-time error,
and the wall time of the chain. Run it on a quiet machine:

    python benchmarks/llama_depths.py --out benchmarks/results/llama_depths.json [--model FILE.gguf]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # benchmarks/llama_cpp.py is not llama_cpp
WORK = Path.home() / ".cache" / "moespec" / "candidates"
DEPTHS = (512, 4096)


def main() -> None:
    from moespec import artifacts
    from moespec.chain.demo import run_demo
    from moespec.chain.demo_config import DemoConfig
    from moespec.report.summary import goals

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", type=Path, default=WORK / "trained-olmoe-q8_0.gguf")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--run-dir", type=Path, default=WORK / "demo-depths")
    args = parser.parse_args()
    if not args.model.exists():
        raise SystemExit(f"{args.model} is missing: `python benchmarks/candidates.py --pairs trained` exports it")
    base = DemoConfig()
    config = DemoConfig(model=str(args.model), backend="llama.cpp", threads=args.threads,
                        measure={**base.measure, "depths": DEPTHS})
    t0 = time.perf_counter()
    run_demo(args.run_dir, config=config, progress=False, restart=True)
    wall = time.perf_counter() - t0
    score = artifacts.load(args.run_dir / "score.json", "score")["payload"]
    rows = []
    for depth in score["depths"]:
        for version, s in depth["versions"].items():
            g = goals(s)
            rows.append({"depth": depth["depth"], "version": version, "k_within_one": g["k_within_one"][0],
                         "acceptances": len(s["acceptance"]), "loss": g["loss"][0], "loss_floor": s.get("loss_floor"),
                         "tau_error": g["tau"][0]})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": str(args.model), "threads": args.threads, "depths": DEPTHS,
                                    "wall_s": wall, "rows": rows}, indent=1))
    print(f"{'d':>5s} {'version':14s} {'within one':>10s} {'lost [floor]':>16s} {'verify-time error':>18s}")
    for r in rows:
        floor = r["loss_floor"]
        print(f"{r['depth']:5d} {r['version']:14s} {r['k_within_one']:>5d}/{r['acceptances']:<4d} "
              f"{r['loss']:8.1%} [{floor if floor is None else f'{floor:.1%}'}] {r['tau_error']:17.1%}")
    print(f"wall {wall / 60:.1f} min; wrote {args.out}")


if __name__ == "__main__":
    main()
