"""Warm start of k="auto": step times V(0..max_k) for the first round, timed in the call or remembered.

A fresh `AutoK` without a seed learns the step times from its own rounds: it opens with rounds at
k_open and plain rounds, then explores each k it would draft, and every fresh call pays for that
again. `prepare` gives it a seed right after the prefill, in one of two ways:

- timed: one warm-up pass, then target passes of n = 1, 2, max_k + 1 tokens and the sizes between
  by bisection (so a short timing still spans every k), on the real cache: each pass is extended
  with the committed tokens' tail and truncated back, so the cache holds what it held and the
  output is unchanged. A proposer with a model of its own (`DraftModel`) gets one-token passes
  too, δ their median; one without (prompt lookup, the oracle) costs δ = 0. Then
  V(k) = τ(k+1) + k δ, τ(n) measured where timed and linear in n between (beyond the largest, the
  line through the last two), and at most n τ(1); a pass far slower than predicted is timed once
  more, so one stray slow pass does not price a draft length out. A pass starts only while its
  predicted end stays within min(budget_s, share × max_new_tokens × τ_w(1)), τ_w(1) the warm-up's
  one-token pass (so share × a plain call's time): the timing costs a bounded share of the call.
  Fewer than two target sizes in the budget is no seed.
- store (the default): the medians of the rounds that earlier k="auto" calls timed
  (`AutoK.measured`), in `step-times.json` under the user's cache folder, keyed by the target's,
  the draft's and the machine's identity (`run_key`). A call with an entry seeds from it and times
  nothing; a call without one decodes cold (no timing: measured side by side, a timing inside a
  96-token call cost more than its seed saved, benchmarks/auto_k_warm.py), and every call averages
  its medians in (`remember`), so only the first call of a model on a machine learns from nothing. The entry
  also keeps the acceptance by position α_1..α_max_k the last call with drafting rounds ended with;
  the next call starts its estimates there (`AutoK.set_acceptance`: worth two tests per position,
  decaying as its own), so a pair whose drafts are good drafts long from the first round.

Keys: a transformers model by `provenance.model_fingerprint` (config and weights, taken once per
loaded module), dtype, device, experts implementation, linear-layer classes and torch's threads; a
GGUF file by its resolved path, size, modification time and a hash of its first 64 KiB, and
llama.cpp's threads; the machine by CPU model, core count, OS and architecture, and the torch and
llama-cpp-python versions. Another model, setting or machine finds no entry. A model of another
kind (a test table) has no key, and its calls decode cold.

The store's file is `$MOESPEC_STEP_TIMES` when set (empty: no store), else
`$MOESPEC_CACHE/step-times.json` (default `~/.cache/moespec/step-times.json`). An unreadable or
malformed file is ignored with one warning and replaced at the next write; writes are atomic
(`artifacts.dump_json`: a temporary file, then os.replace).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import time
import warnings
import weakref
from collections import deque
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from statistics import median
from typing import Callable

import numpy as np
import torch

from moespec.artifacts import cpu_model, dump_json
from moespec.engine.policy import AutoK

BUDGET_S = 1.0  # the most seconds a timing spends
SHARE = 0.1  # ... and at most this share of a plain call's time, max_new_tokens × τ(1)
SUSPECT = 1.5  # a pass slower than its prediction by this factor is timed once more (the faster kept)
DRAFT_PASSES = 3  # timed one-token passes of a proposer's model (after a warm-up)
STORE_VERSION = 1
MAX_ENTRIES = 64  # keys kept in the store; the least recently written go first
MIN_ROUNDS = 3  # timed rounds of a k, over the calls, before its stored time seeds V(k)
MAX_WEIGHT = 32  # the most rounds a stored time stands for when a call's rounds are averaged in
HEAD_BYTES = 64 * 1024  # bytes of a GGUF file hashed into its key
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


def resolve_mode(warm_start: bool | str | None, policy, step_times) -> str | None:
    """The warm start a `generate` call runs: "store", "timed" or None.

    None for a fixed k, for given step_times, and for an AutoK that is seeded or has timed rounds.
    """
    if warm_start is True:
        mode = "store"
    elif warm_start is False or warm_start is None:
        mode = None
    elif isinstance(warm_start, str) and warm_start in MODES:
        mode = warm_start
    else:
        raise ValueError(f"warm_start must be True (= \"store\"), \"store\", \"timed\" or False, got {warm_start!r}")
    fresh = isinstance(policy, AutoK) and policy.seed is None and not any(policy.timed)
    return mode if fresh and step_times is None and policy.max_k > 0 else None


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


def interpolate(points: dict[int, float], n: int) -> float:
    """τ(n) from the timed sizes: linear between them; beyond the largest, the line through the two
    largest (never below the largest: a longer pass is no faster), or n/m τ(m) with one point m (an
    upper bound for costs that grow no faster than n); below the smallest, the smallest's."""
    if not points:
        raise ValueError("interpolate needs at least one timed size")
    if n in points:
        return points[n]
    sizes = sorted(points)
    if n < sizes[0]:
        return points[sizes[0]]
    if n > sizes[-1]:
        if len(sizes) == 1:
            return points[sizes[0]] * n / sizes[0]
        (m0, t0), (m1, t1) = (sizes[-2], points[sizes[-2]]), (sizes[-1], points[sizes[-1]])
        return max(t1 + (t1 - t0) / (m1 - m0) * (n - m1), t1)
    hi = next(m for m in sizes if m > n)
    lo = max(m for m in sizes if m < n)
    return points[lo] + (points[hi] - points[lo]) * (n - lo) / (hi - lo)


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
    time spent plus its prediction (`interpolate` of the sizes timed so far; a draft step and the
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
            guess = interpolate(tau, n) if tau else warm
            if not fits(guess):
                break
            tau[n] = one(target, n, base, forward_s)
            if tau[n] > SUSPECT * guess and fits(guess):  # a stray slow pass (a page fault, another process)
                tau[n] = min(tau[n], one(target, n, base, forward_s))
    return tau, delta, clock() - t_start - draft_s, draft_s


def seed_from_passes(tau: dict[int, float], delta: float, max_k: int) -> list[float] | None:
    """V(k) = τ(k+1) + k δ for k = 0..max_k, each τ(n) at most n τ(1) (a pass is never slower than the
    one-token passes it could be split into: a slow stray pass must not price drafting out for good);
    None with fewer than two timed sizes."""
    if len(tau) < 2 or 1 not in tau:
        return None
    capped = {n: min(t, n * tau[1]) for n, t in tau.items()}
    return [interpolate(capped, k + 1) + k * delta for k in range(max_k + 1)]


def entry_points(entry: dict, max_k: int) -> dict[int, float]:
    """The k whose stored times seed V(k): plain decoding and each k >= 1 timed in at least
    MIN_ROUNDS rounds over the calls (all its k when none is). A k timed once or twice is left to the
    points around it: one slow round must not price it out of every later call, which would then
    never draft it nor correct it."""
    measured = {int(k): s for k, s in entry["measured"].items() if int(k) <= max_k}
    rounds = {int(k): r for k, r in entry.get("rounds", {}).items()}
    steady = {k: s for k, s in measured.items() if k == 0 or rounds.get(k, MIN_ROUNDS) >= MIN_ROUNDS}
    return steady if len(steady) >= 2 else measured


def seed_from_entry(entry: dict, max_k: int) -> list[float] | None:
    """V(0..max_k) from a store entry's `entry_points`; None unless they hold plain decoding's and a
    k >= 1's. V(0) is plain decoding's. For k >= 1, with two or more drafting points: `interpolate`d
    between them, beyond the largest the line through the two largest, below the smallest the line
    through the two smallest (kept between V(0) and the smallest's time); with one drafting point,
    the line through it and plain decoding's. A one-token pass is another regime: a line from plain
    decoding's spreads the jump to two tokens over every k and underprices short drafts, so it is
    used only when no second drafting point gives the slope (the rule `AutoK`'s own line follows).
    (A flat value beyond the largest, to get longer drafts tried, was measured to lose: at low
    acceptance the policy's probes then draft max_k at its full price, benchmarks/auto_k_warm.py.)"""
    measured = entry_points(entry, max_k)
    drafting = {k: s for k, s in measured.items() if k >= 1}
    if 0 not in measured or not drafting:
        return None
    if len(drafting) == 1:
        return [interpolate(measured, k) for k in range(max_k + 1)]
    (k0, t0), (k1, t1) = sorted(drafting.items())[:2]

    def below(k: int) -> float:
        return min(max(t0 + (t1 - t0) / (k1 - k0) * (k - k0), measured[0]), t0)
    return [measured[0]] + [interpolate(drafting, k) if k >= k0 else below(k) for k in range(1, max_k + 1)]


_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> model_fingerprint


def _fingerprint(module: torch.nn.Module) -> str:
    """`provenance.model_fingerprint`, once per loaded module (it reads every weight)."""
    if module not in _FINGERPRINTS:
        from moespec.provenance import model_fingerprint

        _FINGERPRINTS[module] = model_fingerprint(module)
    return _FINGERPRINTS[module]


@functools.cache
def machine_key() -> dict:
    """The machine's part of a key: CPU model, cores, OS, architecture, torch and llama-cpp-python versions."""
    try:
        llama = metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        llama = None
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "os": platform.system(), "arch": platform.machine(),
            "torch": torch.__version__, "llama_cpp": llama}


