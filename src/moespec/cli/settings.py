"""moespec settings: the predicted best draft length k̂*(a) as llama.cpp, vLLM and SGLang settings."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from moespec.cli.app import app, cli_console
from moespec.cli.checks import interval, output_file
from moespec.cli.options import acceptance_grid, parse_batch_step_times, parse_sizes, parse_step_times
from moespec.costmodel.predict import KERNELS, PREFERENCE, VERSIONS
from moespec.costmodel.settings import (
    DRAFT_PLACEHOLDER,
    ENGINES,
    flag_number,
    recommend,
)
from moespec.kernel_names import COST_DEDUP

# The option a `chain.step_times.StepTimesNotFound` names, by the argument it names.
PREDICTION_OPTIONS = {"path": "'--prediction'", "depth": "'--depth'", "version": "'--version'", "kernel": "'--kernel'"}
VERSION_HELP = (f"prediction version, one of {VERSIONS} (default: {PREFERENCE[0]}, else the first of {PREFERENCE[1:]} "
                "there)")
BATCH_STEP_TIMES_HELP = ("B=V_B(0),V_B(1),... in ms, the step times at batch size B; repeatable: the settings per "
                         "batch size")
TIMED_HELP = "a GGUF target whose V_B(k) to time on llama.cpp at --batch-sizes (a GGUF --draft is timed too)"


def _prediction_step_times(path: Path, version: str | None, kernel: str,
                           depth: int | None) -> tuple[list, list, str, list | None]:
    """(V in seconds, V in ms, where it came from, τ̂ alone for llama.cpp's loop or None) from a predict
    artifact (`chain.step_times.predicted_step_times`)."""
    from moespec.chain.step_times import StepTimesNotFound, predicted_step_times

    try:
        read = predicted_step_times(path, kernel=kernel, version=version, depth=depth)
    except StepTimesNotFound as e:
        raise typer.BadParameter(str(e), param_hint=PREDICTION_OPTIONS[e.argument]) from None
    return read.V, [1e3 * v for v in read.V], f"{path}: {read.version} version, {kernel} kernel, depth {read.depth}", read.loop


def _given_step_times(text: str) -> tuple[list, list, str, None]:
    """(V, V in ms, where it came from, no passes of llama.cpp's own) from --step-times, in ms."""
    V = parse_step_times(text)
    if len(V) < 2:
        raise typer.BadParameter(f"{text!r} gives only V(0); give V(0),V(1),... (kmax >= 1) such as 10,11,13",
                                 param_hint="'--step-times'")
    return V, V, "--step-times", None


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
    prediction: Optional[Path] = typer.Option(None, help="a predict artifact (moespec predict / demo), or a batch one "
                                              "(moespec batch): per batch size"),
    version: Optional[str] = typer.Option(None, help=VERSION_HELP),
    kernel: str = typer.Option(COST_DEDUP, help=f"kernel whose V̂(k) to use, one of {KERNELS}"),
    depth: Optional[int] = typer.Option(None, help="context depth of the prediction (default: its first)"),
    step_times: Optional[str] = typer.Option(None, help="V(0),V(1),...,V(kmax) in ms, instead of --prediction"),
    acceptance: Optional[list[str]] = typer.Option(None, "--acceptance", "-a", help="acceptance a in [0, 1); "
                                                   "repeatable (default: the paper's grid)"),
    engine: str = typer.Option("all", help=f"one of {ENGINES} or 'all'"),
    draft: Optional[str] = typer.Option(None, help="draft model path or name to put in the settings"),
    prompt_lookup: Optional[int] = typer.Option(None, callback=interval(1), help="draft by n-gram prompt lookup, "
                                                "n-gram size N >= 1"),
    json_out: Optional[Path] = typer.Option(None, "--json", callback=output_file,
                                            help="also write the settings as a JSON artifact"),
    batch_step_times: Optional[list[str]] = typer.Option(None, "--batch-step-times", help=BATCH_STEP_TIMES_HELP),
    batch_sizes: Optional[str] = typer.Option(None, help="batch sizes such as 1,2,4,8 to time on --timed's file: "
                                              "the settings per batch size"),
    timed: Optional[Path] = typer.Option(None, exists=True, dir_okay=False, help=TIMED_HELP),
    max_k: int = typer.Option(6, callback=interval(1, 16), help="largest draft length timed (--timed)"),
    depth_timed: int = typer.Option(128, "--timed-depth", callback=interval(1),
                                    help="tokens each sequence holds when timed (--timed)"),
    reps: int = typer.Option(7, callback=interval(1), help="timed passes per point (--timed)"),
    threads: Optional[int] = typer.Option(None, callback=interval(1), help="llama.cpp threads (--timed)"),
    max_batch: Optional[int] = typer.Option(None, callback=interval(1), help="the last vLLM range ends here "
                                            "(default: the largest batch size)"),
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
    V, V_ms, origin, loop = (_prediction_step_times(prediction, version, kernel, depth) if prediction is not None
                             else _given_step_times(step_times))
    console = cli_console()
    result = _recommend(V, loop, acceptance_grid(acceptance), console, draft=draft, prompt_lookup=prompt_lookup,
                        engines=engines)
    _print_settings(console, result, V_ms, origin, engines, placeholder=draft is None and prompt_lookup is None)
    if json_out is not None:
        from moespec.artifacts import write

        payload = result.to_dict()
        del payload["step_times"]  # seconds from a prediction, ms from --step-times: written once, in ms
        loop_ms = {} if loop is None else {"llama_step_times_ms": [1e3 * t for t in loop]}  # llama.cpp's rows' V
        write(json_out, "settings", {"source": origin, "step_times_ms": [float(v) for v in V_ms], **loop_ms, **payload})
        console.print(f"wrote {json_out}")


def _recommend(V: list, loop: list | None, grid, console, *, draft, prompt_lookup, engines):
    """`recommend` on V, with llama.cpp's settings at each acceptance recommended on its own loop's rounds
    where the prediction's passes are llama.cpp's (`loop`: τ̂ alone, `costmodel.predict.loop_step_times`)."""
    from dataclasses import replace

    result = recommend(V, grid, draft=draft, prompt_lookup=prompt_lookup, engines=engines)
    if loop is None or "llama.cpp" not in engines:
        return result
    own = recommend(loop, grid, draft=draft, prompt_lookup=prompt_lookup, engines=("llama.cpp",))
    console.print("llama.cpp's settings are priced on its own loop: the passes τ̂(1..) = "
                  + ", ".join(f"{1e3 * t:.4g}" for t in loop) + " ms alone, without the time moespec's engine "
                  "spends around each (the other columns' V̂)")
    rows = tuple(replace(r, engines=tuple(o.engine("llama.cpp") if e.engine == "llama.cpp" else e for e in r.engines))
                 for r, o in zip(result.rows, own.rows))
    return replace(result, rows=rows)


def _print_settings(console, result, V_ms: list, origin: str, engines, *, placeholder: bool) -> None:
    """The step times, a0 and the step points, the table of settings per acceptance, and each engine's line."""
    console.print(f"V̂(0..{len(V_ms) - 1}) from {origin}: " + ", ".join(f"{float(v):.4g}" for v in V_ms) + " ms")
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
    if placeholder:
        console.print(f"{DRAFT_PLACEHOLDER} stands for your draft model: name it with --draft, or use --prompt-lookup")
    console.print("Not modelled here: batch size > 1 (--batch-sizes, --batch-step-times) and tree drafts "
                  "(see docs/settings.md).")


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
        return parse_batch_step_times(batch_step_times), "--batch-step-times", None
    if not batch_sizes or timed is None:
        raise typer.BadParameter("--batch-sizes and --timed go together: the batch sizes to time and the GGUF file "
                                 "to time them on", param_hint="'--timed'" if batch_sizes else "'--batch-sizes'")
    from rich.progress import Progress

    from moespec.bench.batch_passes import batch_step_times as time_batches

    sizes = parse_sizes(batch_sizes)
    from types import SimpleNamespace

    from moespec.cli.sizes import check_batch_model

    # B sequences, each holding the depth and a round at max_k, checked against the file before it loads
    check_batch_model(timed, SimpleNamespace(sizes=tuple(sizes), prompt_tokens=depth, new_tokens=0, max_k=max_k),
                      "--timed-depth")
    draft_file = Path(draft) if draft is not None and draft.endswith(".gguf") and Path(draft).is_file() else None
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"timing passes of {sizes} sequences on {timed.name}", total=None)
        # a ValueError names its own value (a damaged file, a batch too large for the context): not blamed on one option
        record = time_batches(timed, sizes, max_k, depth=depth, reps=reps, threads=threads, draft=draft_file,
                              progress=lambda done, total: bar.update(task, completed=done, total=total))
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
    rows = recommend_batches(V, acceptance_grid(acceptance), draft=draft, prompt_lookup=prompt_lookup, max_batch=max_batch)
    _print_batch_settings(console, V, origin, rows, placeholder=draft is None and prompt_lookup is None)
    if json_out is not None:
        from moespec.artifacts import write

        write(json_out, "settings", {"source": origin, "batch_step_times_ms": {str(B): [float(v) for v in row]
                                                                                for B, row in V.items()},
                                     "timing": record and {k: v for k, v in record.items() if k != "V"},
                                     "draft": draft, "prompt_lookup": prompt_lookup,
                                     "rows": [r.to_dict() for r in rows]})
        console.print(f"wrote {json_out}")


def _print_batch_settings(console, V: dict, origin: str, rows, *, placeholder: bool) -> None:
    """V_B(k), the table of k̂* per batch size, and each engine's line per acceptance."""
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
    if placeholder:
        console.print(f"{DRAFT_PLACEHOLDER} stands for your draft model: name it with --draft, or use --prompt-lookup")
