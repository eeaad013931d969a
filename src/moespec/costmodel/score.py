"""Scoring a prediction against whole-model measurements: Tables 3, 4, 7 and the six rules of Table 8.

Cost-model paper, Sec. 4.2–4.4 and App. E. The measurement comes in as numbers: median verify times
τ_p(n) of both kernels, the 95% bootstrap interval of the saving S(n), the oracle-draft throughput
T(k, a) at each acceptance of the prediction's grid, and the measured step times V(k) of the scored
kernel. Definitions follow the paper:

- saving error: the largest |Ŝ(n) − S(n)| over n = 2..n_max (Table 3);
- crossover: the smallest n from which the saving's point estimate stays positive (Sec. 2);
- k* within one: acceptance values at which |k̂*(a) − k*(a)| <= 1, k* the measured best (Table 3);
- loss: 1 − T(k̂*, a) / T(k*, a) from the measured throughput (Table 4);
- verify-time error: the largest |τ̂_p(n) − τ_p(n)| / τ_p(n) over n = 2..n_max (Tables 4 and 7), on
  verify passes the prediction did not read; beside it the same error on the passes it read (in sample);
  and the part of the saving error the measurement's noise cannot explain: the largest distance of
  Ŝ(n) from the 95% interval of S(n), over τ_dedup(n). For the calibrated version, whose τ̂_slot is
  the measured one, τ̂_dedup(n) − τ_dedup(n) = S(n) − Ŝ(n): this is its verify-time error beyond noise;
- δ: the largest |V̂(k) − V(k)| / V(k) over k, the step-time error of (20)–(21) (Sec. 4.3);
- amplification: (M̂ᵉ_slot + M̂ᵉ_dedup) / |S(n)|, |S(n)| floored at 0.05 ms (Table 7);
- implied ε: the least ε whose band (18) covers every measured saving (Table 7);
- (20) and (21) with that δ, checked on the throughput G_a(k)/V(k) of the measured step times,
  and the oracle gap: the sweep's best speedup over the one those step times imply, minus 1.

The sweep's own noise: given bootstrap resamples of the measured throughput (the sweep's passes
drawn with replacement, `costmodel.sweep_cells.resample_throughput`), the count of k̂* within one, the
largest loss and the largest |oracle gap| are recomputed on each resample, k* included, and
reported with a 95% percentile interval; the *loss floor* is the 95th percentile of the largest loss that the measured
best k* itself shows on a resample, what an exact prediction of the measured staircase would be
charged for the sweep's noise alone.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from moespec.costmodel.bounds import speedup_bounds, step_time_delta, throughput_loss_bound
from moespec.costmodel.predict import Prediction, crossover
from moespec.costmodel.theory import best_draft_length, speedup
from moespec.kernel_names import COST_DEDUP, COST_SLOT

AMPLIFICATION_FLOOR = 5e-5  # seconds: Table 7 floors |S(n)| at 0.05 ms


@dataclass(frozen=True)
class ScoringRules:
    """The tolerances of Table 8, fixed before any speculative run is scored."""

    crossover_within: int = 1
    k_within_one_share: float = 9 / 11  # "k̂* within one at >= 9 of 11 values"
    loss_max: float = 0.06
    verify_max: float = 0.15

    def k_within_one_min(self, A: int) -> int:
        """The count of acceptance values, of A, that the k̂* rule needs (9 of the paper's 11)."""
        return math.ceil(self.k_within_one_share * A - 1e-9)


@dataclass(frozen=True)
class RuleVerdict:
    """One scoring rule of Table 8: its value on this measurement, its threshold and the verdict."""

    name: str
    threshold: float
    value: float
    passed: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RuleVerdict":
        return cls(name=str(d["name"]), threshold=float(d["threshold"]), value=float(d["value"]),
                   passed=bool(d["passed"]))


@dataclass(frozen=True)
class Score:
    """A prediction scored against one measurement. Seconds; lists over n are [n_max − 1] for
    n = 2..n_max, lists over a are [A] on the prediction's acceptance grid."""

    kernel: str
    version: str
    n: list[int]
    S_measured: list[float]
    saving_error_by_n: list[float]
    inside_band: list[bool]
    amplification: list[float]
    eps: float
    eps_implied: float
    crossover_predicted: int | None
    crossover_measured: int | None
    sign_points: int
    sign_agree: int
    tau_error: float  # out of sample: against verify passes the prediction did not read
    tau_error_dedup: float
    tau_error_in_sample: float  # against the verify passes the prediction read
    tau_error_dedup_in_sample: float
    saving_error_beyond_interval: float  # max over n of dist(Ŝ(n), [S_lo, S_hi]) / τ_dedup(n)
    acceptance: list[float]
    k_star_predicted: list[int]
    k_star_measured: list[int]
    loss: list[float]
    delta: float
    speedup_predicted: list[float]
    speedup_measured: list[float]
    speedup_inside: list[bool]
    loss_inside: list[bool]
    oracle_gap: list[float]
    rules: list[RuleVerdict]
    # the sweep's noise (`sweep_intervals`); None when scored without resamples
    resamples: int = 0
    k_within_one_interval: list[float] | None = None
    max_loss_interval: list[float] | None = None
    oracle_gap_interval: list[float] | None = None
    loss_floor: float | None = None

    @property
    def saving_error(self) -> float | None:
        """The largest saving error; None on an engine with one kernel (no measured saving)."""
        return max(self.saving_error_by_n, default=None)

    @property
    def inside_band_count(self) -> int:
        return sum(self.inside_band)

    @property
    def k_within_one(self) -> int:
        return sum(abs(p - m) <= 1 for p, m in zip(self.k_star_predicted, self.k_star_measured))

    @property
    def max_loss(self) -> float:
        return max(self.loss)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rules)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["summary"] = {"saving_error": self.saving_error, "inside_band": self.inside_band_count,
                        "k_within_one": self.k_within_one, "max_loss": self.max_loss, "passed": self.passed}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Score":
        unknown = set(d) - set(cls.__dataclass_fields__) - {"summary"}
        if unknown:
            raise ValueError(f"unknown Score keys {sorted(unknown)}; was it written by another moespec version?")
        kw = {k: d[k] for k in cls.__dataclass_fields__}
        kw["rules"] = [RuleVerdict.from_dict(r) for r in d["rules"]]
        return cls(**kw)


