"""The chain on GGUF files no one here wrote: llama.cpp's converter's files of seven MoE architectures
(`tests/converted.py`). Each is checked the same way: the routing llama.cpp records against
transformers' on the checkpoint, llama.cpp's expert operation (ggml) against transformers' experts
module, the dense products, and the whole chain at smoke settings."""

import numpy as np
import pytest
import torch

from moespec import artifacts
from moespec.models import gguf_info
from moespec.moe.traces import RoutingTrace
from tests.converted import RECIPES

ARCHS = sorted(RECIPES)
TOKENS = 300  # tokens read by both engines: 300 x 2-3 layers = 600-900 (token, layer) pairs per file


@pytest.fixture(scope="module")
def token_ids(converted):
    """TOKENS ids of SmolLM2's tokenizer on text written here (code and prose), the same for every file."""
    from moespec.texts import default_corpus
    from moespec.models import gguf

    tok = gguf.tokenizer(gguf.SMOLLM2)
    ids = [t for _, text in default_corpus()[:4] for t in tok.encode(text)]
    return ids[:TOKENS]


@pytest.mark.parametrize("kind, floor", [("f32", 0.99), ("f16", 0.98), ("q8_0", 0.97)])
@pytest.mark.parametrize("arch", ARCHS)
def test_llama_cpp_routes_as_transformers_up_to_near_ties(converted, token_ids, arch, kind, floor):
    """The same weights route alike (measured: f32 1.000 on every architecture, f16 >= 0.99, q8_0 >= 0.98);
    where they differ, the router was at a near tie: its m-th and (m+1)-th scores closer than a quarter
    of the median gap (measured: under a tenth). A wrong layer, expert order or score would differ at
    ordinary margins, on far more pairs."""
    from moespec.checks.routing_agreement import compare

    a = compare(converted[arch]["checkpoint"], converted[arch][kind], token_ids, threads=1)
    assert a.tokens == TOKENS and a.layers == gguf_info.layout(converted[arch][kind]).num_layers
    assert a.agreement >= floor, a
    assert all(m < 0.25 * a.median_margin for m in a.margins_at_differences), a


@pytest.mark.parametrize("arch", ARCHS)
def test_ggmls_expert_operation_is_transformers_experts_module(converted, arch):
    """llama.cpp's expert operation (`ExpertLayer`, built for the file's layout: separate or merged
    gate/up, biases, gpt-oss's clamped activation) on the f32 file against the checkpoint's experts
    module on the same ids, weights and activations, every MoE layer."""
    from moespec.bench.ggml_expert_op import ExpertLayer
    from moespec.models import load
    from moespec.moe.experts import find_experts

    model, _ = load(str(converted[arch]["checkpoint"]), backend="torch")
    lay = gguf_info.layout(converted[arch]["f32"])
    rng = np.random.default_rng(0)
    n, N, m, H = 5, lay.num_experts, lay.top_k, lay.hidden
    for block, experts in zip(lay.moe_layers, find_experts(model)):
        ids = np.stack([rng.choice(N, m, replace=False) for _ in range(n)])
        weights, x = rng.dirichlet(np.ones(m), n), rng.standard_normal((n, H))
        with torch.inference_mode():
            ref = experts(torch.tensor(x, dtype=torch.float32), torch.tensor(ids), torch.tensor(weights,
                                                                                                  dtype=torch.float32))
        with ExpertLayer(converted[arch]["f32"], block, threads=1) as op:
            got = op.run(ids, weights, x)
        ref = ref.numpy()
        # f32 both sides; a wrong part, slot, bias or activation moves the output by its own scale
        assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max(), (arch, block)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_dense_products_take_every_non_expert_weight(converted, arch):
    import gguf

    from moespec.bench.ggml_dense_op import DenseOps

    path = converted[arch]["q8_0"]
    lay = gguf_info.layout(path)
    with DenseOps(path, threads=1) as ops:
        names = set(ops.names)
        got = ops.run(2)
    assert all(y.shape[0] == 2 and np.isfinite(y).all() for y in got)
    two_d = {t.name for t in gguf.GGUFReader(str(path)).tensors if len(t.shape) == 2 and t.name.startswith("blk.")}
    assert names - {"output.weight"} == {n for n in two_d if "_exps." not in n}
    if lay.dense_blocks:  # DeepSeek's leading dense FFN
        assert {f"blk.{b}.ffn_{p}.weight" for b in lay.dense_blocks for p in ("gate", "up", "down")} <= names
    if any(lay.shared_bytes):  # shared experts: read once per pass
        assert any("shexp" in n for n in names)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_chain_runs_on_the_file_at_smoke_settings(converted, arch, tmp_path):
    """trace (routing from llama.cpp), characterize, measure, predict, sweep, score, report on the
    converter's q8_0 file: the artifacts carry the file's identity and its own expert bytes."""
    from moespec.chain.demo import DemoConfig, run_demo

    path = converted[arch]["q8_0"]
    result = run_demo(tmp_path, config=DemoConfig.smoke(model=str(path), backend="llama.cpp", threads=1),
                      progress=False, echo=lambda _: None)
    assert result.ran == ("trace", "trace-verified", "characterize", "measure-base", "predict", "measure-sweep", "score", "batch-trace",
                          "batch-characterize", "batch-measure", "batch-predict", "batch-score")
    trace = RoutingTrace.load(tmp_path / "traces.parquet")
    lay = gguf_info.layout(path)
    assert trace.model_fingerprint == gguf_info.fingerprint(path) and trace.dtype == "q8_0"
    assert list(trace.expert_bytes) == list(lay.expert_bytes) and list(trace.layers) == list(lay.moe_layers)
    assert "routing recorded by llama.cpp" in trace.corpus
    score = artifacts.load(tmp_path / "score.json", "score")["payload"]
    versions = score["depths"][0]["versions"]
    assert {"prediction", "prediction-outside", "measured-time", "calibrated"} <= set(versions)
    for s in versions.values():
        assert len(s["k_star_predicted"]) == len(s["acceptance"]) == len(s["k_star_measured"])
    assert (tmp_path / "report.html").is_file()
