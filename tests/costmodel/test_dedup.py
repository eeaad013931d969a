"""Deduplicating engines (Sec. 3.4, App. B.2) checked like proofs: random positive step-time
parameters, reuses and acceptances (hypothesis) and exact grids. The step times are built from
(5) directly, so every identity below is tested against the step time, not against itself."""

import itertools
from fractions import Fraction as F

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moespec.costmodel.dedup import (
    added_time,
    byte_one_draft_a0,
    byte_one_draft_threshold,
    byte_reuse_threshold,
    byte_step_times,
    dedup_bytes,
    dedup_speedup,
    dedup_step_times,
    mean_reuse,
    one_draft_a0,
    one_draft_threshold,
    reuse_threshold,
    threshold_shift_in_a,
    threshold_shift_in_D,
)
from moespec.costmodel.steptime import verify_time
from moespec.costmodel.theory import expected_tokens, first_draft_threshold, speedup, speedup_condition
from tests.costmodel.conftest import SETTINGS, acceptance, nonneg, pos

reuse = st.integers(0, 12).map(lambda n: F(n, 12))


@st.composite
def engines(draw, kmax=3):
    """Parameters of (B.10) for k = 0..kmax, and V built from (5) term by term."""
    p = dict(
        m=draw(st.integers(1, 4)), t0=draw(nonneg), D=draw(nonneg), beta_D=draw(pos), beta_1=draw(pos),
        phi_1=draw(nonneg), kv=draw(st.lists(nonneg, min_size=kmax + 1, max_size=kmax + 1)),
        w=draw(st.lists(pos, min_size=1, max_size=3)),
    )
    p["kv"] = sorted(p["kv"])
    p["W"] = sum(p["w"])
    p["B"] = draw(st.lists(pos, min_size=kmax, max_size=kmax))
    p["phi_dedup"] = draw(st.lists(nonneg, min_size=kmax, max_size=kmax))
    p["rho_bars"] = draw(st.lists(reuse, min_size=kmax, max_size=kmax))
    mW = p["m"] * p["W"]
    p["tau_1"] = verify_time(t0=p["t0"], Dn=p["D"] + p["kv"][0], beta_D=p["beta_D"], E=mW, beta=p["beta_1"], phi=p["phi_1"])
    p["dD"] = [p["kv"][k] - p["kv"][0] for k in range(1, kmax + 1)]
    p["dphi"] = [ph - p["phi_1"] for ph in p["phi_dedup"]]
    p["V"] = [p["tau_1"]] + [
        verify_time(t0=p["t0"], Dn=p["D"] + p["kv"][k], beta_D=p["beta_D"],
                    E=dedup_bytes(m=p["m"], W=p["W"], k=k, rho_bar=p["rho_bars"][k - 1]),
                    beta=p["B"][k - 1], phi=p["phi_dedup"][k - 1])
        for k in range(1, kmax + 1)
    ]
    return p


def _at(p, k):
    """Keyword arguments of (13)-(15) at draft length k."""
    return dict(m=p["m"], W=p["W"], tau_1=p["tau_1"], B_k=p["B"][k - 1], beta_1=p["beta_1"],
                dD_k=p["dD"][k - 1], beta_D=p["beta_D"], dphi_k=p["dphi"][k - 1])


@SETTINGS
@given(st.integers(1, 4), st.lists(pos, min_size=1, max_size=3), st.data())
def test_B8_union_bytes_12(m, w, data):
    k = data.draw(st.integers(1, 4))
    rho = [[0] + data.draw(st.lists(reuse, min_size=k, max_size=k)) for _ in w]
    union = m * sum(wl * sum(1 - r for r in rl[: k + 1]) for wl, rl in zip(w, rho))  # (2)/(B.7), rho_l(1) = 0
    rho_bar = mean_reuse(w, rho, k)
    assert 0 <= rho_bar <= 1
    assert dedup_bytes(m=m, W=sum(w), k=k, rho_bar=rho_bar) == union
    assert union >= m * sum(w)  # (B.9)


@SETTINGS
@given(engines())
def test_B10_B13_added_time(p):
    V = dedup_step_times(m=p["m"], W=p["W"], rho_bars=p["rho_bars"], tau_1=p["tau_1"], B=p["B"],
                         beta_1=p["beta_1"], dD=p["dD"], beta_D=p["beta_D"], dphi=p["dphi"])
    assert V == p["V"]
    for k in range(1, len(V)):
        assert added_time(k=k, rho_bar=p["rho_bars"][k - 1], **{x: y for x, y in _at(p, k).items() if x != "tau_1"}) == V[k] - V[0]
        assert V[k] >= p["m"] * p["W"] / p["B"][k - 1] > 0  # (B.11)


