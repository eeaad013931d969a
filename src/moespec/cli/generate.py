"""moespec generate: lossless speculative decoding from the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from moespec.cli.app import app, cli_console
from moespec.cli.checks import (ROUTING_HELP, MAX_DRAFT, backend_name, draft_length, experts_implementation, interval,
                                model_spec, output_file, routing_file)
from moespec.cli.loading import BACKEND_HELP, load_model
from moespec.kernel_names import AUTO

# The options whose help runs long, declared here so that the command's signature reads as a list.
TARGET = typer.Option(..., "--target", callback=model_spec,
                      help="Target model: synthetic:NAME, trained:NAME, smollm2, a local .gguf file or checkpoint folder.")
K = typer.Option("4", "-k", "--k", callback=draft_length,
                 help=f"Draft tokens per round, 0..{MAX_DRAFT} (0 = plain decoding), or 'auto': each round the k in "
                      "0..--max-k with the most expected tokens/s.")
PROMPT_FILE = typer.Option(None, "--prompt-file", exists=True, dir_okay=False,
                           help="Read the prompt from a UTF-8 text file; repeat it to decode several prompts as one batch "
                                "(llama.cpp), one sequence each.")
EXPERTS = typer.Option(
    AUTO, "--experts", callback=experts_implementation,
    help="Expert kernel of MoE models: moespec_auto (compiled; per-slot below the crossover, dedup from it), "
         "moespec_slot, moespec_dedup, their torch versions moespec_torch_*, or a transformers one "
         "(grouped_mm, batched_mm, eager). Dense models ignore it.")
FAST_LINEAR = typer.Option(True, "--fast-linear/--torch-linear",
                           help="Linear layers of decode and verify passes: compiled small-n products "
                                "(moespec.fast_linear), or torch's F.linear.")
WARM_START = typer.Option(
    True, "--warm-start/--no-warm-start",
    help="-k auto: seed the step times right after the prefill from those that earlier calls of these models "
         "measured on this machine (~/.cache/moespec/step-times.json; a first call learns them from its rounds); "
         "the call's measured times are kept for the next. Off: learn them from the rounds alone, keep nothing.")
STEP_TIMES_FROM = typer.Option(
    None, "--step-times-from", exists=True, dir_okay=False,
    help="-k auto: seed the step times V(0..--max-k) from a prediction artifact (`moespec predict`)")
DRAFT_BACKEND = typer.Option(None, "--draft-backend", callback=backend_name,
                             help="The draft model's backend (default as for the target); mixed pairs are fine when "
                                  "the vocabularies agree.")
EXACT = typer.Option(False, "--exact", help="Every target pass computes the same function (no one-token pass; on "
                                            "llama.cpp no flash attention), so greedy output is the same tokens at "
                                            "every -k and in plain decoding. Without it a quantized llama.cpp "
                                            "target's logits depend on the pass size: see the README.")
def _encode(tok, text: str) -> list[int]:
    from moespec.models.tokenizer import ByteTokenizer

    ids = tok.encode(text, add_bos=True) if isinstance(tok, ByteTokenizer) else list(tok.encode(text))
    if not ids:  # an empty prompt on a tokenizer that adds no BOS: decoding starts from the BOS
        bos = getattr(tok, "bos_token_id", None)
        if bos is None:
            raise typer.BadParameter(f"the prompt {text!r} gives no tokens and {tok!r} has no BOS token to start "
                                     "from; give a non-empty prompt", param_hint="'--prompt'")
        ids = [int(bos)]
    return ids


def _stats_table(title: str, stats) -> Table:
    split = stats.latency_split_ms()
    table = Table("figure", "value", title=title)
    table.add_row("new tokens", str(stats.new_tokens))
    table.add_row("tokens/s", f"{stats.tokens_per_s:.2f}")
    table.add_row("TTFT", f"{1e3 * stats.ttft_s:.1f} ms")
    table.add_row("rounds", f"{stats.rounds} ({stats.mean_tokens_per_round:.2f} tokens/round)")
    if stats.drafted:
        table.add_row("acceptance (pooled)", f"{stats.acceptance:.3f}")
        table.add_row("acceptance by position", "  ".join(f"{a:.2f}" for a in stats.acceptance_by_position))
    if stats.policy.get("policy") == "auto":
        _policy_rows(table, stats)
    for part in ("draft", "verify", "sampling", "other"):
        table.add_row(f"{part} ms/token", f"{split[part]:.3f}")
    table.add_row("outside forward passes", f"{100 * stats.overhead_share:.2f}%")
    table.add_row("peak RSS", f"{stats.peak_rss_bytes / 2**20:.0f} MiB")
    return table


def _policy_rows(table: Table, stats) -> None:
    """k="auto": how often each k was chosen, and the policy's final estimates of α_i and V(k)."""
    counts = {k: stats.k_per_round.count(k) for k in sorted(set(stats.k_per_round))}
    table.add_row("chosen k: rounds", "  ".join(f"{k}: {n}" for k, n in counts.items()))
    table.add_row("policy acceptance α_1..", "  ".join(f"{a:.2f}" for a in stats.policy["acceptance"]))
    V = stats.policy["step_s"]
    table.add_row("policy V(0..max_k) ms", "-" if V is None else "  ".join(f"{1e3 * v:.1f}" for v in V))
    warm = stats.policy.get("warm_start")
    if warm is not None:
        source = {"store": "stored step times", "timed": "timed pass sizes", None: "none (learned from the rounds)"}
        table.add_row("warm start", f"{source[warm['source']]}, {1e3 * warm['seconds']:.1f} ms")



