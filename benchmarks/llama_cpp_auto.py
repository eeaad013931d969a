"""moespec k="auto" on llama.cpp against llama.cpp's own speculative decoding, in one run.

Per pair and prompt kind (issue: "Head-to-head, in one run"):
- moespec on llama.cpp: plain decoding, and k="auto" as a user gets it: a fresh policy on every
  request, warm-started from the store of step times earlier requests of the pair measured (a
  temporary file, never the user's; the held-back calibration request, run first, fills it);
- llama-speculative-simple (llama.cpp's example, built from the installed sdist): at its defaults, at
  every --spec-draft-n-max 1..8 (prompt lookup: its n-gram drafters, and ngram-mod over 3-grams at
  every n-max 1..8; the best of them in hindsight), and at the settings `moespec settings`
  emits (`costmodel.settings.recommend`) from step times and an acceptance measured on a held-back
  calibration prompt of the same kind, never one of the scored prompts (where they turn speculation
  off, llama.cpp's plain decoding: llama-bench at the prompt's depth);
- greedy tokens: moespec's k="auto" against its plain decoding, under --exact (must be identical) and
  under llama.cpp's default settings (the share of requests that differ, reported beside it).

Pairs: exported trained:olmoe (q8_0) drafted by trained:draft (q8_0) on held-out code and prose, and
SmolLM2-135M Q4_1 with prompt lookup on the built-in edit requests. Rates are decode rates: tokens
after the first, over the time after the first token (what llama.cpp's tools time). Medians over
prompts; every sample is kept in the JSON.

    python benchmarks/llama_cpp_auto.py --out benchmarks/results/llama_cpp/llama_cpp_auto.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # keep llama_cpp.py off `import llama_cpp`
_spec = importlib.util.spec_from_file_location("llama_cpp_bench", HERE / "llama_cpp.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

N_MAX = range(1, 9)
SETTINGS = "llama.cpp at moespec's settings"
MAX_K = 8


def moespec(target, ids, *, draft=None, k=0, tok=None, exact_plain=None):
    """(decode rate, tokens, stats) of one moespec request (k="auto": the warm start's default, the store)."""
    from moespec.engine.decode import generate

    out = generate(target, ids, draft=draft, k=k, max_k=MAX_K, max_new_tokens=bench.NEW, eos_token_id=tok.eos_token_id,
                   vocab_limit=len(tok))
    return bench.decode_rate(out.stats), list(out.tokens), out.stats


def llama_spec_args(target: Path, text: str, args: list[str]) -> dict:
    """llama-speculative-simple with `args` after the shared flags (as `bench.llama_spec` runs it)."""
    tools = bench.llama_tools.build_tools()
    cmd = [str(tools["llama-speculative-simple"]), "-m", str(target), "-p", text, "-n", str(bench.NEW), "--temp", "0",
           "-t", str(bench.THREADS), "-td", str(bench.THREADS), "--no-repack", "--no-escape", "-c", "4096", *args]
    for _ in range(3):  # one run in a few hundred stopped after loading, saying nothing: run it again
        run = subprocess.run(cmd, capture_output=True, text=True)
        speed = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", run.stderr)
        if run.returncode == 0 and speed:
            return {"tokens_per_s": int(speed.group(1)) / float(speed.group(2)), "args": args}
    raise RuntimeError(f"{' '.join(cmd)} failed (code {run.returncode}): {run.stderr[-1500:]}")


def emitted(target, tok, calibration, proposer, draft_path: Path | None, lookup: int | None):
    """`moespec settings` for this pair from the calibration prompt: the geometric acceptance of a
    k = 8 request, and the step times V(0..8) the policy measured on a k="auto" request."""
    from moespec.costmodel.settings import recommend

    a = moespec(target, calibration, draft=proposer, k=MAX_K, tok=tok)[2].geometric_acceptance
    V = moespec(target, calibration, draft=proposer, k="auto", tok=tok)[2].policy["step_s"]
    rec = recommend(V, [min(a, 0.999)], draft=None if draft_path is None else str(draft_path), prompt_lookup=lookup)
    llama = rec.rows[0].engine("llama.cpp")
    args = [str(x) for s in llama.values for x in (s.name, s.value)]
    return {"acceptance": a, "V": V, "k_star": rec.rows[0].k_star, "args": args}


def same_tokens(f: dict, name: str, draft_name: str | None, items, exact: bool) -> list[bool]:
    """Per prompt: moespec k="auto" gives the tokens of its plain decoding (greedy), on `exact` models."""
    from moespec.engine.proposers import PromptLookup

    target, tok = bench.llama(f[name], exact=exact)
    proposer = bench.llama(f[draft_name], exact=exact)[0] if draft_name else PromptLookup(3)
    return [moespec(target, ids, tok=tok)[1] == moespec(target, ids, draft=proposer, k="auto", tok=tok)[1]
            for _, ids in items]


def run_pair(f: dict, label: str, name: str, draft_name: str | None, items, calibration) -> dict:
    from moespec.engine.proposers import PromptLookup

    target, tok = bench.llama(f[name])
    proposer = bench.llama(f[draft_name])[0] if draft_name else PromptLookup(3)
    draft_path = f[draft_name] if draft_name else None
    setting = emitted(target, tok, calibration[1], proposer, draft_path, None if draft_name else 3)
    rates: dict[str, list[float]] = {}
    add = lambda key, value: rates.setdefault(key, []).append(value)  # noqa: E731
    base = ["-md", str(draft_path), "--spec-type", "draft-simple"] if draft_name else ["--spec-type", "ngram-simple"]
    for text, ids in items:  # every engine and setting on one prompt before the next: drift falls on all alike
        add("moespec plain", moespec(target, ids, tok=tok)[0])
        add("moespec k=auto", moespec(target, ids, draft=proposer, k="auto", tok=tok)[0])
        add("llama.cpp default", llama_spec_args(f[name], text, base)["tokens_per_s"])
        if draft_name:
            for n in N_MAX:
                add(f"llama.cpp n-max={n}", llama_spec_args(f[name], text, base + ["--spec-draft-n-max", str(n)])
                    ["tokens_per_s"])
        else:  # its other n-gram drafters at their defaults, and ngram-mod (what moespec emits) at every n-max
            for kind in ("ngram-mod", "ngram-map-k", "ngram-cache"):
                add(f"llama.cpp {kind}", llama_spec_args(f[name], text, ["--spec-type", kind])["tokens_per_s"])
            for n in N_MAX:
                add(f"llama.cpp ngram-mod n-max={n}", llama_spec_args(f[name], text, [
                    "--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "3", "--spec-ngram-mod-n-max", str(n),
                    "--spec-ngram-mod-n-min", "1"])["tokens_per_s"])
        if "none" in setting["args"]:  # speculation off: llama.cpp's plain decoding, llama-bench at this depth
            add(SETTINGS, statistics.median(bench.llama_bench(f[name], len(ids), reps=1)))
        else:
            add(SETTINGS, llama_spec_args(f[name], text, setting["args"])["tokens_per_s"])
    m = {k: statistics.median(v) for k, v in rates.items()}
    tuned = {k: v for k, v in m.items() if k.startswith("llama.cpp") and k != "llama.cpp default"
             and "moespec" not in k}
    best = max(tuned, key=tuned.get)
    auto = m["moespec k=auto"]
    default = same_tokens(f, name, draft_name, items, exact=False)
    out = {"samples": rates, "median_tokens_per_s": m, "emitted": setting, "best_in_hindsight": best,
           "goals": {"auto / llama.cpp default (>= 1.1)": auto / m["llama.cpp default"],
                     f"auto / llama.cpp best in hindsight, {best} (>= 0.97)": auto / m[best],
                     "llama.cpp at moespec's settings / its default": m["llama.cpp at moespec's settings"]
                     / m["llama.cpp default"]},
           "greedy": {"default_differing": f"{len(default) - sum(default)}/{len(default)}"}}
    print(label, {k: round(v, 1) for k, v in m.items()}, flush=True)
    print("  emitted:", setting["k_star"], " ".join(setting["args"][-6:]), "| a =", round(setting["acceptance"], 3))
    print("  goals:", {k: round(v, 3) for k, v in out["goals"].items()}, "| greedy:", out["greedy"], flush=True)
    return out


def pairs(f: dict, prompts: int) -> list:
    """(label, target, draft or None, scored [(text, ids)], the held-back calibration (text, ids))."""
    from moespec.models.tokenizer import ByteTokenizer

    byte = ByteTokenizer()
    out = []
    for kind in ("code", "prose"):
        items = [(t, byte.encode(t, add_bos=True)) for t in bench.byte_prompts(kind, prompts + 1)]
        out.append((f"trained pair, held-out {kind}", "trained-olmoe-q8_0", "trained-draft-q8_0", items[1:], items[0]))
    edits = bench.edit_requests(bench.llama(f["smollm2-q4_1"])[1])
    out.append(("smollm2-q4_1, prompt lookup, edit requests", "smollm2-q4_1", None, edits[1:prompts + 1], edits[0]))
    return out


def exact_child(args) -> dict:
    """{label: "identical/requests"} from a child process under --exact's settings (GGML_CPU_TILED_MM=0
    is read once, when ggml loads, so it cannot run in this process after its first decode)."""
    out = args.out.with_name(args.out.stem + ".exact.json")
    cmd = [sys.executable, __file__, "--exact-only", "--prompts", str(args.prompts), "--out", str(out)]
    subprocess.run(cmd, check=True, env={**os.environ, "GGML_CPU_TILED_MM": "0"})
    got = json.loads(out.read_text())
    out.unlink()
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=4, help="scored prompts per pair (one more is held back)")
    ap.add_argument("--exact-only", action="store_true", help="(internal) the --exact greedy check alone")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if "MOESPEC_STEP_TIMES" not in os.environ:  # the warm start's store: a temporary one (the child inherits it)
        os.environ["MOESPEC_STEP_TIMES"] = str(Path(tempfile.mkdtemp(prefix="moespec-h2h-")) / "step-times.json")
    f = bench.files({"trained-olmoe-q8_0", "trained-draft-q8_0"})
    if args.exact_only:
        got = {label: same_tokens(f, name, draft, items, exact=True) for label, name, draft, items, _ in pairs(f, args.prompts)}
        args.out.write_text(json.dumps({k: f"{sum(v)}/{len(v)}" for k, v in got.items()}))
        return
    result: dict = {"threads": bench.THREADS, "new_tokens": bench.NEW}
    if args.out.exists():
        result.update(json.loads(args.out.read_text()))
    if "exact_identical" not in result:
        result["exact_identical"] = exact_child(args)
        print("--exact: moespec k=auto's greedy tokens identical to its plain decoding:", result["exact_identical"])
    for label, name, draft_name, items, calibration in pairs(f, args.prompts):
        if label in result:
            print(f"{label}: kept from {args.out}")
            continue
        t0 = time.perf_counter()
        result[label] = {**run_pair(f, label, name, draft_name, items, calibration), "seconds": time.perf_counter() - t0}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str))  # each pair saved as it ends
    show(result)
    print(f"wrote {args.out}")


