"""The user's candidates and their calibration (issue 50; DESIGN.md, "The run folder and the answer").

A `Candidate` names a draft source the way a user gives it: a draft model ("draft": a model spec or a
GGUF file), moespec's prompt lookup ("prompt-lookup", n), llama.cpp's n-gram drafters ("ngram-simple",
"ngram-mod", with llama.cpp's parameters) or the oracle ("oracle", a). `load_candidate` builds its
proposer for a loaded target and tokenizer; `calibrate` measures, on the *calibration half* of the
prompts only, its acceptance by position and its own cost h(k) (`bench.candidate`). The held-out
half is never read here: `chain.candidate_check` checks the answer on it, out of sample.
The prediction and the answer from a calibration: `chain.candidate_answer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from moespec.backends.protocol import as_spec_model
from moespec.bench.candidate import (
    CandidateAcceptance,
    DraftCost,
    check_vocabulary,
    draft_confidence,
    encode_prompts,
    measure_acceptance,
    measure_draft_cost,
)
from moespec.engine.draft_choice import DraftChoice
from moespec.engine.ngram import NgramMod, NgramSimple
from moespec.engine.proposers import DraftModel, OracleDraft, Proposer
from moespec.texts import vocab_limit

DRAFT, LOOKUP, NGRAM_SIMPLE, NGRAM_MOD, ORACLE = "draft", "prompt-lookup", "ngram-simple", "ngram-mod", "oracle"
KINDS = (DRAFT, LOOKUP, NGRAM_SIMPLE, NGRAM_MOD, ORACLE)
# n when the user gives none: moespec's lookup default, llama.cpp's defaults (common/common.h)
DEFAULT_N = {LOOKUP: 3, NGRAM_SIMPLE: 12, NGRAM_MOD: 24}


@dataclass(frozen=True)
class Candidate:
    """One draft source. draft: the model spec or file ("draft"); n: the lookup's n-gram size
    ("prompt-lookup"), llama.cpp's --spec-ngram-simple-size-n or --spec-ngram-mod-n-match; n_min:
    --spec-ngram-mod-n-min (1 by default: llama.cpp's 48 drafts nothing at a short k); min_hits:
    --spec-ngram-simple-min-hits; acceptance, seed: the oracle's a and its draws' seed."""

    kind: str
    draft: str | None = None
    n: int | None = None
    n_min: int = 1
    min_hits: int = 1
    acceptance: float | None = None
    seed: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"candidate kind {self.kind!r} is unknown; choose one of {KINDS}")
        if (self.kind == DRAFT) != bool(self.draft):
            raise ValueError(f"a {self.kind!r} candidate {'needs' if self.kind == DRAFT else 'takes no'} draft "
                             f"model (got {self.draft!r}); give draft= only with kind 'draft'")
        if (self.kind == ORACLE) != (self.acceptance is not None):
            raise ValueError(f"a {self.kind!r} candidate {'needs' if self.kind == ORACLE else 'takes no'} "
                             f"acceptance (got {self.acceptance!r}); give acceptance= only with kind 'oracle'")
        if self.kind in DEFAULT_N and self.n is None:
            object.__setattr__(self, "n", DEFAULT_N[self.kind])
        if self.kind in DEFAULT_N:
            self.proposer_at(max(1, self.min_k))  # the engine's checks of every parameter, now

    @property
    def name(self) -> str:
        """The candidate's name in tables: the draft file, or the kind with its parameters."""
        if self.kind == DRAFT:
            return self.draft
        if self.kind == ORACLE:
            return f"oracle a={self.acceptance:g}"
        extra = {NGRAM_MOD: f" n-min={self.n_min}", NGRAM_SIMPLE: f" min-hits={self.min_hits}"}.get(self.kind, "")
        return f"{self.kind} n={self.n}{extra}"

    @property
    def min_k(self) -> int:
        """The shortest draft length that can draft: ngram-simple with size-m = k < size-n never drafts."""
        return self.n if self.kind == NGRAM_SIMPLE else 1

    def proposer_at(self, k: int, *, model=None, tokenizer=None) -> Proposer:
        """A fresh proposer for rounds at draft length k, as the emitted settings run it at k: the
        n-gram drafters with llama.cpp's draft length set to k (size-m = k; n-max = k, n-min <= k).
        model: the loaded draft model ("draft"; `load_candidate` passes it)."""
        if self.kind == NGRAM_SIMPLE:
            return NgramSimple(self.n, max(k, 1), self.min_hits)
        if self.kind == NGRAM_MOD:
            return NgramMod(self.n, k, min(self.n_min, k))
        if self.kind == DRAFT:
            if model is None:
                raise ValueError(f"candidate {self.name!r} needs its loaded draft model; use load_candidate")
            return DraftModel(model)
        choice = DraftChoice(prompt_lookup=self.n if self.kind == LOOKUP else None,
                             oracle_acceptance=self.acceptance)
        return choice.proposer(tokenizer=tokenizer, load_draft=lambda spec: None, seed=self.seed)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "draft": self.draft, "n": self.n, "n_min": self.n_min, "min_hits": self.min_hits,
                "acceptance": self.acceptance, "seed": self.seed, "name": self.name}

    @classmethod
    def from_dict(cls, d: dict) -> "Candidate":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class LoadedCandidate:
    """A candidate with its draft model loaded (None for the others): `proposer(k)` builds a fresh
    proposer per call (a fresh n-gram pool; the draft model's weights shared)."""

    candidate: Candidate
    model: object = None
    tokenizer: object = None

    def proposer(self, k: int) -> Proposer:
        return self.candidate.proposer_at(k, model=self.model, tokenizer=self.tokenizer)


