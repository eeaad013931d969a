"""Routing recorded by llama.cpp against transformers', on GGUF files llama.cpp's converter wrote.

For each of the seven architectures of `tests/converted.py` (random-initialized checkpoints at
small widths, converted to f32, f16 and q8_0 by convert_hf_to_gguf.py), both engines read the same
TOKENS token ids (code and prose written for moespec) in one pass: the share of (token, MoE layer)
pairs whose expert sets agree, per layer, and the top-m margin (llama.cpp's scores: the gap between
the m-th and (m+1)-th) of every pair that differs, beside the median margin for scale.

    python benchmarks/gguf_routing.py --out benchmarks/results/gguf_routing.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# benchmarks/llama_cpp.py would shadow the llama_cpp package: keep this folder off the path; the
# repository root on it, for tests/converted.py, which builds the files
sys.path[:] = [str(HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() != HERE]

TOKENS = 400


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from moespec.checks.routing_agreement import compare
    from moespec.models import gguf
    from moespec.models.llama_convert import cache_dir
    from moespec.texts import default_corpus
    from tests.converted import TYPES, build

    files = build(cache_dir() / "converted")
    tok = gguf.tokenizer(gguf.SMOLLM2)
    ids = [t for _, text in default_corpus()[:6] for t in tok.encode(text)][:TOKENS]
    rows = []
    for arch, paths in files.items():
        for kind in TYPES:
            a = compare(paths["checkpoint"], paths[kind], ids, threads=args.threads)
            rows.append({"arch": arch, "type": kind, **a.to_dict()})
            worst = max(a.margins_at_differences, default=0.0)
            print(f"{arch:11s} {kind:5s} agreement {a.agreement:.4f}  by layer {['%.3f' % x for x in a.by_layer]}  "
                  f"differ {a.differences:3d}  largest margin there {worst:.2e}  median margin {a.median_margin:.2e}",
                  flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"tokens": TOKENS, "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
