"""Effective bandwidths of the two kernels, r(n), u_bar(n), and the verdict of (7) with margin (19).

Section 2 of the cost-model paper: the effective bandwidth beta_p(n) of kernel p on a pass of n
tokens is its requested expert bytes over its time, *including* the fixed work of the operation
(Table 1). The per-slot kernel requests nmb, the deduplicating kernel f_l U b, with f_l the byte
factor (bytes it reads per distinct expert over w_l, 1 for a kernel that reads the union exactly).

    r(n)     = beta_dedup(n) / beta_slot(n)
    u_bar(n) = E_dedup(n) / E_slot(n) = sum_l f_l w_l U_l(n) / (m n W)
    (7)      deduplication is faster exactly where u_bar(n) < r(n)
    (19)     the sign of (7) survives a bandwidth error eps if |ln r - ln u_bar| > ln((1+eps)/(1-eps))

Table 1 aggregates bytes and times over layers and windows before dividing; Figure 2 shows the
median and interquartile range of the per-window bandwidths. Scalars may be int, Fraction or float.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from moespec.costmodel.bounds import faster_kernel_certain, faster_kernel_margin
from moespec.costmodel.steptime import byte_share, dedup_expert_bytes, dedup_faster, slot_expert_bytes
from moespec.costmodel.theory import check_positive, exact_div


def beta_slot(n, m: int, b, t):
    """beta_slot on one pass: n m b / t, the per-slot kernel's requested bytes over its time (Sec. 2).

    n: tokens; m: slots per token; b: bytes of one expert; t: seconds (scalars or arrays [W]).
    """
    return np.asarray(n) * m * b / np.asarray(t, dtype=float)


def beta_dedup(U, b, t, f=1):
    """beta_dedup on one pass: f U b / t, the deduplicating kernel's union bytes over its time (Sec. 2).

    U: distinct experts of the pass; b: bytes of one expert; t: seconds; f: byte factor f_l >= 1.
    """
    return f * np.asarray(U) * b / np.asarray(t, dtype=float)


def effective_bandwidth(nbytes: Sequence, seconds: Sequence):
    """Bytes and times summed over layers and windows, then divided (Table 1): sum(bytes) / sum(t)."""
    total_bytes = sum(check_positive("bytes", x, allow_zero=True) for x in nbytes)
    total_time = sum(check_positive("seconds", x) for x in seconds)
    return exact_div(total_bytes, check_positive("total time", total_time))


def bandwidth_ratio(beta_dedup_n, beta_slot_n):
    """r(n) = beta_dedup(n) / beta_slot(n) (Sec. 2)."""
    return exact_div(check_positive("beta_dedup(n)", beta_dedup_n), check_positive("beta_slot(n)", beta_slot_n))


def u_bar(U: Sequence, n: int, m: int, w: Sequence, f: Sequence | None = None):
    """u_bar(n) = sum_l f_l w_l U_l(n) / (m n W), the share of per-slot bytes deduplication requests.

    U: [L] mean distinct experts U_l(n) of a pass of n tokens; w: [L] bytes of one expert per layer;
    f: [L] byte factors (None for 1).
    """
    return byte_share(dedup_expert_bytes(w, U, f), slot_expert_bytes(m, n, sum(w)))


def byte_factor(bytes_per_distinct_expert, w):
    """f_l: the bytes a deduplicating kernel reads per distinct expert of layer l, over w_l (>= 1)."""
    f = exact_div(check_positive("bytes per distinct expert", bytes_per_distinct_expert), check_positive("w_l", w))
    if f < 1:
        raise ValueError(
            f"byte factor {f!r} < 1: a kernel reads at least each distinct expert's w_l = {w!r} bytes; "
            "check the bytes per distinct expert"
        )
    return f


def sign_margin(u_bar_n, r_n, eps) -> float:
    """Margin of (19): |ln r - ln u_bar| - ln((1+eps)/(1-eps)); positive when the verdict of (7) is certain."""
    gap = abs(math.log(check_positive("r(n)", r_n)) - math.log(check_positive("u_bar(n)", u_bar_n)))
    return gap - faster_kernel_margin(eps)


def verdict(u_bar_n, r_n, eps) -> dict:
    """The verdict of (7) at one pass size, with the margin (19) for the engine's bandwidth error eps.

    Returns {"u_bar", "r", "dedup_faster": u_bar < r, "margin": (19) margin, "certain": (19) holds};
    an eps >= 1 (a fit worse than 100%) gives margin -inf and no certain verdict.
    """
    if eps >= 1:  # no bound: a bandwidth error of 100% or more can flip any verdict
        margin, certain = float("-inf"), False
    else:
        margin, certain = sign_margin(u_bar_n, r_n, eps), faster_kernel_certain(u_bar_n, r_n, eps)
    return {
        "u_bar": float(u_bar_n),
        "r": float(r_n),
        "dedup_faster": bool(dedup_faster(u_bar_n, r_n)),
        "margin": margin,
        "certain": certain,
    }


def quartiles(values: Sequence[float]) -> dict:
    """Median and interquartile range of per-window bandwidths (Figure 2): {"median", "q1", "q3"}."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        raise ValueError("quartiles of no values; give at least one window")
    q1, med, q3 = np.percentile(arr, [25, 50, 75])
    return {"median": float(med), "q1": float(q1), "q3": float(q3)}
