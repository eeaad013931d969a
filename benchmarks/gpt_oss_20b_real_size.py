"""The chain at real size on gpt-oss-20b's shape (issue 51, item 3): a GGUF file with the full shape of
gpt-oss-20b (24 layers, hidden 2880, 32 experts of 2880, top-4, 64 attention heads of 64 over 8 KV heads,
biases and attention sinks, sliding window 128 on every other layer, YaRN RoPE; transformers' defaults
are the real config), random weights, SmolLM2's vocabulary of 49152 instead of 201088 (a smaller file),
written by llama.cpp's converter (about 11 GB), then `moespec demo --model FILE.gguf`.

The experts are written as the real checkpoint ships them, MXFP4 (`*_blocks` uint8 [E, rows, cols/32, 16],
`*_scales` uint8 E8M0 [E, rows, cols/32], config `quantization_config.quant_method = "mxfp4"`): random
4-bit codes under one scale 2^-7 (std 0.023, about the N(0, 0.02) of the other scripts); the rest bf16
(matrices N(0, 0.02), token embeddings N(0, 0.3), norms 1, biases and sinks 0). llama.cpp's converter
copies MXFP4 as it is and writes the rest in q8_0 (`--outtype q8_0`), the layout of the MXFP4 GGUF files
gpt-oss users run. The disk: the checkpoint is 12 GB (bf16 experts would be 38 GB, and an f16 GGUF
another 42 GB: not within the machine's 66 GB free); it is removed as soon as the GGUF exists; the peak is
23 GB. q4_k (`--kind q4_k`, llama.cpp's quantizer, Q4_K_M) is offered but not the default: every row of
2880 is not whole 256-blocks, so llama.cpp writes nearly every tensor in q4_k's fallback q5_0 (5.5 bits
against MXFP4's 4.25: a larger file that no user runs). Each step is skipped when its output (or a later
one) exists, under ~/.cache/moespec/gpt-oss-20b (resumable):

  checkpoint  GptOssForCausalLM, one safetensors shard per layer, drawn tensor by tensor
  convert     llama.cpp's convert_hf_to_gguf.py to q8_0 (MXFP4 experts kept); the checkpoint is then removed
  quantize    only with --kind q4_k: llama.cpp's quantizer (the converter's file removed unless --keep)
  chain       `moespec demo --model FILE.gguf --threads T` in a subprocess: wall time, peak memory, scores

    python benchmarks/gpt_oss_20b_real_size.py --prepare-only --out benchmarks/results/gpt_oss_20b_real_size/gpt_oss_20b_real_size.json
    python benchmarks/gpt_oss_20b_real_size.py --tiny --prepare-only --out /tmp/gpt-oss-tiny.json   # the check

What random routers change against a real model's reuse (paper, Figure 1) is measured, not assumed: the
chain records ρ(n) per layer (on the OLMoE-1B-7B-shaped file of the same recipe the random deep layers
reused experts more than the real model: BENCHMARKS.md, "The chain at real size").
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("deepseek_v2_lite_real_size", HERE / "deepseek_v2_lite_real_size.py")
deepseek = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(deepseek)
olmoe = deepseek.olmoe

SHAPE = dict(hidden_size=2880, intermediate_size=2880, num_hidden_layers=24, num_local_experts=32, num_experts_per_tok=4,
             num_attention_heads=64, num_key_value_heads=8, head_dim=64, vocab_size=49152, sliding_window=128,
             max_position_embeddings=131072)
TINY = {**SHAPE, "hidden_size": 256, "intermediate_size": 256, "num_hidden_layers": 2, "num_local_experts": 8,
        "num_attention_heads": 4, "num_key_value_heads": 2}  # the check: narrow, 2 layers
MXFP4_SCALE = 120  # E8M0 exponent byte: 2^(120 - 127); codes uniform over E2M1's 16 values give std 0.023
MXFP4 = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                            "model.embed_tokens", "lm_head"]}


def layer_tensors(l: int, s: dict = SHAPE) -> dict[str, tuple[int, ...]]:
    """The checkpoint's tensors of decoder layer l of shape s, as gpt-oss-20b's checkpoint names them
    (experts in MXFP4 blocks and scales, gate and up interleaved along the rows): name -> shape."""
    H, F, E = s["hidden_size"], s["intermediate_size"], s["num_local_experts"]
    heads, kv, d = s["num_attention_heads"], s["num_key_value_heads"], s["head_dim"]
    p = f"model.layers.{l}."
    out = {p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
           p + "self_attn.sinks": (heads,), p + "mlp.router.weight": (E, H), p + "mlp.router.bias": (E,)}
    for x, rows in (("q", heads * d), ("k", kv * d), ("v", kv * d)):
        out.update({p + f"self_attn.{x}_proj.weight": (rows, H), p + f"self_attn.{x}_proj.bias": (rows,)})
    out.update({p + "self_attn.o_proj.weight": (H, heads * d), p + "self_attn.o_proj.bias": (H,)})
    e = p + "mlp.experts."
    for name, rows, cols in (("gate_up_proj", 2 * F, H), ("down_proj", H, F)):
        out.update({e + f"{name}_blocks": (E, rows, cols // 32, 16), e + f"{name}_scales": (E, rows, cols // 32),
                    e + f"{name}_bias": (E, rows)})
    return out


def draw(key: str, shape: tuple[int, ...], g):
    """One tensor of the checkpoint (module docstring): MXFP4 codes and scales, norms 1, biases and sinks 0,
    token embeddings N(0, EMBEDDING_STD), other matrices N(0, STD), bf16."""
    import torch

    if key.endswith("_blocks"):
        return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    if key.endswith("_scales"):
        return torch.full(shape, MXFP4_SCALE, dtype=torch.uint8)
    if key.endswith("norm.weight"):
        return torch.ones(shape, dtype=torch.bfloat16)
    if key.endswith("bias") or key.endswith("sinks"):
        return torch.zeros(shape, dtype=torch.bfloat16)
    std = olmoe.EMBEDDING_STD if key == "model.embed_tokens.weight" else olmoe.STD
    return (torch.randn(shape, generator=g) * std).to(torch.bfloat16)


def make_checkpoint(folder: Path, s: dict = SHAPE, seed: int = 0) -> None:
    """The random-initialized GptOssForCausalLM checkpoint of shape s, one shard per layer (module docstring)."""
    import torch
    import transformers
    from safetensors.torch import save_file

    from moespec.models import gguf

    tok = gguf.tokenizer(gguf.SMOLLM2)
    config = transformers.GptOssConfig(**s, initializer_range=olmoe.STD, tie_word_embeddings=False,
                                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    config.architectures, config.dtype, config.quantization_config = ["GptOssForCausalLM"], "bfloat16", MXFP4
    folder.mkdir(parents=True, exist_ok=True)
    V, H = s["vocab_size"], s["hidden_size"]
    shards = {"outer": {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H)}}
    shards.update({f"layer{l:02d}": layer_tensors(l, s) for l in range(s["num_hidden_layers"])})
    index = {"metadata": {}, "weight_map": {}}
    g = torch.Generator().manual_seed(seed)
    for i, tensors in enumerate(shards.values()):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({key: draw(key, shape, g) for key, shape in tensors.items()}, str(folder / name),
                  metadata={"format": "pt"})
        index["weight_map"].update(dict.fromkeys(tensors, name))
        print(f"  {name}: {len(tensors)} tensors", flush=True)
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    config.save_pretrained(folder)
    tok.save_pretrained(folder)


def prepare(folder: Path, converted: Path, out: Path, s: dict, threads: int, keep: bool, record=print) -> None:
    """`out`: the checkpoint of shape s converted by llama.cpp's converter (the checkpoint then removed),
    quantized by llama.cpp's quantizer when `out` is not the converter's file; a step is skipped when its
    output or a later one exists (a run resumes); each step's seconds go to `record` as it ends."""
    from moespec.backends.llama_lib import quantize
    from moespec.models.llama_convert import convert

    seconds: dict[str, float] = {}
    partial = out.with_name(out.name + ".partial")
    steps = [("checkpoint", lambda: (folder / "config.json").exists() or converted.exists(),
              lambda: make_checkpoint(folder, s)),
             ("convert", converted.exists, lambda: convert(folder, converted, "q8_0"))]
    if out != converted:
        steps.append(("quantize", out.exists, lambda: quantize(converted, partial, "q4_k", threads=threads).replace(out)))
    for name, done, step in steps:
        if not out.exists() and not done():
            print(f"[{name}] {time.strftime('%H:%M:%S')}", flush=True)
            t0 = time.perf_counter()
            step()
            seconds[name] = time.perf_counter() - t0
            record(seconds)
        if name == "convert" and converted.exists():
            shutil.rmtree(folder, ignore_errors=True)
    if out != converted and not keep:
        converted.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="default ~/.cache/moespec/gpt-oss-20b (gpt-oss-20b-tiny with --tiny)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kind", choices=("mxfp4", "q4_k"), default="mxfp4",
                        help="mxfp4: the converter's file (MXFP4 experts, q8_0 rest); q4_k: quantized further")
    parser.add_argument("--keep", action="store_true", help="with --kind q4_k, keep the converter's file")
    parser.add_argument("--prepare-only", action="store_true", help="stop once the file is written")
    parser.add_argument("--tiny", action="store_true", help="the shape narrowed (2 layers, 8 experts): the check")
    args = parser.parse_args()
    shape = TINY if args.tiny else SHAPE
    tag = "gpt-oss-20b" + ("-tiny" if args.tiny else "")
    work = args.work_dir or Path.home() / ".cache" / "moespec" / tag
    work.mkdir(parents=True, exist_ok=True)
    folder, converted = work / "checkpoint", work / f"{tag}-shaped-mxfp4.gguf"
    final = converted if args.kind == "mxfp4" else work / f"{tag}-shaped-q4_k.gguf"
    result: dict = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.update(shape=shape, kind=args.kind, threads=args.threads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    deepseek.make_then_chain(result, args, (folder, converted, final), shape, work, prepare)


if __name__ == "__main__":
    sys.exit(main())
