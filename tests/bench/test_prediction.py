"""predict_from_artifacts: built from characterization, trace and base measurement only."""

import copy
import json
from dataclasses import replace

import numpy as np
import pytest

from moespec import artifacts
from moespec.bench.prediction import (nearest_layers, predict_all, predict_from_artifacts, score_from_artifacts,
                                      window_unions, windows_source)
from moespec.costmodel.fit import ExpertFit
from moespec.costmodel.predict import VERSIONS
from moespec.moe.traces import RoutingTrace
from moespec.pipeline import DemoConfig, run_demo


# Fits of a plausible memory-bound kernel (s, s/byte, s/token). The smoke run's own fits come from
# sub-millisecond timings of a tiny model and can extrapolate below zero; these tests check the
# plumbing from artifacts to a prediction, so they replace them with fixed ones.
FIXED = {"slot": {"t_op": 1e-3, "c_u": 1e-11, "c_re": 8e-12}, "dedup": {"t_op": 1e-3, "c_g": 1.2e-11, "c_t": 1e-4}}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("chain")
    smoke = DemoConfig.smoke()  # the verified windows timed in the characterization too (the fallback)
    run_demo(out, config=replace(smoke, characterize={**smoke.characterize, "verified_reps": 1}), progress=False,
             echo=lambda _: None)
    path = out / "characterization.json"
    char = artifacts.load(path, "characterize")["payload"]
    for fits in char["fits"].values():
        for kernel, fit in fits.items():
            fit["coefficients"] = dict(FIXED[kernel])
    # and the measured operation times: on a tiny model on a busy machine they are sub-millisecond
    # noise, which can make t(n) < t(1) (a verify time below zero, refused) or a saving exceed the
    # per-slot verify time; these are fixed, growing with n, with no saving, and differ by source
    per_token = {"verified": 1.0e-3, "recorded": 1.1e-3, "between": 0.9e-3}
    slot = {(q["layer"], q["n"], q["source"], q["placement"]): q["timing"]["median"]
            for q in char["points"] if q["kernel"] == "slot"}
    dedup = [q for q in char["points"] if q["kernel"] == "dedup"]
    for q in dedup:
        q["timing"]["median"] = slot[(q["layer"], q["n"], q["source"], q["placement"])]
    for q in char["points"]:
        if q["source"] in per_token:
            q["timing"]["median"] = per_token[q["source"]] * q["n"]
    assert dedup
    artifacts.write(path, "characterize", char)
    base_path = out / "measurement-base.json"
    base = artifacts.load(base_path, "measure")["payload"]
    for v in base["verify"]:
        for kernel, by_n in v["ops"].items():
            v["ops"][kernel] = {n: np.full(np.shape(x), per_token["between"] * int(n)).tolist() for n, x in by_n.items()}
    artifacts.write(base_path, "measure", base)
    return out


def _inputs(run):
    return (artifacts.load(run / "characterization.json", "characterize")["payload"],
            RoutingTrace.load(run / "traces.parquet"),
            artifacts.load(run / "measurement-base.json", "measure")["payload"])


def test_window_unions_match_a_direct_count():
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 6, size=(T, 2, 2)) for T in (7, 3)]
    for d in docs:  # top-2 of distinct experts per token
        d[:, :, 1] = (d[:, :, 0] + 1 + rng.integers(0, 4, size=d.shape[:2])) % 6
    trace = RoutingTrace(documents=docs, num_experts=6, expert_bytes=(10, 10))
    for n in (1, 2, 3, 4):
        U = window_unions(trace, n)
        want = [[len(set(d[t:t + n, l].ravel())) for d in docs for t in range(d.shape[0] - n + 1)] for l in range(2)]
        assert U.tolist() == want


def test_nearest_layers():
    assert nearest_layers([0, 4], 6) == [0, 0, 0, 4, 4, 4]
    with pytest.raises(ValueError, match="no layer"):
        nearest_layers([], 3)


def test_every_version_predicts(run):
    char, trace, base = _inputs(run)
    payload = predict_all(char, trace, base)
    entry = payload["depths"][0]
    assert set(entry["versions"]) == set(VERSIONS) and entry["unavailable"] == {}
    # the smoke demo's base measurement splits its passes: the calibrated growth is read inside them
    assert entry["calibrated_growth"].startswith("pass by pass")
    p = entry["versions"]["calibrated"]
    assert p["tau"]["slot"][0] == pytest.approx(base["verify"][0]["tau_meas_1"])  # g(1) = 0


