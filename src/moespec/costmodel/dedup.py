"""Deduplicating engines: union bytes (12), added time (13), reuse threshold (14), speedup (15), byte form (16).

Cost-model paper, Sec. 3.4 and App. B.2, with f_l = 1 and h = 0. Symbols: m experts per token,
W = sum_l w_l, rho_bar_k the byte-weighted mean reuse (11) of the k drafted tokens, tau_1 = tau(1)
= V(0) the one-token pass, beta_1 = beta(1) its bandwidth, B_k = beta_dedup(k+1), dD_k = D(k+1) - D(1)
= kv(k) - kv(0), dphi_k = phi_dedup(k+1) - phi(1). Exact on int/Fraction inputs.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from moespec.costmodel.theory import (
    check_acceptance,
    check_positive,
    exact_div,
    expected_tokens,
)


def _finite(name: str, x):
    """A finite number of either sign (differences such as dD_k and dphi_k)."""
    if isinstance(x, float) and not math.isfinite(x):
        raise ValueError(f"{name} = {x} must be finite")
    return x


def _k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"draft length k = {k} must be an int >= 1 (k = 0 is plain decoding)")
    return k


def _mW(m, W):
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"m = {m} experts per token must be an int >= 1")
    return m * check_positive("W", W)


def mean_reuse(w: Sequence, rho: Sequence[Sequence], k: int):
    """rho_bar_k = 1/(k W) sum_{j=2}^{k+1} sum_l w_l rho_l(j), eq. (11).

    w: [L] expert bytes per layer (> 0); rho: [L, J] with rho[l][j-1] = rho_l(j) in [0, 1], J >= k+1
    (rho_l(1) = 0 is not used).
    """
    k = _k(k)
    w = [check_positive(f"w[{l}]", wl) for l, wl in enumerate(w)]
    if len(rho) != len(w) or any(len(r) < k + 1 for r in rho):
        raise ValueError(f"rho needs {len(w)} layers of at least k+1 = {k + 1} reuses rho_l(1..k+1)")
    total = 0
    for l, wl in enumerate(w):
        for j in range(2, k + 2):
            r = check_positive(f"rho[{l}][{j - 1}]", rho[l][j - 1], allow_zero=True)
            if r > 1:
                raise ValueError(f"reuse rho_{l}({j}) = {r} is outside [0, 1]")
            total = total + wl * r
    return exact_div(total, k * sum(w))


def dedup_bytes(*, m: int, W, k: int, rho_bar):
    """E_dedup(k+1) = mW + mW k (1 - rho_bar_k), eq. (12) = (B.8); >= mW by (B.9)."""
    return _mW(m, W) * (1 + _k(k) * (1 - _check_reuse(rho_bar)))


def _check_reuse(rho_bar):
    rho_bar = check_positive("rho_bar", rho_bar, allow_zero=True)
    if rho_bar > 1:
        raise ValueError(f"mean reuse rho_bar = {rho_bar} is outside [0, 1]")
    return rho_bar


def added_time(*, m: int, W, k: int, rho_bar, B_k, beta_1, dD_k, beta_D, dphi_k):
    """V(k) - V(0) = dD_k/beta_D + dphi_k + E_dedup(k+1)/B_k - mW/beta(1), eq. (13)."""
    E = dedup_bytes(m=m, W=W, k=k, rho_bar=rho_bar)
    return (
        exact_div(_finite("dD_k", dD_k), check_positive("beta_D", beta_D))
        + _finite("dphi_k", dphi_k)
        + exact_div(E, check_positive("B_k", B_k))
        - exact_div(_mW(m, W), check_positive("beta_1", beta_1))
    )


def reuse_threshold(a, k: int, *, m: int, W, tau_1, B_k, beta_1, dD_k, beta_D, dphi_k):
    """rho*_k(a), eq. (14): draft length k beats plain decoding exactly when rho_bar_k > rho*_k(a) (B.14).

    rho*_k(a) = 1 - B_k/(mW k) [(G_a(k) - 1) tau(1) - dD_k/beta_D - dphi_k] - (B_k/beta(1) - 1)/k.
    It may lie outside [0, 1]: below 0 every routing pays, at or above 1 none does.
    """
    k, mW = _k(k), _mW(m, W)
    B_k, tau_1 = check_positive("B_k", B_k), check_positive("tau_1", tau_1)
    Y = (
        (expected_tokens(a, k) - 1) * tau_1
        - exact_div(_finite("dD_k", dD_k), check_positive("beta_D", beta_D))
        - _finite("dphi_k", dphi_k)
    )  # (B.12): the time a draft may add outside the expert reads
    return 1 - exact_div(B_k * Y, mW * k) - exact_div(exact_div(B_k, check_positive("beta_1", beta_1)) - 1, k)


def dedup_speedup(a, k: int, *, m: int, W, rho_bar, tau_1, B_k, beta_1, dD_k, beta_D, dphi_k):
    """T_a(k)/T_a(0) = G_a(k) V(0) / (V(0) + dD_k/beta_D + dphi_k + E_dedup(k+1)/B_k - mW/beta(1)), eq. (15)."""
    tau_1 = check_positive("tau_1", tau_1)
    V_k = tau_1 + added_time(
        m=m, W=W, k=k, rho_bar=rho_bar, B_k=B_k, beta_1=beta_1, dD_k=dD_k, beta_D=beta_D, dphi_k=dphi_k
    )
    return exact_div(expected_tokens(a, k) * tau_1, V_k)


def dedup_step_times(*, m: int, W, rho_bars: Sequence, tau_1, B: Sequence, beta_1, dD: Sequence, beta_D, dphi: Sequence):
    """V(0..kmax) of a deduplicating engine, eq. (B.10): V(0) = tau(1), V(k) = tau(1) + (13).

    rho_bars, B, dD, dphi: [kmax] values of rho_bar_k, B_k, dD_k, dphi_k for k = 1..kmax.
    """
    if not len(rho_bars) == len(B) == len(dD) == len(dphi):
        raise ValueError("rho_bars, B, dD and dphi need one entry per k = 1..kmax")
    tau_1 = check_positive("tau_1", tau_1)
    return [tau_1] + [
        tau_1 + added_time(m=m, W=W, k=k, rho_bar=r, B_k=b, beta_1=beta_1, dD_k=d, beta_D=beta_D, dphi_k=p)
        for k, (r, b, d, p) in enumerate(zip(rho_bars, B, dD, dphi), start=1)
    ]


def _kv_at(kv: Sequence | Callable, k: int):
    value = kv(k) if callable(kv) else kv[k]
    return check_positive(f"kv({k})", value, allow_zero=True)


def byte_step_times(*, m: int, W, D, kv: Sequence | Callable, rho_bars: Sequence) -> list:
    """V_dedup(k) = D + E_dedup(k+1) + kv(k), the one-bandwidth byte cost (App. B.2), k = 0..kmax."""
    D = check_positive("D", D, allow_zero=True)
    E = [_mW(m, W)] + [dedup_bytes(m=m, W=W, k=k, rho_bar=r) for k, r in enumerate(rho_bars, start=1)]
    return [D + e + _kv_at(kv, k) for k, e in enumerate(E)]


def byte_reuse_threshold(a, k: int, *, m: int, W, D, kv: Sequence | Callable):
    """rho*_k(a) = 1 - [(G_a(k) - 1) V_dedup(0) - (kv(k) - kv(0))] / (mW k), eq. (16) = (B.16).

    The one-bandwidth form of (14) (beta_D = B_k = beta(1), t0 = phi = 0), V_dedup(0) = D + mW + kv(0).
    """
    k, mW = _k(k), _mW(m, W)
    V0 = check_positive("D", D, allow_zero=True) + mW + _kv_at(kv, 0)
    return 1 - exact_div((expected_tokens(a, k) - 1) * V0 - (_kv_at(kv, k) - _kv_at(kv, 0)), mW * k)


def one_draft_threshold(a, *, m: int, W, tau_1, B_1, beta_1, dD_1, beta_D, dphi_1):
    """rho*_1(a) = 1 - B_1/(mW) [a tau(1) - dD_1/beta_D - dphi_1] - (B_1/beta(1) - 1), eq. (B.18)."""
    a, mW = check_acceptance(a), _mW(m, W)
    B_1 = check_positive("B_1", B_1)
    bracket = a * check_positive("tau_1", tau_1) - exact_div(_finite("dD_1", dD_1), check_positive("beta_D", beta_D))
    return 1 - exact_div(B_1 * (bracket - _finite("dphi_1", dphi_1)), mW) - (exact_div(B_1, check_positive("beta_1", beta_1)) - 1)


def one_draft_a0(*, m: int, W, rho_bar_1, tau_1, B_1, beta_1, dD_1, beta_D, dphi_1):
    """a0 = [dD_1/beta_D + dphi_1 + mW(2 - rho_bar_1)/B_1 - mW/beta(1)] / tau(1), eq. (B.18)."""
    added = added_time(m=m, W=W, k=1, rho_bar=rho_bar_1, B_k=B_1, beta_1=beta_1, dD_k=dD_1, beta_D=beta_D, dphi_k=dphi_1)
    return exact_div(added, check_positive("tau_1", tau_1))


def byte_one_draft_threshold(a, *, m: int, W, D, kv: Sequence | Callable):
    """rho*_1(a) = 1 - [a V_dedup(0) - (kv(1) - kv(0))] / (mW), eq. (B.22)."""
    a, mW = check_acceptance(a), _mW(m, W)
    V0 = check_positive("D", D, allow_zero=True) + mW + _kv_at(kv, 0)
    return 1 - exact_div(a * V0 - (_kv_at(kv, 1) - _kv_at(kv, 0)), mW)


def byte_one_draft_a0(*, m: int, w: Sequence, rho_2: Sequence, D, kv: Sequence | Callable):
    """a0 = [m sum_l w_l (1 - rho_l(2)) + kv(1) - kv(0)] / V_dedup(0), eq. (B.22).

    w: [L] expert bytes per layer; rho_2: [L] next-token reuse rho_l(2).
    """
    W = sum(check_positive(f"w[{l}]", wl) for l, wl in enumerate(w))
    new = m * sum(wl * (1 - _check_reuse(r)) for wl, r in zip(w, rho_2, strict=True))
    V0 = check_positive("D", D, allow_zero=True) + _mW(m, W) + _kv_at(kv, 0)
    return exact_div(new + _kv_at(kv, 1) - _kv_at(kv, 0), V0)


def threshold_shift_in_a(a, a2, k: int, *, m: int, W, tau_1, B_k):
    """rho*_k(a) - rho*_k(a') = B_k tau(1)/(mW k) (G_a'(k) - G_a(k)), eq. (B.19); > 0 for a < a'."""
    k = _k(k)
    scale = exact_div(check_positive("B_k", B_k) * check_positive("tau_1", tau_1), _mW(m, W) * k)
    return scale * (expected_tokens(a2, k) - expected_tokens(a, k))


def threshold_shift_in_D(a, k: int, D_shift, *, m: int, W, B_k, beta_D):
    """rho*_k(a)|_D - rho*_k(a)|_{D'} = B_k (G_a(k) - 1)/(mW k) (D' - D)/beta_D, eq. (B.19).

    D_shift = D' - D; positive for a > 0 and D' > D (more dense bytes lower the threshold), provided
    the bandwidths and the fixed work do not change with D.
    """
    k = _k(k)
    scale = exact_div(check_positive("B_k", B_k) * (expected_tokens(a, k) - 1), _mW(m, W) * k)
    return scale * exact_div(_finite("D_shift", D_shift), check_positive("beta_D", beta_D))
