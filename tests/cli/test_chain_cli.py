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
    run = tmp_path / "missing"
    result = CliRunner().invoke(app, ["predict", "--characterization", str(run / "c.json"), "--traces",
                                      str(run / "t.parquet"), "--measurement", str(run / "m.json")])
    assert result.exit_code != 0
