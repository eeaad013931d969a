"""Rounds in which a host drafter proposes nothing, run in one compiled call (`round.quiet_rounds`) or asked
round by round: tokens per second of prompt lookup and ngram-mod at a fixed k against plain decoding.

    python benchmarks/quiet_rounds.py --out benchmarks/results/quiet_rounds.json

Files: llama.cpp's converter's qwen3moe file (q8_0, random weights: ~0.4 ms passes, where a round's
Python is a large share) and SmolLM2-135M-Instruct's Q4_1 file (real text: lookup proposes in most
rounds). Per file, each prompt is decoded plain and by each drafter with its quiet runs on and off
(`HostDrafter.quiet` answering None: the loop then asks the drafter every round, as before), in a
rotating order within each repetition; a ratio is taken within a repetition, the median over
repetitions reported. The tokens of the two ways are checked equal.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != HERE]  # benchmarks/llama_cpp.py is not llama_cpp


def files() -> dict[str, tuple[Path, list[list[int]]]]:
    """{name: (GGUF file, prompts as ids)}: the converted qwen3moe file on seeded random ids, SmolLM2 on
    the shipped edit requests through its chat template."""
    import torch

    from tests.converted import build

    from moespec import texts
    from moespec.bench.candidate import encode_prompts
    from moespec.models import gguf

    qwen = Path(build(Path.home() / ".cache" / "moespec" / "converted")["qwen3moe"]["q8_0"])
    g = torch.Generator().manual_seed(0)
    out = {"converted qwen3moe q8_0": (qwen, [torch.randint(10, 5000, (64,), generator=g).tolist() for _ in range(3)])}
    if gguf.smollm2_available():
        tok = gguf.tokenizer(gguf.SMOLLM2)
        chats = [[{"role": "user", "content": c}] for c in texts.chat_prompts("edit")[:3]]
        out["SmolLM2-135M Q4_1"] = (gguf.smollm2_path(), encode_prompts(tok, chats))
    return out


def decoders():
    """{name: (k, a fresh proposer or None)}."""
    from moespec.engine.ngram import NgramMod
    from moespec.engine.proposers import PromptLookup

    return {"plain": (0, lambda: None), "lookup n=3, k=3": (3, lambda: PromptLookup(3)),
            "ngram-mod n=3, k=3": (3, lambda: NgramMod(3, 3, 1))}


def run(model, prompt: list[int], k: int, proposer, tokens: int, quiet: bool) -> tuple[list[int], float, int]:
    """(tokens, seconds, rounds that drafted) of one call, the quiet runs on or off."""
    from moespec.engine.decode import generate

    if not quiet and proposer is not None:
        proposer.quiet = lambda context, width: None  # this instance asks every round
    t0 = time.perf_counter()
    out = generate(model, prompt, draft=proposer, k=k, max_new_tokens=tokens)
    seconds = time.perf_counter() - t0
    return out.tokens, seconds, out.stats.drafted_by_position[0] if k else 0


def measure(path: Path, prompts: list[list[int]], *, reps: int, tokens: int, threads: int) -> dict:
    from moespec.backends.llama_model import LlamaModel

    model = LlamaModel(path, threads=threads, n_ctx=512)
    ways = [(name, quiet) for name, (k, _) in decoders().items() for quiet in ((True, False) if k else (True,))]
    seconds = {w: [] for w in ways}
    drafted = {w: 0 for w in ways}
    for rep in range(reps + 1):  # the first repetition warms up and is not kept
        for p, prompt in enumerate(prompts):
            order = ways[(rep + p) % len(ways):] + ways[: (rep + p) % len(ways)]
            got = {}
            for name, quiet in order:
                k, make = decoders()[name]
                got[name, quiet] = run(model, prompt, k, make(), tokens, quiet)
            for name, quiet in ways:
                assert got[name, quiet][0] == got[name, True][0], f"{name}: quiet runs changed the tokens"
                if rep:
                    seconds[name, quiet].append(got[name, quiet][1])
                    drafted[name, quiet] += got[name, quiet][2]
    rows = []
    for name, quiet in ways:
        ratios = [a / b for a, b in zip(seconds["plain", True], seconds[name, quiet])]
        rows.append({"decoder": name, "quiet": quiet, "ms_per_token": 1e3 * statistics.median(seconds[name, quiet]) / tokens,
                     "speed_vs_plain": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                     "drafting_rounds": drafted[name, quiet]})
    return {"file": str(path), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    result = {"reps": args.reps, "tokens": args.tokens, "threads": args.threads, "files": {}}
    for name, (path, prompts) in files().items():
        result["files"][name] = measure(path, prompts, reps=args.reps, tokens=args.tokens, threads=args.threads)
        print(f"\n{name} ({len(prompts)} prompts x {args.reps} repetitions, {args.tokens} new tokens)")
        print(f"{'decoder':<22} {'quiet runs':<11} {'ms/token':>9} {'vs plain':>9} {'min-max':>13} {'drafting rounds':>16}")
        for r in result["files"][name]["rows"]:
            print(f"{r['decoder']:<22} {('on' if r['quiet'] else 'off'):<11} {r['ms_per_token']:>9.3f} "
                  f"{r['speed_vs_plain']:>8.3f}x {r['ratio_min']:>6.3f}-{r['ratio_max']:.3f} {r['drafting_rounds']:>16}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
