"""The user's drafts at batch size B (chain.candidate_batch), by hand: a host drafter's V̂_{B,c}(k) =
V̂_B(k) + B ĥ(k), a draft model's V̂_B(k) + ĥ_B(k) from its timed h_B; the speedup
E(k) V̂_{B,c}(0)/V̂_{B,c}(k), k̂*(B) its argmax, vLLM's ranges; a draft model untimed at B gets no schedule."""

import pytest

from moespec.bench.batch_draft_cost import BatchDraftCost
from moespec.bench.candidate import DraftCost
from moespec.chain.candidate_batch import NOT_TIMED, candidate_schedule, schedule_settings
from moespec.chain.candidates import Candidate
from tests.chain.test_candidates import calibration

# alpha = 1/2, 1/2 (8 at risk, 4 accepted; 4, 2): E = 1, 3/2, 7/4. The lookup's own cost per sequence,
# h(1) = 1/10, h(2) = 1/4 (no catch-up for a host drafter: plain = catch-up)
LOOKUP = calibration(Candidate("prompt-lookup", n=3), (8, 4), (4, 2), (0, 0.1, 0.25), (0, 0.1, 0.25))
# V_B(k): at B = 1 a pass of k + 1 tokens costs little more than one; at B = 4 the pass grows with k
PREDICTION = {"max_k": 2, "versions": {"prediction": {"1": [1.0, 1.1, 1.2], "4": [2.0, 3.0, 4.0]}}}


def test_the_schedule_by_hand():
    got = candidate_schedule(PREDICTION, LOOKUP)
    assert got["version"] == "prediction" and got["max_k"] == 2
    one, four = got["B"]["1"], got["B"]["4"]
    # B = 1: V_c = 1, 1.2, 1.45; speedup = 1, 1.5/1.2 = 1.25, 1.75/1.45 = 1.207: k = 1
    assert one["step_times"] == pytest.approx([1.0, 1.2, 1.45])
    assert one["k_star"] == 1 and one["speedup"] == pytest.approx(1.25)
    # B = 4: V_c = 2, 3.4, 5 (four sequences' lookups on the host); speedup 1, 3/3.4, 3.5/5: plain decoding
    assert four["step_times"] == pytest.approx([2.0, 3.4, 5.0])
    assert four["k_star"] == 0 and four["speedup"] == 1.0
    vllm = schedule_settings(LOOKUP.candidate.to_dict(), got)
    assert '"num_speculative_tokens_per_batch_size": [[1, 3, 1], [4, 4, 0]]' in vllm["fragment"]


def test_a_draft_model_and_a_missing_version_get_no_schedule():
    draft = calibration(Candidate("draft", draft="d.gguf"), (8, 4), (4, 2), (0, 0.1, 0.2), (0, 0.1, 0.2))
    assert "not timed yet" in candidate_schedule(PREDICTION, draft)["unavailable"]
    assert schedule_settings(draft.candidate.to_dict(), candidate_schedule(PREDICTION, draft)) is None
    assert "no 'timed' version" in candidate_schedule(PREDICTION, LOOKUP, version="timed")["unavailable"]


def test_the_schedule_stops_at_the_shorter_of_the_two_draft_lengths():
    short = {"max_k": 1, "versions": {"prediction": {"1": [1.0, 1.1]}}}
    got = candidate_schedule(short, LOOKUP)
    assert got["max_k"] == 1 and len(got["B"]["1"]["step_times"]) == 2


# the draft model's round of the batch, timed (plain, every sequence catching up), seconds
DRAFT = calibration(Candidate("draft", draft="d.gguf"), (8, 4), (4, 2), (0, 0.1, 0.2), (0, 0.2, 0.3))
TIMED = BatchDraftCost({1: DraftCost((0, 0.1, 0.2), (0, 0.2, 0.3), reps=1, context_tokens=4),
                        4: DraftCost((0, 0.2, 0.6), (0, 0.4, 0.8), reps=1, context_tokens=4)})
CHEAP_AT_4 = {"max_k": 2, "versions": {"prediction": {"1": [1.0, 1.1, 1.2], "4": [2.0, 2.2, 2.4]}}}


