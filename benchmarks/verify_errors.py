"""Every prediction version's verify-time error against a run folder's base measurement alone.

The chain's score needs the oracle sweep; the verify-time error does not: it sets each version's τ̂(n)
(re-predicted from the folder's characterization, trace and base measurement with this moespec)
beside the base measurement's own verify repetitions, the held-out half (out of sample) and the fit
half (in sample), largest relative error over n, deduplicating kernel. For a folder whose sweep was
not run (a real-size chain stopped after `predict`), or to score a version added since.

    python benchmarks/verify_errors.py RUN_DIR [RUN_DIR ...] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from moespec import artifacts
from moespec.chain.prediction import predict_all, repetition_half, verify_times_at
from moespec.kernel_names import COST_DEDUP, TO_ENGINE


def folder_errors(run: Path) -> list[dict]:
    """[{depth, version, half, error, by_n}] of one run folder."""
    base = artifacts.load(run / "measurement-base.json", "measure")["payload"]
    pred = predict_all(run / "characterization.json", run / "traces.parquet", run / "measurement-base.json")
    rows = []
    for entry in pred["depths"]:
        times = verify_times_at(base, entry["depth"])
        for half in ("holdout", "fit"):
            tau = repetition_half(times, half).tau(TO_ENGINE[COST_DEDUP])
            for version, p in entry["versions"].items():
                got = dict(zip(p["n"], p["tau"]["dedup"]))
                by_n = {n: got[n] / t - 1 for n, t in sorted(tau.items()) if n in got}
                rows.append({"run": str(run), "depth": entry["depth"], "version": version, "half": half,
                             "error": max(abs(e) for e in by_n.values()), "by_n": by_n})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = [r for run in args.runs for r in folder_errors(run)]
    print(f"{'run':28s} {'d':>5s} {'version':20s} {'half':8s} {'error':>7s}  by n")
    for r in rows:
        print(f"{Path(r['run']).name[:28]:28s} {r['depth']:5d} {r['version']:20s} {r['half']:8s} {r['error']:7.1%}  "
              + " ".join(f"{e:+.1%}" for e in r["by_n"].values()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
