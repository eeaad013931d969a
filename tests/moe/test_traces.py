"""RoutingTrace storage and the App. D.2 estimators, checked against the definitions and known processes."""

from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from moespec.moe import synthetic_routing as sr
from moespec.texts import MIN_DOC_BYTES, default_corpus, split_documents
from moespec.moe.reuse import ReuseAnalysis
from moespec.moe.traces import (
    RoutingTrace, TraceWriter, analyze, distinct_share, e_dedup, e_slot, mean_union, reuse, rho_bar, u_bar,
    uniform_reuse, uniform_union,
)


def random_trace(seed: int, docs=(1, 2, 3, 7, 30, 61), L=3, m=3, N=7) -> RoutingTrace:
    """Documents of mixed lengths (some shorter than n) from a mix of sticky and uniform routing."""
    rng = np.random.default_rng(seed)
    out = [sr.sticky(T, L, m, N, float(rng.uniform(m / N, 1)), rng) for T in docs]
    return RoutingTrace(out, N, [100 + 10 * l for l in range(L)])


def brute_reuse(trace: RoutingTrace, n: int) -> np.ndarray:
    """rho_l(n) straight from App. D.2 with Python sets: reused experts of each window's last token."""
    num, windows = np.zeros(trace.num_layers), 0
    for d in trace.documents:
        for t in range(d.shape[0] - n + 1):
            windows += 1
            for l in range(trace.num_layers):
                earlier = set(d[t : t + n - 1, l].ravel().tolist())
                num[l] += len(earlier & set(d[t + n - 1, l].tolist()))
    return num / (trace.top_k * windows)


def brute_union(trace: RoutingTrace, n: int) -> tuple[np.ndarray, int]:
    """Mean over windows of |S_t u ... u S_{t+n-1}| per layer, and the number of windows."""
    tot, windows = np.zeros(trace.num_layers), 0
    for d in trace.documents:
        for t in range(d.shape[0] - n + 1):
            windows += 1
            tot += [len(set(d[t : t + n, l].ravel().tolist())) for l in range(trace.num_layers)]
    return tot / windows, windows


@pytest.mark.parametrize("seed", range(4))
def test_reuse_matches_definition_and_eq2_holds_on_every_trace(seed):
    trace = random_trace(seed)
    m = trace.top_k
    for n in range(1, 8):
        np.testing.assert_allclose(reuse(trace, n), brute_reuse(trace, n), rtol=0, atol=1e-12)
        U = mean_union(trace, n)
        np.testing.assert_allclose(U, m * sum(1 - brute_reuse(trace, j) for j in range(1, n + 1)), atol=1e-12)
        # The windows' own mean union obeys (2) up to the windows near a document's end that rho(j)
        # counts and U(n) does not: |diff| <= m sum_j (A_j - A_n) / A_j, A_j = number of j-windows.
        direct, A_n = brute_union(trace, n)
        A = [sum(max(d.shape[0] - j + 1, 0) for d in trace.documents) for j in range(1, n + 1)]
        bound = m * sum((a - A_n) / a for a in A)
        assert np.all(np.abs(direct - U) <= bound + 1e-12)


def test_eq2_is_exact_on_a_single_window_per_length():
    # One document of n tokens has exactly one window of n tokens: (2) holds with no edge term.
    trace = RoutingTrace([np.array([[[0, 1]], [[1, 2]], [[0, 3]], [[4, 5]]])], 6, [1])
    assert brute_union(trace, 4)[0][0] == 6
    assert mean_union(trace, 4)[0] == pytest.approx(2 * 4 - 2 * (reuse(trace, 2) + reuse(trace, 3) + reuse(trace, 4))[0])


def test_uniform_routing_matches_one_minus_q_power():
    # 40,000 tokens x 4 layers, m/N = 4/16: each rho_l(n) averages 40,000 overlapping windows;
    # its standard error is below 0.005, so 0.03 is a > 6-sigma threshold.
    rng = np.random.default_rng(1)
    trace = RoutingTrace([sr.uniform(20_000, 4, 4, 16, rng) for _ in range(2)], 16, [1] * 4)
    for n in range(1, 10):
        np.testing.assert_allclose(reuse(trace, n), uniform_reuse(n, 4, 16), atol=0.03)
        np.testing.assert_allclose(mean_union(trace, n), uniform_union(n, 4, 16), atol=0.03 * 4 * n)


