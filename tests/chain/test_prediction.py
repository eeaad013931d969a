"""The prediction (22) and its score from artifacts built here from known inputs with exact times.

Verify passes of prompt p take FIT[kernel][n] + 2p ms on the even-numbered repetitions (the fit
half) and HELD[kernel] more on the odd ones (the held-out half); their time inside the experts
modules is INSIDE[n] (+3 ms on odd ones); the operation timed between them is OPS (+4 ms on odd ones).
"""

import json

import numpy as np
import pytest

from moespec.artifacts import json_safe
from moespec.chain.prediction import (nearest_layers, predict_all, predict_from_artifacts, repetition_half,
                                      window_unions, windows_source)
from moespec.chain.scoring import score_all, score_from_artifacts
from moespec.bench.measure_base import HSource
from moespec.chain.versions import CalibratedOn, Unavailable, VersionUnavailable, WindowSource
from moespec.costmodel.verify_times import VerifyTimes
from moespec.costmodel.fit import ExpertFit
from moespec.costmodel.predict import ACCEPTANCE_GRID, VERSIONS
from moespec.kernel_names import DEDUP, SLOT
from moespec.moe.traces import RoutingTrace
from moespec.provenance import ProvenanceMismatch

D, P, R, NS = 16, 2, 4, (1, 2, 3)  # depth, prompts, repetitions, pass sizes
M, N, B = 2, 8, 2**20  # top-k, experts, bytes per expert
TS = (2**-10, 2**-30, 2**-31)  # per-slot fit (4): t_op, c_u, c_re
TD = (2**-9, 2**-30, 2**-12)  # dedup fit (E.1): t_op, c_g, c_t
FIT = {SLOT: {1: 0.040, 2: 0.044, 3: 0.047}, DEDUP: {1: 0.040, 2: 0.043, 3: 0.045}}
HELD = {SLOT: 0.005, DEDUP: 0.003}
INSIDE = {1: 0.010, 2: 0.012, 3: 0.013}
OPS = {SLOT: {1: 0.004, 2: 0.006, 3: 0.0075}, DEDUP: {1: 0.004, 2: 0.0055, 3: 0.0065}}
H = [0.001, 0.0012, 0.0014]
# one document, two layers: the experts each token routes to, [T, L, m]
DOC = np.array([[[0, 1], [0, 1]], [[0, 1], [2, 3]], [[2, 3], [4, 5]], [[0, 2], [6, 7]], [[4, 5], [0, 1]]])
TAU1 = FIT[SLOT][1] + 0.001  # τ_meas(1): the fit half's mean over prompts of 40 and 42 ms


def odd(r: int) -> bool:
    return r % 2 == 1


def verify_times(*, ops: bool = True, inside: bool = True) -> VerifyTimes:
    pr = [(p, r) for p in range(P) for r in range(R)]
    grid = lambda f: np.array([f(p, r) for p, r in pr]).reshape(P, R)  # noqa: E731
    samples = {k: {n: grid(lambda p, r: FIT[k][n] + 0.002 * p + HELD[k] * odd(r)) for n in NS} for k in (SLOT, DEDUP)}
    op = {k: {n: grid(lambda p, r: OPS[k][n] + 0.004 * odd(r))[:, :, None] for n in NS} for k in (SLOT, DEDUP)}
    ins = {SLOT: {n: grid(lambda p, r: INSIDE[n] + 0.003 * odd(r)) for n in NS}}
    return VerifyTimes(depth=D, samples=samples, ops=op if ops else None, op_layers=(0,) if ops else (),
                       inside=ins if inside else None)


def as_json(x):
    return json.loads(json.dumps(json_safe(x)))


def base(**kw) -> dict:
    return as_json({"model": "test", "verify": [verify_times(**kw).to_dict()], "h": {D: dict(enumerate(H))},
                    "h_source": HSource.ORACLE_PROBE})


def point(kernel: str, n: int, source: str, placement: str, t: float) -> dict:
    return {"layer": 0, "kernel": kernel, "n": n, "source": source, "placement": placement, "timing": {"median": t}}


def characterization(points=None) -> dict:
    fit = lambda k, coef: ExpertFit(k, coef, m=M, b=B, residuals=(), rank=3, cond=1.0).to_dict()  # noqa: E731
    if points is None:  # two corpus windows per n (1 and 3 ms apart), and the verify pass's own window
        points = [point(k, n, "recorded", f"doc0/{i}", 0.001 * (n + 2 * i)) for k in ("slot", "dedup")
                  for n in NS for i in (0, 1)]
        points += [point(k, n, "verified", f"d{D}/p0", 0.001 * (n + 5)) for k in ("slot", "dedup") for n in NS]
    return as_json({"layers": [0], "n": list(NS), "fits": {0: {"slot": fit("slot", TS), "dedup": fit("dedup", TD)}},
                    "eps": {"slot": 0.02, "dedup": 0.03, "engine": 0.03}, "points": points})


