"""The user's drafts at batch size B (issue 50, "The same at batch size B"): k̂*(B) per candidate from
the chain's batch prediction V̂_B(k) (`chain.batch_prediction`, written by the batch chain on llama.cpp)
and the candidate's calibration (`chain.candidates.calibrate`, the calibration half only).

One round drafts one k for the whole batch (as vLLM and llama-server run it). A host drafter (prompt
lookup, llama.cpp's n-gram rules) drafts each live sequence on the host one after the other, so its
cost at B is B ĥ(k), ĥ its per-sequence cost measured at B = 1:

    V̂_{B,c}(k) = V̂_B(k) + B ĥ(k)

(V̂_B holds the target's pass of B(k + 1) tokens and the engine's own time per round). Each sequence
accepts by the candidate's positional acceptance, independently, so a round yields B E(k) tokens and
the speedup over plain batched decoding at B is E(k) V̂_{B,c}(0) / V̂_{B,c}(k) (cost-model paper,
eq. (9) per sequence). A draft model's cost at B is a batched draft pass, which moespec does not
time yet: such a candidate gets no schedule (said in the payload, not guessed).
"""

from __future__ import annotations

from typing import Any, Mapping

from moespec.bench.candidate import expected_draft_cost
from moespec.chain.candidates import DRAFT, CandidateCalibration
from moespec.costmodel.positional import expected_tokens_positional
from moespec.costmodel.settings import vllm_batch_settings

BATCH_VERSION = "prediction"  # the batch prediction's model version (the other, "timed", reads measured passes)


def candidate_schedule(batch_prediction: Mapping[str, Any], calibration: CandidateCalibration, *,
                       version: str = BATCH_VERSION) -> dict:
    """{"B": {B: {"k_star", "speedup", "step_times"}}, "version", "max_k"} for one calibrated host
    drafter, or {"unavailable": why} for a draft model or a prediction without `version`."""
    c = calibration.candidate
    if c.kind == DRAFT:
        return {"unavailable": "a draft model's cost at batch size B (a batched draft pass) is not timed yet"}
    by_batch = batch_prediction.get("versions", {}).get(version)
    if not by_batch:
        return {"unavailable": f"the batch prediction has no {version!r} version"}
    kmax = min(int(batch_prediction["max_k"]), calibration.kmax)
    alpha = calibration.measured.acceptance.alpha[:kmax]
    own = expected_draft_cost(calibration.cost, calibration.measured.acceptance.alpha[:calibration.kmax])
    E = [float(expected_tokens_positional(alpha, k)) for k in range(kmax + 1)]
    out = {}
    for B, V in sorted(by_batch.items(), key=lambda item: int(item[0])):
        B = int(B)
        steps = [float(V[k]) + B * float(own[k]) for k in range(kmax + 1)]
        gain = [E[k] * steps[0] / steps[k] for k in range(kmax + 1)]
        allowed = [0] + [k for k in range(max(1, c.min_k), kmax + 1)]
        k = max(allowed, key=lambda j: (gain[j], -j))
        out[str(B)] = {"k_star": k, "speedup": gain[k], "step_times": steps}
    return {"B": out, "version": version, "max_k": kmax}


def schedule_settings(candidate: Mapping[str, Any], schedule: Mapping[str, Any]) -> dict | None:
    """vLLM's --speculative-config with a draft length per batch-size range for the candidate's
    schedule (`costmodel.settings.vllm_batch_settings`), or None without a schedule. llama-server
    and SGLang take one k for every batch size (SGLang's per-batch-size adaptive config runs only
    with EAGLE drafts), so they get the line of the user's usual batch size from the table."""
    if "B" not in schedule:
        return None
    ks = {int(B): s["k_star"] for B, s in schedule["B"].items()}
    lookup = candidate.get("n") if candidate.get("kind") != DRAFT else None
    return vllm_batch_settings(ks, prompt_lookup=lookup).to_dict()
