"""Engine settings from the staircase: k̂*(a) and V̂(k) turned into llama.cpp, vLLM and SGLang flags.

Symbols as in `theory`: V = (V(0), ..., V(kmax)) step times, a the acceptance, k*(a) the best
draft length, c_i = V(i) - V(i-1). Pure functions, no I/O; each value carries what it means and the
engine file that defines it. docs/settings.md gives the rules and what is not modelled.

- n-max = k*(a): the cost model's best draft length (Sec. 1) becomes the engine's draft length.
- n-min = the shortest draft j >= 1 that beats no draft, eq. (8) (0 when none does): llama.cpp
  throws away drafts shorter than n-min and decodes one token instead (common/speculative.cpp:409).
- p-min = min_i c_i / V(0) clipped to [0, 1], the draft-probability floor: a continuation whose
  first token has acceptance q < p-min gains at most q per added token and costs at least min_i c_i
  each, so it does not raise the throughput of any draft that beats no draft (proof in
  docs/settings.md). For convex non-decreasing V it equals a_1 = a0, where drafting first pays.

The model is a chain of k drafts (no tree drafts); batch size 1 from V, or one V_B per batch size
(`recommend_batches`: vLLM's per-batch-size ranges, llama-server and SGLang one line per B).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from fractions import Fraction
from typing import Any

from moespec.costmodel.theory import (
    best_draft_length,
    check_acceptance,
    check_step_times,
    exact_div,
    first_draft_threshold,
    increments,
    json_number,
    speedup,
    speedup_condition,
    step_points,
)

ENGINES = ("llama.cpp", "vllm", "sglang")
DRAFT_PLACEHOLDER = "DRAFT_MODEL"  # stands for the draft in the fragments when none is named
P_MIN_PLACES = 4  # p-min is printed rounded up to this many decimals, so the flag admits no token below the floor

# Where each engine defines what these settings set. llama.cpp: the copy vendored by
# llama-cpp-python 0.3.36 (vendor/llama.cpp at 0c1e570); vLLM: vllm-project/vllm@002e77c;
# SGLang: sgl-project/sglang, docs and arg_groups/speculative_hook.py of its main branch.
LLAMA_ARG = "llama.cpp common/arg.cpp"
LLAMA_SPEC = "llama.cpp common/speculative.cpp"
VLLM_CONFIG = "vllm vllm/config/speculative.py (SpeculativeConfig)"
SGLANG_DOC = "sglang docs/advanced_features/speculative_decoding.md"
SGLANG_HOOK = "sglang python/sglang/srt/arg_groups/speculative_hook.py"


@dataclass(frozen=True)
class Setting:
    """One value an engine takes: its flag or key as the engine spells it, what it means, where it is defined."""

    name: str
    value: Any
    meaning: str
    source: str
    from_model: bool = False  # set from k*(a), n-min or p-min; False: fixed by the draft kind or the user's input

    def to_dict(self) -> dict:
        return {"name": self.name, "value": json_number(self.value), "meaning": self.meaning, "source": self.source,
                "from_model": self.from_model}


@dataclass(frozen=True)
class Settings:
    """One engine's settings at one acceptance, and the command-line fragment that sets them."""

    engine: str
    speculate: bool  # False: k*(a) = 0, the fragment turns speculation off (or is empty: omit the option)
    values: tuple[Setting, ...]
    fragment: str  # ready to paste after the engine's command
    note: str

    def to_dict(self) -> dict:
        return {"engine": self.engine, "speculate": self.speculate, "values": [v.to_dict() for v in self.values],
                "fragment": self.fragment, "note": self.note}


@dataclass(frozen=True)
class Recommendation:
    """What the model says at one acceptance: k*(a), its speedup (9), n-min, and each engine's settings."""

    acceptance: Any
    k_star: int
    speedup: Any  # T_a(k*)/T_a(0), eq. (9)
    n_min: int
    engines: tuple[Settings, ...]

    def engine(self, name: str) -> Settings:
        for s in self.engines:
            if s.engine == name:
                return s
        raise ValueError(f"engine {name!r} was not asked for; asked: {[s.engine for s in self.engines]}")

    def to_dict(self) -> dict:
        return {"acceptance": json_number(self.acceptance), "k_star": self.k_star, "speedup": json_number(self.speedup),
                "n_min": self.n_min, "engines": [s.to_dict() for s in self.engines]}


