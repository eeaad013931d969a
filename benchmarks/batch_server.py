"""Speculation at batch size B against llama-server (issue 42): total tokens/s at B = 1, 2, 4, 8, one run.

Each B: B prompts decoded at once, greedy, --new-tokens each, 2 threads; every method once untimed,
then --reps repetitions in a rotating order, medians. Two parts:

  pair    the trained pair's q8_0 exports (trained:olmoe drafted by trained:draft, made as
          `benchmarks/llama_cpp.py` does), held-out code prompts of 256 bytes. The acceptance a is
          measured first on other held-out prompts (k = 4, accepted over tested drafts: the geometric
          MLE), V_B(0..max_k) the engine's own step with the draft on the same held-out prompts
          (`engine_step_times`: the median round of `generate_batch` at each k), k̂*(a, B) =
          `best_draft_length(V_B, a)`. Methods: moespec `generate_batch` at k̂*(a, B) with the draft;
          moespec plain batched (k = 0); llama-server -np B plain (llama.cpp's plain batched decoding);
          llama-server -np B with the draft at its defaults (--spec-type draft-simple -md; n-max 3,
          n-min 0, p-min 0 in this llama.cpp); llama-server with moespec's emitted settings for -np B
          (`costmodel.settings.recommend_batches`, its llama.cpp fragment verbatim).
  oracle  a converter-written MoE file: a random-initialized transformers OLMoE checkpoint at OLMoE's
          expert widths (ORACLE_MODEL, SmolLM2's tokenizer, embeddings at std 0.3), converted to q8_0
          by llama.cpp's own converter once (~/.cache/moespec/batch-server). moespec at k̂*(a, B) with
          the oracle (an `OracleDraft` per sequence, its reference the prompt's greedy continuation) at
          each --acceptances, V_B timed without a draft; against moespec plain batched and llama-server
          -np B plain. No llama-server speculation here: it cannot draft the target's own tokens (its
          --spec-synth-* options accept a real draft's tokens at random: they time that draft).

Rates leave out the prefill on both sides: moespec's are the new tokens after the first round over
the rounds' time after it (`BatchStats.total_s` starts after the prefill); llama-server's are
Σ (predicted_n - 1) over the slowest slot's predicted_ms (its timings start at each slot's first
token, which the prompt pass gives). The server gets the B prompts as one /completion request of B
token-id lists (B tasks queued at once, a slot each), cache_prompt off, ignore_eos on. Wall rates
(prefill, HTTP and all) are in the JSON too, with the machine's steadiness (`costmodel.steadiness`).
Goals, on decode rates: moespec at k̂* >= 1.0x llama-server plain at every B; >= 1.1x llama-server's
defaults where speculation pays at all (k̂*(a, B) >= 1). llama-server listens on 127.0.0.1 only,
answers a bounded number of requests, each with a timeout, and is always stopped. Run it on an
otherwise idle machine (about 5 minutes on 2 cores):

    python benchmarks/batch_server.py --out benchmarks/results/batch_server.json
    python benchmarks/batch_server.py --quick          # B = 1, 2, 16 tokens, 1 repetition: ~20 s
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from moespec.costmodel.steadiness import Phase, Steadiness, round_factors

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # keep llama_cpp.py off `import llama_cpp`
_spec = importlib.util.spec_from_file_location("llama_cpp_bench", HERE / "llama_cpp.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

HOST = "127.0.0.1"  # llama-server listens and is asked on the loopback address only
SLOT_CTX = 512  # positions per sequence, in moespec and in each llama-server slot
CALIBRATION = 8  # held-out prompts that measure the pair's acceptance and step times, none of them timed
REQUEST_TIMEOUT = 600  # seconds one /completion may take
READY_TIMEOUT = 120  # seconds llama-server may take to load and answer /health
BUSY = 0.5  # a load average above this before the run: another job shares the cores
ORACLE_MODEL = dict(hidden_size=1024, intermediate_size=512, num_experts=64, num_experts_per_tok=8,
                    num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=16,
                    max_position_embeddings=4096, tie_word_embeddings=False)
EMBEDDING_STD = 0.3  # as tests/converted.py: routing follows the token


# ---------------------------------------------------------------- the converter-written file

def oracle_file() -> Path:
    """The q8_0 GGUF file of ORACLE_MODEL, written by llama.cpp's converter once (locked, cached)."""
    import torch
    import transformers

    from moespec.models import gguf
    from moespec.models.llama_convert import cache_dir, convert, locked

    versions = [importlib.metadata.version(p) for p in ("transformers", "llama-cpp-python", "torch")]
    key = hashlib.sha256(json.dumps([ORACLE_MODEL, EMBEDDING_STD, versions], sort_keys=True).encode()).hexdigest()
    out = cache_dir() / "batch-server" / f"olmoe-{key[:12]}-q8_0.gguf"
    with locked(out.with_name(out.name + ".lock")):
        if out.is_file():
            return out
        print(f"making {out}", flush=True)
        tok = gguf.tokenizer(gguf.SMOLLM2)
        config = transformers.OlmoeConfig(**ORACLE_MODEL, vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                                          eos_token_id=tok.eos_token_id)
        with tempfile.TemporaryDirectory(dir=out.parent) as folder, torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(config)
            torch.nn.init.normal_(model.get_input_embeddings().weight, std=EMBEDDING_STD)
            model.save_pretrained(folder)
            tok.save_pretrained(folder)
            del model
            convert(folder, out, "q8_0")
    return out


