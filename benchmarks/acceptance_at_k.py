"""E(k) read from a run at each draft length against E(k) implied by the run at kmax alone, from a finished
run folder of `moespec demo ... --draft/--prompt-lookup/--ngram` (no decoding, no timing):

  at k      tokens a round of the calibration's own run at k: 1 + Σ_j Π_{i≤j} α_i^(k) of its counts
            (`CandidateAcceptance.at_k`, what the answer reads)
  from kmax the same sum over the α_j of the run at kmax, cut at k (the answer before 2026-12-07)
  held out  tokens a round of the held-out check's run at k (out of sample: other prompts)

    python benchmarks/acceptance_at_k.py RUN_FOLDER [--out acceptance.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from moespec import artifacts, run_files
from moespec.chain.candidate_check import HeldoutCheck
from moespec.chain.candidates import CandidateCalibration
from moespec.costmodel.positional import expected_tokens_positional


def rows(folder: Path) -> list[dict]:
    """One row per candidate of the folder: its E(k) three ways (module docstring), k = 0..kmax."""
    out = []
    for path in sorted(folder.glob(f"{run_files.CANDIDATE}*{run_files.CALIBRATION_SUFFIX}")):
        cal = CandidateCalibration.from_dict(artifacts.load(path, run_files.CALIBRATION_KIND)["payload"])
        m, kmax = cal.measured, cal.kmax
        if not m.at_k:
            raise SystemExit(f"{path} has no runs at each k: run `moespec demo` on the folder again")
        check_path = path.with_name(path.name.replace(run_files.CALIBRATION_SUFFIX, run_files.CHECK_SUFFIX))
        check = HeldoutCheck.from_dict(artifacts.load(check_path, run_files.CHECK_KIND)["payload"]) \
            if check_path.exists() else None
        out.append({"candidate": cal.candidate.name,
                    "at_k": [1.0] + [float(expected_tokens_positional(c.alpha[:k], k)) for k, c in enumerate(m.at_k, 1)],
                    "from_kmax": [float(expected_tokens_positional(m.acceptance.alpha, k)) for k in range(kmax + 1)],
                    "held_out": list(check.tokens_per_round) if check is not None and check.rounds else None})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    got = rows(args.folder)
    for r in got:
        print(r["candidate"])
        for name in ("at_k", "from_kmax", "held_out"):
            if r[name] is not None:
                print(f"  {name:9s} " + " ".join(f"{x:5.2f}" for x in r[name]))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"folder": str(args.folder), "rows": got}, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
