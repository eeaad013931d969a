"""The llama.cpp backend (`LlamaModel`, `LlamaTokenizer`, `ExactPasses`) on GGUF exports of the trained
presets and on SmolLM2's own Q4_1 file.

KV battery (engine paper Sec. 4): after random extend/truncate sequences, the logits equal a fresh
evaluation of the same tokens. On llama.cpp a token's logits depend on the size of its pass, so the
battery runs the model as `exact=True` runs it (`backends.exact`: every pass of two or more tokens
and output rows, flash attention off), where they must agree bit for bit (torch.equal).
"""

import pytest
import torch

from moespec.backends.exact import ExactPasses
from moespec.backends.llama_model import LlamaModel
from moespec.backends.llama_tokenizer import LlamaTokenizer
from moespec.models.tokenizer import ByteTokenizer
from tests.backends.conftest import kv_battery


def exact_model(path, **kw) -> ExactPasses:
    return ExactPasses(LlamaModel(path, threads=1, n_ctx=512, flash_attn=False, **kw))


@pytest.mark.parametrize("kind", ["olmoe-f32", "olmoe-q8_0", "draft-q8_0"])
def test_random_extend_truncate_matches_a_fresh_evaluation(gguf_files, kind):
    model, other = exact_model(gguf_files[kind]), exact_model(gguf_files[kind])

    def fresh(tokens, logits):
        other.reset()
        again = other.extend(tokens)[-logits.shape[0]:]
        assert torch.equal(logits, again), (kind, (logits - again).abs().max())

    assert kv_battery(model, fresh, steps=14, seed=len(kind), max_new=6, first=1) >= 8


def test_outputs_are_the_last_rows_of_the_same_pass(gguf_files):
    model = exact_model(gguf_files["olmoe-q8_0"])
    ids = torch.tensor(ByteTokenizer().encode("def area(r):\n    return 3.14 * r * r\n", add_bos=True))
    every = model.extend(ids)
    model.reset()
    assert torch.equal(model.extend(ids, outputs=3), every[-3:])


def test_plain_one_token_passes_follow_llamas_own_choice_of_kernels(gguf_files):
    """Without ExactPasses a one-token pass is llama.cpp's own (`capacity`, `length`, `tokens` kept). On
    f32 it runs ggml's dot products and the same token in a two-token pass llamafile's sgemm (in the
    output layer too when both rows ask for logits): logits that differ by rounding. (On the q8_0 export
    the two kernels happen to agree bit for bit.)"""
    path = gguf_files["olmoe-f32"]
    with LlamaModel(path, threads=1, n_ctx=64) as m, LlamaModel(path, threads=1, n_ctx=64) as pair:
        assert m.capacity >= 64 and m.architecture == "olmoe" and m.vocab_limit == ByteTokenizer.vocab_size
        m.extend(torch.tensor([256, 100, 101]))
        one = m.extend(torch.tensor([102]))
        assert m.length == 4 and m.tokens == [256, 100, 101, 102]
        for rows in (1, 2):  # the same token after the same prefill, in a two-token pass of one or two output rows
            pair.reset()
            pair.extend(torch.tensor([256, 100, 101]))
            pair.truncate(2)
            two = pair.extend(torch.tensor([101, 102]), outputs=rows)[-1:]
            assert not torch.equal(one, two) and float((one - two).abs().max()) < 1e-3, (rows, (one - two).abs().max())
        m.truncate(9)  # longer than the cache: a no-op
        assert m.length == 4
        m.truncate(1)
        assert m.tokens == [256]


def test_bad_calls_are_refused_before_llama_cpp_sees_them(gguf_files):
    with LlamaModel(gguf_files["draft-q8_0"], threads=1, n_ctx=8) as m:  # llama.cpp rounds n_ctx up
        with pytest.raises(ValueError, match=f"exceed the context of {m.capacity}"):
            m.extend(torch.arange(m.capacity + 1) % 250)
        assert m.length == 0
        with pytest.raises(ValueError, match="token id 272 is outside"):
            m.extend(torch.tensor([5, 272]))
        with pytest.raises(ValueError, match="at least one token"):
            m.extend(torch.zeros(0, dtype=torch.long))
        with pytest.raises(ValueError, match="n >= 0"):
            m.truncate(-1)
        with pytest.raises(ValueError, match="outputs must be in 1..2"):
            m.extend(torch.tensor([1, 2]), outputs=3)
    m.close()  # closing twice is fine
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="threads must be an int >= 1"):
            LlamaModel(gguf_files["draft-q8_0"], threads=bad)


def test_the_exported_tokenizer_gives_the_byte_tokenizers_ids(gguf_files):
    m = LlamaModel(gguf_files["olmoe-q8_0"], threads=1, n_ctx=32)
    tok, byte = LlamaTokenizer(m), ByteTokenizer()
    for text in ("def f(x):\n    return x  # done", "naïve café ← ünïcödé 漢字 🙂", " two  spaces\t\ttabs\n\n", "À"):
        ids = tok.encode(text)
        assert ids == byte.encode(text, add_bos=True), text
        assert tok.decode(ids) == text
    assert (len(tok), tok.bos_token_id, tok.eos_token_id) == (len(byte), byte.bos_token_id, byte.eos_token_id)
    assert tok.decode([byte.eos_token_id], skip_special_tokens=False) == "<eos>"


def test_smollm2s_llama_tokenizer_matches_its_transformers_tokenizer(smollm2_gguf):
    from moespec.models import gguf

    m = LlamaModel(smollm2_gguf, threads=1, n_ctx=64)
    tok, hf = LlamaTokenizer(m), gguf.tokenizer(gguf.SMOLLM2)
    assert len(tok) == len(hf) == m.width
    for text in ("Rename the variable x to count.", "def f(a, b):\n    return a+b\n", "Ça va? 漢字 🙂"):
        assert tok.encode(text, add_bos=False) == hf.encode(text, add_special_tokens=False), text
    assert tok.eos_token_id == hf.eos_token_id
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert tok.decode(chat, skip_special_tokens=False).endswith("<|im_start|>assistant\n")
