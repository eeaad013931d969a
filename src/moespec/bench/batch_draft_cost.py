"""A draft model's own cost at batch size B (issue 50, "the draft timed at B"): h_B(k), the draft's
part of one round of the batch chain for B live sequences, timed through the proposer the batch
decode runs (`engine.batch_proposers.BatchDraft` on a `BatchModel`, as `engine.batch.generate_batch`).

A round at k is k batched one-token passes of B rows (`BatchDraft.propose`), then each sequence's
commit. The draft's cache keeps the drafts it fed, so a round's catch-up is no pass of its own: a
sequence whose previous round accepted all k drafts feeds the never-fed k-th draft with its bonus
token in the round's first pass (two rows instead of one). So, per B and as
`bench.candidate.measure_draft_cost` at B = 1, each k is timed from two states: no sequence catching
up (plain) and all B catching up (catch_up, 2B rows in the first pass).

How many catch up is Binomial(B, P(k)), P(k) = α_1···α_k; a one-token pass over B..2B rows reads the
weights once and computes per row, so its time is affine in the rows and its expectation is the line
between the two timed ends at P(k): `bench.candidate.expected_draft_cost` at B = 1 gives ĥ_B(k)
unchanged, per B. The two ends, not a grid of catch-up counts: exact under that affinity, and two
timings per (B, k) keep the step short.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from moespec.bench import timing
from moespec.bench.candidate import DraftCost, expected_draft_cost
from moespec.engine.batch_proposers import BatchDraft, SlotView
from moespec.engine.sampling import Sampler, SamplingConfig


@dataclass(frozen=True)
class BatchDraftCost:
    """A draft model's cost of a round at k = 0..kmax per batch size B (`DraftCost` each, seconds for
    the whole batch), at llama.cpp's `threads`."""

    by_batch: Mapping[int, DraftCost]
    threads: int | None = None

    @property
    def kmax(self) -> int:
        return min(c.kmax for c in self.by_batch.values())

    def expected(self, B: int, alpha: Sequence, at_k: Sequence = ()) -> list:
        """ĥ_B(0..kmax): `expected_draft_cost` of batch size B at the positional acceptance `alpha` (and
        the runs at each k, `at_k`, where measured)."""
        if B not in self.by_batch:
            raise ValueError(f"batch size {B} was not timed (timed: {sorted(self.by_batch)}); time it first")
        return expected_draft_cost(self.by_batch[B], alpha, at_k)

    def to_dict(self) -> dict:
        return {"by_batch": {str(B): c.to_dict() for B, c in sorted(self.by_batch.items())}, "threads": self.threads}

    @classmethod
    def from_dict(cls, d: dict) -> "BatchDraftCost":
        return cls({int(B): DraftCost.from_dict(c) for B, c in d["by_batch"].items()}, d.get("threads"))


def time_batch_round(draft: BatchDraft, live: Sequence[tuple[int, int, torch.Tensor]], k: int, catch_up: int, *,
                     samplers: Mapping[int, Sampler], reps: int, warmup: int) -> float:
    """Median seconds of the draft's part of one batch round at k for `live` [(i, slot, context [L_i])]:
    propose, then commit each as if all its drafts were accepted; before each (untimed) every slot is
    cut back to L_i - 1 - catch_up positions."""

    def one_round():
        got = draft.propose(live, k, samplers)
        for i, slot, ctx in live:
            draft.commit(i, slot, ctx.shape[0] + got[i].tokens.shape[0])

    def reset():  # every sequence at the round's start: its last token (and one draft) unfed
        for _, slot, ctx in live:
            draft.model.truncate_seq(slot, ctx.shape[0] - 1 - catch_up)

    return timing.measure(one_round, reps=reps, warmup=warmup, flush=reset).median


def measure_batch_draft_cost(model, prompts: Sequence[Sequence[int]], *, sizes: Sequence[int], kmax: int,
                             reps: int = 20, warmup: int = 3, temperature: float = 0.0,
                             vocab_limit: int | None = None) -> BatchDraftCost:
    """h_B(k) for k = 0..kmax at each batch size B of `sizes` (module docstring) on `model`, a BatchModel
    holding >= max(sizes) sequences. Sequence s holds prompt s (cycled when B exceeds the prompts, each
    >= 2 ids); its cache is filled untimed (`BatchDraft.fill`) before each B is timed."""
    sizes = sorted({int(B) for B in sizes})
    prompts = [torch.as_tensor(list(p), dtype=torch.long) for p in prompts]
    if not sizes or sizes[0] < 1 or sizes[-1] > model.sequences:
        raise ValueError(f"batch sizes {sizes} must lie in 1..{model.sequences} (the sequences the draft holds); "
                         "load the draft with sequences >= the largest")
    if not prompts or min(p.shape[0] for p in prompts) < 2 or kmax < 0:
        raise ValueError(f"need prompts of >= 2 tokens each ({len(prompts)} given) and kmax >= 0 (got {kmax})")
    own = model.vocab_limit or model.n_vocab  # as `generate_batch`: the draft's output layer bounds the ids too
    draft, limit = BatchDraft(model), min(vocab_limit or own, own)
    by_batch = {}
    for B in sizes:
        held = [prompts[s % len(prompts)] for s in range(B)]
        samplers = {s: Sampler(SamplingConfig(temperature=temperature), width=model.n_vocab, vocab_limit=limit)
                    for s in range(B)}
        draft.begin(held, [SlotView(model, s) for s in range(B)], kmax + 1, list(samplers.values()))
        live = [(s, s, ctx) for s, ctx in enumerate(held)]
        draft.fill(live)  # the prompts' prefill, untimed
        plain, caught = [0.0], [0.0]
        for k in range(1, kmax + 1):
            plain.append(time_batch_round(draft, live, k, 0, samplers=samplers, reps=reps, warmup=warmup))
            caught.append(time_batch_round(draft, live, k, 1, samplers=samplers, reps=reps, warmup=warmup))
        by_batch[B] = DraftCost(plain=tuple(plain), catch_up=tuple(caught), reps=reps,
                                context_tokens=min(int(c.shape[0]) for c in held))
    return BatchDraftCost(by_batch, getattr(model, "threads", None))
