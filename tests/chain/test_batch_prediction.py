"""V̂_B from artifacts (`chain.batch_prediction`): the terms of `costmodel.batch.step_times` read from a
characterization, a trace and a batch measurement, checked against the formula worked by hand."""

import numpy as np
import pytest

from moespec.chain.batch_prediction import pass_sizes, predict_batch, score_batch
from moespec.moe.traces import RoutingTrace

W = 1000.0  # bytes of one expert


def _fit(kernel, coef):
    names = {"slot": ("t_op", "c_u", "c_re"), "dedup": ("t_op", "c_g", "c_t")}[kernel]
    return {"kernel": kernel, "coefficients": dict(zip(names, coef)), "m": 1, "b": W, "residuals": [], "rank": 3,
            "cond": 1.0}


def _artifacts():
    # three documents, each always routing to its own expert (m = 1): one sequence's windows use one
    # expert, B windows from distinct documents use B of them, whatever their length
    trace = RoutingTrace([np.full((12, 1, 1), e, dtype=np.int16) for e in (0, 1, 2)], 4, (W,), model="hand")
    char = {"model": "hand", "N": 4, "m": 1, "layers": [0], "n": list(range(1, 10)),
            "fits": {"0": {"slot": _fit("slot", (1e-3, 2e-6, 5e-7)), "dedup": _fit("dedup", (2e-3, 1e-6, 1e-4))}},
            "dense": {"median": {str(n): 0.01 + 0.002 * n for n in (1, 2, 4, 9)}}}
    meas = {"model": "hand", "N": 4, "m": 1, "max_k": 2, "acceptances": [0.5, 0.9],
            "by_batch": {str(B): {"tau": {str(n): {"median": 0.05 * B + 0.01 * n} for n in (1, 2, 3)},
                                  "plain_pass": {"median": 0.05 * B + 0.02},  # text's passes, not seeded ids
                                  "h": [1e-4, 2e-4, 3e-4], "sweep": {"V": [None] * 3, "T": {
                                      "0.5": [100.0, 120.0, 110.0], "0.9": [100.0, 130.0, 150.0]}}}
                         for B in (1, 3)}}
    return char, trace, meas


def test_step_times_follow_the_formula_term_by_term():
    char, trace, meas = _artifacts()
    out = predict_batch(char, trace, meas)
    dense = lambda n: 0.01 + 0.002 * n  # noqa: E731  (linear in the characterized D(n), so interpolation is exact)
    slot1 = 1e-3 + 2e-6 * 1 * W + 5e-7 * (1 - 1) * W  # one row: the per-slot fit, U = 1
    dedup = lambda U, n: 2e-3 + 1e-6 * U * W + 1e-4 * n  # noqa: E731
    # B = 1: one document's windows hold one expert at every n
    want1 = [0.05 + 0.02 + (dedup(1, k + 1) if k else slot1) - slot1 + dense(k + 1) - dense(1) + h
             for k, h in enumerate([1e-4, 2e-4, 3e-4])]
    # B = 3: the three documents' windows, three experts at every n = 3(k + 1)
    want3 = [0.15 + 0.02 + dedup(3, 3 * (k + 1)) - dedup(3, 3) + dense(3 * (k + 1)) - dense(3) + h
             for k, h in enumerate([1e-4, 2e-4, 3e-4])]
    assert out["versions"]["prediction"][1] == pytest.approx(want1, rel=1e-12)
    assert out["versions"]["prediction"][3] == pytest.approx(want3, rel=1e-12)
    # timed: the passes timed alone plus h, never the sweep
    assert out["versions"]["timed"][3] == pytest.approx([0.15 + 0.01 * (k + 1) + h for k, h in
                                                         enumerate([1e-4, 2e-4, 3e-4])], rel=1e-12)
    assert out["unions"][3][9]["trace"] == pytest.approx(3.0) and out["unions"][3][9]["one_sequence"] == pytest.approx(1.0)


