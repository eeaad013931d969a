"""The candidate chain (issue 50): candidates and their calibration on tiny synthetic models, the
prediction and the answer by hand, the held-out check on a fake clock, the score by hand."""

from dataclasses import replace
from fractions import Fraction as F

import pytest
import torch

import moespec.chain.candidate_check as candidate_check
import moespec.engine.decode as decode
from moespec.backends.table_model import TableLM
from moespec.bench.candidate import CandidateAcceptance, DraftCost
from moespec.bench.prefilled import PrefilledTarget
from moespec.chain.candidate_answer import CandidatePrediction, answer_for, lookup_lines, predict_candidate
from moespec.chain.candidate_check import (
    MAX_CHECK_REPS,
    CandidatesScore,
    HeldoutCheck,
    check_heldout,
    check_reps,
    score_candidates,
)
from moespec.chain.candidates import Candidate, CandidateCalibration, calibrate, user_candidates
from moespec.costmodel.positional import PositionalAcceptance
from moespec.engine.ngram import NgramMod, NgramSimple
from moespec.engine.proposers import OracleDraft, PromptLookup
from moespec.models import load
from moespec.report.candidates import engine_lines


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def olmoe():
    return load("synthetic:olmoe-tiny")


def test_candidates_name_round_trip_and_refusals():
    mod, simple = Candidate("ngram-mod", n=16, n_min=4), Candidate("ngram-simple", n=2)
    assert mod.name == "ngram-mod n=16 n-min=4" and Candidate("prompt-lookup").n == 3
    assert Candidate("oracle", acceptance=0.5).name == "oracle a=0.5" and simple.min_k == 2
    for c in (mod, simple, Candidate("draft", draft="d.gguf"), Candidate("oracle", acceptance=0.7, seed=3)):
        assert Candidate.from_dict(c.to_dict()) == c
    # the proposer at k is the rule the emitted line runs at k: llama.cpp's draft length set to k
    p = mod.proposer_at(2)
    assert isinstance(p, NgramMod) and (p.n_match, p.n_max, p.n_min) == (16, 2, 2)
    q = simple.proposer_at(3)
    assert isinstance(q, NgramSimple) and (q.size_n, q.size_m) == (2, 3)
    assert isinstance(Candidate("prompt-lookup", n=2).proposer_at(1), PromptLookup)
    assert isinstance(Candidate("oracle", acceptance=0.5).proposer_at(1), OracleDraft)
    for bad in (dict(kind="eagle"), dict(kind="draft"), dict(kind="oracle"), dict(kind="ngram-mod", draft="x"),
                dict(kind="ngram-simple", n=0)):
        with pytest.raises(ValueError):
            Candidate(**bad)
    with pytest.raises(ValueError, match="load_candidate"):
        Candidate("draft", draft="d.gguf").proposer_at(1)


def test_oracle_acceptance_holds_a_in_every_interval(olmoe):
    # 2 prompts x 150 greedy tokens at kmax = 3, a = 0.6: ~80 rounds, >= 25 at risk at position 3;
    # alpha_j = a at every position, so each 95% Wilson interval must hold 0.6 (seeded: fixed outcome)
    target, tok = olmoe
    cal = calibrate(target, tok, Candidate("oracle", acceptance=0.6), ["the cat sat", "a b c d"], kmax=3,
                    new_tokens=150, cost_reps=2)
    acc = cal.measured.acceptance
    assert min(acc.at_risk) >= 25 and cal.measured.new_tokens == 300
    for lo, hi in acc.intervals:
        assert lo <= 0.6 <= hi
    assert cal.cost.plain[0] == 0 and len(cal.cost.plain) == 4
    assert CandidateCalibration.from_dict(cal.to_dict()) == cal


def test_prompt_lookup_on_repetitive_text_and_a_draft_model(olmoe):
    # 2 repetitive prompts x 24 tokens: the lookup must accept some drafts at position 1; the dense-tiny
    # draft (the byte tokenizer, shared) costs time at every k >= 1
    target, tok = olmoe
    prompts = ["abc abc abc abc abc abc abc abc", "the cat. the cat. the cat. the cat."]
    look = calibrate(target, tok, Candidate("prompt-lookup", n=2), prompts, kmax=2, new_tokens=24, cost_reps=2)
    assert look.measured.acceptance.accepted[0] > 0
    draft = calibrate(target, tok, Candidate("draft", draft="synthetic:dense-tiny"), prompts, kmax=2,
                      new_tokens=12, cost_reps=2)
    assert draft.measured.acceptance.at_risk[0] > 0 and all(h > 0 for h in draft.cost.plain[1:])
    # a draft model proposes k at every round it is offered; the lookup finds no match in some rounds
    # (the first rounds of "abc abc ..." with n = 2 all match, "the cat." prompts need a repeat first)
    assert draft.measured.acceptance.drafted == draft.measured.acceptance.offered
    looked = look.measured.acceptance
    assert 0 < looked.drafted[0] < looked.offered[0] and looked.draft_share[0] < 1
    # a draft model's confidence: one (top-token probability, was it the target's token) per new token
    probability, accepted = draft.confidence
    assert len(probability) == len(accepted) == 2 * 12 and all(0 < q <= 1 for q in probability)
    assert look.confidence is None  # a lookup has no probabilities
    assert CandidateCalibration.from_dict(draft.to_dict()).confidence == draft.confidence


