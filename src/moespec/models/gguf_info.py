"""What the cost-model chain needs to know of a GGUF file, read from its header without llama.cpp.

One cached reader (`reader`) serves every caller. From it:

- `identity`: the file's lineage identity (`lineage` fields: the file's name, its fingerprint
  `provenance.file_fingerprint`, the expert weights' type, N, m, L);
- `layout`: the MoE layout llama.cpp runs, for every MoE architecture it knows that names its
  expert tensors `blk.<l>.ffn_*_exps.*` (olmoe, qwen2moe, qwen3moe, llama/Mixtral, deepseek2,
  gpt-oss, granitemoe, ...): N and m from `<arch>.expert_count` and `<arch>.expert_used_count`, the
  MoE layers (blocks holding expert tensors; leading dense blocks such as DeepSeek's
  `first_k_dense_replace` hold none), the bytes w_l of one expert of each MoE layer summed over its
  expert tensors in their own types (gate, up, down or a merged gate_up, biases included: a q8_0
  expert is about a quarter of an f32 one), the bytes every pass reads once besides the routed
  experts (shared experts `ffn_*_shexp`, the dense FFN of leading dense blocks), and the routing's
  expert groups where the file uses them.

A file it cannot read as an MoE model is refused with a ValueError naming what is missing.
"""

from __future__ import annotations

import re
import struct
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from moespec.provenance import file_fingerprint

ENGINE = "llama.cpp"  # the "experts" field of the identity: llama.cpp runs its own grouped kernel
GGUF_HINT = "pip install gguf (the GGUF reader of llama.cpp's gguf-py)"
EXPERT_TENSOR = re.compile(r"blk\.(\d+)\.ffn_(gate_up|gate|up|down)_exps\.(weight|bias|scale)")
SHARED_TENSOR = re.compile(r"blk\.(\d+)\.ffn_\w*shexp\.(weight|bias|scale)")
DENSE_FFN = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)\.(weight|bias)")
# llama.cpp's activation of the routed experts where it is not SwiGLU (`build_moe_ffn`'s type_op)
ACTIVATIONS = {"gpt-oss": "swiglu_oai", "grok": "gelu"}


@lru_cache(maxsize=8)
def _reader(path: str, mtime_ns: int):
    try:
        import gguf
    except ImportError as e:
        raise ValueError(f"reading {path} needs the gguf package ({e}); install it with: {GGUF_HINT}") from None
    try:
        return gguf.GGUFReader(path)
    except (ValueError, OSError, IndexError, KeyError, OverflowError, struct.error) as e:  # a cut or edited header
        raise ValueError(f"{path} is not a readable GGUF file ({e}); convert the model again with llama.cpp's "
                         "convert_hf_to_gguf.py or `moespec export-gguf`") from None


def reader(path: str | Path):
    """The (cached) gguf.GGUFReader of `path`; a changed file is read again."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"GGUF file {str(path)!r} not found; give the path of a .gguf file")
    return _reader(str(p.resolve()), p.stat().st_mtime_ns)


def forget() -> None:
    """Close every cached reader. A reader maps its whole file, and the pages of every tensor read
    through it stay in the process's resident memory while it is open (a characterization reads a 7B
    file's expert and dense tensors: about 1 GB), so the chain closes them once its steps are done (a
    `ggml_graph.GraphOwner` keeps the map of the tensors it reads in place open by itself)."""
    _reader.cache_clear()


def field(path: str | Path, key: str, default: Any = None) -> Any:
    """The metadata value `key` ("general.architecture", "olmoe.expert_count", ...) or `default`."""
    f = reader(path).fields.get(key)
    return default if f is None else f.contents()


def tensors(path: str | Path) -> dict:
    """{name: gguf ReaderTensor} of the file, in file order."""
    return {t.name: t for t in reader(path).tensors}


def fingerprint(path: str | Path) -> str:
    """The file's identity (`provenance.file_fingerprint`)."""
    return file_fingerprint(path)


def weight_type(path: str | Path) -> str:
    """The type of the file's expert weights ("q8_0", "q4_k", "f16", ...), else of its first 2-D tensor."""
    found = list(reader(path).tensors)
    experts = [t for t in found if EXPERT_TENSOR.fullmatch(t.name) and t.name.endswith("exps.weight")]
    first = experts or [t for t in found if len(t.shape) >= 2] or found
    return first[0].tensor_type.name.lower()


@dataclass(frozen=True)
class MoELayout:
    """The MoE layout of a GGUF file (module docstring). Byte counts are in the file's own types.

    moe_layers: block indices of the MoE layers, [L]; expert_bytes: w_l, one expert of each, [L];
    shared_bytes: what each MoE block reads once per pass besides its routed experts (shared
    experts and their gate), [L]; dense_blocks: blocks with a dense FFN and no experts.
    """

    architecture: str
    num_experts: int
    top_k: int
    blocks: int
    moe_layers: tuple[int, ...]
    expert_bytes: tuple[int, ...]
    shared_bytes: tuple[int, ...]
    dense_blocks: tuple[int, ...]
    hidden: int
    expert_ffn: int
    merged_gate_up: bool
    has_gate: bool
    expert_biases: bool
    activation: str
    expert_groups: int
    groups_used: int
    weight_type: str

    @property
    def num_layers(self) -> int:
        return len(self.moe_layers)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(path: Path, key: str, default: int | None = None) -> int | None:
    value = field(path, key, default)
    return None if value is None else int(value)


