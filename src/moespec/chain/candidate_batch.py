"""The user's drafts at batch size B (issue 50, "The same at batch size B"): k̂*(B) per candidate from
the chain's batch prediction V̂_B(k) (`chain.batch_prediction`, written by the batch chain on llama.cpp)
and the candidate's calibration (`chain.candidates.calibrate`, the calibration half only).

One round drafts one k for the whole batch (as vLLM and llama-server run it). V̂_B holds the target's
pass of B(k + 1) tokens and the engine's own time per round; the draft's own cost goes on top, the
batch counterpart of the step time V(k) = τ_p(k + 1) + h(k) (cost-model paper, Section 3.1):

- a host drafter (prompt lookup, llama.cpp's n-gram rules) drafts each live sequence on the host one
  after the other: B ĥ(k), ĥ its per-sequence cost measured at B = 1, so V̂_{B,c}(k) = V̂_B(k) + B ĥ(k);
- a draft model drafts every live sequence in one batched pass per draft token: its round at B is
  timed on llama.cpp (`bench.batch_draft_cost`, h_B(k) plain and with every sequence catching up)
  and ĥ_B(k) is its expectation under the positional acceptance (`expected_draft_cost`, as at B = 1),
  so V̂_{B,c}(k) = V̂_B(k) + ĥ_B(k).

A lookup's proposal may come short (`costmodel.positional.expected_pass_times`): V̂_B(k) is weighted
by the shares s_j as at B = 1, exact where the batch's sequences draft alike and V̂_B grows linearly
between the k it holds, an approximation otherwise.

Each sequence accepts by the candidate's positional acceptance, independently, so a round yields
B E(k) tokens and the speedup over plain batched decoding at B is E(k) V̂_{B,c}(0) / V̂_{B,c}(k)
(eq. (9) per sequence, E(k) in place of G_a(k); E(k), the draft shares and the chance a round accepted
all read from the calibration's run at k where it made one, as at B = 1: `chain.candidate_answer`);
k̂*(B) is its smallest maximizer. A draft model whose batched rounds were not timed (a torch chain, a
draft that is not a GGUF file, a run folder from before) gets no schedule, said in the payload, not guessed.
"""

from __future__ import annotations

from typing import Any, Mapping

from moespec.bench.batch_draft_cost import BatchDraftCost
from moespec.bench.candidate import expected_draft_cost
from moespec.chain.candidate_answer import by_k, draft_shares
from moespec.chain.candidates import DRAFT, CandidateCalibration
from moespec.costmodel.positional import best_of, expected_by_k, expected_pass_times
from moespec.costmodel.settings import vllm_batch_settings

BATCH_VERSION = "prediction"  # the batch prediction's model version (the other, "timed", reads measured passes)
NOT_TIMED = ("a draft model's cost at batch size B, a batched draft pass, is not timed yet here: moespec times it "
             "where the demo runs the batch chain on llama.cpp with a GGUF draft")


def candidate_schedule(batch_prediction: Mapping[str, Any], calibration: CandidateCalibration, *,
                       version: str = BATCH_VERSION, batch_cost: BatchDraftCost | None = None) -> dict:
    """{"B": {B: {"k_star", "speedup", "step_times", "h"}}, "version", "max_k"} for one calibrated
    candidate (module docstring; h: the draft's own cost per round of the batch, [max_k + 1] s), or
    {"unavailable": why}: a draft model without `batch_cost` (its h_B timed at the prediction's batch
    sizes, `bench.batch_draft_cost`), a prediction without `version`."""
    c = calibration.candidate
    batch_cost = batch_cost if c.kind == DRAFT else None  # a host drafter's cost at B is B ĥ(k)
    if c.kind == DRAFT and batch_cost is None:
        return {"unavailable": NOT_TIMED}
    by_batch = batch_prediction.get("versions", {}).get(version)
    if not by_batch:
        return {"unavailable": f"the batch prediction has no {version!r} version"}
    kmax = min(int(batch_prediction["max_k"]), calibration.kmax, batch_cost.kmax if batch_cost else calibration.kmax)
    own = draft_costs(calibration, batch_cost, [int(B) for B in by_batch])
    if not own:
        return {"unavailable": f"the draft model was timed at batch sizes {sorted(batch_cost.by_batch)}, the batch "
                               f"prediction is at {sorted(int(B) for B in by_batch)}; time it at those"}
    measured = calibration.measured
    E = [float(e) for e in expected_by_k(measured.acceptance, kmax, measured.at_k)[0]]
    allowed = [0] + list(range(max(1, c.min_k), kmax + 1))
    rows = {int(B): V for B, V in by_batch.items()}  # keys are strings in a stored prediction
    shares = draft_shares(measured, kmax)
    out = {}
    for B in sorted(own):
        h = [float(own[B][k]) for k in range(kmax + 1)]
        passes = by_k(expected_pass_times, [[float(rows[B][k]) for k in range(kmax + 1)]], shares)
        steps = [float(passes[k]) + h[k] for k in range(kmax + 1)]
        gain = [E[k] * steps[0] / steps[k] for k in range(kmax + 1)]
        k = best_of(gain, allowed)
        out[str(B)] = {"k_star": k, "speedup": gain[k], "step_times": steps, "h": h}
    return {"B": out, "version": version, "max_k": kmax}


def draft_costs(calibration: CandidateCalibration, batch_cost: BatchDraftCost | None,
                sizes: list[int]) -> dict[int, list]:
    """{B: the candidate's own cost of a round of B sequences at k = 0..}: B ĥ(k) for a host drafter
    (ĥ at B = 1, `expected_draft_cost`), ĥ_B(k) for a draft model at the sizes `batch_cost` timed."""
    measured = calibration.measured
    alpha, at_k = measured.acceptance.alpha[:calibration.kmax], measured.at_k
    if batch_cost is None:
        one = expected_draft_cost(calibration.cost, alpha, at_k)
        return {B: [B * x for x in one] for B in sizes}
    return {B: batch_cost.expected(B, alpha, at_k) for B in sizes if B in batch_cost.by_batch}


def schedule_settings(candidate: Mapping[str, Any], schedule: Mapping[str, Any]) -> dict | None:
    """vLLM's --speculative-config with a draft length per batch-size range for the candidate's
    schedule (`costmodel.settings.vllm_batch_settings`), or None without a schedule. llama-server
    and SGLang take one k for every batch size (SGLang's per-batch-size adaptive config runs only
    with EAGLE drafts), so they get the line of the user's usual batch size from the table."""
    if "B" not in schedule:
        return None
    ks = {int(B): s["k_star"] for B, s in schedule["B"].items()}
    draft = candidate.get("draft") if candidate.get("kind") == DRAFT else None
    lookup = candidate.get("n") if candidate.get("kind") != DRAFT else None
    return vllm_batch_settings(ks, draft=draft, prompt_lookup=lookup).to_dict()