@dataclass(frozen=True)
class Recommendations:
    """`recommend`'s result: the inputs, what follows from V alone, and one Recommendation per acceptance."""

    step_times: tuple  # V(0..kmax)
    first_draft_threshold: Any  # a0 = V(1)/V(0) - 1, (B.4)
    step_points: tuple  # a_1..a_kmax, (B.31)
    p_min: Any  # the draft-probability floor, before rounding for the flag
    draft: str | None
    prompt_lookup: int | None
    rows: tuple[Recommendation, ...]

    def to_dict(self) -> dict:
        return {"step_times": [json_number(v) for v in self.step_times],
                "first_draft_threshold": json_number(self.first_draft_threshold),
                "step_points": [json_number(x) for x in self.step_points], "p_min": json_number(self.p_min),
                "draft": self.draft, "prompt_lookup": self.prompt_lookup, "batch_size": 1,
                "rows": [r.to_dict() for r in self.rows]}


def shortest_paying_draft(V: Sequence, a) -> int:
    """n-min: the smallest j >= 1 with T_a(j) > T_a(0), the speedup condition (8); 0 when no j has it.

    j <= k*(a) whenever k*(a) >= 1, since k* itself satisfies (8).
    """
    V = check_step_times(V)
    return next((j for j in range(1, len(V)) if speedup_condition(V, a, j)), 0)


def draft_probability_floor(V: Sequence):
    """p-min = min_i c_i / V(0), clipped to [0, 1]. Needs kmax >= 1.

    Below it no draft token pays: m more tokens, the first of acceptance q < p-min, gain at most q*m
    expected tokens and cost at least m*min_i c_i (docs/settings.md). 0 when some c_i <= 0.
    Equals a0 = a_1 for convex non-decreasing V (c_1 is then the smallest increment).
    """
    V = check_step_times(V)
    if len(V) < 2:
        raise ValueError(f"the draft-probability floor needs V(0) and V(1); got {len(V)} step time(s)")
    floor = exact_div(min(increments(V)), V[0])
    zero, one = (0, 1) if isinstance(floor, (int, Fraction)) else (0.0, 1.0)
    return min(max(floor, zero), one)


def flag_number(x, places: int = P_MIN_PLACES) -> str:
    """`x` as a decimal flag value, rounded up to `places` decimals ('0.1' stays '0.1')."""
    d = Decimal(x.numerator) / Decimal(x.denominator) if isinstance(x, Fraction) else Decimal(str(x))
    return format(d.quantize(Decimal(1).scaleb(-places), rounding=ROUND_CEILING).normalize(), "f")


def _draft_kind(draft: str | None, prompt_lookup: int | None) -> str:
    """"model" or "lookup", checking that at most one draft source is named."""
    if draft is not None and prompt_lookup is not None:
        raise ValueError(f"give a draft model ({draft!r}) or prompt lookup ({prompt_lookup}), not both")
    if prompt_lookup is not None and (isinstance(prompt_lookup, bool) or not isinstance(prompt_lookup, int)
                                      or prompt_lookup < 1):
        raise ValueError(f"prompt lookup n-gram size {prompt_lookup!r} must be an int >= 1")
    if draft is not None and not draft.strip():
        raise ValueError("the draft model name is empty; give a path or a model name")
    return "lookup" if prompt_lookup is not None else "model"


