"""The shipped trained presets: they load with no network, are what their manifest says, and decode losslessly."""

import hashlib
import json

import pytest
import torch

from moespec.engine.decode import generate
from moespec.models import trained
from moespec.models import load
from moespec.models.train import bits_per_byte, heldout_slice

REAL = 259


def test_both_presets_ship_within_40_mb_and_match_their_manifests():
    assert {"olmoe", "draft"} <= set(trained.names())
    total = 0
    for name in ("olmoe", "draft"):
        folder, manifest = trained.folder(name), trained.manifest(name)
        for file, digest in manifest["files"].items():
            data = (folder / file).read_bytes()
            total += len(data)
            assert hashlib.sha256(data).hexdigest() == digest, (name, file)
        header = json.loads(data[8: 8 + int.from_bytes(data[:8], "little")])
        assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    assert total <= 40 * 2**20


def test_trained_olmoe_has_olmoe_routing_at_small_widths():
    model, tok = load("trained:olmoe")
    cfg = model.config
    assert (cfg.model_type, cfg.num_experts, cfg.num_experts_per_tok) == ("olmoe", 64, 8)
    assert 128 <= cfg.hidden_size <= 256 and 4 <= cfg.num_hidden_layers <= 6
    assert model.name_or_path == "trained:olmoe" and len(tok) == REAL
    draft, _ = load("trained:draft")
    assert draft.config.model_type == "llama" and draft.config.num_hidden_layers <= 2


@pytest.mark.parametrize("name", ["olmoe", "draft"])
def test_weights_reproduce_the_manifests_held_out_bits_per_byte(name):
    model, _ = load(f"trained:{name}")
    got = bits_per_byte(model, heldout_slice(), seq=256)
    assert abs(got - trained.manifest(name)["slice_bits_per_byte"]) < 1e-3


def test_speculative_greedy_with_the_trained_draft_equals_transformers_generate():
    target, tok = load("trained:olmoe")
    draft, _ = load("trained:draft")
    prompt = tok.encode("def read_config(path):\n    with open(path) as f:\n", add_bos=True)
    hf = target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=40, min_new_tokens=40,
                         suppress_tokens=list(range(REAL, target.config.vocab_size)), eos_token_id=None)
    expected = hf[0, len(prompt):].tolist()
    for k in (1, 4, "auto"):
        assert generate(target, prompt, draft=draft, k=k, max_new_tokens=40).tokens == expected, k


def test_an_unknown_trained_preset_names_the_shipped_ones():
    with pytest.raises(ValueError, match="trained:olmoe"):
        load("trained:gpt5")