@SETTINGS
@given(engines(), acceptance)
def test_B13_gap_identity(p, a):
    V = p["V"]
    for k in range(1, len(V)):
        rho_star = reuse_threshold(a, k, **_at(p, k))
        gap = V[k] - V[0] - (expected_tokens(a, k) - 1) * V[0]
        assert gap == p["m"] * p["W"] * k / p["B"][k - 1] * (rho_star - p["rho_bars"][k - 1])


@SETTINGS
@given(engines(), acceptance)
def test_B14_reuse_threshold_iff_faster(p, a):
    for k in range(1, len(p["V"])):
        assert (p["rho_bars"][k - 1] > reuse_threshold(a, k, **_at(p, k))) == speedup_condition(p["V"], a, k)


def test_B14_reuse_threshold_exact_grid():
    grid = [F(j, 4) for j in range(5)]
    checked = set()
    for rho_bar, B, beta_1, dphi, a in itertools.product(grid, [F(1, 2), 1, 2], [F(1, 2), 1, 2], [-F(1, 4), 0, 1], [F(j, 8) for j in range(8)]):
        kw = dict(m=2, W=3, tau_1=F(1, 4) + 6 / beta_1 + F(1, 2), B_k=B, beta_1=beta_1, dD_k=1, beta_D=4, dphi_k=dphi)
        V = [kw["tau_1"], kw["tau_1"] + added_time(k=2, rho_bar=rho_bar, **{x: y for x, y in kw.items() if x != "tau_1"})]
        V = [V[0], V[1] - 1, V[1]]  # V(1) is unused by the k = 2 comparison
        if V[1] <= 0:
            continue
        faster = speedup_condition(V, a, 2)
        assert (rho_bar > reuse_threshold(a, 2, **kw)) == faster
        checked.add(faster)
    assert checked == {True, False}


@SETTINGS
@given(engines(), acceptance)
def test_15_dedup_speedup(p, a):
    for k in range(1, len(p["V"])):
        assert dedup_speedup(a, k, rho_bar=p["rho_bars"][k - 1], **_at(p, k)) == speedup(p["V"], a, k)


@SETTINGS
@given(engines(), st.data())
def test_B15_B20_B21_more_reuse_never_hurts(p, data):
    more = [r + (1 - r) * data.draw(reuse) for r in p["rho_bars"]]
    q = dict(p, rho_bars=more)
    V2 = dedup_step_times(m=q["m"], W=q["W"], rho_bars=more, tau_1=q["tau_1"], B=q["B"], beta_1=q["beta_1"],
                          dD=q["dD"], beta_D=q["beta_D"], dphi=q["dphi"])
    assert V2[0] == p["V"][0] and all(v2 <= v for v2, v in zip(V2, p["V"]))  # (B.15), (B.20)
    for a in [F(j, 6) for j in range(6)]:
        for k in range(1, len(V2)):
            if speedup_condition(p["V"], a, k):
                assert speedup_condition(V2, a, k)  # (B.21)
            assert speedup(V2, a, k) >= speedup(p["V"], a, k)


@SETTINGS
@given(st.integers(1, 4), st.lists(pos, min_size=1, max_size=3), nonneg, st.lists(nonneg, min_size=4, max_size=4),
       pos, st.lists(reuse, min_size=3, max_size=3), acceptance)
def test_B16_byte_form(m, w, D, kv, beta, rho_bars, a):
    kv, W = sorted(kv), sum(w)
    V = byte_step_times(m=m, W=W, D=D, kv=kv, rho_bars=rho_bars)
    # one bandwidth beta for every byte, t0 = phi = 0: (14) must reduce to (16)
    tau_1 = verify_time(t0=0, Dn=D + kv[0], beta_D=beta, E=m * W, beta=beta)
    assert tau_1 == V[0] / beta
    for k in range(1, 4):
        kw = dict(m=m, W=W, tau_1=tau_1, B_k=beta, beta_1=beta, dD_k=kv[k] - kv[0], beta_D=beta, dphi_k=0)
        rho_star = byte_reuse_threshold(a, k, m=m, W=W, D=D, kv=kv)
        assert rho_star == reuse_threshold(a, k, **kw)
        assert (rho_bars[k - 1] > rho_star) == speedup_condition(V, a, k)


