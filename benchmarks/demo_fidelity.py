"""The fidelity goals of finished `moespec demo` runs, one table per run, and their artifacts kept.

Reads each run folder's `score.json` (written by `moespec demo --out-dir DIR`) and prints, per depth
and prediction version: k̂* within one of the measured best (count of acceptance values), the largest
throughput lost at k̂* with the sweep's loss floor, the verify-time error with deduplication on (out
of sample: against the verify repetitions the prediction did not read) and the in-sample figure
beside it, the largest |gap| of the sweep's speedup to G_a(k)V(0)/V(k), and whether the four goals
hold (k̂* within one at >= A-1 of A values, loss <= 5%, verify-time error <= 10%, gap <= 5%). The
demo's wall time is printed where the run folder records it. numpy and the standard library only.

    python benchmarks/demo_fidelity.py RUN_DIR... [--json fidelity.json] [--save-results benchmarks/results/demo]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np

GOALS = dict(loss=0.05, tau=0.10, gap=0.05)  # k̂* within one: at >= A - 1 of A values


def load_payload(path: Path, kind: str) -> dict:
    doc = json.loads(path.read_text(encoding="utf-8"))
    if doc.get("kind") != kind:
        raise SystemExit(f"{path} is a {doc.get('kind')!r} artifact, expected {kind!r}")
    return doc["payload"]


def preset_name(model: str) -> str:
    """synthetic:olmoe-shaped -> olmoe-shaped; a checkpoint path -> its folder name."""
    return model.split(":", 1)[1] if ":" in model else Path(model.rstrip("/")).name


def wall_seconds(run: Path) -> float | None:
    """The demo's wall time where the folder records it (a "demo" artifact with per-step seconds)."""
    for path in run.glob("*.json"):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        seconds = doc.get("payload", {}).get("seconds") if doc.get("kind") == "demo" else None
        if isinstance(seconds, dict):
            return float(sum(seconds.values()))
    return None


def version_row(s: dict) -> dict:
    """The goal figures of one scored version (a Score's to_dict())."""
    A = len(s["acceptance"])
    within = int(np.sum(np.abs(np.subtract(s["k_star_predicted"], s["k_star_measured"])) <= 1))
    loss, gap = float(np.max(s["loss"])), float(np.max(np.abs(s["oracle_gap"])))
    tau = float(s["tau_error_dedup"])
    row = dict(k_within_one=within, acceptances=A, max_loss=loss, loss_floor=s["loss_floor"],
               tau_error=tau, tau_error_both_kernels=float(s["tau_error"]),
               tau_error_in_sample=float(s["tau_error_dedup_in_sample"]), max_oracle_gap=gap)
    row["goals_met"] = dict(k_within_one=within >= A - 1, loss=loss <= GOALS["loss"], tau=tau <= GOALS["tau"],
                            gap=gap <= GOALS["gap"])
    return row


def fidelity(run: Path) -> dict:
    score = load_payload(run / "score.json", "score")
    model = score.get("model") or load_payload(run / "prediction.json", "predict").get("model", run.name)
    depths = [dict(depth=e["depth"], versions={v: version_row(s) for v, s in e["versions"].items()},
                   unavailable=e.get("unavailable", {})) for e in score["depths"]]
    return dict(run=str(run), model=model, preset=preset_name(model), wall_s=wall_seconds(run), depths=depths)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def print_table(f: dict) -> None:
    wall = "-" if f["wall_s"] is None else f"{int(f['wall_s'] // 60)}:{int(f['wall_s'] % 60):02d}"
    print(f"\n{f['run']}  ({f['model']}, demo wall time {wall})")
    head = ["depth", "version", "k̂* within one", "max loss [floor]", "τ err (out)", "τ err (in)", "max gap",
            "all four"]
    rows = [head, ["---"] * len(head)]
    for e in f["depths"]:
        for v, r in e["versions"].items():
            rows.append([str(e["depth"]), v, f"{r['k_within_one']}/{r['acceptances']}",
                         f"{_pct(r['max_loss'])} [{_pct(r['loss_floor'])}]", _pct(r["tau_error"]),
                         _pct(r["tau_error_in_sample"]), _pct(r["max_oracle_gap"]),
                         "yes" if all(r["goals_met"].values()) else "no"])
        for v, why in e["unavailable"].items():
            rows.append([str(e["depth"]), v, f"unavailable: {why}"] + [""] * (len(head) - 3))
    for row in rows:
        print("| " + " | ".join(row) + " |")


def save_results(run: Path, preset: str, dest: Path) -> Path:
    target = dest / preset
    target.mkdir(parents=True, exist_ok=True)
    for name in ("score.json", "summary.txt"):
        if (run / name).exists():
            shutil.copy2(run / name, target / name)
    return target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders of `moespec demo --out-dir DIR`")
    ap.add_argument("--json", type=Path, help="write every run's figures here as JSON")
    ap.add_argument("--save-results", type=Path, metavar="DIR",
                    help="copy each run's score.json and summary.txt to DIR/<preset>/")
    args = ap.parse_args()
    missing = [str(r) for r in args.runs if not (r / "score.json").exists()]
    if missing:
        raise SystemExit(f"no score.json in {', '.join(missing)}; finish the run with `moespec demo --out-dir DIR`")
    results = [fidelity(r) for r in args.runs]
    for f in results:
        print_table(f)
        if args.save_results:
            print(f"saved to {save_results(Path(f['run']), f['preset'], args.save_results)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
