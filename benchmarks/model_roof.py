"""Whole-model plain decoding against the memory roof: bytes per token over time per token.

synthetic:olmoe-shaped (2 layers), float32 and bfloat16, greedy plain decoding of --tokens tokens,
side by side in one run (a rotating order per repetition, median of --reps after a warm-up):
- transformers `generate` with the model's default experts implementation;
- moespec plain decoding (k = 0) with the torch kernels ("moespec_torch_auto") and `F.linear`;
- moespec plain decoding with the compiled expert kernels ("moespec_auto") and the compiled
  small-n dense layers (`moe.dense.fast_linear`), as `moespec generate` runs by default.
Bytes per token: every weight a one-token pass reads: the attention, norms, routers and the output
head whole, m of the N experts of each MoE layer, and one embedding row. The roof is the streaming
read bandwidth, read by one 256 MB sum right before every timed run or pass (`bench.timing.RoofReader`):
this shared machine's reading moves between 26 and 52 GB/s within minutes, so each sample is judged
against its own reading (`share_of_roof`, the median of the paired ratios). The readings of a
512 MB sum at the start and the end of the run are printed beside.
Greedy tokens are asserted identical across the three in float32. Time per token is a run's wall
time over its tokens, the short prompt's prefill included.

Then the verify-batch scaling curve (`--verify-n`, default 1..9), as `moespec generate` runs a
verify pass (compiled kernels, dedup from n = 2, compiled linear layers): after a prefill of
--context tokens, one forward pass of n tokens on the cache, the cache cropped back after each;
--windows windows of n random byte tokens per n, each timed --reps times in rotating order. The
bytes of a pass are the one-token pass's dense bytes plus, per MoE layer, the union of the experts
its n tokens chose (counted from the routing of that very pass) and n embedding rows; tau(n) is
the median time. Goal (issue 24): tau(n) within 10% of bytes(n) / roof at every n <= 9, and
tau(n)/tau(1) with bytes(n)/bytes(1) beside it (how close the verifier is to batch-parallel). Each pass is split into
the time inside the experts modules (`bench.timing.ModuleClock`) and the rest (attention, norms,
routers, output head, the modules' Python), each against its own bytes.

    python benchmarks/model_roof.py --out benchmarks/results/model_roof.json
    python benchmarks/model_roof.py --tokens 8 --reps 1 --windows 1 --verify-n 1 4 --out /tmp/mr.json   # smoke
"""

from __future__ import annotations

import argparse
import statistics

import torch
from rich.console import Console
from rich.table import Table

from moespec import artifacts, generate
from moespec.bench.timing import ModuleClock, RoofReader, measure, read_bandwidth, share_of_roof
from moespec.kernel_names import AUTO, TORCH_AUTO
from moespec.models import load
from moespec.moe import dense
from moespec.moe.experts import expert_bytes, find_experts

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


