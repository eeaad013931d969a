"""`moespec demo`: the chain of the cost-model paper on one model, each step's artifact reused when it exists.

The prediction is written after the base measurement and before any scored sweep (Sec. 4); the
narrative of each step is in docs/methodology.md.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from moespec import artifacts
from moespec.models.lineage import check_chain, of_model
from moespec.bench.measure_base import base_knobs
from moespec.chain.demo_work import _characterize, _trace, _trace_trained, _trace_verified, _verified_too_short
from moespec.chain.prediction import KIND as PREDICT_KIND
from moespec.chain.prediction import predict_all
from moespec.chain.scoring import SCORE_KIND, score_all
from moespec.kernel_names import DEDUP
from moespec.moe.traces import read_header

TRACES = "traces.parquet"
TRAINED_ROUTING = "trained-routing.parquet"  # `--routing trained`: what trained:olmoe chose on the corpus
VERIFIED = "verified.parquet"
CHARACTERIZATION = "characterization.json"
MEASUREMENT_BASE = "measurement-base.json"
MEASUREMENT = "measurement.json"
POINTS = "measurement.points.jsonl"  # the point log that both measure phases share
PREDICTION = "prediction.json"
SCORE = "score.json"
REPORT = "report.html"
KINDS = {CHARACTERIZATION: "characterize", MEASUREMENT_BASE: "measure", MEASUREMENT: "measure",
         PREDICTION: PREDICT_KIND, SCORE: SCORE_KIND}


@dataclass(frozen=True)
class DemoConfig:
    """The knobs of each step; `demo()` fits a 2-core CPU in minutes, `full_protocol()` is the paper's.
    Why each demo value was chosen: docs/methodology.md and BENCHMARKS.md."""

    model: str = "synthetic:olmoe-shaped"
    layers: int | None = None  # a synthetic preset's depth (None: the preset's)
    trace_tokens: int = 4096
    # both layers (rho differs between them); the verified windows are timed between the base
    # measurement's passes (`ops_between_passes`), so the characterization leaves them out
    characterize: dict = field(default_factory=lambda: dict(layers=(0, "mid"), reps=3, u_points=3, windows=4))
    # 32 verify repetitions: the prediction reads the 16 even ones, the score the 16 odd ones; 18
    # one-step oracle runs per cell, 2 tokens apart, verify the stretch the verify passes read
    measure: dict = field(default_factory=lambda: dict(new_tokens=64, oracle_steps=1, oracle_reps=18, prompts=2,
                                                       oracle_start_stride=2, reps=32,
                                                       scaling_ns=tuple(range(1, 10))))
    full: bool = False
    seed: int = 0
    # None: the model's own routers; a trace file the MoE layers replay; "trained": trained:olmoe's
    # routing, recorded into the run folder first (`moe.replay`)
    routing: str | None = None
    # time the characterized layers' operation on each verify pass's window right after the pass
    ops_between_passes: bool = True
    # "llama.cpp": the chain on llama.cpp, on `model` exported to GGUF of `gguf_type` (or a .gguf
    # `model` itself), its expert operation timed through ggml (`chain.llama_inputs`)
    backend: str = "torch"
    gguf_type: str = "q8_0"
    threads: int | None = None
    # on llama.cpp, the chain at batch size B after B = 1's (`chain.batch_chain.BatchKnobs`; torch stays at B = 1)
    batch: dict = field(default_factory=lambda: dict(sizes=(1, 2, 4), max_k=3, acceptances=(0.5, 0.7, 0.9, 0.95),
                                                     prompt_tokens=64, new_tokens=32, reps=2, trace_tokens=4096))

    def __post_init__(self):
        if self.trace_tokens < 16:
            raise ValueError(f"trace_tokens={self.trace_tokens}; trace at least 16 tokens")
        if self.backend not in ("torch", "llama.cpp"):
            raise ValueError(f"backend={self.backend!r}; choose 'torch' or 'llama.cpp'")
        if self.backend == "llama.cpp" and self.routing is not None:
            raise ValueError("routing replay runs on the torch backend; the llama.cpp chain runs the file's own routers")

    @property
    def llama(self) -> bool:
        return self.backend == "llama.cpp"

    def measure_knobs(self) -> dict[str, Any]:
        """`measure` as the measure step takes it: on llama.cpp one kernel, llama.cpp's grouped mul_mat_id."""
        return {**self.measure, "kernels": (DEDUP,), "oracle_kernels": (DEDUP,)} if self.llama else dict(self.measure)

    @property
    def times_ops_between_passes(self) -> bool:
        """Whether the verify phase times the characterized layers' operation between its passes
        (torch only: llama.cpp's chain has no verified windows)."""
        return self.ops_between_passes and not self.llama

    @classmethod
    def demo(cls, **overrides) -> "DemoConfig":
        return cls(**overrides)

    @classmethod
    def full_protocol(cls, **overrides) -> "DemoConfig":
        paper = dict(trace_tokens=65536, characterize=dict(layers=(0, "mid")), measure={}, full=True)
        return cls(**{**paper, **overrides})

    @classmethod
    def smoke(cls, **overrides) -> "DemoConfig":
        """Seconds on a *-tiny preset: n <= 3, k <= 2, depth 16; checks the plumbing, not the figures.
        Medians of 5 after a warm-up keep a slow call out of every time."""
        tiny = dict(model="synthetic:olmoe-tiny", trace_tokens=200,
                    characterize=dict(layers=(0,), reps=5, warmup=1, u_points=2, windows=2, n=range(1, 4)),
                    measure=dict(depths=(16,), ns=range(1, 4), reps=6, ks=(0, 1, 2), new_tokens=6, scaling_ns=(),
                                 flush=False),
                    batch=dict(sizes=(1, 2), max_k=2, acceptances=(0.5, 0.9), prompt_tokens=16, new_tokens=8, reps=1,
                               trace_tokens=512))
        return cls(**{**tiny, **overrides})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def demo_setup(out_dir: str | Path, *, model: str | None = None, backend: str | None = None, smoke: bool = False,
               full: bool = False, layers: int | None = None, routing: str | None = None, gguf_type: str | None = None,
               threads: int | None = None, measure: dict | None = None) -> tuple[DemoConfig, Path]:
    """The config and run folder `moespec demo`'s options name. A .gguf model is the model: the chain
    runs it on llama.cpp in `out_dir` (at smoke settings with `smoke`); another model runs on torch in
    `out_dir`, or with backend "llama.cpp" exported to GGUF (`gguf_type`, default q8_0) in
    `out_dir`/llama.cpp, beside the torch run it is reported with. `measure` overrides knobs of the
    measurement (oracle_reps, reps)."""
    from moespec.models.gguf import is_gguf
    from moespec.report.build import LLAMA_FOLDER

    if smoke and full:
        raise ValueError("--smoke and --full exclude each other")
    gguf = model is not None and is_gguf(model)
    backend = backend or ("llama.cpp" if gguf else "torch")
    if backend not in ("torch", "llama.cpp"):
        raise ValueError(f"backend {backend!r}: choose torch or llama.cpp")
    if gguf and backend == "torch":
        raise ValueError(f"{model} is a GGUF file: its chain runs on llama.cpp, the engine that decodes it (drop "
                         "--backend torch); for the torch chain give the transformers checkpoint it was made from")
    if gguf and (layers is not None or gguf_type is not None):
        raise ValueError(f"--layers and --gguf-type shape a model moespec builds or exports; {model} is used as it is")
    if backend == "llama.cpp":
        from moespec.backends import llama_lib
        from moespec.models.gguf_export import FTYPES

        if routing is not None:
            raise ValueError("--routing replays routing on the torch backend; the llama.cpp chain runs the file's own "
                             "routers")
        if gguf_type is not None and gguf_type not in FTYPES:
            raise ValueError(f"--gguf-type {gguf_type!r} is not one of {', '.join(FTYPES)}")
        if not llama_lib.available():
            raise ValueError(f"the chain on llama.cpp needs llama-cpp-python: {llama_lib.INSTALL_HINT}")
    if smoke:  # olmoe-tiny has grouped-query attention, which llama.cpp's olmoe lacks: trained:olmoe there
        config = DemoConfig.smoke(model=model or ("trained:olmoe" if backend == "llama.cpp" else "synthetic:olmoe-tiny"))
    else:
        make = DemoConfig.full_protocol if full else DemoConfig.demo
        config = make(model=model or DemoConfig.model, layers=layers, routing=routing)
    config = replace(config, backend=backend, gguf_type=gguf_type or DemoConfig.gguf_type,
                     threads=threads if backend == "llama.cpp" else None,
                     measure={**config.measure, **{k: v for k, v in (measure or {}).items() if v is not None}})
    folder = Path(out_dir) / LLAMA_FOLDER if backend == "llama.cpp" and not gguf else Path(out_dir)
    return config, folder


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


