"""The chain's glue: the prediction (22) from artifacts, and its score against the measurement.

Cost-model paper, Sec. 4–4.4 and App. E. `predict_from_artifacts` reads only

- the characterization ("characterize" artifact): each characterized layer's fits (4)/(E.1), its
  measured operation times on windows of recorded routing, and ε;
- the routing trace: the union U of every window of n consecutive tokens, per layer and n;
- the *base* measurement: the verify times τ_p(n) (τ_meas(1) and, for the calibrated version,
  τ_slot(n)), and h(k) from the payload's "h" section, which `moespec demo` fills from a short
  oracle probe at an acceptance off the scored grid, before any scored sweep runs.

It never opens the measurement's oracle sweep, so a prediction can be written before the runs it is
scored against exist. All MoE layers of one model share their widths, so a layer that was not
characterized takes the fit (and the measured times) of the nearest characterized layer.

`score_from_artifacts` then reads the sweep and calls `costmodel.score.score`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from moespec import artifacts
from moespec.bench.prompts import verified_depth
from moespec.bench.sweep_cells import baseline, cell_throughput, resample_throughput
from moespec.bench.verify_times import VerifyTimes, pass_time
from moespec.costmodel.fit import ExpertFit
from moespec.costmodel.predict import ACCEPTANCE_GRID, VERSIONS, Prediction, predict, window_times
from moespec.costmodel.score import Score, score
from moespec.kernel_names import DEDUP, SLOT, TO_ENGINE
from moespec.moe.traces import RoutingTrace

KIND = "predict"
# A characterization with ε >= 1/2 (fits off by half or more) still gives τ̂, Ŝ, the crossover and
# k̂*, which do not depend on ε; the bounds (20)-(21) are then vacuous (δ >= 1), and at ε >= 1 so is
# the band (18). The payload says so ("bounds_vacuous").
EPS_VACUOUS = 0.5
SCORE_KIND = "score"


def payload_of(source: str | Path | Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The payload of an artifact given as a path, a loaded document or a bare payload."""
    if isinstance(source, (str, Path)):
        return artifacts.load(source, kind)["payload"]
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


def _get(d: Mapping, key: Any) -> Any:
    """d[key] with JSON string keys accepted."""
    return d[key] if key in d else d[str(key)]


def _fits(char: Mapping[str, Any], kernel: str, source: list[int]) -> list[ExpertFit]:
    return [ExpertFit.from_dict(_get(_get(char["fits"], c), kernel)) for c in source]


def windows_source(char: Mapping[str, Any], depth: int) -> str:
    """Which windows the measured-time version averages at `depth`: "verified" where the
    characterization timed the verify passes' own windows at that depth (the paper's protocol,
    Sec. 4), else "recorded" (windows of the corpus trace)."""
    return "verified" if any(p.get("source") == "verified" and verified_depth(p.get("placement", "")) == depth
                             for p in char.get("points", [])) else "recorded"


def _measured_times(char: Mapping[str, Any], source: list[int], ns: list[int],
                    depth: int | None = None) -> dict[str, dict] | str:
    """{"slot": {n: [L]}, "dedup": {n: [L]}}: each layer's mean measured time on its windows (the
    characterized source layer's), or the reason the measured-time version is unavailable. The
    windows are those of the verified text at `depth` where timed, else the recorded ones."""
    kind = "recorded" if depth is None else windows_source(char, depth)
    times: dict[tuple, list[float]] = {}
    for p in char.get("points", []):
        if p.get("source") == kind and (kind == "recorded" or verified_depth(p["placement"]) == depth):
            times.setdefault((int(p["layer"]), p["kernel"], int(p["n"])), []).append(float(p["timing"]["median"]))
    out: dict[str, dict] = {"slot": {}, "dedup": {}}
    for kernel, sizes in (("slot", ns), ("dedup", [n for n in ns if n >= 2])):
        for n in sizes:
            missing = [c for c in sorted(set(source)) if (c, kernel, n) not in times]
            if missing:
                return (f"the characterization has no {kernel} times on recorded windows at n = {n} for "
                        f"layer(s) {missing}; run `moespec characterize` with windows >= 1")
            out[kernel][n] = [float(np.mean(times[(c, kernel, n)])) for c in source]
    return out


