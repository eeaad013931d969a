"""`moespec settings` through typer's CliRunner: from step times and from a predict artifact, and its errors."""

import json
import shlex
from fractions import Fraction as F

import pytest

from typer.testing import CliRunner

from moespec import artifacts
from moespec.cli.main import app

runner = CliRunner(env={"COLUMNS": "400"})  # rich wraps errors at the terminal width
V_SLOT = [0.010, 0.016, 0.022]  # seconds: one draft costs 6 ms, so a draft needs a > 0.6
V_DEDUP = [0.010, 0.011, 0.013, 0.016]  # c = 1, 2, 3 ms: a0 = 0.1


def _prediction(path):
    versions = {"prediction": {"V": {"slot": V_SLOT, "dedup": V_DEDUP, "auto": V_DEDUP}}}
    unavailable = {"calibrated": {"reason": "no-outside", "message": "the base measurement has no o(n)"}}
    return artifacts.write(path, "predict", {"depths": [{"depth": 512, "versions": versions,
                                                          "unavailable": unavailable}]})


def test_step_times_to_settings(tmp_path):
    out = tmp_path / "settings.json"
    r = runner.invoke(app, ["settings", "--step-times", "10,11,13,16,20", "-a", "0.5", "-a", "9/10", "-a", "0.05",
                            "--draft", "draft.gguf", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "settings at batch size 1" in r.output and "Not modelled" in r.output
    payload = json.loads(out.read_text())["payload"]
    assert [row["k_star"] for row in payload["rows"]] == [1, 3, 0]
    assert payload["p_min"] == 0.1 and payload["batch_size"] == 1
    assert payload["rows"][1]["speedup"] == float(F(3439, 1000) * 10 / 16)  # G_0.9(3) V(0)/V(3), eq. (9)
    llama = payload["rows"][1]["engines"][0]
    assert llama["engine"] == "llama.cpp"
    assert shlex.split(llama["fragment"]) == ["--spec-type", "draft-simple", "-md", "draft.gguf",
                                              "--spec-draft-n-max", "3", "--spec-draft-n-min", "1",
                                              "--spec-draft-p-min", "0.1"]
    assert llama["fragment"] in r.output  # printed whole, ready to paste
    assert all(not e["speculate"] for e in payload["rows"][2]["engines"])
    assert "--spec-type none" in r.output


def test_prediction_to_settings(tmp_path):
    pred = _prediction(tmp_path / "prediction.json")
    out = tmp_path / "settings.json"
    r = runner.invoke(app, ["settings", "--prediction", str(pred), "-a", "0.9", "--engine", "vllm",
                            "--prompt-lookup", "3", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "prediction version, dedup kernel, depth 512" in r.output  # calibrated is absent: the next one
    payload = json.loads(out.read_text())["payload"]
    assert payload["step_times_ms"] == [10.0, 11.0, 13.0, 16.0]
    (vllm,) = payload["rows"][0]["engines"]
    assert json.loads(shlex.split(vllm["fragment"])[1]) == \
        {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    r = runner.invoke(app, ["settings", "--prediction", str(pred), "--kernel", "slot", "-a", "0.5", "-a", "0.7",
                            "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert [row["k_star"] for row in json.loads(out.read_text())["payload"]["rows"]] == [0, 1]


def test_llama_cpps_settings_from_a_llama_cpp_prediction_are_priced_on_its_own_loop(tmp_path):
    """V̂ = 10, 11, 13, 16 ms holds 5 ms a round of moespec's engine around llama.cpp's passes τ̂ = 5, 6, 8, 11.
    At a = 0.15 one draft pays on V̂ (1.15/11 > 1/10) but not on the passes alone (1.15/6 < 1/5); at
    a = 0.9, V̂'s best is k = 3 (3.439/16 > 2.71/13) and the passes' k = 2 (2.71/8 > 3.439/11, 1.9/6)."""
    pred = tmp_path / "prediction.json"
    versions = {"prediction": {"V": {"dedup": V_DEDUP}, "tau": {"dedup": [v - 0.005 for v in V_DEDUP]}}}
    artifacts.write(pred, "predict", {"provenance": {"experts": "llama.cpp"},
                                      "depths": [{"depth": 512, "versions": versions}]})
    out = tmp_path / "settings.json"
    r = runner.invoke(app, ["settings", "--prediction", str(pred), "-a", "0.15", "-a", "0.9", "--draft", "d.gguf",
                            "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "priced on its own loop" in r.output
    payload = json.loads(out.read_text())["payload"]
    assert payload["llama_step_times_ms"] == pytest.approx([5.0, 6.0, 8.0, 11.0])
    low, high = ({e["engine"]: e for e in row["engines"]} for row in payload["rows"])
    assert [row["k_star"] for row in payload["rows"]] == [1, 3]  # the table's k̂*: moespec's engine
    assert not low["llama.cpp"]["speculate"] and low["vllm"]["speculate"]
    assert "--spec-draft-n-max 2" in high["llama.cpp"]["fragment"] and '"num_speculative_tokens": 3' in high["vllm"]["fragment"]
    artifacts.write(pred, "predict", {"depths": [{"depth": 512, "versions": versions}]})  # no engine named: V̂ alone
    r = runner.invoke(app, ["settings", "--prediction", str(pred), "-a", "0.15", "--json", str(out)])
    assert r.exit_code == 0 and "own loop" not in r.output
    assert json.loads(out.read_text())["payload"]["rows"][0]["engines"][0]["speculate"]


def test_prediction_errors(tmp_path):
    pred = str(_prediction(tmp_path / "prediction.json"))
    for args, text in [
        (["--version", "calibrated"], "no o(n)"),
        (["--version", "guess"], "'guess' is not valid"),
        (["--kernel", "fused"], "'fused' is not valid"),
        (["--depth", "4096"], "[512]"),
    ]:
        r = runner.invoke(app, ["settings", "--prediction", pred, "-a", "0.5", *args])
        assert r.exit_code == 2, r.output
        assert text in r.output, r.output
        assert "Traceback" not in r.output
    missing = str(tmp_path / "none.json")
    r = runner.invoke(app, ["settings", "--prediction", missing, "-a", "0.5"])
    assert r.exit_code == 2 and "no predict artifact" in r.output, r.output


def test_bad_input():
    for args, text in [
        (["--step-times", "10,11", "-a", "1"], "outside [0, 1)"),
        (["--step-times", "10,11", "-a", "-0.1"], "outside [0, 1)"),
        (["--step-times", "10"], "only V(0)"),
        (["--step-times", "10,0"], "V[1] = 0"),
        ([], "exactly one of"),
        (["--step-times", "10,11", "--draft", "d", "--prompt-lookup", "2"], "not both"),
        (["--step-times", "10,11", "--prompt-lookup", "0"], "0 is not valid"),
        (["--step-times", "10,11", "--engine", "tgi"], "'tgi' is not valid"),
    ]:
        r = runner.invoke(app, ["settings", *args])
        assert r.exit_code == 2, (args, r.output)
        assert text in r.output, r.output
        assert "Traceback" not in r.output


def test_batch_step_times_give_a_draft_length_per_batch_size(tmp_path):
    out = tmp_path / "batch.json"
    r = runner.invoke(app, ["settings", "--batch-step-times", "1=10,11,12,13,14", "--batch-step-times", "8=14,22,30,38,46",
                            "-a", "0.8", "--draft", "d.gguf", "--max-batch", "32", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "[[1, 7, 4], [8, 32, 1]]" in r.output and "llama-server -np 8: -np 8 " in r.output
    row = artifacts.load(out, "settings")["payload"]["rows"][0]
    assert row["k_star"] == {"1": 4, "8": 1} and row["acceptance"] == 0.8
    for bad, why in ((["--batch-step-times", "x=1,2"], "B=V(0)"), (["--batch-step-times", "2=10"], "only V(0)"),
                     (["--batch-step-times", "2=10,11", "--step-times", "10,11"], "batch size 1"),
                     (["--batch-sizes", "1,2"], "go together"), (["--batch-sizes", "0,2", "--timed", str(out)], "distinct")):
        r = runner.invoke(app, ["settings", *bad])
        assert r.exit_code != 0 and why in r.output, (bad, r.output)


def test_a_batch_prediction_gives_the_same_settings_as_its_step_times(tmp_path):
    """`--prediction batch-prediction.json` reads V̂_B per batch size (seconds, as `moespec batch` writes
    them): the same k̂*(a, B) as the same step times in ms through --batch-step-times."""
    pred = tmp_path / "batch-prediction.json"
    artifacts.write(pred, "batch-predict", {"versions": {"prediction": {"1": [0.010, 0.011, 0.012, 0.013, 0.014],
                                                                        "8": [0.014, 0.022, 0.030, 0.038, 0.046]},
                                                         "timed": {"1": [0.01, 0.03, 0.05, 0.07, 0.09]}}})
    r = runner.invoke(app, ["settings", "--prediction", str(pred), "-a", "0.8", "--draft", "d.gguf", "--max-batch", "32"])
    assert r.exit_code == 0, r.output
    assert "[[1, 7, 4], [8, 32, 1]]" in r.output
    r = runner.invoke(app, ["settings", "--prediction", str(pred), "--version", "timed", "-a", "0.8"])
    assert r.exit_code == 0 and "k̂* at B=1" in r.output and "off" in r.output, r.output  # no draft pays there
    r = runner.invoke(app, ["settings", "--prediction", str(pred), "--version", "calibrated", "-a", "0.8"])
    assert r.exit_code != 0 and "not 'calibrated'" in r.output


def test_batch_sizes_timed_on_a_gguf_file(tmp_path, gguf_files):
    """V_B(k) timed on llama.cpp at B = 1, 2 (one pass per point): a positive step time per k and batch
    size, and the settings follow from them."""
    from tests.conftest import require_llama

    require_llama()
    out = tmp_path / "timed.json"
    r = runner.invoke(app, ["settings", "--batch-sizes", "1,2", "--timed", str(gguf_files["olmoe-q8_0"]), "--max-k", "2",
                            "--reps", "1", "--timed-depth", "16", "--threads", "1", "--draft", str(gguf_files["draft-q8_0"]),
                            "-a", "0.9", "--json", str(out)])
    assert r.exit_code == 0, r.output
    payload = artifacts.load(out, "settings")["payload"]
    V = payload["batch_step_times_ms"]
    assert sorted(V) == ["1", "2"] and all(len(v) == 3 and min(v) > 0 for v in V.values())
    assert sorted(payload["timing"]["draft_step"]) == ["1", "2"]  # the draft file was timed too
    assert set(payload["rows"][0]["k_star"]) == {"1", "2"}


def test_a_damaged_timed_file_is_named_not_blamed_on_the_batch_sizes(tmp_path, gguf_files):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(gguf_files["olmoe-q8_0"].read_bytes()[:3_000_000])
    r = runner.invoke(app, ["settings", "--batch-sizes", "1,2", "--timed", str(cut), "--max-k", "2", "--reps", "1",
                            "--threads", "1"])
    (line,) = [x for x in r.output.splitlines() if x.strip()]
    assert r.exit_code != 0 and line.startswith("error: llama.cpp could not load") and "cut.gguf" in line, r.output
    assert "--batch-sizes" not in line