def _measure_phase(cfg: DemoConfig, out: Path, *, base: bool, progress: bool, loaded, verified: Path,
                   op_layers: tuple[int, ...]) -> dict[str, Any]:
    """One phase of `bench.measure.measure`. Both phases ask for the same verify points, so the
    sweep phase reads the base phase's back from the point log they share."""
    from moespec.bench.measure import measure

    return measure(str(_gguf(cfg, out.parent)) if cfg.llama else cfg.model, full=cfg.full, out=out,
                   points=out.with_name(POINTS), base=base, layers=cfg.layers, progress=progress, loaded=loaded(),
                   verified=verified if op_layers else None, backend=cfg.backend,
                   **_phase_knobs(cfg, False, op_layers))


CONTEXT_SLACK = 64  # positions beyond what the measurement's passes reach


def _context(cfg: DemoConfig) -> int:
    """llama.cpp's context for the demo's measurements: the positions both phases reach, so that the
    KV cache is sized to the run, not to the file's trained context (a 16-layer OLMoE at 8192
    positions holds 1 GB of cache)."""
    from moespec.bench.measure import MeasureConfig

    return CONTEXT_SLACK + max(MeasureConfig.preset(cfg.full, **_phase_knobs(cfg, base)).positions
                               for base in (True, False))


