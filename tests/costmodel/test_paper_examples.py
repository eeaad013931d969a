"""The paper's own worked examples: App. B.2 "no single threshold" and App. B.3 "jumps", with the
reuses computed exactly from the periodic routing patterns, and the affine step time of Sec. 1."""

from fractions import Fraction as F

from moespec.costmodel.dedup import byte_reuse_threshold, byte_step_times, mean_reuse
from moespec.costmodel.theory import best_draft_length, speculation_pays, staircase, step_points


def pattern_reuse(pattern: str, n: int) -> F:
    """rho(n) (1) of one expert per token (m = 1) repeating `pattern` from a uniformly random phase."""
    P = len(pattern)
    hits = sum(pattern[(t + n - 1) % P] in {pattern[(t + s) % P] for s in range(n - 1)} for t in range(P))
    return F(hits, P)


def pattern_union(pattern: str, n: int) -> F:
    """U(n): mean number of distinct experts of n consecutive tokens of the pattern."""
    P = len(pattern)
    return F(sum(len({pattern[(t + s) % P] for s in range(n)}) for t in range(P)), P)


B2 = dict(m=1, W=1, D=0, kv=[0, 0, 0])  # N = 3, L = 1, m = 1, w_1 = 1, D = 0, kv = 0, kmax = 2
A = F(13, 20)


def test_B2_no_single_threshold_thresholds():
    assert byte_reuse_threshold(A, 1, **B2) == F(7, 20)
    assert byte_reuse_threshold(A, 2, **B2) == F(371, 800)


def test_B2_no_single_threshold_table():
    table = {"01": (0, F(1, 2), 2), "00012": (F(2, 5), F(2, 5), 1), "00102": (F(1, 5), F(2, 5), None)}
    for pattern, (rho1, rho2, k_pays) in table.items():
        rho = [[pattern_reuse(pattern, j) for j in (1, 2, 3)]]
        assert rho[0][0] == 0
        assert (mean_reuse([1], rho, 1), mean_reuse([1], rho, 2)) == (rho1, rho2)
        V = byte_step_times(rho_bars=[rho1, rho2], **B2)
        assert V == [pattern_union(pattern, n) for n in (1, 2, 3)]  # (12) matches the union of (2)
        assert speculation_pays(V, A) == (k_pays is not None)
        if k_pays is not None:
            assert (rho1, rho2)[k_pays - 1] > byte_reuse_threshold(A, k_pays, **B2)
    # k = 1: "01" pays at k = 2 with a lower rho_bar_1 than "00102", which does not pay
    assert table["01"][0] < table["00102"][0]
    # k = 2: "00012" pays (at k = 1) with the same rho_bar_2 as "00102"
    assert table["00012"][1] == table["00102"][1]


def test_B3_jump_from_0_to_2():
    rho = [[pattern_reuse("01", j) for j in (1, 2, 3)]]  # two experts, alternating
    V = byte_step_times(m=1, W=1, D=0, kv=[0, 0, 0], rho_bars=[mean_reuse([1], rho, k) for k in (1, 2)])
    assert V == [1, 2, 2]
    assert best_draft_length(V, F(1, 2)) == 0 and best_draft_length(V, F(9, 10)) == 2
    grid = [F(j, 1000) for j in range(1000)]
    assert 1 not in staircase(V, grid)
    a1, a2 = step_points(V)
    assert a1 == a2  # both steps at one acceptance: the staircase jumps by two
    assert abs(float(a1) - (5**0.5 - 1) / 2) < 1e-15  # 1 + a + a^2 = 2 at the golden-ratio conjugate


def test_affine_step_time_leviathan():
    # V(k) = 1 + chi k: some draft length is faster than plain decoding exactly when a > chi (Sec. 1)
    for chi in [F(1, 10), F(1, 4), F(1, 2)]:
        V = [1 + chi * k for k in range(6)]
        assert step_points(V)[0] == chi
        for a in [F(j, 20) for j in range(20)]:
            assert speculation_pays(V, a) == (a > chi)
