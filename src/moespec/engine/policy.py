"""Draft-length policies: how many tokens each round drafts (cost-model paper Sec. 1, 3.2-3.3, App. B.1).

A round that drafts k tokens commits E(k) = 1 + α_1 + α_1 α_2 + ... + α_1⋯α_k tokens on average,
α_i the acceptance at draft position i once the walk reached it (E(k) = G_a(k) when every α_i = a),
and takes V(k) seconds (k draft steps and a verify pass of k + 1 tokens). Its throughput is
E(k)/V(k); k = 0 is plain decoding, and k beats it exactly when the speedup condition (8) holds.

`Policy` is what the decode loop sees of a policy: `choose` before a round, `update` after it, and
the warm start's three members (`wants_seed`, `start`, `learned`). `FixedK` drafts the same k every
round. `AutoK` drafts the smallest maximizer of E(k)/V(k) over k = 0..max_k under estimates taken
from past rounds only (of this call, and of earlier calls when the same AutoK is passed again as
`generate(k=policy)`: its step times then need no new opening), so the committed tokens follow the
same law as at any fixed k: the choice changes how many tokens are drafted, never the law of those
committed (nor, under greedy decoding, the tokens).

AutoK's estimates and rules (every rule is deterministic, so a run can be repeated):
- α_i: each test of position i (the walk reached it) succeeds when its draft was accepted. Each
  drafting round first multiplies every position's successes s_i and tests n_i by
  2^(-1/half_life), so a test's weight halves in half_life = 16 drafting rounds and a drift of the
  text is followed within tens of rounds. Then α_i = (s_i + 2 α_{i-1}) / (n_i + 2) with α_0 = 1/2:
  the prior of a position is the estimate before it, worth two tests (Laplace's rule at the first
  round), so a position never tested equals the deepest tested one, and one with few recent tests
  (stale, or reached rarely) leans on it instead of freezing an old value. A warm start
  (`set_acceptance`) puts the α_i earlier calls of the same pair ended with in as prior_tests tests
  per position, decaying like the rest.
- V(k): the median of the last `window` (9) timed rounds that drafted k, robust to a stray slow
  round. The first round that drafts k is a warm-up and not timed (the first pass of a size
  allocates and warms caches; one slow time would make k look bad, and it would never be drafted
  again to correct it). A k never timed takes, given a seed V (e.g. a prediction artifact's step times), the seed
  times the median ratio measured/seed over the timed k (the seed gives the shape, the rounds the
  scale; a seed of stored times names its measured k, `anchors`, and only those set the scale);
  without a seed, `interpolate_step_times` of the timed medians (the one rule for V(k) between
  measured points, which the warm start's seeds follow too). Without a seed, an opening times one
  round at k_open = ceil(max_k / 2) and one plain round, so that the rule has its two points.
- exploration: a k never timed is drafted when its estimated throughput is the best, and is timed
  from its second round on, so each k is explored in about two rounds. Once `refresh` (32) rounds have passed without a timed
  plain round, a choice k >= 1 gives way to one plain round: V(0) is the bar "never slower than
  plain" compares against. While the choice is 0, a probe round drafts the best k >= 1 after
  `probe` (4) plain rounds, then after 8, 16, ... up to `refresh` as probes keep failing, and never
  sooner than its expected loss V(k) - E(k) V(0) + C is PROBE_SHARE (3%) of the plain rounds' time before
  it (a probe of a long draft where a two-token pass costs several one-token passes waits hundreds of
  rounds: benchmarks/llama_cpp_auto.py), C the seconds the proposer must first spend catching up
  (`catch_up_s`, set by the decode loop: a draft model's prefill of the prompt and of the tokens
  decoded since it last drafted, which no V(k) holds; at B = 1 on the trained pair it was 7-9 plain
  rounds), unless no k
  would pay even were every draft accepted ((k + 1) V(0) <= V(k) for every k): acceptance
  is only seen by drafting and a k's time only by timing it, the text may have become easier, and a
  slow first timing must not lock drafting out for long.
"""

from __future__ import annotations

import math
import sys
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Protocol, runtime_checkable

PROBE_SHARE = 0.03  # the most of plain decoding's time a probe's expected loss may take


