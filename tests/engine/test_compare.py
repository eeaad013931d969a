"""engine.compare: the compared call decodes the same tokens as `generate` alone, plain decoding
beside it gives the same greedy tokens, and the speedup is the ratio of their tokens per second."""

import math

import pytest

from moespec.engine.compare import Comparison, generate_compared
from moespec.engine.decode import generate
from moespec.engine.proposers import OracleDraft

PROMPT = [3, 7, 1, 3, 7]
KW = dict(max_new_tokens=12, vocab_limit=48)


def test_compared_greedy_call_matches_generate_and_plain_decoding(table_lm):
    lm = table_lm(V=48, seed=2)
    alone = generate(lm, PROMPT, draft=OracleDraft(0.7, seed=1), k=3, **KW)
    run = generate_compared(lm, PROMPT, draft=OracleDraft(0.7, seed=1), k=3, compare=True, **KW)
    assert run.result.tokens == alone.tokens
    assert run.plain is not None and run.plain.stats.rounds == run.plain.stats.new_tokens  # one token a round
    assert run.same_tokens  # greedy: lossless
    expected = run.result.stats.tokens_per_s / run.plain.stats.tokens_per_s
    assert math.isclose(run.speedup, expected)


def test_without_compare_there_is_no_plain_run(table_lm):
    run = generate_compared(table_lm(V=48, seed=2), PROMPT, draft=None, k=0, **KW)
    assert run.plain is None and not run.same_tokens and len(run.result.tokens) == 12
    with pytest.raises(ValueError, match="compare=True"):
        run.speedup


def test_speedup_is_nan_when_plain_took_no_time():
    class Stats:
        def __init__(self, tps):
            self.tokens_per_s = tps

    class Result:
        def __init__(self, tps):
            self.stats, self.tokens = Stats(tps), [1]

    assert math.isnan(Comparison(Result(10.0), Result(0.0)).speedup)
    assert Comparison(Result(10.0), Result(4.0)).speedup == 2.5