@app.command("generate")
def generate_cmd(
    target: str = TARGET,
    draft: Optional[str] = typer.Option(None, "--draft", callback=model_spec,
                                        help="Draft model spec (must share the target's tokenizer)."),
    prompt_lookup: Optional[int] = typer.Option(None, "--prompt-lookup", callback=interval(1),
                                                help="Draft by n-gram prompt lookup, n-gram size N >= 1."),
    oracle_acceptance: Optional[float] = typer.Option(None, "--oracle-acceptance", callback=interval(0, 1),
                                                      help="Oracle draft at acceptance A in [0, 1] (greedy only)."),
    k: str = K,
    max_k: int = typer.Option(8, "--max-k", callback=interval(1, MAX_DRAFT),
                              help=f"Largest draft length of -k auto, 1..{MAX_DRAFT}."),
    temperature: float = typer.Option(0.0, "--temperature", callback=interval(0), help=">= 0; 0 is greedy."),
    top_k: Optional[int] = typer.Option(None, "--top-k", callback=interval(1), help="keep the k likeliest ids, k >= 1"),
    top_p: Optional[float] = typer.Option(None, "--top-p", callback=interval(0, 1, lo_open=True),
                                          help="nucleus sampling, p in (0, 1]"),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", callback=interval(1), help="tokens to generate, >= 1"),
    seed: int = typer.Option(0, "--seed", callback=interval(0)),
    prompt: Optional[str] = typer.Option(None, "--prompt", help="Prompt text."),
    prompt_file: Optional[list[Path]] = PROMPT_FILE,
    chat: bool = typer.Option(False, "--chat", help="Wrap the prompt as a user turn in the tokenizer's chat template "
                                                     "(instruct models such as smollm2)."),
    compare: bool = typer.Option(False, "--compare", help="Also run plain decoding and print the speedup."),
    json_out: Optional[Path] = typer.Option(None, "--json", callback=output_file,
                                            help="Write the result artifact here."),
    experts: str = EXPERTS,
    fast_linear: bool = FAST_LINEAR,
    routing: Optional[Path] = typer.Option(None, "--routing", callback=routing_file, help=ROUTING_HELP),
    warm_start: bool = WARM_START,
    step_times_from: Optional[Path] = STEP_TIMES_FROM,
    backend: Optional[str] = typer.Option(None, "--backend", callback=backend_name, help="Target's backend: " + BACKEND_HELP),
    draft_backend: Optional[str] = DRAFT_BACKEND,
    threads: Optional[int] = typer.Option(None, "--threads", callback=interval(1),
                                          help="llama.cpp's threads, >= 1 (default: all cores)."),
    exact: bool = EXACT,
) -> None:
    """Decode with a target and a draft (model, prompt lookup or oracle), losslessly.

    A .gguf target decodes on llama.cpp when moespec[llama] is installed (--backend torch keeps the
    transformers path)."""
    choice = _draft_choice(draft, prompt_lookup, oracle_acceptance, temperature)
    if (prompt is None) == (not prompt_file):
        raise typer.BadParameter("give exactly one of --prompt and --prompt-file")
    sampling = dict(max_k=max_k, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=max_new_tokens)
    models = dict(target=target, backend=backend, draft_backend=draft_backend, threads=threads, exact=exact)
    if prompt_file and len(prompt_file) > 1:
        if compare or step_times_from is not None or chat:
            raise typer.BadParameter("--compare, --step-times-from and --chat take one prompt, not a batch of "
                                     "prompt files")
        return _batch(choice=choice, files=prompt_file, k=k, sampling=sampling, seed=seed, json_out=json_out, **models)
    from moespec.texts import read_text

    _single(choice=choice, text=prompt if prompt is not None else read_text(prompt_file[0]), chat=chat, k=k,
            sampling=sampling, seed=seed, step_times_from=step_times_from, warm_start=warm_start, compare=compare,
            json_out=json_out, torch_options=dict(experts_implementation=experts, fast_linear=fast_linear),
            routing=routing, **models)


