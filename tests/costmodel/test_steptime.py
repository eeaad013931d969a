"""The step time (5), the saving (6) and the decision rule (7) (Sec. 3.1), on random positive
bytes, bandwidths and fixed work (hypothesis) and on an exhaustive exact grid."""

import itertools
from fractions import Fraction as F

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moespec.costmodel.steptime import (
    bandwidth_ratio,
    byte_share,
    dedup_expert_bytes,
    dedup_faster,
    dense_bytes,
    memory_time,
    saving,
    slot_expert_bytes,
    step_times,
    verify_time,
)
from moespec.costmodel.theory import best_draft_length, check_step_times
from tests.costmodel.conftest import SETTINGS, nonneg, pos



def test_5_dense_bytes():
    kv = [0, 5, 12, 21]
    assert [dense_bytes(100, kv, n) for n in range(1, 5)] == [100, 105, 112, 121]
    assert dense_bytes(100, lambda k: 3 * k, 3) == 106


def test_5_expert_bytes():
    assert slot_expert_bytes(8, 3, 10) == 240
    w, U = [10, 20], [F(9), F(27, 2)]
    assert dedup_expert_bytes(w, U) == 10 * 9 + 20 * F(27, 2)
    assert dedup_expert_bytes(w, U, f=[F(10, 9), 1]) == 100 + 270
    with pytest.raises(ValueError, match=r"f\[0\] = 1/2 must be >= 1"):
        dedup_expert_bytes(w, U, f=[F(1, 2), 1])


@SETTINGS
@given(nonneg, nonneg, pos, nonneg, pos, nonneg)
def test_5_verify_time(t0, Dn, beta_D, E, beta, phi):
    tau = verify_time(t0=t0, Dn=Dn, beta_D=beta_D, E=E, beta=beta, phi=phi)
    assert tau == t0 + Dn / beta_D + E / beta + phi
    assert memory_time(Dn=Dn, beta_D=beta_D, E=E, beta=beta) == tau - t0 - phi
    assert isinstance(tau, (int, F))


def test_5_verify_time_arrays():
    n = np.arange(1, 10)
    tau = verify_time(t0=1e-3, Dn=1e6 + 1e3 * n, beta_D=1e11, E=8 * n * 1e6, beta=2e11 * np.ones(9), phi=1e-4)
    assert tau.shape == (9,) and np.all(np.diff(tau) > 0)


@SETTINGS
@given(st.lists(pos, min_size=1, max_size=6), st.data())
def test_step_time_V_is_tau_plus_h(tau, data):
    h = data.draw(st.lists(nonneg, min_size=len(tau), max_size=len(tau)))
    V = step_times(tau, h)
    assert V == [t + x for t, x in zip(tau, h)]
    assert check_step_times(V) == V  # positive: the theory of Sec. 3.2-3.3 applies
    assert step_times(tau) == tau


@SETTINGS
@given(nonneg, nonneg, pos, pos, pos, pos, pos, nonneg, nonneg)
def test_6_saving_identity(t0, Dn, beta_D, E_slot, E_dedup_raw, beta_slot, beta_dedup, phi_slot, phi_dedup):
    E_dedup = min(E_dedup_raw, E_slot)  # union bytes never exceed the per-slot bytes
    S_direct = verify_time(t0=t0, Dn=Dn, beta_D=beta_D, E=E_slot, beta=beta_slot, phi=phi_slot) - verify_time(
        t0=t0, Dn=Dn, beta_D=beta_D, E=E_dedup, beta=beta_dedup, phi=phi_dedup
    )
    u, r = byte_share(E_dedup, E_slot), bandwidth_ratio(beta_dedup, beta_slot)
    S = saving(E_slot=E_slot, beta_slot=beta_slot, u_bar=u, r=r, phi_slot=phi_slot, phi_dedup=phi_dedup)
    assert S == S_direct


@SETTINGS
@given(pos, pos, st.integers(0, 16).map(lambda n: F(n, 16)), pos, nonneg)
def test_7_decision_rule(E_slot, beta_slot, u, r, phi):
    S = saving(E_slot=E_slot, beta_slot=beta_slot, u_bar=u, r=r, phi_slot=phi, phi_dedup=phi)
    assert (S > 0) == dedup_faster(u, r)
    assert (S == 0) == (u == r)


def test_7_decision_rule_exact_grid():
    grid = [F(j, 8) for j in range(0, 9)]
    for u, r, E_slot, beta in itertools.product(grid, grid[1:], [1, 3], [1, F(1, 2)]):
        S = saving(E_slot=E_slot, beta_slot=beta, u_bar=u, r=r)
        assert (S > 0) == dedup_faster(u, r) == (u < r)


def test_7_one_bandwidth_dedup_always_faster_with_reuse():
    for u in [F(j, 10) for j in range(10)]:
        assert saving(E_slot=5, beta_slot=2, u_bar=u, r=1) > 0
    assert saving(E_slot=5, beta_slot=2, u_bar=1, r=1) == 0


def test_6_unequal_fixed_work_subtracts():
    base = saving(E_slot=6, beta_slot=3, u_bar=F(1, 2), r=F(3, 4))
    assert base == 2 * (1 - F(2, 3))
    assert saving(E_slot=6, beta_slot=3, u_bar=F(1, 2), r=F(3, 4), phi_slot=1, phi_dedup=F(3, 2)) == base - F(1, 2)


def test_paper_table1_rule_at_two_tokens():
    # Table 1, n = 2: u_bar(2) > r(2) for every engine and model, so deduplication is slower there
    for r, u in [(0.75, 0.82), (0.53, 0.72), (0.68, 0.83), (0.59, 0.82), (0.50, 0.77)]:
        assert not dedup_faster(u, r)
        assert saving(E_slot=1.0, beta_slot=1.0, u_bar=u, r=r) < 0
    assert dedup_faster(0.50, 0.58)  # CUDA OLMoE at n = 8


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(t0=-1, Dn=0, beta_D=1, E=1, beta=1), "t0 = -1"),
        (dict(t0=0, Dn=0, beta_D=0, E=1, beta=1), "beta_D = 0"),
        (dict(t0=0, Dn=0, beta_D=1, E=1, beta=float("nan")), "nan"),
        (dict(t0=0, Dn=0, beta_D=1, E=1, beta=1, phi=-0.5), "phi_p"),
    ],
)
def test_bad_verify_time_inputs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        verify_time(**kwargs)


def test_bad_other_inputs():
    with pytest.raises(ValueError, match="pass size n = 0"):
        dense_bytes(1, [0], 0)
    with pytest.raises(ValueError, match="one entry per draft length"):
        step_times([1, 2], [0])
    with pytest.raises(ValueError, match=r"r\(n\) = 0"):
        dedup_faster(0.5, 0)


def test_step_time_feeds_the_staircase():
    # V(k) from (5) with a per-slot kernel: each draft adds m W bytes at beta_slot
    tau = [verify_time(t0=F(1, 10), Dn=100, beta_D=1000, E=slot_expert_bytes(2, n, 50), beta=500) for n in range(1, 6)]
    V = step_times(tau, [F(1, 100) * k for k in range(5)])
    assert best_draft_length(V, F(1, 10)) == 0 and best_draft_length(V, F(9, 10)) >= 2
