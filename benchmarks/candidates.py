"""The answer for a user's own drafts (`moespec demo --draft/--prompt-lookup/--ngram`), tried on pairs
users bring, one demo run each, at the demo's settings on llama.cpp (issue 50, "Where it is tried"):

  trained     trained:olmoe exported to q8_0, drafted by trained:draft exported to q8_0 (the trained
              pair: the draft was distilled from the target, its acceptance is real)
  converted   a MoE file written by llama.cpp's own converter (qwen3moe, q8_0, `tests/converted.py`'s
              random-weight checkpoint) with moespec's prompt lookup and llama.cpp's ngram-mod

Each row: the candidates' predicted k̂* and speedup (calibration half), the held-out check (moespec's
engine at every fixed k on prompts the estimate never read; llama.cpp's own speculative decoding at the
emitted settings, its defaults and every n-max, `--llama-check`), the score against the issue's goals
(k̂* within one, throughput lost at k̂* <= 3%, predicted speedup within 5%, the named best within
2% of the measured best), and the chain's wall time. Run it on a quiet machine: the check is timed.

Not here, and why: SmolLM2 with its distilled draft is a dense model, and the demo's chain predicts
τ̂(n) from the expert operation of a MoE model; the OLMoE-1B-7B-shaped file needs a small draft with
its padded SmolLM2 vocabulary, which moespec does not build yet.

    python benchmarks/candidates.py --out benchmarks/results/candidates/candidates.json [--pairs trained]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

PAIRS = ("trained", "converted")


def trained_pair(work: Path) -> tuple[Path, list[str]]:
    """The exported trained pair (q8_0), made once under `work`."""
    target, draft = work / "trained-olmoe-q8_0.gguf", work / "trained-draft-q8_0.gguf"
    for spec, path in (("trained:olmoe", target), ("trained:draft", draft)):
        if not path.exists():
            subprocess.run([sys.executable, "-m", "moespec.cli.main", "export-gguf", spec, str(path), "--type", "q8_0"],
                           check=True)
    return target, ["--draft", str(draft)]


def converted_pair(work: Path) -> tuple[Path, list[str]]:
    """A converter-written qwen3moe q8_0 file (the tests' cache) with prompt lookup and ngram-mod."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.converted import build  # the converter-written files the tests use, cached

    files = build(Path.home() / ".cache" / "moespec" / "converted")
    return Path(files["qwen3moe"]["q8_0"]), ["--prompt-lookup", "3", "--ngram", "ngram-mod:3"]


def run_pair(name: str, work: Path, threads: int) -> dict:
    """`moespec demo` with the pair's candidates from nothing: wall time and the candidates' score."""
    from moespec import artifacts

    target, flags = (trained_pair if name == "trained" else converted_pair)(work)
    out = work / f"demo-{name}"
    cmd = [sys.executable, "-m", "moespec.cli.main", "demo", "--model", str(target), *flags, "--llama-check",
           "--threads", str(threads), "--out-dir", str(out), "--restart"]
    print("+", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    done = subprocess.run(cmd)
    wall = time.perf_counter() - t0
    row = {"pair": name, "command": " ".join(cmd[2:]), "returncode": done.returncode, "wall_s": wall}
    if done.returncode == 0:
        row["candidates"] = artifacts.load(out / "candidates.json", "candidates")["payload"]
        row["score"] = artifacts.load(out / "candidates-score.json", "candidates-score")["payload"]
        row["llama"] = artifacts.load(out / "candidates-llama.json", "candidates-llama")["payload"]
    return row


def goals(score: dict) -> dict:
    s = score["scores"]
    return {"k_hat within one (every candidate)": all(x["within_one"] for x in s),
            "throughput lost <= 3%": max(x["throughput_lost"] for x in s) <= 0.03,
            "speedup within 5%": max(abs(x["speedup_error"]) for x in s) <= 0.05,
            "named best within 2%": score["named_ok"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "moespec" / "candidates")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pairs", nargs="+", choices=PAIRS, default=list(PAIRS))
    args = parser.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    rows = [run_pair(name, args.work_dir, args.threads) for name in args.pairs]
    for row in rows:
        if "score" in row:
            row["goals"] = goals(row["score"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"threads": args.threads, "rows": rows}, indent=1))
    print(f"\n{'pair':10s} {'candidate':34s} {'k̂*':>4s} {'best k':>6s} {'pred':>6s} {'meas':>6s} {'lost':>6s}")
    for row in rows:
        for s in row.get("score", {}).get("scores", []):
            print(f"{row['pair']:10s} {s['name'][:34]:34s} {s['k_hat']:4d} {s['k_best']:6d} "
                  f"{s['predicted_speedup']:5.2f}x {s['measured_speedup']:5.2f}x {s['throughput_lost']:6.1%}")
        print(f"{row['pair']:10s} wall {row['wall_s'] / 60:.1f} min; goals {row.get('goals')}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