def _single(*, choice, text: str, chat: bool, k, sampling: dict, seed: int, step_times_from: Path | None,
            warm_start: bool, compare: bool, json_out: Path | None, torch_options: dict, routing: Path | None,
            target: str, backend, draft_backend, threads, exact: bool) -> None:
    """One prompt (`engine.compare.generate_compared`): the text, the figures, and with --compare plain decoding's."""
    from moespec.engine.compare import generate_compared

    model, tok = load_model(target, backend, threads=threads, exact=exact, routing=routing, **torch_options)
    proposer = choice.proposer(tokenizer=tok, seed=seed, load_draft=lambda spec: load_model(
        spec, draft_backend, threads=threads, **torch_options))
    seeded = _seeded_step_times(step_times_from, k, sampling["max_k"], read=choice.speculative, target=(target, model))
    kwargs = {**sampling, "eos_token_id": tok.eos_token_id, "seed": seed, "vocab_limit": len(tok)}
    run = generate_compared(model, _input_ids(tok, text, chat), draft=proposer, k=choice.draft_length(k),
                            step_times=seeded, warm_start=warm_start, compare=compare, **kwargs)
    from moespec.models.specs import resolve_backend

    payload = {"target": target, "draft": choice.model, "prompt_lookup": choice.prompt_lookup,
               "oracle_acceptance": choice.oracle_acceptance, "k": k,
               "experts": torch_options["experts_implementation"], "fast_linear": torch_options["fast_linear"],
               "backend": resolve_backend(target, backend or "auto"), "draft_backend": draft_backend,
               "threads": threads, "exact": exact, "step_times": seeded, "warm_start": warm_start, "text": text,
               "chat": chat, **kwargs}
    _report(run, tok, payload, json_out, speculative=choice.speculative)


def _draft_choice(draft, prompt_lookup, oracle_acceptance, temperature: float):
    """The options' `engine.draft_choice.DraftChoice`, a usage error when they clash."""
    from moespec.engine.draft_choice import DraftChoice

    try:
        return DraftChoice(model=draft, prompt_lookup=prompt_lookup, oracle_acceptance=oracle_acceptance,
                           temperature=temperature)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


def _input_ids(tok, text: str, chat: bool) -> list[int]:
    """The prompt's ids: plain, or as a user turn in the tokenizer's chat template (--chat)."""
    if not chat:
        return _encode(tok, text)
    from moespec.texts import chat_ids

    try:
        return chat_ids(tok, text)
    except ValueError as e:
        raise typer.BadParameter(f"--chat: {e}") from None


