"""llama.cpp's own speculative decoding on the held-out half, beside moespec's check (issue 50, item 4).

For each candidate llama.cpp can run (a GGUF draft file, prompt lookup as ngram-mod, ngram-mod,
ngram-simple; not the oracle), `llama-speculative-simple` built from the same llama.cpp source
(`models.llama_tools`) decodes the held-out prompts at plain decoding, moespec's emitted settings,
llama.cpp's defaults and each n-max = 1..kmax (`bench.llama_settings`, `bench.llama_speculative`).
The artifact "candidates-llama" holds each setting's tokens/s and speedup over plain, the best n-max in
hindsight (over 0..kmax, 0 being plain) and the goals of issue 50:

- emitted >= 0.97x the best n-max in hindsight;
- emitted >= 1.1x llama.cpp's defaults where speculation pays (the best n-max in hindsight beats plain);
- emitted never below plain where moespec's answer for the candidate says it pays (k̂* > 0).
"""

from __future__ import annotations

import importlib.metadata
import math
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from moespec import artifacts, run_files
from moespec.bench.llama_settings import (
    DEFAULTS,
    EMITTED,
    PLAIN,
    PLAIN_ARGS,
    LlamaSetting,
    drafter_args,
    header_defaults,
    settings_for,
)
from moespec.bench.llama_speculative import SettingTimes, time_settings

LLAMA_CHECK, LLAMA_CHECK_KIND = run_files.CANDIDATES_LLAMA, run_files.KINDS[run_files.CANDIDATES_LLAMA]
from moespec.report.candidates import GOAL_BEST, GOAL_DEFAULTS, GOAL_PLAIN
CONTEXT_MARGIN = 64  # llama.cpp's own tokens (BOS, a chat template's) beyond moespec's count of the prompt
# a setting's repetitions of one prompt last at least MIN_RUN_S in all: a decode of tens of milliseconds
# (48 tokens of a small model) moved by 10% and more between runs of one setting (BENCHMARKS.md, "The
# answer for your own drafts"); at most MAX_RUN_REPS of them
MIN_RUN_S, MAX_RUN_REPS = 1.0, 12