def test_a_draft_judged_against_itself_is_accepted_at_every_position(olmoe):
    """draft_confidence with the target as its own draft: each greedy continuation token is the
    draft's top token, so every position counts as accepted."""
    from moespec.bench.candidate import draft_confidence
    from moespec.engine.decode import generate

    target, tok = olmoe
    prompt = tok.encode("def f(x):\n    return")
    out = generate(target, prompt, k=0, max_new_tokens=10).tokens
    probability, accepted = draft_confidence(target, [(prompt, out)])
    assert len(probability) == 10 and all(accepted)


def payload(taus, h=None):
    """A predict payload holding only the measured-time version at depth 64 (no calibrated one); the
    engine's overhead h(k) zero unless given."""
    version = {"n": list(range(1, len(taus) + 1)), "tau": {"auto": taus}, "delta": 0.0,
               "h": h or [0.0] * len(taus)}
    return {"depths": [{"depth": 64, "versions": {"measured-time": version}, "unavailable": {}}]}


def calibration(candidate, at_risk, accepted, plain, catch_up):
    measured = CandidateAcceptance(candidate={}, acceptance=PositionalAcceptance(at_risk, accepted), prompts=1,
                                   new_tokens=10, max_new_tokens=10)
    return CandidateCalibration(candidate, measured, DraftCost(plain, catch_up, reps=1, context_tokens=4))


def draft_prediction():
    # alpha = 1/2, 1/4; h(1) = 1/2*1/8 + 1/2*1/4 = 3/16, h(2) = 7/8*1/4 + 1/8*3/8 = 17/64;
    # tau(1..3) = 1, 5/4, 3/2: V = 1, 23/16, 113/64; E = 1, 3/2, 13/8;
    # E/V = 1, 24/23, 104/113: k_hat* = 1 at 24/23; n-min 1; p-min from V less the draft's own cost (spent
    # when llama.cpp checks p-min): tau's increments 1/4, 1/4 over V(0) = 1: 1/4 (V's own, 21/64, cut drafts
    # that paid)
    cal = calibration(Candidate("draft", draft="d.gguf"), (8, 4), (4, 1), (0, 1 / 8, 1 / 4), (0, 1 / 4, 3 / 8))
    return predict_candidate(payload([1, 1.25, 1.5]), cal)


def test_predict_candidate_by_hand():
    p = draft_prediction()
    assert p.version == "measured-time" and p.depth == 64  # "calibrated" is absent: the next one is read
    assert p.h == (0, 3 / 16, 17 / 64) and p.answer.step_times == (1, 23 / 16, 113 / 64)
    assert p.answer.k_star == 1 and p.answer.speedup == pytest.approx(24 / 23, rel=1e-12)
    assert p.answer.n_min == 1 and p.answer.p_min == 1 / 4
    a = F(5, 12)  # the geometric fit: 5 accepted of 12 at risk
    assert p.answer.geometric == pytest.approx((1, float(1 + a), float(1 + a + a * a)), rel=1e-12)
    assert p.settings["llama.cpp"]["fragment"] == ("--spec-type draft-simple -md d.gguf --spec-draft-n-max 1 "
                                                   "--spec-draft-n-min 1 --spec-draft-p-min 0.25")
    assert '"num_speculative_tokens": 1' in p.settings["vllm"]["fragment"]
    assert "--speculative-num-steps 1" in p.settings["sglang"]["fragment"]
    assert CandidatePrediction.from_dict(p.to_dict()).answer.k_star == 1
    failed = {"depths": [{"depth": 64, "versions": {}, "unavailable": {
        "calibrated": {"reason": "nonpositive-time", "message": "operation times must be positive seconds"}}}]}
    with pytest.raises(ValueError, match=r"no version at depth 64 \(calibrated: operation times must be positive.*"
                                         r"nothing else running"):
        predict_candidate(failed, calibration(Candidate("oracle", acceptance=0.5), (8, 4), (4, 1), (0, 0, 0), (0, 0, 0)))
    with pytest.raises(ValueError, match="reach n = 2"):  # kmax = 2 needs tau at n = 3
        predict_candidate(payload([1, 1.25]), calibration(Candidate("oracle", acceptance=0.5), (8, 4), (4, 1),
                                                          (0, 0, 0), (0, 0, 0)))


