"""A llama.cpp pass's o(n) = D(n) + R_d(n) timed beside each verify pass (`bench.ggml_outside`), the
file's weights read in place (`ggml_graph.GraphOwner`), and `time_passes`' call right after each pass."""

import numpy as np
import pytest

from moespec.bench import ggml_graph, timing
from moespec.bench.ggml_dense_op import DenseOps
from moespec.bench.ggml_expert_op import ExpertLayer
from moespec.bench.ggml_outside import TERMS, OutsideOfPass
from moespec.bench.ggml_rest_op import RestOfPass
from moespec.models import gguf_info
from tests.bench.conftest import FakeClock
from tests.conftest import require_llama


@pytest.fixture(autouse=True)
def _llama():
    require_llama()


def test_weights_are_the_files_own_pages_and_compute_as_copies_do(converted, monkeypatch):
    """Each owner's weight tensors point into the file's memory map, at the tensor's own bytes; the
    products over them equal those over copies, bit for bit."""
    import ctypes

    from moespec.backends import llama_lib

    path = converted["olmoe"]["q8_0"]
    found = gguf_info.tensors(path)
    with DenseOps(path, threads=1) as mapped, ExpertLayer(path, 1, threads=1) as layer, \
            RestOfPass(path, threads=1) as rest:
        for owner in (mapped, layer, rest):
            assert owner.mapped
            for name, tensor in owner.weights.items():
                data = llama_lib.ggml().ggml_get_data(tensor)
                assert data == found[name].data.ctypes.data
                assert ctypes.string_at(data, 16) == found[name].data.tobytes()[:16]
        in_place = mapped.run(3, seed=5)
    monkeypatch.setattr(ggml_graph, "_mapped_span", lambda found: None)
    with DenseOps(path, threads=1) as copied:
        assert not copied.mapped
        for a, b in zip(in_place, copied.run(3, seed=5)):
            np.testing.assert_array_equal(a, b)


def test_misaligned_or_foreign_tensors_are_copied():
    """A tensor that is no view of one file map at a multiple of 32 bytes cannot be placed: copies."""
    class T:
        def __init__(self, data):
            self.data, self.n_bytes = data, data.nbytes

    plain = np.zeros(64, dtype=np.uint8)
    assert ggml_graph._mapped_span([T(plain)]) is None  # no map behind it


def test_one_compute_of_each_term_per_call_on_a_fake_clock(converted, monkeypatch):
    """D(n) advances the clock by n/1024 s, R_d(n) by n/512 + d/2^20 s: each call returns exactly
    those, the flush runs before each of its two computes, and a warm-up compute is not timed."""
    clock = FakeClock().install(monkeypatch, timing)

    def compute(plan):
        clock.advance(plan.n / 512 + plan.depth / 2**20 if hasattr(plan, "depth") else plan.n / 1024)

    monkeypatch.setattr(ggml_graph.Plan, "compute", compute)
    flushes = []
    with OutsideOfPass(converted["olmoe"]["q8_0"], threads=1, max_n=9, flush=lambda: flushes.append(1)) as timer:
        for n, depth in ((1, 16), (9, 512), (4, 512)):
            got = timer(n, depth, warmup=1)
            assert set(got) == set(TERMS)
            assert got == {"dense": n / 1024, "rest": n / 512 + depth / 2**20}
    assert len(flushes) == 3 * 2 * 2  # before every compute, the warm-up's included


def test_time_passes_keeps_each_terms_time_right_after_its_pass():
    """`outside` runs after each timed pass (after `between`) with the pass's n and depth, once per
    warm-up pass with warmup=1; its terms come back per n, one sample per pass."""
    from moespec.bench.verify import time_passes
    from moespec.kernel_names import DEDUP
    from tests.bench.test_verify import _watch_passes, build

    model, tok = build("olmoe-tiny")
    events = []
    _watch_passes(model, lambda n: events.append(("pass", n)) if n <= 3 else None)

    def outside(n, depth, warmup=0):
        events.append(("outside", n, depth, warmup))
        return {"dense": n / 4, "rest": depth / 64}

    out = time_passes(model, tok.encode("x" * 40, add_bos=True), 16, [1, 2, 3], [DEDUP], reps=2, warmup=1,
                      outside=outside, between=lambda n, k, s: events.append(("between", n)) or [0.0])
    assert out["outside"] == {"dense": {str(n): [n / 4] * 2 for n in (1, 2, 3)},
                              "rest": {str(n): [0.25] * 2 for n in (1, 2, 3)}}
    warm = [e for e in events if e[0] == "outside" and e[3] == 1]
    assert [e[1] for e in warm] == [1, 2, 3]
    timed = [e for e in events[events.index(warm[-1]) + 1:]]
    assert [e[0] for e in timed] == ["pass", "between", "outside"] * 6
    assert all(p[1] == o[1] and o[2] == 16 and o[3] == 0 for p, o in zip(timed[::3], timed[2::3]))


def test_outside_is_refused_on_torch(tmp_path):
    from moespec.bench.measure import measure
    from moespec.bench.verify import run_verify
    from tests.bench.test_verify import build

    model, tok = build("olmoe-tiny")
    with pytest.raises(ValueError, match="split at its experts modules"):
        run_verify(model, tok, depths=(16,), ns=(1, 2), outside=True)
    with pytest.raises(ValueError, match="drop outside"):
        measure("synthetic:olmoe-tiny", out=tmp_path / "m.json", outside=True, progress=False)
