"""Tests of the scoring (Tables 3, 4, 7 and the six rules of Table 8) against measurements generated
from a known step-time model: a perfect prediction scores perfectly, a perturbation inside ε stays
inside the band (18), a wrong prediction fails the rules it should, and the crossover edge cases.

Times are dyadic (integers times 2^-12 s), so exact quantities are compared with ==.
"""

import json

import numpy as np
import pytest

from moespec.costmodel.predict import ACCEPTANCE_GRID, predict
from moespec.costmodel.score import Score, crossover_distance, implied_eps, score

L, N_MAX, Q = 4, 9, 2.0**-12
OUTSIDE = 0.125


def layer_times(kernel: str, n: int, dedup_slope: int = 2) -> np.ndarray:
    """[L] operation times: per-slot (8 + l + 3n) Q, dedup (14 + l + slope n) Q; crossover 7 at slope 2."""
    l = np.arange(L)
    return ((8 + l + 3 * n) if kernel == "slot" or n == 1 else (14 + l + dedup_slope * n)) * Q


def truth():
    """Measured figures of the model: verify medians, S intervals, step times, oracle throughput [A, K]."""
    tau = {p: {n: OUTSIDE + float(layer_times(p, n).sum()) for n in range(1, N_MAX + 1)} for p in ("slot", "dedup")}
    S = {n: tau["slot"][n] - tau["dedup"][n] for n in tau["slot"]}
    h = [(4 + k) * Q for k in range(N_MAX)]
    V = [tau["dedup"][k + 1] + h[k] for k in range(N_MAX)]
    T = np.array([[sum(a**j for j in range(k + 1)) / V[k] for k in range(N_MAX)] for a in ACCEPTANCE_GRID])
    return dict(tau=tau, S_lo={n: s - 0.5 * Q for n, s in S.items()}, S_hi={n: s + 0.5 * Q for n, s in S.items()},
                h=h, V=V, T=T)


def prediction(m, eps=0.05, dedup_slope=2, scale=None):
    scale = scale or (lambda p, n: 1.0)
    t_slot = {n: layer_times("slot", n) * scale("slot", n) for n in range(1, N_MAX + 1)}
    t_dedup = {n: layer_times("dedup", n, dedup_slope) * scale("dedup", n) for n in range(2, N_MAX + 1)}
    return predict(t_slot=t_slot, t_dedup=t_dedup, tau1=m["tau"]["slot"][1], h=m["h"], eps=eps)


def measured(m):
    """score()'s measurement arguments, the in-sample verify times equal to the held-out ones."""
    return dict(tau_slot=m["tau"]["slot"], tau_dedup=m["tau"]["dedup"], tau_slot_in_sample=m["tau"]["slot"],
                tau_dedup_in_sample=m["tau"]["dedup"], S_lo=m["S_lo"], S_hi=m["S_hi"], throughput=m["T"], V=m["V"])


def run(p, m, **kw):
    return score(p, **(measured(m) | kw))


def test_a_perfect_prediction_scores_perfectly_and_passes_every_rule():
    m = truth()
    s = run(prediction(m), m)
    assert s.saving_error == 0.0 and s.tau_error == 0.0 and s.tau_error_dedup == 0.0 and s.delta == 0.0
    assert s.tau_error_in_sample == 0.0 and s.tau_error_dedup_in_sample == 0.0
    assert s.crossover_predicted == s.crossover_measured == 7
    assert s.k_star_predicted == s.k_star_measured and s.k_within_one == 11
    assert s.max_loss == 0.0 and s.eps_implied == 0.0
    assert all(s.inside_band) and s.inside_band_count == N_MAX - 1
    assert s.sign_agree == s.sign_points == N_MAX - 2  # S(6) = 0: its interval contains 0
    assert all(s.speedup_inside) and all(s.loss_inside) and max(map(abs, s.oracle_gap)) < 1e-12
    assert len(s.rules) == 6 and s.passed


def test_perturbation_inside_eps_keeps_the_measured_saving_inside_the_band_18():
    # 30 seeded draws of bandwidth errors |e| <= eps per (kernel, n); every measured point must
    # stay inside the band and the implied epsilon must not exceed the engine's.
    rng = np.random.default_rng(2)
    m, eps = truth(), 0.08
    for _ in range(30):
        e = {(p, n): rng.uniform(-eps, eps) for p in ("slot", "dedup") for n in range(1, N_MAX + 1)}
        s = run(prediction(m, eps=eps, scale=lambda p, n: 1 / (1 + e[p, n])), m)
        assert all(s.inside_band) and s.eps_implied <= eps


