"""What a model allows before it loads: the positions one sequence may hold and the bytes its KV cache
takes per position, read from its config or its GGUF header (no weight is read), and the memory this
machine has free. The CLI checks sizes against them before any work begins (docs/robustness.md)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

# llama.cpp keeps its KV cache in f16; the torch backend's models run in float32 unless told otherwise
LLAMA_KV_BYTES, TORCH_KV_BYTES = 2, 4


@dataclass(frozen=True)
class Limits:
    """positions: the most positions of one sequence (None: the model declares none); kv_bytes: KV cache
    bytes per position of one sequence (None: unknown); source: where `positions` was read, for messages."""

    positions: int | None
    kv_bytes: int | None
    source: str


def _kv_bytes(layers, kv_heads, key_dim, value_dim, element: int) -> int | None:
    if isinstance(kv_heads, list):  # per-layer head counts in some GGUF files
        return None if not kv_heads else sum(int(h) * (key_dim + value_dim) * element for h in kv_heads)
    if None in (layers, kv_heads, key_dim, value_dim):
        return None
    return int(layers) * int(kv_heads) * (int(key_dim) + int(value_dim)) * element


def gguf_limits(path: str | Path, element: int = LLAMA_KV_BYTES) -> Limits:
    """The trained context and the KV bytes per position of a GGUF file, from its header alone."""
    from moespec.backends.gguf_header import read_metadata

    arch = read_metadata(path, {"general.architecture"}).get("general.architecture")
    if not isinstance(arch, str):
        return Limits(None, None, f"{path}")
    keys = ("context_length", "block_count", "attention.head_count_kv", "attention.head_count", "embedding_length",
            "attention.key_length", "attention.value_length")
    meta = {k: v for k, v in read_metadata(path, {f"{arch}.{k}" for k in keys}).items()}
    get = lambda k: meta.get(f"{arch}.{k}")  # noqa: E731
    heads = get("attention.head_count")
    width = get("embedding_length")
    head_dim = width // heads if isinstance(heads, int) and heads and isinstance(width, int) else None
    kv_heads = get("attention.head_count_kv") if get("attention.head_count_kv") is not None else heads
    key_dim = get("attention.key_length") or head_dim
    value_dim = get("attention.value_length") or head_dim
    context = get("context_length")
    return Limits(int(context) if isinstance(context, int) and context > 0 else None,
                  _kv_bytes(get("block_count"), kv_heads, key_dim, value_dim, element),
                  f"{Path(path).name} ({arch}.context_length)")


def config_limits(config: dict, source: str, element: int = TORCH_KV_BYTES) -> Limits:
    """The positions (`max_position_embeddings`) and KV bytes per position of a transformers config as a dict."""
    text = config.get("text_config") or config
    heads = text.get("num_attention_heads")
    width = text.get("hidden_size")
    head_dim = text.get("head_dim") or (width // heads if heads and width else None)
    key_dim = text.get("qk_head_dim") or (text.get("qk_nope_head_dim", 0) + text.get("qk_rope_head_dim", 0)) or head_dim
    value_dim = text.get("v_head_dim") or head_dim
    kv_heads = text.get("num_key_value_heads") or heads
    positions = text.get("max_position_embeddings")
    return Limits(int(positions) if positions else None,
                  _kv_bytes(text.get("num_hidden_layers"), kv_heads, key_dim, value_dim, element),
                  f"{source} (max_position_embeddings)")


def limits(spec: str, engine: str, *, layers: int | None = None) -> Limits:
    """The Limits of the model `spec` names on `engine` ("torch" or "llama.cpp", `specs.resolve_backend`)."""
    from moespec.models import gguf, synthetic, trained
    from moespec.models.specs import SYNTHETIC_PREFIX

    if spec.startswith(SYNTHETIC_PREFIX):
        name = spec[len(SYNTHETIC_PREFIX):]
        return config_limits(synthetic.config(name, layers=layers).to_dict(), spec)
    if spec.startswith(trained.PREFIX):
        folder = trained.folder(spec[len(trained.PREFIX):])
        return config_limits(json.loads((folder / "config.json").read_text()), spec)
    if gguf.is_gguf(spec) and not Path(spec).expanduser().is_dir():
        return gguf_limits(gguf.resolve(spec), LLAMA_KV_BYTES if engine == "llama.cpp" else TORCH_KV_BYTES)
    path = Path(spec).expanduser() / "config.json"
    return config_limits(json.loads(path.read_text()), spec) if path.is_file() else Limits(None, None, spec)


def free_memory() -> int | None:
    """Bytes this process may still allocate: the kernel's MemAvailable, under a cgroup's limit where one is set."""
    free = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except OSError:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            free = min(free if free is not None else int(limit), int(limit) - used)
    except (OSError, ValueError):
        pass
    return free


def gigabytes(n: int) -> str:
    return f"{n / 1e9:.1f} GB"
