"""The chain on a dense GGUF file (`chain.dense_chain`): (22) with no MoE layer, and the demo on a dense
file with a candidate draft, end to end at smoke settings."""

from fractions import Fraction

import pytest

from moespec import artifacts, run_files
from moespec.chain.demo import DemoConfig, resolve_target, run_demo
from moespec.chain.candidates import user_candidates
from moespec.chain.prediction import base_inputs
from moespec.costmodel.predict import predict_without_experts
from moespec.models import gguf_info

pytestmark = pytest.mark.xdist_group("dense_chain")


def test_without_experts_the_papers_version_is_flat_and_the_calibrated_one_adds_g():
    """τ̂(n) = τ_meas(1) for (22) with an empty sum; + o(n) − o(1) calibrated; V(k) = τ̂(k+1) + h(k);
    no saving, no crossover; k̂*(a) and the speedup from the staircase, checked by hand at a = 0.5."""
    tau1, h, o = 0.010, [0.0, 0.001], {1: 0.002, 2: 0.005, 3: 0.011}
    flat = predict_without_experts(n_max=3, tau1=tau1, h=h, acceptance=[0.5])
    assert flat.tau["dedup"] == flat.tau["slot"] == [tau1] * 3
    assert flat.S == [0.0] * 3 and flat.crossover is None and not any(flat.sign_certain)
    cal = predict_without_experts(n_max=3, tau1=tau1, h=h, version="calibrated", outside=o, acceptance=[0.5])
    assert cal.tau["dedup"] == pytest.approx([0.010, 0.013, 0.019])
    assert cal.V["dedup"] == pytest.approx([0.010, 0.014])  # τ̂(1) + h(0), τ̂(2) + h(1)
    # at a = 1/2: k = 1 yields 1 + 1/2 tokens per step of 14 ms against 1 token per 10 ms: 15/14
    gain = Fraction(3, 2) * Fraction(10, 14)
    assert cal.k_star["dedup"] == [1] and cal.speedup["dedup"][0] == pytest.approx(float(gain))


def test_a_dense_file_is_told_from_an_moe_file(gguf_files):
    assert gguf_info.is_dense(gguf_files["draft-q8_0"]) and not gguf_info.is_dense(gguf_files["olmoe-q8_0"])
    config = DemoConfig.smoke(model=str(gguf_files["draft-q8_0"]), backend="llama.cpp")
    assert resolve_target(config, gguf_files["draft-q8_0"].parent).dense


@pytest.fixture(scope="module")
def dense_run(gguf_files, tmp_path_factory):
    out = tmp_path_factory.mktemp("dense")
    config = DemoConfig.smoke(model=str(gguf_files["draft-q8_0"]), backend="llama.cpp", threads=1,
                              candidates=user_candidates(prompt_lookup=2))
    first = run_demo(out, config=config, progress=False, echo=lambda s: None)
    again = run_demo(out, config=config, progress=False, echo=lambda s: None)
    return out, first, again


def test_the_dense_chain_runs_its_steps_and_the_drafts_answer(dense_run):
    out, first, again = dense_run
    assert list(first.ran[:3]) == ["measure-base", "characterize-dense", "predict"]
    assert "candidates" in first.ran and "candidates-score" in first.ran
    assert again.ran == ()  # every artifact reused
    for absent in (run_files.TRACES, run_files.CHARACTERIZATION, run_files.MEASUREMENT, run_files.BATCH_PREDICTION):
        assert not (out / absent).exists(), absent  # no routing, no oracle sweep, no batch chain
    flat = " ".join(first.answer.split())
    assert "(llama.cpp, 1 thread, context depth 16)" in flat and "a dense model runs no oracle sweep" in flat
    assert "Your drafts (prompt-lookup n=2)" in flat
    assert "Crossover" not in first.summary  # one kernel: no deduplication to cross over


def test_the_dense_prediction_is_tau1_plus_the_files_products_and_rest(dense_run):
    """The calibrated τ̂(n) − τ̂(1) is D(n) + R_d(n) − D(1) − R_d(1), both computed right after each of the
    base measurement's passes and read over its fit half; the paper's version stays at τ_meas(1) of
    that half."""
    from moespec.costmodel.verify_times import pass_time

    out = dense_run[0]
    pred = artifacts.load(out / run_files.PREDICTION, "predict")["payload"]
    base = artifacts.load(out / run_files.MEASUREMENT_BASE, "measure")["payload"]
    entry = pred["depths"][0]
    inputs = base_inputs(base, entry["depth"])
    tau1 = inputs.tau1
    o = {n: pass_time(inputs.beside[n]) for n in (1, 2, 3)}
    assert pred["dense"] and entry["calibrated_outside"] == "beside-passes"
    assert entry["versions"]["prediction"]["tau"]["dedup"] == pytest.approx([tau1] * 3)
    want = [tau1 + o[n] - o[1] for n in (1, 2, 3)]
    assert entry["versions"]["calibrated"]["tau"]["dedup"] == pytest.approx(want)
    assert "measured-time" in entry["unavailable"]
    # prediction-outside: the same terms as the characterization timed them, apart from any pass
    char = artifacts.load(out / run_files.DENSE_CHARACTERIZATION, run_files.KINDS[run_files.DENSE_CHARACTERIZATION])
    dense, rest = char["payload"]["dense"]["median"], char["payload"]["rest"]["median"][str(entry["depth"])]
    apart = {n: dense[str(n)] + rest[str(n)] for n in (1, 2, 3)}
    assert entry["prediction_outside"] == "dense-ops+rest"
    assert entry["versions"]["prediction-outside"]["tau"]["dedup"] == pytest.approx(
        [tau1 + apart[n] - apart[1] for n in (1, 2, 3)])