def test_implied_eps_makes_the_band_just_cover_the_worst_point():
    err, M_sum = [1e-3, 4e-3, 2e-3], [0.1, 0.1, 0.05]
    eps = implied_eps(err, M_sum)
    assert eps / (1 - eps) * 0.05 == pytest.approx(2e-3) and eps == pytest.approx(0.04 / 1.04)
    assert all(eps / (1 - eps) * M >= e * (1 - 1e-12) for e, M in zip(err, M_sum))


def test_a_wrong_prediction_fails_the_rules_it_should():
    # dedup predicted 50x steeper in n: no crossover, every S(n) of the wrong sign from n = 7, verify
    # time far off, k_hat* = 0 everywhere. (21) then holds vacuously (delta >= 1).
    m = truth()
    s = run(prediction(m, dedup_slope=100), m)
    ok = {r.name: r.passed for r in s.rules}
    assert s.crossover_predicted is None and s.crossover_measured == 7
    assert [name for name, passed in ok.items() if not passed] == [
        "crossover within one",
        "k* within one at >= 9 of 11 values",
        "loss at most 6% at every value",
        "sign of S(n) where the interval excludes 0 (wrong signs)",
        "verify time within 15%, both kernels",
    ]
    assert s.delta >= 1 and all(s.speedup_inside) and not s.passed
    assert s.sign_points - s.sign_agree == 3  # n = 7, 8, 9


def test_the_verify_time_error_is_scored_out_of_sample_and_reported_in_sample_beside_it():
    m = truth()
    p = prediction(m)  # exact on the held-out passes
    # the passes the prediction read ran 25% slower with deduplication on: |t - 1.25 t| / 1.25 t = 0.2
    s = run(p, m, tau_dedup_in_sample={n: 1.25 * t for n, t in m["tau"]["dedup"].items()})
    assert (s.tau_error, s.tau_error_dedup) == (0.0, 0.0)
    assert s.tau_error_in_sample == pytest.approx(0.2) and s.tau_error_dedup_in_sample == pytest.approx(0.2)
    assert s.passed  # Table 8 takes the held-out error
    # and the other way round: the held-out per-slot passes 20% faster, |t - 0.8 t| / 0.8 t = 0.25
    s = run(p, m, tau_slot={n: 0.8 * t for n, t in m["tau"]["slot"].items()})
    assert s.tau_error == pytest.approx(0.25) and s.tau_error_dedup == 0.0 and s.tau_error_in_sample == 0.0
    assert not next(r for r in s.rules if r.name.startswith("verify time")).passed


def test_a_common_factor_on_every_step_time_keeps_k_star_but_not_the_verify_time():
    m = truth()
    m_scaled = dict(m, V=[1.3 * v for v in m["V"]], T=m["T"] / 1.3)
    s = run(prediction(m), m_scaled)
    assert s.k_star_predicted == s.k_star_measured and s.max_loss == 0.0
    assert s.delta == pytest.approx(0.3 / 1.3) and all(s.speedup_inside) and all(s.loss_inside)


@pytest.mark.parametrize(
    "predicted, measured, n_max, distance",
    [
        (None, None, 9, 0),
        (None, 9, 9, 1),  # Table 8: a measured crossover at n = 9 counts as within one of none
        (9, None, 9, 1),
        (None, 8, 9, 2),
        (None, 8, 8, 1),  # CUDA reads the crossover over n <= 8
        (2, 3, 9, 1),
        (2, 9, 9, 7),
    ],
)
def test_crossover_distance_edge_cases(predicted, measured, n_max, distance):
    assert crossover_distance(predicted, measured, n_max) == distance


def test_measured_crossover_at_nine_is_within_one_of_a_predicted_none():
    m = truth()
    p = prediction(m, dedup_slope=5)  # dedup slower at every n: no predicted crossover
    S = {n: (1.0 if n == 9 else -1.0) * Q for n in range(2, N_MAX + 1)}
    s = run(p, m, S=S)
    assert (s.crossover_predicted, s.crossover_measured) == (None, 9) and s.rules[0].passed
    s8 = run(p, m, S=S, n_max=8)
    assert s8.n == list(range(2, 9)) and s8.crossover_measured is None and s8.rules[0].passed


