"""What the cost-model chain needs to know of a GGUF file, read from its header without llama.cpp:
its identity (the `bench.lineage` fields: spec, fingerprint, weight type, N, m, L) and the bytes of
one expert in each MoE layer, in the file's own quantization type (a q8_0 expert is about a quarter
of an f32 one; the bytes a pass reads follow the file, not the model it was exported from).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from moespec.provenance import file_fingerprint

EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
ENGINE = "llama.cpp"  # the "experts" field of the identity: llama.cpp runs its own grouped kernel


@lru_cache(maxsize=8)
def _reader(path: str, mtime_ns: int):
    import gguf

    return gguf.GGUFReader(path)


def reader(path: str | Path):
    """A (cached) gguf.GGUFReader of `path`; a changed file is read again."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"GGUF file {str(path)!r} not found; give the path of a .gguf file")
    return _reader(str(p.resolve()), p.stat().st_mtime_ns)


def field(path: str | Path, key: str, default: Any = None) -> Any:
    """The metadata value `key` ("general.architecture", "olmoe.expert_count", ...) or `default`."""
    f = reader(path).fields.get(key)
    return default if f is None else f.contents()


def fingerprint(path: str | Path) -> str:
    """The file's identity (`provenance.file_fingerprint`)."""
    return file_fingerprint(path)


def weight_type(path: str | Path) -> str:
    """The type of the file's expert weights ("Q8_0", "Q4_K", "F16", ...), else of its first 2-D tensor."""
    tensors = reader(path).tensors
    experts = [t for t in tensors if t.name.endswith("ffn_up_exps.weight")]
    first = experts or [t for t in tensors if len(t.shape) >= 2] or tensors
    return first[0].tensor_type.name.lower()


def moe_shape(path: str | Path) -> dict[str, int | None]:
    """{"num_experts": N, "top_k": m, "num_layers": L (MoE layers)}; every value None for a dense file."""
    arch = field(path, "general.architecture")
    N, m = field(path, f"{arch}.expert_count"), field(path, f"{arch}.expert_used_count")
    layers = expert_layers(path)
    if not N or not m or not layers:
        return {"num_experts": None, "top_k": None, "num_layers": None}
    return {"num_experts": int(N), "top_k": int(m), "num_layers": len(layers)}


def expert_layers(path: str | Path) -> list[int]:
    """The block indices that hold expert tensors, ascending."""
    blocks = {int(t.name.split(".")[1]) for t in reader(path).tensors
              if t.name.startswith("blk.") and t.name.split(".")[2] in EXPERT_TENSORS}
    return sorted(blocks)


def expert_bytes(path: str | Path) -> list[int]:
    """w_l: the bytes of one expert of each MoE layer (gate, up and down summed), in the file's types. [L]"""
    N = moe_shape(path)["num_experts"]
    if N is None:
        raise ValueError(f"{path} holds no expert tensors (a dense model); the MoE cost model needs an MoE GGUF")
    per_layer: dict[int, int] = {}
    for t in reader(path).tensors:
        parts = t.name.split(".")
        if parts[0] == "blk" and parts[2] in EXPERT_TENSORS:
            per_layer[int(parts[1])] = per_layer.get(int(parts[1]), 0) + int(t.n_bytes) // N
    return [per_layer[l] for l in sorted(per_layer)]


def identity(path: str | Path) -> dict[str, Any]:
    """The lineage identity of a GGUF file (`bench.lineage.IDENTITY` plus "experts"): its file name
    (the same file given by a relative or an absolute path is one model), fingerprint, the expert
    weights' type as dtype, and N, m, L."""
    return {"model": Path(path).name, "fingerprint": fingerprint(path),
            "dtype": weight_type(path), "experts": ENGINE, **moe_shape(path)}
