"""The README's step-by-step chain ("Will speculation pay?"), run command by command through typer's
CliRunner as written there, on olmoe-tiny with the smoke settings (`DemoConfig.smoke`) appended."""

import re
from pathlib import Path

from typer.testing import CliRunner

import moespec.cli.main  # noqa: F401  (registers every command)
from moespec import artifacts
from moespec.cli.app import app

README = Path(__file__).resolve().parents[2] / "README.md"
VERIFY = ["--depth", "16", "--n-max", "3", "--reps", "6"]  # the smoke chain's verify passes
MEASURE = [*VERIFY, "--k", "0", "--k", "1", "--k", "2", "--new-tokens", "6", "--no-flush", "--op-layers", "0"]
TINY = {  # the smoke settings of each step, appended to the README's command
    "trace": ["--max-tokens", "200"],
    "trace-verified": VERIFY,
    "characterize": ["--layers", "0", "--reps", "5", "--u-points", "2", "--windows", "2", "--n", "1..3"],
    "measure --base": MEASURE,
    "measure": [*MEASURE, "--scaling-n-max", "0"],
}


def readme_steps() -> list[list[str]]:
    """The arguments of each `moespec` command of the README's chain block, `demo` left out."""
    text = README.read_text(encoding="utf-8").split("## Will speculation pay?", 1)[1]
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1).replace("\\\n", " ")
    lines = [line.split("#", 1)[0].split() for line in block.splitlines()]
    return [words[1:] for words in lines if words and words[0] == "moespec" and words[1] != "demo"]


def check_versions(entry: dict) -> None:
    # a torch chain: every version but prediction-outside, which reads the dense products timed alone on llama.cpp
    assert {v: u["reason"] for v, u in entry["unavailable"].items()} == {"prediction-outside": "no-outside-terms"}
    assert sorted(entry["versions"]) == ["calibrated", "measured-time", "prediction"]


def test_the_readme_chain_runs_command_by_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    steps = readme_steps()
    assert [s[0] for s in steps] == ["trace", "trace-verified", "characterize", "measure", "predict", "measure",
                                     "score", "report"]
    for args in steps:
        args = [a.replace("synthetic:olmoe-shaped", "synthetic:olmoe-tiny") for a in args]
        name = "measure --base" if args[:2] == ["measure", "--base"] else args[0]
        result = CliRunner().invoke(app, args + TINY.get(name, []))
        assert result.exit_code == 0, f"moespec {' '.join(args)}\n{result.output}"
    check_versions(artifacts.load("prediction.json", "predict")["payload"]["depths"][0])
    check_versions(artifacts.load("score.json", "score")["payload"]["depths"][0])
    assert Path("report.html").stat().st_size > 0 and "best measured speedup" in Path("summary.txt").read_text()
    # the sweep read the base's verify passes back from the point log they share
    base = artifacts.load("measurement-base.json", "measure")["payload"]
    sweep = artifacts.load("measurement.json", "measure")["payload"]
    assert base["verify"] == sweep["verify"] and base["h"]["16"].keys() == {"0", "1", "2"}

