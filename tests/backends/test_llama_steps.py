"""Greedy decoding's compiled path on llama.cpp (`backends.llama_steps`, `LlamaModel.extend_argmax` and
`greedy_steps`) against the Python path over the same logits: the same tokens, the same cache after,
the vocabulary limit honoured, a bad row named by its step. A model's rows are compared with themselves
(the same pass sizes on both paths), so this holds bit for bit on any file."""

import numpy as np
import pytest
import torch

from moespec.backends import llama_steps
from moespec.backends.llama_model import LlamaModel
from moespec.backends.protocol import GreedyByLogits, NoMaximum, StepStop, argmax_rows, fold
from tests.conftest import require_llama

PROMPT = [256, *range(40, 71)]


@pytest.fixture(autouse=True)
def _compiled():
    require_llama()
    assert llama_steps.available(), "the compiled greedy helper did not build (is there a C compiler?)"


@pytest.mark.parametrize("kind", ["olmoe-q8_0", "draft-q8_0"])
def test_greedy_steps_are_the_python_loops_tokens_and_leave_the_same_cache(gguf_files, kind):
    fast, slow = (LlamaModel(gguf_files[kind], threads=1, n_ctx=256) for _ in range(2))
    limit = fast.n_vocab - 3  # ids near the top never produced: the limit reaches the compiled argmax
    for m in (fast, slow):
        m.extend(torch.tensor(PROMPT[:-1]))
    got, seconds = fast.greedy_steps(PROMPT[-1], 40, limit)
    want, _ = GreedyByLogits.greedy_steps(slow, PROMPT[-1], 40, limit)
    assert got == want and len(seconds) == 40 and all(s > 0 for s in seconds)
    assert fast.tokens == slow.tokens == PROMPT + want[:-1]  # the last token produced is not fed
    # and the cache computes the same function after: one more pass on both
    nxt = torch.tensor([want[-1]])
    assert torch.equal(fast.extend(nxt), slow.extend(nxt))


def test_a_produced_eos_ends_the_run(gguf_files):
    model = LlamaModel(gguf_files["olmoe-q8_0"], threads=1, n_ctx=256)
    model.extend(torch.tensor(PROMPT[:-1]))
    free, _ = model.greedy_steps(PROMPT[-1], 12, model.n_vocab)
    model.truncate(len(PROMPT) - 1)
    stopped, _ = model.greedy_steps(PROMPT[-1], 12, model.n_vocab, eos={free[5]})
    first = free.index(free[5])  # the run stops at the first step that produced that id
    assert stopped == free[: first + 1] and model.length == len(PROMPT) + first


def stop_rules(vocab: int, produced: list[int]) -> list[StepStop]:
    """A seen rule with the prompt marked, and a pool rule whose one entry is the 3-gram ending at
    produced[5] (its tail the prompt's last two tokens): both end a run of `produced`'s steps early."""
    seen = np.zeros(vocab, dtype=np.uint8)
    seen[PROMPT] = 1
    pool = np.full(1 << 20, -1, dtype=np.int32)
    pool[fold(produced[3:6]) % len(pool)] = 0
    return [StepStop(seen=seen), StepStop(pool=pool, tail=np.array(PROMPT[-2:], dtype=np.int32)),
            StepStop(seen=seen.copy(), pool=pool, tail=np.array(PROMPT[-2:], dtype=np.int32))]


def test_a_stop_rule_ends_the_compiled_run_where_the_python_loop_ends(gguf_files):
    fast, slow = (LlamaModel(gguf_files["olmoe-q8_0"], threads=1, n_ctx=256) for _ in range(2))
    for m in (fast, slow):
        m.extend(torch.tensor(PROMPT[:-1]))
    free, _ = fast.greedy_steps(PROMPT[-1], 30, fast.n_vocab)
    fast.truncate(len(PROMPT) - 1)
    for compiled, python in zip(stop_rules(fast.n_vocab, free), stop_rules(fast.n_vocab, free)):
        got, _ = fast.greedy_steps(PROMPT[-1], 30, fast.n_vocab, stop=compiled)
        want, _ = GreedyByLogits.greedy_steps(slow, PROMPT[-1], 30, slow.n_vocab, stop=python)
        assert got == want == free[: len(got)] and len(got) < 30
        assert compiled.pool is None or len(got) <= 6  # the pool rule fires at step 6 at the latest
        for name in ("seen", "tail"):  # the C loop updated the rule's arrays as StepStop.fires does
            a, b = getattr(compiled, name), getattr(python, name)
            assert (a is None and b is None) or np.array_equal(a, b), name
        for m in (fast, slow):
            m.truncate(len(PROMPT) - 1)


def test_extend_argmax_reads_the_rows_extend_returns(gguf_files):
    model = LlamaModel(gguf_files["olmoe-q8_0"], threads=1, n_ctx=256)
    ids = torch.tensor(PROMPT)
    want = argmax_rows(model.extend(ids), 200)  # every row, limit below the vocabulary
    model.reset()
    assert model.extend_argmax(ids, 200) == want
    model.reset()
    assert model.extend_argmax(ids, 200, outputs=3) == want[-3:]
    assert model.length == len(PROMPT)


def test_a_row_without_a_finite_maximum_is_named_by_its_step(gguf_files, monkeypatch):
    """A limit of one id whose logit is -inf cannot be forced on a real file; the C helper's code for such a
    row is checked through a patched helper instead, with the tokens fed so far kept."""
    model = LlamaModel(gguf_files["olmoe-q8_0"], threads=1, n_ctx=256)
    model.extend(torch.tensor(PROMPT[:-1]))
    real = llama_steps.greedy_steps

    def two_then_bad(ctx, batch, seq, token, pos, steps, limit, eos, stop=None):
        out, seconds, status, _ = real(ctx, batch, seq, token, pos, 2, limit, eos, stop)
        return out, seconds, status, 2  # the third step's row "had" no finite maximum

    monkeypatch.setattr(llama_steps, "greedy_steps", two_then_bad)
    with pytest.raises(NoMaximum) as e:
        model.greedy_steps(PROMPT[-1], 10, model.n_vocab)
    assert e.value.row == 2 and model.length == len(PROMPT) + 2


def test_the_python_path_when_nothing_can_be_compiled(gguf_files, monkeypatch):
    model = LlamaModel(gguf_files["draft-q8_0"], threads=1, n_ctx=256)
    model.extend(torch.tensor(PROMPT[:-1]))
    fast, _ = model.greedy_steps(PROMPT[-1], 8, model.n_vocab)
    model.truncate(len(PROMPT) - 1)
    monkeypatch.setattr(llama_steps, "available", lambda: False)
    assert model.greedy_steps(PROMPT[-1], 8, model.n_vocab)[0] == fast
    assert np.array_equal(model.tokens, PROMPT + fast[:-1])