def test_predict_never_reads_the_sweeps(run):
    char, trace, base = _inputs(run)
    clean = predict_from_artifacts(char, trace, base, version="prediction")
    full = artifacts.load(run / "measurement.json", "measure")["payload"]
    garbage = {**base, "oracle": "garbage", "draft_sweep": {"not": "a sweep"}, "scaling": None}
    assert predict_from_artifacts(char, trace, garbage, version="prediction") == clean
    # the sweep's own h(k) differs from the probe's; swapping it in must not leak into the prediction
    swept = {**base, "oracle": full["oracle"]}
    assert predict_from_artifacts(char, trace, swept, version="prediction") == clean


def test_missing_h_names_the_fix(run):
    char, trace, base = _inputs(run)
    with pytest.raises(ValueError, match="no h\\(k\\)"):
        predict_from_artifacts(char, trace, {**base, "h": {}})


def _without_ops(base: dict) -> dict:
    """The base measurement as written before it timed the operation between its passes."""
    strip = lambda v: {k: x for k, x in v.items() if k not in ("ops", "op_layers")}  # noqa: E731
    return {**base, "verify": [strip(v) for v in base["verify"]]}


def test_measured_time_version_takes_the_operation_timed_between_the_verify_passes(run):
    char, trace, base = _inputs(run)
    v = base["verify"][0]
    assert v["op_layers"] == [0]  # the smoke demo characterizes layer 0: its operation is timed there
    entry = predict_all(char, trace, base)["depths"][0]
    assert entry["measured_time_windows"] == "verified, timed between the verify passes"
    got = predict_from_artifacts(char, trace, base, version="measured-time")
    for n in (1, 2, 3):
        for kernel, engine in (("slot", "moespec_slot"), ("dedup", "moespec_dedup")):
            if kernel == "dedup" and n == 1:
                continue
            samples = np.asarray(v["ops"][engine][str(n)])  # [P, R, L]: one prompt, R repetitions, layer 0
            assert samples.shape == (1, len(v["samples"][engine][str(n)][0]), 1)
            # M̂(n) sums the two MoE layers; both take layer 0's median time (the nearest timed)
            assert got.M[kernel][n - 1] == pytest.approx(2 * np.median(samples[0, :, 0]))
    # the calibrated version builds on these times too: its saving is theirs
    cal = predict_from_artifacts(char, trace, base, version="calibrated")
    assert cal.S == pytest.approx(got.S)
    assert predict_from_artifacts(char, trace, _without_ops(base), version="measured-time").M != got.M


def test_calibrated_growth_is_taken_pass_by_pass(run):
    """o(n) is the median of each slot pass's time minus its time inside the experts modules; it
    differs here from the difference of the two medians."""
    char, trace, base = _inputs(run)
    v = copy.deepcopy(base["verify"][0])
    rng = np.random.default_rng(3)
    passes, inside = {}, {}
    tau1 = v["tau_meas_1"]
    for n in (1, 2, 3):  # a growth of 10 ms per token outside the operation, passes 4 ms apart
        passes[n] = tau1 + 0.01 * (n - 1) + rng.uniform(0, 0.004, size=(1, 5))  # [P, R]
        inside[n] = 1e-4 * n + rng.uniform(0, 2e-4, size=(1, 5))  # [P, R]
        v["samples"]["moespec_slot"][str(n)] = passes[n].tolist()
        v["inside"]["moespec_slot"][str(n)] = inside[n].tolist()
    base = {**base, "verify": [v]}
    entry = predict_all(char, trace, base)["depths"][0]
    assert entry["calibrated_growth"].startswith("pass by pass")
    plain = predict_from_artifacts(char, trace, base, version="measured-time")
    cal = predict_from_artifacts(char, trace, base, version="calibrated")
    o = {n: float(np.median(passes[n] - inside[n])) for n in (1, 2, 3)}
    apart = {n: float(np.median(passes[n]) - np.median(inside[n])) for n in (1, 2, 3)}
    assert abs((o[3] - o[1]) - (apart[3] - apart[1])) > 1e-6  # the two estimates differ
    for i, n in enumerate(cal.n):
        assert cal.tau["dedup"][i] == pytest.approx(plain.tau["dedup"][i] + o[n] - o[1], rel=1e-9)
    # a base measurement whose passes were not split: g(n) is tau_slot(n) minus the measured-time version's
    unsplit = {**base, "verify": [{k: x for k, x in v.items() if k != "inside"}]}
    assert predict_all(char, trace, unsplit)["depths"][0]["calibrated_growth"].startswith("tau_slot")
    cal_unsplit = predict_from_artifacts(char, trace, unsplit, version="calibrated")
    for i, n in enumerate(cal.n):
        assert cal_unsplit.tau["slot"][i] == pytest.approx(v["tau"]["moespec_slot"][str(n)], rel=1e-9)


