"""`moespec demo`: the chain of the cost-model paper on one model, each step's artifact reused when it exists.

The model is resolved once (`Target`: what it is, where it runs) and loaded on first use by the one
step runner (`chain.run_folder`), which closes it before a step that opens the file itself. The
prediction is written after the base measurement and before any scored sweep (Sec. 4); the
narrative of each step is in docs/methodology.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from moespec import artifacts
from moespec.chain import demo_steps as work
from moespec.chain.demo_config import (DemoConfig, demo_setup, llama_context, measure_config, phase_knobs,
                                       verified_length)
from moespec.chain.run_folder import (HELD, OWN, Held, Runner, Step, check_folder, drop, holding, move_aside,
                                      run_folder_files, settings_changed)
from moespec.run_files import (ANSWER, CHARACTERIZATION, DENSE_CHARACTERIZATION, KINDS, MEASUREMENT,
                               MEASUREMENT_BASE, POINTS, PREDICTION, REPORT, SCORE, SUMMARY, TRACES, TRAINED_ROUTING,
                               VERIFIED)

__all__ = ["DemoConfig", "DemoResult", "Target", "demo_setup", "resolve_target", "run_demo"]


@dataclass(frozen=True)
class DemoResult:
    """Where each artifact of the run lies, which steps ran (the rest were reused), the summary and the
    answer (`report.answer`: does speculation pay here, from which acceptance, at which k, how far to trust it)."""

    out_dir: Path
    ran: tuple[str, ...]
    seconds: dict
    summary: str
    answer: str

    @property
    def report(self) -> Path:
        return self.out_dir / REPORT


@dataclass(frozen=True)
class Target:
    """The chain's model, resolved once: its spec, and on llama.cpp the GGUF file it runs (`gguf`: the
    spec itself, or its export into the run folder when `exported`)."""

    spec: str
    gguf: Path | None = None
    exported: bool = False
    dense: bool = False  # a GGUF file without routed experts (`chain.dense_chain`)


def resolve_target(config: DemoConfig, out: Path) -> Target:
    """What `config.model` is and where it runs, for the run folder `out`."""
    from moespec.models.gguf import is_gguf, resolve
    from moespec.models.gguf_info import is_dense

    if not config.llama:
        return Target(config.model)
    if is_gguf(config.model):
        return Target(config.model, resolve(config.model), dense=is_dense(resolve(config.model)))
    name = f"{config.model.replace(':', '-').replace('/', '-')}-{config.gguf_type}.gguf"
    return Target(config.model, out / name, exported=True)


def _loader(config: DemoConfig, target: Target, out: Path) -> Callable[[], tuple[Any, Any]]:
    """How the chain's model and tokenizer are built, on first use (as `moespec generate` runs them)."""

    def load():
        from moespec.models import load

        if target.gguf is not None:
            return load(str(target.gguf), backend="llama.cpp", threads=config.threads, n_ctx=llama_context(config))
        routing = out / TRAINED_ROUTING if config.routing == "trained" else config.routing
        return load(config.model, seed=config.seed, layers=config.layers, routing=routing, fast_linear=True)

    return load


def input_steps(config: DemoConfig, target: Target, out: Path) -> list[Step]:
    """What the model needs before it can be built: the file it is, the routing it replays."""
    if target.exported:
        from moespec.chain.llama_inputs import export_target

        return [Step("export", target.gguf, export_target, dict(spec=config.model, out=target.gguf,
                                                                 kind=config.gguf_type))]
    if config.routing == "trained":
        return [Step("trace-trained", out / TRAINED_ROUTING, work.trace_trained, dict(path=out / TRAINED_ROUTING))]
    return []


def _characterize_knobs(config: DemoConfig) -> dict[str, Any]:
    knobs = dict(config.characterize)
    knobs.setdefault("n", measure_config(config).ns)
    if config.llama:
        knobs["threads"] = config.threads
        knobs.setdefault("depths", measure_config(config).depths)  # the rest of the pass at the verify depths
    return knobs


