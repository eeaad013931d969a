"""The calibrated version's o(n) on llama.cpp: D(n) + R_d(n) at the base measurement's depth where the
characterization timed the rest of the pass there, else D(n) alone (`chain.prediction.outside_times`).
No timing: payload dicts with exact times."""

from fractions import Fraction as F

import pytest

from moespec.chain.prediction import BaseInputs, outside_times, predict_all, predict_from_artifacts, rest_at
from moespec.kernel_names import DEDUP
from tests.chain.test_prediction import FIT, NS, TRACE, D, base, characterization

DENSE = {str(n): F(n, 8) for n in NS}  # D(n) = n/8 s
REST = {str(n): F(n * n, 16) for n in NS}  # R_d(n) = n²/16 s at the measured depth


def inputs(depth: int = 512, split=None) -> BaseInputs:
    return BaseInputs(depth=depth, ns=list(NS), tau1=0.05, h=[0.001, 0.001, 0.001], slot_outside=split)


def test_dense_plus_rest_at_the_base_depth_exactly():
    char = {"dense": {"median": DENSE}, "rest": {"depths": [512], "median": {"512": REST}}}
    o, source = outside_times(inputs(512), char, list(NS))
    assert source == "dense-ops+rest" and o == {n: F(n, 8) + F(n * n, 16) for n in NS}
    assert o[3] - o[1] == F(2, 8) + F(8, 16)  # g(3) = D(3) − D(1) + R(3) − R(1)


@pytest.mark.parametrize("rest", [None, {"median": {"4096": REST}}, {"median": {"512": {"1": F(1), "2": F(2)}}}],
                         ids=["older-characterization", "other-depth", "some-n-missing"])
def test_without_rest_at_every_n_of_that_depth_dense_alone(rest):
    char = {"dense": {"median": DENSE}, **({} if rest is None else {"rest": rest})}
    o, source = outside_times(inputs(512), char, list(NS))
    assert source == "dense-ops" and o == {n: F(n, 8) for n in NS}


def test_the_passes_own_split_comes_first():
    char = {"dense": {"median": DENSE}, "rest": {"median": {"512": REST}}}
    split = {n: [[0.25 * n, 0.25 * n]] for n in NS}  # [prompts, repetitions]
    o, source = outside_times(inputs(512, split), char, list(NS))
    assert source == "passes" and o == {n: 0.25 * n for n in NS}


def test_rest_at_reads_one_depth():
    assert rest_at({"rest": {"median": {"512": REST}}}, 512) == REST
    assert rest_at({"rest": {"median": {"512": REST}}}, 4096) == {} and rest_at({}, 512) == {}


def test_the_calibrated_version_adds_the_growth_of_both_terms_to_eq_22():
    """From the artifacts: a base measurement without the passes' split (as on llama.cpp), its depth
    D; the calibrated τ̂(n) is the measured-time version's plus (D + R)(n) − (D + R)(1) at depth D, and
    plus D(n) − D(1) when R was timed only at another depth."""
    dense = {str(n): 2.0**-7 * n for n in NS}
    rest = {str(n): 2.0**-9 * n * n for n in NS}
    for depths, source, grows in (({str(D): rest}, "dense-ops+rest", True), ({"4096": rest}, "dense-ops", False)):
        char = {**characterization(), "dense": {"median": dense}, "rest": {"median": depths}}
        plain = predict_from_artifacts(char, TRACE, base(inside=False), version="measured-time")
        cal = predict_from_artifacts(char, TRACE, base(inside=False), version="calibrated")
        o = {n: dense[str(n)] + (rest[str(n)] if grows else 0.0) for n in NS}
        for kernel in ("slot", "dedup"):
            for i, n in enumerate(NS):
                assert cal.tau[kernel][i] == pytest.approx(plain.tau[kernel][i] + o[n] - o[1], rel=1e-12)
        assert predict_all(char, TRACE, base(inside=False))["depths"][0]["calibrated_outside"] == source


def test_growth_shares_splits_the_held_out_growth_into_the_terms():
    """benchmarks/growth_shares.py on artifacts built here: the held-out passes' growth, the expert
    term of the version the calibrated one builds on, D and R as characterized, and what is left."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("growth_shares", Path(__file__).parents[2] / "benchmarks" /
                                                  "growth_shares.py")
    shares = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shares)
    dense, rest = {str(n): 2.0**-7 * n for n in NS}, {str(n): 2.0**-9 * n * n for n in NS}
    char = {**characterization(), "dense": {"median": dense}, "rest": {"median": {str(D): rest}}}
    measurement = base(inside=False)
    prediction = predict_all(char, TRACE, measurement)
    g = shares.growth(char, measurement, prediction, D)
    mt = predict_from_artifacts(char, TRACE, measurement, version="measured-time").tau["dedup"]
    for i, n in enumerate(NS):
        assert g["measured"][n] == pytest.approx(FIT[DEDUP][n] - FIT[DEDUP][1], abs=1e-12)  # the odd repetitions
        assert g["experts"][n] == pytest.approx(mt[i] - mt[0], abs=1e-12)
        assert (g["dense"][n], g["rest"][n]) == (dense[str(n)] - dense["1"], rest[str(n)] - rest["1"])
        assert g["left"][n] == pytest.approx(g["measured"][n] - g["experts"][n] - g["dense"][n] - g["rest"][n])


def test_terms_timed_beside_the_passes_come_before_the_characterizations_and_read_the_fit_half():
    """A base measurement whose passes of the even repetitions carry D(n) and R_d(n) timed right after
    each (llama.cpp, `run_verify(outside=True)`): the calibrated o(n) is their sum, summarized as the
    passes are (each prompt's median, averaged), "beside-passes", ahead of the characterization's
    terms timed alone; the held-out half carries none."""
    import numpy as np

    from moespec.chain.prediction import base_inputs, repetition_half
    from tests.chain.test_prediction import P, R, as_json, verify_times

    prompt = np.arange(P)[:, None] * 2.0**-6  # [P, 1]: prompt p's terms p/64 s slower
    dense = {n: np.tile(2.0**-7 * n, (P, R // 2)) + prompt for n in NS}
    rest = {n: np.tile(2.0**-9 * n * n, (P, R // 2)) for n in NS}
    times = verify_times(inside=False)
    from dataclasses import replace

    measured = as_json({"model": "test", "verify": [replace(times, outside={"dense": dense, "rest": rest}).to_dict()],
                        "h": {D: {0: 0.001, 1: 0.001, 2: 0.001}}, "h_source": "oracle-probe"})
    char = {**characterization(), "dense": {"median": DENSE}, "rest": {"median": {str(D): REST}}}
    o, source = outside_times(base_inputs(measured, D), char, list(NS))
    assert source == "beside-passes"
    mean_offset = (P - 1) / 2 * 2.0**-6
    assert o == {n: pytest.approx(2.0**-7 * n + 2.0**-9 * n * n + mean_offset, rel=1e-12) for n in NS}
    assert repetition_half(replace(times, outside={"dense": dense, "rest": rest}), "holdout").outside is None
    assert predict_all(char, TRACE, measured)["depths"][0]["calibrated_outside"] == "beside-passes"