def model_key(model) -> dict | None:
    """What a SpecModel's pass times depend on (module docstring); None for a model of another kind."""
    inner = getattr(model, "inner", None)
    if inner is not None:  # a wrapper (backends.exact.ExactPasses) runs other passes than its model
        key = model_key(inner)
        return None if key is None else {**key, "wrapper": type(model).__name__}
    module = getattr(model, "model", None)
    if isinstance(module, torch.nn.Module) and hasattr(module, "config"):
        p = next(module.parameters())
        return {"backend": "torch", "fingerprint": _fingerprint(module), "dtype": str(p.dtype),
                "device": str(p.device), "experts": getattr(module.config, "_experts_implementation", None),
                "linear": sorted({type(m).__name__ for m in module.modules() if isinstance(m, torch.nn.Linear)}),
                "replay": getattr(module, "moespec_replay", None) is not None, "threads": torch.get_num_threads()}
    path = getattr(model, "path", None)
    if path is not None and Path(path).suffix == ".gguf":
        path = Path(path).resolve()
        with open(path, "rb") as f:
            head = hashlib.sha256(f.read(HEAD_BYTES)).hexdigest()[:16]
        st = path.stat()
        return {"backend": "llama.cpp", "gguf": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                "head": head, "threads": getattr(model, "threads", None)}
    return None


