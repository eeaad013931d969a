"""Warm start of k="auto": step times V(0..max_k) for the first round, timed in the call or remembered.

A fresh `AutoK` without a seed learns the step times from its own rounds: it opens with rounds at
k_open and plain rounds, then explores each k it would draft, and every fresh call pays for that
again. `prepare` gives a policy that `wants_seed` a seed right after the prefill, in one of two ways:

- timed: one warm-up pass, then target passes of n = 1, 2, max_k + 1 tokens and the sizes between
  by bisection (so a short timing still spans every k), on the real cache: each pass is extended
  with the committed tokens' tail and truncated back, so the cache holds what it held and the
  output is unchanged. A proposer with a model of its own (`DraftModel`) gets one-token passes
  too, δ their median; one without (prompt lookup, the oracle) costs δ = 0. Then
  V(k) = τ(k+1) + k δ where timed, each τ(n) at most n τ(1), and `policy.interpolate_step_times`
  between and beyond; a pass far slower than predicted is timed once more, so one stray slow pass
  does not price a draft length out. A pass starts only while its predicted end stays within
  min(budget_s, share × max_new_tokens × τ_w(1)), τ_w(1) the warm-up's one-token pass (so share ×
  a plain call's time): the timing costs a bounded share of the call. Fewer than two target sizes
  in the budget is no seed.
- store (the default): the medians of the rounds that earlier k="auto" calls timed, and the
  acceptance by position α_1..α_max_k the last call with drafting rounds ended with, kept by
  `engine.step_store` under the target's, the proposer's and the machine's identity. A call with an
  entry seeds from it and times nothing; a call without one decodes cold (no timing: measured side
  by side, a timing inside a 96-token call cost more than its seed saved,
  benchmarks/auto_k_warm.py), and every call averages its medians in (`step_store.remember`), so
  only the first call of a model on a machine learns from nothing. The remembered acceptance starts
  the estimates (`AutoK.set_acceptance`: worth two tests per position, decaying as its own), so a
  pair whose drafts are good drafts long from the first round.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Callable

import torch

from moespec.engine.policy import Policy, interpolate_step_times
from moespec.engine.step_store import recall

BUDGET_S = 1.0  # the most seconds a timing spends
SHARE = 0.1  # ... and at most this share of a plain call's time, max_new_tokens × τ(1)
SUSPECT = 1.5  # a pass slower than its prediction by this factor is timed once more (the faster kept)
DRAFT_PASSES = 3  # timed one-token passes of a proposer's model (after a warm-up)
MODES = ("store", "timed")


@dataclass(frozen=True)
class WarmStart:
    """What `prepare` found. Times are seconds of wall clock inside the call (its `total_s`)."""

    mode: str  # "store" or "timed"
    source: str | None  # "store", "timed", or None: no seed (a store miss, no store, or a timing that fit
    # fewer than two sizes), the policy opens as without a warm start
    V: tuple[float, ...] | None  # [max_k + 1] the seed V(0..max_k)
    seconds: float  # the lookup and the timing
    target_s: float = 0.0  # of it, the target's passes (warm-up included)
    draft_s: float = 0.0  # of it, the proposer's model's passes
    pass_s: dict[int, float] = field(default_factory=dict)  # τ(n) of each timed size n
    draft_step_s: float | None = None  # δ, one draft step (0 without a proposer model)
    key: dict | None = None  # the store's key (None: no store for this call)
    acceptance: tuple[float, ...] | None = None  # α_1.. remembered by the store's entry
    anchors: tuple[int, ...] | None = None  # the k of V measured (a store's points); None: all

    def to_dict(self) -> dict:
        d = asdict(self)
        d["pass_s"] = {str(n): s for n, s in self.pass_s.items()}
        d["V"] = None if self.V is None else list(self.V)
        d["acceptance"] = None if self.acceptance is None else list(self.acceptance)
        d["anchors"] = None if self.anchors is None else list(self.anchors)
        d.pop("key")
        return d


def resolve_mode(warm_start: bool | str | None, policy: Policy) -> str | None:
    """The warm start a `generate` call runs: "store", "timed" or None (also for a policy that does
    not want a seed: a fixed k, given step times, an AutoK already seeded or timed)."""
    if warm_start is True:
        mode = "store"
    elif warm_start is False or warm_start is None:
        mode = None
    elif isinstance(warm_start, str) and warm_start in MODES:
        mode = warm_start
    else:
        raise ValueError(f"warm_start must be True (= \"store\"), \"store\", \"timed\" or False, got {warm_start!r}")
    return mode if policy.wants_seed else None


def size_order(top: int) -> list[int]:
    """The pass sizes in the order they are timed: 1, 2, top, then the midpoints of the gaps,
    widest first; [1, 2, 9, 5, 3, 7, 4, 6, 8] for top = 9."""
    order, gaps = [n for n in dict.fromkeys((1, 2, top)) if n <= top], deque([(2, top)])
    while gaps:
        lo, hi = gaps.popleft()
        if hi - lo >= 2:
            mid = (lo + hi) // 2
            order.append(mid)
            gaps.extend(((lo, mid), (mid, hi)))
    return order


def predict_pass(tau: dict[int, float], n: int) -> float:
    """τ(n) before it is timed, from the sizes timed so far (which hold n = 1): the step-time rule
    `interpolate_step_times` on V(k) = τ(k+1); with τ(1) alone, n τ(1) (an upper bound for costs
    that grow no faster than n)."""
    if len(tau) == 1:
        ((m, t),) = tau.items()
        return t * n / m
    top = max(max(tau), n) - 1
    return interpolate_step_times({m - 1: t for m, t in tau.items()}, top)[n - 1]


def _restore(model, length: int, forward_s: float) -> None:
    """Roll `model` back to `length` positions (a reset at 0: the state of a cache never fed)."""
    if length == 0:
        model.reset()
        model.forward_s = forward_s
    else:
        model.truncate(length)


def _tokens(context: torch.Tensor, n: int) -> torch.Tensor:
    """[n] the last n committed tokens, cycled when the context is shorter."""
    L = context.shape[0]
    return context[torch.arange(L - n, L) % L]


def time_passes(target, draft, context: torch.Tensor, max_k: int, max_new_tokens: int, *,
                clock: Callable[[], float] = time.perf_counter, budget_s: float = BUDGET_S,
                share: float = SHARE) -> tuple[dict[int, float], float | None, float, float]:
    """(τ(n) per timed size n, δ or None, target seconds, draft seconds), both caches restored.

    target: the SpecModel right after the prefill; draft: the proposer's model (its `cache`) or None;
    context: [L] int64, the committed tokens (the passes feed its tail). A pass starts only when the
    time spent plus its prediction (`predict_pass` from the sizes timed so far; a draft step and the
    first size: the warm-up's time) stays within min(budget_s, share × max_new_tokens × warm-up);
    the first that does not ends the timing. A pass more than SUSPECT times its prediction is timed
    again, the faster kept. δ is None when no draft step fit.
    """
    t_start = clock()
    base, forward_s = target.length, target.forward_s

    def one(model, n: int, held: int, fs: float) -> float:
        t0 = clock()
        model.extend(_tokens(context, n))
        _restore(model, held, fs)
        return clock() - t0

    warm = one(target, 1, base, forward_s)  # the warm-up: its time sets the budget
    budget = min(budget_s, share * max_new_tokens * warm)
    fits = lambda cost: clock() - t_start + cost <= budget  # a pass predicted to cost `cost` may start
    draft_s, delta = 0.0, None if draft is not None else 0.0
    if draft is not None and fits(warm):  # a draft step is predicted to cost no more than a target one
        t0, held, fs, steps = clock(), draft.length, draft.forward_s, []
        guess = one(draft, 1, held, fs)  # its warm-up
        while len(steps) < DRAFT_PASSES and fits(guess):
            steps.append(one(draft, 1, held, fs))
        delta = median(steps) if steps else None
        draft_s = clock() - t0
    tau: dict[int, float] = {}
    if delta is not None:
        for n in size_order(max_k + 1):
            guess = predict_pass(tau, n) if tau else warm
            if not fits(guess):
                break
            tau[n] = one(target, n, base, forward_s)
            if tau[n] > SUSPECT * guess and fits(guess):  # a stray slow pass (a page fault, another process)
                tau[n] = min(tau[n], one(target, n, base, forward_s))
    return tau, delta, clock() - t_start - draft_s, draft_s


def seed_from_passes(tau: dict[int, float], delta: float, max_k: int) -> list[float] | None:
    """V(k) = τ(k+1) + k δ at the timed sizes, each τ(n) at most n τ(1) (a pass is never slower than
    the one-token passes it could be split into: a slow stray pass must not price drafting out for
    good), `interpolate_step_times` elsewhere; None without τ(1) and a second size."""
    if 1 not in tau:
        return None
    return interpolate_step_times({n - 1: min(t, n * tau[1]) + (n - 1) * delta for n, t in tau.items()}, max_k)


def prepare(mode: str, *, target, proposer, context: torch.Tensor, max_k: int, max_new_tokens: int,
            key: dict | None = None, clock: Callable[[], float] = time.perf_counter, budget_s: float = BUDGET_S,
            share: float = SHARE) -> WarmStart:
    """The seed of a k="auto" call, right after its prefill (module docstring): mode "store", the
    store's entry for `key` (`step_store.store_key`; None: no store) or none; mode "timed", a timing.

    target: the SpecModel; proposer: the call's Proposer; context: [L] int64 the committed tokens.
    """
    t0 = clock()
    if mode == "store":  # an entry seeds; a miss, or no store, decodes cold and its rounds fill the entry
        stored = recall(key, max_k) if key is not None else None
        if stored is None:
            return WarmStart(mode, None, None, clock() - t0, key=key)
        return WarmStart(mode, "store", stored.V, clock() - t0, key=key, acceptance=stored.acceptance,
                         anchors=stored.anchors)
    tau, delta, target_s, draft_s = time_passes(target, proposer.cache, context, max_k, max_new_tokens,
                                                clock=clock, budget_s=budget_s, share=share)
    V = None if delta is None else seed_from_passes(tau, delta, max_k)
    return WarmStart(mode, None if V is None else "timed", None if V is None else tuple(V), clock() - t0,
                     target_s, draft_s, tau, delta)
