"""`moespec characterize`: the one-layer expert-operation benchmark, fits, bandwidths and eps."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from moespec import run_files
from moespec.bench.characterize import (
    DEFAULT_DEPTHS,
    DEFAULT_REPS,
    DEFAULT_U_POINTS,
    DEFAULT_WINDOWS,
    characterize as run_characterize,
    points_path,
)
from moespec.bench.expert_op import MOESPEC_KERNELS, TRANSFORMERS_KERNELS
from moespec.cli import checks
from moespec.cli.app import app, cli_console
from moespec.cli.checks import interval, model_spec, output_file
from moespec.cli.options import parse_layers, parse_n_range
from moespec.costmodel.fit import fit_pass_sizes
from moespec.kernel_names import COST_DEDUP, COST_KERNELS, COST_SLOT


def _fit_range(text: str) -> str:
    """--n: a range holding the pass sizes that identify the fits (4) and (E.1), checked before timing."""
    first, last = parse_n_range(text)
    try:
        fit_pass_sizes(range(first, last + 1))
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    return text


def _check_longest(traces: Path, last: int) -> None:
    """--n's largest pass must fit in a trace document: refused here, before any pass is built."""
    from moespec.moe.traces import RoutingTrace

    longest = max((doc.shape[0] for doc in RoutingTrace.load(traces).documents), default=0)
    if last > longest:
        raise typer.BadParameter(f"the largest pass, n = {last}, is longer than the trace's longest document "
                                 f"({longest} tokens in {traces}); give --n up to {longest} or trace longer documents",
                                 param_hint="'--n'")


def _depths(text: str) -> str:
    """--depths: distinct context depths >= 0, "512,4096", checked before timing."""
    try:
        depths = [int(x) for x in text.split(",")]
    except ValueError:
        depths = []
    if not depths or min(depths) < 0 or len(set(depths)) != len(depths):
        raise typer.BadParameter(f"{text!r} is not a list of distinct depths >= 0 such as 512,4096")
    return text


def _u_points(value: int) -> int:
    if value < 0 or value == 1:
        raise typer.BadParameter(f"{value} is not valid; give 0 (every U) or >= 2 U values per n")
    return value


def _kernels(text: str) -> str:
    names = [k.strip() for k in text.split(",") if k.strip()]
    if not set(COST_KERNELS) <= set(names) or not set(names) <= {*MOESPEC_KERNELS, *TRANSFORMERS_KERNELS}:
        raise typer.BadParameter(f"{text!r}: give slot, dedup and any of {', '.join(TRANSFORMERS_KERNELS)}")
    return text


def table(payload: dict) -> Table:
    """A Table-1-style summary: beta per kernel at n = 2 and n = 8 (GB/s), r, u_bar, re-read cost, eps."""
    n_all = [int(x) for x in payload["n"]]
    shown = [x for x in (2, 8) if x in n_all] or n_all[:1]
    kernels = list(payload["beta"])
    t = Table(title=f"characterization of {payload.get('model', '')}: GB/s including fixed work")
    t.add_column("re-read cost", justify="right")
    for x in shown:
        for k in kernels:
            t.add_column(f"β_{k} n={x}", justify="right")
        t.add_column(f"r n={x}", justify="right")
        t.add_column(f"ū n={x}", justify="right")
    t.add_column("ε slot / dedup / engine", justify="right")
    costs = [float(c) for c in payload["re_read_cost"].values()]
    row = [f"{min(costs):.2f}" if len(costs) == 1 or min(costs) == max(costs) else f"{min(costs):.2f}–{max(costs):.2f}"]
    get = lambda d, x: d[x] if x in d else d[str(x)]  # noqa: E731  (int keys in memory, str keys from JSON)
    for x in shown:
        row += [f"{get(payload['beta'][k], x)['aggregate'] / 1e9:.1f}" for k in kernels]
        row += [f"{float(get(payload['r'], x)):.2f}", f"{float(get(payload['u_bar'], x)):.2f}"]
    eps = payload["eps"]
    row.append(f"{eps[COST_SLOT]:.3f} / {eps[COST_DEDUP]:.3f} / {eps['engine']:.3f}")
    t.add_row(*row)
    return t


