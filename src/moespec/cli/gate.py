"""moespec gate: the engine paper's three-level losslessness gate, on the user's own target and draft."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from moespec.texts import PROMPT_COUNT
from moespec.cli.app import app, cli_console
from moespec.cli.checks import MAX_DRAFT, backend_name, draft_length, interval, model_spec, output_file
from moespec.cli.loading import BACKEND_HELP, load_model


def _draft_lengths(values: list[str]) -> list[int | str]:
    return [draft_length(v) for v in values]


def _mark(ok: bool) -> str:
    return "pass" if ok else "FAIL"


def _test(c) -> str:
    if c.pvalue_independent is None:
        return f"χ²={c.chi2:.1f}, dof={c.dof}, p={c.pvalue:.3g}"
    return f"χ²={c.chi2:.1f}, dof={c.dof}, p={c.pvalue:.3g} by runs (χ² law, tokens as independent: {c.pvalue_independent:.3g})"


def _rows(result) -> list[tuple[str, str, str, str]]:
    """The verdict table of a GateResult: (level, check, figure, verdict)."""
    from moespec.checks.gate import EXACT_TOL, LEVEL1_ALPHA

    l1, l2, l3 = result.level1, result.level2, result.level3
    worst, err = min(l1.fit, key=lambda f: l1.fit[f].pvalue), max(l1.max_error.values())
    threshold = all(l1.threshold_ok.values())
    rows = [("1", f"exact law of one round = p, {len(l1.fit)} families",
             f"max |P - p| = {err:.1e}" + ("" if threshold else "; threshold is not min(1, p/q)"),
             _mark(threshold and err <= EXACT_TOL)),
            ("1", f"sampled rounds fit p, {l1.trials:,} per family", f"min p = {l1.fit[worst].pvalue:.3g} ({worst})",
             _mark(l1.fit[worst].pvalue > LEVEL1_ALPHA)),
            ("1", "power: resampling from p is rejected", f"p = {l1.power.pvalue:.2g}",
             _mark(l1.power.pvalue < LEVEL1_ALPHA))]
    rows += [("2", f"mock loop k={k} vs target-only, {l2.runs:,} x {l2.tokens} tokens", _test(c),
              _mark(c.pvalue > l2.alpha)) for k, c in l2.spec.items()]
    rows += [("2", "power: the draft's sampler is rejected", _test(l2.power), _mark(l2.power.pvalue < l2.alpha)),
             ("2", "greedy = plain decoding, k " + ", ".join(g.k for g in l2.greedy),
              f"{sum(g.equal for g in l2.greedy)}/{sum(g.prompts for g in l2.greedy)} identical",
              _mark(all(g.equal == g.prompts for g in l2.greedy) and l2.padded_ids == 0))]
    rows += [("3", f"greedy = {result.settings.get('reference', 'transformers generate')}, k={g.k}",
              f"{g.equal}/{g.prompts} prompts x {l3.greedy_tokens} tokens" + _margins(g),
              _mark(g.equal == g.prompts)) for g in l3.greedy]
    rows += [("3", f"sampled k={l3.sample_k} vs target-only, {l3.spec.n[0]:,} tokens each", _test(l3.spec),
              _mark(l3.spec.pvalue > l3.alpha and not l3.padded_ids)),
             ("3", "power: the draft's own sampler is rejected", _test(l3.power),
              "pass" if l3.power.pvalue < l3.alpha else "inconclusive")]
    return rows


def _margins(g) -> str:
    """The first difference's top-2 margins in one- and two-token passes, when greedy output differs."""
    if g.margins is None:
        return ""
    return (f"; first differs at token {g.first_mismatch[1]}, margin {g.margins[0]:.3g} (1-token pass) / "
            f"{g.margins[1]:.3g} (2-token)" + (", argmax moves" if g.argmax_moves else ""))


@app.command("gate")
def gate_cmd(
    target: str = typer.Option(..., "--target", callback=model_spec,
                               help="Target model: synthetic:NAME, trained:NAME, a checkpoint folder or a .gguf file."),
    draft: str = typer.Option(..., "--draft", callback=model_spec,
                              help="Draft model spec (must share the target's tokenizer)."),
    samples: int = typer.Option(9_200, "--samples", callback=interval(100),
                                help="Level 3: sampled tokens per method (the engine paper used about 9,200)."),
    prompts: int = typer.Option(4, "--prompts", callback=interval(1, PROMPT_COUNT),
                                help=f"Level 3: built-in prompts, 1..{PROMPT_COUNT}."),
    k: list[str] = typer.Option(["1", "4", "auto"], "-k", "--k", callback=_draft_lengths, metavar="K",
                                help=f"Draft lengths to check (repeat), 0..{MAX_DRAFT} or 'auto'."),
    max_k: int = typer.Option(8, "--max-k", callback=interval(1, MAX_DRAFT), help="Largest draft length of -k auto."),
    greedy_tokens: int = typer.Option(32, "--greedy-tokens", callback=interval(1),
                                      help="Level 3: greedy tokens per prompt compared with transformers."),
    trials: int = typer.Option(50_000, "--trials", callback=interval(1000), help="Level 1: rounds per (p, q) family."),
    mock_runs: int = typer.Option(1000, "--mock-runs", callback=interval(50),
                                  help="Level 2: generations per method on the table models."),
    seed: int = typer.Option(0, "--seed", callback=interval(0)),
    json_out: Optional[Path] = typer.Option(None, "--json", callback=output_file, help="Write the gate artifact here."),
    backend: Optional[str] = typer.Option(None, "--backend", callback=backend_name, help="Target's backend: " + BACKEND_HELP),
    draft_backend: Optional[str] = typer.Option(None, "--draft-backend", callback=backend_name,
                                                help="The draft's backend (default as for the target)."),
    threads: Optional[int] = typer.Option(None, "--threads", callback=interval(1),
                                          help="llama.cpp's threads, >= 1 (default: all cores)."),
    exact: bool = typer.Option(False, "--exact", help="Check the target with every pass one function (see generate)."),
) -> None:
    """Check that speculative decoding of this pair is lossless; exit 1 if any level fails."""
    from moespec import artifacts
    from moespec.checks.gate import run_gate
    from moespec.engine.draft_choice import DraftChoice

    console = cli_console()
    model, tok = load_model(target, backend, threads=threads, exact=exact)
    draft_model = DraftChoice(model=draft).proposer(
        tokenizer=tok, load_draft=lambda spec: load_model(spec, draft_backend, threads=threads))
    result = run_gate(model, draft_model, tok, prompts=prompts, ks=k, max_k=max_k, samples=samples,
                      greedy_tokens=greedy_tokens, trials=trials, mock_runs=mock_runs, seed=seed,
                      progress=lambda message: console.print(message, style="dim"))

    table = Table("level", "check", "figure", "verdict", title=f"losslessness gate: {target} with draft {draft}")
    for level, check, figure, verdict in _rows(result):
        table.add_row(level, check, figure, verdict, style=None if verdict == "pass" else "bold red")
    console.print(table)
    if result.level3.reason:
        console.print(f"level 3: {result.level3.reason}", markup=False)
    console.print("gate passed" if result.passed else "gate FAILED", style="green" if result.passed else "bold red")
    if json_out is not None:
        artifacts.write(json_out, "gate", {"target": target, "draft": draft, "result": result.to_dict()})
        console.print(f"wrote {json_out}")
    if not result.passed:
        raise typer.Exit(1)
