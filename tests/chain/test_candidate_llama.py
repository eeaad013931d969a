"""llama.cpp's own speculative decoding on the held-out half (`chain.candidate_llama`): the artifact and
its summary lines from faked runs, the refusals, and one real run of the built binary on the trained
pair exported as GGUF (slow)."""

import json
import subprocess

import pytest

from moespec import artifacts, run_files
from moespec.chain.candidate_llama import (
    LLAMA_CHECK_KIND,
    MAX_RUN_REPS,
    MIN_RUN_S,
    context_size,
    llama_check_step,
    run_reps,
)
from moespec.costmodel.settings import llama_cpp_settings
from moespec.report.candidates import llama_check_lines

SECONDS = {0: 1.0, 1: 0.7, 2: 0.5, 3: 0.6}  # decode seconds of 20 tokens at each n-max: n-max 2 is best
DEFAULT_N_MAX = 3  # llama.cpp's draft-simple default (common/common.h), what a bare -md runs at


def fake_run(calls):
    def run(cmd, **kw):
        calls.append(cmd)
        if "--spec-draft-n-max" in cmd:
            k = int(cmd[cmd.index("--spec-draft-n-max") + 1])
        else:
            k = DEFAULT_N_MAX if "-md" in cmd else 0
        out = ("encoded %4d tokens in %8.3f seconds, speed: %8.3f t/s\n" % (5, 0.01, 500.0)
               + "decoded %4d tokens in %8.3f seconds, speed: %8.3f t/s\n" % (20, SECONDS[k], 20 / SECONDS[k])
               + "n_predict = %d\nn_drafted = %d\nn_accept  = %d\n" % (20, 4 * k, 3 * k))
        return subprocess.CompletedProcess(cmd, 0, stdout="", stderr=out)
    return run


def prediction(candidate: dict, fragment: str, k: int) -> dict:
    return {"name": candidate["name"], "candidate": candidate, "settings": {"llama.cpp": {"fragment": fragment}},
            "answer": {"k_star": k}}


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "t.gguf").write_bytes(b"GGUF")
    (tmp_path / "d.gguf").write_bytes(b"GGUF")
    draft = str(tmp_path / "d.gguf")
    artifacts.write(tmp_path / run_files.PROMPTS, run_files.KINDS[run_files.PROMPTS], {
        "calibration": [[1, 2]], "heldout": [[1, 2, 3], [4] * 300], "calibration_texts": ["x"],
        "heldout_texts": ["Once upon", "A list: one"]})
    cands = [
        prediction({"kind": "draft", "draft": draft, "name": draft}, llama_cpp_settings(
            k=2, n_min=1, p_min=0.0, draft=draft).fragment, 2),
        prediction({"kind": "draft", "draft": draft, "name": "plain-said"}, "--spec-type none", 0),
        prediction({"kind": "oracle", "acceptance": 0.8, "name": "oracle a=0.8"}, "--spec-type none", 0),
        prediction({"kind": "draft", "draft": "trained:draft", "name": "trained:draft"}, "--spec-type none", 0),
    ]
    artifacts.write(tmp_path / run_files.CANDIDATES, run_files.KINDS[run_files.CANDIDATES],
                    {"candidates": cands, "answer": {"best": draft}})
    return tmp_path


def run_step(folder, calls, **kw):
    path = folder / "candidates-llama.json"
    llama_check_step(prompts=folder / run_files.PROMPTS, candidates=folder / run_files.CANDIDATES,
                     target_file=str(folder / "t.gguf"), threads=2, new_tokens=20, kmax=3, reps=1, path=path,
                     run=fake_run(calls), binary=folder / "llama-speculative-simple", **kw)
    return artifacts.load(path, LLAMA_CHECK_KIND)["payload"]


