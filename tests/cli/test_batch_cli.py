"""The chain at batch size B on a GGUF file: `moespec batch` whole, and its steps through `moespec
measure --batch-sizes`, `predict` and `score`, at smoke settings."""

import json

from typer.testing import CliRunner

from moespec.cli.main import app

runner = CliRunner(env={"COLUMNS": "200"})


def _payload(path):
    return json.loads(path.read_text())["payload"]


def test_batch_chain_writes_every_artifact_resumes_and_its_steps_run_alone(tmp_path, gguf_files):
    from tests.conftest import require_llama

    require_llama()
    model = str(gguf_files["olmoe-q8_0"])
    args = ["batch", "--model", model, "--batch-sizes", "1,2", "--max-k", "2", "-a", "0.5", "-a", "0.9",
            "--prompt-tokens", "16", "--max-new-tokens", "8", "--reps", "1", "--threads", "1", "--trace-tokens", "768",
            "--smoke", "--out-dir", str(tmp_path)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    score = _payload(tmp_path / "batch-score.json")
    assert set(score["versions"]) == {"prediction", "timed"}
    for s in score["versions"].values():
        assert sorted((c["B"], c["a"]) for c in s["cells"]) == [(1, 0.5), (1, 0.9), (2, 0.5), (2, 0.9)]
        assert all(0 <= c["k_hat"] <= 2 and 0 <= c["k_measured"] <= 2 and c["loss"] >= 0 for c in s["cells"])
    measured = _payload(tmp_path / "batch-measurement.json")["by_batch"]
    assert all(len(T) == 3 and min(T) > 0 for row in measured.values() for T in row["sweep"]["T"].values())
    assert all(len(row["h"]) == 3 and set(row["tau"]) == {"1", "2", "3"} for row in measured.values())
    char = _payload(tmp_path / "batch-characterization.json")
    assert max(char["n"]) >= 6  # the largest pass, B(k + 1) = 2 * 3, is characterized
    assert (tmp_path / "schedule.png").stat().st_size > 1000 and "moespec settings --prediction" in r.output
    again = runner.invoke(app, args)  # an interrupted run resumes: finished artifacts are reused
    assert again.exit_code == 0 and again.output.count("reusing") == 5, again.output

    # the steps alone, on the same routing and characterization, a new measurement
    m, p, s = tmp_path / "m.json", tmp_path / "p.json", tmp_path / "s.json"
    r = runner.invoke(app, ["measure", "--model", model, "--batch-sizes", "1,2", "--k", "2", "--acceptance", "0.9",
                            "--depth", "16", "--new-tokens", "8", "--oracle-reps", "1", "--threads", "1",
                            "--out", str(m)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["predict", "--characterization", str(tmp_path / "batch-characterization.json"),
                            "--traces", str(tmp_path / "batch-traces.parquet"), "--measurement", str(m), "--out", str(p)])
    assert r.exit_code == 0, r.output
    assert sorted(_payload(p)["versions"]["prediction"]) == ["1", "2"]
    r = runner.invoke(app, ["score", "--prediction", str(p), "--measurement", str(m), "--out", str(s)])
    assert r.exit_code == 0, r.output
    assert [c["a"] for c in _payload(s)["versions"]["prediction"]["cells"]] == [0.9, 0.9]
    assert s.with_suffix(".png").stat().st_size > 1000


def test_batch_predict_refuses_pass_sizes_past_the_characterization(tmp_path, gguf_files):
    """A characterization to n = 9 cannot predict B = 4 at k = 2 (n = 12): refused, naming the --n to give."""
    from tests.conftest import require_llama

    require_llama()
    from moespec.bench.characterize import characterize
    from moespec.chain.batch_prediction import predict_batch
    from moespec.chain.llama_inputs import record_gguf_routing
    from moespec.models import gguf_info

    f = gguf_files["olmoe-q8_0"]
    record_gguf_routing(f, tmp_path / "t.parquet", tokens=512, threads=1)
    # n = 1..9 is what the refusal reads; one layer, a small flush and no rest of the pass keep it seconds
    char = characterize(str(f), tmp_path / "t.parquet", n=range(1, 10), reps=1, u_points=2, windows=1, threads=1,
                        layers=(0,), flush_bytes=16 << 20, depths=())
    meas = {"provenance": gguf_info.identity(f), "max_k": 2, "by_batch": {"4": {}}}
    import pytest

    with pytest.raises(ValueError, match=r"up to n = 12 .* --n 1\.\.9,12"):
        predict_batch(char, tmp_path / "t.parquet", meas)


def test_batch_refuses_what_it_cannot_run(tmp_path):
    f = tmp_path / "model.bin"
    f.write_bytes(b"x")
    r = runner.invoke(app, ["batch", "--model", str(f)])
    assert r.exit_code != 0 and "not a .gguf file" in r.output
    r = runner.invoke(app, ["measure", "--model", "synthetic:olmoe-tiny", "--batch-sizes", "1,2"])
    assert r.exit_code != 0 and "not a .gguf file" in r.output


def test_a_characterization_timed_at_other_settings_is_not_reused(tmp_path):
    """A batch characterization is reused only when it reaches the largest pass and was timed with
    this run's repetitions, U points, windows and flush: a `--smoke` one is not taken by a full run."""
    from moespec import artifacts
    from moespec.chain.batch_chain import BatchKnobs, characterization_stale
    from moespec.chain.demo_config import SMOKE_BATCH_CHARACTERIZE, SMOKE_FLUSH_BYTES
    from moespec.run_files import BATCH_CHARACTERIZATION, KINDS

    path = tmp_path / BATCH_CHARACTERIZATION
    assert characterization_stale(path, 9, {}) == ""  # none yet: nothing to redo
    smoke = {"reps": 3, "u_points": 2, "windows": 2, "flush_bytes": SMOKE_FLUSH_BYTES}
    artifacts.write(path, KINDS[BATCH_CHARACTERIZATION], {"n": [1, 2, 3, 4, 6], "settings": smoke})
    timing = {k: v for k, v in SMOKE_BATCH_CHARACTERIZE.items() if k != "n"}
    assert characterization_stale(path, 6, timing) == ""  # the smoke run again: reused
    assert characterization_stale(path, 9, timing) == "stops short of n = 9"
    full = {k: v for k, v in BatchKnobs().characterize.items() if k != "n"}
    assert "u_points 2, this run 3" in characterization_stale(path, 6, full)
    artifacts.write(path, KINDS[BATCH_CHARACTERIZATION], {"n": [1, 2, 3, 4, 6], "settings": {**smoke, "u_points": 3}})
    assert "flush_bytes" in characterization_stale(path, 6, full)  # the same counts, but the smoke's small flush
