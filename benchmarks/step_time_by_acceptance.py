"""Does the oracle sweep's step time depend on the acceptance? Per prompt, from a finished sweep.

The cost model's V(k) has no a in it: a step verifies k + 1 tokens of the text whatever is
accepted. The gap goal (the sweep's best speedup within 5% of G_a(k)V(0)/V(k), V pooled over every
acceptance) assumes the same. This reads a run folder's `measurement.json` and prints, for each
prompt and acceptance, the geometric mean over k = 1..8 of the cell's step time on that prompt
(`costmodel.sweep_cells.step_time` of the prompt's runs) over the prompt's V(k) pooled over acceptances; 1.000
everywhere is a step time without an a. With `--model`, it also decodes each prompt's greedy
continuation (the text every step verifies) and counts its distinct tokens: a continuation that
cycles through a few ids routes every window to few experts. Before the oracle marked its wrong
drafts instead of replacing them, a replaced draft added experts the cycle never names, and runs
of several steps covered stretches whose length grew with a (BENCHMARKS.md, "Marked wrong drafts,
one step per run").

    python benchmarks/step_time_by_acceptance.py RUN_DIR --model synthetic:qwen3moe-shaped \\
        --out benchmarks/results/step_time_by_acceptance.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from moespec import artifacts
from moespec.costmodel.sweep_cells import step_time
from moespec.kernel_names import DEDUP


def ratios(entry: dict, prompts: int) -> dict[int, dict[float, float]]:
    """{prompt: {a: geometric mean over k >= 1 of V_prompt(k, a) / V_prompt(k)}}; a cell's runs are
    its prompts' runs one prompt after another (`run_oracle`)."""
    cells = {(c["k"], c["a"]): c for c in entry["cells"]}
    ks = sorted({k for k, _ in cells if k >= 1})
    acceptances = sorted({a for _, a in cells})
    out = {}
    for p in range(prompts):
        def v(k, a):
            runs = cells[(k, a)]["run_steps"]
            per = len(runs) // prompts
            return step_time(runs[p * per:(p + 1) * per])
        pooled = {k: float(np.exp(np.mean([np.log(v(k, a)) for a in acceptances]))) for k in ks}
        out[p] = {a: float(np.exp(np.mean([np.log(v(k, a) / pooled[k]) for k in ks]))) for a in acceptances}
    return out


def distinct_tokens(model_spec: str, depth: int, prompts: int, length: int = 80) -> list[int]:
    """Distinct ids among the first `length` greedy tokens after each built-in prompt cut to `depth`."""
    from moespec.texts import prompt_ids, vocab_limit
    from moespec.bench.verified_text import greedy_continuation
    from moespec.models import load

    model, tok = load(model_spec)
    return [len(set(greedy_continuation(model, ids, length, vocab_limit(tok))))
            for ids in prompt_ids(tok, depth, prompts)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path, help="a `moespec demo` folder holding measurement.json")
    ap.add_argument("--model", default=None, help="the run's model, to count its continuations' distinct tokens")
    ap.add_argument("--out", type=Path, default=None, help="where to write the JSON")
    args = ap.parse_args()
    payload = artifacts.load(args.run_dir / "measurement.json", "measure")["payload"]
    prompts = int(payload["config"]["prompts"])
    entry = next(e for e in payload["oracle"] if e["kernel"] == DEDUP)
    table = ratios(entry, prompts)
    distinct = distinct_tokens(args.model, entry["depth"], prompts) if args.model else None
    acceptances = sorted(next(iter(table.values())))
    t = Table(title=f"step time over the prompt's pooled V(k), k = 1..8: {args.run_dir}")
    t.add_column("prompt")
    for a in acceptances:
        t.add_column(f"{a:g}", justify="right")
    for p, row in table.items():
        name = f"{p}" + (f" ({distinct[p]} ids in 80)" if distinct else "")
        t.add_row(name, *(f"{row[a]:.3f}" for a in acceptances))
    Console(width=160).print(t)
    if args.out:
        artifacts.write(args.out, "step_time_by_acceptance", {"run_dir": str(args.run_dir), "model": args.model,
                                                "ratio": {str(p): {str(a): r for a, r in row.items()}
                                                          for p, row in table.items()},
                                                "distinct_tokens_in_80": distinct})
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
