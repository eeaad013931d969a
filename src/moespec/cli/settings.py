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
    prediction: Annotated[Path | None, typer.Option(help="a predict artifact (moespec predict / demo), or a batch one (moespec batch): per batch size")] = None,
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
    batch_step_times: Annotated[list[str] | None, typer.Option(
        "--batch-step-times", help="B=V_B(0),V_B(1),... in ms, the step times at batch size B; repeatable: the "
                                   "settings per batch size")] = None,
    batch_sizes: Annotated[str | None, typer.Option(help="batch sizes such as 1,2,4,8 to time on --timed's file: "
                                                         "the settings per batch size")] = None,
    timed: Annotated[Path | None, typer.Option(exists=True, dir_okay=False, help="a GGUF target whose V_B(k) to "
                                               "time on llama.cpp at --batch-sizes (a GGUF --draft is timed too)")] = None,
    max_k: Annotated[int, typer.Option(callback=interval(1, 16), help="largest draft length timed (--timed)")] = 6,
    depth_timed: Annotated[int, typer.Option("--timed-depth", callback=interval(1),
                                             help="tokens each sequence holds when timed (--timed)")] = 128,
    reps: Annotated[int, typer.Option(callback=interval(1), help="timed passes per point (--timed)")] = 7,
    threads: Annotated[int | None, typer.Option(callback=interval(1), help="llama.cpp threads (--timed)")] = None,
    max_batch: Annotated[int | None, typer.Option(callback=interval(1), help="the last vLLM range ends here "
                                                  "(default: the largest batch size)")] = None,
) -> None:
    """Draft length, n-min and p-min for llama.cpp, vLLM and SGLang from k̂*(a) and V̂(k): at batch size 1,
    or per batch size (--prediction batch-prediction.json, --batch-step-times, or --batch-sizes with --timed FILE.gguf)."""
    from moespec.artifacts import kind_of

    batch_prediction = prediction if prediction is not None and kind_of(prediction) == "batch-predict" else None
    if batch_step_times or batch_sizes or timed is not None or batch_prediction is not None:
        return _batches(batch_step_times=batch_step_times, batch_sizes=batch_sizes, timed=timed, max_k=max_k,
                        depth=depth_timed, reps=reps, threads=threads, acceptance=acceptance, draft=draft,
                        prompt_lookup=prompt_lookup, max_batch=max_batch, json_out=json_out,
                        others=(None if batch_prediction else prediction, step_times),
                        batch_prediction=(batch_prediction, version))
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
    console.print("Not modelled here: batch size > 1 (--batch-sizes, --batch-step-times) and tree drafts "
                  "(see docs/settings.md).")

    if json_out is not None:
        from moespec.artifacts import write

        payload = result.to_dict()
        del payload["step_times"]  # seconds from a prediction, ms from --step-times: written once, in ms
        write(json_out, "settings", {"source": origin, "step_times_ms": [float(v) for v in V_ms], **payload})
        console.print(f"wrote {json_out}")


def _parse_batch_step_times(texts: list[str]) -> dict:
    """{B: V_B in ms} from ["1=10,11,13", "4=14,17,22"]."""
    out = {}
    for text in texts:
        B, sep, times = text.partition("=")
        if not sep or not B.strip().isdigit() or int(B) < 1:
            raise typer.BadParameter(f"{text!r} is not B=V(0),V(1),... with a batch size B >= 1, such as 4=14,17,22",
                                     param_hint="'--batch-step-times'")
        if int(B) in out:
            raise typer.BadParameter(f"batch size {int(B)} is given twice", param_hint="'--batch-step-times'")
        V = _step_times(times)
        if len(V) < 2:
            raise typer.BadParameter(f"{text!r} gives only V(0); give V(0),V(1),... (kmax >= 1)",
                                     param_hint="'--batch-step-times'")
        out[int(B)] = V
    return out


def _parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1 or len(set(sizes)) != len(sizes):
        raise typer.BadParameter(f"{text!r} is not a list of distinct batch sizes >= 1 such as 1,2,4,8",
                                 param_hint="'--batch-sizes'")
    return sorted(sizes)


