"""The chain's glue: the prediction (22) from artifacts (its score: `chain.scoring`).

Cost-model paper, Sec. 4–4.4 and App. E. `predict_from_artifacts` reads only

- the characterization ("characterize" artifact): each characterized layer's fits (4)/(E.1), its
  measured operation times on windows of recorded routing, and ε; of a GGUF file, its dense
  products D(n) and the rest of its pass R_d(n) (the calibrated version's o(n), `outside_times`);
- the routing trace: the union U of every window of n consecutive tokens, per layer and n;
- the *base* measurement: h(k) from its "h" section (the demo's oracle probe off the scored grid),
  and the even-numbered repetitions of its verify passes (τ_meas(1), the operation timed between
  passes, the passes' split); the odd-numbered ones are held out for the score (`repetition_half`).

It never opens the measurement's oracle sweep. A layer that was not characterized takes the fit
(and the measured times) of the nearest characterized layer: all MoE layers of a model share widths.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from moespec import artifacts
from moespec.models.lineage import check_chain
from moespec.texts import verified_depth
from moespec.bench.measure_base import HSource
from moespec.chain.versions import CalibratedOn, Unavailable, VersionUnavailable, WindowSource
from moespec.costmodel.verify_times import VerifyTimes, pass_time
from moespec.costmodel.fit import ExpertFit
from moespec.costmodel.predict import ACCEPTANCE_GRID, VERSIONS, NonPositiveTime, Prediction, predict, window_times
from moespec.kernel_names import COST_DEDUP, COST_KERNELS, COST_SLOT, SLOT, TO_ENGINE
from moespec.moe.traces import RoutingTrace
from moespec.provenance import trace_fingerprint
from moespec.run_files import KINDS, PREDICTION

KIND = KINDS[PREDICTION]
# A characterization with ε >= 1/2 (fits off by half or more) still gives τ̂, Ŝ, the crossover and
# k̂*, which do not depend on ε; the bounds (20)-(21) are then vacuous (δ >= 1), and at ε >= 1 so is
# the band (18). The payload says so ("bounds_vacuous").
EPS_VACUOUS = 0.5


@dataclass(frozen=True)
class OperationTimes:
    """The expert operation's time in seconds per cost-model kernel (`kernel_names.COST_SLOT`,
    `COST_DEDUP`), pass size n and MoE layer: {kernel: {n: [L]}}; dedup from n = 2 (at n = 1 the
    union is the slots). What (22) sums over the layers, from the fits or from measured times."""

    by_kernel: Mapping[str, Mapping[int, list[float]]]

    def __post_init__(self):
        if set(self.by_kernel) != set(COST_KERNELS):
            raise ValueError(f"operation times need the kernels {COST_KERNELS}, got {sorted(self.by_kernel)}")

    def at(self, kernel: str) -> Mapping[int, list[float]]:
        """{n: [L]} of one cost-model kernel."""
        return self.by_kernel[kernel]


@dataclass(frozen=True)
class BaseInputs:
    """What predict takes from the base measurement at one depth (`base_inputs`): the pass sizes,
    τ_meas(1), h(0..kmax), and where the base measurement timed them, the operation on the verified
    windows between its passes (`ops`, over `op_layers`), each per-slot pass's time outside its
    experts modules (`slot_outside`, {n: samples}: torch), and on llama.cpp D(n) + R_d(n) timed right
    after each pass (`beside`, {n: samples})."""

    depth: int
    ns: list[int]
    tau1: float
    h: list[float]
    ops: Mapping[str, Mapping[int, list[float]]] | None = None  # {cost kernel: {n: [L]}}, the kernels the passes ran
    op_layers: list[int] | None = None
    slot_outside: Mapping[int, np.ndarray] | None = None
    beside: Mapping[int, np.ndarray] | None = None


def payload_of(source: str | Path | Mapping[str, Any], kind: str, needs: tuple[str, ...] = ()) -> dict[str, Any]:
    """The payload of an artifact given as a path (checked: `artifacts.load`, the top-level fields in
    `needs` present and whole), a loaded document or a bare payload."""
    if isinstance(source, (str, Path)):
        return artifacts.load(source, kind, needs)["payload"]
    if not isinstance(source, Mapping):
        raise TypeError(f"a {kind} artifact must be a path or a dict, got {type(source).__name__}")
    return dict(source["payload"]) if "payload" in source and "kind" in source else dict(source)


def window_unions(trace: RoutingTrace, n: int) -> np.ndarray:
    """U of every window of n consecutive tokens of every document, per layer: [L, W] ints.

    A window never crosses a document boundary; a document shorter than n gives none.
    """
    if n < 1:
        raise ValueError(f"window length n must be >= 1, got {n}")
    L, N = trace.num_layers, trace.num_experts
    rows: list[list[np.ndarray]] = [[] for _ in range(L)]
    for doc in trace.documents:  # [T, L, m]
        T = doc.shape[0]
        if T < n:
            continue
        for l in range(L):
            hit = np.zeros((T + 1, N), dtype=np.int32)
            np.add.at(hit, (np.arange(1, T + 1)[:, None], doc[:, l, :].astype(np.int64)), 1)
            counts = np.cumsum(hit, axis=0)  # [T+1, N]: selections of each expert in tokens < t
            rows[l].append(((counts[n:] - counts[:-n]) > 0).sum(axis=1))  # [T-n+1]
    if not rows[0]:
        raise ValueError(f"no document of the trace has {n} tokens; record a longer trace")
    return np.stack([np.concatenate(r) for r in rows])


def nearest_layers(characterized: Sequence[int], L: int) -> list[int]:
    """For each of the L MoE layers, the characterized layer nearest to it (the lower on a tie)."""
    c = sorted(int(x) for x in characterized)
    if not c:
        raise ValueError("the characterization holds no layer; run `moespec characterize`")
    return [min(c, key=lambda x: (abs(x - l), x)) for l in range(L)]


def json_get(d: Mapping, key: Any) -> Any:
    """d[key] with JSON string keys accepted."""
    return d[key] if key in d else d[str(key)]


def expert_fits(char: Mapping[str, Any], kernel: str, source: list[int]) -> list[ExpertFit]:
    """The characterization's fit of `kernel` for each layer, read from its characterized `source` layer."""
    return [ExpertFit.from_dict(json_get(json_get(char["fits"], c), kernel)) for c in source]