TRACE = RoutingTrace(documents=[DOC], num_experts=N, expert_bytes=(B, B))


def unions(l: int, n: int) -> list[int]:
    """The distinct experts of every window of n tokens of layer l, counted directly."""
    return [len(set(DOC[t:t + n, l].ravel())) for t in range(len(DOC) - n + 1)]


def test_window_unions_match_a_direct_count():
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 6, size=(T, 2, 2)) for T in (7, 3)]
    for d in docs:  # top-2 of distinct experts per token
        d[:, :, 1] = (d[:, :, 0] + 1 + rng.integers(0, 4, size=d.shape[:2])) % 6
    trace = RoutingTrace(documents=docs, num_experts=6, expert_bytes=(10, 10))
    for n in (1, 2, 3, 4):
        want = [[len(set(d[t:t + n, l].ravel())) for d in docs for t in range(d.shape[0] - n + 1)] for l in range(2)]
        assert window_unions(trace, n).tolist() == want


def test_nearest_layers():
    assert nearest_layers([0, 4], 6) == [0, 0, 0, 4, 4, 4]
    with pytest.raises(ValueError, match="no layer"):
        nearest_layers([], 3)


def test_the_repetition_halves_are_disjoint_and_cover_every_repetition():
    for reps in (2, 5):  # each value names its repetition: 10 p + r
        index = np.arange(2)[:, None] * 10 + np.arange(reps)[None, :]
        t = VerifyTimes(depth=D, samples={SLOT: {1: index}}, ops={SLOT: {1: index[:, :, None]}}, op_layers=(0,),
                        inside={SLOT: {1: index + 0.5}})
        fit, held = repetition_half(t, "fit"), repetition_half(t, "holdout")
        for half, want in ((fit, range(0, reps, 2)), (held, range(1, reps, 2))):
            assert half.samples[SLOT][1].tolist() == [[10 * p + r for r in want] for p in range(2)]
            assert half.ops[SLOT][1][..., 0].tolist() == half.samples[SLOT][1].tolist()
            assert (half.inside[SLOT][1] - 0.5).tolist() == half.samples[SLOT][1].tolist()
        both = np.concatenate([fit.samples[SLOT][1], held.samples[SLOT][1]], axis=1)
        assert sorted(both.ravel().tolist()) == sorted(index.ravel().tolist())  # disjoint, and every one
    with pytest.raises(ValueError, match="reps >= 2"):
        repetition_half(VerifyTimes(depth=D, samples={SLOT: {1: np.ones((2, 1))}}), "fit")


def test_prediction_is_eq_22_at_the_fit_of_every_windows_bytes():
    p = predict_from_artifacts(characterization(), TRACE, base(), version="prediction")

    def fit(kernel, U, n):
        if kernel == "slot":
            return TS[0] + TS[1] * U * B + TS[2] * (n * M - U) * B
        return TD[0] + TD[1] * U * B + TD[2] * n

    one = fit("slot", M, 1)  # one token routes to m distinct experts
    for i, n in enumerate(NS):  # both layers take layer 0's fit, each at its own windows' unions
        for kernel in ("slot", "dedup"):
            k = kernel if n >= 2 else "slot"
            want = TAU1 + sum(np.mean([fit(k, U, n) for U in unions(l, n)]) - one for l in (0, 1))
            assert p.tau[kernel][i] == pytest.approx(want, rel=1e-12)
    assert p.V["dedup"] == pytest.approx([p.tau["dedup"][k] + H[k] for k in range(3)], rel=1e-12)
    assert p.eps == 0.03 and p.h == H


def test_measured_time_version_reads_the_fit_half_of_the_operation_timed_between_passes():
    p = predict_from_artifacts(characterization(), TRACE, base(), version="measured-time")
    for i, n in enumerate(NS):  # two layers, both at layer 0's time on the even repetitions
        assert p.M["slot"][i] == pytest.approx(2 * OPS[SLOT][n])
        assert p.tau["slot"][i] == pytest.approx(TAU1 + 2 * (OPS[SLOT][n] - OPS[SLOT][1]))
        if n >= 2:
            assert p.tau["dedup"][i] == pytest.approx(TAU1 + 2 * (OPS[DEDUP][n] - OPS[SLOT][1]))
    entry = predict_all(characterization(), TRACE, base())["depths"][0]
    assert entry["measured_time_windows"] == WindowSource.BETWEEN_PASSES


