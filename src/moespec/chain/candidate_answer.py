"""The answer for the user's candidates: k̂*, the speedup and the engines' lines per candidate, and the
best of them (issue 50; cost-model paper Sec. 1, eq. (9); `costmodel.positional`).

`predict_candidate` reads τ̂(n) of the chain's prediction ("predict" payload, the calibrated version
by default) at n = k + 1, or the target's passes timed on the calibration half as decoding meets them
(`bench.target_passes`, what the demo uses), and the candidate's calibration (`chain.candidates.calibrate`,
made on the calibration half only), forms V̂(k) = τ̄(k) + ĥ(k) (τ̄(k) the pass of k + 1 tokens for a draft
that always proposes k; less for a lookup whose proposals come short) and answers with `positional.answer`: k̂*, the
speedup and its band, E(k) with the geometric G_a(k) beside it, n-min and p-min, and the lines for
llama-server, vLLM and SGLang (`costmodel.settings`). `answer_for` names the best candidate.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from moespec.chain.candidates import DRAFT, LOOKUP, NGRAM_MOD, NGRAM_SIMPLE, Candidate, CandidateCalibration
from moespec.chain.prediction import KIND, payload_of
from moespec.bench.candidate import CandidateAcceptance, expected_draft_cost
from moespec.bench.target_passes import TargetPasses
from moespec.costmodel.confidence import calibrated_p_min
from moespec.costmodel.positional import (
    PLAINLY,
    SPECULATE,
    PositionalAnswer,
    answer,
    best_of,
    draft_step_times,
    expected_pass_times,
    paying,
    plain,
    shortest_paying,
    steady_round_times,
)
from moespec.costmodel.predict import TIMED_PASSES, preferred_version
from moespec.costmodel.settings import (
    LLAMA_ARG,
    Setting,
    Settings,
    draft_probability_floor,
    llama_cpp_settings,
    sglang_settings,
    vllm_settings,
)
from moespec.kernel_names import COST_AUTO

LLAMA_LOOP_NOTE = ("llama.cpp's compiled loop adds next to nothing to a round beyond the pass and the drafter, "
                   "so its draft length is {k_llama}, where moespec's engine (its Python round) takes {k}")
NGRAM_SIMPLE_NOTE = ("llama.cpp's ngram-simple rule, the one measured; size-m is the draft length k̂*; "
                     "vLLM's and SGLang's n-gram lookups are their own rules, priced at this acceptance")


@dataclass(frozen=True)
class PredictedPasses:
    """What a candidate's answer reads of the chain's prediction at one depth: tau [kmax + 1] τ̂(k + 1)
    and overhead [kmax + 1] the engine's own time per round outside the verify pass (the prediction's
    h(k), measured with the oracle, whose proposing costs next to nothing), seconds; δ of (20)-(21)."""

    tau: list
    overhead: list
    version: str
    depth: int
    delta: float


def prediction_tau(prediction: Any, *, kmax: int, version: str = "calibrated", kernel: str = COST_AUTO,
                   depth: int | None = None) -> PredictedPasses:
    """τ̂(1..kmax+1), the engine's overhead h(0..kmax), the version read, the depth and δ from a predict
    artifact (a path, a document or its payload): `version` or the next available
    (`costmodel.predict.preferred_version`) at `depth` (default: the first). Refused unless the
    prediction's pass sizes reach kmax + 1 and its h reaches kmax."""
    depths = payload_of(prediction, KIND).get("depths") or []
    entries = {int(e["depth"]): e for e in depths}
    entry = depths[0] if depths and depth is None else entries.get(depth)
    if entry is None:
        raise ValueError(f"the prediction has depths {sorted(entries)}, not {depth}; pass one of them")
    chosen = preferred_version(entry.get("versions", {}), version)
    if chosen is None:
        why = "; ".join(f"{name}: {u.get('message', u.get('reason'))}" for name, u in entry.get("unavailable", {}).items())
        raise NoVersion(f"the prediction holds no version at depth {entry['depth']}{f' ({why})' if why else ''}; "
                        "where its fits failed on noisy timings, run `moespec demo --restart` again with nothing "
                        "else running", int(entry["depth"]))
    p = entry["versions"][chosen]
    if kernel not in p["tau"]:
        raise ValueError(f"kernel {kernel!r} is not in the prediction; use one of {sorted(p['tau'])}")
    n_max = max(p["n"])
    if n_max < kmax + 1:
        raise ValueError(f"the prediction's pass sizes reach n = {n_max}, and k = {kmax} drafts need a pass of "
                         f"n = {kmax + 1}; calibrate with kmax <= {n_max - 1} or predict to n >= {kmax + 1}")
    if len(p["h"]) < kmax + 1:
        raise ValueError(f"the prediction's h(k) stops at k = {len(p['h']) - 1} < kmax = {kmax}; calibrate with "
                         f"kmax <= {len(p['h']) - 1} or measure h to k = {kmax}")
    delta = p.get("delta")
    return PredictedPasses([float(t) for t in p["tau"][kernel][: kmax + 1]], [float(x) for x in p["h"][: kmax + 1]],
                           chosen, int(entry["depth"]), math.inf if delta is None else float(delta))


