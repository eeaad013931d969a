"""The machine-steadiness check (`costmodel.steadiness`): the speed factor of each round recovered exactly
from timings made of known factors, the verdict's threshold, and the check over a run's artifacts."""

import numpy as np
import pytest

from moespec.costmodel.steadiness import FIX, SLOW, SLOW_SHARE, Phase, check, round_factors


def test_round_factors_recover_each_rounds_speed():
    """t(p, r) = base_p * f_r: every point slowed alike in a round. f_r / geomean(f) comes back exactly,
    whatever the points' own scales."""
    rng = np.random.default_rng(0)
    f = rng.uniform(0.8, 2.0, size=12)
    base = rng.uniform(1e-4, 1e-1, size=7)
    got = round_factors(base[:, None] * f[None, :])
    assert got == pytest.approx(f / np.exp(np.log(f).mean()), rel=1e-12)


def test_a_point_that_was_not_timed_is_left_out():
    t = np.array([[1.0, 2.0, 1.0], [np.nan, 4.0, 2.0], [3.0, 6.0, 0.0]])
    assert np.isfinite(round_factors(t)).all()


def test_the_verdict_flags_a_tenth_of_slow_rounds_and_not_fewer():
    rounds = 20
    slow = int(np.ceil(SLOW_SHARE * rounds))  # 2 of 20
    busy = Phase("sweep", tuple([1.0] * (rounds - slow) + [1 + SLOW + 0.3] * slow))
    one = Phase("sweep", tuple([1.0] * (rounds - slow + 1) + [1 + SLOW + 0.3] * (slow - 1)))
    assert not busy.steady and busy.slow_rounds == slow and busy.slowest == pytest.approx(1 + SLOW + 0.3)
    assert one.steady


def sweep(factors, cells: int = 6, seed: int = 0) -> dict:
    """An oracle sweep entry whose cell runs (one step each, as the demo's) ran at the given speed per pass,
    with 3% noise of their own."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.01, 0.03, size=cells)
    noise = rng.lognormal(0, 0.03, size=(cells, len(factors)))
    return {"depth": 512, "cells": [{"run_steps": [[float(b * f * e)] for f, e in zip(factors, row)]}
                                    for b, row in zip(base, noise)]}


def verify(factors, ns=(1, 2, 3), seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    return {"depth": 512, "samples": {"moespec_dedup": {str(n): [[float(1e-3 * n * f * rng.lognormal(0, 0.03))
                                                                  for f in factors]] for n in ns}}}


def test_a_busy_spell_in_the_sweep_is_named_with_the_figure_and_the_fix():
    """36 passes (the demo's 2 prompts x 18 repetitions), 8 of them at half speed: another job on the cores."""
    factors = [1.0] * 14 + [2.0] * 8 + [1.0] * 14
    s = check({"oracle": [sweep(factors)], "verify": [verify([1.0] * 32)]})
    assert not s.steady
    moved = [p for p in s.phases if not p.steady]
    assert [p.name for p in moved] == ["oracle sweep, d = 512"] and moved[0].slow_rounds == 8
    assert "8 of 36 rounds" in s.message and FIX in s.message
    assert s.to_dict()["phases"][1]["slow_rounds"] == 8


def test_an_idle_machines_noise_is_not_flagged():
    """Lognormal noise of 8% per pass (more than the 7-8% inside a pass the sweep saw idle), 36 passes:
    no pass reaches 1.25x."""
    rng = np.random.default_rng(3)
    s = check({"oracle": [sweep(rng.lognormal(0, 0.08, size=36))], "verify": [verify(rng.lognormal(0, 0.08, 32))]})
    assert s.steady and "steady" in s.message


def test_the_base_measurements_verify_passes_and_the_dense_products_are_checked():
    busy_verify = verify([1.0] * 24 + [1.8] * 8)
    dense = {"dense": {"samples": {"1": [1e-4] * 10 + [2e-4] * 5, "2": [2e-4] * 10 + [4e-4] * 5}}}
    s = check({"oracle": [sweep([1.0] * 36)], "verify": [verify([1.0] * 32)]}, dense, {"verify": [busy_verify]})
    assert [p.name for p in s.phases if not p.steady] == ["dense products", "verify passes, d = 512, prompt 0"]
