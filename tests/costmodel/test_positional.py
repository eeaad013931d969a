"""Positional acceptance and the answer it gives (costmodel.positional): exact values worked by hand,
the geometric case G_a(k), and k_hat* against a brute-force argmax."""

from fractions import Fraction as F

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moespec.costmodel.band import prompt_bootstrap_band
from moespec.costmodel.positional import (
    PLAINLY,
    PositionalAcceptance,
    PositionalAnswer,
    answer,
    best_draft_length_positional,
    counts_from_rounds,
    draft_step_times,
    expected_pass_times,
    expected_tokens_positional,
    offered_from_rounds,
    paying,
    pooled,
    shortest_paying_draft_positional,
    wilson_interval,
)
from moespec.costmodel.theory import expected_tokens


def test_alpha_and_expected_tokens_by_hand():
    acc = PositionalAcceptance(at_risk=(10, 8, 4), accepted=(8, 4, 1))
    assert acc.alpha == (F(4, 5), F(1, 2), F(1, 4))
    assert acc.geometric == F(13, 22)
    # E(3) = 1 + 4/5 + 4/5*1/2 + 4/5*1/2*1/4 = 1 + 0.8 + 0.4 + 0.1
    assert [expected_tokens_positional(acc.alpha, k) for k in range(4)] == [1, F(9, 5), F(11, 5), F(23, 10)]


def test_answer_by_hand():
    # V = 10, 12, 14, 16: E/V = 1/10, 3/20, 11/70, 23/160; the largest is 11/70 at k = 2
    acc = PositionalAcceptance(at_risk=(10, 8, 4), accepted=(8, 4, 1))
    a = answer([F(10), F(12), F(14), F(16)], acc)
    assert a.k_star == 2 and a.speedup == F(11, 7) and a.verdict == "speculate"
    assert a.n_min == 1 and a.p_min == F(1, 5)  # min increment 2 over V(0) = 10
    assert a.speedup_low < 11 / 7 < a.speedup_high
    assert PositionalAnswer.from_dict(a.to_dict()).k_star == 2


def test_delta_widens_the_band_by_bounds_21():
    acc = PositionalAcceptance(at_risk=(1000,), accepted=(500,))
    tight, wide = answer([F(1), F(1)], acc), answer([F(1), F(1)], acc, delta=F(1, 10))
    assert wide.speedup_low == pytest.approx(tight.speedup_low * 9 / 11)
    assert wide.speedup_high == pytest.approx(tight.speedup_high * 11 / 9)


def test_a_draft_that_costs_too_much_says_decode_plainly():
    # acceptance 1/2 at position 1; a step that doubles with one draft: E(1)/V(1) = 3/4 < 1
    acc = PositionalAcceptance(at_risk=(4,), accepted=(2,))
    V = draft_step_times([F(1), F(3, 2)], [0, F(1, 2)])
    assert V == [1, 2]
    a = answer(V, acc)
    assert a.k_star == 0 and a.verdict == PLAINLY and a.speedup == 1 and a.n_min == 0


