"""OracleDraft: realized acceptance ~ a under greedy verification, output unchanged."""

import math

import pytest
import torch

from moespec.engine.decode import generate
from moespec.engine.cached import CachedModel
from moespec.engine.proposers import OracleDraft
from moespec.models import synthetic

V = 48


@pytest.mark.parametrize("a", [0.3, 0.8, 0.95])
def test_realized_acceptance_is_a(table_lm, a):
    target = table_lm(V, seed=4)
    ref = generate(target, [1, 2, 3], k=0, max_new_tokens=3000, vocab_limit=V).tokens
    oracle = OracleDraft(a, seed=1)
    out = generate(target, [1, 2, 3], draft=oracle, k=4, max_new_tokens=3000, vocab_limit=V)
    assert out.tokens == ref and oracle.reanchors == 0
    tested = sum(out.stats.reached_by_position)
    # 3,000 tokens give >= 600 tested drafts; |a_hat - a| <= 0.04 (the paper's tolerance) is
    # >= 2.4 standard errors sqrt(a(1-a)/tested) at the worst a here.
    assert tested >= 600
    assert abs(out.stats.geometric_acceptance - a) <= 0.04, (a, out.stats.geometric_acceptance)
    assert abs(out.stats.geometric_acceptance - a) <= 4 * math.sqrt(a * (1 - a) / tested)
    # unconditional acceptance at position i is a^i
    for i, acc in enumerate(out.stats.acceptance_by_position, start=1):
        assert abs(acc - a**i) <= 0.06, (a, i, acc)


def test_reanchors_when_committed_text_leaves_the_reference(table_lm):
    # The reference is computed from a target whose table then changes (as a batched-vs-batch-one
    # near-tie would): the oracle must notice and re-anchor, and the output stays the target's greedy.
    target = table_lm(V, seed=5)
    prompt = torch.tensor([7, 8])
    original = target.A.clone()

    class Switching(OracleDraft):
        def begin(self, **kw):
            target.A = original * -1.0  # reference from a different model
            super().begin(**kw)
            target.A = original

    oracle = Switching(1.0)
    ref = generate(target, prompt, k=0, max_new_tokens=20, vocab_limit=V).tokens
    out = generate(target, prompt, draft=oracle, k=4, max_new_tokens=20, vocab_limit=V)
    assert out.tokens == ref and oracle.reanchors >= 1


def test_bad_acceptance():
    with pytest.raises(ValueError, match="acceptance"):
        OracleDraft(1.5)


def test_shared_reference_gives_the_same_run_without_decoding_it_again():
    """A reference passed in replaces begin's greedy decoding: same tokens, same acceptance, and the
    target runs fewer forward passes; a reference for another prompt is ignored."""
    model, _ = synthetic.build("olmoe-tiny", seed=0)
    target = CachedModel(model)
    prompt = [1, 5, 9, 14, 20]
    first = OracleDraft(0.7, seed=3)
    a = generate(target, prompt, draft=first, k=3, max_new_tokens=40)
    calls = []
    target.model.register_forward_pre_hook(lambda *_: calls.append(1))
    shared = OracleDraft(0.7, seed=3, reference=first.reference)
    b = generate(target, prompt, draft=shared, k=3, max_new_tokens=40)
    shared_calls = len(calls)
    calls.clear()
    other = OracleDraft(0.7, seed=3, reference=first.reference.flip(0))  # not this prompt's: decoded anew
    c = generate(target, prompt, draft=other, k=3, max_new_tokens=40)
    assert a.tokens == b.tokens == c.tokens
    assert a.stats.acceptance_by_position == b.stats.acceptance_by_position
    assert shared_calls + 40 - 1 <= len(calls)  # begin's 40-token greedy decode was skipped
