"""The bands of a candidate's speedup (issue 50; `costmodel.positional.answer`): the bootstrap over
prompts (a cluster bootstrap: the prompt, not the round, is the unit drawn) and the ends of the band
of the best speedup and of the speedup at each k."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from moespec.costmodel.positional import PositionalAcceptance


BOOTSTRAP_DRAWS, BOOTSTRAP_SEED = 2000, 0  # prompt resamples of the band; a fixed seed: the same band each run


def prompt_bootstrap_band(V: Sequence, prompts: Sequence[PositionalAcceptance], *, level: float = 0.95,
                          draws: int = BOOTSTRAP_DRAWS, seed: int = BOOTSTRAP_SEED,
                          at_k_prompts: Sequence[Sequence[PositionalAcceptance]] = ()) -> tuple[float, float]:
    """The central `level` percentile band of max_k E(k) V(0)/V(k) over `draws` resamples of the
    prompts with replacement (`prompt_bootstrap_speedups`)."""
    best = prompt_bootstrap_speedups(V, prompts, draws=draws, seed=seed, at_k_prompts=at_k_prompts).max(axis=1)
    return percentile_band(best, level)


def prompt_bootstrap_speedups(V: Sequence, prompts: Sequence[PositionalAcceptance], *, draws: int = BOOTSTRAP_DRAWS,
                              seed: int = BOOTSTRAP_SEED,
                              at_k_prompts: Sequence[Sequence[PositionalAcceptance]] = ()):
    """[draws, kmax + 1] E(k) V(0)/V(k) of each of `draws` resamples of the prompts with replacement, each
    resample's counts pooled before its alphas are taken (a cluster bootstrap: the prompt, not the round,
    is the unit drawn). V: [kmax + 1]; prompts: per-prompt counts; at_k_prompts: [kmax][prompts]
    per-prompt counts of the run at each k (E(k) from the run at k), the same prompts drawn for every k."""
    import numpy as np

    if len(prompts) < 2:
        raise ValueError(f"a bootstrap over prompts needs at least 2 prompts' counts, got {len(prompts)}")
    kmax = len(V) - 1
    picks = np.random.default_rng(seed).integers(0, len(prompts), size=(draws, len(prompts)))
    E = np.ones((draws, kmax + 1))
    for k in range(1, kmax + 1):
        parts = at_k_prompts[k - 1] if at_k_prompts else prompts
        at_risk = np.array([q.at_risk[:k] for q in parts], dtype=float).reshape(len(parts), k)
        accepted = np.array([q.accepted[:k] for q in parts], dtype=float).reshape(len(parts), k)
        n, a = at_risk[picks].sum(axis=1), accepted[picks].sum(axis=1)  # [draws, k]
        alpha = np.divide(a, n, out=np.zeros_like(a), where=n > 0)
        E[:, k] = 1 + np.cumprod(alpha, axis=1).sum(axis=1)
    Vf = np.array([float(v) for v in V])
    return E * Vf[0] / Vf


def percentile_band(samples, level: float = 0.95) -> tuple[float, float]:
    """The central `level` percentile band of `samples` (along the first axis: floats, or arrays per column)."""
    import numpy as np

    tail = (1 - level) / 2
    low, high = np.quantile(samples, tail, axis=0), np.quantile(samples, 1 - tail, axis=0)
    return (float(low), float(high)) if np.ndim(low) == 0 else (low, high)


def speedup_band(slow: Sequence[float], fast: Sequence[float], E_low: Sequence, E_high: Sequence,
                 prompts: Sequence[PositionalAcceptance], at_k_prompts: Sequence) -> tuple[float, float, list, list]:
    """`answer`'s bands before δ: (low, high) of the best speedup, (max_k E_low(k) slow(k), max_k E_high(k)
    fast(k)), and [kmax + 1] low and high ends at each k, E_low(k) slow(k) and E_high(k) fast(k); slow(k)
    and fast(k) V(0)/V(k) at the price's high and low ends, E at the ends of the alphas' intervals. Each
    end is widened to the prompt bootstrap's where >= 2 prompts' counts are kept
    (`prompt_bootstrap_speedups` at V(k) = 1/slow(k) and 1/fast(k), one bootstrap where the two agree)."""
    low_k = [float(e) * g for e, g in zip(E_low, slow)]
    high_k = [float(e) * g for e, g in zip(E_high, fast)]
    low, high = max(low_k), max(high_k)
    if len(prompts) < 2:
        return low, high, low_k, high_k
    draws_slow = prompt_bootstrap_speedups([1 / g for g in slow], prompts, at_k_prompts=at_k_prompts)
    draws_fast = draws_slow if list(slow) == list(fast) else \
        prompt_bootstrap_speedups([1 / g for g in fast], prompts, at_k_prompts=at_k_prompts)
    (boot_low, _), (_, boot_high) = (percentile_band(d.max(axis=1)) for d in (draws_slow, draws_fast))
    (col_low, _), (_, col_high) = percentile_band(draws_slow), percentile_band(draws_fast)
    return (min(low, boot_low), max(high, boot_high), [min(a, float(b)) for a, b in zip(low_k, col_low)],
            [max(a, float(b)) for a, b in zip(high_k, col_high)])