def test_with_one_kernel_between_passes_the_other_comes_from_the_characterizations_verified_windows():
    """llama.cpp's passes run the deduplicating kernel only: its operation is read between the passes
    (fit half); the per-slot one is the deduplicating one's time at n = 1 between the passes plus the
    characterization's per-slot growth on its verified windows (n + 5 ms each: 1 ms per token)."""
    from dataclasses import replace

    times = verify_times()
    one = as_json({"model": "test", "verify": [replace(times, ops={DEDUP: times.ops[DEDUP]}).to_dict()],
                   "h": {D: dict(enumerate(H))}, "h_source": HSource.ORACLE_PROBE})
    p = predict_from_artifacts(characterization(), TRACE, one, version="measured-time")
    for i, n in enumerate(NS):
        assert p.M["slot"][i] == pytest.approx(2 * (OPS[DEDUP][1] + 0.001 * (n - 1)))
        if n >= 2:
            assert p.tau["dedup"][i] == pytest.approx(TAU1 + 2 * (OPS[DEDUP][n] - OPS[DEDUP][1]))
    assert predict_all(characterization(), TRACE, one)["depths"][0]["measured_time_windows"] == \
        WindowSource.BETWEEN_PASSES


def test_calibrated_growth_is_taken_pass_by_pass():
    plain = predict_from_artifacts(characterization(), TRACE, base(), version="measured-time")
    cal = predict_from_artifacts(characterization(), TRACE, base(), version="calibrated")
    o = {n: FIT[SLOT][n] + 0.001 - INSIDE[n] for n in NS}  # each even pass minus its time inside
    for kernel in ("slot", "dedup"):
        for i, n in enumerate(NS):
            assert cal.tau[kernel][i] == pytest.approx(plain.tau[kernel][i] + o[n] - o[1], rel=1e-12)
    entry = predict_all(characterization(), TRACE, base())["depths"][0]
    # every version but prediction-outside: this characterization (torch's kind) timed no D(n) alone
    assert set(entry["versions"]) == set(VERSIONS) - {"prediction-outside"}
    assert Unavailable(entry["unavailable"]["prediction-outside"]["reason"]) == Unavailable.NO_OUTSIDE_TERMS
    assert entry["calibrated_on"] == CalibratedOn.MEASURED_TIME


def test_prediction_outside_adds_the_characterizations_own_terms_to_the_prediction():
    # D(n) and R_d(n) timed alone: o(n) = 1, 3, 6 ms at n = 1, 2, 3 (D 1, 2, 4; R 0, 1, 2); the
    # version is the prediction plus o(n) - o(1) at every n and kernel
    char = characterization()
    char["dense"] = {"median": {"1": 0.001, "2": 0.002, "3": 0.004}}
    char["rest"] = {"median": {str(D): {"1": 0.0, "2": 0.001, "3": 0.002}}}
    plain = predict_from_artifacts(char, TRACE, base(), version="prediction")
    grown = predict_from_artifacts(char, TRACE, base(), version="prediction-outside")
    for kernel in ("slot", "dedup"):
        for i, g in enumerate((0.0, 0.002, 0.005)):
            assert grown.tau[kernel][i] == pytest.approx(plain.tau[kernel][i] + g, rel=1e-12)
    assert grown.S == pytest.approx(plain.S)  # the growth outside the experts cancels in the saving
    entry = predict_all(char, TRACE, base())["depths"][0]
    assert set(entry["versions"]) == set(VERSIONS) and entry["prediction_outside"] == "dense-ops+rest"


def test_calibrated_version_without_the_pass_split_is_unavailable():
    with pytest.raises(VersionUnavailable) as e:
        predict_from_artifacts(characterization(), TRACE, base(inside=False), version="calibrated")
    assert e.value.reason == Unavailable.NO_PASS_SPLIT
    entry = predict_all(characterization(), TRACE, base(inside=False))["depths"][0]
    assert set(entry["versions"]) == {"prediction", "measured-time"} and "calibrated_on" not in entry
    assert Unavailable(entry["unavailable"]["calibrated"]["reason"]) == Unavailable.NO_PASS_SPLIT
    assert entry["unavailable"]["calibrated"]["message"]