def windows_source(char: Mapping[str, Any], depth: int) -> WindowSource:
    """Which characterization windows the measured-time version averages at `depth`: the verify
    passes' own where the characterization timed them at that depth (Sec. 4), else the corpus trace's."""
    verified = any(p.get("source") == WindowSource.VERIFIED and verified_depth(p.get("placement", "")) == depth
                   for p in char.get("points", []))
    return WindowSource.VERIFIED if verified else WindowSource.RECORDED


def _measured_times(char: Mapping[str, Any], source: list[int], ns: list[int], depth: int,
                    kind: WindowSource) -> OperationTimes:
    """Each layer's mean operation time on the characterization's `kind` windows (the characterized
    source layer's)."""
    times: dict[tuple, list[float]] = {}
    for p in char.get("points", []):
        if p.get("source") == kind and (kind == WindowSource.RECORDED or verified_depth(p["placement"]) == depth):
            times.setdefault((int(p["layer"]), p["kernel"], int(p["n"])), []).append(float(p["timing"]["median"]))
    out: dict[str, dict] = {COST_SLOT: {}, COST_DEDUP: {}}
    for kernel, sizes in ((COST_SLOT, ns), (COST_DEDUP, [n for n in ns if n >= 2])):
        for n in sizes:
            missing = [c for c in sorted(set(source)) if (c, kernel, n) not in times]
            if missing:
                raise VersionUnavailable(Unavailable.NO_OPERATION_TIMES, (
                    f"no {kernel} operation times on {kind} windows at n = {n} for layer(s) {missing}, and none "
                    "timed between the verify passes; run `moespec characterize` with windows >= 1"))
            out[kernel][n] = [float(np.mean(times[(c, kernel, n)])) for c in source]
    return OperationTimes(out)


