"""The draft-length policies alone, fed constructed rounds: with exact step times and acceptance
AutoK is the staircase k*(a) of the cost model, and online it learns acceptance by position, step
times, drift and the plain-decoding bar as engine/policy.py states; V(k) between measured points
follows one rule; the decode loop sees a policy only through the Policy protocol."""

from fractions import Fraction as F

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moespec.costmodel.theory import best_draft_length, speculation_pays
from moespec.engine.policy import AutoK, FixedK, Policy, interpolate_step_times, make_policy

LAM = 2 ** (-1 / 16)  # a test's weight after one more drafting round (half-life 16)

STAIRCASES = [
    [F(1), F(2), F(2)],  # the paper's jump example (App. B.3): k* goes 0 -> 2, never 1
    [1 + F(k, 5) for k in range(9)],  # affine: some k pays exactly when a > 1/5 (Leviathan et al.)
    [F(10), F(11), F(12), F(14), F(17), F(21)],  # convex
    [F(5), F(6), F(6), F(9), F(9), F(9), F(13)],  # flat stretches, as a kernel crossover makes them
]


@pytest.mark.parametrize("V", STAIRCASES)
def test_with_exact_step_times_and_acceptance_it_is_the_staircase(V):
    for a in [F(i, 40) for i in range(40)]:
        assert AutoK(len(V) - 1, V=V, prior=a).choose() == best_draft_length(V, a), (V, a)


def test_staircase_on_float_step_times():
    V = [10.0, 11.5, 12.6, 13.9, 15.5, 17.0, 19.2]
    for a in np.linspace(0.0, 0.98, 50):
        assert AutoK(6, V=V, prior=float(a)).choose() == best_draft_length(V, float(a)), a


def test_hand_worked_choices():
    jump = STAIRCASES[0]
    # a = 1/2: E/V = 1, 3/4, 7/8; a = 9/10: 1, 19/20, 271/200
    assert AutoK(2, V=jump, prior=F(1, 2)).choose() == 0
    assert AutoK(2, V=jump, prior=F(9, 10)).choose() == 2
    # affine, a = 1/2: E(1)/V(1) = (3/2)/(6/5) = 5/4 = (7/4)/(7/5) = E(2)/V(2); the smaller k wins
    assert AutoK(8, V=STAIRCASES[1], prior=F(1, 2)).choose() == 1


@pytest.mark.parametrize("V, a, k_at_three_fifths", [
    ([F(1), F(3, 2), F(2), F(5, 2)], F(2, 5), 1),  # a + ... + a^k < k/2 for k = 1, 2, 3; at 3/5, 8/5 > 3/2
    ([F(1), F(2), F(3), F(4)], F(9, 10), 0),  # V(k) = (k + 1) V(0): G_a(k) < k + 1, never pays
])
def test_drafts_nothing_where_no_k_satisfies_the_speedup_condition(V, a, k_at_three_fifths):
    assert not speculation_pays(V, a)
    assert AutoK(len(V) - 1, V=V, prior=a).choose() == 0
    assert AutoK(len(V) - 1, V=V, prior=F(3, 5)).choose() == k_at_three_fifths


def test_acceptance_is_estimated_by_position():
    V = [F(1), F(11, 10), F(5, 4), F(7, 5), F(31, 20)]
    policy = AutoK(4, V=V)
    for _ in range(30):  # position 1 always accepted, position 2 always rejected, 3 and 4 never reached
        policy.update(drafted=4, accepted=1, tested=2, seconds=None)
    n = (1 - LAM**30) / (1 - LAM)  # discounted tests of positions 1 and 2: 17.156
    a1 = (n + 2 * 0.5) / (n + 2)  # 0.9478
    a2 = (0 + 2 * a1) / (n + 2)  # 0.0990; positions 3 and 4, never tested, equal it
    assert policy.state()["acceptance"] == pytest.approx([a1, a2, a2, a2], abs=1e-12)
    assert policy.state()["tests"] == [30, 30, 0, 0]
    # E/V = 1, 1.948/1.1 = 1.771, 2.042/1.25 = 1.633, ...: one draft. The pooled rate 30/60 would give k*(1/2) = 2.
    assert policy.choose() == 1
    assert best_draft_length(V, F(1, 2)) == 2