def test_a_gain_inside_how_far_the_timed_price_moved_decodes_plainly():
    # the draft of draft_prediction priced with timed passes (warm 1, 5/4, 3/2 at n = 1..3; plain 1):
    # V = 1, 23/16, 113/64 and k_hat* = 1 at 24/23. Three blocks of the timing: A as the whole, B with
    # the passes of 2 and 3 a quarter slower (V_B = 1, 27/16, 129/64), C with the plain step at 5/4:
    # V(k)/V(0) rose by 27/23 at k = 1 and 129/113 at k = 2 (B), fell to 4/5 (C). 24/23 < 27/23: a tie
    from moespec.bench.target_passes import TargetPasses

    cal = calibration(Candidate("draft", draft="d.gguf"), (8, 4), (4, 1), (0, 1 / 8, 1 / 4), (0, 1 / 4, 3 / 8))
    whole = TargetPasses((1, 1.25, 1.5), (1, 1.25, 1.5), 1.0, reps=3, depths=(64,))
    slow, plain_slow = replace(whole, warm=(1, 1.5, 1.75)), replace(whole, plain=1.25)
    p = predict_candidate(payload([1, 1.25, 1.5]), cal, passes=replace(whole, blocks=(whole, slow, plain_slow)))
    assert p.answer.step_times == pytest.approx((1, 23 / 16, 113 / 64), rel=1e-12)
    assert p.answer.price_high == pytest.approx((1, 27 / 23, 129 / 113), rel=1e-12)
    assert p.answer.price_low == pytest.approx((1, 4 / 5, 4 / 5), rel=1e-12)
    assert p.answer.k_star == 0 and p.answer.tied and p.speedup_at(1) == pytest.approx(24 / 23, rel=1e-12)
    assert "--spec-draft-n-max" not in p.settings["llama.cpp"]["fragment"] and p.llama_answer.k_star == 0
    # the blocks that moved only the plain step leave k = 1 paying beyond the noise
    q = predict_candidate(payload([1, 1.25, 1.5]), cal, passes=replace(whole, blocks=(whole, plain_slow)))
    assert q.answer.k_star == 1 and q.answer.price_high == (1, 1, 1) and not q.answer.tied
    assert CandidatePrediction.from_dict(p.to_dict()).answer == p.answer


def test_without_a_version_the_rounds_are_priced_with_the_timed_passes_and_the_base_h():
    # the draft of draft_prediction (own cost 0, 3/16, 17/64), a prediction whose fits all failed, the
    # target's passes timed (1, 5/4, 3/2 at n = 1..3; plain 1) and the base measurement's h = 1/16, 1/8, 1/8:
    # h = 1/16, 5/16, 25/64; V = 1 (a plain step), 5/4 + 5/16, 3/2 + 25/64 (the base's h(0) unused)
    from moespec.bench.target_passes import TargetPasses
    from moespec.chain.candidate_answer import NoVersion
    from moespec.costmodel.predict import TIMED_PASSES

    cal = calibration(Candidate("draft", draft="d.gguf"), (8, 4), (4, 1), (0, 1 / 8, 1 / 4), (0, 1 / 4, 3 / 8))
    failed = {"depths": [{"depth": 64, "versions": {}, "unavailable": {
        "calibrated": {"reason": "nonpositive-time", "message": "operation times must be positive seconds"}}}]}
    passes = TargetPasses((1, 1.25, 1.5), (1, 1.25, 1.5), 1.0, reps=1, depths=(64,))
    base = {"h": {"64": {"0": 1 / 16, "1": 1 / 8, "2": 1 / 8}}}
    p = predict_candidate(failed, cal, passes=passes, base=base)
    assert p.version == TIMED_PASSES and p.depth == 64 and p.tau == (1, 1.25, 1.5)
    assert p.h == pytest.approx((1 / 16, 5 / 16, 25 / 64), rel=1e-12)
    assert p.answer.step_times == pytest.approx((1, 1.5625, 1.890625), rel=1e-12) and p.answer.k_star == 0
    with pytest.raises(NoVersion, match="no version at depth 64"):  # the base alone prices nothing
        predict_candidate(failed, cal, base=base)
    with pytest.raises(ValueError, match=r"holds k = \[0, 1\]"):
        predict_candidate(failed, cal, passes=passes, base={"h": {"64": {"0": 0.1, "1": 0.1}}})


