"""The chain at batch size B on a GGUF file as steps (`chain.run_folder.Step`): `moespec batch` runs them,
and so does `moespec demo` on llama.cpp after its B = 1 chain (`report.build` shows the result).

1. routing: a trace of many short documents (`texts.spread`, at most `DOC_TOKENS` each), so
   that the union of B windows from distinct documents has documents enough (`moe.batch_union`);
2. characterization of the file's expert operation and dense products at n = 1..9 and every pass
   size B(k + 1) the batch sizes need (`batch_prediction.pass_sizes`);
3. the batch measurement (`bench.batch_measure`): τ_B, h_B(k), and the oracle sweep; written after
   each batch size and resumed, measured again when its settings changed;
4. the prediction V̂_B (`batch_prediction.predict_batch`, never reading the sweep), then the score
   and Figure 7, the schedule (`report.figures.plot_schedule`).

`chain.run_folder.Runner` runs them (a step whose artifact exists is reused); a characterization
that does not reach the largest pass is made again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from moespec import artifacts
from moespec.chain.demo_config import SMOKE_FLUSH_BYTES
from moespec.chain.run_folder import OWN, Step, drop, set_partial, settings_changed
from moespec.run_files import BATCH_CHARACTERIZATION as CHARACTERIZATION
from moespec.run_files import BATCH_MEASUREMENT as MEASUREMENT
from moespec.run_files import BATCH_PREDICTION as PREDICTION
from moespec.run_files import BATCH_SCORE as SCORE
from moespec.run_files import BATCH_TRACES as TRACES
from moespec.run_files import KINDS
from moespec.run_files import SCHEDULE as FIGURE

# documents of at most 256 tokens, cut from 4 KiB of text taken in turn from each corpus file: 8192
# tokens give 32 distinct documents, more than B, each longer than any window of k + 1 tokens
DOC_TOKENS, DOC_CHARS = 256, 4096


@dataclass(frozen=True)
class BatchKnobs:
    """The settings of the chain at batch size B (`moespec batch`'s options)."""

    sizes: tuple[int, ...] = (1, 2, 4, 8)
    max_k: int = 4
    acceptances: tuple[float, ...] = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)
    prompt_tokens: int = 128
    new_tokens: int = 48
    reps: int = 3
    trace_tokens: int = 8192
    threads: int | None = None
    # the characterization of the expert operation and dense products: n = 1..9 and every pass size
    # B(k + 1), on these layers, repetitions, U points and windows (a smoke run times fewer)
    characterize: dict = field(default_factory=lambda: dict(n=tuple(range(1, 10)), layers=(0, "mid"), reps=3,
                                                            u_points=3, windows=2))

    def __post_init__(self):
        if self.new_tokens < self.max_k + 2:
            raise ValueError(f"{self.new_tokens} new tokens is under the largest draft length + 2 = {self.max_k + 2}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def batch_steps(gguf: str | Path, out: Path, knobs: BatchKnobs, *, progress: bool = True,
                echo: Callable[[str], None] = print) -> list[Step]:
    """The steps (module docstring) into the folder `out`; each opens the file itself and closes it."""
    from moespec.bench.characterize import characterize
    from moespec.chain.batch_prediction import pass_sizes
    from moespec.chain.llama_inputs import record_gguf_routing
    from moespec.texts import default_corpus, spread

    p = out.joinpath
    timing = dict(knobs.characterize)
    ns = sorted(set(timing.pop("n", range(1, 10))) | set(pass_sizes(knobs.sizes, knobs.max_k)))
    stale = characterization_stale(p(CHARACTERIZATION), ns[-1], timing)
    if stale:
        echo(f"[batch-characterize] {CHARACTERIZATION} {stale}; characterizing again")
        drop(out, (CHARACTERIZATION, CHARACTERIZATION + ".points.jsonl", PREDICTION, SCORE))
    _drop_stale_measurement(out, knobs, echo)
    return [
        Step("batch-trace", p(TRACES), record_gguf_routing, dict(
            gguf=gguf, out=p(TRACES), texts=spread(default_corpus(), DOC_CHARS), tokens=knobs.trace_tokens,
            per_document=DOC_TOKENS, threads=knobs.threads), model=OWN),
        Step("batch-characterize", p(CHARACTERIZATION), characterize, dict(
            model=str(gguf), traces=p(TRACES), n=ns, **timing, out=p(CHARACTERIZATION), threads=knobs.threads,
            progress=progress, depths=()), reads=(p(TRACES),), model=OWN),  # V̂_B reads D(n), not R_d(n)
        Step("batch-measure", p(MEASUREMENT), measure, dict(gguf=gguf, out=p(MEASUREMENT), knobs=knobs,
                                                             progress=progress), model=OWN),
        Step("batch-predict", p(PREDICTION), predict, dict(out=p(PREDICTION), characterization=p(CHARACTERIZATION),
                                                            traces=p(TRACES), measurement=p(MEASUREMENT)),
             reads=(p(CHARACTERIZATION), p(TRACES), p(MEASUREMENT))),
        Step("batch-score", p(SCORE), score, dict(prediction=p(PREDICTION), measurement=p(MEASUREMENT), out=p(SCORE),
                                                  figure=p(FIGURE)), reads=(p(PREDICTION), p(MEASUREMENT))),
    ]


