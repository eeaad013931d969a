"""llama.cpp's n-gram drafters (engine.ngram): the drafts each rule proposes on hand-made sequences,
written out from the rule as llama.cpp states it, and losslessness under greedy decoding."""

import pytest
import torch

from moespec.engine.decode import generate
from moespec.engine.ngram import MOD_POOL, NgramMod, NgramSimple, mod_index

T = lambda *xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731


def drafts(proposer, context, k=8):
    return proposer.propose(T(*context), k).tokens.tolist()


def test_llama_cpp_defaults():
    s, m = NgramSimple(), NgramMod()
    assert (s.size_n, s.size_m, s.min_hits) == (12, 48, 1)  # common.h common_params_speculative_ngram_map
    assert (m.n_match, m.n_max, m.n_min) == (24, 64, 48)  # common.h common_params_speculative_ngram_mod


def test_simple_copies_after_the_latest_match():
    # pattern = last 2 tokens [1, 2]; cache [7,1,2,3,1,2,4,6,1]; starts 6..1, latest first: [1,2] at 4,
    # then up to size_m = 3 tokens after it: 4, 6, 1
    assert drafts(NgramSimple(2, 3), [7, 1, 2, 3, 1, 2, 4, 6, 1, 2]) == [4, 6, 1]
    # one match, at start 1: the 3 tokens after it; k = 2 cuts the draft
    assert drafts(NgramSimple(2, 3), [7, 1, 2, 3, 4, 5, 8, 1, 2]) == [3, 4, 5]
    assert drafts(NgramSimple(2, 3), [7, 1, 2, 3, 4, 5, 8, 1, 2], k=2) == [3, 4]


def test_simple_drafts_nothing_where_llama_cpp_does_not():
    # cache of 5 tokens <= size_n + size_m + 1 = 6: too short
    assert drafts(NgramSimple(2, 3), [1, 2, 3, 1, 2, 3]) == []
    # the only earlier [1, 2] is at start 0, which the search never tests
    assert drafts(NgramSimple(2, 2), [1, 2, 5, 6, 7, 8, 1, 2]) == []
    # [3, 3] at start len - 2 of the cache (shifted by one) is not searched either
    assert drafts(NgramSimple(2, 2), [5, 6, 7, 8, 9, 3, 3, 3]) == []
    # match [1,2,3] at start 4 leaves 2 tokens after it, fewer than size_n = 3: nothing
    assert drafts(NgramSimple(3, 2), [9, 9, 9, 9, 1, 2, 3, 4, 1, 2, 3]) == []


def test_simple_refuses_sizes_llama_cpp_refuses():
    with pytest.raises(ValueError, match="--spec-ngram-simple-size-n"):
        NgramSimple(size_n=0)


def test_mod_hash_is_llama_cpps():
    # res = res * 6364136223846793005 + token in uint64, then % 4*1024*1024
    assert MOD_POOL == 4194304
    assert mod_index([5]) == 5 and mod_index([1, 2]) == 1408815


def begun(proposer, prompt):
    proposer.begin(target=None, prompt=T(*prompt), max_new_tokens=8, sampler=None)
    return proposer


def test_mod_chains_lookups_until_a_miss():
    # prompt [7,8,1,2,3,7] enters (7,8)->1 (8,1)->2 (1,2)->3 (2,3)->7; context + 8: key [7,8] gives 1,
    # then [8,1] 2, [1,2] 3, [2,3] 7, and [3,7] misses after 4 drafts
    assert drafts(begun(NgramMod(2, n_max=8, n_min=1), [7, 8, 1, 2, 3, 7]), [7, 8, 1, 2, 3, 7, 8]) == [1, 2, 3, 7]
    assert drafts(begun(NgramMod(2, n_max=3, n_min=1), [7, 8, 1, 2, 3, 7]), [7, 8, 1, 2, 3, 7, 8]) == [1, 2, 3]
    assert drafts(begun(NgramMod(2, n_max=8, n_min=4), [7, 8, 1, 2, 3, 7]), [7, 8, 1, 2, 3, 7, 8]) == [1, 2, 3, 7]
    # a miss before n_min = 5 tokens drafts nothing; the engine's k cuts after the rule
    assert drafts(begun(NgramMod(2, n_max=8, n_min=5), [7, 8, 1, 2, 3, 7]), [7, 8, 1, 2, 3, 7, 8]) == []
    assert drafts(begun(NgramMod(2, n_max=8, n_min=4), [7, 8, 1, 2, 3, 7]), [7, 8, 1, 2, 3, 7, 8], k=2) == [1, 2]


def test_mod_adds_new_ngrams_in_chunks_of_more_than_32():
    prompt = [7, 8, 1, 2, 3, 7]  # i_last = 4 after begin
    near = prompt + [5, 6, 0, 0, 5, 6]  # cache of 11 tokens: 4 + 32 >= 11, (5,6)->0 not entered yet
    assert drafts(begun(NgramMod(2, n_max=3, n_min=1), prompt), near) == []
    far = prompt + [5, 6, 0] + list(range(100, 140)) + [5, 6]  # cache of 50: windows 4..47 entered
    assert drafts(begun(NgramMod(2, n_max=3, n_min=1), prompt), far) == [0, 100, 101]


def test_mod_empties_its_pool_after_five_poor_drafts():
    mod = begun(NgramMod(2, n_max=4, n_min=1), [7, 8, 1, 2, 3, 7])
    context = [7, 8, 1, 2, 3, 7, 8]
    for _ in range(4):
        assert drafts(mod, context) == [1, 2, 3, 7]
        mod.commit(len(context))  # none of 4 accepted
    mod.commit(len(context))  # no proposal since: not counted
    assert mod.filled and mod.n_low == 4
    drafts(mod, context)
    mod.commit(len(context) + 1)  # 1 of 4 = 25%, not below: the streak ends
    assert mod.n_low == 0
    for _ in range(5):
        drafts(mod, context)
        mod.commit(len(context))
    assert not mod.filled and (mod.pool == -1).all() and mod.resets == 1 and mod.i_last == 0


V = 6  # a small vocabulary: the table model's greedy text repeats, so n-grams recur


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_output_is_plain_greedy(table_lm, k):
    target = table_lm(V, seed=3)
    proposers = lambda: (NgramSimple(1, 2), NgramSimple(2, 4), NgramMod(1, n_max=4, n_min=1),  # noqa: E731
                         NgramMod(2, n_max=6, n_min=0))
    drafted = 0
    for seed in range(4):
        prompt = torch.randint(0, V, (12,), generator=torch.Generator().manual_seed(seed))
        ref = generate(target, prompt, k=0, max_new_tokens=40).tokens
        for proposer in proposers():
            out = generate(target, prompt, draft=proposer, k=k, max_new_tokens=40)
            assert out.tokens == ref, (proposer.identity(), k, seed)
            drafted += out.stats.drafted
    assert drafted > 0  # the drafters did propose, so the check had drafts to reject or accept


def test_mod_keeps_its_pool_across_sequences_as_llama_server_does():
    # the second prompt has no n-gram of its own, but the first one's entries still draft
    mod = begun(NgramMod(2, n_max=2, n_min=1), [7, 8, 1, 2, 3, 7])
    begun(mod, [4, 9])
    assert drafts(mod, [4, 9, 7, 8]) == [1, 2]
    assert drafts(begun(NgramMod(2, n_max=2, n_min=1), [4, 9]), [4, 9, 7, 8]) == []