class NoVersion(ValueError):
    """The prediction fitted no version at `depth` (each version's reason in the message)."""

    def __init__(self, message: str, depth: int):
        super().__init__(message)
        self.depth = depth


def base_passes(measurement_base: Mapping[str, Any], passes: TargetPasses, *, kmax: int, depth: int) -> PredictedPasses:
    """What a candidate's answer reads where the prediction fitted no version (`NoVersion`) but the
    target's passes were timed (`bench.target_passes`, which price the rounds): the engine's own time
    per round h(0..kmax) from the base measurement at `depth` (the same h the prediction reads), τ the
    passes timed after one of the same size, and no band from ε (δ = 0: nothing predicted is priced)."""
    h = (measurement_base.get("h") or {}).get(str(depth)) or {}
    if not all(str(k) in h for k in range(kmax + 1)) or passes.kmax < kmax:
        raise ValueError(f"the base measurement's h(k) at depth {depth} holds k = {sorted(int(k) for k in h)} and the "
                         f"passes reach n = {passes.kmax + 1}; k = {kmax} drafts need both; run the demo again")
    return PredictedPasses(list(passes.warm[: kmax + 1]), [float(h[str(k)]) for k in range(kmax + 1)], TIMED_PASSES,
                           depth, 0.0)


def restricted(ans: PositionalAnswer, min_k: int) -> PositionalAnswer:
    """The answer with draft lengths 1..min_k - 1 left out (they draft nothing: ngram-simple below
    size-n): k̂* and n-min over {0} ∪ {min_k..kmax} (those paying beyond the price's noise,
    `positional.paying`); the band stays that of every k (wider)."""
    if min_k <= 1:
        return ans
    r = [e / v for e, v in zip(ans.expected, ans.step_times)]
    allowed = paying(r, ans.price_high, [0] + list(range(min_k, len(r))))
    k, n_min = best_of(r, allowed), shortest_paying(r, allowed)
    return replace(ans, k_star=k, speedup=ans.expected[k] * ans.step_times[0] / ans.step_times[k], n_min=n_min)


def ngram_simple_settings(candidate: Candidate, k: int) -> Settings:
    """llama-server's line for llama.cpp's ngram-simple at draft length k (size-m = k)."""
    if k == 0:
        return llama_cpp_settings(k=0, n_min=0, p_min=0, prompt_lookup=1)
    values = (
        Setting("--spec-type", "ngram-simple", "draft by copying what followed the latest match of the last "
                "size-n tokens", f"{LLAMA_ARG} (--spec-type)"),
        Setting("--spec-ngram-simple-size-n", candidate.n, "tokens matched", f"{LLAMA_ARG}"),
        Setting("--spec-ngram-simple-size-m", k, "draft length k̂*: tokens copied", f"{LLAMA_ARG}", True),
        Setting("--spec-ngram-simple-min-hits", candidate.min_hits, "parsed; the rule does not read it", LLAMA_ARG),
    )
    fragment = " ".join(f"{s.name} {shlex.quote(str(s.value))}" for s in values)
    return Settings("llama.cpp", True, values, fragment, NGRAM_SIMPLE_NOTE)


