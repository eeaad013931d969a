"""Statistics of recorded sweep runs: the step time V(k), the pooled figures of a sweep cell, the
plain-decoding baseline, the bootstrap of throughput over passes and the check that an oracle cell
realized the acceptance it is set to. Numbers in, numbers out: no torch.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass
from statistics import NormalDist
from typing import Any, Sequence

import numpy as np

from moespec.costmodel.theory import expected_tokens

ACCEPTANCE_LEVEL = 0.99  # two-sided level of an oracle cell's sampling interval (`acceptance_interval`)


def acceptance_interval(a: float, tested: int, level: float = ACCEPTANCE_LEVEL) -> tuple[float, float] | None:
    """The sampling interval of the realized acceptance of `tested` drafts at set acceptance a:
    a ± z·sqrt(a(1 − a)/tested), z the normal quantile of `level` (2.58 at 99%), within [0, 1].

    Under the oracle's geometric law every tested draft is right with probability a, independently
    of the others, so accepted/tested has mean a and that variance (binomial); a realized
    acceptance inside it is the score test not rejecting a, i.e. a inside the Wilson interval of
    accepted/tested. The oracle's stratified draws (`STEP_BLOCK`) vary far less: the interval is
    conservative for them. None when no draft was tested (k = 0).
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if tested <= 0:
        return None
    half = NormalDist().inv_cdf(0.5 + level / 2) * math.sqrt(a * (1 - a) / tested)
    return max(0.0, a - half), min(1.0, a + half)


def acceptance_check(cell: dict[str, Any], level: float = ACCEPTANCE_LEVEL) -> dict[str, Any] | None:
    """{"k", "a", "realized", "tested", "interval", "within"} of an oracle cell (a `SweepCell` dict);
    None for a cell that tested no draft or records no tested count (artifacts written before it was
    recorded), or has no set acceptance (a real draft, the pooled baseline)."""
    tested, a = int(cell.get("tested") or 0), cell.get("a")
    interval = None if a is None else acceptance_interval(float(a), tested, level)
    if interval is None:
        return None
    realized = float(cell["realized_acceptance"])
    return {"k": int(cell["k"]), "a": float(a), "realized": realized, "tested": tested, "interval": list(interval),
            "within": interval[0] <= realized <= interval[1]}


def acceptance_rows(cells: Sequence[dict[str, Any]], acceptances: Sequence[float],
                    level: float = ACCEPTANCE_LEVEL) -> list[dict[str, Any]]:
    """Per set acceptance a: did the oracle sweep's cells at a (k >= 1) run at a?

    "realized": accepted over tested drafts pooled over those cells, "tested", "interval" (its
    `acceptance_interval`), "cells_outside": the k of each cell outside its own interval,
    "refused": a cell or the pooled figure outside (the score leaves a out), "checked": False
    where the cells record no tested count (then nothing is refused).
    """
    out = []
    for a in acceptances:
        at = [c for c in cells if c["k"] and c.get("a") is not None and round(float(c["a"]), 6) == round(float(a), 6)]
        checks = [x for x in (acceptance_check(c, level) for c in at) if x is not None]
        tested = sum(x["tested"] for x in checks)
        realized = sum(x["realized"] * x["tested"] for x in checks) / tested if tested else None
        interval = acceptance_interval(float(a), tested, level)
        outside = [x["k"] for x in checks if not x["within"]]
        pooled_out = interval is not None and not interval[0] <= realized <= interval[1]
        out.append({"a": float(a), "realized": realized, "tested": tested,
                    "interval": None if interval is None else list(interval), "cells": len(at),
                    "cells_outside": outside, "checked": bool(checks), "refused": bool(outside) or pooled_out})
    return out


def _sum(runs: Sequence[dict], name: str) -> float:
    return float(sum(r["stats"][name] for r in runs))


def _by_position(runs: Sequence[dict], name: str, k: int) -> np.ndarray:
    return np.sum([r["stats"][name] for r in runs], axis=0) if k else np.zeros(0)


def step_time(run_steps: Sequence[Sequence[float]]) -> float:
    """V(k) of a cell: the geometric mean over its runs of each run's median step time, seconds.

    run_steps: [runs][steps] seconds (runs without steps are left out). The median inside a run
    reads through one slow step; the mean of logs across runs is what makes the oracle sweep's
    comparisons paired. Run i of every cell at one acceptance sits in the same pass, seconds from
    the others (`_oracle_order`), and the machine's speed moves from pass to pass: on the demo's
    three sweeps a run's median step varied by 10-14% between passes but by 7-8% inside one. A
    speed factor f_i common to pass i multiplies every cell of that acceptance by the same
    (f_1 ... f_P)^(1/P), so it cancels exactly from T(k)/T(k'), which k* and the loss compare; the
    median of all the cell's steps pooled, the estimator before this one, only roughly cancels it.
    NaN when no run has a step.
    """
    medians = [float(np.median(s)) for s in run_steps if len(s)]
    if not medians:
        return float("nan")
    if min(medians) <= 0:
        raise ValueError(f"step times must be positive seconds, got a run with median {min(medians)}")
    return float(np.exp(np.mean(np.log(medians))))


