"""`moespec export-gguf SPEC OUT.gguf --type T`: a moespec model as a GGUF file llama.cpp decodes.

The weights are written in float32 with the `gguf` package under llama.cpp's tensor names; other
types come from llama.cpp's own quantizer (`backends.llama_lib.quantize`). Architectures:

| transformers | llama.cpp | notes |
| --- | --- | --- |
| OlmoeForCausalLM | olmoe | q/k norms over the whole projection, so no grouped-query attention |
| Qwen3MoeForCausalLM | qwen3moe | llama.cpp always normalizes the top-k weights: norm_topk_prob must be true |
| MixtralForCausalLM, LlamaForCausalLM | llama | q and k rows permuted for llama.cpp's rotary layout |

The byte tokenizer becomes a byte-level BPE vocabulary with no merge that can apply (every byte
one token, ids unchanged, GPT-2's byte-to-character table), its specials control tokens and the output layer's
padding rows unused tokens, with `moespec.vocab_limit` naming the real size. SmolLM2's tokenizer is
copied from its own GGUF file.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch

from moespec.backends.llama_lib import FTYPES, quantize
from moespec.backends.llama_model import VOCAB_LIMIT_KEY
from moespec.models.tokenizer import BOS_ID, EOS_ID, PAD_ID, SPECIALS, ByteTokenizer

ARCHITECTURES = {"OlmoeForCausalLM": "olmoe", "Qwen3MoeForCausalLM": "qwen3moe", "MixtralForCausalLM": "llama",
                 "LlamaForCausalLM": "llama"}
EXPORTABLE = ("trained:olmoe", "trained:draft", "trained:smollm2-draft", "synthetic:olmoe-shaped",
              "synthetic:qwen3moe-shaped", "synthetic:mixtral-shaped")
# llama.cpp's BPE needs a merges key and the gguf package writes no empty array: one merge of two
# bytes (0xC0, 0xC0) that never occur in UTF-8 text, so it never applies and every byte stays a token
NEVER_MERGED = "\u00c0 \u00c0"
LAYER_TENSORS = {  # transformers name in layer i -> llama.cpp name in block i
    "input_layernorm.weight": "attn_norm", "post_attention_layernorm.weight": "ffn_norm",
    "self_attn.q_proj.weight": "attn_q", "self_attn.k_proj.weight": "attn_k", "self_attn.v_proj.weight": "attn_v",
    "self_attn.o_proj.weight": "attn_output", "self_attn.q_norm.weight": "attn_q_norm",
    "self_attn.k_norm.weight": "attn_k_norm", "mlp.gate_proj.weight": "ffn_gate", "mlp.up_proj.weight": "ffn_up",
    "mlp.down_proj.weight": "ffn_down", "mlp.gate.weight": "ffn_gate_inp", "mlp.experts.down_proj": "ffn_down_exps",
}


def export_gguf(spec: str, out: str | Path, kind: str = "f32", *, threads: int | None = None) -> Path:
    """Write model `spec` (a moespec spec, see `models.load`) to `out` as GGUF of type `kind`."""
    from moespec.models import load

    if kind not in FTYPES:
        raise ValueError(f"--type {kind!r} is not one of {', '.join(FTYPES)}")
    model, tok = load(spec, dtype="float32")
    return write_model(model, tok, out, kind, name=spec, threads=threads)


def write_model(model, tokenizer, out: str | Path, kind: str = "f32", *, name: str = "moespec",
                threads: int | None = None) -> Path:
    """Write a transformers model of a supported architecture (table above) as GGUF of type `kind`."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if kind == "f32":
        return _write_f32(model, tokenizer, out, name)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        return quantize(_write_f32(model, tokenizer, Path(tmp, "f32.gguf"), name), out, kind, threads=threads)


def _architecture(config) -> str:
    arch = (config.architectures or [type(config).__name__.replace("Config", "ForCausalLM")])[0]
    if arch not in ARCHITECTURES:
        raise ValueError(f"{arch} has no llama.cpp export here; exportable: {', '.join(ARCHITECTURES)}")
    gguf_arch = ARCHITECTURES[arch]
    if gguf_arch == "olmoe" and config.num_key_value_heads != config.num_attention_heads:
        raise ValueError(f"llama.cpp's olmoe has no grouped-query attention; this model has "
                         f"{config.num_key_value_heads} kv heads for {config.num_attention_heads} heads")
    if gguf_arch == "olmoe" and getattr(config, "norm_topk_prob", False):
        raise ValueError("llama.cpp's olmoe does not normalize the top-k expert weights; norm_topk_prob must be false")
    if gguf_arch == "qwen3moe" and not getattr(config, "norm_topk_prob", False):
        raise ValueError("llama.cpp's qwen3moe normalizes the top-k expert weights; norm_topk_prob must be true")
    return gguf_arch