def test_acceptance_forgets_with_a_half_life_of_16_drafting_rounds():
    policy = AutoK(1, V=[1.0, 1.1])
    policy.update(drafted=1, accepted=1, tested=1, seconds=None)
    assert policy.state()["acceptance"] == pytest.approx([2 / 3], abs=1e-12)  # Laplace's rule (1 + 1)/(2 + 1)
    for _ in range(39):
        policy.update(drafted=1, accepted=1, tested=1, seconds=None)
    S = (1 - LAM**40) / (1 - LAM)  # 19.42 discounted successes in as many tests
    assert policy.state()["acceptance"] == pytest.approx([(S + 1) / (S + 2)], abs=1e-12)  # 0.953
    for _ in range(16):
        policy.update(drafted=1, accepted=0, tested=1, seconds=None)
    # the 40 successes now weigh half; the 16 failures (1 - 1/2)/(1 - LAM): 0.953 -> 0.456
    s, n = S / 2, S / 2 + 0.5 / (1 - LAM)
    assert policy.state()["acceptance"] == pytest.approx([(s + 1) / (n + 2)], abs=1e-12)
    policy.update(drafted=0, accepted=0, tested=0, seconds=1.0)  # a plain round tests nothing and forgets nothing
    assert policy.state()["acceptance"] == pytest.approx([(s + 1) / (n + 2)], abs=1e-12)


def test_opening_then_the_line_through_the_timed_rounds():
    policy = AutoK(8)
    assert policy.choose() == 4  # k_open = ceil(8 / 2)
    policy.update(drafted=4, accepted=2, tested=3, seconds=9.0)  # k = 4's warm-up round: not timed
    assert policy.choose() == 4
    policy.update(drafted=4, accepted=1, tested=2, seconds=1.4)
    assert policy.choose() == 0 and policy.state()["step_s"] is None
    policy.update(drafted=0, accepted=0, tested=0, seconds=7.0)  # plain's warm-up
    assert policy.choose() == 0 and policy.state()["step_s"] is None
    policy.update(drafted=0, accepted=0, tested=0, seconds=1.0)
    # line through (0, 1.0) and (4, 1.4): V = 1 + k/10
    assert policy.state()["step_s"] == pytest.approx([1 + k / 10 for k in range(9)], abs=1e-12)
    # position 1: 2 of 2, position 2: 1 of 2 (the older test discounted by LAM), position 3: 0 of 1
    a1 = (1 + LAM + 1) / (1 + LAM + 2)  # 0.747
    a2 = (LAM + 2 * a1) / (1 + LAM + 2)  # 0.620
    a3 = (0 + 2 * a2) / (LAM + 2)  # 0.419, and positions 4..8 equal it
    assert policy.state()["acceptance"] == pytest.approx([a1, a2] + [a3] * 6, abs=1e-12)
    # E/V: 1.747/1.1 = 1.588, 2.210/1.2 = 1.842, 2.404/1.3 = 1.850, 2.486/1.4 = 1.776, ...
    assert policy.choose() == 3


def test_a_seed_gives_the_shape_and_the_timed_rounds_the_scale():
    policy = AutoK(2, V=[2.0, 3.0, 4.0])
    policy.update(drafted=1, accepted=0, tested=1, seconds=60.0)  # warm-up
    policy.update(drafted=0, accepted=0, tested=0, seconds=30.0)  # warm-up
    assert policy.state()["step_s"] == [2.0, 3.0, 4.0]
    policy.update(drafted=1, accepted=0, tested=1, seconds=6.0)  # twice the seed at k = 1
    assert policy.state()["step_s"] == [4.0, 6.0, 8.0]
    policy.update(drafted=0, accepted=0, tested=0, seconds=3.0)  # ratios 1.5 and 2: their median 1.75
    assert policy.state()["step_s"] == [3.0, 6.0, 7.0]


