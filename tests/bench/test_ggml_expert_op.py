"""llama.cpp's expert operation of one layer (`ExpertLayer`, cost-model paper Sec. 2) on GGUF exports of
the trained olmoe preset (N = 64 experts, m = 8, H = 128, F = 64).

The f32 file is checked against numpy on the file's own tensors; the quantized ones against the f32
file and between the grouped (deduplicating) and per-slot kernels."""

import math
import sys

import numpy as np
import pytest

from moespec.bench.ggml_expert_op import PARTS, ExpertLayer
from tests.conftest import require_llama


@pytest.fixture(autouse=True)
def _llama():
    require_llama()


def routing(n: int, N: int, m: int, seed: int):
    """ids [n, m] (each token's m experts distinct, as top-k gives), weights [n, m] summing to 1 per token,
    x [n, H=128] standard normal."""
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.choice(N, m, replace=False) for _ in range(n)])
    return ids, rng.dirichlet(np.ones(m), n), rng.standard_normal((n, 128))


def numpy_reference(path, layer: int, ids, weights, x) -> np.ndarray:
    """[n, H] float64: sum over slots of w * down(silu(gate x) * up x), from the f32 tensors read by gguf."""
    import gguf

    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    gate, up, down = (np.asarray(tensors[f"blk.{layer}.ffn_{p}_exps.weight"].data, dtype=np.float64) for p in PARTS)
    out = np.zeros_like(x, dtype=np.float64)
    for t in range(ids.shape[0]):
        for s, e in enumerate(ids[t]):
            g, u = gate[e] @ x[t], up[e] @ x[t]  # [F] each: gate/up are [N, F, H], down [N, H, F]
            out[t] += weights[t, s] * (down[e] @ (g / (1 + np.exp(-g)) * u))
    return out


@pytest.mark.parametrize("layer", [0, 1])
def test_f32_matches_numpy_and_both_kernels_agree(gguf_files, layer):
    ids, weights, x = routing(5, 64, 8, seed=layer)
    with ExpertLayer(gguf_files["olmoe-f32"], layer, threads=1) as op:
        assert (op.num_experts, op.top_k, op.hidden, op.ffn, op.type_name) == (64, 8, 128, 64, "f32")
        grouped, per_slot = op.run(ids, weights, x), op.run(ids, weights, x, grouped=False)
    ref = numpy_reference(gguf_files["olmoe-f32"], layer, ids, weights, x)
    assert grouped.shape == (5, 128) and grouped.dtype == np.float32
    # f32 dot products of K <= 128 terms: rounding ~ sqrt(K) * 2^-24 of the terms' scale; 1e-5 leaves 10x room,
    # while a wrong expert, slot or weight moves the output by its own scale (~0.5)
    scale = np.abs(ref).max()
    assert np.abs(grouped - ref).max() <= 1e-5 * scale
    # the same vec_dot per (row, expert) in both kernels, only grouped differently
    assert np.abs(grouped - per_slot).max() <= 1e-6 * scale


def test_weights_and_ids_are_inputs(gguf_files):
    """The router is not part of the operation: other weights or other ids give another output."""
    ids, weights, x = routing(3, 64, 8, seed=7)
    with ExpertLayer(gguf_files["olmoe-f32"], 0) as op:
        base = op.run(ids, weights, x)
        assert not np.allclose(op.run(ids, None, x), base)
        assert not np.allclose(op.run((ids + 1) % 64, weights, x), base)
        assert np.array_equal(op.run(ids, weights, x), base)  # a cached graph, new inputs: the same result


@pytest.mark.parametrize("kind, tolerance", [("olmoe-q8_0", 0.03), ("olmoe-q4_k", 0.1)])
def test_quantized_files_agree_across_kernels_and_with_f32(gguf_files, kind, tolerance):
    """Grouped and per-slot quantize each activation row alike (to q8_0/q8_1 blocks, ggml's vec_dot_type)
    and run the same vec_dot per (row, expert), so they agree to f32 rounding. Against the f32 file they
    differ by quantization: q8_0 weights and activations round to 1/127 of each 32-block's max (measured
    ~1% of the output's norm over three products); the q4_k export stores these 128-wide rows as q5_0
    (~3%), so the bounds leave about 3x room."""
    ids, weights, x = routing(6, 64, 8, seed=3)
    with ExpertLayer(gguf_files["olmoe-f32"], 1) as op:
        exact = op.run(ids, weights, x)
    with ExpertLayer(gguf_files[kind], 1) as op:
        grouped, per_slot = op.run(ids, weights, x), op.run(ids, weights, x, grouped=False)
    assert np.abs(grouped - per_slot).max() <= 1e-6 * np.abs(grouped).max()
    error = np.linalg.norm(grouped - exact) / np.linalg.norm(exact)
    assert 0 < error < tolerance, (kind, error)


