"""The warm start's store: step times and acceptance that earlier k="auto" calls measured, on disk.

One JSON file holds an entry per key. A key is the target's identity, the proposer's (its kind,
options and model) and the machine's; each implementation states its own (`SpecModel.identity`,
`Proposer.identity`; None: no key, the call decodes cold), the machine's part is `machine_key`: CPU
model, core count, OS and architecture, the torch and llama-cpp-python versions. Another model,
setting or machine finds no entry.

An entry keeps, per k, the mean of the medians its calls timed (`Learned.step_s`), weighted by their
rounds, the stored time standing for at most MAX_WEIGHT rounds (so a changed machine state is
followed), and the rounds behind it; and α_1..α_max_k of the last call that drafted. A seed
(`recall`) takes plain decoding's time and each k >= 1 timed in at least MIN_ROUNDS rounds over the
calls (`entry_points`), V(k) elsewhere by `policy.interpolate_step_times`; the k it took are its
anchors. The MAX_ENTRIES most recently written keys are kept.

The file is `$MOESPEC_STEP_TIMES` when set (empty: no store), else `$MOESPEC_CACHE/step-times.json`
(default `~/.cache/moespec/step-times.json`). An unreadable file, or one this version did not write,
is ignored with one warning and replaced at the next write; a malformed entry is dropped alone, with a
warning naming it, and the rest kept. A write holds the store's lock (`locking.exclusive`) from its
read to its atomic replace (`artifacts.dump_json`: a temporary file, then os.replace), so concurrent
calls lose no entry.
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
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from moespec.artifacts import cpu_model, dump_json
from moespec.cache import cache_dir
from moespec.locking import exclusive
from moespec.engine.policy import Learned, interpolate_step_times

STORE_VERSION = 1
MAX_ENTRIES = 64  # keys kept in the store; the least recently written go first
MIN_ROUNDS = 3  # timed rounds of a k, over the calls, before its stored time seeds V(k)
MAX_WEIGHT = 32  # the most rounds a stored time stands for when a call's rounds are averaged in


@dataclass(frozen=True)
class Stored:
    """A store entry as a seed: what `recall` gives the policy's `start`."""

    V: tuple[float, ...]  # [max_k + 1] V(0..max_k), seconds
    anchors: tuple[int, ...]  # the k of V that are stored times (`entry_points`); the rest filled in
    acceptance: tuple[float, ...] | None  # α_1.. of the last call that drafted


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def machine_key() -> dict:
    """The machine's part of a key: CPU model, cores, OS, architecture, torch and llama-cpp-python versions."""
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "os": platform.system(), "arch": platform.machine(),
            "torch": _version("torch"), "llama_cpp": _version("llama-cpp-python")}


def store_path() -> Path | None:
    """The store's file (module docstring), or None when $MOESPEC_STEP_TIMES is set empty."""
    own = os.environ.get("MOESPEC_STEP_TIMES")
    if own is not None:
        return Path(own).expanduser() if own else None
    return cache_dir() / "step-times.json"


def stated(obj) -> dict | None:
    """What `obj.identity()` states; None for an object without one (a batch model need not state it)."""
    identity = getattr(obj, "identity", None)
    return None if identity is None else identity()


def store_key(target, proposer) -> dict | None:
    """The key of a call (module docstring) as JSON values; None when the store is off or the target
    or the proposer states no identity. A torch model's identity hashes its weights (once per module)."""
    if store_path() is None:
        return None
    model, drafter = stated(target), stated(proposer)
    if model is None or drafter is None:
        return None
    return json.loads(json.dumps({"target": model, **drafter, "machine": machine_key()}))


