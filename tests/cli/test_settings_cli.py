"""`moespec settings` through typer's CliRunner: from step times and from a predict artifact, and its errors."""

import json
import shlex
from fractions import Fraction as F

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
