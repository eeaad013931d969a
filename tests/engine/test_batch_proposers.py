"""The batch's proposers behind one interface (`engine.batch_proposers.BatchProposer`), on a tiny
batch model built here: a table whose greedy token after x is (x + 1) mod V, every sequence in its own
slot (no llama.cpp needed; `test_batch.py` runs them on real GGUF files)."""

import pytest
import torch

from moespec.backends.protocol import BatchModel, SpecModel
from moespec.backends.table_model import TableLM
from moespec.engine.batch_proposers import BatchDraft, BatchProposer, PerSequence, SlotView, batch_proposer
from moespec.engine.proposers import PromptLookup
from moespec.engine.sampling import Sampler, SamplingConfig

V = 11


class CountingBatch:
    """A BatchModel whose every row's greedy token is the fed token plus one, mod V."""

    batch = 64
    n_vocab = V
    forward_s = 0.0
    compiled_steps = False

    def __init__(self, sequences: int, vocab_limit: int | None = None):
        self.sequences, self.vocab_limit = sequences, vocab_limit
        self.held = [[] for _ in range(sequences)]

    def reset(self):
        self.held = [[] for _ in range(self.sequences)]

    def seq_length(self, seq):
        return len(self.held[seq])

    def truncate_seq(self, seq, n):
        del self.held[seq][n:]

    def move(self, src, dst):
        self.held[dst] = self.held[src]
        self.held[src] = []

    def extend_parts(self, parts):
        out = []
        for seq, ids in parts:
            self.held[seq].extend(ids)
            logits = torch.full((len(ids), V), -1.0)
            logits[torch.arange(len(ids)), (torch.tensor(ids) + 1) % V] = 1.0
            out.append(logits)
        return out

    def argmax_parts(self, parts, limit):
        return [[int(r) for r in rows[:, :limit].argmax(-1)] for rows in self.extend_parts(parts)]

    def batch_greedy_steps(self, parts, steps, limit, eos=()):
        raise AssertionError("not compiled")


def greedy(limit=V):
    return Sampler(SamplingConfig(), width=V, vocab_limit=limit)


def test_the_batch_model_speaks_the_protocol_and_a_one_sequence_model_does_not():
    assert isinstance(CountingBatch(2), BatchModel)
    table = TableLM(V)
    assert isinstance(table, SpecModel) and not isinstance(table, BatchModel)


def test_every_batch_proposer_implements_the_interface_and_states_its_vocabulary():
    draft = batch_proposer(CountingBatch(3), 2)
    lookup = batch_proposer(PromptLookup(), 2)
    assert isinstance(draft, BatchDraft) and isinstance(lookup, PerSequence)
    assert isinstance(draft, BatchProposer) and isinstance(lookup, BatchProposer)
    assert draft.vocab_limit == V and lookup.vocab_limit is None
    assert BatchDraft(CountingBatch(2, vocab_limit=7)).vocab_limit == 7
    assert batch_proposer(None, 2) is None


def test_a_draft_model_with_too_few_sequences_or_a_wrong_list_is_refused():
    with pytest.raises(ValueError, match="holds 1 sequences, the batch 2"):
        batch_proposer(CountingBatch(1), 2)
    with pytest.raises(TypeError, match="a list of 3"):
        batch_proposer([PromptLookup()], 3)


def test_a_batch_draft_proposes_k_tokens_per_live_sequence_and_rolls_back_on_commit():
    model = CountingBatch(2)
    draft = BatchDraft(model)
    prompts = [torch.tensor([1, 2, 3]), torch.tensor([7, 8])]
    views = [SlotView(model, 0), SlotView(model, 1)]
    samplers = [greedy(), greedy()]
    draft.begin(prompts, views, 8, samplers)
    assert [model.seq_length(s) for s in (0, 1)] == [0, 0]  # nothing until a round drafts (a call may never)
    got = draft.propose([(0, 0, prompts[0]), (1, 1, prompts[1])], 3, dict(enumerate(samplers)))
    assert [model.seq_length(s) for s in (0, 1)] == [5, 4]  # the prompts, then the drafts but the last
    assert got[0].tokens.tolist() == [4, 5, 6] and got[1].tokens.tolist() == [9, 10, 0]
    assert got[0].q is None  # greedy drafts carry no distribution
    draft.commit(0, 0, 4)
    assert model.held[0] == [1, 2, 3, 4]
    draft.move(1, 0)
    assert model.held[0] == [7, 8, 9, 10] and model.held[1] == []


def test_a_batch_draft_clears_and_fills_at_its_first_draft_and_prices_its_catch_up_by_its_fills(monkeypatch):
    """A call that never drafts neither clears nor fills the draft; the first draft clears the earlier
    call's sequences and feeds the context; catch_up_s is the tokens still to feed times the median
    seconds per fed token of the model's fills (0 before any), on a fake clock: 0.5 s per pass token."""
    import moespec.engine.batch_proposers as module

    now = [0.0]
    monkeypatch.setattr(module.time, "perf_counter", lambda: now[0])
    model = CountingBatch(1)
    fed = model.extend_parts

    def timed(parts):
        now[0] += 0.5 * sum(len(ids) for _, ids in parts)
        return fed(parts)

    model.extend_parts = timed
    model.held[0] = [5, 5, 5]  # an earlier call's sequence
    draft, ctx = BatchDraft(model), torch.tensor([1, 2, 3, 4, 5, 6, 7])
    draft.begin([ctx], [SlotView(model, 0)], 8, [greedy()])
    assert model.held[0] == [5, 5, 5]  # untouched until a round drafts
    assert draft.catch_up_s([(0, 0, ctx)]) == 0.0  # no fill of this model timed yet
    draft.propose([(0, 0, ctx)], 1, {0: greedy()})
    assert model.held[0][:7] == ctx.tolist()  # cleared, then the context (its last token fed by the draft pass)
    assert draft.filled_s == 0.5 * 6  # the six tokens before the last, one pass
    draft.commit(0, 0, 7)
    longer = torch.arange(1, 12)  # four tokens committed while no round drafted: 11 - 1 - 7 = 3 to fill
    assert draft.catch_up_s([(0, 0, longer)]) == 0.5 * 3
    assert draft.catch_up_s([(0, 0, longer[:8])]) == 0.0  # within a round's catch-up: the draft pass feeds it


def test_per_sequence_proposes_with_each_sequences_own_proposer():
    model = CountingBatch(2)
    lookup = batch_proposer(PromptLookup(n=1), 2)
    prompts = [torch.tensor([5, 6, 5]), torch.tensor([1, 2, 3])]
    lookup.begin(prompts, [SlotView(model, 0), SlotView(model, 1)], 8, [greedy(), greedy()])
    got = lookup.propose([(0, 0, prompts[0]), (1, 1, prompts[1])], 2, {0: greedy(), 1: greedy()})
    assert got[0].tokens.tolist() == [6, 5] and got[1].tokens.tolist() == []
    assert lookup.propose([(0, 0, prompts[0])], 0, {0: greedy()})[0].tokens.tolist() == []
