"""Was the machine steady while the chain measured it? A check read off the timings the chain keeps.

A run's scores judge the prediction against the sweep, both made on this machine; if another job
took the cores for a few minutes, some passes ran slow and the scores say more about that job than
about the cost model (k̂* within one at 8 of 11 instead of 11, a 17.7% loss instead of 3.2%, on one
such run). Each timing phase of the chain repeats its whole grid in rounds (`bench.verify.time_passes`:
every pass size once per round; `bench.sweep.run_oracle`: every (k, a) cell once per prompt and
repetition, `_oracle_order`), so the machine's speed at each round can be read off the round itself:

    f_r = median over the grid's points p of t(p, r) / t̄(p)

where t(p, r) is point p's time in round r and t̄(p) its median (geometric mean for sweep cells,
`sweep_cells.step_time`) over the rounds. On an idle 2-core machine f_r stays within about ±10%
(the sweep's runs moved by 10-14% between passes, 7-8% inside one: `sweep_cells.step_time`); a
job sharing the cores makes its rounds 1.5-2x slower. A phase is flagged when at least
`SLOW_SHARE` of its rounds ran `SLOW` or more below its usual speed. Numbers in, numbers out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

SLOW = 0.25  # a round at least 25% slower than the phase's usual speed
SLOW_SHARE = 0.10  # flagged when at least a tenth of the rounds were
FIX = ("rerun on an idle machine (`moespec demo --restart` with nothing else running); more repetitions "
       "(--verify-reps, --oracle-reps) average a short disturbance out")


def round_factors(times: np.ndarray) -> np.ndarray:
    """f_r (module docstring) of times [points, rounds], seconds: [rounds]. Points with a
    non-positive or missing (NaN) time are left out of the median."""
    t = np.asarray(times, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(t > 0, t, np.nan)
        typical = np.exp(np.nanmean(np.log(t), axis=1, keepdims=True))  # [points, 1]
        return np.nanmedian(t / typical, axis=0)


@dataclass(frozen=True)
class Phase:
    """One timing phase: its name, the speed factor f_r of each round in time order, and the verdict."""

    name: str
    factors: tuple[float, ...]

    @property
    def slow_rounds(self) -> int:
        return sum(f >= 1 + SLOW for f in self.factors)

    @property
    def slow_share(self) -> float:
        return self.slow_rounds / len(self.factors) if self.factors else 0.0

    @property
    def steady(self) -> bool:
        return self.slow_share < SLOW_SHARE

    @property
    def slowest(self) -> float:
        return max(self.factors, default=1.0)

    def said(self) -> str:
        return (f"{self.name}: {self.slow_rounds} of {len(self.factors)} rounds ran {100 * SLOW:.0f}% or more slower "
                f"than the phase's usual speed (slowest {self.slowest:.2f}x)")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "slow_rounds": self.slow_rounds, "slow_share": self.slow_share, "steady": self.steady}


@dataclass(frozen=True)
class Steadiness:
    """The check over every phase of a run; `steady` unless one of them was flagged."""

    phases: tuple[Phase, ...] = field(default_factory=tuple)

    @property
    def steady(self) -> bool:
        return all(p.steady for p in self.phases)

    @property
    def message(self) -> str:
        if self.steady:
            checked = ", ".join(f"{p.name} (slowest round {p.slowest:.2f}x)" for p in self.phases)
            return f"the machine was steady while it was measured: {checked or 'no phase was timed'}"
        moved = "; ".join(p.said() for p in self.phases if not p.steady)
        return (f"the machine's speed moved while it was measured, enough to spoil the scores: {moved}. "
                f"The fix: {FIX}")

    def to_dict(self) -> dict[str, Any]:
        return {"steady": self.steady, "message": self.message, "slow": SLOW, "slow_share": SLOW_SHARE,
                "phases": [p.to_dict() for p in self.phases]}


def verify_rounds(measurement: Mapping[str, Any]) -> list[Phase]:
    """One phase per (depth, prompt) of the verify passes: points are (kernel, n), rounds the repetitions."""
    phases = []
    for v in measurement.get("verify", []):
        per_kernel = [np.asarray([by_n[n] for n in sorted(by_n, key=int)], dtype=float)  # [ns, P, R]
                      for by_n in v["samples"].values()]
        samples = np.concatenate(per_kernel)  # [points, P, R]
        for prompt in range(samples.shape[1]):
            phases.append(Phase(f"verify passes, d = {v['depth']}, prompt {prompt}",
                                tuple(float(f) for f in round_factors(samples[:, prompt, :]))))
    return phases


def sweep_rounds(measurement: Mapping[str, Any]) -> list[Phase]:
    """One phase per oracle sweep (kernel, depth): points are its (k, a) cells, rounds the passes over them."""
    phases = []
    for e in measurement.get("oracle", []):
        cells = [c["run_steps"] for c in e["cells"] if c.get("run_steps")]
        if not cells:
            continue
        passes = min(len(c) for c in cells)
        times = np.array([[np.median(run) if len(run) else np.nan for run in c[:passes]] for c in cells])
        phases.append(Phase(f"oracle sweep, d = {e['depth']}", tuple(float(f) for f in round_factors(times))))
    return phases


def batch_sweep_rounds(measurement: Mapping[str, Any]) -> list[Phase]:
    """One phase per batch size of a batch measurement's sweep (`bench.batch_sweep`): points are its
    (k, a) cases, rounds its repetitions (each runs every case once), the time a case's seconds per token."""
    phases = []
    for B, row in sorted(measurement.get("by_batch", {}).items(), key=lambda x: int(x[0])):
        runs = [v for v in row["sweep"].get("samples", {}).values() if v]
        reps = min((len(v) for v in runs), default=0)
        if reps:
            times = np.array([[1 / x if x > 0 else np.nan for x in v[:reps]] for v in runs])
            phases.append(Phase(f"batch sweep, B = {B}", tuple(float(f) for f in round_factors(times))))
    return phases


def dense_rounds(characterization: Mapping[str, Any] | None) -> list[Phase]:
    """The dense products' rounds over every n (`bench.characterize.dense_times`), where timed."""
    dense = (characterization or {}).get("dense")
    if not dense:
        return []
    samples = np.array([dense["samples"][n] for n in sorted(dense["samples"], key=int)], dtype=float)
    return [Phase("dense products", tuple(float(f) for f in round_factors(samples)))]


def check(measurement: Mapping[str, Any], characterization: Mapping[str, Any] | None = None,
          base: Mapping[str, Any] | None = None) -> Steadiness:
    """The check over a run's timing phases: the base measurement's verify passes (or the
    measurement's own), the oracle sweep, and the characterization's dense products."""
    phases: Sequence[Phase] = [*dense_rounds(characterization), *verify_rounds(base or measurement),
                               *sweep_rounds(measurement)]
    return Steadiness(tuple(phases))