def verify_scaling(model, ids: list[int], n_values, windows: int, reps: int, reader, seed: int = 0) -> list[dict]:
    """tau(n) of whole-model verify passes on a cache of `ids`, and the bytes each pass reads."""
    from transformers import DynamicCache

    experts = find_experts(model)
    emb = model.get_input_embeddings().weight
    dense_bytes = bytes_per_token(model) - sum(
        expert_bytes(e) * model.config.num_experts_per_tok for e in experts) - emb.shape[1] * emb.element_size()
    unions: list[int] = []

    def count(module, args, kwargs):
        index = args[1] if len(args) > 1 else kwargs["top_k_index"]
        unions.append(expert_bytes(module) * int(index.unique().numel()))

    hooks = [e.register_forward_pre_hook(count, with_kwargs=True) for e in experts]
    gen = torch.Generator().manual_seed(seed)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
    prefix = cache.get_seq_length()
    passes = [(n, w, torch.randint(3, 259, (1, n), generator=gen)) for n in n_values for w in range(windows)]

    def verify(x):
        with torch.inference_mode():
            model(x, past_key_values=cache, use_cache=True)
        cache.crop(-(cache.get_seq_length() - prefix))  # transformers 5.x: the positions to drop

    pass_bytes = {}
    for n, w, x in passes:  # warm-up, and the bytes of each pass
        unions.clear()
        verify(x)
        pass_bytes[(n, w)] = dense_bytes + sum(unions) + n * emb.shape[1] * emb.element_size()
    for h in hooks:
        h.remove()
    expert_share = {}
    for n, w, _ in passes:
        expert_share[(n, w)] = pass_bytes[(n, w)] - dense_bytes - n * emb.shape[1] * emb.element_size()
    samples = {(n, w): [] for n, w, _ in passes}
    inside = {(n, w): [] for n, w, _ in passes}  # seconds inside the experts modules of each timed pass
    roofs = {(n, w): [] for n, w, _ in passes}  # the roof read right before each timed pass
    with ModuleClock(experts) as clock:
        for rep in range(reps):
            order = passes[rep % len(passes):] + passes[: rep % len(passes)]
            for n, w, x in order:
                roofs[(n, w)].append(reader())
                clock.take()
                samples[(n, w)].extend(measure(lambda: verify(x), reps=1, warmup=0, device="cpu").samples)
                inside[(n, w)].append(clock.take())
    rows = []
    for n in n_values:
        ws = range(windows)
        rest_bytes = dense_bytes + n * emb.shape[1] * emb.element_size()

        def share(nbytes, seconds):  # pooled over the windows, each sample against its own reading
            return statistics.median(share_of_roof(nbytes(w), seconds(w), roofs[(n, w)]) for w in ws)

        tau = statistics.median(statistics.median(samples[(n, w)]) for w in ws)
        t_experts = statistics.median(statistics.median(inside[(n, w)]) for w in ws)
        rows.append({
            "n": n, "tau_s": tau, "bytes": statistics.median(pass_bytes[(n, w)] for w in ws),
            "experts_s": t_experts, "experts_bytes": statistics.median(expert_share[(n, w)] for w in ws),
            "rest_s": tau - t_experts, "rest_bytes": rest_bytes,
            "roof_GB_per_s": statistics.median(r for w in ws for r in roofs[(n, w)]) / 1e9,
            "share_of_roof": share(lambda w: pass_bytes[(n, w)], lambda w: samples[(n, w)]),
            "experts_share_of_roof": share(lambda w: expert_share[(n, w)], lambda w: inside[(n, w)]),
            "rest_share_of_roof": share(lambda w: rest_bytes,
                                        lambda w: [t - i for t, i in zip(samples[(n, w)], inside[(n, w)])]),
        })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--verify-n", type=int, nargs="+", default=list(range(1, 10)), help="verify pass sizes")
    ap.add_argument("--windows", type=int, default=4, help="token windows per verify pass size")
    ap.add_argument("--context", type=int, default=64, help="tokens in the cache before each verify pass")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(2)
    readings = [read_bandwidth()]
    reader = RoofReader()
    rows, scaling = [], []
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
        roofs = {name: [] for name in runs}  # the roof read right before each timed run
        names = list(runs)
        for rep in range(args.reps):
            for name in names[rep % len(names):] + names[: rep % len(names)]:
                roofs[name].append(reader())
                samples[name].extend(measure(runs[name], reps=1, warmup=0, device="cpu").samples)
        b = bytes_per_token(model)
        for name in names:
            per_token = statistics.median(samples[name]) / n
            rows.append({"dtype": dtype, "method": name, "bytes_per_token": b, "s_per_token": per_token,
                         "tokens_per_s": 1 / per_token, "GB_per_s": b / per_token / 1e9,
                         "share_of_roof": share_of_roof(b * n, samples[name], roofs[name]),
                         "samples_s": samples[name], "roofs": roofs[name]})
        model.set_experts_implementation(AUTO)  # as moespec generate runs a verify pass
        dense.fast_linear(model)
        context = tok.encode((PROMPT * 16)[: args.context], add_bos=True)
        for r in verify_scaling(model, context, args.verify_n, args.windows, args.reps, reader):
            scaling.append({"dtype": dtype, **r})
    readings.append(read_bandwidth())
    roof = max(readings)
    for dtype in ("float32", "bfloat16"):
        mine = [r for r in scaling if r["dtype"] == dtype]
        for r in mine:
            r["roof_s"] = r["bytes"] / (r["roof_GB_per_s"] * 1e9)  # bytes over the median reading beside
            r["tau_over_roof_time"] = 1 / r["share_of_roof"]
            r["tau_ratio"] = r["tau_s"] / mine[0]["tau_s"]
            r["bytes_ratio"] = r["bytes"] / mine[0]["bytes"]
    artifacts.write(args.out, "model_roof", {"config": vars(args), "roof_GB_per_s": roof / 1e9,
                                             "roof_readings_GB_per_s": [x / 1e9 for x in readings], "rows": rows,
                                             "verify_scaling": scaling})
    table = Table("dtype", "method", "MB/token", "ms/token", "tokens/s", "GB/s", "of roof",
                  title=f"plain decoding, olmoe-shaped x{args.layers}: of the roof read beside each run "
                        f"(start and end of the run: {', '.join(f'{x / 1e9:.1f}' for x in readings)} GB/s)")
    for r in rows:
        table.add_row(r["dtype"], r["method"], f"{r['bytes_per_token'] / 1e6:.0f}", f"{1e3 * r['s_per_token']:.1f}",
                      f"{r['tokens_per_s']:.1f}", f"{r['GB_per_s']:.1f}", f"{100 * r['share_of_roof']:.0f}%")
    console = Console(width=200)
    console.print(table)
    table = Table("dtype", "n", "MB/pass", "tau(n) ms", "bytes/roof ms", "tau / (bytes/roof)", "tau(n)/tau(1)",
                  "bytes(n)/bytes(1)", "experts: MB, ms, of roof", "rest: MB, ms, of roof",
                  title="verify passes on the cache, compiled kernels and linear layers")
    for r in scaling:
        table.add_row(r["dtype"], str(r["n"]), f"{r['bytes'] / 1e6:.0f}", f"{1e3 * r['tau_s']:.1f}",
                      f"{1e3 * r['roof_s']:.1f}", f"{r['tau_over_roof_time']:.2f}", f"{r['tau_ratio']:.2f}",
                      f"{r['bytes_ratio']:.2f}",
                      f"{r['experts_bytes'] / 1e6:.0f}, {1e3 * r['experts_s']:.1f}, {r['experts_share_of_roof']:.0%}",
                      f"{r['rest_bytes'] / 1e6:.0f}, {1e3 * r['rest_s']:.1f}, {r['rest_share_of_roof']:.0%}")
    console.print(table)


if __name__ == "__main__":
    main()