def torch_steps(config: DemoConfig, out: Path, progress: bool) -> list[Step]:
    """The chain's first steps on torch: the routing (replayed if asked), the verified windows, the
    characterization of the expert operation on both (the base measurement times the verified
    windows between its passes, unless `verified_reps` asks the characterization to)."""
    p, m = out.joinpath, measure_config(config)
    timed_between = config.times_ops_between_passes and "verified_reps" not in config.characterize
    return [
        Step("trace", p(TRACES), work.trace_routing, dict(spec=config.model, tokens=config.trace_tokens,
                                                          path=p(TRACES)), model=HELD),
        Step("trace-verified", p(VERIFIED), work.trace_verified, dict(
            spec=config.model, depths=m.depths, prompts=m.prompts, n_max=max(m.ns), length=verified_length(config),
            path=p(VERIFIED)), model=HELD),
        Step("characterize", p(CHARACTERIZATION), work.characterize_model, dict(
            traces=p(TRACES), verified=None if timed_between else p(VERIFIED), path=p(CHARACTERIZATION),
            knobs=_characterize_knobs(config), seed=config.seed, spec=config.model, progress=progress),
             reads=(p(TRACES),) if timed_between else (p(TRACES), p(VERIFIED)), model=HELD)]


def llama_steps(config: DemoConfig, target: Target, out: Path, progress: bool) -> list[Step]:
    """The chain's first steps on llama.cpp: the routing llama.cpp computes for the file and for the
    text its verify passes verify, the characterization of ggml's expert operation on the file's
    tensors at both (each opens the file itself). The base measurement times the verified windows'
    grouped operation between its passes; the characterization times them too, for the per-slot
    kernel that llama.cpp's passes do not run."""
    from moespec.chain.llama_inputs import record_gguf_routing, record_gguf_verified

    p, m = out.joinpath, measure_config(config)
    return [
        Step("trace", p(TRACES), record_gguf_routing, dict(gguf=target.gguf, out=p(TRACES), tokens=config.trace_tokens,
                                                           threads=config.threads), model=OWN),
        Step("trace-verified", p(VERIFIED), record_gguf_verified, dict(
            gguf=target.gguf, out=p(VERIFIED), depths=m.depths, prompts=m.prompts, n_max=max(m.ns),
            length=verified_length(config), threads=config.threads), model=OWN),
        Step("characterize", p(CHARACTERIZATION), work.characterize_model, dict(
            model=str(target.gguf), traces=p(TRACES), verified=p(VERIFIED), path=p(CHARACTERIZATION),
            knobs=_characterize_knobs(config), seed=config.seed, spec=None, progress=progress),
             reads=(p(TRACES), p(VERIFIED)), model=OWN)]


def _op_layers(config: DemoConfig, verified: Path) -> tuple[int, ...]:
    """The layers whose operation the verify phase times between its passes: the characterized ones."""
    if not config.times_ops_between_passes:
        return ()
    from moespec.bench.expert_op import resolve_layers
    from moespec.moe.traces import RoutingTrace

    layers = config.characterize.get("layers", (0, "mid"))
    return tuple(resolve_layers(layers, RoutingTrace.load(verified).num_layers))


def knobs_changed(config: DemoConfig, path: Path, *, base: bool, op_layers: tuple[int, ...] = ()) -> str:
    """"" when the measurement at `path` (base or sweep phase) is absent or was made with this
    config's knobs, else what differs ("oracle_reps 5, this run 15")."""
    from moespec.bench.measure import MeasureConfig

    if not path.exists():
        return ""
    got = artifacts.load(path, KINDS[path.name])["payload"].get("config", {})
    want = MeasureConfig.preset(config.full, **phase_knobs(config, base, op_layers)).to_dict()
    return settings_changed(got, want)


