import numpy as np
import pytest
import torch

from moespec.models.synthetic import build
from moespec.moe.traces import RoutingTrace
from moespec.provenance import (
    ProvenanceMismatch,
    check,
    check_same_model,
    diff,
    model_fingerprint,
    model_provenance,
    trace_fingerprint,
)


def fingerprint(name="olmoe-tiny", seed=0, **kw):
    return model_fingerprint(build(name, seed=seed, **kw)[0])


def test_fingerprint_is_reproducible_and_tells_seeds_and_presets_apart():
    assert fingerprint(seed=0) == fingerprint(seed=0)
    assert len({fingerprint(seed=0), fingerprint(seed=1), fingerprint("mixtral-tiny", seed=0)}) == 3


def test_fingerprint_changes_with_one_element_by_one_ulp():
    model, _ = build("olmoe-tiny", seed=0)
    before = model_fingerprint(model)
    w = dict(model.named_parameters())["model.layers.1.mlp.experts.down_proj"]
    w[3, 5, 7] = torch.nextafter(w[3, 5, 7], torch.tensor(1.0))
    assert model_fingerprint(model) != before


def test_fingerprint_changes_when_two_experts_swap():
    model, _ = build("olmoe-tiny", seed=0)
    before = model_fingerprint(model)
    w = dict(model.named_parameters())["model.layers.0.mlp.experts.gate_up_proj"]
    w[[0, 1]] = w[[1, 0]].clone()
    assert model_fingerprint(model) != before


def test_fingerprint_changes_with_dtype_and_config_but_not_experts_implementation():
    model, _ = build("olmoe-tiny", seed=0)
    base = model_fingerprint(model)
    assert fingerprint(dtype="bfloat16") != base
    eps, _ = build("olmoe-tiny", seed=0, rms_norm_eps=1e-6)  # same weights, another config value
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), eps.parameters()))
    assert model_fingerprint(eps) != base
    model.set_experts_implementation("moespec_dedup")
    assert model_fingerprint(model) == base


def test_model_provenance_records_what_the_model_holds():
    model, _ = build("olmoe-tiny", seed=0, dtype="bfloat16")
    model.set_experts_implementation("moespec_slot")
    p = model_provenance("synthetic:olmoe-tiny", model)
    assert p == {"model": "synthetic:olmoe-tiny", "fingerprint": model_fingerprint(model),
                 "dtype": "bfloat16", "experts": "moespec_slot"}
    assert model_provenance("x", model, dtype=torch.bfloat16, experts="moespec_dedup")["experts"] == "moespec_dedup"
    assert model_provenance("x", model, dtype=torch.bfloat16)["dtype"] == "bfloat16"


def make_trace(seed=0, **kw):
    rng = np.random.default_rng(seed)
    docs = [np.stack([rng.permutation(16)[:4] for _ in range(2 * 9)]).reshape(9, 2, 4) for _ in range(3)]
    return RoutingTrace(documents=docs, num_experts=16, expert_bytes=(1000, 1000), **kw)


def test_trace_fingerprint_sees_one_routed_id_and_the_header():
    base = trace_fingerprint(make_trace())
    assert trace_fingerprint(make_trace()) == base
    changed = make_trace()
    doc = changed.documents[1]
    doc[4, 1, 2] = next(e for e in range(16) if e not in doc[4, 1])
    assert trace_fingerprint(changed) != base
    assert trace_fingerprint(RoutingTrace(documents=make_trace().documents, num_experts=17,
                                          expert_bytes=(1000, 1000))) != base
    weighted = make_trace(weights=[np.full(d.shape, 0.25, np.float32) for d in make_trace().documents])
    assert trace_fingerprint(weighted) != base


def test_trace_fingerprint_survives_a_save_and_load(tmp_path):
    trace = make_trace()
    assert trace_fingerprint(RoutingTrace.load(trace.save(tmp_path / "t.parquet"))) == trace_fingerprint(trace)


def test_diff_names_each_field_with_both_values():
    expected = {"model": "synthetic:olmoe-tiny", "dtype": "float32", "options": {"reps": 5, "ns": (1, 2)}}
    found = {"model": "synthetic:mixtral-tiny", "dtype": "float32", "options": {"reps": 3, "ns": [1, 2]},
             "trace": "ab12"}
    assert diff(expected, found) == [
        'model: expected "synthetic:olmoe-tiny", found "synthetic:mixtral-tiny"',
        "options.reps: expected 5, found 3",
        'trace: expected nothing, found "ab12"',
    ]
    assert diff(expected, {**expected, "options": {"reps": 5, "ns": [1, 2]}}) == []


def test_check_raises_with_every_difference_and_the_fix():
    with pytest.raises(ProvenanceMismatch) as err:
        check({"dtype": "float32", "experts": "moespec_slot"}, {"dtype": "bfloat16", "experts": "moespec_dedup"},
              what="the point log q.points.jsonl", fix="pass --restart")
    message = str(err.value)
    assert message.startswith("the point log q.points.jsonl was made under another provenance")
    assert 'dtype: expected "float32", found "bfloat16"' in message
    assert 'experts: expected "moespec_slot", found "moespec_dedup"' in message
    assert message.endswith("pass --restart") and len(err.value.differences) == 2
    check({"a": 1}, {"a": 1}, what="same")


def test_check_same_model_names_the_artifacts_and_fields_that_differ():
    named = {
        "characterization.json": {"model": "synthetic:olmoe-tiny", "num_experts": 16, "top_k": 4, "layers": [0, 1]},
        "prediction.json": {"model": "synthetic:olmoe-tiny", "num_experts": 16, "fingerprint": "aa"},
        "measurement.json": {"model": "synthetic:mixtral-tiny", "num_experts": 8, "top_k": 4, "fingerprint": None},
    }
    with pytest.raises(ProvenanceMismatch) as err:
        check_same_model(named)
    assert err.value.differences == [
        'model: characterization.json has "synthetic:olmoe-tiny"; prediction.json has "synthetic:olmoe-tiny"; '
        'measurement.json has "synthetic:mixtral-tiny"',
        "num_experts: characterization.json has 16; prediction.json has 16; measurement.json has 8",
    ]
    assert "characterization.json, prediction.json, measurement.json" in str(err.value)


def test_check_same_model_compares_only_shared_fields():
    check_same_model({
        "characterization.json": {"model": "m", "num_experts": 16, "layers": (0, 1)},
        "measurement.json": {"model": "m", "top_k": 4, "layers": [0, 1], "fingerprint": None},
        "score.json": {"model": "m", "fingerprint": "aa", "num_experts": 16.0},
    })
