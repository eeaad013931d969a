"""The prediction (22): whole-model verify times from the expert operation alone, and what follows.

Section 4 of the cost-model paper. Inputs are the operation times of each layer's experts on
windows of recorded routing (the fits (4)/(E.1) at each window's bytes for the *prediction*, the
measured medians for the *measured-time version*), the measured one-token time τ_meas(1) and h(k),
the time per step outside the verify pass. Nothing comes from a speculative run.

    τ̂_p(n) = τ_meas(1) + Σ_l ( t̄_{p,l}(n) − t̄_l(1) )                                  (22)

t̄_l(1) is the per-slot kernel's one-token time, because the engine runs that kernel at n = 1 with
deduplication off and on (the paper's one correction after comparing with measurements). The
*calibrated version* adds g(n), the growth with n of the time outside the expert operation, read
inside the per-slot verify passes (`_calibrate`); the *prediction-outside* version adds it to the
prediction from the outside terms timed alone (on llama.cpp D(n) + R_d(n)), so that it still reads no
whole-model time but τ_meas(1) (issue 51: on a CPU much of a pass's growth lies outside the experts). From τ̂ follow the saving Ŝ(n) with the band
of (18), the crossover (Sec. 2), V̂(k) = τ̂_p(k+1) + h(k), k̂*(a), the speedup and (20)–(21).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from moespec.costmodel.bounds import (
    best_draft_length_separated,
    delta_from_eps,
    faster_kernel_certain,
    saving_bound,
    speedup_interval,
)
from moespec.costmodel.steptime import step_times
from moespec.costmodel.theory import best_draft_length, check_positive, first_draft_threshold, speedup, step_points
from moespec.kernel_names import COST_AUTO, COST_DEDUP, COST_KERNELS, COST_SLOT

# The paper's grid (Sec. 4, App. D.2): 11 acceptance values from 0.2 to 0.98.
ACCEPTANCE_GRID = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98)
VERSIONS = ("prediction", "prediction-outside", "measured-time", "calibrated")
# Not a version of (22): what a candidates' answer names where none fitted and it priced its rounds with
# the target's timed passes alone (`chain.candidate_answer.base_passes`).
TIMED_PASSES = "timed-passes"
# The versions that add g(n) = o(n) − o(1), the growth of the pass outside the expert operation
# (`_calibrate`): the calibrated one (o(n) from or beside the verify passes) and the prediction with
# that term (o(n) timed alone by the characterization: still no whole-model time but τ_meas(1)).
OUTSIDE_VERSIONS = ("prediction-outside", "calibrated")
# The version a user's answer and settings read: the one closest to the machine that is available.
PREFERENCE = ("calibrated", "measured-time", "prediction-outside", "prediction")
# "auto" runs, at each pass size, the kernel that the prediction says is faster.
KERNELS = (*COST_KERNELS, COST_AUTO)


def loop_step_times(version: dict, kernel: str) -> list[float]:
    """A round at k as llama.cpp's compiled loop runs it with a draft that costs nothing: the pass τ̂(k + 1)
    alone, for k = 0..kmax of one predicted version's V̂. V̂(k) = τ̂(k + 1) + h(k) adds the time moespec's
    engine spends around the pass (the oracle's draft and the bookkeeping, timed by the base measurement),
    which llama-server does not spend; on a model whose pass takes a millisecond it is half a round."""
    return [float(t) for t in version["tau"][kernel][: len(version["V"][kernel])]]


def preferred_version(available, first: str | None = None) -> str | None:
    """The first of `first` (when given) and PREFERENCE that `available` holds, else None."""
    order = ([first] if first else []) + [v for v in PREFERENCE if v != first]
    return next((v for v in order if v in available), None)


class NonPositiveTime(ValueError):
    """An operation or predicted verify time <= 0: these inputs (a fit extrapolated below zero, say)
    cannot give this version, though nothing is malformed."""


def layer_means(t_op: Any) -> np.ndarray:
    """t̄_l: each layer's operation time averaged over its windows of recorded routing (22).

    t_op: [L, W] times in seconds (one row per layer, one column per window), or [L] if already
    averaged. Returns [L].
    """
    arr = np.asarray(t_op, dtype=float)
    if arr.ndim == 2:
        if arr.shape[1] == 0:
            raise ValueError(f"operation times of shape {arr.shape} hold no window; give >= 1 window per layer")
        arr = arr.mean(axis=1)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"operation times must have shape [L, W] or [L] with L >= 1, got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"operation times must be finite seconds, got {arr.tolist()}")
    if np.any(arr <= 0):
        raise NonPositiveTime(f"operation times must be positive seconds, got {arr.tolist()}")
    return arr


def _by_n(t_op: Mapping[Any, Any], what: str) -> dict[int, np.ndarray]:
    """{n: t̄_{p,l}(n) [L]} from a mapping pass size -> [L, W] times; JSON string keys accepted."""
    if not isinstance(t_op, Mapping):
        raise TypeError(f"{what} must map pass size n to [L, W] times, got {type(t_op).__name__}")
    out = {int(n): layer_means(t) for n, t in t_op.items()}
    sizes = {len(t) for t in out.values()}
    if len(sizes) > 1:
        raise ValueError(f"{what} has different layer counts per n: {sorted(sizes)}; give every layer at every n")
    return dict(sorted(out.items()))


def _operation_times(t_slot: Mapping[Any, Any], t_dedup: Mapping[Any, Any]) -> dict[str, dict[int, np.ndarray]]:
    """{"slot": {n: t̄_{slot,l}(n)}, "dedup": {n: t̄_{dedup,l}(n)}} for n = 1..n_max, each [L], checked.

    Where t_dedup has no n = 1, the one-token pass runs the per-slot kernel: t̄_{dedup,l}(1) = t̄_l(1).
    """
    slot, dedup = _by_n(t_slot, "t_slot"), _by_n(t_dedup, "t_dedup")
    n_max = max(slot, default=0)
    ns = list(range(1, n_max + 1))
    if n_max < 2 or list(slot) != ns:
        raise ValueError(f"t_slot has pass sizes {list(slot)}; give every n = 1..n_max (n_max >= 2), "
                         "n = 1 included for t̄_l(1)")
    if [n for n in dedup if n >= 2] != ns[1:]:
        raise ValueError(f"t_dedup has pass sizes {list(dedup)}; give every n = 2..{n_max} (as t_slot)")
    if len(dedup[2]) != len(slot[1]):
        raise ValueError(f"t_dedup has {len(dedup[2])} layers, t_slot {len(slot[1])}; give the same layers")
    dedup.setdefault(1, slot[1])
    return {COST_SLOT: slot, COST_DEDUP: dict(sorted(dedup.items()))}


def _calibrate(tau: dict[str, list[float]], ns: list[int], outside: Mapping[Any, float]) -> dict:
    """The calibrated version: add g(n) = o(n) − o(1) to both kernels' (22), o(n) the per-slot passes'
    time outside their experts modules (attention, dense layers, logits). It cancels in the saving."""
    o = {int(n): float(t) for n, t in outside.items()}
    missing = [n for n in ns if n not in o]
    if missing:
        raise ValueError(f"outside lacks n = {missing}; give o(n) at every n = 1..{ns[-1]}")
    g = [o[n] - o[1] for n in ns]
    return {p: [t + gi for t, gi in zip(tau[p], g)] for p in tau}


def crossover(n: Sequence[int], S: Sequence[float]) -> int | None:
    """The crossover (Sec. 2): the smallest pass size n >= 2 from which the saving S stays positive.

    n: [P] pass sizes, S: [P] savings τ_slot(n) − τ_dedup(n) in seconds. None when the saving at the
    largest n is not positive. The same rule serves the prediction and the measured point estimate.
    """
    if len(n) != len(S):
        raise ValueError(f"n has {len(n)} entries but S has {len(S)}; give one saving per pass size")
    pairs = sorted((int(ni), float(si)) for ni, si in zip(n, S) if int(ni) >= 2)
    found = None
    for ni, si in reversed(pairs):
        if si <= 0:
            break
        found = ni
    return found


def saving_band(S: float, M_slot: float, M_dedup: float, eps: float) -> tuple[float, float]:
    """The band of (18) around a predicted saving: Ŝ ± ε/(1−ε) (M̂ᵉ_slot + M̂ᵉ_dedup), seconds."""
    if eps >= 1:  # a bandwidth error of 100% or more bounds nothing
        return -math.inf, math.inf
    half = float(saving_bound(eps, M_slot, M_dedup))
    return S - half, S + half


@dataclass(frozen=True)
class Prediction:
    """The prediction of one version (Sec. 4): verify times, saving, crossover, staircase, bounds.

    Times in seconds. Lists over n are [n_max] for n = 1..n_max; over k [kmax+1]; over a [A].
    Dicts are keyed by kernel ("slot", "dedup", "auto"; M has only the first two).
    """

    version: str
    n: list[int]
    tau1: float
    tau: dict[str, list[float]]
    M: dict[str, list[float]]
    S: list[float]
    S_lo: list[float]
    S_hi: list[float]
    sign_certain: list[bool]
    eps: float
    crossover: int | None
    h: list[float]
    V: dict[str, list[float]]
    acceptance: list[float]
    k_star: dict[str, list[int]]
    speedup: dict[str, list[float]]
    speedup_lo: dict[str, list[float]]
    speedup_hi: dict[str, list[float]]
    k_star_certain: dict[str, list[bool]]
    a0: dict[str, float]
    step_points: dict[str, list[float]]
    delta: float

    @property
    def kmax(self) -> int:
        return len(self.h) - 1

    @property
    def loss_bound(self) -> float:
        """(20): at most 2δ/(1+δ) of the best throughput is lost by drafting k̂*; 1 (vacuous) at δ >= 1."""
        return min(1.0, 2 * self.delta / (1 + self.delta))

    @property
    def bounds_vacuous(self) -> bool:
        """δ >= 1 (ε >= 1/2): the bounds (20)-(21) hold nothing; τ̂, Ŝ, the crossover and k̂* still stand."""
        return self.delta >= 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Prediction":
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown Prediction keys {sorted(unknown)}; was it written by another moespec version?")
        d = dict(d)
        # JSON stores the vacuous bounds' infinities as null: restore them
        d["delta"] = math.inf if d["delta"] is None else d["delta"]
        d["S_lo"] = [-math.inf if x is None else x for x in d["S_lo"]]
        d["S_hi"] = [math.inf if x is None else x for x in d["S_hi"]]
        d["speedup_hi"] = {p: [math.inf if x is None else x for x in v] for p, v in d["speedup_hi"].items()}
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


def _staircase(V: list[float], acceptance: Sequence[float], delta: float) -> dict[str, list]:
    """k̂*(a), the predicted speedup with the interval (21) for the true one, and the certificate
    of (20) (separation on V̂ by (1+δ)/(1−δ) leaves no other maximizer within δ) for one V̂."""
    out: dict[str, list] = {"k_star": [], "speedup": [], "lo": [], "hi": [], "certain": []}
    for a in acceptance:
        k = best_draft_length(V, a)
        s = float(speedup(V, a, k))
        if delta >= 1:  # a step-time error of 100% or more: (20)-(21) say nothing
            out["k_star"].append(int(k))
            out["speedup"].append(s)
            out["lo"].append(0.0)
            out["hi"].append(math.inf)
            out["certain"].append(False)
            continue
        lo, hi = speedup_interval(s, delta)
        out["k_star"].append(int(k))
        out["speedup"].append(s)
        out["lo"].append(float(lo))
        out["hi"].append(float(hi))
        out["certain"].append(bool(best_draft_length_separated(V, a, delta)))
    return out


def _check_version(version: str, outside: Mapping[Any, float] | None) -> None:
    if version not in VERSIONS:
        raise ValueError(f"version={version!r}; choose one of {VERSIONS}")
    if (version in OUTSIDE_VERSIONS) != (outside is not None):
        given = "given" if outside is not None else None
        raise ValueError(f"outside is required by the versions {OUTSIDE_VERSIONS} and used by no other; "
                         f"got version={version!r} with outside={given}")


def _eps_delta(eps: float, delta: float | None) -> tuple[float, float]:
    """(ε, δ) checked; δ by default ε/(1−ε) from (C.7), infinite at ε >= 1."""
    eps = float(check_positive("eps", eps, allow_zero=True))  # eps >= 1 is allowed: its bounds are vacuous
    if delta is None:
        delta = math.inf if eps >= 1 else float(delta_from_eps(eps))
    elif not delta >= 0:
        raise ValueError(f"delta = {delta} must be >= 0 (δ >= 1 is allowed: the bounds (20)-(21) are then vacuous)")
    return eps, float(delta)


def _check_h(h: Sequence[float], n_max: int) -> list[float]:
    """h(0..kmax) as floats, finite, non-negative, with 1 <= kmax <= n_max - 1."""
    h = [float(x) for x in h]
    if not 2 <= len(h) <= n_max or any(not math.isfinite(x) or x < 0 for x in h):
        raise ValueError(f"h={h} must hold finite non-negative times at k = 0..kmax, "
                         f"1 <= kmax <= n_max - 1 = {n_max - 1}")
    return h


def _verify_times(t_bar: dict[str, dict[int, np.ndarray]], tau1: float, ns: list[int],
                  outside: Mapping[Any, float] | None) -> dict[str, list[float]]:
    """τ̂_p(n) of (22) for both kernels, calibrated when `outside` is given, and "auto", the faster at
    each n; NonPositiveTime at a predicted time <= 0."""
    tau = {p: [tau1 + float(np.sum(t_bar[p][n] - t_bar[COST_SLOT][1])) for n in ns] for p in COST_KERNELS}
    if outside is not None:
        tau = _calibrate(tau, ns, outside)
    low = [(p, n, t) for p in tau for n, t in zip(ns, tau[p]) if t <= 0]
    if low:
        raise NonPositiveTime(f"the predicted verify time τ̂_{low[0][0]}({low[0][1]}) = {low[0][2]} s is <= 0")
    tau[COST_AUTO] = [min(s, d) for s, d in zip(tau[COST_SLOT], tau[COST_DEDUP])]
    return tau


def predict(
    *,
    t_slot: Mapping[Any, Any],
    t_dedup: Mapping[Any, Any],
    tau1: float,
    h: Sequence[float],
    eps: float,
    version: str = "prediction",
    outside: Mapping[Any, float] | None = None,
    delta: float | None = None,
    acceptance: Sequence[float] = ACCEPTANCE_GRID,
) -> Prediction:
    """The prediction (22) of one version, and the saving, crossover, k̂*(a) and bounds that follow.

    t_slot: {n: [L, W_n] or [L]} per-slot operation times, n = 1..n_max; n = 1 gives t̄_l(1).
    t_dedup: {n: [L, W_n] or [L]} deduplicating times, n = 2..n_max; with n = 1 absent the engine
        runs the per-slot kernel on one-token passes, so τ̂_dedup(1) = τ_meas(1).
    tau1: τ_meas(1), the measured whole-model one-token verify time.
    h: [kmax+1] time per step outside the verify pass, k = 0..kmax (kmax + 1 <= n_max).
    eps: the engine's bandwidth error ε (the larger of its two kernels'), for the band of (18).
    version: "prediction" (fit times), "prediction-outside" (fit times + g(n)), "measured-time"
        (measured times) or "calibrated" (measured times + g(n)).
    outside: {n: o(n)}, n = 1..n_max, the time outside the expert operation (`_calibrate`): read inside
        the per-slot passes or timed beside them for the calibrated version, timed alone by the
        characterization for prediction-outside; required by, and only by, those two.
    delta: δ of (20)–(21); default ε/(1−ε) from (C.7).
    """
    return _from_operation_times(_operation_times(t_slot, t_dedup), tau1=tau1, h=h, eps=eps, version=version,
                                 outside=outside, delta=delta, acceptance=acceptance)


def predict_without_experts(*, n_max: int, tau1: float, h: Sequence[float], version: str = "prediction",
                            outside: Mapping[Any, float] | None = None,
                            acceptance: Sequence[float] = ACCEPTANCE_GRID) -> Prediction:
    """(22) for a model with no MoE layer (a dense model): its sum over layers is empty, so τ̂(n) =
    τ_meas(1) at every n = 1..n_max, and the calibrated version's g(n) holds the whole growth. Both
    kernels are the same pass; with no expert fit ε = 0, and the saving is 0."""
    none = {n: np.zeros(0) for n in range(1, int(n_max) + 1)}
    return _from_operation_times({COST_SLOT: none, COST_DEDUP: dict(none)}, tau1=tau1, h=h, eps=0.0,
                                 version=version, outside=outside, delta=None, acceptance=acceptance)


def _from_operation_times(t_bar: dict[str, dict[int, np.ndarray]], *, tau1: float, h: Sequence[float], eps: float,
                          version: str, outside: Mapping[Any, float] | None, delta: float | None,
                          acceptance: Sequence[float]) -> Prediction:
    """`predict` from the checked operation times t̄_p,l(n) (`_operation_times`)."""
    _check_version(version, outside)
    eps, delta = _eps_delta(eps, delta)
    tau1 = float(tau1)
    if not (math.isfinite(tau1) and tau1 > 0):
        raise ValueError(f"tau1={tau1} must be a positive time in seconds")
    ns = list(t_bar[COST_SLOT])
    n_max = ns[-1]
    h = _check_h(h, n_max)
    M = {p: [float(t_bar[p][n].sum()) for n in ns] for p in COST_KERNELS}
    tau = _verify_times(t_bar, tau1, ns, outside)

    S = [s - d for s, d in zip(tau[COST_SLOT], tau[COST_DEDUP])]
    band = [saving_band(S[i], M[COST_SLOT][i], M[COST_DEDUP][i], eps) for i in range(n_max)]
    V = {p: [float(v) for v in step_times(tau[p][: len(h)], h)] for p in KERNELS}
    stairs = {p: _staircase(V[p], acceptance, delta) for p in KERNELS}
    return Prediction(
        version=version, n=ns, tau1=tau1, tau=tau, M=M, S=S,
        S_lo=[lo for lo, _ in band], S_hi=[hi for _, hi in band],
        # (19) with equal fixed work: ū/r = M̂ᵉ_dedup / M̂ᵉ_slot
        sign_certain=[n >= 2 and eps < 1 and M[COST_SLOT][i] > 0  # no expert operation (a dense model): no sign
                      and faster_kernel_certain(M[COST_DEDUP][i] / M[COST_SLOT][i], 1.0, eps)
                      for i, n in enumerate(ns)],
        eps=eps, crossover=crossover(ns, S), h=h, V=V, acceptance=[float(a) for a in acceptance],
        k_star={p: stairs[p]["k_star"] for p in KERNELS},
        speedup={p: stairs[p]["speedup"] for p in KERNELS},
        speedup_lo={p: stairs[p]["lo"] for p in KERNELS},
        speedup_hi={p: stairs[p]["hi"] for p in KERNELS},
        k_star_certain={p: stairs[p]["certain"] for p in KERNELS},
        a0={p: float(first_draft_threshold(V[p])) for p in KERNELS},
        step_points={p: [float(x) for x in step_points(V[p])] for p in KERNELS},
        delta=delta,
    )


def window_times(fits: Sequence[Any], U: Any, n: int, m: int, w: Sequence[float]) -> np.ndarray:
    """The prediction's operation times: each layer's fit evaluated at the bytes of every window.

    fits: [L] fit results of (4) or (E.1) with predict(U, n, m, b) (the fit of a timed layer may
    stand for several layers); U: [L, W] distinct experts of each window; w: [L] expert bytes.
    Returns [L, W] seconds, ready for t_slot[n] / t_dedup[n] of `predict`.
    """
    U = np.asarray(U)
    if U.ndim != 2 or len(fits) != U.shape[0] or len(w) != U.shape[0]:
        raise ValueError(f"give one fit and one expert size per layer row of U: fits {len(fits)}, "
                         f"w {len(w)}, U {U.shape}")
    return np.stack([np.asarray(f.predict(U[l], n, m, w[l]), dtype=float) * np.ones(U.shape[1])
                     for l, f in enumerate(fits)])