def _gguf(cfg: DemoConfig, out: Path) -> Path:
    """The GGUF file the llama.cpp chain runs: `model` itself, or its export into the run folder."""
    from moespec.models.gguf import is_gguf, resolve

    if is_gguf(cfg.model):
        return resolve(cfg.model)
    return out / f"{cfg.model.replace(':', '-').replace('/', '-')}-{cfg.gguf_type}.gguf"


def _phase_knobs(cfg: DemoConfig, base: bool, op_layers: tuple[int, ...] = ()) -> dict[str, Any]:
    knobs = dict(cfg.measure_knobs(), op_layers=tuple(op_layers))
    return base_knobs(knobs) if base else knobs


def _op_layers(cfg: DemoConfig, verified: Path) -> tuple[int, ...]:
    """The layers whose operation the verify phase times between its passes: the characterized ones."""
    if not cfg.times_ops_between_passes:
        return ()
    from moespec.bench.expert_op import resolve_layers
    from moespec.moe.traces import RoutingTrace

    layers = cfg.characterize.get("layers", (0, "mid"))
    return tuple(resolve_layers(layers, RoutingTrace.load(verified).num_layers))


@dataclass
class _Run:
    """What every step of one run shares: the config, the folder's paths, and the model, built on first use."""

    config: DemoConfig
    out: Path
    progress: bool
    held: list = field(default_factory=list)

    def path(self, name: str) -> Path:
        return self.out / name

    @property
    def gguf(self) -> Path:
        return _gguf(self.config, self.out)

    @property
    def routing(self) -> Path | str | None:
        """The routing the torch model replays: "trained" is recorded into the run folder first."""
        return self.path(TRAINED_ROUTING) if self.config.routing == "trained" else self.config.routing

    def loaded(self):
        """The model and tokenizer, built on first use only and then shared by every step."""
        if not self.held:
            from moespec.models import load

            cfg = self.config
            self.held.extend(load(str(self.gguf), backend="llama.cpp", threads=cfg.threads, n_ctx=_context(cfg))
                             if cfg.llama else
                             load(cfg.model, seed=cfg.seed, layers=cfg.layers, routing=self.routing,
                                  fast_linear=True))  # as `moespec generate` runs it
        return self.held[0], self.held[1]


# A step: (name, the artifact it writes, the work that writes it). A step whose artifact exists is reused.
Step = tuple[str, Path, Callable[[], Any]]


def _torch_steps(run: _Run) -> list[Step]:
    """The chain's first steps on torch: the routing (replayed if asked), the verified windows, the
    characterization of the expert operation on both."""
    cfg, p = run.config, run.path
    return [("trace", p(TRACES), lambda: _trace(*run.loaded(), cfg, p(TRACES))),
            ("trace-verified", p(VERIFIED), lambda: _trace_verified(*run.loaded(), cfg, p(VERIFIED))),
            ("characterize", p(CHARACTERIZATION), lambda: _characterize(
                run.loaded()[0], cfg, p(TRACES), p(VERIFIED), p(CHARACTERIZATION), run.progress))]


