"""Level 1 of the losslessness gate (engine paper Sec. 6.1): the accept/resample rule alone.

For each synthetic (p, q) family over a 30-token vocabulary, 50,000 independent single-position
rounds (draw x ~ q, accept by eq. (1), else resample from eq. (2)) are run at once; the emitted
tokens must fit p: chi-square goodness of fit p-value > 0.01 and KL(p_hat || p) <= 1e-3.
"""

import math

import pytest
import torch
from scipy import stats as sps

from moespec.engine.sampling import Sampler, SamplingConfig, accept_mask, residual_distribution

V, TRIALS = 30, 50_000


def _family(name: str, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(p, q) [V] of one family; Dirichlet draws use the global RNG, so it is forked and seeded from g."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=g)))
        return _draw_family(name)


def _draw_family(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    dir_ = lambda alpha: torch.distributions.Dirichlet(torch.full((V,), alpha)).sample()  # noqa: E731
    if name == "uniform-dirichlet":
        return dir_(1.0), dir_(1.0)
    if name == "heavy-tailed":
        ranks = torch.arange(1, V + 1, dtype=torch.float32)
        p = ranks ** -1.5
        return p / p.sum(), dir_(0.3)
    if name == "near-identical":
        p = dir_(1.0)
        q = p * (1 + 0.05 * torch.randn(V)).clamp(min=0.5)
        return p, q / q.sum()
    if name == "mismatched-concentration":
        return dir_(0.2), dir_(5.0)
    if name == "disjoint-support":  # q(x) = 0 where p > 0 and the reverse: both edge cases of (1)-(2)
        p, q = dir_(1.0), dir_(1.0)
        p[: V // 3] = 0.0
        q[V // 3: 2 * V // 3] = 0.0
        return p / p.sum(), q / q.sum()
    raise AssertionError(name)


def _emit(p: torch.Tensor, q: torch.Tensor, n: int, g: torch.Generator) -> torch.Tensor:
    """n independent single-position rounds: [n] emitted tokens."""
    x = torch.multinomial(q, n, replacement=True, generator=g)  # [n]
    r = torch.rand(n, generator=g)
    accepted = accept_mask(p[x], q[x], r)
    recovered = torch.multinomial(residual_distribution(p, q), n, replacement=True, generator=g)
    return torch.where(accepted, x, recovered)


def _gof(counts: torch.Tensor, p: torch.Tensor) -> tuple[float, float]:
    """(chi-square p-value, KL(p_hat || p)); bins with expected count < 5 are pooled into one."""
    n = counts.sum().item()
    expected = p.double() * n
    small = expected < 5
    obs = torch.cat([counts[~small].double(), counts[small].double().sum().reshape(1)])
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    if exp[-1] < 5:
        assert obs[-1] <= 0.0 or exp[-1] > 0, "a zero-probability token was emitted"
        obs, exp = obs[:-1], exp[:-1]
    pvalue = sps.chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue
    p_hat = counts.double() / n
    nz = p_hat > 0
    kl = float((p_hat[nz] * (p_hat[nz] / p.double()[nz]).log()).sum())
    return pvalue, kl


FAMILIES = ["uniform-dirichlet", "heavy-tailed", "near-identical", "mismatched-concentration", "disjoint-support"]


@pytest.mark.parametrize("family", FAMILIES)
def test_rule_reproduces_target(family):
    g = torch.Generator().manual_seed(FAMILIES.index(family))
    p, q = _family(family, g)
    y = _emit(p, q, TRIALS, g)
    counts = torch.bincount(y, minlength=V)
    assert counts[p == 0].sum() == 0, "a token with p = 0 was emitted"
    pvalue, kl = _gof(counts, p)
    assert pvalue > 0.01, (family, pvalue)  # 50,000 trials; gate threshold of the engine paper
    assert kl <= 1e-3, (family, kl)


def test_wrong_rule_is_detected():
    # Resampling from p instead of the residual is the classic bug; the same test must catch it.
    g = torch.Generator().manual_seed(7)
    p, q = _family("mismatched-concentration", g)
    x = torch.multinomial(q, TRIALS, replacement=True, generator=g)
    keep = accept_mask(p[x], q[x], torch.rand(TRIALS, generator=g))
    y = torch.where(keep, x, torch.multinomial(p, TRIALS, replacement=True, generator=g))
    pvalue, _ = _gof(torch.bincount(y, minlength=V), p)
    assert pvalue < 0.01


def test_all_zero_residual_falls_back_to_p():
    p = torch.tensor([0.25, 0.25, 0.5, 0.0])
    assert torch.equal(residual_distribution(p, p.clone()), p)
    assert torch.allclose(residual_distribution(p, torch.tensor([0.5, 0.0, 0.5, 0.0])), torch.tensor([0.0, 1.0, 0.0, 0.0]))


def test_zero_q_accepts_iff_p_positive():
    r = torch.tensor([0.0, 0.99])
    assert accept_mask(torch.tensor([0.1, 0.1]), torch.zeros(2), r).all()
    assert not accept_mask(torch.zeros(2), torch.zeros(2), r).any()


def _sampler(**kw) -> Sampler:
    vocab_limit = kw.pop("vocab_limit", None)
    return Sampler(SamplingConfig(**kw), width=8, vocab_limit=vocab_limit, seed=0)


def test_greedy_consumes_no_randomness_and_matches_general_rule_on_one_hots():
    s = _sampler(temperature=0.0)
    before = s.generator.get_state().clone()
    logits = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    g = logits.argmax(-1)
    x = g[:4].clone()
    x[2] = (x[2] + 1) % 8
    assert s.verify(s.prepare(logits), x, None) == (2, int(g[2]))
    assert s.verify(s.prepare(logits), g[:4], None) == (4, int(g[4]))
    assert torch.equal(s.generator.get_state(), before)
    # the general rule on one-hot p and q gives the same walk
    t = _sampler(temperature=1.0)
    one_hot = lambda idx: torch.nn.functional.one_hot(idx, 8).float()  # noqa: E731
    assert t.verify(one_hot(g), x, one_hot(x)) == (2, int(g[2]))
    assert t.verify(one_hot(g), g[:4], None) == (4, int(g[4]))


def test_top_k_top_p_temperature_and_vocab_limit():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0, 9.0, 9.0]])
    p = _sampler(temperature=1.0, top_k=3, vocab_limit=6).prepare(logits)
    assert torch.all(p[0, 3:] == 0) and math.isclose(p.sum().item(), 1.0, rel_tol=1e-6)
    expected = torch.softmax(torch.tensor([4.0, 3.0, 2.0]), -1)
    assert torch.allclose(p[0, :3], expected)
    p = _sampler(temperature=0.5, top_p=0.9, vocab_limit=6).prepare(logits)
    full = torch.softmax(logits[0, :6] / 0.5, -1)
    assert full[0] < 0.9 < full[0] + full[1]  # the nucleus is exactly the first two ids
    assert torch.allclose(p[0, :2], full[:2] / full[:2].sum()) and torch.all(p[0, 2:] == 0)
    assert int(_sampler(temperature=0.0, vocab_limit=6).sample(_sampler(vocab_limit=6).prepare(logits))) == 0


def test_nan_logits_and_bad_settings():
    with pytest.raises(ValueError, match="NaN"):
        _sampler(temperature=1.0).prepare(torch.full((1, 8), float("nan")))
    for bad in (dict(temperature=-1.0), dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError):
            SamplingConfig(**bad)


def test_verify_matches_vectorized_rule():
    # The sampler's walk at K = 1 reproduces p too (fewer trials: it runs one round per call).
    g = torch.Generator().manual_seed(3)
    p, q = _family("mismatched-concentration", g)
    s = Sampler(SamplingConfig(temperature=1.0), width=V, seed=11)
    rows = torch.stack([p, p])  # [2, V]: row 0 checks x_1, row 1 is the bonus row
    n = 5_000  # 5,000 rounds; chi-square p > 0.01
    xs = torch.multinomial(q, n, replacement=True, generator=g)
    first = []
    for i in range(n):
        a, nxt = s.verify(rows, xs[i: i + 1], q[None])
        first.append(int(xs[i]) if a == 1 else nxt)  # the round's first emitted token
    out = torch.tensor(first)
    pvalue, _ = _gof(torch.bincount(out, minlength=V), p)
    assert pvalue > 0.01
