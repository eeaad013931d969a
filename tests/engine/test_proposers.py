"""The proposer protocol: every proposer returns a `Proposal` that keeps its documented invariants,
and the loop honours a proposal's fields whoever wrote the proposer."""

import pytest
import torch

from moespec.engine.decode import generate
from moespec.engine.proposers import DraftModel, OracleDraft, PromptLookup, Proposal, Proposer

V, PAD = 48, 4
PROMPT = [5, 9, 2, 5, 9, 2, 5, 9, 7, 5, 9]  # repeats, so prompt lookup finds matches


class Recorder:
    """A Proposer that passes every call to `inner` and keeps each (k, Proposal) it returned."""

    def __init__(self, inner):
        self.inner, self.seen, self.width = inner, [], None

    @property
    def cache(self):
        return self.inner.cache

    def begin(self, *, sampler, **kw):
        self.width = sampler.width
        self.inner.begin(sampler=sampler, **kw)

    def propose(self, context, k):
        proposal = self.inner.propose(context, k)
        self.seen.append((k, proposal))
        return proposal

    def commit(self, keep):
        self.inner.commit(keep)

    def identity(self):
        return self.inner.identity()


CASES = {  # name: (proposer factory, sampling keywords)
    "draft-greedy": (lambda lm: DraftModel(lm), {}),
    "draft-sampled": (lambda lm: DraftModel(lm), {"temperature": 1.0, "top_k": 12, "top_p": 0.9}),
    "lookup": (lambda lm: PromptLookup(2), {"temperature": 1.0}),
    "oracle": (lambda lm: OracleDraft(0.5, seed=1), {}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_proposal_keeps_the_documented_invariants(table_lm, name):
    make, sampling = CASES[name]
    target, draft_lm = table_lm(V, seed=1, width=V + PAD), table_lm(V, seed=2, width=V + PAD, scale=0.6)
    proposer = make(draft_lm)
    assert isinstance(proposer, Proposer)
    rec = Recorder(proposer)
    generate(target, PROMPT, draft=rec, k=4, max_new_tokens=60, vocab_limit=V, seed=3, **sampling)
    assert len(rec.seen) >= 12 and any(p.tokens.numel() for _, p in rec.seen)
    for k, p in rec.seen:
        assert isinstance(p, Proposal)
        n = p.tokens.shape[0]
        assert p.tokens.dtype == torch.long and p.tokens.dim() == 1 and n <= k
        assert p.marked_from is None or 0 <= p.marked_from < n
        if p.q is not None:
            assert p.q.dtype == torch.float32 and p.q.shape == (n, rec.width)
            assert torch.allclose(p.q.sum(-1), torch.ones(n), atol=1e-5) and bool((p.q >= 0).all())
            assert bool((p.q[torch.arange(n), p.tokens] > 0).all())  # each draft came from its row
            assert float(p.q[:, V:].abs().sum()) == 0.0  # padding ids have no mass
    qs = [p.q for _, p in rec.seen]
    if name == "draft-sampled":
        assert all(q is not None for q in qs)
    else:
        assert all(q is None for q in qs)  # one-hot drafts, or greedy: q is never read
    marks = {p.marked_from for _, p in rec.seen} - {None}
    assert bool(marks) == (name == "oracle")  # only the oracle marks drafts


def test_cache_is_the_draft_models_own_or_none(table_lm):
    lm = table_lm(V)
    assert DraftModel(lm).cache is lm
    assert PromptLookup(2).cache is None and OracleDraft(0.5).cache is None


def test_proposal_rejects_fields_that_break_the_invariants():
    x = torch.tensor([3, 4, 5])
    with pytest.raises(ValueError, match="int64"):
        Proposal(x.reshape(1, 3))
    with pytest.raises(ValueError, match=r"\[3, W\]"):
        Proposal(x, q=torch.full((2, V), 1 / V))
    with pytest.raises(ValueError, match="marked_from"):
        Proposal(x, marked_from=3)
    assert Proposal(x, marked_from=2).marked_from == 2


class Fixed:
    """A proposer written outside the package: the target's greedy text, the first draft marked."""

    cache = None

    def __init__(self, text: list[int], extra: int = 0):
        self.text, self.extra = torch.tensor(text), extra

    def begin(self, **kw):
        pass

    def propose(self, context, k):
        L = context.shape[0]
        tokens = self.text[L: L + k + self.extra]
        return Proposal(tokens, marked_from=0 if tokens.numel() else None)

    def commit(self, keep):
        pass

    def identity(self):
        return None  # no key: k="auto" would decode cold


def test_the_loop_rejects_from_marked_from_for_any_proposer(table_lm):
    target = table_lm(V, seed=4)
    prompt = [1, 2, 3]
    greedy = generate(target, prompt, k=0, max_new_tokens=20, vocab_limit=V).tokens
    out = generate(target, prompt, draft=Fixed(prompt + greedy), k=3, max_new_tokens=20, vocab_limit=V)
    assert out.tokens == greedy  # every draft matched the target, yet each round stopped at its mark
    assert set(out.stats.tokens_per_round) == {1} and out.stats.accepted == 0
    with pytest.raises(ValueError, match="at most k"):
        generate(target, prompt, draft=Fixed(prompt + greedy, extra=1), k=3, max_new_tokens=20, vocab_limit=V)