def test_plain_and_one_draft_rounds_refresh_the_estimates():
    pays = AutoK(1, V=[1.0, 1.1], prior=0.9)
    for _ in range(31):
        pays.update(drafted=1, accepted=1, tested=1, seconds=1.1)
        assert pays.choose() == 1
    pays.update(drafted=1, accepted=1, tested=1, seconds=1.1)
    assert pays.choose() == 0  # 32 rounds without a plain one
    pays.update(drafted=0, accepted=0, tested=0, seconds=1.0)
    assert pays.choose() == 1
    idle, probes = AutoK(1, V=[1.0, 1.1], prior=0.0), []
    for r in range(150):
        k = idle.choose()
        probes += [r] * k
        idle.update(drafted=k, accepted=0, tested=k, seconds=1.0 + k / 10)
    # probes after 4, 8, 16 and then every 32 plain rounds: the wait doubles while probes fail
    assert [b - a - 1 for a, b in zip([-1] + probes, probes)] == [4, 8, 16, 32, 32, 32]


def test_a_slow_first_timing_does_not_lock_drafting_out():
    V = [1.0, 1.1, 1.2, 1.3, 1.4]  # at a = 0.9, k* = 4: E(4)/V(4) = 2.91 against 1 for plain
    policy, rng, chosen = AutoK(4), np.random.default_rng(0), []
    for _ in range(100):
        k = policy.choose()
        accepted = 0
        while accepted < k and rng.random() < 0.9:
            accepted += 1
        slow = 4.0 if policy.state()["timed_rounds"][k] == 0 else 1.0  # the first pass of a size warms up
        policy.update(drafted=k, accepted=accepted, tested=min(accepted + 1, k), seconds=V[k] * slow)
        chosen.append(k)
    assert chosen[20:].count(0) <= 4 and max(set(chosen[20:]), key=chosen[20:].count) >= 3


def _round(policy, rng, a, V) -> int:
    """One simulated round at the policy's choice: geometric acceptance at rate a, time V[k]."""
    k = policy.choose()
    accepted = 0
    while accepted < k and rng.random() < a:
        accepted += 1
    policy.update(drafted=k, accepted=accepted, tested=min(accepted + 1, k), seconds=float(V[k]))
    return k


def test_follows_a_drift_of_acceptance_within_tens_of_rounds():
    V = [1 + F(k, 2) for k in range(9)]  # k*(0.9) = 3; k*(0.3) = 0 since a_1 = 1/2
    assert best_draft_length(V, F(9, 10)) == 3 and best_draft_length(V, F(3, 10)) == 0
    policy, rng = AutoK(8, V=V), np.random.default_rng(0)
    before = [_round(policy, rng, 0.9, V) for _ in range(200)]
    after = [_round(policy, rng, 0.3, V) for _ in range(300)]
    # at 0.9 it drafts every round but one plain round per 33
    assert min(before[100:]) == 0 and sum(k == 0 for k in before[100:]) <= 4 and max(before[100:]) >= 3
    # α_1 falls as 0.3 + 0.6 * 2^(-n/16) and crosses a_1 = 1/2 near n = 25; from n = 60 on, mostly
    # plain rounds and a one-draft probe per 33
    assert max(after[60:]) == 1 and sum(after[60:]) <= 12