def _inputs(run: _Run) -> list[Step]:
    """What the model needs before it can be built: the routing it replays, the file it is."""
    cfg, p = run.config, run.path
    from moespec.models.gguf import is_gguf

    if cfg.llama and not is_gguf(cfg.model):
        from moespec.chain.llama_inputs import export_target

        return [("export", run.gguf, lambda: export_target(cfg.model, run.gguf, cfg.gguf_type))]
    if cfg.routing == "trained":
        return [("trace-trained", p(TRAINED_ROUTING), lambda: _trace_trained(p(TRAINED_ROUTING)))]
    return []


def _llama_steps(run: _Run) -> list[Step]:
    """The chain's first steps on llama.cpp: the routing llama.cpp computes for the file, the
    characterization of ggml's expert operation on the file's tensors."""
    from moespec.chain.llama_inputs import record_gguf_routing

    cfg, p, gguf = run.config, run.path, run.gguf
    return [("trace", p(TRACES), lambda: record_gguf_routing(gguf, p(TRACES), tokens=cfg.trace_tokens,
                                                             threads=cfg.threads)),
            ("characterize", p(CHARACTERIZATION), lambda: _characterize(
                str(gguf), cfg, p(TRACES), None, p(CHARACTERIZATION), run.progress))]


def _measure_steps(run: _Run, echo: Callable[[str], None]) -> list[Step]:
    """Base measurement, prediction (written before any scored run), sweep, score. Artifacts measured
    with other knobs than this config's are removed first, with what follows from them."""
    cfg, p = run.config, run.path
    op_layers = _op_layers(cfg, p(VERIFIED))
    changed = _knobs_changed(cfg, p(MEASUREMENT_BASE), base=True, op_layers=op_layers)
    if changed:  # the prediction reads the base measurement: both, and the sweep scored against it, again
        echo(f"[measure-base] {MEASUREMENT_BASE} was measured with {changed}; measuring it again and "
             "predicting again (the sweep's runs are read back from the point log)")
        for name in (MEASUREMENT_BASE, PREDICTION, MEASUREMENT, SCORE):
            p(name).unlink(missing_ok=True)
    changed = _knobs_changed(cfg, p(MEASUREMENT), base=False, op_layers=op_layers)
    if changed:  # measured with other knobs: measure again (runs whose keys match are read back from the log)
        echo(f"[measure-sweep] {MEASUREMENT} was measured with {changed}; measuring the sweep again")
        p(MEASUREMENT).unlink()
        p(SCORE).unlink(missing_ok=True)
    sources = {"characterization": str(p(CHARACTERIZATION)), "traces": str(p(TRACES)),
               "measurement_base": str(p(MEASUREMENT_BASE))}

    def phase(name: str, base: bool) -> Step:
        return (name, p(name), lambda: _measure_phase(cfg, p(name), base=base, progress=run.progress,
                                                        loaded=run.loaded, verified=p(VERIFIED), op_layers=op_layers))

    return [phase(MEASUREMENT_BASE, True),
            ("predict", p(PREDICTION), lambda: artifacts.write(p(PREDICTION), PREDICT_KIND, predict_all(
                p(CHARACTERIZATION), p(TRACES), p(MEASUREMENT_BASE), sources=sources))),
            phase(MEASUREMENT, False),
            ("score", p(SCORE), lambda: artifacts.write(p(SCORE), SCORE_KIND, score_all(
                artifacts.load(p(PREDICTION), PREDICT_KIND), p(MEASUREMENT), characterization=p(CHARACTERIZATION),
                measurement_base=p(MEASUREMENT_BASE))))]


