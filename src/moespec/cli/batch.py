"""The chain at batch size B on a GGUF file (`chain.batch_chain`): `moespec batch` runs it whole, each
artifact in --out-dir reused when present (an interrupted run resumes; the measurement also within
itself, one batch size at a time); `moespec measure --batch-sizes`, `predict` and `score` run its
steps one by one. The tables and lines they print are here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from moespec.cli.app import app, cli_console
from moespec.cli.checks import interval, output_folder
from moespec.cli.options import parse_acceptances, parse_sizes
from moespec.cli.sizes import check_batch_model, check_batch_trace

DEFAULT_ACCEPTANCES = ("0.3", "0.5", "0.7", "0.8", "0.9", "0.95")


def gguf_only(model: str | Path, option: str = "'--model'") -> Path:
    """The GGUF file the batch chain runs on, else a BadParameter naming why."""
    if Path(model).suffix != ".gguf" or not Path(model).is_file():
        raise typer.BadParameter(f"{model} is not a .gguf file; batches of B sequences decode on llama.cpp (the "
                                 "torch backend stays at B = 1)", param_hint=option)
    return Path(model)


def prediction_table(payload: dict) -> Table:
    never = {v: p["first_never_paying_batch"] for v, p in payload.get("paying", {}).items()}
    off = "; ".join([*(f"{v}: no draft pays from B = {B}" for v, B in never.items() if B is not None),
                     *(f"{v} unavailable: {why}" for v, why in payload.get("unavailable", {}).items())])
    table = Table("B", "version", "V̂_B(0..k) ms", "U^B(k+1) trace / B=1 / uniform (at k = max)",
                  title=f"step times at batch size B, {payload.get('model')}", caption=off or None)
    for B in payload["sizes"]:
        u = payload["unions"][str(B) if str(B) in payload["unions"] else B]
        last = u[max(u, key=int)]
        for version, V in payload["versions"].items():
            V = V[str(B)] if str(B) in V else V[B]
            table.add_row(str(B), version, " ".join(f"{1e3 * v:.2f}" for v in V),
                          f"{last['trace']:.1f} / {last['one_sequence']:.1f} / {last['uniform']:.1f}"
                          if version == "prediction" else "")
    return table


def score_table(payload: dict) -> Table:
    from moespec.report.batch import schedule_rows

    sizes, rows = schedule_rows(payload)
    table = Table("a", *(f"B={B} k̂* / best" for B in sizes),
                  title=f"draft length per batch size, {', '.join(payload['versions'])} / measured best")
    for row in rows:
        table.add_row(*row)
    return table


@app.command("batch")
def batch_command(
    model: Path = typer.Option(..., "--model", exists=True, dir_okay=False, help="the GGUF target (llama.cpp)"),
    batch_sizes: str = typer.Option("1,2,4,8", "--batch-sizes", help="batch sizes such as 1,2,4,8"),
    max_k: int = typer.Option(4, "--max-k", callback=interval(1, 16), help="largest draft length"),
    acceptance: Optional[list[str]] = typer.Option(None, "--acceptance", "-a", help="acceptances of the sweep; "
                                                   f"repeatable (default {', '.join(DEFAULT_ACCEPTANCES)})"),
    prompt_tokens: int = typer.Option(128, "--prompt-tokens", callback=interval(2), help="tokens of each prompt"),
    max_new_tokens: int = typer.Option(48, "--max-new-tokens", callback=interval(3), help="new tokens per sequence"),
    reps: int = typer.Option(3, "--reps", callback=interval(1), help="repetitions of each swept point"),
    threads: Optional[int] = typer.Option(None, "--threads", callback=interval(1), help="llama.cpp threads"),
    trace_tokens: int = typer.Option(8192, "--trace-tokens", callback=interval(64), help="tokens of the routing "
                                     "trace, in documents of at most 256"),
    out_dir: Path = typer.Option(Path("moespec-batch"), "--out-dir", callback=output_folder,
                                 help="where the artifacts go"),
    restart: bool = typer.Option(False, "--restart/--no-restart", help="set earlier artifacts of --out-dir aside "
                                 "and start over"),
    smoke: bool = typer.Option(False, "--smoke", help="characterize one layer, few repetitions, a small cache "
                               "flush: seconds, to check the run, not its figures"),
) -> None:
    """k̂*(a, B) on a GGUF file: routing, characterization to n = B(k+1), the batch measurement, V̂_B, the score."""
    from moespec.chain.batch_chain import FIGURE, MEASUREMENT, PREDICTION, SCORE, BatchKnobs, run_batch_chain
    from moespec.chain.demo_config import SMOKE_BATCH_CHARACTERIZE
    from moespec.report.batch import goal_lines

    model = gguf_only(model)
    try:
        knobs = BatchKnobs(sizes=tuple(parse_sizes(batch_sizes)), max_k=max_k, acceptances=tuple(
            float(a) for a in parse_acceptances(acceptance or list(DEFAULT_ACCEPTANCES))), prompt_tokens=prompt_tokens,
            new_tokens=max_new_tokens, reps=reps, trace_tokens=trace_tokens, threads=threads,
            **({"characterize": dict(SMOKE_BATCH_CHARACTERIZE)} if smoke else {}))
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="'--max-new-tokens'") from e
    check_batch_trace(knobs)
    check_batch_model(model, knobs, "--prompt-tokens")
    console = cli_console()
    prediction, score = run_batch_chain(model, out_dir, knobs, restart=restart,
                                        echo=lambda text: console.print(text, markup=False))
    console.print(prediction_table(prediction))
    console.print(score_table(score))
    for line in goal_lines(score):
        console.print(line)
    console.print(f"wrote {out_dir / SCORE}, {out_dir / FIGURE} (measurement: {out_dir / MEASUREMENT}); engine settings "
                  f"per batch size: moespec settings --prediction {out_dir / PREDICTION} -a A --draft D",
                  soft_wrap=True, markup=False, highlight=False)
