"""The engine on a model someone pretrained: SmolLM2-135M-Instruct (GGUF), drafted by prompt lookup
and by the shipped trained:smollm2-draft. Greedy output must be transformers' greedy `generate`
token for token; sampled output must pass the gate's two-sample test against target-only sampling."""

import pytest
import torch

from moespec.texts import chat_ids, chat_prompts
from moespec.engine.decode import generate
from moespec.checks.gate import run_level3
from moespec.engine.proposers import PromptLookup
from moespec.models import load

# the module's fixture is built once: its tests run in one pytest-xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("smollm2")

TOKENS = 32


@pytest.fixture(scope="module")
def draft(smollm2):
    return load("trained:smollm2-draft")[0]


@pytest.fixture(scope="module")
def prompts(smollm2):
    _, tok = smollm2
    # two requests that quote a text (prompt lookup's case) and one open-ended request
    return [chat_ids(tok, p) for p in (*chat_prompts("edit")[:2], chat_prompts("open")[0])]


def _hf(model, ids, eos):
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=TOKENS, eos_token_id=eos, pad_token_id=eos)
    return out[0, len(ids):].tolist()


@pytest.mark.slow
def test_greedy_speculative_output_is_transformers_greedy_output(smollm2, draft, prompts):
    model, tok = smollm2
    eos = tok.eos_token_id
    for ids in prompts:
        expected = _hf(model, ids, eos)
        assert len(expected) >= 8  # a real answer, not an immediate EOS
        for name, proposer, k in (("lookup", PromptLookup(3), 4), ("lookup", PromptLookup(3), "auto"),
                                  ("draft", draft, 1), ("draft", draft, 3), ("draft", draft, "auto")):
            got = generate(model, ids, draft=proposer, k=k, max_new_tokens=TOKENS, eos_token_id=eos).tokens
            assert got == expected, (name, k, tok.decode(got), tok.decode(expected))


@pytest.mark.slow
def test_sampled_tokens_pass_the_two_sample_test_and_the_draft_alone_fails_it(smollm2, draft, prompts):
    """1,200 sampled tokens per method (20 runs of 60, temperature 1), pooled by id; the gate's
    threshold alpha = 0.01. The benchmark (benchmarks/smollm2.py) runs the paper's ~9,200. Each
    method's 20 runs are decoded side by side (`checks.side_by_side`): each is still its own seeded
    `generate` call, only the passes of the runs waiting at once are batched (a run's logits differ from
    a lone call's by float rounding; at seed 2 all 2,400 spec and plain tokens were the lone calls'):
    20 runs take a third to a fifth of their time one after another."""
    model, tok = smollm2
    level = run_level3(model, draft, tok, prompts=prompts, ks=(3,), greedy_tokens=8, samples=1_200,
                       tokens_per_run=60, seed=1, batch=20)
    assert level.greedy[0].equal == len(prompts)
    assert level.spec.n == (1_200, 1_200) and level.padded_ids == 0
    assert level.spec.pvalue > 0.01, level.spec
    assert level.power.pvalue < 0.01, level.power  # the test can tell the draft's own law from SmolLM2's
