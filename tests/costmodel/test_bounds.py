"""Table 2 (App. C) checked like proofs: every perturbation inside eps or delta keeps each bound
(hypothesis, plus the extreme perturbations on exact grids), and each bound is attained or nearly
attained somewhere, so none is vacuous."""

import itertools
import math
from fractions import Fraction as F

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moespec.costmodel.bounds import (
    best_draft_length_separated,
    delta_from_eps,
    faster_kernel_certain,
    faster_kernel_margin,
    saving_bound,
    speedup_bounds,
    speedup_factor_from_eps,
    speedup_interval,
    step_time_delta,
    throughput_loss_bound,
    verify_time_bound,
)
from moespec.costmodel.steptime import memory_time, verify_time
from moespec.costmodel.theory import best_draft_length, speedup, throughput
from tests.costmodel.conftest import SETTINGS, acceptance, nonneg, pos, step_times

eps_s = st.integers(0, 19).map(lambda n: F(n, 20))  # eps in [0, 0.95]
small_eps = st.integers(0, 9).map(lambda n: F(n, 20))  # eps < 1/2
unit = st.integers(-20, 20).map(lambda n: F(n, 20))  # e / eps in [-1, 1]


def _tau(t0, Dn, beta_D, E, beta, phi, e_D=0, e=0):
    """tau_p(n) of (5) with the bandwidths estimated as beta (1 + e)."""
    return verify_time(t0=t0, Dn=Dn, beta_D=beta_D * (1 + e_D), E=E, beta=beta * (1 + e), phi=phi)


@SETTINGS
@given(nonneg, nonneg, pos, nonneg, pos, nonneg, eps_s, unit, unit)
def test_C1_17_verify_time_bound(t0, Dn, beta_D, E, beta, phi, eps, u1, u2):
    tau, tau_hat = _tau(t0, Dn, beta_D, E, beta, phi), _tau(t0, Dn, beta_D, E, beta, phi, u1 * eps, u2 * eps)
    M = memory_time(Dn=Dn, beta_D=beta_D, E=E, beta=beta)
    assert abs(tau_hat - tau) <= verify_time_bound(eps, M) <= verify_time_bound(eps, tau)
    # attained: every bandwidth underestimated by the full eps
    assert _tau(t0, Dn, beta_D, E, beta, phi, -eps, -eps) - tau == verify_time_bound(eps, M)


@SETTINGS
@given(nonneg, pos, pos, pos, pos, pos, eps_s, unit, unit, unit)
def test_C2_18_saving_bound(Dn, beta_D, E_slot, beta_slot, E_dedup, beta_dedup, eps, u_D, u_s, u_d):
    e_D = u_D * eps  # both kernels read D(n) at beta_D with the same estimate
    S = _tau(0, Dn, beta_D, E_slot, beta_slot, 0) - _tau(0, Dn, beta_D, E_dedup, beta_dedup, 0)
    S_hat = _tau(0, Dn, beta_D, E_slot, beta_slot, 0, e_D, u_s * eps) - _tau(0, Dn, beta_D, E_dedup, beta_dedup, 0, e_D, u_d * eps)
    bound = saving_bound(eps, E_slot / beta_slot, E_dedup / beta_dedup)
    assert abs(S_hat - S) <= bound


def test_C2_18_saving_bound_nearly_attained():
    # slot bandwidth under by eps, dedup over by eps: error eps/(1-eps) Me_slot + eps/(1+eps) Me_dedup,
    # within 0.1% of the bound when the deduplicating expert time is small
    eps, Ms, Md = F(1, 10), F(1), F(1, 1000)
    S = Ms - Md
    S_hat = Ms / (1 - eps) - Md / (1 + eps)
    assert abs(S_hat - S) <= saving_bound(eps, Ms, Md)
    assert abs(S_hat - S) / saving_bound(eps, Ms, Md) > F(999, 1000)


@SETTINGS
@given(pos, pos, eps_s, unit, unit)
def test_C3_19_faster_kernel_agree(u_bar, r, eps, uu, uv):
    # x = dedup expert time, y = slot expert time, x/y = u_bar/r; estimates scale them by 1/(1 + e)
    x, y = u_bar, r
    if faster_kernel_certain(u_bar, r, eps):
        x_hat, y_hat = x / (1 + uu * eps), y / (1 + uv * eps)
        assert (x_hat < y_hat) == (x < y) and (x_hat > y_hat) == (x > y)


def test_C3_19_margin_is_tight_exact_grid():
    for eps in [F(j, 20) for j in range(1, 10)]:
        edge = (1 - eps) / (1 + eps)  # u_bar/r at the margin of (19)
        for eta in [F(1, 100), F(1, 1000)]:
            inside, outside = edge * (1 + eta), edge * (1 - eta)
            assert not faster_kernel_certain(inside, 1, eps) and faster_kernel_certain(outside, 1, eps)
            # just inside the margin a perturbation within eps flips the predicted faster kernel
            x_hat, y_hat = inside / (1 - eps), 1 / (1 + eps)
            assert (x_hat < y_hat) != (inside < 1)
        assert faster_kernel_margin(float(eps)) == pytest.approx(math.log((1 + float(eps)) / (1 - float(eps))))


def _perturb(V, delta, signs):
    return [v * (1 + s * delta) for v, s in zip(V, signs)]


