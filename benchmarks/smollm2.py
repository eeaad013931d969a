"""SmolLM2-135M-Instruct (GGUF, dequantized to float32) through the engine: acceptance, exactness,
the engine paper's sampled losslessness check, and the K-sweep, with prompt lookup and with
trained:smollm2-draft.

Parts (each writes its own JSON under --out, so an interrupted run keeps the parts it finished):

1. acceptance: greedy acceptance by draft position (k = 8) of trained:smollm2-draft against SmolLM2
   on held-out text (`texts`'s held-out documents, which neither the draft nor this run
   trained on): --prompts windows of PROMPT_TOKENS tokens per kind, --tokens new tokens each;
2. greedy: on every built-in chat request (edit and open), greedy speculative tokens (lookup k = 4
   and auto, draft k = 3 and auto) against transformers' greedy `generate`, token for token;
3. chi2: the gate's level 3 at the engine paper's scale: --samples sampled tokens per method (runs
   of 100, temperature 1) with the draft at k = 3 (by default in bfloat16 with the compiled layers,
   the faster drafter here) against target-only sampling, two-sample chi-square, and the power
   check (the draft's own sampling must be rejected);
4. sweep: tokens/s at k in 0 + --ks and auto for each drafter (prompt lookup, the draft, and the
   draft in bfloat16 with moespec's compiled linear layers), on the edit requests (whose answers
   repeat the prompt) and the open ones, greedy, --tokens new tokens, methods interleaved in each
   repetition; speedup = median over requests of (tokens/s at k) / (tokens/s at k = 0, same request).

    python benchmarks/smollm2.py --parts sweep --tokens 64 --ks 1 2 3 4 6 --requests 4 --out benchmarks/results/smollm2
    python benchmarks/smollm2.py --parts acceptance chi2 --out benchmarks/results/smollm2
    python benchmarks/smollm2.py --parts greedy --tokens 48 --out benchmarks/results/smollm2
    python benchmarks/smollm2.py --parts acceptance greedy --prompts 2 --tokens 16 --out /tmp/sm  # smoke
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.progress import track
from rich.table import Table

from moespec import artifacts
from moespec.texts import CHAT_KINDS, chat_ids, chat_prompts
from moespec.engine.decode import generate
from moespec.checks.gate import run_level3
from moespec.engine.proposers import PromptLookup
from moespec.models import load, trained
from moespec.texts import training_text
from moespec.models.train import vocabulary

PROMPT_TOKENS = 128
PARTS = ("acceptance", "greedy", "chi2", "sweep")


def held_out_prompts(kind: str, count: int) -> list[list[int]]:
    """`count` windows of PROMPT_TOKENS SmolLM2 tokens, one per held-out document of `kind`, spread evenly."""
    v, split = vocabulary("smollm2"), training_text()
    docs = [d for d in split.held_out if d.kind == kind]
    out = []
    for d in [docs[i] for i in np.linspace(0, len(docs) - 1, len(docs)).astype(int)]:
        ids = v.encode([d])
        if len(ids) >= 2 * PROMPT_TOKENS:
            out.append(ids[len(ids) // 2 - PROMPT_TOKENS // 2:][:PROMPT_TOKENS].tolist())
    pick = np.linspace(0, len(out) - 1, min(count, len(out))).astype(int)
    return [out[i] for i in pick]


def acceptance(target, draft, prompts: int, tokens: int, spec: str) -> dict:
    name = spec.removeprefix(trained.PREFIX)
    out = {"manifest_agreement": trained.manifest(name).get("held_out_teacher_agreement") if spec != name else None}
    for kind in ("code", "prose"):
        acc, drafted, reached = np.zeros(8), np.zeros(8), np.zeros(8)
        ps = held_out_prompts(kind, prompts)
        for ids in track(ps, description=f"acceptance on held-out {kind}"):
            s = generate(target, ids, draft=draft, k=8, max_new_tokens=tokens).stats
            acc += s.accepted_by_position
            drafted += s.drafted_by_position
            reached += s.reached_by_position
        out[kind] = {"prompts": len(ps), "tokens": tokens, "by_position": list(acc / np.maximum(drafted, 1)),
                     "conditional_by_position": list(acc / np.maximum(reached, 1))}
    return out


def requests(tok) -> dict[str, list[list[int]]]:
    return {kind: [chat_ids(tok, p) for p in chat_prompts(kind)] for kind in CHAT_KINDS}


def greedy(target, tok, draft, tokens: int) -> dict:
    eos, rows = tok.eos_token_id, []
    methods = (("lookup", lambda: PromptLookup(3), 4), ("lookup", lambda: PromptLookup(3), "auto"),
               ("draft", lambda: draft, 3), ("draft", lambda: draft, "auto"))
    items = [(kind, i, ids) for kind, ps in requests(tok).items() for i, ids in enumerate(ps)]
    for kind, i, ids in track(items, description="greedy vs transformers"):
        ref = target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=tokens, eos_token_id=eos,
                              pad_token_id=eos)[0, len(ids):].tolist()
        for name, make, k in methods:
            got = generate(target, ids, draft=make(), k=k, max_new_tokens=tokens, eos_token_id=eos).tokens
            rows.append({"kind": kind, "request": i, "drafter": name, "k": str(k), "tokens": len(ref),
                         "equal": got == ref})
    return {"tokens": tokens, "rows": rows, "equal": sum(r["equal"] for r in rows), "runs": len(rows)}


def chi2(target, tok, draft, samples: int, drafter: str) -> dict:
    ps = [ids for kind in requests(tok).values() for ids in kind]
    t0 = time.perf_counter()
    level = run_level3(target, draft, tok, prompts=ps, ks=(3,), greedy_tokens=16, samples=samples,
                       tokens_per_run=100, seed=0)
    return {"samples": samples, "tokens_per_run": 100, "k": 3, "drafter": drafter, "spec": vars(level.spec), "power": vars(level.power),
            "greedy_equal": [vars(g) for g in level.greedy], "verdict": level.verdict, "reason": level.reason,
            "wall_s": time.perf_counter() - t0}


def fast_draft(spec: str):
    """The draft in bfloat16 with moespec's compiled small-n linear layers (`moe.dense.fast_linear`),
    its output layer included: half the bytes of its 49,152-row head. Only the draft's numerics
    change, so the output is still the target's; None where the compiled layers do not build."""
    from moespec.moe import dense

    if not dense.available():
        return None
    model = load(spec, dtype="bfloat16")[0]
    dense.fast_linear(model)
    return model