def _at(values: Mapping[Any, float], ns: Sequence[int], what: str) -> list[float]:
    """values[n] for each n, with JSON string keys accepted; a missing n names the fix."""
    got = {int(k): float(v) for k, v in values.items()}
    missing = [n for n in ns if n not in got]
    if missing:
        raise ValueError(f"{what} lacks pass sizes n = {missing}; measure every n = {ns[0]}..{ns[-1]}")
    return [got[n] for n in ns]


def crossover_distance(predicted: int | None, measured: int | None, n_max: int) -> int:
    """|ĉ − c| with "none" read as n_max + 1, so a crossover at n_max is within one of none (Table 8)."""
    none = n_max + 1
    return abs((none if predicted is None else predicted) - (none if measured is None else measured))


def implied_eps(error: Sequence[float], M_sum: Sequence[float]) -> float:
    """The least ε with ε/(1−ε)·(M̂ᵉ_slot + M̂ᵉ_dedup) >= |Ŝ(n) − S(n)| at every n, from (18)."""
    x = [e / m for e, m in zip(error, M_sum)]
    return max(xi / (1 + xi) for xi in x)


def _relative_errors(estimate: Sequence[float], true: Sequence[float]) -> list[float]:
    return [abs(e - t) / t for e, t in zip(estimate, true)]


def _speedups(V: Sequence[float], acceptance: Sequence[float]) -> np.ndarray:
    """[A, K]: G_a(k)V(0)/V(k), the speedup the measured step times imply at each a and k."""
    return np.array([[float(speedup(V, a, k)) for k in range(len(V))] for a in acceptance])