def test_a_lookup_that_drafts_in_some_rounds_is_priced_at_its_expected_pass():
    # prompt lookup offered 8 rounds at positions 1, 2; it proposed in 4 of them, 2 of them reached
    # position 2: s = 1/2, 1/4; alpha = 3/8, 1/3 (empty proposals rejected at position 1);
    # tau(1..3) = 1, 2, 3 (no draft cost): tau_bar = 1, 3/2, 7/4; E = 1, 11/8, 3/2;
    # E/V = 1, 11/12, 6/7: decode plainly. At tau(k + 1), the proposal priced full, E/V = 11/16 and 1/2.
    cal = calibration(Candidate("prompt-lookup", n=2), (8, 3), (3, 1), (0, 0, 0), (0, 0, 0))
    acc = replace(cal.measured.acceptance, offered=(8, 8), drafted=(4, 2))
    cal = replace(cal, measured=replace(cal.measured, acceptance=acc))
    p = predict_candidate(payload([1, 2, 3]), cal)
    assert p.answer.step_times == (1, 1.5, 1.75) and p.tau == (1, 2, 3)
    assert p.speedup_at(1) == pytest.approx(11 / 12, rel=1e-12) and p.speedup_at(2) == pytest.approx(6 / 7, rel=1e-12)
    assert p.answer.k_star == 0
    # where the drafts are good (alpha = 1/2, 3/4), the short passes make the lookup pay at k = 2
    good = replace(cal, measured=replace(cal.measured, acceptance=replace(acc, at_risk=(8, 4), accepted=(4, 3))))
    q = predict_candidate(payload([1, 1.25, 1.5]), good)  # tau_bar = 1, 9/8, 19/16; E = 1, 3/2, 15/8
    assert q.answer.k_star == 2 and q.answer.speedup == pytest.approx(15 / 8 / (19 / 16), rel=1e-12)


def test_each_k_is_priced_and_counted_from_the_run_at_it():
    # the lookup above at kmax = 2 (s = 1/2, 1/4; alpha = 3/8, 1/3; tau(1..3) = 1, 2, 3): decode plainly.
    # Its run at k = 1 proposed in 6 of 8 rounds and had 5 accepted: s_1 = 3/4, alpha_1 = 5/8, so
    # V(1) = 1 + 3/4 = 7/4 and E(1) = 13/8: E/V = 13/14 at k = 1 (the run at kmax read 11/12); k = 2 as before
    cal = calibration(Candidate("prompt-lookup", n=2), (8, 3), (3, 1), (0, 0, 0), (0, 0, 0))
    acc = replace(cal.measured.acceptance, offered=(8, 8), drafted=(4, 2))
    one = PositionalAcceptance((8,), (5,), offered=(8,), drafted=(6,))
    cal = replace(cal, measured=replace(cal.measured, acceptance=acc, at_k=(one, acc)))
    p = predict_candidate(payload([1, 2, 3]), cal)
    assert p.answer.step_times == (1, 1.75, 1.75) and p.answer.expected == (1, F(13, 8), F(3, 2))
    assert p.speedup_at(1) == pytest.approx(13 / 14, rel=1e-12) and p.answer.k_star == 0
    # a better run at k = 1 (7 of 8 accepted, E(1) = 15/8 > 7/4) pays where the run at kmax said it would not
    better = replace(cal, measured=replace(cal.measured, at_k=(replace(one, accepted=(7,)), acc)))
    q = predict_candidate(payload([1, 2, 3]), better)
    assert q.answer.k_star == 1 and q.answer.speedup == pytest.approx(15 / 14, rel=1e-12)


