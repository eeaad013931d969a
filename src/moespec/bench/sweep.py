"""Speculative sweeps: the oracle sweep over k x a (cost-model paper, Sec. 4 and App. D.2) and the
real-draft K-sweep (engine paper, Sec. 5-6).

Oracle sweep: `OracleDraft` proposes the target's greedy token, marked wrong with probability 1 - a,
so acceptance is geometric at rate a and every step verifies the greedy text. Each round commits the
oracle's verdict (`OracleDraft(honour=True)`): its verify pass is run and timed as any, but a near
tie that the (k+1)-token pass breaks otherwise than the one-token passes that decoded the text does
not reject a right draft (docs/methodology.md, "The oracle's verdict"); a cell records how often
that happened (`overruled`) and whether its realized acceptance lies in its interval
(`sweep_cells`). At each draft length k = 0..8, acceptance a of the paper's grid and kernel, a run
decodes `new_tokens` tokens from a prompt at depth d, or, with `steps`, exactly `steps` steps
(`oracle_budget`). Every round is a step: the prompt's last token is fed by the first round, not the
prefill (`generate(prefill_last=False)`), so every pass verifies k + 1 tokens. Recorded: the step
time V(k) (`step_time`: each run's median step, averaged over runs on a log scale), tokens per step
against G_a(k) = 1 + a + ... + a^k and the throughput T_a(k) = G/V they give (Sec. 1), the realized
acceptance (accepted over tested drafts, the MLE of a), and h(k), the time per step outside the
verify pass, so that V(k) = τ_p(k+1) + h(k) (Sec. 3.1).

Real-draft sweep: with a `DraftModel` or `PromptLookup`, the K-sweep of throughput, pooled
acceptance and acceptance by position, TTFT, the draft / verify / sampling / other split, peak
memory and the draft/target step-time ratio.

Each run is one point of a `moespec.pointlog.PointLog`, keyed by its parameters, appended when it
finishes: an interrupted sweep resumes at the first missing point. The prompt is prefilled once per
(prompt, depth) and shared by every run on it (`PrefilledTarget`), so a run's clock covers decoding
alone; the prefill time is recorded once and added back into TTFT.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, Sequence

import torch

from moespec.pointlog import OnPoint, logged_point
from moespec.bench.prefilled import PrefilledPrompts, switch_kernel
from moespec.texts import vocab_limit
from moespec.costmodel.sweep_cells import SweepCell
from moespec.costmodel.predict import ACCEPTANCE_GRID
from moespec.engine.decode import generate
from moespec.kernel_names import DEDUP, ENGINE_KERNELS
from moespec.engine.proposers import STEP_BLOCK, OracleDraft


def _record(result, prefill_s: float, extra: dict | None = None) -> dict:
    """What a point log keeps of one run: its Stats, the shared prefill time and extras."""
    return {"stats": result.stats.to_dict(), "prefill_s": prefill_s, **(extra or {})}


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
    use the oracle; its runs in every block pool into the sweep's baseline ("plain"), measured at
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
    kernels: Sequence[str] = ENGINE_KERNELS,
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

    Kernels alternate run by run; at each a the draft lengths, k = 0 included, run back to back
    (`_oracle_order`); each prompt's repetitions pass over every cell in turn, so a cell's runs
    spread over the whole sweep. Greedy decoding. steps: every run takes exactly that many steps
    (`oracle_budget`) instead of decoding `new_tokens`. The oracle's draws form one seeded sequence
    per sweep, stratified over a cell's steps and shared by every cell (common random numbers).
    start_stride: repetition r's runs start r·start_stride tokens into the target's greedy text, so
    with `steps=1` every cell verifies the same windows of text. Why each choice:
    docs/methodology.md, "The oracle sweep".
    """
    if start_stride < 0:
        raise ValueError(f"start_stride must be >= 0 tokens, got {start_stride}")
    ks = sorted(set(int(k) for k in ks))
    runs: dict[tuple, list[dict]] = {}
    order = _oracle_order(ks, acceptances)
    longest = max(oracle_budget(k, new_tokens, steps)[0] for k in ks) + start_stride * (reps - 1)
    block = prompts * reps * steps if steps else STEP_BLOCK  # one cell's steps
    for depth in depths:
        cache = PrefilledPrompts(model, tokenizer, depth, prompts, prefill_last=False)
        greedy = _GreedyText(cache, tokenizer, longest)  # shared by every oracle at this depth
        for i, rep, (k, a), kernel in itertools.product(range(prompts), range(reps), order, kernels):
            tokens, rounds = oracle_budget(k, new_tokens, steps)
            key = {"part": "oracle", "kernel": kernel, "depth": depth, "prompt": i, "k": k,
                   "a": a, "rep": rep, "new_tokens": tokens, "seed": seed, "prefill_last": False,
                   "oracle_draws": f"one per step, blocks of {block}", "wrong_drafts": "marked",
                   "verdict": "the oracle's",
                   **({"steps": rounds} if rounds else {}),
                   **({"start": start_stride * rep} if start_stride else {})}
            cell = runs.setdefault((kernel, depth, k, a), [])
            offset = sum(r["draws"] for r in cell)  # where this cell's draws stopped
            run = functools.partial(_oracle_run, model, tokenizer, cache, greedy, i=i, k=k, a=a, kernel=kernel,
                                    tokens=tokens, rounds=rounds, start=start_stride * rep, offset=offset,
                                    seed=seed, block=block)
            cell.append(logged_point(log, key, run, on_point))
    return [_oracle_entry(runs, kernel, depth, ks, acceptances) for kernel in kernels for depth in depths]


