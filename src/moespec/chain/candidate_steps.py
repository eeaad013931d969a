"""The user's candidate drafts as steps of `moespec demo` (issue 50), after the chain's prediction.

1. prompts: the user's prompts (`--prompts FILE`) or the shipped ones, encoded and split into a
   calibration and a held-out half (`bench.candidate.split_prompts`: by content, not by order);
2. per candidate, its calibration on the calibration half only (`chain.candidates.calibrate`): the
   acceptance by position α_1..α_kmax and its own cost h(k);
3. where the demo runs the batch chain on llama.cpp, per GGUF draft model its own cost at each batch
   size B of the chain, h_B(k) (`bench.batch_draft_cost`, on the calibration half's prompts);
   the target's passes on the calibration half as decoding meets them (`bench.target_passes`);
   the answer over the candidates (`chain.candidate_answer`): V̂(k) = τ̄(k) + ĥ(k) with the passes
   just timed (the chain's calibrated τ̂ beside them), k̂*, the speedup and its band, the lines for
   llama-server, vLLM and SGLang;
   with the batch chain, each candidate's k̂*(B) (`chain.candidate_batch`);
4. per candidate, the held-out check (`chain.candidate_check.check_heldout`): moespec's engine at
   every fixed k = 0..kmax on prompts the calibration never read;
5. the score: k̂* against the measured best k, the speedup error, the named best against the measured.

Each step is reused when its artifact exists and was made from the same parents (`chain.run_folder`);
a candidate or a setting changed on the command line remakes that candidate's artifacts only.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from moespec import artifacts, run_files
from moespec.chain.run_folder import HELD, OWN, Step, drop, settings_changed
from moespec.kernel_names import COST_AUTO, COST_DEDUP

MAX_PROMPT_TOKENS = 512  # a prompt longer than this is refused: the chain's context holds it and the draft


def candidate_kmax(ns: Sequence[int], ks: Sequence[int]) -> int:
    """The longest draft the candidates are priced at: the prediction's passes reach n = max(ns)
    tokens (k = n - 1) and its h(k) reaches max(ks)."""
    return max(1, min(max(ns) - 1, max(ks)))


def default_prompts(tokenizer, prompt_tokens: int) -> list:
    """The shipped prompts: the chat requests (`texts.chat_prompts`, edit and open) through the
    tokenizer's chat template where it has one, else the six built-in texts cut to `prompt_tokens`."""
    from moespec import texts

    if getattr(tokenizer, "chat_template", None) is not None:
        return [[{"role": "user", "content": r}] for kind in texts.CHAT_KINDS for r in texts.chat_prompts(kind)]
    return texts.prompt_ids(tokenizer, prompt_tokens)


def file_digest(path: str | Path) -> str:
    return hashlib.sha256(Path(path).expanduser().read_bytes()).hexdigest()[:16]


def prompts_step(model, tokenizer, *, source: str | None, prompt_tokens: int, path: Path) -> None:
    """prompts.json: every prompt's token ids and text, split into the calibration and held-out halves."""
    from moespec.bench.candidate import read_prompts, split_prompts
    from moespec.chain.candidates import prompt_ids

    prompts = read_prompts(source) if source else default_prompts(tokenizer, prompt_tokens)
    ids = prompt_ids(tokenizer, prompts)
    for i, p in enumerate(ids, 1):
        if not p:
            raise ValueError(f"prompt {i} of {source or 'the shipped prompts'} encodes to no tokens; remove it")
        if len(p) > MAX_PROMPT_TOKENS:
            raise ValueError(f"prompt {i} of {source or 'the shipped prompts'} has {len(p)} tokens, over the "
                             f"{MAX_PROMPT_TOKENS} the candidates' answer takes; shorten it")
    calibration, heldout = split_prompts(ids)
    decode = lambda half: [prompt_text(tokenizer, p) for p in half]  # noqa: E731  llama.cpp's own runs take text
    artifacts.write(path, run_files.KINDS[run_files.PROMPTS], {
        "source": str(source) if source else "shipped", "digest": file_digest(source) if source else None,
        "prompt_tokens": prompt_tokens, "calibration": calibration, "heldout": heldout,
        "calibration_texts": decode(calibration), "heldout_texts": decode(heldout)})


