"""Statistics of recorded verify passes: τ_p(n) (cost-model paper, eq. (5)), the saving
S(n) = τ_slot(n) − τ_dedup(n) (eq. (6)) with its bootstrap interval, and the verify-batch scaling
curve τ(n)/τ(1) (engine paper, Sec. 6.5). Numbers in, numbers out: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from moespec.kernel_names import DEDUP, SLOT


def pass_time(samples: np.ndarray) -> float:
    """A verify time from samples [P, R] (prompt x repetition), seconds: each prompt's median over
    its repetitions, averaged over the prompts.

    The prompts are windows of different text, measured one after another: their routing names
    different numbers of distinct experts (qwen3moe-shaped: 10 against 31 at n = 8), and the machine
    may run at another speed by the next prompt, so their passes fall in separate clusters (40 and
    54 ms at n = 2 there). The median of the pooled passes then lands wherever the two clusters'
    inner tails meet; it missed the average of the prompts' medians by up to 5.4 ms at 70 ms on
    qwen3moe-shaped. The average is the one that the prediction's operation times (22) take over
    their windows, so the two are compared like for like.
    """
    s = np.asarray(samples, dtype=float)
    if s.ndim != 2 or s.size == 0:
        raise ValueError(f"samples must be a non-empty [prompts, repetitions] array, got shape {s.shape}")
    return float(np.median(s, axis=1).mean())


@dataclass(frozen=True)
class Saving:
    """S(n) = τ_slot(n) − τ_dedup(n) (eq. (6)) in seconds, with its bootstrap interval [lo, hi]."""

    n: int
    point: float
    lo: float
    hi: float
    level: float = 0.95

    @property
    def excludes_zero(self) -> bool:
        return self.lo > 0 or self.hi < 0

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "point": self.point, "lo": self.lo, "hi": self.hi, "level": self.level}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Saving":
        return cls(**d)


def bootstrap_saving(
    slot: np.ndarray,  # [P, R] seconds, per-slot kernel, prompt x repetition
    dedup: np.ndarray,  # [P, R] seconds, deduplicating kernel, paired with `slot`
    *,
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(point, lo, hi) of S = τ_slot − τ_dedup, eq. (6), each τ a `pass_time`, with a percentile
    interval.

    Each resample draws P prompts with replacement, then R repetitions with replacement within
    each drawn prompt; the same (prompt, repetition) indices go to both kernels, which were timed
    back to back.
    """
    slot, dedup = np.asarray(slot, dtype=float), np.asarray(dedup, dtype=float)
    if slot.ndim != 2 or slot.shape != dedup.shape or slot.size == 0:
        raise ValueError(
            f"slot and dedup must be non-empty [prompts, reps] arrays of one shape, got {slot.shape} and {dedup.shape}"
        )
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    P, R = slot.shape
    rng = np.random.default_rng(seed)
    pi = rng.integers(P, size=(resamples, P, 1))
    ri = rng.integers(R, size=(resamples, P, R))
    stats = np.median(slot[pi, ri], axis=2).mean(axis=1) - np.median(dedup[pi, ri], axis=2).mean(axis=1)
    point = pass_time(slot) - pass_time(dedup)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(stats, [alpha, 1 - alpha])
    return point, float(lo), float(hi)


def _as_samples(d: dict) -> dict[int, np.ndarray]:
    return {int(n): np.asarray(v, dtype=float) for n, v in d.items()}


