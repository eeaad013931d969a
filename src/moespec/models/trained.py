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
from moespec.models.tokenizer import ByteTokenizer

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


def load_trained(name: str, *, dtype: str | torch.dtype | None = None):
    """(model, ByteTokenizer) of trained preset `name`, in eval mode, float32 unless `dtype` says."""
    import transformers

    from moespec.moe import registry

    registry.register()
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # a 20 MB preset needs no "Loading weights" bar
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder(name), local_files_only=True,
                                                                  dtype=resolve_dtype(dtype))
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
    model.eval().requires_grad_(False)
    model.name_or_path = PREFIX + name
    return model, ByteTokenizer()
