"""Per-round statistics of one generation, the log that counts them, and the result `generate` returns.

Acceptance follows the engine paper (Sec. 5, Metrics): pooled acceptance is accepted draft tokens
over drafted tokens; acceptance at position i is the same ratio restricted to draft position i.
Because the accept walk stops at the first rejection, position i is only *reached* when drafts
1..i-1 were accepted; accepted/reached at i is the conditional rate, and pooled over positions it
is the maximum-likelihood estimate of a in the geometric model of the cost-model paper (Sec. 4),
`geometric_acceptance`.

Times are seconds of wall clock, read after a device synchronize: `draft_s` (proposing), `verify_s`
(the target's pass, prefill included), `sampling_s` (the accept/resample walk), `other_s` (the rest:
bookkeeping, cache truncation). `forward_s` is the time inside the two models' forward passes alone.
`round_s` times each round from its proposal to the end of its bookkeeping; the prefill is in none.
The first round differs from the rest: the prefill already gave its first row, so its pass has k
tokens, not k + 1 (none at k = 0). The step time V(k) of the cost model is the later rounds'.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from moespec.engine.round import Round


@dataclass(frozen=True)
class Stats:
    """Figures of one `generate` call. Tuples indexed by draft position have length k (max_k for k="auto")."""

    k: int
    prompt_tokens: int
    new_tokens: int
    stop_reason: str  # "max_new_tokens", "eos" or "max_steps"
    tokens_per_round: tuple[int, ...]  # tokens committed by each round, [rounds]
    round_s: tuple[float, ...]  # wall time of each round, proposing to bookkeeping, [rounds]
    drafted_by_position: tuple[int, ...]  # [k] drafts proposed at position i
    reached_by_position: tuple[int, ...]  # [k] drafts at position i that the walk tested
    accepted_by_position: tuple[int, ...]  # [k] drafts at position i that were accepted
    total_s: float
    ttft_s: float
    draft_s: float
    verify_s: float
    sampling_s: float
    target_forward_s: float
    draft_forward_s: float
    peak_rss_bytes: int
    k_per_round: tuple[int, ...] = ()  # [rounds] the draft length the policy chose (the budget may cap it)
    policy: dict = field(default_factory=dict)  # the policy and, for k="auto", its estimates at the end

    @property
    def rounds(self) -> int:
        return len(self.tokens_per_round)

    @property
    def other_s(self) -> float:
        return max(0.0, self.total_s - self.draft_s - self.verify_s - self.sampling_s)

    @property
    def forward_s(self) -> float:
        return self.target_forward_s + self.draft_forward_s

    @property
    def overhead_share(self) -> float:
        """Share of wall time spent outside the target's and the draft's forward passes."""
        return 1.0 - self.forward_s / self.total_s if self.total_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def mean_tokens_per_round(self) -> float:
        return sum(self.tokens_per_round) / self.rounds if self.rounds else 0.0

    @property
    def drafted(self) -> int:
        return sum(self.drafted_by_position)

    @property
    def accepted(self) -> int:
        return sum(self.accepted_by_position)

    @property
    def acceptance(self) -> float:
        """Pooled acceptance: accepted drafts / drafted tokens (nan when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def acceptance_by_position(self) -> tuple[float, ...]:
        return tuple(a / d if d else float("nan") for a, d in zip(self.accepted_by_position, self.drafted_by_position))

    @property
    def conditional_acceptance_by_position(self) -> tuple[float, ...]:
        return tuple(a / r if r else float("nan") for a, r in zip(self.accepted_by_position, self.reached_by_position))

    @property
    def geometric_acceptance(self) -> float:
        """Realized a: accepted drafts / tested drafts, the MLE of a geometric acceptance rate."""
        reached = sum(self.reached_by_position)
        return self.accepted / reached if reached else float("nan")

    def latency_split_ms(self) -> dict[str, float]:
        """Milliseconds per generated token: draft, verify, sampling, other."""
        n = max(self.new_tokens, 1)
        return {
            "draft": 1e3 * self.draft_s / n,
            "verify": 1e3 * self.verify_s / n,
            "sampling": 1e3 * self.sampling_s / n,
            "other": 1e3 * self.other_s / n,
        }

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            rounds=self.rounds,
            other_s=self.other_s,
            tokens_per_s=self.tokens_per_s,
            mean_tokens_per_round=self.mean_tokens_per_round,
            acceptance=self.acceptance,
            acceptance_by_position=list(self.acceptance_by_position),
            geometric_acceptance=self.geometric_acceptance,
            overhead_share=self.overhead_share,
        )
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict) -> "Stats":
        names = {f.name for f in fields(cls)} & d.keys()
        missing = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING} - names
        if missing:
            raise ValueError(f"Stats.from_dict: missing keys {sorted(missing)}")
        return cls(**{n: tuple(d[n]) if isinstance(d[n], list) else d[n] for n in names})


