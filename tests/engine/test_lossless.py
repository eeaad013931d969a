"""Level 2 of the losslessness gate (engine paper Sec. 6.1): the whole loop on mock models.

Target and draft are deterministic table models (conftest.TableLM, vocabulary 48 plus 4 padded ids
with large logits). Speculative sampling (k = 4, and k = "auto" on a clock the models advance, so
its choices repeat) and target-only sampling each pool 800 seeded generations of 25 tokens (20,000
tokens per method); a two-sample chi-square over the 48 token bins must give p > 0.01, and the same
test must give p < 0.01 for a sampler that resamples from p instead of the residual. Greedy
speculative output must equal plain greedy output bit for bit.
"""

import pytest
import torch
from scipy import stats as sps

import moespec.engine.decode as decode
import moespec.engine.sampling as sampling
from moespec.engine.decode import generate
from moespec.engine.proposers import DraftModel, OracleDraft, PromptLookup
from tests.engine.fake_clock import FakeClock

V, PAD = 48, 4
RUNS, TOKENS = 800, 25


def _counts(target, draft, k: int | str, temperature: float = 1.0) -> torch.Tensor:
    counts = torch.zeros(V + PAD, dtype=torch.long)
    for seed in range(RUNS):
        prompt = [seed % V, (7 * seed) % V]
        out = generate(target, prompt, draft=draft, k=k, temperature=temperature, max_new_tokens=TOKENS,
                       seed=seed, vocab_limit=V)
        assert len(out.tokens) == TOKENS
        counts += torch.bincount(torch.tensor(out.tokens), minlength=V + PAD)
    return counts


def _two_sample_p(a: torch.Tensor, b: torch.Tensor) -> float:
    table = torch.stack([a, b]).numpy()
    table = table[:, table.sum(0) > 0]
    return sps.chi2_contingency(table).pvalue


def _pair(table_lm):
    return table_lm(V, seed=1, width=V + PAD), table_lm(V, seed=2, width=V + PAD, scale=0.6)


def test_speculative_sampling_matches_target_sampling(table_lm, monkeypatch):
    target, draft = _pair(table_lm)
    plain = _counts(target, None, k=0)
    spec = _counts(target, draft, k=4)
    assert plain[V:].sum() == 0 and spec[V:].sum() == 0, "a padded id was produced"
    assert _two_sample_p(spec, plain) > 0.01  # 20,000 tokens per method, gate threshold 0.01
    monkeypatch.setattr(decode, "time", FakeClock(target, draft))
    auto = _counts(target, draft, k="auto")
    assert _two_sample_p(auto, plain) > 0.01

    # A deliberately wrong sampler: on rejection, resample from p instead of max(0, p - q).
    monkeypatch.setattr(sampling, "residual_distribution", lambda p, q: p)
    wrong = _counts(target, draft, k=4)
    assert _two_sample_p(wrong, plain) < 0.01


@pytest.mark.parametrize("k", [1, 2, 4, 8, "auto"])
def test_greedy_is_bit_identical_for_every_proposer(table_lm, k):
    target, draft = _pair(table_lm)
    for seed in range(5):
        prompt = torch.randint(0, V, (6,), generator=torch.Generator().manual_seed(seed))
        ref = generate(target, prompt, k=0, max_new_tokens=40, vocab_limit=V).tokens
        for proposer in (draft, DraftModel(draft), PromptLookup(2), OracleDraft(0.7, seed=seed)):
            out = generate(target, prompt, draft=proposer, k=k, max_new_tokens=40, vocab_limit=V)
            assert out.tokens == ref, (type(proposer).__name__, k, seed)
            assert out.stats.new_tokens == 40 and sum(out.stats.tokens_per_round) == 40


def test_caches_stay_at_committed_prefix(table_lm):
    # After every generate, the target holds the committed sequence minus its last token and the
    # draft a prefix of it; their cached tokens must equal the committed tokens.
    target, draft_lm = _pair(table_lm)
    draft = DraftModel(draft_lm)
    prompt = torch.tensor([3, 1, 4, 1, 5])
    for temperature, budget in ((0.0, 17), (1.0, 23), (1.0, 1)):
        out = generate(target, prompt, draft=draft, k=5, temperature=temperature, max_new_tokens=budget,
                       vocab_limit=V, seed=budget)
        committed = torch.cat((prompt, torch.tensor(out.tokens)))
        assert target.length == committed.shape[0] - 1
        assert torch.equal(target.tokens, committed[:-1])
        assert draft_lm.length <= committed.shape[0]
        assert torch.equal(draft_lm.tokens, committed[: draft_lm.length])
