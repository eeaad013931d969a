"""How much of a llama.cpp verify pass's growth τ(n) − τ(1) each term of the model explains, from a
finished run folder of `moespec demo --model FILE.gguf` (no timing, unless --time-rest):

  measured   τ(n) − τ(1) of the base measurement's held-out repetitions (odd-numbered; the prediction
             read the even ones), the deduplicating kernel llama.cpp runs
  experts    the expert operation's growth Σ_l t̄_l(n) − t̄_l(1): τ̂(n) − τ̂(1) of the version the calibrated
             one builds on (`calibrated_on`: the measured-time version, else the prediction)
  dense      D(n) − D(1), the dense weight products (`bench.ggml_dense_op`)
  rest       R_d(n) − R_d(1) at the measurement's depth d (`bench.ggml_rest_op`)
  left       measured − experts − dense − rest: growth in no term

each in ms and as a share of the measured growth. A run folder made before R_d(n) was timed has no
"rest": --time-rest FILE.gguf times it here at the folder's depths (the file's tensors copied, about
a minute at OLMoE-1B-7B size), without writing any artifact.

    python benchmarks/growth_shares.py RUN_FOLDER [--time-rest FILE.gguf --threads T] [--out shares.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from moespec import artifacts
from moespec.chain.prediction import repetition_half, rest_at, verify_times_at
from moespec.costmodel.verify_times import pass_time
from moespec.kernel_names import DEDUP
from moespec.run_files import CHARACTERIZATION, KINDS, MEASUREMENT_BASE, PREDICTION

TERMS = ("experts", "dense", "rest")


def _payload(folder: Path, name: str) -> dict:
    return artifacts.load(folder / name, KINDS[name])["payload"]


def growth(char: dict, base: dict, prediction: dict, depth: int) -> dict:
    """{term: {n: seconds}} of the measured growth and of each term at `depth` (module docstring)."""
    held = repetition_half(verify_times_at(base, depth), "holdout")
    kernel = DEDUP if DEDUP in held.samples else held.kernels[0]
    tau = {n: pass_time(held.samples[kernel][n]) for n in held.ns}
    entry = next(e for e in prediction["depths"] if int(e["depth"]) == depth)
    mt = entry["versions"][entry.get("calibrated_on") or "measured-time"]
    experts = dict(zip(mt["n"], mt["tau"]["dedup"]))
    dense, rest = char["dense"]["median"], rest_at(char, depth)
    ns = [n for n in mt["n"] if n in tau]
    out = {"measured": {n: tau[n] - tau[1] for n in ns}, "experts": {n: experts[n] - experts[1] for n in ns},
           "dense": {n: dense[str(n)] - dense["1"] for n in ns},
           "rest": {n: rest[str(n)] - rest["1"] for n in ns} if rest else None}
    out["left"] = {n: out["measured"][n] - sum(out[t][n] for t in TERMS if out[t]) for n in ns}
    return out


def shares(folder: Path, rest_file: str | None = None, threads: int | None = None) -> dict:
    """{depth: {"ms": {term: {n: ms}}, "share": {term: share of the measured growth at the largest n}}}."""
    char, base = _payload(folder, CHARACTERIZATION), _payload(folder, MEASUREMENT_BASE)
    prediction = _payload(folder, PREDICTION)
    depths = [int(e["depth"]) for e in prediction["depths"]]
    if rest_file and not all(rest_at(char, d) for d in depths):
        from moespec.bench.ggml_rest_op import rest_times

        char = {**char, "rest": rest_times(rest_file, [int(n) for n in char["n"]], depths, threads or 1)}
    found = {}
    for depth in depths:
        g = growth(char, base, prediction, depth)
        last = max(g["measured"])
        found[depth] = {"ms": {t: None if v is None else {n: 1e3 * x for n, x in v.items()} for t, v in g.items()},
                        "share": {t: None if g[t] is None else g[t][last] / g["measured"][last]
                                  for t in (*TERMS, "left")}, "n": last}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--time-rest", default=None, help="the run's .gguf file: time R_d(n) where the folder lacks it")
    parser.add_argument("--threads", type=int, default=None, help="the run's llama.cpp threads (with --time-rest)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    found = shares(args.folder, args.time_rest, args.threads)
    for depth, f in found.items():
        cells = [f"{t} {f['ms'][t][f['n']]:.1f} ms ({f['share'][t]:.0%})" for t in (*TERMS, "left") if f["ms"][t]]
        print(f"d = {depth}, n = 1 -> {f['n']}: measured {f['ms']['measured'][f['n']]:.1f} ms = " + ", ".join(cells))
    if args.out:
        args.out.write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