def test_the_prediction_never_reads_the_sweep_and_the_score_does():
    char, trace, meas = _artifacts()
    first = predict_batch(char, trace, meas)
    for row in meas["by_batch"].values():
        row["sweep"]["T"] = {"0.5": [1.0, 2.0, 3.0], "0.9": [3.0, 2.0, 1.0]}
    assert predict_batch(char, trace, meas)["versions"] == first["versions"]
    score = score_batch(first, meas)
    assert {c["k_measured"] for c in score["versions"]["prediction"]["cells"] if c["a"] == 0.5} == {2}


def test_refuses_passes_past_the_characterized_sizes_and_artifacts_of_another_model():
    char, trace, meas = _artifacts()
    meas["max_k"] = 3  # B = 3 at k = 3: n = 12 > 9
    for row in meas["by_batch"].values():
        row["h"].append(4e-4)
    with pytest.raises(ValueError, match=r"n = 12 .* --n 1\.\.9,12"):
        predict_batch(char, trace, meas)
    char, trace, meas = _artifacts()
    meas["model"] = "another"
    with pytest.raises(Exception, match="another"):
        predict_batch(char, trace, meas)


def test_pass_sizes_are_every_b_times_k_plus_one():
    assert pass_sizes([1, 2, 4], 2) == [1, 2, 3, 4, 6, 8, 12]


def test_where_no_draft_pays_is_reported_per_version():
    """Timed passes of 3 sequences that cost 0.2 s per token from the second on: V(k) >= (k + 1) V(0),
    so no draft pays at B = 3 in the timed version, and B = 3 is where that starts."""
    from moespec.costmodel.batch import first_never_paying_batch, no_draft_pays

    char, trace, meas = _artifacts()
    meas["by_batch"]["3"]["tau"] = {"1": {"median": 0.15}, "2": {"median": 0.4}, "3": {"median": 0.6}}
    out = predict_batch(char, trace, meas)
    for version, V in out["versions"].items():
        assert out["paying"][version]["no_draft_pays"] == {B: no_draft_pays(V[B]) for B in (1, 3)}
        assert out["paying"][version]["first_never_paying_batch"] == first_never_paying_batch(V)
    assert out["paying"]["timed"] == {"no_draft_pays": {1: False, 3: True}, "first_never_paying_batch": 3}


def test_a_sweep_on_a_busy_machine_is_flagged_in_the_score_and_its_lines():
    """Four repetitions of every (k, a) case; in the third every case ran at half speed (another job on
    the cores): 1 of 4 rounds >= 25% slower is over the flag's tenth, so the score says so, and the
    same sweep with that repetition at full speed is steady."""
    from moespec.report.batch import goal_lines

    char, trace, meas = _artifacts()
    pred = predict_batch(char, trace, meas)

    def samples(slow: float) -> dict:
        return {case: [rate, rate, rate * slow, rate] for case, rate in (("0,None", 100.0), ("1,0.5", 120.0),
                                                                          ("2,0.9", 150.0))}

    for row in meas["by_batch"].values():
        row["sweep"]["samples"] = samples(0.5)
    busy = score_batch(pred, meas)
    assert busy["steadiness"]["steady"] is False
    assert any("moved while it was measured" in line and "batch sweep, B = 3" in line for line in goal_lines(busy))
    for row in meas["by_batch"].values():
        row["sweep"]["samples"] = samples(1.0)
    assert score_batch(pred, meas)["steadiness"]["steady"] is True


def test_a_version_with_a_step_time_at_or_below_zero_is_left_out_and_the_rest_scored(tmp_path):
    """Dense products timed slower at one row than at two (noise at tiny widths) drive V̂_1(1) below
    zero: the prediction version is reported unavailable with its reason, the timed one is still
    scored and drawn."""
    from moespec.report.figures import plot_schedule

    char, trace, meas = _artifacts()
    char["dense"]["median"] = {"1": 0.5, "2": 0.3, "4": 0.1, "9": 0.0}
    out = predict_batch(char, trace, meas)
    assert set(out["versions"]) == {"timed"} and "is not positive" in out["unavailable"]["prediction"]
    score = score_batch(out, meas)
    assert set(score["versions"]) == {"timed"}
    assert plot_schedule(score, tmp_path / "s.png").stat().st_size > 1000
