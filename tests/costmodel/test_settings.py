"""Engine settings from V: n-max against k*(a) computed here from its definition, the staircase in a,
speculation turned off at k* = 0, n-min and p-min on hand-computed cases, and the p-min claim itself
(a continuation that starts below the floor never pays) checked on random drafts."""

import json
import math
import random
import shlex
from fractions import Fraction as F

import pytest

from moespec.costmodel.settings import (
    ENGINES,
    draft_probability_floor,
    flag_number,
    recommend,
    shortest_paying_draft,
)

GRID = [F(j, 40) for j in range(40)]  # a in [0, 1)


def brute_k_star(V, a):
    """argmax_k G_a(k)/V(k), smallest on ties, straight from the definition (Sec. 1)."""
    T = [sum(a**i for i in range(k + 1)) / F(V[k]) for k in range(len(V))]
    return T.index(max(T))


def draft_throughput(V, q):
    """Expected tokens per time of a step drafting tokens of conditional acceptances q: (1 + q_1 + q_1 q_2 + ...) / V(len q)."""
    E, P = F(1), F(1)
    for x in q:
        P *= x
        E += P
    return E / V[len(q)]


def values(settings):
    return {s.name: s.value for s in settings.values}


def test_linear_step_times_follow_the_closed_form():
    # V(k) = 1 + k/2: one draft pays for a > c/V(0) = 1/2; two beat one for 3a^2 - a - 1 > 0
    V = [F(1), F(3, 2), F(2)]
    a2 = (1 + math.sqrt(13)) / 6
    for a in GRID:
        expected = 0 if a <= F(1, 2) else 1 if a <= a2 else 2
        row = recommend(V, [a]).rows[0]
        assert row.k_star == expected
        assert values(row.engine("llama.cpp")).get("--spec-draft-n-max", 0) == expected


@pytest.mark.parametrize("V", [[10, 11, 13, 16, 20], [5, 9, 9, 12], [1, 2, 2], [3, 3, 4, 7, 7], [7, 8, 9, 10, 11, 12]])
def test_n_max_is_k_star_in_every_engine(V):
    rows = recommend([F(v) for v in V], GRID).rows
    for a, row in zip(GRID, rows):
        k = brute_k_star(V, a)
        assert row.k_star == k
        if k == 0:
            continue
        assert values(row.engine("llama.cpp"))["--spec-draft-n-max"] == k
        assert values(row.engine("vllm"))["num_speculative_tokens"] == k
        sglang = values(row.engine("sglang"))
        assert (sglang["--speculative-num-steps"], sglang["--speculative-eagle-topk"]) == (k, 1)
        assert sglang["--speculative-num-draft-tokens"] == k + 1  # the last accepted token and k drafts
    ks = [r.k_star for r in rows]
    assert ks == sorted(ks)  # the staircase is non-decreasing in a (B.28)


def test_k_star_zero_turns_speculation_off():
    # c_1 = V(0): one draft needs a > 1, and more drafts cost as much each
    row = recommend([F(1), F(2), F(3)], [F(9, 10)]).rows[0]
    assert row.k_star == 0 and row.speedup == 1
    llama, vllm, sglang = (row.engine(e) for e in ENGINES)
    assert not any(s.speculate for s in (llama, vllm, sglang))
    assert llama.fragment == "--spec-type none"
    assert vllm.fragment == "" and "omit --speculative-config" in vllm.note
    assert sglang.fragment == "" and "omit --speculative-algorithm" in sglang.note


def test_p_min_hand_computed():
    assert draft_probability_floor([10, 11, 13, 16, 20]) == F(1, 10)  # convex: min c = c_1 = 1, a0 = 1/10
    assert draft_probability_floor([10, 14, 15, 19]) == F(1, 10)  # not convex: min c = c_2 = 1, though a0 = 2/5
    assert draft_probability_floor([1, 2, 2]) == 0  # the second draft is free
    assert draft_probability_floor([5, 4, 6]) == 0  # a draft that shortens the step
    assert draft_probability_floor([1, 3, 5]) == 1  # no token pays
    assert draft_probability_floor([8.0, 9.0, 11.0]) == 0.125
    row = recommend([10, 11, 13, 16, 20], [F(9, 10)], draft="d.gguf").rows[0]
    assert values(row.engine("llama.cpp"))["--spec-draft-p-min"] == 0.1
    assert "--spec-draft-p-min 0.1" in row.engine("llama.cpp").fragment