def test_each_runnable_candidate_gets_plain_emitted_defaults_and_every_n_max(folder):
    calls = []
    got = run_step(folder, calls)
    # one plain run to learn the run length (20 tokens take 1 s: enough), then two prompts; six settings
    # of the first candidate, five of the second (its emitted line is plain's)
    assert len(calls) == 1 + 2 * (6 + 5) and got["new_tokens"] == 20 and got["probe_tokens_per_s"] == 20
    assert got["context"] == context_size([[1, 2, 3], [4] * 300], 20, 3) == 512
    first, said_plain, oracle, not_gguf = got["candidates"]
    assert first["plain_tokens_per_s"] == pytest.approx(40 / 2.0)
    assert first["emitted_n_max"] == 2 and first["emitted_tokens_per_s"] == pytest.approx(40 / 1.0)
    assert first["defaults_tokens_per_s"] == pytest.approx(40 / 1.2)
    assert first["defaults_values"] == {"n_max": 3, "n_min": 0, "p_min": 0.0}
    assert first["best_n_max"] == 2 and first["speculation_pays"]
    assert [s["name"] for s in first["settings"]] == ["plain", "emitted", "defaults", "n-max 1", "n-max 2",
                                                      "n-max 3"]
    assert first["settings"][3]["speedup"] == pytest.approx(1.0 / 0.7)
    assert first["goals"]["emitted_vs_best"] == {"value": 1.0, "goal": 0.97, "applies": True, "met": True}
    assert first["goals"]["emitted_vs_defaults"]["value"] == pytest.approx(1.2)
    assert first["goals"]["emitted_vs_defaults"]["met"] and first["goals"]["emitted_vs_plain"]["met"]
    # the answer said "decode plainly" where n-max 2 measures 2x: the emitted/best goal is missed
    assert said_plain["goals"]["emitted_vs_best"]["value"] == pytest.approx(0.5)
    assert said_plain["goals"]["emitted_vs_best"]["met"] is False
    assert said_plain["goals"]["emitted_vs_plain"] == {"value": 1.0, "goal": 1.0, "applies": False, "met": None}
    assert "no llama.cpp drafter" in oracle["skipped"] and "not a GGUF file" in not_gguf["skipped"]
    json.dumps(got)  # the artifact is plain JSON


def test_the_lines_give_each_figure_beside_its_goal(folder):
    lines = llama_check_lines(run_step(folder, []))
    text = "\n".join(lines)
    assert "on 2 held-out prompts" in lines[0]
    assert "plain 20.0 tok/s; emitted (n-max 2) 40.0 (2.00x)" in text
    assert "best in hindsight n-max 2 40.0 (2.00x)" in text
    assert "emitted/best 1.00 (goal >= 0.97: met)" in text and "emitted/best 0.50 (goal >= 0.97: NOT met)" in text
    assert "pays: n/a" in text and "oracle a=0.8: not run" in text


def test_the_goals_read_the_answer_llama_cpps_line_was_priced_with(folder):
    """moespec's engine says plain (k = 0) and llama.cpp's loop k = 2 (`llama_answer`): the line drafts at 2,
    so "never below plain where the answer says it pays" applies to it."""
    doc = artifacts.load(folder / run_files.CANDIDATES, run_files.KINDS[run_files.CANDIDATES])["payload"]
    first = doc["candidates"][0]
    doc["candidates"] = [{**first, "answer": {"k_star": 0}, "llama_answer": {"k_star": 2}}]
    artifacts.write(folder / run_files.CANDIDATES, run_files.KINDS[run_files.CANDIDATES], doc)
    (got,) = run_step(folder, [])["candidates"]
    assert got["predicted_k"] == 2 and got["answer_pays"] and got["emitted_n_max"] == 2
    assert got["goals"]["emitted_vs_plain"] == {"value": 2.0, "goal": 1.0, "applies": True, "met": True}


def test_a_line_priced_on_another_candidate_is_checked_there_only(folder):
    doc = artifacts.load(folder / run_files.CANDIDATES, run_files.KINDS[run_files.CANDIDATES])["payload"]
    first = doc["candidates"][0]
    twin = {**first, "name": "lookup", "settings": {"llama.cpp": {**first["settings"]["llama.cpp"],
                                                                  "priced_by": first["name"]}}}
    doc["candidates"] = [first, twin]
    artifacts.write(folder / run_files.CANDIDATES, run_files.KINDS[run_files.CANDIDATES], doc)
    calls = []
    checked, skipped = run_step(folder, calls)["candidates"]
    assert len(calls) == 1 + 2 * 6 and checked["skipped"] is None  # the probe, then one candidate's settings
    assert skipped["skipped"] == f"llama.cpp runs its line, that of {first['name']!r}: checked there"