def test_periodic_patterns_of_appendix_b2():
    # App. B.2's table: N = 3, m = 1; (rho_bar_1, rho_bar_2) per pattern.
    table = {"01": (Fraction(0), Fraction(1, 2)), "00012": (Fraction(2, 5), Fraction(2, 5)),
             "00102": (Fraction(1, 5), Fraction(2, 5))}
    rng = np.random.default_rng(2)
    for pattern, (rb1, rb2) in table.items():
        assert (sr.periodic_rho_bar(pattern, 1), sr.periodic_rho_bar(pattern, 2)) == (rb1, rb2)
        # 10 documents of 3,000 tokens, random phases: the estimator is off the phase average by
        # at most one period's worth of windows per document, P/3000 <= 0.002.
        trace = RoutingTrace([sr.periodic(pattern, 3000, 2, rng) for _ in range(10)], 3, [1, 1])
        assert rho_bar(trace, 1) == pytest.approx(float(rb1), abs=0.002)
        assert rho_bar(trace, 2) == pytest.approx(float(rb2), abs=0.002)
        for n in range(1, 9):
            np.testing.assert_allclose(reuse(trace, n), float(sr.periodic_reuse(pattern, n)), atol=0.002)


@pytest.mark.parametrize("rho2", [0.3, 0.6, 0.9])
def test_sticky_router_matches_its_analytic_reuse(rho2):
    # 60,000 tokens, mean run length <= 10: the standard error of rho(n) stays below 0.006; threshold 0.03.
    rng = np.random.default_rng(3)
    trace = RoutingTrace([sr.sticky(30_000, 2, 4, 16, rho2, rng) for _ in range(2)], 16, [1, 1])
    truth = sr.sticky_reuse(9, 4, 16, rho2)
    for n in range(1, 10):
        np.testing.assert_allclose(reuse(trace, n), truth[n - 1], atol=0.03)


def test_byte_figures_satisfy_eqs_3_11_12():
    trace = random_trace(7, docs=(40, 80, 25), L=4, m=2, N=9)
    m, W, w = trace.top_k, trace.W, np.array(trace.expert_bytes)
    for n in range(1, 9):
        assert e_slot(trace, n) == m * n * W
        assert e_dedup(trace, n) == pytest.approx(float(w @ mean_union(trace, n)))
        gap = m * sum(float(w @ reuse(trace, j)) for j in range(1, n + 1))
        assert e_slot(trace, n) - e_dedup(trace, n) == pytest.approx(gap)  # (3)
        np.testing.assert_allclose(distinct_share(trace, n), mean_union(trace, n) / (n * m))
    for k in range(1, 8):
        assert e_dedup(trace, k + 1) == pytest.approx(m * W + m * W * k * (1 - rho_bar(trace, k)))  # (12)
        assert u_bar(trace, k + 1) == pytest.approx((1 + k * (1 - rho_bar(trace, k))) / (k + 1))


def test_analyze_bootstrap_is_seeded_and_brackets_the_estimate():
    trace = random_trace(4, docs=(50,) * 12)
    a = analyze(trace, 6, resamples=300, seed=5)
    assert a == analyze(trace, 6, resamples=300, seed=5)
    assert a != analyze(trace, 6, resamples=300, seed=6)
    for band in (a.rho_mean, a.u_bar, a.distinct_share, a.rho_bar):
        assert all(lo <= v + 1e-12 and v <= hi + 1e-12 for v, lo, hi in zip(band.value, band.lo, band.hi))
    assert a.rho_mean.lo[3] < a.rho_mean.hi[3]
    assert a.rho_mean.value[2] == pytest.approx(reuse(trace, 3).mean())
    assert a.u_bar.value[4] == pytest.approx(u_bar(trace, 5))
    assert a.uniform[2] == pytest.approx(uniform_reuse(3, 3, 7))
    assert ReuseAnalysis.from_dict(a.to_dict()) == a