def llama_cpp_settings(*, k: int, n_min: int, p_min, draft: str | None = None,
                       prompt_lookup: int | None = None) -> Settings:
    """llama-server / llama-speculative-simple flags: draft-simple with a GGUF draft, or ngram-mod lookup."""
    kind = _draft_kind(draft, prompt_lookup)
    if k == 0:
        off = Setting("--spec-type", "none", "no speculative decoding: the target decodes one token a step",
                      f"{LLAMA_ARG}:4249; names {LLAMA_SPEC}:34; default none, llama.cpp common/common.h:373")
        return Settings("llama.cpp", False, (off,), "--spec-type none",
                        "speculation does not pay: drop -md and pass --spec-type none (the default)")
    if kind == "lookup":
        values = (
            Setting("--spec-type", "ngram-mod", "draft by n-gram lookup in a hashed pool of the context",
                    f"{LLAMA_ARG}:4249; {LLAMA_SPEC}:43"),
            Setting("--spec-ngram-mod-n-match", prompt_lookup, "length of the n-gram looked up",
                    f"{LLAMA_ARG}:4279"),
            Setting("--spec-ngram-mod-n-max", k, "draft length k*(a): lookup stops after this many tokens",
                    f"{LLAMA_ARG}:4269; {LLAMA_SPEC}:1954", True),
            Setting("--spec-ngram-mod-n-min", n_min, "a lookup that ends before this many tokens drafts nothing",
                    f"{LLAMA_ARG}:4259; {LLAMA_SPEC}:1957", True),
        )
        note = "n-gram drafts have no probabilities: no p-min"
        if prompt_lookup < 16:
            note += f"; llama.cpp warns that n-match {prompt_lookup} < 16 may draft poorly ({LLAMA_SPEC}:1886)"
    else:
        values = (
            Setting("--spec-type", "draft-simple", "standalone draft model, one token at a time",
                    f"{LLAMA_ARG}:4249; {LLAMA_SPEC}:35"),
            Setting("-md", draft or DRAFT_PLACEHOLDER, "draft model GGUF file", f"{LLAMA_ARG}:4241"),
            Setting("--spec-draft-n-max", k, "draft length k*(a): drafting stops after this many tokens",
                    f"{LLAMA_ARG}:4140; {LLAMA_SPEC}:380", True),
            Setting("--spec-draft-n-min", n_min,
                    "drafts shorter than this are thrown away and one token is decoded instead",
                    f"{LLAMA_ARG}:4150; {LLAMA_SPEC}:409", True),
            Setting("--spec-draft-p-min", float(flag_number(p_min)),
                    "drafting stops at the first token whose draft probability is below this",
                    f"{LLAMA_ARG}:4197; {LLAMA_SPEC}:366", True),
        )
        note = "p-min reads the draft's top-token probability as that token's acceptance"
    fragment = " ".join(f"{s.name} {shlex.quote(str(s.value))}" for s in values)
    return Settings("llama.cpp", True, values, fragment, note)


def vllm_settings(*, k: int, draft: str | None = None, prompt_lookup: int | None = None) -> Settings:
    """vLLM's --speculative-config JSON for batch 1: draft_model with "model", or ngram prompt lookup."""
    kind = _draft_kind(draft, prompt_lookup)
    if k == 0:
        return Settings("vllm", False, (), "", "speculation does not pay: omit --speculative-config "
                        "(vLLM takes num_speculative_tokens > 0 only)")
    n = Setting("num_speculative_tokens", k, "draft length k*(a), at batch size 1", VLLM_CONFIG, True)
    if kind == "lookup":
        values = (Setting("method", "ngram", "draft by matching n-grams of the prompt and output", VLLM_CONFIG), n,
                  Setting("prompt_lookup_max", prompt_lookup, "longest n-gram window matched", VLLM_CONFIG),
                  Setting("prompt_lookup_min", 1, "shortest n-gram window matched (moespec's lookup tries n..1)",
                          VLLM_CONFIG))
    else:
        values = (Setting("method", "draft_model", "standalone draft model", VLLM_CONFIG),
                  Setting("model", draft or DRAFT_PLACEHOLDER, "draft model name or path", VLLM_CONFIG), n)
    config = json.dumps({s.name: s.value for s in values})
    return Settings("vllm", True, values, f"--speculative-config {shlex.quote(config)}",
                    "batch size 1 only: moespec does not model batch > 1, so it gives no value for it")


def sglang_settings(*, k: int, draft: str | None = None, prompt_lookup: int | None = None) -> Settings:
    """SGLang server flags for a chain of k drafts: STANDALONE with a draft model, or NGRAM lookup."""
    kind = _draft_kind(draft, prompt_lookup)
    if k == 0:
        return Settings("sglang", False, (), "", "speculation does not pay: omit --speculative-algorithm")
    tokens = Setting("--speculative-num-draft-tokens", k + 1,
                     "tokens in the verify pass: the last accepted token and k*(a) drafts",
                     f"{SGLANG_HOOK} (_handle_eagle_family: steps + 1 at topk 1; ngram: cpp_ngram/result.cpp)", True)
    if kind == "lookup":
        values = (Setting("--speculative-algorithm", "NGRAM", "draft from an n-gram cache of the context", SGLANG_DOC),
                  tokens,
                  Setting("--speculative-ngram-max-bfs-breadth", 1, "one branch per level: a chain, not a tree",
                          f"{SGLANG_HOOK} (_handle_ngram: topk = max-bfs-breadth)"),
                  Setting("--speculative-ngram-min-bfs-breadth", 1, "one branch per level", SGLANG_DOC),
                  Setting("--speculative-ngram-max-match-window-size", prompt_lookup, "longest n-gram window matched",
                          SGLANG_DOC),
                  Setting("--speculative-ngram-min-match-window-size", 1, "shortest n-gram window matched",
                          SGLANG_DOC))
    else:
        values = (Setting("--speculative-algorithm", "STANDALONE", "standalone draft model", SGLANG_DOC),
                  Setting("--speculative-draft-model-path", draft or DRAFT_PLACEHOLDER, "draft model name or path",
                          SGLANG_DOC),
                  Setting("--speculative-num-steps", k, "draft length k*(a): autoregressive draft steps",
                          SGLANG_DOC, True),
                  Setting("--speculative-eagle-topk", 1, "one candidate per step: a chain, not a tree", SGLANG_DOC),
                  tokens)
    fragment = " ".join(f"{s.name} {shlex.quote(str(s.value))}" for s in values)
    return Settings("sglang", True, values, fragment,
                    "batch size 1 only: moespec does not model batch > 1, so it gives no value for it")


