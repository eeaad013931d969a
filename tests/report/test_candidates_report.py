"""The words of the user's-drafts answer (report.candidates) from candidates.json as it is stored:
an unbounded band is stored as null (JSON has no inf) and must read as "no band", not fail."""

from moespec.report.candidates import answer_lines


def stored(high):
    answer = {"k_star": 2, "speedup": 1.5, "speedup_low": 1.2, "speedup_high": high, "expected": [1, 1.5, 1.75],
              "step_times": [1, 1, 1.1]}
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
