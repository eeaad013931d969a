"""The user's drafts in `moespec demo` (chain.candidate_steps) on the trained pair at smoke settings:
the steps run after the prediction and are reused; the answer reads τ̂ of the run's own prediction
and the calibration half only; the held-out check and its score; the words, table and figure; and
every refusal before anything runs."""

import shutil

import pytest
from typer.testing import CliRunner

from moespec import artifacts
from moespec.chain.candidate_batch import NOT_TIMED
from moespec.chain.candidate_steps import batch_answer, batch_cost_step, batch_cost_steps, candidate_steps, drop_changed
from moespec.chain.candidates import Candidate
from moespec.chain.demo import DemoConfig, demo_setup, run_demo
from moespec.cli.main import app
from tests.bench.test_candidate import WORDS, write_gguf

# the module's fixture is built once: its tests run in one pytest-xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("candidate_steps")

CANDIDATES = (Candidate("draft", draft="trained:draft").to_dict(), Candidate("prompt-lookup", n=2).to_dict(),
              Candidate("ngram-mod", n=3).to_dict())
STEPS = ("prompts", *(f"calibrate {c['name']}" for c in CANDIDATES), "passes", "candidates",
         *(f"check {c['name']}" for c in CANDIDATES), "candidates-score")
PROMPTS = ["The cat sat on the mat. The cat sat on the mat again.", "One two three, one two three, one two.",
           "def f(x): return x + x + x", "A B C D A B C D A B", "Hello there. Hello there. Hello."]


