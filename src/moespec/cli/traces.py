"""moespec trace / moespec reuse: record routing traces and read the reuse figures off them."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from moespec import artifacts
from moespec import run_files
from moespec.texts import PROMPT_COUNT
from moespec.cli import checks
from moespec.cli.app import app, cli_console
from moespec.cli.checks import ROUTING_HELP, backend_name, interval, model_spec, output_file, routing_file
from moespec.cli.options import parse_n_range


def _n_range(text: str) -> str:
    parse_n_range(text)
    return text


TRACE_BACKEND_HELP = ("llama.cpp (default for a .gguf file when moespec[llama] is installed): the routing llama.cpp "
                      "computes for the file itself, read while it evaluates it; torch: through transformers (a .gguf "
                      "file dequantized)")


def _on_llama(model: str, backend: str | None, torch_only: dict[str, object]) -> bool:
    """Whether `model` is traced on llama.cpp; refuses options that apply to the torch backend only."""
    from moespec.models.specs import resolve_backend

    if resolve_backend(model, backend or "auto") != "llama.cpp":
        return False
    given = [name for name, value in torch_only.items() if value]
    if given:
        raise typer.BadParameter(f"{', '.join(given)} apply to the torch backend; {model} is traced on llama.cpp "
                                 "(add --backend torch to read it through transformers)")
    return True


def _progress(total: int) -> Progress:
    return Progress(TextColumn("tracing"), BarColumn(), MofNCompleteColumn(), TextColumn("tokens"),
                    TimeRemainingColumn())


@app.command()
def trace(
    model: str = typer.Option(..., "--model", callback=model_spec,
                              help="synthetic:NAME, trained:NAME, a local checkpoint folder or a .gguf file"),
    corpus: Optional[list[Path]] = typer.Option(None, "--corpus", exists=True, dir_okay=False,
                                                help="UTF-8 text files (default: the built-in corpus)"),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", callback=interval(1),
                                             help="stop after this many tokens in all"),
    out: Path = typer.Option(..., "--out", callback=output_file, help="the Parquet trace to write"),
    dtype: str = typer.Option("float32", callback=checks.dtype, help="model dtype (torch)"),
    chunk: int = typer.Option(512, callback=interval(1),
                              help="tokens per forward pass; the cache carries positions across chunks"),
    weights: bool = typer.Option(False, help="also store the router's weights of the selected experts (torch)"),
    seed: int = typer.Option(0, callback=interval(0), help="seed of a synthetic preset's weights"),
    routing: Optional[Path] = typer.Option(None, "--routing", callback=routing_file, help=ROUTING_HELP),
    for_gguf: Optional[Path] = typer.Option(None, "--for-gguf", exists=True, dir_okay=False, help="with --backend "
                                            "torch: label the trace with this GGUF file (its identity and expert bytes "
                                            "in its own type); --model is the model the file was made from"),
    backend: Optional[str] = typer.Option(None, "--backend", callback=backend_name, help=TRACE_BACKEND_HELP),
    threads: Optional[int] = typer.Option(None, "--threads", callback=interval(1),
                                          help="llama.cpp's threads (default: all cores)"),
) -> None:
    """Record the experts each token selects in every MoE layer, reading a corpus by teacher forcing."""
    from moespec.texts import default_corpus, read_corpus

    texts = read_corpus(corpus) if corpus else default_corpus()
    names = [str(p) for p in corpus] if corpus else ["moespec:data/corpus"]
    on_llama = _on_llama(model, backend, {"--weights": weights, "--routing": routing, "--for-gguf": for_gguf,
                                          "--dtype": dtype != "float32"})
    if not on_llama and threads is not None:
        raise typer.BadParameter("--threads sets llama.cpp's threads; the torch backend uses torch's")
    with _progress(0) as progress:
        task = progress.add_task("trace", total=max_tokens)
        advance = lambda t: progress.advance(task, t)  # noqa: E731
        if on_llama:
            from moespec.chain.llama_inputs import record_gguf_routing
            from moespec.models import gguf

            n_docs, n_tokens = record_gguf_routing(gguf.resolve(model), out, texts=texts, tokens=max_tokens,
                                                   threads=threads, chunk=chunk, corpus=names, on_tokens=advance)
        else:
            from moespec.chain.torch_inputs import record_torch_routing

            n_docs, n_tokens = record_torch_routing(
                model, out, texts=texts, corpus=names, max_tokens=max_tokens, chunk=chunk, dtype=dtype, weights=weights,
                seed=seed, routing=routing, on_total=lambda total: progress.update(task, total=total), on_tokens=advance)
    if for_gguf is not None:
        _label(out, for_gguf, model)
    cli_console().print(f"wrote {out}: {n_docs} documents, {n_tokens} tokens"
                        + (" (routing read from llama.cpp)" if on_llama else ""))


def _label(out: Path, gguf_file: Path, model: str) -> None:
    """Label the trace at `out` with the GGUF file made from `model` (--for-gguf)."""
    from moespec.chain.llama_inputs import label_with_file
    from moespec.moe.traces import RoutingTrace

    try:
        label_with_file(RoutingTrace.load(out), gguf_file, model).save(out)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e


@app.command("trace-verified")
def trace_verified(
    model: str = typer.Option(..., "--model", callback=model_spec,
                              help="synthetic:NAME, trained:NAME, a local checkpoint folder or a .gguf file"),
    depth: Optional[list[int]] = typer.Option(None, "--depth", callback=interval(1), help="context depth d, as given "
                                              "to `moespec measure` (repeatable; default 512)"),
    prompts: int = typer.Option(1, "--prompts", callback=interval(1, PROMPT_COUNT),
                                help=f"built-in prompts, as given to `moespec measure` (1..{PROMPT_COUNT})"),
    n_max: int = typer.Option(9, "--n-max", callback=interval(1), help="largest verify pass size n, >= 1"),
    reps: int = typer.Option(3, "--reps", callback=interval(1), help="verify repetitions, as given to `moespec "
                             "measure`: repetition r verifies the window --stride x r tokens into the continuation"),
    stride: int = typer.Option(3, "--stride", callback=interval(0), help="tokens between two repetitions' windows, as "
                               "given to `moespec measure`"),
    out: Path = typer.Option(Path(run_files.VERIFIED), "--out", callback=output_file,
                             help="the Parquet trace to write"),
    dtype: str = typer.Option("float32", callback=checks.dtype, help="model dtype (torch)"),
    seed: int = typer.Option(0, callback=interval(0), help="seed of a synthetic preset's weights"),
    routing: Optional[Path] = typer.Option(None, "--routing", callback=routing_file, help=ROUTING_HELP),
    backend: Optional[str] = typer.Option(None, "--backend", callback=backend_name, help=TRACE_BACKEND_HELP),
    threads: Optional[int] = typer.Option(None, "--threads", callback=interval(1),
                                          help="llama.cpp's threads (default: all cores)"),
) -> None:
    """Record the routing of the tokens `moespec measure` verifies: for each depth and prompt, the
    target's greedy continuation of the prompt's first d tokens, as long as the verify passes read.
    Give it to `moespec characterize --verified` and `moespec measure --verified`: the expert
    operation is timed on those windows."""
    from moespec.texts import continuation_length
    from moespec.bench.verify import verified_routing
    from moespec.models import load

    length = continuation_length(reps, n_max, stride)
    try:
        if _on_llama(model, backend, {"--routing": routing, "--dtype": dtype != "float32"}):
            from moespec.chain.llama_inputs import record_gguf_verified
            from moespec.models import gguf

            trace = record_gguf_verified(gguf.resolve(model), out, depths=depth or (512,), prompts=prompts,
                                         n_max=n_max, length=length, threads=threads)
        else:
            net, tok = load(model, dtype=dtype, seed=seed, routing=routing, backend="torch")
            trace = verified_routing(net, tok, depths=depth or (512,), prompts=prompts, n_max=n_max, length=length,
                                     model_spec=model)
            trace.save(out)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    cli_console().print(f"wrote {out}: {len(trace.documents)} continuations of {length} tokens "
                        f"({', '.join(trace.doc_ids)})")


def _cell(value: float, lo: float, hi: float) -> str:
    return f"{value:.3f} [{lo:.3f}, {hi:.3f}]"


@app.command("reuse")
def reuse_command(
    trace_path: Path = typer.Argument(..., metavar="TRACES", exists=True, dir_okay=False,
                                      help="a trace written by `moespec trace`"),
    n: str = typer.Option("1..9", "--n", callback=_n_range, help="pass sizes, as 1..9 (n >= 1)"),
    out: Optional[Path] = typer.Option(None, "--out", callback=output_file,
                                       help="write the figures as a JSON artifact"),
    figure: Optional[Path] = typer.Option(None, "--figure", callback=output_file,
                                          help="write Figure 1 (reuse vs n) as PNG"),
    resamples: int = typer.Option(2000, callback=interval(1), help="bootstrap resamples of documents"),
    seed: int = typer.Option(0, callback=interval(0), help="bootstrap seed"),
) -> None:
    """Reuse rho(n), byte share u_bar(n) and distinct share U/(nm) of a trace, with 95% intervals."""
    from moespec.moe.reuse import analyze
    from moespec.moe.traces import RoutingTrace

    first, last = parse_n_range(n)
    tr = RoutingTrace.load(trace_path)
    a = analyze(tr, last, resamples=resamples, seed=seed)
    table = Table("n", "ρ(n) layer mean", "uniform", "ρ̄_k (k=n-1)", "ū(n)", "U/(nm)",
                  title=f"{tr.model or trace_path}: {len(tr.documents)} documents, {tr.num_tokens} tokens, "
                        f"N={tr.num_experts}, m={tr.top_k}, L={tr.num_layers}")
    for i in range(first - 1, last):
        rb = _cell(a.rho_bar.value[i - 1], a.rho_bar.lo[i - 1], a.rho_bar.hi[i - 1]) if i >= 1 else "—"
        table.add_row(
            str(a.n[i]), _cell(a.rho_mean.value[i], a.rho_mean.lo[i], a.rho_mean.hi[i]), f"{a.uniform[i]:.3f}", rb,
            _cell(a.u_bar.value[i], a.u_bar.lo[i], a.u_bar.hi[i]),
            _cell(a.distinct_share.value[i], a.distinct_share.lo[i], a.distinct_share.hi[i]),
        )
    cli_console().print(table)
    if out is not None:
        from moespec.models.lineage import identity
        from moespec.provenance import trace_fingerprint

        payload = {"trace": str(trace_path), "model": tr.model, "dtype": tr.dtype, "corpus": list(tr.corpus),
                   "provenance": {**identity(tr), "trace": trace_fingerprint(tr)},
                   "n_range": [first, last], "analysis": a.to_dict()}
        artifacts.write(out, "reuse", payload)
        cli_console().print(f"wrote {out}")
    if figure is not None:
        from moespec.report.fig_reuse import plot_reuse

        plot_reuse([(tr.model or trace_path.stem, a)], figure)
        cli_console().print(f"wrote {figure}")
