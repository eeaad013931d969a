"""A draft model's cost at batch size B (bench.batch_draft_cost) on a fake clock and a fake batch
model: every batched pass of r rows costs 1/16 + r/32 s, so h_B(k) is exact: k passes of B rows, the
first of 2B rows when every sequence catches up; ĥ_B(k) the line between the two at P(k)."""

from fractions import Fraction as F

import pytest

import moespec.bench.timing as timing
from moespec.bench.batch_draft_cost import BatchDraftCost, measure_batch_draft_cost
from moespec.bench.candidate import DraftCost
from tests.bench.conftest import FakeClock
from tests.engine.test_batch_proposers import CountingBatch

PROMPTS = [[1, 2, 3, 4], [5, 6, 7], [2, 4, 6, 8, 10]]


class ClockedBatch(CountingBatch):
    """CountingBatch whose every pass advances the fake clock by 1/16 + rows/32 and logs its rows."""

    def __init__(self, sequences, clock):
        super().__init__(sequences)
        self.clock, self.rows = clock, []

    def extend_parts(self, parts):
        rows = sum(len(ids) for _, ids in parts)
        self.rows.append(rows)
        self.clock.advance(1 / 16 + rows / 32)
        return super().extend_parts(parts)


def test_h_B_counts_k_passes_of_B_rows_and_the_catch_up_rows(monkeypatch):
    clock = FakeClock().install(monkeypatch, timing)
    model = ClockedBatch(4, clock)
    cost = measure_batch_draft_cost(model, PROMPTS, sizes=(1, 4, 2), kmax=3, reps=3, warmup=1)
    assert sorted(cost.by_batch) == [1, 2, 4] and cost.kmax == 3
    for B, c in cost.by_batch.items():
        step = 1 / 16 + B / 32  # one draft pass of B rows
        assert c.plain == pytest.approx([k * step for k in range(4)])
        # the catch-up: the first pass feeds two tokens of each sequence, B rows more
        assert c.catch_up == pytest.approx([0] + [k * step + B / 32 for k in range(1, 4)])
        assert c.context_tokens == (3 if B >= 2 else 4)  # sequence s holds prompt s (cycled)
    one, four = cost.by_batch[1], cost.by_batch[4]
    assert all(four.plain[k] > one.plain[k] and one.plain[k + 1] > one.plain[k] for k in range(1, 3))
    # timed rounds: k passes of B rows, or 2B rows first; the prefill of each B's prompts beside them
    assert {4, 8} <= set(model.rows) and max(model.rows) == 8
    assert BatchDraftCost.from_dict(cost.to_dict()) == cost


def test_h_B_holds_every_sequence_and_cycles_the_prompts(monkeypatch):
    clock = FakeClock().install(monkeypatch, timing)
    model = ClockedBatch(4, clock)
    measure_batch_draft_cost(model, PROMPTS, sizes=(4,), kmax=1, reps=1, warmup=1)
    # the last timed round (k = 1, catching up) fed each slot its prompt's last two ids and no draft:
    # slot s holds prompt s mod 3 whole
    assert [model.held[s] for s in range(4)] == [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[0]]


def test_the_expected_cost_is_the_line_between_plain_and_catch_up():
    cost = BatchDraftCost({4: DraftCost(plain=(0, F(1), F(2)), catch_up=(0, F(3), F(5)), reps=1, context_tokens=3)})
    # P(1) = 1/2, P(2) = 1/8: h_4(1) = 1 + 1/2 * 2 = 2, h_4(2) = 2 + 1/8 * 3 = 19/8
    assert cost.expected(4, [F(1, 2), F(1, 4)]) == [0, 2, F(19, 8)]
    with pytest.raises(ValueError, match="batch size 2 was not timed"):
        cost.expected(2, [F(1, 2), F(1, 4)])


def test_refusals(monkeypatch):
    FakeClock().install(monkeypatch, timing)
    with pytest.raises(ValueError, match=r"must lie in 1..2"):
        measure_batch_draft_cost(CountingBatch(2), PROMPTS, sizes=(1, 4), kmax=1)
    with pytest.raises(ValueError, match="prompts of >= 2 tokens"):
        measure_batch_draft_cost(CountingBatch(2), [[1]], sizes=(1,), kmax=1)