def prompt_text(tokenizer, ids) -> str:
    """The prompt as text llama.cpp tokenizes back to `ids`: its special tokens (a chat template's) kept,
    a leading BOS left to llama.cpp, which adds its own."""
    bos = getattr(tokenizer, "bos_token_id", None)
    ids = list(ids)[1:] if bos is not None and ids and ids[0] == bos else ids
    try:
        return tokenizer.decode(ids, skip_special_tokens=False)
    except TypeError:  # a tokenizer without the option keeps them
        return tokenizer.decode(ids)


def draft_loader(threads: int | None, context: int | None):
    """How a draft model is loaded: a GGUF file on llama.cpp at the chain's threads and context."""
    def load(spec: str):
        from moespec.models import load as load_model
        from moespec.models.gguf import is_gguf

        if is_gguf(spec):
            return load_model(spec, backend="llama.cpp", threads=threads, n_ctx=context)
        return load_model(spec)

    return load


@contextlib.contextmanager
def opened(candidate: dict, prompts: Path, *, tokenizer, target_file: str | None, threads: int | None,
           context: int | None) -> Iterator[tuple[Any, dict]]:
    """(the candidate loaded, the prompts' halves); a draft model is closed on leaving."""
    from moespec.chain.candidates import Candidate, load_candidate

    halves = artifacts.load(prompts, run_files.KINDS[run_files.PROMPTS])["payload"]
    loaded = load_candidate(Candidate.from_dict(candidate), tokenizer=tokenizer, load=draft_loader(threads, context),
                            target_file=target_file)
    try:
        yield loaded, halves
    finally:
        close = getattr(loaded.model, "close", None)
        if close is not None:
            close()


def calibrate_step(model, tokenizer, *, candidate: dict, prompts: Path, knobs: dict, path: Path, **where) -> None:
    """One candidate's calibration on the calibration half: its acceptance by position and its h(k).
    where: target_file, threads, context (`opened`)."""
    from moespec.chain.candidates import calibrate

    with opened(candidate, prompts, tokenizer=tokenizer, **where) as (loaded, halves):
        cal = calibrate(model, tokenizer, loaded, halves["calibration"], kmax=knobs["kmax"],
                        new_tokens=knobs["new_tokens"], temperature=knobs["temperature"], top_p=knobs["top_p"],
                        seed=knobs["seed"], cost_reps=knobs["cost_reps"])
    artifacts.write(path, run_files.CALIBRATION_KIND, {**cal.to_dict(), "settings": dict(knobs)})


def passes_step(model, tokenizer, *, prompts: Path, knobs: dict, path: Path) -> None:
    """The target's passes of n = 1..kmax + 1 tokens and a plain step on the calibration half, as decoding
    meets them (`bench.target_passes`), `cost_reps` repetitions, each prompt's at the middle of its
    answer's depths (`passes_ahead`)."""
    from moespec.bench.target_passes import measure_target_passes
    from moespec.texts import vocab_limit

    ids = artifacts.load(prompts, run_files.KINDS[run_files.PROMPTS])["payload"]["calibration"]
    got = measure_target_passes(model, ids, kmax=knobs["kmax"], reps=knobs["cost_reps"],
                                vocab_limit=vocab_limit(tokenizer), greedy=knobs["temperature"] == 0,
                                ahead=passes_ahead(knobs))
    artifacts.write(path, run_files.KINDS[run_files.PASSES], {**got.to_dict(), "half": "calibration",
                                                              "settings": dict(knobs)})


def passes_ahead(knobs: Mapping[str, Any]) -> int:
    """Tokens decoded past a prompt before its passes are timed: half the answer's new tokens, the middle
    of the depths its rounds run at."""
    return int(knobs["new_tokens"]) // 2


def check_step(model, tokenizer, *, candidate: dict, prompts: Path, knobs: dict, path: Path, **where) -> None:
    """One candidate at every fixed k = 0..kmax on the held-out half, timed by moespec's engine."""
    from moespec.chain.candidate_check import check_heldout

    with opened(candidate, prompts, tokenizer=tokenizer, **where) as (loaded, halves):
        check = check_heldout(model, tokenizer, loaded, halves["heldout"], kmax=knobs["kmax"],
                              new_tokens=knobs["new_tokens"], reps=knobs["check_reps"], seed=knobs["seed"],
                              temperature=knobs["temperature"], top_p=knobs["top_p"],
                              min_seconds=knobs.get("check_seconds", 0.0))
    artifacts.write(path, run_files.CHECK_KIND, {**check.to_dict(), "settings": dict(knobs)})


def batch_cost_file(index: int) -> str:
    """A draft model's h_B(k) (`batch_cost_step`) for the candidate at `index`."""
    return f"{run_files.CANDIDATE}{index}{run_files.BATCH_COST_SUFFIX}"