@SETTINGS
@given(engines(kmax=1), acceptance)
def test_B18_one_draft(p, a):
    kw = dict(m=p["m"], W=p["W"], tau_1=p["tau_1"], B_1=p["B"][0], beta_1=p["beta_1"], dD_1=p["dD"][0],
              beta_D=p["beta_D"], dphi_1=p["dphi"][0])
    rho_star = one_draft_threshold(a, **kw)
    assert rho_star == reuse_threshold(a, 1, **_at(p, 1))
    a0 = one_draft_a0(rho_bar_1=p["rho_bars"][0], **kw)
    assert a0 == first_draft_threshold(p["V"])
    assert (p["rho_bars"][0] > rho_star) == (a > a0)


@SETTINGS
@given(st.integers(1, 4), st.lists(pos, min_size=1, max_size=3), nonneg, st.lists(nonneg, min_size=2, max_size=2),
       st.data(), acceptance)
def test_B22_byte_one_draft(m, w, D, kv, data, a):
    kv = sorted(kv)
    rho_2 = data.draw(st.lists(reuse, min_size=len(w), max_size=len(w)))
    W = sum(w)
    rho_bar_1 = mean_reuse(w, [[0, r] for r in rho_2], 1)
    V = byte_step_times(m=m, W=W, D=D, kv=kv, rho_bars=[rho_bar_1])
    assert byte_one_draft_threshold(a, m=m, W=W, D=D, kv=kv) == byte_reuse_threshold(a, 1, m=m, W=W, D=D, kv=kv)
    a0 = byte_one_draft_a0(m=m, w=w, rho_2=rho_2, D=D, kv=kv)
    assert a0 == first_draft_threshold(V)
    assert (rho_bar_1 > byte_one_draft_threshold(a, m=m, W=W, D=D, kv=kv)) == (a > a0)


@SETTINGS
@given(engines(), acceptance, acceptance)
def test_B19_threshold_falls_in_a(p, a, a2):
    for k in range(1, len(p["V"])):
        shift = threshold_shift_in_a(a, a2, k, m=p["m"], W=p["W"], tau_1=p["tau_1"], B_k=p["B"][k - 1])
        assert shift == reuse_threshold(a, k, **_at(p, k)) - reuse_threshold(a2, k, **_at(p, k))
        assert (shift > 0) == (a < a2)


@SETTINGS
@given(engines(), acceptance, pos)
def test_B19_threshold_falls_in_D(p, a, extra):
    kv0, mW = p["kv"][0], p["m"] * p["W"]
    tau_1_more_D = verify_time(t0=p["t0"], Dn=p["D"] + extra + kv0, beta_D=p["beta_D"], E=mW, beta=p["beta_1"], phi=p["phi_1"])
    for k in range(1, len(p["V"])):
        before = reuse_threshold(a, k, **_at(p, k))
        after = reuse_threshold(a, k, **dict(_at(p, k), tau_1=tau_1_more_D))
        shift = threshold_shift_in_D(a, k, extra, m=p["m"], W=p["W"], B_k=p["B"][k - 1], beta_D=p["beta_D"])
        assert before - after == shift
        assert (after < before) if a > 0 else (after == before)


def test_B19_exact_grid_monotone():
    for a, a2 in itertools.combinations([F(j, 10) for j in range(10)], 2):
        for k in (1, 2, 3):
            assert byte_reuse_threshold(a2, k, m=1, W=1, D=2, kv=[0, 1, 2, 3]) < byte_reuse_threshold(a, k, m=1, W=1, D=2, kv=[0, 1, 2, 3])
            assert byte_reuse_threshold(a2, k, m=1, W=1, D=5, kv=[0, 1, 2, 3]) < byte_reuse_threshold(a2, k, m=1, W=1, D=2, kv=[0, 1, 2, 3])


def test_bad_inputs():
    with pytest.raises(ValueError, match="outside"):
        dedup_bytes(m=1, W=1, k=1, rho_bar=F(3, 2))
    with pytest.raises(ValueError, match="draft length k = 0"):
        byte_reuse_threshold(F(1, 2), 0, m=1, W=1, D=0, kv=[0])
    with pytest.raises(ValueError, match=r"acceptance a = 1 is outside \[0, 1\)"):
        byte_reuse_threshold(1, 1, m=1, W=1, D=0, kv=[0, 0])
    with pytest.raises(ValueError, match="B_k = -1"):
        reuse_threshold(F(1, 2), 1, m=1, W=1, tau_1=1, B_k=-1, beta_1=1, dD_k=0, beta_D=1, dphi_k=0)
    with pytest.raises(ValueError, match="dphi_k = nan"):
        added_time(m=1, W=1, k=1, rho_bar=0, B_k=1, beta_1=1, dD_k=0, beta_D=1, dphi_k=float("nan"))
