"""moespec predict / score / report / demo: the end of the chain, and the whole chain in one command."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from moespec import artifacts, run_files
from moespec.cli.app import app, cli_console
from moespec.cli.checks import interval, model_spec, output_file, output_folder, routing_file
from moespec.kernel_names import COST_DEDUP, COST_KERNELS
from moespec.chain.demo import DemoConfig

_DEMO_MEASURE = DemoConfig().measure  # the defaults the options' help quotes
_ORACLE_REPS_HELP = (f"repetitions of every oracle cell per prompt (demo: {_DEMO_MEASURE['oracle_reps']}); more "
                     "lower the summary's loss floor and take longer (3x the repetitions: ~3x the sweep); on a "
                     "finished run folder the sweep (only) is measured again")
_VERIFY_REPS_HELP = (f"repetitions of every verify pass per prompt (demo: {_DEMO_MEASURE['reps']}); more lower the "
                     "noise of τ_p(n), which the calibrated version is built on; on a finished run folder the base "
                     "measurement and the prediction are made again, the sweep's runs reused")
_DRAFT_HELP = "your draft model (a GGUF file beside a .gguf --model; repeat for several), priced on your prompts"
_NGRAM_HELP = ("price llama.cpp's n-gram drafter MODE[:N]: ngram-mod (N: n-match, default 24) or ngram-simple "
               "(N: size-n, default 12); repeatable")
_LLAMA_CHECK_HELP = ("then llama.cpp's own speculative decoding of your drafts on the held-out prompts, at the "
                     "emitted settings, its defaults and every n-max (builds llama-speculative-simple once)")
_PROMPTS_HELP = "your prompts: one per line, or JSONL chats (default: the shipped ones); half calibrate, half check"


def _prediction_table(payload: dict) -> Table:
    table = Table("d", "version", "crossover", "k̂*(a) on the grid (dedup)", "best predicted speedup",
                  title=f"prediction, {payload.get('model')}")
    for entry in payload["depths"]:
        for version, p in entry["versions"].items():
            k = p["k_star"][COST_DEDUP]
            table.add_row(str(entry["depth"]), version, str(p["crossover"] or "none"), " ".join(map(str, k)),
                          f"{max(p['speedup']['dedup']):.3f}x")
        for version, why in entry["unavailable"].items():
            why = f"unavailable ({why['reason']}): {why['message']}"
            table.add_row(str(entry["depth"]), version, "—", why, "—")
    return table


def _score_table(payload: dict) -> Table:
    table = Table("d", "version", "crossover pred/meas", "k* within one", "max loss", "τ error held out / in sample",
                  "δ", "rules passed", title=f"score, {payload.get('model')} ({payload.get('kernel')} kernel)")
    for entry in payload["depths"]:
        for version, s in entry["versions"].items():
            within = sum(abs(p - m) <= 1 for p, m in zip(s["k_star_predicted"], s["k_star_measured"]))
            passed = sum(r["passed"] for r in s["rules"])
            table.add_row(str(entry["depth"]), version,
                          f"{s['crossover_predicted'] or 'none'} / {s['crossover_measured'] or 'none'}",
                          f"{within}/{len(s['acceptance'])}", f"{100 * max(s['loss']):.1f}%",
                          f"{100 * s['tau_error']:.1f}% / {100 * s['tau_error_in_sample']:.1f}%", f"{s['delta']:.3f}",
                          f"{passed}/{len(s['rules'])}")
    return table


def _exit_if_empty(console: Console, payload: dict, done: str) -> None:
    """Exit 1 with one line saying why, when no version at any depth was `done` (predicted, scored)."""
    if any(entry["versions"] for entry in payload["depths"]):
        return
    why = [(f"d={e['depth']} {v}: {u['reason']}", u["message"])
           for e in payload["depths"] for v, u in e["unavailable"].items()]
    console.print(f"{done} no version ({'; '.join(w for w, _ in why)}): {why[0][1] if why else 'no depth'}",
                  markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(1)


def _write_versions(make, table, done: str | None, kind: str | None, out: Path, parents: tuple = ()) -> dict:
    """make() the payload (its errors as the command's), print its table, exit 1 when no version was
    `done` (None: a batch payload, which has no versions to lack), else write the `kind` artifact to
    `out` (None: make() wrote it), naming the files it was made from (`parents`)."""
    try:
        payload = make()
    except (ValueError, FileNotFoundError) as e:
        raise typer.BadParameter(str(e)) from e
    console = cli_console()
    console.print(table(payload))
    if done is not None:
        _exit_if_empty(console, payload, done)
    if kind is not None:
        artifacts.write(out, kind, payload, parents=parents)
    console.print(f"wrote {out}")
    return payload


@app.command("predict")
def predict_command(
    characterization: Path = typer.Option(..., "--characterization", exists=True, dir_okay=False,
                                          help="characterize artifact"),
    traces: Path = typer.Option(..., "--traces", exists=True, dir_okay=False,
                                help="routing trace (Parquet) of the same model"),
    measurement: Path = typer.Option(..., "--measurement", exists=True, dir_okay=False,
                                     help="base measurement: verify times and h(k)"),
    out: Path = typer.Option(Path(run_files.PREDICTION), "--out", callback=output_file,
                             help="where to write the prediction"),
) -> None:
    """Predict τ̂_p(n), Ŝ(n) with its band, the crossover, k̂*(a) and the speedup (22), in three versions;
    exits 1, writing nothing, when no version can be predicted. From a batch measurement (`moespec measure
    --batch-sizes`): V̂_B(k) at each of its batch sizes."""
    from moespec.chain.prediction import KIND, predict_all

    if artifacts.kind_of(measurement) == "batch-measure":
        from moespec.chain.batch_prediction import KIND as BATCH_KIND, predict_batch
        from moespec.cli.batch import prediction_table

        sources = {"characterization": str(characterization), "traces": str(traces), "measurement": str(measurement)}
        _write_versions(lambda: predict_batch(characterization, traces, measurement, sources=sources),
                        prediction_table, None, BATCH_KIND, out, parents=(characterization, traces, measurement))
        return
    sources = {"characterization": str(characterization), "traces": str(traces), "measurement_base": str(measurement)}
    _write_versions(lambda: predict_all(characterization, traces, measurement, sources=sources), _prediction_table,
                    "predicted", KIND, out, parents=(characterization, traces, measurement))


@app.command("score")
def score_command(
    prediction: Path = typer.Option(..., "--prediction", exists=True, dir_okay=False, help="predict artifact"),
    measurement: Path = typer.Option(..., "--measurement", exists=True, dir_okay=False,
                                     help="measure artifact with the oracle sweep"),
    out: Path = typer.Option(Path(run_files.SCORE), "--out", callback=output_file, help="where to write the score"),
    kernel: str = typer.Option(COST_DEDUP, help=f"the scored kernel: one of {COST_KERNELS}"),
) -> None:
    """Score the prediction against the measurement: Tables 3, 4, 7 and the rules of Table 8; exits 1,
    writing nothing, when no version can be scored."""
    from moespec.chain.scoring import SCORE_KIND, score_all

    if kernel not in COST_KERNELS:
        raise typer.BadParameter(f"--kernel {kernel!r}; use one of {COST_KERNELS}")
    if artifacts.kind_of(prediction) == "batch-predict":
        from moespec.chain.batch_chain import score as score_batch
        from moespec.cli.batch import score_table
        from moespec.report.batch import goal_lines

        figure = out.with_suffix(".png")
        payload = _write_versions(lambda: score_batch(prediction, measurement, out, figure), score_table, None, None,
                                  out)
        for line in goal_lines(payload):
            cli_console().print(line)
        cli_console().print(f"wrote {figure}: k̂*(a, B) against a, one line per B")
        return
    _write_versions(lambda: score_all(prediction, measurement, kernel=kernel), _score_table,
                    "scored", SCORE_KIND, out, parents=(prediction, measurement))


@app.command("report")
def report_command(
    run_dir: Path = typer.Option(..., "--dir", exists=True, file_okay=False,
                                 help="run folder holding the chain's artifacts"),
    out: Optional[Path] = typer.Option(None, "--out", callback=output_file,
                                       help="HTML file (default: DIR/report.html)"),
) -> None:
    """Write the self-contained HTML report (Figures 1–6, Tables 1, 3, 4, 7, 8) and summary.txt."""
    from moespec.report.build import build_report

    try:
        path = build_report(run_dir, out=out or run_dir / run_files.REPORT)
    except FileNotFoundError as e:
        raise typer.BadParameter(str(e)) from e
    console = cli_console()
    console.print((path.parent / run_files.SUMMARY).read_text(encoding="utf-8"))
    console.print(f"wrote {path}")


def _demo_routing(value: str | None) -> str | None:
    if value is None or value == "trained":
        return value
    return str(routing_file(Path(value)))


@app.command("demo")
def demo_command(
    out_dir: Path = typer.Option(Path("moespec-demo"), "--out-dir", callback=output_folder,
                                 help="run folder; finished steps are reused"),
    full: bool = typer.Option(False, "--full", help="the paper's protocol: 6 prompts, 256 tokens, d = 512 and 4096"),
    model: Optional[str] = typer.Option(None, "--model", callback=model_spec,
                                        help="your MoE model: a .gguf file (the chain runs it on llama.cpp), a local "
                                             "checkpoint, or a preset (default synthetic:olmoe-shaped)"),
    layers: Optional[int] = typer.Option(None, "--layers", callback=interval(1),
                                         help="layers of a synthetic preset (default: the preset's)"),
    smoke: bool = typer.Option(False, "--smoke", help="plumbing check in seconds at tiny settings, on --model (default "
                               "olmoe-tiny; trained:olmoe on llama.cpp)"),
    oracle_reps: Optional[int] = typer.Option(None, "--oracle-reps", min=1, help=_ORACLE_REPS_HELP),
    verify_reps: Optional[int] = typer.Option(None, "--verify-reps", min=1, help=_VERIFY_REPS_HELP),
    restart: bool = typer.Option(False, "--restart", help="move every artifact and point log of the run folder to "
                                 "NAME.old and run the chain afresh (a folder made for another model is refused)"),
    routing: Optional[str] = typer.Option(None, "--routing", callback=_demo_routing,
                                          help="'trained': the MoE layers replay the routing trained:olmoe chose on the "
                                               "corpus (recorded into the run folder first); or a trace file to replay"),
    backend: Optional[str] = typer.Option(None, "--backend", help="torch or llama.cpp (default: llama.cpp for a .gguf "
                                          "--model, else torch). llama.cpp on a preset: --model exported to GGUF "
                                          "(--gguf-type) into OUT_DIR/llama.cpp; the report shows both backends side "
                                          "by side when both were run"),
    gguf_type: Optional[str] = typer.Option(None, "--gguf-type", help="with --backend llama.cpp on a preset: f32, f16, "
                                            "q8_0 (default) or q4_k"),
    threads: Optional[int] = typer.Option(None, "--threads", callback=interval(1),
                                          help="llama.cpp's threads (default: all cores)"),
    draft: Optional[list[str]] = typer.Option(None, "--draft", help=_DRAFT_HELP),
    prompt_lookup: Optional[int] = typer.Option(None, "--prompt-lookup", callback=interval(1),
                                                help="price moespec's prompt lookup with n-grams of this size "
                                                "(a .gguf model: llama.cpp's ngram-mod of this n-match beside it, "
                                                "the rule llama-server runs as lookup)"),
    ngram: Optional[list[str]] = typer.Option(None, "--ngram", help=_NGRAM_HELP),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help=_PROMPTS_HELP),
    temperature: float = typer.Option(0.0, "--temperature", callback=interval(0.0), help="sampling of your drafts"),
    llama_check: bool = typer.Option(False, "--llama-check", help=_LLAMA_CHECK_HELP),
    top_p: Optional[float] = typer.Option(None, "--top-p", callback=interval(0.0, 1.0, lo_open=True),
                                          help="nucleus sampling of your drafts' acceptance"),
) -> None:
    """The whole chain: trace → characterize → measure → predict → sweep → score → report, ending with
    the answer: does speculation pay on this model and machine, from which acceptance, at which draft
    length, with which settings, and how far to trust it. With --draft, --prompt-lookup or --ngram:
    the answer for those drafts on your --prompts, checked on the half of them it never read."""
    from moespec.chain.demo import demo_setup, run_demo

    console = cli_console()
    try:
        config, out_dir = demo_setup(out_dir, model=model, backend=backend, smoke=smoke, full=full, layers=layers,
                                     routing=routing, gguf_type=gguf_type, threads=threads,
                                     measure={"oracle_reps": oracle_reps, "reps": verify_reps},
                                     drafts=draft or (), prompt_lookup=prompt_lookup, ngrams=ngram or (),
                                     prompts=prompts, candidate={"temperature": temperature, "top_p": top_p},
                                     llama_check=llama_check)
        run_demo(out_dir, config=config, progress=not smoke, restart=restart,
                 echo=lambda text: console.print(text, markup=False, highlight=False))
    except (ValueError, FileNotFoundError) as e:
        raise typer.BadParameter(str(e)) from e
