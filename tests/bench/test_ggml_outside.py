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
    """`outside` runs after each timed pass of the even repetitions (after `between`) with the pass's
    n and depth, once per warm-up pass with warmup=1; its terms come back per n, one sample per such
    pass; the odd repetitions' passes are followed by `between` alone."""
    from moespec.bench.verify import time_passes
    from moespec.kernel_names import DEDUP
    from tests.bench.test_verify import _watch_passes, build

    model, tok = build("olmoe-tiny")
    events = []
    _watch_passes(model, lambda n: events.append(("pass", n)) if n <= 3 else None)

    def outside(n, depth, warmup=0):
        events.append(("outside", n, depth, warmup))
        return {"dense": n / 4, "rest": depth / 64}

    out = time_passes(model, tok.encode("x" * 40, add_bos=True), 16, [1, 2, 3], [DEDUP], reps=3, warmup=1,
                      outside=outside, between=lambda n, k, s: events.append(("between", n)) or [0.0])
    assert out["outside"] == {"dense": {str(n): [n / 4] * 2 for n in (1, 2, 3)},
                              "rest": {str(n): [0.25] * 2 for n in (1, 2, 3)}}
    warm = [e for e in events if e[0] == "outside" and e[3] == 1]
    assert [e[1] for e in warm] == [1, 2, 3]
    timed = [e for e in events[events.index(warm[-1]) + 1:]]
    rounds = [["pass", "between", "outside"] * 3, ["pass", "between"] * 3, ["pass", "between", "outside"] * 3]
    assert [e[0] for e in timed] == [kind for r in rounds for kind in r]
    first = timed[:9]
    assert all(p[1] == o[1] and o[2] == 16 and o[3] == 0 for p, o in zip(first[::3], first[2::3]))


def test_outside_is_refused_on_torch(tmp_path):
    from moespec.bench.measure import measure
    from moespec.bench.verify import run_verify
    from tests.bench.test_verify import build

    model, tok = build("olmoe-tiny")
    with pytest.raises(ValueError, match="split at its experts modules"):
        run_verify(model, tok, depths=(16,), ns=(1, 2), outside=True)
    with pytest.raises(ValueError, match="drop outside"):
        measure("synthetic:olmoe-tiny", out=tmp_path / "m.json", outside=True, progress=False)


def test_the_window_timer_reads_each_passs_own_rows_on_a_fake_clock(converted, monkeypatch):
    """llama.cpp's expert operation after each pass (`WindowTimer`): one call per layer on rows
    [start, start + n) of the document, grouped for the deduplicating kernel, per slot for the other,
    each call's time exact on a fake clock (2^-10 s per row), the flush before each."""
    from moespec.bench.ggml_expert_op import WindowTimer
    from moespec.kernel_names import DEDUP, SLOT

    clock = FakeClock().install(monkeypatch, timing)
    monkeypatch.setattr(ggml_graph.Plan, "compute", lambda plan: clock.advance(plan.n / 1024))
    seen = []
    prepare = ExpertLayer.prepare

    def spy(layer, ids, *, grouped=True, seed=0):
        seen.append((layer.layer, ids.tolist(), grouped))
        return prepare(layer, ids, grouped=grouped, seed=seed)

    monkeypatch.setattr(ExpertLayer, "prepare", spy)
    path = converted["olmoe"]["q8_0"]
    blocks = gguf_info.expert_layers(path)
    m = ExpertLayer(path, blocks[0], threads=1).top_k
    doc = np.random.default_rng(0).integers(0, 8, size=(12, len(blocks), m))  # [T, L, m]
    flushes = []
    with WindowTimer(path, [0, len(blocks) - 1], threads=1, flush=lambda: flushes.append(1)) as timer:
        timed = timer.for_document(doc)
        assert timed(3, DEDUP, 4) == [3 / 1024] * 2
        assert timed(2, SLOT, 0) == [2 / 1024] * 2
        with pytest.raises(ValueError, match="record it longer"):
            timed(3, DEDUP, 10)
    assert seen == [(blocks[0], doc[4:7, 0].tolist(), True), (blocks[-1], doc[4:7, -1].tolist(), True),
                    (blocks[0], doc[0:2, 0].tolist(), False), (blocks[-1], doc[0:2, -1].tolist(), False)]
    assert len(flushes) == 4
