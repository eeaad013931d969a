"""`checks.side_by_side`: seeded `generate` runs decoded side by side on transformers models, their
passes batched, on synthetic:olmoe-tiny with synthetic:dense-tiny as draft. At a fixed k the runs are
the runs `generate` decodes one after another, token for token (a batched pass changes the logits by
float rounding only, far below what moves a seeded draw here); errors reach the caller."""

import numpy as np
import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

from moespec.backends.table_model import TableLM
from moespec.checks import gate
from moespec.checks.side_by_side import Lane, Passes, Schedule, side_by_side
from moespec.engine.decode import generate
from moespec.models import load
from moespec.models.tokenizer import ByteTokenizer

LIMIT = 259  # the byte tokenizer's ids


@pytest.fixture(scope="module")
def pair():
    target, tok = load("synthetic:olmoe-tiny")
    draft, _ = load("synthetic:dense-tiny")
    prompts = [tok.encode(t) for t in ("def f(x):\n    return", "The quick brown fox", "import numpy as np\n")]
    return target, draft, prompts


def one_after_another(target, draft, k, prompts, runs: int, tokens: int, seed: int) -> np.ndarray:
    return np.array([generate(target, prompts[i % len(prompts)], draft=draft, k=k, max_k=4, temperature=1.0,
                              max_new_tokens=tokens, seed=seed + i, vocab_limit=LIMIT).tokens for i in range(runs)])


@pytest.mark.parametrize("with_draft, k", [(False, 0), (True, 1), (True, 4)])
def test_runs_side_by_side_are_the_runs_one_after_another(pair, with_draft, k):
    """7 runs, 4 at a time (a second, smaller batch), prompts of different lengths, drafts accepted in
    part so the runs fall out of step: every token is the lone call's."""
    target, draft, prompts = pair
    d = draft if with_draft else None
    got = side_by_side(target, d, k, prompts, runs=7, tokens=16, seed=3, max_k=4, limit=LIMIT, batch=4)
    assert got.shape == (7, 16)
    assert (got == one_after_another(target, d, k, prompts, 7, 16, 3)).all()


def test_the_draft_alone_side_by_side_and_auto_k(pair):
    target, draft, prompts = pair
    alone = side_by_side(draft, None, 0, prompts, runs=5, tokens=12, seed=0, max_k=4, limit=LIMIT, batch=5)
    assert (alone == one_after_another(draft, None, 0, prompts, 5, 12, 0)).all()
    # k="auto" follows measured times, so only the shape and the ids are fixed
    auto = side_by_side(target, draft, "auto", prompts, runs=5, tokens=12, seed=0, max_k=4, limit=LIMIT, batch=5)
    assert auto.shape == (5, 12) and auto.max() < LIMIT


def test_level3_side_by_side_passes_and_checks_batch(pair):
    target, draft, _ = pair
    tok = ByteTokenizer()
    level = gate.run_level3(target, draft, tok, prompts=2, ks=(4,), greedy_tokens=8, samples=1500, batch=15)
    assert level.verdict == "pass" and level.spec.n == (1500, 1500) and level.power.pvalue < 0.01
    with pytest.raises(ValueError, match="batch must be >= 1"):
        gate.run_level3(target, draft, tok, prompts=2, batch=0)


def test_errors_reach_the_caller_and_no_run_waits_forever(pair):
    target, draft, prompts = pair
    with pytest.raises(TypeError, match="transformers models"):
        side_by_side(TableLM(16, seed=1), None, 0, [[1, 2]], runs=2, tokens=4, seed=0, max_k=4, limit=16, batch=2)
    sliding = MistralConfig(vocab_size=300, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                            num_key_value_heads=1, intermediate_size=64, sliding_window=8)
    with pytest.raises(TypeError, match="full-attention"):
        side_by_side(MistralForCausalLM(sliding), None, 0, [[1, 2]], runs=2, tokens=4, seed=0, max_k=4, limit=300,
                     batch=2)
    with pytest.raises(ValueError, match="vocab_limit"):  # every run fails in generate; none hangs
        side_by_side(target, None, 0, prompts, runs=3, tokens=4, seed=0, max_k=4, limit=10**6, batch=3)
    lane = Lane(Passes(target, 1), 0, Schedule(1))
    lane.extend(torch.tensor(prompts[0]))
    assert lane.length == len(prompts[0])
    lane.truncate(3)
    assert lane.length == 3
    with pytest.raises(ValueError, match="one run"):
        lane.reset()
