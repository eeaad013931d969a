"""The step time (5) as bytes over effective bandwidth plus fixed time, the saving (6) and rule (7).

Cost-model paper, Sec. 3.1. A pass of n tokens with kernel p in {slot, dedup} takes

    tau_p(n) = t0 + D(n)/beta_D + E_p(n)/beta_p(n) + phi_p(n),      D(n) = D + kv(n - 1),     (5)

and a step that drafts k tokens takes V(k) = tau_p(k + 1) + h(k). Scalars may be int, Fraction or
float (exact on int/Fraction); the per-layer helpers take sequences or numpy arrays of shape [L].
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from moespec.costmodel.theory import check_positive, exact_div


def dense_bytes(D, kv: Sequence | Callable, n: int):
    """D(n) = D + kv(n - 1) of (5): bytes read once per pass of n >= 1 tokens.

    kv: key-value cache bytes of a step verifying k + 1 tokens, as a sequence indexed by k or a
    callable k -> bytes.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"pass size n = {n} must be an int >= 1")
    kv_n = kv(int(n) - 1) if callable(kv) else kv[int(n) - 1]
    return check_positive("D", D, allow_zero=True) + check_positive(f"kv({n - 1})", kv_n, allow_zero=True)


def slot_expert_bytes(m: int, n: int, W):
    """E_slot(n) = m n W: one expert read per slot (Sec. 1)."""
    if m < 1 or n < 1:
        raise ValueError(f"m = {m} and n = {n} must be >= 1")
    return m * n * check_positive("W", W)


def dedup_expert_bytes(w, U, f=None):
    """E_dedup(n) with the byte factor of (5): sum_l f_l w_l U_l(n).

    w: [L] bytes of one expert per layer; U: [L] mean distinct experts U_l(n) of the pass;
    f: [L] bytes the deduplicating kernel reads per distinct expert over w_l (f_l >= 1), None for 1.
    """
    w, U = list(w), list(U)
    f = [1] * len(w) if f is None else list(f)
    if not len(w) == len(U) == len(f):
        raise ValueError(f"w, U and f must have one entry per layer; lengths {len(w)}, {len(U)}, {len(f)}")
    for l, fl in enumerate(f):
        if check_positive(f"f[{l}]", fl) < 1:
            raise ValueError(f"byte factor f[{l}] = {fl} must be >= 1")
    return sum(
        fl * check_positive(f"w[{l}]", wl) * check_positive(f"U[{l}]", ul, allow_zero=True)
        for l, (wl, ul, fl) in enumerate(zip(w, U, f))
    )


def verify_time(*, t0, Dn, beta_D, E, beta, phi=0):
    """tau_p(n) = t0 + D(n)/beta_D + E_p(n)/beta_p(n) + phi_p(n), eq. (5).

    t0 >= 0: time outside the memory reads; Dn = D(n) >= 0: bytes read once per pass at the dense
    bandwidth beta_D > 0; E = E_p(n) >= 0: expert bytes the kernel requests at its effective
    bandwidth beta = beta_p(n) > 0; phi = phi_p(n) >= 0: fixed work such as launches.
    """
    t0 = check_positive("t0", t0, allow_zero=True)
    Dn = check_positive("D(n)", Dn, allow_zero=True)
    E = check_positive("E_p(n)", E, allow_zero=True)
    phi = check_positive("phi_p(n)", phi, allow_zero=True)
    return t0 + exact_div(Dn, check_positive("beta_D", beta_D)) + exact_div(E, check_positive("beta_p(n)", beta)) + phi


def memory_time(*, Dn, beta_D, E, beta):
    """M_p(n) = D(n)/beta_D + E_p(n)/beta_p(n), the memory part of tau_p(n) (Sec. 3.5)."""
    return verify_time(t0=0, Dn=Dn, beta_D=beta_D, E=E, beta=beta)


def step_times(tau: Sequence, h: Sequence | None = None) -> list:
    """V(k) = tau_p(k + 1) + h(k) for k = 0..kmax (Sec. 3.1).

    tau: [kmax+1] verify times, tau[k] = tau_p(k + 1); h: [kmax+1] draft-and-host time per step
    (>= 0), None for h = 0.
    """
    tau = list(tau)
    h = [0] * len(tau) if h is None else list(h)
    if len(h) != len(tau):
        raise ValueError(f"tau and h need one entry per draft length; lengths {len(tau)} and {len(h)}")
    return [
        check_positive(f"tau[{k}]", t) + check_positive(f"h[{k}]", hk, allow_zero=True)
        for k, (t, hk) in enumerate(zip(tau, h))
    ]


def byte_share(E_dedup, E_slot):
    """u_bar(n) = E_dedup(n) / E_slot(n), the share of per-slot bytes that deduplication requests."""
    return exact_div(check_positive("E_dedup(n)", E_dedup), check_positive("E_slot(n)", E_slot))


def bandwidth_ratio(beta_dedup, beta_slot):
    """r(n) = beta_dedup(n) / beta_slot(n)."""
    return exact_div(check_positive("beta_dedup(n)", beta_dedup), check_positive("beta_slot(n)", beta_slot))



def saving(*, E_slot, beta_slot, u_bar, r, phi_slot=0, phi_dedup=0):
    """S(n) = tau_slot(n) - tau_dedup(n) = E_slot/beta_slot (1 - u_bar/r) - (phi_dedup - phi_slot), eq. (6).

    Holds with f_l = 1 (the byte factor sits in u_bar otherwise); t0 and the dense reads cancel.
    Positive: the deduplicating kernel is faster.
    """
    E_slot = check_positive("E_slot(n)", E_slot, allow_zero=True)
    expert_time = exact_div(E_slot, check_positive("beta_slot(n)", beta_slot))
    u_bar = check_positive("u_bar(n)", u_bar, allow_zero=True)
    r = check_positive("r(n)", r)
    phi_slot = check_positive("phi_slot(n)", phi_slot, allow_zero=True)
    phi_dedup = check_positive("phi_dedup(n)", phi_dedup, allow_zero=True)
    return expert_time * (1 - exact_div(u_bar, r)) - (phi_dedup - phi_slot)


def dedup_faster(u_bar, r) -> bool | np.ndarray:
    """Rule (7): with f_l = 1 and equal fixed work, deduplication is faster exactly when u_bar(n) < r(n)."""
    return check_positive("u_bar(n)", u_bar, allow_zero=True) < check_positive("r(n)", r)