def load_candidate(candidate: Candidate | LoadedCandidate, *, tokenizer, load: Callable[[str], tuple] | None = None,
                   target_file: str | None = None) -> LoadedCandidate:
    """The candidate ready to propose. A draft model is loaded with `load(spec)` (default
    `moespec.models.load`) after llama.cpp's vocabulary rule where both target_file and the draft are
    GGUF files (`bench.candidate.check_vocabulary`: refused before anything is timed), and its
    tokenizer must map ids as the target's does (`engine.decode.check_pairing`)."""
    if isinstance(candidate, LoadedCandidate):
        return candidate
    if candidate.kind != DRAFT:
        return LoadedCandidate(candidate, None, tokenizer)
    if target_file and str(target_file).endswith(".gguf") and candidate.draft.endswith(".gguf"):
        check_vocabulary(target_file, candidate.draft)
    if load is None:
        from moespec.models import load
    model = DraftChoice(model=candidate.draft).proposer(tokenizer=tokenizer, load_draft=load)
    return LoadedCandidate(candidate, as_spec_model(model), tokenizer)


class RewoundOracle:
    """An `OracleDraft` whose draws restart at every commit: timing its rounds calls `propose` far more
    often than one run's budget of draws (`OracleDraft.begin`) allows; the draws do not change its cost."""

    def __init__(self, oracle: OracleDraft):
        self.oracle = oracle
        self.cache = None

    def begin(self, **kwargs) -> None:
        self.oracle.begin(**kwargs)

    def propose(self, context, k: int):
        return self.oracle.propose(context, k)

    def commit(self, keep: int) -> None:
        self.oracle.commit(keep)
        self.oracle.draws = 0

    def identity(self) -> dict:
        return self.oracle.identity()


def prompt_ids(tokenizer, prompts: Sequence) -> list[list[int]]:
    """Token ids of each prompt: ids are kept, texts and chats encoded (`bench.candidate.encode_prompts`)."""
    if not prompts:
        raise ValueError("no prompts given; give at least one (a text, a chat or a list of token ids)")
    return [list(map(int, p)) if not isinstance(p, str) and all(isinstance(x, int) for x in p)
            else encode_prompts(tokenizer, [p])[0] for p in prompts]


@dataclass(frozen=True)
class CandidateCalibration:
    """What the calibration half gave for one candidate: its acceptance by position at kmax and its
    own cost h(k), k = 0..kmax; for a draft model under greedy decoding, its confidence: per token of
    the target's continuations, the draft's top-token probability and whether it was the target's
    (`bench.candidate.draft_confidence`, which sets llama.cpp's p-min: `costmodel.confidence`)."""

    candidate: Candidate
    measured: CandidateAcceptance
    cost: DraftCost
    confidence: tuple[tuple[float, ...], tuple[bool, ...]] | None = None

    @property
    def kmax(self) -> int:
        return self.cost.kmax

    def to_dict(self) -> dict:
        d = {"candidate": self.candidate.to_dict(), "measured": self.measured.to_dict(),
             "cost": self.cost.to_dict(), "half": "calibration"}
        if self.confidence is not None:
            d["confidence"] = {"probability": list(self.confidence[0]), "accepted": list(self.confidence[1])}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "CandidateCalibration":
        c = d.get("confidence")
        return cls(Candidate.from_dict(d["candidate"]), CandidateAcceptance.from_dict(d["measured"]),
                   DraftCost.from_dict(d["cost"]),
                   None if c is None else (tuple(c["probability"]), tuple(c["accepted"])))


