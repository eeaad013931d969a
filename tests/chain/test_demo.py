"""run_demo on olmoe-tiny with the smoke settings: the chain runs, a second run reuses every artifact."""

import shutil
from dataclasses import replace

import pytest

from moespec import artifacts
from moespec.bench.measure_base import HSource
from moespec.chain.versions import Unavailable, WindowSource
from moespec.costmodel.predict import VERSIONS
from moespec.chain.demo import DemoConfig, run_demo
from moespec.provenance import ProvenanceMismatch

# the module's fixture is built once: its tests run in one pytest-xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("demo")

STEPS = ("trace", "trace-verified", "characterize", "measure-base", "predict", "measure-sweep", "score")


def check_versions(entry: dict) -> None:
    """The smoke chain's artifacts hold every input of every version the torch chain can give, so each is
    computed (an unavailable one names its reason, an `Unavailable` member); prediction-outside reads
    the dense products timed alone, which only a llama.cpp characterization times."""
    reasons = {v: Unavailable(u["reason"]) for v, u in entry["unavailable"].items()}
    assert reasons == {"prediction-outside": Unavailable.NO_OUTSIDE_TERMS}
    assert sorted(entry["versions"]) == sorted(set(VERSIONS) - {"prediction-outside"})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    return out, run_demo(out, config=DemoConfig.smoke(), progress=False, echo=lambda _: None)


def test_first_run_runs_every_step_in_order(run):
    out, result = run
    assert result.ran == STEPS
    assert (out / "report.html").exists() and (out / "summary.txt").exists()


def test_every_step_that_ran_records_its_peak_memory(run):
    """Each step's peak resident memory, anonymous and file-backed apart, in memory.json and in the
    header of its JSON artifact; the summary names the largest."""
    out, result = run
    steps = artifacts.load(out / "memory.json", "memory")["payload"]["steps"]
    assert tuple(steps) == STEPS
    assert all(s["anon_bytes"] > 0 and s["file_bytes"] > 0 for s in steps.values())
    for name, kind in (("characterization.json", "characterize"), ("measurement-base.json", "measure"),
                       ("prediction.json", "predict"), ("score.json", "score")):
        assert artifacts.load(out / name, kind)["memory"]["anon_bytes"] > 0
    assert "peak resident memory" in result.summary


def test_prediction_is_written_before_the_sweep(run):
    out, _ = run
    # the sweep artifact is written after the prediction it is scored against
    assert (out / "prediction.json").stat().st_mtime_ns < (out / "measurement.json").stat().st_mtime_ns
    base = artifacts.load(out / "measurement-base.json", "measure")["payload"]
    assert base["oracle"] == [] and base["h"]["16"].keys() == {"0", "1", "2"}
    assert all(c["a"] in (None, 0.75) for e in base["h_probe"] for c in e["cells"])
    assert HSource(base["h_source"]) == HSource.ORACLE_PROBE


def test_every_version_is_predicted_and_scored(run):
    out, _ = run
    prediction = artifacts.load(out / "prediction.json", "predict")["payload"]
    score = artifacts.load(out / "score.json", "score")["payload"]
    for entry in (prediction["depths"][0], score["depths"][0]):
        check_versions(entry)
    assert set(score["depths"][0]["versions"]) == set(prediction["depths"][0]["versions"])
    assert score["depths"][0]["unavailable"] == prediction["depths"][0]["unavailable"]


def test_the_verified_windows_are_timed_between_the_passes_not_in_the_characterization(run):
    out, _ = run
    # the measured-time version reads the operation timed between the base measurement's passes, so
    # the characterization does not time the verified windows a second time
    char = artifacts.load(out / "characterization.json", "characterize")["payload"]
    assert char["points"] and all(p["source"] != "verified" for p in char["points"])
    base = artifacts.load(out / "measurement-base.json", "measure")["payload"]
    assert base["verify"][0]["op_layers"] == [0] and base["verify"][0]["ops"]
    prediction = artifacts.load(out / "prediction.json", "predict")["payload"]
    assert WindowSource(prediction["depths"][0]["measured_time_windows"]) == WindowSource.BETWEEN_PASSES


