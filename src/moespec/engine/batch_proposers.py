"""The proposers of a batch (`engine.batch.generate_batch`), behind one interface, `BatchProposer`
(as llama.cpp's common_speculative begin/draft/accept, each call naming its sequences): a draft
model holding every sequence's cache (`BatchDraft`: each draft step one pass over every live
sequence), or one `Proposer` per sequence (`PerSequence`: prompt lookup, the oracle on its slot's
view of the target, `SlotView`).
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from statistics import median
from typing import Protocol, runtime_checkable

import torch

from moespec.backends.protocol import BatchModel, GreedyByLogits, output_rows
from moespec.engine.proposers import Proposal, Proposer
from moespec.engine.sampling import Sampler

Live = tuple[int, int, torch.Tensor]  # (sequence i, its slot, its committed tokens [L] int64)


@runtime_checkable
class BatchProposer(Protocol):
    """What the batch's decode loop asks of its proposer, whichever it is; sequence i is the prompt's
    index, its slot the sequence id of its caches (which changes as sequences leave, `move`)."""

    @property
    def vocab_limit(self) -> int | None:
        """The ids its drafts can hold (a draft model's output layer); None: any the target allows."""

    def begin(self, prompts: Sequence[torch.Tensor], views: Sequence[SlotView], max_new_tokens: int,
              samplers: Sequence[Sampler]) -> None:
        """Before the first round: prompt [P_i] of each sequence i, its slot's view of the target, its sampler."""

    def propose(self, live: Sequence[Live], k: int, samplers: Mapping[int, Sampler]) -> dict[int, Proposal]:
        """{i: up to k drafts} of every live sequence i."""

    def commit(self, i: int, slot: int, keep: int) -> None:
        """Sequence i (in `slot`) keeps its first `keep` tokens: what its verify pass accepted."""

    def move(self, src: int, dst: int) -> None:
        """The sequence in slot `src` now lives in slot `dst` (the one there has left)."""

    def identity(self) -> dict | None:
        """What sets its drafts and their cost, as `Proposer.identity` (the warm start's store key);
        None: no key, k="auto" decodes cold."""

    def catch_up_s(self, live: Sequence[Live]) -> float:
        """The seconds its next draft must first spend feeding what it has not seen (a draft model's
        prefill, or the tokens decoded while no round drafted): part of a probe's cost; 0 when none
        or not yet known."""

    @property
    def filled_s(self) -> float:
        """The seconds of that catch-up in its last `propose` (0 when none): not a drafting step's time."""


def prefill_slot(model: BatchModel, slot: int, prompt: torch.Tensor) -> None:
    """Every token of `prompt` but its last into `slot`'s cache, in passes of the model's batch (the
    invariant of `engine.round`: each round verifies from the last committed token on)."""
    ids = prompt[:-1].tolist()
    for a in range(0, len(ids), model.batch):
        model.extend_parts([(slot, ids[a: a + model.batch])])


class SlotView(GreedyByLogits):
    """One slot of a BatchModel as a single-sequence SpecModel (the oracle re-decodes its reference
    on it); `slot` follows the sequence when it moves."""

    def __init__(self, model: BatchModel, slot: int):
        self.model, self.slot = model, slot
        self.forward_s = 0.0
        self.vocab_limit = model.vocab_limit

    @property
    def length(self) -> int:
        return self.model.seq_length(self.slot)

    @property
    def width(self) -> int:
        return self.model.n_vocab

    def reset(self) -> None:
        self.model.truncate_seq(self.slot, 0)

    def truncate(self, n: int) -> None:
        self.model.truncate_seq(self.slot, n)

    def extend(self, tokens: torch.Tensor, outputs: int | None = None) -> torch.Tensor:
        ids = torch.as_tensor(tokens).reshape(-1).tolist()
        return self.model.extend_parts([(self.slot, ids)])[0][-output_rows(len(ids), outputs):]

    def identity(self) -> None:
        return None


CATCH_UP = 2  # tokens a round's first draft pass feeds: the last draft of a round that accepted all, and the bonus
FILL_WINDOW = 5  # fills whose seconds per token give a draft model's fill rate (their median)
_fill_rates: "weakref.WeakKeyDictionary[BatchModel, deque[float]]" = weakref.WeakKeyDictionary()


class BatchDraft:
    """A draft model holding the batch's sequences (a BatchModel, slots as the target's): each draft
    step is one pass over every live sequence."""

    def __init__(self, model: BatchModel):
        self.model = model
        self.stale = True  # the model's caches hold an earlier call's sequences until the first fill
        self.filled_s = 0.0

    @property
    def vocab_limit(self) -> int:
        return self.model.vocab_limit or self.model.n_vocab

    def begin(self, prompts: Sequence[torch.Tensor], views: Sequence[SlotView], max_new_tokens: int,
              samplers: Sequence[Sampler]) -> None:
        """Nothing yet: the draft's caches are cleared and a sequence's context goes into them at its
        first drafting round (`fill`), so a call whose rounds never draft (k="auto" where drafting
        does not pay) neither clears nor prefills the draft (at B = 8 the prefill was 5% of a
        64-token call)."""
        self.stale = True

    def _lag(self, slot: int, ctx: torch.Tensor) -> int:
        """Tokens of ctx that `fill` feeds into slot: 0 within a round's catch-up."""
        behind = ctx.shape[0] - 1 - (0 if self.stale else self.model.seq_length(slot))
        return behind if behind + 1 > CATCH_UP else 0

    def catch_up_s(self, live: Sequence[Live]) -> float:
        """Tokens to fill times the model's seconds per filled token, the median of its last fills in
        this process (0 before its first)."""
        rates = _fill_rates.get(self.model)
        return median(rates) * sum(self._lag(slot, ctx) for _, slot, ctx in live) if rates else 0.0

    def fill(self, live: Sequence[Live]) -> None:
        """Where a live sequence's slot lacks more than a round's catch-up (the last draft and the bonus
        token, which the first draft pass feeds), every committed token but the last, in passes of the
        model's batch: the prefill, or the tokens decoded while no round drafted. Timed (`filled_s`,
        and the model's fill rate that `catch_up_s` prices)."""
        t0, fed = time.perf_counter(), 0
        if self.stale:
            self.model.reset()
            self.stale = False
        for _, slot, ctx in live:
            lag = self._lag(slot, ctx)
            if lag:
                prefill_slot(self.model, slot, ctx[-(lag + 1):])
                fed += lag
        self.filled_s = time.perf_counter() - t0 if fed else 0.0
        if fed:
            _fill_rates.setdefault(self.model, deque(maxlen=FILL_WINDOW)).append(self.filled_s / fed)

    def propose(self, live: Sequence[Live], k: int, samplers: Mapping[int, Sampler]) -> dict[int, Proposal]:
        """{i: up to k drafts} for live [(i, slot, committed tokens)]: k passes of one token per sequence
        (the first feeds what each slot's cache lacks), greedy or sampled by each sequence's sampler."""
        m, slots = self.model, {slot: i for i, slot, _ in live}
        self.fill(live)
        feed = {slot: ctx[m.seq_length(slot):].tolist() for _, slot, ctx in live}
        drafts = {slot: [] for slot in feed}
        qs = {slot: [] for slot in feed}
        greedy = all(samplers[i].greedy for i in slots.values())
        limit = min(samplers[i].vocab_limit for i in slots.values())
        for _ in range(k):
            parts = list(feed.items())
            if greedy:
                nxt = {slot: rows[-1] for (slot, _), rows in zip(parts, m.argmax_parts(parts, limit))}
            else:
                nxt = {}
                for (slot, _), logits in zip(parts, m.extend_parts(parts)):
                    s = samplers[slots[slot]]
                    q = s.prepare(logits[-1:])
                    nxt[slot] = int(s.sample(q)[0])
                    qs[slot].append(q)
            for slot, x in nxt.items():
                drafts[slot].append(x)
            feed = {slot: [x] for slot, x in nxt.items()}
        return {slots[slot]: Proposal(torch.tensor(d, dtype=torch.long), None if greedy or not d else torch.cat(qs[slot]))
                for slot, d in drafts.items()}

    def commit(self, i: int, slot: int, keep: int) -> None:
        self.model.truncate_seq(slot, keep)

    def move(self, src: int, dst: int) -> None:
        if not self.stale:  # a stale cache is cleared at the first fill
            self.model.move(src, dst)

    def identity(self) -> dict | None:
        """Its model's identity (`SpecModel.identity`); None when the model states none."""
        from moespec.engine.step_store import stated

        model = stated(self.model)
        return None if model is None else {"proposer": type(self).__name__, "options": {}, "draft": model}


class PerSequence:
    """One `Proposer` per sequence (prompt lookup, the oracle given its reference), each proposing for
    its own sequence on its own slot's view of the target."""

    filled_s = 0.0  # its proposers read the committed text as it is: no catch-up

    def __init__(self, proposers: Sequence[Proposer]):
        self.proposers = list(proposers)

    @property
    def vocab_limit(self) -> None:
        """Its proposers draft from the target's own ids (the oracle) or the text's (prompt lookup)."""
        return None

    def begin(self, prompts: Sequence[torch.Tensor], views: Sequence[SlotView], max_new_tokens: int,
              samplers: Sequence[Sampler]) -> None:
        for p, prompt, view, sampler in zip(self.proposers, prompts, views, samplers):
            p.begin(target=view, prompt=prompt, max_new_tokens=max_new_tokens, sampler=sampler)

    def propose(self, live: Sequence[Live], k: int, samplers: Mapping[int, Sampler]) -> dict[int, Proposal]:
        return {i: self.proposers[i].propose(ctx, k) if k else Proposal(ctx[:0]) for i, _, ctx in live}

    def catch_up_s(self, live: Sequence[Live]) -> float:
        return 0.0

    def commit(self, i: int, slot: int, keep: int) -> None:
        self.proposers[i].commit(keep)

    def move(self, src: int, dst: int) -> None:
        """Its proposers keep no cache of their own."""

    def identity(self) -> dict | None:
        """Its proposers' identity when they all state the same one (one prompt lookup, oracles of one
        acceptance); None otherwise."""
        ids = [p.identity() for p in self.proposers]
        return ids[0] if ids and all(i is not None and i == ids[0] for i in ids) else None


def batch_proposer(draft, B: int) -> BatchProposer | None:
    """The batch's proposer: None, a BatchDraft for a model holding >= B sequences, PerSequence for a
    list of B proposers or one prompt lookup shared by all (it keeps no state)."""
    from moespec.engine.proposers import PromptLookup

    if draft is None:
        return None
    if isinstance(draft, BatchModel):
        if draft.sequences < B:
            raise ValueError(f"the draft model holds {draft.sequences} sequences, the batch {B}; load it with "
                             f"sequences={B}")
        return BatchDraft(draft)
    if isinstance(draft, PromptLookup):
        return PerSequence([draft] * B)
    if isinstance(draft, Sequence) and len(draft) == B and all(isinstance(p, Proposer) for p in draft):
        return PerSequence(draft)
    raise TypeError(f"draft must be None, a model loaded with sequences >= {B}, a PromptLookup, or a list of {B} "
                    f"proposers (one per prompt, e.g. OracleDraft with its reference); got {type(draft).__name__}")

