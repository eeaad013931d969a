"""Routing replay: every architecture's experts see the trace's ids at each token's position, in one
pass, chunked over a cache and in speculative decoding; the model's fingerprint says so."""

import numpy as np
import pytest
import torch

from moespec.engine.decode import generate
from moespec.models import synthetic
from moespec.models import load
from moespec.moe.replay import RoutingReplay, layer_map, replay_routing
from moespec.moe.routing import record, experts_modules
from moespec.moe.traces import RoutingTrace
from moespec.provenance import model_fingerprint
from tests.moe.conftest import moe_presets

MOE_PRESETS = moe_presets()


def fake_trace(N: int, m: int, layers: int = 3, tokens: int = 40, seed: int = 0) -> RoutingTrace:
    rng = np.random.default_rng(seed)
    docs = [np.stack([np.stack([rng.choice(N, m, replace=False) for _ in range(layers)]) for _ in range(t)])
            for t in (tokens // 2, tokens - tokens // 2)]
    return RoutingTrace(documents=[d.astype(np.int16) for d in docs], num_experts=N, expert_bytes=(1,) * layers)


def _shape(model):
    return int(experts_modules(model)[0][1].num_experts), int(model.config.num_experts_per_tok)


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_each_position_takes_its_trace_row(name):
    model, _ = synthetic.build(name, seed=0)
    trace = fake_trace(*_shape(model))
    stream = np.concatenate(trace.documents)  # [40, 3, m]
    replay = RoutingReplay(model, trace)
    ids = torch.randint(0, 256, (50,)).tolist()  # past the trace's 40 rows: positions wrap around
    for chunk in (1000, 7):
        got = record(model, [("d", ids)], chunk=chunk).documents[0]  # [50, L, m]
        want = stream[np.arange(50) % 40][:, replay.layers]
        np.testing.assert_array_equal(np.sort(got, -1), np.sort(want, -1))
    replay.remove()
    own = record(model, [("d", ids)]).documents[0]
    assert not np.array_equal(np.sort(own, -1), np.sort(stream[np.arange(50) % 40][:, replay.layers], -1))


def test_speculative_decoding_replays_and_stays_lossless():
    target, tok = synthetic.build("olmoe-tiny", seed=0)
    draft, _ = synthetic.build("dense-tiny", seed=1)
    replay_routing(target, fake_trace(*_shape(target)))
    prompt = tok.encode("Replayed routing", add_bos=True)
    plain = generate(target, prompt, k=0, max_new_tokens=20).tokens
    assert generate(target, prompt, draft=draft, k=3, max_new_tokens=20).tokens == plain
    with torch.no_grad():  # the replayed model's own greedy continuation, token by token without a cache
        ids = list(prompt)
        for _ in range(20):
            logits = target(torch.tensor([ids])).logits[0, -1, :259]
            ids.append(int(logits.argmax()))
    assert ids[len(prompt):] == plain


def test_layers_map_by_relative_depth():
    assert layer_map(2, 6) == [1, 4]
    assert layer_map(6, 6) == list(range(6))
    assert layer_map(4, 1) == [0, 0, 0, 0]
    for L, T in ((2, 16), (3, 5), (16, 4)):
        m = layer_map(L, T)
        assert m == sorted(m) and 0 <= m[0] and m[-1] < T


def test_a_trace_of_another_shape_is_refused_and_the_fingerprint_changes(tmp_path):
    model, _ = synthetic.build("olmoe-tiny", seed=0)
    before = model_fingerprint(model)
    with pytest.raises(ValueError, match="same N and m"):
        RoutingReplay(model, fake_trace(64, 8))
    other = fake_trace(64, 8).save(tmp_path / "other.parquet")
    with pytest.raises(ValueError, match=f"the trace {other} routes 8 of 64"):  # a file is named
        replay_routing(model, other)
    path = fake_trace(*_shape(model)).save(tmp_path / "t.parquet")
    replayed, _ = load("synthetic:olmoe-tiny", routing=path)
    assert model_fingerprint(replayed) != before