def interpolate_step_times(measured: Mapping[int, float], max_k: int) -> list[float] | None:
    """V(0..max_k) from the step times measured at some k: the one rule for V(k) between and beyond
    measured points (AutoK's estimate, the store's seed and the timed seed all use it).

    A measured k keeps its time. The others lie on lines through measured drafting points (k >= 1):
    between two, the line through them; beyond the largest, the line through the two largest, never
    below the largest (a longer pass is no faster); below the smallest, the line through the two
    smallest, kept between V(0) and the smallest's time. Plain decoding's point (k = 0) enters a line
    only while a single drafting point is measured (then the line through it and plain's): a
    one-token pass is another regime, and a line from it spreads the jump to a two-token pass over
    every k (benchmarks/auto_k_warm.py: it underpriced short drafts, and a global line through every
    point overpriced long ones). None unless plain decoding's and one k >= 1 are measured.
    """
    measured = {k: t for k, t in measured.items() if 0 <= k <= max_k}
    drafting = sorted((k, t) for k, t in measured.items() if k >= 1)
    if 0 not in measured or not drafting:
        return None
    points = drafting if len(drafting) >= 2 else [(0, measured[0]), *drafting]
    (first, t_first), (last, t_last) = points[0], points[-1]

    def at(k: int) -> float:
        if k in measured:
            return measured[k]
        i = 1 if k < first else len(points) - 1 if k > last else next(j for j, (m, _) in enumerate(points) if m > k)
        (k0, t0), (k1, t1) = points[i - 1], points[i]
        t = t0 + (t1 - t0) / (k1 - k0) * (k - k0)
        if k > last:
            return max(t, t_last)
        return min(max(t, measured[0]), t_first) if k < first else t

    return [at(k) for k in range(max_k + 1)]


@dataclass(frozen=True)
class Learned:
    """What a policy measured in a call, for the warm start's store (`step_store.remember`)."""

    step_s: dict[int, float]  # {k: median seconds of the timed rounds that drafted k}, the k timed
    rounds: dict[int, int]  # {k: timed rounds behind step_s[k]}
    acceptance: tuple[float, ...] | None  # α_1..α_max_k at the end; None when no position was tested


@runtime_checkable
class Policy(Protocol):
    """What the decode loop calls on a draft-length policy; it knows no concrete one."""

    max_k: int  # the longest draft a round may ask for

    def choose(self) -> int:
        """The draft length of the next round, in 0..max_k, from past rounds only."""

    def update(self, *, drafted: int, accepted: int, tested: int, seconds: float | None) -> None:
        """After a round that drafted `drafted` tokens: the walk tested positions 1..tested and accepted
        1..accepted; seconds is the round's wall time, or None when the round is no step to time."""

    def plain_run(self) -> int:
        """How many coming rounds are plain (k = 0) whatever they measure, so that the loop may run
        them in one call to the backend (`SpecModel.greedy_steps`); 0 when the next round drafts."""

    def state(self) -> dict:
        """The policy and its estimates as plain JSON values (`Stats.policy`)."""

    @property
    def wants_seed(self) -> bool:
        """True when a warm start would help: it learns step times and has neither a seed nor a timed round."""

    def start(self, *, V: Sequence[float] | None = None, anchors: Sequence[int] | None = None,
              acceptance: Sequence[float] | None = None) -> None:
        """Before the first round: a warm start's seed of V(0..max_k) (anchors: its measured k) and
        remembered acceptances α_1..; None leaves that estimate cold."""

    def learned(self) -> Learned | None:
        """What this call measured, for the next call's warm start; None when it learns nothing."""


class FixedK:
    """Every round drafts k tokens (0 = plain decoding)."""

    def __init__(self, k: int):
        self.k = self.max_k = k

    def choose(self) -> int:
        return self.k

    def update(self, *, drafted: int, accepted: int, tested: int, seconds: float | None) -> None:
        """A fixed k learns nothing from its rounds."""

    def update_plain(self, seconds: Sequence[float | None]) -> None:
        """Nor from a run of plain rounds."""

    def plain_run(self) -> int:
        """Every round at k = 0; none at a k >= 1."""
        return sys.maxsize if self.k == 0 else 0

    def settled(self) -> int:
        """How many coming rounds choose the same k whatever they measure: all of them (a policy
        without `settled` is asked before every round at k >= 1)."""
        return sys.maxsize

    def state(self) -> dict:
        return {"policy": "fixed", "k": self.k}

    @property
    def wants_seed(self) -> bool:
        """False: a fixed k needs no step times."""
        return False

    def start(self, *, V=None, anchors=None, acceptance=None) -> None:
        """A fixed k takes no seed."""

    def learned(self) -> None:
        return None


