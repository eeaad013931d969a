"""The chain at batch size B on a GGUF file (`chain.batch_chain`): `moespec batch` runs it whole, each
artifact in --out-dir reused when present (an interrupted run resumes; the measurement also within
itself, one batch size at a time); `moespec measure --batch-sizes`, `predict` and `score` run its
steps one by one. The tables and lines they print are here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from moespec import artifacts
from moespec.cli.app import app, cli_console
from moespec.cli.checks import interval, output_folder
from moespec.cli.options import parse_acceptances, parse_sizes

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
    model: Annotated[Path, typer.Option(exists=True, dir_okay=False, help="the GGUF target (llama.cpp)")],
    batch_sizes: Annotated[str, typer.Option(help="batch sizes such as 1,2,4,8")] = "1,2,4,8",
    max_k: Annotated[int, typer.Option(callback=interval(1, 16), help="largest draft length")] = 4,
    acceptance: Annotated[list[str] | None, typer.Option("--acceptance", "-a", help="acceptances of the sweep; "
                                                         f"repeatable (default {', '.join(DEFAULT_ACCEPTANCES)})")] = None,
    prompt_tokens: Annotated[int, typer.Option(callback=interval(2), help="tokens of each prompt")] = 128,
    max_new_tokens: Annotated[int, typer.Option(callback=interval(3), help="new tokens per sequence")] = 48,
    reps: Annotated[int, typer.Option(callback=interval(1), help="repetitions of each swept point")] = 3,
    threads: Annotated[int | None, typer.Option(callback=interval(1), help="llama.cpp threads")] = None,
    trace_tokens: Annotated[int, typer.Option(callback=interval(64), help="tokens of the routing trace, in "
                                              "documents of at most 256")] = 8192,
    out_dir: Annotated[Path, typer.Option(callback=output_folder, help="where the artifacts go")] = Path("moespec-batch"),
    restart: Annotated[bool, typer.Option(help="set earlier artifacts of --out-dir aside and start over")] = False,
) -> None:
    """k̂*(a, B) on a GGUF file: routing, characterization to n = B(k+1), the batch measurement, V̂_B, the score."""
    from moespec.chain.batch_chain import FIGURE, MEASUREMENT, PREDICTION, SCORE, BatchKnobs, batch_steps
    from moespec.report.batch import goal_lines

    model = gguf_only(model)
    try:
        knobs = BatchKnobs(sizes=tuple(parse_sizes(batch_sizes)), max_k=max_k, acceptances=tuple(
            float(a) for a in parse_acceptances(acceptance or list(DEFAULT_ACCEPTANCES))), prompt_tokens=prompt_tokens,
            new_tokens=max_new_tokens, reps=reps, trace_tokens=trace_tokens, threads=threads)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="'--max-new-tokens'") from e
    out_dir.mkdir(parents=True, exist_ok=True)
    console = cli_console()
    if restart:
        for path in out_dir.glob("batch-*"):
            path.replace(path.with_name(path.name + ".old"))
        if (out_dir / FIGURE).exists():
            (out_dir / FIGURE).replace(out_dir / f"{FIGURE}.old")
    for name, path, work in batch_steps(model, out_dir, knobs, echo=console.print):
        if path.exists():
            console.print(f"[{name}] reusing {path}", markup=False)
            continue
        work()
        console.print(f"[{name}] wrote {path}", markup=False)
    prediction = artifacts.load(out_dir / PREDICTION, "batch-predict")["payload"]
    score = artifacts.load(out_dir / SCORE, "batch-score")["payload"]
    console.print(prediction_table(prediction))
    console.print(score_table(score))
    for line in goal_lines(score):
        console.print(line)
    console.print(f"wrote {out_dir / SCORE}, {out_dir / FIGURE} (measurement: {out_dir / MEASUREMENT}); engine settings "
                  f"per batch size: moespec settings --prediction {out_dir / PREDICTION} -a A --draft D",
                  soft_wrap=True, markup=False, highlight=False)