STEP_NAMES = {MEASUREMENT_BASE: "measure-base", MEASUREMENT: "measure-sweep"}


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
    from moespec.report.build import ANSWER, build_report

    if config is None:
        config = DemoConfig.full_protocol(model=model) if full else DemoConfig.demo(model=model)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if restart:
        _move_aside(out, echo)
    run, ran, seconds = _Run(config, out, progress), [], {}
    for name, path, work in _inputs(run):
        _step(name, path, work, echo, ran, seconds)
    _check_folder(config, out, lambda: run.loaded()[0])
    if not config.llama:
        short = _verified_too_short(config, run.path(VERIFIED))
        if short:  # more verify repetitions read further into the continuation; its first rows stay the same
            echo(f"[trace-verified] {VERIFIED} {short}; recording it again")
            run.path(VERIFIED).unlink()
    first = _llama_steps(run) if config.llama else _torch_steps(run)
    for name, path, work in first:  # the measure steps read what these wrote (the verified windows' layers)
        _step(STEP_NAMES.get(name, name), path, work, echo, ran, seconds)
    for name, path, work in _measure_steps(run, echo):
        _step(STEP_NAMES.get(name, name), path, work, echo, ran, seconds)
    if config.llama:  # the chain at batch size B (report: Figure 7, the schedule)
        from moespec.chain.batch_chain import BatchKnobs, batch_steps

        knobs = BatchKnobs(**{**config.batch, "threads": config.threads})
        for name, path, work in batch_steps(run.gguf, out, knobs, progress=progress, echo=echo):
            _step(name, path, work, echo, ran, seconds)
    t0 = time.perf_counter()
    report = build_report(out, out=out / REPORT)
    summary = (out / "summary.txt").read_text(encoding="utf-8")
    answer = (out / ANSWER).read_text(encoding="utf-8")
    seconds["report"] = time.perf_counter() - t0
    echo(summary.removeprefix(answer))
    echo(f"report: {report}; summary: {out / 'summary.txt'}\n")
    echo(answer.rstrip())
    return DemoResult(out_dir=out, ran=tuple(ran), seconds=seconds, summary=summary, answer=answer)


def _step(name: str, path: Path, work: Callable[[], Any], echo: Callable[[str], None], ran: list,
          seconds: dict) -> None:
    """Run `work` unless its artifact `path` exists; log it and its time."""
    if path.exists():
        echo(f"[{name}] reusing {path}")
        return
    echo(f"[{name}] running")
    t0 = time.perf_counter()
    work()
    seconds[name] = time.perf_counter() - t0
    ran.append(name)
    echo(f"[{name}] done in {seconds[name]:.0f} s -> {path}")


def _move_aside(out: Path, echo: Callable[[str], None]) -> None:
    """`--restart`: every artifact, point log and report of the run folder moved to `<name>.old`."""
    from moespec.report.build import ANSWER

    names = (TRACES, VERIFIED, *KINDS, REPORT, "summary.txt", ANSWER)
    moved = [p for p in [*(out / n for n in names), *out.glob("*.points.jsonl"), *out.glob("batch-*"),
                         out / "schedule.png"] if p.exists() and not p.name.endswith(".old")]
    for path in moved:
        os.replace(path, path.with_name(path.name + ".old"))
    echo(f"[restart] moved {len(moved)} file(s) of {out} to *.old")


def _check_folder(config: DemoConfig, out: Path, model: Callable[[], Any]) -> None:
    """Refuse a run folder holding artifacts of another model than `model()`, this run's (`models.lineage`)."""
    named: dict[str, Any] = {name: read_header(out / name) for name in (TRACES, VERIFIED) if (out / name).exists()}
    named.update({name: artifacts.load(out / name, kind)["payload"] for name, kind in KINDS.items()
                  if (out / name).exists()})
    if named:
        named[f"this run (--model {config.model})"] = {"provenance": of_model(config.model, model())}
        check_chain(named, fix=f"pass --restart to move them to *.old and start afresh, or give another --out-dir "
                               f"than {out}")


def _knobs_changed(config: DemoConfig, path: Path, *, base: bool, op_layers: tuple[int, ...] = ()) -> str:
    """"" when the measurement at `path` (base or sweep phase) is absent or was made with this
    config's knobs, else what differs ("oracle_reps 5, this run 15")."""
    from moespec.bench.measure import MeasureConfig

    if not path.exists():
        return ""
    got = artifacts.load(path, "measure")["payload"].get("config", {})
    want = MeasureConfig.preset(config.full, **_phase_knobs(config, base, op_layers)).to_dict()
    differ = [k for k in want if k in got and _jsonable(got[k]) != _jsonable(want[k])]
    return "; ".join(f"{k} {got[k]}, this run {want[k]}" for k in differ)


def _jsonable(x: Any) -> Any:
    return [_jsonable(y) for y in x] if isinstance(x, (list, tuple, range)) else x
