"""Speculative sweeps: the oracle sweep over k x a (cost-model paper, Sec. 4 and App. D.2) and the
real-draft K-sweep (engine paper, Sec. 5-6).

Oracle sweep: `OracleDraft` proposes the target's greedy token, marked wrong with probability 1 - a,
so acceptance is geometric at rate a and every step verifies the greedy text. At each draft length k
= 0..8, acceptance a of the paper's grid and kernel, a run decodes `new_tokens` tokens from a prompt
at depth d, or, with `steps`, exactly `steps` steps (`oracle_budget`). Every round is a step: the
prompt's last token is fed by the first round, not the prefill (`generate(prefill_last=False)`), so
every pass verifies k + 1 tokens. Recorded: the step time V(k) (`step_time`: each run's median step,
averaged over runs on a log scale), tokens per step against G_a(k) = 1 + a + ... + a^k and the
throughput T_a(k) = G/V they give (Sec. 1), the realized acceptance (accepted over tested drafts,
the MLE of a), and h(k), the time per step outside the verify pass, so that V(k) = τ_p(k+1) + h(k)
(Sec. 3.1).

Real-draft sweep: with a `DraftModel` or `PromptLookup`, the K-sweep of throughput, pooled
acceptance and acceptance by position, TTFT, the draft / verify / sampling / other split, peak
memory and the draft/target step-time ratio.

Each run is one point of a `moespec.artifacts.PointLog`, keyed by its parameters, appended when it
finishes: an interrupted sweep resumes at the first missing point. The prompt is prefilled once per
(prompt, depth) and shared by every run on it (`PrefilledTarget`), so a run's clock covers decoding
alone; the prefill time is recorded once and added back into TTFT.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from moespec.bench.verify import (
    DEDUP, KERNELS, PREFILL_CHUNK, OnPoint, _logged, avoid_slot_prefill, prompt_ids, vocab_limit,
)
from moespec.costmodel.predict import ACCEPTANCE_GRID
from moespec.costmodel.theory import expected_tokens
from moespec.device import synchronize
from moespec.engine.cached import CachedModel
from moespec.engine.decode import generate
from moespec.engine.proposers import STEP_BLOCK, OracleDraft


class PrefilledTarget:
    """A target whose cache holds one prompt's prefill, reused by every `generate` call on it.

    It presents the `CachedModel` interface (`extend`, `truncate`, `reset`, `length`, `width`,
    `vocab_limit`, `device`, `forward_s`). Positions inside the prompt are served from the logits
    kept at prefill (rows [P, V]); positions past it run the model on the real cache, which always
    holds the prompt.
    Extending a prompt position with any other token than the prompt's raises ValueError.
    `hold(tokens)` makes the prompt longer by `tokens`, so that runs can start further into a text.
    """

    def __init__(self, model, prompt: torch.Tensor):  # prompt: [P] int64
        self.inner = CachedModel(model)
        self.prompt = torch.as_tensor(prompt, dtype=torch.long).reshape(-1)
        P = self.prompt.shape[0]
        synchronize(self.inner.device)
        t0 = time.perf_counter()
        rows = [self.inner.extend(self.prompt[s : s + PREFILL_CHUNK]) for s in range(0, P, PREFILL_CHUNK)]
        synchronize(self.inner.device)
        self.prefill_s = time.perf_counter() - t0
        self.logits = torch.cat(rows)  # [P, V] float32 CPU, row j predicts token j+1
        self.device = self.inner.device
        self.forward_s = 0.0
        self._length = 0

    @property
    def length(self) -> int:
        return self._length

    @property
    def width(self) -> int:
        return self.inner.width

    @property
    def vocab_limit(self) -> int | None:
        return self.inner.vocab_limit

    def reset(self) -> None:
        self._length = 0
        self.forward_s = 0.0
        self.inner.truncate(self.prompt.shape[0])

    def hold(self, tokens: torch.Tensor) -> None:
        """Hold `tokens` [t] after the prompt as well: run on the cache (untimed), their logits kept."""
        tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        self.reset()
        if tokens.numel():
            self.logits = torch.cat([self.logits, self.inner.extend(tokens)])
            self.prompt = torch.cat([self.prompt, tokens])

    def truncate(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"truncate() needs n >= 0, got {n}")
        self._length = min(self._length, n)
        self.inner.truncate(max(self._length, self.prompt.shape[0]))

    def extend(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append tokens [n]; returns the logits of the n new positions, [n, V] float32 CPU."""
        tokens = tokens.reshape(-1)
        P, start, n = self.prompt.shape[0], self._length, int(tokens.shape[0])
        inside = max(0, min(start + n, P) - start)
        if inside and not torch.equal(tokens[:inside], self.prompt[start : start + inside]):
            raise ValueError(
                f"PrefilledTarget holds one prompt; positions {start}..{start + inside - 1} were extended "
                "with other tokens. Build one PrefilledTarget per prompt."
            )
        parts = [self.logits[start : start + inside]]
        if inside < n:
            before = self.inner.forward_s
            parts.append(self.inner.extend(tokens[inside:]))
            self.forward_s += self.inner.forward_s - before
        self._length = start + n
        return torch.cat(parts)


