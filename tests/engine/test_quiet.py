"""Rounds in which a host drafter proposes nothing, run as plain greedy steps (`HostDrafter.quiet`,
`round.quiet_rounds`): each drafter's rule never fires later than the drafter would propose (prompt
lookup: exactly where it proposes), and decoding with the quiet runs gives the same tokens and the
same round records as asking the drafter every round."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moespec.backends.protocol import GreedyByLogits, StepStop, fold
from moespec.backends.table_model import TableLM
from moespec.engine.decode import generate
from moespec.engine.ngram import MOD_CHUNK, NgramMod, NgramSimple, mod_index
from moespec.engine.proposers import HostDrafter, PromptLookup

T = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
texts = st.lists(st.integers(0, 7), min_size=2, max_size=70)  # 8 ids: repeats and new tokens both come


def walk(proposer, text: list[int], start: int):
    """From the context text[:start]: (quiet()'s run or None, [(fired, proposed, ends the run)] for each
    later token until the rule fired or its steps ran out), asking the drafter at every context as
    rounds with empty proposals would (and committing, as the loop does)."""
    quiet = proposer.quiet(T(text[:start]), 8)
    if quiet is None:
        return None, []
    seen = []
    for j, token in enumerate(text[start:], 1):
        fired = quiet.stop.fires(token)
        ctx = T(text[: start + j])
        seen.append((fired, proposer.propose(ctx, 4).tokens.numel() > 0, fired or j == quiet.steps))
        proposer.commit(len(ctx))
        if seen[-1][2]:
            break
    return quiet, seen


@settings(max_examples=300, deadline=None)
@given(text=texts, data=st.data())
def test_prompt_lookup_fires_exactly_where_it_proposes(text, data):
    start = data.draw(st.integers(1, len(text)))
    lookup = PromptLookup(3)
    quiet, seen = walk(lookup, text, start)
    assert (quiet is None) == (lookup.propose(T(text[:start]), 4).tokens.numel() > 0 or start < 2)
    assert all(fired == proposed for fired, proposed, _ in seen)


@settings(max_examples=300, deadline=None)
@given(text=texts, data=st.data(), size_n=st.integers(1, 3))
def test_ngram_simple_never_fires_after_it_proposes(text, data, size_n):
    start = data.draw(st.integers(1, len(text)))
    simple = NgramSimple(size_n, 4)
    quiet, seen = walk(simple, text, start)
    if quiet is not None:
        assert simple.propose(T(text[:start]), 4).tokens.numel() == 0
    assert all(fired or not proposed for fired, proposed, _ in seen)  # it may fire where nothing is drafted


@settings(max_examples=300, deadline=None)
@given(prompt=texts, text=texts, data=st.data(), n_match=st.integers(1, 3))
def test_ngram_mod_proposes_nothing_and_adds_no_chunk_before_its_rule_ends_the_run(prompt, text, data, n_match):
    mod = NgramMod(n_match, 4, 1)
    mod.begin(target=None, prompt=T(prompt), max_new_tokens=len(text), sampler=None)
    whole, at = prompt + text, len(prompt) + data.draw(st.integers(1, len(text)))
    for j in range(len(prompt) + 1, at):  # the earlier rounds asked it, as the loop does
        mod.propose(T(whole[:j]), 4)
        mod.commit(j)
    i_last = mod.i_last
    quiet = mod.quiet(T(whole[:at]), 8)
    if quiet is None:
        return
    assert 1 <= quiet.steps <= MOD_CHUNK + 1
    assert mod.propose(T(whole[:at]), 4).tokens.numel() == 0 and mod.i_last == i_last  # this round's own
    mod.commit(at)
    for j, token in enumerate(whole[at:], 1):
        fired = quiet.stop.fires(token)
        proposed = mod.propose(T(whole[: at + j]), 4).tokens.numel() > 0
        mod.commit(at + j)
        if fired or j == quiet.steps:
            break
        assert not proposed and mod.i_last == i_last  # the pool the rule reads is the pool the drafter reads


def test_the_pool_rule_hashes_as_ngram_mod_does():
    pool = np.full(64, -1, dtype=np.int32)
    pool[fold([3, 4, 5]) % 64] = 9
    stop = StepStop(pool=pool, tail=np.array([3, 4], dtype=np.int32))
    assert not stop.fires(6)  # [3, 4, 6]: empty slot; the tail slides to [4, 6]
    assert stop.tail.tolist() == [4, 6]
    stop.tail[:] = [3, 4]
    assert stop.fires(5)
    assert mod_index([3, 4, 5]) == fold([3, 4, 5]) % (4 * 1024 * 1024)


def test_the_seen_rule_fires_on_a_repeat_and_marks_each_token():
    seen = np.zeros(10, dtype=np.uint8)
    seen[[1, 2]] = 1
    stop = StepStop(seen=seen)
    assert [stop.fires(t) for t in (4, 5, 4, 2)] == [False, False, True, True]
    assert seen.nonzero()[0].tolist() == [1, 2, 4, 5]


class Counting(GreedyByLogits):
    """A TableLM whose greedy_steps calls with a stop rule are counted (the quiet runs taken)."""

    def __init__(self, model):
        self.model, self.stopped = model, 0

    def __getattr__(self, name):
        return getattr(self.model, name)

    def extend(self, tokens, outputs=None):
        return self.model.extend(tokens, outputs)

    def truncate(self, n):
        self.model.truncate(n)

    def greedy_steps(self, token, steps, limit, eos=(), stop=None):
        self.stopped += stop is not None
        return GreedyByLogits.greedy_steps(self, token, steps, limit, eos, stop)


RECORDS = ("tokens_per_round", "k_per_round", "drafted_by_position", "reached_by_position", "accepted_by_position")


@pytest.mark.parametrize("make", [lambda: PromptLookup(2), lambda: NgramSimple(2, 3), lambda: NgramMod(2, 3, 1)],
                         ids=["lookup", "ngram-simple", "ngram-mod"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_quiet_runs_give_the_rounds_asking_every_round_gives(table_lm, monkeypatch, make, seed):
    prompt = torch.randint(0, 40, (24,), generator=torch.Generator().manual_seed(seed)).tolist()
    target = Counting(table_lm(V=40, seed=seed))
    quiet = generate(target, prompt, draft=make(), k=3, max_new_tokens=80)
    assert target.stopped > 0  # the quiet runs were taken
    monkeypatch.setattr(HostDrafter, "quiet", lambda self, context, width: None, raising=True)
    for cls in (PromptLookup, NgramSimple, NgramMod):
        monkeypatch.delattr(cls, "quiet", raising=False)
    target.stopped = 0
    asked = generate(target, prompt, draft=make(), k=3, max_new_tokens=80)
    assert target.stopped == 0
    assert quiet.tokens == asked.tokens
    for name in RECORDS:
        assert getattr(quiet.stats, name) == getattr(asked.stats, name), name
    assert quiet.stats.drafted > 0 and quiet.stats.rounds > quiet.stats.drafted_by_position[0]


def test_a_quiet_run_keeps_max_steps_and_the_token_budget(table_lm):
    prompt = list(range(30))  # every id new: prompt lookup is quiet until a token repeats
    for max_steps, budget in ((5, 40), (40, 7)):
        out = generate(table_lm(V=40, seed=3), prompt, draft=PromptLookup(2), k=3, max_new_tokens=budget,
                       max_steps=max_steps)
        assert out.stats.rounds <= max_steps and len(out.tokens) <= budget
        assert len(out.tokens) == budget or out.stats.rounds == max_steps


class _PerRound:
    """A policy seen without `update_plain`: the decode loop then updates it round by round."""

    def __init__(self, policy):
        self.policy = policy

    def __getattr__(self, name):
        if name == "update_plain":
            raise AttributeError(name)
        return getattr(self.policy, name)


def test_a_run_of_plain_rounds_updates_auto_k_once_as_round_by_round_would():
    # step times that say no k pays (V(k) >= (k + 1) V(0)): k="auto" decodes in plain runs; one AutoK
    # takes each run in one update_plain, the other round by round: same tokens, same counts
    from moespec.engine.policy import AutoK

    V = [1e-3, 5e-3, 9e-3]
    runs, target = [], TableLM(24, seed=3)
    whole, per_round = AutoK(max_k=2, V=V), AutoK(max_k=2, V=V)
    real = whole.update_plain
    whole.update_plain = lambda seconds: runs.append(len(seconds)) or real(seconds)
    prompt = [1, 2, 3, 4, 1, 2]
    a = generate(target, prompt, draft=PromptLookup(2), k=whole, max_new_tokens=40)
    b = generate(target, prompt, draft=PromptLookup(2), k=_PerRound(per_round), max_new_tokens=40)
    assert a.tokens == b.tokens and set(a.stats.k_per_round) == {0}
    assert runs and sum(runs) == len(a.stats.k_per_round) - 1  # every round after the prefill's, in runs
    for name in ("timed", "since_draft", "since_plain", "_warm", "tests"):
        assert getattr(whole, name) == getattr(per_round, name)