def test_a_target_that_is_not_a_gguf_file_is_refused(folder):
    with pytest.raises(ValueError, match="needs the target as a GGUF file"):
        llama_check_step(prompts=folder / run_files.PROMPTS, candidates=folder / run_files.CANDIDATES,
                         target_file="trained:olmoe", threads=1, new_tokens=4, kmax=2, reps=1,
                         path=folder / "x.json", run=fake_run([]), binary=folder / "bin")


@pytest.mark.slow
def test_the_built_binary_runs_the_trained_pair_at_every_setting(tmp_path, gguf_files):
    """llama-speculative-simple built from the vendored source (cached after the first build) on the
    trained pair exported as q8_0 GGUF: a handful of tokens per setting, each figure read back."""
    target, draft = str(gguf_files["olmoe-q8_0"]), str(gguf_files["draft-q8_0"])
    artifacts.write(tmp_path / run_files.PROMPTS, run_files.KINDS[run_files.PROMPTS], {
        "calibration": [[1]], "heldout": [[1] * 16], "calibration_texts": ["x"],
        "heldout_texts": ["The cat sat on the mat. The cat sat on the"]})
    cand = prediction({"kind": "draft", "draft": draft, "name": "draft-q8_0"},
                      llama_cpp_settings(k=2, n_min=1, p_min=0.0, draft=draft).fragment, 2)
    artifacts.write(tmp_path / run_files.CANDIDATES, run_files.KINDS[run_files.CANDIDATES],
                    {"candidates": [cand], "answer": {"best": "draft-q8_0"}})
    path = tmp_path / "candidates-llama.json"
    llama_check_step(prompts=tmp_path / run_files.PROMPTS, candidates=tmp_path / run_files.CANDIDATES,
                     target_file=target, threads=1, new_tokens=8, kmax=2, reps=1, path=path)
    (got,) = artifacts.load(path, LLAMA_CHECK_KIND)["payload"]["candidates"]
    by_name = {s["name"]: s for s in got["settings"]}
    assert set(by_name) == {"plain", "emitted", "defaults", "n-max 1", "n-max 2"}
    assert all(s["tokens"][0] >= 8 and s["tokens_per_s"] > 0 for s in by_name.values())
    assert by_name["plain"]["drafted"] == 0  # the plain setting drafts nothing
    for name in ("emitted", "defaults", "n-max 1", "n-max 2"):
        assert 0 <= by_name[name]["accepted"] <= by_name[name]["drafted"] and by_name[name]["drafted"] > 0
    assert got["best_n_max"] in (0, 1, 2) and got["goals"]["emitted_vs_best"]["value"] > 0


def test_the_demo_adds_the_step_only_when_asked(tmp_path):
    from moespec.chain.candidate_steps import candidate_steps

    cand = {"kind": "draft", "draft": "d.gguf", "n": None, "n_min": 1, "min_hits": 1, "acceptance": None,
            "seed": 0, "name": "d.gguf"}
    knobs = {"kmax": 3, "new_tokens": 16, "prompt_tokens": 32, "check_reps": 2}
    common = dict(source=None, target_file="t.gguf", threads=1, context=None, llama=True, echo=lambda s: None)
    assert "candidates-llama" not in [s.name for s in candidate_steps(tmp_path, [cand], knobs, **common)]
    last = candidate_steps(tmp_path, [cand], knobs, **common, llama_check=True)[-1]
    assert last.name == "candidates-llama" and last.writes == tmp_path / "candidates-llama.json"
    assert last.reads == (tmp_path / run_files.PROMPTS, tmp_path / run_files.CANDIDATES)
    assert (last.args["kmax"], last.args["new_tokens"], last.args["reps"]) == (3, 16, 2)


