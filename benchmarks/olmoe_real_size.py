"""The chain at real size: a GGUF file with the full shape of OLMoE-1B-7B (16 layers, hidden 2048, 64
experts of 1024, top-8, vocabulary 50304; random weights), written by llama.cpp's converter and
quantized to q4_k by llama.cpp's quantizer (about 4 GB), then `moespec demo --model FILE.gguf`.

Each phase is skipped when its output exists, so an interrupted run resumes:

  checkpoint  a transformers checkpoint of OlmoeForCausalLM, f16, one safetensors shard per layer,
              drawn tensor by tensor (never the whole 7B model in memory): linear weights and routers
              N(0, 0.02) (the config's initializer_range), token embeddings N(0, 0.3) (routing that
              follows the token, as moespec's olmoe-shaped preset), norms 1; SmolLM2's tokenizer,
              padded to 50304 ids by the converter
  convert     llama.cpp's convert_hf_to_gguf.py to f16 (`moespec.models.llama_convert`)
  quantize    llama.cpp's quantizer to q4_k (Q4_K_M); the checkpoint and the f16 file are then removed
  chain       `moespec demo --model FILE.gguf --threads T` in a subprocess: wall time and peak memory
              (the largest resident set of the process, mapped weights included)
  plain       moespec's plain decoding against llama-bench on the same file, side by side
  routing     ρ_l(2) of the file's routing (the trace llama.cpp recorded) against the uniform router's
              and the 0.44 measured on the real OLMoE-1B-7B (cost-model paper, Sec. 2)

    python benchmarks/olmoe_real_size.py --out benchmarks/results/olmoe_real_size/olmoe_real_size.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # benchmarks/llama_cpp.py is not llama_cpp
_spec = importlib.util.spec_from_file_location("llama_cpp_bench", HERE / "llama_cpp.py")
llama_cpp_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(llama_cpp_bench)

SHAPE = dict(hidden_size=2048, intermediate_size=1024, num_hidden_layers=16, num_experts=64, num_experts_per_tok=8,
             num_attention_heads=16, num_key_value_heads=16, vocab_size=50304, max_position_embeddings=4096)
REAL_RHO_2 = 0.44  # ρ(2) of the real OLMoE-1B-7B (cost-model paper, Sec. 2)
STD, EMBEDDING_STD = 0.02, 0.3
PARTS = ("chain", "plain")


def layer_tensors(l: int) -> dict[str, tuple[int, ...]]:
    """The checkpoint's tensors of decoder layer l, as transformers saves OlmoeForCausalLM: name -> shape."""
    H, F, E = SHAPE["hidden_size"], SHAPE["intermediate_size"], SHAPE["num_experts"]
    p = f"model.layers.{l}."
    out = {p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
           p + "self_attn.q_norm.weight": (H,), p + "self_attn.k_norm.weight": (H,), p + "mlp.gate.weight": (E, H)}
    out.update({p + f"self_attn.{x}_proj.weight": (H, H) for x in "qkvo"})
    return {**out, **expert_tensors(p, E, F, H)}


def expert_tensors(prefix: str, E: int, F: int, H: int) -> dict[str, tuple[int, ...]]:
    """One layer's routed experts as transformers names them (gate and up [F, H], down [H, F]): name -> shape."""
    return {f"{prefix}mlp.experts.{e}.{name}_proj.weight": shape
            for e in range(E) for name, shape in (("gate", (F, H)), ("up", (F, H)), ("down", (H, F)))}


