"""The chain at real size on the cost-model paper's own shape (issue 51, item 3): a GGUF file with the full
shape of DeepSeek-V2-Lite (27 layers, the first dense of 10944; 64 routed experts of 1408 and 2 shared,
top-6; hidden 2048; MLA attention of 16 heads, kv_lora_rank 512, no q LoRA, qk_nope 128, qk_rope 64,
v 128; the real config's YaRN RoPE), random weights, SmolLM2's vocabulary of 49152 instead of 102400
(a smaller file), written by llama.cpp's converter and quantized to q4_k by llama.cpp's quantizer
(10.2 GB), then `moespec demo --model FILE.gguf`.

Built as `olmoe_real_size.py` builds its file (its `write_checkpoint`: f16, one safetensors shard per
layer, drawn tensor by tensor, never more than one layer in memory; linear weights and routers
N(0, 0.02), token embeddings N(0, 0.3), norms 1), with tensor names as transformers'
DeepseekV2ForCausalLM saves them (llama.cpp's `DeepseekV2Model` merges the experts and splits kv_b_proj).
The disk: 15.5B parameters are 31 GB in f16, so an f16 GGUF beside the checkpoint (62 GB) would not fit
the machine's 66 GB free. The converter therefore writes q8_0 itself (16.5 GB), the checkpoint is removed
as soon as that file exists, and llama.cpp's quantizer requantizes q8_0 -> q4_k (the weights are random:
the extra rounding changes nothing measured); the peak is 47.5 GB, during the conversion. Each step is
skipped when its output (or a later one) exists, under ~/.cache/moespec/deepseek-v2-lite (resumable):

  checkpoint  DeepseekV2ForCausalLM, f16, 28 shards (a run stopped inside it draws it again)
  convert     llama.cpp's convert_hf_to_gguf.py to q8_0; the checkpoint is then removed
  quantize    llama.cpp's quantizer, q8_0 -> q4_k (Q4_K_M; rows of 1408 or 10944 or 128 are not whole
              256-blocks, so llama.cpp writes those tensors in its fallback type, as in the real
              model's Q4_K_M files); the q8_0 file is then removed unless --keep
  chain       `moespec demo --model FILE.gguf --threads T` in a subprocess: wall time, peak memory, scores

Measured making it (2 threads on the shared 2-core machine, nice 19): checkpoint 472 s, convert 527 s
(q8_0, 16.47 GB), quantize 1923 s (q4_k, 10.21 GB); 49 minutes in all.

    python benchmarks/deepseek_v2_lite_real_size.py --prepare-only --out benchmarks/results/deepseek_v2_lite_real_size/deepseek_v2_lite_real_size.json
    python benchmarks/deepseek_v2_lite_real_size.py --tiny --out /tmp/deepseek-tiny.json   # narrow, 8 experts: the check

What random routers change against the real model's reuse (paper, Figure 1) is measured, not assumed:
the chain records ρ(n) per layer. On the OLMoE-1B-7B-shaped file of the same recipe the random deep
layers mapped tokens to nearly one hidden state and reused experts more than the real model (ρ(2) up
to 0.86 against 0.44; BENCHMARKS.md, "The chain at real size"); this file's figures say the same or not.
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
_spec = importlib.util.spec_from_file_location("olmoe_real_size", HERE / "olmoe_real_size.py")
olmoe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(olmoe)

YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, original_max_position_embeddings=4096, beta_fast=32.0,
            beta_slow=1.0, mscale=0.707, mscale_all_dim=0.707)  # DeepSeek-V2-Lite's config.json
SHAPE = dict(hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408, num_hidden_layers=27,
             first_k_dense_replace=1, n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6,
             num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=None, qk_nope_head_dim=128,
             qk_rope_head_dim=64, v_head_dim=128, vocab_size=49152, max_position_embeddings=163840,
             routed_scaling_factor=1.0, topk_method="greedy", norm_topk_prob=False, rms_norm_eps=1e-6)
# the check: all 27 layers (llama.cpp reads a DeepSeek-V2 without q LoRA only at 26 or 27 layers), narrow
TINY = {**SHAPE, "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 64,
        "qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "v_head_dim": 32}


def attention_tensors(p: str, s: dict) -> dict[str, tuple[int, ...]]:
    """MLA without q LoRA, as transformers' DeepseekV2Attention names it (prefix p): name -> shape."""
    H, heads, r = s["hidden_size"], s["num_attention_heads"], s["kv_lora_rank"]
    nope, rope, v = s["qk_nope_head_dim"], s["qk_rope_head_dim"], s["v_head_dim"]
    return {p + "self_attn.q_proj.weight": (heads * (nope + rope), H),
            p + "self_attn.kv_a_proj_with_mqa.weight": (r + rope, H), p + "self_attn.kv_a_layernorm.weight": (r,),
            p + "self_attn.kv_b_proj.weight": (heads * (nope + v), r), p + "self_attn.o_proj.weight": (H, heads * v)}