def test_a_gain_inside_the_prices_noise_ties_plain_decoding():
    # at kmax = 2: alpha = 1/2, 1/2, E = 1, 3/2, 7/4; V = 1, 5/4, 3/2: E/V = 1, 6/5, 7/6, k_hat* = 1 at 6/5.
    # The price of a round at k = 1 rose by up to 1/4 over the timing's blocks, at k = 2 by 1/10:
    # 6/5 < 5/4 ties plain decoding, 7/6 > 11/10 pays beyond it, so k_hat* = 2 (and n-min 2)
    acc = PositionalAcceptance((4, 2), (2, 1))
    V = [F(1), F(5, 4), F(3, 2)]
    assert paying([1, F(6, 5), F(7, 6)], (1, 1.25, 1.1)) == [0, 2] and paying([1, F(6, 5)], ()) == [0, 1]
    central = answer(V, acc)
    a = answer(V, acc, price_low=(1, 0.9, 0.95), price_high=(1, 1.25, 1.1))
    assert central.k_star == 1 and a.k_star == 2 and a.speedup == F(7, 6) and a.n_min == 2 and not a.tied
    # both lengths inside their noise: decode plainly, a tie
    b = answer(V, acc, price_low=(1, 0.9, 0.9), price_high=(1, 1.25, 1.2))
    assert b.k_star == 0 and b.verdict == PLAINLY and b.n_min == 0 and b.tied and not central.tied
    # the band's ends are those of the answer at the prices' ends
    slow = answer([F(1), F(5, 4) * F(5, 4), F(3, 2) * F(6, 5)], acc)
    fast = answer([F(1), F(5, 4) * F(9, 10), F(3, 2) * F(9, 10)], acc)
    assert b.speedup_low == pytest.approx(slow.speedup_low) and b.speedup_high == pytest.approx(fast.speedup_high)
    assert b.low_by_k == pytest.approx(slow.low_by_k) and b.high_by_k == pytest.approx(fast.high_by_k)
    # without prompts' counts the band of the best is the largest of the bands at each k
    assert central.speedup_low == max(central.low_by_k) and central.speedup_high == max(central.high_by_k)
    assert all(lo <= float(e * V[0] / v) <= hi for lo, hi, e, v in
               zip(central.low_by_k, central.high_by_k, central.expected, V))
    assert PositionalAnswer.from_dict(b.to_dict()) == b


def test_wilson_interval_by_hand():
    # 0 of 0: no information; 5 of 10: symmetric about 1/2, half-width z/(1+z^2/10) sqrt(1/40 + z^2/400)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(0.2365931) and hi == pytest.approx(0.7634069)


def test_counts_from_rounds_by_hand():
    # k = 3, 9 tokens: rounds commit 4 (all accepted), 1 (first rejected), 3 (two accepted), then the
    # budget leaves 1 token: k = 0, nothing at risk
    at_risk, accepted = counts_from_rounds([4, 1, 3, 1], [3, 3, 3, 3], max_new_tokens=9, kmax=3)
    assert at_risk == (3, 2, 2) and accepted == (2, 2, 1)
    assert pooled([PositionalAcceptance(at_risk, accepted)] * 2).at_risk == (6, 4, 4)
    # every round offered 3 positions but the last (k = 0 from the budget)
    assert offered_from_rounds([3, 3, 3, 3], [4, 1, 3, 1], max_new_tokens=9, kmax=3) == (3, 3, 3)


def test_a_short_proposal_verifies_fewer_tokens_by_hand():
    # offered 10 rounds at every position; proposals reached position 1 in 4, 2 in 2, 3 in 1:
    # s = 2/5, 1/5, 1/10; tau(1..4) = 10, 12, 15, 19 (growth 2, 3, 4):
    # tau_bar = 10, 10 + 2*2/5, + 3/5, + 2/5 = 10, 54/5, 57/5, 59/5
    acc = PositionalAcceptance((10, 3, 1), (3, 1, 0), offered=(10, 10, 10), drafted=(4, 2, 1))
    assert acc.draft_share == (F(2, 5), F(1, 5), F(1, 10))
    assert expected_pass_times([F(10), F(12), F(15), F(19)], acc.draft_share) == [10, F(54, 5), F(57, 5), F(59, 5)]
    # a proposer that always drafts k (or counts not taken) keeps tau itself, floats bit for bit
    tau = [0.1, 0.13, 0.17, 0.2]
    assert expected_pass_times(tau, [F(1)] * 3) == tau
    assert PositionalAcceptance((1, 1, 1), (1, 1, 1)).draft_share == (1, 1, 1)
    back = PositionalAcceptance.from_dict(acc.to_dict())
    assert back == acc and pooled([acc, acc]).drafted == (8, 4, 2)
    assert pooled([acc, PositionalAcceptance((1, 1, 1), (1, 1, 1))]).offered is None  # not counted in one part