def make_checkpoint(folder: Path, seed: int = 0) -> None:
    """The random-initialized checkpoint (module docstring), shard by shard."""
    import transformers

    from moespec.models import gguf

    tok = gguf.tokenizer(gguf.SMOLLM2)
    config = transformers.OlmoeConfig(**SHAPE, initializer_range=STD, tie_word_embeddings=False,
                                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    config.architectures = ["OlmoeForCausalLM"]
    layers = [layer_tensors(l) for l in range(SHAPE["num_hidden_layers"])]
    write_checkpoint(folder, config, tok, layers, seed=seed)


def write_checkpoint(folder: Path, config, tok, layers: list[dict[str, tuple[int, ...]]], seed: int = 0) -> None:
    """A transformers checkpoint in f16, one safetensors shard per decoder layer (`layers`: name ->
    shape) and one for the embeddings, norm and head, drawn tensor by tensor: norms 1, token
    embeddings N(0, EMBEDDING_STD), every other matrix N(0, STD)."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config.dtype = "float16"
    V, H = config.vocab_size, config.hidden_size
    shards = {"outer": {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H)}}
    shards.update({f"layer{l:02d}": tensors for l, tensors in enumerate(layers)})
    index = {"metadata": {}, "weight_map": {}}
    g = torch.Generator().manual_seed(seed)
    for i, (shard, tensors) in enumerate(shards.items()):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        drawn = {}
        for key, shape in tensors.items():
            if len(shape) == 1:
                drawn[key] = torch.ones(shape, dtype=torch.float16)
            else:
                std = EMBEDDING_STD if key == "model.embed_tokens.weight" else STD
                drawn[key] = (torch.randn(shape, generator=g) * std).half()
            index["weight_map"][key] = name
        save_file(drawn, str(folder / name), metadata={"format": "pt"})
        print(f"  {name}: {len(drawn)} tensors", flush=True)
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    config.save_pretrained(folder)
    tok.save_pretrained(folder)


def prepare(folder: Path, f16: Path, out: Path, make, kind: str, threads: int, keep: bool) -> dict[str, float]:
    """`out`: the checkpoint `make(folder)` writes, converted by llama.cpp's converter to f16, quantized
    to `kind`; each step skipped when its output exists (a run resumes), the checkpoint and the f16
    file removed at the end unless `keep`. Returns the seconds of the steps run."""
    from moespec.backends.llama_lib import quantize
    from moespec.models.llama_convert import convert

    seconds: dict[str, float] = {}
    if out.exists():
        return seconds
    partial = out.with_name(out.name + ".partial")  # renamed when whole: an interrupted quantizer is run again
    for name, path, step in (("checkpoint", folder / "config.json", lambda: make(folder)),
                             ("convert", f16, lambda: convert(folder, f16, "f16")),
                             ("quantize", out, lambda: quantize(f16, partial, kind, threads=threads).replace(out))):
        if not path.exists():
            print(f"[{name}]", flush=True)
            t0 = time.perf_counter()
            step()
            seconds[name] = time.perf_counter() - t0
    if not keep:
        shutil.rmtree(folder, ignore_errors=True)
        f16.unlink(missing_ok=True)
    return seconds


def step_memory(run_dir: Path) -> dict:
    """Each step's peak resident memory, anonymous and file-backed apart, as the runner recorded it
    (the folder's memory.json; the llama.cpp chain's batch steps included)."""
    return json.loads((run_dir / "memory.json").read_text())["payload"]["steps"]


def run_chain(gguf_path: Path, out_dir: Path, threads: int) -> dict:
    """`moespec demo --model FILE.gguf` in a subprocess: its wall time, peak memory and exit code."""
    cmd = [sys.executable, "-m", "moespec.cli.main", "demo", "--model", str(gguf_path), "--out-dir", str(out_dir),
           "--threads", str(threads)]
    print("+", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    done = subprocess.run(cmd)
    wall = time.perf_counter() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the largest child: the demo
    return {"command": " ".join(cmd[2:]), "returncode": done.returncode, "wall_s": wall, "peak_rss_bytes": peak_kb * 1024}


def chain_scores(run_dir: Path) -> dict:
    """The calibrated version's scores at the demo's depth, and the steadiness check's verdict."""
    from moespec import artifacts
    from moespec.report.summary import goals

    score = artifacts.load(run_dir / "score.json", "score")["payload"]
    depth = score["depths"][0]
    out = {"depth": depth["depth"], "steadiness": score.get("steadiness")}
    for version, s in depth["versions"].items():
        g = goals(s)
        out[version] = {"k_within_one": g["k_within_one"][0], "acceptances": len(s["acceptance"]),
                        "loss": g["loss"][0], "loss_floor": s.get("loss_floor"), "tau_error": g["tau"][0]}
    return out


def plain_speed(gguf_path: Path, threads: int, reps: int) -> dict:
    """moespec's plain decoding against llama-bench, the same file, depth and new tokens, interleaved."""
    from moespec.models import load

    llama_cpp_bench.THREADS = threads
    prompt = list(range(300, 332))
    model, _ = load(str(gguf_path), backend="llama.cpp", threads=threads)
    rates = {"llama-bench": [], "moespec": []}
    for r in range(reps):  # in turns, llama-bench first on even repetitions: no engine always runs first
        if r % 2 == 0:
            rates["llama-bench"] += llama_cpp_bench.llama_bench(gguf_path, len(prompt), reps=1)
        rates["moespec"].append(llama_cpp_bench.moespec_rate(model, prompt)[0])
        if r % 2 == 1:
            rates["llama-bench"] += llama_cpp_bench.llama_bench(gguf_path, len(prompt), reps=1)
    model.close()
    m = {k: float(np.median(v)) for k, v in rates.items()}
    paired = float(np.median([o / b for o, b in zip(rates["moespec"], rates["llama-bench"])]))  # through the drift
    return {"samples": rates, "median_tokens_per_s": m, "ratio": m["moespec"] / m["llama-bench"], "paired_ratio": paired}


def routing_reuse(trace_path: Path) -> dict:
    from moespec.moe.traces import RoutingTrace, reuse, uniform_reuse

    trace = RoutingTrace.load(trace_path)
    rho = reuse(trace, 2)
    return {"rho_2_by_layer": [float(x) for x in rho], "rho_2_mean": float(np.mean(rho)),
            "rho_2_uniform": float(uniform_reuse(2, trace.top_k, trace.num_experts)), "rho_2_real_olmoe": REAL_RHO_2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "moespec" / "olmoe-1b-7b")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--plain-reps", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint and the f16 file")
    parser.add_argument("--prepare-only", action="store_true", help="stop once the q4_k file is written")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="which parts to run; the others are kept from an earlier --out")
    args = parser.parse_args()
    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    folder, f16, q4 = work / "checkpoint", work / "olmoe-1b-7b-shaped-f16.gguf", work / "olmoe-1b-7b-shaped-q4_k.gguf"
    result: dict = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.update(shape=SHAPE, threads=args.threads)
    if not q4.exists():
        result["seconds"] = prepare(folder, f16, q4, make_checkpoint, "q4_k", args.threads, args.keep)
    result["file"] = {"name": q4.name, "bytes": q4.stat().st_size}
    if args.prepare_only:
        print(f"wrote {q4} ({q4.stat().st_size / 1e9:.2f} GB)")
        return
    run_dir = work / "demo"
    if "chain" in args.parts:
        shutil.rmtree(run_dir, ignore_errors=True)  # the whole chain, timed from nothing
        result["chain"] = run_chain(q4, run_dir, args.threads)
        result["scores"] = chain_scores(run_dir)
        result["routing"] = routing_reuse(run_dir / "traces.parquet")
        result["steps_memory"] = step_memory(run_dir)
    if "plain" in args.parts:
        result["plain"] = plain_speed(q4, args.threads, args.plain_reps)
    if "chain" in result and "plain" in result:
        result["goals"] = {"wall_s <= 3600": result["chain"]["wall_s"] <= 3600,
                           "peak memory <= file + 2 GB": result["chain"]["peak_rss_bytes"] <= result["file"]["bytes"] + 2e9,
                           "plain >= 0.99x llama-bench (paired)": result["plain"]["paired_ratio"] >= 0.99}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    c, p, r = result["chain"], result["plain"], result["routing"]
    print(f"\nfile {q4.name}: {result['file']['bytes'] / 1e9:.2f} GB")
    print(f"chain: {c['wall_s'] / 60:.1f} min, peak memory {c['peak_rss_bytes'] / 1e9:.2f} GB (exit {c['returncode']})")
    for version, s in result["scores"].items():
        if isinstance(s, dict) and "loss" in s:
            print(f"  {version:14s} k̂* within one {s['k_within_one']}/{s['acceptances']}, loss {100 * s['loss']:.1f}%, "
                  f"verify-time error {100 * s['tau_error']:.1f}%")
    print(f"plain: moespec {p['median_tokens_per_s']['moespec']:.2f} t/s, llama-bench "
          f"{p['median_tokens_per_s']['llama-bench']:.2f} t/s, ratio {p['ratio']:.3f}, paired {p['paired_ratio']:.3f}")
    print(f"routing: rho(2) {r['rho_2_mean']:.3f} (uniform {r['rho_2_uniform']:.3f}, real OLMoE {REAL_RHO_2})")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
