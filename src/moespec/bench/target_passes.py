"""The target's verify passes as the user's decoding meets them: on their prompts, one pass after another
(issue 50).

The chain's τ̂(n) follows the cost-model paper's protocol (App. D): pass sizes in rotation, the cache
flushed before each pass when the weights outgrow half the last-level cache, the expert operation and
the terms outside it timed between the passes, all at depth 512. That measures each term cleanly, and on
a model of ~50 ms a pass it is what decoding pays. On a small model it is not: llama.cpp rebuilds its
graph when a pass differs in size from the last (~0.25 ms on a 6-layer model), the timings between the
passes evict the weights, and a flushed pass reads them cold where decoding finds them warm. On the
trained pair (~0.5 ms a pass) the chain's τ̂(1) was 1.02 ms, decoding paid 0.61 ms; on SmolLM2-135M
16.3 ms against 8.3 ms; every speedup the answer named read that difference.

`measure_target_passes` times what the answer for a user's draft needs: on each calibration prompt at
the middle of the depths its answer's rounds run at (the prompt and `ahead` tokens decoded past it,
untimed: an answer of N new tokens runs its rounds at P..P + N, and on a small model the passes grow
with the depth: SmolLM2-135M on llama.cpp, 2 threads, the edit prompts, n = 9 took 101.3, 105.2 and
108.8 ms at P, P + 24 and P + 48, n = 1 16.4, 17.1 and 18.0 ms, `benchmarks/pass_depth.py`), for
n = 1..kmax + 1 in rotation, a pass of n tokens right after one of another size
("cold": the graph rebuilt) and then again ("warm": a run of rounds at one draft length, the graph
reused), nothing run between; and a plain greedy step as the engine decodes plainly (its compiled
loop where the backend has one). `chain.candidate_answer.predict_candidate` prices a round with these.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from statistics import median
from typing import Sequence

import torch

from moespec.backends.protocol import as_spec_model

PLAIN_STEPS = 8  # plain greedy steps timed per repetition
BLOCKS = 4  # each prompt's repetitions cut into this many runs in time order: how far the price moves


@dataclass(frozen=True)
class TargetPasses:
    """Medians, seconds: warm[n - 1] a pass of n tokens after one of the same size, cold[n - 1] after one
    of another size, n = 1..kmax + 1; plain one plain greedy step; depths: where they were timed, each
    prompt's length and `ahead` tokens past it. blocks: the same medians over each block b of the timing
    (block b holds the b-th of `BLOCKS` runs, in time order, of every prompt's repetitions); the spread of
    the rounds' prices over them is the price's own noise (`chain.candidate_answer.price_noise`)."""

    warm: tuple[float, ...]
    cold: tuple[float, ...]
    plain: float
    reps: int
    depths: tuple[int, ...]
    ahead: int = 0
    blocks: tuple["TargetPasses", ...] = ()

    @property
    def kmax(self) -> int:
        return len(self.warm) - 1

    def to_dict(self) -> dict:
        return {"warm": list(self.warm), "cold": list(self.cold), "plain": self.plain, "reps": self.reps,
                "depths": list(self.depths), "ahead": self.ahead, "blocks": [b.to_dict() for b in self.blocks]}

    @classmethod
    def from_dict(cls, d: dict) -> "TargetPasses":
        return cls(tuple(d["warm"]), tuple(d["cold"]), float(d["plain"]), int(d["reps"]), tuple(d["depths"]),
                   int(d.get("ahead", 0)), tuple(cls.from_dict(b) for b in d.get("blocks", ())))


def measure_target_passes(target, prompts: Sequence[Sequence[int]], *, kmax: int, reps: int = 20,
                          vocab_limit: int | None = None, greedy: bool = True, ahead: int = 0,
                          clock=time.perf_counter) -> TargetPasses:
    """`TargetPasses` of `target` on `prompts` ([P_i] ids each, P_i >= 2), `reps` repetitions in all,
    shared among the prompts in turn, each prompt's passes after it and `ahead` tokens decoded past it
    (greedy, untimed; the passes step asks for half the answer's new tokens: the middle of its rounds'
    depths). A pass feeds n of that text's own tokens after it, as the engine's verify does
    (`extend_argmax` under greedy decoding, else `extend`), and the cache is cut back after it, outside
    the timing. The medians of each `BLOCKS`-th of every prompt's repetitions, in time order, are kept
    beside (`TargetPasses.blocks`; a block with no sample of some size is left out). clock: seconds (a
    fake one in tests)."""
    if kmax < 0 or reps < 1 or ahead < 0 or not prompts or min(len(p) for p in prompts) < 2:
        raise ValueError(f"need kmax >= 0 (got {kmax}), reps >= 1 (got {reps}), ahead >= 0 (got {ahead}) and "
                         "prompts of >= 2 tokens each")
    spec = as_spec_model(target)
    limit = vocab_limit or spec.width
    step = (lambda ids: spec.extend_argmax(ids, limit)) if greedy and hasattr(spec, "extend_argmax") else spec.extend
    samples, depths = [], []  # (block, n or 0 for the plain step, warm, seconds)
    for i, prompt in enumerate(prompts):
        ids = prefilled_ahead(spec, torch.as_tensor(list(prompt), dtype=torch.long), ahead, limit)
        depths.append(ids.shape[0])
        base = spec.length
        mine = range(i, reps, len(prompts))
        for j, rep in enumerate(mine):
            block, sizes = j * BLOCKS // len(mine), list(range(1, kmax + 2))
            for n in sizes[rep % len(sizes):] + sizes[: rep % len(sizes)]:
                for is_warm in (False, True):
                    tokens = ids[torch.arange(n) % len(ids)]
                    start = clock()
                    step(tokens)
                    samples.append((block, n, is_warm, clock() - start))
                    spec.truncate(base)
            samples.append((block, 0, True, _plain_step(spec, int(ids[-1]), limit, greedy, step, clock)))
            spec.truncate(base)
    spec.reset()
    whole = medians(samples, kmax, reps, depths, ahead)
    blocks = [medians([x for x in samples if x[0] == b], kmax, reps, depths, ahead) for b in range(BLOCKS)]
    return replace(whole, blocks=tuple(b for b in blocks if b is not None))


def medians(samples: Sequence[tuple], kmax: int, reps: int, depths: Sequence[int], ahead: int) -> TargetPasses | None:
    """`TargetPasses` of the medians of (block, n, warm, seconds) samples (n = 0: the plain step); None
    where some pass size or the plain step has no sample."""
    def of(n, is_warm):
        got = [t for _, m, w, t in samples if m == n and w == is_warm]
        return median(got) if got else None
    warm, cold = [of(n, True) for n in range(1, kmax + 2)], [of(n, False) for n in range(1, kmax + 2)]
    plain = of(0, True)
    if plain is None or None in warm or None in cold:
        return None
    return TargetPasses(tuple(warm), tuple(cold), plain, reps, tuple(depths), ahead)


def prefilled_ahead(spec, ids: torch.Tensor, ahead: int, limit: int) -> torch.Tensor:
    """The prompt `ids` [P] and `ahead` tokens after it, each the target's greedy choice (untimed), [P + ahead];
    the cache left holding all of that text but its last token (a verify pass feeds it first)."""
    spec.reset()
    if ahead == 0:
        spec.extend(ids[:-1], outputs=1)
        return ids
    row = spec.extend(ids, outputs=1)
    out = ids.tolist()
    for i in range(ahead):
        out.append(int(row[-1, :limit].argmax()))
        if i < ahead - 1:
            row = spec.extend(torch.tensor(out[-1:]), outputs=1)
    return torch.tensor(out, dtype=torch.long)


def _plain_step(spec, token: int, limit: int, greedy: bool, step, clock) -> float:
    """Seconds of one plain greedy step as the engine decodes plainly: the median of `PLAIN_STEPS` steps
    of the backend's `greedy_steps` (compiled where it has one), else a pass of one token after another."""
    if greedy and hasattr(spec, "greedy_steps"):
        _, seconds = spec.greedy_steps(token, PLAIN_STEPS, limit)
        if seconds:
            return float(median(seconds))
    step(torch.tensor([token]))
    start = clock()
    step(torch.tensor([token]))
    return clock() - start