def batch_cost_step(model, tokenizer, *, candidate: dict, prompts: Path, measurement: Path, knobs: dict, path: Path,
                    threads: int | None) -> None:
    """A GGUF draft's h_B(k) at the batch chain's batch sizes and threads, on llama.cpp, for k up to the
    shorter of the candidate's kmax and the chain's max_k (`bench.batch_draft_cost`): each sequence
    holds a prompt of the calibration half, as h(k) at B = 1 is timed at the first one's depth."""
    from moespec.bench.batch_draft_cost import measure_batch_draft_cost
    from moespec.models import load as load_model
    from moespec.texts import vocab_limit

    ids = artifacts.load(prompts, run_files.KINDS[run_files.PROMPTS])["payload"]["calibration"]
    chain = artifacts.load(measurement, run_files.KINDS[run_files.BATCH_MEASUREMENT])["payload"]
    sizes, kmax = [int(B) for B in chain["sizes"]], min(int(knobs["kmax"]), int(chain["max_k"]))
    draft, _ = load_model(candidate["draft"], backend="llama.cpp", threads=threads, sequences=max(sizes),
                          n_ctx=max(len(p) for p in ids) + kmax + 2)
    try:
        cost = measure_batch_draft_cost(draft, ids, sizes=sizes, kmax=kmax, reps=knobs["cost_reps"],
                                        temperature=knobs["temperature"], vocab_limit=vocab_limit(tokenizer))
    finally:
        draft.close()
    artifacts.write(path, run_files.BATCH_COST_KIND, {"candidate": candidate, **cost.to_dict(), "kmax": kmax,
                                                      "half": "calibration", "settings": dict(knobs)})


def answer_step(*, prediction: Path, calibrations: Sequence[Path], kernel: str, path: Path,
                batch_prediction: Path | None = None, batch_costs: Sequence[Path | None] = (),
                passes: Path | None = None, measurement_base: Path | None = None) -> None:
    """candidates.json: each candidate's prediction and the answer over them, its rounds priced with the
    target's `passes` where given (and the engine's h(k) from `measurement_base` where the prediction
    fitted no version: `candidate_answer.base_passes`); with the batch chain's
    prediction, each candidate's k̂*(B) and vLLM's per-batch-size line (`chain.candidate_batch`; a
    draft model's from its h_B(k) in `batch_costs`, one path or None per candidate)."""
    from moespec.bench.target_passes import TargetPasses
    from moespec.chain.candidate_answer import answer_for, lookup_lines, predict_candidate
    from moespec.chain.candidates import CandidateCalibration

    doc = artifacts.load(prediction, run_files.KINDS[run_files.PREDICTION])
    cals = [CandidateCalibration.from_dict(artifacts.load(c, run_files.CALIBRATION_KIND)["payload"])
            for c in calibrations]
    timed = None if passes is None else \
        TargetPasses.from_dict(artifacts.load(passes, run_files.KINDS[run_files.PASSES])["payload"])
    base = None if measurement_base is None or not measurement_base.exists() else \
        artifacts.load(measurement_base, run_files.KINDS[run_files.MEASUREMENT_BASE])["payload"]
    preds = lookup_lines([predict_candidate(doc, cal, kernel=kernel, passes=timed, base=base) for cal in cals])
    got = {"candidates": [p.to_dict() for p in preds], "answer": answer_for(preds).to_dict()}
    if batch_prediction is not None and batch_prediction.exists():
        got["batch"] = batch_answer(batch_prediction, cals, batch_costs)
    artifacts.write(path, run_files.KINDS[run_files.CANDIDATES], got)


def batch_answer(batch_prediction: Path, calibrations, batch_costs: Sequence[Path | None] = ()) -> dict:
    """{name: the candidate's schedule and vLLM's line} at the batch chain's batch sizes; a draft
    model's h_B(k) read from its entry of `batch_costs` where it was timed (an existing file)."""
    from moespec.bench.batch_draft_cost import BatchDraftCost
    from moespec.chain.candidate_batch import candidate_schedule, schedule_settings

    payload = artifacts.load(batch_prediction, run_files.KINDS[run_files.BATCH_PREDICTION])["payload"]
    costs = list(batch_costs) + [None] * (len(calibrations) - len(batch_costs))
    out = {}
    for cal, cost in zip(calibrations, costs):
        timed = None if cost is None or not Path(cost).exists() else \
            BatchDraftCost.from_dict(artifacts.load(cost, run_files.BATCH_COST_KIND)["payload"])
        schedule = candidate_schedule(payload, cal, batch_cost=timed)
        out[cal.candidate.name] = {**schedule, "vllm": schedule_settings(cal.candidate.to_dict(), schedule)}
    return out


