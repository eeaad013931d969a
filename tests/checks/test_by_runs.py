"""The gate's two-sample test with runs as the unit (`checks.by_runs`): the paper's statistic, a
p-value that holds α when the tokens of one run depend on each other, and its power."""

import numpy as np

from moespec.checks.by_runs import by_runs
from moespec.checks.gate import run_counts, two_sample

LAW = np.array([0.3, 0.25, 0.2, 0.15, 0.1])


def _sticky_runs(rng, runs: int, tokens: int, law=LAW) -> np.ndarray:
    """[runs, 5] counts of runs whose tokens all repeat the run's first draw (maximal dependence)."""
    first = rng.choice(len(law), size=runs, p=law)
    return run_counts(np.repeat(first[:, None], tokens, axis=1), len(law))


def test_the_statistic_and_the_independent_p_value_are_the_pooled_tests():
    rng = np.random.default_rng(0)
    a = run_counts(rng.choice(5, size=(40, 10), p=LAW), 5)
    b = run_counts(rng.choice(5, size=(40, 10), p=LAW[::-1]), 5)
    got, pooled = by_runs(a, b, permutations=200), two_sample(a.sum(0), b.sum(0))
    assert abs(got["chi2"] - pooled.chi2) < 1e-9 * pooled.chi2
    assert got["dof"] == pooled.dof and abs(got["pvalue_independent"] - pooled.pvalue) < 1e-12
    assert got["pvalue"] == 1 / 201  # the laws differ: no permutation reaches the observed statistic


def test_with_dependent_tokens_the_permutation_holds_alpha_where_the_chi2_law_does_not():
    """200 trials, both methods sampling one law, 30 runs of 20 tokens that repeat one draw each: at
    alpha = 0.05 the χ² law's p rejects in most trials (> 50%), the permutation p in at most 10% (its
    expected 5% plus over 3 binomial standard deviations of 1.5%)."""
    rng = np.random.default_rng(1)
    pooled = permuted = 0
    for trial in range(200):
        r = by_runs(_sticky_runs(rng, 30, 20), _sticky_runs(rng, 30, 20), permutations=199, seed=trial)
        pooled += r["pvalue_independent"] < 0.05
        permuted += r["pvalue"] < 0.05
    assert pooled > 100 and permuted <= 20, (pooled, permuted)


def test_it_tells_two_laws_apart_with_dependent_tokens():
    """40 runs per method, the second law [0.05, 0.05, 0.1, 0.3, 0.5]: at least 19 of 20 trials reject at
    alpha = 0.01 (the runs are the sample: 40 draws per method, not 800 tokens)."""
    rng, other = np.random.default_rng(2), np.array([0.05, 0.05, 0.1, 0.3, 0.5])
    hits = sum(by_runs(_sticky_runs(rng, 40, 20), _sticky_runs(rng, 40, 20, other), permutations=199,
                       seed=t)["pvalue"] < 0.01 for t in range(20))
    assert hits >= 19


def test_bad_input_is_refused():
    import pytest

    with pytest.raises(ValueError, match="same bins"):
        by_runs(np.ones((2, 3)), np.ones((2, 4)))
