"""Tests of the prediction (22): exact recovery of a known step-time model, the calibrated version,
the band of (18), the crossover of Sec. 2 and the bounds (20)-(21).

Times are dyadic (integers times 2^-12 s, averaged over 4 windows), so every sum is exact in float
and "recovers the truth" is tested with ==.
"""

import json
import math

import numpy as np
import pytest

from moespec.costmodel.fit import ExpertFit
from moespec.costmodel.predict import ACCEPTANCE_GRID, NonPositiveTime, Prediction, crossover, predict, window_times

L, W, N_MAX, Q = 4, 4, 9, 2.0**-12  # layers, windows, largest pass size, time quantum (s)
OUTSIDE = 0.125  # time outside the expert operation, constant in n unless a test adds growth


def op_times(kernel: str, n: int, scale: float = 1.0) -> np.ndarray:
    """[L, W] operation times of a known kernel model: per-slot 8+l+3n, dedup 14+l+2n (+ window jitter)."""
    l, w = np.arange(L)[:, None], np.arange(W)[None, :]
    base = 8 + l + 3 * n if kernel == "slot" else 14 + l + 2 * n
    return (base + (w % 2)) * Q * scale


def inputs():
    t_slot = {n: op_times("slot", n) for n in range(1, N_MAX + 1)}
    t_dedup = {n: op_times("dedup", n) for n in range(2, N_MAX + 1)}
    h = [(4 + k) * Q for k in range(N_MAX)]
    return t_slot, t_dedup, h


def true_tau(kernel: str, n: int, growth: float = 0.0) -> float:
    """The step-time model: outside time + its growth + the sum of layer operation times."""
    k = "slot" if n == 1 else kernel
    return OUTSIDE + growth * (n - 1) + float(op_times(k, n).mean(axis=1).sum())


def true_k_star(V, a) -> int:
    G = np.cumsum(a ** np.arange(len(V)))
    T = G / np.asarray(V)
    return int(np.flatnonzero(T == T.max())[0])


def test_noiseless_inputs_recover_the_true_step_time_model_exactly():
    t_slot, t_dedup, h = inputs()
    p = predict(t_slot=t_slot, t_dedup=t_dedup, tau1=true_tau("slot", 1), h=h, eps=0.05)
    for i, n in enumerate(p.n):
        assert p.tau["slot"][i] == true_tau("slot", n)
        assert p.tau["dedup"][i] == true_tau("dedup", n)
        assert p.S[i] == true_tau("slot", n) - true_tau("dedup", n)
        assert p.M["dedup"][i] == float(op_times("slot" if n == 1 else "dedup", n).mean(axis=1).sum())
    # per layer slot - dedup = (n - 6) Q: negative below 6, zero at 6, positive from 7
    assert p.crossover == 7
    V = [true_tau("dedup", k + 1) + h[k] for k in range(len(h))]
    assert p.V["dedup"] == V
    assert p.acceptance == list(ACCEPTANCE_GRID) and len(p.acceptance) == 11
    assert p.k_star["dedup"] == [true_k_star(V, a) for a in ACCEPTANCE_GRID]
    assert len(set(p.k_star["dedup"])) > 2  # the staircase actually climbs on this model
    for a, k, s in zip(ACCEPTANCE_GRID, p.k_star["dedup"], p.speedup["dedup"]):
        assert s == pytest.approx(sum(a**j for j in range(k + 1)) * V[0] / V[k], rel=1e-12)
    assert p.tau["auto"] == [min(s, d) for s, d in zip(p.tau["slot"], p.tau["dedup"])]


def test_band_of_18_is_eps_over_one_minus_eps_times_both_expert_times():
    t_slot, t_dedup, h = inputs()
    p = predict(t_slot=t_slot, t_dedup=t_dedup, tau1=true_tau("slot", 1), h=h, eps=0.2)
    for i in range(N_MAX):
        half = 0.25 * (p.M["slot"][i] + p.M["dedup"][i])
        assert p.S_hi[i] - p.S[i] == pytest.approx(half) and p.S[i] - p.S_lo[i] == pytest.approx(half)


def test_bandwidth_errors_inside_eps_keep_the_true_saving_inside_the_band():
    # 50 seeded draws of one bandwidth error per (kernel, n, layer), |e| <= eps; (18) must hold in all.
    rng = np.random.default_rng(0)
    eps = 0.1
    t_slot, t_dedup, h = inputs()
    for _ in range(50):
        def estimate(t):  # beta_hat = beta (1 + e) turns a time x into x / (1 + e)
            return {n: x / (1 + rng.uniform(-eps, eps, size=(L, 1))) for n, x in t.items()}

        p = predict(t_slot=estimate(t_slot), t_dedup=estimate(t_dedup), tau1=true_tau("slot", 1), h=h, eps=eps)
        for i, n in enumerate(p.n[1:], start=1):
            assert p.S_lo[i] <= true_tau("slot", n) - true_tau("dedup", n) <= p.S_hi[i]