def _engine_settings(engine: str, *, k: int, n_min: int, p_min, draft: str | None,
                     prompt_lookup: int | None) -> Settings:
    if engine == "llama.cpp":
        return llama_cpp_settings(k=k, n_min=n_min, p_min=p_min, draft=draft, prompt_lookup=prompt_lookup)
    if engine == "vllm":
        return vllm_settings(k=k, draft=draft, prompt_lookup=prompt_lookup)
    return sglang_settings(k=k, draft=draft, prompt_lookup=prompt_lookup)


def recommend(V: Sequence, acceptances: Sequence, *, draft: str | None = None, prompt_lookup: int | None = None,
              engines: Sequence[str] = ENGINES) -> Recommendations:
    """k*(a), its speedup (9), n-min and every engine's settings at each acceptance, for one V (kmax >= 1).

    V: [kmax+1] step times, any unit; exact (int/Fraction) inputs give exact k*, n-min and p-min.
    """
    V = check_step_times(V)
    if len(V) < 2:
        raise ValueError(f"got {len(V)} step time; give V(0), V(1), ..., V(kmax) with kmax >= 1 to choose a draft")
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise ValueError(f"unknown engine(s) {unknown}; choose from {ENGINES}")
    _draft_kind(draft, prompt_lookup)
    p_min = draft_probability_floor(V)
    rows = []
    for a in acceptances:
        a = check_acceptance(a)
        k = best_draft_length(V, a)
        n_min = shortest_paying_draft(V, a)
        values = tuple(_engine_settings(e, k=k, n_min=n_min, p_min=p_min, draft=draft, prompt_lookup=prompt_lookup)
                       for e in engines)
        rows.append(Recommendation(a, k, speedup(V, a, k), n_min, values))
    return Recommendations(tuple(V), first_draft_threshold(V), tuple(step_points(V)), p_min, draft, prompt_lookup,
                           tuple(rows))


# ---- batch size B > 1: one draft length per batch size (costmodel.batch) ----

VLLM_DYNAMIC = "vllm vllm/v1/spec_decode/dynamic/utils.py (num_speculative_tokens_per_batch_size)"
SGLANG_ADAPTIVE = "sglang python/sglang/srt/speculative/adaptive_spec_params.py"


@dataclass(frozen=True)
class BatchRecommendation:
    """One acceptance at several batch sizes: k*(a, B), the total speedup at each B, and the engines'
    settings (vLLM's ranges; llama-server and SGLang one line per B, since each takes one k)."""

    acceptance: Any
    k_star: dict  # {B: k*(a, B)}
    speedup: dict  # {B: T_{a,B}(k*)/T_{a,B}(0)}
    vllm: Settings
    per_batch: dict  # {B: (llama.cpp Settings with -np B, SGLang Settings)}

    def to_dict(self) -> dict:
        return {"acceptance": json_number(self.acceptance), "k_star": {str(B): k for B, k in self.k_star.items()},
                "speedup": {str(B): json_number(s) for B, s in self.speedup.items()}, "vllm": self.vllm.to_dict(),
                "per_batch": {str(B): [s.to_dict() for s in pair] for B, pair in self.per_batch.items()}}