def test_second_run_reuses_every_artifact(run):
    out, _ = run
    logs = sorted(out.glob("*.points.jsonl"))
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in logs + [out / "measurement.json"]}
    again = run_demo(out, config=DemoConfig.smoke(), progress=False, echo=lambda _: None)
    assert again.ran == ()
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in before} == before


def test_summary_names_crossover_best_speedup_and_both_verify_time_errors(run):
    _, result = run
    assert "Crossover: the smallest n from which deduplication saves time, predicted / measured" in result.summary
    assert "best measured speedup" in result.summary and "Sweep noise" in result.summary
    assert "k* measured" in result.summary and "Table 8: scoring rules" in result.summary
    assert "out of sample" in result.summary and "in-sample" in result.summary


def _rerun_copy(run, tmp_path, **measure):
    """run_demo on a copy of the smoke run with `measure` knobs changed: (copy, result, echoed lines)."""
    out = tmp_path / "copy"
    shutil.copytree(run[0], out)
    smoke = DemoConfig.smoke()
    lines = []
    again = run_demo(out, config=replace(smoke, measure={**smoke.measure, **measure}), progress=False,
                     echo=lines.append)
    return out, again, lines


def test_a_run_asking_for_more_oracle_repetitions_measures_the_sweep_again(run, tmp_path):
    out, again, lines = _rerun_copy(run, tmp_path, oracle_reps=2)
    assert again.ran == ("measure-sweep", "score")  # the prediction and everything before it are kept
    assert any("oracle_reps 1, this run 2; measuring the sweep again" in line for line in lines)
    meas = artifacts.load(out / "measurement.json", "measure")["payload"]
    assert meas["config"]["oracle_reps"] == 2
    assert all(c["runs"] == 2 for e in meas["oracle"] for c in e["cells"])  # 1 prompt x 2 repetitions


def test_a_run_asking_for_more_verify_repetitions_measures_and_predicts_again(run, tmp_path):
    out, again, lines = _rerun_copy(run, tmp_path, reps=8)
    # the prediction reads the base measurement, and the sweep is scored against the prediction;
    # repetition 7 reads 3 * 7 + 3 tokens of continuation (stride 3, n <= 3): its routing is recorded again
    assert again.ran == ("trace-verified", "measure-base", "predict", "measure-sweep", "score")
    assert any("holds 18 tokens per continuation, the verify passes read 24" in line for line in lines)
    assert any("reps 6, this run 8; measuring it again" in line for line in lines)
    base = artifacts.load(out / "measurement-base.json", "measure")["payload"]
    assert base["config"]["reps"] == 8
    assert all(len(s[0]) == 8 for p in base["verify"][0]["samples"].values() for s in p.values())  # [P, R]


def test_full_is_the_papers_protocol():
    """`--full` (issue 6): 6 prompts, 256 tokens, k = 0..8, 11 acceptance values from 0.2 to 0.98, both
    depths, both kernels swept; its base phase still runs no scored cell."""
    from moespec.bench.measure import MeasureConfig
    from moespec.kernel_names import ENGINE_KERNELS as KERNELS
    from moespec.bench.measure_base import H_PROBE_ACCEPTANCE
    from moespec.chain.demo_config import measure_config as _measure_config
    from moespec.chain.demo_config import phase_knobs as _phase_knobs

    cfg = DemoConfig.full_protocol()
    m = _measure_config(cfg)
    assert (m.prompts, m.new_tokens, m.oracle_steps, m.depths) == (6, 256, None, (512, 4096))
    assert m.ks == tuple(range(9)) and len(m.acceptances) == 11
    assert (m.acceptances[0], m.acceptances[-1]) == (0.2, 0.98) and set(m.oracle_kernels) == set(KERNELS)
    base = MeasureConfig.preset(True, **_phase_knobs(cfg, True))
    assert base.acceptances == (H_PROBE_ACCEPTANCE,) and H_PROBE_ACCEPTANCE not in m.acceptances
    assert cfg.trace_tokens > DemoConfig.demo().trace_tokens