def test_calibrated_version_adds_the_growth_of_the_time_outside_the_operation():
    growth = 3 * Q  # attention and dense growth per extra token, invisible to the expert operation
    t_slot, t_dedup, h = inputs()
    outside = {n: OUTSIDE + growth * (n - 1) for n in range(1, N_MAX + 1)}  # o(n), read inside the slot passes
    kw = dict(t_slot=t_slot, t_dedup=t_dedup, tau1=true_tau("slot", 1), h=h, eps=0.05)
    plain = predict(**kw, version="measured-time")
    cal = predict(**kw, version="calibrated", outside=outside)
    for i, n in enumerate(cal.n):
        assert cal.tau["slot"][i] == true_tau("slot", n, growth)
        assert cal.tau["dedup"][i] == true_tau("dedup", n, growth)
        assert plain.tau["dedup"][i] == true_tau("dedup", n)  # misses the growth
    assert cal.S == plain.S  # the growth cancels in the saving
    assert cal.version == "calibrated" and cal.crossover == plain.crossover


def test_calibrated_version_takes_the_growth_pass_by_pass_where_given():
    """g(n) = o(n) - o(1) as given, steps up and down included (a BLAS call that runs faster at 8
    rows than at 7): o(n) of the split passes holds them, not noise."""
    t_slot, t_dedup, h = inputs()
    quanta = dict(zip(range(1, N_MAX + 1), (0, 20, 31, 24, 25, 25, 30, 24, 29)))  # o(n) - o(1), with o(8) < o(7)
    outside = {n: 0.004 + x * Q for n, x in quanta.items()}
    kw = dict(t_slot=t_slot, t_dedup=t_dedup, tau1=true_tau("slot", 1), h=h, eps=0.05)
    plain = predict(**kw, version="measured-time")
    cal = predict(**kw, version="calibrated", outside=outside)
    for p in ("slot", "dedup"):
        for i, n in enumerate(cal.n):
            assert cal.tau[p][i] == pytest.approx(plain.tau[p][i] + quanta[n] * Q, rel=1e-12)
    assert cal.S == pytest.approx(plain.S)
    with pytest.raises(ValueError, match="outside lacks n = \\[9\\]"):
        predict(**kw, version="calibrated", outside={n: 0.0 for n in range(1, 9)})
    with pytest.raises(ValueError, match="used by no other"):
        predict(**kw, version="measured-time", outside=outside)


def test_one_token_dedup_time_is_used_when_given_and_tau1_otherwise():
    t_slot, t_dedup, h = inputs()
    p = predict(t_slot=t_slot, t_dedup=t_dedup, tau1=0.5, h=h, eps=0.0)
    assert p.tau["dedup"][0] == p.tau["slot"][0] == 0.5 and p.S[0] == 0.0
    t_dedup[1] = op_times("slot", 1) + Q
    p = predict(t_slot=t_slot, t_dedup=t_dedup, tau1=0.5, h=h, eps=0.0)
    assert p.tau["dedup"][0] == 0.5 + L * Q


@pytest.mark.parametrize(
    "S, expected",
    [
        ([-1, -1, -1, -1, -1, -1, -1, -1, -1], None),  # never faster
        ([0, 1, 1, 1, 1, 1, 1, 1, 1], 2),  # faster from the first pass with reuse
        ([0, -1, -1, -1, 1, -1, 1, 1, 1], 7),  # must *stay* positive
        ([0, -1, -1, -1, -1, -1, -1, -1, 1], 9),
        ([0, -1, -1, -1, -1, -1, -1, 1, 0], None),  # zero is not faster
        ([5, -1, 1, 1, 1, 1, 1, 1, 1], 3),  # n = 1 never counts
    ],
)
def test_crossover_edge_cases(S, expected):
    assert crossover(list(range(1, 10)), S) == expected


def test_bounds_20_21_hold_for_any_step_time_error_within_delta():
    # 40 seeded step-time perturbations within delta: the true speedup lies in (21), and where
    # the prediction certifies separation, k_hat* is the true k*. A larger h leaves room to perturb.
    rng = np.random.default_rng(1)
    t_slot, t_dedup, h = inputs()
    h = [x + 0.01 for x in h]
    V = [true_tau("dedup", k + 1) + h[k] for k in range(len(h))]
    delta = 0.02
    certified = 0
    for _ in range(40):
        factor = 1 + rng.uniform(-delta, delta, size=N_MAX)
        h_hat = [v * f - true_tau("dedup", k + 1) for k, (v, f) in enumerate(zip(V, factor))]
        p = predict(t_slot=t_slot, t_dedup=t_dedup, tau1=true_tau("slot", 1), h=h_hat, eps=0.0, delta=delta)
        for j, a in enumerate(ACCEPTANCE_GRID):
            k = true_k_star(V, a)
            s_true = sum(a**i for i in range(k + 1)) * V[0] / V[k]
            assert p.speedup_lo["dedup"][j] <= s_true * (1 + 1e-12)
            assert s_true <= p.speedup_hi["dedup"][j] * (1 + 1e-12)
            if p.k_star_certain["dedup"][j]:
                certified += 1
                assert p.k_star["dedup"][j] == k
    assert certified > 0  # the certificate is not vacuous on this model
    assert p.loss_bound == pytest.approx(2 * delta / (1 + delta))


