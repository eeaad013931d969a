"""The chain's score: one prediction version against the measurement's held-out verify repetitions and
its oracle sweep (cost-model paper, Sec. 4.4, Tables 3, 4, 7 and the rules of Table 8), and the
"score" payload of every version at every depth. The prediction's inputs are `chain.prediction`'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from moespec.costmodel.sweep_cells import acceptance_rows, cell_throughput, resample_throughput
from moespec.chain import prediction as _prediction
from moespec.chain.prediction import KIND, json_get, payload_of, verify_times_at
from moespec.chain.sweep_acceptance import refusal_message, restricted
from moespec.chain.versions import Unavailable, VersionUnavailable
from moespec.costmodel.predict import Prediction
from moespec.costmodel.score import Score, score
from moespec.kernel_names import DEDUP, SLOT, TO_ENGINE
from moespec.models.lineage import check_chain
from moespec.run_files import KINDS, SCORE

SCORE_KIND = KINDS[SCORE]


def _oracle_entry(measurement: Mapping[str, Any], kernel: str, depth: int) -> dict:
    for e in measurement.get("oracle", []):
        if e["kernel"] == kernel and int(e["depth"]) == depth:
            return e
    raise VersionUnavailable(Unavailable.NO_SWEEP, (
        f"the measurement has no oracle sweep with {kernel} at depth {depth}; run the sweep phase "
        "(`moespec measure` or `moespec demo`)"))


def score_from_artifacts(prediction: Prediction | Mapping[str, Any], measurement: str | Path | Mapping[str, Any], *,
                         depth: int | None = None, kernel: str = "dedup", resamples: int = 1000) -> Score:
    """Score one prediction version against the measurement's verify times and oracle sweep at `depth`.

    The verify times, S(n) and its interval come from the held-out repetitions (`repetition_half`),
    which the prediction did not read; the in-sample errors from the fit half, which it did.
    kernel: the scored kernel ("dedup" or "slot"); its sweep gives the throughput T(k, a) on the
    prediction's acceptance grid, at k = 0 plain decoding's pooled over every acceptance
    (the entry's "plain" cell), and the measured step times V(k). An acceptance at which the sweep did
    not run at its set value is left out (`chain.sweep_acceptance`); none left: VersionUnavailable.
    resamples: bootstrap resamples of the sweep's runs for the intervals of the scored figures
    (`costmodel.score.sweep_intervals`); 0, or a sweep that keeps no per-run steps, scores without.
    """
    if not isinstance(prediction, Prediction):
        prediction = Prediction.from_dict(prediction)
    meas = payload_of(measurement, "measure")
    times = verify_times_at(meas, depth)
    half = _prediction.repetition_half  # by module name: benchmarks/fit_half.py swaps it
    held, fit = half(times, "holdout"), half(times, "fit")
    entry = _oracle_entry(meas, TO_ENGINE[kernel], times.depth)
    ks = list(range(prediction.kmax + 1))
    cells = {(int(c["k"]), None if c["a"] is None else round(float(c["a"]), 6)): c for c in entry["cells"]}
    grid = []
    for a in prediction.acceptance:
        row = []
        for k in ks:
            c = entry["plain"] if k == 0 else cells.get((k, round(float(a), 6)))  # k = 0: plain decoding, pooled
            if c is None:
                raise VersionUnavailable(Unavailable.NO_SWEEP, (
                    f"the oracle sweep lacks k={k}, a={a}; sweep k = 0..{ks[-1]} at every a of the grid"))
            row.append(c)
        grid.append(row)
    ran = acceptance_rows(entry["cells"], prediction.acceptance)  # refused: not run at a (`chain.sweep_acceptance`)
    keep = [i for i, r in enumerate(ran) if not r["refused"]]
    if not keep:
        raise VersionUnavailable(Unavailable.NO_SWEEP, refusal_message(ran))
    prediction, grid = restricted(prediction, keep), [grid[i] for i in keep]
    T = [[cell_throughput(c) for c in row] for row in grid]
    flat = [c for row in grid for c in row]
    T_b = None
    if resamples and all(c.get("run_steps") for c in flat):
        T_b = resample_throughput(flat, resamples).reshape(resamples, len(grid), len(ks))
    savings = held.savings()
    one = SLOT not in held.samples  # an engine with one kernel (llama.cpp): no measured saving
    return score(
        prediction, tau_slot=None if one else held.tau(SLOT), tau_dedup=held.tau(DEDUP),
        tau_slot_in_sample=None if one else fit.tau(SLOT), tau_dedup_in_sample=fit.tau(DEDUP),
        S_lo=None if one else {s.n: s.lo for s in savings}, S_hi=None if one else {s.n: s.hi for s in savings},
        S=None if one else {s.n: s.point for s in savings}, throughput=T,
        V=[float(json_get(entry["V"], k)) for k in ks], kernel=kernel, throughput_resamples=T_b,
    )


def score_all(prediction_payload: Mapping[str, Any], measurement, *, kernel: str = "dedup", characterization=None,
              measurement_base=None) -> dict[str, Any]:
    """Every available version at every depth scored: the "score" payload, unavailable entries as in predict's,
    and whether the machine was steady while it was measured (`costmodel.steadiness`: the sweep, the base
    measurement's verify passes (else the measurement's), the characterization's dense products, when given).
    Refused unless the prediction and the measurement describe one model (`models.lineage.check_chain`)."""
    from moespec.costmodel.steadiness import check

    meas = payload_of(measurement, "measure", needs=("verify",))
    pred = payload_of(prediction_payload, KIND, needs=("depths",))
    shared = check_chain({"prediction": pred, "measurement": meas})
    out = []
    for entry in pred["depths"]:
        scored: dict[str, Any] = {"depth": entry["depth"], "versions": {}, "unavailable": dict(entry["unavailable"])}
        grid = next(iter(entry["versions"].values()), {}).get("acceptance", [])
        try:  # per acceptance: set and realized, refused or not (`acceptance_rows`)
            oracle = _oracle_entry(meas, TO_ENGINE[kernel], int(entry["depth"]))
            scored["oracle_acceptance"] = acceptance_rows(oracle["cells"], grid)
        except VersionUnavailable:
            pass
        for version, p in entry["versions"].items():
            try:
                scored["versions"][version] = score_from_artifacts(p, meas, depth=entry["depth"],
                                                                   kernel=kernel).to_dict()
            except VersionUnavailable as e:
                scored["unavailable"][version] = e.to_dict()
        out.append(scored)
    steadiness = check(meas, None if characterization is None else payload_of(characterization, "characterize"),
                       None if measurement_base is None else payload_of(measurement_base, "measure"))
    return {"model": pred.get("model"), "provenance": shared, "kernel": kernel, "depths": out,
            "steadiness": steadiness.to_dict()}