def test_amplification_floors_the_saving_at_a_twentieth_of_a_millisecond():
    m = truth()
    p = prediction(m)
    s = run(p, m)
    i6 = s.n.index(6)  # S(6) = 0 exactly
    assert s.amplification[i6] == pytest.approx((p.M["slot"][5] + p.M["dedup"][5]) / 5e-5)


def test_oracle_gap_reports_the_sweep_against_the_measured_step_times():
    m = truth()
    T = m["T"].copy()
    T[:, 1:] *= 0.95  # the oracle draft emits 5% fewer tokens than G_a(k)
    s = run(prediction(m), dict(m, T=T))
    assert all(g == pytest.approx(-0.05) for g, k in zip(s.oracle_gap, s.k_star_measured) if k > 0)


def test_score_round_trips_through_json():
    m = truth()
    s = run(prediction(m, dedup_slope=3), m)
    d = json.loads(json.dumps(s.to_dict()))
    assert d["summary"]["k_within_one"] == s.k_within_one
    assert Score.from_dict(d) == s


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(throughput=np.ones((10, N_MAX))), "shape"),
        (dict(V=[0.1] * 5), "step times"),
        (dict(kernel="tiled"), "kernel"),
        (dict(n_max=12), "n_max"),
        (dict(tau_slot={1: 0.1}), "tau_slot lacks"),
        (dict(tau_dedup_in_sample={1: 0.1}), "tau_dedup_in_sample lacks"),
    ],
)
def test_bad_measurements_raise_with_the_fix(change, match):
    m = truth()
    with pytest.raises(ValueError, match=match):
        score(prediction(m), **(measured(m) | change))


def test_sweep_intervals_collapse_on_a_noiseless_sweep_and_charge_a_flat_one_its_noise():
    m = truth()
    p = prediction(m)
    same = run(p, m, throughput_resamples=np.stack([m["T"]] * 50))
    assert same.resamples == 50 and same.k_within_one_interval == [11, 11]
    assert same.max_loss_interval == [0.0, 0.0] and same.loss_floor == 0.0
    assert same.oracle_gap_interval == pytest.approx([0.0, 0.0], abs=1e-12)
    # a flat sweep: T(k, a) equal at every k, each resample off by 5% (sd) per cell, 400 resamples;
    # the measured argmax then wanders, and even the measured k* loses on most resamples
    flat = np.ones_like(m["T"])
    rng = np.random.default_rng(0)
    noisy = flat * np.exp(0.05 * rng.standard_normal((400, *flat.shape)))
    s = run(p, dict(m, T=flat), throughput_resamples=noisy)
    assert s.max_loss == 0.0 and s.loss_floor > 0.05  # 9 cells of sd 5%: the largest of 11 losses is > 5%
    lo, hi = s.max_loss_interval
    assert 0 < lo < hi and s.k_within_one_interval[0] < 11
    assert Score.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    with pytest.raises(ValueError, match="B, A, K"):
        run(p, m, throughput_resamples=np.ones((5, 3, N_MAX)))


def test_the_saving_error_beyond_the_measured_interval_counts_only_what_noise_cannot_explain():
    m = truth()
    p = prediction(m)
    assert run(p, m).saving_error_beyond_interval == 0.0  # Ŝ = S, inside [S - Q/2, S + Q/2]
    wide = run(p, dict(m, S_lo={n: s - 9 * Q for n, s in m["S_lo"].items()},
                       S_hi={n: s + 9 * Q for n, s in m["S_hi"].items()}), S={n: 0.0 for n in m["S_lo"]})
    assert wide.saving_error > 0 and wide.saving_error_beyond_interval == 0.0  # every miss within the interval
    off = prediction(m, dedup_slope=3)  # each layer's dedup time larger by n Q: Ŝ(n) smaller by n L Q
    s = run(off, m)
    beyond = max((n * L * Q - 0.5 * Q) / m["tau"]["dedup"][n] for n in range(2, N_MAX + 1))  # half-width Q/2
    assert s.saving_error_beyond_interval == pytest.approx(beyond)
