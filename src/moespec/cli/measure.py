"""moespec measure: verify times, the oracle sweep and the real-draft K-sweep of one model."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from moespec.bench.measure_base import H_PROBE_ACCEPTANCE
from moespec.texts import PROMPT_COUNT
from moespec.cli.app import app, cli_console
from moespec.cli.checks import MAX_DRAFT, ROUTING_HELP, interval, model_spec, output_file, routing_file
from moespec.cli.options import parse_layers
from moespec.cli.sizes import check_batch_model, check_measure
from moespec.cli.loading import BACKEND_HELP
from moespec.kernel_names import ENGINE_KERNELS
from moespec.run_files import MEASUREMENT


def _op_layers(text: str) -> str:
    parse_layers(text)  # ints or "mid"; their range is checked against the verified routing
    return text


HELP = {
    "model": "target: synthetic:NAME or a local checkpoint folder",
    "draft": "draft model spec for the real-draft K-sweep",
    "stride": "tokens of the greedy continuation between two repetitions' windows (default 3)",
    "steps": "each oracle run takes exactly this many steps (verify passes of k + 1 tokens) instead of decoding "
             "--new-tokens",
    "oracle_reps": "runs of each oracle cell per prompt, spread over the sweep",
    "start_stride": "tokens of the greedy text between the starts of two oracle repetitions' runs (default 0: every "
                    "run starts at the prompt's end)",
    "k": f"draft length of the oracle sweep, 0..{MAX_DRAFT} (repeatable)",
    "scaling": "largest n of the scaling curve (default 16; 0: skip)",
    "lookup": "n-gram size: prompt lookup as the draft",
    "depth": "context depth d in tokens (repeatable)",
    "prompts": f"built-in prompts to use (1..{PROMPT_COUNT})",
    "new_tokens": "tokens generated per sweep run",
    "acceptance": "oracle acceptance a in [0, 1) (repeatable)",
    "n_max": "largest verify pass size n, >= 1 (default 9)",
    "out": "where to write the measure artifact",
    "threads": "llama.cpp's threads (default: all cores)",
    "verified": "routing of the verified text (`moespec trace-verified`): time the expert operation of --op-layers on "
                "each verify pass's own window right after the pass (for the measured-time version)",
    "op_layers": "with --verified: MoE layers, ints or 'mid' (give the characterized ones)",
    "base": "write the base measurement that `moespec predict` reads: the verify times and h(k), probed at a = "
            f"{H_PROBE_ACCEPTANCE} off the scored grid; no sweep",
    "points": "the point log (default: OUT's stem + .points.jsonl); a base and a sweep measurement given one share "
              "their verify passes",
    "restart": "move a point log made under another provenance (model, fingerprint, dtype, --flush, --layers, draft) "
               "to NAME.old and measure afresh",
    "backend": BACKEND_HELP + " llama.cpp runs one kernel, its grouped mul_mat_id: the verify times and the oracle "
               "sweep are measured with it alone",
    "batch_sizes": "on a GGUF file: measure at these batch sizes (1,2,4,8): τ_B, h_B(k) and the oracle sweep at every "
                   "(k, a, B); --k (largest), --acceptance, --depth (prompt tokens), --new-tokens and --oracle-reps "
                   "apply",
}


@app.command("measure")
def measure_command(
    model: str = typer.Option(..., "--model", callback=model_spec, help=HELP["model"]),
    draft: Optional[str] = typer.Option(None, "--draft", callback=model_spec, help=HELP["draft"]),
    prompt_lookup: Optional[int] = typer.Option(None, "--prompt-lookup", callback=interval(1), help=HELP["lookup"]),
    depth: Optional[list[int]] = typer.Option(None, "--depth", callback=interval(1), help=HELP["depth"]),
    full: bool = typer.Option(False, "--full", help="the paper's protocol: 6 prompts, d=512 and 4096, 256 tokens"),
    reps: Optional[int] = typer.Option(None, "--reps", callback=interval(1), help="repetitions of each verify pass"),
    stride: Optional[int] = typer.Option(None, "--stride", callback=interval(0), help=HELP["stride"]),
    prompts: Optional[int] = typer.Option(None, "--prompts", callback=interval(1, PROMPT_COUNT), help=HELP["prompts"]),
    new_tokens: Optional[int] = typer.Option(None, "--new-tokens", callback=interval(1), help=HELP["new_tokens"]),
    steps: Optional[int] = typer.Option(None, "--steps", callback=interval(1), help=HELP["steps"]),
    oracle_reps: Optional[int] = typer.Option(None, "--oracle-reps", callback=interval(1), help=HELP["oracle_reps"]),
    start_stride: Optional[int] = typer.Option(None, "--start-stride", help=HELP["start_stride"]),
    k: Optional[list[int]] = typer.Option(None, "--k", callback=interval(0, MAX_DRAFT), help=HELP["k"]),
    acceptance: Optional[list[float]] = typer.Option(None, "--acceptance", callback=interval(0, 1, hi_open=True),
                                                     help=HELP["acceptance"]),
    n_max: Optional[int] = typer.Option(None, "--n-max", callback=interval(1), help=HELP["n_max"]),
    scaling_n_max: Optional[int] = typer.Option(None, "--scaling-n-max", callback=interval(0), help=HELP["scaling"]),
    layers: Optional[int] = typer.Option(None, "--layers", callback=interval(1), help="layers of a synthetic preset"),
    flush: bool = typer.Option(True, "--flush/--no-flush", help="flush the cache before each timed pass (App. D)"),
    out: Path = typer.Option(Path(MEASUREMENT), "--out", callback=output_file, help=HELP["out"]),
    verified: Optional[Path] = typer.Option(None, "--verified", exists=True, dir_okay=False, help=HELP["verified"]),
    op_layers: str = typer.Option("0,mid", "--op-layers", callback=_op_layers, help=HELP["op_layers"]),
    base: bool = typer.Option(False, "--base", help=HELP["base"]),
    points: Optional[Path] = typer.Option(None, "--points", help=HELP["points"]),
    restart: bool = typer.Option(False, "--restart", help=HELP["restart"]),
    routing: Optional[Path] = typer.Option(None, "--routing", callback=routing_file, help=ROUTING_HELP),
    backend: str = typer.Option("auto", "--backend", help=HELP["backend"]),
    threads: Optional[int] = typer.Option(None, "--threads", callback=interval(1), help=HELP["threads"]),
    batch_sizes: Optional[str] = typer.Option(None, "--batch-sizes", help=HELP["batch_sizes"]),
) -> None:
    """Measure τ_p(n), S(n), the scaling curve, h(k) and the oracle (and draft) sweeps; resumable under
    the same provenance. With --base: the verify times and the h(k) probe only. With --batch-sizes:
    the measurement at batch size B (`moespec predict` / `score` read it like the others)."""
    from moespec.bench.measure import measure

    if batch_sizes is not None:
        if base or draft or prompt_lookup or verified:
            raise typer.BadParameter("--batch-sizes measures the oracle at batch size B; drop --base, --draft, "
                                     "--prompt-lookup and --verified", param_hint="'--batch-sizes'")
        _measure_batch(model, batch_sizes, k=k, acceptance=acceptance, depth=depth, new_tokens=new_tokens,
                       reps=oracle_reps, threads=threads, out=out, restart=restart)
        return
    knobs = _knobs(base, depths=depth or None, reps=reps, stride=stride, prompts=prompts, new_tokens=new_tokens,
                   oracle_steps=steps, oracle_reps=oracle_reps, oracle_start_stride=start_stride, ks=k or None,
                   acceptances=acceptance or None, ns=range(1, n_max + 1) if n_max else None,
                   scaling_ns=range(1, scaling_n_max + 1) if scaling_n_max is not None else None,
                   flush=None if flush else False)
    check_measure(model, backend, full=full, base=base, layers=layers, knobs=knobs)  # before the model loads
    try:
        if verified is not None:
            knobs.update(_verified(verified, op_layers))
        payload = measure(model, draft_spec=draft, prompt_lookup=prompt_lookup, full=full, out=out, layers=layers,
                          base=base, points=points, restart=restart, routing=routing, backend=backend,
                          threads=threads, **knobs)
    except (ValueError, FileNotFoundError) as e:
        raise typer.BadParameter(str(e)) from e
    _print_measurement(payload, model, out)


def _knobs(base: bool, **given) -> dict:
    """The measure knobs the options gave (None: the preset's); refused where --base does not take them."""
    knobs = {name: value for name, value in given.items() if value is not None}
    overridden = sorted({"acceptances", "oracle_reps", "scaling_ns"} & set(knobs)) if base else []
    if overridden:
        raise typer.BadParameter(f"--base probes h(k) at its own acceptance with no scaling curve; {overridden} do "
                                 "not apply: drop --acceptance, --oracle-reps and --scaling-n-max")
    return knobs


def _verified(path: Path, op_layers: str) -> dict:
    """The verified windows and the layers (--op-layers) whose operation is timed between the passes."""
    from moespec.bench.expert_op import resolve_layers
    from moespec.moe.traces import RoutingTrace

    windows = RoutingTrace.load(path)
    return dict(verified=windows, op_layers=resolve_layers(op_layers.split(","), windows.num_layers))


def _print_measurement(payload: dict, model: str, out: Path) -> None:
    console = cli_console()
    table = Table("depth", "n", "τ_slot ms", "τ_dedup ms", "S(n) ms [95% CI]", title=f"verify times, {model}")
    for v in payload["verify"]:
        savings = {s["n"]: s for s in v["saving"]}
        tau = v["tau"]
        for n in v["ns"]:
            s = savings.get(n)
            table.add_row(
                str(v["depth"]), str(n),
                *(f"{1e3 * tau[p][str(n)]:.2f}" if p in tau else "-" for p in ENGINE_KERNELS),
                f"{1e3 * s['point']:+.2f} [{1e3 * s['lo']:+.2f}, {1e3 * s['hi']:+.2f}]" if s else "-",
            )
    console.print(table)
    for entry in payload["oracle"]:
        h = ", ".join(f"{1e3 * float(x):.1f}" for x in entry["h"].values())
        console.print(f"oracle sweep {entry['kernel']} d={entry['depth']}: h(k) ms = {h}")
    for depth, h in payload.get("h", {}).items():
        console.print(f"h(k) probe d={depth}: h(k) ms = {', '.join(f'{1e3 * float(x):.1f}' for x in h.values())}")
    console.print(f"wrote {out}")


def _measure_batch(model: str, batch_sizes: str, *, k, acceptance, depth, new_tokens, reps, threads, out: Path,
                   restart: bool) -> None:
    from moespec.chain.batch_chain import BatchKnobs, measure
    from moespec.chain.run_folder import move_aside
    from moespec.cli.batch import DEFAULT_ACCEPTANCES, gguf_only
    from moespec.cli.options import parse_sizes

    path = gguf_only(model)
    if restart:
        move_aside([out])
    try:
        knobs = BatchKnobs(sizes=tuple(parse_sizes(batch_sizes)), max_k=max(k) if k else 4,
                           acceptances=tuple(float(a) for a in acceptance or DEFAULT_ACCEPTANCES),
                           prompt_tokens=depth[0] if depth else 128, new_tokens=new_tokens or 48, reps=reps or 3,
                           threads=threads)
        check_batch_model(path, knobs, "--depth")
        payload = measure(path, out, knobs)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    table = Table("B", "τ_B(1..k+1) ms", "h_B(0..k) ms", "measured V_B(0..k) ms", title=f"batch measurement, {path}")
    for B, row in payload["by_batch"].items():
        taus = " ".join(f"{1e3 * t['median']:.2f}" for t in row["tau"].values())
        table.add_row(B, taus, " ".join(f"{1e3 * h:.2f}" for h in row["h"]),
                      " ".join("-" if v is None else f"{1e3 * v:.2f}" for v in row["sweep"]["V"]))
    cli_console().print(table)
    cli_console().print(f"wrote {out}")