def repetition_half(times: VerifyTimes, half: str) -> VerifyTimes:
    """The even-numbered repetitions r = 0, 2, ... ("fit": what predict reads) or the odd-numbered
    ones ("holdout": what score checks against) of every sample, op and inside array; the outside
    terms, timed after the even ones only, go with "fit". Repetition r verifies a window stride*r
    tokens in, so the two halves time different windows."""
    if half not in ("fit", "holdout"):
        raise ValueError(f"half={half!r}; choose 'fit' or 'holdout'")
    groups = [g for g in (times.samples, times.ops, times.inside) if g]
    reps = min(a.shape[1] for g in groups for by_n in g.values() for a in by_n.values())
    if reps < 2:
        raise ValueError(f"the verify times at depth {times.depth} hold {reps} repetition(s) per prompt; measure "
                         "with reps >= 2, so that predict and score read different repetitions")
    start = 0 if half == "fit" else 1

    def pick(g):  # {kernel: {n: [P, R, ...]}} -> every second repetition from `start`; None stays None
        return {p: {n: a[:, start::2] for n, a in by_n.items()} for p, by_n in g.items()} if g else g

    # the terms timed beside the passes were timed after the even repetitions only (`time_passes`)
    return replace(times, samples=pick(times.samples), ops=pick(times.ops), inside=pick(times.inside),
                   outside=times.outside if half == "fit" else None)


def verify_times_at(measurement: Mapping[str, Any], depth: int | None) -> VerifyTimes:
    """The verify times at `depth` (default: the smallest measured)."""
    verify = {int(v["depth"]): v for v in measurement.get("verify", [])}
    if not verify:
        raise ValueError("the measurement has no verify times; run `moespec measure` (or the demo's base phase)")
    depth = min(verify) if depth is None else int(depth)
    if depth not in verify:
        raise ValueError(f"the measurement has no verify times at depth {depth}; it has {sorted(verify)}")
    return VerifyTimes.from_dict(verify[depth])


def base_inputs(measurement_base: Mapping[str, Any], depth: int | None = None) -> BaseInputs:
    """What predict takes from the base measurement at one depth: h(k) from its "h" section
    ({depth: {k: seconds}}), and from the fit half of its verify repetitions (`repetition_half`)
    the pass sizes, τ_meas(1), the operation times between passes and the passes' split."""
    times = repetition_half(verify_times_at(measurement_base, depth), "fit")
    h_all = measurement_base.get("h")
    if not h_all or str(times.depth) not in {str(k) for k in h_all}:
        raise VersionUnavailable(Unavailable.NO_H, (
            f"the measurement has no h(k) at depth {times.depth}; give the base measurement of `moespec measure "
            "--base` (or of `moespec demo`), or add an \"h\" section {depth: {k: seconds}}"))
    h = json_get(h_all, times.depth)
    ks = sorted(int(k) for k in h)
    if ks != list(range(len(ks))):
        raise ValueError(f"h(k) at depth {times.depth} has k = {ks}; give every k = 0..kmax")
    ops = op_layers = outside = None
    if times.ops:  # the verified windows' operation, timed between the verify passes
        ops = {p: {n: t.tolist() for n, t in times.op_times(TO_ENGINE[p]).items()}
               for p in COST_KERNELS if TO_ENGINE[p] in times.ops}
        op_layers = list(times.op_layers)
    if times.inside and SLOT in times.inside:  # pass by pass: the time outside the operation (`outside_times`)
        outside = {n: times.samples[SLOT][n] - times.inside[SLOT][n] for n in times.ns}
    beside = times.outside_samples() if times.outside else None  # llama.cpp: D(n) + R_d(n) right after each pass
    return BaseInputs(depth=times.depth, ns=list(times.ns), tau1=times.tau_meas_1,
                      h=[float(json_get(h, k)) for k in ks], ops=ops, op_layers=op_layers, slot_outside=outside,
                      beside=beside)