def measure_steps(config: DemoConfig, target: Target, out: Path, progress: bool,
                  echo: Callable[[str], None]) -> list[Step]:
    """Base measurement, prediction (written before any scored run), sweep, score. Artifacts measured
    with other knobs than this config's are removed first, with what follows from them."""
    p = out.joinpath
    op_layers = _op_layers(config, p(VERIFIED))
    changed = knobs_changed(config, p(MEASUREMENT_BASE), base=True, op_layers=op_layers)
    if changed:  # the prediction reads the base measurement: both, and the sweep scored against it, again
        echo(f"[measure-base] {MEASUREMENT_BASE} was measured with {changed}; measuring it again and "
             "predicting again (the sweep's runs are read back from the point log)")
        drop(out, (MEASUREMENT_BASE, PREDICTION, MEASUREMENT, SCORE))
    changed = knobs_changed(config, p(MEASUREMENT), base=False, op_layers=op_layers)
    if changed:  # measured with other knobs: measure again (runs whose keys match are read back from the log)
        echo(f"[measure-sweep] {MEASUREMENT} was measured with {changed}; measuring the sweep again")
        drop(out, (MEASUREMENT, SCORE))
    phase = _phase(config, target, out, progress, op_layers)
    firsts = (p(CHARACTERIZATION), p(TRACES))
    return [
        Step("measure-base", p(MEASUREMENT_BASE), work.measure_phase, dict(phase, path=p(MEASUREMENT_BASE), base=True),
             model=HELD),
        Step("predict", p(PREDICTION), work.predict, dict(path=p(PREDICTION), characterization=firsts[0],
                                                          traces=firsts[1], measurement_base=p(MEASUREMENT_BASE)),
             reads=(*firsts, p(MEASUREMENT_BASE))),
        Step("measure-sweep", p(MEASUREMENT), work.measure_phase, dict(phase, path=p(MEASUREMENT), base=False),
             model=HELD),
        Step("score", p(SCORE), work.score, dict(path=p(SCORE), prediction=p(PREDICTION), measurement=p(MEASUREMENT),
                                                 characterization=firsts[0], measurement_base=p(MEASUREMENT_BASE)),
             reads=(p(PREDICTION), p(MEASUREMENT)))]


def _phase(config: DemoConfig, target: Target, out: Path, progress: bool, op_layers: tuple[int, ...]) -> dict:
    """The arguments both measure phases share (`demo_steps.measure_phase`), the path and phase apart."""
    return dict(spec=str(target.gguf) if target.gguf else config.model, points=out / POINTS, full=config.full,
                layers=config.layers, verified=out / VERIFIED if op_layers else None, backend=config.backend,
                progress=progress, knobs=phase_knobs(config, False, op_layers))


def dense_steps(config: DemoConfig, target: Target, out: Path, progress: bool, echo: Callable[[str], None]) -> list[Step]:
    """The chain on a dense GGUF file (`chain.dense_chain`): the base measurement, the file's products
    and the rest of its pass timed alone, the prediction from both."""
    from moespec.chain.dense_chain import characterize_dense, predict_dense

    p, m = out.joinpath, measure_config(config)
    changed = knobs_changed(config, p(MEASUREMENT_BASE), base=True)
    if changed:
        echo(f"[measure-base] {MEASUREMENT_BASE} was measured with {changed}; measuring it again and predicting again")
        drop(out, (MEASUREMENT_BASE, PREDICTION))
    return [
        Step("measure-base", p(MEASUREMENT_BASE), work.measure_phase,
             dict(_phase(config, target, out, progress, ()), path=p(MEASUREMENT_BASE), base=True), model=HELD),
        Step("characterize-dense", p(DENSE_CHARACTERIZATION), characterize_dense, dict(
            gguf=target.gguf, path=p(DENSE_CHARACTERIZATION), ns=_characterize_knobs(config)["n"], depths=m.depths,
            threads=config.threads, reps=config.dense_reps,
            flush_bytes=config.characterize.get("flush_bytes"), seed=config.seed), model=OWN),
        Step("predict", p(PREDICTION), predict_dense, dict(
            path=p(PREDICTION), characterization=p(DENSE_CHARACTERIZATION), measurement_base=p(MEASUREMENT_BASE)),
             reads=(p(DENSE_CHARACTERIZATION), p(MEASUREMENT_BASE)))]


