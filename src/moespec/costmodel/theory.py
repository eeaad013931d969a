"""Geometric acceptance, the speedup condition and the staircase (cost-model paper, Sec. 1, 3.2–3.3, App. B.1, B.3).

Symbols: V = (V(0), ..., V(kmax)) is the step time of a step that drafts k tokens (any positive
numbers), a in [0, 1) the acceptance rate, G_a(k) = 1 + a + ... + a^k, T_a(k) = G_a(k)/V(k),
c_i = V(i) - V(i-1). Every function is exact when its inputs are int or fractions.Fraction (no
float or log is taken on them) and works on floats; `expected_tokens`, `throughput` and `speedup`
also take a numpy array of acceptances.

alpha(V, k, i) is the least acceptance above which k beats i, the root of the polynomial
V(i) P_k(a) - V(k) P_i(a) in [0, 1). On exact inputs it is returned exactly when it is rational
(always found: the rational-root bound fixes how far to bisect) and otherwise as the upper end of an
isolating interval of width 2**-ALPHA_BITS, every sign decided in integer arithmetic. On floats it is
bisected to ALPHA_TOL. Either way the returned value is >= alpha, within the stated precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from fractions import Fraction
from numbers import Integral, Real
from typing import Sequence

import numpy as np

ALPHA_BITS = 64  # exact path: width of the isolating interval of an irrational alpha, 2**-64
ALPHA_TOL = 1e-12  # float path: bisection tolerance of alpha


def _number(name: str, x):
    """A Python int, Fraction or float from `x` (numpy scalars converted); TypeError otherwise."""
    if isinstance(x, bool) or not isinstance(x, (Real, np.number)):
        raise TypeError(f"{name} = {x!r} is not a real number; give an int, float or Fraction")
    if isinstance(x, (int, Fraction)):
        return x
    if isinstance(x, (Integral, np.integer)):
        return int(x)
    return float(x)


def is_exact(x) -> bool:
    """True for int and Fraction, the inputs on which this package computes exactly."""
    return isinstance(x, (int, Fraction)) and not isinstance(x, bool)


def exact_div(x, y):
    """x / y, kept exact (a Fraction) when both are int or Fraction; ordinary division otherwise."""
    if is_exact(x) and is_exact(y):
        return Fraction(x) / Fraction(y)
    return x / y


def check_positive(name: str, x, *, allow_zero: bool = False):
    """`x` as a number (or float array), checked finite and > 0 (>= 0 with allow_zero)."""
    bound = ">= 0" if allow_zero else "> 0"
    if isinstance(x, np.ndarray):
        arr = np.asarray(x, dtype=float)
        bad = ~np.isfinite(arr) | ((arr < 0) if allow_zero else (arr <= 0))
        if bad.any():
            raise ValueError(f"{name} = {arr[bad][0]} must be finite and {bound}")
        return arr
    x = _number(name, x)
    if (isinstance(x, float) and not math.isfinite(x)) or x < 0 or (x == 0 and not allow_zero):
        raise ValueError(f"{name} = {x} must be finite and {bound}")
    return x


def check_step_times(V: Sequence) -> list:
    """V(0..kmax) as a list: exact if every entry is int/Fraction, else all floats.

    Raises ValueError for an empty V or an entry that is not finite and positive.
    """
    if isinstance(V, np.ndarray):
        V = V.tolist()
    V = list(V)
    if not V:
        raise ValueError("V is empty; give the step times V(0), ..., V(kmax), each finite and > 0")
    V = [check_positive(f"V[{k}]", v) for k, v in enumerate(V)]
    return V if all(is_exact(v) for v in V) else [float(v) for v in V]


def check_acceptance(a):
    """`a` checked to lie in [0, 1) (scalar, or array of acceptances)."""
    if isinstance(a, (np.ndarray, list, tuple)):
        arr = np.asarray(a, dtype=float)
        bad = ~np.isfinite(arr) | (arr < 0) | (arr >= 1)
        if bad.any():
            raise ValueError(f"acceptance a = {arr[bad][0]} is outside [0, 1)")
        return arr
    a = _number("a", a)
    if (isinstance(a, float) and not math.isfinite(a)) or not 0 <= a < 1:
        raise ValueError(f"acceptance a = {a} is outside [0, 1)")
    return a


def _check_k(name: str, k, kmax: int, low: int = 0) -> int:
    if isinstance(k, bool) or not isinstance(k, (Integral, np.integer)):
        raise TypeError(f"{name} = {k!r} must be an int draft length")
    if not low <= k <= kmax:
        raise ValueError(f"{name} = {k} is outside {low}..{kmax} (kmax = len(V) - 1)")
    return int(k)


def expected_tokens(a, k: int):
    """G_a(k) = 1 + a + ... + a^k, tokens emitted per step under geometric acceptance (Sec. 1)."""
    a = check_acceptance(a)
    if isinstance(k, bool) or not isinstance(k, (Integral, np.integer)) or k < 0:
        raise ValueError(f"draft length k = {k} must be an int >= 0")
    g = 1 if is_exact(a) else np.ones_like(a) if isinstance(a, np.ndarray) else 1.0
    for _ in range(int(k)):
        g = 1 + a * g
    return g


def throughput(V: Sequence, a, k: int):
    """T_a(k) = G_a(k) / V(k), tokens per unit time (Sec. 1)."""
    V = check_step_times(V)
    k = _check_k("k", k, len(V) - 1)
    return exact_div(expected_tokens(a, k), V[k])


def speedup(V: Sequence, a, k: int):
    """T_a(k) / T_a(0) = G_a(k) V(0) / V(k), eq. (9) = (B.17)."""
    V = check_step_times(V)
    k = _check_k("k", k, len(V) - 1)
    return exact_div(expected_tokens(a, k) * V[0], V[k])


def best_draft_length(V: Sequence, a) -> int:
    """k*(a): the smallest maximizer of T_a(k) over k = 0..kmax (Sec. 1)."""
    V = check_step_times(V)
    a = check_acceptance(a)
    if isinstance(a, np.ndarray):
        raise TypeError("best_draft_length takes one acceptance; use staircase(V, grid) for many")
    best, g, g_best = 0, 1, 1
    for k in range(1, len(V)):
        g = 1 + a * g
        if g * V[best] > g_best * V[k]:  # T_a(k) > T_a(best), cross-multiplied
            best, g_best = k, g
    return best


def staircase(V: Sequence, grid) -> list[int]:
    """k*(a) at every acceptance of `grid`, the staircase a -> k*(a) of Sec. 3.3 (non-decreasing, (B.28))."""
    V = check_step_times(V)
    values = [check_acceptance(a) for a in (grid.tolist() if isinstance(grid, np.ndarray) else grid)]
    if all(is_exact(v) for v in V) or any(is_exact(a) for a in values):
        return [best_draft_length(V, a) for a in values]
    a = np.asarray(values, dtype=float)[:, None]  # [A, 1]
    G = np.cumsum(a ** np.arange(len(V))[None, :], axis=1)  # [A, kmax+1]
    return np.argmax(G / np.asarray(V)[None, :], axis=1).tolist()  # argmax: first = smallest maximizer


def speedup_condition(V: Sequence, a, k: int) -> bool:
    """Eq. (8) = (B.2): T_a(k) > T_a(0)  <=>  V(k) - V(0) < (a + ... + a^k) V(0)."""
    V = check_step_times(V)
    k = _check_k("k", k, len(V) - 1)
    return V[k] - V[0] < (expected_tokens(a, k) - 1) * V[0]


def speculation_pays(V: Sequence, a) -> bool:
    """Eq. (B.3): k*(a) >= 1  <=>  some k in 1..kmax satisfies the speedup condition (8)."""
    V = check_step_times(V)
    return any(speedup_condition(V, a, k) for k in range(1, len(V)))


def first_draft_threshold(V: Sequence):
    """a0 = V(1)/V(0) - 1 (B.4): T_a(1) > T_a(0) exactly when a > a0. Needs kmax >= 1.

    a0 may lie outside [0, 1): below 0 one draft always pays, at or above 1 it never does.
    """
    V = check_step_times(V)
    if len(V) < 2:
        raise ValueError(f"first_draft_threshold needs V(0) and V(1); got {len(V)} step time(s)")
    return exact_div(V[1], V[0]) - 1


def _sign_at_dyadic(coeffs: list[int], m: int, b: int) -> int:
    """Sign of sum_t coeffs[t] x^t at x = m / 2^b, in integer arithmetic (Horner scaled by 2^(b d))."""
    d = len(coeffs) - 1
    acc = coeffs[d]
    for t in range(d - 1, -1, -1):
        acc = acc * m + coeffs[t] * (1 << (b * (d - t)))
    return (acc > 0) - (acc < 0)


def _poly_at(coeffs, x):
    acc = coeffs[-1]
    for c in reversed(coeffs[:-1]):
        acc = acc * x + c
    return acc


def _least_positive_point(coeffs: list) -> Fraction | float | int:
    """inf{x in [0, 1): f(x) > 0} for f = sum coeffs[t] x^t with f(0) <= 0 < f(1) and one sign change.

    Exact coefficients: integer bisection (see the module docstring); float ones: bisection to ALPHA_TOL.
    """
    if not all(is_exact(c) for c in coeffs):
        lo, hi = 0.0, 1.0
        while hi - lo > ALPHA_TOL:
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if _poly_at(coeffs, mid) > 0 else (mid, hi)
        return hi
    den = math.lcm(*(Fraction(c).denominator for c in coeffs))
    ints = [int(Fraction(c) * den) for c in coeffs]
    g = math.gcd(*ints)
    ints = [c // g for c in ints]
    lead = abs(ints[-1])
    bits = max(ALPHA_BITS, 2 * lead.bit_length() + 1)  # width < 1/(2 lead^2) isolates a rational root
    lo, hi = 0, 1  # numerators over 2^b
    for b in range(1, bits + 1):
        lo, hi, mid = 2 * lo, 2 * hi, lo + hi
        s = _sign_at_dyadic(ints, mid, b)
        if s == 0:
            return Fraction(mid, 1 << b)
        lo, hi = (lo, mid) if s > 0 else (mid, hi)
    candidate = Fraction(lo + hi, 1 << (bits + 1)).limit_denominator(lead)
    if _poly_at(ints, candidate) == 0:
        return candidate
    return Fraction(hi, 1 << bits)


def alpha(V: Sequence, k: int, i: int):
    """alpha_{k,i} (App. B.3): inf{a in [0, 1) : T_a(k) > T_a(i)} for i < k, 1 when the set is empty.

    The set is upward closed (B.26)-(B.27), so k beats i on (alpha, 1) and not on [0, alpha).
    alpha = 0 when V(k) <= V(i); alpha = 1 when V(k)/V(i) >= (k+1)/(i+1), the limit of G_a(k)/G_a(i)
    as a -> 1; otherwise the unique root of V(i) P_k(a) - V(k) P_i(a) in (0, 1), computed as the
    module docstring states.
    """
    V = check_step_times(V)
    k = _check_k("k", k, len(V) - 1, low=1)
    i = _check_k("i", i, k - 1)
    if V[k] <= V[i]:
        return 0 if is_exact(V[k]) else 0.0
    if V[k] * (i + 1) >= V[i] * (k + 1):
        return 1 if is_exact(V[k]) else 1.0
    coeffs = [V[i] - V[k] if t <= i else V[i] for t in range(k + 1)]
    return _least_positive_point(coeffs)


def step_points(V: Sequence) -> list:
    """[a_1, ..., a_kmax] with a_j = max_{i<j} min_{j<=k<=kmax} alpha_{k,i}, eq. (B.31).

    k*(a) >= j for every a in (a_j, 1) and k*(a) < j for every a in [0, a_j); a_j = 1 where the
    staircase never reaches j. Non-decreasing in j.
    """
    V = check_step_times(V)
    kmax = len(V) - 1
    al = {(k, i): alpha(V, k, i) for k in range(1, kmax + 1) for i in range(k)}
    return [max(min(al[k, i] for k in range(j, kmax + 1)) for i in range(j)) for j in range(1, kmax + 1)]


def increments(V: Sequence) -> list:
    """c_i = V(i) - V(i-1) for i = 1..kmax, the time the i-th draft adds (Sec. 1)."""
    V = check_step_times(V)
    return [V[i] - V[i - 1] for i in range(1, len(V))]


def increment_condition(V: Sequence, a) -> bool:
    """Hypothesis of (B.35): c_{i+1} >= a c_i for every i in 1..kmax-1."""
    c = increments(V)
    a = check_acceptance(a)
    return all(c[i] >= a * c[i - 1] for i in range(1, len(c)))


def is_convex_nondecreasing(V: Sequence) -> bool:
    """Hypothesis of (10)/(B.36): 0 <= c_1 <= c_2 <= ... <= c_kmax."""
    c = increments(V)
    return all(x >= 0 for x in c[:1]) and all(c[i - 1] <= c[i] for i in range(1, len(c)))


def h_j(a, j: int):
    """h_j(a) = a^j / G_a(j-1), eq. (B.32); strictly increasing on [0, 1) for j >= 1."""
    a = check_acceptance(a)
    if isinstance(j, bool) or not isinstance(j, (Integral, np.integer)) or j < 1:
        raise ValueError(f"j = {j} must be an int >= 1")
    return exact_div(a**j, expected_tokens(a, int(j) - 1))


def two_neighbour_test(V: Sequence, a, j: int) -> bool:
    """Eq. (10) = (B.35): a^j V(j-1) > G_a(j-1) c_j, i.e. T_a(j) > T_a(j-1).

    Under the increment condition (B.35) (in particular when V is convex and non-decreasing) this
    decides k*(a) >= j from j and j-1 alone.
    """
    V = check_step_times(V)
    j = _check_k("j", j, len(V) - 1, low=1)
    a = check_acceptance(a)
    return a**j * V[j - 1] > expected_tokens(a, j - 1) * (V[j] - V[j - 1])


def convex_step_points(V: Sequence) -> list:
    """[a_1, ..., a_kmax] for convex non-decreasing V, eq. (B.36): a_j = inf{a : h_j(a) > c_j/V(j-1)}.

    a_1 = min(c_1/V(0), 1) (so a_1 = a0 when a0 < 1), and a_j = alpha_{j,j-1}. Equal to step_points(V)
    under this hypothesis; raises ValueError when V is not convex and non-decreasing.
    """
    V = check_step_times(V)
    if not is_convex_nondecreasing(V):
        raise ValueError(f"convex_step_points needs 0 <= c_1 <= ... <= c_kmax; increments are {increments(V)}")
    if len(V) < 2:
        return []
    c1 = exact_div(V[1] - V[0], V[0])
    return [min(c1, 1 if is_exact(c1) else 1.0)] + [alpha(V, j, j - 1) for j in range(2, len(V))]


def json_number(x):
    """JSON-ready number: Fractions become floats (display only; the computation stayed exact)."""
    return float(x) if isinstance(x, Fraction) else x


@dataclass(frozen=True)
class TheorySummary:
    """What `summarize` derives from one step-time sequence: the inputs of the `moespec theory` table."""

    step_times: tuple  # V(0..kmax)
    increments: tuple  # c_1..c_kmax
    first_draft_threshold: object  # a0 (B.4), None when kmax = 0
    step_points: tuple  # a_1..a_kmax (B.31)
    convex: bool  # 0 <= c_1 <= ... <= c_kmax, so (10) applies
    stairs: tuple  # ((lo, hi, k), ...): k*(a) = k on the open interval (lo, hi)
    at: tuple  # ((a, k*(a), speedup at k*(a)), ...) at the requested acceptances

    def to_dict(self) -> dict:
        return {
            "step_times": [json_number(v) for v in self.step_times],
            "increments": [json_number(c) for c in self.increments],
            "first_draft_threshold": json_number(self.first_draft_threshold),
            "step_points": [json_number(x) for x in self.step_points],
            "convex": self.convex,
            "stairs": [{"lo": json_number(lo), "hi": json_number(hi), "k": k} for lo, hi, k in self.stairs],
            "at": [{"a": json_number(a), "k_star": k, "speedup": json_number(s)} for a, k, s in self.at],
        }

    @classmethod
    def from_dict(cls, d: dict) -> "TheorySummary":
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown TheorySummary keys {sorted(unknown)}")
        return cls(
            step_times=tuple(d["step_times"]),
            increments=tuple(d["increments"]),
            first_draft_threshold=d["first_draft_threshold"],
            step_points=tuple(d["step_points"]),
            convex=bool(d["convex"]),
            stairs=tuple((s["lo"], s["hi"], s["k"]) for s in d["stairs"]),
            at=tuple((p["a"], p["k_star"], p["speedup"]) for p in d["at"]),
        )


def summarize(V: Sequence, acceptances: Sequence = ()) -> TheorySummary:
    """Staircase, step points, a0 and k*(a) with its speedup (9) at each acceptance, for one V."""
    V = check_step_times(V)
    points = step_points(V)
    edges = [0, *points, 1]
    stairs = tuple(
        (edges[k], edges[k + 1], k) for k in range(len(V)) if edges[k] < edges[k + 1]
    )  # k*(a) = #{j : a > a_j} between step points (B.31)
    at = []
    for a in acceptances:
        k = best_draft_length(V, a)
        at.append((a, k, speedup(V, a, k)))
    return TheorySummary(
        step_times=tuple(V),
        increments=tuple(increments(V)),
        first_draft_threshold=first_draft_threshold(V) if len(V) > 1 else None,
        step_points=tuple(points),
        convex=is_convex_nondecreasing(V),
        stairs=stairs,
        at=tuple(at),
    )