def _digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _seconds(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _acceptances(x) -> bool:
    return x is None or (isinstance(x, list) and len(x) > 0 and all(
        isinstance(a, (int, float)) and not isinstance(a, bool) and 0 <= a <= 1 for a in x))


def _well_formed(e) -> bool:
    return (isinstance(e, dict) and isinstance(e.get("key"), dict) and _seconds(e.get("written"))
            and isinstance(e.get("measured"), dict)
            and all(isinstance(k, str) and k.isdigit() and _seconds(s) for k, s in e["measured"].items())
            and _acceptances(e.get("acceptance"))
            and isinstance(e.get("rounds", {}), dict)
            and all(isinstance(k, str) and k.isdigit() and isinstance(r, int) and not isinstance(r, bool) and r >= 1
                    for k, r in e.get("rounds", {}).items()))


def _entries(doc, path: Path, warn: bool) -> dict:
    """The well-formed entries of a parsed store; a malformed entry is dropped alone (a warning names
    it); ValueError when this version did not write the file."""
    if not isinstance(doc, dict) or doc.get("version") != STORE_VERSION or not isinstance(doc.get("entries"), dict):
        raise ValueError(f"not a version-{STORE_VERSION} step-time store")
    bad = [name for name, e in doc["entries"].items() if not _well_formed(e)]
    if bad and warn:
        warnings.warn(f"dropping {len(bad)} malformed entr{'y' if len(bad) == 1 else 'ies'} of the step-time store "
                      f"{path} ({', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}); the other "
                      f"{len(doc['entries']) - len(bad)} are kept", stacklevel=7)
    return {name: e for name, e in doc["entries"].items() if name not in bad}


def read_store(path: Path, *, warn: bool = True) -> dict:
    """The store's entries ({} when there is no file); an unreadable or malformed file reads as {},
    with a warning when `warn`."""
    try:
        return _entries(json.loads(path.read_text()), path, warn)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:  # JSON and Unicode decoding errors are ValueErrors
        if warn:
            warnings.warn(f"ignoring the step-time store {path} ({e}); the next k=\"auto\" call replaces it",
                          stacklevel=6)  # generate's caller: read_store < recall < prepare < _decode < generate
        return {}


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
    """V(0..max_k) from a store entry: `interpolate_step_times` of its `entry_points`; None unless
    they hold plain decoding's and a k >= 1's. (A flat value beyond the largest, to get longer
    drafts tried, was measured to lose: at low acceptance the policy's probes then draft max_k at
    its full price, benchmarks/auto_k_warm.py.)"""
    return interpolate_step_times(entry_points(entry, max_k), max_k)


def recall(key: dict, max_k: int) -> Stored | None:
    """The seed the store holds for `key` (from `store_key`), or None: no store, no entry, or one
    without plain decoding's and a drafting time. A malformed store warns once here."""
    path = store_path()
    entry = read_store(path).get(_digest(key)) if path is not None else None
    if entry is None or entry["key"] != key:
        return None
    V = seed_from_entry(entry, max_k)
    if V is None:
        return None
    acceptance = tuple(entry["acceptance"]) if entry.get("acceptance") else None
    return Stored(tuple(V), tuple(sorted(entry_points(entry, max_k))), acceptance)


def lookup(keys: Mapping[Hashable, dict]) -> dict[Hashable, dict]:
    """{label: the store's entry} for each (label, key) of `keys` that has one, in one read of the
    store ({} without a store). A malformed store warns once here."""
    path = store_path()
    entries = read_store(path) if path is not None and keys else {}
    found = {label: entries.get(_digest(key)) for label, key in keys.items()}
    return {label: e for label, e in found.items() if e is not None and e["key"] == keys[label]}


def remember(key: dict, learned: Learned | None) -> None:
    """Write a call's medians (`Learned.step_s`, from `Learned.rounds` timed rounds each) and, when
    it drafted, its acceptance by position α_1.. into the entry of `key`, atomically: a k's stored
    time becomes the mean of the stored one and the call's, weighted by their rounds (the stored
    ones counting at most MAX_WEIGHT, so a changed machine state is followed). A store that cannot
    be written warns and decoding goes on."""
    remember_all([(key, learned)], stacklevel=5)


def remember_all(learned: Sequence[tuple[dict, Learned | None]], *, stacklevel: int = 4) -> None:
    """`remember` of several (key, Learned) at once (a batch's sizes), under one hold of the store's
    lock: one read and one atomic replace."""
    path = store_path()
    learned = [(key, got) for key, got in learned if got is not None and got.step_s]
    if path is None or not learned:
        return
    try:
        with exclusive(path):  # read, edit and replace as one step: a concurrent call's entry is not lost
            entries = read_store(path, warn=False)
            for key, got in learned:
                entries[_digest(key)] = _updated(entries.get(_digest(key)), key, got)
            kept = sorted(entries, key=lambda n: entries[n]["written"], reverse=True)[:MAX_ENTRIES]
            dump_json(path, {"version": STORE_VERSION, "entries": {n: entries[n] for n in kept}}, compact=True)
    except OSError as e:
        warnings.warn(f"could not write the step-time store {path} ({e}); set MOESPEC_STEP_TIMES to a writable "
                      f"file, or to nothing to turn the store off", stacklevel=stacklevel)  # the decode's caller


def _updated(entry: dict | None, key: dict, learned: Learned) -> dict:
    """`entry` (None: a new one) with a call's medians averaged in, by rounds (`remember`)."""
    if entry is None or entry["key"] != key:
        entry = {"key": key, "measured": {}}
    stored, counts = entry["measured"], entry.setdefault("rounds", {})
    for k, s in learned.step_s.items():
        new = max(1, learned.rounds.get(k, 1))
        old = min(counts.get(str(k), MIN_ROUNDS if str(k) in stored else 0), MAX_WEIGHT)
        stored[str(k)] = (stored.get(str(k), 0.0) * old + float(s) * new) / (old + new)
        counts[str(k)] = old + new
    if learned.acceptance:
        entry["acceptance"] = [float(a) for a in learned.acceptance]
    entry["written"] = time.time()
    return entry
