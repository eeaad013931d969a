"""The losslessness gate of the engine paper (Sec. 6.1), run on the pair the user will decode with.

1. The accept/resample rule alone, over families of (p, q): the law of one round's token, computed
   exactly from the rule's threshold (eq. (1)) and residual (eq. (2)), equals p; `trials` sampled
   rounds fit p (chi-square goodness of fit, p > LEVEL1_ALPHA).
2. The whole `generate` loop on table models (`TableLM`): (position, token) counts of `runs` seeded
   generations, speculative at each k vs target-only, two-sample chi-square p > alpha; greedy output
   identical to plain decoding.
3. The user's pair: greedy speculative tokens equal transformers' greedy `generate` on each prompt
   and k; `samples` sampled tokens (pooled by id) vs target-only, two-sample chi-square p > alpha.
Levels 1-3 carry a power check: the same test must reject a deliberately wrong sampler, or the level
fails (level 3: "inconclusive"). Seeds are fixed, so a run repeats; under another seed a correct
engine fails each test at rate alpha (about 4% for the whole gate at alpha = 0.01 and three k).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from scipy import stats as sps

from moespec.backends.table_model import TableLM
from moespec.checks.by_runs import MIN_EXPECTED, binned, by_runs
from moespec.engine import sampling
from moespec.engine.decode import generate

ALPHA = 0.01  # the engine paper's gate threshold (levels 2 and 3)
LEVEL1_ALPHA = 0.001  # per family at level 1, where seven families are tested
EXACT_TOL = 1e-6  # float32 error allowed between the exact output law of level 1 and p
FAMILIES = ("dirichlet", "mismatched", "disjoint", "q-equals-p", "one-hot-p", "one-hot-q", "near-zero")


@dataclass(frozen=True)
class ChiSquare:
    """One chi-square test: statistic, degrees of freedom, p-value, bins used and sample sizes. For the
    two-sample tests of levels 2 and 3, `pvalue` is by permuting the runs (`checks.by_runs`) and
    `pvalue_independent` the χ² law's, which assumes independent tokens (the paper's)."""

    chi2: float
    dof: int
    pvalue: float
    bins: int
    n: tuple[int, ...]
    pvalue_independent: float | None = None


def two_sample_runs(a_runs: np.ndarray, b_runs: np.ndarray, seed: int = 0) -> ChiSquare:
    """Two-sample chi-square of two methods' runs [R, B] of counts, runs as the unit (`checks.by_runs`)."""
    r = by_runs(a_runs, b_runs, seed=seed)
    return ChiSquare(r["chi2"], r["dof"], r["pvalue"], r["bins"], r["n"], r["pvalue_independent"])


def run_counts(sample: np.ndarray, bins: int) -> np.ndarray:
    """[runs, bins] each run's count of every id of `sample` [runs, tokens] (ids >= bins in the last bin)."""
    sample = np.asarray(sample, np.int64).clip(max=bins - 1)
    out = np.zeros((len(sample), bins), np.int64)
    np.add.at(out, (np.repeat(np.arange(len(sample)), sample.shape[1]), sample.ravel()), 1)
    return out


def goodness_of_fit(counts: np.ndarray, p: np.ndarray) -> ChiSquare:
    """counts [V] of emitted tokens against the law p [V]; bins with expected count below
    MIN_EXPECTED are pooled into one. A token with p = 0 that was emitted gives p-value 0."""
    n, p = int(counts.sum()), np.asarray(p, dtype=np.float64)
    if counts[p == 0].sum() > 0:
        return ChiSquare(math.inf, 0, 0.0, 0, (n,))
    expected = p * n
    small = expected < MIN_EXPECTED
    obs = np.append(counts[~small], counts[small].sum()).astype(float)
    exp = np.append(expected[~small], expected[small].sum())
    obs, exp = obs[exp > 0], exp[exp > 0]
    if len(obs) < 2:  # all mass on one bin: nothing left to compare
        return ChiSquare(0.0, 0, 1.0, len(obs), (n,))
    r = sps.chisquare(obs, exp * obs.sum() / exp.sum())
    return ChiSquare(float(r.statistic), len(obs) - 1, float(r.pvalue), len(obs), (n,))


