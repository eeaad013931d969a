"""Whole-model plain decoding against the memory roof: bytes per token over time per token.

synthetic:olmoe-shaped (2 layers), float32 and bfloat16, greedy plain decoding of --tokens tokens,
side by side in one run (a rotating order per repetition, median of --reps after a warm-up):
- transformers `generate` with the model's default experts implementation;
- moespec plain decoding (k = 0) with the torch kernels ("moespec_torch_auto") and `F.linear`;
- moespec plain decoding with the compiled expert kernels ("moespec_auto") and the compiled
  small-n dense layers (`moe.dense.fast_linear`), as `moespec generate` runs by default.
Bytes per token: every weight a one-token pass reads: the attention, norms, routers and the output
head whole, m of the N experts of each MoE layer, and one embedding row. The roof is the streaming
read bandwidth (`bench.timing.read_bandwidth`), measured before and after (the larger is kept).
Greedy tokens are asserted identical across the three in float32. Time per token is a run's wall
time over its tokens, the short prompt's prefill included.

    python benchmarks/model_roof.py --out benchmarks/results/model_roof.json
    python benchmarks/model_roof.py --tokens 8 --reps 1 --out /tmp/mr.json   # smoke
"""

from __future__ import annotations

import argparse

import torch
from rich.console import Console
from rich.table import Table

from moespec import artifacts, generate
from moespec.bench.timing import measure, read_bandwidth
from moespec.kernel_names import AUTO, TORCH_AUTO
from moespec.models import load
from moespec.moe import dense
from moespec.moe.experts import find_experts

PROMPT = "The roof: "  # short, so the prefill is a small share of each run


def bytes_per_token(model) -> int:
    """Weight bytes one decode step reads: everything but the experts and the embedding, m/N of each
    experts module, and one embedding row."""
    experts = find_experts(model)
    expert_params = {id(p) for e in experts for p in e.parameters()}
    emb = model.get_input_embeddings().weight
    other = sum(p.numel() * p.element_size() for p in model.parameters()
                if id(p) not in expert_params and p is not emb)
    m = model.config.num_experts_per_tok
    routed = sum(sum(p.numel() * p.element_size() for p in e.parameters()) * m // e.num_experts for e in experts)
    return other + routed + emb.shape[1] * emb.element_size()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(2)
    roof = read_bandwidth()
    rows = []
    for dtype in ("float32", "bfloat16"):
        model, tok = load("synthetic:olmoe-shaped", layers=args.layers, dtype=dtype)
        ids = tok.encode(PROMPT, add_bos=True)
        n, vocab = args.tokens, len(tok)

        def hf():
            model.set_experts_implementation("grouped_mm")
            out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, min_new_tokens=n,
                                 eos_token_id=None, suppress_tokens=list(range(vocab, model.config.vocab_size)))
            return out[0, len(ids):].tolist()

        def ours(kernel, fast):
            def run():
                model.set_experts_implementation(kernel)
                (dense.fast_linear if fast else dense.restore_linear)(model)
                try:
                    return generate(model, ids, k=0, max_new_tokens=n, vocab_limit=vocab, eos_token_id=None).tokens
                finally:
                    dense.restore_linear(model)
            return run

        runs = {"transformers generate": hf, "moespec, torch kernels": ours(TORCH_AUTO, False),
                "moespec, compiled": ours(AUTO, True)}
        tokens = {name: fn() for name, fn in runs.items()}  # warm-up, and the tokens to compare
        if dtype == "float32":
            assert len({tuple(t) for t in tokens.values()}) == 1, "greedy tokens differ"
        samples = {name: [] for name in runs}
        names = list(runs)
        for rep in range(args.reps):
            for name in names[rep % len(names):] + names[: rep % len(names)]:
                samples[name].extend(measure(runs[name], reps=1, warmup=0, device="cpu").samples)
        b = bytes_per_token(model)
        for name in names:
            s = sorted(samples[name])
            per_token = s[len(s) // 2] / n
            rows.append({"dtype": dtype, "method": name, "bytes_per_token": b, "s_per_token": per_token,
                         "tokens_per_s": 1 / per_token, "GB_per_s": b / per_token / 1e9})
    roof = max(roof, read_bandwidth())
    for r in rows:
        r["share_of_roof"] = r["GB_per_s"] * 1e9 / roof
    artifacts.write(args.out, "model_roof", {"config": vars(args), "roof_GB_per_s": roof / 1e9, "rows": rows})
    table = Table("dtype", "method", "MB/token", "ms/token", "tokens/s", "GB/s", "of roof",
                  title=f"plain decoding, olmoe-shaped x{args.layers}, roof {roof / 1e9:.1f} GB/s")
    for r in rows:
        table.add_row(r["dtype"], r["method"], f"{r['bytes_per_token'] / 1e6:.0f}", f"{1e3 * r['s_per_token']:.1f}",
                      f"{r['tokens_per_s']:.1f}", f"{r['GB_per_s']:.1f}", f"{100 * r['share_of_roof']:.0f}%")
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
