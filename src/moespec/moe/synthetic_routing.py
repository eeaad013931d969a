"""Synthetic routing processes with known reuse, for tests and benchmarks.

Each process draws expert sets S_{l,t} (m distinct experts of N per token and layer) and comes with
its exact reuse rho(n) of eq. (1), so the estimators of `moespec.moe.reuse` can be checked against
the truth:

- `uniform`: every set independent and uniform; rho(n) = 1 - q^(n-1), q = 1 - m/N.
- `periodic`: one pattern of sets repeated from a uniformly random phase, as in the examples of
  App. B.2 (patterns 01, 00012, 00102 with N = 3, m = 1); stationary, rho(n) by enumeration.
- `sticky`: a Markov router — with probability p a token repeats the previous token's set, else it
  draws a fresh uniform set; p is set from the wanted next-token reuse rho(2) = p + (1-p) m/N.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Sequence

import numpy as np

_CHUNK = 65536  # tokens drawn at once, to bound the temporaries


def uniform(T: int, L: int, m: int, N: int, rng: np.random.Generator) -> np.ndarray:
    """Independent uniform m-subsets of N experts per token and layer, [T, L, m] int16."""
    if not 1 <= m < N < 2**15:
        raise ValueError(f"need 1 <= m < N < 32768; got m={m}, N={N}")
    out = np.empty((T, L, m), dtype=np.int16)
    for a in range(0, T, _CHUNK):
        block = out[a : a + _CHUNK]
        # Floyd's sampling: slot i takes r ~ U{0..j}, or j itself when r is already taken
        for i, j in enumerate(range(N - m, N)):
            r = rng.integers(0, j + 1, size=block.shape[:2], dtype=np.int16)
            taken = (block[..., :i] == r[..., None]).any(axis=-1)
            block[..., i] = np.where(taken, j, r)
    return out


def _pattern_array(pattern: str | Sequence[Sequence[int]]) -> np.ndarray:
    """A pattern as [P, m] ids: a string of digits is m = 1 ("00012"), else a list of sets."""
    if isinstance(pattern, str):
        if not pattern.isdigit():
            raise ValueError(f"a string pattern is one digit per token, like '00012'; got {pattern!r}")
        return np.array([[int(c)] for c in pattern], dtype=np.int16)
    arr = np.asarray(pattern, dtype=np.int16)
    if arr.ndim != 2 or any(len(set(row)) != arr.shape[1] for row in arr.tolist()):
        raise ValueError(f"a pattern is [P, m] with m distinct experts per token; got {pattern!r}")
    return arr


def periodic(pattern: str | Sequence[Sequence[int]], T: int, L: int, rng: np.random.Generator) -> np.ndarray:
    """The pattern repeated over T tokens from a random phase, independently per layer, [T, L, m]."""
    p = _pattern_array(pattern)
    P = p.shape[0]
    phase = rng.integers(0, P, size=L)
    t = (np.arange(T)[:, None] + phase[None, :]) % P  # [T, L]
    return p[t]


def periodic_reuse(pattern: str | Sequence[Sequence[int]], n: int) -> Fraction:
    """Exact rho(n) of the periodic process: the mean over the P phases of eq. (1)'s share."""
    p = [set(row) for row in _pattern_array(pattern).tolist()]
    P, m = len(p), len(p[0])
    total = Fraction(0)
    for t in range(P):
        earlier = set().union(*(p[(t + i) % P] for i in range(n - 1)))
        total += len(p[(t + n - 1) % P] & earlier)
    return total / (m * P)


def periodic_rho_bar(pattern: str | Sequence[Sequence[int]], k: int) -> Fraction:
    """rho_bar_k of eq. (11) for one layer: the mean of rho(2..k+1) (App. B.2's table)."""
    return sum((periodic_reuse(pattern, j) for j in range(2, k + 2)), Fraction(0)) / k


def sticky_p(rho2: float, m: int, N: int) -> float:
    """The repeat probability p that gives next-token reuse rho(2) = p + (1 - p) m/N."""
    base = m / N
    if not base <= rho2 <= 1:
        raise ValueError(f"a sticky router reaches rho(2) in [m/N, 1] = [{base:.4g}, 1]; got {rho2}")
    return (rho2 - base) / (1 - base)


def sticky(T: int, L: int, m: int, N: int, rho2: float, rng: np.random.Generator) -> np.ndarray:
    """Sticky Markov routing with next-token reuse rho2, from a uniform first set, [T, L, m] int16."""
    p = sticky_p(rho2, m, N)
    out = uniform(T, L, m, N, rng)
    repeat = rng.random((T, L)) < p
    repeat[0] = False
    # the set in force at t is the fresh set drawn at the latest t' <= t that did not repeat
    src = np.where(repeat, 0, np.arange(T)[:, None])
    np.maximum.accumulate(src, axis=0, out=src)
    return np.take_along_axis(out, src[:, :, None], axis=0)


def sticky_reuse(n_max: int, m: int, N: int, rho2: float) -> np.ndarray:
    """Exact rho(n), n = 1..n_max, of `sticky`: [n_max].

    The last token of a window repeats its predecessor's set (probability p: all m reused) or draws
    a fresh set independent of the window, which meets the earlier tokens' union in m U(n-1)/N
    experts on average; so rho(n) = p + (1-p) U(n-1)/N with U from eq. (2).
    """
    p = sticky_p(rho2, m, N)
    rho = np.zeros(n_max)
    U = float(m)
    for n in range(2, n_max + 1):
        rho[n - 1] = p + (1 - p) * U / N
        U += m * (1 - rho[n - 1])
    return rho