def show(result: dict) -> None:
    """One row per pair: decode rates (tokens/s, medians over prompts), the goals, greedy tokens."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"moespec k=auto against llama.cpp's speculative decoding, {result['new_tokens']} new "
                        f"tokens, {result['threads']} threads, tokens/s")
    for col in ("pair", "moespec plain", "moespec k=auto", "llama.cpp default", "llama.cpp best (hindsight)",
                "llama.cpp at moespec's settings", "auto / default", "auto / best", "settings / default",
                "k̂*, a (calibration)", "identical under --exact", "default differs"):
        table.add_column(col)
    for label, r in result.items():
        if not isinstance(r, dict) or "median_tokens_per_s" not in r:
            continue
        m, g = r["median_tokens_per_s"], list(r["goals"].values())
        best = r["best_in_hindsight"]
        table.add_row(label, f"{m['moespec plain']:.1f}", f"{m['moespec k=auto']:.1f}", f"{m['llama.cpp default']:.1f}",
                      f"{best.removeprefix('llama.cpp ')}: {m[best]:.1f}", f"{m[SETTINGS]:.1f}",
                      f"{g[0]:.2f}", f"{g[1]:.2f}", f"{g[2]:.2f}",
                      f"{r['emitted']['k_star']}, {r['emitted']['acceptance']:.2f}",
                      result.get("exact_identical", {}).get(label, "?"), r["greedy"]["default_differing"])
    Console(width=260).print(table)


if __name__ == "__main__":
    main()
