"""The chain on llama.cpp at the paper's two depths, d = 512 and d = 4096 (issue 51, item 2), each scored.

`moespec demo`'s chain on a GGUF file with the demo's knobs but the verify passes and the oracle sweep
at both depths (the paper's `--full` protocol names the same two; its 6 prompts and 256 new tokens
take hours on this CPU, these minutes): the characterization times the rest of the pass R_d(n) at
both depths, and the score judges each depth's prediction on the sweep at that depth, out of sample.
Default file: trained:olmoe exported to q8_0 (`benchmarks/candidates.py` makes it). Each row: per
depth and version, k̂* within one, the throughput lost at k̂* with its floor, the verify-time error,
and the wall time of the chain. Run it on a quiet machine:

    python benchmarks/llama_depths.py --out benchmarks/results/llama_depths.json [--model FILE.gguf]

At real size (issue 51: each shape at d = 4096 beside its d = 512 chain) one depth, no batch steps,
resumable, the corpus trace copied from the file's d = 512 run folder (it does not depend on depth):

    python benchmarks/llama_depths.py --model FILE.gguf --depths 4096 --no-batch --resume \
        --run-dir DIR --trace-from D512_DIR --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import shutil
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
    parser.add_argument("--depths", type=int, nargs="+", default=list(DEPTHS))
    parser.add_argument("--no-batch", action="store_true", help="stop after the score (no chain at batch size B)")
    parser.add_argument("--resume", action="store_true", help="reuse the run folder's finished steps")
    parser.add_argument("--trace-from", type=Path, help="a run folder of the same file whose corpus trace to reuse")
    args = parser.parse_args()
    if not args.model.exists():
        raise SystemExit(f"{args.model} is missing: `python benchmarks/candidates.py --pairs trained` exports it")
    if min(args.depths) < 1:
        raise SystemExit(f"--depths {args.depths}: give positive context depths, e.g. --depths 4096")
    if args.trace_from and not (args.trace_from / "traces.parquet").exists():
        raise SystemExit(f"--trace-from {args.trace_from} holds no traces.parquet: give the run folder of a "
                         f"finished `moespec demo` on {args.model.name}, or leave it out to trace afresh")
    base = DemoConfig()
    config = DemoConfig(model=str(args.model), backend="llama.cpp", threads=args.threads,
                        measure={**base.measure, "depths": tuple(args.depths)},
                        batch={**base.batch, "sizes": ()} if args.no_batch else base.batch)
    args.run_dir.mkdir(parents=True, exist_ok=True)
    if args.trace_from and not (args.run_dir / "traces.parquet").exists():
        shutil.copy2(args.trace_from / "traces.parquet", args.run_dir / "traces.parquet")
    t0 = time.perf_counter()
    result = run_demo(args.run_dir, config=config, progress=False, restart=not args.resume)
    wall = time.perf_counter() - t0
    memory = artifacts.load(args.run_dir / "memory.json", "memory")["payload"]["steps"]
    score = artifacts.load(args.run_dir / "score.json", "score")["payload"]
    rows = []
    for depth in score["depths"]:
        for version, s in depth["versions"].items():
            g = goals(s)
            rows.append({"depth": depth["depth"], "version": version, "k_within_one": g["k_within_one"][0],
                         "acceptances": len(s["acceptance"]), "loss": g["loss"][0], "loss_floor": s.get("loss_floor"),
                         "tau_error": g["tau"][0]})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": str(args.model), "threads": args.threads, "depths": args.depths,
                                    "wall_s": wall, "ran": result.ran, "seconds": result.seconds,
                                    "memory": memory, "rows": rows}, indent=1))
    print(f"{'d':>5s} {'version':14s} {'within one':>10s} {'lost [floor]':>16s} {'verify-time error':>18s}")
    for r in rows:
        floor = r["loss_floor"]
        print(f"{r['depth']:5d} {r['version']:14s} {r['k_within_one']:>5d}/{r['acceptances']:<4d} "
              f"{r['loss']:8.1%} [{floor if floor is None else f'{floor:.1%}'}] {r['tau_error']:17.1%}")
    steps = ", ".join(f"{k} {v:.0f} s" for k, v in result.seconds.items())
    peak = max((m["anon_bytes"] + m["file_bytes"] for m in memory.values()), default=0)
    print(f"wall {wall / 60:.1f} min (this run's steps: {steps}); largest step peak {peak / 1e9:.2f} GB; "
          f"wrote {args.out}")


if __name__ == "__main__":
    main()
