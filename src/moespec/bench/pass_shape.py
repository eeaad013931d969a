"""What one llama.cpp pass runs outside its weight products and routed experts, read from a GGUF
header and tensor list without llama.cpp (`PassShape`): the shapes `bench.ggml_rest_op` builds its
graph with, the way llama.cpp's graph derives them (src/llama-model.cpp, src/models/*.cpp)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from moespec.models import gguf_info

ROPE_NORM, ROPE_NEOX = 0, 2  # GGML_ROPE_TYPE_*: llama_model_rope_type gives NORM to these, NEOX to the rest
ROPE_NORM_ARCHS = frozenset({"llama", "deepseek", "deepseek2", "granite", "granitemoe"})
SWA_EVEN_BLOCKS = frozenset({"gpt-oss"})  # its sliding window on blocks 0, 2, 4, ... (load_swa_pattern(2))
NORM_WEIGHT = re.compile(r"blk\.(\d+)\.(\w*norm)\.weight")
FFN_GATE = re.compile(r"blk\.(\d+)\.ffn_gate(_shexp)?\.weight")  # a dense FFN's or the shared experts' SwiGLU
BIAS = re.compile(r"blk\.(\d+)\.(\w+)\.bias")  # a product's bias, added over n rows (not an expert's: `ggml_expert_op`)
ABSORBED = re.compile(r"blk\.(\d+)\.attn_[kv]_b\.weight")  # DeepSeek's per-head products of absorbed MLA


def _scalar(value):
    return value[0] if isinstance(value, list) else value  # a per-layer array: its first block's value


@dataclass(frozen=True)
class PassShape:
    """What one pass runs outside its products, read from a GGUF header (module docstring).

    norms: (block, name, width, rows per token), block −1 for the final norm; ffn: (block, width)
    of each SwiGLU outside the routed experts; swa_blocks: the blocks with the sliding `window`;
    biases: (block, name, width); mla: (nope, kv_lora_rank, value head) of absorbed multi-head latent
    attention (`attn_k_b`, `attn_v_b`: a cache of keys only, values a view of their first columns), or None.
    """

    architecture: str
    blocks: int
    hidden: int
    heads: int
    kv_heads: int
    head_k: int
    head_v: int
    rope_dims: int
    rope_mode: int
    freq_base: float
    eps: float
    experts: int
    top_k: int
    moe_blocks: tuple[int, ...]
    window: int | None
    swa_blocks: tuple[int, ...]
    norms: tuple[tuple[int, str, int, int], ...]
    ffn: tuple[tuple[int, int], ...]
    biases: tuple[tuple[int, str, int], ...] = ()
    mla: tuple[int, int, int] | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def pass_shape(path: str | Path) -> PassShape:
    """The `PassShape` of a GGUF file; ValueError naming a missing header key."""
    arch = gguf_info.field(path, "general.architecture")
    key = lambda name, default=None: _scalar(gguf_info.field(path, f"{arch}.{name}", default))  # noqa: E731
    hidden, blocks, heads = key("embedding_length"), key("block_count"), key("attention.head_count")
    missing = [k for k, v in (("embedding_length", hidden), ("block_count", blocks), ("attention.head_count", heads))
               if not v]
    if arch is None or missing:
        raise ValueError(f"{path} has no {arch or 'general.architecture'}.{missing[0] if missing else ''} key; convert "
                         "it again with llama.cpp's convert_hf_to_gguf.py, which writes the attention shapes")
    hidden, blocks, heads = int(hidden), int(blocks), int(heads)
    kv_heads = int(key("attention.head_count_kv", heads))
    head_k = int(key("attention.key_length", hidden // heads))
    head_v = int(key("attention.value_length", head_k))
    try:
        lay = gguf_info.layout(path)
        experts, top_k, moe = lay.num_experts, lay.top_k, lay.moe_layers
    except ValueError:  # a dense file: no router
        experts, top_k, moe = 0, 0, ()
    window = key("attention.sliding_window") if arch in SWA_EVEN_BLOCKS else None
    tensors = gguf_info.tensors(path)
    per_token = {"attn_q_norm": heads * head_k, "attn_k_norm": kv_heads * head_k}
    norms = [(int(h.group(1)), h.group(2), int(t.shape[0]), max(1, per_token.get(h.group(2), 0) // int(t.shape[0])))
             for name, t in tensors.items() if (h := NORM_WEIGHT.fullmatch(name)) and len(t.shape) == 1]
    if "output_norm.weight" in tensors:
        norms.append((-1, "output_norm", int(tensors["output_norm.weight"].shape[0]), 1))
    ffn = [(int(h.group(1)), int(t.shape[1])) for name, t in tensors.items() if (h := FFN_GATE.fullmatch(name))]
    biases = [(int(h.group(1)), h.group(2), int(t.shape[0])) for name, t in tensors.items()
              if (h := BIAS.fullmatch(name)) and len(t.shape) == 1 and not gguf_info.EXPERT_TENSOR.fullmatch(name)]
    k_b, v_b = (next((t for name, t in tensors.items() if name.endswith(f".attn_{x}_b.weight")), None) for x in "kv")
    mla = None if k_b is None or v_b is None else (int(k_b.shape[0]), int(k_b.shape[1]), int(v_b.shape[1]))
    return PassShape(architecture=arch, blocks=blocks, hidden=hidden, heads=heads, kv_heads=kv_heads, head_k=head_k,
                     head_v=head_v, rope_dims=int(key("rope.dimension_count", head_k)),
                     rope_mode=ROPE_NORM if arch in ROPE_NORM_ARCHS else ROPE_NEOX,
                     freq_base=float(key("rope.freq_base", 10000.0)),
                     eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)), experts=experts, top_k=top_k,
                     moe_blocks=tuple(moe), window=None if window is None else int(window),
                     swa_blocks=tuple(range(0, blocks, 2)) if window else (), norms=tuple(sorted(norms)),
                     ffn=tuple(sorted(ffn)), biases=tuple(sorted(biases)), mla=mla)


def rest_tensors(path: str | Path) -> list:
    """The file's tensors the rest of a pass reads: every norm weight, every 1-D bias but the experts',
    and DeepSeek's absorbed per-head products."""
    return [t for name, t in gguf_info.tensors(path).items()
            if ((NORM_WEIGHT.fullmatch(name) or name == "output_norm.weight" or BIAS.fullmatch(name))
                and len(t.shape) == 1 and not gguf_info.EXPERT_TENSOR.fullmatch(name))
            or (ABSORBED.fullmatch(name) and len(t.shape) == 3)]
