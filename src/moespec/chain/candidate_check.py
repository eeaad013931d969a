"""The candidates checked on the held-out half, and the answer scored (issue 50, "Checked on the held-out half").

`check_heldout` decodes each candidate in moespec's engine at every fixed k = 0..kmax (k = 0 is
plain decoding, the baseline) on the held-out prompts, which the calibration never read: the
score is out of sample by construction. Each prompt is prefilled once (`bench.prefilled.
PrefilledTarget`) so a run's time is its decoding; that time is the engine's own clock
(`Stats.total_s`), summarized per (k, prompt) as a `bench.timing.Timing` (its median over reps).
`score_candidates` sets each prediction (`chain.candidate_answer`) beside its check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from moespec.bench.prefilled import PrefilledTarget
from moespec.bench.timing import Timing
from moespec.chain.candidate_answer import CandidatePrediction, answer_for
from moespec.chain.candidates import Candidate, LoadedCandidate, load_candidate, prompt_ids
from moespec.engine.decode import generate
from moespec.engine.proposers import DraftModel
from moespec.texts import vocab_limit

NAMED_BEST_SLACK = 0.02  # the named candidate may measure up to 2% below the measured best (issue 50)
LOSS_FLOOR_LEVEL, LOSS_FLOOR_RESAMPLES = 0.95, 1000  # the check's loss floor: its quantile and resamples


class PrefilledDraft(DraftModel):
    """A draft model fed the prompt in `begin`, outside `generate`'s clock: the check times decoding,
    and the target's prefill is left out too (`PrefilledTarget`); a draft's prefill is once per request."""

    def begin(self, *, target, prompt, max_new_tokens: int, sampler) -> None:
        super().begin(target=target, prompt=prompt, max_new_tokens=max_new_tokens, sampler=sampler)
        if prompt.shape[0] > 1:
            self.cache.extend(prompt[:-1], outputs=1)


def untimed_prefill(proposer):
    """The proposer, with a draft model's prompt fed before the clock starts (`PrefilledDraft`)."""
    return PrefilledDraft(proposer.cache) if type(proposer) is DraftModel else proposer


@dataclass(frozen=True)
class HeldoutCheck:
    """One candidate at every fixed k = 0..kmax on the held-out prompts.

    tokens: [kmax + 1] new tokens over all prompts; seconds: [kmax + 1] the sum over prompts of each
    prompt's median decode time over `reps`; throughput = tokens / seconds; rounds: [kmax + 1] the
    rounds those tokens took (one rep; () in a check from before they were kept), so tokens/rounds is
    the held-out E(k), beside the calibration's (where a miss came from: the acceptance or the time);
    samples: [kmax + 1][prompts][reps] every repetition's seconds (() before they were kept), which
    `loss_floor` resamples."""

    candidate: Candidate
    tokens: tuple[int, ...]
    seconds: tuple[float, ...]
    prompts: int
    reps: int
    new_tokens: int
    rounds: tuple[int, ...] = ()
    samples: tuple = ()

    @property
    def tokens_per_round(self) -> tuple[float, ...]:
        """[kmax + 1] the held-out E(k): tokens per round at each k (() without rounds)."""
        return tuple(n / r for n, r in zip(self.tokens, self.rounds))

    @property
    def throughput(self) -> tuple[float, ...]:
        return tuple(n / s for n, s in zip(self.tokens, self.seconds))

    @property
    def speedup(self) -> tuple[float, ...]:
        """[kmax + 1] measured throughput at k over plain decoding's (k = 0)."""
        return tuple(t / self.throughput[0] for t in self.throughput)

    @property
    def best_k(self) -> int:
        """The measured best fixed k (the smallest on a tie)."""
        s = self.speedup
        return s.index(max(s))

    @property
    def best_speedup(self) -> float:
        return self.speedup[self.best_k]

    def loss_floor(self, level: float = LOSS_FLOOR_LEVEL, resamples: int = LOSS_FLOOR_RESAMPLES,
                   seed: int = 0) -> float | None:
        """What the check's own noise charges an exact answer: the `level` quantile, over bootstrap
        resamples of the repetitions (each (k, prompt)'s drawn with replacement, its median taken), of
        the throughput the measured best k loses against the resample's best, 1 - T_b(k_best)/max_k T_b(k)
        (the chain's loss floor, `costmodel.score.sweep_intervals`, on this check). None without samples."""
        if not self.samples:
            return None
        rng = np.random.default_rng(seed)
        times = [[np.asarray(reps, dtype=float) for reps in by_prompt] for by_prompt in self.samples]
        floor = []
        for _ in range(resamples):
            seconds = [sum(np.median(rng.choice(r, r.size)) for r in by_prompt) for by_prompt in times]
            T = np.asarray(self.tokens, dtype=float) / np.asarray(seconds)
            floor.append(1 - T[self.best_k] / T.max())
        return float(np.quantile(floor, level))

    def to_dict(self) -> dict:
        return {"candidate": self.candidate.to_dict(), "tokens": list(self.tokens), "seconds": list(self.seconds),
                "prompts": self.prompts, "reps": self.reps, "new_tokens": self.new_tokens,
                "throughput": list(self.throughput), "speedup": list(self.speedup), "best_k": self.best_k,
                "rounds": list(self.rounds), "tokens_per_round": list(self.tokens_per_round), "half": "held-out",
                "samples": [[list(r) for r in by_prompt] for by_prompt in self.samples]}

    @classmethod
    def from_dict(cls, d: dict) -> "HeldoutCheck":
        samples = tuple(tuple(tuple(r) for r in by_prompt) for by_prompt in d.get("samples", ()))
        return cls(Candidate.from_dict(d["candidate"]), tuple(d["tokens"]), tuple(d["seconds"]), d["prompts"],
                   d["reps"], d["new_tokens"], tuple(d.get("rounds", ())), samples)