@dataclass(frozen=True)
class VerifyTimes:
    """Verify-pass samples at one depth d.

    samples[kernel][n] holds seconds shaped [P, R] (prompt x repetition); τ_p(n) is their `pass_time`.
    ops[kernel][n], where timed (`run_verify` with verified windows), holds the expert operation's
    seconds on each pass's own window, shaped [P, R, L] over `op_layers`, each taken right after
    its pass. inside[kernel][n], where recorded, holds the seconds each pass spent inside its experts
    modules, summed over the layers, shaped [P, R] like the samples (`time_passes`).
    outside[term][n], where timed (a llama.cpp target, `run_verify(outside=True)`), holds the
    seconds of each term of the pass outside its expert operation ("dense": D(n), "rest": R_d(n),
    `bench.ggml_outside`) computed right after each pass of the even repetitions (the half that
    `chain.prediction` reads), shaped [P, ceil(R/2)].
    """

    depth: int
    samples: dict[str, dict[int, np.ndarray]]
    ops: dict[str, dict[int, np.ndarray]] | None = None
    op_layers: tuple[int, ...] = ()
    inside: dict[str, dict[int, np.ndarray]] | None = None
    outside: dict[str, dict[int, np.ndarray]] | None = None

    @property
    def kernels(self) -> tuple[str, ...]:
        return tuple(self.samples)

    @property
    def ns(self) -> tuple[int, ...]:
        return tuple(sorted(next(iter(self.samples.values()))))

    def tau(self, kernel: str) -> dict[int, float]:
        """τ_p(n): each prompt's median over repetitions, averaged over prompts (`pass_time`), seconds."""
        return {n: pass_time(s) for n, s in sorted(self.samples[kernel].items())}

    @property
    def tau_meas_1(self) -> float:
        """τ_meas(1), the one-token verify time of eq. (22): the per-slot kernel's (or the only one's)."""
        kernel = SLOT if SLOT in self.samples else self.kernels[0]
        return self.tau(kernel)[1] if 1 in self.samples[kernel] else float("nan")

    def op_times(self, kernel: str) -> dict[int, np.ndarray]:
        """Each of `op_layers`' operation time on the verified windows, timed between the passes: the
        median over repetitions, averaged over prompts (the windows), {n: [L]} seconds."""
        if not self.ops:
            raise ValueError(f"no operation times at depth {self.depth}; run_verify times them when given the "
                             "verified windows and op_layers")
        return {n: np.median(s, axis=1).mean(axis=0) for n, s in sorted(self.ops[kernel].items())}

    def outside_samples(self) -> dict[int, np.ndarray]:
        """o(n) of each pass, the sum of its outside terms timed right after it: {n: [P, R]} seconds."""
        if not self.outside:
            raise ValueError(f"no outside times at depth {self.depth}; run_verify(outside=True) times them on llama.cpp")
        return {n: sum(by_n[n] for by_n in self.outside.values()) for n in self.ns}  # [P, ceil(R/2)]

    def savings(self, *, resamples: int = 2000, seed: int = 0) -> list[Saving]:
        """S(n) with its 95% bootstrap interval at every measured n; empty unless both kernels ran."""
        if not (SLOT in self.samples and DEDUP in self.samples):
            return []
        out = []
        for n in self.ns:
            point, lo, hi = bootstrap_saving(
                self.samples[SLOT][n], self.samples[DEDUP][n], resamples=resamples, seed=seed + n
            )
            out.append(Saving(n=n, point=point, lo=lo, hi=hi))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "depth": self.depth,
            "ns": list(self.ns),
            "tau": {p: {str(n): t for n, t in self.tau(p).items()} for p in self.kernels},
            "tau_meas_1": self.tau_meas_1,
            "saving": [s.to_dict() for s in self.savings()],
            "samples": {p: {str(n): s.tolist() for n, s in sorted(ns.items())} for p, ns in self.samples.items()},
            **({"op_layers": list(self.op_layers),
                "ops": {p: {str(n): s.tolist() for n, s in sorted(ns.items())} for p, ns in self.ops.items()}}
               if self.ops else {}),
            **({"inside": {p: {str(n): s.tolist() for n, s in sorted(ns.items())} for p, ns in self.inside.items()}}
               if self.inside else {}),
            **({"outside": {t: {str(n): s.tolist() for n, s in sorted(ns.items())} for t, ns in self.outside.items()}}
               if self.outside else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "VerifyTimes":
        ops = {p: _as_samples(v) for p, v in d["ops"].items()} if d.get("ops") else None
        inside = {p: _as_samples(v) for p, v in d["inside"].items()} if d.get("inside") else None
        outside = {t: _as_samples(v) for t, v in d["outside"].items()} if d.get("outside") else None
        return cls(depth=int(d["depth"]), samples={p: _as_samples(v) for p, v in d["samples"].items()}, ops=ops,
                   op_layers=tuple(int(l) for l in d.get("op_layers", ())), inside=inside, outside=outside)


@dataclass(frozen=True)
class ScalingCurve:
    """Verify-batch scaling at depth d with one kernel: samples[n] seconds shaped [P, R]."""

    depth: int
    kernel: str
    samples: dict[int, np.ndarray]

    @property
    def ratio(self) -> dict[int, float]:
        """τ(n)/τ(1): an n-token pass over a 1-token pass (engine paper, Sec. 6.5)."""
        t1 = pass_time(self.samples[1])
        return {n: pass_time(s) / t1 for n, s in sorted(self.samples.items())}

    def to_dict(self) -> dict[str, Any]:
        return {
            "depth": self.depth,
            "kernel": self.kernel,
            "ratio": {str(n): r for n, r in self.ratio.items()},
            "samples": {str(n): s.tolist() for n, s in sorted(self.samples.items())},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ScalingCurve":
        return cls(depth=int(d["depth"]), kernel=d["kernel"], samples=_as_samples(d["samples"]))