def _oracle_gaps(T: np.ndarray, k_meas: Sequence[int], s_V: np.ndarray) -> list[float]:
    """At each a: the sweep's speedup of k* over the one the measured step times imply, minus 1."""
    return [float(T[i, k] / T[i, 0] / s_V[i, k]) - 1 for i, k in enumerate(k_meas)]


def _draft_figures(prediction: Prediction, kernel: str, T: np.ndarray, V: list[float],
                   s_V: np.ndarray) -> dict[str, Any]:
    """k* from the sweep, the loss at k̂*, δ, the checks of (20)-(21) and the oracle draft's gap."""
    acceptance, k_hat, s_hat = prediction.acceptance, prediction.k_star[kernel], prediction.speedup[kernel]
    delta = float(step_time_delta(V, prediction.V[kernel]))
    k_meas = [int(np.argmax(row)) for row in T]  # argmax: the smallest maximizer
    # (20) and (21) are checked on the throughput the measured step times imply, where they are
    # theorems (Sec. 4.3); the sweep's gap to it is the oracle draft's own (App. E), reported apart.
    s_meas = [float(speedup(V, a, best_draft_length(V, a))) for a in acceptance]
    loss_V = [1 - float(speedup(V, a, kh)) / s for a, kh, s in zip(acceptance, k_hat, s_meas)]
    if delta < 1:
        (lo, hi), bound20 = map(float, speedup_bounds(delta)), float(throughput_loss_bound(delta))
    else:  # a step-time error of 100% or more leaves (20)-(21) nothing to say
        (lo, hi), bound20 = (0.0, math.inf), 1.0
    return dict(
        delta=delta, k_star_predicted=list(k_hat), k_star_measured=k_meas,
        loss=[float(1 - row[kh] / row[km]) for row, kh, km in zip(T, k_hat, k_meas)],
        speedup_predicted=list(s_hat), speedup_measured=s_meas,
        speedup_inside=[lo * (1 - 1e-12) <= sh / sm <= hi * (1 + 1e-12) for sh, sm in zip(s_hat, s_meas)],
        loss_inside=[x <= bound20 + 1e-12 for x in loss_V],
        oracle_gap=_oracle_gaps(T, k_meas, s_V),
    )


def _largest_gap(T: np.ndarray, k_meas: Sequence[int], s_V: np.ndarray) -> float:
    """The largest |oracle gap| over acceptance values with k* >= 1; s_V[a, k] the speedup from V."""
    return max((abs(g) for g, k in zip(_oracle_gaps(T, k_meas, s_V), k_meas) if k >= 1), default=0.0)


def sweep_intervals(k_hat: Sequence[int], k_meas: Sequence[int], T_resampled: Any, s_V: Any,
                    level: float = 0.95) -> dict[str, Any]:
    """The scored figures of the sweep on bootstrap resamples of its throughput.

    k_hat, k_meas: [A] predicted and measured best draft lengths; T_resampled: [B, A, K] resampled
    throughput; s_V: [A, K] speedups G_a(k)V(0)/V(k) of the measured step times (V is pooled over
    every acceptance, ~A times a cell's steps, and kept fixed). Each resample takes its own argmax
    k*. Returns the level-intervals of the count of k̂* within one, the largest loss and the
    largest |gap|, and the loss floor: the `level` quantile of the largest 1 - T(k*)/T(k*_b), the
    loss of the measured k* on resample b.
    """
    Tb = np.asarray(T_resampled, dtype=float)
    if Tb.ndim != 3 or Tb.shape[1:] != (len(k_hat), np.shape(s_V)[1]):
        raise ValueError(f"T_resampled has shape {Tb.shape}, expected [B, A, K] = [B, {len(k_hat)}, "
                         f"{np.shape(s_V)[1]}]")
    rows, s_V = np.arange(len(k_hat)), np.asarray(s_V, dtype=float)
    k_hat, k_meas = np.asarray(k_hat), np.asarray(k_meas)
    within, loss, gap, floor = [], [], [], []
    for T in Tb:
        kb = T.argmax(axis=1)
        best = T[rows, kb]
        within.append(int(np.sum(np.abs(k_hat - kb) <= 1)))
        loss.append(float(np.max(1 - T[rows, k_hat] / best)))
        floor.append(float(np.max(1 - T[rows, k_meas] / best)))
        gap.append(_largest_gap(T, kb, s_V))
    q = [(1 - level) / 2, (1 + level) / 2]
    interval = lambda x: [float(v) for v in np.quantile(x, q)]  # noqa: E731
    return dict(resamples=len(Tb), k_within_one_interval=interval(within), max_loss_interval=interval(loss),
                oracle_gap_interval=interval(gap), loss_floor=float(np.quantile(floor, level)))


