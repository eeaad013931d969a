"""Speculation at batch size B: the step time of a B-sequence verify pass and what follows from it.

A step at batch B drafts k tokens for each of B sequences and verifies them in one pass of
n = B(k + 1) tokens (one k for the whole batch, as vLLM and llama-server run it). Each sequence
commits G_a(k) tokens on average, so with V_B(k) the time of that step

    T_{a,B}(k) = G_a(k) / V_B(k)     per sequence,        B G_a(k) / V_B(k)     in all,

and k*(a, B) = argmax_k T_{a,B}(k): the theory of Sec. 3 and App. B holds for any positive step
times, so the staircase, a0 = V_B(1)/V_B(0) − 1 and the step points carry over with V_B in place of
V. What changes with B is V_B itself (`step_times`), which this module builds the way (22) builds V
at B = 1:

    τ̂_B(k+1) = τ_B(1) + Σ_l [ t̄_l(U_l^B(k+1), B(k+1)) − t̄_l(U_l^B(1), B) ] + g(B(k+1)) − g(B),
    V̂_B(k)   = τ̂_B(k+1) + h_B(k),

τ_B(1) a measured pass of one token in each of B sequences (its fixed time, the B caches its
attention reads, its B rows), t̄_l(U, n) the expert operation's time at a union of U experts over n
rows (the fits (4)/(E.1), characterized up to the largest n used), U_l^B(n) the expected union of B
windows from distinct documents (`moe.batch_union`), g the growth of the dense products with rows,
h_B(k) the step's time outside the pass.

Error bounds: (20) and (21) hold for any V̂ within δ of V, so they carry over at every B; δ from ε
(App. C, "From ε to δ") needs ε measured on passes of up to B(kmax + 1) rows, which a
characterization at n <= 9 does not give. The union U^B is an estimate from a trace, not a
bandwidth, so its sampling error is outside the bounds, as is the growth with k of attention's
queries over the B caches, which τ_B(1) holds only at k = 0.
Every function but score_schedule (measured throughputs, floats) is exact on int and Fraction inputs.
"""

from __future__ import annotations

import statistics
from typing import Mapping, Sequence

from moespec.costmodel.theory import best_draft_length, check_acceptance, check_step_times, throughput


def pass_tokens(B: int, k: int) -> int:
    """n = B(k + 1): the tokens of one verify pass of B sequences drafting k each."""
    if int(B) != B or B < 1 or int(k) != k or k < 0:
        raise ValueError(f"need an integer batch B >= 1 and draft length k >= 0; got B={B!r}, k={k!r}")
    return int(B) * (int(k) + 1)


def total_throughput(V_B: Sequence, a, k: int, B: int):
    """B G_a(k) / V_B(k): tokens per unit time of the whole batch."""
    return int(B) * throughput(V_B, a, k)


def no_draft_pays(V: Sequence) -> bool:
    """True when no k >= 1 beats plain decoding at any acceptance a < 1: V(k) >= (k + 1) V(0) for every
    k, since G_a(k) < k + 1 for a < 1 (and G_a(k) -> k + 1 as a -> 1 makes the condition exact)."""
    V = check_step_times(V)
    return all(V[k] >= (k + 1) * V[0] for k in range(1, len(V)))


def schedule(V_by_batch: Mapping[int, Sequence], acceptances: Sequence) -> dict:
    """{a: {B: k*(a, B)}} over the acceptances and the batch sizes given ({B: V_B(0..kmax)})."""
    checked = {int(B): check_step_times(V) for B, V in sorted(V_by_batch.items())}
    return {a: {B: best_draft_length(V, check_acceptance(a)) for B, V in checked.items()} for a in acceptances}


def largest_paying_batch(V_by_batch: Mapping[int, Sequence], a) -> int | None:
    """The largest B given at which some k >= 1 beats plain decoding at acceptance a, else None."""
    paying = [B for B, V in V_by_batch.items() if best_draft_length(check_step_times(V), check_acceptance(a)) >= 1]
    return max(paying) if paying else None


def first_never_paying_batch(V_by_batch: Mapping[int, Sequence]) -> int | None:
    """The smallest B given from which on no draft pays at any acceptance (`no_draft_pays` at it and every
    larger B given), else None: the batch size above which speculation is off whatever the draft."""
    found = None
    for B in sorted(V_by_batch, reverse=True):
        if not no_draft_pays(V_by_batch[B]):
            break
        found = int(B)
    return found


def step_times(tau_1: float, expert_time, dense_growth, h: Sequence, unions: Sequence, B: int) -> list:
    """V̂_B(0..kmax) (module docstring) for one batch size B.

    tau_1: τ_B(1), the measured pass of one token per sequence. expert_time(U, n): the expert
    operation summed over the layers at per-layer unions U [L] over n rows (the fits). dense_growth(n):
    the dense products' time at n rows (g(n) up to a constant, which cancels). h: h_B(0..kmax).
    unions: U^B(1..kmax+1) per layer, [kmax+1][L]."""
    if len(unions) != len(h):
        raise ValueError(f"unions for {len(unions)} pass sizes and h for {len(h)} draft lengths must match")
    base_experts, base_dense = expert_time(unions[0], B), dense_growth(B)
    V = []
    for k, (U, h_k) in enumerate(zip(unions, h)):
        n = pass_tokens(B, k)
        V.append(tau_1 + (expert_time(U, n) - base_experts) + (dense_growth(n) - base_dense) + h_k)
    return V


def score_schedule(V_by_batch: Mapping[int, Sequence], measured: Mapping[int, Mapping], acceptances: Sequence) -> dict:
    """The schedule k̂*(a, B) from V̂_B scored against a sweep at batch size B, with the rules of B = 1
    (cost-model paper, Table 8): k̂* within one of the measured best, and the throughput lost by
    running k̂* instead of it, 1 − T(k̂*)/T(k_meas), per (a, B) cell.

    V_by_batch: {B: V̂_B(0..kmax)} (any unit). measured: {B: {a: [T(0..kmax)]}}, the sweep's total
    throughput at each k (the acceptances given as keys, as in `acceptances`). Returns {"cells": [...],
    "within_one": share of cells, "loss_max", "loss_median"}."""
    cells = []
    for B in sorted(measured):
        V = check_step_times(V_by_batch[B])
        for a in acceptances:
            T = [float(t) for t in measured[B][a]]
            if len(T) != len(V):
                raise ValueError(f"batch {B}, a = {a}: {len(T)} measured throughputs for {len(V)} step times")
            k_hat, k_meas = best_draft_length(V, check_acceptance(a)), max(range(len(T)), key=T.__getitem__)
            cells.append({"B": int(B), "a": float(a), "k_hat": k_hat, "k_measured": k_meas,
                          "within_one": abs(k_hat - k_meas) <= 1, "loss": 1 - T[k_hat] / T[k_meas]})
    if not cells:
        raise ValueError("no (a, B) cell to score: give a sweep at one batch size or more")
    losses = [c["loss"] for c in cells]
    return {"cells": cells, "within_one": sum(c["within_one"] for c in cells) / len(cells),
            "loss_max": max(losses), "loss_median": statistics.median(losses)}
