"""The trained presets: held-out quality, the draft's acceptance, trained reuse and the K-sweep.

Everything is read on text the presets never trained on (`texts`'s held-out documents, and
the built-in prompts, which are not in the training text):

1. quality: held-out bits per byte of each preset (re-scored here, as the manifest's), and the
   draft's greedy acceptance by position against trained:olmoe, k = 8, on --prompts windows of
   held-out code and of held-out prose (`Stats.acceptance_by_position`: accepted / drafted at
   position i; and the conditional rate, accepted / reached);
2. reuse: layer rho_l(n) of trained:olmoe's routing on held-out text, the layer mean with a
   bootstrap interval over documents (`moe.reuse.analyze`), against the uniform 1 - (1 - m/N)^(n-1);
3. sweep: the engine paper's K-sweep on the pair at depth --depth (built-in prompts, greedy), with
   prompt lookup as a second drafter (`bench.sweep.run_draft`), and the verify-batch scaling curve.

    python benchmarks/trained_presets.py --out benchmarks/results/trained/trained_presets.json
    python benchmarks/trained_presets.py --prompts 2 --tokens 16 --reps 1 --out /tmp/tp.json  # smoke
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from moespec import artifacts, generate
from moespec.bench.sweep import run_draft
from moespec.bench.verify import run_scaling
from moespec.engine.proposers import DraftModel, PromptLookup
from moespec.kernel_names import AUTO
from moespec.models import load
from moespec.texts import training_text
from moespec.models.train import bits_per_byte
from moespec.moe.reuse import analyze, uniform_reuse
from moespec.moe.routing import record_to_file
from moespec.moe.traces import RoutingTrace

PROMPT_BYTES = 256  # held-out windows: the prompt, then the target's continuation


def held_out_prompts(split, kind: str, count: int) -> list[list[int]]:
    """`count` prompts of PROMPT_BYTES tokens, one per held-out document of `kind`, evenly spread."""
    docs = [d for d in split.held_out if d.kind == kind and len(d.ids) > PROMPT_BYTES * 2]
    pick = [docs[i] for i in np.linspace(0, len(docs) - 1, min(count, len(docs))).astype(int)]
    return [d.ids[len(d.ids) // 2 - PROMPT_BYTES // 2:][:PROMPT_BYTES].tolist() for d in pick]


def quality(target, draft, split, prompts: int, tokens: int) -> dict:
    out = {"bits_per_byte": {}, "acceptance": {}}
    for name, model in (("trained:olmoe", target), ("trained:draft", draft)):
        out["bits_per_byte"][name] = {kind: bits_per_byte(model, split.held_out_ids(kind)) for kind in ("code", "prose")}
    for kind in ("code", "prose"):
        accepted, drafted, reached = np.zeros(8), np.zeros(8), np.zeros(8)
        for ids in held_out_prompts(split, kind, prompts):
            s = generate(target, ids, draft=draft, k=8, max_new_tokens=tokens).stats
            accepted += s.accepted_by_position
            drafted += s.drafted_by_position
            reached += s.reached_by_position
        out["acceptance"][kind] = {"prompts": prompts, "tokens": tokens, "by_position": list(accepted / drafted),
                                   "conditional_by_position": list(accepted / np.maximum(reached, 1))}
    return out


def reuse(target, split, max_tokens: int, resamples: int, per_doc: int = 1024) -> dict:
    """Up to `per_doc` tokens of each held-out document, `max_tokens` in all: the bootstrap resamples
    documents, so it needs many."""
    docs, total = [], 0
    for d in split.held_out:
        ids = d.ids.tolist()[: min(per_doc, max_tokens - total)]
        if len(ids) > 9:
            docs.append((d.name, ids))
            total += len(ids)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "held_out.parquet"
        record_to_file(target, docs, path, model_spec="trained:olmoe", corpus=["held-out text"])
        trace = RoutingTrace.load(path)
    a = analyze(trace, 9, resamples=resamples)
    m, N = trace.top_k, trace.num_experts
    return {"tokens": trace.num_tokens, "documents": len(docs), "N": N, "m": m, "resamples": resamples,
            "rho_by_layer": [list(r) for r in a.rho], "rho_mean": a.rho_mean.to_dict(),
            "uniform": [uniform_reuse(n, m, N) for n in range(1, 10)]}


def sweep(target, tok, draft, depth: int, prompts: int, reps: int, tokens: int, ks, kernel: str = AUTO) -> dict:
    out = {}
    for name, proposer in (("trained:draft", DraftModel(draft)), ("prompt-lookup:3", PromptLookup(3))):
        out[name] = run_draft(target, tok, proposer, draft_name=name, depths=(depth,), ks=ks, prompts=prompts,
                              reps=reps, new_tokens=tokens, temperature=0.0, kernel=kernel)[0]
    curve = run_scaling(target, tok, depth=depth, ns=range(1, 17), kernel=kernel, prompts=min(prompts, 2), reps=3)
    out["scaling"] = curve.to_dict()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=12, help="held-out prompts per kind (quality); built-in prompts "
                    "(sweep, at most 6)")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per decoding")
    ap.add_argument("--reps", type=int, default=2, help="repetitions of every sweep cell")
    ap.add_argument("--depth", type=int, default=256, help="prompt depth of the K-sweep (the presets train on 512)")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    ap.add_argument("--reuse-tokens", type=int, default=65536)
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--parts", nargs="+", default=["quality", "reuse", "sweep"])
    ap.add_argument("--kernel", default=AUTO, help="experts implementation of the target in the sweep")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(2)
    target, tok = load("trained:olmoe", experts_implementation=args.kernel)
    draft, _ = load("trained:draft")
    split = training_text()
    payload = {"config": vars(args)}
    if "quality" in args.parts:
        payload["quality"] = quality(target, draft, split, args.prompts, args.tokens)
    if "reuse" in args.parts:
        payload["reuse"] = reuse(target, split, args.reuse_tokens, args.resamples)
    if "sweep" in args.parts:
        payload["sweep"] = sweep(target, tok, draft, args.depth, min(args.prompts, 6), args.reps, args.tokens, args.ks,
                                 args.kernel)
    artifacts.write(args.out, "trained-presets", payload)
    report(payload)


def report(p: dict) -> None:
    c = Console(width=200)
    if "quality" in p:
        q = p["quality"]
        t = Table("preset", "held-out code bits/byte", "held-out prose bits/byte", title="held-out quality")
        for name, b in q["bits_per_byte"].items():
            t.add_row(name, f"{b['code']:.3f}", f"{b['prose']:.3f}")
        c.print(t)
        t = Table("text", "acceptance by position 1..8 (accepted/drafted)", "conditional", title="greedy, k = 8")
        for kind, a in q["acceptance"].items():
            t.add_row(kind, " ".join(f"{x:.2f}" for x in a["by_position"]),
                      " ".join(f"{x:.2f}" for x in a["conditional_by_position"]))
        c.print(t)
    if "reuse" in p:
        r = p["reuse"]
        t = Table("n", *[f"layer {i}" for i in range(len(r["rho_by_layer"]))], "mean [95%]", "uniform",
                  title=f"rho(n), trained:olmoe, {r['tokens']} held-out tokens")
        band = r["rho_mean"]
        for n in range(2, 10):
            t.add_row(str(n), *[f"{layer[n - 1]:.3f}" for layer in r["rho_by_layer"]],
                      f"{band['value'][n - 1]:.3f} [{band['lo'][n - 1]:.3f}, {band['hi'][n - 1]:.3f}]",
                      f"{r['uniform'][n - 1]:.3f}")
        c.print(t)
    if "sweep" in p:
        for name in ("trained:draft", "prompt-lookup:3"):
            e = p["sweep"][name]
            t = Table("k", "tokens/s", "speedup", "acceptance", "by position", "TTFT ms",
                      title=f"K-sweep, {name}, depth {e['depth']}, draft/target step {e['draft_target_ratio']:.2f}")
            for cell in e["cells"]:
                t.add_row(str(cell["k"]), f"{cell['throughput']:.1f}", f"{e['speedup'][str(cell['k'])]:.2f}",
                          f"{cell['acceptance']:.2f}" if cell["k"] else "-",
                          " ".join(f"{x:.2f}" for x in cell["acceptance_by_position"]), f"{1e3 * cell['ttft_s']:.1f}")
            c.print(t)


if __name__ == "__main__":
    main()
