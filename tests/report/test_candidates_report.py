"""The words of the user's-drafts answer (report.candidates) from candidates.json as it is stored:
an unbounded band is stored as null (JSON has no inf) and must read as "no band", not fail; the
batch lines of a draft model timed at B read as a host drafter's, an untimed one says why."""

from moespec.chain.candidate_batch import NOT_TIMED
from moespec.report.candidates import answer_lines, batch_lines, moved_lines


def stored(high):
    answer = {"k_star": 2, "speedup": 1.5, "speedup_low": 1.2, "speedup_high": high, "expected": [1, 1.5, 1.75],
              "geometric": [1, 1.5, 1.75], "step_times": [1, 1, 1.1], "n_min": 1, "p_min": 0.1}
    settings = {"llama.cpp": {"fragment": "--spec-type draft-simple -md d.gguf --spec-draft-n-max 2"}}
    return {"candidates": [{"name": "d.gguf", "answer": answer}],
            "answer": {"best": "d.gguf", "k_star": 2, "speedup": 1.5, "best_drafting": 1.5, "settings": settings,
                       "candidates": ["d.gguf"]}}


def test_the_band_reads_from_a_stored_answer_bounded_or_not():
    bounded = " ".join(answer_lines(stored(1.9)))
    assert "the best is d.gguf, at draft length k = 2, 1.50x plain decoding (band 1.20x to 1.90x)" in bounded
    assert "llama-server: --spec-type draft-simple -md d.gguf --spec-draft-n-max 2" in bounded
    unbounded = " ".join(answer_lines(stored(None)))
    assert "1.50x plain decoding (no band: the prediction's step-time error bound is vacuous)" in unbounded
    # the band at k̂* itself beside the band of the best speedup, where the answer kept it
    at_k = stored(1.9)
    at_k["candidates"][0]["answer"].update(low_by_k=[1, 0.9, 0.95], high_by_k=[1, 1.6, 1.8])
    assert "1.50x plain decoding (at k = 2: 0.95x to 1.80x; the best speedup over every k: 1.20x to 1.90x)" in \
        " ".join(answer_lines(at_k))


def test_llama_cpps_own_best_is_said_where_it_differs():
    plainly = stored(1.9)
    plainly["answer"].update(best=None, best_drafting=0.96, llama={
        "name": "ngram-mod n=3 n-min=1", "k_star": 3, "speedup": 1.03, "line": {"fragment": "--spec-type ngram-mod"}})
    lines = answer_lines(plainly)
    assert lines[0].endswith("decode plainly. No candidate pays on this machine: the best drafting any of them "
                             "predicts is 0.96x plain decoding.")
    assert "the best is ngram-mod n=3 n-min=1 at n-max 3, 1.03x plain decoding:" in lines[1]
    assert lines[2] == "  llama-server: --spec-type ngram-mod" and len(lines) == 3
    assert len(answer_lines(stored(1.9))) == 2  # no llama entry: the answer and its one line


def test_the_batch_lines_of_a_draft_model_timed_at_B_and_of_one_that_was_not():
    timed = {"version": "prediction", "max_k": 2, "vllm": {"speculate": True, "fragment": "--speculative-config X"},
             "B": {"1": {"k_star": 2, "speedup": 1.228, "step_times": [1, 1.25, 1.425], "h": [0, 0.15e-3, 0.225e-3]},
                   "4": {"k_star": 0, "speedup": 1.0, "step_times": [2, 2.5, 3.05], "h": [0, 0.3e-3, 0.65e-3]}}}
    lines = batch_lines({"batch": {"d.gguf": timed, "e.gguf": {"unavailable": NOT_TIMED, "vllm": None}}})
    assert lines[0] == ("At batch size B (prediction of the batch chain), d.gguf: k = 2 at B = 1 (1.23x, drafting "
                        "0.23 ms a round), k = 0 at B = 4 (1.00x).")
    assert lines[1] == "  vLLM: --speculative-config X"
    assert lines[2].startswith("At batch size B, e.gguf: no schedule (a draft model's cost at batch size B, a "
                               "batched draft pass, is not timed yet here")
    assert len(lines) == 3


def test_a_batch_schedule_at_B_1_that_differs_from_the_headline_says_so():
    at = {"version": "prediction", "max_k": 2, "vllm": None,
          "B": {"1": {"k_star": 0, "speedup": 1.0, "step_times": [1, 1.5, 2]}}}
    heads = [{"name": "d.gguf", "answer": {"k_star": 1}}]
    lines = batch_lines({"candidates": heads, "batch": {"d.gguf": at}})
    assert len(lines) == 2 and lines[1].startswith("  At B = 1 this differs from the answer above (k = 1)")
    heads[0]["answer"]["k_star"] = 0  # the same k: nothing to say
    assert len(batch_lines({"candidates": heads, "batch": {"d.gguf": at}})) == 1


def test_a_miss_whose_acceptance_moved_between_the_halves_says_so():
    row = dict(name="ngram-mod n=3 n-min=1", k_hat=0, k_best=2, predicted_tokens=1.06, measured_tokens=1.25)
    (line,) = moved_lines([row])
    assert "1.25 tokens a round against 1.06" in line and "k = 2" in line
    # a hit, a move under 10%, or a check that kept no rounds: nothing to say
    assert moved_lines([{**row, "k_hat": 2}, {**row, "measured_tokens": 1.1}, {**row, "measured_tokens": None}]) == []


def test_an_answer_priced_without_the_prediction_says_so():
    from moespec.costmodel.predict import TIMED_PASSES

    doc = stored(1.9)
    assert not any("fitted no version" in line for line in answer_lines(doc))
    doc["candidates"][0]["version"] = TIMED_PASSES
    assert "The chain's prediction fitted no version on these timings" in answer_lines(doc)[-1]


def test_a_tie_inside_the_prices_noise_says_so():
    # E = 1, 1.5, 1.75 and V = 1, 1.25, 1.5: 1.20x at k = 1 and 1.17x at k = 2, each inside how far the
    # price rose over the timing's 4 blocks (25% and 20%): decoded plainly, said once with the best of them
    doc = stored(1.9)
    doc["candidates"][0]["answer"].update(k_star=0, step_times=[1, 1.25, 1.5], price_high=[1, 1.25, 1.2])
    doc["candidates"][0]["passes"] = {"blocks": [{}] * 4}
    doc["answer"].update(best=None, best_drafting=1.2)
    lines = answer_lines(doc)
    assert lines[1] == ("d.gguf ties plain decoding: at k = 1 it predicts 1.20x, inside how far the price of a round "
                        "against a plain step moved while the target's passes were timed (up to 25% over 4 blocks), "
                        "so it decodes plainly.") and len(lines) == 2
    doc["candidates"][0]["answer"]["price_high"] = [1, 1.1, 1.1]  # the gain clears the noise: no tie to say
    assert len(answer_lines(doc)) == 1