def _write_f32(model, tokenizer, path: Path, name: str) -> Path:
    import gguf

    config = model.config.get_text_config()
    arch = _architecture(model.config)
    heads, kv_heads, H = config.num_attention_heads, config.num_key_value_heads, config.hidden_size
    head_dim = getattr(config, "head_dim", None) or H // heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(H)
    w.add_block_count(config.num_hidden_layers)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    ffn = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
    w.add_feed_forward_length(config.intermediate_size)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(config.num_experts_per_tok)
        w.add_expert_feed_forward_length(ffn)
    _write_tokenizer(w, tokenizer, model)
    for gguf_name, array in _tensors(model, arch, heads, kv_heads):
        w.add_tensor(gguf_name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _tensors(model, arch: str, heads: int, kv_heads: int):
    """(llama.cpp name, float32 array in transformers' [out, in] order) for every weight."""
    state = {k: v.detach().to(torch.float32).cpu() for k, v in model.state_dict().items()}
    tied = model.config.get_text_config().tie_word_embeddings
    yield "token_embd.weight", state.pop("model.embed_tokens.weight").numpy()
    yield "output_norm.weight", state.pop("model.norm.weight").numpy()
    head = state.pop("lm_head.weight", None)
    if not tied:
        yield "output.weight", head.numpy()
    for key in sorted(state, key=_layer_order):
        if not key.startswith("model.layers."):
            raise ValueError(f"tensor {key} has no place in llama.cpp's {arch} layout")
        i, rest = key[len("model.layers."):].split(".", 1)
        t = state[key]
        if rest == "mlp.experts.gate_up_proj":  # [E, 2I, H], gate rows first
            gate, up = t.chunk(2, dim=1)
            yield f"blk.{i}.ffn_gate_exps.weight", gate.contiguous().numpy()
            yield f"blk.{i}.ffn_up_exps.weight", up.contiguous().numpy()
            continue
        if rest not in LAYER_TENSORS:
            raise ValueError(f"tensor {key} has no place in llama.cpp's {arch} layout")
        if arch == "llama" and rest in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
            t = rotary_pairs(t, heads if "q_proj" in rest else kv_heads)
        yield f"blk.{i}.{LAYER_TENSORS[rest]}.weight", t.numpy()


def _layer_order(key: str) -> tuple:
    parts = key.split(".")
    return (int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else -1, key)


def rotary_pairs(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of a q or k projection [heads * d, in] reordered from transformers' rotary layout (dims i and
    i + d/2 of a head rotate together) to llama.cpp's llama one (dims 2i and 2i + 1 rotate together)."""
    out_dim, in_dim = w.shape
    d = out_dim // heads
    return w.reshape(heads, 2, d // 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def bytes_to_characters() -> list[str]:
    """GPT-2's table: byte b -> the printable character that stands for it in byte-level BPE vocabularies
    (printable Latin-1 bytes stand for themselves, the others for characters from U+0100 on)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def _write_tokenizer(w, tokenizer, model) -> None:
    import gguf

    if isinstance(tokenizer, ByteTokenizer):
        width = model.get_output_embeddings().weight.shape[0]
        names = {v: k for k, v in SPECIALS.items()}
        tokens = bytes_to_characters() + [names[i] for i in range(256, 256 + len(SPECIALS))]
        types = [gguf.TokenType.NORMAL] * 256 + [gguf.TokenType.CONTROL] * len(SPECIALS)
        tokens += [f"<unused{i}>" for i in range(len(tokens), width)]
        types += [gguf.TokenType.UNUSED] * (width - len(types))
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges([NEVER_MERGED])
        w.add_bos_token_id(BOS_ID)
        w.add_eos_token_id(EOS_ID)
        w.add_pad_token_id(PAD_ID)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        w.add_uint32(VOCAB_LIMIT_KEY, ByteTokenizer.vocab_size)
        return
    source = getattr(model.config, "moespec_shared_embedding", None)
    if source == "smollm2":
        from moespec.models.gguf import smollm2_path

        _copy_tokenizer(w, smollm2_path())
        return
    raise ValueError(f"{tokenizer!r} has no GGUF form here; export models with the byte tokenizer or SmolLM2's")


def _copy_tokenizer(w, path: Path) -> None:
    """Every tokenizer.* key of another GGUF file (its vocabulary, merges, specials, chat template)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            values = [_value(field, i, sub) for i in field.data]
            w.add_array(key, values)
        elif kind == gguf.GGUFValueType.STRING:
            w.add_string(key, _value(field, field.data[0], kind))
        else:
            w.add_key_value(key, _value(field, field.data[0], kind), kind)


def _value(field, index: int, kind):
    import gguf

    part = field.parts[index]
    if kind == gguf.GGUFValueType.STRING:
        return bytes(part).decode("utf-8")
    return np.asarray(part).tolist()[0]