def two_sample(a: np.ndarray, b: np.ndarray) -> ChiSquare:
    """Two-sample chi-square of count vectors a, b [B] (same bins): are they draws of one law?

    Bins whose expected count (under the pooled law, in the smaller sample) is below MIN_EXPECTED
    are pooled into an "other" bin, topped up from the rarest kept bins until it reaches it too.
    """
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    n = (int(a.sum()), int(b.sum()))
    table = binned(np.stack([a, b]), min(n) / max(sum(n), 1))  # a bin's expected count: its total * scale
    if table.shape[1] < 2:
        return ChiSquare(0.0, 0, 1.0, table.shape[1], n)
    r = sps.chi2_contingency(table, correction=False)
    return ChiSquare(float(r.statistic), int(r.dof), float(r.pvalue), table.shape[1], n)


def _family(name: str, V: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(p, q), each [V] float32 summing to 1, of one family; Dirichlet draws are seeded from g."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=g)))
        dirichlet = lambda c: torch.distributions.Dirichlet(torch.full((V,), c)).sample()
        p, q = dirichlet(1.0), dirichlet(1.0)
        if name == "mismatched":
            p, q = dirichlet(0.2), dirichlet(5.0)
    one_hot = lambda i: torch.nn.functional.one_hot(torch.tensor(i), V).float()
    if name == "disjoint":  # q(x) = 0 wherever p(x) > 0: every draft is rejected
        p[V // 2:], q[: V // 2] = 0.0, 0.0
    elif name == "q-equals-p":  # the residual is all zero: rejection has probability 0
        q = p.clone()
    elif name == "one-hot-p":
        p = one_hot(int(q.argmin()))
    elif name == "one-hot-q":  # a deterministic draft
        q = one_hot(int(p.argmin()))
    elif name == "near-zero":  # entries far below float32 epsilon on both sides
        p[: V // 3], q[V // 3: 2 * V // 3] = 1e-20, 1e-30
    return p / p.sum(), q / q.sum()


def exact_output(p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The law [V] of the token one round emits, P(x) = q(x) t(x) + (1 - Σ q t) p'(x), and whether
    `accept_mask`'s threshold is t(x) = min(1, p(x)/q(x)) (it accepts every r just below, rejects
    every r just above); t is the acceptance probability of draft x, p' the residual of eq. (2)."""
    t = torch.where(q > 0, (p / q.clamp(min=torch.finfo(q.dtype).tiny)).clamp(max=1.0), (p > 0).float())  # [V]
    below = sampling.accept_mask(p, q, t * (1 - 1e-4))
    above = sampling.accept_mask(p, q, (t * (1 + 1e-4)).clamp(max=1 - 2**-24))
    accepted = q * t
    law = accepted + (1 - accepted.sum()) * sampling.residual_distribution(p, q)
    return law, torch.equal(below, t > 0) and torch.equal(above, t >= 1)


def _sampled_rounds(p: torch.Tensor, q: torch.Tensor, n: int, g: torch.Generator, resample=None) -> np.ndarray:
    """Counts [V] of the tokens n independent single-position rounds emit (draft x ~ q, eq. (1), else eq. (2))."""
    x = torch.multinomial(q, n, replacement=True, generator=g)  # [n]
    keep = sampling.accept_mask(p[x], q[x], torch.rand(n, generator=g))
    law = sampling.residual_distribution(p, q) if resample is None else resample
    y = torch.where(keep, x, torch.multinomial(law, n, replacement=True, generator=g))
    return torch.bincount(y, minlength=p.shape[0]).numpy()


@dataclass
class Level1:
    """The rule alone: per family, the exact law's max error from p and the sampled fit's p-value."""

    trials: int
    vocab: int
    max_error: dict[str, float]  # max |P - p| of the exact law
    threshold_ok: dict[str, bool]  # accept_mask's threshold is min(1, p/q)
    fit: dict[str, ChiSquare]
    power: ChiSquare  # resampling from p instead of the residual (the classic bug), "mismatched" family

    @property
    def passed(self) -> bool:
        return (all(self.threshold_ok.values()) and all(e <= EXACT_TOL for e in self.max_error.values())
                and all(c.pvalue > LEVEL1_ALPHA for c in self.fit.values()) and self.power.pvalue < LEVEL1_ALPHA)


def run_level1(*, trials: int = 50_000, vocab: int = 30, seed: int = 0) -> Level1:
    """Level 1 over FAMILIES of (p, q) on `vocab` tokens, `trials` sampled rounds per family."""
    g = torch.Generator().manual_seed(seed)
    errors, threshold, fits = {}, {}, {}
    for name in FAMILIES:
        p, q = _family(name, vocab, g)
        law, threshold[name] = exact_output(p, q)
        errors[name] = float((law - p).abs().max())
        fits[name] = goodness_of_fit(_sampled_rounds(p, q, trials, g), p.numpy())
    p, q = _family("mismatched", vocab, g)
    power = goodness_of_fit(_sampled_rounds(p, q, trials, g, resample=p), p.numpy())
    return Level1(trials, vocab, errors, threshold, fits, power)


@dataclass
class Greedy:
    """Greedy speculative decoding at one k against a reference greedy decoder, over the prompts.

    At the first difference, `margins` holds the top-2 logit gap of the reference's position in a
    one-token pass and in two-token passes, and `argmax_moves` whether the argmax differs between them:
    then the target's own logits depend on the pass size (a backend property, engine paper Sec. 6.1).
    """

    k: str
    prompts: int
    equal: int
    first_mismatch: tuple[int, int] | None = None  # (prompt index, token position) of the first difference
    margins: tuple[float, float] | None = None  # (one-token pass, two-token passes) at the first difference
    argmax_moves: bool | None = None

    @property
    def differing_share(self) -> float:
        """The share of prompts whose speculative tokens differ from the reference's."""
        return 1 - self.equal / self.prompts if self.prompts else 0.0


def _greedy(target, draft, ks, prompts, reference, *, tokens: int, max_k: int, limit: int, eos=None) -> list[Greedy]:
    """For each k, on how many prompts greedy speculative decoding gives the reference's tokens (up to
    `tokens`, or to an EOS, kept)."""
    refs = [reference(p) for p in prompts]
    checks = []
    for k in ks:
        g = Greedy(str(k), len(prompts), 0)
        for j, (p, ref) in enumerate(zip(prompts, refs, strict=True)):
            out = generate(target, p, draft=draft, k=k, max_k=max_k, max_new_tokens=tokens, vocab_limit=limit,
                           eos_token_id=eos).tokens
            g.equal += out == ref
            if out != ref and g.first_mismatch is None:
                at = next((i for i, (a, b) in enumerate(zip(out, ref, strict=False)) if a != b), min(len(out), len(ref)))
                g.first_mismatch = (j, at)
                if 0 < at < len(ref):
                    g.margins, g.argmax_moves = _pass_size_margins(target, p, ref[:at], limit)
        checks.append(g)
    return checks


def _pass_size_margins(target, prompt: list[int], tokens: list[int], limit: int) -> tuple[tuple[float, float], bool]:
    """The top-2 logit gap of the token after prompt + tokens, the prompt prefilled and the tokens fed
    in one-token passes (plain decoding) and in two-token passes (`pass_agreement.cuts`; a verify
    pass), and whether the argmax moves between the two."""
    from moespec.backends.protocol import as_spec_model
    from moespec.checks.pass_agreement import fed_in_passes, margins

    m = as_spec_model(target)
    m.reset()
    rows = [fed_in_passes(m, prompt, tokens, n)[-1:, :limit] for n in (1, 2)]
    m.reset()
    gaps = tuple(float(margins(r)[0]) for r in rows)
    return gaps, int(rows[0].argmax()) != int(rows[1].argmax())


def _sample(model, draft, k, prompts, *, runs: int, tokens: int, seed: int, max_k: int, limit: int,
            batch: int = 1) -> np.ndarray:
    """[runs, tokens] ids of `runs` generations at temperature 1, no EOS stop; run i continues prompt i mod len.
    batch > 1: that many runs side by side (`side_by_side`, transformers models), each still a `generate` call."""
    if batch > 1:
        from moespec.checks.side_by_side import side_by_side  # imports transformers: only when asked

        return side_by_side(model, draft, k, prompts, runs=runs, tokens=tokens, seed=seed, max_k=max_k, limit=limit,
                            batch=batch)
    return np.array([generate(model, prompts[i % len(prompts)], draft=draft, k=k, max_k=max_k, temperature=1.0,
                              max_new_tokens=tokens, seed=seed + i, vocab_limit=limit).tokens for i in range(runs)])


@dataclass
class Level2:
    """The loop on table models: speculative vs target-only per k, the power check, greedy identity."""

    runs: int
    tokens: int
    vocab: int
    spec: dict[str, ChiSquare]  # by str(k)
    power: ChiSquare  # the draft's own sampling vs target-only
    greedy: list[Greedy]  # against plain greedy decoding
    padded_ids: int  # tokens emitted at padded ids (must be 0)
    alpha: float = ALPHA

    @property
    def passed(self) -> bool:
        return (all(c.pvalue > self.alpha for c in self.spec.values()) and self.power.pvalue < self.alpha
                and all(g.equal == g.prompts for g in self.greedy) and self.padded_ids == 0)


def run_level2(*, ks=(1, 4, "auto"), max_k: int = 8, runs: int = 1000, tokens: int = 8, vocab: int = 16,
               seed: int = 0, alpha: float = ALPHA) -> Level2:
    """Level 2: `runs` generations of `tokens` tokens per method, binned by (position, token)."""
    V = vocab
    target, draft = TableLM(V, seed=1 + seed, width=V + 4), TableLM(V, seed=2 + seed, width=V + 4, scale=0.6)
    prompts = [[i % V, (7 * i) % V] for i in range(runs)]
    size = dict(runs=runs, tokens=tokens, max_k=max_k, limit=V)
    base = 1_000_003 * seed  # each method draws from its own seeds, so the samples are independent

    def counts(sample: np.ndarray) -> np.ndarray:  # [runs, tokens] -> [runs, tokens * V]: (position, token) per run
        return run_counts(sample.clip(max=V - 1) + V * np.arange(tokens), tokens * V)

    plain = _sample(target, None, 0, prompts, seed=base, **size)
    wrong = _sample(draft, None, 0, prompts, seed=base + runs, **size)
    spec, padded = {}, int((plain >= V).sum())
    for j, k in enumerate(ks):
        s = _sample(target, draft, k, prompts, seed=base + (j + 2) * runs, **size)
        spec[str(k)], padded = two_sample_runs(counts(s), counts(plain), seed), padded + int((s >= V).sum())
    greedy_prompts = [[j, (5 * j + 3) % V, (11 * j) % V] for j in range(3)]
    plain_greedy = lambda p: generate(target, p, k=0, max_new_tokens=20, vocab_limit=V).tokens
    greedy = _greedy(target, draft, ks, greedy_prompts, plain_greedy, tokens=20, max_k=max_k, limit=V)
    return Level2(runs, tokens, V, spec, two_sample_runs(counts(wrong), counts(plain), seed), greedy, padded, alpha)


@dataclass
class Level3:
    """The user's pair: greedy equality per k, the sampled two-sample test and its power check."""

    greedy_tokens: int
    greedy: list[Greedy]  # against transformers' greedy `generate`
    sample_k: str
    spec: ChiSquare  # speculative vs target-only sampling, token ids pooled
    power: ChiSquare  # the draft's own sampling vs target-only sampling
    padded_ids: int  # sampled tokens at ids >= len(tokenizer) (must be 0)
    alpha: float = ALPHA

    verdict = property(lambda self: self._judge()[0],
                       doc="pass, fail, inconclusive (only the power check failed), or pass-size (greedy output "
                           "differs where the target's own argmax changes with the pass size)")
    reason = property(lambda self: self._judge()[1], doc="why the verdict is not pass; empty when it is")

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def _judge(self) -> tuple[str, str]:
        bad = [g for g in self.greedy if g.equal < g.prompts]
        if bad:
            g = bad[0]
            where = (f"greedy tokens differ from the reference at k={g.k} on {g.prompts - g.equal} of {g.prompts} "
                     f"prompts (first: prompt {g.first_mismatch[0]}, token {g.first_mismatch[1]})")
            if g.margins is None:
                return "fail", where
            gaps = (f"top-2 margin there {g.margins[0]:.3g} in a one-token pass, {g.margins[1]:.3g} in two-token "
                    "passes")
            if g.argmax_moves:
                return "pass-size", (f"{where}; {gaps}, and the argmax changes with the pass size: the target's "
                                     "logits depend on how many tokens a pass holds (not batch-invariant), so no "
                                     "speculative decoder can repeat its plain output; decode with --exact")
            return "fail", f"{where}; {gaps}"
        if self.padded_ids:
            return "fail", f"{self.padded_ids} sampled tokens are padded ids (>= len(tokenizer))"
        if self.spec.pvalue <= self.alpha:
            return "fail", f"speculative sampling differs from target-only sampling (p = {self.spec.pvalue:.2g})"
        if self.power.pvalue >= self.alpha:
            return "inconclusive", (f"at {self.spec.n[0]:,} tokens the test cannot tell the draft's own sampling "
                                    f"from the target's (p = {self.power.pvalue:.2g}); raise the sample size")
        return "pass", ""


def _hf_greedy(model, prompt: list[int], n: int, vocab_limit: int, eos: int | None) -> list[int]:
    """transformers' own greedy continuation: up to n tokens or an EOS, never an id >= vocab_limit."""
    from moespec.backends.torch_model import CachedModel

    width = CachedModel(model).width
    device = next(model.parameters()).device
    out = model.generate(torch.tensor([prompt], device=device), do_sample=False, max_new_tokens=n,
                         suppress_tokens=list(range(vocab_limit, width)) or None, eos_token_id=eos,
                         pad_token_id=0 if eos is None else eos)
    return out[0, len(prompt):].tolist()


def _prompt_ids(tokenizer, prompts, length: int) -> list[list[int]]:
    """None or a count: the built-in prompts cut to `length` tokens; else the given texts or id lists."""
    from moespec.texts import prompt_ids

    if prompts is None or isinstance(prompts, int):
        return prompt_ids(tokenizer, length, 4 if prompts is None else prompts)
    ids = [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
    if not ids or not all(ids):
        raise ValueError("prompts must be a non-empty list of non-empty texts or token-id lists")
    return ids


def run_level3(target, draft, tokenizer, *, prompts=None, prompt_tokens: int = 32, ks=(1, 4, "auto"),
               max_k: int = 8, greedy_tokens: int = 32, samples: int = 9_200, tokens_per_run: int = 100,
               sample_k: int | str | None = None, seed: int = 0, alpha: float = ALPHA, batch: int = 1) -> Level3:
    """Level 3 on the user's pair; samples is rounded up to whole runs of `tokens_per_run` tokens.

    sample_k: the k of the sampled leg (default: the largest int in ks, else "auto"). batch: the sampled
    runs decoded that many side by side, their passes batched (`checks.side_by_side`; transformers
    models): the same calls of `generate`, far fewer weight reads on a CPU; 1: one after another.
    """
    if min(samples, tokens_per_run, greedy_tokens, batch) < 1:
        raise ValueError(f"samples, tokens_per_run, greedy_tokens, batch must be >= 1, got "
                         f"{samples, tokens_per_run, greedy_tokens, batch}")
    ids, limit, eos = _prompt_ids(tokenizer, prompts, prompt_tokens), len(tokenizer), tokenizer.eos_token_id
    if hasattr(target, "generate") and hasattr(target, "config"):  # a transformers model: its own generate
        reference = lambda p: _hf_greedy(target, p, greedy_tokens, limit, eos)
    else:  # another backend: its plain decoding (on llama.cpp, llama.cpp's own greedy tokens)
        reference = lambda p: generate(target, p, k=0, max_new_tokens=greedy_tokens, vocab_limit=limit,
                                       eos_token_id=eos).tokens
    greedy = _greedy(target, draft, ks, ids, reference, tokens=greedy_tokens, max_k=max_k, limit=limit, eos=eos)
    if sample_k is None:
        sample_k = max((k for k in ks if isinstance(k, int)), default="auto")
    runs = -(-samples // tokens_per_run)
    size = dict(runs=runs, tokens=tokens_per_run, max_k=max_k, limit=limit, batch=batch)
    base = 1_000_003 * seed  # each method draws from its own seeds, so the samples are independent
    spec = _sample(target, draft, sample_k, ids, seed=base, **size)
    plain = _sample(target, None, 0, ids, seed=base + runs, **size)
    wrong = _sample(draft, None, 0, ids, seed=base + 2 * runs, **size)
    counts = lambda s: run_counts(s, limit)  # noqa: E731  [runs, limit]: token ids pooled within each run
    return Level3(greedy_tokens, greedy, str(sample_k), two_sample_runs(counts(spec), counts(plain), seed),
                  two_sample_runs(counts(wrong), counts(plain), seed),
                  int((spec >= limit).sum() + (plain >= limit).sum()), alpha)


@dataclass
class GateResult:
    """The three levels and the settings they ran with."""

    level1: Level1
    level2: Level2
    level3: Level3
    settings: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.level1.passed and self.level2.passed and self.level3.passed

    def to_dict(self) -> dict:
        return {"passed": self.passed, "settings": self.settings,
                "level1": {**asdict(self.level1), "passed": self.level1.passed},
                "level2": {**asdict(self.level2), "passed": self.level2.passed},
                "level3": {**asdict(self.level3), "passed": self.level3.passed, "verdict": self.level3.verdict,
                           "reason": self.level3.reason}}


def run_gate(target, draft, tokenizer, *, prompts=None, ks=(1, 4, "auto"), max_k: int = 8, samples: int = 9_200,
             greedy_tokens: int = 32, trials: int = 50_000, mock_runs: int = 1000, seed: int = 0,
             alpha: float = ALPHA, progress=None) -> GateResult:
    """The three levels on `target` and `draft` (causal LMs sharing `tokenizer`).

    prompts: None (4 built-in prompts), a count of built-in prompts, or texts / token-id lists.
    ks: the draft lengths of levels 2 and 3 (ints and "auto"). samples: sampled tokens per method at
    level 3; trials: sampled rounds per family at level 1; mock_runs: generations per method at level 2.
    progress: called with a short message before each level (the CLI prints it).
    """
    ks = tuple(ks)
    if not ks:
        raise ValueError("ks must name at least one draft length (an int >= 0 or 'auto')")
    say = progress or (lambda message: None)
    say(f"level 1: the accept/resample rule, {len(FAMILIES)} families x {trials:,} rounds")
    level1 = run_level1(trials=trials, seed=seed)
    say(f"level 2: the decode loop on table models, {mock_runs} runs per method, k in {ks}")
    level2 = run_level2(ks=ks, max_k=max_k, runs=mock_runs, seed=seed, alpha=alpha)
    say(f"level 3: the user's pair, greedy on each k, then {samples:,} sampled tokens x 3 methods")
    level3 = run_level3(target, draft, tokenizer, prompts=prompts, ks=ks, max_k=max_k, greedy_tokens=greedy_tokens,
                        samples=samples, seed=seed, alpha=alpha)
    settings = dict(ks=[str(k) for k in ks], max_k=max_k, samples=samples, greedy_tokens=greedy_tokens,
                    trials=trials, mock_runs=mock_runs, seed=seed, alpha=alpha,
                    reference="transformers generate" if hasattr(target, "generate") else "plain decoding")
    return GateResult(level1, level2, level3, settings)
