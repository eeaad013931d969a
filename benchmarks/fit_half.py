"""How many verify repetitions the prediction needs: a finished demo run rescored with the prediction
reading the even repetitions (what `moespec predict` reads), the odd ones, or all of them.

The score's verify-time error always uses the odd (held-out) repetitions, so only the "even" row is
out of sample; the other rows show what k̂* gains from more passes. No torch; seconds per run.

    python benchmarks/fit_half.py RUN_DIR... [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from moespec.chain import prediction, scoring

READS = ("even", "odd", "all")


def rescore(run: Path, reads: str, version: str = "calibrated") -> dict:
    """The calibrated version predicted from the repetitions `reads` and scored as the demo scores it."""
    split = prediction.repetition_half

    def fit_half(times, half):
        if half == "fit" and reads == "all":
            return times
        return split(times, "holdout" if half == "fit" and reads == "odd" else half)

    prediction.repetition_half = fit_half  # predict_all and score_all both call it by module name
    try:
        pred = prediction.predict_all(run / "characterization.json", run / "traces.parquet",
                                      run / "measurement-base.json")
        scored = scoring.score_all({"kind": prediction.KIND, "payload": pred}, run / "measurement.json")
    finally:
        prediction.repetition_half = split
    s = scored["depths"][0]["versions"][version]
    within = sum(abs(p - m) <= 1 for p, m in zip(s["k_star_predicted"], s["k_star_measured"]))
    return {"run": run.name, "reads": reads, "k_within_one": within, "acceptances": len(s["acceptance"]),
            "max_loss": max(s["loss"]), "tau_error_dedup": s["tau_error_dedup"],
            "k_star_predicted": s["k_star_predicted"], "k_star_measured": s["k_star_measured"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = [rescore(run, reads) for run in args.runs for reads in READS]
    print("| run | prediction reads | k̂* within one | max loss | τ err (dedup, odd reps) |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['run']} | {r['reads']} | {r['k_within_one']}/{r['acceptances']} | {100 * r['max_loss']:.1f}% "
              f"| {100 * r['tau_error_dedup']:.1f}% |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
