"""The characterization of a GGUF file records the rest of its pass R_d(n) at the depths given, beside
D(n); `--depths` is checked before anything is timed."""

import numpy as np
import pytest
from typer.testing import CliRunner

import moespec.cli.main  # noqa: F401  (registers every command)
from moespec.bench.characterize import characterize
from moespec.cli.app import app
from tests.conftest import require_llama


@pytest.fixture(autouse=True)
def _llama():
    require_llama()


def test_a_gguf_characterization_holds_the_rest_at_each_depth(converted, tmp_path):
    from moespec.chain.llama_inputs import record_gguf_routing

    path = converted["olmoe"]["q8_0"]
    record_gguf_routing(path, tmp_path / "t.parquet", tokens=120, threads=1)
    payload = characterize(str(path), tmp_path / "t.parquet", layers=(0,), n=range(1, 4), reps=1, u_points=2,
                           windows=1, flush_bytes=1 << 20, threads=1, depths=(64, 16, 64))
    rest = payload["rest"]
    assert rest["depths"] == [16, 64] and rest["threads"] == 1 and set(payload["dense"]["median"]) == {"1", "2", "3"}
    for d in ("16", "64"):
        assert set(rest["median"][d]) == {"1", "2", "3"}
        assert all(len(v) == 15 and np.median(v) == rest["median"][d][n] > 0 for n, v in rest["samples"][d].items())
    none = characterize(str(path), tmp_path / "t.parquet", layers=(0,), n=range(1, 4), reps=1, u_points=2,
                        windows=1, flush_bytes=1 << 20, threads=1, depths=())
    assert "rest" not in none and "dense" in none  # no depth: D(n) alone, as before


def test_bad_depths_are_refused_before_any_timing(tmp_path):
    with pytest.raises(ValueError, match="depths must be token counts >= 0"):
        characterize("synthetic:olmoe-tiny", tmp_path / "absent.parquet", depths=(512, -1))


@pytest.mark.parametrize("depths", ["512,512", "-4", "deep"])
def test_the_cli_refuses_bad_depths(converted, tmp_path, depths):
    result = CliRunner(env={"COLUMNS": "300"}).invoke(app, [
        "characterize", "--model", str(converted["olmoe"]["q8_0"]), "--traces", str(tmp_path / "t.parquet"),
        "--depths", depths])
    flat = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2 and "distinct depths >= 0" in flat, result.output
