"""The schedule at batch size B as text (`chain.batch_chain`, run by `moespec demo` on llama.cpp and by
`moespec batch`): each version's k̂*(a, B) against the sweep's best, and its score. The report and
the CLI print the same lines and rows."""

from __future__ import annotations

from typing import Any

from moespec.report.html import Table


def goal_lines(score: dict[str, Any]) -> list[str]:
    """A line per version with the issue's goals (k̂* within one at >= 90% of the (a, B) cells, loss
    <= 5%), then whether the machine was steady during the sweep (`costmodel.steadiness`), the fix if not."""
    lines = [f"at batch size B ({version}): k̂*(a, B) within one of the sweep's best in {s['within_one']:.0%} of "
             f"{len(s['cells'])} (a, B) cells (goal >= 90%), throughput lost at k̂* median {s['loss_median']:.1%}, "
             f"largest {s['loss_max']:.1%} (goal <= 5%)" for version, s in score["versions"].items()]
    steadiness = score.get("steadiness")
    return lines + ([f"at batch size B: {steadiness['message']}"] if steadiness else [])


def schedule_rows(score: dict[str, Any]) -> tuple[list[int], list[list[str]]]:
    """(the batch sizes, one row per acceptance: a, then per B "k̂* of each version / measured best")."""
    versions = score["versions"]
    first = next(iter(versions))
    sizes = sorted({c["B"] for c in versions[first]["cells"]})
    rows = []
    for a in score["acceptances"]:
        by = {v: {c["B"]: c for c in s["cells"] if c["a"] == a} for v, s in versions.items()}
        rows.append([f"{a:g}", *(" / ".join([*(str(by[v][B]["k_hat"]) for v in versions),
                                             str(by[first][B]["k_measured"])]) for B in sizes)])
    return sizes, rows


def batch_blocks(score: dict[str, Any]) -> tuple[list[str], Table]:
    """The summary's goal lines and Table 9: k̂*(a, B) of each version / the measured best, one column per B."""
    sizes, rows = schedule_rows(score)
    return goal_lines(score), Table(f"Table 9: best draft length per batch size, {' / '.join(score['versions'])} / "
                                    "measured best", ["a", *(f"B = {B}" for B in sizes)], rows)