def base_inputs(measurement_base: Mapping[str, Any], depth: int | None = None) -> dict[str, Any]:
    """What predict takes from the measurement: τ_p(n), τ_meas(1) and h(k) at one depth.

    Reads the "verify" section and the "h" section ({depth: {k: seconds}}) only.
    """
    verify = {int(v["depth"]): v for v in measurement_base.get("verify", [])}
    if not verify:
        raise ValueError("the measurement has no verify times; run `moespec measure` (or the demo's base phase)")
    depth = min(verify) if depth is None else int(depth)
    if depth not in verify:
        raise ValueError(f"the measurement has no verify times at depth {depth}; it has {sorted(verify)}")
    h_all = measurement_base.get("h")
    if not h_all or str(depth) not in {str(k) for k in h_all}:
        raise ValueError(f"the measurement has no h(k) at depth {depth}; write the base measurement with "
                         "`moespec demo` (its h probe) or add an \"h\" section {depth: {k: seconds}}")
    h = _get(h_all, depth)
    ks = sorted(int(k) for k in h)
    if ks != list(range(len(ks))):
        raise ValueError(f"h(k) at depth {depth} has k = {ks}; give every k = 0..kmax")
    v = verify[depth]
    tau = {p: {int(n): float(t) for n, t in v["tau"][TO_ENGINE[p]].items()}
           for p in ("slot", "dedup") if TO_ENGINE[p] in v["tau"]}
    out = {"depth": depth, "tau": tau, "tau1": float(v["tau_meas_1"]), "h": [float(_get(h, k)) for k in ks]}
    times = VerifyTimes.from_dict(v)
    if times.ops:  # the verified windows' operation, timed between the verify passes
        out["ops"] = {p: {n: t.tolist() for n, t in times.op_times(TO_ENGINE[p]).items()}
                      for p in ("slot", "dedup")}
        out["op_layers"] = list(times.op_layers)
    if times.inside and SLOT in times.inside and SLOT in times.samples:
        # pass by pass, for the calibrated version's time outside the operation (`_outside`)
        out["slot_outside"] = {n: times.samples[SLOT][n] - times.inside[SLOT][n] for n in times.ns}
    return out


def _outside(base: Mapping[str, Any], ns: list[int]) -> dict[int, float] | None:
    """o(n): over the per-slot verify passes, each pass's time minus the time it spent inside its
    experts modules, summarized as the verify times are (`bench.verify_times.pass_time`); None where the
    base measurement did not split its passes."""
    split = base.get("slot_outside", {})
    if not set(ns) <= set(split):
        return None
    return {n: pass_time(split[n]) for n in ns}


def _between_passes(base: Mapping[str, Any], source: list[int], ns: list[int]) -> dict[str, dict] | None:
    """The measured times of `_measured_times`' shape from the base measurement's operation times on
    the verified windows, timed between its passes, where it has them for every source layer and n."""
    ops, layers = base.get("ops"), base.get("op_layers", [])
    if not ops or not set(source) <= set(layers) or not set(ns) <= set(ops["slot"]):
        return None
    pick = [layers.index(c) for c in source]
    return {p: {n: [ops[p][n][i] for i in pick] for n in (ns if p == "slot" else ns[1:])} for p in ("slot", "dedup")}


def _windows_used(char: Mapping[str, Any], trace: RoutingTrace, base: Mapping[str, Any], depth: int) -> str:
    """Which operation times the measured-time version takes at `depth` (`_operation_inputs`)."""
    try:
        inputs = base_inputs(base, depth)
    except ValueError:
        return windows_source(char, depth)
    ns = sorted(inputs.get("ops", {}).get("slot", {}))
    if _between_passes(inputs, nearest_layers(char["layers"], trace.num_layers), ns):
        return "verified, timed between the verify passes"
    return windows_source(char, depth)


