"""Synthetic presets and the shared byte tokenizer."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moespec.models import ByteTokenizer, load, synthetic
from moespec.models.tokenizer import EOS_ID

TINY = [n for n in synthetic.preset_names() if n.endswith("-tiny")]
MOE_TINY = [n for n in TINY if n != "dense-tiny"]


@given(st.text())
@settings(max_examples=200, deadline=None)
def test_byte_tokenizer_round_trips_any_text(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert tok.decode(ids) == text


def test_byte_tokenizer_specials_are_skipped_or_named():
    tok = ByteTokenizer()
    ids = tok.encode("ab", add_bos=True) + [EOS_ID]
    assert tok.decode(ids) == "ab"
    assert tok.decode(ids, skip_special_tokens=False) == "<bos>ab<eos>"


@pytest.mark.parametrize("name", TINY)
def test_same_seed_same_weights_other_seed_other_weights(name):
    a, _ = synthetic.build(name, seed=3)
    b, _ = synthetic.build(name, seed=3)
    c, _ = synthetic.build(name, seed=4)
    pa, pb, pc = (dict(m.named_parameters()) for m in (a, b, c))
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert any(not torch.equal(pa[k], pc[k]) for k in pa)


@pytest.mark.parametrize("name", TINY)
def test_preset_runs_and_shares_the_vocabulary(name):
    model, tok = synthetic.build(name)
    ids = torch.tensor([tok.encode("moespec")])
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], synthetic.VOCAB)
    assert torch.isfinite(logits).all()
    assert len(tok) <= synthetic.VOCAB


@pytest.mark.parametrize("name", MOE_TINY)
def test_overrides_layers_experts_dtype(name):
    model, _ = synthetic.build(name, layers=3, experts=12, dtype="bfloat16")
    assert model.config.num_hidden_layers == 3
    assert next(model.parameters()).dtype == torch.bfloat16
    key = synthetic.PRESETS[name].experts_key
    assert getattr(model.config, key) == 12


def test_bad_preset_and_bad_overrides_are_clear():
    with pytest.raises(ValueError, match="olmoe-tiny"):
        synthetic.build("olmoe-huge")
    with pytest.raises(ValueError, match="dense"):
        synthetic.build("dense-tiny", experts=4)
    with pytest.raises(ValueError, match="top-k"):
        synthetic.build("olmoe-tiny", experts=2)


def test_spec_strings(tmp_path):
    model, tok = load("synthetic:mixtral-tiny")
    assert model.name_or_path == "synthetic:mixtral-tiny"
    with pytest.raises(ValueError, match="synthetic:olmoe-tiny"):
        load(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="config.json"):
        load(str(tmp_path))


def test_local_checkpoint_round_trip(tmp_path):
    model, tok = synthetic.build("olmoe-tiny", seed=1)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, loaded_tok = load(str(tmp_path))
    assert isinstance(loaded_tok, ByteTokenizer)
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.allclose(model(ids).logits, loaded(ids).logits, atol=1e-6)