def test_n_beyond_every_document_is_an_error():
    trace = random_trace(0, docs=(3, 4))
    with pytest.raises(ValueError, match="smaller n"):
        reuse(trace, 5)
    with pytest.raises(ValueError, match="n must be"):
        reuse(trace, 0)


def test_save_load_round_trip_with_chunked_appends(tmp_path):
    rng = np.random.default_rng(0)
    docs = [sr.uniform(T, 2, 3, 8, rng) for T in (5, 17)]
    wts = [rng.random(d.shape).astype(np.float32) for d in docs]
    trace = RoutingTrace(docs, 8, [10, 20], ("a", "b"), "synthetic:x", "float32", ("c.txt",), (1, 3), wts)
    back = RoutingTrace.load(trace.save(tmp_path / "t.parquet"))
    assert back.doc_ids == ("a", "b") and back.layers == (1, 3) and back.corpus == ("c.txt",)
    assert (back.num_experts, back.expert_bytes, back.model, back.dtype) == (8, (10, 20), "synthetic:x", "float32")
    for x, y in zip(back.documents + back.weights, docs + wts):
        np.testing.assert_array_equal(x, y)
    with TraceWriter(tmp_path / "c.parquet", num_experts=8, top_k=3, expert_bytes=[10, 20]) as tw:
        for a in range(0, 17, 4):
            tw.append("long", docs[1][a : a + 4])
        tw.append("short", docs[0])
    back = RoutingTrace.load(tmp_path / "c.parquet")
    assert back.doc_ids == ("long", "short")
    np.testing.assert_array_equal(back.documents[0], docs[1])


def test_load_rejects_corrupt_truncated_and_mismatched_files(tmp_path):
    rng = np.random.default_rng(0)
    good = RoutingTrace([sr.uniform(50, 2, 3, 8, rng)], 8, [10, 20]).save(tmp_path / "good.parquet")
    data = good.read_bytes()
    (tmp_path / "trunc.parquet").write_bytes(data[: len(data) // 2])
    (tmp_path / "junk.parquet").write_bytes(b"PAR1" + bytes(rng.integers(0, 256, 300, dtype=np.uint8)))
    for name in ("trunc", "junk"):
        with pytest.raises(ValueError, match="truncated or corrupt"):
            RoutingTrace.load(tmp_path / f"{name}.parquet")
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "other.parquet")
    with pytest.raises(ValueError, match="not a moespec routing trace"):
        RoutingTrace.load(tmp_path / "other.parquet")
    # header says N = 8, m = 3, L = 2, but the rows hold ids >= 8 / a length that is not a multiple of 6
    schema = pq.read_schema(good)
    for bad, match in [(np.full(12, 9, np.int16), "outside"), (np.zeros(7, np.int16), "multiple of")]:
        t = pa.table({"doc_index": pa.array([0], pa.int32()), "doc_id": ["d"], "start": pa.array([0], pa.int64()),
                      "experts": pa.array([bad], pa.large_list(pa.int16()))}, schema=schema)
        pq.write_table(t, tmp_path / "bad.parquet")
        with pytest.raises(ValueError, match=match):
            RoutingTrace.load(tmp_path / "bad.parquet")
    with pytest.raises(FileNotFoundError):
        RoutingTrace.load(tmp_path / "missing.parquet")


def test_trace_validates_its_fields():
    with pytest.raises(ValueError, match="outside"):
        RoutingTrace([np.full((2, 1, 2), 5)], 4, [1])
    with pytest.raises(ValueError, match="expert_bytes"):
        RoutingTrace([np.zeros((2, 2, 1), int)], 4, [1])


def test_split_documents_and_default_corpus():
    assert split_documents("a\n\f\nb\n\f\n") == ["a", "b"]
    paras = "\n\n".join("x" * 900 for _ in range(7))  # 3 + 4 paragraphs: the short tail joins the last
    docs = split_documents(paras)
    assert len(docs) == 2 and all(len(d.encode()) >= MIN_DOC_BYTES for d in docs)
    corpus = default_corpus()
    assert len(corpus) >= 5 and len({i for i, _ in corpus}) == len(corpus)
    assert sum(len(t.encode()) for _, t in corpus) > 50_000