def candidate_settings(candidate: Candidate, ans: PositionalAnswer,
                       llama: PositionalAnswer | None = None) -> dict[str, dict]:
    """{engine: Settings.to_dict()} at k̂*, n-min and p-min of the answer (llama.cpp's line at those of
    `llama`, the rounds priced on its compiled loop, where given). llama-server runs the rule
    measured: -md FILE for a draft file; ngram-mod with the candidate's n-match and n-min (n-max k̂*);
    ngram-simple with its size-n (size-m k̂*). A prompt-lookup candidate's llama.cpp line is ngram-mod,
    another rule (`lookup_lines` gives it the line of an ngram-mod candidate of the same n); the
    oracle's names DRAFT_MODEL."""
    k, draft = ans.k_star, candidate.draft if candidate.kind == DRAFT else None
    lookup = candidate.n if candidate.kind in (LOOKUP, NGRAM_MOD, NGRAM_SIMPLE) else None
    own = llama or ans
    if candidate.kind == NGRAM_SIMPLE:
        line = ngram_simple_settings(candidate, own.k_star)
    else:
        n_min = min(candidate.n_min, own.k_star) if candidate.kind == NGRAM_MOD else own.n_min
        line = llama_cpp_settings(k=own.k_star, n_min=n_min, p_min=own.p_min, draft=draft, prompt_lookup=lookup)
    why = LLAMA_LOOP_NOTE.format(k_llama=llama.k_star, k=k) if llama is not None and llama.k_star != k else None
    line = line.to_dict() if why is None else {**line.to_dict(), "note": f"{line.note}; {why}", "why": why}
    return {"llama.cpp": line, "vllm": vllm_settings(k=k, draft=draft, prompt_lookup=lookup).to_dict(),
            "sglang": sglang_settings(k=k, draft=draft, prompt_lookup=lookup).to_dict()}


