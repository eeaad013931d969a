"""OracleDraft: realized acceptance ~ a under greedy verification, output unchanged."""

import math

import pytest
import torch

from moespec.engine.decode import generate
from moespec.backends.torch_model import CachedModel
from moespec.engine.proposers import OracleDraft
from moespec.models import synthetic

V = 48


@pytest.mark.parametrize("a", [0.3, 0.8, 0.95])
def test_realized_acceptance_is_a(table_lm, a):
    target = table_lm(V, seed=4)
    ref = generate(target, [1, 2, 3], k=0, max_new_tokens=3000, vocab_limit=V).tokens
    oracle = OracleDraft(a, seed=1)
    out = generate(target, [1, 2, 3], draft=oracle, k=4, max_new_tokens=3000, vocab_limit=V)
    assert out.tokens == ref and oracle.reanchors == 0
    tested = sum(out.stats.reached_by_position)
    # 3,000 tokens give >= 600 tested drafts; |a_hat - a| <= 0.04 (the paper's tolerance) is
    # >= 2.4 standard errors sqrt(a(1-a)/tested) at the worst a here.
    assert tested >= 600
    assert abs(out.stats.geometric_acceptance - a) <= 0.04, (a, out.stats.geometric_acceptance)
    assert abs(out.stats.geometric_acceptance - a) <= 4 * math.sqrt(a * (1 - a) / tested)
    # unconditional acceptance at position i is a^i
    for i, acc in enumerate(out.stats.acceptance_by_position, start=1):
        assert abs(acc - a**i) <= 0.06, (a, i, acc)


def test_reanchors_when_committed_text_leaves_the_reference(table_lm):
    # The reference is computed from a target whose table then changes (as a batched-vs-batch-one
    # near-tie would): the oracle must notice and re-anchor, and the output stays the target's greedy.
    target = table_lm(V, seed=5)
    prompt = torch.tensor([7, 8])
    original = target.A.clone()

    class Switching(OracleDraft):
        def begin(self, **kw):
            target.A = original * -1.0  # reference from a different model
            super().begin(**kw)
            target.A = original

    oracle = Switching(1.0)
    ref = generate(target, prompt, k=0, max_new_tokens=20, vocab_limit=V).tokens
    out = generate(target, prompt, draft=oracle, k=4, max_new_tokens=20, vocab_limit=V)
    assert out.tokens == ref and oracle.reanchors >= 1


def test_bad_acceptance():
    with pytest.raises(ValueError, match="acceptance"):
        OracleDraft(1.5)


def test_offset_continues_one_sequence_of_draws(table_lm):
    """Two runs of 20 rounds, the second starting its draws where the first stopped, realize the
    rounds of one 40-round run: outcomes follow the examination order, not the text."""
    target = table_lm(V, seed=4)
    room = 40 * 4  # k + 1 tokens per round: no round is cut short by the token budget
    whole = OracleDraft(0.7, seed=2)
    long = generate(target, [1, 2, 3], draft=whole, k=3, max_new_tokens=room, max_steps=40, vocab_limit=V)
    first = OracleDraft(0.7, seed=2)
    a = generate(target, [1, 2, 3], draft=first, k=3, max_new_tokens=room, max_steps=20, vocab_limit=V)
    second = OracleDraft(0.7, seed=2, offset=first.draws)
    b = generate(target, [1, 2, 3], draft=second, k=3, max_new_tokens=room, max_steps=20, vocab_limit=V)
    assert a.stats.stop_reason == b.stats.stop_reason == "max_steps" and len(a.stats.tokens_per_round) == 20
    assert a.stats.tokens_per_round + b.stats.tokens_per_round == long.stats.tokens_per_round
    assert first.draws + second.draws == whole.draws == 40  # one draw per step
    with pytest.raises(ValueError, match="offset"):
        OracleDraft(0.5, offset=-1)


def test_shared_reference_gives_the_same_run_without_decoding_it_again():
    """A reference passed in replaces begin's greedy decoding: same tokens, same acceptance, and the
    target runs fewer forward passes; a reference for another prompt is ignored."""
    model, _ = synthetic.build("olmoe-tiny", seed=0)
    target = CachedModel(model)
    prompt = [1, 5, 9, 14, 20]
    first = OracleDraft(0.7, seed=3)
    a = generate(target, prompt, draft=first, k=3, max_new_tokens=40)
    calls = []
    target.model.register_forward_pre_hook(lambda *_: calls.append(1))
    shared = OracleDraft(0.7, seed=3, reference=first.reference)
    b = generate(target, prompt, draft=shared, k=3, max_new_tokens=40)
    shared_calls = len(calls)
    calls.clear()
    other = OracleDraft(0.7, seed=3, reference=first.reference.flip(0))  # not this prompt's: decoded anew
    c = generate(target, prompt, draft=other, k=3, max_new_tokens=40)
    assert a.tokens == b.tokens == c.tokens
    assert a.stats.acceptance_by_position == b.stats.acceptance_by_position
    assert shared_calls + 40 - 1 <= len(calls)  # begin's 40-token greedy decode was skipped


