"""Does the chain notice a busy machine? The same `moespec demo` run twice, once on an idle machine and
once while another job takes both cores for a few minutes, side by side: each run's calibrated
scores and the steadiness check's verdict (`costmodel/steadiness.py`).

The other job is LOAD_PROCESSES Python processes spinning on arithmetic, started LOAD_AT seconds into
the run for LOAD_FOR seconds, as a second user's job would be. Both runs use fresh run folders on
the same exported file (the demo's olmoe-shaped preset in q8_0 on llama.cpp by default).

    python benchmarks/busy_machine.py --out benchmarks/results/busy_machine.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

LOAD_PROCESSES = 2
SPIN = "import time\nend = time.time() + {seconds}\nx = 0\nwhile time.time() < end:\n    x = (x * 31 + 7) % 1000003\n"


def run_demo(out_dir: Path, args, load: bool) -> dict:
    """One `moespec demo` into a fresh folder, with the other job when `load`: its wall time and scores."""
    shutil.rmtree(out_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "moespec.cli.main", "demo", "--out-dir", str(out_dir), "--threads", str(args.threads),
           *(["--model", args.model] if args.model else []), *(["--backend", "llama.cpp"] if args.llama else [])]
    print("+", " ".join(cmd), "(with another job)" if load else "", flush=True)
    t0 = time.perf_counter()
    demo = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    others = []
    if load:
        time.sleep(args.load_at)
        others = [subprocess.Popen([sys.executable, "-c", SPIN.format(seconds=args.load_for)])
                  for _ in range(LOAD_PROCESSES)]
    code = demo.wait()
    for p in others:
        p.wait()
    return {"command": " ".join(cmd[2:]), "returncode": code, "wall_s": time.perf_counter() - t0, "load": load,
            **scores(out_dir / "llama.cpp" if args.llama and not args.model else out_dir)}


def scores(run: Path) -> dict:
    from moespec import artifacts
    from moespec.report.summary import goals

    score = artifacts.load(run / "score.json", "score")["payload"]
    s = score["depths"][0]["versions"]["calibrated"]
    g = goals(s)
    return {"k_within_one": g["k_within_one"][0], "acceptances": len(s["acceptance"]), "loss": g["loss"][0],
            "tau_error": g["tau"][0], "steadiness": score["steadiness"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "moespec" / "busy-machine")
    parser.add_argument("--model", default=None, help="a .gguf file (default: the demo's preset, exported)")
    parser.add_argument("--torch", dest="llama", action="store_false", help="the torch chain instead of llama.cpp")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--load-at", type=float, default=150.0, help="seconds into the run the other job starts")
    parser.add_argument("--load-for", type=float, default=150.0, help="seconds the other job runs")
    args = parser.parse_args()
    runs = {"idle": run_demo(args.work_dir / "idle", args, load=False),
            "busy": run_demo(args.work_dir / "busy", args, load=True)}
    result = {"load": {"processes": LOAD_PROCESSES, "at_s": args.load_at, "for_s": args.load_for}, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"\n{'run':5s} {'k̂* within one':>14s} {'loss':>7s} {'τ error':>8s}  steadiness")
    for name, r in runs.items():
        flagged = [p["name"] for p in r["steadiness"]["phases"] if not p["steady"]]
        print(f"{name:5s} {r['k_within_one']:>10d}/{r['acceptances']:<3d} {100 * r['loss']:6.1f}% {100 * r['tau_error']:7.1f}%  "
              f"{'steady' if r['steadiness']['steady'] else 'moved: ' + '; '.join(flagged)}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