def proposer_options(proposer) -> dict:
    """What sets a model-free proposer's drafts, so its remembered acceptance is its own: prompt
    lookup's n-gram size, the oracle's acceptance."""
    if getattr(proposer, "cache", None) is not None:  # a draft model: its key says what drafts
        return {}
    return {name: getattr(proposer, attr) for name, attr in (("n", "n"), ("acceptance", "a")) if hasattr(proposer, attr)}


def run_key(target, proposer) -> dict | None:
    """The store's key of a call: the target's, the proposer's (its kind, model or options) and the
    machine's identity; None when a model has no key."""
    draft = getattr(proposer, "cache", None)
    keys = {"target": model_key(target), "draft": None if draft is None else model_key(draft)}
    if keys["target"] is None or (draft is not None and keys["draft"] is None):
        return None
    return json.loads(json.dumps({**keys, "proposer": type(proposer).__name__, "options": proposer_options(proposer),
                                  "machine": machine_key()}))


def store_path() -> Path | None:
    """The store's file (module docstring), or None when $MOESPEC_STEP_TIMES is set empty."""
    own = os.environ.get("MOESPEC_STEP_TIMES")
    if own is not None:
        return Path(own).expanduser() if own else None
    return Path(os.environ.get("MOESPEC_CACHE", Path.home() / ".cache" / "moespec")) / "step-times.json"