def test_expert_bytes_are_the_files_tensor_bytes(gguf_files, tmp_path):
    import gguf

    from moespec.backends.llama_lib import quantize

    files = {"f32": gguf_files["olmoe-f32"], "q8_0": gguf_files["olmoe-q8_0"],
             "f16": quantize(gguf_files["olmoe-f32"], tmp_path / "olmoe-f16.gguf", "f16", threads=1)}
    sizes = {}
    for kind, path in files.items():
        tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
        with ExpertLayer(path, 1) as op:
            total = sum(int(tensors[f"blk.1.ffn_{p}_exps.weight"].n_bytes) for p in PARTS)
            assert op.expert_bytes * op.num_experts == total and op.type_name == kind
            sizes[kind] = op.expert_bytes
    assert sizes["f32"] == 3 * 128 * 64 * 4  # three [H, F] matrices of 4-byte floats
    assert sizes["q8_0"] < sizes["f16"] < sizes["f32"]


def test_time_gives_one_positive_sample_per_rep(gguf_files):
    ids, _, _ = routing(4, 64, 8, seed=1)
    with ExpertLayer(gguf_files["olmoe-q8_0"], 0) as op:
        for grouped in (True, False):
            samples = op.time(ids, grouped=grouped, reps=3, warmup=1)
            assert len(samples) == 3 and all(math.isfinite(s) and s > 0 for s in samples)


def test_files_and_layers_without_experts_are_refused(gguf_files, tmp_path):
    import gguf

    blocks = gguf.GGUFReader(str(gguf_files["olmoe-f32"])).fields["olmoe.block_count"].contents()
    with ExpertLayer(gguf_files["olmoe-f32"], blocks - 1) as last:
        assert last.num_experts == 64
    with pytest.raises(ValueError, match="dense model"):
        ExpertLayer(gguf_files["draft-f32"], 0)
    with pytest.raises(ValueError, match=rf"layer {blocks} is out of range .* 0\.\.{blocks - 1}"):
        ExpertLayer(gguf_files["olmoe-f32"], blocks)
    with pytest.raises(ValueError, match="out of range"):
        ExpertLayer(gguf_files["olmoe-f32"], -1)
    with pytest.raises(ValueError, match="is no file"):
        ExpertLayer(tmp_path / "missing.gguf", 0)
    with pytest.raises(ValueError, match="threads must be >= 1"):
        ExpertLayer(gguf_files["olmoe-f32"], 0, threads=0)


def test_bad_inputs_are_refused_before_ggml_aborts(gguf_files):
    ids, weights, x = routing(2, 64, 8, seed=0)
    with ExpertLayer(gguf_files["olmoe-f32"], 0) as op:
        bad = ids.copy()
        bad[1, 3] = 64
        with pytest.raises(ValueError, match=r"expert id 64 is outside 0\.\.63"):
            op.run(bad)
        with pytest.raises(ValueError, match=r"shape \[n, m=8\]"):
            op.run(ids[:, :4])
        with pytest.raises(ValueError, match="weights has shape"):
            op.run(ids, weights[:1])
        with pytest.raises(ValueError, match="x has shape"):
            op.run(ids, weights, x[:, :64])
    with pytest.raises(ValueError, match="is closed"):
        op.run(ids)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_ggml_is_the_copy_llama_cpp_loaded(gguf_files):
    """The .so and .so.0 files are copies: loading the wrong one maps a second ggml with its own state."""
    with ExpertLayer(gguf_files["olmoe-f32"], 0), open("/proc/self/maps") as maps:
        mapped = {line.split()[-1] for line in maps if "libggml-base" in line}
    assert len(mapped) == 1, mapped
