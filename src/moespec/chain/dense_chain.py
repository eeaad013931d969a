"""The chain on a dense GGUF file (no routed experts): what a verify pass of n tokens costs, for the
answer over the user's drafts.

(22) adds to the measured one-token pass the growth of the expert operation summed over the MoE
layers; a dense model has no MoE layer, so the paper's version is τ̂(n) = τ_meas(1) at every n, and
every part of the pass that grows with n is in the calibrated version's g(n) = o(n) − o(1), with o(n)
= D(n) + R_d(n): the file's weight products (every 2-D weight of every block, the FFN's included, and
the output head, `bench.ggml_dense_op`) and the rest of its pass at the verify depth (norms, RoPE,
attention over the cache, `bench.ggml_rest_op`), timed alone through ggml as on an MoE file. Nothing
in it comes from the verify passes but τ_meas(1) and h(k). With no expert fit, ε is 0: the band of a
speedup is the staircase's own, and the held-out check of the drafts measures the error.

The oracle sweep and the batch chain, which score the MoE cost model, do not run on a dense file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from moespec import artifacts
from moespec.chain.versions import CalibratedOn, Unavailable
from moespec.run_files import DENSE_CHARACTERIZATION, KINDS, MEASUREMENT_BASE, PREDICTION

KIND = KINDS[DENSE_CHARACTERIZATION]
NO_EXPERTS = ("a dense model has no expert operation: the measured-time version of (22) times nothing, "
              "and the prediction and calibrated versions hold the whole pass")


def characterize_dense(*, gguf: Path, path: Path, ns: Sequence[int], depths: Sequence[int], threads: int | None,
                       reps: int, flush_bytes: int | None = None, seed: int = 0) -> dict[str, Any]:
    """D(n) and R_d(n) of a dense GGUF file at every n of `ns` and depth of `depths` (the verify
    passes'), on `threads` threads, `reps` interleaved rounds, the cache flushed before every
    compute: the "characterize-dense" artifact at `path`."""
    from moespec.backends.llama_model import default_threads
    from moespec.bench.characterize import gguf_outside
    from moespec.bench.timing import CacheFlusher
    from moespec.models import gguf_info

    threads = threads or default_threads()
    flusher = CacheFlusher(flush_bytes)
    ns = sorted({int(n) for n in ns})
    payload = {"model": str(gguf), "provenance": {**gguf_info.identity(gguf), "options": {"threads": threads}},
               "n": ns, **gguf_outside(str(gguf), ns, depths, threads, reps=reps, flush=flusher, seed=seed),
               "settings": {"reps": reps, "flush_bytes": flusher.nbytes, "seed": seed, "threads": threads}}
    artifacts.write(path, KIND, payload)
    return payload


def dense_versions(char: dict[str, Any], measurement_base: dict[str, Any], depth: int,
                   acceptance: Sequence[float]) -> dict[str, Any]:
    """The prediction's entry at one verify depth: the paper's version (flat at τ_meas(1)), the
    prediction-outside one (+ g(n) from D and R_d timed by the characterization alone) and the
    calibrated one (+ g(n) from D and R_d, beside the passes where they were timed so), as
    `chain.prediction.predict_all` writes them."""
    from moespec.chain.prediction import apart_or_unavailable, base_inputs, outside_times
    from moespec.costmodel.predict import predict_without_experts

    base = base_inputs(measurement_base, depth)
    both = {int(n) for n in char["n"]} & set(base.ns)
    ns = [n for n in range(1, len(both) + 1) if set(range(1, n + 1)) <= both]
    if len(ns) < 2:
        raise ValueError(f"the dense characterization's pass sizes {sorted(char['n'])} and the verify times' "
                         f"{base.ns} share no n = 1..n_max >= 2; characterize and measure the same n")
    outside, source = outside_times(base, char, ns)
    apart, apart_source = apart_or_unavailable(char, base.depth, ns)  # D(n) is what a dense characterization times
    common = dict(n_max=ns[-1], tau1=base.tau1, h=base.h[: ns[-1]], acceptance=acceptance)
    versions = {"prediction": predict_without_experts(version="prediction", **common),
                "prediction-outside": predict_without_experts(version="prediction-outside", outside=apart, **common),
                "calibrated": predict_without_experts(version="calibrated", outside=outside, **common)}
    return {"depth": base.depth, "versions": {name: v.to_dict() for name, v in versions.items()},
            "unavailable": {"measured-time": {"reason": Unavailable.NO_OPERATION_TIMES.value, "message": NO_EXPERTS}},
            "calibrated_outside": source, "prediction_outside": apart_source,
            "calibrated_on": CalibratedOn.PREDICTION.value}


def predict_dense(*, path: Path, characterization: Path, measurement_base: Path,
                  acceptance: Sequence[float] | None = None) -> dict[str, Any]:
    """prediction.json of a dense file at every verify depth of the base measurement (module docstring),
    refused unless both artifacts are of the same file (`models.lineage.check_chain`)."""
    from moespec.bench.measure_base import HSource
    from moespec.costmodel.predict import ACCEPTANCE_GRID
    from moespec.models.lineage import check_chain

    char = artifacts.load(characterization, KIND)["payload"]
    base = artifacts.load(measurement_base, KINDS[MEASUREMENT_BASE])["payload"]
    shared = check_chain({f"characterization ({characterization})": char,
                          f"measurement_base ({measurement_base})": base})
    grid = ACCEPTANCE_GRID if acceptance is None else acceptance
    depths = [dense_versions(char, base, int(v["depth"]), grid) for v in base.get("verify", [])]
    if not depths:
        raise ValueError(f"{measurement_base} has no verify times; run the base measurement first")
    options = (base.get("provenance") or {}).get("options", {})  # the threads the passes ran on
    engine = (char.get("provenance") or {}).get("experts")  # "llama.cpp": which engine ran the passes
    payload = {"model": base.get("model"), "provenance": {**shared, "experts": engine, "options": options},
               "sources": {"characterization": str(characterization), "measurement_base": str(measurement_base)},
               "h_source": HSource(base.get("h_source", HSource.GIVEN)).value, "characterized_layers": [],
               "trace_layers": 0, "eps": {"engine": 0.0}, "eps_characterized": 0.0, "bounds_vacuous": False,
               "dense": True, "depths": depths}
    artifacts.write(path, KINDS[PREDICTION], payload)
    return payload
