"""The measurement at batch size B on llama.cpp (`moespec measure --batch-sizes`): what the
prediction of V̂_B reads, and the oracle sweep it is scored against, one batch size at a time.

For each B, on the first B of the prompts (each its own sequence, `prompt_tokens` long):

- "h" and "plain_pass": an oracle probe at an acceptance off the scored grid
  (`bench.measure_base.H_PROBE_ACCEPTANCE`, as at B = 1), one batched call at each k: h_B(k), the
  step's time outside the pass, the median over rounds where all B sequences were live of the
  round's time minus its pass's; and the passes of its plain call (k = 0), one token of each
  sequence's own text: τ_B(1), what the prediction (`chain.batch_prediction`) reads.
- "tau": the verify passes τ_B(n), n = 1..max_k + 1 tokens in each of B sequences, at the sweep's
  mean depth (prompt + new tokens / 2), timed alone on seeded token ids (`bench.batch_passes`):
  τ_B(k + 1) + h_B(k) is the prediction's timed counterpart. Ids that are not text route each token
  to experts of its own, so these passes read more experts than a text's do.
- "sweep": total tokens/s at every (k, a) of the grid (`bench.batch_sweep`), what only the score reads.

The artifact is written after each batch size; a rerun with the same settings keeps the sizes
already measured and goes on from the next (nothing lost when a long run is interrupted).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from moespec import artifacts
from moespec.bench.measure_base import H_PROBE_ACCEPTANCE
from moespec.run_files import BATCH_MEASUREMENT, KINDS

KIND = KINDS[BATCH_MEASUREMENT]
SETTINGS = ("sizes", "max_k", "acceptances", "prompt_tokens", "new_tokens", "reps", "threads")


def probe(target, prompts: Sequence[Sequence[int]], refs, *, max_k: int, new_tokens: int, limit: int,
          seed: int = 0) -> tuple[list[float], list[float]]:
    """(h_B(0..max_k), the plain rounds' passes) in seconds (module docstring), B = len(prompts): one
    batched call at each k, oracle drafts at H_PROBE_ACCEPTANCE; the k = 0 call's passes, one token of
    each sequence's own text per pass, are the prediction's τ_B(1)."""
    from moespec.engine.batch import generate_batch
    from moespec.engine.proposers import OracleDraft

    B, h, plain = len(prompts), [], []
    for k in range(max_k + 1):
        draft = None if k == 0 else [OracleDraft(H_PROBE_ACCEPTANCE, seed=seed + 7919 + i, reference=refs[i],
                                                 honour=True)
                                     for i in range(B)]
        batch = generate_batch(target, prompts, draft=draft, k=k, max_new_tokens=new_tokens, vocab_limit=limit)[0].batch
        full = [(r, p) for r, p, live in zip(batch.round_s, batch.pass_s, batch.live_per_round) if live == B]
        h.append(statistics.median(r - p for r, p in full))
        if k == 0:
            plain = [p for _, p in full]
    return h, plain


def measure_size(target, prompts: Sequence[Sequence[int]], B: int, *, max_k: int, acceptances: Sequence[float],
                 new_tokens: int, reps: int, depth: int, limit: int,
                 progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """The measurement at one batch size B (module docstring) on `target`, a `LlamaBatch` of >= B
    sequences: the passes τ_B timed alone at `depth`, then h_B, the plain passes and the sweep."""
    from moespec.bench.batch_passes import fill, pass_times
    from moespec.bench.batch_sweep import references, sweep_batch

    fill(target, B, depth, seed=0)
    tau = pass_times(target, B, max_k, depth=depth, reps=max(reps, 3) + 2, progress=progress)
    target.reset()
    refs = references(target, prompts[:B], new_tokens, limit)
    h, plain = probe(target, prompts[:B], refs, max_k=max_k, new_tokens=new_tokens, limit=limit)
    sweep = sweep_batch(target, prompts, B, max_k=max_k, acceptances=acceptances, max_new_tokens=new_tokens,
                        reps=reps, vocab_limit=limit, progress=progress, refs=refs)
    return {"tau": {n: t.to_dict() for n, t in tau.items()}, "h": h, "sweep": sweep, "threads": target.threads,
            "plain_pass": {"median": statistics.median(plain), "samples": plain}}


def open_target(path: str | Path, *, sequences: int, context: int, threads: int | None = None):
    """(the `LlamaBatch` of `sequences` sequences of `context` positions the measurement runs on, its tokenizer)."""
    from moespec.models.specs import load

    return load(str(path), backend="llama.cpp", threads=threads, sequences=sequences, n_ctx=context)


def context(prompt_tokens: int, new_tokens: int, max_k: int) -> int:
    """Positions of one sequence the measurement reaches: the prompt, the new tokens, a last draft and its bonus."""
    return prompt_tokens + new_tokens + max_k + 2


def measure_batch(path: str | Path, prompts: Sequence[Sequence[int]], *, sizes: Sequence[int], max_k: int,
                  acceptances: Sequence[float], new_tokens: int, reps: int = 3, threads: int | None = None,
                  vocab_limit: int | None = None, out: str | Path | None = None,
                  progress: Callable[[str, int, int], None] | None = None, target=None) -> dict[str, Any]:
    """The "batch-measure" payload of the GGUF file `path` (module docstring); with `out`, written there
    after each batch size and resumed from it when its settings match. progress(label, done, total).
    target: the file opened by `open_target` with >= max(sizes) sequences, when the caller holds it;
    else the file is opened here, once, and closed at the end."""
    from moespec.models import gguf_info

    sizes = sorted({int(B) for B in sizes})
    if not sizes or sizes[0] < 1 or sizes[-1] > len(prompts):
        raise ValueError(f"batch sizes must be 1..{len(prompts)} (the prompts given), got {list(sizes)}")
    prompt_tokens = min(len(p) for p in prompts[: sizes[-1]])
    settings = dict(sizes=sizes, max_k=int(max_k), acceptances=[float(a) for a in acceptances],
                    prompt_tokens=prompt_tokens, new_tokens=int(new_tokens), reps=int(reps), threads=threads)
    payload = {"model": str(path), "provenance": gguf_info.identity(path), **settings,
               "depth": prompt_tokens + new_tokens // 2, "h_acceptance": H_PROBE_ACCEPTANCE, "by_batch": {}}
    if out is not None and Path(out).exists():
        old = artifacts.load(out, KIND)["payload"]
        if {k: old.get(k) for k in ("provenance", *SETTINGS)} == {k: payload[k] for k in ("provenance", *SETTINGS)}:
            payload["by_batch"] = old["by_batch"]
    todo = [B for B in sizes if str(B) not in payload["by_batch"]]
    own = target is None and bool(todo)
    if own:
        target, _ = open_target(path, sequences=sizes[-1], context=context(prompt_tokens, new_tokens, max_k),
                                threads=threads)
    try:
        for B in todo:
            tick = (lambda done, total, B=B: progress(f"B = {B}", done, total)) if progress else None
            payload["by_batch"][str(B)] = measure_size(
                target, prompts, B, max_k=max_k, acceptances=acceptances, new_tokens=new_tokens, reps=reps,
                depth=payload["depth"], limit=vocab_limit or target.vocab_limit or target.n_vocab, progress=tick)
            if out is not None:
                artifacts.write(out, KIND, payload)
    finally:
        if own:
            target.close()
    return payload


def timed_step_times(payload: dict[str, Any]) -> dict[int, list[float]]:
    """{B: [τ_B(k + 1) + h_B(k)]}: the step times of the measured passes (the prediction's timed counterpart)."""
    out = {}
    for B, row in payload["by_batch"].items():
        tau = {int(n): t["median"] for n, t in row["tau"].items()}
        out[int(B)] = [tau[k + 1] + h for k, h in enumerate(row["h"])]
    return out