@dataclass(frozen=True)
class CandidatePrediction:
    """The answer for one candidate: τ̂(k+1) and ĥ(k) ([kmax + 1] seconds; ĥ the draft's own cost and the
    engine's overhead), the answer from V̂ = τ̄ + ĥ (its step_times; τ̄ the expected pass at the
    calibration's draft shares), and the engines' settings. Its calibration never read the held-out half."""

    candidate: Candidate
    version: str
    kernel: str
    depth: int
    tau: tuple
    h: tuple
    answer: PositionalAnswer
    settings: dict
    passes: dict | None = None  # `bench.target_passes.TargetPasses` the rounds were priced with, if any
    llama_answer: PositionalAnswer | None = None  # priced on llama.cpp's loop (no engine time per round)

    @property
    def name(self) -> str:
        return self.candidate.name

    def speedup_at(self, k: int) -> float:
        """The predicted speedup at draft length k: E(k) V̂(0) / V̂(k)."""
        a = self.answer
        return float(a.expected[k] * a.step_times[0] / a.step_times[k])

    def to_dict(self) -> dict:
        return {"candidate": self.candidate.to_dict(), "name": self.name, "version": self.version,
                "kernel": self.kernel, "depth": self.depth, "tau": [plain(x) for x in self.tau],
                "h": [plain(x) for x in self.h], "answer": self.answer.to_dict(), "settings": self.settings,
                **({"passes": self.passes} if self.passes is not None else {}),
                **({"llama_answer": self.llama_answer.to_dict()} if self.llama_answer is not None else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "CandidatePrediction":
        return cls(Candidate.from_dict(d["candidate"]), d["version"], d["kernel"], d["depth"], tuple(d["tau"]),
                   tuple(d["h"]), PositionalAnswer.from_dict(d["answer"]), d["settings"], d.get("passes"),
                   PositionalAnswer.from_dict(d["llama_answer"]) if d.get("llama_answer") else None)


def predict_candidate(prediction: Any, calibration: CandidateCalibration, *, version: str = "calibrated",
                      kernel: str = COST_AUTO, depth: int | None = None, overhead: bool = True,
                      passes: TargetPasses | None = None, base: Mapping[str, Any] | None = None) -> CandidatePrediction:
    """k̂*, the speedup with its band, n-min, p-min and the settings for one calibrated candidate
    (p-min: the floor min_i c_i / V̂(0) as a draft probability, c_i the increments of V̂ less the draft's
    own cost (spent when p-min is checked: `priced_answer`), through the draft's measured confidence
    where its calibration has it, `costmodel.confidence`).

    V̂(k) = τ̄(k) + ĥ(k): τ̄(k) the expected pass of a round at k, τ̂(1..k+1) from the prediction
    (`prediction_tau`) weighted by the shares of rounds whose proposal reached each position
    (`positional.expected_pass_times`: a lookup that finds no match verifies one token), ĥ(k) the calibration's draft
    cost weighted by the chance a round at k accepted all (`bench.candidate.expected_draft_cost`, from the
    run at k where the calibration made one),
    plus, with `overhead`, the engine's own time per round outside the pass (the prediction's h(k)),
    both weighted by the same shares: a round whose proposal came short pays the round of its length,
    and one that proposed nothing a plain round's (the engine runs those as plain greedy steps,
    `HostDrafter.quiet`, and llama.cpp's cost as little); for a draft model ĥ is unchanged.
    With `passes` (the target's passes timed on the calibration prompts as decoding meets them,
    `bench.target_passes`) the rounds are priced with those instead of τ̂: V̂(k) from
    `positional.steady_round_times`, a round that proposed nothing a plain step; τ̂ stays in the record.
    The band uses the prediction's δ (none when δ >= 1: the bounds are vacuous) and, where the calibration
    kept each prompt's counts, spans the bootstrap over its prompts (`positional.answer`).
    With `overhead`, llama.cpp's line is priced as its own loop runs a round (`llama_answer`): the pass
    and the draft's cost, without moespec's engine time, which its compiled loop does not spend.
    Where the prediction fitted no version and `passes` and the base measurement (`base`, its payload)
    are given, the engine's h(k) is read from the base measurement instead (`base_passes`), no band from ε."""
    try:
        got = prediction_tau(prediction, kmax=calibration.kmax, version=version, kernel=kernel, depth=depth)
    except NoVersion as e:
        if passes is None or base is None:
            raise
        got = base_passes(base, passes, kmax=calibration.kmax, depth=e.depth)
    alpha = calibration.measured.acceptance.alpha[: calibration.kmax]
    own = [float(x) for x in expected_draft_cost(calibration.cost, alpha, calibration.measured.at_k)]
    engine = [x + o for x, o in zip(own, got.overhead)] if overhead else own
    h, ans = priced_answer(got, calibration, engine, passes, own)
    llama = priced_answer(got, calibration, own, passes, own)[1] if overhead else None
    return CandidatePrediction(calibration.candidate, got.version, kernel, got.depth, tuple(got.tau), tuple(h), ans,
                               candidate_settings(calibration.candidate, ans, llama),
                               None if passes is None else passes.to_dict(), llama)


def priced_answer(got: PredictedPasses, calibration: CandidateCalibration, extra: Sequence[float],
                  passes: TargetPasses | None, drafted: Sequence[float] = ()) -> tuple[list, PositionalAnswer]:
    """(ĥ, the answer) with extra[k] the time a round at k that proposed k tokens adds to its pass
    (`predict_candidate`): ĥ(k) weighted by the shares of the rounds' proposal lengths.
    drafted[k]: the draft's own part of extra[k]. p-min is read off the rounds without it: llama.cpp
    checks a draft token's probability after the draft's step that made it (common/speculative.cpp), so
    a token p-min cuts saves its verification, not its drafting (`costmodel.settings.draft_probability_floor`
    on V̂ less the draft's cost)."""
    kmax, measured = calibration.kmax, calibration.measured
    shares = draft_shares(measured, kmax)
    h = [float(x) for x in by_k(expected_pass_times, [extra], shares)]  # a round pays for what it proposed
    if passes is not None and passes.kmax < kmax:
        raise ValueError(f"the target's passes were timed to n = {passes.kmax + 1}, and k = {kmax} drafts need "
                         f"n = {kmax + 1}; time them again with kmax >= {kmax}")
    V = round_times(got, passes, extra, shares)
    low, high = price_noise(V, got, passes, extra, shares)
    ans = answer(V, measured.acceptance, delta=got.delta if got.delta < 1 else 0,
                 prompts=measured.by_prompt, at_k=measured.at_k, at_k_prompts=measured.at_k_by_prompt,
                 price_low=low, price_high=high)
    if got.delta >= 1:
        ans = replace(ans, speedup_low=0.0, speedup_high=math.inf, low_by_k=(1.0,) + (0.0,) * kmax,
                      high_by_k=(1.0,) + (math.inf,) * kmax)
    if kmax and any(drafted):
        rest = [e - d for e, d in zip(extra, drafted)]
        ans = replace(ans, p_min=draft_probability_floor(round_times(got, passes, rest, shares)))
    ans = restricted(ans, calibration.candidate.min_k)
    if calibration.confidence is not None and ans.k_star:  # the floor read through the draft's calibration
        p_min = calibrated_p_min(*calibration.confidence, float(ans.p_min))
        ans = ans if p_min is None else replace(ans, p_min=p_min)
    return h, ans


def round_times(got: PredictedPasses, passes: TargetPasses | None, extra: Sequence[float], shares: list) -> list:
    """V̂(0..kmax) with extra[k] beside the pass of a round that proposed k tokens: τ̂ weighted by the shares
    (`positional.draft_step_times`), or with `passes` the rounds as decoding meets them
    (`positional.steady_round_times`)."""
    if passes is None:
        return draft_step_times([float(t) for t in by_k(expected_pass_times, [got.tau], shares)],
                                [float(x) for x in by_k(expected_pass_times, [extra], shares)])
    return by_k(lambda warm, cold, x, share: steady_round_times(warm, cold, passes.plain, x, share),
                [passes.warm, passes.cold, extra], shares)


def price_noise(whole: Sequence, got: PredictedPasses, passes: TargetPasses | None, extra: Sequence[float],
                shares: list) -> tuple[list, list]:
    """([kmax + 1] low, [kmax + 1] high): the least and the most V_b(k)/V_b(0) over the blocks b of the
    target's timing (`TargetPasses.blocks`, each block's rounds priced as `round_times` priced the
    whole timing's, `whole`), each over the whole's V(k)/V(0), clamped to <= 1 and >= 1: how far the
    price of a round at k against a plain step moved while it was timed (`positional.paying` reads it). ([], []) without
    the passes or with fewer than 2 blocks. The draft's own cost in `extra` is held fixed."""
    if passes is None or len(passes.blocks) < 2:
        return [], []
    rel = [[b[k] / b[0] / (whole[k] / whole[0]) for k in range(len(whole))]
           for b in (round_times(got, block, extra, shares) for block in passes.blocks)]
    return [min(1.0, *col) for col in zip(*rel)], [max(1.0, *col) for col in zip(*rel)]


def draft_shares(measured: CandidateAcceptance, kmax: int) -> list:
    """[kmax + 1] the draft shares s_1..s_k a round at k is priced with: the run at k's own where it was
    measured (`CandidateAcceptance.at_k`), else the run at kmax's."""
    return [(measured.at_k[k - 1] if measured.at_k else measured.acceptance).draft_share[:k] for k in range(kmax + 1)]


def by_k(price, series: Sequence[Sequence], shares: Sequence[Sequence]) -> list:
    """[kmax + 1] entry k of `price(*[x[: k + 1] for x in series], shares[k])`: a round at k priced at the
    draft shares of the run at k (`positional.expected_pass_times`, `positional.steady_round_times`)."""
    return [price(*[x[: k + 1] for x in series], share)[k] for k, share in enumerate(shares)]


def lookup_lines(predictions: Sequence[CandidatePrediction]) -> list[CandidatePrediction]:
    """The predictions with each prompt-lookup candidate's llama.cpp line replaced by that of an ngram-mod
    candidate of the same n (llama-server's lookup, a rule of its own: moespec's lookup does not price
    it), marked `priced_by` that candidate's name; the others unchanged."""
    mods = {p.candidate.n: p for p in predictions if p.candidate.kind == NGRAM_MOD}
    out = []
    for p in predictions:
        twin = mods.get(p.candidate.n) if p.candidate.kind == LOOKUP else None
        if twin is not None:
            line = twin.settings["llama.cpp"]
            said = f"llama.cpp runs lookup as ngram-mod: the line of {twin.name!r}, its rule measured"
            line = {**line, "priced_by": twin.name, "note": f"{said}; {line['note']}", "why": said}
            p = replace(p, settings={**p.settings, "llama.cpp": line})
        out.append(p)
    return out


@dataclass(frozen=True)
class CandidatesAnswer:
    """The answer over all candidates: the best (largest predicted speedup at its k̂*) when one pays,
    else None and "decode plainly"; best_drafting: the largest speedup any candidate predicts at any
    k >= 1 (below 1 when none pays: the figure the verdict gives)."""

    best: str | None
    k_star: int
    speedup: float
    best_drafting: float
    settings: dict
    candidates: tuple[str, ...]
    llama: dict | None = None  # llama.cpp's own best where it differs from the above (`llama_pick`)

    @property
    def verdict(self) -> str:
        return PLAINLY if self.best is None else SPECULATE

    @property
    def message(self) -> str:
        if self.best is None:
            return (f"{PLAINLY}: no candidate pays (the best drafting predicts "
                    f"{self.best_drafting:.2f}x plain decoding)")
        return f"{self.best}: k = {self.k_star}, {self.speedup:.2f}x plain decoding"

    def to_dict(self) -> dict:
        return {"best": self.best, "k_star": self.k_star, "speedup": self.speedup,
                "best_drafting": self.best_drafting, "settings": self.settings, "candidates": list(self.candidates),
                "verdict": self.verdict, "message": self.message, "llama": self.llama}

    @classmethod
    def from_dict(cls, d: Mapping) -> "CandidatesAnswer":
        return cls(d["best"], d["k_star"], d["speedup"], d["best_drafting"], d["settings"], tuple(d["candidates"]),
                   d.get("llama"))


def answer_for(predictions: Sequence[CandidatePrediction]) -> CandidatesAnswer:
    """The best candidate by predicted speedup at its k̂* (the first on a tie), or "decode plainly"."""
    if not predictions:
        raise ValueError("no candidate predictions to answer from; calibrate and predict at least one")
    names = tuple(p.name for p in predictions)
    drafting = max((p.speedup_at(k) for p in predictions for k in range(max(1, p.candidate.min_k),
                                                                         len(p.tau))), default=0.0)
    paying = [p for p in predictions if p.answer.k_star > 0]
    best = max(paying, key=lambda p: float(p.answer.speedup), default=None)  # max keeps the first of equals
    llama = llama_pick(predictions, best)
    if best is None:
        return CandidatesAnswer(None, 0, 1.0, drafting, {}, names, llama)
    return CandidatesAnswer(best.name, best.answer.k_star, float(best.answer.speedup), drafting, best.settings, names,
                            llama)


def llama_pick(predictions: Sequence[CandidatePrediction], best: CandidatePrediction | None) -> dict | None:
    """llama.cpp's own best, its rounds priced on its loop (`llama_answer`), where it differs from `best`
    (another candidate, or drafting where moespec's engine decodes plainly): {name, k_star, speedup, line};
    None where the two agree or none pays on llama.cpp."""
    def own(p):
        return p.llama_answer or p.answer
    paying = [p for p in predictions if own(p).k_star > 0 and "priced_by" not in p.settings["llama.cpp"]]
    pick = max(paying, key=lambda p: float(own(p).speedup), default=None)
    if pick is None or (best is not None and pick.name == best.name):
        return None
    return {"name": pick.name, "k_star": own(pick).k_star, "speedup": float(own(pick).speedup),
            "line": pick.settings["llama.cpp"]}