def score_step(*, candidates: Path, checks: Sequence[Path], path: Path) -> None:
    """candidates-score.json: every candidate's k̂* and speedup against its held-out check."""
    from moespec.chain.candidate_answer import CandidatePrediction
    from moespec.chain.candidate_check import HeldoutCheck, score_candidates

    preds = [CandidatePrediction.from_dict(d) for d in
             artifacts.load(candidates, run_files.KINDS[run_files.CANDIDATES])["payload"]["candidates"]]
    held = [HeldoutCheck.from_dict(artifacts.load(c, run_files.CHECK_KIND)["payload"]) for c in checks]
    score = score_candidates(preds, held)
    artifacts.write(path, run_files.KINDS[run_files.CANDIDATES_SCORE],
                    {**score.to_dict(), "checks": [h.to_dict() for h in held]})


def drop_changed(out: Path, candidates: Sequence[dict], knobs: Mapping[str, Any], source: str | None,
                 echo, batch: bool = False) -> None:
    """Remove what was made for another prompts file, candidate list or setting than this run's (the
    runner then makes it again; what was made from it is remade as its parents changed)."""
    p = out.joinpath
    if p(run_files.PROMPTS).exists():
        got = artifacts.load(p(run_files.PROMPTS), run_files.KINDS[run_files.PROMPTS])["payload"]
        want = {"source": str(source) if source else "shipped", "digest": file_digest(source) if source else None,
                "prompt_tokens": knobs["prompt_tokens"]}
        changed = settings_changed(got, want)
        if changed:
            echo(f"[prompts] {run_files.PROMPTS} was made with {changed}; splitting the prompts again")
            drop(out, [run_files.PROMPTS])
    names = [c["name"] for c in candidates]
    for path in sorted(out.glob(f"{run_files.CANDIDATE}*.json")):
        index, _, rest = path.name.removeprefix(run_files.CANDIDATE).partition("-")
        kind = {run_files.CALIBRATION_SUFFIX: run_files.CALIBRATION_KIND, run_files.CHECK_SUFFIX: run_files.CHECK_KIND,
                run_files.BATCH_COST_SUFFIX: run_files.BATCH_COST_KIND}.get("-" + rest)
        if kind is None or not index.isdigit():
            continue
        got = artifacts.load(path, kind)["payload"]
        if int(index) >= len(names) or got["candidate"]["name"] != names[int(index)] or \
                settings_changed(got.get("settings", {}), dict(knobs)) or \
                (kind == run_files.CALIBRATION_KIND and not got["measured"].get("at_k")):  # before runs at each k
            echo(f"[candidates] {path.name} was made for another candidate or settings; making it again")
            path.unlink()
    passes = p(run_files.PASSES)
    if passes.exists():
        got = artifacts.load(passes, run_files.KINDS[run_files.PASSES])["payload"]
        if settings_changed(got.get("settings", {}), dict(knobs)) or got.get("ahead", 0) != passes_ahead(knobs) or \
                "blocks" not in got:  # made before the timing kept its blocks (the price's noise)
            echo(f"[candidates] {run_files.PASSES} was made with other settings or depths; timing the passes again")
            passes.unlink()
    if p(run_files.CANDIDATES).exists():
        got = artifacts.load(p(run_files.CANDIDATES), run_files.KINDS[run_files.CANDIDATES])["payload"]
        from moespec.chain.candidate_batch import NOT_TIMED

        untimed = [n for n in timed_at_batch(candidates, batch) if got.get("batch", {}).get(n, {}).get("unavailable")
                   == NOT_TIMED]  # an answer made before h_B was timed
        if [c["name"] for c in got["candidates"]] != names or batch != ("batch" in got) or untimed:
            drop(out, [run_files.CANDIDATES, run_files.CANDIDATES_SCORE])


def timed_at_batch(candidates: Sequence[dict], batch: bool) -> list[str]:
    """The names of the candidates whose own cost is timed at batch size B: GGUF draft models, with the
    batch chain (a draft on torch has no batched pass on llama.cpp; host drafters need none)."""
    from moespec.chain.candidates import DRAFT
    from moespec.models.gguf import is_gguf

    return [c["name"] for c in candidates if batch and c["kind"] == DRAFT and is_gguf(c["draft"])]


