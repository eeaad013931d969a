"""The expected expert union at batch size B (`moe.batch_union`) against a brute-force count over every
B-subset of documents and every choice of one window in each, on small traces; its B = 1 value against
the mean union of the trace's windows; uniform routing."""

import itertools
from fractions import Fraction

import numpy as np
import pytest

from moespec.moe.batch_union import batch_union, batch_union_uniform, window_misses
from moespec.moe.reuse import mean_union, uniform_union
from moespec.moe.traces import RoutingTrace


def small_trace(seed: int, docs: int = 4, N: int = 6, m: int = 2, L: int = 2) -> RoutingTrace:
    """Documents of 3 to 6 tokens, each token's m experts distinct, routing that follows a drifting topic."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(docs):
        T = int(rng.integers(3, 7))
        topic = rng.permutation(N)[:3]
        out.append(np.array([[rng.choice(topic if rng.random() < 0.7 else np.arange(N), m, replace=False)
                              for _ in range(L)] for _ in range(T)], dtype=np.int16))
    return RoutingTrace(out, N, (1000,) * L)


def brute_force(trace: RoutingTrace, n: int, B: int) -> list[Fraction]:
    """E|union| per layer: B-subsets of documents weighted by the product of their window counts, every
    combination of one window per document, exactly, in fractions."""
    docs = [d for d in trace.documents if d.shape[0] >= n]
    L = trace.num_layers
    total_weight, total = Fraction(0), [Fraction(0)] * L
    for subset in itertools.combinations(range(len(docs)), B):
        windows = [range(docs[d].shape[0] - n + 1) for d in subset]
        weight = Fraction(np.prod([len(w) for w in windows]))
        combos = list(itertools.product(*windows))
        for l in range(L):
            size = sum(len({int(e) for d, s in zip(subset, starts) for e in docs[d][s:s + n, l].ravel()})
                       for starts in combos)
            total[l] += weight * Fraction(size, len(combos))
        total_weight += weight
    return [t / total_weight for t in total]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n, B", [(1, 1), (2, 1), (2, 2), (3, 2), (1, 3), (2, 3), (2, 4)])
def test_the_estimator_is_the_brute_force_expectation(seed, n, B):
    trace = small_trace(seed)
    got = batch_union(trace, n, B)
    want = brute_force(trace, n, B)
    assert got == pytest.approx([float(w) for w in want], rel=1e-12, abs=1e-12)


def test_at_b_1_it_is_the_mean_union_of_the_windows():
    """One long document, whose windows overlap only at its edges: the D.2 estimator (`mean_union`) and the
    batched one agree to the edge effect, n / T."""
    rng = np.random.default_rng(5)
    N, m, T = 16, 4, 2000
    doc = np.stack([[rng.choice(N, m, replace=False)] for _ in range(T)]).astype(np.int16)  # [T, 1, m]
    trace = RoutingTrace([doc], N, (1,))
    for n in (2, 5, 9):
        assert batch_union(trace, n, 1)[0] == pytest.approx(mean_union(trace, n)[0], rel=2 * n / T)


def test_distinct_documents_share_fewer_experts_than_one_documents_windows():
    """B windows from B documents with their own topics select more experts than one window of B n
    consecutive tokens of a document does (uniform routing is no bound: documents on disjoint topics
    can cover more experts than B n uniform tokens)."""
    rng = np.random.default_rng(1)
    N, m, T = 32, 2, 300
    docs = []
    for d in range(6):
        topic = np.arange(N)[d * 5: d * 5 + 6]
        docs.append(np.stack([[rng.choice(topic, m, replace=False)] for _ in range(T)]).astype(np.int16))
    trace = RoutingTrace(docs, N, (1,))
    for B in (2, 4, 6):
        assert batch_union(trace, 3, B)[0] > mean_union(trace, 3 * B)[0]
    assert batch_union_uniform(3, 4, m, N) == uniform_union(12, m, N)


def test_window_misses_and_refusals():
    doc = np.array([[[0, 1]], [[1, 2]], [[3, 0]]], dtype=np.int16)  # 3 tokens, 1 layer, m = 2, N = 4
    # windows of 2: {0,1,2} and {0,1,2,3}: expert 3 is missing from one of the two
    assert window_misses(doc, 2, 4)[0].tolist() == [0.0, 0.0, 0.0, 0.5]
    trace = RoutingTrace([doc, doc], 4, (1,))
    with pytest.raises(ValueError, match="needs 3 distinct documents"):
        batch_union(trace, 2, 3)
    with pytest.raises(ValueError, match="integers >= 1"):
        batch_union(trace, 0, 1)