def payload(path):
    return artifacts.load(path, artifacts.kind_of(path))["payload"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("drafts")
    prompts = out / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    config = DemoConfig.smoke(model="trained:olmoe", candidates=CANDIDATES, prompts=str(prompts))
    lines = []
    result = run_demo(out / "run", config=config, progress=False, echo=lines.append)
    return out / "run", result, config, lines


def test_the_candidates_steps_run_after_the_prediction_and_are_reused(run, tmp_path):
    original, result, config, _ = run
    folder = shutil.copytree(original, tmp_path / "copy")  # the other tests read the original
    ran = result.ran
    assert ran[ran.index("score") + 1:] == STEPS
    again = run_demo(folder, config=config, progress=False, echo=lambda _: None)
    assert again.ran == ()  # every artifact reused
    one_less = DemoConfig.smoke(model="trained:olmoe", candidates=CANDIDATES[:2], prompts=config.prompts)
    third = run_demo(folder, config=one_less, progress=False, echo=lambda _: None)
    assert third.ran == ("candidates", "candidates-score")  # the two kept candidates' steps reused
    assert [c["name"] for c in payload(folder / "candidates.json")["candidates"]] == [c["name"] for c in
                                                                                       CANDIDATES[:2]]


def test_the_prompts_split_into_halves_the_calibration_alone_reads(run):
    folder, _, config, _ = run
    halves = payload(folder / "prompts.json")
    assert len(halves["calibration"]) + len(halves["heldout"]) == len(PROMPTS)
    assert not {tuple(p) for p in halves["calibration"]} & {tuple(p) for p in halves["heldout"]}
    for i in range(3):
        cal = payload(folder / f"candidate-{i}-calibration.json")
        assert cal["half"] == "calibration" and cal["measured"]["prompts"] == len(halves["calibration"])
        check = payload(folder / f"candidate-{i}-check.json")
        assert check["half"] == "held-out" and check["prompts"] == len(halves["heldout"])
        assert check["tokens"][0] == len(halves["heldout"]) * config.candidate["new_tokens"]


def test_the_answer_reads_the_runs_prediction_and_each_candidates_cost(run):
    folder, _, config, _ = run
    tau = payload(folder / "prediction.json")["depths"][0]["versions"]["calibrated"]["tau"]["auto"]
    kmax = config.candidate_knobs()["kmax"]
    got = payload(folder / "candidates.json")
    timed = payload(folder / "candidate-passes.json")
    assert timed["half"] == "calibration" and len(timed["warm"]) == len(timed["cold"]) == kmax + 1
    ahead = config.candidate_knobs()["new_tokens"] // 2  # the middle of the answer's rounds' depths
    assert timed["ahead"] == ahead
    assert timed["depths"] == [len(p) + ahead for p in payload(folder / "prompts.json")["calibration"]]
    for i, c in enumerate(got["candidates"]):
        # τ̂ of the prediction is kept beside the passes the rounds were priced with
        assert c["version"] == "calibrated" and c["tau"] == pytest.approx(tau[: kmax + 1])
        assert c["passes"] == {key: timed[key] for key in ("warm", "cold", "plain", "reps", "depths", "ahead",
                                                           "blocks")}
        # a round that proposes nothing is a plain step; a draft model proposes k every round, so
        # V̂(k) = warm(k + 1) + ĥ(k): its pass after one of the same size, its own cost and the engine's
        share = payload(folder / f"candidate-{i}-calibration.json")["measured"]["acceptance"]["draft_share"]
        assert c["answer"]["step_times"][0] == pytest.approx(timed["plain"])
        if c["candidate"]["kind"] == "draft":
            assert share == [1.0] * kmax
            assert c["answer"]["step_times"][1:] == pytest.approx([w + h for w, h in zip(timed["warm"][1:],
                                                                                         c["h"][1:])])
    costs = {c["name"]: c["h"][1] for c in got["candidates"]}
    assert costs["trained:draft"] > costs["prompt-lookup n=2"]  # a draft model's step costs more than a lookup
    best = got["answer"]
    paying = [c for c in got["candidates"] if c["answer"]["k_star"] > 0]
    if paying:
        top = max(paying, key=lambda c: c["answer"]["speedup"])
        assert best["best"] == top["name"] and best["k_star"] == top["answer"]["k_star"]
    else:
        assert best["best"] is None and best["verdict"] == "decode plainly"


def test_the_score_sets_each_prediction_beside_its_held_out_check(run):
    folder, _, _, _ = run
    score = payload(folder / "candidates-score.json")
    preds = {c["name"]: c for c in payload(folder / "candidates.json")["candidates"]}
    for s, check in zip(score["scores"], score["checks"]):
        assert s["k_hat"] == preds[s["name"]]["answer"]["k_star"]
        assert s["k_best"] == max(range(len(check["speedup"])), key=lambda k: (check["speedup"][k], -k))
        assert s["measured_speedup"] == pytest.approx(check["speedup"][s["k_hat"]])
    assert score["out_of_sample"] is True


def test_the_answer_words_table_and_figure(run):
    folder, _, _, _ = run
    answer = (folder / "answer.txt").read_text()
    assert answer.startswith("Your drafts (trained:draft, prompt-lookup n=2, ngram-mod n=3 n-min=1) on your prompts")
    assert "Checked on the held-out prompts (out of sample)" in answer
    floor = max(x["loss_floor"] for x in payload(folder / "candidates-score.json")["scores"])
    assert f"its measured best k up to {floor:.1%}" in " ".join(answer.split())
    got = payload(folder / "candidates.json")["answer"]
    if got["best"] is not None:
        assert f"llama-server: {got['settings']['llama.cpp']['fragment']}" in answer.replace("\n", " ")
    html = (folder / "report.html").read_text()
    assert "Figure 8: your drafts" in html and "Table 10: your drafts" in html


def test_a_torch_chain_times_no_draft_at_batch_size_B(run):
    folder, result, _, _ = run
    assert not list(folder.glob("candidate-*-batch-cost.json"))
    assert not any(name.startswith("batch-cost") for name in result.ran)
    assert "batch" not in payload(folder / "candidates.json")  # no batch chain: no batch lines at all


def test_refusals_come_before_anything_runs(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        demo_setup(tmp_path / "a", smoke=True, drafts=("trained:draft",), prompts=empty)
    with pytest.raises(ValueError, match="--prompts is read for your drafts"):
        demo_setup(tmp_path / "a", smoke=True, prompts=empty)
    with pytest.raises(ValueError, match="drafts only at k >= 5, and this chain prices k <= 2"):
        demo_setup(tmp_path / "a", smoke=True, ngrams=("ngram-simple:5",))
    with pytest.raises(ValueError, match="--llama-check runs llama.cpp's own speculative decoding"):
        demo_setup(tmp_path / "a", smoke=True, drafts=("trained:draft",), llama_check=True)  # a torch chain
    with pytest.raises(ValueError, match="the modes moespec prices are"):
        demo_setup(tmp_path / "a", smoke=True, ngrams=("ngram-map",))
    assert not (tmp_path / "a").exists()


def test_the_cli_refuses_a_draft_llama_cpp_would_not_pair_in_one_line(tmp_path):
    target = write_gguf(tmp_path / "t.gguf", WORDS)
    other = write_gguf(tmp_path / "d.gguf", WORDS[:6] + ["x", "e"])
    text = tmp_path / "d.bin"
    text.write_text("not a model")
    for draft, why in ((other, "id 6 is 'x' in the draft, 'd' in the target"), (text, "is not a GGUF file")):
        got = CliRunner(env={"COLUMNS": "300"}).invoke(app, ["demo", "--model", str(target), "--draft", str(draft),
                                                             "--out-dir", str(tmp_path / "out")])
        assert got.exit_code == 2 and isinstance(got.exception, SystemExit), got.output
        assert why in " ".join(got.output.replace("│", " ").split()) and "Traceback" not in got.output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


KNOBS = dict(kmax=2, new_tokens=8, prompt_tokens=24, temperature=0.0, top_p=None, seed=0, cost_reps=2, check_reps=1)
GGUF_DRAFT = Candidate("draft", draft="d.gguf").to_dict()


def test_a_gguf_draft_is_timed_at_batch_size_B_only_after_the_batch_chain(tmp_path):
    cands = (GGUF_DRAFT, CANDIDATES[0], CANDIDATES[1])  # a GGUF draft, a draft on torch, a lookup
    steps = candidate_steps(tmp_path, cands, KNOBS, source=None, target_file="t.gguf", threads=2, context=None,
                            llama=True, batch=True, echo=lambda _: None)
    names = [s.name for s in steps]
    assert names[names.index("calibrate prompt-lookup n=2") + 1: names.index("candidates") + 1] == [
        "batch-cost d.gguf", "passes", "candidates"]
    cost, answer = steps[names.index("batch-cost d.gguf")], steps[names.index("candidates")]
    assert cost.writes == tmp_path / "candidate-0-batch-cost.json" and cost.args["threads"] == 2
    assert cost.reads == (tmp_path / "prompts.json", tmp_path / "batch-measurement.json")
    assert answer.args["batch_costs"] == [cost.writes, None, None] and cost.writes in answer.reads
    plain = candidate_steps(tmp_path, cands, KNOBS, source=None, target_file=None, threads=None, context=None,
                            llama=False, echo=lambda _: None)
    assert not any(s.name.startswith("batch-cost") for s in plain)  # a torch chain runs no batch chain
    assert batch_cost_steps(tmp_path, cands, KNOBS, prompts=tmp_path / "p", threads=1, batch=False) == [None] * 3


def test_an_answer_made_before_h_B_was_timed_and_a_cost_of_another_candidate_are_made_again(tmp_path):
    cands = (GGUF_DRAFT,)
    old = {"candidates": [{"name": "d.gguf"}], "batch": {"d.gguf": {"unavailable": NOT_TIMED}}}
    artifacts.write(tmp_path / "candidates.json", "candidates", old)
    artifacts.write(tmp_path / "candidate-0-batch-cost.json", "candidate-batch-cost",
                    {"candidate": Candidate("draft", draft="e.gguf").to_dict(), "settings": KNOBS})
    drop_changed(tmp_path, cands, KNOBS, None, lambda _: None, batch=True)
    assert not (tmp_path / "candidates.json").exists() and not (tmp_path / "candidate-0-batch-cost.json").exists()
    timed = {"candidates": [{"name": "d.gguf"}], "batch": {"d.gguf": {"B": {}}}}
    artifacts.write(tmp_path / "candidates.json", "candidates", timed)
    drop_changed(tmp_path, cands, KNOBS, None, lambda _: None, batch=True)
    assert (tmp_path / "candidates.json").exists()


def test_passes_timed_at_another_depth_or_without_blocks_are_timed_again(tmp_path):
    timed = {"warm": [1.0], "cold": [1.0], "plain": 1.0, "reps": 1, "depths": [5], "settings": KNOBS, "blocks": []}
    half = KNOBS["new_tokens"] // 2
    for changed, kept in (({}, False), ({"ahead": half + 1}, False), ({"ahead": half}, True),
                          ({"ahead": half, "blocks": None}, False)):  # made before the timing kept its blocks
        got = {k: v for k, v in {**timed, **changed}.items() if v is not None}
        artifacts.write(tmp_path / "candidate-passes.json", "candidate-passes", got)
        drop_changed(tmp_path, (), KNOBS, None, lambda _: None)
        assert (tmp_path / "candidate-passes.json").exists() == kept


def test_a_calibration_without_runs_at_each_k_is_made_again(tmp_path):
    lookup = Candidate("prompt-lookup", n=2)
    acceptance = {"at_risk": [1], "accepted": [1]}
    for at_k, kept in (([], False), ([acceptance], True)):
        artifacts.write(tmp_path / "candidate-0-calibration.json", "candidate-calibration",
                        {"candidate": lookup.to_dict(), "measured": {"acceptance": acceptance, "at_k": at_k},
                         "settings": KNOBS})
        drop_changed(tmp_path, (lookup.to_dict(),), KNOBS, None, lambda _: None)
        assert (tmp_path / "candidate-0-calibration.json").exists() == kept


def test_the_batch_answer_reads_a_draft_models_stored_h_B(tmp_path):
    from tests.chain.test_candidate_batch import CHEAP_AT_4, DRAFT, LOOKUP, TIMED

    prediction = artifacts.write(tmp_path / "batch-prediction.json", "batch-predict", CHEAP_AT_4)
    cost = artifacts.write(tmp_path / "candidate-0-batch-cost.json", "candidate-batch-cost", TIMED.to_dict())
    got = batch_answer(prediction, [DRAFT, LOOKUP], [cost, None])
    assert got["d.gguf"]["B"]["4"]["k_star"] == 1 and got["d.gguf"]["vllm"]["speculate"]  # test_candidate_batch
    assert got["prompt-lookup n=3"]["B"]["4"]["step_times"] == pytest.approx([2.0, 2.6, 3.4])  # V_B + 4 h(k)
    untimed = batch_answer(prediction, [DRAFT], [tmp_path / "missing.json"])
    assert untimed["d.gguf"]["unavailable"] == NOT_TIMED and untimed["d.gguf"]["vllm"] is None


def test_a_gguf_drafts_h_B_on_llama_cpp(gguf_files, tmp_path):
    # the step on the trained draft's GGUF file, at batch sizes 1 and 2 and k <= 2 (the chain's max_k)
    prompts = artifacts.write(tmp_path / "prompts.json", "prompts", {"calibration": [[5, 6, 7, 8], [9, 10, 11]]})
    chain = artifacts.write(tmp_path / "batch-measurement.json", "batch-measure", {"sizes": [1, 2], "max_k": 2})
    draft = Candidate("draft", draft=str(gguf_files["draft-q8_0"])).to_dict()
    path = tmp_path / "candidate-0-batch-cost.json"
    batch_cost_step(None, None, candidate=draft, prompts=prompts, measurement=chain, knobs=dict(KNOBS, kmax=3),
                    path=path, threads=1)
    got = payload(path)
    assert got["kmax"] == 2 and sorted(got["by_batch"]) == ["1", "2"] and got["candidate"] == draft
    for row in got["by_batch"].values():
        assert row["plain"][0] == 0 and min(row["plain"][1:] + row["catch_up"][1:]) > 0 and row["reps"] == 2


def test_a_prediction_that_fitted_no_version_still_answers_from_the_timed_passes(run, tmp_path):
    # the run's prediction with every version removed as failed fits: the answer prices its rounds with
    # the passes it timed and the base measurement's h(k), says so, and keeps each candidate's cost
    from moespec import run_files
    from moespec.chain.candidate_steps import answer_step
    from moespec.costmodel.predict import TIMED_PASSES
    from moespec.report.candidates import answer_lines

    folder, _, config, _ = run
    doc = payload(folder / "prediction.json")
    for entry in doc["depths"]:
        entry["unavailable"] = {v: {"reason": "nonpositive-time", "message": "fits failed"} for v in entry["versions"]}
        entry["versions"] = {}
    failed = tmp_path / "prediction.json"
    artifacts.write(failed, run_files.KINDS[run_files.PREDICTION], doc)
    cals = [folder / f"candidate-{i}-calibration.json" for i in range(len(CANDIDATES))]
    out = tmp_path / "candidates.json"
    answer_step(prediction=failed, calibrations=cals, kernel="auto", path=out, passes=folder / "candidate-passes.json",
                measurement_base=folder / "measurement-base.json")
    got, before = payload(out), payload(folder / "candidates.json")
    kmax = config.candidate_knobs()["kmax"]
    h = payload(folder / "measurement-base.json")["h"][str(doc["depths"][0]["depth"])]
    for c, b in zip(got["candidates"], before["candidates"]):
        assert c["version"] == TIMED_PASSES and c["tau"] == pytest.approx(payload(folder / "candidate-passes.json")[
            "warm"][: kmax + 1])
        if c["candidate"]["kind"] == "draft":  # its own cost plus the engine's, now the base's h(k)
            own = [x - o for x, o in zip(b["h"], payload(folder / "prediction.json")["depths"][0]["versions"][
                b["version"]]["h"])]
            assert c["h"][1:] == pytest.approx([x + h[str(k)] for k, x in enumerate(own)][1:])
    assert "fitted no version" in " ".join(answer_lines(got))
    with pytest.raises(ValueError, match="holds no version"):  # without the passes nothing prices a round
        answer_step(prediction=failed, calibrations=cals, kernel="auto", path=out)
