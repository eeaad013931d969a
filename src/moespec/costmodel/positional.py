"""Acceptance by draft position and the answer it gives for one draft (issue 50; cost-model paper Sec. 1, 3, App. B).

Terms. A round at draft length k offers positions 1..k; position j is *at risk* when drafts 1..j-1
were accepted, and alpha_j = P(draft j accepted | position j at risk) is the conditional acceptance
(a short or empty proposal counts as a rejection at the first position it left out: that is what
tokens per round see). The engine paper's "acceptance at position j" (Sec. 5, accepted/drafted) is
the unconditional prod_{i<=j} alpha_i when every round drafts k tokens.

E(k) = 1 + sum_{j=1..k} prod_{i<=j} alpha_i, the expected tokens a round commits (its accepted
drafts plus the one recovered or bonus token). With alpha_i = a for every i it is the paper's
G_a(k) = 1 + a + ... + a^k (Sec. 1): the geometric model is the case of constant alpha.

V_hat(k) = tau_hat(k + 1) + h_hat(k): the target's pass of k + 1 tokens plus the draft's own cost.
A drafter whose proposal may come short (prompt lookup, llama.cpp's n-gram rules: nothing where no
match is found) verifies 1 + L_k tokens, L_k = min(L, k) its proposal's length at k, so its pass
costs in expectation tau_bar(k) = tau(1) + sum_{j=1..k} s_j (tau(j + 1) - tau(j)), s_j = P(L >= j) the
share of rounds offering position j whose proposal reached it (`expected_pass_times`); a draft
model always proposes k (s_j = 1: tau_bar(k) = tau(k + 1), the paper's V(k)).
k_hat* = the smallest argmax of E(k)/V_hat(k), the speedup E(k_hat*) V_hat(0) / V_hat(k_hat*)
(eq. (9) with E for G_a); k_hat* = 0 is the verdict "decode plainly". Where the timing that priced
the rounds says how far V(k)/V(0) moved over its course, a k that beats plain decoding by less than
that ties it, and k_hat* is taken over the others (`paying`): the paper's argmax, over lengths whose
gain is not inside the price's own noise.

Exact on int/Fraction counts and times (no float is taken) except the intervals, which are Wilson
score intervals (floats, 95% by default, one per position, not simultaneous), and the band's
bootstrap over prompts (`band.prompt_bootstrap_band`): rounds of one prompt are not independent (a lookup
finds matches in a text that repeats itself, none in the next), so where the counts of each prompt
are kept the band is the wider of the Wilson band and a 95% percentile band over prompts resampled.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Sequence

from moespec.costmodel.band import speedup_band
from moespec.costmodel.bounds import speedup_bounds
from moespec.costmodel.settings import draft_probability_floor
from moespec.costmodel.theory import check_step_times, exact_div, is_exact

Z_95 = 1.959963984540054  # the standard normal's 97.5% quantile: a two-sided 95% interval
PLAINLY = "decode plainly"
SPECULATE = "speculate"


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (Wilson 1927); (0, 1) when trials = 0."""
    if trials < 0 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes ({successes}) <= trials ({trials})")
    if trials == 0:
        return 0.0, 1.0
    p, n = successes / trials, trials
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def counts_from_rounds(tokens_per_round: Sequence[int], k_per_round: Sequence[int], *, max_new_tokens: int,
                       kmax: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(at_risk, accepted), each [kmax], from one call's rounds (`engine.stats.Stats` fields).

    Round r offered k_r = min(chosen_r, tokens left - 1) positions (the engine's budget cap) and
    accepted tokens_r - 1 drafts; position j is at risk in it when j <= k_r and drafts 1..j-1 were
    accepted. A round an EOS cut short counts the drafts it kept.
    """
    if len(tokens_per_round) != len(k_per_round):
        raise ValueError(f"{len(tokens_per_round)} token counts for {len(k_per_round)} draft lengths; "
                         "give one per round")
    at_risk, accepted = [0] * kmax, [0] * kmax
    done = 0
    for tokens, chosen in zip(tokens_per_round, k_per_round):
        k = min(chosen, max_new_tokens - done - 1, kmax)
        kept = tokens - 1
        for j in range(min(k, kept + 1)):  # position j + 1 is at risk while drafts 1..j were kept
            at_risk[j] += 1
            accepted[j] += j < kept
        done += tokens
    return tuple(at_risk), tuple(accepted)


def offered_from_rounds(k_per_round: Sequence[int], tokens_per_round: Sequence[int], *, max_new_tokens: int,
                        kmax: int) -> tuple[int, ...]:
    """[kmax] the rounds that offered position j: k_r = min(chosen_r, tokens left - 1, kmax) >= j (the
    engine's budget cap, as in `counts_from_rounds`). With the rounds' proposals by position
    (`engine.stats.Stats.drafted_by_position`) it gives s_j, the share of offers a proposal reached."""
    offered, done = [0] * kmax, 0
    for tokens, chosen in zip(tokens_per_round, k_per_round):
        for j in range(min(chosen, max_new_tokens - done - 1, kmax)):
            offered[j] += 1
        done += tokens
    return tuple(offered)


@dataclass(frozen=True)
class PositionalAcceptance:
    """Counts by position and what follows from them. at_risk, accepted: [kmax] ints. offered, drafted:
    [kmax] ints or None: the rounds that offered position j and those whose proposal reached it (None:
    not counted, read as a proposer that always drafts k, s_j = 1)."""

    at_risk: tuple[int, ...]
    accepted: tuple[int, ...]
    z: float = Z_95
    offered: tuple[int, ...] | None = None
    drafted: tuple[int, ...] | None = None

    def __post_init__(self):
        if len(self.at_risk) != len(self.accepted):
            raise ValueError(f"at_risk has {len(self.at_risk)} positions, accepted {len(self.accepted)}; "
                             "give both [kmax]")
        for j, (n, a) in enumerate(zip(self.at_risk, self.accepted), 1):
            if not 0 <= a <= n:
                raise ValueError(f"position {j}: accepted {a} must lie in 0..at_risk ({n})")
        if (self.offered is None) != (self.drafted is None):
            raise ValueError("give offered and drafted together, or neither")
        for j, (n, d) in enumerate(zip(self.offered or (), self.drafted or ()), 1):
            if not 0 <= d <= n:
                raise ValueError(f"position {j}: drafted {d} must lie in 0..offered ({n})")
        if self.offered is not None and not len(self.offered) == len(self.drafted) == len(self.at_risk):
            raise ValueError(f"offered and drafted need {len(self.at_risk)} positions, as at_risk has")

    @property
    def kmax(self) -> int:
        return len(self.at_risk)

    @property
    def alpha(self) -> tuple[Fraction, ...]:
        """[kmax] accepted/at_risk, exact; 0 where a position was never at risk (an earlier alpha is then 0
        or the data stop there: the interval says (0, 1))."""
        return tuple(Fraction(a, n) if n else Fraction(0) for a, n in zip(self.accepted, self.at_risk))

    @property
    def draft_share(self) -> tuple[Fraction, ...]:
        """[kmax] s_j = drafted/offered, exact: the share of rounds offering position j whose proposal
        reached it; 1 where not counted or never offered (a proposer that always drafts k)."""
        if self.offered is None:
            return (Fraction(1),) * self.kmax
        return tuple(Fraction(d, n) if n else Fraction(1) for d, n in zip(self.drafted, self.offered))

    @property
    def intervals(self) -> tuple[tuple[float, float], ...]:
        """[kmax] Wilson intervals of alpha_j (level from z: 95% by default)."""
        return tuple(wilson_interval(a, n, self.z) for a, n in zip(self.accepted, self.at_risk))

    @property
    def geometric(self) -> Fraction:
        """The geometric fit a = sum accepted / sum at risk: the MLE when every alpha_j = a (Sec. 4)."""
        n = sum(self.at_risk)
        return Fraction(sum(self.accepted), n) if n else Fraction(0)

    def to_dict(self) -> dict:
        d = {"at_risk": list(self.at_risk), "accepted": list(self.accepted), "z": self.z,
             "alpha": [float(a) for a in self.alpha], "intervals": [list(i) for i in self.intervals],
             "geometric": float(self.geometric)}
        if self.offered is not None:
            d.update(offered=list(self.offered), drafted=list(self.drafted),
                     draft_share=[float(x) for x in self.draft_share])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "PositionalAcceptance":
        counted = d.get("offered") is not None
        return cls(at_risk=tuple(d["at_risk"]), accepted=tuple(d["accepted"]), z=d.get("z", Z_95),
                   offered=tuple(d["offered"]) if counted else None, drafted=tuple(d["drafted"]) if counted else None)


def pooled(parts: Sequence[PositionalAcceptance]) -> PositionalAcceptance:
    """The counts of several calls (prompts) added position by position; all must share kmax. The
    proposals' counts are pooled where every part has them, else left out."""
    if not parts or len({p.kmax for p in parts}) != 1:
        raise ValueError(f"pool needs one or more counts of one kmax, got kmax {[p.kmax for p in parts]}")
    add = lambda rows: tuple(map(sum, zip(*rows)))  # noqa: E731
    counted = all(p.offered is not None for p in parts)
    return PositionalAcceptance(at_risk=add(p.at_risk for p in parts), accepted=add(p.accepted for p in parts),
                                z=parts[0].z, offered=add(p.offered for p in parts) if counted else None,
                                drafted=add(p.drafted for p in parts) if counted else None)


def check_alpha(alpha: Sequence) -> list:
    """alpha_1..alpha_kmax as a list, each checked to lie in [0, 1]."""
    alpha = list(alpha)
    for j, a in enumerate(alpha, 1):
        if isinstance(a, bool) or not 0 <= a <= 1:
            raise ValueError(f"alpha_{j} = {a!r} must be a number in [0, 1]")
    return alpha


def expected_tokens_positional(alpha: Sequence, k: int):
    """E(k) = 1 + sum_{j<=k} prod_{i<=j} alpha_i; G_a(k) when every alpha_i = a. Exact on Fractions."""
    alpha = check_alpha(alpha)
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= len(alpha):
        raise ValueError(f"draft length k = {k!r} must be an int in 0..{len(alpha)} (the positions given)")
    total, survive = 1, 1
    for a in alpha[:k]:
        survive = survive * a
        total = total + survive
    return total


def draft_step_times(tau: Sequence, h: Sequence) -> list:
    """V_hat(k) = tau_hat(k + 1) + h_hat(k) for k = 0..kmax. tau: [kmax + 1], tau[k] the target's pass
    of k + 1 tokens; h: [kmax + 1], h[k] the draft's cost of a round at k (h[0] = 0: nothing proposed)."""
    if len(tau) != len(h):
        raise ValueError(f"tau has {len(tau)} entries and h {len(h)}; give both for k = 0..kmax")
    for k, x in enumerate(h):
        if x < 0:
            raise ValueError(f"draft cost h({k}) = {x} must be >= 0")
    return check_step_times([t + x for t, x in zip(tau, h)])


def expected_pass_times(tau: Sequence, share: Sequence) -> list:
    """tau_bar(k) = tau(1) + sum_{j<=k} s_j (tau(j + 1) - tau(j)), k = 0..kmax: the expected pass of a
    round at k whose proposal reaches position j with chance s_j (module docstring). tau: [kmax + 1],
    tau[k] the pass of k + 1 tokens; share: [>= kmax] s_1..s_kmax in [0, 1]. Exact on Fractions;
    tau itself where every s_j = 1 (written as tau(k + 1) less the passes' growth left undrafted).
    The same expectation of any cost of a round that grows with its proposal's length (the drafting
    and the engine's time per round: `chain.candidate_answer.predict_candidate`)."""
    kmax = len(tau) - 1
    if len(share) < kmax:
        raise ValueError(f"tau goes to kmax = {kmax} but only {len(share)} draft shares were given")
    for j, x in enumerate(share[:kmax], 1):
        if isinstance(x, bool) or not 0 <= x <= 1:
            raise ValueError(f"draft share s_{j} = {x!r} must be a number in [0, 1]")
    out, undrafted = [tau[0]], 0
    for j in range(1, kmax + 1):
        undrafted = undrafted + (1 - share[j - 1]) * (tau[j] - tau[j - 1])
        out.append(tau[j] - undrafted)
    return out


def proposal_lengths(share: Sequence, k: int) -> list:
    """P_k(j), j = 0..k: the chance a round at draft length k proposes exactly j tokens, from the draft
    shares s_j = P(L >= j) (s_0 = 1): s_j - s_{j+1} below k, s_k at k (the proposal is cut at k)."""
    s = [1, *share[:k]]
    if len(s) < k + 1:
        raise ValueError(f"a round at k = {k} needs {k} draft shares, got {len(share)}")
    return [s[j] - s[j + 1] for j in range(k)] + [s[k]]


def steady_round_times(warm: Sequence, cold: Sequence, plain, extra: Sequence, share: Sequence) -> list:
    """V(k), k = 0..kmax, of rounds as a run of decoding at one draft length meets them
    (`bench.target_passes`): V(k) = P_k(0) plain + sum_{j>=1} P_k(j) [pass_k(j + 1) + extra(j)], where
    a round that proposes nothing is a plain step (the engine runs those as plain greedy steps), and the
    pass of j + 1 tokens is warm when the round before verified as many and cold otherwise, rounds taken
    as independent: pass_k(m) = P_k(m - 1) warm(m) + (1 - P_k(m - 1)) cold(m). A draft model always
    proposes k (s_j = 1): V(k) = warm(k + 1) + extra(k). warm, cold: [kmax + 1], index n - 1 the pass of
    n tokens; extra: [kmax + 1], extra[j] the drafting and the engine's time of a round that proposed j
    (extra[0] unused). Exact on Fractions."""
    kmax = len(warm) - 1
    if len(cold) != kmax + 1 or len(extra) != kmax + 1:
        raise ValueError(f"warm has {len(warm)} pass sizes, cold {len(cold)} and extra {len(extra)}; give one "
                         "per n = 1..kmax + 1")
    out = []
    for k in range(kmax + 1):
        p = proposal_lengths(share, k)
        out.append(p[0] * plain + sum(p[j] * (p[j] * warm[j] + (1 - p[j]) * cold[j] + extra[j])
                                      for j in range(1, k + 1)))
    return check_step_times(out)


def ratios(V: Sequence, alpha: Sequence) -> list:
    """[kmax + 1] E(k)/V(k), tokens per unit time at each k (exact on exact inputs)."""
    V = check_step_times(V)
    if len(alpha) < len(V) - 1:
        raise ValueError(f"V has {len(V)} entries (kmax = {len(V) - 1}) but only {len(alpha)} alphas")
    return [exact_div(expected_tokens_positional(alpha, k), v) for k, v in enumerate(V)]


def best_of(r: Sequence, allowed: Sequence[int] | None = None) -> int:
    """k_hat* = the smallest k in `allowed` (default 0..kmax) maximizing r(k) = E(k)/V(k)."""
    ks = range(len(r)) if allowed is None else allowed
    return max(ks, key=lambda k: (r[k], -k))


def paying(r: Sequence, price_high: Sequence = (), allowed: Sequence[int] | None = None) -> list[int]:
    """The draft lengths in `allowed` (default 0..kmax) k̂* may be: 0, and each k >= 1 whose rate beats
    plain decoding's by more than its price could have risen, r(k) > r(0) price_high[k]
    (`chain.candidate_answer.price_noise`: the most V(k)/V(0) rose over the timing's blocks; every k
    where none is given).
    A draft length that pays only inside the price's own noise ties plain decoding, and plain decoding
    is what then runs: it needs no draft and spends nothing on one."""
    ks = list(range(len(r)) if allowed is None else allowed)
    return [k for k in ks if k == 0 or not price_high or r[k] > r[0] * price_high[k]]


def shortest_paying(r: Sequence, allowed: Sequence[int] | None = None) -> int:
    """n-min: the shortest j >= 1 in `allowed` (default 1..kmax) with r(j) = E(j)/V(j) > r(0) = 1/V(0)
    (eq. (8) with E for G_a); 0 when none pays."""
    ks = range(1, len(r)) if allowed is None else [j for j in allowed if j >= 1]
    return next((j for j in ks if r[j] > r[0]), 0)


def best_draft_length_positional(V: Sequence, alpha: Sequence) -> int:
    """k_hat* = the smallest k in 0..kmax maximizing E(k)/V(k)."""
    return best_of(ratios(V, alpha))


def shortest_paying_draft_positional(V: Sequence, alpha: Sequence) -> int:
    """n-min: the shortest j >= 1 with E(j)/V(j) > 1/V(0) (eq. (8) with E for G_a); 0 when none pays."""
    return shortest_paying(ratios(V, alpha))


def plain(x):
    """A Fraction as a float for JSON; other numbers unchanged."""
    return float(x) if isinstance(x, Fraction) else x


@dataclass(frozen=True)
class PositionalAnswer:
    """The answer for one candidate: k_hat*, its speedup and band, and the figures behind them.

    expected: [kmax + 1] E(k); geometric: [kmax + 1] G_a(k) at the geometric fit a; step_times:
    [kmax + 1] V_hat(k); speedup: E(k_hat*) V_hat(0) / V_hat(k_hat*); speedup_low/high: the band of
    the true best speedup (`answer`); low_by_k/high_by_k: the band of the speedup at each k itself, the
    one a user running k_hat* meets; n_min, p_min: the settings from this V_hat (`costmodel.settings`).
    """

    k_star: int
    speedup: float
    speedup_low: float
    speedup_high: float
    expected: tuple
    geometric: tuple
    step_times: tuple
    n_min: int
    p_min: float
    price_low: tuple = ()  # [kmax + 1] how far V(k)/V(0) fell and rose over the timing's blocks (`answer`)
    price_high: tuple = ()
    low_by_k: tuple = ()  # [kmax + 1] the band of the speedup at each k itself (1 at k = 0: plain decoding)
    high_by_k: tuple = ()

    @property
    def verdict(self) -> str:
        return PLAINLY if self.k_star == 0 else SPECULATE

    @property
    def ties(self) -> list[int]:
        """Where the answer decodes plainly, the k >= 1 whose predicted gain lies inside how far the price
        of its rounds moved (`paying`); [] otherwise."""
        r = [e / v for e, v in zip(self.expected, self.step_times)]
        return [k for k, f in enumerate(self.price_high) if k and self.k_star == 0 and r[0] < r[k] <= r[0] * f]

    @property
    def tied(self) -> bool:
        return bool(self.ties)

    def to_dict(self) -> dict:
        d = {k: [plain(x) for x in v] if isinstance(v, tuple) else plain(v) for k, v in asdict(self).items()}
        return {**d, "verdict": self.verdict}

    @classmethod
    def from_dict(cls, d: dict) -> "PositionalAnswer":
        names = cls.__dataclass_fields__.keys()
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in names})


def expected_by_k(acceptance: PositionalAcceptance, kmax: int, at_k: Sequence[PositionalAcceptance] = (),
                  exact: bool = True) -> tuple[list, list, list]:
    """([kmax + 1] E(k), and E(k) at the low and high ends of the alphas' Wilson intervals): from the
    counts at kmax, or with `at_k` ([>= kmax] counts of the run at each k) from the run at k itself."""
    rows = [at_k[k - 1] if at_k else acceptance for k in range(1, kmax + 1)]
    point, low, high = [1], [1.0], [1.0]
    for k, c in enumerate(rows, 1):
        alpha = c.alpha[:k] if exact else [float(a) for a in c.alpha[:k]]
        lows, highs = zip(*c.intervals[:k])
        point.append(expected_tokens_positional(alpha, k))
        low.append(float(expected_tokens_positional(lows, k)))
        high.append(float(expected_tokens_positional(highs, k)))
    return point, low, high


def answer(V: Sequence, acceptance: PositionalAcceptance, *, delta=0,
           prompts: Sequence[PositionalAcceptance] = (), at_k: Sequence[PositionalAcceptance] = (),
           at_k_prompts: Sequence[Sequence[PositionalAcceptance]] = (), price_low: Sequence = (),
           price_high: Sequence = ()) -> PositionalAnswer:
    """k_hat*, its speedup and its band for one candidate, from V_hat(0..kmax) and its positional counts.

    The band holds the true best speedup T(k*)/T(0) when every alpha_j lies in its interval and every
    V_hat(k) within delta of the true V(k) (bounds (21)): [max_k E_low(k) V(0)/V(k) (1 - delta)/(1 + delta),
    max_k E_high(k) V(0)/V(k) (1 + delta)/(1 - delta)], E_low/E_high at the intervals' ends (E grows
    with every alpha_j). A bandwidth error eps gives delta = eps/(1 - eps) (`bounds.delta_from_eps`).
    prompts: the counts of each prompt (>= 2) whose pool is `acceptance`: the band then also spans
    `prompt_bootstrap_band`'s (the wider of the two ends each side), for the acceptance moves from one
    prompt to the next more than independent rounds would.
    at_k, at_k_prompts: the counts of the runs at each k = 1..kmax, pooled and per prompt
    (`bench.candidate.CandidateAcceptance.at_k`): E(k) and its band from the run at k itself.
    price_low, price_high: [kmax + 1] factors <= 1 and >= 1, how far V(k)/V(0) fell and rose over the
    blocks of the timing that priced the rounds (`chain.candidate_answer.price_noise`; none: the timing
    is taken as exact): k_hat* and n-min are then taken over the lengths that pay beyond that (`paying`), and the
    band spans it (its low end at V(k) price_high[k], its high end at V(k) price_low[k]). The band of the
    speedup at each k itself is kept beside (`PositionalAnswer.low_by_k`): the same ends at that k alone,
    the bootstrap's percentiles taken at that k (plain decoding's speedup is 1 exactly).
    """
    V = check_step_times(V)
    kmax = len(V) - 1
    if acceptance.kmax < kmax or (at_k and len(at_k) < kmax):
        raise ValueError(f"V_hat goes to kmax = {kmax} but the acceptance was counted to {acceptance.kmax} positions"
                         f"{f' and at {len(at_k)} draft lengths' if at_k else ''}")
    exact = all(is_exact(v) for v in V)
    E, E_low, E_high = expected_by_k(acceptance, kmax, at_k, exact)
    r = [exact_div(e, v) for e, v in zip(E, V)]
    allowed = paying(r, price_high)
    k_star = best_of(r, allowed)
    shrink, grow = speedup_bounds(delta)
    Vf = [float(v) for v in V]
    a = acceptance.geometric if exact else float(acceptance.geometric)
    low, high, low_k, high_k = speedup_band([Vf[0] / v / f for v, f in zip(Vf, price_high or [1] * len(Vf))],
                                            [Vf[0] / v / f for v, f in zip(Vf, price_low or [1] * len(Vf))],
                                            E_low, E_high, prompts, at_k_prompts[:kmax] if at_k else ())
    return PositionalAnswer(
        k_star=k_star, speedup=exact_div(E[k_star] * V[0], V[k_star]),
        speedup_low=float(low * shrink), speedup_high=float(high * grow),
        low_by_k=(1.0, *(float(x * shrink) for x in low_k[1:])),
        high_by_k=(1.0, *(float(x * grow) for x in high_k[1:])),
        expected=tuple(E),
        geometric=tuple(expected_tokens_positional([a] * kmax, k) for k in range(kmax + 1)),
        step_times=tuple(V), n_min=shortest_paying(r, allowed),
        p_min=draft_probability_floor(V) if kmax else 0,
        price_low=tuple(float(f) for f in price_low), price_high=tuple(float(f) for f in price_high),
    )
