"""The answer at the head of the summary (`report.answer`), on a run whose step times are known:
V = 10, 12, 13.5 ms gives a0 = 12/10 - 1 = 0.2; at a = 0.5, G(1)/V(1) = 1.5/12 = 0.125 and
G(2)/V(2) = 1.75/13.5 = 0.130 beat 1/10, so k* = 2; at a = 0.1 plain decoding wins."""

from moespec.report.answer import answer_blocks
from moespec.report.html import Table
from moespec.report.summary import as_text


def said(blocks) -> str:
    return " ".join(as_text(blocks).split())  # the paragraphs as words, however they were wrapped

V = [0.010, 0.012, 0.0135]
A = [0.1, 0.5]


def run(steady: bool = True, loss: float = 0.02) -> dict:
    version = {"V": {"dedup": V}, "tau": {"dedup": V}, "acceptance": A, "a0": {"dedup": 0.2}, "step_points": {"dedup": [0.2, 0.4215]},
               "k_star": {"dedup": [0, 2]}, "speedup": {"dedup": [1.0, 1.75 / 13.5 / 0.1]}}
    scored = {"acceptance": A, "k_star_predicted": [0, 2], "k_star_measured": [0, 1], "loss": [0.0, loss],
              "tau_error_dedup": 0.04, "oracle_gap": [0.0, 0.01]}
    steadiness = {"steady": steady, "message": "the machine was steady while it was measured" if steady else
                  "the machine's speed moved while it was measured, enough to spoil the scores: oracle sweep: 8 of "
                  "36 rounds ran 25% or more slower. The fix: rerun on an idle machine"}
    return {"prediction": {"model": "olmoe.gguf", "depths": [{"depth": 512, "versions": {"calibrated": version}}]},
            "measurement": {"provenance": {"experts": "llama.cpp", "options": {"threads": 2}}},
            "score": {"depths": [{"depth": 512, "versions": {"calibrated": scored}}], "steadiness": steadiness}}


def test_the_answer_says_from_which_acceptance_and_at_which_draft_length():
    text = said(answer_blocks(run()))
    assert "The answer for olmoe.gguf on this machine (llama.cpp, 2 threads, context depth 512)" in text
    assert "above a0 = 0.20" in text and "k = 1 from a = 0.20, k = 2 from a = 0.42" in text  # 12a² − 1.5a − 1.5 = 0
    table = next(b for b in answer_blocks(run()) if isinstance(b, Table))
    rows = {r[0]: r for r in table.rows}
    assert rows["0.10"][1] == 0 and rows["0.10"][3] == "--spec-type none"
    assert rows["0.50"][1] == 2 and "--spec-draft-n-max 2" in rows["0.50"][3] and "-md DRAFT_MODEL" in rows["0.50"][3]


def test_the_answer_says_how_far_to_trust_it():
    trusted = said(answer_blocks(run()))
    assert "within one of the measured best at 2 of 2 acceptances" in trusted and "trust it as measured" in trusted
    assert "The machine was steady" in trusted
    busy = said(answer_blocks(run(steady=False, loss=0.12)))
    assert "lost at most 12.0%" in busy and "broad shape" in busy
    assert "8 of 36 rounds" in busy and "rerun on an idle machine" in busy


def test_no_draft_length_pays_below_one():
    r = run()
    version = r["prediction"]["depths"][0]["versions"]["calibrated"]
    version.update(V={"dedup": [0.010, 0.0235, 0.040]}, a0={"dedup": 1.35}, k_star={"dedup": [0, 0]},
                   speedup={"dedup": [1.0, 1.0]})  # a0 = 1.35, and two drafts never pay either
    assert "speculation does not pay" in said(answer_blocks(r))
    assert answer_blocks({"measurement": {}}) == []


def test_the_words_agree_with_the_table_when_the_step_times_are_not_monotone():
    """V̂ = 0.717, 0.903, 0.834 ms (a smoke run's): one draft pays only from a0 = 0.903/0.717 − 1 = 0.26,
    but two drafts pay earlier: G(2)/V(2) > 1/V(0) once 1 + a + a² > 0.834/0.717, from a = 0.139...;
    so the staircase goes 0 -> 2 and the answer must say k = 2 from a = 0.14, never k = 1."""
    r = run()
    V2, A2 = [0.717e-3, 0.903e-3, 0.834e-3], [0.1, 0.2, 0.5]
    k2 = [max(range(3), key=lambda k: (sum(a ** i for i in range(k + 1)) / V2[k], -k)) for a in A2]
    gain2 = [sum(a ** i for i in range(k + 1)) / V2[k] * V2[0] for a, k in zip(A2, k2)]
    version = r["prediction"]["depths"][0]["versions"]["calibrated"]
    version.update(V={"dedup": V2}, acceptance=A2, k_star={"dedup": k2}, speedup={"dedup": gain2},
                   a0={"dedup": 0.903 / 0.717 - 1}, step_points={"dedup": [0.26, 0.26]})
    text = said(answer_blocks(r))
    assert k2 == [0, 2, 2]  # the table: plain at a = 0.1, two drafts at 0.2 and 0.5
    assert "above a_1 = 0.14" in text and "k = 2 from a = 0.14" in text and "k = 1 from" not in text
    assert "from a0 = 0.26" in text


def test_llama_servers_line_is_priced_without_the_engines_time_around_the_pass():
    """V̂ = 10, 12, 13.5 ms holds h = 5 ms of moespec's engine a round; llama.cpp's loop pays the passes
    τ̂ = 5, 7, 8.5 alone. At a = 0.5 the engine's k̂* is 2 (above), but on the passes alone one draft wins:
    1.5/7 = 0.214 > 1.75/8.5 = 0.206 > 1/5; at a = 0.1, 1.1/7 = 0.157 < 0.2 keeps it plain."""
    r = run()
    r["prediction"]["depths"][0]["versions"]["calibrated"]["tau"] = {"dedup": [v - 0.005 for v in V]}
    table = next(b for b in answer_blocks(r) if isinstance(b, Table))
    rows = {row[0]: row for row in table.rows}
    assert rows["0.50"][1] == 2 and "--spec-draft-n-max 1" in rows["0.50"][3]  # the engine's k̂*, llama's own line
    assert rows["0.10"][3] == "--spec-type none"
    assert "priced on llama.cpp's own loop" in table.caption
    r["measurement"]["provenance"] = {"experts": "torch"}  # moespec's engine decodes: its V̂ prices the line
    r["prediction"]["depths"][0]["versions"]["calibrated"]["V"]["auto"] = V
    r["prediction"]["depths"][0]["versions"]["calibrated"]["k_star"]["auto"] = [0, 2]
    r["prediction"]["depths"][0]["versions"]["calibrated"]["speedup"]["auto"] = [1.0, 1.75 / 13.5 / 0.1]
    table = next(b for b in answer_blocks(r) if isinstance(b, Table))
    assert "--spec-draft-n-max 2" in table.rows[1][3] and "own loop" not in table.caption