def test_measured_time_version_times_the_verified_windows(run):
    char, trace, base = _inputs(run)
    base = _without_ops(base)  # the characterization's times, where the base measurement has none
    depth = base["verify"][0]["depth"]
    verified = [p for p in char["points"] if p["source"] == "verified"]
    # the smoke demo times the first n tokens after depth d of each verify prompt, at each n
    assert {p["placement"] for p in verified} == {f"d{depth}/p0"} and {p["n"] for p in verified} == {1, 2, 3}
    assert windows_source(char, depth) == "verified" and windows_source(char, depth + 1) == "recorded"
    entry = predict_all(char, trace, base)["depths"][0]
    assert entry["measured_time_windows"] == "verified"
    got = predict_from_artifacts(char, trace, base, version="measured-time")
    # M̂(n) sums the two MoE layers; both take layer 0's time on the verified window (the nearest timed)
    for n in (2, 3):
        (t,) = [p["timing"]["median"] for p in verified if p["n"] == n and p["kernel"] == "dedup"]
        assert got.M["dedup"][n - 1] == pytest.approx(2 * t)
    # without them the version falls back to the corpus windows, and its operation times change
    recorded = predict_from_artifacts({**char, "points": [p for p in char["points"] if p["source"] != "verified"]},
                                      trace, base, version="measured-time")
    assert recorded.M["dedup"] != got.M["dedup"]


def test_measured_time_version_unavailable_without_recorded_windows(run):
    char, trace, base = _inputs(run)
    base = _without_ops(base)
    chosen_only = {**char, "points": [p for p in char["points"] if p["source"] == "chosen"]}
    with pytest.raises(ValueError, match="recorded windows"):
        predict_from_artifacts(chosen_only, trace, base, version="measured-time")
    entry = predict_all(chosen_only, trace, base)["depths"][0]
    assert "measured-time" in entry["unavailable"] and entry["calibrated_on"] == "prediction"


def test_uncharacterized_layers_take_the_nearest_fit(run):
    char, trace, base = _inputs(run)
    assert char["layers"] == [0] and trace.num_layers == 2
    p = predict_from_artifacts(char, trace, base, version="prediction")
    fit0 = ExpertFit.from_dict(char["fits"]["0"]["slot"])
    # at n = 1 every window has U = m; M̂ sums two layers that both use layer 0's fit
    one = float(fit0.predict(trace.top_k, 1, trace.top_k, trace.expert_bytes[1]))
    assert p.M["slot"][0] == pytest.approx(2 * one)


def test_score_from_artifacts_reads_the_sweep(run):
    char, trace, base = _inputs(run)
    p = predict_from_artifacts(char, trace, base, version="calibrated")
    s = score_from_artifacts(p, run / "measurement.json")
    assert len(s.k_star_measured) == len(p.acceptance) == 11
    assert len(s.rules) == 6
    json.dumps(s.to_dict())


def test_every_acceptance_is_scored_against_the_pooled_plain_decoding(run):
    char, trace, base = _inputs(run)
    p = predict_from_artifacts(char, trace, base, version="prediction")
    meas = artifacts.load(run / "measurement.json", "measure")["payload"]
    entry = next(e for e in meas["oracle"] if e["kernel"] == "moespec_dedup")
    assert entry["plain"]["runs"] == sum(c["runs"] for c in entry["cells"] if c["k"] == 0)
    entry["plain"]["step_throughput"] = 1e12  # plain decoding beats every drafting cell at every a
    assert score_from_artifacts(p, meas).k_star_measured == [0] * len(p.acceptance)
    entry["plain"]["step_throughput"] = 1e-12  # ... or none
    assert 0 not in score_from_artifacts(p, meas).k_star_measured