def _batch_step_times(*, batch_step_times, batch_sizes, timed, max_k, depth, reps, threads, draft, console,
                      batch_prediction=(None, None)):
    """({B: V_B in ms}, where they came from, the timing record or None)."""
    path, version = batch_prediction
    if path is not None:  # a batch prediction (`moespec batch`, `moespec predict` on a batch measurement)
        if batch_step_times or batch_sizes or timed is not None:
            raise typer.BadParameter(f"{path} gives V̂_B at its own batch sizes: drop --batch-step-times, "
                                     "--batch-sizes and --timed", param_hint="'--prediction'")
        from moespec.artifacts import load

        versions = load(path, "batch-predict")["payload"]["versions"]
        version = version or "prediction"
        if version not in versions:
            raise typer.BadParameter(f"{path} holds the versions {sorted(versions)}, not {version!r}",
                                     param_hint="'--version'")
        return ({int(B): [1e3 * v for v in row] for B, row in sorted(versions[version].items(), key=lambda x: int(x[0]))},
                f"{path}, {version} V̂_B", None)
    if batch_step_times:
        if batch_sizes or timed is not None:
            raise typer.BadParameter("give --batch-step-times, or --batch-sizes with --timed, not both",
                                     param_hint="'--batch-step-times'")
        return _parse_batch_step_times(batch_step_times), "--batch-step-times", None
    if not batch_sizes or timed is None:
        raise typer.BadParameter("--batch-sizes and --timed go together: the batch sizes to time and the GGUF file "
                                 "to time them on", param_hint="'--timed'" if batch_sizes else "'--batch-sizes'")
    from rich.progress import Progress

    from moespec.bench.batch_passes import batch_step_times as time_batches

    sizes = _parse_sizes(batch_sizes)
    draft_file = Path(draft) if draft is not None and draft.endswith(".gguf") and Path(draft).is_file() else None
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"timing passes of {sizes} sequences on {timed.name}", total=None)
        try:
            record = time_batches(timed, sizes, max_k, depth=depth, reps=reps, threads=threads, draft=draft_file,
                                  progress=lambda done, total: bar.update(task, completed=done, total=total))
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="'--batch-sizes'") from None
    V = {B: [1e3 * v for v in row] for B, row in record["V"].items()}
    origin = f"timed on {timed} at depth {depth}" + (f", draft {draft_file}" if draft_file else ", no draft pass")
    return V, origin, record


def _batches(*, batch_step_times, batch_sizes, timed, max_k, depth, reps, threads, acceptance, draft, prompt_lookup,
             max_batch, others, json_out, batch_prediction=(None, None)) -> None:
    """The settings per batch size (`costmodel.settings.recommend_batches`)."""
    from moespec.costmodel.settings import recommend_batches

    if any(x is not None for x in others):
        raise typer.BadParameter("--prediction and --step-times give batch size 1; per batch size give "
                                 "--batch-step-times, or --batch-sizes with --timed", param_hint="'--batch-sizes'")
    if draft is not None and prompt_lookup is not None:
        raise typer.BadParameter("give --draft or --prompt-lookup, not both", param_hint="'--draft'")
    console = cli_console()
    V, origin, record = _batch_step_times(batch_step_times=batch_step_times, batch_sizes=batch_sizes, timed=timed,
                                          max_k=max_k, depth=depth, reps=reps, threads=threads, draft=draft,
                                          console=console, batch_prediction=batch_prediction)
    if max_batch is not None and max_batch < max(V):
        raise typer.BadParameter(f"--max-batch {max_batch} is below the largest batch size, {max(V)}",
                                 param_hint="'--max-batch'")
    grid = _acceptances(acceptance) if acceptance else [Fraction(str(a)) for a in ACCEPTANCE_GRID]
    rows = recommend_batches(V, grid, draft=draft, prompt_lookup=prompt_lookup, max_batch=max_batch)
    console.print(f"V_B(k) from {origin}, ms:")
    for B, row in V.items():
        console.print(f"  B = {B}: " + ", ".join(f"{float(v):.4g}" for v in row), highlight=False)
    sizes = sorted(V)
    table = Table("a", *(f"k̂* at B={B}" for B in sizes), "vLLM ranges [lo, hi, k]",
                  title="the best draft length per batch size")
    for r in rows:
        ranges = dict((s.name, s.value) for s in r.vllm.values).get("num_speculative_tokens_per_batch_size")
        table.add_row(f"{float(r.acceptance):.4g}", *(str(r.k_star[B]) for B in sizes), str(ranges or "off"))
    console.print(table)
    for r in rows:
        a = f"a = {float(r.acceptance):.4g}"
        console.print(f"{a}, vllm: {r.vllm.fragment or '# ' + r.vllm.note}", soft_wrap=True, markup=False,
                      highlight=False)
        for B in sizes:
            llama, sglang = r.per_batch[B]
            console.print(f"{a}, llama-server -np {B}: {llama.fragment}", soft_wrap=True, markup=False,
                          highlight=False)
            console.print(f"{a}, sglang at batch {B}: {sglang.fragment or '# ' + sglang.note}", soft_wrap=True,
                          markup=False, highlight=False)
    console.print("llama-server and SGLang take one draft length for every batch: use the line of the batch size you "
                  "run most (docs/settings.md#batch-sizes).")
    if draft is None and prompt_lookup is None:
        console.print(f"{DRAFT_PLACEHOLDER} stands for your draft model: name it with --draft, or use --prompt-lookup")
    if json_out is not None:
        from moespec.artifacts import write

        write(json_out, "settings", {"source": origin, "batch_step_times_ms": {str(B): [float(v) for v in row]
                                                                                for B, row in V.items()},
                                     "timing": record and {k: v for k, v in record.items() if k != "V"},
                                     "draft": draft, "prompt_lookup": prompt_lookup,
                                     "rows": [r.to_dict() for r in rows]})
        console.print(f"wrote {json_out}")
