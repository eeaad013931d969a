"""The sweep's prefilled prompts on llama.cpp, where the model is its own cache: each prompt's target
starts from an empty cache, so prompt 1's runs read prompt 1, not prompt 0 followed by it."""

from moespec.backends.llama_tokenizer import LlamaTokenizer
from moespec.bench.prefilled import PrefilledPrompts
from moespec.models import load
from tests.conftest import require_llama


def test_each_prompt_is_prefilled_on_an_empty_cache(gguf_files):
    require_llama()
    model, tok = load(str(gguf_files["olmoe-q8_0"]), backend="llama.cpp", threads=1, n_ctx=256)
    assert isinstance(tok, LlamaTokenizer)
    prompts = PrefilledPrompts(model, tok, depth=40, count=2, prefill_last=False)
    first = prompts.target(0)
    assert model.tokens == list(prompts.ids[0][:-1])
    second = prompts.target(1)
    assert model.tokens == list(prompts.ids[1][:-1]) and second.length == 0
    second.extend(second.prompt)  # served from the kept rows: the cache is left as it is
    assert model.tokens == list(prompts.ids[1][:-1]) and first is not second
