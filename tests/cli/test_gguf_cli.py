"""The chain on a user's own GGUF file through the CLI (CliRunner), on converter-written files
(`tests/converted.py`): `moespec trace` reads the routing from llama.cpp by default, `moespec demo
--smoke --model FILE.gguf` runs that very file and ends with the answer, and files the chain cannot
use are refused naming what is missing, with no traceback."""

from typer.testing import CliRunner

import moespec.cli.main  # noqa: F401  (registers every command)
from moespec.cli.app import app
from moespec.models import gguf_info
from moespec.moe.traces import RoutingTrace
from tests.models.test_gguf_info import without_key


def invoke(*args: str):
    return CliRunner(env={"COLUMNS": "300"}).invoke(app, list(args))


def refused(result, *said: str) -> None:
    """A user's error: exit 2 by SystemExit, the problem named, no traceback."""
    flat = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output and all(s in flat for s in said), flat


def test_trace_on_a_gguf_file_reads_llama_cpps_routing(converted, tmp_path):
    path = converted["deepseek2"]["q8_0"]
    out = tmp_path / "t.parquet"
    result = invoke("trace", "--model", str(path), "--out", str(out), "--max-tokens", "300", "--threads", "1")
    assert result.exit_code == 0, result.output
    assert "routing read from llama.cpp" in result.output
    trace = RoutingTrace.load(out)
    lay = gguf_info.layout(path)
    assert trace.num_tokens == 300 and list(trace.layers) == list(lay.moe_layers) == [1, 2]  # block 0 is dense
    assert trace.model_fingerprint == gguf_info.fingerprint(path) and list(trace.expert_bytes) == list(lay.expert_bytes)
    verified = tmp_path / "v.parquet"
    result = invoke("trace-verified", "--model", str(path), "--out", str(verified), "--depth", "32", "--threads", "1")
    assert result.exit_code == 0, result.output
    windows = RoutingTrace.load(verified)
    assert windows.doc_ids == ("d32/p0",) and windows.model_fingerprint == trace.model_fingerprint


def test_trace_refuses_torch_options_on_llama_cpp(converted, tmp_path):
    result = invoke("trace", "--model", str(converted["olmoe"]["f16"]), "--out", str(tmp_path / "t.parquet"),
                    "--weights")
    refused(result, "--weights apply to the torch backend", "--backend torch")


def test_demo_smoke_runs_the_given_file_and_ends_with_the_answer(converted, tmp_path):
    path = converted["qwen3moe"]["q8_0"]
    run = tmp_path / "run"
    result = invoke("demo", "--smoke", "--model", str(path), "--out-dir", str(run), "--threads", "1")
    assert result.exit_code == 0, result.output
    assert (run / "traces.parquet").is_file() and not (run / "llama.cpp").exists()  # the file is the model
    assert RoutingTrace.load(run / "traces.parquet").model == path.name
    last = " ".join(result.output.strip().split("\n\n")[-1].split())
    assert last.startswith("How far to trust it:"), result.output[-1500:]
    flat = " ".join(result.output.split())
    assert f"The answer for {path.name} on this machine (llama.cpp, 1 thread," in flat
    assert "llama-server settings" in flat and (run / "answer.txt").is_file()


def test_files_the_chain_cannot_use_are_refused(converted, smollm2_gguf, tmp_path):
    # a dense file's demo runs the dense chain (tests/chain/test_dense_chain.py); its routing does not exist
    refused(invoke("trace", "--model", str(smollm2_gguf), "--out", str(tmp_path / "a.parquet")),
            "holds no expert tensors", "dense model")
    bare = without_key(converted["olmoe"]["f16"], "olmoe.expert_count", tmp_path / "bare.gguf")
    refused(invoke("trace", "--model", str(bare), "--out", str(tmp_path / "t.parquet")),
            "no olmoe.expert_count metadata")
    refused(invoke("demo", "--smoke", "--model", str(converted["olmoe"]["f16"]), "--backend", "torch"),
            "its chain runs on llama.cpp")
    refused(invoke("demo", "--model", str(converted["olmoe"]["f16"]), "--layers", "2"), "is used as it is")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(converted["olmoe"]["f16"].read_bytes()[:4096])
    refused(invoke("demo", "--smoke", "--model", str(cut), "--out-dir", str(tmp_path / "c")), "cut.gguf")
