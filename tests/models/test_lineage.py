"""Which model an artifact describes (`lineage.identity`) and the check that combines only one's."""

import numpy as np
import pytest

from moespec.models.lineage import IDENTITY, check_chain, identity
from moespec.moe.traces import RoutingTrace
from moespec.provenance import ProvenanceMismatch

TRACE = RoutingTrace(documents=[np.zeros((3, 2, 2), dtype=np.int16)], num_experts=8, expert_bytes=(10, 10),
                     model="synthetic:mixtral-tiny", dtype="float32", model_fingerprint="ab12")
OLMOE = {"model": "synthetic:olmoe-tiny", "fingerprint": "cd34", "dtype": "float32", "experts": "eager",
         "num_experts": 16, "top_k": 4, "num_layers": 2, "options": {"flush": True}}


def test_identity_reads_a_trace_a_payload_and_a_legacy_payload():
    assert identity(TRACE) == identity(TRACE.header()) == {
        "model": "synthetic:mixtral-tiny", "fingerprint": "ab12", "dtype": "float32", "num_experts": 8, "top_k": 2,
        "num_layers": 2}
    unnamed = RoutingTrace(documents=TRACE.documents, num_experts=8, expert_bytes=(10, 10))
    assert identity(unnamed)["model"] is None and identity(unnamed)["fingerprint"] is None  # "": unknown
    # the experts implementation and the options are the run's, not the model's
    assert identity({"provenance": OLMOE}) == {k: OLMOE[k] for k in IDENTITY}
    assert identity({"model": "synthetic:olmoe-tiny", "N": 16, "m": 4}) == {
        "model": "synthetic:olmoe-tiny", "fingerprint": None, "dtype": None, "num_experts": 16, "top_k": 4,
        "num_layers": None}


def test_check_chain_names_each_artifact_and_field_and_returns_what_they_share():
    with pytest.raises(ProvenanceMismatch) as e:
        check_chain({"c.json": {"provenance": OLMOE}, "t.parquet": TRACE}, fix="record the trace with this model")
    assert [line.split(":", 1)[0] for line in e.value.differences] == ["fingerprint", "model", "num_experts", "top_k"]
    assert "num_experts: c.json has 16; t.parquet has 8" in str(e.value)
    assert str(e.value).endswith("\nrecord the trace with this model")
    legacy = {"model": "synthetic:olmoe-tiny", "N": 16, "m": 4}
    assert check_chain({"a": legacy, "b": {"provenance": OLMOE}}) == {k: OLMOE[k] for k in IDENTITY}


@pytest.mark.parametrize("field, value", [("N", 3), ("m", 2)])
def test_a_payload_whose_own_shape_differs_from_its_provenance_is_refused(field, value):
    """An edited N (or m) would pass the identity check, which reads the provenance, while the chain
    computes with the edited value: the payload is refused, naming the field and both values."""
    edited = {"provenance": OLMOE, "N": 16, "m": 4, field: value}
    with pytest.raises(ValueError) as e:
        check_chain({"c.json": edited, "other": {"provenance": OLMOE}})
    said = OLMOE["num_experts" if field == "N" else "top_k"]
    assert f"c.json: its {field} = {value} but its provenance says" in str(e.value) and f"= {said}" in str(e.value)
    assert check_chain({"c.json": {"provenance": OLMOE, "N": 16, "m": 4}})["num_experts"] == 16
