"""llama.cpp's p-min read through the draft's measured confidence (`costmodel.confidence`): the
non-decreasing fit against a hand-computed pool-adjacent-violators, and the threshold it gives on a
draft of known calibration (underconfident, calibrated), exact where hand-checked."""

import numpy as np
import pytest

from moespec.costmodel.confidence import MIN_DRAFTS, calibrated_p_min, monotone_acceptance


def test_the_fit_pools_adjacent_violators_by_hand():
    # q ascending: 0.1 hit, 0.2 miss, 0.3 hit, 0.4 hit, 0.5 miss, 0.6 hit -> pools (0.1, 0.2) = 0.5,
    # then (0.3..0.6): 1, 1, 0 violates -> (0.4, 0.5) = 0.5 < 1 of 0.3 -> (0.3, 0.4, 0.5) = 2/3, then 0.6 = 1
    fit = monotone_acceptance([0.6, 0.1, 0.5, 0.3, 0.2, 0.4], [1, 1, 0, 1, 0, 1])
    assert [q for q, _ in fit] == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    assert [f for _, f in fit] == pytest.approx([0.5, 0.5, 2 / 3, 2 / 3, 2 / 3, 1.0])
    assert all(a <= b for (_, a), (_, b) in zip(fit, fit[1:]))


def test_equal_probabilities_pool_before_the_fit():
    fit = monotone_acceptance([0.3, 0.3, 0.3, 0.7], [1, 0, 0, 1])
    assert [f for _, f in fit] == pytest.approx([1 / 3, 1 / 3, 1 / 3, 1.0])


def test_p_min_is_the_least_probability_whose_acceptance_reaches_the_floor():
    """An underconfident draft, accepted with probability min(1, 2q) at top-token probability q, on
    4,000 positions (q uniform on [0, 1], seed 0): at a floor of 0.3 the calibrated p-min is near
    0.15 (within 0.06: the fit's steps at this sample size), where reading q as the acceptance would
    stop at 0.3; a calibrated draft (accepted with probability q) gives p-min near the floor itself."""
    rng = np.random.default_rng(0)
    q, u = rng.uniform(size=4000), rng.uniform(size=4000)
    assert calibrated_p_min(q, u < np.minimum(1, 2 * q), 0.3) == pytest.approx(0.15, abs=0.06)
    assert calibrated_p_min(q, u < q, 0.3) == pytest.approx(0.3, abs=0.06)


def test_the_ends_and_too_few_positions():
    q = [i / MIN_DRAFTS for i in range(MIN_DRAFTS)]
    assert calibrated_p_min(q, [True] * MIN_DRAFTS, 0.5) == 0.0  # even the least likely drafts pay
    assert calibrated_p_min(q, [False] * MIN_DRAFTS, 0.5) == 1.0  # none does: no draft token pays
    assert calibrated_p_min(q[:-1], [True] * (MIN_DRAFTS - 1), 0.5) is None  # the caller keeps the floor
    with pytest.raises(ValueError, match="one per position"):
        monotone_acceptance([0.1, 0.2], [True])
