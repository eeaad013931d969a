"""moespec train: train a shipped preset's recipe on the standard library and the corpus."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from moespec.cli.app import app, cli_console
from moespec.cli.checks import interval


@app.command()
def train(
    name: str = typer.Argument(..., help="recipe: olmoe, draft, smollm2-draft, or the test-sized tiny-moe and tiny-smollm2-draft (models/train.py RECIPES)"),
    out: Path = typer.Option(..., "--out", file_okay=False,
                             help="folder for the weights, config and manifest; a checkpoint there is resumed"),
    seed: int = typer.Option(0, callback=interval(0), help="seed of the weights and of the batches"),
    threads: int = typer.Option(2, callback=interval(1), help="torch threads; the weights depend on it"),
    steps: Optional[int] = typer.Option(None, callback=interval(1), help="override the recipe's step count"),
) -> None:
    """Train a recipe (held-out files never read) and write safetensors and a manifest."""
    import dataclasses

    from moespec.models.train import recipe
    from moespec.models.train import train as run

    r = recipe(name)
    if steps is not None:
        r = dataclasses.replace(r, steps=steps)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[info]}"), TimeRemainingColumn()) as bar:
        task = bar.add_task(f"train {name}", total=r.steps, info="")

        unit = "bits/byte" if r.tokenizer == "bytes" else "bits/token"

        def on_step(step: int, bits: float, tps: float) -> None:
            bar.update(task, completed=step, info=f"{bits:.3f} {unit}  {tps:,.0f} tokens/s")

        m = run(name, out, r=r, seed=seed, threads=threads, on_step=on_step,
                command="moespec " + " ".join(sys.argv[1:]))
    key = "held_out_bits_per_byte" if "held_out_bits_per_byte" in m else "held_out_bits_per_token"
    label = key.removeprefix("held_out_").replace("_per_", "/")  # bits/byte or bits/token
    table = Table("preset", "steps", "tokens", "wall", f"held-out code {label}", f"held-out prose {label}")
    bits = m[key]
    table.add_row(m["preset"], str(m["steps"]), f"{m['tokens_seen']:,}", f"{m['train_wall_s']:.0f} s",
                  f"{bits['code']:.3f}", f"{bits['prose']:.3f}")
    if "held_out_teacher_agreement" in m:
        agree = m["held_out_teacher_agreement"]
        cli_console().print(f"held-out top-1 agreement with the teacher: {agree['code']:.3f} on code, "
                        f"{agree['prose']:.3f} on prose")
    cli_console().print(table)
    typer.echo(f"wrote {out}")