def table8(rules: ScoringRules, *, n_max: int, A: int, crossover_predicted: int | None,
           crossover_measured: int | None, k_within_one: int, max_loss: float, sign_points: int,
           sign_agree: int, tau_error: float, speedup_inside: Sequence[bool],
           one_kernel: bool = False) -> list[RuleVerdict]:
    """The six scoring rules of Table 8, each with its value and verdict; on an engine with one
    kernel (`one_kernel`) the four that do not compare two kernels."""
    distance = crossover_distance(crossover_predicted, crossover_measured, n_max)
    k_min = rules.k_within_one_min(A)
    outside = len(speedup_inside) - sum(speedup_inside)
    pair = [
        RuleVerdict("crossover within one", rules.crossover_within, distance, distance <= rules.crossover_within),
        RuleVerdict(f"k* within one at >= {k_min} of {A} values", k_min, k_within_one, k_within_one >= k_min),
        RuleVerdict(f"loss at most {rules.loss_max:.0%} at every value", rules.loss_max, max_loss,
                    max_loss <= rules.loss_max),
        RuleVerdict("sign of S(n) where the interval excludes 0 (wrong signs)", 0, sign_points - sign_agree,
                    sign_agree == sign_points),
        RuleVerdict(f"verify time within {rules.verify_max:.0%}, {'the kernel' if one_kernel else 'both kernels'}",
                    rules.verify_max, tau_error, tau_error <= rules.verify_max),
        RuleVerdict("best speedup inside (21) (values outside)", 0, outside, outside == 0),
    ]
    return [r for r in pair if not one_kernel or not r.name.startswith(("crossover", "sign"))]


