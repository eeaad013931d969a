"""V̂_B(k) from the chain's artifacts, and its score: speculation at batch size B (`costmodel.batch`).

`predict_batch` builds the step time of a pass of B sequences with k drafts each the way (22) builds
V at B = 1 (`costmodel.batch.step_times`), from

- the routing trace: U_l^B(k + 1), the expected union of B windows of k + 1 tokens drawn from
  distinct documents (`moe.batch_union`), next to B = 1's and uniform routing's (`unions`);
- the characterization: each layer's fit of the expert operation (E.1) at the bytes of that union
  over n = B(k + 1) rows (the grouped kernel, llama.cpp's `mul_mat_id`; at one row (4), as (22)
  takes it), and the file's dense products D(n) (g(n) = D(n) − D(B)), linear between the
  characterized pass sizes. Pass sizes above the largest characterized one are refused: the fits'
  bandwidths are known only up to there (`moespec characterize --n`, `pass_sizes`);
- the batch measurement (`bench.batch_measure`): τ_B(1), the passes of plain batched decoding of the
  prompts (one token of each sequence's own text), and h_B(k). Never its sweep.

"timed" is the measured counterpart, τ_B(k + 1) + h_B(k) with the passes timed alone. `score_batch`
scores each version's k̂*(a, B) against the sweep (`costmodel.batch.score_schedule`), out of sample:
no prediction read the sweep's runs; and says whether the machine was steady during the sweep
(`bench.steadiness`: its repetitions as rounds), so a busy machine's score is flagged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from moespec.bench.batch_measure import KIND as MEASURE_KIND, timed_step_times
from moespec.costmodel.steadiness import Steadiness, batch_sweep_rounds
from moespec.chain.prediction import expert_fits, nearest_layers, payload_of
from moespec.costmodel.batch import (first_never_paying_batch, no_draft_pays, pass_tokens, score_schedule,
                                     step_times)
from moespec.kernel_names import COST_DEDUP, COST_SLOT
from moespec.models.lineage import check_chain
from moespec.moe.batch_union import batch_union, batch_union_uniform
from moespec.moe.traces import RoutingTrace
from moespec.provenance import trace_fingerprint
from moespec.run_files import BATCH_PREDICTION, BATCH_SCORE, KINDS

KIND, SCORE_KIND = KINDS[BATCH_PREDICTION], KINDS[BATCH_SCORE]
VERSIONS = ("prediction", "timed")


def pass_sizes(sizes: Sequence[int], max_k: int) -> list[int]:
    """Every pass size n = B(k + 1) the batch sizes and draft lengths given need characterized."""
    return sorted({pass_tokens(B, k) for B in sizes for k in range(max_k + 1)})


def _dense(char: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    found = (char.get("dense") or {}).get("median") or {}
    if not found:
        raise ValueError("the characterization has no dense products' times D(n); characterize the GGUF file "
                         "with this moespec (`moespec characterize --model FILE.gguf`)")
    ns = sorted(int(n) for n in found)
    return np.array(ns, dtype=float), np.array([float(found[str(n)] if str(n) in found else found[n]) for n in ns])


def predict_batch(characterization, traces, measurement, *, sources: Mapping[str, str] | None = None) -> dict:
    """The "batch-predict" payload: {"versions": {"prediction" | "timed": {B: V̂_B(0..max_k) s}}, "unions":
    {B: {n: {"trace", "one_sequence", "uniform"}}} (mean over layers), "paying": {version: where no k
    pays at any acceptance, and the batch size from which on}, "unavailable": {version: why} for a
    version with a step time <= 0, left out, ...} (module docstring)."""
    char = payload_of(characterization, "characterize")
    trace = traces if isinstance(traces, RoutingTrace) else RoutingTrace.load(traces)
    meas = payload_of(measurement, MEASURE_KIND)
    shared = check_chain({"characterization": char, "traces": trace, "batch measurement": meas})
    sizes, max_k = sorted(int(B) for B in meas["by_batch"]), int(meas["max_k"])
    if not sizes:
        raise ValueError("the batch measurement holds no batch size yet; run `moespec measure --batch-sizes ...`")
    need, have = pass_sizes(sizes, max_k), sorted(int(n) for n in char["n"])
    if need[-1] > have[-1]:
        raise ValueError(f"batch sizes {sizes} at k <= {max_k} verify up to n = {need[-1]} tokens per pass; the "
                         f"characterization reaches n = {have[-1]}: characterize again with "
                         f"--n {_n_text(have, need)}")
    source = nearest_layers(char["layers"], trace.num_layers)
    fits = {kernel: expert_fits(char, kernel, source) for kernel in (COST_SLOT, COST_DEDUP)}
    w, m = list(trace.expert_bytes), trace.top_k
    dense_n, dense_t = _dense(char)

    def expert_time(U, n: int) -> float:
        return float(sum(f.predict(np.array([u]), n, m, b)[0] for f, u, b in
                         zip(fits[COST_SLOT if n == 1 else COST_DEDUP], U, w)))

    versions: dict[str, dict[int, list[float]]] = {"prediction": {}, "timed": timed_step_times(meas)}
    unions: dict[int, dict[int, dict[str, float]]] = {}
    for B in sizes:
        row = meas["by_batch"][str(B)]
        U = [batch_union(trace, k + 1, B) for k in range(max_k + 1)]
        tau1 = row["plain_pass"]["median"]  # one token of each sequence's own text per pass
        versions["prediction"][B] = step_times(float(tau1), expert_time,
                                               lambda n: float(np.interp(n, dense_n, dense_t)), row["h"], U, B)
        unions[B] = {pass_tokens(B, k): {"trace": float(np.mean(U[k])),
                                         "one_sequence": float(np.mean(batch_union(trace, pass_tokens(B, k), 1))),
                                         "uniform": batch_union_uniform(k + 1, B, m, trace.num_experts)}
                     for k in range(max_k + 1)}
    unavailable = {v: _nonpositive(V) for v, V in versions.items() if _nonpositive(V)}
    versions = {v: V for v, V in versions.items() if v not in unavailable}
    if not versions:
        raise ValueError("no version of V̂_B is positive at every k: " + "; ".join(unavailable.values()))
    paying = {v: {"no_draft_pays": {B: no_draft_pays(V[B]) for B in sizes},
                  "first_never_paying_batch": first_never_paying_batch(V)} for v, V in versions.items()}
    return {"model": meas.get("model"), "provenance": {**shared, "trace": trace_fingerprint(trace)},
            "sources": dict(sources or {}), "sizes": sizes, "max_k": max_k, "kernel": COST_DEDUP,
            "characterized_n": have, "versions": versions, "unavailable": unavailable, "unions": unions,
            "paying": paying}


def _nonpositive(V: Mapping[int, list[float]]) -> str:
    """Why a version's step times are no step times ("" when every V̂_B(k) > 0): at tiny widths and few
    repetitions the fits' differences between pass sizes can be below their noise and turn V̂ negative,
    as (22) can at B = 1 (`costmodel.predict.NonPositiveTime`)."""
    bad = [(B, k, v) for B, row in V.items() for k, v in enumerate(row) if not v > 0]
    return f"V̂_{bad[0][0]}({bad[0][1]}) = {bad[0][2]:.3g} s is not positive" if bad else ""


def _n_text(have: list[int], need: list[int]) -> str:
    extra = [n for n in need if n > have[-1]]
    return f"1..{have[-1]}," + ",".join(map(str, extra))


def score_batch(prediction, measurement) -> dict:
    """The "batch-score" payload: each version's `score_schedule` against the measurement's sweep."""
    pred = payload_of(prediction, KIND)
    meas = payload_of(measurement, MEASURE_KIND)
    check_chain({"batch prediction": pred, "batch measurement": meas})
    grid = [float(a) for a in meas["acceptances"]]
    measured = {int(B): {float(a): T for a, T in row["sweep"]["T"].items()} for B, row in meas["by_batch"].items()}
    missing = sorted(set(measured) - {int(B) for B in pred["sizes"]})
    if missing:
        raise ValueError(f"the prediction has no V̂_B at batch sizes {missing} of the measurement; predict again "
                         "from this measurement (`moespec predict --measurement ...`)")
    scores = {}
    for version, V in pred["versions"].items():
        V = {int(B): v for B, v in V.items()}
        scores[version] = score_schedule({B: V[B] for B in measured}, measured, grid)
    steadiness = Steadiness(tuple(batch_sweep_rounds(meas)))  # a busy machine's sweep is flagged, not trusted
    return {"model": pred.get("model"), "provenance": pred.get("provenance"), "acceptances": grid,
            "versions": scores, "measured_V": {B: row["sweep"]["V"] for B, row in meas["by_batch"].items()},
            "steadiness": steadiness.to_dict()}