def _digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _seconds(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _acceptances(x) -> bool:
    return x is None or (isinstance(x, list) and len(x) > 0 and all(
        isinstance(a, (int, float)) and not isinstance(a, bool) and 0 <= a <= 1 for a in x))


def _entries(doc) -> dict:
    """The entries of a parsed store; ValueError naming what is off when this version did not write it."""
    if not isinstance(doc, dict) or doc.get("version") != STORE_VERSION or not isinstance(doc.get("entries"), dict):
        raise ValueError(f"not a version-{STORE_VERSION} step-time store")
    for name, e in doc["entries"].items():
        if not (isinstance(e, dict) and isinstance(e.get("key"), dict) and _seconds(e.get("written"))
                and isinstance(e.get("measured"), dict)
                and all(k.isdigit() and _seconds(s) for k, s in e["measured"].items())
                and _acceptances(e.get("acceptance"))
                and all(k.isdigit() and isinstance(r, int) and r >= 1 for k, r in e.get("rounds", {}).items())):
            raise ValueError(f"entry {name} is malformed")
    return doc["entries"]


def read_store(path: Path, *, warn: bool = True) -> dict:
    """The store's entries ({} when there is no file); an unreadable or malformed file reads as {},
    with a warning when `warn`."""
    try:
        return _entries(json.loads(path.read_text()))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:  # JSON and Unicode decoding errors are ValueErrors
        if warn:
            warnings.warn(f"ignoring the step-time store {path} ({e}); the next k=\"auto\" call replaces it",
                          stacklevel=5)  # generate's caller: read_store < prepare < _decode < generate
        return {}


def prepare(mode: str, *, target, proposer, context: torch.Tensor, max_k: int, max_new_tokens: int,
            key: dict | None = None, clock: Callable[[], float] = time.perf_counter, budget_s: float = BUDGET_S,
            share: float = SHARE) -> WarmStart:
    """The seed of a k="auto" call, right after its prefill (module docstring): mode "store", the
    store's entry for `key` (from `run_key`; None: no store) or none; mode "timed", a timing.

    target: the SpecModel; proposer: the call's Proposer; context: [L] int64 the committed tokens.
    """
    t0 = clock()
    if mode == "store":  # an entry seeds; a miss, or no store, decodes cold and its rounds fill the entry
        path = store_path() if key is not None else None
        entry = read_store(path).get(_digest(key)) if path is not None else None
        hit = entry is not None and entry["key"] == key
        V = seed_from_entry(entry, max_k) if hit else None
        alpha = tuple(entry["acceptance"]) if hit and V is not None and entry.get("acceptance") else None
        anchors = tuple(sorted(entry_points(entry, max_k))) if V is not None else None
        return WarmStart(mode, None if V is None else "store", None if V is None else tuple(V), clock() - t0,
                         key=key if path is not None else None, acceptance=alpha, anchors=anchors)
    tau, delta, target_s, draft_s = time_passes(target, getattr(proposer, "cache", None), context, max_k,
                                                max_new_tokens, clock=clock, budget_s=budget_s, share=share)
    V = None if delta is None else seed_from_passes(tau, delta, max_k)
    return WarmStart(mode, None if V is None else "timed", None if V is None else tuple(V), clock() - t0,
                     target_s, draft_s, tau, delta)


def remember(warm: WarmStart, measured: dict[int, float], acceptance: list[float] | None = None,
             rounds: dict[int, int] | None = None) -> None:
    """Write a call's medians ({k: seconds}, `AutoK.measured`, from `rounds[k]` timed rounds each)
    and, when it drafted, its acceptance by position α_1.. into the store entry of `warm.key`,
    atomically: a k's stored time becomes the mean of the stored one and the call's, weighted by
    their rounds (the stored ones counting at most MAX_WEIGHT, so a changed machine state is
    followed). A store that cannot be written warns and decoding goes on."""
    path = store_path()
    if warm.key is None or path is None or not measured:
        return
    entries, name = read_store(path, warn=False), _digest(warm.key)
    entry = entries.get(name)
    if entry is None or entry["key"] != warm.key:
        entry = {"key": warm.key, "measured": {}}
    stored, counts = entry["measured"], entry.setdefault("rounds", {})
    for k, s in measured.items():
        new = max(1, (rounds or {}).get(k, 1))
        old = min(counts.get(str(k), MIN_ROUNDS if str(k) in stored else 0), MAX_WEIGHT)
        stored[str(k)] = (stored.get(str(k), 0.0) * old + float(s) * new) / (old + new)
        counts[str(k)] = old + new
    if acceptance:
        entry["acceptance"] = [float(a) for a in acceptance]
    entry["written"] = time.time()
    entries[name] = entry
    kept = sorted(entries, key=lambda n: entries[n]["written"], reverse=True)[:MAX_ENTRIES]
    try:
        dump_json(path, {"version": STORE_VERSION, "entries": {n: entries[n] for n in kept}})
    except OSError as e:
        warnings.warn(f"could not write the step-time store {path} ({e}); set MOESPEC_STEP_TIMES to a writable "
                      f"file, or to nothing to turn the store off", stacklevel=4)  # generate's caller
