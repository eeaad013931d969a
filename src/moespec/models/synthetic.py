"""Seeded synthetic presets: small random-init models of real transformers architectures.

Each preset is a transformers config of a real architecture, shrunk, with the byte tokenizer's
vocabulary (259 real ids, padded to 272 so tests can check padded ids are never produced). The
`*-shaped` presets keep a real model's expert widths for timing; the `*-tiny` ones are for tests.

>>> model, tok = build("olmoe-tiny", seed=0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import transformers

from moespec.device import resolve_dtype
from moespec.models.tokenizer import BOS_ID, EOS_ID, PAD_ID, ByteTokenizer
from moespec.moe import registry

VOCAB = 272  # the byte tokenizer's 259 ids, padded to a multiple of 16
# Common small attention stack; rope and a long position range so depth-4096 prompts fit.
_BASE = dict(
    vocab_size=VOCAB,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=8192,
    bos_token_id=BOS_ID,
    eos_token_id=EOS_ID,
    pad_token_id=PAD_ID,
    tie_word_embeddings=False,
    initializer_range=0.08,  # wider than the default 0.02: well-separated logits, no near-ties in greedy tests
)


@dataclass(frozen=True)
class Preset:
    """A preset: its architecture's config class and the keyword arguments of its config."""

    config_class: Callable
    kwargs: dict
    layers_key: str = "num_hidden_layers"
    experts_key: str | None = None  # None for dense models
    description: str = ""
    # Token embeddings re-drawn at this std (None: the config's). At 0.02 every token routes alike
    # (rho(2) 0.6-0.9); at 0.3 routing follows the token, rho(2) 0.33-0.45 per layer, near a trained
    # OLMoE's 0.36 (cost-model paper, Sec. 2).
    embedding_std: float | None = None


PRESETS: dict[str, Preset] = {
    "dense-tiny": Preset(
        transformers.LlamaConfig,
        dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, head_dim=16),
        description="Llama-style dense causal LM, the usual draft",
    ),
    "olmoe-tiny": Preset(
        transformers.OlmoeConfig,
        dict(hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_experts=16, num_experts_per_tok=4),
        experts_key="num_experts",
        description="OLMoE: 16 experts, top-4",
    ),
    "qwen3moe-tiny": Preset(
        transformers.Qwen3MoeConfig,
        dict(
            hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
            num_experts=16, num_experts_per_tok=4, head_dim=16, norm_topk_prob=True,
        ),
        experts_key="num_experts",
        description="Qwen3-MoE: 16 experts, top-4, normalized top-k weights",
    ),
    "mixtral-tiny": Preset(
        transformers.MixtralConfig,
        dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2, head_dim=16),
        experts_key="num_local_experts",
        description="Mixtral: 8 experts, top-2",
    ),
    "deepseekv2-tiny": Preset(
        transformers.DeepseekV2Config,
        dict(
            hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
            n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1, first_k_dense_replace=0,
            kv_lora_rank=16, q_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
            head_dim=8, num_key_value_heads=4,
        ),
        experts_key="n_routed_experts",
        description="DeepSeek-V2: 16 routed experts, top-4, one shared expert, MLA attention",
    ),
    "gptoss-tiny": Preset(
        transformers.GptOssConfig,
        dict(
            hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2,
            head_dim=16, layer_types=["full_attention", "full_attention"], sliding_window=4096,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
        experts_key="num_local_experts",
        description="gpt-oss: biases, transposed interleaved gate/up, clamped gate activation",
    ),
    "olmoe-shaped": Preset(
        transformers.OlmoeConfig,
        dict(
            hidden_size=2048, intermediate_size=1024, num_hidden_layers=2, num_experts=64, num_experts_per_tok=8,
            num_attention_heads=16, num_key_value_heads=16, initializer_range=0.02,
        ),
        embedding_std=0.3,
        experts_key="num_experts",
        description="OLMoE's widths for timing: hidden 2048, 64 experts x 1024, top-8 (2 layers by default)",
    ),
    "qwen3moe-shaped": Preset(
        transformers.Qwen3MoeConfig,
        dict(
            hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=2,
            num_experts=128, num_experts_per_tok=8, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
            initializer_range=0.02, norm_topk_prob=True,  # as Qwen3-30B-A3B (and llama.cpp's qwen3moe)
        ),
        embedding_std=0.3,
        experts_key="num_experts",
        description="Qwen3-30B-A3B's widths for timing: hidden 2048, 128 experts x 768, top-8 (2 layers)",
    ),
    "mixtral-shaped": Preset(
        transformers.MixtralConfig,
        dict(
            hidden_size=1024, intermediate_size=3584, num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2,
            num_attention_heads=8, num_key_value_heads=2, head_dim=128, initializer_range=0.02,
        ),
        embedding_std=0.3,
        experts_key="num_local_experts",
        description="Mixtral's expert count and top-2 at a quarter of its widths, for timing (2 layers)",
    ),
}


def preset_names() -> list[str]:
    return sorted(PRESETS)


def config(name: str, *, layers: int | None = None, experts: int | None = None, **overrides) -> transformers.PretrainedConfig:
    """The transformers config of preset `name`, with optional overrides."""
    if name not in PRESETS:
        raise ValueError(f"unknown synthetic preset {name!r}; presets: {', '.join(preset_names())}")
    preset = PRESETS[name]
    kwargs = {**_BASE, **preset.kwargs}
    if layers is not None:
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        kwargs[preset.layers_key] = layers
        if "layer_types" in kwargs:
            kwargs["layer_types"] = ["full_attention"] * layers
    if experts is not None:
        if preset.experts_key is None:
            raise ValueError(f"preset {name!r} is dense; it has no experts to override")
        if experts < kwargs["num_experts_per_tok"]:
            raise ValueError(f"experts={experts} is below top-k={kwargs['num_experts_per_tok']} of preset {name!r}")
        kwargs[preset.experts_key] = experts
    kwargs.update(overrides)
    return preset.config_class(**kwargs)


def build(
    name: str,
    seed: int = 0,
    *,
    layers: int | None = None,
    experts: int | None = None,
    dtype: str | torch.dtype | None = None,
    **overrides,
) -> tuple[transformers.PreTrainedModel, ByteTokenizer]:
    """A seeded random-init model of preset `name` and the shared byte tokenizer.

    The same (name, seed, overrides) always gives the same weights. The model is in eval mode on
    the CPU, in `dtype` (float32 by default), and accepts moespec's experts implementations.
    """
    registry.register()
    cfg = config(name, layers=layers, experts=experts, **overrides)
    torch_dtype = resolve_dtype(dtype)
    cfg.dtype = torch_dtype
    cfg.moespec_vocab_limit = ByteTokenizer.vocab_size  # ids from here to VOCAB are padding, never sampled
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(cfg)
        std = PRESETS[name].embedding_std
        if std is not None:
            torch.nn.init.normal_(model.get_input_embeddings().weight, std=std)
    model = model.to(torch_dtype).eval()
    model.requires_grad_(False)
    model.name_or_path = f"synthetic:{name}"
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.eos_token_id = EOS_ID
    return model, ByteTokenizer()