def layout(path: str | Path) -> MoELayout:
    """The MoE layout of the file; ValueError naming what is missing when it is not an MoE model."""
    path = Path(path).expanduser()
    arch = field(path, "general.architecture")
    if arch is None:
        raise ValueError(f"{path} has no general.architecture key; it is not a GGUF model file")
    found = tensors(path)
    parts: dict[int, dict[str, list]] = {}
    for name, t in found.items():
        hit = EXPERT_TENSOR.fullmatch(name)
        if hit:
            parts.setdefault(int(hit.group(1)), {}).setdefault(hit.group(2), []).append(t)
    N, m = _int(path, f"{arch}.expert_count"), _int(path, f"{arch}.expert_used_count")
    if not parts:
        raise ValueError(f"{path} ({arch}) holds no expert tensors (blk.N.ffn_*_exps.weight): it is a dense model, "
                         "and this step of the MoE cost model needs an MoE GGUF file (`moespec demo --model "
                         f"{path.name}` runs the chain for a dense file)")
    missing = [k for k, v in ((f"{arch}.expert_count", N), (f"{arch}.expert_used_count", m)) if not v]
    if missing:
        raise ValueError(f"{path} ({arch}) has expert tensors but no {' or '.join(missing)} metadata; convert it again "
                         "with llama.cpp's convert_hf_to_gguf.py, which writes both")
    layers = sorted(parts)
    for l in layers:
        kinds = set(parts[l])
        if "down" not in kinds or not ({"up", "gate_up"} & kinds):
            raise ValueError(f"{path} ({arch}) block {l} has expert tensors {sorted(kinds)}; an MoE layer needs "
                             "ffn_down_exps and ffn_up_exps (or a merged ffn_gate_up_exps)")
        for t in (t for ts in parts[l].values() for t in ts):
            if int(t.shape[-1]) != N:
                raise ValueError(f"{path} ({arch}): {t.name} has shape {[int(d) for d in t.shape]} (ggml order), whose "
                                 f"last dimension is not the {N} experts of {arch}.expert_count")
    shared = {l: 0 for l in layers}
    for name, t in found.items():
        hit = SHARED_TENSOR.fullmatch(name)
        if hit and int(hit.group(1)) in shared:
            shared[int(hit.group(1))] += int(t.n_bytes)
    first = parts[layers[0]]
    up = (first.get("up") or first["gate_up"])[0]
    merged = "gate_up" in first
    hidden, ffn = int(up.shape[0]), int(up.shape[1]) // (2 if merged else 1)
    dense = sorted({int(h.group(1)) for h in map(DENSE_FFN.fullmatch, found) if h} - set(layers))
    return MoELayout(
        architecture=arch, num_experts=N, top_k=m, blocks=_int(path, f"{arch}.block_count", max(layers) + 1),
        moe_layers=tuple(layers),
        expert_bytes=tuple(sum(int(t.n_bytes) for ts in parts[l].values() for t in ts) // N for l in layers),
        shared_bytes=tuple(shared[l] for l in layers), dense_blocks=tuple(dense), hidden=hidden, expert_ffn=ffn,
        merged_gate_up=merged, has_gate=merged or "gate" in first,
        expert_biases=any(t.name.endswith(".bias") for ts in first.values() for t in ts),
        activation=ACTIVATIONS.get(arch, "silu"), expert_groups=_int(path, f"{arch}.expert_group_count", 1) or 1,
        groups_used=_int(path, f"{arch}.expert_group_used_count", 1) or 1, weight_type=weight_type(path))


def is_dense(path: str | Path) -> bool:
    """True for a language model file without routed experts (no blk.N.ffn_*_exps tensor)."""
    return not any(EXPERT_TENSOR.fullmatch(name) for name in tensors(Path(path).expanduser()))


def moe_shape(path: str | Path) -> dict[str, int | None]:
    """{"num_experts": N, "top_k": m, "num_layers": L (MoE layers)}; every value None for a dense file."""
    try:
        lay = layout(path)
    except ValueError:
        return {"num_experts": None, "top_k": None, "num_layers": None}
    return {"num_experts": lay.num_experts, "top_k": lay.top_k, "num_layers": lay.num_layers}


def expert_layers(path: str | Path) -> list[int]:
    """The block indices that hold expert tensors, ascending."""
    return list(layout(path).moe_layers)


def expert_bytes(path: str | Path) -> list[int]:
    """w_l: the bytes of one expert of each MoE layer, in the file's types (`MoELayout.expert_bytes`). [L]"""
    return list(layout(path).expert_bytes)


def identity(path: str | Path) -> dict[str, Any]:
    """The lineage identity of a GGUF file (`lineage.IDENTITY` plus "experts"): its file name
    (the same file given by a relative or an absolute path is one model), fingerprint, the expert
    weights' type as dtype, and N, m, L. A header whose expert counts contradict each other is refused
    first, naming them (`gguf_header.check_moe_fields`), before any comparison with another artifact."""
    from moespec.backends.gguf_header import check_moe_fields

    check_moe_fields(path)
    return {"model": Path(path).name, "fingerprint": fingerprint(path),
            "dtype": weight_type(path), "experts": ENGINE, **moe_shape(path)}