def outside_times(base: BaseInputs, char: Mapping[str, Any], ns: list[int]) -> tuple[dict[int, float], str]:
    """(o(n), where it comes from): on torch, over the per-slot verify passes, each pass's time minus
    its time inside the experts modules, summarized as the verify times are
    (`costmodel.verify_times.pass_time`), "passes"; on llama.cpp, whose graph has no such split, the
    file's dense products D(n) (`bench.ggml_dense_op`) plus R_d(n), the rest of the pass at the base
    measurement's depth d (`bench.ggml_rest_op`): timed right after each of the base measurement's
    passes where it did (`bench.ggml_outside`), summarized as the passes are, "beside-passes"; else
    the characterization's, timed alone, "dense-ops+rest", or D(n) alone, "dense-ops". o(n) up to a
    constant, which g(n) = o(n) − o(1) drops."""
    split = base.slot_outside or {}
    if set(ns) <= set(split):
        return {n: pass_time(split[n]) for n in ns}, "passes"
    beside = base.beside or {}
    if set(ns) <= set(beside):
        return {n: pass_time(beside[n]) for n in ns}, "beside-passes"
    got = outside_apart(char, base.depth, ns)
    if got is None:
        raise VersionUnavailable(Unavailable.NO_PASS_SPLIT, (
            f"the base measurement's per-slot passes at depth {base.depth} hold no time inside their experts "
            "modules, and the characterization has no dense products' times D(n) at every n; measure again "
            "with this moespec (`moespec measure`; on llama.cpp, `moespec characterize` the GGUF file)"))
    return got


def outside_apart(char: Mapping[str, Any], depth: int, ns: list[int]) -> tuple[dict[int, float], str] | None:
    """(o(n), where it comes from) from the characterization alone, timed apart from any verify pass:
    D(n) + R_d(n) at `depth`, "dense-ops+rest", or D(n) alone, "dense-ops"; None without D(n) at
    every n (a torch characterization, which times no dense products)."""
    dense = (char.get("dense") or {}).get("median", {})
    if not {str(n) for n in ns} <= set(dense):
        return None
    rest = rest_at(char, depth)
    if {str(n) for n in ns} <= set(rest):
        return {n: dense[str(n)] + rest[str(n)] for n in ns}, "dense-ops+rest"
    return {n: dense[str(n)] for n in ns}, "dense-ops"


def rest_at(char: Mapping[str, Any], depth: int) -> dict[str, float]:
    """The characterization's R_d(n) at `depth`, {str(n): seconds}; empty where it has none there
    (a characterization made before the rest of the pass was timed, or at other depths)."""
    return dict(((char.get("rest") or {}).get("median") or {}).get(str(depth)) or {})


def _between_passes(base: BaseInputs, source: list[int], ns: list[int]) -> dict[str, dict[int, list[float]]]:
    """The base measurement's operation times on the verified windows, timed between its passes, of
    the source layers, {cost kernel: {n: [L]}} at every n for each kernel the passes ran with times
    for every source layer and n (llama.cpp runs one kernel: one entry); empty where there are none."""
    ops, layers = base.ops or {}, base.op_layers or []
    if not set(source) <= set(layers):
        return {}
    pick = [layers.index(c) for c in source]
    return {p: {n: [ops[p][n][i] for i in pick] for n in ns} for p in ops if set(ns) <= set(ops[p])}


def _measured_inputs(char: Mapping[str, Any], trace: RoutingTrace, base: BaseInputs,
                     ns: list[int]) -> tuple[OperationTimes, WindowSource]:
    """The measured-time version's operation times, and where they come from: timed between the
    base measurement's passes where it did, else by the characterization. Where the passes ran only
    the deduplicating kernel (llama.cpp), the per-slot one is its one-token time between the passes
    (at n = 1 both read the same m experts) plus the characterization's growth t_slot(n) − t_slot(1):
    (22)'s reference t_slot(1) then shares the passes' moments with τ_meas(1) and t_dedup(n)."""
    source = nearest_layers(char["layers"], trace.num_layers)
    between = _between_passes(base, source, ns)
    if set(between) == set(COST_KERNELS):
        return OperationTimes({COST_SLOT: between[COST_SLOT], COST_DEDUP: _from_two(between[COST_DEDUP])}), \
            WindowSource.BETWEEN_PASSES
    kind = windows_source(char, base.depth)
    timed = _measured_times(char, source, ns, base.depth, kind)
    if COST_DEDUP not in between:
        return timed, kind
    slot, one = timed.at(COST_SLOT), between[COST_DEDUP][1]
    grown = {n: [o + t - t1 for o, t, t1 in zip(one, slot[n], slot[1])] for n in ns}
    return OperationTimes({COST_SLOT: grown, COST_DEDUP: _from_two(between[COST_DEDUP])}), WindowSource.BETWEEN_PASSES


