"""exact=True turns llama.cpp's tiled K-quant kernel off by itself (`exact_llama_environment`).

ggml reads GGML_CPU_TILED_MM once per process and the suite sets it for its own (tests/conftest.py),
so each case runs in a fresh process whose environment lacks the variable. The file has K-quant
dense weights with rows of 256 (a 1-layer OLMoE-shaped model at hidden 256, 8 experts); the
tiled kernel takes their products from eight rows on (docs/llama_cpp.md)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import moespec
from moespec.models import gguf_info, synthetic
from moespec.models.gguf_export import write_model
from moespec.models.train import heldout_slice

from ..conftest import require_llama

SIZES = tuple(range(2, 17))
K_QUANTS = {"Q4_K", "Q5_K", "Q6_K"}
# exact: load(..., exact=True); else the same passes (two tokens at least, flash attention off) with the
# variable left unset. Prints the variable as the process found it and the pass sizes' agreement.
CHILD = """
import json, os, sys
from moespec.backends.exact import ExactPasses
from moespec.backends.llama_model import LlamaModel
from moespec.checks.pass_agreement import pass_sizes
from moespec.models import load

path, exact, prompt, text, sizes = json.loads(sys.argv[1])
found = os.environ.get("GGML_CPU_TILED_MM")
if exact:
    model, _ = load(path, backend="llama.cpp", threads=1, exact=True)
else:
    model = ExactPasses(LlamaModel(path, threads=1, flash_attn=False))
print(json.dumps({"variable": found, "agreement": pass_sizes(model, prompt, text, sizes).to_dict()}))
"""


@pytest.fixture(scope="module")
def k_quant_file(tmp_path_factory) -> Path:
    require_llama()
    model, tok = synthetic.build("olmoe-shaped", layers=1, experts=8, hidden_size=256, intermediate_size=256)
    path = write_model(model, tok, tmp_path_factory.mktemp("kquant") / "olmoe-q4_k.gguf", "q4_k", threads=1)
    types = {name: t.tensor_type.name for name, t in gguf_info.tensors(path).items()}
    gguf_info.forget()
    dense = ("blk.0.attn_q.weight", "blk.0.attn_output.weight", "output.weight")  # plain matrix products
    assert all(types[name] in K_QUANTS for name in dense), types
    return path


def passes_in_fresh_process(path: Path, *, exact: bool) -> dict:
    """The child's report (CHILD) on `path`, run without GGML_CPU_TILED_MM in its environment."""
    ids = [256, *heldout_slice().tolist()[1:80]]
    src = str(Path(moespec.__file__).parents[1])
    env = {k: v for k, v in os.environ.items() if k != "GGML_CPU_TILED_MM"}
    env["PYTHONPATH"] = os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])
    arg = json.dumps([str(path), exact, ids[:40], ids[40:], SIZES])
    done = subprocess.run([sys.executable, "-c", CHILD, arg], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["variable"] is None  # the process started with the tiled kernel on
    return report["agreement"]


def test_exact_load_turns_the_tiled_k_quant_kernel_off_in_a_fresh_process(k_quant_file):
    found = passes_in_fresh_process(k_quant_file, exact=True)
    assert found["classes"] == [list(SIZES)] and max(found["max_diff"]) == 0.0, found


def test_without_the_variable_passes_of_eight_rows_or_more_compute_another_function(k_quant_file):
    """The control: the same passes with the tiled kernel on differ from eight rows on, so the file
    above does exercise the kernel exact=True must turn off."""
    found = passes_in_fresh_process(k_quant_file, exact=False)
    assert found["classes"][0] == list(range(2, 8)) and len(found["classes"]) > 1, found
