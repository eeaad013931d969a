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
    second.extend(second.prompt, outputs=1)  # served from the kept row: the cache is left as it is
    assert model.tokens == list(prompts.ids[1][:-1]) and first is not second


def test_past_the_prompt_a_prefilled_target_decodes_through_the_backends_own_steps(gguf_files, monkeypatch):
    # a plain run and a lookup run on a prefilled prompt take llama.cpp's compiled greedy steps and
    # argmax, as runs on the bare model do, and give the same tokens and round records
    from moespec.backends.llama_model import LlamaModel
    from moespec.bench.prefilled import PrefilledTarget
    from moespec.engine.decode import generate
    from moespec.engine.proposers import PromptLookup

    require_llama()
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 9, 10, 11, 5, 6, 7]
    with LlamaModel(gguf_files["olmoe-q8_0"], threads=1, n_ctx=256) as model:
        bare = [generate(model, prompt, draft=d, k=k, max_new_tokens=24) for k, d in ((0, None), (2, PromptLookup(2)))]
        calls = []
        for name in ("greedy_steps", "extend_argmax"):
            real = getattr(model, name)
            monkeypatch.setattr(model, name, lambda *a, real=real, name=name, **kw: calls.append(name) or real(*a, **kw))
        target = PrefilledTarget(model, prompt)
        held = [generate(target, prompt, draft=d, k=k, max_new_tokens=24) for k, d in ((0, None), (2, PromptLookup(2)))]
    assert {"greedy_steps", "extend_argmax"} <= set(calls)
    for a, b in zip(bare, held):
        assert a.tokens == b.tokens and a.stats.tokens_per_round == b.stats.tokens_per_round