def test_a_lookup_pays_its_drafting_and_the_rounds_overhead_only_for_what_it_proposed():
    # the lookup above (s = 1/2, 1/4; alpha = 3/8, 1/3) with a cost of 1/8, 1/4 at k = 1, 2 and the engine's
    # overhead 1/16, 1/8, 1/8 at k = 0, 1, 2: h = 1/16, 1/4, 3/8 for a round of each proposal length;
    # h_bar = 1/16, 1/16 + 1/2 (3/16) = 5/32, 5/32 + 1/4 (1/8) = 3/16; tau_bar = 1, 3/2, 7/4 as above
    cal = calibration(Candidate("prompt-lookup", n=2), (8, 3), (3, 1), (0, 1 / 8, 1 / 4), (0, 1 / 8, 1 / 4))
    acc = replace(cal.measured.acceptance, offered=(8, 8), drafted=(4, 2))
    cal = replace(cal, measured=replace(cal.measured, acceptance=acc))
    p = predict_candidate(payload([1, 2, 3], h=[1 / 16, 1 / 8, 1 / 8]), cal)
    assert p.h == (1 / 16, 5 / 32, 3 / 16)
    assert p.answer.step_times == (1 + 1 / 16, 1.5 + 5 / 32, 1.75 + 3 / 16)
    # a draft model (every share 1) pays its whole cost and overhead every round, as before
    full = replace(cal, measured=replace(cal.measured, acceptance=replace(acc, drafted=(8, 8))))
    assert predict_candidate(payload([1, 2, 3], h=[1 / 16, 1 / 8, 1 / 8]), full).h == (1 / 16, 1 / 4, 3 / 8)


def test_p_min_is_read_through_the_drafts_measured_confidence():
    """The by-hand pair above (floor p-min 1/4) with a confidence of 40 positions: drafts of top-token
    probability 0.05..0.09 were never the target's, 0.1 and up always: the fit steps from 0 to 1 at
    0.1, so llama.cpp's p-min is 0.1, not 1/4 (an underconfident draft); with too few positions the
    floor stays."""
    base = draft_prediction()
    cal = calibration(Candidate("draft", draft="d.gguf"), (8, 4), (4, 1), (0, 1 / 8, 1 / 4), (0, 1 / 4, 3 / 8))
    q = [0.05, 0.06, 0.07, 0.08, 0.09] * 2 + [0.1 + 0.02 * i for i in range(30)]
    hit = [False] * 10 + [True] * 30
    p = predict_candidate(payload([1, 1.25, 1.5]), replace(cal, confidence=(tuple(q), tuple(hit))))
    assert p.answer.p_min == 0.1 and p.answer.k_star == base.answer.k_star
    assert p.settings["llama.cpp"]["fragment"].endswith("--spec-draft-p-min 0.1")
    few = predict_candidate(payload([1, 1.25, 1.5]), replace(cal, confidence=(tuple(q[:20]), tuple(hit[:20]))))
    assert few.answer.p_min == 1 / 4


def ngram_prediction(candidate):
    # alpha = 1/2, 1/4, 0, no draft cost; tau = V = 1, 5/4, 3/2, 7/4; E = 1, 3/2, 13/8, 13/8;
    # E/V = 1, 6/5, 13/12, 13/14: k_hat* = 1 at 6/5, or 2 at 13/12 where k = 1 cannot draft (ngram-simple n=2)
    cal = calibration(candidate, (8, 4, 1), (4, 1, 0), (0, 0, 0, 0), (0, 0, 0, 0))
    return predict_candidate(payload([1, 1.25, 1.5, 1.75]), cal)


def test_ngram_lines_name_the_rule_measured():
    simple = ngram_prediction(Candidate("ngram-simple", n=2))
    assert simple.answer.k_star == 2 and simple.answer.speedup == pytest.approx(13 / 12) and simple.answer.n_min == 2
    assert simple.settings["llama.cpp"]["fragment"] == ("--spec-type ngram-simple --spec-ngram-simple-size-n 2 "
                                                        "--spec-ngram-simple-size-m 2 --spec-ngram-simple-min-hits 1")
    mod = ngram_prediction(Candidate("ngram-mod", n=16, n_min=4))
    assert mod.answer.k_star == 1 and mod.answer.speedup == pytest.approx(6 / 5)
    assert mod.settings["llama.cpp"]["fragment"] == ("--spec-type ngram-mod --spec-ngram-mod-n-match 16 "
                                                     "--spec-ngram-mod-n-max 1 --spec-ngram-mod-n-min 1")


