"""trained:smollm2-draft: shipped as its manifest says, scored again here, and its recipe's code path."""

import dataclasses
import hashlib
import json

import torch
import transformers

from moespec.models import trained
from moespec.models import load
from moespec.models.train import RECIPES, bits_per_byte, draft_config, heldout_slice, init_from_teacher, train


def test_the_draft_ships_in_bfloat16_within_30_mb_and_matches_its_manifest():
    folder, manifest = trained.folder("smollm2-draft"), trained.manifest("smollm2-draft")
    total = 0
    for file, digest in manifest["files"].items():
        data = (folder / file).read_bytes()
        total += len(data)
        assert hashlib.sha256(data).hexdigest() == digest, file
        header = json.loads(data[8: 8 + int.from_bytes(data[:8], "little")])
        assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    assert total <= 30 * 2**20
    assert manifest["tokenizer"] == "smollm2" and manifest["recipe"]["teacher"] == "smollm2"


def test_the_draft_uses_smollm2s_tokenizer_and_reproduces_its_manifests_slice(smollm2):
    draft, tok = load("trained:smollm2-draft")
    _, target_tok = smollm2
    assert tok.get_vocab() == target_tok.get_vocab()
    assert draft.config.vocab_size == 49152 and draft.config.num_hidden_layers <= 2
    got = bits_per_byte(draft, heldout_slice("smollm2"), seq=256)
    assert abs(got - trained.manifest("smollm2-draft")["slice_bits_per_byte"]) < 1e-3


def test_a_draft_of_all_the_teachers_layers_is_the_teacher_and_of_some_an_early_exit():
    torch.manual_seed(0)
    teacher = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True)).eval()
    x = torch.randint(0, 64, (2, 9))
    whole = transformers.AutoModelForCausalLM.from_config(draft_config(teacher.config, 3)).eval()
    init_from_teacher(whole, teacher, [0, 1, 2])
    assert torch.equal(whole(input_ids=x).logits, teacher(input_ids=x).logits)
    part = transformers.AutoModelForCausalLM.from_config(draft_config(teacher.config, 2, shared="smollm2")).eval()
    init_from_teacher(part, teacher, [0, 2])
    assert part.config.moespec_shared_embedding == "smollm2"
    assert torch.equal(part.model.layers[1].mlp.up_proj.weight, teacher.model.layers[2].mlp.up_proj.weight)
    assert not part.get_input_embeddings().weight.requires_grad  # frozen: the output layer is tied to it
    assert part.lm_head.weight.data_ptr() == part.get_input_embeddings().weight.data_ptr()


def _trained_weights(monkeypatch, model, r, out, logits=None) -> tuple[dict, list]:
    """The float32 weights of a training of `r` with teacher `model` (its logits passed through
    `logits` when given), and the input ids of every teacher pass; the scoring at the end is left out."""
    import moespec.models.train as train_module

    seen = []
    with monkeypatch.context() as mp:
        forward = model.forward

        def teacher(*args, **kwargs):
            seen.append(kwargs["input_ids"].clone())
            result = forward(*args, **kwargs)
            if logits is not None:
                result.logits = logits(result.logits)
            return result

        mp.setattr(model, "forward", teacher)
        mp.setattr(train_module, "finish", lambda draft, *a, **k: {
            name: t.detach().clone() for name, t in draft.state_dict().items()})
        weights = train("tiny-smollm2-draft", out, r=r, threads=1, teacher=model)
    return weights, seen


def test_the_recipe_trains_on_smollm2s_tokens_and_logits(smollm2, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    model, tok = smollm2
    r = dataclasses.replace(RECIPES["tiny-smollm2-draft"], teacher_dtype="float32")
    m = train("tiny-smollm2-draft", tmp_path / "run", r=r, threads=1, teacher=model)
    assert m["tokenizer"] == "smollm2" and m["tokens_seen"] == r.steps * r.batch * r.seq
    # The teacher labels every step's batch, and its logits are the labels: the same training
    # again gives the same weights (so any difference below is the labels'), and one on the
    # teacher's logits moved by one vocabulary id gives other weights in every trained tensor.
    same, seen = _trained_weights(monkeypatch, model, r, tmp_path / "same")
    assert [tuple(x.shape) for x in seen] == [(r.batch, r.seq)] * r.steps
    assert all(int(x.max()) < 49152 for x in seen)  # SmolLM2's ids
    shipped = load_file(tmp_path / "run" / "model.safetensors")
    assert shipped and all(torch.equal(t, same[name].to(t.dtype)) for name, t in shipped.items())
    shifted, _ = _trained_weights(monkeypatch, model, r, tmp_path / "shifted", logits=lambda x: x.roll(1, dims=-1))
    assert set(shifted) == set(same)
    differ = [name for name in shipped if not torch.equal(shifted[name], same[name])]  # the trained, shipped tensors
    assert differ == list(shipped), sorted(set(shipped) - set(differ))
    draft, draft_tok = load(str(tmp_path / "run"))
    assert draft_tok.get_vocab() == tok.get_vocab() and draft.config.moespec_vocab_limit == 49152
    # shipped without the embedding, which loading reads from SmolLM2's file: the draft's rows are the target's
    assert torch.equal(draft.get_input_embeddings().weight, model.get_input_embeddings().weight)
    assert (tmp_path / "run" / "model.safetensors").stat().st_size < 8 * 2**20
