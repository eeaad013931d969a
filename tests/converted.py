"""GGUF files no one here wrote: small random-initialized transformers checkpoints of real MoE
architectures, converted by llama.cpp's own converter (`convert_hf_to_gguf.py` from the installed
llama-cpp-python's sdist), built once per machine under ~/.cache/moespec/converted and reused.

Each checkpoint uses SmolLM2's tokenizer (one the converter knows), hidden size 64 and 2-3 layers;
token embeddings are drawn at std 0.3, so that routing follows the token (`models.synthetic`).
Written types: f32 and f16 (routing against transformers') and q8_0 (the converter's own).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

TYPES = ("f32", "f16", "q8_0")
RECIPE_VERSION = 1  # bump when a recipe changes: the cache key holds it
# transformers config class, keyword arguments; llama.cpp's architecture name beside it
RECIPES: dict[str, tuple[str, dict, str]] = {
    "olmoe": ("OlmoeConfig", dict(intermediate_size=32, num_experts=16, num_experts_per_tok=4,
                                  num_key_value_heads=4), "olmoe"),
    "qwen2moe": ("Qwen2MoeConfig", dict(intermediate_size=128, moe_intermediate_size=32, num_experts=16,
                                        num_experts_per_tok=4, shared_expert_intermediate_size=64), "qwen2moe"),
    "qwen3moe": ("Qwen3MoeConfig", dict(intermediate_size=128, moe_intermediate_size=32, num_experts=16,
                                        num_experts_per_tok=4, head_dim=16, norm_topk_prob=True), "qwen3moe"),
    "mixtral": ("MixtralConfig", dict(intermediate_size=64, num_local_experts=8, num_experts_per_tok=2, head_dim=16),
                "llama"),
    "deepseek2": ("DeepseekV2Config", dict(intermediate_size=128, moe_intermediate_size=32, n_routed_experts=16,
                                           num_experts_per_tok=4, n_shared_experts=1, first_k_dense_replace=1,
                                           kv_lora_rank=16, q_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                           v_head_dim=16, head_dim=8, num_key_value_heads=4, num_hidden_layers=3),
                  "deepseek2"),
    "gpt-oss": ("GptOssConfig", dict(intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, head_dim=16,
                                     layer_types=["sliding_attention", "full_attention"], sliding_window=128),
                "gpt-oss"),
    "granitemoe": ("GraniteMoeConfig", dict(intermediate_size=32, num_local_experts=8, num_experts_per_tok=2),
                   "granitemoe"),
}
COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=4096, tie_word_embeddings=False)
EMBEDDING_STD = 0.3


def cache_key() -> str:
    versions = [importlib.metadata.version(p) for p in ("transformers", "llama-cpp-python", "torch")]
    text = json.dumps([RECIPE_VERSION, versions, {k: [v[0], v[1]] for k, v in RECIPES.items()}, COMMON], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def checkpoint(arch: str, folder: Path, tokenizer, seed: int = 0) -> Path:
    """The random-initialized checkpoint of `arch` in `folder` (config, safetensors, tokenizer)."""
    import torch
    import transformers

    config_class, kwargs, _ = RECIPES[arch]
    config = getattr(transformers, config_class)(**{**COMMON, **kwargs}, vocab_size=len(tokenizer),
                                                 bos_token_id=tokenizer.bos_token_id,
                                                 eos_token_id=tokenizer.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config)
        torch.nn.init.normal_(model.get_input_embeddings().weight, std=EMBEDDING_STD)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def build(root: Path) -> dict[str, dict[str, Path]]:
    """{arch: {"checkpoint": folder, "f32" | "f16" | "q8_0": file}} under root/<cache key>, built once."""
    from moespec.models import gguf
    from moespec.models.llama_convert import convert, locked

    folder = root / cache_key()
    files = {arch: {"checkpoint": folder / arch, **{t: folder / f"{arch}-{t}.gguf" for t in TYPES}} for arch in RECIPES}
    with locked(folder.with_name(folder.name + ".lock")):
        tokenizer = None
        for arch, paths in files.items():
            if not (paths["checkpoint"] / "config.json").is_file():
                tokenizer = tokenizer or gguf.tokenizer(gguf.SMOLLM2)
                checkpoint(arch, paths["checkpoint"], tokenizer)
        todo = [(paths["checkpoint"], paths[kind], kind) for paths in files.values() for kind in TYPES
                if not paths[kind].is_file()]
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # each conversion is a process of its own
            list(pool.map(lambda job: convert(*job), todo))
    return files
