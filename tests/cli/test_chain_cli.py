"""moespec demo --smoke, predict, score and report through typer's CliRunner."""

from typer.testing import CliRunner

import moespec.cli.chain  # noqa: F401  (registers the commands)
import moespec.cli.main  # noqa: F401  (registers the others, so these are subcommands)
from moespec import artifacts
from moespec.cli.app import app


def test_demo_then_predict_score_report(tmp_path):
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["demo", "--smoke", "--out-dir", str(run)])
    assert result.exit_code == 0, result.output
    assert "report:" in result.output and (run / "report.html").exists()
    assert "[measure-sweep] done" in result.output  # step names survive rich's markup
    result = CliRunner().invoke(app, ["demo", "--smoke", "--out-dir", str(run), "--oracle-reps", "2"])
    assert result.exit_code == 0, result.output
    assert "measuring the sweep again" in result.output and "[characterize] reusing" in result.output
    assert artifacts.load(run / "measurement.json", "measure")["payload"]["config"]["oracle_reps"] == 2

    pred = tmp_path / "p.json"
    result = CliRunner().invoke(app, ["predict", "--characterization", str(run / "characterization.json"),
                                      "--traces", str(run / "traces.parquet"),
                                      "--measurement", str(run / "measurement-base.json"), "--out", str(pred)])
    assert result.exit_code == 0, result.output
    # the same inputs give the same prediction as the demo's
    assert artifacts.load(pred, "predict")["payload"]["depths"] == \
        artifacts.load(run / "prediction.json", "predict")["payload"]["depths"]

    score = tmp_path / "s.json"
    result = CliRunner().invoke(app, ["score", "--prediction", str(pred), "--measurement", str(run / "measurement.json"),
                                      "--out", str(score)])
    assert result.exit_code == 0, result.output
    # measured-time: the one version a tiny model's noisy timings cannot push to a time <= 0
    scored = artifacts.load(score, "score")["payload"]["depths"][0]["versions"]
    assert len(scored["measured-time"]["rules"]) == 6

    result = CliRunner().invoke(app, ["report", "--dir", str(run), "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r.html").exists() and "best measured speedup" in result.output


def test_predict_of_missing_files_is_refused(tmp_path):
    present = known_inputs(tmp_path)  # c.json, t.parquet, m.json
    flags = ("--characterization", "--traces", "--measurement")
    for i, flag in enumerate(flags):  # each input missing in turn, the others there
        paths = list(present)
        paths[i] = tmp_path / "missing" / present[i].name
        out = tmp_path / f"p{i}.json"
        args = ["predict", *(x for f, p in zip(flags, paths) for x in (f, str(p))), "--out", str(out)]
        result = CliRunner(env={"COLUMNS": "300"}).invoke(app, args)
        # a usage error (click's exit code 2, by SystemExit) naming the missing file, not a crash
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit), (flag, result.exception,
                                                                                    result.output)
        assert "Traceback" not in result.output
        assert str(paths[i]) in result.output, (flag, result.output)
        assert not out.exists()


def known_inputs(tmp_path, **base_changes):
    """A characterization, a trace and a base measurement of known values (`tests.chain.test_prediction`)."""
    from tests.chain.test_prediction import TRACE, base, characterization

    paths = tmp_path / "c.json", tmp_path / "t.parquet", tmp_path / "m.json"
    artifacts.write(paths[0], "characterize", characterization())
    TRACE.save(paths[1])
    artifacts.write(paths[2], "measure", {**base(), **base_changes})
    return paths


def test_predict_exits_1_and_writes_nothing_when_no_version_can_be_predicted(tmp_path):
    char, trace, meas = known_inputs(tmp_path, h={})  # a measurement without h(k): not a base measurement
    pred = tmp_path / "p.json"
    result = CliRunner().invoke(app, ["predict", "--characterization", str(char), "--traces", str(trace),
                                      "--measurement", str(meas), "--out", str(pred)])
    assert result.exit_code == 1 and "predicted no version" in result.output and "moespec measure --base" in result.output
    assert not pred.exists()