def score(prediction: Prediction, *, tau_slot: Mapping[Any, float] | None, tau_dedup: Mapping[Any, float],
          tau_slot_in_sample: Mapping[Any, float] | None, tau_dedup_in_sample: Mapping[Any, float],
          S_lo: Mapping[Any, float] | None, S_hi: Mapping[Any, float] | None, throughput: Any, V: Sequence[float],
          kernel: str = COST_DEDUP, S: Mapping[Any, float] | None = None, n_max: int | None = None,
          rules: ScoringRules = ScoringRules(), throughput_resamples: Any | None = None) -> Score:
    """Score `prediction` against a measurement (Tables 3, 4, 7; the rules of Table 8).

    tau_slot, tau_dedup: {n: verify time} with deduplication off / on, n = 2..n_max at least, from
        passes the prediction did not read (the held-out ones); they score τ̂ and give S(n).
    tau_slot_in_sample, tau_dedup_in_sample: the same from the passes the prediction read.
    S_lo, S_hi: {n: bounds of the 95% bootstrap interval of S(n)}, n = 2..n_max.
    throughput: [A, kmax+1] measured oracle-draft tokens per second with `kernel`, rows on
        prediction.acceptance, columns k = 0..prediction.kmax.
    V: [kmax+1] measured step times of `kernel`, V(k) = τ(k+1) + h(k).
    S: {n: point estimate of S(n)}; default τ_slot(n) − τ_dedup(n).
    n_max: largest pass size scored (8 where the engine runs one kernel at 9 either way).
    throughput_resamples: [B, A, kmax+1] bootstrap resamples of `throughput` (`sweep_intervals`).
    An engine that runs one kernel (llama.cpp groups every pass by expert) gives tau_slot,
    tau_slot_in_sample, S_lo and S_hi as None: there is no measured saving, so the saving's figures are
    empty, and of Table 8 the crossover and sign rules do not apply (they are left out).
    """
    ns = _scored_sizes(prediction, kernel, n_max)
    idx = [prediction.n.index(n) for n in ns]
    one = tau_slot is None  # one engine kernel: nothing to measure a saving against
    t_slot, t_dedup, S_meas, lo, hi = _measured_saving(ns, tau_slot, tau_dedup, S, S_lo, S_hi)
    T, V = _checked_sweep(prediction, throughput, V)

    S_hat = [prediction.S[i] for i in idx]
    c_pred, c_meas = crossover(ns, S_hat), None if one else crossover(ns, S_meas)
    sign_points, sign_agree = _sign_agreement(lo, hi, S_hat)
    tau = _verify_errors(prediction, idx, ns, t_slot, t_dedup, tau_slot_in_sample, tau_dedup_in_sample, one=one)
    s_V = _speedups(V, prediction.acceptance)
    draft = _draft_figures(prediction, kernel, T, V, s_V)
    noise = {}
    if throughput_resamples is not None:
        noise = sweep_intervals(draft["k_star_predicted"], draft["k_star_measured"], throughput_resamples, s_V)
    within = sum(abs(p - m) <= 1 for p, m in zip(draft["k_star_predicted"], draft["k_star_measured"]))
    verdicts = table8(rules, n_max=ns[-1], A=len(prediction.acceptance), crossover_predicted=c_pred,
                      crossover_measured=c_meas, k_within_one=within, max_loss=max(draft["loss"]),
                      sign_points=sign_points, sign_agree=sign_agree, tau_error=tau["tau_error"],
                      speedup_inside=draft["speedup_inside"], one_kernel=one)
    return Score(
        kernel=kernel, version=prediction.version, n=ns, eps=prediction.eps, crossover_predicted=c_pred,
        crossover_measured=c_meas, sign_points=sign_points, sign_agree=sign_agree, **tau,
        **_saving_figures(prediction, idx, S_hat, S_meas, lo, hi, t_dedup, one=one),
        acceptance=list(prediction.acceptance), rules=verdicts, **draft, **noise,
    )


def _measured_saving(ns: Sequence[int], tau_slot: Mapping[Any, float] | None, tau_dedup: Mapping[Any, float],
                     S: Mapping[Any, float] | None, S_lo: Mapping[Any, float] | None,
                     S_hi: Mapping[Any, float] | None) -> tuple[list[float], ...]:
    """(τ_slot, τ_dedup, S, S_lo, S_hi) at the scored sizes `ns`; all but τ_dedup empty where the
    engine runs one kernel (tau_slot None)."""
    if tau_slot is None:
        return [], _at(tau_dedup, ns, "tau_dedup"), [], [], []
    t_slot, t_dedup = _at(tau_slot, ns, "tau_slot"), _at(tau_dedup, ns, "tau_dedup")
    S_meas = [s - d for s, d in zip(t_slot, t_dedup)] if S is None else _at(S, ns, "S")
    return t_slot, t_dedup, S_meas, _at(S_lo, ns, "S_lo"), _at(S_hi, ns, "S_hi")


def _saving_figures(prediction: Prediction, idx: Sequence[int], S_hat: Sequence[float], S_meas: Sequence[float],
                    lo: Sequence[float], hi: Sequence[float], t_dedup: Sequence[float], *, one: bool) -> dict:
    """The saving figures of the Score (Tables 3 and 7): Ŝ's error against S, inside the band (18), the
    amplification M/|S|, the ε the errors imply, the largest error beyond the measured interval."""
    err = [abs(p - m) for p, m in zip(S_hat, S_meas)]
    M_sum = [prediction.M[COST_SLOT][i] + prediction.M[COST_DEDUP][i] for i in idx]
    return dict(
        S_measured=S_meas, saving_error_by_n=err,
        inside_band=[prediction.S_lo[i] <= s <= prediction.S_hi[i] for i, s in zip(idx, S_meas)],
        amplification=[m / max(abs(s), AMPLIFICATION_FLOOR) for m, s in zip(M_sum, S_meas)],
        eps_implied=None if one else implied_eps(err, M_sum),
        saving_error_beyond_interval=max((max(0.0, l - s, s - h) / t for s, l, h, t in zip(S_hat, lo, hi, t_dedup)),
                                         default=None),
    )


