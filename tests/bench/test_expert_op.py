"""The one-layer expert-operation benchmark on tiny models: ids, kernels, resumption, layer loading."""

import json
import numpy as np
import pytest
import torch

from moespec.pointlog import PointLog
from moespec.bench.expert_op import (
    Pass,
    chosen_ids,
    chosen_passes,
    kernel_fn,
    layer_experts,
    load_layer_experts,
    pass_inputs,
    recorded_passes,
    resolve_layers,
    run,
    u_grid,
)
from moespec.models.synthetic import build

M, N = 4, 16  # olmoe-tiny: top-4 of 16 experts


@pytest.mark.parametrize("placement", ["same", "shuffled"])
def test_chosen_ids_name_exactly_U_experts_with_distinct_rows(placement):
    rng = np.random.default_rng(0)
    for n in range(1, 10):
        for U in u_grid(n, M, N):
            ids = chosen_ids(n, U, M, N, placement, rng)
            assert ids.shape == (n, M)
            assert len(np.unique(ids)) == U
            assert all(len(set(row)) == M for row in ids.tolist())


def test_same_placement_repeats_in_token_zeros_slot_and_U_equal_m_repeats_everything():
    rng = np.random.default_rng(1)
    ids = chosen_ids(5, 10, M, N, "same", rng)
    first = {e: s for s, e in enumerate(ids[0])}
    for row in ids[1:]:
        for s, e in enumerate(row):
            if e in first:
                assert first[e] == s
    every = chosen_ids(4, M, M, N, "same", rng)
    assert (every == every[0]).all()
    shuffled = chosen_ids(4, M, M, N, "shuffled", rng)
    assert all(set(row) == set(shuffled[0]) for row in shuffled.tolist())


def test_u_grid_and_passes_span_m_to_min_N_nm():
    assert u_grid(2, M, N) == list(range(4, 9))
    assert u_grid(9, M, N, points=4) == [4, 8, 12, 16]
    passes = chosen_passes(range(2, 10), M, N, u_points=4, seed=3)
    assert passes == chosen_passes(range(2, 10), M, N, u_points=4, seed=3)  # seeded
    for n in range(2, 10):
        Us = {p.U for p in passes if p.n == n}
        assert min(Us) == M and max(Us) == min(N, n * M)
    # both placements wherever they differ, one pass where U = nm (no repeats)
    assert {p.placement for p in passes if p.U < p.n * M} == {"same", "shuffled"}
    with pytest.raises(ValueError, match="outside"):
        chosen_ids(2, 9, M, N, "same", np.random.default_rng(0))


def test_recorded_passes_copy_consecutive_windows_of_the_layer():
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, N, size=(12, 2, M)), rng.integers(0, N, size=(3, 2, M))]
    passes = recorded_passes(docs, 1, range(1, 5), windows=5, seed=0)
    assert len(passes) == 4 * 5
    for p in passes:
        ids = np.array(p.ids)
        hits = [t for t in range(12 - p.n + 1) if (docs[0][t : t + p.n, 1] == ids).all()]
        assert hits, "every window is a slice of a document long enough for the largest n"
    with pytest.raises(ValueError, match="tokens"):
        recorded_passes(docs, 0, [20])


def test_kernels_compute_the_same_expert_operation():
    model, _ = build("olmoe-tiny")
    experts = layer_experts(model, 1)
    p = Pass("chosen", 3, "shuffled", 0, tuple(map(tuple, chosen_ids(3, 9, M, N, "shuffled", np.random.default_rng(2)))))
    hidden, index, weights = pass_inputs(p, 64, torch.float32, "cpu")
    ref = kernel_fn("eager", experts)(experts, hidden, index, weights)
    for name in ("slot", "dedup", "grouped_mm", "batched_mm"):
        torch.testing.assert_close(kernel_fn(name, experts)(experts, hidden, index, weights), ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="unknown kernel"):
        kernel_fn("tiled", experts)


