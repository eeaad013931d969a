"""Step times at batch size B timed on llama.cpp: V_B(k) for the batch settings (`moespec settings
--batch-sizes ... --timed FILE.gguf`, `costmodel.settings.recommend_batches`).

For each B, B sequences hold `depth` tokens each (seeded random ids, a different stream per sequence);
a verify pass feeds k + 1 tokens to every one of them in one llama_decode (`LlamaBatch.decode_parts`,
the pass `engine.batch.generate_batch` runs), timed by `bench.timing.measure` and rolled back before
the next call, outside the timed interval. With a draft file, a draft step is one token per sequence
on the draft, timed the same way:

    V_B(k) = τ_B(k + 1) + k d_B,

τ_B(n) the median pass of n tokens per sequence, d_B the median draft step (0 without a draft:
prompt lookup and the oracle cost no pass). This is the measured counterpart of
`costmodel.batch.step_times`; it times what the machine does at each B rather than predicting it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from moespec.bench.timing import Timing, measure


def fill(model, sequences: int, depth: int, seed: int) -> None:
    """Sequences 0..sequences-1 of `model` (a `LlamaBatch`, reset first) holding `depth` seeded random ids each."""
    model.reset()
    rng = np.random.default_rng(seed)
    limit = min(model.n_vocab, 32000)
    for s in range(sequences):
        ids = rng.integers(1, limit, size=depth).tolist()
        for a in range(0, depth, model.batch):
            model.decode_parts([(s, ids[a: a + model.batch])])


def _opened(path: Path, sequences: int, depth: int, extra: int, threads: int | None, seed: int):
    from moespec.backends.llama_batch import LlamaBatch

    model = LlamaBatch(path, sequences=sequences, threads=threads, n_ctx=depth + extra + 1)
    fill(model, sequences, depth, seed)
    return model


def _pass(model, B: int, n: int, depth: int, reps: int) -> Timing:
    """The median of `reps` passes of n tokens in each of sequences 0..B-1, each rolled back after."""
    parts = [(s, [1 + (7 * s + j) % 97 for j in range(n)]) for s in range(B)]

    def rollback():
        for s in range(B):
            model.truncate_seq(s, depth)

    return measure(lambda: model.decode_parts(parts), reps=reps, warmup=1, flush=rollback)


def pass_times(model, B: int, max_k: int, *, depth: int, reps: int, progress=None) -> dict[int, Timing]:
    """{n: τ_B(n)} for n = 1..max_k + 1 on `model`, whose sequences 0..B-1 hold `depth` tokens (`fill`).
    progress(done, total) after each timed point."""
    if B * (max_k + 1) > model.batch:
        raise ValueError(f"a pass of {B} sequences x {max_k + 1} tokens exceeds llama.cpp's batch of "
                         f"{model.batch}; lower --max-k or the largest batch size")
    tau = {}
    for n in range(1, max_k + 2):
        tau[n] = _pass(model, B, n, depth, reps)
        if progress is not None:
            progress(n, max_k + 1)
    return tau


def batch_step_times(path: str | Path, sizes: Sequence[int], max_k: int, *, depth: int = 128, reps: int = 5,
                     threads: int | None = None, draft: str | Path | None = None, seed: int = 0,
                     progress=None) -> dict:
    """{"V": {B: [V_B(0..max_k)] seconds}, "tau": {B: {n: Timing dict}}, "draft_step": {B: Timing dict}}.

    sizes: batch sizes >= 1; max_k >= 1; depth: tokens each sequence holds before the timed passes.
    progress(done, total), when given, is called after each timed point. The files are closed at the end."""
    sizes = sorted({int(B) for B in sizes})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch sizes must be >= 1, got {list(sizes)}")
    if max_k < 1:
        raise ValueError(f"max_k must be >= 1, got {max_k}")
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    target = _opened(Path(path), sizes[-1], depth, max_k + 1, threads, seed)
    drafter = _opened(Path(draft), sizes[-1], depth, 2, threads, seed + 1) if draft is not None else None
    try:
        return _time_sizes(target, drafter, sizes, max_k, depth=depth, reps=reps, progress=progress)
    finally:
        target.close()
        if drafter is not None:
            drafter.close()


def _time_sizes(target, drafter, sizes: Sequence[int], max_k: int, *, depth: int, reps: int, progress) -> dict:
    if sizes[-1] * (max_k + 1) > target.batch:
        raise ValueError(f"a pass of {sizes[-1]} sequences x {max_k + 1} tokens exceeds llama.cpp's batch of "
                         f"{target.batch}; lower --max-k or the largest batch size")
    per_size = max_k + 1 + (drafter is not None)
    total = len(sizes) * per_size
    V, tau, steps = {}, {}, {}
    for i, B in enumerate(sizes):
        tick = (lambda d, _t, i=i: progress(i * per_size + d, total)) if progress is not None else None
        tau[B] = pass_times(target, B, max_k, depth=depth, reps=reps, progress=tick)
        d = 0.0
        if drafter is not None:
            steps[B] = _pass(drafter, B, 1, depth, reps)
            d = steps[B].median
            if progress is not None:
                progress((i + 1) * per_size, total)
        V[B] = [tau[B][k + 1].median + k * d for k in range(max_k + 1)]
    return {"V": V, "tau": {B: {n: t.to_dict() for n, t in row.items()} for B, row in tau.items()},
            "draft_step": {B: t.to_dict() for B, t in steps.items()}, "depth": depth, "reps": reps,
            "threads": target.threads}