@SETTINGS
@given(step_times, acceptance, small_eps, st.data())
def test_C4_C5_20_throughput_loss(V, a, delta, data):
    signs = data.draw(st.lists(unit, min_size=len(V), max_size=len(V)))
    V_hat = _perturb(V, delta, signs)
    assert step_time_delta(V, V_hat) <= delta
    k, k_hat = best_draft_length(V, a), best_draft_length(V_hat, a)
    T = [throughput(V, a, i) for i in range(len(V))]
    T_hat = [throughput(V_hat, a, i) for i in range(len(V))]
    assert all(t / (1 + delta) <= th <= t / (1 - delta) for t, th in zip(T, T_hat))  # (C.4)
    assert T[k_hat] >= (1 - delta) / (1 + delta) * T[k]  # (C.5)
    assert 1 - T[k_hat] / T[k] <= throughput_loss_bound(delta)
    if best_draft_length_separated(V, a, delta):
        assert k_hat == k  # (20), separation
    assert best_draft_length([3 * v for v in V], a) == k  # a common factor leaves k* unchanged


def test_20_loss_bound_nearly_attained():
    delta, a = F(1, 10), F(1, 2)
    # T(1) = (1-delta)/(1+delta) T(0) (1 + eta): V_hat(0) = (1+delta) V(0), V_hat(1) = (1-delta) V(1)
    eta = F(1, 10**6)
    V = [1, F(3, 2) * (1 + delta) / ((1 - delta) * (1 + eta))]
    V_hat = [V[0] * (1 + delta), V[1] * (1 - delta)]
    k, k_hat = best_draft_length(V, a), best_draft_length(V_hat, a)
    assert (k, k_hat) == (0, 1)
    loss = 1 - throughput(V, a, k_hat) / throughput(V, a, k)
    assert throughput_loss_bound(delta) - loss < F(1, 10**5)
    assert not best_draft_length_separated(V, a, delta)  # the separation condition is needed


@SETTINGS
@given(step_times, acceptance, small_eps, st.data())
def test_C6_21_speedup_bounds(V, a, delta, data):
    signs = data.draw(st.lists(unit, min_size=len(V), max_size=len(V)))
    V_hat = _perturb(V, delta, signs)
    k, k_hat = best_draft_length(V, a), best_draft_length(V_hat, a)
    ratio = speedup(V_hat, a, k_hat) / speedup(V, a, k)
    lo, hi = speedup_bounds(delta)
    assert lo <= ratio <= hi
    s_lo, s_hi = speedup_interval(speedup(V_hat, a, k_hat), delta)
    assert s_lo <= speedup(V, a, k) <= s_hi


def test_21_speedup_bounds_attained():
    delta, a, V = F(1, 10), F(1, 2), [1, 1]
    lo, hi = speedup_bounds(delta)
    for V_hat, bound in [([1 - delta, 1 + delta], lo), ([1 + delta, 1 - delta], hi)]:
        k_hat = best_draft_length(V_hat, a)
        assert speedup(V_hat, a, k_hat) / speedup(V, a, best_draft_length(V, a)) == bound


@SETTINGS
@given(st.lists(st.tuples(nonneg, nonneg, pos, nonneg, pos, nonneg, nonneg, unit, unit), min_size=2, max_size=4), small_eps)
def test_C7_delta_from_eps(steps, eps):
    delta = delta_from_eps(eps)
    V, V_hat = [], []
    for t0, Dn, beta_D, E, beta, phi, h, u1, u2 in steps:
        if t0 + Dn + E + phi + h == 0:
            continue
        V.append(_tau(t0, Dn, beta_D, E, beta, phi) + h)
        V_hat.append(_tau(t0, Dn, beta_D, E, beta, phi, u1 * eps, u2 * eps) + h)
    if V:
        assert step_time_delta(V, V_hat) <= delta
        assert (1 + delta) / (1 - delta) == speedup_factor_from_eps(eps) == 1 / (1 - 2 * eps)


def test_C7_eps_tenth_gives_one_quarter_and_is_attained():
    assert speedup_factor_from_eps(F(1, 10)) == F(5, 4)
    assert speedup_factor_from_eps(0.1) == pytest.approx(1.25)
    delta = delta_from_eps(F(1, 10))
    assert delta == F(1, 9)
    # pure memory step times, every bandwidth under by eps: V_hat = V/(1 - eps) = (1 + delta) V exactly
    V = [_tau(0, 2, 1, 3, 1, 0), _tau(0, 2, 1, 6, 1, 0)]
    V_hat = [_tau(0, 2, 1, 3, 1, 0, -F(1, 10), -F(1, 10)), _tau(0, 2, 1, 6, 1, 0, -F(1, 10), -F(1, 10))]
    assert step_time_delta(V, V_hat) == delta


def test_exhaustive_extreme_perturbations():
    # every corner of the delta-box on V in {1..3}^3 at a grid of acceptances: (20) and (21) hold
    delta = F(1, 8)
    lo, hi = speedup_bounds(delta)
    for V in itertools.product(range(1, 4), repeat=3):
        for signs in itertools.product((-1, 0, 1), repeat=3):
            V_hat = _perturb(V, delta, signs)
            for a in [F(j, 4) for j in range(4)]:
                k, k_hat = best_draft_length(V, a), best_draft_length(V_hat, a)
                assert 1 - throughput(V, a, k_hat) / throughput(V, a, k) <= throughput_loss_bound(delta)
                assert lo <= speedup(V_hat, a, k_hat) / speedup(V, a, k) <= hi
                if best_draft_length_separated(V, a, delta):
                    assert k_hat == k


@pytest.mark.parametrize("eps", [1, F(3, 2), -0.1, float("nan")])
def test_bad_eps(eps):
    with pytest.raises(ValueError, match="eps"):
        verify_time_bound(eps, 1)


def test_bad_delta():
    with pytest.raises(ValueError, match=r"delta = 1 must lie in \[0, 1\)"):
        speedup_bounds(1)
    with pytest.raises(ValueError, match="eps < 1/2"):
        speedup_factor_from_eps(F(1, 2))
