"""engine.draft_choice: the options name at most one proposer, the oracle only when greedy, and each
choice builds the proposer `generate` / `generate_batch` take."""

import pytest

from moespec.engine.draft_choice import DraftChoice
from moespec.engine.proposers import OracleDraft, PromptLookup
from moespec.models.tokenizer import ByteTokenizer


def no_load(spec):
    raise AssertionError(f"no draft model should load, asked for {spec}")


@pytest.mark.parametrize("kw", [dict(model="d", prompt_lookup=2), dict(model="d", oracle_acceptance=0.5),
                                dict(prompt_lookup=2, oracle_acceptance=0.5)])
def test_two_proposers_are_refused(kw):
    with pytest.raises(ValueError, match="at most one of --draft, --prompt-lookup, --oracle-acceptance"):
        DraftChoice(**kw)


def test_the_oracle_needs_greedy_decoding():
    with pytest.raises(ValueError, match="--temperature 0.7"):
        DraftChoice(oracle_acceptance=0.5, temperature=0.7)
    assert DraftChoice(prompt_lookup=3, temperature=0.7).speculative  # lookup samples at any temperature


def test_nothing_drafts_is_plain_decoding():
    choice = DraftChoice()
    assert not choice.speculative and choice.draft_length("auto") == 0 and choice.draft_length(4) == 0
    assert choice.proposer(tokenizer=ByteTokenizer(), load_draft=no_load) is None


def test_prompt_lookup_and_the_oracle_keep_k():
    lookup = DraftChoice(prompt_lookup=3)
    assert lookup.draft_length("auto") == "auto" and lookup.draft_length(4) == 4
    p = lookup.proposer(tokenizer=ByteTokenizer(), load_draft=no_load)
    assert isinstance(p, PromptLookup) and p.n == 3


def test_a_batch_gets_one_oracle_per_sequence_each_its_own_seed():
    one = DraftChoice(oracle_acceptance=0.6).proposer(tokenizer=None, load_draft=no_load, seed=5)
    assert isinstance(one, OracleDraft)
    many = DraftChoice(oracle_acceptance=0.6).proposer(tokenizer=None, load_draft=no_load, seed=5, sequences=3)
    assert [type(o) for o in many] == [OracleDraft] * 3
    assert [o.seed for o in many] == [5, 6, 7]


def test_a_draft_model_loads_and_must_pair_with_the_target():
    tok = ByteTokenizer()
    loaded = []
    got = DraftChoice(model="draft").proposer(tokenizer=tok, load_draft=lambda s: loaded.append(s) or ("M", tok))
    assert got == "M" and loaded == ["draft"]

    class Other:  # a different vocabulary size
        def __len__(self):
            return len(tok) + 1

    with pytest.raises(ValueError):
        DraftChoice(model="draft").proposer(tokenizer=tok, load_draft=lambda s: ("M", Other()))