@dataclass(frozen=True)
class BatchStats:
    """The figures of a batched call (`engine.batch.generate_batch`) over all its sequences.

    live_per_round: the sequences each round's pass verified, [rounds]; k_per_round: the round's draft
    length, one for the batch; round_s: each round's wall time, pass_s the time of its target pass
    within it (round_s - pass_s: the step's time outside the pass, h); new_tokens: every sequence's."""

    sequences: int
    new_tokens: int
    total_s: float
    k_per_round: tuple[int, ...]
    live_per_round: tuple[int, ...]
    round_s: tuple[float, ...]
    policy: dict = field(default_factory=dict)
    pass_s: tuple[float, ...] = ()

    @property
    def rounds(self) -> int:
        return len(self.round_s)

    @property
    def tokens_per_s(self) -> float:
        """Every sequence's new tokens over the call's wall time: the batch's throughput."""
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "rounds": self.rounds, "tokens_per_s": self.tokens_per_s}

    @classmethod
    def from_dict(cls, d: dict) -> "BatchStats":
        names = {f.name for f in fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class GenerationResult:
    """The new tokens (prompt excluded, EOS included when it stopped the run) and their statistics;
    `batch` holds the batch's figures when the sequence was decoded in one (shared by all of them)."""

    tokens: list[int]
    stats: Stats
    batch: BatchStats | None = None

    def to_dict(self) -> dict:
        return {"tokens": list(self.tokens), "stats": self.stats.to_dict(),
                **({"batch": self.batch.to_dict()} if self.batch is not None else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "GenerationResult":
        return cls(tokens=list(d["tokens"]), stats=Stats.from_dict(d["stats"]),
                   batch=BatchStats.from_dict(d["batch"]) if d.get("batch") else None)


class RoundLog:
    """The counters of one call, round by round; `stats` makes its `Stats`.

    start: the clock's reading when the call's clock started (after the prefill's synchronize); the
    first round's end gives the TTFT. `add_passes` counts time outside the rounds (the prefill, a
    warm start) as verify or draft time.
    """

    def __init__(self, max_k: int, start: float):
        self.max_k, self.start = max_k, start
        self.drafted = [0] * max_k  # [max_k] drafts proposed at position i
        self.reached = [0] * max_k  # [max_k] drafts at position i that the walk tested
        self.accepted = [0] * max_k  # [max_k] drafts at position i that were accepted
        self.tokens_per_round: list[int] = []  # [rounds]
        self.k_per_round: list[int] = []  # [rounds] the policy's choice
        self.round_s: list[float] = []  # [rounds]
        self.draft_s = self.verify_s = self.sampling_s = self.ttft_s = 0.0

    @property
    def rounds(self) -> int:
        return len(self.tokens_per_round)

    def add_passes(self, *, verify_s: float = 0.0, draft_s: float = 0.0) -> None:
        self.verify_s += verify_s
        self.draft_s += draft_s

    def add(self, r: Round, now: float) -> None:
        """Count round r, which ended at clock reading `now`."""
        for i in range(r.drafted):
            self.drafted[i] += 1
        for i in range(r.tested):
            self.reached[i] += 1
        for i in range(r.accepted):
            self.accepted[i] += 1
        self.tokens_per_round.append(r.new_tokens)
        self.k_per_round.append(r.chosen)
        self.round_s.append(r.seconds)
        self.add_passes(verify_s=r.verify_s, draft_s=r.draft_s)
        self.sampling_s += r.sampling_s
        if self.rounds == 1:
            self.ttft_s = now - self.start

    def stats(self, *, prompt_tokens: int, stop_reason: str, total_s: float, target_forward_s: float,
              draft_forward_s: float, peak_rss_bytes: int, policy: dict) -> Stats:
        return Stats(
            k=self.max_k, prompt_tokens=prompt_tokens, new_tokens=sum(self.tokens_per_round),
            stop_reason=stop_reason, tokens_per_round=tuple(self.tokens_per_round), round_s=tuple(self.round_s),
            drafted_by_position=tuple(self.drafted), reached_by_position=tuple(self.reached),
            accepted_by_position=tuple(self.accepted), total_s=total_s, ttft_s=self.ttft_s, draft_s=self.draft_s,
            verify_s=self.verify_s, sampling_s=self.sampling_s, target_forward_s=target_forward_s,
            draft_forward_s=draft_forward_s, peak_rss_bytes=peak_rss_bytes, k_per_round=tuple(self.k_per_round),
            policy=policy,
        )