def test_window_times_evaluates_each_layers_fit_at_each_window():
    fits = [ExpertFit("slot", (1e-4 * (l + 1), 1e-12, 2e-13), m=8, b=1e6, residuals=(), rank=3, cond=1.0)
            for l in range(L)]
    U = np.array([[8, 12, 16], [9, 10, 11], [8, 8, 8], [20, 24, 30]])
    t = window_times(fits, U, 4, 8, [1e6] * L)
    assert t.shape == (L, 3)
    for l in range(L):
        expected = 1e-4 * (l + 1) + 1e-12 * U[l] * 1e6 + 2e-13 * (32 - U[l]) * 1e6
        np.testing.assert_allclose(t[l], expected, rtol=1e-12)


def test_prediction_round_trips_through_json():
    t_slot, t_dedup, h = inputs()
    p = predict(t_slot=t_slot, t_dedup=t_dedup, tau1=true_tau("slot", 1), h=h[:5], eps=0.05)
    assert Prediction.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    assert p.kmax == 4 and len(p.V["slot"]) == 5


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(eps=-0.1), "eps"),
        (dict(delta=-1.0), "delta"),
        (dict(version="guess"), "version"),
        (dict(version="calibrated"), "outside"),
        (dict(h=[0.0] * 10), "h="),
        (dict(h=[0.0]), "kmax"),
        (dict(tau1=-1.0), "tau1"),
        (dict(t_slot={n: op_times("slot", n) for n in range(2, 10)}), "n = 1"),
        (dict(t_dedup={n: op_times("dedup", n)[:3] for n in range(2, 10)}), "layers"),
        (dict(t_dedup={n: -op_times("dedup", n) for n in range(2, 10)}), "positive"),
    ],
)
def test_bad_inputs_raise_with_the_offending_value(change, match):
    t_slot, t_dedup, h = inputs()
    kw = dict(t_slot=t_slot, t_dedup=t_dedup, tau1=0.2, h=h, eps=0.05) | change
    with pytest.raises(ValueError, match=match):
        predict(**kw)


def test_a_time_at_or_below_zero_is_its_own_error():
    t_slot, t_dedup, h = inputs()
    falling = {n: op_times("slot", N_MAX + 1 - n) for n in range(1, N_MAX + 1)}  # slot times fall by 3 Q per n
    with pytest.raises(NonPositiveTime, match="τ̂_slot"):  # τ̂_slot(9) = Q + L (3 - 27) Q < 0
        predict(t_slot=falling, t_dedup=t_dedup, tau1=Q, h=h, eps=0.0)
    with pytest.raises(NonPositiveTime, match="positive"):
        predict(t_slot=t_slot, t_dedup={n: -t for n, t in t_dedup.items()}, tau1=0.2, h=h, eps=0.0)
    with pytest.raises(ValueError, match="finite") as e:  # a NaN is malformed, not merely unavailable
        predict(t_slot=t_slot, t_dedup={n: t * np.nan for n, t in t_dedup.items()}, tau1=0.2, h=h, eps=0.0)
    assert not isinstance(e.value, NonPositiveTime)


@pytest.mark.parametrize("eps", [0.6, 1.0, 3.0])
def test_large_eps_leaves_the_prediction_and_makes_the_bounds_vacuous(eps):
    """ε >= 1/2 gives δ >= 1: (20)-(21) bound nothing, and at ε >= 1 neither does (18); τ̂, Ŝ,
    the crossover and k̂* do not depend on ε."""
    t_slot, t_dedup, h = inputs()
    small = predict(t_slot=t_slot, t_dedup=t_dedup, tau1=0.2, h=h, eps=0.05)
    large = predict(t_slot=t_slot, t_dedup=t_dedup, tau1=0.2, h=h, eps=eps)
    assert large.bounds_vacuous and not small.bounds_vacuous
    assert (large.tau, large.S, large.crossover, large.k_star) == (small.tau, small.S, small.crossover, small.k_star)
    assert large.loss_bound == 1.0 and not any(large.k_star_certain["dedup"])
    assert all(hi == math.inf for hi in large.speedup_hi["dedup"])
    assert all((lo == -math.inf) == (eps >= 1) for lo in large.S_lo)
    from moespec.artifacts import json_safe

    assert Prediction.from_dict(json.loads(json.dumps(json_safe(large.to_dict())))) == large  # infinities survive JSON
