"""Bad input to the llama.cpp backend gets a one-line error naming the value and the fix, and the
Python process survives (llama.cpp aborts on some errors: moespec checks before calling it)."""

import json
import sys

import pytest
from typer.testing import CliRunner

from moespec.backends import llama_lib
from moespec.backends.llama_model import LlamaModel
from moespec.cli.main import app
from moespec.engine.decode import check_pairing, generate
from moespec.models import load

runner = CliRunner(env={"COLUMNS": "200"})


def _gguf(tmp_path, arch: str, experts: tuple[int, int] | None = None):
    import gguf
    import numpy as np

    path = tmp_path / f"{arch}{'-' + '-'.join(map(str, experts)) if experts else ''}.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    if experts:
        w.add_expert_count(experts[0])
        w.add_expert_used_count(experts[1])
    w.add_tensor("token_embd.weight", np.zeros((10, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_files_llama_cpp_cannot_load(gguf_files, tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    with pytest.raises(ValueError, match=r"not a GGUF file \(it starts with b'not '"):
        LlamaModel(text)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(gguf_files["olmoe-f32"].read_bytes()[:3_000_000])
    with pytest.raises(ValueError, match="not within the file bounds.*cut short: copy or convert it again"):
        LlamaModel(cut)
    with pytest.raises(ValueError, match="unknown model architecture: 'nosucharch'.*--backend torch"):
        LlamaModel(_gguf(tmp_path, "nosucharch"))
    with pytest.raises(ValueError, match="is no file"):
        LlamaModel(tmp_path / "missing.gguf")


@pytest.mark.parametrize("experts, said", [
    ((4, 8), "olmoe.expert_used_count = 8, more than its olmoe.expert_count = 4"),
    ((0, 2), "olmoe.expert_count = 0 but olmoe.expert_used_count = 2"),
])
def test_contradicting_expert_counts_are_refused_before_llama_cpp_aborts(tmp_path, experts, said):
    """llama.cpp aborts the process on these (exit 134); moespec reads the header first."""
    bad = _gguf(tmp_path, "olmoe", experts)
    with pytest.raises(ValueError, match=said + ".*convert the model again"):
        LlamaModel(bad)
    r = runner.invoke(app, ["generate", "--target", str(bad), "--prompt", "x", "--max-new-tokens", "2"])
    (line,) = [x for x in r.output.splitlines() if x.strip()]
    assert r.exit_code != 0 and line.startswith("error: ") and said in line, r.output
    from moespec.models import gguf_info

    with pytest.raises(ValueError, match=said):  # the file's identity, compared with a trace's, is read after it
        gguf_info.identity(bad)


def test_more_threads_than_cores_are_refused_in_one_line(gguf_files):
    from moespec.backends.llama_model import default_threads

    cores = default_threads()
    with pytest.raises(ValueError, match=f"threads={cores + 1} is more than the {cores} cores.*give {cores} or fewer"):
        LlamaModel(gguf_files["olmoe-q8_0"], threads=cores + 1)
    r = runner.invoke(app, ["generate", "--target", str(gguf_files["olmoe-q8_0"]), "--prompt", "x",
                            "--threads", "10000"])
    (line,) = [x for x in r.output.splitlines() if x.strip()]
    assert r.exit_code != 0 and f"threads=10000 is more than the {cores} cores" in line, r.output


def test_a_draft_with_another_vocabulary_is_refused_naming_both(gguf_files, smollm2_gguf):
    _, olmoe_tok = load(str(gguf_files["olmoe-q8_0"]), backend="llama.cpp")
    _, smol_tok = load(str(smollm2_gguf), backend="llama.cpp")
    with pytest.raises(ValueError, match=r"target's tokenizer \(LlamaTokenizer\(.*olmoe-q8_0.gguf, 259 ids\)\) has 259 "
                                         r"ids and the draft's \(LlamaTokenizer\(.*SmolLM2.*\)\) 49152"):
        check_pairing(olmoe_tok, smol_tok)


def test_a_prompt_and_budget_beyond_the_context_fail_before_any_pass(gguf_files):
    model = LlamaModel(gguf_files["olmoe-q8_0"], threads=1, n_ctx=256)
    with pytest.raises(ValueError, match=r"target's context holds 256 positions, but a 200-token prompt, "
                                         r"max_new_tokens=60 and drafts of up to 4 need 264"):
        generate(model, list(range(200)), draft=LlamaModel(gguf_files["draft-q8_0"], threads=1), k=4,
                 max_new_tokens=60)
    assert model.length == 0 and model.forward_s == 0.0


def test_the_backend_without_llama_cpp_python_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    llama_lib.bindings.cache_clear()
    try:
        with pytest.raises(ValueError, match=r'CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF" pip install '
                                             r"'moespec\[llama\]'"):
            llama_lib.bindings()
        assert not llama_lib.available()
    finally:
        llama_lib.bindings.cache_clear()


def test_options_of_the_other_backend_are_refused(gguf_files):
    with pytest.raises(ValueError, match="dtype apply to the torch backend"):
        load(str(gguf_files["olmoe-q8_0"]), backend="llama.cpp", dtype="bfloat16")
    with pytest.raises(ValueError, match="decodes GGUF files; 'trained:olmoe' is none.*export-gguf trained:olmoe"):
        load("trained:olmoe", backend="llama.cpp")
    with pytest.raises(ValueError, match="threads, n_ctx and sequences set llama.cpp's context"):
        load("synthetic:dense-tiny", threads=1)
    with pytest.raises(ValueError, match="decode one sequence at a time"):
        load("synthetic:dense-tiny", sequences=2)


@pytest.mark.parametrize("args, message", [
    (["--threads", "0"], "0 is not valid; give a value >= 1"),
    (["--backend", "vllm"], "'vllm' is no backend; use one of torch, llama.cpp"),
])
def test_cli_usage_errors(gguf_files, args, message):
    r = runner.invoke(app, ["generate", "--target", str(gguf_files["olmoe-q8_0"]), "--prompt", "x", *args])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output


def test_cli_reports_a_file_llama_cpp_refuses_in_one_line(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    r = runner.invoke(app, ["generate", "--target", str(bad), "--prompt", "x"])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    line = r.output.strip().splitlines()[-1]
    assert line.startswith("error: llama.cpp could not load") and "bad.gguf" in line, r.output


def test_cli_decodes_a_gguf_target_on_llama_cpp_by_default(gguf_files, tmp_path):
    out = tmp_path / "gen.json"
    r = runner.invoke(app, ["generate", "--target", str(gguf_files["olmoe-q8_0"]), "--draft",
                            str(gguf_files["draft-q8_0"]), "-k", "3", "--threads", "1", "--prompt", "def area(r):",
                            "--max-new-tokens", "24", "--exact", "--compare", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "identical tokens" in r.output  # --exact: speculative = plain, bit for bit
    payload = json.loads(out.read_text())["payload"]
    assert payload["backend"] == "llama.cpp" and payload["threads"] == 1 and payload["exact"]
    assert payload["result"]["stats"]["drafted_by_position"][0] > 0
    assert payload["result"]["tokens"] == payload["plain"]["tokens"]