def _record(result, prefill_s: float, extra: dict | None = None) -> dict:
    """What a point log keeps of one run: its Stats, the shared prefill time and extras."""
    return {"stats": result.stats.to_dict(), "prefill_s": prefill_s, **(extra or {})}


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
    run_steps: tuple[tuple[float, ...], ...] = ()  # each run's step times, seconds (`resample_throughput`)

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
        if any("round_s" not in r["stats"] for r in runs):
            raise ValueError(f"runs at k={k}, a={a} lack per-round times: their point log was written by an "
                             "older moespec; delete it (or use a new --out-dir) to measure again")
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
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SweepCell":
        def frozen(x):
            return tuple(frozen(y) for y in x) if isinstance(x, list) else x
        return cls(**{n: frozen(d[n]) for n in cls.__dataclass_fields__ if n in d})


def cell_throughput(cell: dict[str, Any]) -> float:
    """The throughput a cell's speedups are scored on: T_a(k) = G/V (`SweepCell.step_throughput`);
    the wall-clock figure for a sweep written before cells had one."""
    return float(cell.get("step_throughput", cell["throughput"]))


def baseline(entry: dict[str, Any], a: float | None) -> dict[str, Any] | None:
    """The plain-decoding cell every speedup at acceptance `a` of an oracle entry is taken over.

    Plain decoding (k = 0) drafts nothing, so its throughput does not depend on a: the k = 0 run in
    each acceptance's block repeats one experiment, and the baseline pools all of them (`plain`): 11
    times the steps of one cell on the paper's grid, at the same moments of the sweep as every other
    cell. Taken at each a alone, the k = 0 cell's own noise (40 steps in the demo, +-3%
    on this shared machine) went into every speedup and every k* comparison at that a. An entry
    written before `plain` existed gives its k = 0 cell at `a`, or its only k = 0 cell.
    """
    if entry.get("plain"):
        return entry["plain"]
    zero = {None if c["a"] is None else round(float(c["a"]), 6): c for c in entry["cells"] if c["k"] == 0}
    return zero.get(None if a is None else round(float(a), 6), zero.get(None))


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
    counts = {len(c.get("run_steps") or ()) for c in cells}
    passes = min(counts, default=0)
    if passes == 0:
        bare = next(c for c in cells if not c.get("run_steps"))
        raise ValueError(f"cell k={bare['k']}, a={bare['a']} keeps no per-run steps (written by an older "
                         "moespec); measure again, or score without resamples")
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


def _switch(model, kernel: str | None) -> None:
    if kernel is not None:
        model.set_experts_implementation(kernel)


