"""The gate's two-sample test with generations as the unit (levels 2 and 3 of `checks.gate`).

The engine paper pools every sampled token of every generation into one count vector per method and
reads the χ² statistic's p-value off the χ² law (Sec. 6.1). That law assumes independent tokens, and
the tokens of one generation are not (each conditions the next): the pooled counts spread more than
the law allows, so a correct engine fails the gate more often than α (SmolLM2 with its distilled
draft, 20 runs of 60 tokens: p = 0.004 at one seed). Here the same statistic's law under the null is
read by permuting which method each run came from: runs are independent, and where both methods
sample one law they are exchangeable, so the permutation p-value holds α whatever the dependence
inside a run. The χ² law's p-value, the paper's, is kept beside it (`ChiSquare.pvalue_independent`).
"""

from __future__ import annotations

import numpy as np
from scipy import stats as sps

MIN_EXPECTED = 5.0  # bins are pooled until every expected count reaches this (the gate's rule)
PERMUTATIONS = 2000  # the smallest p-value is 1/2001, under the gate's alpha of 0.01


def binned(rows: np.ndarray, scale: float) -> np.ndarray:
    """rows [R, B] of counts over the same bins, their bins pooled [R, bins]: a bin whose expected count
    (its column total × `scale`) is below MIN_EXPECTED goes into one "other" bin, last, which is topped
    up from the rarest kept bins until it reaches MIN_EXPECTED too (left out when it holds nothing)."""
    col = rows.sum(0)
    order = np.argsort(col, kind="stable")
    rare = col[order] * scale < MIN_EXPECTED
    kept, pooled = list(order[~rare]), list(order[rare])
    while pooled and col[pooled].sum() * scale < MIN_EXPECTED and kept:
        pooled.append(kept.pop(0))
    out = rows[:, kept]
    if pooled and col[pooled].sum() > 0:
        out = np.column_stack([out, rows[:, pooled].sum(1)])
    return out


def _statistics(which: np.ndarray, binned: np.ndarray) -> np.ndarray:
    """The two-sample χ² statistic (no continuity correction) of each labelling: which [P, R] marks the
    runs of the first method, binned [R, bins] each run's counts. [P]"""
    C = binned.sum(0).astype(float)
    N = C.sum()
    A = which @ binned
    nA = A.sum(1, keepdims=True)
    Ea, Eb = C * nA / N, C * (N - nA) / N
    return (((A - Ea) ** 2 / Ea) + (((C - A) - Eb) ** 2 / Eb)).sum(1)


def by_runs(a_runs, b_runs, *, permutations: int = PERMUTATIONS, seed: int = 0) -> dict:
    """The two-sample χ² of runs a_runs [Ra, B] against b_runs [Rb, B] (each row one run's counts over
    the same bins), binned as `checks.gate.two_sample` bins the pooled counts: {"chi2", "dof", "bins",
    "n", "pvalue" (by permuting the runs' labels), "pvalue_independent" (the χ² law's)}."""
    a_runs, b_runs = np.atleast_2d(np.asarray(a_runs, np.int64)), np.atleast_2d(np.asarray(b_runs, np.int64))
    if permutations < 1 or a_runs.shape[1] != b_runs.shape[1]:
        raise ValueError(f"runs of {a_runs.shape[1]} and {b_runs.shape[1]} bins, {permutations} permutations; "
                         "give both methods' runs over the same bins and at least one permutation")
    both = np.concatenate([a_runs, b_runs])
    n = (int(a_runs.sum()), int(b_runs.sum()))
    counts = binned(both, min(n) / max(sum(n), 1))
    if counts.shape[1] < 2 or min(n) == 0:
        return {"chi2": 0.0, "dof": 0, "bins": counts.shape[1], "n": n, "pvalue": 1.0, "pvalue_independent": 1.0}
    R, first = len(both), np.r_[np.ones(len(a_runs)), np.zeros(len(b_runs))]
    observed = float(_statistics(first[None], counts)[0])
    rng = np.random.default_rng(seed)
    null = _statistics(np.array([rng.permutation(first) for _ in range(permutations)]), counts)
    dof = counts.shape[1] - 1
    return {"chi2": observed, "dof": dof, "bins": counts.shape[1], "n": n,
            "pvalue": float((1 + np.sum(null >= observed * (1 - 1e-12))) / (1 + permutations)),
            "pvalue_independent": float(sps.chi2.sf(observed, dof)), "runs": R}