# ---------------------------------------------------------------- llama-server

class Server:
    """llama-server with -c and -b for `slots` slots on a free loopback port, for a `with` block that
    always stops it; at most `max_requests` completions, each within REQUEST_TIMEOUT."""

    def __init__(self, model: Path, args: list[str], *, slots: int, log: Path, max_requests: int):
        self.cmd = [str(bench.llama_tools.build_server()), "-m", str(model), "--host", HOST, "-t", str(bench.THREADS),
                    "-tb", str(bench.THREADS), "-c", str(slots * SLOT_CTX), "-b", str(max(2048, slots * SLOT_CTX)),
                    "--no-repack", *args]  # repacking off in both engines (llama_cpp.py)
        self.log, self.left, self.proc = log, max_requests, None

    def __enter__(self) -> "Server":
        with socket.socket() as s:
            s.bind((HOST, 0))
            self.port = s.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}  # only the flags given
        with self.log.open("w") as log:
            self.proc = subprocess.Popen([*self.cmd, "--port", str(self.port)], stdout=log, stderr=subprocess.STDOUT,
                                         env=env)
        try:
            deadline = time.monotonic() + READY_TIMEOUT
            while not self._healthy():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"llama-server did not come up ({shlex.join(self.cmd)}):\n"
                                       + "\n".join(self.log.read_text().splitlines()[-15:]))
                time.sleep(0.2)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.port}/health", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def complete(self, prompts: list[list[int]], new: int) -> list[dict]:
        """One /completion of every prompt (token ids), greedy, exactly `new` tokens each; in prompt order."""
        if self.left < 1:
            raise RuntimeError("llama-server: the request budget of this run is spent")
        self.left -= 1
        body = {"prompt": prompts, "n_predict": new, "temperature": 0, "cache_prompt": False, "ignore_eos": True,
                "return_tokens": True}
        req = urllib.request.Request(f"http://{HOST}:{self.port}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT) as r:
            got = json.loads(r.read())
        got = sorted(got if isinstance(got, list) else [got], key=lambda x: x.get("index", 0))
        counts = [(x["tokens_evaluated"], x["timings"]["predicted_n"]) for x in got]
        if counts != [(len(p), new) for p in prompts]:  # its prompts are ours (no BOS added), its lengths too
            raise RuntimeError(f"llama-server read and wrote (prompt, new) tokens {counts}; asked "
                               f"{[(len(p), new) for p in prompts]}")
        return got


# ---------------------------------------------------------------- one timed call of each kind

def moespec_call(target, prompts, *, new: int, limit: int, draft=None, k: int = 0) -> tuple[dict, list]:
    """generate_batch once: its decode rate, wall rate and realized acceptance; and the tokens."""
    from moespec.engine.batch import generate_batch

    t0 = time.perf_counter()
    out = generate_batch(target, prompts, draft=draft, k=k, max_new_tokens=new, vocab_limit=limit)
    wall = time.perf_counter() - t0
    b = out[0].batch
    first = sum(r.stats.tokens_per_round[0] for r in out)  # the first round: the prompt's last token's pass
    reached = sum(sum(r.stats.reached_by_position) for r in out)
    return ({"decode": (b.new_tokens - first) / (b.total_s - b.round_s[0]), "wall": b.new_tokens / wall,
             "acceptance": sum(r.stats.accepted for r in out) / reached if reached else None},
            [r.tokens for r in out])


def server_call(server: Server, prompts, *, new: int) -> tuple[dict, list]:
    """One batch on llama-server: decode rate from its timings, wall rate, its drafts' acceptance."""
    t0 = time.perf_counter()
    got = server.complete(prompts, new)
    wall = time.perf_counter() - t0
    t = [x["timings"] for x in got]
    drafted = sum(x.get("draft_n", 0) for x in t)
    return ({"decode": sum(x["predicted_n"] - 1 for x in t) / (max(x["predicted_ms"] for x in t) / 1e3),
             "wall": len(prompts) * new / wall,
             "acceptance": sum(x.get("draft_n_accepted", 0) for x in t) / drafted if drafted else None},
            [x["tokens"] for x in got])


def rotate(methods: dict, reps: int) -> tuple[dict[str, list[dict]], dict[str, list]]:
    """Each method once untimed (its tokens returned), then `reps` rounds in an order rotated by one per round."""
    names = list(methods)
    tokens = {n: methods[n](-1)[1] for n in names}
    samples = {n: [] for n in names}
    for rep in range(reps):
        for n in names[rep % len(names):] + names[: rep % len(names)]:
            samples[n].append(methods[n](rep)[0])
    return samples, tokens


def medians(samples: dict, field: str = "decode") -> dict[str, float]:
    return {n: statistics.median(s[field] for s in v) for n, v in samples.items()}


def steadiness(name: str, samples: dict) -> Phase:
    """The machine's speed at each repetition, read off every method's seconds per token (`costmodel.steadiness`)."""
    times = np.array([[1 / x["decode"] for x in v] for v in samples.values()])  # [methods, reps]
    return Phase(name, tuple(float(f) for f in round_factors(times)))


def goal(ratio: float | None, bound: float) -> str:
    return "n/a" if ratio is None else ("met" if ratio >= bound else "missed")


# ---------------------------------------------------------------- the parts

def engine_step_times(target, draft, prompts, sizes, max_k: int, *, new: int, limit: int, reps: int) -> dict:
    """{"V": {B: [V_B(0..max_k)] s}}: each step of the engine itself, the draft's k steps, the verify pass,
    the walks and the bookkeeping, the median round with all B sequences live, over `reps` batched calls
    on the first B of `prompts` at each k (held out: none of them is timed below). On a pair whose
    passes take half a millisecond, the step's time outside the passes is a large share of it, which
    the passes timed alone (`bench.batch_passes`) leave out."""
    from moespec.engine.batch import generate_batch

    V = {}
    for B in sizes:
        V[B] = []
        for k in range(max_k + 1):
            rounds = []
            for _ in range(reps):
                b = generate_batch(target, prompts[:B], draft=draft if k else None, k=k, max_new_tokens=new,
                                   vocab_limit=limit)[0].batch
                rounds += [t for t, live in zip(b.round_s, b.live_per_round) if live == B]
            V[B].append(statistics.median(rounds))
    return {"V": V, "source": "engine rounds on the calibration prompts", "reps": reps}


def part_pair(args, logs: Path) -> dict:
    from moespec.costmodel.settings import recommend_batches
    from moespec.models import load
    from moespec.models.tokenizer import ByteTokenizer

    f = bench.files({"trained-olmoe-q8_0", "trained-draft-q8_0"})
    target_path, draft_path = f["trained-olmoe-q8_0"], f["trained-draft-q8_0"]
    tok, top = ByteTokenizer(), max(args.batch_sizes)
    ids = [tok.encode(t, add_bos=True) for t in bench.byte_prompts("code", count=max(top, 8) + CALIBRATION)]
    prompts, calibration = ids[:top], ids[-CALIBRATION:]  # the same calibration prompts at any --batch-sizes
    seqs = max(top, CALIBRATION)
    if top > CALIBRATION:
        raise SystemExit(f"--batch-sizes up to {CALIBRATION}: the pair's step times are timed on {CALIBRATION} prompts")
    target, _ = load(str(target_path), backend="llama.cpp", threads=bench.THREADS, sequences=seqs, n_ctx=SLOT_CTX)
    draft, _ = load(str(draft_path), backend="llama.cpp", threads=bench.THREADS, sequences=seqs, n_ctx=SLOT_CTX)
    limit = len(tok)
    cal = moespec_call(target, calibration, new=args.new_tokens, limit=limit, draft=draft, k=4)[0]
    a = cal["acceptance"]
    steps = engine_step_times(target, draft, calibration, args.batch_sizes, args.max_k, new=args.new_tokens,
                              limit=limit, reps=args.step_reps)
    (rec,) = recommend_batches(steps["V"], [a], draft=str(draft_path))
    out = {"target": target_path, "draft": draft_path, "acceptance": a, "calibration": cal, "step_times": steps,
           "sizes": {}}
    for B in args.batch_sizes:
        ps, k = prompts[:B], rec.k_star[B]
        emitted = rec.per_batch[B][0]
        plain_args = ["-np", str(B)]
        configs = {"server plain": plain_args,
                   "server defaults": [*plain_args, "--spec-type", "draft-simple", "-md", str(draft_path)]}
        if emitted.speculate:
            configs["server emitted"] = shlex.split(emitted.fragment)
        with ExitStack() as stack:
            servers = {n: stack.enter_context(Server(target_path, flags, slots=B, log=logs / f"pair-{B}-{n[7:]}.log",
                                                     max_requests=args.reps + 1)) for n, flags in configs.items()}
            methods = {"moespec plain": lambda rep: moespec_call(target, ps, new=args.new_tokens, limit=limit)}
            if k > 0:
                methods["moespec k̂*"] = lambda rep: moespec_call(target, ps, new=args.new_tokens, limit=limit,
                                                                  draft=draft, k=k)
            methods.update({n: (lambda rep, s=s: server_call(s, ps, new=args.new_tokens)) for n, s in servers.items()})
            samples, tokens = rotate(methods, args.reps)
        same = sum(x == y for x, y in zip(tokens["moespec plain"], tokens["server plain"]))
        m = medians(samples)
        m.setdefault("moespec k̂*", m["moespec plain"])  # k̂* = 0: plain decoding is what moespec runs
        m.setdefault("server emitted", m["server plain"])  # k̂* = 0: the emitted fragment turns speculation off
        ratios = {"moespec k̂* / server plain": m["moespec k̂*"] / m["server plain"],
                  "moespec k̂* / server defaults": m["moespec k̂*"] / m["server defaults"] if k > 0 else None,
                  "server emitted / server defaults": m["server emitted"] / m["server defaults"],
                  "moespec plain / server plain": m["moespec plain"] / m["server plain"]}
        out["sizes"][B] = {"k_star": k, "emitted": emitted.fragment, "samples": samples, "tokens_per_s": m,
                           "steadiness": steadiness(f"pair, B = {B}", samples),
                           "wall_tokens_per_s": medians(samples, "wall"), "ratios": ratios,
                           "server_plain_same_tokens": f"{same}/{B}",
                           "goals": {">= 1.0x server plain": goal(ratios["moespec k̂* / server plain"], 1.0),
                                     ">= 1.1x server defaults": goal(ratios["moespec k̂* / server defaults"], 1.1)}}
        print(f"pair B={B} k̂*={k}", {n: round(v, 1) for n, v in m.items()},
              f"server plain = moespec plain: {same}/{B}", flush=True)
    return out


def part_oracle(args, logs: Path) -> dict:
    import torch

    from moespec.bench.batch_passes import batch_step_times
    from moespec.costmodel.theory import best_draft_length
    from moespec.engine.proposers import OracleDraft
    from moespec.models import load

    path, top = oracle_file(), max(args.batch_sizes)
    target, tok = load(str(path), backend="llama.cpp", threads=bench.THREADS, sequences=top, n_ctx=SLOT_CTX)
    prompts = [tok.encode(t) for t in bench.byte_prompts("code", count=top)]  # the file's own BOS rule
    limit = len(tok)
    depth = round(statistics.mean(map(len, prompts))) + args.new_tokens // 2
    steps = batch_step_times(path, args.batch_sizes, args.max_k, depth=depth, reps=args.step_reps,
                             threads=bench.THREADS)
    out = {"file": path, "model": ORACLE_MODEL, "step_times": steps, "sizes": {}}
    for B in args.batch_sizes:
        ps = prompts[:B]
        ks = {a: best_draft_length(steps["V"][B], a) for a in args.acceptances}
        _, greedy = moespec_call(target, ps, new=args.new_tokens, limit=limit)
        refs = [torch.tensor(p + g, dtype=torch.long) for p, g in zip(ps, greedy)]  # [P + new] each

        def oracle(rep, a):
            drafts = [OracleDraft(a, seed=1000 * (rep + 1) + i, reference=refs[i]) for i in range(B)]
            record, tokens = moespec_call(target, ps, new=args.new_tokens, limit=limit, draft=drafts, k=ks[a])
            record["reanchors"] = sum(d.reanchors for d in drafts)  # re-decoded references: the oracle's own cost
            return record, tokens

        with Server(path, ["-np", str(B)], slots=B, log=logs / f"oracle-{B}.log", max_requests=args.reps + 1) as s:
            methods = {"moespec plain": lambda rep: moespec_call(target, ps, new=args.new_tokens, limit=limit),
                       "server plain": lambda rep: server_call(s, ps, new=args.new_tokens)}
            methods.update({f"moespec k̂*, a={a}": (lambda rep, a=a: oracle(rep, a)) for a in args.acceptances
                            if ks[a] > 0})
            samples, tokens = rotate(methods, args.reps)
        same = sum(x == y for x, y in zip(tokens["moespec plain"], tokens["server plain"]))
        m = medians(samples)
        rows = {}
        for a in args.acceptances:
            rate = m.get(f"moespec k̂*, a={a}", m["moespec plain"])
            rows[a] = {"k_star": ks[a], "tokens_per_s": rate, "ratio": rate / m["server plain"],
                       "goal >= 1.0x server plain": goal(rate / m["server plain"], 1.0)}
        out["sizes"][B] = {"samples": samples, "tokens_per_s": m, "wall_tokens_per_s": medians(samples, "wall"),
                           "by_acceptance": rows, "server_plain_same_tokens": f"{same}/{B}",
                           "steadiness": steadiness(f"oracle, B = {B}", samples)}
        print(f"oracle B={B}", {n: round(v, 1) for n, v in m.items()}, f"server plain = moespec plain: {same}/{B}",
              flush=True)
    return out


# ---------------------------------------------------------------- tables and main

def print_tables(result: dict, new: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=220)
    if "pair" in result:
        p = result["pair"]
        t = Table("B", "k̂*", "moespec k̂*", "moespec plain", "server plain", "server defaults", "server emitted",
                  "k̂* ÷ server plain", "k̂* ÷ defaults", "emitted ÷ defaults", "goals (≥1.0, ≥1.1)",
                  title=f"trained pair q8_0, a = {p['acceptance']:.3f}: decode tokens/s of all B sequences, "
                        f"{new} new tokens each, {bench.THREADS} threads")
        for B, r in p["sizes"].items():
            m, q = r["tokens_per_s"], r["ratios"]
            names = ("moespec k̂*", "moespec plain", "server plain", "server defaults", "server emitted")
            t.add_row(str(B), str(r["k_star"]), *(f"{m[n]:.0f}" for n in names),
                      *("-" if v is None else f"{v:.2f}" for v in list(q.values())[:3]), ", ".join(r["goals"].values()))
        console.print(t)
    if "oracle" in result:
        o = result["oracle"]
        t = Table("B", "a", "k̂*", "moespec k̂*", "moespec plain", "server plain", "k̂* ÷ server plain",
                  "goal (≥1.0)", title=f"converter-written OLMoE-shaped q8_0, oracle draft: decode tokens/s, "
                                       f"{new} new tokens each")
        for B, r in o["sizes"].items():
            m = r["tokens_per_s"]
            for a, row in r["by_acceptance"].items():
                t.add_row(str(B), f"{a:g}", str(row["k_star"]), f"{row['tokens_per_s']:.0f}",
                          f"{m['moespec plain']:.0f}", f"{m['server plain']:.0f}", f"{row['ratio']:.2f}",
                          row["goal >= 1.0x server plain"])
        console.print(t)


def main() -> None:
    from moespec import artifacts

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="+", choices=("pair", "oracle"), default=["pair", "oracle"])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--step-reps", type=int, default=5, help="repetitions of each timed pass (oracle) or batched call (pair) of V_B")
    ap.add_argument("--max-k", type=int, default=8)
    ap.add_argument("--acceptances", type=float, nargs="+", default=[0.6, 0.8, 0.95])
    ap.add_argument("--quick", action="store_true", help="B = 1, 2, 16 tokens, one repetition: a plumbing check")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "batch_server.json")
    args = ap.parse_args()
    if args.quick:
        args.batch_sizes, args.new_tokens, args.reps, args.step_reps, args.max_k = [1, 2], 16, 1, 2, 4
        args.acceptances = [0.8]
    if args.new_tokens < args.max_k + 2 or min(args.batch_sizes) < 1 or args.reps < 1:
        ap.error(f"need --new-tokens >= --max-k + 2, batch sizes >= 1 and --reps >= 1; got {args.new_tokens}, "
                 f"{args.batch_sizes}, {args.reps}")
    bench.llama_tools.build_server()
    busy = os.getloadavg()[0]
    if busy > BUSY:
        print(f"warning: the machine is busy (load average {busy:.2f} over the last minute): the timings will say "
              "more about the other jobs than about the engines; run it on an idle machine", flush=True)
    result = {"new_tokens": args.new_tokens, "threads": bench.THREADS, "reps": args.reps, "quick": args.quick,
              "rates": "decode only: moespec after its first round, llama-server over predicted_ms (its timings)",
              "load_average_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="batch-server-logs-") as logs:
        for part in args.parts:
            t0 = time.perf_counter()
            result[part] = {"pair": part_pair, "oracle": part_oracle}[part](args, Path(logs))
            result[f"{part}_seconds"] = time.perf_counter() - t0
    result["load_average_after"] = os.getloadavg()
    phases = [r["steadiness"] for part in args.parts for r in result[part]["sizes"].values()]
    result["steadiness"] = Steadiness(tuple(phases)) if args.reps > 1 else None  # one round: nothing to compare
    print_tables(result, args.new_tokens)
    print(result["steadiness"].message if args.reps > 1 else "steadiness: not checked (one repetition)")
    artifacts.write(args.out, "benchmark", result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
