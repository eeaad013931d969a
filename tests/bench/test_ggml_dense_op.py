"""The dense products of a GGUF file on ggml (`DenseOps`): the tensors picked, their products against
numpy on the f32 export of trained:olmoe, and the timing's shape."""

import numpy as np
import pytest

from moespec.bench.ggml_dense_op import DenseOps
from tests.conftest import require_llama


@pytest.fixture(autouse=True)
def _llama():
    require_llama()


def test_every_dense_weight_and_the_head_none_of_the_experts(gguf_files):
    import gguf

    reader = gguf.GGUFReader(str(gguf_files["olmoe-q8_0"]))
    layers = {int(t.name.split(".")[1]) for t in reader.tensors if t.name.startswith("blk.")}
    with DenseOps(gguf_files["olmoe-q8_0"], threads=1) as ops:
        names = ops.names
        assert ops.nbytes == sum(int(t.n_bytes) for t in reader.tensors if t.name in names)
    per_block = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp"}
    assert set(names) == {f"blk.{l}.{p}.weight" for l in layers for p in per_block} | {"output.weight"}
    assert not any("_exps" in n or "norm" in n for n in names)


def test_products_match_numpy_on_the_f32_file(gguf_files):
    import gguf

    tensors = {t.name: np.asarray(t.data, dtype=np.float64) for t in gguf.GGUFReader(str(gguf_files["olmoe-f32"])).tensors}
    with DenseOps(gguf_files["olmoe-f32"], threads=2) as ops:
        for n in (1, 3):
            got = ops.run(n, seed=n)
            assert len(got) == len(ops.names)
            # the inputs are one seeded standard-normal [n, k] per inner size k, drawn in increasing k
            rng = np.random.default_rng(n)
            xs = {k: rng.standard_normal((n, k)).astype(np.float32) for k in sorted({tensors[m].shape[1] for m in ops.names})}
            for name, y in zip(ops.names, got):
                W = tensors[name]  # [rows, k] in numpy's order
                ref = xs[W.shape[1]].astype(np.float64) @ W.T
                assert y.shape == (n, W.shape[0])
                # f32 dot products of k <= 128 terms of unit-scale inputs: 1e-4 of the scale is 10x rounding
                assert np.abs(y - ref).max() <= 1e-4 * max(np.abs(ref).max(), 1.0), name


def test_timing_and_errors(gguf_files, tmp_path):
    with DenseOps(gguf_files["olmoe-q8_0"], threads=1) as ops:
        times = ops.time(2, reps=4, warmup=1)
        assert len(times) == 4 and all(t > 0 for t in times)
        with pytest.raises(ValueError, match="n >= 1"):
            ops.run(0)
    with pytest.raises(ValueError, match="closed"):
        ops.run(1)
    with pytest.raises(ValueError, match="threads must be >= 1"):
        DenseOps(gguf_files["olmoe-q8_0"], threads=0)