def sweep(target, tok, drafters: dict, ks, tokens: int, reps: int, count: int) -> dict:
    eos, out = tok.eos_token_id, {}
    for kind, ps in requests(tok).items():
        ps = ps[:count]
        cells: dict[str, list[float]] = {}
        by_request = []
        for i, ids in enumerate(track(ps, description=f"K-sweep, {kind} requests")):
            runs = {"plain": lambda ids=ids: generate(target, ids, k=0, max_new_tokens=tokens, eos_token_id=eos)}
            for name, make in drafters.items():
                for k in [*ks, "auto"]:
                    runs[f"{name} k={k}"] = (lambda ids=ids, make=make, k=k: generate(
                        target, ids, draft=make(), k=k, max_new_tokens=tokens, eos_token_id=eos))
            tps: dict[str, list[float]] = {m: [] for m in runs}
            first: dict[str, object] = {}
            names = list(runs)
            for rep in range(reps):
                for m in names[rep % len(names):] + names[: rep % len(names)]:  # rotate the order
                    r = runs[m]()
                    tps[m].append(len(r.tokens) / r.stats.total_s)
                    first.setdefault(m, r)
            plain_tokens = first["plain"].tokens
            for m, r in first.items():
                assert r.tokens == plain_tokens, f"{kind} request {i}: {m}'s greedy tokens differ from plain"
            med = {m: statistics.median(v) for m, v in tps.items()}
            by_request.append({"request": i, "tokens": len(plain_tokens), "tokens_per_s": med,
                               "acceptance": {m: first[m].stats.acceptance for m in runs if m != "plain"},
                               "auto_k": {m: {str(k): c for k, c in sorted(Counter(first[m].stats.k_per_round).items())}
                                          for m in runs if m.endswith("auto")}})
            for m in runs:
                cells.setdefault(m, []).append(med[m] / med["plain"])
        out[kind] = {"requests": by_request, "speedup": {m: statistics.median(v) for m, v in cells.items()},
                     "plain_tokens_per_s": statistics.median(r["tokens_per_s"]["plain"] for r in by_request)}
    return {"tokens": tokens, "reps": reps, "ks": list(ks), "requests_per_kind": count, "by_kind": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    ap.add_argument("--prompts", type=int, default=12, help="held-out windows per kind (acceptance)")
    ap.add_argument("--tokens", type=int, default=96, help="new tokens per decoding")
    ap.add_argument("--samples", type=int, default=9_200, help="sampled tokens per method (chi2)")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    ap.add_argument("--reps", type=int, default=2, help="repetitions of every sweep cell")
    ap.add_argument("--chi2-drafter", default="draft-bf16", choices=["draft", "draft-bf16"],
                    help="the draft of the sampled test (bf16 with compiled layers: the faster of the two here)")
    ap.add_argument("--requests", type=int, default=6, help="chat requests of each kind in the sweep (at most 6)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--draft", default="trained:smollm2-draft", help="the draft model (SmolLM2's tokenizer)")
    ap.add_argument("--drafters", nargs="+", default=["lookup", "draft", "draft-bf16"],
                    choices=["lookup", "draft", "draft-bf16"],
                    help="sweep drafters: prompt lookup (n = 3), the draft, the draft in bf16 with compiled layers")
    ap.add_argument("--out", required=True, help="folder for one JSON per part")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, tok = load("smollm2")
    draft = load(args.draft)[0]  # a causal LM: generate wraps it, the gate samples from it alone
    out = Path(args.out)
    for part in args.parts:
        if part == "acceptance":
            payload = acceptance(target, draft, args.prompts, args.tokens, args.draft)
        elif part == "greedy":
            payload = greedy(target, tok, draft, args.tokens)
        elif part == "chi2":
            sampler = fast_draft(args.draft) if args.chi2_drafter == "draft-bf16" else None
            payload = chi2(target, tok, sampler or draft, args.samples, args.chi2_drafter if sampler else "draft")
        else:
            makers = {"lookup": lambda: PromptLookup(3), "draft": lambda: draft}
            if "draft-bf16" in args.drafters:
                fast = fast_draft(args.draft)
                if fast is None:
                    print("draft-bf16: the compiled layers do not build here; left out")
                else:
                    makers["draft-bf16"] = lambda: fast
            drafters = {name: makers[name] for name in args.drafters if name in makers}
            payload = sweep(target, tok, drafters, args.ks, args.tokens, args.reps, args.requests)
        artifacts.write(out / f"{part}.json", f"smollm2-{part}", {"config": vars(args), part: payload})
        report(part, payload)


def report(part: str, p: dict) -> None:
    c = Console(width=200)
    if part == "acceptance":
        t = Table("text", "prompts", "accepted/drafted at positions 1..8", "conditional",
                  title="trained:smollm2-draft vs SmolLM2, greedy, k = 8, held-out text")
        for kind in ("code", "prose"):
            a = p[kind]
            t.add_row(kind, str(a["prompts"]), " ".join(f"{x:.2f}" for x in a["by_position"]),
                      " ".join(f"{x:.2f}" for x in a["conditional_by_position"]))
        c.print(t)
    elif part == "greedy":
        c.print(f"greedy speculative == transformers greedy generate: {p['equal']}/{p['runs']} runs "
                f"(up to {p['tokens']} tokens each)")
    elif part == "chi2":
        s, w = p["spec"], p["power"]
        c.print(f"two-sample chi-square, {s['n'][0]:,} tokens per method: speculative vs target-only "
                f"chi2 = {s['chi2']:.1f}, dof = {s['dof']}, p = {s['pvalue']:.3f}; draft's own sampling vs "
                f"target-only p = {w['pvalue']:.2g}; verdict {p['verdict']} ({p['wall_s'] / 60:.1f} min)")
    else:
        for kind, e in p["by_kind"].items():
            t = Table("method", "speedup over plain (median of requests)",
                      title=f"K-sweep on {kind} requests, plain {e['plain_tokens_per_s']:.1f} tokens/s")
            for m, x in e["speedup"].items():
                t.add_row(m, f"{x:.2f}")
            c.print(t)


if __name__ == "__main__":
    main()