class _Prompts:
    """Prompts at one depth, each prefilled on first use only (a resumed sweep may need none).

    `target(i, text)` holds prompt i's `text` (by default the prompt itself): a run may start
    further into the target's greedy text (`run_oracle`'s `start_stride`)."""

    def __init__(self, model, tokenizer, depth: int, count: int, prefill_last: bool = True):
        self.model, self.ids = model, prompt_ids(tokenizer, depth, count)
        self.prefill_last = prefill_last  # False: the targets hold all but the last token (its pass is a round's)
        self._targets: dict[int, PrefilledTarget] = {}

    def target(self, i: int, text: Sequence[int] | None = None) -> PrefilledTarget:
        text = list(self.ids[i] if text is None else text)
        held = torch.tensor(text if self.prefill_last else text[:-1])
        have = self._targets.get(i)
        if have is None or not (have.prompt.shape[0] <= held.shape[0]
                                and torch.equal(have.prompt, held[: have.prompt.shape[0]])):
            self._targets.clear()  # one prompt's cache at a time
            avoid_slot_prefill(self.model)
            self._targets[i] = PrefilledTarget(self.model, held)
        elif have.prompt.shape[0] < held.shape[0]:  # a later start on the same text: hold the tokens between
            avoid_slot_prefill(self.model)
            have.hold(held[have.prompt.shape[0]:])
        return self._targets[i]


def oracle_budget(k: int, new_tokens: int, steps: int | None) -> tuple[int, int | None]:
    """(max_new_tokens, max_steps) of one oracle run: `new_tokens`, or exactly `steps` steps.

    At a fixed token count a cell gets as many rounds as its tokens need: at 64 tokens a run at
    a = 0.98, k = 8 takes 8 rounds, the last cut short by the budget, while one at a = 0.2 takes
    51. A cell's throughput is a mean over its rounds, so its error follows the round count. With
    `steps`, a run stops after exactly that many rounds, each drafting its full k (room is left for
    steps * (k + 1) tokens): every cell gets the same number of steps, none cut short.
    """
    if steps is None:
        return new_tokens, None
    if steps < 1:
        raise ValueError(f"steps={steps} must be >= 1 steps per run (or None for new_tokens)")
    return steps * (k + 1), steps


def oracle_points(*, depths, ks, acceptances, kernels, prompts: int, reps: int) -> int:
    """How many runs `run_oracle` logs: one per (k, a), k = 0 included, per prompt, kernel and repetition."""
    return len(depths) * prompts * len(ks) * len(acceptances) * len(kernels) * reps


def _oracle_order(ks: Sequence[int], acceptances: Sequence[float]) -> list[tuple[int, float]]:
    """(k, a) in the order they run on one prompt: for each a, every k back to back, ascending and
    descending in turn. k*(a) and the speedup over k = 0 compare runs at one a, so those run within
    a minute of each other: on a shared machine whose speed drifts by 10-20% over minutes, a k = 0
    run made once at the start set every speedup of the sweep by that moment's speed. k = 0 does not
    use the oracle; its runs in every block pool into the sweep's baseline (`baseline`), measured at
    the same moments as every cell."""
    order: list[tuple[int, float]] = []
    for j, a in enumerate(acceptances):
        order += [(k, a) for k in (ks if j % 2 == 0 else ks[::-1])]
    return order


