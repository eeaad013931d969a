"""Every option is checked before any model loads or timing starts; a user's mistake is a short
message naming the value and what is valid (a usage error, exit 2), never a traceback."""

import importlib
import subprocess
import sys
import warnings

import numpy as np
import pytest
from typer.testing import CliRunner

from moespec import artifacts
from moespec.cli.main import app
from moespec.moe.synthetic_routing import sticky
from moespec.moe.traces import RoutingTrace

runner = CliRunner(env={"COLUMNS": "200"})


@pytest.fixture
def no_work(monkeypatch):
    """Any model load, characterization or measurement fails the test: the check must come first."""
    def forbidden(*args, **kwargs):
        raise AssertionError("work started before the options were checked")

    monkeypatch.setattr(importlib.import_module("moespec.models.specs"), "load", forbidden)  # not the package's `load`
    monkeypatch.setattr("moespec.cli.characterize.run_characterize", forbidden)
    monkeypatch.setattr("moespec.bench.measure.measure", forbidden)


def usage_error(args: list[str], *fragments: str) -> None:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    text = " ".join(r.output.replace("│", " ").split())  # typer's error panel, unwrapped
    for fragment in fragments:
        assert fragment in text, text


def small_trace(path):
    rng = np.random.default_rng(0)
    docs = [sticky(24, 2, 4, 16, 0.4, rng) for _ in range(2)]
    RoutingTrace(documents=docs, num_experts=16, expert_bytes=[1000, 1000], model="test").save(path)
    return path


def test_reuse_at_n_1_reports_rho_1(tmp_path):
    out = tmp_path / "reuse.json"
    r = runner.invoke(app, ["reuse", str(small_trace(tmp_path / "t.parquet")), "--n", "1", "--resamples", "20",
                            "--out", str(out)])
    assert r.exit_code == 0, r.output
    analysis = artifacts.load(out, "reuse")["payload"]["analysis"]
    assert analysis["n"] == [1] and analysis["rho_mean"]["value"] == [0.0]  # rho(1) = 0 by eq. (1)
    assert analysis["rho_bar"]["value"] == []  # no draft length k = n - 1 >= 1


@pytest.mark.parametrize("n", ["1", "2..2", "1..2"])
def test_characterize_refuses_pass_sizes_that_cannot_identify_the_fits(tmp_path, no_work, n):
    traces = tmp_path / "t.parquet"
    traces.write_bytes(b"never read")
    usage_error(["characterize", "--model", "synthetic:olmoe-tiny", "--traces", str(traces), "--n", n],
                "'--n'", "at least 2 sizes n >= 2")


@pytest.mark.parametrize("option, value, valid", [("--windows", "0", ">= 1"), ("--reps", "0", ">= 1"),
                                                  ("--u-points", "1", "0 (every U) or >= 2"),
                                                  ("--kernels", "slot", "give slot, dedup")])
def test_characterize_checks_its_counts_before_timing(tmp_path, no_work, option, value, valid):
    traces = tmp_path / "t.parquet"
    traces.write_bytes(b"never read")
    usage_error(["characterize", "--model", "synthetic:olmoe-tiny", "--traces", str(traces), option, value],
                option, value, valid)


@pytest.mark.parametrize("option, value, valid", [("--n-max", "0", ">= 1"), ("--prompts", "7", "in [1, 6]"),
                                                  ("--acceptance", "1.0", "in [0, 1)"), ("--k", "65", "in [0, 64]")])
def test_measure_checks_its_ranges_before_measuring(tmp_path, no_work, option, value, valid):
    usage_error(["measure", "--model", "synthetic:olmoe-tiny", option, value, "--out", str(tmp_path / "m.json")],
                option, value, valid)


def test_theory_names_an_empty_step_time():
    usage_error(["theory", "--step-times", "10,,11"], "'--step-times':", "entry 2 of '10,,11' is empty")
    usage_error(["theory", "--step-times", "10,-1"], "V[1] = -1 must be finite and > 0")


@pytest.mark.parametrize("option, value, valid", [("-k", "1000000", "in [0, 64]"), ("--top-p", "0", "in (0, 1]"),
                                                  ("--temperature", "-1", ">= 0"), ("--max-new-tokens", "0", ">= 1"),
                                                  ("--experts", "fastest", "moespec_auto")])
def test_generate_checks_its_options_before_loading(no_work, option, value, valid):
    usage_error(["generate", "--target", "synthetic:olmoe-tiny", "--prompt", "x", option, value], option, value, valid)