def test_engine_overhead_adds_to_the_draft_cost():
    # the ngram-mod numbers with the engine's overhead h = 0, 1/4, 1/2, 3/4 from the prediction:
    # V = 1, 3/2, 2, 5/2; E/V = 1, 1, 13/16, 13/20: nothing beats k = 0 strictly: decode plainly
    cal = calibration(Candidate("ngram-mod", n=16), (8, 4, 1), (4, 1, 0), (0, 0, 0, 0), (0, 0, 0, 0))
    p = predict_candidate(payload([1, 1.25, 1.5, 1.75], h=[0, 0.25, 0.5, 0.75]), cal)
    assert p.h == (0, 0.25, 0.5, 0.75) and p.answer.step_times == (1, 1.5, 2, 2.5) and p.answer.k_star == 0
    assert not p.settings["vllm"]["speculate"] and not p.settings["sglang"]["speculate"]
    # llama.cpp's line is priced on its compiled loop, which spends no engine time: V = tau, k = 1 at 6/5
    assert p.llama_answer.step_times == (1, 1.25, 1.5, 1.75) and p.llama_answer.k_star == 1
    assert p.llama_answer.speedup == pytest.approx(6 / 5)
    assert p.settings["llama.cpp"]["fragment"] == ("--spec-type ngram-mod --spec-ngram-mod-n-match 16 "
                                                   "--spec-ngram-mod-n-max 1 --spec-ngram-mod-n-min 1")
    assert "its draft length is 1, where moespec's engine (its Python round) takes 0" in p.settings["llama.cpp"]["why"]
    assert p.settings["llama.cpp"]["why"] in "\n".join(engine_lines(p.settings))
    assert CandidatePrediction.from_dict(p.to_dict()).llama_answer == p.llama_answer
    alone = predict_candidate(payload([1, 1.25, 1.5, 1.75], h=[0, 0.25, 0.5, 0.75]), cal, overhead=False)
    assert alone.answer.k_star == 1 and alone.llama_answer is None
    # the answer: "decode plainly" in moespec's engine, and llama.cpp's own best beside it
    said = answer_for([p])
    assert said.best is None and said.llama["name"] == "ngram-mod n=16 n-min=1" and said.llama["k_star"] == 1
    assert said.llama["speedup"] == pytest.approx(6 / 5) and said.llama["line"] == p.settings["llama.cpp"]
    assert answer_for([alone]).llama is None  # the two agree: nothing more to say
    with pytest.raises(ValueError, match="h\\(k\\) stops at k = 2"):
        predict_candidate(payload([1, 1.25, 1.5, 1.75], h=[0, 0.25, 0.5]), cal)


def test_prompt_lookup_of_a_gguf_target_is_priced_for_llama_cpp_on_its_ngram_mod():
    names = [c["name"] for c in user_candidates(prompt_lookup=3, target_gguf="t.gguf")]
    assert names == ["prompt-lookup n=3", "ngram-mod n=3 n-min=1"]  # llama-server's lookup, measured beside it
    assert [c["name"] for c in user_candidates(prompt_lookup=3)] == ["prompt-lookup n=3"]  # no llama.cpp line run
    named = user_candidates(prompt_lookup=3, ngrams=["ngram-mod:3"], target_gguf="t.gguf")
    assert [c["name"] for c in named] == ["prompt-lookup n=3", "ngram-mod n=3 n-min=1"]
    # the lookup's own acceptance is 0 (decode plainly); its ngram-mod drafts at k = 1: llama.cpp's line
    # for the lookup is the ngram-mod's, the other engines' lines stay the lookup's own
    mod = ngram_prediction(Candidate("ngram-mod", n=3))
    lookup = predict_candidate(payload([1, 1.25, 1.5, 1.75]), calibration(
        Candidate("prompt-lookup", n=3), (8, 8, 8), (0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0)))
    other = ngram_prediction(Candidate("ngram-mod", n=4))
    got = lookup_lines([lookup, mod, other])
    assert lookup.settings["llama.cpp"]["fragment"] == "--spec-type none"
    assert got[0].settings["llama.cpp"]["fragment"] == mod.settings["llama.cpp"]["fragment"] != "--spec-type none"
    assert got[0].settings["llama.cpp"]["priced_by"] == "ngram-mod n=3 n-min=1"
    assert got[0].settings["vllm"] == lookup.settings["vllm"] and got[0].answer == lookup.answer
    assert got[1:] == [mod, other]
    assert lookup_lines([lookup, other])[0] == lookup  # no ngram-mod of its n: unchanged


def test_answer_names_the_best_or_decode_plainly():
    best = answer_for([draft_prediction(), ngram_prediction(Candidate("ngram-simple", n=2))])
    assert best.best == "ngram-simple n=2 min-hits=1" and best.k_star == 2 and best.speedup == pytest.approx(13 / 12)
    assert best.settings["llama.cpp"]["speculate"] and best.verdict == "speculate"
    # alpha = 0: E = 1 everywhere; h = plain: V = 1, 3/2, 2: the best drafting is k = 1 at 2/3
    none = predict_candidate(payload([1, 1.25, 1.5]), calibration(Candidate("draft", draft="d.gguf"), (8, 8), (0, 0),
                                                                  (0, 1 / 4, 1 / 2), (0, 1 / 2, 1)))
    plainly = answer_for([none])
    assert plainly.best is None and plainly.best_drafting == pytest.approx(2 / 3)
    assert plainly.message == "decode plainly: no candidate pays (the best drafting predicts 0.67x plain decoding)"