def test_explores_each_k_at_most_once_and_settles_near_the_best():
    true_V = [1.0 + 0.05 * k + 0.02 * k * k for k in range(9)]  # convex: the line misjudges it
    policy, rng = AutoK(8), np.random.default_rng(1)
    explored, chosen = {}, []  # rounds of each k drafted before it was ever timed
    for r in range(300):
        untimed = [t == 0 for t in policy.state()["timed_rounds"]]
        chosen.append(_round(policy, rng, 0.8, true_V))
        if untimed[chosen[-1]]:
            explored.setdefault(chosen[-1], []).append(r)
    assert all(len(rounds) <= 2 for rounds in explored.values())  # a warm-up round, then timed
    # the opening (k_open = 4, then plain), then only k that the line made look best: at most 18 rounds
    assert list(explored)[:2] == [4, 0], explored
    # the most frequent choice of the last 100 rounds is within 2% of the best throughput for the true V and a
    T = [(1 - 0.8 ** (k + 1)) / 0.2 / true_V[k] for k in range(9)]
    assert T[max(range(9), key=chosen[200:].count)] >= 0.98 * max(T)


def test_fixed_k_and_bad_arguments():
    fixed = make_policy(3)
    assert isinstance(fixed, FixedK) and fixed.choose() == 3 and fixed.state() == {"policy": "fixed", "k": 3}
    assert make_policy("auto", 5).max_k == 5
    for bad in (-1, 2.0, True, "fast"):
        with pytest.raises(ValueError, match=f"k must be an int >= 0 .* or \"auto\".*got {bad!r}"):
            make_policy(bad)
    with pytest.raises(ValueError, match="step_times seeds the policy"):
        make_policy(2, step_times=[1.0, 2.0])
    with pytest.raises(ValueError, match="max_k must be"):
        AutoK(-1)
    with pytest.raises(ValueError, match="max_k \\+ 1 = 3 finite step times"):
        AutoK(2, V=[1.0, 2.0])
    with pytest.raises(ValueError, match="accepted <= tested"):
        AutoK(2).update(drafted=2, accepted=2, tested=1, seconds=None)
    assert AutoK(0).choose() == 0


def test_the_line_prices_long_drafts_from_the_drafting_rounds():
    policy = AutoK(8)
    for k, t in ((4, 2.4), (0, 1.0), (2, 2.0)):
        policy.update(drafted=k, accepted=0, tested=min(1, k), seconds=99.0)  # the warm-up round, not timed
        policy.update(drafted=k, accepted=0, tested=min(1, k), seconds=t)
    V = policy.state()["step_s"]
    # through (2, 2.0) and (4, 2.4), not through plain's (0, 1.0) too, which would price V(8) at 3.9
    assert V[0] == 1.0 and V[6] == pytest.approx(2.8) and V[8] == pytest.approx(3.2)


def test_a_remembered_acceptance_starts_the_estimates_and_fades_under_the_calls_own_rounds():
    V = [1.0, 1.25, 1.5, 1.75, 2.0]
    assert AutoK(4, V=V).choose() == 1  # α = 1/2 everywhere: E(1)/V(1) = 1.2 beats E(2)/V(2) = 1.17
    warm = AutoK(4, V=V)
    warm.set_acceptance([0.95, 0.95])  # positions past the given ones take the deepest given
    assert warm.alpha[1:] == [0.95] * 4 and warm.choose() == 4  # E(4)/V(4) = 4.52/2 beats E(3)/V(3) = 3.71/1.75
    for _ in range(6):  # every first draft rejected: two remembered tests against six of this call
        warm.update(drafted=4, accepted=0, tested=1, seconds=None)
    assert warm.alpha[1] < 0.3 and warm.choose() < 4
    with pytest.raises(ValueError, match="before its rounds"):
        warm.set_acceptance([0.5])
    for bad in ([], [1.2], [0.5, -0.1]):
        with pytest.raises(ValueError, match=r"\[0, 1\]"):
            AutoK(4).set_acceptance(bad)