def context_size(prompt_ids: Sequence[Sequence[int]], new_tokens: int, kmax: int) -> int:
    """A context that holds the longest prompt, its new tokens and a last draft, rounded up to 256."""
    need = max(len(p) for p in prompt_ids) + new_tokens + kmax + CONTEXT_MARGIN
    return -(-need // 256) * 256


def run_reps(binary: Path, *, target: str, prompt: str, threads: int | None, new_tokens: int, reps: int,
             context: int, run=None) -> tuple[int, float]:
    """(repetitions per setting, plain decoding's tokens/s): `reps`, or more where `reps` runs of
    new_tokens would decode in under MIN_RUN_S (at most MAX_RUN_REPS), from one plain run of `prompt`.
    Every run decodes new_tokens, the length the answer's acceptance was measured at: an n-gram rule
    accepts more the further a small model's text runs on (its loops), so longer runs check another
    workload (SmolLM2's ngram-mod at 4 drafts: 1.45 tokens a round over 48 new tokens on moespec's
    engine, 1.54 over 144 on llama.cpp's)."""
    extra = {} if run is None else {"run": run}
    probe = time_settings(binary, target=target, prompts=[prompt], settings=[LlamaSetting(PLAIN, PLAIN_ARGS, 0)],
                          threads=threads, new_tokens=new_tokens, reps=1, context=context, **extra)[0]
    rate = probe.tokens_per_s
    wanted = math.ceil(MIN_RUN_S * rate / new_tokens) if math.isfinite(rate) else reps
    return max(reps, min(MAX_RUN_REPS, wanted)), rate


def runnable(candidate: Mapping) -> tuple[dict | None, str | None]:
    """(the candidate with its draft resolved to a file, None) when llama.cpp can run it, else
    (None, why not)."""
    from moespec.models.gguf import is_gguf, resolve

    try:
        drafter_args(candidate)
    except ValueError as exc:
        return None, str(exc)
    if candidate["kind"] != "draft":
        return dict(candidate), None
    if not is_gguf(candidate["draft"]):
        return None, f"draft {candidate['draft']!r} is not a GGUF file; llama.cpp runs GGUF drafts only"
    return {**candidate, "draft": str(resolve(candidate["draft"]))}, None


def goal(value: float, target: float, applies: bool) -> dict:
    return {"value": value, "goal": target, "applies": applies, "met": (value >= target) if applies else None}


def candidate_figures(prediction: Mapping, times: Sequence[SettingTimes], defaults: Mapping) -> dict:
    """One candidate's tokens/s and speedup per setting, its best n-max in hindsight and the goals. An
    n-max whose runs accepted no draft decoded plainly (an n-gram rule that found no match drafts
    nothing): it is not a best n-max, and its speed against plain's is the machine's noise."""
    by_name = {t.setting.name: t for t in times}
    plain = by_name[PLAIN].tokens_per_s
    sweep = [by_name[PLAIN]] + [t for t in times if t.setting.name.startswith("n-max ") and t.accepted > 0]
    best = max(sweep, key=lambda t: t.tokens_per_s)  # max keeps the first (shortest) of equals
    speculation_pays = best.setting.n_max > 0 and best.tokens_per_s > plain
    emitted, default = by_name[EMITTED].tokens_per_s, by_name[DEFAULTS].tokens_per_s
    k_llama = int((prediction.get("llama_answer") or prediction["answer"])["k_star"])  # its line's draft length
    pays = k_llama > 0
    drafter = drafter_args(prediction["candidate"])[0]
    return {
        "name": prediction["name"], "candidate": dict(prediction["candidate"]), "drafter": drafter,
        "skipped": None, "predicted_k": k_llama, "answer_pays": pays,
        "emitted_n_max": by_name[EMITTED].setting.n_max, "defaults_values": dict(defaults[drafter]),
        "plain_tokens_per_s": plain, "emitted_tokens_per_s": emitted, "defaults_tokens_per_s": default,
        "best_n_max": best.setting.n_max, "best_tokens_per_s": best.tokens_per_s,
        "speculation_pays": speculation_pays,
        "settings": [{**t.to_dict(), "speedup": t.tokens_per_s / plain} for t in times],
        "goals": {"emitted_vs_best": goal(emitted / best.tokens_per_s, GOAL_BEST, True),
                  "emitted_vs_defaults": goal(emitted / default, GOAL_DEFAULTS, speculation_pays),
                  "emitted_vs_plain": goal(emitted / plain, GOAL_PLAIN, pays)},
    }


def check_candidates(predictions: Sequence[Mapping], *, binary: Path, target: str, heldout: Sequence[str],
                     defaults: Mapping, threads: int | None, new_tokens: int, kmax: int, reps: int,
                     context: int, run=None, progress: Callable[[str], None] | None = None) -> list[dict]:
    """candidate_figures for each prediction llama.cpp can run; the others with `skipped` saying why."""
    out = []
    for pred in predictions:
        candidate, why = runnable(pred["candidate"])
        twin = pred["settings"]["llama.cpp"].get("priced_by")
        if twin is not None:
            candidate, why = None, f"llama.cpp runs its line, that of {twin!r}: checked there"
        if candidate is None:
            out.append({"name": pred["name"], "candidate": dict(pred["candidate"]), "skipped": why})
            continue
        settings = settings_for(candidate, pred["settings"]["llama.cpp"]["fragment"], kmax)
        extra = {} if run is None else {"run": run}
        times = time_settings(binary, target=target, prompts=heldout, settings=settings, threads=threads,
                              new_tokens=new_tokens, reps=reps, context=context, progress=progress, **extra)
        out.append(candidate_figures({**pred, "candidate": candidate}, times, defaults))
    return out


def llama_check_step(*, prompts: Path, candidates: Path, target_file: str | None, threads: int | None,
                     new_tokens: int, kmax: int, reps: int, path: Path, run=None, binary: Path | None = None,
                     progress: Callable[[str], None] | None = None) -> None:
    """candidates-llama.json: llama.cpp's own speculative decoding of the held-out prompts per candidate
    (module docstring), each run decoding new_tokens, `reps` times or, on a model fast enough to decode
    those in under MIN_RUN_S, more (`run_reps`). run, binary: a stand-in for subprocess.run and the binary (the tests')."""
    from moespec.models.gguf import is_gguf, resolve
    from moespec.models.llama_convert import source_dir
    from moespec.models.llama_tools import build_speculative

    if target_file is None or not is_gguf(target_file):
        raise ValueError(f"llama.cpp's check needs the target as a GGUF file, not {target_file!r}; run the demo "
                         "with --model FILE.gguf")
    halves = artifacts.load(prompts, run_files.KINDS[run_files.PROMPTS])["payload"]
    doc = artifacts.load(candidates, run_files.KINDS[run_files.CANDIDATES])["payload"]
    binary = binary or build_speculative()
    defaults = header_defaults(source_dir() / "common" / "common.h")
    target = str(resolve(target_file))
    context = context_size(halves["heldout"], new_tokens, kmax)
    runs, rate = run_reps(binary, target=target, prompt=halves["heldout_texts"][0], threads=threads,
                          new_tokens=new_tokens, reps=reps, context=context, run=run)
    figures = check_candidates(doc["candidates"], binary=binary, target=target, heldout=halves["heldout_texts"],
                               defaults=defaults, threads=threads, new_tokens=new_tokens, kmax=kmax, reps=runs,
                               context=context, run=run, progress=progress)
    artifacts.write(path, LLAMA_CHECK_KIND, {
        "binary": str(binary), "llama_cpp_python": importlib.metadata.version("llama-cpp-python"),
        "target": target, "threads": threads, "new_tokens": new_tokens, "probe_tokens_per_s": rate,
        "kmax": kmax, "reps": runs, "asked_reps": reps,
        "context": context, "prompts": len(halves["heldout_texts"]), "defaults": defaults,
        "answer": doc["answer"].get("best"), "candidates": figures})