class _GreedyText:
    """Each prompt at one depth followed by `longest` greedy tokens of the target, decoded (untimed)
    the first time a run asks for it: the oracle's reference and the text later repetitions start in."""

    def __init__(self, cache: PrefilledPrompts, tokenizer, longest: int):
        self.cache, self.tokenizer, self.longest = cache, tokenizer, longest
        self.texts: dict[int, torch.Tensor] = {}  # prompt -> [prompt + longest] token ids

    def __call__(self, i: int) -> torch.Tensor:
        if i not in self.texts:
            ids = self.cache.ids[i]
            greedy = generate(self.cache.target(i), ids, k=0, temperature=0.0, max_new_tokens=self.longest,
                              vocab_limit=vocab_limit(self.tokenizer), prefill_last=False).tokens
            self.texts[i] = torch.as_tensor(list(ids) + greedy, dtype=torch.long)
        return self.texts[i]


def _oracle_run(model, tokenizer, cache: PrefilledPrompts, greedy: _GreedyText, *, i: int, k: int, a: float,
                kernel: str, tokens: int, rounds: int | None, start: int, offset: int, seed: int,
                block: int) -> dict:
    """One oracle run on prompt i, `start` tokens into its greedy text, with `kernel`: the oracle
    draft at (k, a), its draws from `offset` of the cell's sequence, or plain decoding at k = 0."""
    ref = greedy(i) if k or start else None
    text = cache.ids[i]
    if start:  # the prompt and the greedy text up to this repetition's start
        text = ref[: len(text) + start].tolist()
    target = cache.target(i, text)
    switch_kernel(model, kernel)
    oracle = OracleDraft(a, seed=seed, reference=ref, offset=offset, block=block, honour=True) if k else None
    result = generate(target, text, draft=oracle, k=k, temperature=0.0, max_new_tokens=tokens, max_steps=rounds,
                      seed=seed + i, vocab_limit=vocab_limit(tokenizer), prefill_last=False)
    return _record(result, target.prefill_s, {"reanchors": oracle.reanchors if oracle else 0,
                                              "draws": oracle.draws if oracle else 0,
                                              "overruled": oracle.overruled if oracle else 0, "prefill_last": False})


def _oracle_entry(runs: dict[tuple, list[dict]], kernel: str, depth: int, ks: Sequence[int],
                  acceptances: Sequence[float]) -> dict[str, Any]:
    """One (kernel, depth) entry of the sweep: a cell per (k, a), and per k the runs of every
    acceptance pooled into h(k) and V(k), k = 0's into the baseline."""
    cells = [SweepCell.pool(k, a, runs[(kernel, depth, k, a)]).to_dict() for k in ks for a in acceptances]
    # pooled over acceptances, one acceptance's runs after another, each in pass order
    # (`resample_throughput` relies on that order)
    at_k = {k: SweepCell.pool(k, None, [r for (p, d, kk, _), rs in runs.items()
                                        if (p, d, kk) == (kernel, depth, k) for r in rs]) for k in ks}
    return {
        "kernel": kernel,
        "depth": depth,
        "cells": cells,
        "plain": at_k[0].to_dict() if 0 in at_k else None,  # every k = 0 run, pooled: the baseline
        "h": {str(k): c.h for k, c in at_k.items()},
        "V": {str(k): c.step_s for k, c in at_k.items()},
    }


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
        cache = PrefilledPrompts(model, tokenizer, depth, prompts)
        runs: dict[int, list[dict]] = {k: [] for k in ks}
        for i in range(prompts):
            for k in ks:
                for rep in range(reps):
                    key = {"part": "draft", "draft": draft_name, "kernel": kernel, "depth": depth, "prompt": i,
                           "k": k, "rep": rep, "new_tokens": new_tokens, "temperature": temperature, "seed": seed}

                    def run(i=i, k=k, rep=rep):
                        target = cache.target(i)
                        switch_kernel(model, kernel)
                        result = generate(target, cache.ids[i], draft=draft if k else None, k=k,
                                          temperature=temperature, max_new_tokens=new_tokens,
                                          seed=seed + 1000 * rep + i, vocab_limit=vocab_limit(tokenizer))
                        return _record(result, target.prefill_s)

                    runs[k].append(logged_point(log, key, run, on_point))
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