@dataclass(frozen=True)
class SweepCell:
    """Pooled figures of the runs of one sweep cell (prompts x repetitions).

    `throughput` is the engine paper's (Sec. 5): all new tokens over all decoding time, each run's
    first round included; `throughput_std` is the spread of the per-run figures (mean +/- std over
    prompts). `step_throughput` is the cost-model paper's T_a(k) = G/V (Sec. 1): the tokens of a step
    over the step time V(k) (`step_time`). A step is every round of a run made with
    `generate(prefill_last=False)` (its "prefill_last" record False), else every round but the
    first, whose pass verifies only k tokens, the prefill having given its first row (at k = 0 it
    runs no model at all).
    A step's pass has k + 1 tokens whatever is accepted, so the spread of step times is the
    machine's.
    """

    k: int
    a: float | None  # the oracle's acceptance; None for a real draft
    runs: int
    tokens: int
    rounds: int
    total_s: float
    verify_s: float
    draft_s: float
    sampling_s: float
    throughput_std: float
    steps: int  # the rounds that are steps (`pool`)
    step_s: float  # V(k): `step_time` of the runs' steps
    step_tokens: float  # mean tokens committed per step
    acceptance: float  # pooled: accepted / drafted
    realized_acceptance: float  # accepted / tested, the geometric MLE of a
    acceptance_by_position: tuple[float, ...]  # [k] accepted / drafted at position i
    ttft_s: float  # mean over runs, prefill included
    peak_rss_bytes: int
    reanchors: int
    run_steps: tuple[tuple[float, ...], ...]  # each run's step times, seconds (`resample_throughput`)
    tested: int = 0  # drafts tested, the denominator of realized_acceptance
    overruled: int = 0  # oracle rounds whose verify pass disagreed with the oracle's verdict (`OracleDraft`)

    @property
    def throughput(self) -> float:
        return self.tokens / self.total_s if self.total_s > 0 else float("nan")

    @property
    def tokens_per_step(self) -> float:
        return self.step_tokens

    @property
    def step_throughput(self) -> float:
        """T_a(k) = G/V: tokens per step over the step time (cost-model paper, Sec. 1)."""
        return self.step_tokens / self.step_s if self.step_s > 0 else float("nan")

    @property
    def G(self) -> float | None:
        """G_a(k) = 1 + a + ... + a^k, the expected tokens per step under geometric acceptance."""
        return float(expected_tokens(self.a, self.k)) if self.a is not None else None

    @property
    def h(self) -> float:
        """h(k): time per step outside the verify pass (Sec. 3.1)."""
        return (self.total_s - self.verify_s) / self.rounds if self.rounds else float("nan")

    @property
    def latency_split_ms(self) -> dict[str, float]:
        """Milliseconds per generated token: draft, verify, sampling, other (engine paper, Sec. 6.4)."""
        n = max(self.tokens, 1)
        other = max(0.0, self.total_s - self.draft_s - self.verify_s - self.sampling_s)
        return {
            "draft": 1e3 * self.draft_s / n,
            "verify": 1e3 * self.verify_s / n,
            "sampling": 1e3 * self.sampling_s / n,
            "other": 1e3 * other / n,
        }

    @classmethod
    def pool(cls, k: int, a: float | None, runs: Sequence[dict]) -> "SweepCell":
        if not runs:
            raise ValueError(f"no runs to pool at k={k}, a={a}")
        drafted = _by_position(runs, "drafted_by_position", k)
        accepted = _by_position(runs, "accepted_by_position", k)
        reached = _by_position(runs, "reached_by_position", k)
        per_run = [r["stats"]["new_tokens"] / r["stats"]["total_s"] for r in runs if r["stats"]["total_s"] > 0]
        skip = [int(r.get("prefill_last", True)) for r in runs]  # the first round is no step
        run_steps = tuple(tuple(r["stats"]["round_s"][j:]) for r, j in zip(runs, skip))
        times = [t for steps in run_steps for t in steps]
        tokens = [n for r, j in zip(runs, skip) for n in r["stats"]["tokens_per_round"][j:]]
        return cls(
            k=k,
            a=a,
            runs=len(runs),
            tokens=int(_sum(runs, "new_tokens")),
            rounds=int(sum(len(r["stats"]["tokens_per_round"]) for r in runs)),
            total_s=_sum(runs, "total_s"),
            verify_s=_sum(runs, "verify_s"),
            draft_s=_sum(runs, "draft_s"),
            sampling_s=_sum(runs, "sampling_s"),
            throughput_std=float(np.std(per_run)) if per_run else float("nan"),
            steps=len(times),
            step_s=step_time(run_steps),
            step_tokens=float(np.mean(tokens)) if tokens else float("nan"),
            acceptance=float(accepted.sum() / drafted.sum()) if drafted.sum() else float("nan"),
            realized_acceptance=float(accepted.sum() / reached.sum()) if reached.sum() else float("nan"),
            acceptance_by_position=tuple(float(x / d) if d else float("nan") for x, d in zip(accepted, drafted)),
            ttft_s=float(np.mean([r["stats"]["ttft_s"] + r["prefill_s"] for r in runs])),
            peak_rss_bytes=int(max(r["stats"]["peak_rss_bytes"] for r in runs)),
            reanchors=int(sum(r.get("reanchors", 0) for r in runs)),
            run_steps=run_steps,
            tested=int(reached.sum()),
            overruled=int(sum(r.get("overruled", 0) for r in runs)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "a": self.a,
            "runs": self.runs,
            "tokens": self.tokens,
            "rounds": self.rounds,
            "throughput": self.throughput,
            "throughput_std": self.throughput_std,
            "step_throughput": self.step_throughput,
            "steps": self.steps,
            "step_tokens": self.step_tokens,
            "tokens_per_step": self.tokens_per_step,
            "G": self.G,
            "acceptance": self.acceptance,
            "realized_acceptance": self.realized_acceptance,
            "acceptance_by_position": list(self.acceptance_by_position),
            "step_s": self.step_s,
            "h": self.h,
            "latency_split_ms": self.latency_split_ms,
            "ttft_s": self.ttft_s,
            "peak_rss_bytes": self.peak_rss_bytes,
            "reanchors": self.reanchors,
            "total_s": self.total_s,
            "verify_s": self.verify_s,
            "draft_s": self.draft_s,
            "sampling_s": self.sampling_s,
            "run_steps": [list(x) for x in self.run_steps],
            "tested": self.tested,
            "overruled": self.overruled,
            **self._interval_fields(),
        }

    def _interval_fields(self) -> dict[str, Any]:
        """"acceptance_interval" ([lo, hi], `acceptance_interval`) and "acceptance_within" (the realized
        acceptance inside it) of an oracle cell; None for both where no draft was tested."""
        interval = None if self.a is None else acceptance_interval(self.a, self.tested)
        within = None if interval is None else bool(interval[0] <= self.realized_acceptance <= interval[1])
        return {"acceptance_interval": None if interval is None else list(interval), "acceptance_within": within}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SweepCell":
        def frozen(x):
            return tuple(frozen(y) for y in x) if isinstance(x, list) else x
        fields = cls.__dataclass_fields__.items()  # fields added later (tested, overruled) take their default
        return cls(**{n: frozen(d[n]) for n, f in fields if n in d or f.default is MISSING})


def cell_throughput(cell: dict[str, Any]) -> float:
    """The throughput a cell's speedups are scored on: T_a(k) = G/V (`SweepCell.step_throughput`)."""
    return float(cell["step_throughput"])


def resample_throughput(cells: Sequence[dict[str, Any]], resamples: int = 1000, seed: int = 0) -> np.ndarray:
    """[resamples, len(cells)]: each cell's T = G/V (`SweepCell.step_throughput`) on bootstrap
    resamples of the passes of a sweep.

    The unit drawn is the pass: one repetition on one prompt, in which `run_oracle` runs every cell
    once, each acceptance's draft lengths back to back. Run i of every cell was made in pass i, so
    all cells take the same draw of passes, and the cells of one acceptance keep the moments they
    shared: drawn cell by cell, their step times would vary apart, and the comparisons of k at one
    a, which is what k* and the loss are, would look noisier than they are. A cell pooled over
    several acceptances (the plain-decoding baseline) holds its groups' runs one group after the
    other, each in pass order; it takes the same passes from every group. A resample is the cell's
    tokens per step over the `step_time` of the drawn runs. Only times are drawn: the oracle's
    draws are stratified over a cell's steps (`OracleDraft`, `STEP_BLOCK`), so its tokens per step
    are set by design (0.98-1.01 of G_a(k) in the demo), while its runs' own token counts are not
    samples of anything (at a = 0.98 one run of 4 steps may hold 8 tokens, another 36). One cell
    given at several positions gets one value per draw.
    """
    if resamples < 1:
        raise ValueError(f"resamples={resamples} must be >= 1")
    counts = {len(c["run_steps"]) for c in cells}
    passes = min(counts)
    if any(n % passes for n in counts):
        raise ValueError(f"cells hold {sorted(counts)} runs; resampling passes needs multiples of {passes}")
    pick = np.random.default_rng(seed).integers(passes, size=(resamples, passes))  # the passes drawn
    out = np.empty((resamples, len(cells)))
    done: dict[int, np.ndarray] = {}
    for j, cell in enumerate(cells):
        if id(cell) not in done:
            # `step_time` on every draw at once: each run's median step, then a mean of logs over runs
            medians = np.array([np.median(r) if len(r) else np.nan for r in cell["run_steps"]])  # [runs]
            groups = np.arange(len(medians) // passes)[None, :, None] * passes
            runs = (groups + pick[:, None, :]).reshape(resamples, -1)
            done[id(cell)] = cell["step_tokens"] / np.exp(np.nanmean(np.log(medians[runs]), axis=1))
        out[:, j] = done[id(cell)]
    return out