def test_refusals():
    with pytest.raises(ValueError, match="accepted 3 must lie"):
        PositionalAcceptance(at_risk=(2,), accepted=(3,))
    with pytest.raises(ValueError, match="draft cost h"):
        draft_step_times([1, 1], [0, -1])
    with pytest.raises(ValueError, match="counted to 1 positions"):
        answer([1, 1, 1], PositionalAcceptance(at_risk=(1,), accepted=(1,)))
    with pytest.raises(ValueError, match="drafted 3 must lie"):
        PositionalAcceptance(at_risk=(2,), accepted=(1,), offered=(2,), drafted=(3,))
    with pytest.raises(ValueError, match="together"):
        PositionalAcceptance(at_risk=(2,), accepted=(1,), offered=(2,))
    with pytest.raises(ValueError, match="s_2"):
        expected_pass_times([1, 2, 3], [F(1, 2), F(3, 2)])


fractions = st.fractions(min_value=0, max_value=1, max_denominator=50)


@settings(max_examples=60, deadline=None)
@given(a=st.fractions(min_value=0, max_value=F(49, 50), max_denominator=50), k=st.integers(0, 8))
def test_constant_alpha_is_the_geometric_g(a, k):
    assert expected_tokens_positional([a] * 8, k) == expected_tokens(a, k)


@settings(max_examples=80, deadline=None)
@given(data=st.data(), kmax=st.integers(0, 6))
def test_k_star_is_the_brute_force_argmax(data, kmax):
    V = data.draw(st.lists(st.fractions(min_value=F(1, 10), max_value=10, max_denominator=20),
                           min_size=kmax + 1, max_size=kmax + 1))
    alpha = data.draw(st.lists(fractions, min_size=kmax, max_size=kmax))
    rates = []
    for k in range(kmax + 1):
        e, survive = F(1), F(1)
        for a in alpha[:k]:
            survive *= a
            e += survive
        rates.append(e / V[k])
    brute = min(k for k in range(kmax + 1) if rates[k] == max(rates))
    assert best_draft_length_positional(V, alpha) == brute
    n_min = shortest_paying_draft_positional(V, alpha)
    assert n_min == next((j for j in range(1, kmax + 1) if rates[j] > rates[0]), 0)


@settings(max_examples=60, deadline=None)
@given(k=st.integers(1, 6), data=st.data())
def test_expected_tokens_at_k_is_the_mean_tokens_per_round(k, data):
    # with every round at k (no budget cut), prod_{i<=j} alpha_i = accepted_j / rounds, so E(k) is
    # exactly the mean tokens a round committed
    tokens = data.draw(st.lists(st.integers(1, k + 1), min_size=1, max_size=40))
    acc = PositionalAcceptance(*counts_from_rounds(tokens, [k] * len(tokens), max_new_tokens=10**6, kmax=k))
    assert expected_tokens_positional(acc.alpha, k) == F(sum(tokens), len(tokens))


@settings(max_examples=60, deadline=None)
@given(k=st.integers(1, 6), data=st.data())
def test_the_expected_pass_is_the_mean_pass_of_the_rounds(k, data):
    # rounds at k with proposals of any length 0..k: tau_bar(k) is exactly the mean of tau(1 + L_r),
    # with tau drawn at random; drafted counts built as the engine's Stats counts them
    lengths = data.draw(st.lists(st.integers(0, k), min_size=1, max_size=40))
    tau = data.draw(st.lists(st.fractions(min_value=0, max_value=10, max_denominator=20), min_size=k + 1,
                             max_size=k + 1))
    offered = offered_from_rounds([k] * len(lengths), [1] * len(lengths), max_new_tokens=10**6, kmax=k)
    drafted = tuple(sum(n > j for n in lengths) for j in range(k))
    acc = PositionalAcceptance((len(lengths),) + (0,) * (k - 1), (0,) * k, offered=offered, drafted=drafted)
    assert expected_pass_times(tau, acc.draft_share)[k] == F(sum(tau[n] for n in lengths), len(lengths))


