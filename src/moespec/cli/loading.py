"""Loading the models a command names, each on its backend."""

from __future__ import annotations

BACKEND_HELP = ("torch or llama.cpp. Default: llama.cpp for a .gguf file when moespec[llama] is installed "
                "(llama-cpp-python), torch otherwise; --backend torch dequantizes a .gguf file into transformers.")


def load_model(spec: str, backend: str | None, *, threads: int | None, exact: bool = False,
               sequences: int | None = None, **torch_options):
    """(model, tokenizer) of `spec` on its backend: llama.cpp takes the threads (and `sequences` for a
    batch of prompts), torch the kernel options."""
    from moespec.models.specs import load, resolve_backend

    if resolve_backend(spec, backend or "auto") == "llama.cpp":
        if torch_options.get("routing") is not None:
            raise ValueError(f"--routing replays traces in torch MoE layers; {spec} decodes on llama.cpp (add --backend torch)")
        return load(spec, backend="llama.cpp", threads=threads, exact=exact, sequences=sequences)
    if sequences is not None:
        raise ValueError(f"several prompts decode as one batch on llama.cpp; {spec} runs on torch, which decodes one "
                         "prompt at a time: give a .gguf model, or one --prompt-file")
    return load(spec, backend="torch", exact=exact, **torch_options)