def test_a_run_shaped_like_full_scores_and_reports_every_depth_and_kernel(tmp_path):
    """What `--full` adds to the demo's shape, at smoke size: two depths, several prompts, both kernels
    swept; each depth is predicted, scored and drawn."""
    import re

    from moespec.kernel_names import ENGINE_KERNELS as KERNELS

    smoke = DemoConfig.smoke()
    cfg = replace(smoke, measure={**smoke.measure, "depths": (16, 24), "prompts": 2, "oracle_kernels": KERNELS})
    result = run_demo(tmp_path, config=cfg, progress=False, echo=lambda _: None)
    assert result.ran == STEPS
    meas = artifacts.load(tmp_path / "measurement.json", "measure")["payload"]
    assert sorted((e["depth"], e["kernel"]) for e in meas["oracle"]) == sorted(
        (d, k) for d in (16, 24) for k in KERNELS)
    score = artifacts.load(tmp_path / "score.json", "score")["payload"]
    assert [e["depth"] for e in score["depths"]] == [16, 24]
    for e in score["depths"]:
        check_versions(e)
    assert all(f"(gap, %), d = {d}" in result.summary for d in (16, 24))  # the k* table of each depth
    html = (tmp_path / "report.html").read_text()
    for i in (4, 5, 6):  # the whole-model figures, at each depth; Figures 1-3 describe the trace and kernels
        assert sorted(set(int(d) for d in re.findall(rf"Figure {i}: [^<]*?d = (\d+)", html))) == [16, 24]
    assert len(re.findall(r'src="data:image/png;base64,', html)) == 3 + 3 * 2


def _refused(run, tmp_path, config: DemoConfig) -> ProvenanceMismatch:
    """run_demo on a copy of the smoke run (olmoe-tiny, seed 0) with `config`: the refusal, the copy unchanged."""
    out = tmp_path / "copy"
    shutil.copytree(run[0], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ProvenanceMismatch) as e:
        run_demo(out, config=config, progress=False, echo=lambda _: None)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert "--restart" in str(e.value) and "this run (--model " in str(e.value)
    return e.value


def test_a_folder_made_for_another_model_is_refused_naming_what_differs(run, tmp_path):
    e = _refused(run, tmp_path, DemoConfig.smoke(model="synthetic:mixtral-tiny"))
    fields = {line.split(":", 1)[0] for line in e.differences}
    assert fields == {"model", "fingerprint", "num_experts", "top_k"}  # mixtral-tiny: 8 experts, top-2
    assert any('this run (--model synthetic:mixtral-tiny) has "synthetic:mixtral-tiny"' in d for d in e.differences)


def test_a_folder_of_other_weights_under_the_same_spec_is_refused(run, tmp_path):
    e = _refused(run, tmp_path, DemoConfig.smoke(seed=1))  # seed 1 draws other weights: only the fingerprint differs
    assert [line.split(":", 1)[0] for line in e.differences] == ["fingerprint"]


def test_restart_moves_the_folder_aside_and_runs_the_chain_afresh(run, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(run[0], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    again = run_demo(out, config=DemoConfig.smoke(model="synthetic:mixtral-tiny"), progress=False,
                     echo=lambda _: None, restart=True)
    assert again.ran == STEPS
    assert {p.name: p.read_bytes() for p in out.glob("*.old")} == {f"{n}.old": b for n, b in before.items()}
    for name, kind in (("characterization.json", "characterize"), ("measurement.json", "measure")):
        assert artifacts.load(out / name, kind)["payload"]["provenance"]["model"] == "synthetic:mixtral-tiny"