def mlp_tensors(p: str, F: int, H: int) -> dict[str, tuple[int, ...]]:
    """A SwiGLU MLP of width F at prefix p (the dense layers' `mlp.`, the MoE layers' `mlp.shared_experts.`)."""
    return {p + "gate_proj.weight": (F, H), p + "up_proj.weight": (F, H), p + "down_proj.weight": (H, F)}


def layer_tensors(l: int, s: dict = SHAPE) -> dict[str, tuple[int, ...]]:
    """The checkpoint's tensors of decoder layer l of shape s, as transformers saves DeepseekV2ForCausalLM:
    the first `first_k_dense_replace` layers a dense MLP, the others router, routed and shared experts."""
    H, F, E = s["hidden_size"], s["moe_intermediate_size"], s["n_routed_experts"]
    p = f"model.layers.{l}."
    out = {p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,), **attention_tensors(p, s)}
    if l < s["first_k_dense_replace"]:
        return {**out, **mlp_tensors(p + "mlp.", s["intermediate_size"], H)}
    out.update({p + "mlp.gate.weight": (E, H), **mlp_tensors(p + "mlp.shared_experts.", F * s["n_shared_experts"], H)})
    return {**out, **olmoe.expert_tensors(p, E, F, H)}


def make_checkpoint(folder: Path, s: dict = SHAPE, seed: int = 0) -> None:
    """The random-initialized DeepseekV2ForCausalLM checkpoint of shape s (module docstring), shard by shard."""
    import transformers

    from moespec.models import gguf

    tok = gguf.tokenizer(gguf.SMOLLM2)
    config = transformers.DeepseekV2Config(**s, rope_parameters=dict(YARN), initializer_range=olmoe.STD,
                                           tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
                                           eos_token_id=tok.eos_token_id)
    config.architectures = ["DeepseekV2ForCausalLM"]
    olmoe.write_checkpoint(folder, config, tok, [layer_tensors(l, s) for l in range(s["num_hidden_layers"])],
                           seed=seed)


