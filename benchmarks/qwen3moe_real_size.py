"""The oracle at real size on a file llama.cpp's converter wrote (issue 55): a GGUF file with Qwen3-30B-A3B's
widths (hidden 2048, 128 experts of 768, top-8, 32 attention heads over 4 KV heads of 128; 6 layers,
SmolLM2's vocabulary of 49152, random weights), quantized to q8_0 (about 4.2 GB), then
`moespec demo --model FILE.gguf`: does every oracle cell realize the acceptance it is set to?

Built as `olmoe_real_size.py` builds its file (its `write_checkpoint` and `prepare`): a transformers
checkpoint of Qwen3MoeForCausalLM in f16, one safetensors shard per layer, drawn tensor by tensor
(linear weights and routers N(0, 0.02), token embeddings N(0, 0.3), norms 1; norm_topk_prob true, as
the real model and llama.cpp's qwen3moe), llama.cpp's convert_hf_to_gguf.py to f16, llama.cpp's
quantizer to q8_0; each step skipped when its output exists, under ~/.cache/moespec (resumable).

    python benchmarks/qwen3moe_real_size.py --out benchmarks/results/qwen3moe_real_size/qwen3moe_real_size.json

Recorded: the chain's wall time and peak memory, each step's peak (anonymous and file-backed apart), the score lines of every version, and per oracle cell
its set and realized acceptance, the tested drafts and the interval (`costmodel.sweep_cells.acceptance_check`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("olmoe_real_size", HERE / "olmoe_real_size.py")
olmoe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(olmoe)

SHAPE = dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=6,
             num_experts=128, num_experts_per_tok=8, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
             vocab_size=49152, max_position_embeddings=4096, norm_topk_prob=True)


def layer_tensors(l: int) -> dict[str, tuple[int, ...]]:
    """The checkpoint's tensors of decoder layer l, as Qwen3-30B-A3B's checkpoint names them: name -> shape."""
    H, F, E = SHAPE["hidden_size"], SHAPE["moe_intermediate_size"], SHAPE["num_experts"]
    heads, kv, d = SHAPE["num_attention_heads"], SHAPE["num_key_value_heads"], SHAPE["head_dim"]
    p = f"model.layers.{l}."
    out = {p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
           p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,), p + "mlp.gate.weight": (E, H),
           p + "self_attn.q_proj.weight": (heads * d, H), p + "self_attn.k_proj.weight": (kv * d, H),
           p + "self_attn.v_proj.weight": (kv * d, H), p + "self_attn.o_proj.weight": (H, heads * d)}
    return {**out, **olmoe.expert_tensors(p, E, F, H)}


def make_checkpoint(folder: Path, seed: int = 0) -> None:
    """The random-initialized Qwen3MoeForCausalLM checkpoint (module docstring), shard by shard."""
    import transformers

    from moespec.models import gguf

    tok = gguf.tokenizer(gguf.SMOLLM2)
    config = transformers.Qwen3MoeConfig(**SHAPE, initializer_range=olmoe.STD, tie_word_embeddings=False,
                                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    config.architectures = ["Qwen3MoeForCausalLM"]
    olmoe.write_checkpoint(folder, config, tok, [layer_tensors(l) for l in range(SHAPE["num_hidden_layers"])],
                           seed=seed)


def oracle_cells(run_dir: Path) -> list[dict]:
    """Per oracle cell of the demo's measurement: k, set a, realized a, tested drafts, its interval, within."""
    from moespec import artifacts

    meas = artifacts.load(run_dir / "measurement.json", "measure")["payload"]
    out = []
    for entry in meas.get("oracle", []):
        for c in entry["cells"]:
            if c["a"] is None or not c["k"]:
                continue
            out.append({"kernel": entry["kernel"], "depth": entry["depth"], "k": c["k"], "a": c["a"],
                        "realized": c["realized_acceptance"], "tested": c.get("tested"),
                        "interval": c.get("acceptance_interval"), "within": c.get("acceptance_within"),
                        "overruled": c.get("overruled")})
    return out


def score_lines(run_dir: Path) -> dict:
    """The score's acceptance rows per depth (`chain.scoring.score_all`) and the answer's trust line."""
    from moespec import artifacts

    score = artifacts.load(run_dir / "score.json", "score")["payload"]
    answer = (run_dir / "answer.txt").read_text(encoding="utf-8") if (run_dir / "answer.txt").exists() else ""
    return {"oracle_acceptance": {e["depth"]: e.get("oracle_acceptance") for e in score["depths"]},
            "trust": next((" ".join(block.split()) for block in answer.split("\n\n") if "How far to trust it" in block),
                          None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "moespec" / "qwen3-30b-a3b-6l")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint and the f16 file")
    parser.add_argument("--prepare-only", action="store_true", help="stop once the q8_0 file is written")
    args = parser.parse_args()
    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    folder, f16, q8 = work / "checkpoint", work / "qwen3moe-shaped-f16.gguf", work / "qwen3moe-shaped-q8_0.gguf"
    result: dict = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.update(shape=SHAPE, threads=args.threads)
    if not q8.exists():
        result["seconds"] = olmoe.prepare(folder, f16, q8, make_checkpoint, "q8_0", args.threads, args.keep)
    result["file"] = {"name": q8.name, "bytes": q8.stat().st_size}
    print(f"{q8}: {q8.stat().st_size / 1e9:.2f} GB", flush=True)
    if args.prepare_only:
        return
    run_dir = work / "demo"
    shutil.rmtree(run_dir, ignore_errors=True)
    result["chain"] = olmoe.run_chain(q8, run_dir, args.threads)
    result["scores"] = olmoe.chain_scores(run_dir)
    result["oracle"] = cells = oracle_cells(run_dir)
    result["score_lines"] = score_lines(run_dir)
    result["steps_memory"] = steps = olmoe.step_memory(run_dir)
    limit = result["file"]["bytes"] + 2e9
    result["goals"] = {"every oracle cell within its interval": all(c["within"] for c in cells),
                       "peak memory <= file + 2 GB": result["chain"]["peak_rss_bytes"] <= limit,
                       "every step's peak <= file + 2 GB": all(s["anon_bytes"] + s["file_bytes"] <= limit
                                                               for s in steps.values())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for name, m in steps.items():
        print(f"  {name}: peak {m['anon_bytes'] / 1e9:.2f} GB anonymous + {m['file_bytes'] / 1e9:.2f} GB file-backed")
    for c in cells:
        print(f"  {c['kernel']} d={c['depth']} k={c['k']} a={c['a']:.2f}: realized {c['realized']:.3f} "
              f"of {c['tested']} tested, interval {c['interval']}, within {c['within']}")
    print(result["score_lines"]["trust"])
    print(json.dumps(result["goals"]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
