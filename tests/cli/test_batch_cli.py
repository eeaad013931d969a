"""moespec batch: the schedule k̂*(a, B) on a GGUF file, timed, swept and scored at smoke settings."""

import json

from typer.testing import CliRunner

from moespec.cli.main import app

runner = CliRunner(env={"COLUMNS": "200"})


def test_batch_writes_prediction_sweep_score_and_figure_and_resumes(tmp_path, gguf_files):
    from tests.conftest import require_llama

    require_llama()
    args = ["batch", "--model", str(gguf_files["olmoe-q8_0"]), "--batch-sizes", "1,2", "--max-k", "2", "-a", "0.5",
            "-a", "0.9", "--prompt-tokens", "16", "--max-new-tokens", "8", "--reps", "1", "--threads", "1",
            "--out-dir", str(tmp_path)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    score = json.loads((tmp_path / "batch-score.json").read_text())["payload"]
    assert sorted((c["B"], c["a"]) for c in score["cells"]) == [(1, 0.5), (1, 0.9), (2, 0.5), (2, 0.9)]
    assert all(0 <= c["k_hat"] <= 2 and 0 <= c["k_measured"] <= 2 and c["loss"] >= 0 for c in score["cells"])
    sweep = json.loads((tmp_path / "batch-sweep.json").read_text())["payload"]["by_batch"]
    assert all(len(T) == 3 and min(T) > 0 for row in sweep.values() for T in row["T"].values())
    assert (tmp_path / "schedule.png").stat().st_size > 1000 and "--batch-step-times 1=" in r.output
    again = runner.invoke(app, args)  # an interrupted run resumes: finished artifacts are reused
    assert again.exit_code == 0 and again.output.count("reusing") == 2, again.output


def test_batch_refuses_what_it_cannot_run(tmp_path):
    f = tmp_path / "model.bin"
    f.write_bytes(b"x")
    r = runner.invoke(app, ["batch", "--model", str(f)])
    assert r.exit_code != 0 and "not a .gguf file" in r.output