def characterization_stale(path: Path, n_max: int, timing: dict) -> str:
    """"" when the characterization at `path` is absent or serves this run: it reaches n_max and was
    timed with `timing`'s repetitions, U points, windows and flush (a `--smoke` one is not reused by
    a full run, nor the reverse); else why not."""
    if not path.exists():
        return ""
    old = artifacts.load(path, KINDS[CHARACTERIZATION])["payload"]
    if max(old["n"]) < n_max:
        return f"stops short of n = {n_max}"
    want = {k: timing[k] for k in ("reps", "u_points", "windows", "flush_bytes") if k in timing}
    if "flush_bytes" not in timing and old["settings"].get("flush_bytes") == SMOKE_FLUSH_BYTES:
        want["flush_bytes"] = "the full flush"
    changed = settings_changed(old.get("settings", {}), want, missing_differs=True)
    return f"was timed with {changed}" if changed else ""


def _drop_stale_measurement(out: Path, knobs: BatchKnobs, echo: Callable[[str], None]) -> None:
    """A measurement made with other settings is removed, with what was made from it; an unfinished
    one is set aside as ".partial", which `measure` resumes."""
    path = out / MEASUREMENT
    if not path.exists():
        return
    old = artifacts.load(path, KINDS[MEASUREMENT])["payload"]
    want = {"sizes": sorted(knobs.sizes), "max_k": knobs.max_k, "acceptances": [float(a) for a in knobs.acceptances],
            "new_tokens": knobs.new_tokens, "reps": knobs.reps}
    if settings_changed(old, want, missing_differs=True) or old.get("prompt_tokens", 0) > knobs.prompt_tokens:
        echo(f"[batch-measure] {MEASUREMENT} was measured with other settings; measuring it again")
        drop(out, (MEASUREMENT, PREDICTION, SCORE))
    elif sorted(int(B) for B in old["by_batch"]) != sorted(knobs.sizes):  # interrupted: resume it
        set_partial(path, KINDS[MEASUREMENT])


def measure(gguf: str | Path, out: Path, knobs: BatchKnobs, *, progress: bool = True) -> dict:
    """The batch measurement of `gguf` written to `out` (resumed from `out` or its ".partial" copy), on
    one open instance of the file: its tokenizer makes the prompts, its sequences run the batches."""
    from contextlib import nullcontext

    from rich.progress import Progress

    from moespec.bench.batch_measure import context, measure_batch, open_target
    from moespec.texts import batch_prompt_ids

    partial = out.with_name(out.name + ".partial")
    if partial.exists() and not out.exists():
        partial.replace(out)
    target, tok = open_target(gguf, sequences=max(knobs.sizes), threads=knobs.threads,
                              context=context(knobs.prompt_tokens, knobs.new_tokens, knobs.max_k))
    try:
        prompts = batch_prompt_ids(tok, knobs.prompt_tokens, max(knobs.sizes))
        with Progress(transient=True) if progress else nullcontext() as bar:
            task = bar.add_task("batch measurement", total=None) if bar else None
            tick = (lambda label, d, t: bar.update(task, description=f"measuring {label}", completed=d, total=t)) \
                if bar else None
            return measure_batch(gguf, prompts, sizes=knobs.sizes, max_k=knobs.max_k, acceptances=knobs.acceptances,
                                 new_tokens=knobs.new_tokens, reps=knobs.reps, threads=knobs.threads,
                                 vocab_limit=len(tok), out=out, progress=tick, target=target)
    finally:
        target.close()


def predict(*, out: Path, characterization: Path, traces: Path, measurement: Path) -> None:
    """The prediction V̂_B (`batch_prediction.predict_batch`), which never reads the sweep."""
    from moespec.chain.batch_prediction import predict_batch

    sources = {"characterization": str(characterization), "traces": str(traces), "measurement": str(measurement)}
    artifacts.write(out, KINDS[PREDICTION], predict_batch(characterization, traces, measurement, sources=sources))


def run_batch_chain(gguf: str | Path, out: Path, knobs: BatchKnobs, *, restart: bool = False, progress: bool = True,
                    echo: Callable[[str], None] = print) -> tuple[dict, dict]:
    """`moespec batch`: every step into `out` (finished artifacts reused; `restart` first sets the
    folder's batch artifacts aside as *.old); returns (the prediction's payload, the score's)."""
    from moespec.chain.run_folder import Runner, holding, move_aside

    out.mkdir(parents=True, exist_ok=True)
    with holding(out, f"moespec batch --out-dir {out}", echo):
        if restart:
            move_aside([*out.glob("batch-*"), out / FIGURE])
        Runner(out, echo).run(batch_steps(gguf, out, knobs, progress=progress, echo=echo))
    return (artifacts.load(out / PREDICTION, KINDS[PREDICTION])["payload"],
            artifacts.load(out / SCORE, KINDS[SCORE])["payload"])


def score(prediction: str | Path, measurement: str | Path, out: Path, figure: Path) -> dict:
    """The score of a batch prediction against the measurement's sweep, written to `out`, and Figure 7
    to `figure`."""
    from moespec.chain.batch_prediction import score_batch
    from moespec.report.figures import plot_schedule

    payload = score_batch(prediction, measurement)
    artifacts.write(out, KINDS[SCORE], payload)
    plot_schedule(payload, figure)
    return payload
