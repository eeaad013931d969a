"""`measure`: the whole-model measurements that predictions are scored against (cost-model paper
Sec. 4 and App. D; engine paper Sec. 5-6), written as the "measure" artifact.

In order: verify times τ_p(n) with each kernel at each depth, with S(n) and its bootstrap interval
and τ_meas(1); the verify-batch scaling curve (read from the verify times where they hold its
passes, n <= 9 with the deduplicating kernel); the oracle sweep over k x a with each kernel (h(k),
V(k), realized acceptance, tokens per step against G_a(k)); with a draft, the real-draft K-sweep.
Every finished point goes to `<out stem>.points.jsonl` beside the artifact at once, so a rerun of
the same command resumes where an interruption stopped it, under the same provenance only.
The models run as `moespec generate` runs them: compiled expert kernels and linear layers.

Two presets: the default is demo-sized (one prompt, depth 512, 12 new tokens, the oracle sweep
with the deduplicating kernel only) so that synthetic:olmoe-shaped fits in minutes on a laptop
CPU; `full=True` is the paper's protocol (6 prompts, depths 512 and 4096, 256 new tokens,
k = 0..8, 11 acceptance values, both kernels). Any knob given explicitly overrides the preset.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from moespec import artifacts
from moespec.bench import sweep, verify
from moespec.models.lineage import PER_POINT, check_chain, of_model
from moespec.bench.measure_base import base_knobs, base_payload
from moespec.texts import PROMPT_COUNT, STRIDE, continuation_length
from moespec.costmodel.verify_times import ScalingCurve
from moespec.costmodel.predict import ACCEPTANCE_GRID
from moespec.kernel_names import DEDUP, ENGINE_KERNELS
from moespec.pointlog import PointLog
from moespec.provenance import model_provenance, trace_fingerprint
from moespec.run_files import MEASUREMENT


@dataclass(frozen=True)
class MeasureConfig:
    """The knobs of one measurement; `demo()` and `full()` are the two presets."""

    depths: tuple[int, ...] = (512,)
    ns: tuple[int, ...] = tuple(range(1, 10))
    kernels: tuple[str, ...] = ENGINE_KERNELS
    prompts: int = 1
    reps: int = 3
    flush: bool = True
    scaling_ns: tuple[int, ...] = tuple(range(1, 17))
    scaling_kernel: str = DEDUP
    ks: tuple[int, ...] = tuple(range(0, 9))
    acceptances: tuple[float, ...] = ACCEPTANCE_GRID
    oracle_kernels: tuple[str, ...] = (DEDUP,)
    oracle_reps: int = 1
    new_tokens: int = 12
    oracle_steps: int | None = None  # each oracle run takes exactly this many rounds instead of new_tokens
    # tokens of greedy text between the starts of two repetitions' oracle runs (`sweep.run_oracle`)
    oracle_start_stride: int = 0
    draft_ks: tuple[int, ...] = (1, 2, 4, 6, 8)
    # MoE layers whose expert operation is timed on each verify pass's own window right after the
    # pass (`verify.run_verify`); needs the verified windows (`measure(verified=...)`)
    op_layers: tuple[int, ...] = ()
    # tokens of greedy continuation between the windows of two verify repetitions (`verify.time_passes`)
    stride: int = STRIDE
    # llama.cpp: D(n) and R_d(n) timed right after each verify pass (`verify.run_verify`, `bench.ggml_outside`)
    outside: bool = False
    temperature: float = 0.8
    seed: int = 0

    def __post_init__(self):
        for name in ("depths", "ns", "kernels", "scaling_ns", "ks", "acceptances", "oracle_kernels", "draft_ks",
                     "op_layers"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not 1 <= self.prompts <= PROMPT_COUNT:
            raise ValueError(f"prompts must be 1..{PROMPT_COUNT}, got {self.prompts}")
        if min(self.reps, self.oracle_reps, self.new_tokens) < 1:
            raise ValueError(
                f"reps, oracle_reps and new_tokens must be >= 1, got {self.reps}, {self.oracle_reps}, {self.new_tokens}"
            )
        if self.stride < 0:
            raise ValueError(f"stride must be >= 0 tokens between verify windows, got {self.stride}")
        if self.oracle_start_stride < 0:
            raise ValueError(f"oracle_start_stride must be >= 0 tokens between run starts, got {self.oracle_start_stride}")
        if self.oracle_steps is not None and self.oracle_steps < 1:
            raise ValueError(f"oracle_steps must be >= 1 rounds per run (or None), got {self.oracle_steps}")
        if any(d < 1 for d in self.depths) or not self.depths:
            raise ValueError(f"depths must be positive token counts, got {self.depths}")
        if any(not 0 <= a < 1 for a in self.acceptances):
            raise ValueError(f"acceptances must lie in [0, 1), got {self.acceptances}")

    @property
    def scaling_from_verify(self) -> bool:
        """Whether the verify times already hold every pass of the scaling curve (same depth, kernel
        and n), so that the curve is read from them instead of timed twice."""
        ns = set(self.scaling_ns) | {1}
        return bool(self.scaling_ns) and self.scaling_kernel in self.kernels and ns <= set(self.ns)

    @classmethod
    def demo(cls, **overrides) -> "MeasureConfig":
        return cls(**overrides)

    @classmethod
    def full(cls, **overrides) -> "MeasureConfig":
        paper = dict(depths=(512, 4096), prompts=6, reps=5, new_tokens=256, oracle_kernels=ENGINE_KERNELS)
        return cls(**{**paper, **overrides})

    @property
    def positions(self) -> int:
        """The most cache positions a pass of this measurement reaches: the deepest prompt, then the
        longest of the verify continuation, the scaling passes, the oracle runs and the draft sweep's,
        and one round's drafts beyond (what a llama.cpp context must hold, `_Run.loaded`)."""
        verify_tokens = continuation_length(self.reps, max(self.ns), self.stride)
        oracle = max(sweep.oracle_budget(k, self.new_tokens, self.oracle_steps)[0] for k in self.ks)
        oracle += self.oracle_start_stride * (self.oracle_reps - 1)
        drafts = max((*self.ks, *self.draft_ks), default=0)
        return max(self.depths) + max(verify_tokens, oracle, max(self.scaling_ns, default=1), self.new_tokens) + drafts + 1

    @classmethod
    def preset(cls, full: bool, **overrides) -> "MeasureConfig":
        """The paper's protocol (`full`) or the demo-sized one, with `overrides` on top."""
        return cls.full(**overrides) if full else cls.demo(**overrides)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "MeasureConfig":
        return cls(**d)


