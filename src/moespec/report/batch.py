"""The report's part on batch size B (`chain.batch_chain`, run by `moespec demo` on llama.cpp and by
`moespec batch`): the schedule k̂*(a, B) of each version against the sweep's best, and its score."""

from __future__ import annotations

from typing import Any

from moespec.report.html import Table


def batch_blocks(score: dict[str, Any]) -> list:
    """A line per version with the issue's goals (k̂* within one at >= 90% of the (a, B) cells, loss
    <= 5%), and Table 9: k̂*(a, B) of each version / the measured best, one column per B."""
    versions = score["versions"]
    lines = [f"at batch size B ({version}): k̂*(a, B) within one of the sweep's best in {s['within_one']:.0%} of "
             f"{len(s['cells'])} (a, B) cells (goal >= 90%), throughput lost at k̂* median {s['loss_median']:.1%}, "
             f"largest {s['loss_max']:.1%} (goal <= 5%)" for version, s in versions.items()]
    first = next(iter(versions.values()))["cells"]
    sizes = sorted({c["B"] for c in first})
    rows = []
    for a in score["acceptances"]:
        by = {v: {c["B"]: c for c in s["cells"] if c["a"] == a} for v, s in versions.items()}
        rows.append([f"{a:g}", *(" / ".join([*(str(by[v][B]["k_hat"]) for v in versions),
                                             str(by[next(iter(versions))][B]["k_measured"])]) for B in sizes)])
    table = Table(f"Table 9: best draft length per batch size, {' / '.join(versions)} / measured best",
                  ["a", *(f"B = {B}" for B in sizes)], rows)
    return [*lines, table]