def test_p_min_flag_rounds_up():
    assert flag_number(F(1, 3)) == "0.3334"
    assert flag_number(F(1, 10)) == "0.1" and flag_number(0.1) == "0.1"
    assert flag_number(0) == "0" and flag_number(1) == "1"


def test_a_continuation_below_the_floor_never_pays():
    """The p-min claim: a draft (q_1..q_j) that beats no draft loses throughput when continued by
    tokens whose first has acceptance q <= p-min, however good the tokens after it."""
    rng = random.Random(0)
    checked = 0
    for _ in range(3000):
        V = [F(rng.randint(1, 40), 4)]
        for _ in range(rng.randint(1, 5)):
            V.append(V[-1] + F(rng.randint(-2, 12), 4))
        if min(V) <= 0:
            continue
        floor = draft_probability_floor(V)
        if floor == 0:
            continue  # nothing lies below a floor of 0 (llama.cpp drops tokens with p < p-min)
        j = rng.randint(0, len(V) - 2)
        q = [F(rng.randint(0, 20), 20) for _ in range(j)]
        q.append(floor * F(rng.randint(0, 10), 10))  # the first continued token: at or below the floor
        q += [F(rng.randint(0, 20), 20) for _ in range(rng.randint(0, len(V) - 2 - j))]
        T = [draft_throughput(V, q[:m]) for m in range(len(q) + 1)]
        if T[j] < T[0]:
            continue  # the claim is about drafts that pay
        assert all(T[m] <= T[j] for m in range(j + 1, len(q) + 1)), (V, q, j)
        checked += 1
    assert checked > 500


def test_n_min_is_the_shortest_draft_that_beats_none():
    # V = (1, 2, 2) at a = 0.9: T(1) = 1.9/2 < T(0) = 1 < T(2) = 2.71/2
    assert shortest_paying_draft([1, 2, 2], F(9, 10)) == 2
    row = recommend([1, 2, 2], [F(9, 10)], prompt_lookup=3).rows[0]
    assert (row.k_star, row.n_min) == (2, 2)
    llama = values(row.engine("llama.cpp"))
    assert (llama["--spec-type"], llama["--spec-ngram-mod-n-max"], llama["--spec-ngram-mod-n-min"]) == \
        ("ngram-mod", 2, 2)
    # convex V: n-min is 1 wherever a draft pays, 0 where none does
    for a in GRID:
        assert shortest_paying_draft([10, 11, 13, 16, 20], a) == (1 if a > F(1, 10) else 0)


def test_vllm_json_parses_back():
    row = recommend([10, 11, 13, 16, 20], [F(9, 10)], draft="Qwen/Qwen3-0.6B").rows[0]
    flag, config = shlex.split(row.engine("vllm").fragment)
    assert flag == "--speculative-config"
    assert json.loads(config) == {"method": "draft_model", "model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 3}
    row = recommend([10, 11, 13, 16, 20], [F(9, 10)], prompt_lookup=4).rows[0]
    assert json.loads(shlex.split(row.engine("vllm").fragment)[1]) == \
        {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 1}


def test_fragments_quote_the_draft_path():
    row = recommend([10, 11, 13], [F(9, 10)], draft="my models/d.gguf").rows[0]
    assert shlex.split(row.engine("llama.cpp").fragment)[3] == "my models/d.gguf"


@pytest.mark.parametrize("kwargs, match", [
    ({"V": [1], "acceptances": [F(1, 2)]}, "kmax >= 1"),
    ({"V": [1, 2], "acceptances": [1]}, "outside"),
    ({"V": [1, 2], "acceptances": [F(1, 2)], "engines": ["tgi"]}, "unknown engine"),
    ({"V": [1, 2], "acceptances": [F(1, 2)], "draft": "d", "prompt_lookup": 3}, "not both"),
    ({"V": [1, 2], "acceptances": [F(1, 2)], "prompt_lookup": 0}, ">= 1"),
])
def test_bad_input_names_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        recommend(kwargs.pop("V"), kwargs.pop("acceptances"), **kwargs)
