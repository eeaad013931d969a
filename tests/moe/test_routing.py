"""Recording routing on every synthetic MoE preset: shapes, ids, the router's choice, chunking."""

import numpy as np
import pytest
import torch

from moespec.models import synthetic
from moespec.moe.routing import RoutingRecorder, experts_modules, moe_shape, record, record_to_file, tokenize
from moespec.moe.traces import RoutingTrace, read_header
from moespec.provenance import model_fingerprint
from tests.moe.conftest import moe_presets

MOE_PRESETS = moe_presets()


def test_the_moe_presets_are_every_tiny_preset_with_experts():
    tiny = [name for name in synthetic.preset_names() if name.endswith("-tiny")]
    for name in tiny:  # built, so the list is checked against the models, not against the presets' table
        model, _ = synthetic.build(name, seed=0)
        assert bool(experts_modules(model)) == (name in MOE_PRESETS), name
    assert MOE_PRESETS and set(MOE_PRESETS) < set(tiny)


def documents(seed=0, lengths=(24, 9)):
    rng = np.random.default_rng(seed)
    return [(f"doc{i}", rng.integers(0, 256, size=T).tolist()) for i, T in enumerate(lengths)]


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_recorded_experts_are_the_routers_choice(name, tmp_path):
    model, tok = synthetic.build(name, seed=0)
    cfg = model.config
    docs = documents()
    trace = record(model, docs, chunk=1000, with_weights=True)
    L, m = len(experts_modules(model)), cfg.num_experts_per_tok
    assert [d.shape for d in trace.documents] == [(24, L, m), (9, L, m)]
    assert trace.num_experts == model.model.layers[0].mlp.experts.num_experts
    for d in trace.documents:
        assert d.min() >= 0 and d.max() < trace.num_experts
        assert (np.diff(np.sort(d, axis=-1), axis=-1) > 0).all()  # m distinct experts per token and layer
    # The experts the model used: the top-m of each layer's router logits, read off the model's own
    # output_router_logits (top-m of softmax(logits) = top-m of logits for every preset's router).
    out = model(torch.tensor([docs[0][1]]), output_router_logits=True)
    for l, logits in enumerate(out.router_logits):
        chosen = torch.topk(logits.float(), m, dim=-1).indices.sort(-1).values.numpy()
        np.testing.assert_array_equal(np.sort(trace.documents[0][:, l], -1), chosen)
    # Chunks over one cache lose no position: chunked == one pass.
    chunked = record(model, docs, chunk=10, with_weights=True)
    for a, b in zip(trace.documents, chunked.documents):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(trace.weights, chunked.weights):
        np.testing.assert_allclose(a, b, atol=1e-5)
    # The streamed file holds the same trace.
    record_to_file(model, docs, tmp_path / "t.parquet", chunk=12, model_spec=f"synthetic:{name}")
    back = RoutingTrace.load(tmp_path / "t.parquet")
    assert back.doc_ids == ("doc0", "doc1") and back.model == f"synthetic:{name}"
    # the model that routed, by fingerprint, in the file's header and in memory (the chain's checks read it)
    assert back.model_fingerprint == trace.model_fingerprint == model_fingerprint(model)
    assert read_header(tmp_path / "t.parquet") == back.header()
    assert moe_shape(model) == {"num_experts": trace.num_experts, "top_k": m, "num_layers": L}
    assert back.expert_bytes == trace.expert_bytes
    for a, b in zip(back.documents, trace.documents):
        np.testing.assert_array_equal(a, b)


def test_expert_bytes_from_shapes_and_dtype():
    model, _ = synthetic.build("olmoe-tiny", seed=0, dtype="bfloat16")
    trace = record(model, documents(lengths=(5,)))
    H, I = model.config.hidden_size, model.config.intermediate_size
    assert trace.expert_bytes == (3 * H * I * 2,) * model.config.num_hidden_layers  # gate, up, down in bf16
    assert trace.dtype == "bfloat16"
    gptoss, _ = synthetic.build("gptoss-tiny", seed=0)
    H, I = gptoss.config.hidden_size, gptoss.config.intermediate_size
    assert record(gptoss, documents(lengths=(3,))).expert_bytes[0] == (3 * H * I + 2 * I + H) * 4  # + biases


def test_dense_model_and_bad_inputs_are_refused():
    dense, tok = synthetic.build("dense-tiny", seed=0)
    with pytest.raises(ValueError, match="no MoE"):
        RoutingRecorder(dense)
    assert tokenize(tok, [("a", "hello"), ("b", ""), ("c", "world!")], max_tokens=8) == [
        ("a", list(b"hello")), ("c", list(b"wor"))]
    with pytest.raises(ValueError, match="no tokens"):
        tokenize(tok, [("a", "")])