def test_a_seed_of_stored_times_is_scaled_only_by_its_measured_k():
    shape = AutoK(2, V=[1.0, 2.0, 2.0])
    stored = AutoK(2)
    stored.set_seed([1.0, 2.0, 2.0], anchors=[0, 1])  # V(2) was filled in, not measured
    for policy in (shape, stored):
        policy.update(drafted=2, accepted=2, tested=2, seconds=9.0)  # the warm-up round of k = 2, not timed
        policy.update(drafted=2, accepted=2, tested=2, seconds=4.0)  # k = 2 takes twice its seed value
    assert shape.V == [2.0, 4.0, 4.0]  # a prediction's shape: every untimed k scales with it
    assert stored.V == [1.0, 2.0, 4.0]  # measured times stay; the filled-in one is replaced
    stored.update(drafted=0, accepted=0, tested=0, seconds=9.0)
    stored.update(drafted=0, accepted=0, tested=0, seconds=1.5)  # an anchor timed: it sets the scale of the untimed anchors
    assert stored.V == [1.5, 3.0, 4.0]


def test_one_rule_for_step_times_between_and_beyond_measured_points():
    rule = interpolate_step_times
    # between drafting points their line; beyond the largest the line through the two largest;
    # below the smallest the line through the two smallest (plain's point is in no line)
    assert rule({0: 1.0, 2: 2.0, 4: 2.4, 8: 4.0}, 9) == pytest.approx([1.0, 1.8, 2.0, 2.2, 2.4, 2.8, 3.2, 3.6, 4.0, 4.4])
    assert rule({0: 1.0, 4: 1.4}, 6) == pytest.approx([1 + k / 10 for k in range(7)])  # one drafting point: through plain's
    assert rule({0: 1.0, 1: 1.1, 4: 2.0, 8: 6.0}, 8)[6] == pytest.approx(4.0)  # local: convex times are followed
    assert rule({0: 1.0, 4: 2.0, 5: 1.5}, 7)[6:] == [1.5, 1.5]  # a longer pass is no faster than the largest
    assert rule({0: 1.0, 4: 2.0, 5: 4.0}, 5)[1:4] == [1.0, 1.0, 1.0]  # below the smallest: >= V(0)
    assert rule({0: 1.0, 8: 3.0}, 4) is None and rule({0: 1.0}, 4) is None and rule({1: 1.0, 3: 4.0}, 4) is None
    policy = AutoK(8)  # AutoK's estimate of an untimed k is the rule's
    for k, t in ((4, 2.4), (0, 1.0), (2, 2.0), (8, 4.0)):
        policy.update(drafted=k, accepted=0, tested=min(1, k), seconds=99.0)  # the warm-up round, not timed
        policy.update(drafted=k, accepted=0, tested=min(1, k), seconds=t)
    assert policy.V == rule({0: 1.0, 2: 2.0, 4: 2.4, 8: 4.0}, 8)


class _Alternating:
    """A policy written outside the package: max_k, then plain, in turn; it keeps every update."""

    def __init__(self, max_k: int):
        self.max_k, self.updates, self.started = max_k, [], []

    def choose(self) -> int:
        return self.max_k if len(self.updates) % 2 == 0 else 0

    def update(self, *, drafted, accepted, tested, seconds):
        self.updates.append(dict(drafted=drafted, accepted=accepted, tested=tested, seconds=seconds))

    def plain_run(self) -> int:
        return 0  # every round goes through the loop's round, where choose() decides

    def state(self) -> dict:
        return {"policy": "alternating", "rounds": len(self.updates)}

    wants_seed = True

    def start(self, *, V=None, anchors=None, acceptance=None):
        self.started.append(len(self.updates))

    def learned(self):
        return None


