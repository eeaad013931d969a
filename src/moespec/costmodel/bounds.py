"""Error bounds of Table 2 (cost-model paper, Sec. 3.5, App. C): how a bandwidth error moves each prediction.

Each bandwidth of (5) is estimated as beta_hat = beta (1 + e) with |e| <= eps < 1 (rows (17)-(19)),
or the whole predicted step time satisfies (1 - delta) V(k) <= V_hat(k) <= (1 + delta) V(k) with
0 <= delta < 1 (rows (20)-(21)). Exact on int/Fraction inputs: no logarithm is taken in a decision,
(19) is tested in the equivalent product form.
"""

from __future__ import annotations

import math
from typing import Sequence

from moespec.costmodel.theory import (
    best_draft_length,
    check_acceptance,
    check_positive,
    check_step_times,
    exact_div,
    throughput,
)


def check_eps(eps):
    """eps, the bound on the relative bandwidth error, checked to lie in [0, 1)."""
    eps = check_positive("eps", eps, allow_zero=True)
    if eps >= 1:
        raise ValueError(f"bandwidth error eps = {eps} must lie in [0, 1)")
    return eps


def check_delta(delta):
    """delta, the bound on the relative step-time error, checked to lie in [0, 1)."""
    delta = check_positive("delta", delta, allow_zero=True)
    if delta >= 1:
        raise ValueError(
            f"step-time error delta = {delta} must lie in [0, 1) (from bandwidths alone: eps < 1/2)"
        )
    return delta


def relative_error_factor(eps):
    """eps/(1 - eps): the largest relative move of one memory term M/beta under |e| <= eps, (C.1)."""
    eps = check_eps(eps)
    return exact_div(eps, 1 - eps)


def verify_time_bound(eps, M):
    """|tau_hat_p(n) - tau_p(n)| <= eps/(1 - eps) M_p(n) <= eps/(1 - eps) tau_p(n), eq. (17).

    M: the memory part M_p(n) = D(n)/beta_D + E_p(n)/beta_p(n) (or tau_p(n) for the looser form).
    Attained when every bandwidth is underestimated by the full eps (e = -eps).
    """
    return relative_error_factor(eps) * check_positive("M_p(n)", M, allow_zero=True)


def saving_bound(eps, Me_slot, Me_dedup):
    """|S_hat(n) - S(n)| <= eps/(1 - eps) (M^e_slot(n) + M^e_dedup(n)), eq. (18).

    Me_slot, Me_dedup: the expert times E_p(n)/beta_p(n) of the two kernels (same dense reads).
    """
    return relative_error_factor(eps) * (
        check_positive("M^e_slot(n)", Me_slot, allow_zero=True)
        + check_positive("M^e_dedup(n)", Me_dedup, allow_zero=True)
    )


def faster_kernel_margin(eps) -> float:
    """ln((1 + eps)/(1 - eps)), the margin of (19), as a float for display."""
    eps = check_eps(eps)
    return math.log1p(float(eps)) - math.log1p(-float(eps))


def faster_kernel_certain(u_bar, r, eps) -> bool:
    """Eq. (19): |ln r(n) - ln u_bar(n)| > ln((1 + eps)/(1 - eps)), so the predicted and true sides of (7) agree.

    Tested as r (1 - eps) > u_bar (1 + eps) or u_bar (1 - eps) > r (1 + eps): exact, no logarithm.
    Assumes f_l = 1 and equal fixed work (App. C).
    """
    eps = check_eps(eps)
    u_bar = check_positive("u_bar(n)", u_bar)
    r = check_positive("r(n)", r)
    return r * (1 - eps) > u_bar * (1 + eps) or u_bar * (1 - eps) > r * (1 + eps)


def throughput_loss_bound(delta):
    """2 delta/(1 + delta): the largest share of T_a(k*) lost by drafting k_hat*, eq. (20) = (C.5)."""
    delta = check_delta(delta)
    return exact_div(2 * delta, 1 + delta)


def best_draft_length_separated(V: Sequence, a, delta) -> bool:
    """Separation condition of (20): (1 + delta)/(1 - delta) T_a(i) < T_a(k*) for every i != k*.

    When it holds, every V_hat within delta of V has k_hat* = k*.
    """
    V = check_step_times(V)
    a = check_acceptance(a)
    factor = speedup_bounds(delta)[1]
    k_star = best_draft_length(V, a)
    T_star = throughput(V, a, k_star)
    return all(factor * throughput(V, a, i) < T_star for i in range(len(V)) if i != k_star)


def speedup_bounds(delta) -> tuple:
    """((1 - delta)/(1 + delta), (1 + delta)/(1 - delta)): the range of the predicted over the true best speedup, (21)."""
    delta = check_delta(delta)
    return exact_div(1 - delta, 1 + delta), exact_div(1 + delta, 1 - delta)


def speedup_interval(predicted_speedup, delta) -> tuple:
    """The interval (21) puts the true best speedup T_a(k*)/T_a(0) in, given the predicted one."""
    lo, hi = speedup_bounds(delta)
    s = check_positive("predicted speedup", predicted_speedup)
    return exact_div(s, hi), exact_div(s, lo)


def delta_from_eps(eps):
    """delta = eps/(1 - eps), eq. (C.7): a bandwidth error eps bounds the step-time error by delta.

    The bounds (20)-(21) need delta < 1, i.e. eps < 1/2; delta_from_eps itself accepts eps in [0, 1).
    """
    return relative_error_factor(eps)


def speedup_factor_from_eps(eps):
    """(1 + delta)/(1 - delta) = 1/(1 - 2 eps) with delta = eps/(1 - eps), eq. (C.7); eps = 0.1 gives 1.25."""
    eps = check_eps(eps)
    if 2 * eps >= 1:
        raise ValueError(f"eps = {eps} gives delta >= 1; (C.7) needs eps < 1/2")
    return exact_div(1, 1 - 2 * eps)


def step_time_delta(V: Sequence, V_hat: Sequence):
    """The least delta with (1 - delta) V(k) <= V_hat(k) <= (1 + delta) V(k) for all k: max_k |V_hat(k)/V(k) - 1|."""
    V, V_hat = check_step_times(V), check_step_times(V_hat)
    if len(V) != len(V_hat):
        raise ValueError(f"V and V_hat have different lengths {len(V)} and {len(V_hat)}")
    return max(abs(exact_div(vh, v) - 1) for v, vh in zip(V, V_hat))
