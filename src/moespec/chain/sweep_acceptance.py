"""The score reads the oracle sweep only where it ran at the acceptance it is labeled with.

Per acceptance a of the prediction's grid, `costmodel.sweep_cells.acceptance_rows` says whether the
sweep's cells at a realized a within their sampling intervals. An acceptance where one did not is
refused: the score compares k̂*(a) and the loss on the other acceptances only (`restricted`), and
says which it left out; with none left the version is not scored. Re-placing such a row at its
realized acceptance would need one acceptance per row, which cells at several k need not share.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from moespec.costmodel.sweep_cells import ACCEPTANCE_LEVEL
from moespec.costmodel.predict import Prediction

PER_ACCEPTANCE = ("k_star", "speedup", "speedup_lo", "speedup_hi", "k_star_certain")  # {kernel: [A]} fields


def restricted(prediction: Prediction, keep: Sequence[int]) -> Prediction:
    """The prediction on the acceptances of its grid at indices `keep` only."""
    per_a = {f: {p: [v[i] for i in keep] for p, v in getattr(prediction, f).items()} for f in PER_ACCEPTANCE}
    return replace(prediction, acceptance=[prediction.acceptance[i] for i in keep], **per_a)


def refused_text(rows: Sequence[dict[str, Any]]) -> str:
    """"a = 0.90 (realized 0.65 of 240 tested drafts), ..." for the refused rows of `acceptance_rows`."""
    return ", ".join(f"a = {r['a']:.2f} (realized {r['realized']:.2f} of {r['tested']} tested drafts)"
                     for r in rows if r["refused"])


def refusal_message(rows: Sequence[dict[str, Any]]) -> str:
    """Why no acceptance of the grid could be scored."""
    return (f"the oracle sweep did not run at its set acceptance at any a of the grid: {refused_text(rows)}, each "
            f"outside its {100 * ACCEPTANCE_LEVEL:.0f}% sampling interval (docs/methodology.md, \"The oracle's "
            "verdict\"); measure the sweep again with this moespec")
