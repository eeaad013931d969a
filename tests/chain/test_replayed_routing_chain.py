"""The demo chain on replayed routing: every step sees the trace's experts, and a run folder made
on the model's own routing is refused; `--routing trained` records trained:olmoe's routing."""

import numpy as np
import pytest

from moespec.chain import demo as pipeline
from moespec.chain import demo_steps as demo_work
from moespec.models import synthetic
from moespec.moe.replay import RoutingReplay
from moespec.moe.routing import record
from moespec.moe.traces import RoutingTrace
from moespec.chain.demo import DemoConfig, run_demo
from moespec.provenance import ProvenanceMismatch


def _trace(path, N=16, m=4, layers=2, tokens=300, seed=0):
    rng = np.random.default_rng(seed)
    doc = np.stack([np.stack([rng.choice(N, m, replace=False) for _ in range(layers)]) for _ in range(tokens)])
    return RoutingTrace(documents=[doc.astype(np.int16)], num_experts=N, expert_bytes=(1,) * layers).save(path)


def test_the_chain_records_and_times_the_replayed_routing(tmp_path):
    routing = _trace(tmp_path / "routing.parquet")
    out = tmp_path / "run"
    run_demo(out, config=DemoConfig.smoke(routing=str(routing)), progress=False, echo=lambda _: None)
    stream = RoutingTrace.load(routing).documents[0]
    traced = RoutingTrace.load(out / pipeline.TRACES)
    for doc in traced.documents:  # each corpus document is read from position 0
        np.testing.assert_array_equal(np.sort(doc, -1), np.sort(stream[: len(doc)], -1))
    assert (out / "score.json").exists()
    with pytest.raises(ProvenanceMismatch):  # the same folder, the model's own routing: refused
        run_demo(out, config=DemoConfig.smoke(), progress=False, echo=lambda _: None)


def test_trained_routing_is_trained_olmoes_and_replays_on_its_shape(tmp_path):
    path = tmp_path / pipeline.TRAINED_ROUTING
    demo_work.trace_trained(path)
    trace = RoutingTrace.load(path)
    assert (trace.num_experts, trace.top_k, trace.num_layers) == (64, 8, 6)
    assert trace.num_tokens == demo_work.TRAINED_ROUTING_TOKENS and trace.model == "trained:olmoe"
    model, _ = synthetic.build("olmoe-tiny", experts=64, num_experts_per_tok=8)  # olmoe-shaped's N and m
    replay = RoutingReplay(model, trace)
    ids = list(range(40))
    got = record(model, [("d", ids)]).documents[0]
    want = np.concatenate(trace.documents)[:40][:, replay.layers]
    np.testing.assert_array_equal(np.sort(got, -1), np.sort(want, -1))
