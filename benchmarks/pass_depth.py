"""How a llama.cpp verify pass of n tokens grows with the depth past its prompt, on a small model.

The answer for a user's draft prices its rounds with the target's passes timed on the calibration
prompts (`bench.target_passes`); its rounds run from the prompt's end to the answer's new tokens past
it. Per prompt: prefill, decode `--ahead` tokens greedily (untimed), then in each repetition, at every
offset of --offsets tokens past the prompt (in rotation) and every n of --sizes, one untimed pass of n
tokens then one timed (the graph reused), the cache cut back after each. Medians per (offset, n) over
prompts and repetitions, milliseconds; the ratio of each offset to offset 0.

    python benchmarks/pass_depth.py --out benchmarks/results/pass_depth.json   # SmolLM2-135M, the edit prompts
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # keep llama_cpp.py off `import llama_cpp`

from moespec import texts  # noqa: E402
from moespec.backends.protocol import as_spec_model  # noqa: E402
from moespec.bench.candidate import encode_prompts  # noqa: E402
from moespec.bench.target_passes import prefilled_ahead  # noqa: E402
from moespec.models import gguf, load  # noqa: E402


def timed_passes(spec, ids: torch.Tensor, *, offsets: list[int], sizes: list[int], reps: int, limit: int) -> dict:
    """{(offset, n): [ms]} on one prompt's text `ids` (the prompt and max(offsets) tokens past it), the cache
    holding all of it but its last token (`prefilled_ahead`)."""
    P = ids.shape[0] - max(offsets)
    out: dict = {}
    for rep in range(reps):
        for off in offsets[rep % len(offsets):] + offsets[: rep % len(offsets)]:
            spec.truncate(min(spec.length, P + off - 1))
            if spec.length < P + off - 1:  # the text up to the offset's last token back in the cache
                spec.extend(ids[spec.length: P + off - 1], outputs=1)
            for n in sizes:
                tokens = ids[P + off - 1: P + off - 1 + n] if P + off - 1 + n <= ids.shape[0] else ids[:n]
                spec.extend_argmax(tokens, limit)
                spec.truncate(P + off - 1)
                start = time.perf_counter()
                spec.extend_argmax(tokens, limit)
                out.setdefault((off, n), []).append(1e3 * (time.perf_counter() - start))
                spec.truncate(P + off - 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="a GGUF file (default: the installed SmolLM2-135M)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--offsets", type=int, nargs="+", default=[0, 24, 48])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 5, 9])
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    model_path = args.model or str(gguf.smollm2_path())
    model, tok = load(model_path, backend="llama.cpp", threads=args.threads, n_ctx=1024)
    spec, limit = as_spec_model(model), texts.vocab_limit(tok)
    chats = [[{"role": "user", "content": c}] for c in texts.chat_prompts("edit")]
    got: dict = {}
    for ids in encode_prompts(tok, chats):
        text = prefilled_ahead(spec, torch.tensor(ids), max(args.offsets), limit)
        for key, ms in timed_passes(spec, text, offsets=args.offsets, sizes=args.sizes, reps=args.reps,
                                    limit=limit).items():
            got.setdefault(key, []).extend(ms)
    med = {key: statistics.median(v) for key, v in got.items()}
    print(f"{'n':>3s} " + " ".join(f"{'+' + str(o):>8s}" for o in args.offsets) + "   ratio to +0")
    for n in args.sizes:
        row = [med[(o, n)] for o in args.offsets]
        print(f"{n:3d} " + " ".join(f"{x:8.1f}" for x in row) + "   " + " ".join(f"{x / row[0]:5.2f}" for x in row))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": model_path, "threads": args.threads, "reps": args.reps,
                                    "prompts": len(chats), "median_ms": [{"offset": o, "n": n, "ms": m, "samples": len(got[(o, n)])}
                                                                         for (o, n), m in sorted(med.items())]}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