class Clock:
    """decode's `time`: a target pass of n tokens advances it by 1 + n/4 s."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def test_check_heldout_on_a_fake_clock(monkeypatch):
    # oracle a = 1, 13 new tokens per prompt, prefill kept: token 1 comes from the prefill's row; a round at
    # k commits k + 1 tokens, the first with a pass of k tokens, later ones k + 1, until the budget leaves
    # one token (a one-token pass). Per prompt: k=0: 12 passes of 1 (12 * 5/4 = 15); k=1: 5/4 + 5 * 3/2 +
    # 5/4 = 10; k=2: 3/2 + 3 * 7/4 + 5/4 = 8; k=3: 7/4 + 2 + 2 + 5/4 = 7. Two prompts.
    clock = Clock()
    monkeypatch.setattr(decode, "time", clock)
    target = TableLM(48, seed=1)
    extend = target.extend

    def timed(tokens, outputs=None):
        clock.now += 1 + tokens.numel() / 4
        return extend(tokens, outputs)

    monkeypatch.setattr(target, "extend", timed)
    made = []
    monkeypatch.setattr(candidate_check, "PrefilledTarget", lambda *a, **kw: made.append(a) or PrefilledTarget(*a, **kw))
    check = check_heldout(target, None, Candidate("oracle", acceptance=1.0), [[1, 2, 3, 4, 5], [7, 8, 9]], kmax=3,
                          new_tokens=13, reps=2)
    assert check.tokens == (26,) * 4 and check.seconds == (30, 20, 16, 14)
    assert check.throughput == (26 / 30, 26 / 20, 26 / 16, 26 / 14) and check.best_k == 3
    assert check.speedup[3] == pytest.approx(30 / 14)
    # rounds per prompt: k=0: 13 (the prefill's row commits the first token); k=1: 6 of 2 tokens and
    # the budget's last one: 7; k=2: 4 of 3 and 1: 5; k=3: 3 of 4 and 1: 4
    assert check.rounds == (26, 14, 10, 8) and check.tokens_per_round == (1, 26 / 14, 2.6, 3.25)
    assert check.samples == (((15, 15), (15, 15)), ((10, 10), (10, 10)), ((8, 8), (8, 8)), ((7, 7), (7, 7)))
    assert check.loss_floor() == 0  # every repetition alike: the measured best k loses nothing on a resample
    # each repetition runs every k on a prompt before the next: the warm-up's prefill of prompt 0 serves the
    # first repetition's prompt 0, then one prefill per prompt and repetition (k outermost made 16)
    assert len(made) == 4
    assert HeldoutCheck.from_dict(check.to_dict()) == check
    # plain decoding of the two prompts lasts 30 s a repetition: 100 s in all asks for 4 repetitions
    longer = check_heldout(target, None, Candidate("oracle", acceptance=1.0), [[1, 2, 3, 4, 5], [7, 8, 9]], kmax=3,
                           new_tokens=13, reps=2, min_seconds=100)
    assert longer.reps == 4 and longer.seconds == check.seconds


def test_the_loss_floor_is_what_the_checks_own_noise_charges_its_best_k():
    # one prompt, 10 tokens: plain 1 s in each of 3 reps, k = 1 0.9, 0.9 and 1.2 s (median 0.9: best k = 1).
    # A resample's median at k = 1 is 1.2 s when 2 or 3 of its 3 draws are: 7/27 = 0.26 of resamples, which
    # then measure k = 1 at 10/1.2 against plain's 10: a loss of 1/6; else 0
    check = HeldoutCheck(Candidate("prompt-lookup", n=2), (10, 10), (1.0, 0.9), 1, 3, 10,
                         samples=(((1.0, 1.0, 1.0),), ((0.9, 0.9, 1.2),)))
    assert check.best_k == 1
    assert check.loss_floor(level=0.95) == pytest.approx(1 / 6) and check.loss_floor(level=0.5) == 0
    assert HeldoutCheck(Candidate("prompt-lookup", n=2), (10, 10), (1.0, 0.9), 1, 3, 10).loss_floor() is None
    draft = draft_prediction()
    scored = score_candidates([draft], [HeldoutCheck(draft.candidate, (10,) * 3, (1.0, 0.9, 1.0), 1, 3, 10,
                                                     samples=(((1.0,) * 3,), ((0.9, 0.9, 1.2),), ((1.0,) * 3,)))])
    assert scored.scores[0].loss_floor == pytest.approx(1 / 6)


def test_check_reps_stretch_a_fast_models_check():
    assert check_reps(3, 0.2, 2.0) == 10 and check_reps(3, 0.01, 2.0) == MAX_CHECK_REPS == 15
    assert check_reps(3, 5.0, 2.0) == 3 and check_reps(3, 0.2, 0.0) == 3 and check_reps(3, 0.0, 2.0) == 3


def test_score_by_hand():
    draft, simple = draft_prediction(), ngram_prediction(Candidate("ngram-simple", n=2))
    c_draft = HeldoutCheck(draft.candidate, (100,) * 3, (10, 9, 9.5), 2, 1, 50)
    c_simple = HeldoutCheck(simple.candidate, (100,) * 4, (10, 8, 9, 9.5), 2, 1, 50)
    got = score_candidates([draft, simple], [c_draft, c_simple])
    d, s = got.scores
    # draft: k_hat = 1 = measured best; predicted 24/23 against 10/9: error 216/230 - 1
    assert (d.k_hat, d.k_best, d.throughput_lost) == (1, 1, 0) and d.speedup_error == pytest.approx(216 / 230 - 1)
    # ngram-simple: k_hat = 2, best 1: within one, lost 1 - 8/9; predicted 13/12 against 10/9: 117/120 - 1
    assert s.within_one and s.throughput_lost == pytest.approx(1 / 9) and s.speedup_error == pytest.approx(-0.025)
    assert got.named == got.measured_best == "ngram-simple n=2 min-hits=1" and got.named_ok
    assert d.predicted_tokens == 1.5 and d.measured_tokens is None  # E(1) = 3/2; these checks kept no rounds
    counted = score_candidates([draft], [replace(c_draft, rounds=(100, 80, 70))]).scores[0]
    assert counted.measured_tokens == 100 / 80  # tokens per round at the measured best k = 1
    # the draft measures 1.25x, the named ngram-simple 10/8.2 = 1.2195x < 0.98 * 1.25: not within 2%
    worse = HeldoutCheck(draft.candidate, (100,) * 3, (10, 8, 9.5), 2, 1, 50)
    miss = score_candidates([draft, simple], [worse, HeldoutCheck(simple.candidate, (100,) * 4, (10, 8.2, 9, 9.5),
                                                                  2, 1, 50)])
    assert miss.measured_best == "d.gguf" and not miss.named_ok
    near = score_candidates([draft, simple], [worse, HeldoutCheck(simple.candidate, (100,) * 4, (10, 8.1, 9, 9.5),
                                                                  2, 1, 50)])
    assert near.named_ok  # 10/8.1 = 1.2346 >= 1.225
    assert CandidatesScore.from_dict(got.to_dict()) == got
    with pytest.raises(ValueError, match="no held-out check"):
        score_candidates([draft], [c_simple])
    # "decode plainly" (alpha = 0) against a check where drafting measures 10/11 = 0.91x at best: plain is the best
    plainly = predict_candidate(payload([1, 1.25, 1.5]), calibration(Candidate("draft", draft="d.gguf"), (8, 8),
                                                                     (0, 0), (0, 1 / 4, 1 / 2), (0, 1 / 2, 1)))
    slow = score_candidates([plainly], [HeldoutCheck(plainly.candidate, (90,) * 3, (10, 11, 12), 1, 1, 90)])
    assert slow.named is None and slow.measured_best is None and slow.named_ok
    assert slow.scores[0].k_hat == slow.scores[0].k_best == 0


def test_the_check_gives_each_prompt_a_fresh_ngram_pool():
    """Two copies of one prompt decode the same rounds at every k, as one copy alone does twice: no
    run's pool holds an earlier run's text (llama-speculative-simple starts every prompt so; with one
    pool over the prompts the second copy would draft from the first's continuation)."""
    target, prompt = TableLM(48, seed=2), [5, 9, 14, 3, 22, 7]
    kw = dict(kmax=3, new_tokens=40, reps=1, warmup=0)
    ngram = Candidate("ngram-mod", n=2)
    one = check_heldout(target, None, ngram, [prompt], **kw)
    two = check_heldout(target, None, ngram, [prompt, prompt], **kw)
    assert two.rounds == tuple(2 * r for r in one.rounds)
    assert one.rounds[3] < one.rounds[0]  # the rule drafts and is accepted on this text