class AutoK:
    """The cost-model policy: each round drafts argmax_k E(k)/V(k) under running estimates.

    max_k: the largest draft length. V: optional seed of the step times V(0..max_k) in seconds.
    prior: α_0, the prior of α_1 (prior_tests: the weight in tests of each position's prior).
    half_life: drafting rounds after which a test's weight in α_i has halved. window: timed rounds
    per k in the median. refresh: rounds between forced plain rounds, and the longest wait between
    probes while the choice is 0. probe: plain rounds before the first probe (doubling up to refresh).
    """

    def __init__(self, max_k: int = 8, V: Sequence[float] | None = None, *, prior: float = 0.5,
                 prior_tests: float = 2.0, half_life: float = 16.0, window: int = 9, refresh: int = 32,
                 probe: int = 4):
        if isinstance(max_k, bool) or not isinstance(max_k, int) or max_k < 0:
            raise ValueError(f"max_k must be an int >= 0, got {max_k!r}")
        V = None if V is None else _checked_seed(V, max_k)
        if not 0 <= prior <= 1 or prior_tests <= 0 or half_life <= 0 or window < 1 or not 1 <= probe <= refresh:
            raise ValueError(f"AutoK needs 0 <= prior <= 1, prior_tests, half_life, window > 0 and 1 <= probe <= "
                             f"refresh; got {prior}, {prior_tests}, {half_life}, {window}, {probe}, {refresh}")
        self.max_k, self.seed, self.prior, self.prior_tests = max_k, V, prior, prior_tests
        self.anchors: frozenset[int] | None = None  # the seed's measured k (`set_seed`); None: all give the shape
        self.decay = 2 ** (-1 / half_life)
        self.refresh, self.probe = refresh, probe
        self._wait = probe  # plain rounds before the next probe while the choice is 0
        self.k_open = (max_k + 1) // 2
        self.tests = [0] * (max_k + 1)  # [max_k + 1] tests of position i (index 0 unused)
        self._s = [0.0] * (max_k + 1)  # [max_k + 1] discounted successes of position i
        self._n = [0.0] * (max_k + 1)  # [max_k + 1] discounted tests of position i
        self.alpha = [prior] * (max_k + 1)  # [max_k + 1] α_i (index 0: the prior)
        self._times = [deque(maxlen=window) for _ in range(max_k + 1)]  # recent round seconds per k
        self._warm = [False] * (max_k + 1)  # k has had its warm-up round
        self._median: list[float | None] = [None] * (max_k + 1)
        self.timed = [0] * (max_k + 1)  # [max_k + 1] timed rounds per k
        self.V = self._step_times()  # [max_k + 1] estimated V(k), None until the opening is done
        self.since_plain = self.since_draft = 0
        self.catch_up_s = 0.0  # the proposer's catch-up before its next draft (the decode loop sets it)

    def choose(self) -> int:
        """The draft length of the next round, from the estimates alone."""
        if self.max_k == 0:
            return 0
        V = self.V
        if V is None:  # the opening: one timed round at k_open, then one plain round
            return self.k_open if not any(self.timed[1:]) else 0
        best, drafting = self._ranked(V)
        if best and self.since_plain >= self.refresh:
            return 0
        if not best and self.since_draft >= self._probe_wait(V, drafting):
            return drafting  # a probe of the best drafting k, due (`_probe_wait`)
        return best

    def _probe_wait(self, V: list, k: int) -> float:
        """Plain rounds before a probe of k while plain decoding is the choice: the doubling wait, and
        as many rounds as keep the probe's expected loss, V(k) - E(k) V(0) + catch_up_s, within
        PROBE_SHARE of their time; never (inf) when no k would pay were every draft accepted."""
        if all((j + 1) * V[0] <= V[j] for j in range(1, len(V))):
            return math.inf
        E, p = 1.0, 1.0
        for i in range(1, k + 1):
            p *= self.alpha[i]
            E += p
        return max(self._wait, (V[k] - E * V[0] + self.catch_up_s) / (PROBE_SHARE * V[0]))

    def _ranked(self, V: list) -> tuple[int, int]:
        """(the maximizer of E(k)/V(k) over 0..max_k, the maximizer over 1..max_k), the smallest on ties."""
        best, drafting, E, E_best, E_drafting, p = 0, 1, 1, 1, 0, 1
        for k in range(1, self.max_k + 1):
            p = p * self.alpha[k]
            E = E + p
            if E * V[best] > E_best * V[k]:  # E(k)/V(k) > E(best)/V(best), cross-multiplied
                best, E_best = k, E
            if E * V[drafting] > E_drafting * V[k]:
                drafting, E_drafting = k, E
        return best, drafting

    def plain_run(self) -> int:
        """While no k beats plain decoding, the rounds until the next probe is due: AutoK commits to
        plain decoding for them, so a plain round's time that would tip the choice to drafting takes
        effect at that probe, a few rounds later at most."""
        if self.max_k == 0:
            return sys.maxsize
        if self.V is None:
            return 0
        best, drafting = self._ranked(self.V)
        if best:
            return 0
        wait = self._probe_wait(self.V, drafting)
        return sys.maxsize if wait == math.inf else max(math.ceil(wait) - self.since_draft, 0)

    def update(self, *, drafted: int, accepted: int, tested: int, seconds: float | None) -> None:
        """After a round that drafted `drafted` tokens: the walk tested positions 1..tested and accepted
        1..accepted; seconds is the round's wall time, or None when the round is no step to time."""
        k = drafted
        if not 0 <= accepted <= tested <= k <= self.max_k:
            raise ValueError(f"update needs 0 <= accepted <= tested <= drafted <= max_k = {self.max_k}; "
                             f"got accepted={accepted}, tested={tested}, drafted={k}")
        if k:  # a drafting round: older tests weigh less, then this round's count
            m, alpha = self.prior_tests, self.alpha
            for i in range(1, self.max_k + 1):
                hit = i <= tested
                self.tests[i] += hit
                self._s[i] = self._s[i] * self.decay + (i <= accepted)
                self._n[i] = self._n[i] * self.decay + hit
                alpha[i] = (self._s[i] + m * alpha[i - 1]) / (self._n[i] + m)
        if k:  # a round chosen plain after this one waits longer for a probe if this one was a probe
            self._wait = min(2 * self._wait, self.refresh) if self.since_draft >= self._wait else self.probe
        self.since_draft = 0 if k else self.since_draft + 1
        self.since_plain = 0 if k == 0 and seconds is not None else self.since_plain + 1
        if seconds is not None and not self._warm[k]:
            self._warm[k] = True
        elif seconds is not None:
            self._times[k].append(seconds)
            self.timed[k] += 1
            self._median[k] = median(self._times[k])
            self.V = self._step_times()

    def update_plain(self, seconds: Sequence[float | None]) -> None:
        """`update` after each of a run of plain rounds (drafted 0; seconds as `update` takes them), V
        recomputed once at the end: the same state as an `update` per round, for only `choose` reads
        the estimates, between runs (a run of 64 rounds of ~0.5 ms paid 0.6 ms in updates)."""
        timed = False
        for s in seconds:
            self.since_draft += 1
            self.since_plain = 0 if s is not None else self.since_plain + 1
            if s is not None and not self._warm[0]:
                self._warm[0] = True
            elif s is not None:
                self._times[0].append(s)
                self.timed[0] += 1
                timed = True
        if timed:
            self._median[0] = median(self._times[0])
            self.V = self._step_times()

    @property
    def wants_seed(self) -> bool:
        """True while it drafts (max_k >= 1) and has neither a seed nor a timed round."""
        return self.max_k > 0 and self.seed is None and not any(self.timed)

    def start(self, *, V: Sequence[float] | None = None, anchors: Sequence[int] | None = None,
              acceptance: Sequence[float] | None = None) -> None:
        """A warm start: `set_seed(V, anchors)` and `set_acceptance(acceptance)`, each where given."""
        if V is not None:
            self.set_seed(V, anchors)
        if acceptance is not None:
            self.set_acceptance(acceptance)

    def set_seed(self, V: Sequence[float], anchors: Sequence[int] | None = None) -> None:
        """Seed the step times V(0..max_k) before any round is timed (a warm start, `engine.warm_start`).
        anchors: the k whose seed values are times measured on this machine (the rest filled in
        between them); only those set the scale of the untimed k (none timed yet: scale 1). None:
        every k's value gives the shape, as a prediction's do."""
        if any(self.timed):
            raise ValueError(f"set_seed seeds a policy before its rounds; this one has timed {sum(self.timed)} "
                             f"(pass the seed to a new AutoK(max_k, V=...))")
        self.seed = _checked_seed(V, self.max_k)
        self.anchors = None if anchors is None else frozenset(anchors)
        self.V = self._step_times()

    def set_acceptance(self, alpha: Sequence[float]) -> None:
        """Start from acceptances α_1..α_max_k remembered from earlier calls (a warm start,
        `engine.warm_start`): each position gets them as `prior_tests` tests, which decay as any test
        does, so this call's own rounds outweigh them within a few drafting rounds. Before any round."""
        if any(self.tests[1:]) or any(self.timed):
            raise ValueError("set_acceptance starts a policy before its rounds; this one has run some")
        alpha = [float(a) for a in alpha][: self.max_k]
        if not alpha or not all(0 <= a <= 1 for a in alpha):
            raise ValueError(f"alpha must give acceptances in [0, 1] for positions 1.., got {alpha!r}")
        alpha += [alpha[-1]] * (self.max_k - len(alpha))  # a deeper position: the deepest given
        for i, a in enumerate(alpha, start=1):
            self._s[i], self._n[i], self.alpha[i] = a * self.prior_tests, self.prior_tests, a

    def measured(self) -> dict[int, float]:
        """{k: the median seconds of the timed rounds that drafted k}, only the k timed so far."""
        return {k: m for k, m in enumerate(self._median) if m is not None}

    def learned(self) -> Learned:
        """The medians and their rounds per timed k, and α_1.. once some position was tested."""
        step_s = self.measured()
        tested = tuple(float(a) for a in self.alpha[1:]) if any(self.tests) else None
        return Learned(step_s, {k: self.timed[k] for k in step_s}, tested)

    def _step_times(self) -> list | None:
        """V(0..max_k): measured medians where timed, the scaled seed or `interpolate_step_times` elsewhere."""
        measured = self.measured()
        if self.seed is None:
            return interpolate_step_times(measured, self.max_k)
        if not measured:
            return list(self.seed)
        scaled = [m / self.seed[k] for k, m in measured.items() if self.anchors is None or k in self.anchors]
        scale = median(scaled) if scaled else 1.0
        return [measured.get(k, s * scale) for k, s in enumerate(self.seed)]

    def state(self) -> dict:
        """The estimates as plain JSON numbers: α_1..α_max_k, tests per position, V(0..max_k), timed rounds per k."""
        return {
            "policy": "auto",
            "max_k": self.max_k,
            "acceptance": [float(a) for a in self.alpha[1:]],
            "tests": self.tests[1:],
            "step_s": None if self.V is None else [float(v) for v in self.V],
            "timed_rounds": list(self.timed),
            "seeded": self.seed is not None,
        }