def run_oracle(
    model,
    tokenizer,
    *,
    depths: Sequence[int] = (512, 4096),
    ks: Sequence[int] = range(0, 9),
    acceptances: Sequence[float] = ACCEPTANCE_GRID,
    kernels: Sequence[str] = KERNELS,
    prompts: int = 6,
    reps: int = 1,
    new_tokens: int = 256,
    steps: int | None = None,
    seed: int = 0,
    start_stride: int = 0,
    log=None,
    on_point: OnPoint | None = None,
) -> list[dict[str, Any]]:
    """The oracle sweep; one entry per (kernel, depth) with a cell per (k, a), h(k) and V(k).

    Kernels alternate innermost, run by run, so drift falls on both alike; at each a the draft
    lengths, k = 0 included, run back to back (`_oracle_order`); each prompt's repetitions pass over
    every cell in turn, so a cell's runs spread over the whole sweep and a prompt is prefilled once.
    steps: every run takes exactly that many steps (`oracle_budget`) instead of decoding
    `new_tokens`. Short runs in many repetitions put each cell at more moments of the machine's
    drifting speed and put k = 0 and the other k of a block seconds apart; they cost nothing extra,
    as a run has no set-up inside its clock beyond the prompt's cached rows. Greedy decoding.
    The oracle's draws form one seeded sequence per sweep: a cell's runs (prompts x repetitions, in
    run order) read consecutive stretches of it (`OracleDraft` offset), one draw per step,
    stratified in blocks of one cell's steps when `steps` is given, so each cell's steps follow the
    quantiles of the geometric law, and every cell reads the same draws (common random numbers
    across k and a).

    start_stride: repetition r's runs start r·start_stride tokens into the target's greedy text (the
    prompt followed by that much of it, untimed). With `steps=1` every cell's steps then verify the
    same windows of text, those starting at 0, T, 2T, ... tokens in, at every k and a: the oracle's
    drafts are that text (`OracleDraft` marks wrong drafts, it does not replace them). A run of
    several steps covers a stretch whose length grows with a (at a = 0.98 and k = 8, 4 steps read
    36 tokens, at a = 0.2 about 5); where the greedy text cycles through a few ids, as on the
    synthetic presets, stretches of different lengths route to different numbers of experts, and
    the step time came to depend on a (BENCHMARKS.md, "One step per run").
    """
    if start_stride < 0:
        raise ValueError(f"start_stride must be >= 0 tokens, got {start_stride}")
    ks = sorted(set(int(k) for k in ks))
    runs: dict[tuple, list[dict]] = {}
    references: dict[tuple[int, int], torch.Tensor] = {}  # (depth, prompt) -> greedy reference, shared by every oracle
    order = _oracle_order(ks, acceptances)
    longest = max(oracle_budget(k, new_tokens, steps)[0] for k in ks) + start_stride * (reps - 1)
    block = prompts * reps * steps if steps else STEP_BLOCK  # one cell's steps
    for depth in depths:
        cache = _Prompts(model, tokenizer, depth, prompts, prefill_last=False)

        def reference(i: int, target: PrefilledTarget, depth=depth, cache=cache) -> None:
            """Prompt i followed by `longest` greedy tokens of the target, decoded on `target` (prompt i's)."""
            greedy = generate(target, cache.ids[i], k=0, temperature=0.0, max_new_tokens=longest,
                              vocab_limit=vocab_limit(tokenizer), prefill_last=False).tokens
            references[(depth, i)] = torch.as_tensor(list(cache.ids[i]) + greedy, dtype=torch.long)

        for i in range(prompts):
            for rep in range(reps):
                for k, a in order:
                    for kernel in kernels:
                        tokens, rounds = oracle_budget(k, new_tokens, steps)
                        key = {"part": "oracle", "kernel": kernel, "depth": depth, "prompt": i, "k": k,
                               "a": a, "rep": rep, "new_tokens": tokens, "seed": seed, "prefill_last": False,
                               "oracle_draws": f"one per step, blocks of {block}", "wrong_drafts": "marked",
                               **({"steps": rounds} if rounds else {}),
                               **({"start": start_stride * rep} if start_stride else {})}
                        cell = runs.setdefault((kernel, depth, k, a), [])
                        offset = sum(r["draws"] for r in cell)  # where this cell's draws stopped

                        def run(i=i, k=k, a=a, kernel=kernel, tokens=tokens, rounds=rounds, offset=offset, rep=rep):
                            start = start_stride * rep
                            if (k or start) and (depth, i) not in references:  # untimed, once per prompt
                                reference(i, cache.target(i))
                            text = cache.ids[i]
                            if start:  # the prompt and the greedy text up to this repetition's start
                                text = references[(depth, i)][: len(text) + start].tolist()
                            target = cache.target(i, text)
                            _switch(model, kernel)
                            ref = references.get((depth, i))
                            oracle = OracleDraft(a, seed=seed, reference=ref, offset=offset, block=block) if k else None
                            result = generate(target, text, draft=oracle, k=k, temperature=0.0,
                                              max_new_tokens=tokens, max_steps=rounds, seed=seed + i,
                                              vocab_limit=vocab_limit(tokenizer), prefill_last=False)
                            return _record(result, target.prefill_s, {"reanchors": oracle.reanchors if oracle else 0,
                                                                      "draws": oracle.draws if oracle else 0,
                                                                      "prefill_last": False})

                        cell.append(_logged(log, key, run, on_point))
    out = []
    for kernel in kernels:
        for depth in depths:
            cells = []
            for k in ks:
                for a in acceptances:
                    cells.append(SweepCell.pool(k, a, runs[(kernel, depth, k, a)]).to_dict())
            # pooled over acceptances, one acceptance's runs after another, each in pass order
            # (`resample_throughput` relies on that order)
            at_k = {k: SweepCell.pool(k, None, [r for (p, d, kk, _), rs in runs.items()
                                                if (p, d, kk) == (kernel, depth, k) for r in rs]) for k in ks}
            out.append({
                "kernel": kernel,
                "depth": depth,
                "cells": cells,
                "plain": at_k[0].to_dict() if 0 in at_k else None,  # every k = 0 run: the baseline (`baseline`)
                "h": {str(k): c.h for k, c in at_k.items()},
                "V": {str(k): c.step_s for k, c in at_k.items()},
            })
    return out


