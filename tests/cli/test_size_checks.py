"""Sizes are checked against the model's context, llama.cpp's sequence limit, the batch trace and the
memory free before any work: each refusal is a usage error (exit 2) naming the value and the limit,
and nothing is loaded, measured or written first (docs/robustness.md, issue 52)."""

import importlib

import pytest
from typer.testing import CliRunner

from moespec.cli.main import app

runner = CliRunner(env={"COLUMNS": "200"})


@pytest.fixture
def no_work(monkeypatch):
    """Any model load, measurement or batch chain fails the test: the check must come before them."""
    def forbidden(*args, **kwargs):
        raise AssertionError("work started before the sizes were checked")

    monkeypatch.setattr(importlib.import_module("moespec.models.specs"), "load", forbidden)
    monkeypatch.setattr("moespec.bench.measure.measure", forbidden)
    monkeypatch.setattr("moespec.chain.batch_chain.measure", forbidden)
    monkeypatch.setattr("moespec.chain.batch_chain.run_batch_chain", forbidden)


def refused(args: list[str], *fragments: str) -> str:
    r = runner.invoke(app, args)
    text = " ".join(r.output.replace("│", " ").split())  # typer's error panel, unwrapped
    assert r.exit_code == 2, (r.exit_code, text, r.exception)
    for fragment in fragments:
        assert fragment in text, text
    return text


@pytest.fixture
def gguf(gguf_files):
    return str(gguf_files["olmoe-q8_0"])  # trained:olmoe, trained on 4096 positions


def test_a_depth_beyond_the_torch_model_positions_is_refused_before_it_loads(tmp_path, no_work):
    out = tmp_path / "m.json"
    refused(["measure", "--model", "synthetic:olmoe-tiny", "--depth", "100000000", "--out", str(out)],
            "--depth 100000000", "beyond the 8192 positions of synthetic:olmoe-tiny", "give --depth")
    assert list(tmp_path.iterdir()) == []  # no point log, no artifact


def test_a_depth_beyond_the_gguf_context_is_refused_from_its_header(tmp_path, gguf, no_work):
    refused(["measure", "--model", gguf, "--depth", "5000", "--out", str(tmp_path / "m.json")],
            "--depth 5000", "beyond the 4096 positions", "olmoe.context_length", "give --depth")
    assert list(tmp_path.iterdir()) == []


def test_a_kv_cache_beyond_the_free_memory_is_refused(tmp_path, monkeypatch, no_work):
    monkeypatch.setattr("moespec.cli.sizes.free_memory", lambda: 10_000_000)  # 10 MB free
    # olmoe-tiny: 2 layers x 2 KV heads x (16 + 16) x 4 bytes = 512 bytes a position; 4000 positions: 2 MB, fits
    refused(["measure", "--model", "synthetic:olmoe-tiny", "--depth", "8000", "--layers", "40",
             "--out", str(tmp_path / "m.json")], "--depth 8000", "KV cache of", "0.0 GB this machine has free")


def test_batch_sizes_beyond_the_trace_documents_are_refused_before_any_step(tmp_path, gguf, no_work):
    refused(["batch", "--model", gguf, "--batch-sizes", "1,100000", "--out-dir", str(tmp_path)],
            "batch size 100000", "500000 tokens", "256-token documents", "give batch sizes up to 51")
    refused(["batch", "--model", gguf, "--batch-sizes", "40", "--max-k", "1", "--trace-tokens", "64",
             "--out-dir", str(tmp_path)], "batch size 40", "--trace-tokens 64", "gives 1", "up to 1 or --trace-tokens")
    # within the corpus and the pass length, but over the 8192 default tokens' 32 documents (probe 2026-12-06)
    refused(["batch", "--model", gguf, "--batch-sizes", "1,100", "--max-k", "1", "--out-dir", str(tmp_path)],
            "batch size 100", "gives 32", "give batch sizes up to 32 or --trace-tokens 25600")
    assert list(tmp_path.iterdir()) == []


def test_batch_sizes_beyond_llama_cpp_sequences_are_refused(tmp_path, gguf, no_work):
    from moespec.cli.sizes import max_sequences

    most = max_sequences()
    refused(["measure", "--model", gguf, "--batch-sizes", f"1,{most + 1}", "--k", "1", "--depth", "8",
             "--out", str(tmp_path / "m.json")], f"batch size {most + 1}", f"the {most} llama.cpp decodes together")
    assert list(tmp_path.iterdir()) == []