def record_plain_run(policy: Policy, seconds: Sequence[float | None]) -> None:
    """A run of plain rounds into `policy` (seconds as `update` takes them): its `update_plain` where it
    has one (`AutoK`: the estimates recomputed once), else an `update` per round."""
    own = getattr(policy, "update_plain", None)
    if own is not None:
        own(seconds)
        return
    for s in seconds:
        policy.update(drafted=0, accepted=0, tested=0, seconds=s)


def _checked_seed(V: Sequence[float], max_k: int) -> list[float]:
    V = list(V)
    if len(V) != max_k + 1 or not all(math.isfinite(v) and v > 0 for v in V):
        raise ValueError(f"V must give max_k + 1 = {max_k + 1} finite step times > 0 (V(0..max_k)), got {V!r}")
    return V


def make_policy(k: int | str | Policy, max_k: int = 8, step_times: Sequence[float] | None = None) -> Policy:
    """The policy for `generate(k=...)`: FixedK(k) for an int k >= 0, AutoK(max_k, step_times) for
    "auto", and a Policy instance (an AutoK) itself: it goes on from what it learned in earlier calls."""
    if isinstance(k, Policy):
        if step_times is not None:
            raise ValueError("step_times seeds a new policy; an AutoK passed as k keeps its own (AutoK(max_k, V=...))")
        return k
    if isinstance(k, str) and k == "auto":
        return AutoK(max_k, V=step_times)
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an int >= 0 (0 = plain decoding), an AutoK or \"auto\" (the cost-model "
                         f"policy), got {k!r}")
    if step_times is not None:
        raise ValueError(f"step_times seeds the policy of k=\"auto\"; with k={k} drop it or pass k=\"auto\"")
    return FixedK(k)
