"""Characterize a model on this machine: benchmark, fits (4)/(E.1), bandwidths, r(n), u_bar(n), eps.

The measurement step of the cost-model paper's chain (Sec. 2, Sec. 4 and App. E): time one or two
layers' expert operation on chosen and recorded ids (`moespec.bench.expert_op`), fit (4) and (E.1)
per layer on the chosen ids at n >= 2, score them on the recorded windows they never saw (eps),
and derive the effective bandwidths beta_p(n), r(n), u_bar(n) from the trace, the verdict of (7)
with its margin (19), and the crossover, which `moespec_auto` reads from the artifact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from moespec import artifacts
from moespec.bench import expert_op
from moespec.models.lineage import PER_POINT, check_chain, of_model
from moespec.bench.timing import CacheFlusher, read_bandwidth
from moespec.costmodel import bandwidth, fit
from moespec.costmodel.predict import crossover as crossover_from_saving
from moespec.kernel_names import COST_DEDUP, COST_KERNELS, COST_SLOT
from moespec.moe.experts import expert_views, find_experts
from moespec.moe.traces import RoutingTrace, mean_union
from moespec.pointlog import PointLog
from moespec.provenance import trace_fingerprint
from moespec.run_files import CHARACTERIZATION, KINDS

KIND = KINDS[CHARACTERIZATION]
# Defaults sized for a full OLMoE-width characterization of two layers in < 10 min on 2 CPU cores.
DEFAULT_REPS = 5
DEFAULT_WARMUP = 1
DEFAULT_U_POINTS = 4
DEFAULT_WINDOWS = 6
DEFAULT_DEPTHS = (512,)  # the demo's verify depth (`bench.measure.MeasureConfig.depths`)
ROOF_BYTES = 256_000_000


def points_path(out: str | Path) -> Path:
    """The resumable point log kept beside the artifact: `<out>.points.jsonl`."""
    out = Path(out)
    return out.with_name(out.name + ".points.jsonl")


def _experts_source(model: Any, dtype, spec: str | None, threads: int | None = None):
    """(getter layer -> experts module, number of MoE layers or None, label, the model's provenance)
    for a spec or a module; `spec` names a module's model in its provenance. A GGUF file gives
    llama.cpp's own expert operation of each layer (`bench.ggml_expert_op`), on `threads` threads."""
    if isinstance(model, torch.nn.Module):
        found = find_experts(model)
        if not found:
            raise ValueError(f"{type(model).__name__} holds no transformers experts module")
        label = spec or getattr(model, "name_or_path", "") or type(model).__name__
        provenance = of_model(spec, model, experts=PER_POINT) if hasattr(model, "config") else {"model": spec}
        return (lambda l: found[l]), len(found), label, provenance
    spec = str(model)
    if spec.endswith(".gguf"):
        from moespec.models import gguf_info
        from moespec.bench.ggml_expert_op import ExpertLayer
        from moespec.backends.llama_model import default_threads

        blocks = gguf_info.expert_layers(spec)
        threads = threads or default_threads()
        return ((lambda l: ExpertLayer(spec, blocks[l], threads=threads)), len(blocks), spec,
                {**gguf_info.identity(spec), "options": {"threads": threads}})
    if spec.startswith(("synthetic:", "trained:")):  # the presets moespec builds or ships, as `measure` takes them
        from moespec.models import load

        built, _ = load(spec, dtype=dtype)
        found = find_experts(built)
        return (lambda l: found[l]), len(found), spec, of_model(spec, built, experts=PER_POINT)
    if not Path(spec).expanduser().is_dir():
        raise ValueError(f"model {spec!r} is neither synthetic:NAME, trained:NAME, a .gguf file, a local checkpoint "
                         "folder, nor a module")
    # a folder's layers are loaded one at a time: no whole model to fingerprint
    provenance = {"model": spec, "dtype": None if dtype is None else str(dtype).removeprefix("torch.")}
    return (lambda l: expert_op.load_layer_experts(Path(spec).expanduser(), l, dtype=dtype)), None, spec, provenance


def _named(what: str, source: Any) -> str:
    return what if isinstance(source, RoutingTrace) else f"{what} {source}"


def characterize(model: Any, traces: str | Path | RoutingTrace, *, layers: Sequence[int | str] = (0, "mid"),
                 n: Iterable[int] = range(1, 10), reps: int = DEFAULT_REPS, warmup: int = DEFAULT_WARMUP,
                 u_points: int | None = DEFAULT_U_POINTS, windows: int = DEFAULT_WINDOWS,
                 verified: str | Path | RoutingTrace | None = None, verified_reps: int | None = None,
                 kernels: Sequence[str] = COST_KERNELS, out: str | Path | None = None,
                 dtype: str | torch.dtype | None = None, flush_bytes: int | None = None, seed: int = 0,
                 progress: bool = False, model_spec: str | None = None, restart: bool = False,
                 threads: int | None = None, depths: Sequence[int] = DEFAULT_DEPTHS) -> dict[str, Any]:
    """Run the benchmark on `layers` and return (and write to `out`) the "characterize" payload.

    model: a `synthetic:NAME` spec, a local checkpoint folder (each layer's experts loaded alone),
    or a model / experts module. traces: a routing trace of the same model (path or object); its
    MoE-layer indices are the `layers` indices, "mid" is L // 2. u_points: U values per n on chosen
    ids (None: every U); windows: recorded windows per n. verified: the routing of the text the
    whole-model verify passes verify (`bench.verify.verified_routing`); its windows are timed too
    (`verified_reps` repetitions, default `reps`), for the measured-time version of the prediction,
    and take no part in the fits or ε. With `out`, finished points are appended to
    `<out>.points.jsonl` and skipped on a rerun under the same provenance (the model, its fingerprint,
    dtype, experts, the traces' fingerprints, seed, u_points, windows, warmup, flush bytes), else
    ProvenanceMismatch; `restart` moves the log to `<name>.old`. model_spec: the spec of a module.
    A GGUF file as `model` times llama.cpp's own expert operation (`bench.ggml_expert_op`) on
    `threads` threads (default: llama.cpp's); its trace must carry the file's identity and expert bytes
    (`moespec trace --model FILE.gguf` records it through transformers and labels it so), and also
    the file's dense products D(n) ("dense") and the rest of its pass R_d(n) at each of `depths`
    ("rest", `bench.ggml_rest_op`), for the calibrated g(n).
    """
    n_values, fit_n = _pass_sizes(n)
    depths = _depths(depths)
    _check_settings(reps=reps, verified_reps=verified_reps, windows=windows, warmup=warmup, u_points=u_points,
                    kernels=kernels)
    trace = _as_trace(traces)
    layer_ids = expert_op.resolve_layers(layers, trace.num_layers)  # a bad layer fails before the model loads
    windows_of = None if verified is None else _as_trace(verified)
    verified_reps = reps if verified_reps is None else int(verified_reps)
    get_experts, label, target = _load_experts(model, dtype, model_spec, threads, traces, trace, verified, windows_of)
    roof = read_bandwidth(nbytes=ROOF_BYTES, reps=3)
    flusher = CacheFlusher(flush_bytes)
    plan = _plan(trace, layer_ids, fit_n, n_values, u_points=u_points, windows=windows, seed=seed)
    extra = {l: expert_op.verified_passes(windows_of, l, n_values) if windows_of is not None else [] for l in layer_ids}
    provenance = _provenance(target, trace, windows_of, seed=seed, u_points=u_points, windows=windows, warmup=warmup,
                             flush_bytes=flusher.nbytes)
    log = PointLog(points_path(out), provenance, restart=restart) if out is not None else None
    records = _time_layers(get_experts, layer_ids, plan, extra, kernels, trace, reps=reps, verified_reps=verified_reps,
                           warmup=warmup, flush=flusher, log=log, seed=seed, progress=progress)
    payload = summarize(records, trace, layer_ids, n_values)
    if target.get("experts") == "llama.cpp":  # a GGUF file: what grows with n outside its experts, for g(n)
        payload.update(gguf_outside(label, n_values, depths, target["options"]["threads"], warmup=warmup,
                                     flush=flusher, seed=seed))
    payload.update(
        model=label,
        provenance=provenance,
        **_windows_from(traces, trace, verified, windows_of),
        settings={"reps": reps, "verified_reps": verified_reps, "warmup": warmup, "u_points": u_points, "windows": windows,
                  "kernels": list(kernels), "flush_bytes": flusher.nbytes, "seed": seed},
        read_bandwidth=roof,
    )
    if out is not None:
        artifacts.write(out, KIND, payload)
    return payload


def _as_trace(source: str | Path | RoutingTrace) -> RoutingTrace:
    return source if isinstance(source, RoutingTrace) else RoutingTrace.load(source)


def _pass_sizes(n: Iterable[int]) -> tuple[list[int], list[int]]:
    """(every pass size n, sorted; the sizes the fits (4)/(E.1) read), refusing sizes that cannot identify them."""
    n_values = sorted({int(x) for x in n})
    if not n_values or n_values[0] < 1:
        raise ValueError(f"pass sizes n must be >= 1, got {n_values}")
    return n_values, fit.fit_pass_sizes(n_values)


def _check_settings(*, reps: int, verified_reps: int | None, windows: int, warmup: int, u_points: int | None,
                    kernels: Sequence[str]) -> None:
    """Refuse repetitions, windows, U values and kernels the benchmark cannot run or fit with."""
    if min(reps, windows, reps if verified_reps is None else verified_reps) < 1 or warmup < 0:
        raise ValueError(f"need reps, verified_reps and windows >= 1 and warmup >= 0; got reps={reps}, "
                         f"verified_reps={verified_reps}, windows={windows}, warmup={warmup}")
    if u_points is not None and u_points < 2:
        raise ValueError(f"u_points={u_points}: give >= 2 U values per n, or None for every U")
    if not set(COST_KERNELS) <= set(kernels):
        raise ValueError(f"kernels {list(kernels)} must include {COST_KERNELS} (the fits need both)")


def _load_experts(model: Any, dtype, spec: str | None, threads: int | None, traces: Any, trace: RoutingTrace,
                  verified: Any, windows_of: RoutingTrace | None) -> tuple[Callable[[int], Any], str, dict]:
    """(getter layer -> experts module, label, the model's provenance) of `_experts_source`, once the
    model is known to be the one the trace and the verified routing were recorded on."""
    get_experts, model_layers, label, target = _experts_source(model, dtype, spec, threads)
    _check_lineage(label, target, traces, trace, verified, windows_of)
    if model_layers is not None and model_layers != trace.num_layers:
        raise ValueError(f"the model has {model_layers} MoE layers but the trace has {trace.num_layers}; "
                         "trace this model with `moespec trace`")
    return get_experts, label, target


def _windows_from(traces: Any, trace: RoutingTrace, verified: Any, windows_of: RoutingTrace | None) -> dict:
    """The payload's "traces" and "verified": the recordings whose windows were timed."""
    return {"traces": str(traces) if not isinstance(traces, RoutingTrace) else trace.model,
            "verified": None if windows_of is None else {
                "source": str(verified) if not isinstance(verified, RoutingTrace) else windows_of.model,
                "documents": list(windows_of.doc_ids)}}


def _check_lineage(label: str, target: dict, traces: Any, trace: RoutingTrace, verified: Any,
                   windows_of: RoutingTrace | None) -> None:
    """The trace and the verified routing must be recordings of this model (`models.lineage.check_chain`)."""
    named = {f"the model {label}": {"provenance": target}, _named("the trace", traces): trace}
    if windows_of is not None:
        named[_named("the verified routing", verified)] = windows_of
    check_chain(named, fix="record the routing with this model (`moespec trace` / `moespec trace-verified`)")


def _provenance(target: dict, trace: RoutingTrace, windows_of: RoutingTrace | None, **options) -> dict:
    """What a timed point depends on beyond its key: the model, the routing it runs (the traces'
    fingerprints) and the settings that shape its passes and timing (`options`)."""
    return {**target, "num_experts": trace.num_experts, "top_k": trace.top_k, "num_layers": trace.num_layers,
            "trace": trace_fingerprint(trace),
            "verified": None if windows_of is None else trace_fingerprint(windows_of),
            "options": options}


def _plan(trace: RoutingTrace, layer_ids: Sequence[int], fit_n: Sequence[int], n_values: Sequence[int], *,
          u_points: int | None, windows: int, seed: int) -> dict[int, list]:
    """Each layer's passes: chosen ids at the fit's sizes and recorded windows at every n, in a seeded
    shuffled order so that slow drift of the machine falls on both alike."""
    plan = {}
    for l in layer_ids:
        passes = expert_op.chosen_passes(fit_n, trace.top_k, trace.num_experts, u_points=u_points, seed=seed + l)
        passes += expert_op.recorded_passes(trace.documents, l, n_values, windows=windows, seed=seed + l)
        order = np.random.default_rng(seed + 7919 * (l + 1)).permutation(len(passes))  # drift-neutral
        plan[l] = [passes[i] for i in order]
    return plan


def _time_layers(get_experts: Callable[[int], Any], layer_ids: Sequence[int], plan: dict[int, list],
                 extra: dict[int, list], kernels: Sequence[str], trace: RoutingTrace, *, reps: int,
                 verified_reps: int, warmup: int, flush: CacheFlusher, log: PointLog | None, seed: int,
                 progress: bool) -> list[dict]:
    """The point records of every layer's planned passes and its verified windows (`extra`, timed
    `verified_reps` times), one layer's experts loaded at a time and closed before the next; the
    progress bar is weighted by requested bytes."""
    total = sum(expert_op.requested_bytes(k, p, trace.expert_bytes[l])
                for l in layer_ids for p in plan[l] + extra[l] for k in kernels)
    records = []
    with _progress_bar(progress, total) as advance:
        for l in layer_ids:
            experts = get_experts(l)
            have = experts.num_experts if hasattr(experts, "prepare") else expert_views(experts).num_experts
            if have != trace.num_experts:
                raise ValueError(f"layer {l} has {have} experts, the trace {trace.num_experts}; "
                                 "use the trace of this model")
            records += expert_op.run(experts, plan[l], kernels, layer=l, reps=reps, warmup=warmup, flush=flush,
                                     log=log, on_point=advance, seed=seed)
            if extra[l]:
                records += expert_op.run(experts, extra[l], kernels, layer=l, reps=verified_reps, warmup=warmup,
                                         flush=flush, log=log, on_point=advance, seed=seed)
            if hasattr(experts, "close"):
                experts.close()
            del experts
    return records


def _depths(depths: Sequence[int]) -> list[int]:
    """The context depths of the rest of the pass, checked: distinct token counts >= 0, sorted."""
    try:
        found = sorted({int(d) for d in depths})
        whole = all(not isinstance(d, bool) and int(d) == d for d in depths)
    except (TypeError, ValueError):
        found, whole = [], False
    if not whole or (found and found[0] < 0):
        raise ValueError(f"depths must be token counts >= 0, got {list(depths)}; give the verify passes' depths")
    return found


def gguf_outside(path: str, ns: Sequence[int], depths: Sequence[int], threads: int, **timing) -> dict:
    """{"dense": `dense_times`, "rest": `ggml_rest_op.rest_times` at `depths` (left out without
    depths)} of a GGUF file, then the file's mapped pages let go."""
    from moespec.bench.ggml_rest_op import rest_times
    from moespec.models import gguf_info

    found = {"dense": dense_times(path, ns, threads, **timing)}
    if depths:
        found["rest"] = rest_times(path, ns, depths, threads, **timing)
    gguf_info.forget()  # timed: drop the cached reader (an owner still reading a tensor in place keeps its map)
    return found


DENSE_REPS = 15  # timed computes of the dense products per pass size


def dense_times(path: str, ns: Sequence[int], threads: int, *, reps: int = DENSE_REPS, warmup: int = 1,
                flush: Callable[[], None] | None = None, seed: int = 0) -> dict:
    """D(n), the time of a GGUF file's dense products at n rows (`bench.ggml_dense_op`), for each
    n of `ns`: `reps` rounds over every n, each round in a fresh seeded order (drift falls on every n
    alike), `flush` before every compute; medians and every sample, in seconds."""
    from moespec.bench.ggml_dense_op import DenseOps

    samples: dict[int, list[float]] = {n: [] for n in ns}
    rng = np.random.default_rng(seed)
    with DenseOps(path, threads=threads) as ops:
        for n in ns:  # each graph's first compute (allocation, first touch) is not timed
            ops.time(n, reps=1, warmup=warmup)
        for _ in range(reps):
            for n in rng.permutation(list(ns)):
                samples[int(n)] += ops.time(int(n), reps=1, warmup=0, flush=flush)
        names, nbytes = list(ops.names), ops.nbytes
    return {"tensors": names, "bytes": nbytes, "threads": threads,
            "median": {str(n): float(np.median(v)) for n, v in samples.items()},
            "samples": {str(n): v for n, v in samples.items()}}


class _progress_bar:
    """A rich progress bar weighted by requested bytes (so the ETA follows the work), or a no-op."""

    def __init__(self, enabled: bool, total: int):
        self.enabled, self.total = enabled, total

    def __enter__(self):
        if not self.enabled:
            return lambda _: None
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TimeElapsedColumn, TimeRemainingColumn

        self._bar = Progress("[progress.description]{task.description}", BarColumn(), TaskProgressColumn(),
                             TimeElapsedColumn(), "ETA", TimeRemainingColumn())
        self._bar.__enter__()
        task = self._bar.add_task("characterize", total=self.total)
        return lambda nbytes: self._bar.advance(task, nbytes)

    def __exit__(self, *exc):
        if self.enabled:
            self._bar.__exit__(*exc)
        return False


def _median_time(record: dict) -> float:
    return float(record["timing"]["median"])


def summarize(records: Sequence[dict], trace: RoutingTrace, layers: Sequence[int], n_values: Sequence[int]) -> dict:
    """Fits, scores, eps, bandwidths, r(n), u_bar(n), verdicts and the crossover from timed points.

    Pure given the records (each a `expert_op.point_record`), so it can be recomputed from a log.
    """
    m = trace.top_k
    kernels = sorted({r["kernel"] for r in records})
    by = lambda l, k, src: [r for r in records if r["layer"] == l and r["kernel"] == k and r["source"] == src]  # noqa: E731
    fits, scores, timings = {}, {}, {}
    for l in layers:
        b = trace.expert_bytes[l]
        fits[l], scores[l] = {}, {}
        for k in COST_KERNELS:
            chosen = [r for r in by(l, k, "chosen") if r["n"] >= 2]
            f = fit.fit(k, [r["U"] for r in chosen], [r["n"] for r in chosen], [_median_time(r) for r in chosen],
                        m=m, b=chosen[0]["b"] if chosen else b)
            fits[l][k] = f
            rec = [r for r in by(l, k, "recorded") if r["n"] >= 2]
            scores[l][k] = fit.median_relative_error(f, [r["U"] for r in rec], [r["n"] for r in rec],
                                                     [_median_time(r) for r in rec])
        timings[l] = {k: {nn: float(np.mean([_median_time(r) for r in by(l, k, "recorded") if r["n"] == nn]))
                          for nn in n_values} for k in kernels}
    eps = {k: fit.eps_kernel([scores[l][k] for l in layers]) for k in COST_KERNELS}
    eps["engine"] = fit.eps_engine(eps[COST_SLOT], eps[COST_DEDUP])

    beta, r_n, u_bar_n, verdicts, saving = {}, {}, {}, {}, {}
    for k in kernels:
        beta[k] = {}
        for nn in n_values:
            rec = [r for r in records if r["kernel"] == k and r["source"] == "recorded" and r["n"] == nn]
            per_window = [r["bytes"] / _median_time(r) for r in rec]
            beta[k][nn] = {**bandwidth.quartiles(per_window),
                           "aggregate": bandwidth.effective_bandwidth([r["bytes"] for r in rec],
                                                                      [_median_time(r) for r in rec])}
    for nn in n_values:
        r_n[nn] = bandwidth.bandwidth_ratio(beta[COST_DEDUP][nn]["aggregate"], beta[COST_SLOT][nn]["aggregate"])
        u_bar_n[nn] = bandwidth.u_bar(mean_union(trace, nn), nn, m, trace.expert_bytes)
        verdicts[nn] = bandwidth.verdict(u_bar_n[nn], r_n[nn], eps["engine"])
        saving[nn] = sum(timings[l][COST_SLOT][nn] - timings[l][COST_DEDUP][nn] for l in layers)
    return {
        "layers": list(layers),
        "n": list(n_values),
        "m": m,
        "N": trace.num_experts,
        "expert_bytes": {l: trace.expert_bytes[l] for l in layers},
        "fits": {l: {k: f.to_dict() for k, f in fits[l].items()} for l in layers},
        "scores": scores,
        "eps": eps,
        "re_read_cost": {l: fits[l][COST_SLOT].re_read_cost for l in layers},
        "timings": timings,
        "beta": beta,
        "r": r_n,
        "u_bar": u_bar_n,
        "byte_factor": {k: 1 for k in kernels},
        "verdict": verdicts,
        "saving": saving,
        "crossover": crossover_from_saving(list(saving), list(saving.values())),
        "points": list(records),
    }
