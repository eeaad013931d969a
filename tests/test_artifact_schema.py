"""A missing or edited field of a chain artifact is named with its file and the fix
(`moespec.artifact_schema`, checked by `artifacts.load`), not met as `KeyError: 'fits'` or
"could not convert string to float" deep in a reader."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import moespec.cli.main  # noqa: F401  (registers the commands)
from moespec import artifacts
from moespec.artifact_schema import EVERY, INT, NUM, Optional, check, problems
from moespec.cli.app import app
from tests.cli.test_chain_cli import known_inputs

RESULTS = Path(__file__).parents[1] / "benchmarks" / "results"


def test_problems_name_the_field_and_what_it_held():
    schema = {"depths": [{"depth": INT, "versions": {EVERY: {"V": {EVERY: [NUM]}, "c": Optional(INT)}}}]}
    good = {"depths": [{"depth": 512, "versions": {"calibrated": {"V": {"dedup": [1.0, float("nan")]}, "c": None}}}]}
    assert problems(good, schema) == []
    bad = {"depths": [{"depth": 512, "versions": {"calibrated": {"V": {"dedup": [1.0, "x"]}, "c": 2}}}]}
    assert problems(bad, schema) == ["depths[0].versions.calibrated.V.dedup[1] holds 'x', not a number"]
    gone = {"depths": [{"depth": 512, "versions": {"calibrated": {"c": 2}}}]}
    assert problems(gone, schema) == ["depths[0].versions.calibrated.V is missing"]
    assert problems(gone, schema, whole=False) == []  # a reader that needs no V: only what is there is checked
    assert problems({"depths": [{"depth": True}]}, schema, whole=False) == ["depths[0].depth holds True, not a integer"]


def test_every_committed_artifact_fits_its_schema():
    docs = [json.loads(p.read_text()) for p in RESULTS.rglob("*.json")]
    docs = [d for d in docs if isinstance(d, dict) and "kind" in d and "payload" in d]
    assert len(docs) >= 20  # the demos' scores, the batch chain's artifacts, the characterizations
    for d in docs:
        check(d["kind"], d["payload"], "committed")


def _edit(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc["payload"])
    path.write_text(json.dumps(doc))


def _line(result) -> str:
    """The error's words: one `error:` line, or click's usage box unwrapped."""
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    return " ".join(result.output.replace("│", " ").split())


@pytest.mark.parametrize("change, said", [
    (lambda p: p.pop("fits"), "fits is missing"),
    (lambda p: p["eps"].update(slot="x"), "eps.slot holds 'x', not a number"),
])
def test_predict_names_a_missing_or_edited_field_of_the_characterization(tmp_path, change, said):
    char, trace, meas = known_inputs(tmp_path)
    _edit(char, change)
    result = CliRunner(env={"COLUMNS": "300"}).invoke(app, [
        "predict", "--characterization", str(char), "--traces", str(trace), "--measurement", str(meas),
        "--out", str(tmp_path / "p.json")])
    line = _line(result)
    assert f"{char}: {said}" in line and "moespec characterize" in line, line
    assert not (tmp_path / "p.json").exists()


def test_score_names_a_prediction_without_step_times(tmp_path):
    char, trace, meas = known_inputs(tmp_path)
    pred = tmp_path / "p.json"
    args = ["predict", "--characterization", str(char), "--traces", str(trace), "--measurement", str(meas)]
    assert CliRunner().invoke(app, [*args, "--out", str(pred)]).exit_code == 0
    version = next(iter(artifacts.load(pred, "predict")["payload"]["depths"][0]["versions"]))
    _edit(pred, lambda p: p["depths"][0]["versions"][version].pop("V"))
    result = CliRunner(env={"COLUMNS": "300"}).invoke(app, ["score", "--prediction", str(pred), "--measurement",
                                                            str(meas), "--out", str(tmp_path / "s.json")])
    line = _line(result)
    assert f"{pred}: depths[0].versions.{version}.V is missing" in line and "moespec predict" in line, line


def test_an_empty_list_where_one_entry_is_needed_is_named():
    from moespec.artifact_schema import NonEmpty

    schema = {"depths": NonEmpty([{"depth": INT}])}
    assert problems({"depths": []}, schema) == ["depths is empty"]
    assert problems({"depths": [{"depth": 1}]}, schema) == []
    assert problems({"depths": [{"depth": "x"}]}, schema) == ["depths[0].depth holds 'x', not a integer"]


def test_predict_names_an_edited_h_of_the_base_measurement(tmp_path):
    """An "h" that is not {depth: {k: seconds}} was read as no h at all ("unavailable (no-h)")."""
    char, trace, meas = known_inputs(tmp_path)
    _edit(meas, lambda p: p.update(h="x"))
    result = CliRunner(env={"COLUMNS": "300"}).invoke(app, [
        "predict", "--characterization", str(char), "--traces", str(trace), "--measurement", str(meas),
        "--out", str(tmp_path / "p.json")])
    line = _line(result)
    assert f"{meas}: h holds 'x', not a mapping" in line and "moespec measure" in line, line


def test_score_names_a_prediction_with_no_depth(tmp_path):
    char, trace, meas = known_inputs(tmp_path)
    pred = tmp_path / "p.json"
    args = ["predict", "--characterization", str(char), "--traces", str(trace), "--measurement", str(meas)]
    assert CliRunner().invoke(app, [*args, "--out", str(pred)]).exit_code == 0
    _edit(pred, lambda p: p.update(depths=[]))
    result = CliRunner(env={"COLUMNS": "300"}).invoke(app, ["score", "--prediction", str(pred), "--measurement",
                                                            str(meas), "--out", str(tmp_path / "s.json")])
    line = _line(result)
    assert f"{pred}: depths is empty" in line and "moespec predict" in line, line


def test_a_step_time_that_is_not_positive_is_named():
    from moespec.artifact_schema import POS

    assert problems({"V": {"dedup": [1e-3, 2e-3]}}, {"V": {EVERY: [POS]}}) == []
    assert problems({"V": {"dedup": [-1.0]}}, {"V": {EVERY: [POS]}}) == ["V.dedup[0] holds -1.0, not a positive number"]
    assert problems({"V": {"dedup": [float("inf")]}}, {"V": {EVERY: [POS]}}) == ["V.dedup[0] holds inf, not a positive number"]
