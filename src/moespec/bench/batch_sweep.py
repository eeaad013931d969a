"""The oracle sweep at batch size B on llama.cpp: measured total throughput at every (k, a, B), what
`costmodel.batch.score_schedule` scores a schedule k̂*(a, B) against.

At one batch size B (the caller loops over B), the first B prompts decode as one batch
(`engine.batch.generate_batch`), each sequence drafted by its own oracle (`OracleDraft`: the target's greedy continuation, computed once per prompt
by plain batched decoding and handed over as its reference, each draft marked wrong with probability
1 − a by seeded draws, so acceptance is geometric at rate a), at every k of 0..max_k (k = 0: plain
batched decoding, once for every a) and every a; `reps` repetitions in a rotating order, the median
total tokens/s (every sequence's new tokens over the call's wall time, which leaves out the prefill).
The rounds where all B sequences were live give the measured V_B(k) (median round time).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch

from moespec.engine.batch import generate_batch
from moespec.engine.proposers import OracleDraft


def references(target, prompts: Sequence[Sequence[int]], max_new_tokens: int, limit: int) -> list[torch.Tensor]:
    """Each prompt followed by its greedy continuation (plain batched decoding)."""
    out = generate_batch(target, prompts, k=0, max_new_tokens=max_new_tokens, vocab_limit=limit)
    return [torch.tensor(list(p) + r.tokens, dtype=torch.long) for p, r in zip(prompts, out)]


def sweep_batch(target, prompts: Sequence[Sequence[int]], B: int, *, max_k: int, acceptances: Sequence[float],
                max_new_tokens: int = 64, reps: int = 3, seed: int = 0, vocab_limit: int | None = None, progress=None,
                refs: Sequence[torch.Tensor] | None = None) -> dict:
    """{"T": {a: [T(0..max_k)] tokens/s}, "V": [V_B(0..max_k)] s, "samples": {"k,a": [tokens/s]}} at batch
    size B on `target`, a model holding >= B sequences (`LlamaBatch`), the first B prompts decoding.
    progress(done, total) after each call; refs: each prompt's greedy continuation (`references`), when
    already decoded."""
    if B < 1 or B > len(prompts):
        raise ValueError(f"batch size must be 1..{len(prompts)} (the prompts given), got {B}")
    if max_k < 1 or reps < 1 or max_new_tokens < max_k + 2:
        raise ValueError(f"need max_k >= 1, reps >= 1 and max_new_tokens >= max_k + 2; got {max_k}, {reps}, "
                         f"{max_new_tokens}")
    limit = vocab_limit or target.vocab_limit or target.n_vocab
    if refs is None or len(refs) < B:
        refs = references(target, prompts[:B], max_new_tokens, limit)
    cases = [(0, None)] + [(k, float(a)) for k in range(1, max_k + 1) for a in acceptances]
    total, done = len(cases) * reps, 0
    samples = {case: [] for case in cases}
    rounds = {k: [] for k in range(max_k + 1)}
    for rep in range(reps):
        for k, a in cases[rep % len(cases):] + cases[: rep % len(cases)]:
            draft = None if k == 0 else [OracleDraft(a, seed=seed + 1000 * rep + i, reference=refs[i], honour=True)
                                         for i in range(B)]
            batch = generate_batch(target, prompts[:B], draft=draft, k=k, max_new_tokens=max_new_tokens,
                                   vocab_limit=limit)[0].batch
            samples[(k, a)].append(batch.new_tokens / batch.total_s)
            rounds[k] += [s for s, live in zip(batch.round_s, batch.live_per_round) if live == B]
            done += 1
            if progress is not None:
                progress(done, total)
    med = {case: statistics.median(v) for case, v in samples.items()}
    return {"T": {float(a): [med[(0, None)]] + [med[(k, float(a))] for k in range(1, max_k + 1)] for a in acceptances},
            "V": [statistics.median(rounds[k]) if rounds[k] else None for k in range(max_k + 1)],
            "samples": {f"{k},{a}": v for (k, a), v in samples.items()}}
