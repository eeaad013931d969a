"""`moespec export-gguf`: llama.cpp loads every exportable model, and on an f32 export its logits agree
with transformers' on the same weights and token ids.

Teacher-forced on held-out text (`train.heldout_slice`, 256 tokens; never trained on): the argmax must
be the same at every position where transformers' top-2 margin exceeds twice BOUND, and each position's
largest absolute logit difference must stay below BOUND = 0.05: at every position for dense models
(observed at most 0.008 on trained:draft), at >= 98% of them for MoE models, whose top-k routing
flips an expert where two router logits nearly tie (trained:olmoe: median 0.001, 3 of 256 positions
above 0.02, at most 0.38, all at and right after one such flip), with MOE_BOUND = 1.0 on every position.
"""

import pytest
import torch
from typer.testing import CliRunner

from moespec.backends.llama_model import LlamaModel
from moespec.backends.llama_tokenizer import LlamaTokenizer
from moespec.cli.main import app
from moespec.models import synthetic
from moespec.models.gguf_export import bytes_to_characters, rotary_pairs, write_model
from moespec.models import load
from moespec.models.train import heldout_slice
from tests.conftest import require_llama

BOUND = 0.05
MOE_BOUND = 1.0
TOKENS = 256
# median |logit difference| from transformers' f32 logits of trained:olmoe per quantized type (observed on
# 64 held-out tokens: 0.002, 0.08, 0.13; on 256 the argmax moved only where the margin was under 0.08)
QUANTIZED_MEDIAN = {"f16": 0.01, "q8_0": 0.2, "q4_k": 0.4}


def _agree(model, path, ids: list[int]) -> torch.Tensor:
    """[T] max |logit difference| of transformers and llama.cpp per position; asserts the argmax agreement."""
    with torch.inference_mode():
        ref = model(input_ids=torch.tensor([ids])).logits[0].float()
    got = LlamaModel(path, threads=1, n_ctx=1024).extend(torch.tensor(ids))
    limit = getattr(model.config, "moespec_vocab_limit", None) or ref.shape[-1]
    ref, got = ref[:, :limit], got[:, :limit]
    diff = (ref - got).abs().amax(-1)
    top = ref.topk(2, dim=-1).values
    clear = (top[:, 0] - top[:, 1]) > 2 * BOUND
    assert clear.sum() >= len(ids) // 2, "too few positions with a clear argmax to judge"
    assert torch.equal(ref.argmax(-1)[clear], got.argmax(-1)[clear])
    return diff


def _check(diff: torch.Tensor, *, moe: bool) -> None:
    if not moe:
        assert float(diff.max()) <= BOUND
        return
    assert float((diff <= BOUND).float().mean()) >= 0.98 and float(diff.max()) <= MOE_BOUND, diff.max()


@pytest.mark.parametrize("spec", ["trained:olmoe", "trained:draft"])
def test_f32_export_agrees_with_transformers_on_held_out_text(spec, gguf_files):
    model, tok = load(spec, dtype="float32")
    path = gguf_files["olmoe-f32" if spec == "trained:olmoe" else "draft-f32"]
    ids = heldout_slice()[:TOKENS].tolist()
    _check(_agree(model, path, ids), moe=spec == "trained:olmoe")
    assert LlamaTokenizer(LlamaModel(path, threads=1, n_ctx=64)).encode(tok.decode(ids[1:])) == ids  # same ids


def test_the_smollm2_draft_exports_with_smollm2s_tokenizer(tmp_path, smollm2_gguf):
    model, tok = load("trained:smollm2-draft", dtype="float32")
    path = write_model(model, tok, tmp_path / "smollm2-draft.gguf")
    ids = heldout_slice("smollm2")[:TOKENS].tolist()
    _check(_agree(model, path, ids), moe=False)
    llama_tok = LlamaTokenizer(LlamaModel(path, threads=1, n_ctx=64))
    text = "def f(a, b):\n    return a + b  # ünïcödé"
    assert llama_tok.encode(text, add_bos=False) == tok.encode(text, add_special_tokens=False)
    assert len(llama_tok) == len(tok)


@pytest.mark.parametrize("name", ["olmoe-shaped", "qwen3moe-shaped", "mixtral-shaped"])
def test_shaped_presets_export_at_their_widths(name, tmp_path):
    """One layer and eight experts of each timing preset (the widths are the point; the full presets
    are gigabytes): llama.cpp loads the file as the right architecture and its logits agree."""
    require_llama()
    model, tok = synthetic.build(name, layers=1, experts=8)
    path = write_model(model, tok, tmp_path / f"{name}.gguf")
    arch = {"olmoe-shaped": "olmoe", "qwen3moe-shaped": "qwen3moe", "mixtral-shaped": "llama"}[name]
    assert LlamaModel(path, threads=1, n_ctx=64).architecture == arch
    _check(_agree(model, path, heldout_slice()[:64].tolist()), moe=True)


def test_quantized_exports_shrink_and_decode(tmp_path, gguf_files):
    """Each type's file is smaller and decodes the same model: transformers' argmax wherever its top-2
    margin exceeds 2 * BOUND (`_agree`), the median |logit difference| within the type's bound."""
    model, _ = load("trained:olmoe", dtype="float32")
    ids = heldout_slice()[:64].tolist()
    sizes = {"f32": gguf_files["olmoe-f32"].stat().st_size}
    for kind, bound in QUANTIZED_MEDIAN.items():
        out = tmp_path / f"olmoe-{kind}.gguf"
        r = CliRunner().invoke(app, ["export-gguf", "trained:olmoe", str(out), "--type", kind, "--threads", "1"])
        assert r.exit_code == 0, r.output
        sizes[kind] = out.stat().st_size
        diff = _agree(model, out, ids)
        assert float(diff.median()) <= bound, (kind, float(diff.median()))
    assert sizes["f32"] > sizes["f16"] > sizes["q8_0"] > sizes["q4_k"]


def test_architectures_llama_cpp_would_compute_differently_are_refused(tmp_path):
    require_llama()
    model, tok = synthetic.build("olmoe-tiny")  # two kv heads for four heads
    with pytest.raises(ValueError, match="olmoe has no grouped-query attention; this model has 2 kv heads for 4"):
        write_model(model, tok, tmp_path / "x.gguf")
    model, tok = synthetic.build("qwen3moe-tiny", norm_topk_prob=False)
    with pytest.raises(ValueError, match="normalizes the top-k expert weights; norm_topk_prob must be true"):
        write_model(model, tok, tmp_path / "x.gguf")
    model, tok = synthetic.build("gptoss-tiny")
    with pytest.raises(ValueError, match="GptOssForCausalLM has no llama.cpp export here"):
        write_model(model, tok, tmp_path / "x.gguf")


def test_rotary_pairs_moves_dim_i_plus_half_next_to_dim_i():
    heads, d = 2, 6
    w = torch.arange(heads * d, dtype=torch.float32)[:, None].repeat(1, 3)  # row r holds r
    rows = rotary_pairs(w, heads)[:, 0].int().tolist()
    assert rows == [0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11]


def test_the_byte_table_is_a_bijection_onto_printable_characters():
    table = bytes_to_characters()
    assert len(set(table)) == 256 and all(c.isprintable() and not c.isspace() for c in table)
    assert table[ord("A")] == "A" and table[ord(" ")] == "\u0120"  # GPT-2's 'Ġ' for a space