def _from_two(times: Mapping[int, list[float]]) -> dict[int, list[float]]:
    """{n: [L]} from n = 2 (the deduplicating kernel's times: at n = 1 (22) reads the per-slot one's)."""
    return {n: t for n, t in times.items() if n >= 2}


def _fit_times(char: Mapping[str, Any], trace: RoutingTrace, ns: list[int]) -> OperationTimes:
    """The prediction's operation times: each layer's fit at every recorded window's bytes."""
    source = nearest_layers(char["layers"], trace.num_layers)
    fits = {k: expert_fits(char, k, source) for k in COST_KERNELS}
    w, m = list(trace.expert_bytes), trace.top_k
    out: dict[str, dict] = {COST_SLOT: {}, COST_DEDUP: {}}
    for n in ns:
        U = window_unions(trace, n)
        for kernel in COST_KERNELS if n >= 2 else (COST_SLOT,):
            out[kernel][n] = window_times(fits[kernel], U, n, m, w)
    return OperationTimes(out)


def _predict(char: Mapping[str, Any], trace: RoutingTrace, measurement_base: Mapping[str, Any], version: str,
             depth: int | None, acceptance: Sequence[float]) -> tuple[Prediction, dict[str, Any]]:
    """One version and what it was built from ({"measured_time_windows": ..., "calibrated_on": ...})."""
    if version not in VERSIONS:
        raise ValueError(f"version={version!r}; choose one of {VERSIONS}")
    base = base_inputs(measurement_base, depth)
    both = {int(n) for n in char["n"]} & set(base.ns)
    ns = []
    while len(ns) + 1 in both:
        ns.append(len(ns) + 1)
    if len(ns) < 2:
        raise VersionUnavailable(Unavailable.TOO_FEW_PASS_SIZES, (
            f"pass sizes shared by the characterization and the verify times: {ns}; need 1..n_max >= 2"))
    made_of: dict[str, Any] = {}
    outside = None
    if version in ("prediction", "prediction-outside"):
        ops = _fit_times(char, trace, ns)
        if version == "prediction-outside":
            outside, made_of["prediction_outside"] = apart_or_unavailable(char, base.depth, ns)
    else:
        try:
            ops, made_of["measured_time_windows"] = _measured_inputs(char, trace, base, ns)
            on = CalibratedOn.MEASURED_TIME
        except VersionUnavailable:
            if version == "measured-time":
                raise
            ops, on = _fit_times(char, trace, ns), CalibratedOn.PREDICTION
    if version == "calibrated":
        outside, made_of["calibrated_outside"] = outside_times(base, char, ns)
        made_of["calibrated_on"] = on
    try:
        p = predict(t_slot=ops.at(COST_SLOT), t_dedup=ops.at(COST_DEDUP), tau1=base.tau1, h=base.h[: ns[-1]],
                    eps=engine_eps(char), version=version, outside=outside, acceptance=acceptance)
    except NonPositiveTime as e:
        raise VersionUnavailable(Unavailable.NONPOSITIVE_TIME, str(e)) from e
    return p, made_of


def apart_or_unavailable(char: Mapping[str, Any], depth: int, ns: list[int]) -> tuple[dict[int, float], str]:
    """`outside_apart`, or VersionUnavailable for the prediction-outside version."""
    got = outside_apart(char, depth, ns)
    if got is None:
        raise VersionUnavailable(Unavailable.NO_OUTSIDE_TERMS, (
            "the characterization timed no dense products D(n) at every n, the term the prediction-outside "
            "version adds (a torch chain times none: its calibrated version reads the passes' own split); "
            "on llama.cpp, characterize the GGUF file with this moespec"))
    return got