def test_measured_time_version_falls_back_to_the_characterizations_windows():
    char = characterization()
    assert windows_source(char, D) == WindowSource.VERIFIED and windows_source(char, D + 1) == WindowSource.RECORDED
    p = predict_from_artifacts(char, TRACE, base(ops=False), version="measured-time")
    assert p.M["dedup"][1:] == pytest.approx([2 * 0.001 * (n + 5) for n in (2, 3)])  # the verified window's
    recorded = characterization([q for q in char["points"] if q["source"] == "recorded"])
    p = predict_from_artifacts(recorded, TRACE, base(ops=False), version="measured-time")
    assert p.M["dedup"][1:] == pytest.approx([2 * 0.001 * (n + 1) for n in (2, 3)])  # mean of n and n + 2 ms
    entry = predict_all(recorded, TRACE, base(ops=False))["depths"][0]
    assert entry["measured_time_windows"] == WindowSource.RECORDED


def test_without_measured_operation_times_the_calibrated_version_builds_on_the_prediction():
    char = characterization([])
    with pytest.raises(VersionUnavailable) as e:
        predict_from_artifacts(char, TRACE, base(ops=False), version="measured-time")
    assert e.value.reason == Unavailable.NO_OPERATION_TIMES
    entry = predict_all(char, TRACE, base(ops=False))["depths"][0]
    assert Unavailable(entry["unavailable"]["measured-time"]["reason"]) == Unavailable.NO_OPERATION_TIMES
    assert entry["calibrated_on"] == CalibratedOn.PREDICTION and "measured_time_windows" not in entry
    plain = predict_from_artifacts(char, TRACE, base(ops=False), version="prediction")
    cal = predict_from_artifacts(char, TRACE, base(ops=False), version="calibrated")
    assert cal.S == pytest.approx(plain.S)  # the growth cancels in the saving


def test_a_fit_extrapolating_below_zero_leaves_the_prediction_unavailable():
    char = characterization()
    char["fits"]["0"]["slot"]["coefficients"]["t_op"] = -1.0  # every per-slot fit time below zero
    entry = predict_all(char, TRACE, base())["depths"][0]
    assert Unavailable(entry["unavailable"]["prediction"]["reason"]) == Unavailable.NONPOSITIVE_TIME
    assert set(entry["versions"]) == {"measured-time", "calibrated"}  # measured times need no fit


@pytest.mark.parametrize("change, reason", [
    (lambda c, b: (c, {**b, "h": {}}), Unavailable.NO_H),
    (lambda c, b: ({**c, "n": [1]}, b), Unavailable.TOO_FEW_PASS_SIZES),
])
def test_a_missing_input_makes_every_version_unavailable_with_its_reason(change, reason):
    char, b = change(characterization(), base())
    payload = predict_all(char, TRACE, b)
    assert payload["h_source"] == HSource.ORACLE_PROBE
    entry = payload["depths"][0]
    assert entry["versions"] == {} and {Unavailable(u["reason"]) for u in entry["unavailable"].values()} == {reason}


def test_a_malformed_input_is_an_error_not_an_unavailable_version():
    with pytest.raises(ValueError, match="k = \\[0, 2\\]"):
        predict_all(characterization(), TRACE, {**base(), "h": {str(D): {"0": 0.001, "2": 0.002}}})
    one_rep = as_json({"verify": [VerifyTimes(depth=D, samples={SLOT: {n: np.ones((P, 1)) for n in NS}}).to_dict()],
                       "h": {D: dict(enumerate(H))}})
    with pytest.raises(ValueError, match="reps >= 2"):
        predict_all(characterization(), TRACE, one_rep)


def test_predict_never_reads_the_sweeps():
    clean = predict_from_artifacts(characterization(), TRACE, base(), version="calibrated")
    garbage = {**base(), "oracle": "garbage", "draft_sweep": {"not": "a sweep"}, "scaling": None}
    assert predict_from_artifacts(characterization(), TRACE, garbage, version="calibrated") == clean


V = [0.05, 0.06, 0.07]  # the sweep's step times, k = 0..2


def measurement(plain: float = 1 / V[0]) -> dict:
    G = lambda a, k: sum(a**j for j in range(k + 1))  # noqa: E731
    cells = [{"k": k, "a": a, "step_throughput": G(a, k) / V[k]} for a in ACCEPTANCE_GRID for k in (1, 2)]
    oracle = {"kernel": DEDUP, "depth": D, "cells": cells, "plain": {"step_throughput": plain}, "V": dict(enumerate(V))}
    return {**base(), "oracle": [as_json(oracle)]}


