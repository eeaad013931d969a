"""The oracle's verdict: `Proposal.settle`, and `OracleDraft(honour=True)` on a backend whose verify passes
break near ties otherwise than the one-token passes that decoded the reference (issue 55)."""

import pytest
import torch

from moespec.costmodel.sweep_cells import acceptance_interval
from moespec.engine.decode import generate
from moespec.engine.proposers import OracleDraft, Proposal
from tests.near_tie import NearTieLM

V, PROMPT, NEW = 64, [1, 2, 3], 400


def test_settle_cuts_at_the_mark_or_commits_the_verdict():
    drafts = torch.tensor([5, 6, 7])
    marked = Proposal(drafts, marked_from=1)
    assert marked.settle(3, 9) == (1, 6) and marked.settle(0, 4) == (0, 4)  # the walk stopped before the mark
    assert Proposal(drafts).settle(2, 8) == (2, 8)
    overruled = []
    honoured = Proposal(drafts, marked_from=2, verdict=(2, 7), on_overrule=lambda: overruled.append(1))
    assert honoured.settle(3, 9) == (2, 7) and honoured.settle(2, 7) == (2, 7)  # the pass agreed up to the mark
    assert not overruled
    assert honoured.settle(1, 8) == (2, 7) and honoured.settle(2, 4) == (2, 7)  # a right draft, or the token, refused
    assert len(overruled) == 2
    with pytest.raises(ValueError, match="verdict"):
        Proposal(drafts, verdict=(4, 1))


def reference(model) -> torch.Tensor:
    """The prompt and NEW greedy tokens of one-token passes (the sweep's `_GreedyText`)."""
    return torch.tensor(PROMPT + generate(model, PROMPT, k=0, max_new_tokens=NEW, vocab_limit=V,
                                          prefill_last=False).tokens)


@pytest.mark.parametrize("a", [0.5, 0.9])
def test_the_honoured_oracle_delivers_its_acceptance_where_the_verify_pass_breaks_ties_apart(a):
    model = NearTieLM(V, seed=2, margin=0.1)
    ref = reference(model)
    assert model.flips(ref) >= 0.1  # >= 10% of the reference's positions are near ties that a batched pass flips
    runs = {}
    for honour in (True, False):
        oracle = OracleDraft(a, seed=1, reference=ref, honour=honour)
        out = generate(model, PROMPT, draft=oracle, k=4, max_new_tokens=NEW, vocab_limit=V, prefill_last=False)
        runs[honour] = oracle, out
    oracle, out = runs[True]
    tested = sum(out.stats.reached_by_position)
    lo, hi = acceptance_interval(a, tested)  # 99%: at >= 300 tested drafts at most ± 0.075 wide
    assert tested >= 300 and lo <= out.stats.geometric_acceptance <= hi
    assert out.tokens == ref[len(PROMPT):].tolist() and oracle.reanchors == 0  # the output is the reference
    assert oracle.overruled >= 10  # the pass disagreed, and the verdict held
    oracle, out = runs[False]  # the pass's own verdict: right drafts rejected at the flipped ties
    assert out.stats.geometric_acceptance < lo and oracle.reanchors > 0 and oracle.overruled == 0


def test_where_the_passes_agree_the_verdict_changes_nothing(table_lm):
    model = table_lm(V, seed=3)
    plain = generate(model, PROMPT, k=0, max_new_tokens=200, vocab_limit=V, prefill_last=False).tokens
    outs = {}
    for honour in (True, False):
        oracle = OracleDraft(0.7, seed=4, reference=torch.tensor(PROMPT + plain), honour=honour)
        outs[honour] = generate(model, PROMPT, draft=oracle, k=3, max_new_tokens=200, vocab_limit=V,
                                prefill_last=False)
        assert oracle.overruled == 0 and outs[honour].tokens == plain
    assert outs[True].stats.accepted_by_position == outs[False].stats.accepted_by_position
