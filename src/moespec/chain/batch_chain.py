"""The chain at batch size B on a GGUF file as steps (name, artifact, work): `moespec batch` runs them,
and so does `moespec demo` on llama.cpp after its B = 1 chain (`report.build` shows the result).

1. routing: a trace of many short documents (`texts.spread`, at most `DOC_TOKENS` each), so
   that the union of B windows from distinct documents has documents enough (`moe.batch_union`);
2. characterization of the file's expert operation and dense products at n = 1..9 and every pass
   size B(k + 1) the batch sizes need (`batch_prediction.pass_sizes`);
3. the batch measurement (`bench.batch_measure`): τ_B, h_B(k), and the oracle sweep; written after
   each batch size and resumed, measured again when its settings changed;
4. the prediction V̂_B (`batch_prediction.predict_batch`, never reading the sweep), then the score
   and Figure 7, the schedule (`report.figures.plot_schedule`).

A step whose artifact exists is skipped (the demo's rule); a characterization that does not reach
the largest pass is made again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from moespec import artifacts

TRACES, CHARACTERIZATION = "batch-traces.parquet", "batch-characterization.json"
MEASUREMENT, PREDICTION, SCORE, FIGURE = ("batch-measurement.json", "batch-prediction.json", "batch-score.json",
                                          "schedule.png")
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

    def __post_init__(self):
        if self.new_tokens < self.max_k + 2:
            raise ValueError(f"{self.new_tokens} new tokens is under the largest draft length + 2 = {self.max_k + 2}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Step = tuple[str, Path, Callable[[], Any]]


def batch_steps(gguf: str | Path, out: Path, knobs: BatchKnobs, *, progress: bool = True,
                echo: Callable[[str], None] = print) -> list[Step]:
    """The steps (module docstring) into the folder `out`."""
    from moespec.bench.characterize import characterize
    from moespec.chain.batch_prediction import KIND, pass_sizes, predict_batch
    from moespec.chain.llama_inputs import record_gguf_routing
    from moespec.texts import default_corpus, spread

    p = out.joinpath
    ns = sorted(set(range(1, 10)) | set(pass_sizes(knobs.sizes, knobs.max_k)))
    if p(CHARACTERIZATION).exists() and max(artifacts.load(p(CHARACTERIZATION), "characterize")["payload"]["n"]) < ns[-1]:
        echo(f"[batch-characterize] {CHARACTERIZATION} stops short of n = {ns[-1]}; characterizing again")
        for name in (CHARACTERIZATION, CHARACTERIZATION + ".points.jsonl", PREDICTION, SCORE):
            p(name).unlink(missing_ok=True)
    _drop_stale_measurement(out, knobs, echo)
    sources = {"characterization": str(p(CHARACTERIZATION)), "traces": str(p(TRACES)), "measurement": str(p(MEASUREMENT))}
    return [
        ("batch-trace", p(TRACES), lambda: record_gguf_routing(
            gguf, p(TRACES), texts=spread(default_corpus(), DOC_CHARS), tokens=knobs.trace_tokens,
            per_document=DOC_TOKENS, threads=knobs.threads)),
        ("batch-characterize", p(CHARACTERIZATION), lambda: characterize(
            str(gguf), p(TRACES), n=ns, reps=3, u_points=3, windows=2, out=p(CHARACTERIZATION), threads=knobs.threads,
            progress=progress)),
        ("batch-measure", p(MEASUREMENT), lambda: measure(gguf, p(MEASUREMENT), knobs, progress=progress)),
        ("batch-predict", p(PREDICTION), lambda: artifacts.write(p(PREDICTION), KIND, predict_batch(
            p(CHARACTERIZATION), p(TRACES), p(MEASUREMENT), sources=sources))),
        ("batch-score", p(SCORE), lambda: score(p(PREDICTION), p(MEASUREMENT), p(SCORE), p(FIGURE))),
    ]


def _drop_stale_measurement(out: Path, knobs: BatchKnobs, echo: Callable[[str], None]) -> None:
    from moespec.bench.batch_measure import KIND

    path = out / MEASUREMENT
    if not path.exists():
        return
    old = artifacts.load(path, KIND)["payload"]
    want = {"sizes": sorted(knobs.sizes), "max_k": knobs.max_k, "acceptances": [float(a) for a in knobs.acceptances],
            "new_tokens": knobs.new_tokens, "reps": knobs.reps}
    if {k: old.get(k) for k in want} != want or old.get("prompt_tokens", 0) > knobs.prompt_tokens:
        echo(f"[batch-measure] {MEASUREMENT} was measured with other settings; measuring it again")
        for name in (MEASUREMENT, PREDICTION, SCORE):
            (out / name).unlink(missing_ok=True)
    elif sorted(int(B) for B in old["by_batch"]) != sorted(knobs.sizes):  # interrupted: resume it
        path.unlink()
        artifacts.write(path.with_name(path.name + ".partial"), KIND, old)


def measure(gguf: str | Path, out: Path, knobs: BatchKnobs, *, progress: bool = True) -> dict:
    """The batch measurement of `gguf` written to `out` (resumed from `out` or its ".partial" copy)."""
    from contextlib import nullcontext

    from rich.progress import Progress

    from moespec.bench.batch_measure import measure_batch
    from moespec.texts import batch_prompt_ids
    from moespec.models.specs import load

    _, tok = load(str(gguf), backend="llama.cpp", threads=knobs.threads)
    prompts = batch_prompt_ids(tok, knobs.prompt_tokens, max(knobs.sizes))
    partial = out.with_name(out.name + ".partial")
    if partial.exists() and not out.exists():
        partial.replace(out)
    with Progress(transient=True) if progress else nullcontext() as bar:
        task = bar.add_task("batch measurement", total=None) if bar else None
        tick = (lambda label, d, t: bar.update(task, description=f"measuring {label}", completed=d, total=t)) \
            if bar else None
        return measure_batch(gguf, prompts, sizes=knobs.sizes, max_k=knobs.max_k, acceptances=knobs.acceptances,
                             new_tokens=knobs.new_tokens, reps=knobs.reps, threads=knobs.threads, vocab_limit=len(tok),
                             out=out, progress=tick)


def score(prediction: str | Path, measurement: str | Path, out: Path, figure: Path) -> dict:
    """The score of a batch prediction against the measurement's sweep, written to `out`, and Figure 7
    to `figure`."""
    from moespec.chain.batch_prediction import SCORE_KIND, score_batch
    from moespec.report.figures import plot_schedule

    payload = score_batch(prediction, measurement)
    artifacts.write(out, SCORE_KIND, payload)
    plot_schedule(payload, figure)
    return payload
