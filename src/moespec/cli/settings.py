"""moespec settings: the predicted best draft length k̂*(a) as llama.cpp, vLLM and SGLang settings."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from moespec.cli.app import app, cli_console
from moespec.cli.checks import interval, output_file
from moespec.cli.theory import _acceptances, _step_times
from moespec.costmodel.predict import ACCEPTANCE_GRID, KERNELS, PREFERENCE, VERSIONS, preferred_version
from moespec.costmodel.settings import (
    DRAFT_PLACEHOLDER,
    ENGINES,
    flag_number,
    recommend,
)
from moespec.kernel_names import COST_DEDUP



def _prediction_step_times(path: Path, version: str | None, kernel: str, depth: int | None) -> tuple[list, str, int]:
    """(V in seconds, the version read, its depth) from a predict artifact; a named version must be there."""
    from moespec.chain.prediction import KIND, payload_of

    try:
        payload = payload_of(path, KIND)
    except (ValueError, FileNotFoundError) as e:
        raise typer.BadParameter(str(e), param_hint="'--prediction'") from None
    depths = payload.get("depths") or []
    entries = {int(e["depth"]): e for e in depths}
    if not entries:
        raise typer.BadParameter(f"{path} predicts no depth; run `moespec predict` again", param_hint="'--prediction'")
    entry = depths[0] if depth is None else entries.get(depth)
    if entry is None:
        raise typer.BadParameter(f"{path} predicts depths {sorted(entries)}, not {depth}; pass one of them",
                                 param_hint="'--depth'")
    found = entry.get("versions", {})
    if version is None:
        version = preferred_version(found)
        if version is None:
            why = "; ".join(f"{v}: {u.get('message')}" for v, u in entry.get("unavailable", {}).items())
            raise typer.BadParameter(f"{path} holds no predicted version at depth {entry['depth']} ({why or 'none'})",
                                     param_hint="'--prediction'")
    elif version not in found:
        why = entry.get("unavailable", {}).get(version, {}).get("message")
        raise typer.BadParameter(f"{path} has no {version!r} version at depth {entry['depth']}"
                                 f"{f' ({why})' if why else ''}; use one of {sorted(found)}", param_hint="'--version'")
    V = found[version].get("V", {}).get(kernel)
    if V is None:
        raise typer.BadParameter(f"kernel {kernel!r} is not in the {version!r} version of {path}; "
                                 f"use one of {sorted(found[version].get('V', {}))}", param_hint="'--kernel'")
    return [float(v) for v in V], version, int(entry["depth"])


def _choice(value: str | None, valid, option: str) -> str | None:
    if value is not None and value not in valid:
        raise typer.BadParameter(f"{value!r} is not valid; use one of {list(valid)}", param_hint=option)
    return value


def _summary(s) -> str:
    """The values the model chose, flags shortened ("n-max 3, n-min 1, p-min 0.1"); "off" when off."""
    if not s.speculate:
        return "off"
    short = [(v.name.lstrip("-"), v.value) for v in s.values if v.from_model]
    for prefix in ("spec-draft-", "spec-ngram-mod-", "speculative-", "num_speculative_", "num-"):
        short = [(n.removeprefix(prefix), x) for n, x in short]
    return ", ".join(f"{n} {x:g}" for n, x in short)


@app.command()
def settings(
    prediction: Annotated[Path | None, typer.Option(help="a predict artifact (moespec predict / demo)")] = None,
    version: Annotated[str | None, typer.Option(help=f"prediction version, one of {VERSIONS} (default: "
                                                     f"{PREFERENCE[0]}, else the first of {PREFERENCE[1:]} there)")] = None,
    kernel: Annotated[str, typer.Option(help=f"kernel whose V̂(k) to use, one of {KERNELS}")] = COST_DEDUP,
    depth: Annotated[int | None, typer.Option(help="context depth of the prediction (default: its first)")] = None,
    step_times: Annotated[str | None, typer.Option(help="V(0),V(1),...,V(kmax) in ms, instead of --prediction")] = None,
    acceptance: Annotated[list[str] | None, typer.Option("--acceptance", "-a", help="acceptance a in [0, 1); "
                                                         "repeatable (default: the paper's grid)")] = None,
    engine: Annotated[str, typer.Option(help=f"one of {ENGINES} or 'all'")] = "all",
    draft: Annotated[str | None, typer.Option(help="draft model path or name to put in the settings")] = None,
    prompt_lookup: Annotated[int | None, typer.Option(callback=interval(1), help="draft by n-gram prompt lookup, "
                                                      "n-gram size N >= 1")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", callback=output_file,
                                                  help="also write the settings as a JSON artifact")] = None,
) -> None:
    """Draft length, n-min and p-min for llama.cpp, vLLM and SGLang from k̂*(a) and V̂(k), at batch size 1."""
    _choice(version, VERSIONS, "'--version'")
    _choice(kernel, KERNELS, "'--kernel'")
    engines = ENGINES if engine == "all" else (_choice(engine, (*ENGINES, "all"), "'--engine'"),)
    if (prediction is None) == (step_times is None):
        raise typer.BadParameter("give exactly one of --prediction and --step-times", param_hint="'--step-times'")
    if draft is not None and prompt_lookup is not None:
        raise typer.BadParameter("give --draft or --prompt-lookup, not both", param_hint="'--draft'")
    if prediction is not None:
        V, version, depth = _prediction_step_times(prediction, version, kernel, depth)
        V_ms = [1e3 * v for v in V]
        origin = f"{prediction}: {version} version, {kernel} kernel, depth {depth}"
    else:
        V = V_ms = _step_times(step_times)
        origin = "--step-times"
        if len(V) < 2:
            raise typer.BadParameter(f"{step_times!r} gives only V(0); give V(0),V(1),... (kmax >= 1) such as 10,11,13",
                                     param_hint="'--step-times'")
    grid = _acceptances(acceptance) if acceptance else [Fraction(str(a)) for a in ACCEPTANCE_GRID]
    result = recommend(V, grid, draft=draft, prompt_lookup=prompt_lookup, engines=engines)

    console = cli_console()
    console.print(f"V̂(0..{len(V) - 1}) from {origin}: " + ", ".join(f"{float(v):.4g}" for v in V_ms) + " ms")
    console.print(f"a0 = {float(result.first_draft_threshold):.4g}; step points a_j = "
                  + ", ".join(f"{float(x):.4g}" for x in result.step_points)
                  + f"; p-min floor = {flag_number(result.p_min)}")
    table = Table("a", "k̂*(a)", "speedup (9)", "n-min", *engines, title="settings at batch size 1")
    for row in result.rows:
        table.add_row(f"{float(row.acceptance):.4g}", str(row.k_star), f"{float(row.speedup):.4g}", str(row.n_min),
                      *(_summary(s) for s in row.engines))
    console.print(table)
    for row in result.rows:
        for s in row.engines:
            line = s.fragment if s.speculate else f"{s.fragment}  # {s.note}".lstrip()
            console.print(f"a = {float(row.acceptance):.4g}, {s.engine}: {line}", soft_wrap=True, markup=False,
                          highlight=False)
    if draft is None and prompt_lookup is None:
        console.print(f"{DRAFT_PLACEHOLDER} stands for your draft model: name it with --draft, or use --prompt-lookup")
    console.print("Not modelled: batch size > 1 and tree drafts (see docs/settings.md).")

    if json_out is not None:
        from moespec.artifacts import write

        payload = result.to_dict()
        del payload["step_times"]  # seconds from a prediction, ms from --step-times: written once, in ms
        write(json_out, "settings", {"source": origin, "step_times_ms": [float(v) for v in V_ms], **payload})
        console.print(f"wrote {json_out}")
