"""The draft-probability floor read through the draft's own measured calibration (issue 50).

llama.cpp's `--spec-draft-p-min q` stops a draft at its first token whose draft probability (the
draft's top-token probability) is below q. `settings.draft_probability_floor(V)` gives the floor in
acceptance: a token accepted with probability below min_i c_i / V(0) cannot pay. The two are the same
number only for a calibrated draft, whose top-token probability is that token's acceptance. A
distilled draft is not calibrated: on the trained pair the 36 drafts that a p-min of 0.31 stopped were
accepted at 50% (llama.cpp's own runs, BENCHMARKS.md), and the emitted line ran 7% slower than the same
n-max without it.

So p-min is read from the draft on the user's calibration prompts: for every position of the target's
greedy continuation, the draft's top-token probability q given the text before it and whether that
token is the target's (a greedy draft token there is accepted exactly then; every position a verify
pass tests has the committed text before it). The acceptance as a function of q is fitted
non-decreasing (pool-adjacent-violators: a likelier draft token is not accepted less often), and
p-min is the smallest q whose fitted acceptance reaches the floor: 0 when even the least likely
drafts reach it, 1 when none do. Below MIN_DRAFTS positions the fit is not trusted and the caller
keeps the floor itself.
"""

from __future__ import annotations

from collections.abc import Sequence

MIN_DRAFTS = 30  # positions below which the fitted acceptance is not trusted


def monotone_acceptance(probability: Sequence[float], accepted: Sequence[bool]) -> list[tuple[float, float]]:
    """[(q, fitted acceptance)] in ascending q: the non-decreasing least-squares fit of `accepted`
    (0/1) on `probability` (pool-adjacent-violators; equal q pooled first)."""
    if len(probability) != len(accepted):
        raise ValueError(f"{len(probability)} probabilities but {len(accepted)} outcomes; give one per position")
    pairs = sorted(zip((float(q) for q in probability), (float(bool(a)) for a in accepted)))
    blocks: list[list[float]] = []  # [sum of outcomes, count, first index] per pooled block
    for i, (q, a) in enumerate(pairs):
        if i and q == pairs[i - 1][0]:
            blocks[-1][0] += a
            blocks[-1][1] += 1
        else:
            blocks.append([a, 1.0, float(i)])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, n, _ = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += n
    fitted = [0.0] * len(pairs)
    for s, n, first in blocks:
        fitted[int(first): int(first + n)] = [s / n] * int(n)
    return [(q, f) for (q, _), f in zip(pairs, fitted)]


def calibrated_p_min(probability: Sequence[float], accepted: Sequence[bool], floor: float) -> float | None:
    """The smallest draft probability whose fitted acceptance reaches `floor` (module docstring): 0.0
    when the least likely drafts reach it, 1.0 when none do; None below MIN_DRAFTS positions."""
    if len(probability) < MIN_DRAFTS:
        return None
    fit = monotone_acceptance(probability, accepted)
    if fit[0][1] >= floor:
        return 0.0
    return next((q for q, f in fit if f >= floor), 1.0)
