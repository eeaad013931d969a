"""moespec export-gguf: a preset or checkpoint as a GGUF file that llama.cpp decodes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from moespec.cli.app import app, cli_console
from moespec.cli.checks import interval, model_spec, output_file

TYPES = ("f32", "f16", "q8_0", "q4_k")


def _kind(value: str) -> str:
    if value not in TYPES:
        raise typer.BadParameter(f"{value!r} is not valid; use one of {', '.join(TYPES)}")
    return value


@app.command("export-gguf")
def export_gguf_cmd(
    spec: str = typer.Argument(..., callback=model_spec,
                               help="The model: trained:olmoe, trained:draft, trained:smollm2-draft, synthetic:NAME "
                                    "(olmoe-shaped, qwen3moe-shaped, mixtral-shaped) or a checkpoint folder."),
    out: Path = typer.Argument(..., callback=output_file, help="The .gguf file to write."),
    kind: str = typer.Option("f32", "--type", callback=_kind,
                             help="f32, f16, q8_0 or q4_k (llama.cpp's Q4_K_M mix); all but f32 come from "
                                  "llama.cpp's own quantizer."),
    threads: Optional[int] = typer.Option(None, "--threads", callback=interval(1), help="quantizer threads"),
) -> None:
    """Write a model as GGUF with its tokenizer (llama.cpp's olmoe, qwen3moe or llama architecture)."""
    from moespec.backends.llama_lib import bindings
    from moespec.models.gguf_export import export_gguf

    bindings()  # the quantizer and the check below need llama-cpp-python: say so before the model loads
    t0 = time.perf_counter()
    path = export_gguf(spec, out, kind, threads=threads)
    cli_console().print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB, {kind}) in {time.perf_counter() - t0:.1f} s")