def _operation_inputs(char: Mapping[str, Any], trace: RoutingTrace, ns: list[int], measured: bool, depth: int,
                      base: Mapping[str, Any] | None = None):
    """(t_slot, t_dedup) for `predict`: fits at every recorded window's bytes, or measured times: those
    the base measurement took between its passes where it did, else the characterization's."""
    L, m = trace.num_layers, trace.top_k
    source = nearest_layers(char["layers"], L)
    if measured:
        got = _between_passes(base or {}, source, ns) or _measured_times(char, source, ns, depth)
        if isinstance(got, str):
            return got
        return got["slot"], got["dedup"]
    fits = {k: _fits(char, k, source) for k in ("slot", "dedup")}
    w = list(trace.expert_bytes)
    t_slot, t_dedup = {}, {}
    for n in ns:
        U = window_unions(trace, n)
        t_slot[n] = window_times(fits["slot"], U, n, m, w)
        if n >= 2:
            t_dedup[n] = window_times(fits["dedup"], U, n, m, w)
    return t_slot, t_dedup


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
    window, eq. (4)/(E.1)), "measured-time" (each layer's measured operation time on the windows the
    verify passes at this depth verified: timed between those passes where the base measurement did,
    else by the characterization where it timed them, else on its recorded windows) or "calibrated"
    (the measured-time version, or the prediction where no measured times exist, plus the growth
    with n of the time outside the expert operation from the per-slot verify passes: pass by pass
    where the passes were split into the time inside their experts modules and the rest,
    `costmodel.predict._calibrate`).
    Uncharacterized layers take the nearest characterized layer's fit and times: all MoE layers of
    a model share their widths.
    depth: the context depth of the verify times and h(k) (default: the smallest measured).
    Raises ValueError naming the missing input when a version cannot be computed.
    """
    if version not in VERSIONS:
        raise ValueError(f"version={version!r}; choose one of {VERSIONS}")
    char = payload_of(characterization, "characterize")
    trace = traces if isinstance(traces, RoutingTrace) else RoutingTrace.load(traces)
    base = base_inputs(payload_of(measurement_base, "measure"), depth)
    both = {int(n) for n in char["n"]} & set(base["tau"].get("slot", {}))
    ns = []
    while len(ns) + 1 in both:
        ns.append(len(ns) + 1)
    if len(ns) < 2:
        raise ValueError(f"pass sizes shared by the characterization and the verify times: {ns}; need 1..n_max >= 2")
    ops = _operation_inputs(char, trace, ns, measured=version != "prediction", depth=base["depth"], base=base)
    if isinstance(ops, str):
        if version == "measured-time":
            raise ValueError(ops)
        ops = _operation_inputs(char, trace, ns, measured=False, depth=base["depth"])
    h = base["h"][: ns[-1]]
    calibrated = version == "calibrated"
    outside = _outside(base, ns) if calibrated else None  # read inside the per-slot passes
    return predict(
        t_slot=ops[0], t_dedup=ops[1], tau1=base["tau1"], h=h, eps=engine_eps(char), version=version,
        tau_slot_measured=base["tau"]["slot"] if calibrated else None, outside=outside, acceptance=acceptance,
    )


def engine_eps(char: Mapping[str, Any]) -> float:
    """The engine's ε of the characterization: the larger of its two kernels' (Sec. 4)."""
    return float(char["eps"]["engine"])


def predict_all(characterization, traces, measurement_base, *, acceptance: Sequence[float] = ACCEPTANCE_GRID,
                sources: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every version at every measured depth: the "predict" payload, with the reason for any gap."""
    char = payload_of(characterization, "characterize")
    trace = traces if isinstance(traces, RoutingTrace) else RoutingTrace.load(traces)
    base = payload_of(measurement_base, "measure")
    depths = []
    for v in base.get("verify", []):
        d = int(v["depth"])
        entry: dict[str, Any] = {"depth": d, "versions": {}, "unavailable": {},
                                 "measured_time_windows": _windows_used(char, trace, base, d)}
        for version in VERSIONS:
            try:
                entry["versions"][version] = predict_from_artifacts(
                    char, trace, base, version=version, depth=d, acceptance=acceptance).to_dict()
            except ValueError as e:
                entry["unavailable"][version] = str(e)
        if "calibrated" in entry["versions"]:
            entry["calibrated_on"] = "measured-time" if "measured-time" in entry["versions"] else "prediction"
            split = "slot_outside" in base_inputs(base, d)
            entry["calibrated_growth"] = ("pass by pass: each per-slot pass minus its time inside the experts "
                                          "modules" if split else "tau_slot(n) minus the measured-time version's")
        depths.append(entry)
    if not depths:
        raise ValueError("the measurement has no verify times; run the base measurement first")
    return {"model": base.get("model"), "sources": dict(sources or {}), "h_source": base.get("h_source", ""),
            "characterized_layers": list(char["layers"]), "trace_layers": trace.num_layers,
            "eps": char["eps"], "eps_characterized": engine_eps(char),
            "bounds_vacuous": engine_eps(char) >= EPS_VACUOUS, "depths": depths}