def _check_model(config: DemoConfig, target: Target, out: Path, held: Held) -> None:
    """Refuse a folder made for another model; a GGUF file is known by its identity, without loading it."""
    from moespec.models.lineage import of_model

    def provenance() -> dict:
        if target.gguf is not None:
            from moespec.models import gguf_info

            return gguf_info.identity(target.gguf)
        return of_model(config.model, held.loaded()[0])

    check_folder(out, f"this run (--model {config.model})", provenance,
                 fix=f"pass --restart to move them to *.old and start afresh, or give another --out-dir than {out}")


def _steps(config: DemoConfig, target: Target, runner: Runner, progress: bool) -> None:
    """Every step after the model's inputs, in order (each list reads what the one before wrote)."""
    out, echo = runner.out, runner.echo
    short = work.verified_too_short(out / VERIFIED, verified_length(config))
    if short:  # more verify repetitions read further into the continuation; its first rows stay the same
        echo(f"[trace-verified] {VERIFIED} {short}; recording it again")
        drop(out, (VERIFIED,))
    if target.dense:  # no experts: no routing, no oracle sweep or batch chain scoring an MoE cost model
        runner.run(dense_steps(config, target, out, progress, echo))
    else:
        runner.run(llama_steps(config, target, out, progress) if config.llama else torch_steps(config, out, progress))
        runner.run(measure_steps(config, target, out, progress, echo))
    if config.batched and not target.dense:  # the chain at batch size B (report: Figure 7, the schedule)
        from moespec.chain.batch_chain import BatchKnobs, batch_steps

        knobs = BatchKnobs(**{**config.batch, "threads": config.threads})
        runner.run(batch_steps(target.gguf, out, knobs, progress=progress, echo=echo))
    if config.candidates:  # the user's drafts, priced from the predictions and checked on held-out prompts
        from moespec.chain.candidate_steps import candidate_steps

        runner.run(candidate_steps(out, config.candidates, config.candidate_knobs(), source=config.prompts,
                                   target_file=str(target.gguf) if target.gguf else None,
                                   threads=config.threads, context=llama_context(config) if config.llama else None,
                                   llama=config.llama, batch=config.batched and not target.dense, echo=echo,
                                   llama_check=config.llama_check))


def run_demo(
    out_dir: str | Path = "moespec-demo",
    *,
    full: bool = False,
    model: str = "synthetic:olmoe-shaped",
    config: DemoConfig | None = None,
    progress: bool = True,
    echo: Callable[[str], None] = print,
    restart: bool = False,
) -> DemoResult:
    """Run (or resume) the chain into `out_dir` and return where everything lies. config defaults to
    `DemoConfig.demo(model=model)` (`full_protocol` with `full`); the model is built once, on first use.

    The folder's artifacts are reused only if they were made from this model (spec, fingerprint,
    dtype, N, m, L; the model is built to check); otherwise the run stops with
    `provenance.ProvenanceMismatch` naming both. `restart` first moves them and the point logs to
    `<name>.old`."""
    from moespec.report.build import build_report

    if config is None:
        config = DemoConfig.full_protocol(model=model) if full else DemoConfig.demo(model=model)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with holding(out, f"moespec demo --out-dir {out}", echo):
        if restart:
            move_aside(run_folder_files(out), echo, out)
        target = resolve_target(config, out)
        held = Held(_loader(config, target, out))
        runner = Runner(out, echo, held)
        try:
            runner.run(input_steps(config, target, out))
            _check_model(config, target, out, held)
            _steps(config, target, runner, progress)
        finally:
            held.release()  # the report needs no model
    t0 = time.perf_counter()
    report = build_report(out, out=out / REPORT)
    summary = (out / SUMMARY).read_text(encoding="utf-8")
    answer = (out / ANSWER).read_text(encoding="utf-8")
    runner.seconds["report"] = time.perf_counter() - t0
    echo(summary.removeprefix(answer))
    echo(f"report: {report}; summary: {out / SUMMARY}\n")
    echo(answer.rstrip())
    return DemoResult(out_dir=out, ran=tuple(runner.ran), seconds=runner.seconds, summary=summary, answer=answer)