def test_run_keeps_raw_timings_and_resumes_from_the_log(tmp_path):
    model, _ = build("olmoe-tiny")
    experts = layer_experts(model, 0)
    passes = chosen_passes([2], M, N, u_points=2)
    log = PointLog(tmp_path / "p.jsonl")
    calls = []
    records = run(experts, passes, ["slot", "dedup"], layer=0, reps=3, log=log, on_point=calls.append)
    assert len(records) == 2 * len(passes) and len(log) == len(calls) == 3 * len(records)  # one entry per sample
    assert all(len(r["timing"]["samples"]) == 3 for r in records)
    assert {r["bytes"] for r in records if r["kernel"] == "slot"} == {2 * M * records[0]["b"]}
    assert sum(calls) == pytest.approx(sum(r["bytes"] for r in records))  # progress weighted by bytes
    again = run(experts, passes, ["slot", "dedup"], layer=0, reps=3, log=PointLog(tmp_path / "p.jsonl"))
    assert again == records  # nothing re-measured: every sample comes back from the log
    more = run(experts, passes, ["slot", "dedup"], layer=0, reps=5, log=PointLog(tmp_path / "p.jsonl"))
    for old, new in zip(records, more):  # more repetitions keep the logged samples and add two
        assert new["timing"]["samples"][:3] == old["timing"]["samples"] and len(new["timing"]["samples"]) == 5


def test_run_interrupted_mid_round_resumes_with_the_samples_taken(tmp_path):
    model, _ = build("olmoe-tiny")
    experts = layer_experts(model, 0)
    passes = chosen_passes([2, 3], M, N, u_points=2)
    points = 2 * len(passes)
    taken = []

    def stop(nbytes):
        taken.append(nbytes)
        if len(taken) == points + 3:  # inside the second round
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(experts, passes, ["slot", "dedup"], layer=0, reps=2, log=PointLog(tmp_path / "p.jsonl"), on_point=stop)
    log = PointLog(tmp_path / "p.jsonl")
    assert len(log) == points + 3
    kept = dict(log.items())
    records = run(experts, passes, ["slot", "dedup"], layer=0, reps=2, log=log)
    samples = {float(s) for r in records for s in r["timing"]["samples"]}
    assert {float(v) for v in kept.values()} <= samples and len(PointLog(tmp_path / "p.jsonl")) == 2 * points


def test_run_spreads_each_points_repetitions_over_rounds(tmp_path):
    """Round r of every point is taken before round r + 1 of any: the log's order shows it."""
    model, _ = build("olmoe-tiny")
    experts = layer_experts(model, 0)
    passes = chosen_passes([2], M, N, u_points=3)
    log = PointLog(tmp_path / "p.jsonl")
    run(experts, passes, ["slot", "dedup"], layer=0, reps=3, log=log)
    rounds = [json.loads(key)[-1] for key, _ in log.items()]
    assert rounds == sorted(rounds) and set(rounds) == {0, 1, 2}


@pytest.mark.parametrize("preset", ["olmoe-tiny", "mixtral-tiny"])
def test_load_layer_experts_reads_one_layer_from_shards(tmp_path, preset):
    model, _ = build(preset)
    model.save_pretrained(tmp_path, max_shard_size="40KB")  # several shards, per-expert tensors
    loaded = load_layer_experts(tmp_path, "mid")
    ref = layer_experts(model, 1)
    for name, param in ref.named_parameters(recurse=False):
        assert torch.equal(getattr(loaded, name), param), name


def test_resolve_layers():
    assert resolve_layers([0, "mid", -1], 16) == [0, 8, 15]
    assert resolve_layers(["mid", 1], 2) == [1]
    with pytest.raises(ValueError, match="out of range"):
        resolve_layers([5], 2)
    with pytest.raises(ValueError, match="neither"):
        resolve_layers(["last"], 2)