def test_score_exits_1_and_writes_nothing_when_no_version_can_be_scored(tmp_path):
    char, trace, meas = known_inputs(tmp_path)
    pred, score = tmp_path / "p.json", tmp_path / "s.json"
    result = CliRunner().invoke(app, ["predict", "--characterization", str(char), "--traces", str(trace),
                                      "--measurement", str(meas), "--out", str(pred)])
    assert result.exit_code == 0, result.output
    # the base measurement holds no oracle sweep: there is nothing to score against
    result = CliRunner().invoke(app, ["score", "--prediction", str(pred), "--measurement", str(meas),
                                      "--out", str(score)])
    assert result.exit_code == 1 and "scored no version" in result.output and "no-sweep" in result.output
    assert not score.exists()


def test_predict_refuses_a_measurement_of_another_model_naming_both(tmp_path):
    char, trace, meas = known_inputs(tmp_path, provenance={"model": "synthetic:mixtral-tiny", "num_experts": 16})
    result = CliRunner().invoke(app, ["predict", "--characterization", str(char), "--traces", str(trace),
                                      "--measurement", str(meas), "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 2 and not (tmp_path / "p.json").exists()
    assert "num_experts:" in result.output and "measurement_base" in result.output  # the text: test_prediction.py


def test_report_refuses_a_folder_of_two_models(tmp_path):
    from tests.chain.test_prediction import base, characterization

    olmoe = {"model": "synthetic:olmoe-tiny", "num_experts": 16, "top_k": 4}
    artifacts.write(tmp_path / "characterization.json", "characterize", {**characterization(), "provenance": olmoe})
    artifacts.write(tmp_path / "measurement.json", "measure",
                    {**base(), "provenance": {**olmoe, "model": "synthetic:mixtral-tiny", "num_experts": 8}})
    result = CliRunner().invoke(app, ["report", "--dir", str(tmp_path)])
    flat = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2 and not (tmp_path / "report.html").exists()
    assert "num_experts: characterization.json has 16; measurement.json has 8" in flat


def test_a_table_keeps_its_rows_whole_when_the_output_is_piped(tmp_path, monkeypatch):
    """CliRunner's output is no terminal, as a pipe or a log is: rich alone would wrap at 80 columns."""
    monkeypatch.delenv("COLUMNS", raising=False)
    char, trace, meas = known_inputs(tmp_path)
    result = CliRunner().invoke(app, ["predict", "--characterization", str(char), "--traces", str(trace),
                                      "--measurement", str(meas), "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if "version" in line and "crossover" in line)
    assert "k̂*(a) on the grid (dedup)" in header and "best predicted speedup" in header
    rows = [line for line in result.output.splitlines() if "prediction" in line and "│" in line]
    assert rows and max(len(line) for line in result.output.splitlines()) > 80  # wider than rich's default


def test_a_score_names_what_it_scored_and_the_report_refuses_it_beside_another_prediction(tmp_path):
    char, trace, meas = known_inputs(tmp_path)
    pred, score = tmp_path / "prediction.json", tmp_path / "score.json"
    run = CliRunner(env={"COLUMNS": "300"})
    args = ["--characterization", str(char), "--traces", str(trace), "--measurement", str(meas)]
    assert run.invoke(app, ["predict", *args, "--out", str(pred)]).exit_code == 0
    doc = artifacts.load(pred, "predict")
    assert set(doc["parents"]) == {"c.json", "t.parquet", "m.json"}
    # a score made from this prediction, its parents named as `moespec score` and the runner name them
    sweep = tmp_path / "measurement.json"
    artifacts.write(sweep, "measure", artifacts.load(meas, "measure")["payload"])
    artifacts.write(score, "score", {"depths": []}, parents=(pred, sweep))
    assert set(artifacts.load(score, "score")["parents"]) == {"prediction.json", "measurement.json"}
    assert artifacts.changed_parents(score) == []
    artifacts.write(pred, "predict", {**doc["payload"], "model": "replaced"})  # another prediction in the folder
    assert artifacts.changed_parents(score) == ["prediction.json"]
    r = run.invoke(app, ["report", "--dir", str(tmp_path), "--out", str(tmp_path / "r.html")])
    words = " ".join(r.output.replace("│", " ").split())
    assert r.exit_code != 0 and "score.json was made from another prediction.json" in words, words