def test_a_draft_model_schedule_by_hand_from_its_timed_h_B():
    got = candidate_schedule(CHEAP_AT_4, DRAFT, batch_cost=TIMED)
    one, four = got["B"]["1"], got["B"]["4"]
    # alpha = 1/2, 1/2: P(1) = 1/2, P(2) = 1/4; E = 1, 3/2, 7/4
    # B = 1: h = 1/2*0.1 + 1/2*0.2 = 0.15, 3/4*0.2 + 1/4*0.3 = 0.225; V_c = 1, 1.25, 1.425;
    # speedup 1, 1.5/1.25 = 1.2, 1.75/1.425 = 1.228: k = 2
    assert one["h"] == pytest.approx([0, 0.15, 0.225]) and one["step_times"] == pytest.approx([1.0, 1.25, 1.425])
    assert one["k_star"] == 2 and one["speedup"] == pytest.approx(1.75 / 1.425)
    # B = 4: h = 1/2*0.2 + 1/2*0.4 = 0.3, 3/4*0.6 + 1/4*0.8 = 0.65 (one batched pass per draft, not 4 h);
    # V_c = 2, 2.5, 3.05; speedup 1, 3/2.5 = 1.2, 3.5/3.05 = 1.148: k = 1
    assert four["h"] == pytest.approx([0, 0.3, 0.65]) and four["step_times"] == pytest.approx([2.0, 2.5, 3.05])
    assert four["k_star"] == 1 and four["speedup"] == pytest.approx(1.2)
    vllm = schedule_settings(DRAFT.candidate.to_dict(), got)
    assert '"model": "d.gguf"' in vllm["fragment"]
    assert '"num_speculative_tokens_per_batch_size": [[1, 3, 2], [4, 4, 1]]' in vllm["fragment"]


def test_the_schedule_reads_each_k_from_the_run_at_it():
    # the draft above, its run at k = 1 accepting 6 of 8 (alpha_1 = 3/4, E(1) = 7/4, P(1) = 3/4); the run at
    # k = 2 is the one at kmax. B = 1: h(1) = 1/4*0.1 + 3/4*0.2 = 0.175, V_c(1) = 1.275, speedup 1.75/1.275
    # = 1.373 > 1.228 at k = 2: k = 1, where the run at kmax said 2. B = 4: h(1) = 1/4*0.2 + 3/4*0.4 = 0.35,
    # V_c(1) = 2.55, speedup 3.5/2.55 = 1.373: k = 1
    from dataclasses import replace

    from moespec.costmodel.positional import PositionalAcceptance

    acc = DRAFT.measured.acceptance
    runs = replace(DRAFT, measured=replace(DRAFT.measured, at_k=(PositionalAcceptance((8,), (6,)), acc)))
    got = candidate_schedule(CHEAP_AT_4, runs, batch_cost=TIMED)
    one, four = got["B"]["1"], got["B"]["4"]
    assert one["h"] == pytest.approx([0, 0.175, 0.225]) and one["k_star"] == 1
    assert one["speedup"] == pytest.approx(1.75 / 1.275)
    assert four["h"] == pytest.approx([0, 0.35, 0.65]) and four["k_star"] == 1
    assert four["speedup"] == pytest.approx(3.5 / 2.55)


def test_a_draft_model_schedule_stops_where_its_h_B_was_timed():
    short = BatchDraftCost({1: DraftCost((0, 0.1), (0, 0.2), reps=1, context_tokens=4)})
    got = candidate_schedule(CHEAP_AT_4, DRAFT, batch_cost=short)
    assert got["max_k"] == 1 and list(got["B"]) == ["1"]  # k <= 1, and B = 4 was not timed
    elsewhere = BatchDraftCost({8: DraftCost((0, 0.1), (0, 0.2), reps=1, context_tokens=4)})
    assert "timed at batch sizes [8], the batch prediction is at [1, 4]" in \
        candidate_schedule(CHEAP_AT_4, DRAFT, batch_cost=elsewhere)["unavailable"]


def test_a_host_drafter_keeps_B_times_its_own_cost_and_an_untimed_draft_its_unavailable_line():
    assert candidate_schedule(PREDICTION, LOOKUP, batch_cost=TIMED) == candidate_schedule(PREDICTION, LOOKUP)
    assert candidate_schedule(CHEAP_AT_4, DRAFT) == {"unavailable": NOT_TIMED}


def test_a_lookup_that_drafts_in_half_the_rounds_is_priced_at_its_expected_pass_at_every_B():
    # the lookup above, its proposals reaching position 1 in 4 of 8 rounds and position 2 in 2:
    # s = 1/2, 1/4. B = 4: V_B = 2, 2 + 1/2, 2.5 + 1/4 = 2, 2.5, 2.75, plus 4 h = 0, 0.4, 1:
    # 2, 2.9, 3.75; speedup 1, 1.5*2/2.9 = 1.034, 1.75*2/3.75 = 0.933: k = 1, where a full pass said 0
    from dataclasses import replace

    acc = replace(LOOKUP.measured.acceptance, offered=(8, 8), drafted=(4, 2))
    half = replace(LOOKUP, measured=replace(LOOKUP.measured, acceptance=acc))
    four = candidate_schedule(PREDICTION, half)["B"]["4"]
    assert four["step_times"] == pytest.approx([2.0, 2.9, 3.75])
    assert four["k_star"] == 1 and four["speedup"] == pytest.approx(3 / 2.9)