def _oracle_entry(measurement: Mapping[str, Any], kernel: str, depth: int) -> dict:
    for e in measurement.get("oracle", []):
        if e["kernel"] == kernel and int(e["depth"]) == depth:
            return e
    raise ValueError(f"the measurement has no oracle sweep with {kernel} at depth {depth}; "
                     "run the sweep phase (`moespec measure` or `moespec demo`)")


def score_from_artifacts(prediction: Prediction | Mapping[str, Any], measurement: str | Path | Mapping[str, Any], *,
                         depth: int | None = None, kernel: str = "dedup", resamples: int = 1000) -> Score:
    """Score one prediction version against the measurement's verify times and oracle sweep at `depth`.

    kernel: the scored kernel ("dedup" or "slot"); its sweep gives the throughput T(k, a) on the
    prediction's acceptance grid, at k = 0 plain decoding's pooled over every acceptance
    (`bench.sweep_cells.baseline`), and the measured step times V(k).
    resamples: bootstrap resamples of the sweep's runs for the intervals of the scored figures
    (`costmodel.score.sweep_intervals`); 0, or a sweep that keeps no per-run steps, scores without.
    """
    if not isinstance(prediction, Prediction):
        prediction = Prediction.from_dict(prediction)
    meas = payload_of(measurement, "measure")
    verify = {int(v["depth"]): v for v in meas.get("verify", [])}
    depth = min(verify) if depth is None else int(depth)
    if depth not in verify:
        raise ValueError(f"the measurement has no verify times at depth {depth}; it has {sorted(verify)}")
    v = verify[depth]
    entry = _oracle_entry(meas, TO_ENGINE[kernel], depth)
    ks = list(range(prediction.kmax + 1))
    cells = {(int(c["k"]), None if c["a"] is None else round(float(c["a"]), 6)): c for c in entry["cells"]}
    grid = []
    for a in prediction.acceptance:
        row = []
        for k in ks:
            c = baseline(entry, a) if k == 0 else cells.get((k, round(float(a), 6)))  # k = 0: plain decoding
            if c is None:
                raise ValueError(f"the oracle sweep lacks k={k}, a={a}; sweep k = 0..{ks[-1]} at every a of the grid")
            row.append(c)
        grid.append(row)
    T = [[cell_throughput(c) for c in row] for row in grid]
    flat = [c for row in grid for c in row]
    T_b = None
    if resamples and all(c.get("run_steps") for c in flat):
        T_b = resample_throughput(flat, resamples).reshape(resamples, len(grid), len(ks))
    savings = {int(s["n"]): s for s in v["saving"]}
    return score(
        prediction, tau_slot=v["tau"][SLOT], tau_dedup=v["tau"][DEDUP],
        S_lo={n: s["lo"] for n, s in savings.items()}, S_hi={n: s["hi"] for n, s in savings.items()},
        S={n: s["point"] for n, s in savings.items()}, throughput=T,
        V=[float(_get(entry["V"], k)) for k in ks], kernel=kernel, throughput_resamples=T_b,
    )


def score_all(prediction_payload: Mapping[str, Any], measurement, *, kernel: str = "dedup") -> dict[str, Any]:
    """Every available version at every depth scored: the "score" payload."""
    meas = payload_of(measurement, "measure")
    pred = payload_of(prediction_payload, KIND)
    out = []
    for entry in pred["depths"]:
        scored: dict[str, Any] = {"depth": entry["depth"], "versions": {}, "unavailable": dict(entry["unavailable"])}
        for version, p in entry["versions"].items():
            try:
                scored["versions"][version] = score_from_artifacts(p, meas, depth=entry["depth"], kernel=kernel).to_dict()
            except ValueError as e:
                scored["unavailable"][version] = str(e)
        out.append(scored)
    return {"model": pred.get("model"), "kernel": kernel, "depths": out}