def test_the_band_over_prompts_by_hand():
    # V = 1, 3/2: k = 1 pays when E(1) = 1 + alpha_1 > 3/2. Prompt A accepts all 10 drafts, prompt B
    # none of 10. Resampling 2 prompts: {A, A} (chance 1/4) gives alpha 1 and 2/(3/2) = 4/3, {A, B}
    # (1/2) alpha 1/2 and max(1, 1) = 1, {B, B} (1/4) 1: the 95% band is [1, 4/3], the Wilson band
    # of the pooled 10 of 20 far narrower on top (its high end below 4/3)
    a, b = PositionalAcceptance((10,), (10,)), PositionalAcceptance((10,), (0,))
    low, high = prompt_bootstrap_band([1, 1.5], [a, b])
    assert (low, high) == (1.0, pytest.approx(4 / 3))
    pooled_ab = pooled([a, b])
    wilson_only = answer([1.0, 1.5], pooled_ab)
    both = answer([1.0, 1.5], pooled_ab, prompts=[a, b])
    assert wilson_only.speedup_high < 4 / 3 and both.speedup_high == pytest.approx(4 / 3)
    assert both.speedup_low == min(wilson_only.speedup_low, 1.0) and both.k_star == wilson_only.k_star
    # the band of the speedup at k = 1 itself: {B, B} gives 1/(3/2) = 2/3, below plain, which the band
    # of the best speedup (max over k, plain's 1 among them) cannot show
    assert both.low_by_k == (1.0, pytest.approx(2 / 3)) and both.high_by_k == (1.0, pytest.approx(4 / 3))
    # prompts that agree: every resample is the pool, so the band over prompts is the point itself
    same = PositionalAcceptance((10, 6), (6, 3))
    point = answer([1.0, 1.2, 1.5], pooled([same, same]))
    assert prompt_bootstrap_band([1.0, 1.2, 1.5], [same, same]) == (pytest.approx(point.speedup),) * 2
    assert answer([1.0, 1.2, 1.5], pooled([same, same]), prompts=[same, same]).speedup_high == point.speedup_high
    with pytest.raises(ValueError, match="at least 2 prompts"):
        prompt_bootstrap_band([1, 1.5], [a])


def test_each_k_read_from_the_run_at_it_by_hand():
    # at kmax = 2: alpha = 1/2, 1/2, E = 1, 3/2, 7/4; V = 1, 1, 9/8: E/V = 1, 3/2, 14/9, k_hat* = 2.
    # The run at k = 1 accepted 3 of its 4 offers: E(1) = 7/4 and E/V = 1, 7/4, 14/9: k_hat* = 1 at 7/4
    at_kmax, at_one = PositionalAcceptance((4, 2), (2, 1)), PositionalAcceptance((4,), (3,))
    V = [F(1), F(1), F(9, 8)]
    assert answer(V, at_kmax).k_star == 2
    a = answer(V, at_kmax, at_k=[at_one, at_kmax])
    assert a.expected == (1, F(7, 4), F(7, 4)) and a.k_star == 1 and a.speedup == F(7, 4) and a.n_min == 1
    assert a.geometric == answer(V, at_kmax).geometric  # the geometric fit stays the run at kmax's
    # the band over prompts draws the same prompts for every k: two alike prompts give the point itself
    both = answer(V, pooled([at_kmax, at_kmax]), prompts=[at_kmax, at_kmax],
                  at_k=[pooled([at_one, at_one]), pooled([at_kmax, at_kmax])],
                  at_k_prompts=[[at_one, at_one], [at_kmax, at_kmax]])
    assert prompt_bootstrap_band([1.0, 1.0, 1.125], [at_kmax, at_kmax],
                                 at_k_prompts=[[at_one, at_one], [at_kmax, at_kmax]]) == (1.75, 1.75)
    assert both.k_star == 1 and both.speedup_low <= 1.75 <= both.speedup_high
    with pytest.raises(ValueError, match="at 1 draft lengths"):
        answer(V, at_kmax, at_k=[at_one])