def batch_cost_steps(out: Path, candidates: Sequence[dict], knobs: dict, *, prompts: Path, threads: int | None,
                     batch: bool) -> list[Step | None]:
    """Per candidate, the step timing its h_B(k) after the batch chain (`batch_cost_step`), or None where
    none is timed (`timed_at_batch`)."""
    timed = set(timed_at_batch(candidates, batch))
    measurement = out / run_files.BATCH_MEASUREMENT
    return [Step(f"batch-cost {c['name']}", out / batch_cost_file(i), batch_cost_step, dict(
        candidate=c, prompts=prompts, measurement=measurement, knobs=knobs, path=out / batch_cost_file(i),
        threads=threads), reads=(prompts, measurement), model=HELD) if c["name"] in timed else None
            for i, c in enumerate(candidates)]


def candidate_steps(out: Path, candidates: Sequence[dict], knobs: Mapping[str, Any], *, source: str | None,
                    target_file: str | None, threads: int | None, context: int | None, llama: bool,
                    batch: bool = False, echo=print, llama_check: bool = False) -> list[Step]:
    """The steps of the module docstring for `candidates` (`Candidate.to_dict()` each) in `out`, after
    its prediction (and the batch chain's, with `batch`). knobs: kmax, new_tokens, prompt_tokens,
    temperature, top_p, seed, cost_reps, check_reps. llama_check: then llama.cpp's own speculative
    decoding on the held-out half (`chain.candidate_llama`)."""
    if not candidates:
        return []
    p, knobs = out.joinpath, dict(knobs)
    drop_changed(out, candidates, knobs, source, echo, batch)
    prompts = p(run_files.PROMPTS)
    common = dict(prompts=prompts, knobs=knobs, target_file=target_file, threads=threads, context=context)
    cals = [p(run_files.calibration_file(i)) for i in range(len(candidates))]
    checks = [p(run_files.check_file(i)) for i in range(len(candidates))]
    steps = [Step("prompts", prompts, prompts_step, dict(source=source, prompt_tokens=knobs["prompt_tokens"],
                                                           path=prompts), model=HELD)]
    steps += [Step(f"calibrate {c['name']}", cal, calibrate_step, dict(common, candidate=c, path=cal),
                   reads=(prompts,), model=HELD) for c, cal in zip(candidates, cals)]
    costs = batch_cost_steps(out, candidates, knobs, prompts=prompts, threads=threads, batch=batch)
    steps += [step for step in costs if step is not None]
    passes = p(run_files.PASSES)
    steps.append(Step("passes", passes, passes_step, dict(prompts=prompts, knobs=knobs, path=passes),
                      reads=(prompts,), model=HELD))
    batched = (p(run_files.BATCH_PREDICTION),) if batch else ()
    timed = [None if step is None else step.writes for step in costs]
    steps.append(Step("candidates", p(run_files.CANDIDATES), answer_step, dict(
        prediction=p(run_files.PREDICTION), calibrations=cals, kernel=COST_DEDUP if llama else COST_AUTO,
        path=p(run_files.CANDIDATES), batch_prediction=batched[0] if batched else None, batch_costs=timed,
        passes=passes, measurement_base=p(run_files.MEASUREMENT_BASE)),
        reads=(p(run_files.PREDICTION), p(run_files.MEASUREMENT_BASE), *batched, *cals, passes,
               *(t for t in timed if t is not None))))
    steps += [Step(f"check {c['name']}", chk, check_step, dict(common, candidate=c, path=chk), reads=(prompts,),
                   model=HELD) for c, chk in zip(candidates, checks)]
    steps.append(Step("candidates-score", p(run_files.CANDIDATES_SCORE), score_step, dict(
        candidates=p(run_files.CANDIDATES), checks=checks, path=p(run_files.CANDIDATES_SCORE)),
        reads=(p(run_files.CANDIDATES), *checks)))
    if llama_check:
        from moespec.chain.candidate_llama import llama_check_step

        check = p(run_files.CANDIDATES_LLAMA)
        steps.append(Step("candidates-llama", check, llama_check_step, dict(
            prompts=prompts, candidates=p(run_files.CANDIDATES), target_file=target_file, threads=threads,
            new_tokens=knobs["new_tokens"], kmax=knobs["kmax"], reps=knobs["check_reps"], path=check),
            reads=(prompts, p(run_files.CANDIDATES)), model=OWN))
    return steps