def test_output_paths_are_checked_before_the_work(tmp_path, no_work):
    usage_error(["generate", "--target", "synthetic:olmoe-tiny", "--prompt", "x", "--json", str(tmp_path)],
                "'--json'", "is a folder")
    blocker = tmp_path / "file"
    blocker.write_text("")
    usage_error(["measure", "--model", "synthetic:olmoe-tiny", "--out", str(blocker / "m.json")],
                "'--out'", "is a file, so no folder can be made there")


def test_unknown_models_and_dtypes_are_usage_errors(tmp_path, no_work):
    usage_error(["generate", "--target", "synthetic:nope", "--prompt", "x"], "'synthetic:nope' is no synthetic preset")
    usage_error(["trace", "--model", "synthetic:olmoe-tiny", "--out", str(tmp_path / "t.parquet"), "--dtype", "fp8"],
                "'fp8' is no dtype")


def test_a_non_utf8_corpus_or_artifact_is_named(tmp_path, no_work):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9".encode("latin-1"))
    r = runner.invoke(app, ["trace", "--model", "synthetic:olmoe-tiny", "--corpus", str(bad),
                            "--out", str(tmp_path / "t.parquet")])
    assert r.exit_code == 2 and r.output.startswith(f"error: {bad} is not UTF-8 text (byte 3: ") \
        and r.output.count("\n") == 1, r.output
    artifact = tmp_path / "prediction.json"
    artifact.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ValueError, match=f"{artifact} is not valid JSON"):
        artifacts.load(artifact, "predict")


def test_debug_shows_the_traceback_and_bugs_keep_theirs(tmp_path, monkeypatch):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"\xe9")
    args = ["trace", "--model", "synthetic:olmoe-tiny", "--corpus", str(bad), "--out", str(tmp_path / "t.parquet")]
    r = runner.invoke(app, ["--debug", *args])
    assert isinstance(r.exception, ValueError) and "latin1.txt is not UTF-8" in str(r.exception)

    def bug(*a, **k):
        raise AssertionError("an internal invariant")

    monkeypatch.setattr("moespec.texts.read_corpus", bug)
    assert isinstance(runner.invoke(app, args).exception, AssertionError)


def test_warnings_are_one_loud_line(monkeypatch):
    from moespec.cli import theory

    def warn_then_summarize(*args):
        warnings.warn("fit (4) of kernel 'slot' is ill-conditioned", RuntimeWarning)
        return summarize(*args)

    summarize = theory.summarize
    monkeypatch.setattr(theory, "summarize", warn_then_summarize)
    r = runner.invoke(app, ["theory", "--step-times", "10,11"])
    assert r.exit_code == 0 and "warning: fit (4) of kernel 'slot' is ill-conditioned\n" in r.output, r.output


def test_the_entry_point_prints_one_line_and_exit_2(tmp_path):
    """main(), as installed: the user's mistake is one line on stderr; --debug gives the traceback."""
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"\xe9")
    args = [sys.executable, "-m", "moespec.cli.main"]
    rest = ["trace", "--model", "synthetic:olmoe-tiny", "--corpus", str(bad), "--out", str(tmp_path / "t.parquet")]
    plain = subprocess.run([*args, *rest], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 2 and plain.stderr.startswith(f"error: {bad} is not UTF-8 text (byte 0: ") \
        and plain.stderr.count("\n") == 1, plain.stderr
    debug = subprocess.run([*args, "--debug", *rest], capture_output=True, text=True, timeout=120)
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "is not UTF-8 text" in debug.stderr


@pytest.mark.parametrize("settings, why", [(dict(n=[1, 2]), "at least 2 sizes n >= 2"),
                                           (dict(windows=0), "windows >= 1"), (dict(u_points=1), "u_points=1"),
                                           (dict(layers=[5]), "layer 5 out of range for 2 MoE layers")])
def test_the_library_checks_characterize_settings_before_timing(tmp_path, monkeypatch, settings, why):
    from moespec.bench import characterize

    def forbidden(*args, **kwargs):
        raise AssertionError("timing started before the settings were checked")

    monkeypatch.setattr(characterize, "read_bandwidth", forbidden)
    monkeypatch.setattr(characterize, "_experts_source", forbidden)
    with pytest.raises(ValueError, match=why):
        characterize.characterize("synthetic:olmoe-tiny", small_trace(tmp_path / "t.parquet"), **settings)