MAX_CHECK_REPS = 15  # the most repetitions `check_reps` asks for


def check_reps(reps: int, plain_s: float, min_seconds: float) -> int:
    """Repetitions of the check: `reps`, or as many as make plain decoding of the prompts (plain_s seconds
    a repetition) last min_seconds in all, at most MAX_CHECK_REPS. A fast model's 48 tokens last tens of
    milliseconds a prompt, and three repetitions of those moved the measured best k between runs."""
    if min_seconds <= 0 or plain_s <= 0:
        return reps
    return max(reps, min(MAX_CHECK_REPS, math.ceil(min_seconds / plain_s)))


def check_heldout(target, tokenizer, candidate: Candidate | LoadedCandidate, prompts: Sequence, *, kmax: int,
                  new_tokens: int, reps: int = 3, seed: int = 0, warmup: int = 1, temperature: float = 0.0,
                  top_p: float | None = None, load: Callable[[str], tuple] | None = None,
                  min_seconds: float = 0.0) -> HeldoutCheck:
    """Measured tokens/s of the candidate at k = 0..kmax on the held-out `prompts` (ids, texts or chats),
    greedy unless `temperature` (and `top_p`) sample as the calibration did. At least `reps` repetitions,
    more where plain decoding of the prompts would last less than `min_seconds` in all (`check_reps`).

    Every run has a fresh proposer (an n-gram pool of its prompt alone, as the calibration's and as
    llama-speculative-simple starts each prompt, `chain.candidate_llama`). A repetition runs every k on one
    prompt before the next prompt, ascending in even reps and descending in odd ones: the runs a speedup
    compares lie seconds apart, and drift on a shared machine spreads over every k. `warmup` untimed
    passes over the first prompt at each k come first. Neither model's prefill is timed (`PrefilledTarget`,
    `PrefilledDraft`). The target holds one prompt's prefill at a time (a llama.cpp model is one cache),
    made again, untimed, when the next run is on another prompt: once per prompt and repetition.
    """
    if reps < 1 or warmup < 0 or kmax < 1:
        raise ValueError(f"need reps >= 1 (got {reps}), warmup >= 0 (got {warmup}) and kmax >= 1 (got {kmax})")
    loaded = load_candidate(candidate, tokenizer=tokenizer, load=load)
    ids = prompt_ids(tokenizer, prompts)
    held: dict[int, PrefilledTarget] = {}
    limit = vocab_limit(tokenizer)

    def run(i: int, k: int, proposer):
        if i not in held:
            held.clear()
            held[i] = PrefilledTarget(target, ids[i], keep=1)
        return generate(held[i], ids[i], draft=proposer, k=k, max_new_tokens=new_tokens, temperature=temperature,
                        top_p=top_p, seed=seed + i, vocab_limit=limit).stats

    for k in range(kmax + 1):
        for _ in range(warmup):
            run(0, k, untimed_prefill(loaded.proposer(k)) if k else None)
    samples = [[[] for _ in ids] for _ in range(kmax + 1)]  # [k][prompt] -> seconds per rep
    tokens = [[0] * len(ids) for _ in range(kmax + 1)]
    rounds = [[0] * len(ids) for _ in range(kmax + 1)]
    rep = 0
    while rep < reps:
        for i in range(len(ids)):
            for k in (range(kmax + 1) if rep % 2 == 0 else range(kmax, -1, -1)):
                stats = run(i, k, untimed_prefill(loaded.proposer(k)) if k else None)
                samples[k][i].append(stats.total_s)
                tokens[k][i], rounds[k][i] = stats.new_tokens, stats.rounds
        if rep == 0:
            reps = check_reps(reps, sum(s[0] for s in samples[0]), min_seconds)
        rep += 1
    seconds = tuple(sum(Timing(tuple(s)).median for s in by_prompt) for by_prompt in samples)
    return HeldoutCheck(loaded.candidate, tuple(sum(t) for t in tokens), seconds, len(ids), reps, new_tokens,
                        tuple(sum(r) for r in rounds), tuple(tuple(tuple(s) for s in by) for by in samples))


