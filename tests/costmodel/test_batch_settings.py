"""Engine settings per batch size (`costmodel.settings.recommend_batches`, `batch_ranges`): k*(a, B) from
each V_B on exact rationals, vLLM's ranges that give every batch size the k of the largest measured
size at or below it, llama-server's -np lines, speculation off where no k pays."""

import json
from fractions import Fraction as F

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moespec.costmodel.settings import batch_ranges, recommend_batches


def brute_k(V, a):
    """argmax_k G_a(k)/V(k), the smallest on ties, written out here."""
    best, best_T = 0, None
    for k, v in enumerate(V):
        T = sum(a ** i for i in range(k + 1)) / F(v)
        if best_T is None or T > best_T:
            best, best_T = k, T
    return best


V_BY_B = {1: [10, 11, 12, 13, 14], 2: [10, 12, 14, 16, 18], 4: [12, 16, 20, 24, 28], 8: [14, 22, 30, 38, 46]}


def test_k_star_per_batch_size_is_the_throughputs_argmax_and_falls_with_B():
    grid = [F(1, 5), F(1, 2), F(4, 5), F(19, 20)]
    rows = recommend_batches(V_BY_B, grid, draft="d.gguf")
    for row, a in zip(rows, grid):
        assert row.k_star == {B: brute_k(V, a) for B, V in V_BY_B.items()}
        assert [row.k_star[B] for B in sorted(V_BY_B)] == sorted(row.k_star.values(), reverse=True)
    at = {r.acceptance: r for r in rows}
    assert at[F(4, 5)].k_star == {1: 4, 2: 4, 4: 3, 8: 1}  # worked by hand from V_BY_B
    assert at[F(1, 2)].k_star[8] == 0


def test_vllm_gets_ranges_capped_by_the_largest_k_and_llama_server_a_line_per_slot_count():
    row = recommend_batches(V_BY_B, [F(4, 5)], draft="d.gguf", max_batch=64)[0]
    config = json.loads(row.vllm.fragment.removeprefix("--speculative-config ").strip("'"))
    assert config["num_speculative_tokens"] == 4 and config["model"] == "d.gguf"
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 3, 4], [4, 7, 3], [8, 64, 1]]
    llama, sglang = row.per_batch[4]
    assert llama.fragment.startswith("-np 4 ") and "--spec-draft-n-max 3" in llama.fragment
    assert "--speculative-num-steps 3" in sglang.fragment
    off = recommend_batches(V_BY_B, [F(1, 2)], prompt_lookup=3)[0]
    assert off.per_batch[8][0].fragment == "-np 8 --spec-type none" and not off.per_batch[8][1].speculate
    nowhere = recommend_batches({2: [10, 21], 4: [10, 25]}, [F(9, 10)])[0]
    assert nowhere.k_star == {2: 0, 4: 0} and not nowhere.vllm.speculate and nowhere.vllm.fragment == ""


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(1, 300), st.integers(0, 8), min_size=1, max_size=8), st.integers(0, 200))
def test_every_batch_size_gets_the_k_of_the_largest_measured_size_at_or_below_it(ks, extra):
    """200 random schedules: the ranges tile 1..max_batch without gaps, neighbours differ, and batch size b
    gets k at the largest measured B <= b (at the smallest measured B for b below it)."""
    top = max(ks) + extra
    ranges = batch_ranges(ks, top)
    assert ranges[0][0] == 1 and ranges[-1][1] == top
    assert all(r[1] + 1 == s[0] for r, s in zip(ranges, ranges[1:]))
    assert all(r[2] != s[2] for r, s in zip(ranges, ranges[1:]))
    sizes = sorted(ks)
    for b in range(1, top + 1):
        want = ks[max((B for B in sizes if B <= b), default=sizes[0])]
        assert [K for lo, hi, K in ranges if lo <= b <= hi] == [want], b


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="below the largest batch size"):
        batch_ranges({1: 2, 8: 1}, max_batch=4)
    with pytest.raises(ValueError, match="kmax >= 1"):
        recommend_batches({1: [10]}, [F(1, 2)])
    with pytest.raises(ValueError, match="not both"):
        recommend_batches(V_BY_B, [F(1, 2)], draft="d.gguf", prompt_lookup=3)