def calibrate(target, tokenizer, candidate: Candidate | LoadedCandidate, prompts: Sequence, *, kmax: int,
              new_tokens: int, temperature: float = 0.0, top_p: float | None = None, seed: int = 0,
              cost_reps: int = 20, load: Callable[[str], tuple] | None = None) -> CandidateCalibration:
    """The candidate on the calibration half `prompts` (ids, texts or chats): its acceptance by
    position from untimed decoding at kmax and at every k below it (`bench.candidate.measure_acceptance`,
    a fresh proposer for each prompt: an n-gram pool holds that prompt alone, as llama-speculative-simple
    and a server's first request meet it) and h(k) timed at the depth of the first prompt
    (`bench.candidate.measure_draft_cost`, `cost_reps` timings per k; a draft model's rounds each after
    the target's pass, as in decoding). Never given the held-out half."""
    loaded = load_candidate(candidate, tokenizer=tokenizer, load=load)
    ids = prompt_ids(tokenizer, prompts)
    limit = vocab_limit(tokenizer)
    texts = [] if loaded.candidate.kind == DRAFT and temperature == 0 else None
    measured = measure_acceptance(target, lambda: loaded.proposer(kmax), ids, kmax=kmax, max_new_tokens=new_tokens,
                                  temperature=temperature, top_p=top_p, seed=seed, vocab_limit=limit, texts=texts,
                                  at_k=loaded.proposer)
    confidence = None
    if texts is not None:
        probability, accepted = draft_confidence(loaded.model, texts, vocab_limit=limit)
        confidence = (tuple(round(q, 6) for q in probability), tuple(accepted))
    spec, timed = as_spec_model(target), loaded.proposer(kmax)
    if loaded.candidate.kind == ORACLE:
        timed = RewoundOracle(timed)
    cost = measure_draft_cost(timed, target=spec, context=ids[0], kmax=kmax, reps=cost_reps,
                              temperature=temperature, vocab_limit=limit, alternate=loaded.candidate.kind == DRAFT)
    return CandidateCalibration(loaded.candidate, measured, cost, confidence)


def parse_ngram(text: str) -> Candidate:
    """`--ngram MODE[:N]`: llama.cpp's ngram-mod (N: its n-match) or ngram-simple (N: its size-n)."""
    mode, _, n = text.partition(":")
    if mode not in (NGRAM_MOD, NGRAM_SIMPLE):
        raise ValueError(f"--ngram {text!r}: the modes moespec prices are {NGRAM_MOD} and {NGRAM_SIMPLE} "
                         f"(optionally MODE:N, e.g. {NGRAM_MOD}:24)")
    if n and not n.isdigit():
        raise ValueError(f"--ngram {text!r}: N must be a whole number >= 1, e.g. {mode}:{DEFAULT_N[mode]}")
    return Candidate(mode, n=int(n) if n else None)


def user_candidates(*, drafts: Sequence[str] = (), prompt_lookup: int | None = None, ngrams: Sequence[str] = (),
                    target_gguf: str | None = None) -> tuple[dict, ...]:
    """The candidates `moespec demo` names (`Candidate.to_dict()` each), checked before anything is
    timed: a draft of a GGUF target must be a GGUF file llama.cpp would pair with it (the vocabulary
    rule, `bench.candidate.check_vocabulary`); the same candidate twice is refused. Prompt lookup of a
    GGUF target brings ngram-mod of the same n beside it (unless named): llama-server runs lookup as
    that rule, whose acceptance is its own, so its line is priced on it (`candidate_answer.lookup_lines`)."""
    found = [Candidate(DRAFT, draft=str(d)) for d in drafts]
    if target_gguf is not None:
        for c in found:
            check_vocabulary(target_gguf, c.draft)
    if prompt_lookup is not None:
        found.append(Candidate(LOOKUP, n=int(prompt_lookup)))
    found += [parse_ngram(t) for t in ngrams]
    twin = Candidate(NGRAM_MOD, n=int(prompt_lookup)) if prompt_lookup is not None else None
    if target_gguf is not None and twin is not None and not any(c.kind == NGRAM_MOD and c.n == twin.n for c in found):
        found.append(twin)
    names = [c.name for c in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"candidate {twice[0]!r} is given twice; name each draft once")
    return tuple(c.to_dict() for c in found)
