"""A host drafter at batch size B (chain.candidate_batch), by hand: V̂_{B,c}(k) = V̂_B(k) + B ĥ(k), the
speedup E(k) V̂_{B,c}(0)/V̂_{B,c}(k), k̂*(B) its argmax, vLLM's ranges; a draft model gets no schedule."""

import pytest

from moespec.chain.candidate_batch import candidate_schedule, schedule_settings
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
