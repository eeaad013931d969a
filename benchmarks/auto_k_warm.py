"""The warm start of k="auto" (`engine.warm_start`) against a cold k="auto", plain decoding and every fixed k.

Cold 96-token calls of synthetic:olmoe-shaped (torch, compiled experts and linear layers, as
`moespec generate` loads it; or a GGUF file on llama.cpp) with the oracle draft, given its
reference so it decodes nothing, at each --acceptances a; the i-th call of every method draws the
oracle's flags from seed i, so the methods meet the same acceptance sequences. Methods, side by side
in one process (`auto_k.side_by_side`: one untimed call of each, then --reps repetitions in an order
that rotates by one per repetition; wall clock around `generate`; tokens/s is new tokens over the
median):
- plain (k = 0) and each fixed k of --ks, the best of them in hindsight;
- auto cold: k="auto" without a warm start (warm_start=False): a fresh AutoK opens and learns;
- auto timed: a fresh AutoK seeded by the call's own timing of pass sizes (warm_start="timed");
- auto store (the default): a fresh AutoK seeded from the store (warm_start="store": step times
  and the pair's acceptance by position) as one earlier call of the same case left it (that first call, a miss, decoded cold): the store file (a temporary one, never the user's) is reset to that state
  after each call, so every repetition is a second call (the reset, a 2 KB write, is inside the
  timed interval). The model's fingerprint, which a new process takes once per loaded model
  before its first lookup, is timed apart (`fingerprint_s`);
- auto session: the default as a user meets it over a sequence of requests in one process: a fresh
  AutoK per call, seeded by a store of its own that every call of the session adds to (the first
  a miss, then 1, 2, ... earlier calls, never reset).
Ratios: auto/plain (the bar where drafts are useless, a = 0.1) and auto/best fixed k (a = 0.9).
Greedy tokens are checked against plain decoding's (asserted on torch; recorded on llama.cpp,
whose quantized passes may differ by pass size).

    python benchmarks/auto_k_warm.py
    python benchmarks/auto_k_warm.py --backend llama.cpp --gguf ~/.cache/moespec/gguf/olmoe-shaped-q8_0.gguf
    python benchmarks/auto_k_warm.py --reps 1 --ks 1 2 4 8 --out /tmp/akw.json  # smoke
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from statistics import median

import torch
from rich.console import Console
from rich.table import Table

from moespec import OracleDraft, artifacts, generate
from moespec.engine import warm_start
from moespec.kernel_names import AUTO
from moespec.models import load

HERE = Path(__file__).resolve().parent
# benchmarks/llama_cpp.py has the llama_cpp package's name: keep this folder off the path, load auto_k by file
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
_spec = importlib.util.spec_from_file_location("auto_k", HERE / "auto_k.py")
auto_k = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(auto_k)
PROMPT, side_by_side = auto_k.PROMPT, auto_k.side_by_side
RESULTS = HERE / "results" / "auto_k_warm"
AUTOS = {"auto cold": False, "auto timed": "timed", "auto store": "store", "auto session": "session"}


def load_target(args):
    """(target, prompt ids, vocabulary limit, fingerprint seconds or None) on the chosen backend."""
    if args.backend == "llama.cpp":
        target, tok = load(str(args.gguf), backend="llama.cpp", threads=args.threads)
        return target, list(tok.encode(PROMPT)), target.vocab_limit or len(tok), None
    torch.set_num_threads(args.threads)
    target, tok = load("synthetic:olmoe-shaped", experts_implementation=AUTO, fast_linear=True)
    from moespec.provenance import model_fingerprint

    t0 = time.perf_counter()
    model_fingerprint(target)
    return target, tok.encode(PROMPT, add_bos=True), len(tok), time.perf_counter() - t0


def run_case(a: float, target, ids: list[int], vocab: int, args, store: Path) -> dict:
    n, max_k = args.tokens, max(args.ks)
    common = dict(max_new_tokens=n, vocab_limit=vocab, eos_token_id=None, max_k=max_k)
    reference = torch.tensor(ids + generate(target, ids, k=0, **common).tokens)

    store.unlink(missing_ok=True)  # the store as one earlier call of this case leaves it
    first = generate(target, ids, draft=OracleDraft(a, seed=10**6, reference=reference), k="auto",
                     warm_start="store", **common)
    assert first.stats.policy["warm_start"]["source"] is None, first.stats.policy["warm_start"]  # a miss: cold
    snapshot = store.read_bytes() if store.exists() else None

    session = store.with_name("session.json")  # the session's own store, kept across its calls
    session.unlink(missing_ok=True)

    def call(k, mode=True):
        calls = iter(range(10**6))  # the i-th call of every method draws the oracle's flags from seed i

        def run():
            draft = OracleDraft(a, seed=next(calls), reference=reference) if k else None
            if mode == "session":
                os.environ["MOESPEC_STEP_TIMES"] = str(session)
            try:
                out = generate(target, ids, draft=draft, k=k, warm_start="store" if mode == "session" else mode,
                               **common)
            finally:
                os.environ["MOESPEC_STEP_TIMES"] = str(store)
            if mode == "store" and snapshot is not None:
                store.write_bytes(snapshot)
            return out
        return run

    methods = {"plain": call(0), **{f"k={k}": call(k) for k in args.ks},
               **{name: call("auto", mode) for name, mode in AUTOS.items()}}
    times, results = side_by_side(methods, args.reps)
    plain = results["plain"][0].tokens
    same = {m: all(r.tokens == plain for r in rs) for m, rs in results.items()}
    if args.backend == "torch":
        assert all(same.values()), f"a={a}: greedy tokens differ from plain decoding's: {same}"
    tps = {m: n / times[m].median for m in methods}
    best = max((f"k={k}" for k in args.ks), key=tps.get)
    case = {"acceptance": a, "tokens_per_s": tps, "best_fixed": best, "identical_tokens": same,
            "seconds": {m: t.to_dict() for m, t in times.items()}, "first_store_call": first.stats.policy}
    for name in AUTOS:
        rs = results[name]
        warm = [r.stats.policy.get("warm_start") or {} for r in rs]
        case[name] = {"over_plain": tps[name] / tps["plain"], "over_best": tps[name] / tps[best],
                      "k_counts": {str(k): c for k, c in sorted(Counter(c for r in rs for c in r.stats.k_per_round)
                                                                    .items())},
                      "warm_start_s": median(w.get("seconds", 0.0) for w in warm),
                      "sources": sorted({str(w.get("source")) for w in warm}),
                      "policy_last": rs[-1].stats.policy}
    return case


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=["torch", "llama.cpp"], default="torch")
    ap.add_argument("--gguf", type=Path, help="the GGUF file of --backend llama.cpp")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=96, help="new tokens per call")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--acceptances", type=float, nargs="+", default=[0.1, 0.9])
    ap.add_argument("--ks", type=int, nargs="+", default=list(range(1, 9)), help="fixed draft lengths")
    ap.add_argument("--out", type=Path, help="default: benchmarks/results/auto_k_warm/<backend>.json")
    args = ap.parse_args()
    if args.backend == "llama.cpp" and args.gguf is None:
        ap.error("--backend llama.cpp needs --gguf PATH (e.g. ~/.cache/moespec/gguf/olmoe-shaped-q8_0.gguf)")
    out = args.out or RESULTS / f"{args.backend.replace('.', '_')}.json"
    store = Path(tempfile.mkdtemp(prefix="moespec-akw-")) / "step-times.json"
    os.environ["MOESPEC_STEP_TIMES"] = str(store)  # never the user's store
    target, ids, vocab, fingerprint_s = load_target(args)
    cases = [run_case(a, target, ids, vocab, args, store) for a in args.acceptances]
    config = {"backend": args.backend, "gguf": args.gguf, "threads": args.threads, "tokens": args.tokens,
              "reps": args.reps, "ks": args.ks, "max_k": max(args.ks), "greedy": True, "prompt_tokens": len(ids),
              "budget_s": warm_start.BUDGET_S, "share": warm_start.SHARE, "fingerprint_s": fingerprint_s}
    artifacts.write(out, "auto_k_warm", {"config": config, "cases": cases})
    report(cases, args)
    print(f"wrote {out}")


def report(cases: list[dict], args) -> None:
    table = Table("a", "plain", "best fixed k", *AUTOS, *(f"{m}/plain" for m in AUTOS), *(f"{m}/best" for m in AUTOS),
                  "warm start ms (timed, store)", "auto timed's k (rounds)",
                  title=f"tokens/s, {args.backend}, greedy oracle, {args.tokens} tokens, median of {args.reps}")
    for c in cases:
        t = c["tokens_per_s"]
        table.add_row(f"{c['acceptance']:.2f}", f"{t['plain']:.1f}", f"{c['best_fixed']}: {t[c['best_fixed']]:.1f}",
                      *(f"{t[m]:.1f}" for m in AUTOS), *(f"{c[m]['over_plain']:.2f}" for m in AUTOS),
                      *(f"{c[m]['over_best']:.2f}" for m in AUTOS),
                      f"{1e3 * c['auto timed']['warm_start_s']:.0f}, {1e3 * c['auto store']['warm_start_s']:.1f}",
                      " ".join(f"{k}:{n}" for k, n in c["auto timed"]["k_counts"].items()))
    Console(width=240).print(table)


if __name__ == "__main__":
    main()