def test_the_verify_time_error_is_scored_on_the_held_out_repetitions():
    p = predict_from_artifacts(characterization(), TRACE, base(), version="measured-time")
    s = score_from_artifacts(p, measurement())
    # τ̂ = 41 + 2 (OPS(n) - OPS(1)) ms, and the fit half's τ = FIT + 1 ms (the mean prompt): slot 45, 48;
    # dedup 44, 46 at n = 2, 3, exactly
    assert s.tau_error_in_sample == pytest.approx(0, abs=1e-12)
    assert s.tau_error_dedup_in_sample == pytest.approx(0, abs=1e-12)
    # the held-out passes: slot 5 ms and dedup 3 ms longer; the largest error is slot's at n = 2
    assert s.tau_error == pytest.approx(5 / 50) and s.tau_error_dedup == pytest.approx(3 / 47)
    assert s.S_measured == pytest.approx([0.003, 0.004])  # held out: 50 - 47 and 53 - 49 ms
    assert s.n == [2, 3] and len(s.rules) == 6


def test_score_all_marks_a_version_without_its_sweep_unavailable():
    pred = predict_all(characterization(), TRACE, base(inside=False))
    scored = score_all(pred, base())["depths"][0]  # the base measurement holds no oracle sweep
    assert scored["versions"] == {}
    reasons = {v: Unavailable(u["reason"]) for v, u in scored["unavailable"].items()}
    assert reasons == {"prediction": Unavailable.NO_SWEEP, "measured-time": Unavailable.NO_SWEEP,
                       "calibrated": Unavailable.NO_PASS_SPLIT, "prediction-outside": Unavailable.NO_OUTSIDE_TERMS}
    full = score_all(pred, measurement())["depths"][0]
    assert set(full["versions"]) == {"prediction", "measured-time"}


def test_every_acceptance_is_scored_against_the_pooled_plain_decoding():
    p = predict_from_artifacts(characterization(), TRACE, base(), version="prediction")
    assert score_from_artifacts(p, measurement(plain=1e12)).k_star_measured == [0] * len(p.acceptance)
    assert 0 not in score_from_artifacts(p, measurement(plain=1e-12)).k_star_measured


OLMOE = {"model": "synthetic:olmoe-tiny", "fingerprint": "0123", "dtype": "float32", "num_experts": N, "top_k": M,
         "num_layers": 2}


def test_predict_refuses_a_characterization_and_a_measurement_of_different_models():
    char = {**characterization(), "provenance": OLMOE}
    mixtral = {**base(), "provenance": {**OLMOE, "model": "synthetic:mixtral-tiny", "fingerprint": "4567"}}
    with pytest.raises(ProvenanceMismatch) as e:
        predict_all(char, TRACE, mixtral, sources={"characterization": "c.json", "measurement_base": "m.json"})
    assert e.value.differences == [
        'fingerprint: characterization (c.json) has "0123"; measurement_base (m.json) has "4567"',
        'model: characterization (c.json) has "synthetic:olmoe-tiny"; measurement_base (m.json) has '
        '"synthetic:mixtral-tiny"']
    assert predict_all(char, TRACE, {**base(), "provenance": OLMOE})["provenance"]["model"] == OLMOE["model"]


def test_predict_refuses_a_trace_with_other_n_and_m():
    other = RoutingTrace(documents=[np.zeros((4, 2, 4), dtype=np.int16)], num_experts=16, expert_bytes=(B, B),
                         model="synthetic:mixtral-tiny")
    with pytest.raises(ProvenanceMismatch) as e:
        predict_all({**characterization(), "provenance": OLMOE}, other, {**base(), "provenance": OLMOE})
    named = lambda key, c, t: f"{key}: characterization has {c}; traces has {t}; measurement_base has {c}"  # noqa: E731
    assert e.value.differences == [named("model", '"synthetic:olmoe-tiny"', '"synthetic:mixtral-tiny"'),
                                   named("num_experts", 8, 16), named("top_k", 2, 4)]


def test_score_refuses_a_measurement_of_another_model():
    pred = predict_all(characterization(), TRACE, {**base(), "provenance": OLMOE})
    with pytest.raises(ProvenanceMismatch, match="model: prediction has .* measurement has"):
        score_all(pred, {**measurement(), "provenance": {**OLMOE, "model": "synthetic:mixtral-tiny"}})


def test_the_prediction_names_the_engine_whose_passes_it_read():
    """`moespec settings` prices llama.cpp's line on the passes alone only where they are llama.cpp's."""
    measured = {**base(), "provenance": {"experts": "llama.cpp"}}
    assert predict_all(characterization(), TRACE, measured)["provenance"]["experts"] == "llama.cpp"
    assert "experts" not in predict_all(characterization(), TRACE, base())["provenance"]