def prepare(folder: Path, q8: Path, out: Path, s: dict, threads: int, keep: bool, record=print) -> dict[str, float]:
    """`out` (q4_k): the checkpoint of shape s, converted to q8_0 by llama.cpp's converter (the checkpoint
    then removed), requantized by llama.cpp's quantizer; a step is skipped when its output or a later
    one exists (a run resumes). Returns the seconds of the steps run, each also given to `record` as it ends."""
    from moespec.backends.llama_lib import quantize
    from moespec.models.llama_convert import convert

    seconds: dict[str, float] = {}
    partial = out.with_name(out.name + ".partial")  # renamed when whole: an interrupted quantizer is run again
    steps = (("checkpoint", lambda: (folder / "config.json").exists() or q8.exists(), lambda: make_checkpoint(folder, s)),
             ("convert", q8.exists, lambda: convert(folder, q8, "q8_0")),
             ("quantize", out.exists, lambda: quantize(q8, partial, "q4_k", threads=threads).replace(out)))
    for name, done, step in steps:
        if not out.exists() and not done():
            print(f"[{name}] {time.strftime('%H:%M:%S')}", flush=True)
            t0 = time.perf_counter()
            step()
            seconds[name] = time.perf_counter() - t0
            record(seconds)
        if name == "convert" and q8.exists():
            shutil.rmtree(folder, ignore_errors=True)  # 31 GB: gone before the quantizer writes its file
    if not keep:
        q8.unlink(missing_ok=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="default ~/.cache/moespec/deepseek-v2-lite (deepseek-v2-lite-tiny with --tiny)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the q8_0 file the converter wrote")
    parser.add_argument("--prepare-only", action="store_true", help="stop once the q4_k file is written")
    parser.add_argument("--tiny", action="store_true", help="the shape narrowed (27 layers, 8 experts): the check")
    args = parser.parse_args()
    shape = TINY if args.tiny else SHAPE
    work = args.work_dir or Path.home() / ".cache" / "moespec" / ("deepseek-v2-lite" + ("-tiny" if args.tiny else ""))
    work.mkdir(parents=True, exist_ok=True)
    stem = "deepseek-v2-lite-shaped" + ("-tiny" if args.tiny else "")
    folder, q8, q4 = work / "checkpoint", work / f"{stem}-q8_0.gguf", work / f"{stem}-q4_k.gguf"
    result: dict = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.update(shape=shape, rope=YARN, threads=args.threads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    make_then_chain(result, args, (folder, q8, q4), shape, work, prepare)


def make_then_chain(result: dict, args, files: tuple[Path, Path, Path], shape: dict, work: Path, make) -> None:
    """`make(checkpoint, converted, final, shape, threads, keep, record)` unless the final file exists,
    each step's seconds and the files' sizes written to `args.out` as the step ends (a stopped run keeps
    them); then the chain on the final file unless --prepare-only. Shared with gpt_oss_20b_real_size.py."""
    folder, made, final = files

    def record(seconds: dict[str, float]) -> None:
        result.setdefault("seconds", {}).update(seconds)
        result["sizes"] = {p.name: p.stat().st_size for p in dict.fromkeys((made, final)) if p.exists()}
        args.out.write_text(json.dumps(result, indent=1))
        print(f"  {time.strftime('%H:%M:%S')} seconds {result['seconds']}, sizes {result['sizes']}", flush=True)

    if not final.exists():
        make(folder, made, final, shape, args.threads, args.keep, record)
    result["file"] = {"name": final.name, "bytes": final.stat().st_size}
    args.out.write_text(json.dumps(result, indent=1))
    print(f"{final}: {final.stat().st_size / 1e9:.2f} GB; steps {result.get('seconds')}", flush=True)
    if args.prepare_only:
        return
    run_chain_into(result, final, work / "demo", args.threads)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


def run_chain_into(result: dict, q4: Path, run_dir: Path, threads: int) -> None:
    """The whole chain from nothing on `q4`, its scores, routing reuse, step memory and goals into `result`."""
    shutil.rmtree(run_dir, ignore_errors=True)
    result["chain"] = c = olmoe.run_chain(q4, run_dir, threads)
    result["scores"] = olmoe.chain_scores(run_dir)
    result["routing"] = olmoe.routing_reuse(run_dir / "traces.parquet")
    result["routing"].pop("rho_2_real_olmoe", None)
    result["steps_memory"] = olmoe.step_memory(run_dir)
    result["goals"] = {"wall_s <= 3600": c["wall_s"] <= 3600,
                       "peak memory <= file + 2 GB": c["peak_rss_bytes"] <= result["file"]["bytes"] + 2e9}
    print(f"chain: {c['wall_s'] / 60:.1f} min, peak memory {c['peak_rss_bytes'] / 1e9:.2f} GB (exit {c['returncode']})")
    for version, sc in result["scores"].items():
        if isinstance(sc, dict) and "loss" in sc:
            print(f"  {version:14s} k̂* within one {sc['k_within_one']}/{sc['acceptances']}, loss {100 * sc['loss']:.1f}%, "
                  f"verify-time error {100 * sc['tau_error']:.1f}%")


if __name__ == "__main__":
    sys.exit(main())
