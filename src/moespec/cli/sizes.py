"""Sizes checked against the model and the machine before any work: the positions a measurement's
passes reach against the model's context (its config or GGUF header, `models.limits`, read without
loading it), the KV cache of those positions (B sequences' at batch size B) against the memory free,
and batch sizes against llama.cpp's sequence limit and what the batch chain's trace holds. Each check
raises typer.BadParameter naming the value, the limit and the fix (docs/robustness.md).
"""

from __future__ import annotations

from pathlib import Path

import typer

from moespec.models.limits import free_memory, gigabytes


def check_memory(bytes_needed: int | None, what: str, fix: str, option: str) -> None:
    """Refuse `what` (a KV cache of some positions) when it alone outgrows the memory this machine has free."""
    free = free_memory()
    if bytes_needed is not None and free is not None and bytes_needed > free:
        raise typer.BadParameter(f"{what} needs a KV cache of {gigabytes(bytes_needed)}, more than the "
                                 f"{gigabytes(free)} this machine has free; {fix}", param_hint=option)


def check_measure(model: str, backend: str, *, full: bool, base: bool, layers: int | None, knobs: dict) -> None:
    """`moespec measure`: the deepest pass (`MeasureConfig.positions`) within the model's context, and its
    KV cache within the memory free, before the model loads."""
    from moespec.backends.llama_model import DEFAULT_CONTEXT
    from moespec.bench.measure import MeasureConfig
    from moespec.bench.measure_base import base_knobs
    from moespec.models.limits import limits
    from moespec.models.specs import resolve_backend

    try:
        engine = resolve_backend(model, backend)
        cfg = MeasureConfig.preset(full, **(base_knobs(knobs) if base else knobs))
        lim = limits(model, engine, layers=layers)
    except (ValueError, TypeError, OSError):
        return  # the measurement names these itself, where it meets them
    capacity, source = lim.positions, lim.source
    if engine == "llama.cpp":  # `measure` opens the file at llama.cpp's default context
        capacity, source = min(capacity or DEFAULT_CONTEXT, DEFAULT_CONTEXT), f"the llama.cpp context ({source})"
    depth, need = max(cfg.depths), cfg.positions
    if capacity is not None and need > capacity:
        raise typer.BadParameter(
            f"--depth {depth} and the passes after it (verify windows, oracle runs, drafts) reach {need} positions, "
            f"beyond the {capacity} positions of {source}; give --depth {max(capacity - (need - depth), 1)} or less",
            param_hint="'--depth'")
    check_memory(None if lim.kv_bytes is None else need * lim.kv_bytes, f"--depth {depth} ({need} positions)",
                 "give a smaller --depth", "'--depth'")


def check_batch_model(path: Path, knobs, prompt_option: str) -> None:
    """The batch measurement on the GGUF file `path` (`bench.batch_measure`, `knobs` a BatchKnobs): B
    sequences within llama.cpp's limit, each sequence's positions within the file's trained context, and
    B sequences' KV caches within the memory free."""
    from moespec.bench.batch_measure import context
    from moespec.models.limits import gguf_limits

    B = max(knobs.sizes)
    most = max_sequences()
    if most is not None and B > most:
        raise typer.BadParameter(f"batch size {B} is more sequences than the {most} llama.cpp decodes together; "
                                 f"give batch sizes up to {most}", param_hint="'--batch-sizes'")
    try:
        lim = gguf_limits(path)
    except (ValueError, OSError):
        return  # a damaged header: llama.cpp's loader names it
    positions = context(knobs.prompt_tokens, knobs.new_tokens, knobs.max_k)
    if lim.positions is not None and positions > lim.positions:
        slack = positions - knobs.prompt_tokens
        raise typer.BadParameter(
            f"{prompt_option} {knobs.prompt_tokens}: each sequence holds {knobs.prompt_tokens} + {slack} = {positions} "
            f"positions (prompt, new tokens, the last draft), beyond the {lim.positions} positions of {lim.source}; "
            f"give {prompt_option} {max(lim.positions - slack, 1)} or less", param_hint=f"'{prompt_option}'")
    check_memory(None if lim.kv_bytes is None else B * positions * lim.kv_bytes,
                 f"batch size {B} x {positions} positions", "give smaller batch sizes or fewer prompt tokens",
                 "'--batch-sizes'")


def check_batch_trace(knobs) -> None:
    """`moespec batch`: its characterization times passes of B(k + 1) tokens on windows of one trace
    document, and the trace's documents hold at most `DOC_TOKENS` tokens; B windows need B documents."""
    from moespec.chain.batch_chain import DOC_CHARS, DOC_TOKENS
    from moespec.texts import default_corpus, spread

    B, k = max(knobs.sizes), knobs.max_k
    if B * (k + 1) > DOC_TOKENS:
        raise typer.BadParameter(
            f"batch size {B} at --max-k {k} makes passes of B(k + 1) = {B * (k + 1)} tokens, longer than the "
            f"{DOC_TOKENS}-token documents of the batch trace its characterization reads; give batch sizes up to "
            f"{DOC_TOKENS // (k + 1)} (or a smaller --max-k)", param_hint="'--batch-sizes'")
    # the trace takes documents in turn, each cut to DOC_TOKENS (a DOC_CHARS text is longer under any
    # tokenizer), until --trace-tokens; the last, cut shorter, counts if it holds a window of k + 1
    corpus = len(spread(default_corpus(), DOC_CHARS))
    whole, rest = divmod(knobs.trace_tokens, DOC_TOKENS)
    documents = min(corpus, whole + (rest >= k + 1))
    if B > documents:
        more = f" or --trace-tokens {B * DOC_TOKENS}" if B <= corpus else ""
        raise typer.BadParameter(
            f"batch size {B} needs {B} distinct trace documents, and --trace-tokens {knobs.trace_tokens} over the "
            f"shipped corpus gives {documents} (documents of up to {DOC_TOKENS} tokens); give batch sizes up to "
            f"{documents}{more}", param_hint="'--batch-sizes'")


def max_sequences() -> int | None:
    """The most sequences one llama.cpp context decodes together (None when llama-cpp-python is absent)."""
    try:
        from moespec.backends.llama_lib import bindings

        return int(bindings().llama_max_parallel_sequences())
    except (ValueError, AttributeError):
        return None