def batch_ranges(k_by_batch: dict, max_batch: int | None = None) -> list[list[int]]:
    """vLLM's [[lo, hi, K], ...] (inclusive) from k at the batch sizes given: B_i covers B_i..B_{i+1}-1,
    the first range starts at 1 (vLLM requires it: k at the smallest B given stands for the sizes below),
    the last ends at max_batch (default: the largest B given; vLLM keeps the last K above it), and
    neighbours with equal K merge."""
    sizes = sorted(int(B) for B in k_by_batch)
    if not sizes or sizes[0] < 1:
        raise ValueError(f"need batch sizes >= 1, got {sorted(k_by_batch)}")
    top = sizes[-1] if max_batch is None else int(max_batch)
    if top < sizes[-1]:
        raise ValueError(f"max_batch {max_batch} is below the largest batch size given, {sizes[-1]}")
    ranges: list[list[int]] = []
    for i, B in enumerate(sizes):
        lo, hi, K = 1 if i == 0 else B, sizes[i + 1] - 1 if i + 1 < len(sizes) else top, int(k_by_batch[B])
        if ranges and ranges[-1][2] == K:
            ranges[-1][1] = hi
        else:
            ranges.append([lo, hi, K])
    return ranges


def vllm_batch_settings(k_by_batch: dict, *, draft: str | None = None, prompt_lookup: int | None = None,
                        max_batch: int | None = None) -> Settings:
    """vLLM's --speculative-config with a draft length per batch-size range: num_speculative_tokens is
    the largest k*(a, B) (vLLM caps every range's K by it), num_speculative_tokens_per_batch_size the
    ranges (`batch_ranges`)."""
    top = max(k_by_batch.values())
    if top == 0:
        return Settings("vllm", False, (), "", "speculation pays at none of these batch sizes: omit "
                        "--speculative-config")
    single = vllm_settings(k=top, draft=draft, prompt_lookup=prompt_lookup)
    ranges = batch_ranges(k_by_batch, max_batch)
    per = Setting("num_speculative_tokens_per_batch_size", ranges,
                  "[first batch size, last batch size, draft length] per range: k*(a, B) over the batch sizes "
                  "measured", VLLM_DYNAMIC, True)
    values = tuple(Setting(s.name, s.value, "the largest draft length of the ranges (it caps them)", s.source, True)
                   if s.name == "num_speculative_tokens" else s for s in single.values) + (per,)
    config = json.dumps({s.name: s.value for s in values})
    return Settings("vllm", True, values, f"--speculative-config {shlex.quote(config)}",
                    f"batch sizes above {ranges[-1][1]} keep the last range's draft length")


def _with_slots(s: Settings, B: int) -> Settings:
    """llama-server's settings for -np B slots (its draft length is one for all slots)."""
    slots = Setting("-np", B, "parallel slots: up to B sequences decoded together", f"{LLAMA_ARG} (--parallel)")
    values = (slots, *s.values)
    return Settings(s.engine, s.speculate, values, f"-np {B} {s.fragment}".strip(), s.note)


def recommend_batches(V_by_batch: dict, acceptances: Sequence, *, draft: str | None = None,
                      prompt_lookup: int | None = None, max_batch: int | None = None) -> list[BatchRecommendation]:
    """k*(a, B) and the engines' settings at each acceptance from V_B(0..kmax) at each batch size B
    ({B: V_B}, kmax >= 1 at every B; any one unit). vLLM takes the whole schedule; llama-server
    (`-np B`) and SGLang take one draft length for every batch, so each B gets its own line (SGLang's
    --speculative-adaptive adapts the steps to the acceptance, not to the batch size)."""
    _draft_kind(draft, prompt_lookup)
    checked = {}
    for B, V in sorted(V_by_batch.items()):
        V = check_step_times(V)
        if len(V) < 2:
            raise ValueError(f"batch size {B}: give V_B(0), V_B(1), ... (kmax >= 1), got {len(V)} step time")
        checked[int(B)] = V
    if not checked:
        raise ValueError("give the step times of at least one batch size")
    rows = []
    for a in acceptances:
        a = check_acceptance(a)
        ks = {B: best_draft_length(V, a) for B, V in checked.items()}
        per = {}
        for B, V in checked.items():
            k, n_min = ks[B], shortest_paying_draft(V, a)
            llama = llama_cpp_settings(k=k, n_min=n_min, p_min=draft_probability_floor(V), draft=draft,
                                       prompt_lookup=prompt_lookup)
            per[B] = (_with_slots(llama, B), sglang_settings(k=k, draft=draft, prompt_lookup=prompt_lookup))
        rows.append(BatchRecommendation(a, ks, {B: speedup(V, a, ks[B]) for B, V in checked.items()},
                                        vllm_batch_settings(ks, draft=draft, prompt_lookup=prompt_lookup,
                                                            max_batch=max_batch), per))
    return rows