@dataclass(frozen=True)
class CandidateScore:
    """One candidate's prediction against its held-out check: k̂* against the measured best k, the
    throughput lost at k̂* (1 - T(k̂*)/T(k_best)), and the predicted speedup at k̂* against the measured
    one (relative error predicted/measured - 1). Out of sample: the calibration never read these prompts.
    predicted_tokens, measured_tokens: E(k_best) from the calibration and tokens per round at k_best on
    the held-out half (None without the check's rounds): apart, the acceptance moved between the halves."""

    name: str
    k_hat: int
    k_best: int
    throughput_lost: float
    predicted_speedup: float
    measured_speedup: float
    predicted_tokens: float | None = None
    measured_tokens: float | None = None
    loss_floor: float | None = None

    @property
    def within_one(self) -> bool:
        return abs(self.k_hat - self.k_best) <= 1

    @property
    def speedup_error(self) -> float:
        return self.predicted_speedup / self.measured_speedup - 1

    def to_dict(self) -> dict:
        return {"name": self.name, "k_hat": self.k_hat, "k_best": self.k_best, "within_one": self.within_one,
                "throughput_lost": self.throughput_lost, "predicted_speedup": self.predicted_speedup,
                "measured_speedup": self.measured_speedup, "speedup_error": self.speedup_error,
                "predicted_tokens": self.predicted_tokens, "measured_tokens": self.measured_tokens,
                "loss_floor": self.loss_floor}

    @classmethod
    def from_dict(cls, d: dict) -> "CandidateScore":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass(frozen=True)
class CandidatesScore:
    """Every candidate's score, and the named best (None: "decode plainly") against the measured best
    (None: plain decoding measured fastest): named_ok when the named choice measures within 2% of it."""

    scores: tuple[CandidateScore, ...]
    named: str | None
    measured_best: str | None
    named_speedup: float
    measured_best_speedup: float

    @property
    def named_ok(self) -> bool:
        return self.named == self.measured_best or \
            self.named_speedup >= (1 - NAMED_BEST_SLACK) * self.measured_best_speedup

    def to_dict(self) -> dict:
        return {"scores": [s.to_dict() for s in self.scores], "named": self.named,
                "measured_best": self.measured_best, "named_speedup": self.named_speedup,
                "measured_best_speedup": self.measured_best_speedup, "named_ok": self.named_ok,
                "out_of_sample": True}

    @classmethod
    def from_dict(cls, d: dict) -> "CandidatesScore":
        return cls(tuple(CandidateScore.from_dict(s) for s in d["scores"]), d["named"], d["measured_best"],
                   d["named_speedup"], d["measured_best_speedup"])


def score_one(prediction: CandidatePrediction, check: HeldoutCheck) -> CandidateScore:
    """The prediction of one candidate scored against its held-out check (same kmax needed)."""
    if len(prediction.tau) != len(check.tokens):
        raise ValueError(f"{prediction.name}: predicted to kmax = {len(prediction.tau) - 1}, checked to "
                         f"{len(check.tokens) - 1}; check every k the prediction priced")
    k, T, best = prediction.answer.k_star, check.throughput, check.best_k
    measured = check.tokens_per_round[best] if check.rounds else None
    return CandidateScore(prediction.name, k, best, 1 - T[k] / T[best], prediction.speedup_at(k), check.speedup[k],
                          float(prediction.answer.expected[best]), measured, check.loss_floor())


def score_candidates(predictions: Sequence[CandidatePrediction], checks: Sequence[HeldoutCheck]) -> CandidatesScore:
    """Each candidate's score (matched by name) and the named best (`answer_for`) against the measured
    best: the candidate with the largest measured speedup at its best fixed k, or plain decoding (1x)
    when none beats it. The named candidate is credited with its measured speedup at its best fixed k
    (the choice of candidate is scored here, the choice of k by each CandidateScore); "decode
    plainly" with 1x."""
    by_name = {c.candidate.name: c for c in checks}
    missing = [p.name for p in predictions if p.name not in by_name]
    if missing:
        raise ValueError(f"no held-out check for candidate(s) {missing}; check every predicted candidate")
    scores = tuple(score_one(p, by_name[p.name]) for p in predictions)
    named = answer_for(predictions).best
    chosen = [by_name[p.name] for p in predictions]
    top = max(chosen, key=lambda c: c.best_speedup)
    measured_best, best_speedup = (top.candidate.name, top.best_speedup) if top.best_speedup > 1 else (None, 1.0)
    named_speedup = by_name[named].best_speedup if named is not None else 1.0
    return CandidatesScore(scores, named, measured_best, named_speedup, best_speedup)