def test_stratified_uniforms_are_uniform_per_block_and_prefix_stable():
    from moespec.engine.proposers import stratified_uniforms

    u = stratified_uniforms(1000, torch.Generator().manual_seed(0), block=100)
    assert u.shape == (1000,) and 0 <= float(u.min()) and float(u.max()) < 1
    for b in range(10):  # one draw in each stratum [i/100, (i+1)/100) of every block
        assert sorted((u[100 * b: 100 * (b + 1)] * 100).floor().long().tolist()) == list(range(100))
    shorter = stratified_uniforms(250, torch.Generator().manual_seed(0), block=100)
    assert torch.equal(shorter, u[:250])  # a longer run sees the same first draws


@pytest.mark.parametrize("a", [0.3, 0.8, 0.95])
def test_stratified_steps_keep_acceptance_geometric(a):
    """Accepted drafts per step at k = 4, min(geometric_run(u), 4) on the oracle's stratified draws,
    follow the truncated geometric law P(j) = a^j (1-a), j < 4, P(4) = a^4: 10,000 steps, chi-square
    at level 0.001, in blocks of 128 and of 40 (a demo cell's steps). The test has power: draws
    u^1.3, a wrong law (P(j = 0) = 1 - a^(1/1.3): 3.9% for 5% at a = 0.95), are rejected."""
    from scipy.stats import chisquare

    from moespec.engine.proposers import STEP_BLOCK, geometric_run, stratified_uniforms

    k = 4
    probs = [a**j * (1 - a) for j in range(k)] + [a**k]

    def pvalue(block, power=1.0):
        u = stratified_uniforms(10_000, torch.Generator().manual_seed(1), block=block) ** power
        steps = [min(geometric_run(float(x), a), k) for x in u]
        counts = [steps.count(j) for j in range(k + 1)]
        return chisquare(counts, [p * len(steps) for p in probs]).pvalue

    assert pvalue(STEP_BLOCK) > 1e-3 and pvalue(40) > 1e-3
    assert pvalue(STEP_BLOCK, power=1.3) < 1e-3


def test_geometric_run_edges():
    from moespec.engine.proposers import geometric_run

    assert geometric_run(0.5, 1.0) == math.inf and geometric_run(0.0, 0.5) == math.inf
    assert geometric_run(0.3, 0.0) == 0
    assert geometric_run(0.5, 0.5) == 1 and geometric_run(0.49, 0.5) == 1 and geometric_run(0.51, 0.5) == 0


@pytest.mark.parametrize("a", [0.0, 0.6])
def test_marked_drafts_keep_the_greedy_tokens_and_are_rejected(table_lm, a):
    """Every draft is the target's greedy token, marked or not; a marked draft ends the step's
    acceptance there. At a = 0 every step's first draft is marked, so every step commits one token."""
    target = table_lm(V, seed=6)
    prompt = list(range(1, 30))
    seen = []

    class Recording(OracleDraft):
        def propose(self, context, k):
            proposal = super().propose(context, k)
            seen.append((context.shape[0], proposal.tokens.clone(), self.reference.clone(), proposal.marked_from))
            return proposal

    out = generate(target, prompt, draft=Recording(a, seed=2), k=3, max_new_tokens=60, vocab_limit=V)
    assert out.tokens == generate(target, prompt, k=0, max_new_tokens=60, vocab_limit=V).tokens
    assert len(seen) >= 15
    for L, g, ref, marked in seen:
        assert torch.equal(g, ref[L: L + g.shape[0]]), L  # the window holds the greedy text
    # a step commits its drafts up to the first marked one, then one token of the target
    marks = [m for _, g, _, m in seen]
    assert all(n == (g.shape[0] if m is None else m) + 1
               for n, (_, g, _, m) in zip(out.stats.tokens_per_round, seen))
    if a == 0.0:
        assert set(marks) == {0} and set(out.stats.tokens_per_round) == {1}
    else:
        assert 0 in marks and None in marks  # some steps cut, some accept every draft


def test_an_autok_passed_again_goes_on_from_what_it_learned(table_lm):
    """The first call opens (k_open, then plain) and times its rounds; a second call with the same
    AutoK starts from those estimates, so it needs no opening, and greedy output is still plain's."""
    from moespec.engine.policy import AutoK

    target = table_lm(V, seed=6)
    ref = generate(target, [1, 2, 3], k=0, max_new_tokens=200, vocab_limit=V).tokens
    policy = AutoK(max_k=4)
    first = generate(target, [1, 2, 3], draft=OracleDraft(0.9, seed=2), k=policy, max_new_tokens=200, vocab_limit=V,
                     warm_start=False)
    assert first.tokens == ref and first.stats.k_per_round[0] == policy.k_open
    learned = sum(policy.timed)
    expected = policy.choose()
    second = generate(target, [1, 2, 3], draft=OracleDraft(0.9, seed=3), k=policy, max_new_tokens=200, vocab_limit=V)
    assert second.tokens == ref
    assert second.stats.k_per_round[0] == expected and sum(policy.timed) > learned
    assert second.stats.policy["timed_rounds"] == policy.timed
    with pytest.raises(ValueError, match="keeps its own"):
        generate(target, [1, 2, 3], k=policy, step_times=[1.0] * 5, max_new_tokens=4, vocab_limit=V)
