"""Model spec strings: `synthetic:NAME`, `trained:NAME` or a local checkpoint folder. Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import torch

from moespec.device import resolve_device, resolve_dtype
from moespec.models import synthetic, trained
from moespec.models.tokenizer import MARKER_FILE, ByteTokenizer
from moespec.moe import registry

SYNTHETIC_PREFIX = "synthetic:"


def load(
    spec: str,
    *,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = "cpu",
    seed: int = 0,
    layers: int | None = None,
    experts_implementation: str | None = None,
    routing: str | Path | None = None,
):
    """(model, tokenizer) for a spec string.

    `synthetic:NAME` builds a seeded preset (`layers` overrides its depth); `trained:NAME` loads a
    preset shipped in the package (`models.trained`); anything else must be
    a local folder holding a transformers checkpoint, loaded with `local_files_only=True`. moespec's
    experts implementations are registered first, so `experts_implementation` may name one.
    `routing`: a trace file the MoE layers replay (`moe.replay`), e.g. one recorded from trained:olmoe.
    """
    registry.register()
    if spec.startswith(SYNTHETIC_PREFIX):
        name = spec[len(SYNTHETIC_PREFIX):]
        model, tok = synthetic.build(name, seed=seed, layers=layers, dtype=dtype)
    elif spec.startswith(trained.PREFIX):
        if layers is not None:
            raise ValueError("layers= applies to synthetic presets only; a trained preset keeps its depth")
        model, tok = trained.load_trained(spec[len(trained.PREFIX):], dtype=dtype)
    else:
        path = Path(spec).expanduser()
        if not path.is_dir():
            raise ValueError(
                f"model {spec!r} is neither a local checkpoint folder nor a synthetic preset; use a path "
                f"to a folder with config.json, or one of: "
                + ", ".join([SYNTHETIC_PREFIX + n for n in synthetic.preset_names()]
                            + [trained.PREFIX + n for n in trained.names()])
            )
        if not (path / "config.json").exists():
            raise ValueError(f"{path} has no config.json; point --model at a transformers checkpoint folder")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if layers is not None:
            raise ValueError("layers= applies to synthetic presets only; a checkpoint keeps its depth")
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=resolve_dtype(dtype))
        model.eval().requires_grad_(False)
        if (path / MARKER_FILE).exists():
            tok = ByteTokenizer()
        else:
            tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if experts_implementation is not None:
        model.set_experts_implementation(experts_implementation)
    if routing is not None:
        from moespec.moe.replay import replay_routing

        model.moespec_replay = replay_routing(model, routing)
    return model.to(resolve_device(device)), tok