@app.command()
def characterize(
    model: str = typer.Option(..., "--model", callback=model_spec, help="synthetic:NAME or a local checkpoint folder"),
    traces: Path = typer.Option(..., "--traces", help="routing trace of this model (from `moespec trace`)"),
    layers: str = typer.Option("0,mid", "--layers", help="MoE layers to time: indices or 'mid'"),
    n: str = typer.Option("1..9", "--n", callback=_fit_range,
                          help="pass sizes, a range like 1..9 (the fits use n >= 2: at least two of them)"),
    reps: int = typer.Option(DEFAULT_REPS, "--reps", callback=interval(1), help="timed repetitions per point"),
    u_points: int = typer.Option(DEFAULT_U_POINTS, "--u-points", callback=_u_points,
                                 help="distinct-expert counts U per n on chosen ids, >= 2 (0: all)"),
    windows: int = typer.Option(DEFAULT_WINDOWS, "--windows", callback=interval(1),
                                help="windows of recorded routing per n"),
    verified: Optional[Path] = typer.Option(
        None, "--verified", exists=True, dir_okay=False,
        help="routing of the verified text (from `moespec trace-verified`): its windows are timed for the "
             "measured-time version"),
    verified_reps: Optional[int] = typer.Option(None, "--verified-reps", callback=interval(1),
                                                help="repetitions on those windows (default --reps)"),
    kernels: str = typer.Option("slot,dedup", "--kernels", callback=_kernels,
                                help="kernels: slot, dedup and any of eager, grouped_mm, batched_mm"),
    dtype: str = typer.Option(None, "--dtype", callback=checks.dtype, help="weights dtype (default: the model's)"),
    figure: Path = typer.Option(None, "--figure", callback=output_file,
                                help="Figure-2-style PNG (default: OUT with .png)"),
    flush_mib: int = typer.Option(None, "--flush-mib", callback=interval(1),
                                  help="cache-flush buffer (default: 2x LLC, >= 256 MiB)"),
    seed: int = typer.Option(0, "--seed", callback=interval(0)),
    depths: str = typer.Option(",".join(map(str, DEFAULT_DEPTHS)), "--depths", callback=_depths,
                               help="a .gguf model: the context depths at which the rest of its pass (attention "
                                    "over the cache, norms, RoPE) is timed, e.g. 512,4096"),
    out: Path = typer.Option(Path(run_files.CHARACTERIZATION), "--out", callback=output_file,
                             help="the characterize artifact"),
    restart: bool = typer.Option(False, "--restart", help="move a point log made under another provenance (model, "
                                 "fingerprint, dtype, traces, --seed, --u-points, --windows) to NAME.old, start afresh"),
) -> None:
    """Time one or two layers' expert operation and write fits, bandwidths, r(n), ū(n) and ε.

    Resumable: finished points are kept in OUT.points.jsonl and skipped when the command runs again
    under the same provenance; under another it stops, naming both (or starts afresh with --restart).
    """
    console = cli_console()
    if points_path(out).exists() and not restart:
        console.print(f"resuming from {points_path(out)}")
    first, last = parse_n_range(n)
    _check_longest(traces, last)
    payload = run_characterize(
        model, traces, layers=parse_layers(layers), n=range(first, last + 1), reps=reps, u_points=u_points or None,
        windows=windows, verified=verified, verified_reps=verified_reps,
        kernels=[k.strip() for k in kernels.split(",") if k.strip()], out=out, dtype=dtype,
        flush_bytes=None if flush_mib is None else flush_mib * 1024**2, seed=seed, progress=True, restart=restart,
        depths=[int(d) for d in depths.split(",")])
    from moespec.report.fig_bandwidth import plot_bandwidth

    png = plot_bandwidth(payload, figure or out.with_suffix(".png"))
    console.print(table(payload))
    cross = payload["crossover"]
    console.print(f"crossover: {'dedup never pays' if cross is None else f'n = {cross}'}; wrote {out} and {png}")