def test_the_loop_sees_a_policy_only_through_the_protocol(table_lm):
    from moespec.engine.decode import generate

    assert all(isinstance(p, Policy) for p in (FixedK(2), AutoK(2), _Alternating(2)))
    target, draft = table_lm(48, seed=1), table_lm(48, seed=2)
    policy = _Alternating(3)
    out = generate(target, [1, 2, 3], draft=draft, k=policy, max_new_tokens=24, warm_start="timed")
    assert policy.started == [0]  # the warm start, before the first round
    s, ups = out.stats, policy.updates
    assert s.k_per_round == tuple(3 if i % 2 == 0 else 0 for i in range(s.rounds)) and len(ups) == s.rounds
    budgets = [24 - sum(s.tokens_per_round[:i]) - 1 for i in range(s.rounds)]  # a round never runs past the budget
    assert [u["drafted"] for u in ups] == [min(k, b) for k, b in zip(s.k_per_round, budgets)]
    assert sum(u["accepted"] for u in ups) == s.accepted and sum(u["tested"] for u in ups) == sum(s.reached_by_position)
    assert ups[0]["seconds"] is None and all(u["seconds"] > 0 for u in ups[1:])  # the first round is no step
    assert s.policy == {"policy": "alternating", "rounds": s.rounds, "warm_start": s.policy["warm_start"]}


def test_probes_of_costly_drafts_lose_at_most_their_share_of_plain_time():
    """A pass of two tokens costing 3.4 one-token passes and each draft step 0.7 (the shape of the
    trained pair on llama.cpp): over 400 rounds at acceptance 0.7, where plain decoding is best, the
    probes' expected loss V(k) - G_0.7(k) V(0) stays within PROBE_SHARE of the plain rounds' time
    (the doubling wait alone loses 7.6% here), and probes still happen (drafting is never locked out)."""
    V = [1.0, 3.4, 4.1, 4.8, 5.5, 6.2, 6.9, 7.6, 8.3]
    policy, rng = AutoK(8, V=V), np.random.default_rng(3)
    policy.set_acceptance([0.7] * 8)
    chosen = [_round(policy, rng, 0.7, V) for _ in range(400)]
    G = lambda k: sum(0.7 ** i for i in range(k + 1))  # noqa: E731
    loss = sum(V[k] - G(k) * V[0] for k in chosen if k)
    assert best_draft_length(V, F(7, 10)) == 0 and sum(k > 0 for k in chosen) >= 3
    assert loss <= 0.03 * V[0] * chosen.count(0), (loss, chosen.count(0))  # PROBE_SHARE, documented as 3%


def test_a_probes_cost_holds_the_proposers_catch_up():
    """Plain decoding best (V(1) = 1.5 V(0), acceptance 0.25 at every position): the probe of k = 1 is
    due after max(4, (V(1) - E(1) V(0) + C) / (0.03 V(0))) plain rounds, E(1) = 1.25: 8.33 rounds with
    no catch-up (C = 0), 41.67 with a catch-up of one plain round (C = V(0))."""
    V = [1.0, 1.5, 2.5, 3.5]
    for catch_up, due in ((0.0, 9), (1.0, 42)):
        policy = AutoK(3, V=V)
        policy.set_acceptance([0.25] * 3)
        policy.catch_up_s = catch_up
        assert policy.plain_run() == due
        chosen = []
        for _ in range(due + 1):
            chosen.append(policy.choose())
            policy.update(drafted=chosen[-1], accepted=0, tested=min(chosen[-1], 1), seconds=None)
        assert chosen == [0] * due + [1], (catch_up, chosen)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(1e-4, 1e-2), st.booleans()), min_size=1, max_size=40),
       st.lists(st.one_of(st.none(), st.floats(1e-4, 1e-2)), max_size=30))
def test_a_run_of_plain_rounds_updates_as_one_update_each(history, run):
    # two policies after the same history (drafting and plain rounds); then one takes the run of plain
    # rounds one `update` at a time, the other in one `update_plain`: the same estimates and choices
    a, b = AutoK(max_k=3), AutoK(max_k=3)
    for k, seconds, timed in history:
        for p in (a, b):
            p.update(drafted=k, accepted=k // 2, tested=k, seconds=seconds if timed else None)
    for s in run:
        a.update(drafted=0, accepted=0, tested=0, seconds=s)
    b.update_plain(run)
    assert a.state() == b.state() and a.choose() == b.choose() and a.plain_run() == b.plain_run()
    assert (a.since_draft, a.since_plain, a._wait, a._warm) == (b.since_draft, b.since_plain, b._wait, b._warm)