@pytest.mark.parametrize("seconds, want", [(1.0, 2), (0.25, 4), (0.01, MAX_RUN_REPS)])
def test_a_fast_model_repeats_its_runs_at_the_asked_length(tmp_path, seconds, want):
    """20 plain tokens in `seconds`: a setting gets enough runs of 20 tokens to last MIN_RUN_S (1 s) in
    all, never fewer than the 2 asked, at most MAX_RUN_REPS; the probe is one plain run of the first
    prompt, at the asked length, as every later run."""
    calls = []

    def run(cmd, **kw):
        calls.append(cmd)
        out = ("encoded %4d tokens in %8.3f seconds, speed: %8.3f t/s\n" % (5, 0.01, 500.0)
               + "decoded %4d tokens in %8.3f seconds, speed: %8.3f t/s\n" % (20, seconds, 20 / seconds)
               + "n_predict = 20\nn_drafted = 0\nn_accept  = 0\n")
        return subprocess.CompletedProcess(cmd, 0, stdout="", stderr=out)

    reps, rate = run_reps(tmp_path / "bin", target="t.gguf", prompt="Once", threads=2, new_tokens=20, reps=2,
                          context=256, run=run)
    assert MIN_RUN_S == 1.0 and rate == pytest.approx(20 / seconds) and reps == want
    assert len(calls) == 1 and "--spec-ngram-mod-n-max" in calls[0]
    assert calls[0][calls[0].index("-n") + 1] == "20"


def test_each_held_out_prompt_decodes_on_its_own_prefill(gguf_files, monkeypatch):
    # a llama.cpp model is one cache: the check prefills one prompt at a time, so that every plain run
    # (k = 0) gives the target's own greedy continuation of its prompt (two prompts of 37 and 20 ids)
    import moespec.chain.candidate_check as check
    from moespec.backends.llama_model import LlamaModel
    from moespec.chain.candidates import Candidate
    from moespec.engine.decode import generate

    seen, real = [], check.generate

    def recording(target, prompt, **kw):
        out = real(target, prompt, **kw)
        if kw["k"] == 0:
            seen.append((list(prompt), list(out.tokens)))
        return out

    monkeypatch.setattr(check, "generate", recording)
    prompts = [list(range(3, 40)), list(range(100, 120))]
    with LlamaModel(gguf_files["olmoe-q8_0"], threads=1, n_ctx=256) as model:
        check.check_heldout(model, None, Candidate("prompt-lookup", n=2), prompts, kmax=1, new_tokens=8, reps=2,
                            warmup=0)
        assert len(seen) == 4
        for prompt, tokens in seen:
            model.reset()
            assert tokens == generate(model, prompt, k=0, max_new_tokens=8).tokens


def test_an_n_max_that_accepted_no_draft_is_plain_decoding_not_a_best_setting():
    """ngram-mod that found no match drafts nothing: its n-max runs are plain decoding measured again,
    so one that ran 2% faster than plain by the machine's noise neither becomes the best n-max nor makes
    speculation pay (the ÷ defaults goal then does not apply); one that accepted drafts does."""
    from moespec.bench.llama_settings import DEFAULTS, EMITTED, PLAIN, LlamaSetting
    from moespec.bench.llama_speculative import SettingTimes
    from moespec.chain.candidate_llama import candidate_figures

    def times(name, n_max, seconds, accepted=0):
        return SettingTimes(LlamaSetting(name, (), n_max), (100,), (seconds,), 4 * accepted, accepted)

    cand = {"kind": "ngram-mod", "n": 3, "name": "ngram-mod n=3"}
    pred = {"name": cand["name"], "candidate": cand, "answer": {"k_star": 0}}
    defaults = {"ngram-mod": {"n_match": 24, "n_max": 64, "n_min": 48}}
    base = [times(PLAIN, 0, 1.0), times(EMITTED, 0, 1.0), times(DEFAULTS, None, 1.0)]
    idle = candidate_figures(pred, base + [times("n-max 1", 1, 0.98), times("n-max 2", 2, 1.01)], defaults)
    assert idle["best_n_max"] == 0 and not idle["speculation_pays"]
    assert not idle["goals"]["emitted_vs_defaults"]["applies"] and idle["goals"]["emitted_vs_best"]["value"] == 1.0
    drafting = candidate_figures(pred, base + [times("n-max 1", 1, 0.98, accepted=5), times("n-max 2", 2, 1.01)],
                                 defaults)
    assert drafting["best_n_max"] == 1 and drafting["speculation_pays"]
