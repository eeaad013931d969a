"""moespec theory: the staircase calculator of Sec. 3.2-3.3 for measured step times."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from moespec.cli.app import app, cli_console
from moespec.cli.checks import output_file
from moespec.cli.options import parse_acceptances, parse_step_times
from moespec.costmodel.theory import summarize


def _fmt(x) -> str:
    return "-" if x is None else f"{float(x):.6g}"


@app.command()
def theory(
    step_times: str = typer.Option(
        ..., "--step-times", help="V(0),V(1),...,V(kmax): step time of a step drafting k tokens, any unit"
    ),
    acceptance: list[str] = typer.Option(
        [], "--acceptance", "-a", help="acceptance rate a in [0, 1) at which to report k*(a); repeatable"
    ),
    json_out: Optional[Path] = typer.Option(None, "--json", callback=output_file,
                                            help="also write the result as a JSON artifact"),
) -> None:
    """Best draft length k*(a), its speedup, the step points a_j and a0 from step times V(0..kmax)."""
    s = summarize(parse_step_times(step_times), parse_acceptances(acceptance))
    console = cli_console()

    steps = Table("k", "V(k)", "c_k = V(k) - V(k-1)", title="step times")
    for k, v in enumerate(s.step_times):
        steps.add_row(str(k), _fmt(v), _fmt(s.increments[k - 1]) if k else "")
    console.print(steps)

    stairs = Table("acceptance a in", "k*(a)", title="staircase")
    for lo, hi, k in s.stairs:
        stairs.add_row(f"({_fmt(lo)}, {_fmt(hi)})", str(k))
    console.print(stairs)

    points = Table("j", "a_j (B.31)", "reached", title="step points")
    for j, aj in enumerate(s.step_points, start=1):
        points.add_row(str(j), _fmt(aj), "no" if aj == 1 else "yes")
    console.print(points)
    console.print(f"a0 = V(1)/V(0) - 1 = {_fmt(s.first_draft_threshold)}   (one draft beats none for a > a0)")
    console.print("V convex and non-decreasing: (10) decides each step from two neighbours" if s.convex
                  else "V not convex and non-decreasing: step points from (B.31)")

    if s.at:
        best = Table("a", "k*(a)", "speedup T_a(k*)/T_a(0) (9)", title="best draft length")
        for a, k, sp in s.at:
            best.add_row(_fmt(a), str(k), _fmt(sp))
        console.print(best)

    if json_out is not None:
        from moespec.artifacts import write

        write(json_out, "theory", s.to_dict())
        console.print(f"wrote {json_out}")