def _scored_sizes(prediction: Prediction, kernel: str, n_max: int | None) -> list[int]:
    """n = 2..n_max, the pass sizes scored; n_max defaults to the prediction's largest and may not pass it."""
    if kernel not in prediction.V:
        raise ValueError(f"kernel={kernel!r}; the prediction has step times for {sorted(prediction.V)}")
    n_max = prediction.n[-1] if n_max is None else int(n_max)
    if not 2 <= n_max <= prediction.n[-1]:
        raise ValueError(f"n_max={n_max} must lie in 2..{prediction.n[-1]}, the prediction's pass sizes")
    return list(range(2, n_max + 1))


def _checked_sweep(prediction: Prediction, throughput: Any, V: Sequence[float]) -> tuple[np.ndarray, list[float]]:
    """The measured throughput T [A, K] and step times V [K], checked against the prediction's
    acceptance grid (A values) and draft lengths k = 0..kmax (K = kmax + 1)."""
    T = np.asarray(throughput, dtype=float)
    A, K = len(prediction.acceptance), prediction.kmax + 1
    if T.shape != (A, K):
        raise ValueError(f"throughput has shape {T.shape}, expected [A, kmax+1] = {(A, K)} "
                         "(one row per acceptance of the prediction, one column per k = 0..kmax)")
    if not np.all(np.isfinite(T)) or np.any(T <= 0):
        raise ValueError(f"throughput must be finite positive tokens per second, got {T.tolist()}")
    V = [float(v) for v in V]
    if len(V) != K:
        raise ValueError(f"V has {len(V)} step times, the prediction {K} (k = 0..{K - 1})")
    return T, V


def _sign_agreement(lo: Sequence[float], hi: Sequence[float], S_hat: Sequence[float]) -> tuple[int, int]:
    """(points, agreeing): the sign rule counts only the n whose interval [lo, hi] of S(n) excludes 0,
    and there Ŝ(n) must have the same sign."""
    decided = [(1 if l > 0 else -1, s) for l, h, s in zip(lo, hi, S_hat) if l > 0 or h < 0]
    return len(decided), sum(sign * s > 0 for sign, s in decided)


def _verify_errors(prediction: Prediction, idx: Sequence[int], ns: Sequence[int], t_slot: Sequence[float],
                   t_dedup: Sequence[float], tau_slot_in_sample: Mapping[Any, float] | None,
                   tau_dedup_in_sample: Mapping[Any, float], *, one: bool) -> dict[str, float]:
    """The largest relative errors of τ̂_p(n), out of sample (t_slot, t_dedup) and in sample, over both
    kernels and over the deduplicating one; on an engine with one kernel (`one`) over that one alone."""
    dedup_hat = [prediction.tau[COST_DEDUP][i] for i in idx]
    err_slot = [] if one else _relative_errors([prediction.tau[COST_SLOT][i] for i in idx], t_slot)
    err_dedup = _relative_errors(dedup_hat, t_dedup)
    in_slot = [] if one else _relative_errors([prediction.tau[COST_SLOT][i] for i in idx],
                                              _at(tau_slot_in_sample, ns, "tau_slot_in_sample"))
    in_dedup = _relative_errors(dedup_hat, _at(tau_dedup_in_sample, ns, "tau_dedup_in_sample"))
    return dict(tau_error=max(err_slot + err_dedup), tau_error_dedup=max(err_dedup),
                tau_error_in_sample=max(in_slot + in_dedup), tau_error_dedup_in_sample=max(in_dedup))
