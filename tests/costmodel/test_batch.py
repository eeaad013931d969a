"""The theory at batch size B (`costmodel.batch`) on exact rationals: the schedule k*(a, B), where no draft
pays, the largest paying batch, and V̂_B(k) built from its terms, each checked against values worked
out by hand."""

from fractions import Fraction as F

import pytest

from moespec.costmodel.batch import (first_never_paying_batch, largest_paying_batch, no_draft_pays, pass_tokens,
                                     schedule, step_times, total_throughput)

# V_B(0..3) in ms: B = 1 cheap drafts, B = 4 dearer, B = 8 dearer than k + 1 plain steps at every k
V = {1: [F(10), F(11), F(12), F(13)], 4: [F(20), F(30), F(40), F(50)], 8: [F(30), F(62), F(95), F(128)]}


def test_the_schedule_falls_with_the_batch():
    """a = 1/2: B = 1: T(k) = G(k)/V(k): 1/10, (3/2)/11, (7/4)/12, (15/8)/13 = 0.1, 0.136, 0.146, 0.144 -> k* = 2;
    B = 4: 1/20 = 0.05, (3/2)/30 = 0.05 (a tie: the smallest maximizer), (7/4)/40 < 0.05 -> 0; B = 8: 0.
    a = 9/10: B = 4: 1/20, 1.9/30 = 0.0633, 2.71/40 = 0.0678, 3.439/50 = 0.0688 -> 3."""
    got = schedule(V, [F(1, 2), F(9, 10)])
    assert got == {F(1, 2): {1: 2, 4: 0, 8: 0}, F(9, 10): {1: 3, 4: 3, 8: 0}}


def test_where_no_draft_pays():
    assert no_draft_pays(V[8]) and not no_draft_pays(V[4]) and not no_draft_pays(V[1])
    assert no_draft_pays([F(1), F(2)])  # V(1) = 2 V(0): even a = 1 - ε only ties plain decoding in the limit
    assert first_never_paying_batch(V) == 8
    assert first_never_paying_batch({1: V[1], 4: V[4]}) is None
    assert largest_paying_batch(V, F(1, 2)) == 1 and largest_paying_batch(V, F(9, 10)) == 4
    assert largest_paying_batch({8: V[8]}, F(9, 10)) is None


def test_total_throughput_counts_every_sequence():
    assert total_throughput(V[4], F(1, 2), 1, 4) == 4 * F(3, 2) / 30


def test_step_times_add_each_terms_growth_to_the_measured_pass():
    """τ_B(1) = 20; experts: 2 per union expert summed over layers + 1/2 per row; dense: n/4; h = 1, 2.
    B = 2, k = 1: n = 4, unions (per layer) [3, 4] at one token each, [5, 7] at two:
    V(0) = 20 + 1 = 21; V(1) = 20 + (2·12 + 2 − (2·7 + 1)) + (1 − 1/2) + 2 = 20 + 11 + 1/2 + 2 = 67/2."""
    got = step_times(F(20), lambda U, n: 2 * sum(U) + F(n, 2), lambda n: F(n, 4), [F(1), F(2)],
                     [[3, 4], [5, 7]], B=2)
    assert got == [F(21), F(67, 2)]
    assert pass_tokens(2, 1) == 4 and pass_tokens(8, 8) == 72
    with pytest.raises(ValueError, match="batch B >= 1"):
        pass_tokens(0, 1)
    with pytest.raises(ValueError, match="must match"):
        step_times(F(20), lambda U, n: 0, lambda n: 0, [F(1)], [[1], [2]], B=1)


def test_a_schedule_is_scored_cell_by_cell_with_the_rules_of_batch_one():
    """Two batch sizes, two acceptances: k̂* from V̂_B against the measured best of each cell."""
    from moespec.costmodel.batch import score_schedule

    V = {1: [10, 11, 12, 13], 4: [12, 18, 24, 30]}
    # E(k)/V(k) at a = 0.9: 0.1, 0.173, 0.226, 0.264 (B = 1) and 0.083, 0.106, 0.113, 0.115 (B = 4): k̂* = 3 at both;
    # at a = 0.5, B = 4: 0.083, 0.083 (a tie: the smallest k), 0.073, 0.063: k̂* = 0
    measured = {1: {0.9: [100, 160, 200, 190], 0.5: [100, 120, 110, 90]},
                4: {0.9: [300, 320, 330, 310], 0.5: [300, 250, 200, 150]}}
    out = score_schedule(V, measured, [0.9, 0.5])
    cells = {(c["B"], c["a"]): c for c in out["cells"]}
    assert cells[(1, 0.9)]["k_hat"] == 3 and cells[(1, 0.9)]["k_measured"] == 2
    assert cells[(1, 0.9)]["loss"] == pytest.approx(1 - 190 / 200) and cells[(1, 0.9)]["within_one"]
    assert cells[(4, 0.5)]["k_hat"] == 0 and cells[(4, 0.5)]["loss"] == 0
    assert cells[(4, 0.9)]["k_hat"] == 3 and cells[(4, 0.9)]["loss"] == pytest.approx(1 - 310 / 330)
    k_hat_1_05 = cells[(1, 0.5)]["k_hat"]  # E/V: 0.1, 0.136, 0.146, 0.144 -> 2; measured best 1
    assert k_hat_1_05 == 2 and cells[(1, 0.5)]["loss"] == pytest.approx(1 - 110 / 120)
    assert out["within_one"] == 1.0 and out["loss_max"] == pytest.approx(max(c["loss"] for c in out["cells"]))
    with pytest.raises(ValueError, match="3 measured throughputs for 4 step times"):
        score_schedule(V, {1: {0.9: [1, 2, 3]}}, [0.9])