def predict_from_artifacts(
    characterization: str | Path | Mapping[str, Any],
    traces: str | Path | RoutingTrace,
    measurement_base: str | Path | Mapping[str, Any],
    *,
    version: str = "prediction",
    depth: int | None = None,
    acceptance: Sequence[float] = ACCEPTANCE_GRID,
) -> Prediction:
    """One version of the prediction (22) from the chain's artifacts (Sec. 4).

    version: "prediction" (each characterized layer's fit at the union bytes of every recorded
    window, eq. (4)/(E.1)), "measured-time" (each layer's measured operation time on the verified
    windows: timed between the base measurement's passes where it did, else by the characterization,
    else on its recorded windows) or "calibrated" (the measured-time version, or the prediction where
    no measured times exist, plus g(n) read inside the per-slot verify passes, `costmodel.predict._calibrate`).
    Uncharacterized layers take the nearest characterized layer's fit and times.
    depth: the context depth of the verify times and h(k) (default: the smallest measured).
    Raises VersionUnavailable (with its `Unavailable` reason) when the artifacts cannot give `version`.
    """
    char, trace, base, _ = _inputs(characterization, traces, measurement_base, None)
    return _predict(char, trace, base, version, depth, acceptance)[0]


def _inputs(characterization, traces, measurement_base, sources: Mapping[str, str] | None):
    """(characterization, trace, base measurement, the identity they share): refused unless they
    describe one model (`models.lineage.check_chain`); `sources` names them by file in the message."""
    char = payload_of(characterization, "characterize", needs=("fits", "eps", "layers"))
    trace = traces if isinstance(traces, RoutingTrace) else RoutingTrace.load(traces)
    base = payload_of(measurement_base, "measure", needs=("verify",))
    named = dict(zip(("characterization", "traces", "measurement_base"), (char, trace, base)))
    return char, trace, base, check_chain({_label(k, sources): v for k, v in named.items()})


def _label(name: str, sources: Mapping[str, str] | None) -> str:
    return f"{name} ({sources[name]})" if sources and name in sources else name


def engine_eps(char: Mapping[str, Any]) -> float:
    """The engine's ε of the characterization: the larger of its two kernels' (Sec. 4)."""
    return float(char["eps"]["engine"])


def predict_all(characterization, traces, measurement_base, *, acceptance: Sequence[float] = ACCEPTANCE_GRID,
                sources: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every version at every measured depth: the "predict" payload. An unavailable version's entry
    is `VersionUnavailable.to_dict()`; its provenance fields are `bench.versions` enum values."""
    char, trace, base, shared = _inputs(characterization, traces, measurement_base, sources)
    depths = []
    for v in base.get("verify", []):
        entry: dict[str, Any] = {"depth": int(v["depth"]), "versions": {}, "unavailable": {}}
        for version in VERSIONS:
            try:
                p, made_of = _predict(char, trace, base, version, entry["depth"], acceptance)
            except VersionUnavailable as e:
                entry["unavailable"][version] = e.to_dict()
                continue
            entry["versions"][version] = p.to_dict()
            entry.update(made_of)
        depths.append(entry)
    if not depths:
        raise ValueError("the measurement has no verify times; run the base measurement first")
    experts = base.get("provenance", {}).get("experts")  # the engine whose passes τ̂ are: "llama.cpp" on a GGUF file
    return {"model": base.get("model"),
            "provenance": {**shared, "trace": trace_fingerprint(trace), **({"experts": experts} if experts else {})},
            "sources": dict(sources or {}),
            "h_source": HSource(base.get("h_source", HSource.GIVEN)),
            "characterized_layers": list(char["layers"]), "trace_layers": trace.num_layers,
            "eps": char["eps"], "eps_characterized": engine_eps(char),
            "bounds_vacuous": engine_eps(char) >= EPS_VACUOUS, "depths": depths}