def _seeded_step_times(path: Path | None, k, max_k: int, *, read: bool, target: tuple) -> list[float] | None:
    """V(0..max_k) for -k auto from a prediction artifact (--step-times-from) of this target (spec,
    loaded model) when `read` (something drafts), else None; a prediction of another model is refused."""
    if path is None:
        return None
    if k != "auto":
        raise typer.BadParameter(f"--step-times-from seeds -k auto; got -k {k}")
    from moespec.chain.prediction import KIND, payload_of
    from moespec.chain.step_times import seed_step_times
    from moespec.models.lineage import check_chain, of_model

    check_chain({"the target": {"provenance": of_model(*target)}, str(path): payload_of(path, KIND)},
                fix="give --step-times-from a prediction made for this target (moespec predict / demo on it)")
    return seed_step_times(path, max_k=max_k) if read else None


def _report(run, tok, payload: dict, json_out: Path | None, *, speculative: bool) -> None:
    """The decoded text and the figures (plain decoding's and the speedup when compared); the artifact."""
    from moespec import artifacts

    console = cli_console()
    console.print(tok.decode(run.result.tokens), markup=False, highlight=False)
    console.print(_stats_table("speculative" if speculative else "plain decoding", run.result.stats))
    payload = {**payload, "result": run.result.to_dict()}
    if run.plain is not None:
        console.print(_stats_table("plain decoding", run.plain.stats))
        same = "identical tokens" if run.same_tokens else "different tokens (sampling)"
        console.print(f"speedup {run.speedup:.2f}x over plain decoding; {same}")
        payload.update(plain=run.plain.to_dict(), speedup=run.speedup)
    if json_out is not None:
        artifacts.write(json_out, "generate", payload)
        console.print(f"wrote {json_out}")


def _batch(*, choice, files: list[Path], k, sampling: dict, seed: int, json_out: Path | None, target: str, backend,
           draft_backend, threads, exact: bool) -> None:
    """Several prompt files decoded as one batch (`engine.batch.generate_batch`), one sequence each."""
    from moespec import artifacts
    from moespec.engine.batch import generate_batch
    from moespec.texts import read_text

    texts = [read_text(f) for f in files]
    B = len(texts)
    model, tok = load_model(target, backend, threads=threads, exact=exact, sequences=B)
    proposer = choice.proposer(tokenizer=tok, seed=seed, sequences=B, load_draft=lambda spec: load_model(
        spec, draft_backend, threads=threads, exact=exact, sequences=B))
    results = generate_batch(model, [_encode(tok, text) for text in texts], draft=proposer, k=choice.draft_length(k),
                             **sampling, eos_token_id=tok.eos_token_id, seed=seed, vocab_limit=len(tok))
    console = cli_console()
    for i, r in enumerate(results):
        console.print(f"[{i}] {tok.decode(r.tokens)}", markup=False, highlight=False)
    console.print(_batch_table(files, results))
    batch = results[0].batch
    console.print(f"batch: {batch.new_tokens} tokens in {batch.total_s:.2f} s, {batch.tokens_per_s:.1f} tokens/s, "
                  f"{batch.rounds} rounds")
    if json_out is not None:
        artifacts.write(json_out, "generate", {
            "target": target, "draft": choice.model, "prompt_lookup": choice.prompt_lookup,
            "oracle_acceptance": choice.oracle_acceptance, "k": k, "max_k": sampling["max_k"], "threads": threads,
            "exact": exact, "temperature": sampling["temperature"], "top_k": sampling["top_k"],
            "top_p": sampling["top_p"], "max_new_tokens": sampling["max_new_tokens"], "seed": seed,
            "prompt_files": [str(f) for f in files], "texts": texts,
            "results": [{**r.to_dict(), "batch": None} for r in results], "batch": batch.to_dict()})
        console.print(f"wrote {json_out}")


def _batch_table(files: list[Path], results) -> Table:
    table = Table("sequence", "prompt file", "new tokens", "rounds", "acceptance", "stop",
                  title=f"a batch of {len(results)} sequences")
    for i, (f, r) in enumerate(zip(files, results)):
        table.add_row(str(i), str(f), str(r.stats.new_tokens), str(r.stats.rounds),
                      f"{r.stats.acceptance:.3f}" if r.stats.drafted else "-", r.stats.stop_reason)
    return table