def test_batch_prompt_tokens_beyond_the_gguf_context_are_refused_before_any_step(tmp_path, gguf, no_work):
    refused(["batch", "--model", gguf, "--prompt-tokens", "100000", "--out-dir", str(tmp_path)],
            "--prompt-tokens 100000", "beyond the 4096 positions", "give --prompt-tokens 4042 or less")
    assert list(tmp_path.iterdir()) == []


def test_batch_kv_caches_beyond_the_free_memory_are_refused(tmp_path, gguf, monkeypatch, no_work):
    monkeypatch.setattr("moespec.cli.sizes.free_memory", lambda: 1_000_000)
    refused(["batch", "--model", gguf, "--batch-sizes", "1,8", "--out-dir", str(tmp_path)],
            "batch size 8 x 182 positions", "KV cache of", "free")
    assert list(tmp_path.iterdir()) == []


def test_sizes_within_the_limits_pass_the_checks(gguf):
    from moespec.chain.batch_chain import BatchKnobs
    from moespec.cli.sizes import check_batch_model, check_batch_trace, check_measure

    check_measure("synthetic:olmoe-tiny", "auto", full=False, base=False, layers=None, knobs={"depths": (4096,)})
    knobs = BatchKnobs(sizes=(1, 2, 4, 8), prompt_tokens=4000)
    check_batch_trace(knobs)
    check_batch_model(gguf, knobs, "--prompt-tokens")


def test_batch_step_times_past_the_longest_draft_are_refused_at_once(monkeypatch):
    """`settings --batch-step-times` parses each list as --step-times does: kmax <= 64, before the step points."""
    from moespec.cli.options import MAX_K

    def forbidden(*args, **kwargs):
        raise AssertionError("the step points were computed before kmax was checked")

    monkeypatch.setattr("moespec.costmodel.theory.summarize", forbidden)
    times = ",".join(str(10 + k) for k in range(200))
    refused(["settings", "--batch-step-times", f"4={times}", "-a", "0.5"], f"kmax = 199, above the {MAX_K}")
    refused(["theory", "--step-times", times], f"kmax = 199, above the {MAX_K}")


def test_numbers_beyond_a_float_are_refused_naming_them():
    """1e999 is an exact Fraction but no float: the step points overflowed with a traceback; now a usage error."""
    refused(["theory", "--step-times", "10,1e999"], "'1e999' is beyond a float's range")
    refused(["theory", "--step-times", "1e-999,10"], "'1e-999' is beyond a float's range")
    refused(["theory", "--step-times", "1e-300,1e300"], "span more than a float's range")
    refused(["theory", "--step-times", "10,11", "-a", "-0.1"], "-0.1: acceptance a = -1/10 is outside [0, 1)")


def test_a_gguf_whose_key_length_runs_past_the_file_is_one_line(tmp_path, gguf):
    """A flipped string length in the header asked the reader for 1 TB (MemoryError, a traceback)."""
    from pathlib import Path

    data = bytearray(Path(gguf).read_bytes())
    data[24:32] = (2 ** 40).to_bytes(8, "little")  # the first key's length
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    r = runner.invoke(app, ["generate", "--target", str(bad), "--prompt", "hi", "--max-new-tokens", "2"])
    assert r.exit_code == 2 and "bad.gguf" in r.output and r.output.startswith("error: "), (r.output, r.exception)


def test_a_bad_batch_step_time_names_its_option_and_batch_size():
    """It named '--step-times', an option the command was not given."""
    refused(["settings", "-a", "0.5", "--batch-step-times", "4=1,nan"], "'--batch-step-times' 4=", "'nan'")
    refused(["settings", "-a", "0.5", "--batch-step-times", "4="], "'--batch-step-times' 4=", "is empty")


def test_settings_timed_batch_sizes_beyond_llama_cpp_sequences_are_refused_before_timing(gguf, monkeypatch):
    from moespec.cli.sizes import max_sequences

    def forbidden(*args, **kwargs):
        raise AssertionError("the passes were timed before the sizes were checked")

    monkeypatch.setattr("moespec.bench.batch_passes.batch_step_times", forbidden)
    most = max_sequences()
    refused(["settings", "--timed", gguf, "--batch-sizes", f"1,{most + 1}", "--acceptance", "0.7"],
            f"batch size {most + 1}", f"the {most} llama.cpp decodes together")
    refused(["settings", "--timed", gguf, "--batch-sizes", "1,2", "--timed-depth", "100000", "--acceptance", "0.7"],
            "--timed-depth 100000", "positions")
