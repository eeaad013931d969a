"""Tests of the bandwidth quantities: beta_p, r(n), u_bar(n), (7) and the margin (19), f_l."""

import math
from fractions import Fraction

import numpy as np
import pytest

from moespec.costmodel.bandwidth import (
    bandwidth_ratio,
    beta_dedup,
    beta_slot,
    byte_factor,
    effective_bandwidth,
    quartiles,
    sign_margin,
    u_bar,
    verdict,
)


def test_betas_are_requested_bytes_over_time():
    assert beta_slot(2, 8, 1e6, 0.016) == pytest.approx(1e9)
    assert beta_dedup(12, 1e6, 0.012) == pytest.approx(1e9)
    assert beta_dedup(12, 1e6, 0.012, f=Fraction(10, 9)) == pytest.approx(1e9 * 10 / 9)
    np.testing.assert_allclose(beta_slot(np.array([1, 2]), 8, 1.0, np.array([8.0, 8.0])), [1.0, 2.0])


def test_effective_bandwidth_sums_before_dividing():
    # Table 1: one pass of 10 bytes in 1 s and one of 90 bytes in 9 s give 10 B/s, not the mean of ratios
    assert effective_bandwidth([10, 90], [1, 9]) == 10
    assert effective_bandwidth([Fraction(1), Fraction(2)], [Fraction(1), Fraction(2)]) == Fraction(1)
    with pytest.raises(ValueError):
        effective_bandwidth([1], [0])


def test_u_bar_is_exact_and_weighted_by_layer_bytes():
    # two layers: U = (12, 16) at n = 2, m = 8; weights 1 and 3 -> (12 + 48) / (16 * 4)
    assert u_bar([12, 16], 2, 8, [1, 3]) == Fraction(60, 64)
    assert u_bar([8], 1, 8, [5]) == 1
    assert u_bar([12], 2, 8, [1], f=[Fraction(3, 2)]) == Fraction(18, 16)


def test_r_and_rule_7():
    r = bandwidth_ratio(Fraction(3), Fraction(5))
    assert r == Fraction(3, 5)
    assert verdict(Fraction(1, 2), r, 0.0)["dedup_faster"] is True
    assert verdict(Fraction(7, 10), r, 0.0)["dedup_faster"] is False


def test_margin_19_matches_its_definition_and_flips_certainty_at_the_threshold():
    ub, r, eps = 0.5, 0.6, 0.05
    expected = abs(math.log(r) - math.log(ub)) - math.log(1.05 / 0.95)
    assert sign_margin(ub, r, eps) == pytest.approx(expected)
    v = verdict(ub, r, eps)
    assert v["certain"] is True and v["margin"] == pytest.approx(expected)
    # at eps with ln((1+eps)/(1-eps)) = ln(r/ub) the margin is exactly 0
    eps_star = (r / ub - 1) / (r / ub + 1)
    assert sign_margin(ub, r, eps_star) == pytest.approx(0.0, abs=1e-12)
    assert verdict(ub, r, eps_star + 1e-3)["certain"] is False
    with pytest.raises(ValueError, match="eps"):
        sign_margin(ub, r, 1.0)


def test_byte_factor():
    assert byte_factor(500, 459) == Fraction(500, 459)
    assert byte_factor(1.0, 1.0) == 1
    with pytest.raises(ValueError, match="< 1"):
        byte_factor(9, 10)


def test_quartiles():
    q = quartiles([1.0, 2.0, 3.0, 4.0, 5.0])
    assert q == {"median": 3.0, "q1": 2.0, "q3": 4.0}
    with pytest.raises(ValueError):
        quartiles([])


def test_verdict_without_a_usable_eps_is_never_certain():
    v = verdict(0.2, 0.9, 1.5)
    assert v["dedup_faster"] is True and v["certain"] is False and v["margin"] == float("-inf")
