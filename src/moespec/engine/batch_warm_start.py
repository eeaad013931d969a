"""Warm start of a batch's k="auto" (`engine.batch.generate_batch`): the `AutoK` of each live count B
is seeded before its first round from what the step-time store (`engine.step_store`) and the call
itself know, so that no live count opens by probing a long k where drafting does not pay.

The store keeps one entry per live count: the key of `step_store.store_key` (target, proposer,
machine) with "batch": B. A call reads every size's entry at once, at its first round, and at its
end writes what each live count's policy measured into that count's entry (`step_store.remember_all`:
one hold of the store's lock, one atomic replace).

The seed of live count B, given when the batch first runs at B sequences:
- acceptance α_1..: a sequence's, whatever B (each sequence runs its own accept walk): that of this
  call's latest policy that tested a position, else B's own entry's, else the most recently written
  entry's of another size.
- step times V_B(0..max_k): B's own entry's (`step_store.seed_from_entry`, with its anchors) when it
  holds plain decoding's time and a drafting one. Otherwise, from the sizes known (this call's
  policies' estimates first, then the store's entries), with B' the nearest known size that has a
  drafting time (|log B/B'| smallest, the larger on a tie), the assumption is that a round drafting
  k costs the same multiple of a plain round at B as at B':
      V_B(k) = V_B(0) · V_B'(k) / V_B'(0),
  with V_B(0) B's own plain time where one is known, else linear in B between the nearest known
  plain times below and above it, else the nearest one's. AutoK's own timed rounds rescale the seed
  (`policy.AutoK`), so the ratio is what carries over. (Read at the same pass size n = B(k+1)
  instead, B = 1's one-draft round would be priced as B' = 2's plain round, which runs no draft
  step: drafting underpriced at exactly the live counts a batch shrinks to.)
- nothing known: the policy opens cold (`policy.AutoK`'s opening), and its rounds fill the entry.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from moespec.engine.policy import Policy
from moespec.engine.step_store import entry_points, lookup, remember_all, seed_from_entry

SAME_PLAIN = 0.02  # a call that only decoded plainly within this share of the stored plain time writes nothing

MODES = ("store",)


@dataclass(frozen=True)
class Known:
    """What is known of one batch size: V(0..max_k) (None: plain decoding's time alone), its plain
    time, the anchors of V (None: every k's value gives the shape), α_1.., when it was written."""

    V: tuple[float, ...] | None
    plain: float | None
    anchors: tuple[int, ...] | None
    acceptance: tuple[float, ...] | None
    written: float


@dataclass(frozen=True)
class SizeSeed:
    """The seed one live count's policy started from."""

    source: str | None  # "store": B's own entry; "sizes": other sizes' (from_size); None: cold
    V: tuple[float, ...] | None  # [max_k + 1] V_B(0..max_k)
    anchors: tuple[int, ...] | None
    acceptance: tuple[float, ...] | None  # α_1..
    from_size: int | None = None  # B', whose V_B'(k)/V_B'(0) it took

    def to_dict(self) -> dict:
        return {n: list(v) if isinstance(v, tuple) else v for n, v in asdict(self).items()}


def batch_key(key: dict, B: int) -> dict:
    """The store's key of live count B: the pair's key (`step_store.store_key`) with "batch": B."""
    return {**key, "batch": B}


def resolve_batch_mode(warm_start: bool | str | None) -> str | None:
    """The warm start a `generate_batch` call runs: "store" (True) or None (False)."""
    if warm_start is True or warm_start in MODES:
        return "store"
    if warm_start is False or warm_start is None:
        return None
    raise ValueError(f"generate_batch's warm_start must be True (= \"store\") or False, got {warm_start!r} "
                     f"(a timed warm start is generate's alone)")


def known_from_entry(entry: dict, max_k: int) -> Known:
    """A store entry as what is known of its size."""
    V = seed_from_entry(entry, max_k)
    acceptance = tuple(entry["acceptance"]) if entry.get("acceptance") else None
    return Known(None if V is None else tuple(V), entry["measured"].get("0"),
                 None if V is None else tuple(sorted(entry_points(entry, max_k))), acceptance, entry["written"])


def plain_time(B: int, plains: Mapping[int, float]) -> float:
    """V_B(0) from the known plain times: B's own, else linear in B between the nearest below and
    above, else the nearest one's. plains: non-empty {B': V_B'(0)}."""
    if B in plains:
        return plains[B]
    below = max((b for b in plains if b < B), default=None)
    above = min((b for b in plains if b > B), default=None)
    if below is None or above is None:
        return plains[above if below is None else below]
    return plains[below] + (plains[above] - plains[below]) * (B - below) / (above - below)


def size_seed(B: int, known: Mapping[int, Known], acceptance_now: tuple[float, ...] | None) -> SizeSeed:
    """The seed of live count B from what is known of each size (module docstring) and the
    acceptance this call measured so far (None: none)."""
    own = known.get(B)
    latest = max((kn for kn in known.values() if kn.acceptance), key=lambda kn: kn.written, default=None)
    acceptance = acceptance_now or (own.acceptance if own is not None else None) or (latest and latest.acceptance)
    if own is not None and own.V is not None:
        return SizeSeed("store", own.V, own.anchors, acceptance)
    shaped = [b for b, kn in known.items() if kn.V is not None]
    if not shaped:
        return SizeSeed(None, None, None, acceptance)
    near = min(shaped, key=lambda b: (abs(math.log(B / b)), -b))
    V = known[near].V
    plain = plain_time(B, {b: kn.plain for b, kn in known.items() if kn.plain is not None})
    return SizeSeed("sizes", tuple(plain * v / V[0] for v in V), None, acceptance, near)


class BatchWarmStart:
    """The store's entries of one call's pair at every live count (read at the first seed), the
    seed each live count got, and the write-back of what each measured."""

    def __init__(self, key: dict, sizes: Iterable[int], max_k: int):
        self.key, self.sizes, self.max_k = key, tuple(sizes), max_k
        self.stored: dict[int, Known] | None = None
        self.seeds: dict[int, SizeSeed] = {}

    def seed(self, B: int, policies: Mapping[int, Policy]) -> SizeSeed:
        """The seed of live count B, from the store and this call's policies (in the order they
        started: the latest's acceptance wins)."""
        if self.stored is None:
            found = lookup({b: batch_key(self.key, b) for b in self.sizes})
            self.stored = {b: known_from_entry(e, self.max_k) for b, e in found.items()}
        known, acceptance = dict(self.stored), None
        for b, policy in policies.items():
            V = policy.state().get("step_s")
            if V:  # this call's estimate of V_b; the acceptance the store held for b stays (a sequence's)
                stored = known.get(b)
                known[b] = Known(tuple(V), V[0], None, stored and stored.acceptance, stored.written if stored else 0.0)
            learned = policy.learned()
            if learned is not None and learned.acceptance:
                acceptance = learned.acceptance
        self.seeds[B] = size_seed(B, known, acceptance)
        return self.seeds[B]

    def remember(self, policies: Mapping[int, Policy]) -> None:
        """Each warm-started live count's measured medians and acceptance into its entry, at once; a
        count whose call only decoded plainly, within SAME_PLAIN of the plain time the store held, is
        left out, and with none left the store is not written (its write, ~1 ms, was 2% of a 64-token
        call of the trained pair)."""
        learned = [(B, p.learned()) for B, p in policies.items() if B in self.seeds]
        remember_all([(batch_key(self.key, B), got) for B, got in learned if not self._nothing_new(B, got)],
                     stacklevel=6)  # generate_batch's caller

    def _nothing_new(self, B: int, got) -> bool:
        """Whether live count B's call timed plain rounds only, tested no draft, and its plain time is within
        SAME_PLAIN of the store's."""
        stored = (self.stored or {}).get(B)
        if got is None or got.acceptance is not None or set(got.step_s) != {0} or stored is None or not stored.plain:
            return False
        return abs(got.step_s[0] / stored.plain - 1) <= SAME_PLAIN

    def state(self) -> dict:
        return {str(B): s.to_dict() for B, s in sorted(self.seeds.items())}
