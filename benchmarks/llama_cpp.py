"""moespec on llama.cpp against llama.cpp itself, in one run.

Parts (--parts, default all; each a section of the JSON and a table):
  plain       plain decoding tokens/s: llama-bench, moespec on llama.cpp (default, --exact), moespec on torch
  scaling     the verify-batch scaling curve tau(n)/tau(1), n = 1..16, per weight type, flash attention on
              and off; the draft-step/target-step ratio of each pair
  agreement   which pass sizes compute the same function (1..64, prefill chunkings, 1 and 2 threads), with
              llama.cpp's defaults and with --exact's settings
  fa-off      the same with flash attention off and nothing else changed (with --library: the only part)
  divergence  default-settings greedy speculative output against plain, per type: moespec, and
              llama.cpp's own speculative decoding (llama-speculative-simple)
  head2head   speculative decoding against llama-speculative-simple: same target, draft and prompts, greedy

llama.cpp's tools come from `benchmarks/llama_tools.py` (the same llama.cpp source as the installed
llama-cpp-python); the GGUF files are exported once into ~/.cache/moespec/gguf. Weight repacking is
off in both engines (it crashes on this machine; `backends/llama_model.py`). Decode rates leave out
the prefill and the first round (llama.cpp's tools time the same span). `--library DIR` runs the
scaling and agreement parts on another libllama (e.g. `llama_tools.build_library(llamafile=False)`).

    python benchmarks/llama_cpp.py --out benchmarks/results/llama_cpp/llama_cpp.json
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
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# this file's name is the llama_cpp package's: keep its folder off the path, or `import llama_cpp` finds it
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
_spec = importlib.util.spec_from_file_location("llama_tools", HERE / "llama_tools.py")
llama_tools = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(llama_tools)

NEW = 96  # new tokens per request
THREADS = 2
PARTS = ("plain", "scaling", "agreement", "fa-off", "divergence", "head2head")
GGUF = llama_tools.CACHE / "gguf"


def files(only: set[str] | None = None) -> dict[str, Path]:
    """Every GGUF file the parts read (or those named in `only`), exported or quantized once (cached)."""
    from moespec.backends.llama_lib import quantize
    from moespec.models.gguf import smollm2_path
    from moespec.models.gguf_export import export_gguf

    GGUF.mkdir(parents=True, exist_ok=True)
    out = {"smollm2-q4_1": smollm2_path()}

    def made(name: str, make) -> Path:
        path = GGUF / f"{name}.gguf"
        if only is not None and name not in only and not (name.endswith("-f32") and any(
                n.startswith(name[:-3]) and n not in out for n in only)):  # an exported file's types need its f32
            return path
        if not path.exists():
            print(f"making {path}", flush=True)
            make(path)
        out[name] = path
        return path

    made("smollm2-f32", lambda p: quantize(out["smollm2-q4_1"], p, "f32"))
    for spec, stem in (("synthetic:olmoe-shaped", "olmoe-shaped"), ("trained:olmoe", "trained-olmoe"),
                       ("trained:draft", "trained-draft"), ("trained:smollm2-draft", "smollm2-draft")):
        f32 = made(f"{stem}-f32", lambda p, spec=spec: export_gguf(spec, p))
        for kind in ("f16", "q8_0", "q4_k"):
            made(f"{stem}-{kind}", lambda p, kind=kind, f32=f32: quantize(f32, p, kind))
    return out


def llama(path: Path, **kw):
    from moespec.models import load

    return load(str(path), backend="llama.cpp", threads=THREADS, **kw)


def decode_rate(stats) -> float:
    """Tokens per second after the prefill and the first round (the span llama.cpp's tools time)."""
    return (stats.new_tokens - stats.tokens_per_round[0]) / (stats.total_s - stats.ttft_s)


def moespec_rate(model, prompt, *, draft=None, k=0, eos=None, limit=None) -> tuple[float, object]:
    from moespec.engine.decode import generate

    out = generate(model, prompt, draft=draft, k=k, max_new_tokens=NEW, eos_token_id=eos, vocab_limit=limit)
    return decode_rate(out.stats), out


def llama_bench(path: Path, depth: int, *, reps: int = 3, flash_attn: str = "auto") -> list[float]:
    """llama-bench's tokens/s of NEW one-token passes after `depth` positions (each repetition)."""
    tools = llama_tools.build_tools()
    cmd = [str(tools["llama-bench"]), "-m", str(path), "-t", str(THREADS), "-p", "0", "-n", str(NEW), "-d", str(depth),
           "-r", str(reps), "--repack", "0", "-fa", {"auto": "auto", "on": "1", "off": "0"}[flash_attn], "-o", "json"]
    run = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return [float(x) for x in json.loads(run.stdout)[0]["samples_ts"]]


def llama_spec(target: Path, text: str, *, draft: Path | None = None, spec_type: str = "draft-simple",
               n_max: int | None = None) -> dict:
    """llama-speculative-simple, greedy: its decode rate, drafted/accepted counts and generated text."""
    tools = llama_tools.build_tools()
    cmd = [str(tools["llama-speculative-simple"]), "-m", str(target), "-p", text, "-n", str(NEW), "--temp", "0",
           "-t", str(THREADS), "-td", str(THREADS), "--no-repack", "--no-escape", "-c", "4096", "--spec-type", spec_type]
    if draft is not None:
        cmd += ["-md", str(draft)]
    if n_max is not None:
        cmd += ["--spec-draft-n-max", str(n_max)]
    for attempt in range(3):  # one run in a few hundred stopped after loading, saying nothing: run it again
        run = subprocess.run(cmd, capture_output=True, text=True)
        speed = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", run.stderr)
        drafted = re.search(r"n_drafted = (\d+)", run.stderr)
        accepted = re.search(r"n_accept\s+= (\d+)", run.stderr)
        if run.returncode == 0 and speed and drafted and accepted:
            break
    else:
        raise RuntimeError(f"{' '.join(cmd)} failed (code {run.returncode}): {run.stderr[-1500:]}")
    tokens, seconds = int(speed.group(1)), float(speed.group(2))
    return {"tokens_per_s": tokens / seconds, "tokens": tokens, "seconds": seconds, "drafted": int(drafted.group(1)),
            "accepted": int(accepted.group(1)), "stdout": run.stdout}


def medians(values: dict) -> dict:
    return {k: statistics.median(v) for k, v in values.items()}


# ---------------------------------------------------------------- prompts

def byte_prompts(kind: str, count: int = 4, length: int = 256) -> list[str]:
    """Held-out text of one kind (never trained on), `count` pieces of `length` bytes."""
    from moespec.texts import CORPUS_HOLDOUT, corpus_documents, held_out

    docs = [d for d in corpus_documents() if d.kind == kind and held_out(d.name, CORPUS_HOLDOUT)]
    text = "\n".join(d.text for d in docs)
    data = text.encode("utf-8")
    pieces = [data[i * length: (i + 1) * length].decode("utf-8", errors="ignore") for i in range(count)]
    return [p for p in pieces if p]


def edit_requests(tok) -> list[tuple[str, list[int]]]:
    """SmolLM2's chat template around the built-in edit requests: (rendered text, the ids llama.cpp's
    tools give that text, with the file's own BOS rule and special tokens parsed)."""
    from moespec.texts import chat_prompts

    out = []
    for request in chat_prompts("edit"):
        text = tok.decode(tok.apply_chat_template([{"role": "user", "content": request}]), skip_special_tokens=False)
        out.append((text, tok.encode(text, parse_special=True)))
    return out


def generated_text(stdout: str, tok, prompt: list[int]) -> str:
    """What llama-speculative-simple generated: its stdout after the echo of the prompt's pieces."""
    echo = b"".join(tok.piece(i, special=True) for i in prompt).decode("utf-8", errors="replace")
    body = stdout[2:] if stdout.startswith("\n\n") else stdout
    if not body.startswith(echo):
        raise ValueError("llama-speculative-simple's output does not start with the prompt")
    return body[len(echo):]


# ---------------------------------------------------------------- parts

def part_plain(f: dict, reps: int, setting: str) -> dict:
    """Plain decoding, side by side, repetitions interleaved; under --exact's settings (another process:
    ggml reads GGML_CPU_TILED_MM once) moespec --exact against llama-bench."""
    from moespec.models import load

    rows = {}
    cases = [("smollm2-q4_1", "smollm2", None), ("olmoe-shaped-f16", "synthetic:olmoe-shaped", "bfloat16"),
             ("olmoe-shaped-q8_0", "synthetic:olmoe-shaped", "bfloat16"), ("trained-olmoe-q8_0", "trained:olmoe", None)]
    for name, torch_spec, dtype in cases:
        prompt = list(range(300, 332)) if name.startswith("smollm2") else [256, *range(40, 71)]
        ours = "moespec llama.cpp" + (" --exact" if setting == "exact" else "")
        model, _ = llama(f[name], exact=setting == "exact")
        torch_model = None
        if setting == "default":
            torch_model, _ = load(torch_spec, backend="torch", fast_linear=True, **({"dtype": dtype} if dtype else {}))
        rates = {"llama-bench": [], ours: [], "moespec torch": []}
        engine_share = []  # the share of moespec's decoding time outside llama.cpp's passes (and their argmax)
        for r in range(reps):  # in turns, llama-bench first on even repetitions: no engine always runs first
            if r % 2 == 0:
                rates["llama-bench"] += llama_bench(f[name], len(prompt), reps=1)
            rate, out = moespec_rate(model, prompt)
            if r % 2 == 1:
                rates["llama-bench"] += llama_bench(f[name], len(prompt), reps=1)
            rates[ours].append(rate)
            engine_share.append(1 - out.stats.target_forward_s / out.stats.total_s)
            if torch_model is not None:
                rates["moespec torch"].append(moespec_rate(torch_model, prompt)[0])
        del torch_model, model
        m = medians({k: v for k, v in rates.items() if v})
        # each repetition's pair ran a minute apart at most: the median of their ratios reads through the
        # machine's drift (here 0.6-1.5x between repetitions), which the ratio of medians does not
        paired = statistics.median(o / b for o, b in zip(rates[ours], rates["llama-bench"]))
        rows[name] = {"samples": rates, "median_tokens_per_s": m, "depth": len(prompt),
                      "moespec_over_llama": m[ours] / m["llama-bench"], "paired_ratio": paired,
                      "engine_share": statistics.median(engine_share)}
        print(name, {k: round(v, 1) for k, v in m.items()}, f"ratio {rows[name]['moespec_over_llama']:.3f}",
              f"paired {paired:.3f}", f"engine share {rows[name]['engine_share']:.4f}", flush=True)
    return rows


def _tau(model, depth: int, ns, reps: int) -> dict[int, float]:
    """Median seconds of an n-token pass at `depth` (sizes interleaved within each repetition)."""
    import torch

    ids = torch.arange(depth + max(ns)) % 200 + 40
    model.reset()
    model.extend(ids[:depth], outputs=1)
    times = {n: [] for n in ns}
    for r in range(reps + 1):
        for n in ns:
            model.truncate(depth)
            t0 = time.perf_counter()
            model.extend(ids[depth: depth + n])
            if r:  # the first round warms each size
                times[n].append(time.perf_counter() - t0)
    return medians(times)


def part_scaling(f: dict, reps: int) -> dict:
    ns = list(range(1, 17))
    out = {"curves": {}, "draft_target_ratio": {}}
    for name in ("smollm2-q4_1", "olmoe-shaped-f32", "olmoe-shaped-f16", "olmoe-shaped-q8_0", "olmoe-shaped-q4_k"):
        for fa in (None, False):
            model, _ = llama(f[name]) if fa is None else (_plain_llama(f[name], flash_attn=False), None)
            tau = _tau(model, 256, ns, reps)
            key = f"{name}, flash attention {'auto' if fa is None else 'off'}"
            out["curves"][key] = {"tau1_ms": 1e3 * tau[1], "ratio": {n: tau[n] / tau[1] for n in ns}}
            print(key, f"tau(1) {1e3 * tau[1]:.2f} ms", " ".join(f"{tau[n] / tau[1]:.2f}" for n in ns), flush=True)
            del model
    for target, draft in (("trained-olmoe-q8_0", "trained-draft-q8_0"), ("trained-olmoe-f16", "trained-draft-f16"),
                          ("smollm2-q4_1", "smollm2-draft-q8_0")):
        t = _tau(llama(f[target])[0], 256, [1], reps)[1]
        d = _tau(llama(f[draft])[0], 256, [1], reps)[1]
        out["draft_target_ratio"][f"{draft} / {target}"] = {"draft_ms": 1e3 * d, "target_ms": 1e3 * t, "ratio": d / t}
    return out


def _plain_llama(path: Path, threads: int = THREADS, **kw):
    from moespec.backends.llama_model import LlamaModel

    return LlamaModel(path, threads=threads, **kw)


def part_agreement(f: dict, setting: str) -> dict:
    """Pass sizes 1..64 over 64 tokens after 600, prefill chunkings, and threads, per type."""
    import torch

    from moespec.backends.exact import ExactPasses
    from moespec.checks.pass_agreement import _agreement, fed_in_passes, pass_sizes, prefill_chunks

    out = {}
    g = torch.Generator().manual_seed(0)
    for name in ("smollm2-q4_1", "smollm2-f32", "trained-olmoe-f32", "trained-olmoe-f16", "trained-olmoe-q8_0",
                 "trained-olmoe-q4_k", "olmoe-shaped-f16", "olmoe-shaped-q8_0", "olmoe-shaped-q4_k"):
        ids = (torch.randint(40, 250, (664,), generator=g)).tolist()
        prompt, text = ids[:600], ids[600:]
        row = {}
        for setting in (setting,):
            make = {"default": lambda t: _plain_llama(f[name], threads=t),
                    "fa-off": lambda t: _plain_llama(f[name], threads=t, flash_attn=False),
                    "exact": lambda t: ExactPasses(_plain_llama(f[name], threads=t, flash_attn=False))}[setting]
            model = make(THREADS)
            sizes = pass_sizes(model, prompt, text, range(1, 65))
            chunks = prefill_chunks(model, prompt, text, (600, 256, 64, 16))
            one = make(1)
            threads = _agreement([THREADS, 1], [fed_in_passes(m, prompt, text, 2) for m in (model, one)])
            row[setting] = {"sizes": sizes.to_dict(), "prefill": chunks.to_dict(), "threads": threads.to_dict()}
            print(name, setting, "pass sizes:", _classes(sizes.classes), "| prefill:", _classes(chunks.classes),
                  "| threads 2 vs 1:", "same" if threads.uniform else f"differ ({max(threads.max_diff):.3g})", flush=True)
            del model, one
        out[name] = row
    return out


def _classes(classes) -> str:
    """Size classes as ranges: ((1,), (2, 3, ..., 63), (64,)) -> '1 | 2-63 | 64'."""
    def span(c):
        return f"{c[0]}-{c[-1]}" if len(c) > 2 and list(c) == list(range(c[0], c[-1] + 1)) else ",".join(map(str, c))
    return " | ".join(span(c) for c in classes)


def part_divergence(f: dict) -> dict:
    """Greedy speculative output under llama.cpp's default settings against plain output."""
    from moespec.checks import gate
    from moespec.checks.llama_reference import llama_greedy
    from moespec.engine.proposers import PromptLookup
    from moespec.models.tokenizer import ByteTokenizer

    out = {}
    byte = ByteTokenizer()
    deep = [byte.encode(t, add_bos=True) for t in byte_prompts("code", 6, 700)]
    cases = [(f"trained-olmoe-{kind}", f["trained-draft-q8_0"], deep) for kind in ("f32", "f16", "q8_0", "q4_k")]
    smol_tok = llama(f["smollm2-q4_1"])[1]
    edits = edit_requests(smol_tok)
    cases += [(name, None, [ids for _, ids in edits]) for name in ("smollm2-q4_1", "smollm2-f32")]
    texts = {tuple(ids): text for text, ids in edits}
    for name, draft_path, prompts in cases:
        target, tok = llama(f[name])
        draft = llama(draft_path)[0] if draft_path else PromptLookup(3)
        reference = lambda p: gate.generate(target, p, k=0, max_new_tokens=NEW, vocab_limit=len(tok),  # noqa: E731
                                            eos_token_id=tok.eos_token_id).tokens
        checks = gate._greedy(target, draft, (1, 4, "auto"), prompts, reference, tokens=NEW, max_k=8,
                              limit=len(tok), eos=tok.eos_token_id)
        # llama.cpp's own speculative decoding at its defaults, its text against its plain greedy text
        own = 0
        for p in prompts:
            plain = tok.decode(llama_greedy(f[name], p, NEW, threads=THREADS, eos=tok.eos_token_id))
            text = texts.get(tuple(p)) or tok.decode(p[1:])  # byte prompts: the text after BOS
            spec = (llama_spec(f[name], text, draft=draft_path) if draft_path else
                    llama_spec(f[name], text, spec_type="ngram-simple"))
            own += not generated_text(spec["stdout"], tok, p).startswith(plain)
        out[name] = {"requests": len(prompts),
                     "moespec": [{"k": c.k, "differing_share": c.differing_share, "first": c.first_mismatch,
                                  "margins": c.margins, "argmax_moves": c.argmax_moves} for c in checks],
                     "llama_cpp_differing_share": own / len(prompts)}
        print(name, " ".join(f"k={c.k}: {c.prompts - c.equal}/{c.prompts}" + (f" (margins {c.margins[0]:.3g}/"
              f"{c.margins[1]:.3g})" if c.margins else "") for c in checks),
              f"| llama.cpp's own: {own}/{len(prompts)}", flush=True)
    return out


def part_head2head(f: dict, reps: int) -> dict:
    """Per pair and prompt kind: plain llama.cpp, moespec (plain, auto, each fixed k) and
    llama-speculative-simple (its default, each n-max, its n-gram types), medians over prompts."""
    from moespec.engine.proposers import PromptLookup
    from moespec.models.tokenizer import ByteTokenizer

    byte = ByteTokenizer()
    out = {}
    pairs = [("trained pair, held-out code", "trained-olmoe-q8_0", "trained-draft-q8_0", byte_prompts("code")),
             ("trained pair, held-out prose", "trained-olmoe-q8_0", "trained-draft-q8_0", byte_prompts("prose"))]
    smol_tok = llama(f["smollm2-q4_1"])[1]
    edits = edit_requests(smol_tok)
    pairs += [(f"{name}, prompt lookup, edit requests", name, None, edits) for name in ("smollm2-q4_1", "smollm2-f32")]
    for label, target_name, draft_name, prompts in pairs:
        target, tok = llama(f[target_name])
        draft = llama(f[draft_name])[0] if draft_name else None
        items = [(t, byte.encode(t, add_bos=True)) for t in prompts] if draft_name else prompts
        rates: dict[str, list[float]] = {}
        depth = round(statistics.mean(len(ids) for _, ids in items))
        rates["llama.cpp plain (llama-bench)"] = llama_bench(f[target_name], depth, reps=reps)
        for text, ids in items:
            eos, limit = tok.eos_token_id, len(tok)
            add = lambda key, value: rates.setdefault(key, []).append(value)  # noqa: E731
            add("moespec plain", moespec_rate(target, ids, eos=eos, limit=limit)[0])
            proposer = draft if draft is not None else PromptLookup(3)
            add("moespec k=auto", moespec_rate(target, ids, draft=proposer, k="auto", eos=eos, limit=limit)[0])
            for k in range(1, 9):
                add(f"moespec k={k}", moespec_rate(target, ids, draft=proposer, k=k, eos=eos, limit=limit)[0])
            if draft_name:
                add("llama.cpp draft-simple default", llama_spec(f[target_name], text, draft=f[draft_name])["tokens_per_s"])
                for n in range(1, 9):
                    add(f"llama.cpp draft-simple n-max={n}",
                        llama_spec(f[target_name], text, draft=f[draft_name], n_max=n)["tokens_per_s"])
            else:
                for kind in ("ngram-simple", "ngram-mod"):
                    add(f"llama.cpp {kind} default", llama_spec(f[target_name], text, spec_type=kind)["tokens_per_s"])
        m = medians(rates)
        plain = m["llama.cpp plain (llama-bench)"]
        llama_fixed = {k: v for k, v in m.items() if k.startswith("llama.cpp") and "plain" not in k}
        default_key = next(k for k in llama_fixed if "default" in k)
        best_llama = max((v for k, v in llama_fixed.items() if "n-max" in k), default=max(llama_fixed.values()))
        best_any = max([v for k, v in m.items() if "k=" in k and "auto" not in k] + list(llama_fixed.values()))
        auto = m["moespec k=auto"]
        goals = {"auto / plain llama.cpp (>= 0.97)": auto / plain,
                 "auto / llama.cpp default (>= 1.1)": auto / m[default_key],
                 "auto / llama.cpp best n-max or type in hindsight (>= 1.0)": auto / best_llama,
                 "auto / best fixed setting of either engine, where one beats plain (>= 0.95)":
                     auto / best_any if best_any > plain else None}
        out[label] = {"samples": rates, "median_tokens_per_s": m, "depth": depth, "goals": goals}
        print(label, {k: round(v, 1) for k, v in m.items()}, flush=True)
        print("  goals:", {k: (None if v is None else round(v, 3)) for k, v in goals.items()}, flush=True)
    return out


def _exact_child(args, part: str) -> dict:
    """`part` under --exact's settings, in a child process with GGML_CPU_TILED_MM=0."""
    out = args.out.with_name(args.out.stem + f".{part}-exact.json")
    cmd = [sys.executable, __file__, "--parts", part, "--setting", "exact", "--reps", str(args.reps), "--out", str(out)]
    subprocess.run(cmd, check=True, env={**os.environ, "GGML_CPU_TILED_MM": "0"})
    got = json.loads(out.read_text())[part]
    out.unlink()
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--library", type=Path, help="run scaling and agreement on the libllama in this folder")
    ap.add_argument("--setting", choices=("default", "exact"), default="default",
                    help="exact: only the --exact rows of plain and agreement (run by the default run itself, in "
                         "a process with GGML_CPU_TILED_MM=0)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    parts = args.parts.split(",")
    if args.library and os.environ.get("LLAMA_CPP_LIB_PATH") != str(args.library):
        env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(args.library)}
        sys.exit(subprocess.call([sys.executable, *sys.argv], env=env))
    if args.setting == "exact":
        os.environ["GGML_CPU_TILED_MM"] = "0"  # --exact's setting, read once by ggml (backends/exact.py)
    from moespec.backends import llama_lib

    f = files()
    result = {"threads": THREADS, "new_tokens": NEW, "library": str(args.library or "llama-cpp-python's own"),
              "system": llama_lib.bindings().llama_print_system_info().decode()}
    if args.out.exists():
        result.update(json.loads(args.out.read_text()))
    for part in parts:
        t0 = time.perf_counter()
        fn = {"plain": lambda: part_plain(f, args.reps, args.setting), "scaling": lambda: part_scaling(f, args.reps * 3),
              "agreement": lambda: part_agreement(f, args.setting), "fa-off": lambda: part_agreement(f, "fa-off"),
              "divergence": lambda: part_divergence(f),
              "head2head": lambda: part_head2head(f, args.reps)}[part]
        result[part] = fn()
        if part in ("plain", "agreement") and args.setting == "default":
            result[part + "_exact"] = _exact_child(args, part)
        result[f"{part}_seconds"] = time.perf_counter() - t0
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str))  # each part saved as it ends
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
