"""moespec batch: the best draft length per batch size on a GGUF file, predicted and scored.

Three artifacts in --out-dir, each reused when present (an interrupted run resumes): the prediction
(V̂_B(k) timed on llama.cpp, `bench.batch_passes`), the oracle sweep at every (k, a, B)
(`bench.batch_sweep`), never read by the prediction, and the score (`costmodel.batch.score_schedule`);
plus schedule.png, k̂*(a, B) against a, one line per B.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import Progress
from rich.table import Table

from moespec import artifacts
from moespec.cli.app import app, cli_console
from moespec.cli.checks import interval, output_folder
from moespec.cli.settings import _parse_sizes
from moespec.cli.theory import _acceptances

PREDICTION, SWEEP, SCORE = "batch-prediction.json", "batch-sweep.json", "batch-score.json"
DEFAULT_ACCEPTANCES = ("0.3", "0.5", "0.7", "0.8", "0.9", "0.95")


def _step(console, path: Path, kind: str, label: str, make):
    """The payload of `path` when a run left it, else make(progress) written there."""
    if path.exists():
        console.print(f"{label}: reusing {path}")
        return artifacts.load(path, kind)["payload"]
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(label, total=None)
        payload = make(lambda done, total: bar.update(task, completed=done, total=total))
    artifacts.write(path, kind, payload)
    console.print(f"{label}: wrote {path}")
    return payload


def _figure(score: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    sizes = sorted({c["B"] for c in score["cells"]})
    for i, B in enumerate(sizes):  # each B a little higher, so equal staircases stay apart
        cells, lift = [c for c in score["cells"] if c["B"] == B], 0.06 * (i - (len(sizes) - 1) / 2)
        line, = ax.step([c["a"] for c in cells], [c["k_hat"] + lift for c in cells], where="post", label=f"B = {B}")
        ax.plot([c["a"] for c in cells], [c["k_measured"] + lift for c in cells], "o", color=line.get_color(), alpha=0.6)
    ax.set_xlabel("acceptance a")
    ax.set_ylabel("draft length k")
    ax.set_title("k̂*(a, B): lines predicted, dots measured best")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@app.command("batch")
def batch_command(
    model: Annotated[Path, typer.Option(exists=True, dir_okay=False, help="the GGUF target (llama.cpp)")],
    batch_sizes: Annotated[str, typer.Option(help="batch sizes such as 1,2,4,8")] = "1,2,4,8",
    max_k: Annotated[int, typer.Option(callback=interval(1, 16), help="largest draft length")] = 4,
    acceptance: Annotated[list[str] | None, typer.Option("--acceptance", "-a", help="acceptances of the sweep; "
                                                         f"repeatable (default {', '.join(DEFAULT_ACCEPTANCES)})")] = None,
    prompt_tokens: Annotated[int, typer.Option(callback=interval(2), help="tokens of each prompt")] = 128,
    max_new_tokens: Annotated[int, typer.Option(callback=interval(3), help="new tokens per sequence")] = 48,
    reps: Annotated[int, typer.Option(callback=interval(1), help="repetitions of each timed point")] = 3,
    threads: Annotated[int | None, typer.Option(callback=interval(1), help="llama.cpp threads")] = None,
    out_dir: Annotated[Path, typer.Option(callback=output_folder, help="where the artifacts go")] = Path("moespec-batch"),
    restart: Annotated[bool, typer.Option(help="set earlier artifacts of --out-dir aside and start over")] = False,
) -> None:
    """k̂*(a, B) on a GGUF file: V̂_B timed, an oracle sweep at every (k, a, B) it never reads, the score."""
    from moespec.bench.batch_passes import batch_step_times
    from moespec.bench.batch_sweep import sweep_batch
    from moespec.bench.prompts import batch_prompt_ids
    from moespec.costmodel.batch import score_schedule
    from moespec.models.specs import load

    if model.suffix != ".gguf":
        raise typer.BadParameter(f"{model} is not a .gguf file; moespec batch decodes B sequences on llama.cpp",
                                 param_hint="'--model'")
    sizes = _parse_sizes(batch_sizes)
    grid = [float(a) for a in _acceptances(acceptance or list(DEFAULT_ACCEPTANCES))]
    if max_new_tokens < max_k + 2:
        raise typer.BadParameter(f"--max-new-tokens {max_new_tokens} is under --max-k + 2 = {max_k + 2}",
                                 param_hint="'--max-new-tokens'")
    out_dir.mkdir(parents=True, exist_ok=True)
    if restart:
        for name in (PREDICTION, SWEEP, SCORE, "schedule.png"):
            if (out_dir / name).exists():
                (out_dir / name).replace(out_dir / f"{name}.old")
    console = cli_console()
    prediction = _step(console, out_dir / PREDICTION, "batch-predict", f"timing V_B(k) at B = {sizes}", lambda p: {
        "model": str(model), **batch_step_times(model, sizes, max_k, depth=prompt_tokens, reps=max(reps, 3) + 2,
                                                threads=threads, progress=p)})
    target, tok = load(str(model), backend="llama.cpp", threads=threads, sequences=max(sizes),
                       n_ctx=prompt_tokens + max_new_tokens + max_k + 2)
    prompts = batch_prompt_ids(tok, prompt_tokens, max(sizes))
    sweep = _step(console, out_dir / SWEEP, "batch-sweep", f"the oracle sweep at B = {sizes}", lambda p: {
        "model": str(model), "acceptances": grid, "by_batch": {str(B): v for B, v in sweep_batch(
            target, prompts, sizes=sizes, max_k=max_k, acceptances=grid, max_new_tokens=max_new_tokens, reps=reps,
            vocab_limit=len(tok), progress=p).items()}})
    V = {int(B): v for B, v in prediction["V"].items()}
    measured = {int(B): {float(a): T for a, T in row["T"].items()} for B, row in sweep["by_batch"].items()}
    score = score_schedule({B: V[B] for B in measured}, measured, grid)
    artifacts.write(out_dir / SCORE, "batch-score", {"model": str(model), **score})
    _figure(score, out_dir / "schedule.png")
    table = Table("a", *(f"B={B}: k̂* / best" for B in sorted(measured)), title="draft length per batch size "
                  "(predicted / measured best)")
    for a in grid:
        row = {c["B"]: c for c in score["cells"] if c["a"] == a}
        table.add_row(f"{a:g}", *(f"{row[B]['k_hat']} / {row[B]['k_measured']}" for B in sorted(measured)))
    console.print(table)
    console.print(f"k̂* within one of the measured best in {score['within_one']:.0%} of the (a, B) cells (goal >= 90%); "
                  f"throughput lost at k̂*: median {score['loss_median']:.1%}, largest {score['loss_max']:.1%} "
                  f"(goal <= 5%); wrote {out_dir / SCORE}, {out_dir / 'schedule.png'}")
    steps = " ".join(f"--batch-step-times {B}=" + ",".join(f"{1e3 * v:.4g}" for v in V[B]) for B in sorted(V))
    console.print(f"engine settings: moespec settings {steps} -a A", soft_wrap=True, markup=False, highlight=False)
