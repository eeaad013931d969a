"""Inputs the engine cannot decode are refused with the widths or the position at fault, before any
forward pass where the inputs show it (TableLM: the mock of tests/engine/conftest.py)."""

import pytest

from moespec.engine.decode import generate
from moespec.engine.sampling import Sampler, SamplingConfig


def test_a_draft_narrower_than_the_vocabulary_is_refused_before_decoding(table_lm):
    target, draft = table_lm(V=48), table_lm(V=40, seed=1)
    with pytest.raises(ValueError, match="the draft's output layer has 40 logits, fewer than the 48 ids .* has 48"):
        generate(target, [1, 2, 3], draft=draft, k=2, max_new_tokens=4, vocab_limit=48)
    assert target.extends == 0 and draft.extends == 0


def test_a_vocab_limit_above_the_logit_width_is_refused(table_lm):
    target = table_lm(V=40, width=48)  # ids 40..47 are padding with a large logit
    with pytest.raises(ValueError, match="vocab_limit=60 is above the target's logit width 48"):
        generate(target, [1, 2, 3], k=0, max_new_tokens=4, vocab_limit=60)
    assert target.extends == 0
    assert max(generate(target, [1, 2, 3], k=0, max_new_tokens=4, vocab_limit=40).tokens) < 40
    with pytest.raises(ValueError, match=r"vocab_limit must be in 1..8 \(the logit width\), got 9"):
        Sampler(SamplingConfig(), width=8, vocab_limit=9)


@pytest.mark.parametrize("value, shown", [(float("inf"), r"\+inf"), (float("nan"), "NaN"), (float("-inf"), "-inf")])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_logit_row_without_a_distribution_names_its_position(table_lm, value, shown, temperature):
    target = table_lm(V=48)
    target.A[3] = value  # the row after token 3: greedy decoding used to emit token 0 for +inf
    with pytest.raises(ValueError, match=f"{shown}.* at row 0 \\(predicting sequence position 3\\)"):
        generate(target, [1, 2, 3], k=0, max_new_tokens=4, vocab_limit=48, temperature=temperature)


def test_a_drafted_row_is_named_by_its_own_position(table_lm):
    target, draft = table_lm(V=48), table_lm(V=48)  # the same tables: every draft is accepted
    seq = [1, 2, 3, *generate(target, [1, 2, 3], k=0, max_new_tokens=3, vocab_limit=48).tokens]
    target.A[seq[4]] = float("nan")  # every row fed this token is NaN; the first one verified names its position
    first = next(p for p in range(2, len(seq)) if seq[p] == seq[4])
    with pytest.raises(ValueError, match=f"NaN at row \\d \\(predicting sequence position {first + 1}\\)"):
        generate(target, [1, 2, 3], draft=draft, k=3, max_new_tokens=6, vocab_limit=48)


def test_some_minus_inf_logits_are_fine(table_lm):
    target = table_lm(V=48)
    target.A[3, 10:] = float("-inf")  # a model may rule ids out, as long as one stays finite
    assert generate(target, [1, 2, 3], k=0, max_new_tokens=2, vocab_limit=48).tokens[0] < 10