def _progress(total: int, enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("[bold]measure[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        disable=not enabled,
    )


def _draft(draft_spec: str | None, prompt_lookup: int | None, seed: int):
    """(proposer, name, the draft model's provenance or None) for the real-draft sweep, or Nones."""
    from moespec.engine.proposers import DraftModel, PromptLookup
    from moespec.models import load

    if draft_spec is not None and prompt_lookup is not None:
        raise ValueError("give one draft: draft_spec or prompt_lookup, not both")
    if draft_spec is not None:
        model, _ = load(draft_spec, seed=seed, fast_linear=True)
        return DraftModel(model), draft_spec, model_provenance(draft_spec, model)
    if prompt_lookup is not None:
        return PromptLookup(prompt_lookup), f"prompt-lookup:{prompt_lookup}", None
    return None, None, None


def measure(
    model_spec: str,
    *,
    draft_spec: str | None = None,
    prompt_lookup: int | None = None,
    full: bool = False,
    out: str | Path = MEASUREMENT,
    layers: int | None = None,
    progress: bool = True,
    on_point: Callable[[dict, bool], None] | None = None,
    loaded: tuple[Any, Any] | None = None,
    verified: Any = None,
    base: bool = False,
    points: str | Path | None = None,
    restart: bool = False,
    routing: str | Path | None = None,
    backend: str = "torch",
    threads: int | None = None,
    **knobs,
) -> dict[str, Any]:
    """Measure `model_spec` and write the "measure" artifact to `out`; returns its payload.

    loaded: (model, tokenizer) already built from `model_spec` (saves building it again; the
    artifact still names `model_spec`).

    knobs: any `MeasureConfig` field (depths, ns, kernels, prompts, reps, ks, acceptances,
    new_tokens, ...) overriding the preset (`full` picks the paper's). `on_point(key, resumed)` runs
    after each point (the progress bar advances there too). verified: the routing of the verified
    text (`verify.verified_routing`, a RoutingTrace or its file), required by and only by op_layers.

    base: write the base measurement that `predict` reads (`measure_base`: the verify times and the
    h(k) probe, whose knobs replace acceptances, scaling_ns, oracle_kernels and oracle_reps).
    points: the point log (default `<out stem>.points.jsonl`); a base and a sweep measurement may
    share one, the sweep reading the base's verify passes back. It resumes only under this run's
    provenance (model, fingerprint, dtype, experts, flush, layers, draft), else raises
    `provenance.ProvenanceMismatch`; `restart` moves it to `<name>.old` and measures afresh.
    routing: a trace the target's MoE layers replay (`moe.replay`; part of its fingerprint).
    backend: "torch", or "llama.cpp" for a GGUF target (`models.load`; `threads` are llama.cpp's). llama.cpp
    runs one kernel, its own grouped `mul_mat_id` (each distinct expert read once per pass): kernels and
    oracle_kernels default to the deduplicating one alone there, and the per-slot one is refused.
    """
    engine, cfg = _config(model_spec, backend, full=full, base=base, knobs=knobs)
    verified = _verified_windows(cfg, verified)
    if loaded is None:
        loaded = _load_target(model_spec, engine, cfg.seed, layers=layers, routing=routing, threads=threads)
    model, tokenizer = loaded
    draft, draft_name, draft_provenance = _draft(draft_spec, prompt_lookup, cfg.seed)
    provenance = _provenance(model_spec, model, engine, verified, layers=layers, flush=cfg.flush,
                             draft=draft_provenance)
    out = Path(out)
    log = PointLog(out.with_name(out.stem + ".points.jsonl") if points is None else points, provenance,
                   restart=restart)
    parts = _measure_parts(model, tokenizer, cfg, draft=draft, draft_name=draft_name, verified=verified, log=log,
                           progress=progress, on_point=on_point)
    payload = _payload(model_spec, provenance, verified, layers=layers, draft=draft_name, cfg=cfg, parts=parts)
    payload = base_payload(payload) if base else payload
    artifacts.write(out, "measure", payload)
    return payload


def _payload(model_spec: str, provenance: dict, verified: Any, *, layers: int | None, draft: str | None,
             cfg: MeasureConfig, parts: dict) -> dict[str, Any]:
    """The "measure" payload: what was measured, from which model and windows, with which knobs."""
    return {
        "model": model_spec,
        "provenance": {**provenance, "verified": None if verified is None else trace_fingerprint(verified)},
        "layers": layers,
        "draft": draft,
        "config": cfg.to_dict(),
        **parts,
    }


def _config(model_spec: str, backend: str, *, full: bool, base: bool, knobs: dict) -> tuple[str, MeasureConfig]:
    """(the engine `model_spec` runs on, the measurement's config): the preset with `knobs` on top,
    unknown knobs refused, the base measurement's knobs for `base`, llama.cpp's one kernel fixed."""
    from moespec.models.specs import resolve_backend

    unknown = set(knobs) - set(MeasureConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown measure knobs {sorted(unknown)}; known: {sorted(MeasureConfig.__dataclass_fields__)}")
    engine = resolve_backend(model_spec, backend)
    if engine == "llama.cpp":
        one = {"kernels": (DEDUP,), "oracle_kernels": (DEDUP,)}
        asked = {k: tuple(knobs[k]) for k in one if k in knobs and tuple(knobs[k]) != one[k]}
        if asked:
            raise ValueError(f"{asked}: llama.cpp runs one kernel, its grouped mul_mat_id ({DEDUP!r}); drop the "
                             "kernels, or measure the torch backend for the per-slot one")
        knobs = {"outside": True, **knobs, **one}  # o(n) beside each pass unless asked not to
    elif knobs.get("outside"):
        raise ValueError("outside=True times a llama.cpp pass's dense products and rest beside it; a torch pass is "
                         "split at its experts modules by itself: drop outside")
    return engine, MeasureConfig.preset(full, **(base_knobs(knobs) if base else knobs))


def _verified_windows(cfg: MeasureConfig, verified: Any):
    """The verified routing as a RoutingTrace (read from its file), or None; op_layers needs it and
    nothing else does."""
    if bool(cfg.op_layers) != (verified is not None):
        raise ValueError(f"op_layers={list(cfg.op_layers)} and verified={verified!r}: timing the expert operation "
                         "between the verify passes needs both (the layers, and the verified windows from "
                         "`moespec trace-verified` / verify.verified_routing), or neither")
    if verified is not None and not hasattr(verified, "doc_ids"):
        from moespec.moe.traces import RoutingTrace

        return RoutingTrace.load(verified)
    return verified


def _load_target(model_spec: str, engine: str, seed: int, *, layers: int | None, routing: str | Path | None,
                 threads: int | None) -> tuple[Any, Any]:
    """(model, tokenizer) of the target as `moespec generate` runs it: llama.cpp's, or torch's with
    compiled linear layers."""
    from moespec.models import load

    if engine == "llama.cpp":
        return load(model_spec, backend="llama.cpp", threads=threads)
    return load(model_spec, seed=seed, layers=layers, routing=routing, fast_linear=True)


def _provenance(model_spec: str, model, engine: str, verified: Any, *, layers: int | None, flush: bool,
                draft: dict | None) -> dict[str, Any]:
    """What a point depends on beyond its key: the target model and the options that change its
    passes; the verified windows must be this model's."""
    target = of_model(model_spec, model, experts=PER_POINT)
    if verified is not None:
        check_chain({f"the model {model_spec}": {"provenance": target}, "the verified routing": verified},
                    fix="record the verified routing with this model: `moespec trace-verified --model MODEL`")
    # the verified windows are this model's (checked above), and a longer recording of them keeps its first rows
    return {**target, "options": {"layers": layers, "flush": flush, "draft": draft,
                                  **({"threads": getattr(model, "threads", None)} if engine == "llama.cpp" else {})}}


def _point_count(cfg: MeasureConfig, drafting: bool) -> int:
    """How many points the measurement logs: verify, scaling (unless read from verify), oracle, draft."""
    return (
        verify.verify_points(cfg.depths, cfg.prompts)
        + (cfg.prompts if cfg.scaling_ns and not cfg.scaling_from_verify else 0)
        + sweep.oracle_points(depths=cfg.depths, ks=cfg.ks, acceptances=cfg.acceptances,
                              kernels=cfg.oracle_kernels, prompts=cfg.prompts, reps=cfg.oracle_reps)
        + (sweep.draft_points(depths=cfg.depths, ks=cfg.draft_ks, prompts=cfg.prompts, reps=cfg.oracle_reps)
           if drafting else 0)
    )


def _measure_parts(model, tokenizer, cfg: MeasureConfig, *, draft, draft_name: str | None, verified: Any,
                   log: PointLog, progress: bool, on_point: Callable[[dict, bool], None] | None) -> dict[str, Any]:
    """The payload's verify times, scaling curve, oracle sweep and (with a draft) draft sweep, measured
    in that order under one progress bar that each finished point advances, `on_point` after it."""
    flush = verify.default_flusher(cfg.flush, model)
    total = _point_count(cfg, draft is not None)
    with _progress(total, progress) as bar:
        task = bar.add_task("verify", total=total)

        def tick(key: dict, resumed: bool) -> None:
            bar.update(task, advance=1, description=f"{key['part']} d={key['depth']}")
            if on_point is not None:
                on_point(key, resumed)

        common = dict(prompts=cfg.prompts, flush=flush, log=log, on_point=tick)
        verify_times = verify.run_verify(model, tokenizer, depths=cfg.depths, ns=cfg.ns, kernels=cfg.kernels,
                                         reps=cfg.reps, windows=verified, op_layers=cfg.op_layers, stride=cfg.stride,
                                         outside=cfg.outside, **common)
        scaling = _scaling(model, tokenizer, cfg, verify_times, common)
        sweep_common = dict(prompts=cfg.prompts, reps=cfg.oracle_reps, new_tokens=cfg.new_tokens, seed=cfg.seed,
                            log=log, on_point=tick)
        oracle = sweep.run_oracle(model, tokenizer, depths=cfg.depths, ks=cfg.ks, acceptances=cfg.acceptances,
                                  kernels=cfg.oracle_kernels, steps=cfg.oracle_steps,
                                  start_stride=cfg.oracle_start_stride, **sweep_common)
        drafted = (
            sweep.run_draft(model, tokenizer, draft, draft_name=draft_name, depths=cfg.depths, ks=cfg.draft_ks,
                            temperature=cfg.temperature, **sweep_common)
            if draft is not None else []
        )
    return {"verify": [v.to_dict() for v in verify_times], "scaling": scaling, "oracle": oracle,
            "draft_sweep": drafted, "flushed": flush is not None}


def _scaling(model, tokenizer, cfg: MeasureConfig, verify_times: list, common: dict) -> list[dict]:
    """The scaling curve as the payload lists it: read from the verify times where they hold its
    passes (`MeasureConfig.scaling_from_verify`), else timed; none without scaling_ns."""
    if cfg.scaling_from_verify:
        first = verify_times[0].samples[cfg.scaling_kernel]
        curve = ScalingCurve(cfg.depths[0], cfg.scaling_kernel,
                             {n: first[n] for n in sorted(set(cfg.scaling_ns) | {1})})
    elif cfg.scaling_ns:
        curve = verify.run_scaling(model, tokenizer, depth=cfg.depths[0], ns=cfg.scaling_ns,
                                   kernel=cfg.scaling_kernel, reps=cfg.reps, **common)
    else:
        return []
    return [curve.to_dict()]