def draft_points(*, depths, ks, prompts: int, reps: int) -> int:
    """How many runs `run_draft` logs (k = 0, the baseline, is always included)."""
    return len(depths) * prompts * len(set(ks) | {0}) * reps


def run_draft(
    model,
    tokenizer,
    draft,
    *,
    draft_name: str,
    depths: Sequence[int] = (512,),
    ks: Sequence[int] = (1, 2, 4, 6, 8),
    prompts: int = 6,
    reps: int = 1,
    new_tokens: int = 96,
    temperature: float = 0.8,
    kernel: str | None = DEDUP,
    seed: int = 0,
    log=None,
    on_point: OnPoint | None = None,
) -> list[dict[str, Any]]:
    """The real-draft K-sweep (engine paper, Sec. 6.2-6.4), one entry per depth.

    `draft` is a proposer (`DraftModel`, `PromptLookup`) or a causal LM; k = 0 (plain decoding) is
    the baseline of every speedup. The draft/target step-time ratio is the draft's time per drafted
    token over the baseline's time per step (Sec. 7).
    """
    ks = sorted(set(int(k) for k in ks) | {0})
    out = []
    for depth in depths:
        cache = _Prompts(model, tokenizer, depth, prompts)
        runs: dict[int, list[dict]] = {k: [] for k in ks}
        for i in range(prompts):
            for k in ks:
                for rep in range(reps):
                    key = {"part": "draft", "draft": draft_name, "kernel": kernel, "depth": depth, "prompt": i,
                           "k": k, "rep": rep, "new_tokens": new_tokens, "temperature": temperature, "seed": seed}

                    def run(i=i, k=k, rep=rep):
                        target = cache.target(i)
                        _switch(model, kernel)
                        result = generate(target, cache.ids[i], draft=draft if k else None, k=k,
                                          temperature=temperature, max_new_tokens=new_tokens,
                                          seed=seed + 1000 * rep + i, vocab_limit=vocab_limit(tokenizer))
                        return _record(result, target.prefill_s)

                    runs[k].append(_logged(log, key, run, on_point))
        cells = {k: SweepCell.pool(k, None, rs) for k, rs in runs.items()}
        base = cells[0]
        drafted = sum(sum(r["stats"]["drafted_by_position"]) for k in ks if k for r in runs[k])
        draft_s = sum(c.draft_s for c in cells.values() if c.k)
        draft_step = draft_s / drafted if drafted else float("nan")
        out.append({
            "depth": depth,
            "draft": draft_name,
            "kernel": kernel,
            "cells": [c.to_dict() for c in cells.values()],
            "baseline_throughput": base.throughput,
            "speedup": {str(k): c.throughput / base.throughput for k, c in cells.items()},
            "draft_step_s": draft_step,
            "target_step_s": base.step_s,
            "draft_target_ratio": draft_step / base.step_s,
        })
    return out
