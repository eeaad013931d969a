"""Tests of the fits (4) and (E.1): exact recovery, rank-deficient refusal, ill-conditioning warning,
scoring, round trip."""

import warnings

import numpy as np
import pytest

from moespec.costmodel.fit import (
    COND_WARN,
    ExpertFit,
    design,
    eps_engine,
    eps_kernel,
    fit,
    fit_pass_sizes,
    median_relative_error,
    relative_errors,
)

M, N_EXPERTS, B = 8, 64, 25_165_824.0  # OLMoE: top-8 of 64, fp32 expert bytes


def chosen_grid():
    """(U, n) over n = 2..9 and U = m..min(N, nm), as the benchmark's chosen ids span them."""
    U, n = [], []
    for nn in range(2, 10):
        for u in range(M, min(N_EXPERTS, nn * M) + 1, 3):
            U.append(u)
            n.append(nn)
    return np.array(U), np.array(n)


def test_slot_fit_recovers_known_coefficients_exactly():
    U, n = chosen_grid()
    t_op, c_u, c_re = 2e-4, 1 / 8e9, 0.3 / 8e9
    t = t_op + c_u * U * B + c_re * (n * M - U) * B
    f = fit("slot", U, n, t, m=M, b=B)
    assert f.coef == pytest.approx((t_op, c_u, c_re), rel=1e-9)
    assert f.re_read_cost == pytest.approx(0.3, rel=1e-9)
    assert f.rank == 3
    assert np.max(np.abs(f.residuals)) < 1e-12
    assert f.predict(U, n) == pytest.approx(t, rel=1e-9)


def test_dedup_fit_recovers_known_coefficients_exactly():
    U, n = chosen_grid()
    t_op, c_g, c_t = 5e-4, 1 / 5e9, 3e-5
    t = t_op + c_g * U * B + c_t * n
    f = fit("dedup", U, n, t, m=M, b=B)
    assert f.coefficients == pytest.approx({"t_op": t_op, "c_g": c_g, "c_t": c_t}, rel=1e-9)
    with pytest.raises(ValueError, match="per-slot"):
        _ = f.re_read_cost


def test_fit_is_least_squares_under_noise():
    # the chosen grid (~130 passes), 1% multiplicative noise: residuals are orthogonal to X
    rng = np.random.default_rng(0)
    U, n = chosen_grid()
    t = (1e-4 + U * B / 8e9 + 0.5 * (n * M - U) * B / 8e9) * (1 + 0.01 * rng.standard_normal(U.shape))
    f = fit("slot", U, n, t, m=M, b=B)
    X = design("slot", U, n, M, B)
    assert np.abs(X.T @ np.array(f.residuals)) / np.abs(X.T @ t) == pytest.approx(np.zeros(3), abs=1e-9)
    assert f.re_read_cost == pytest.approx(0.5, abs=0.1)


def test_no_repeats_is_rank_deficient_and_refused():
    # U = nm at every pass: the repeated-read column is zero and c_re is not identified
    n = np.arange(2, 10)
    U = n * M
    t = 1e-4 + U * B / 8e9
    with pytest.raises(ValueError, match=r"fit \(4\) of kernel 'slot' is rank deficient \(rank 2 of 3, 8 passes at "
                                         r"n = 2..9, U = 16..72\): t_op, c_u, c_re are not identified"):
        fit("slot", U, n, t, m=M, b=B)


@pytest.mark.parametrize("kernel", ["slot", "dedup"])
def test_one_pass_size_is_rank_deficient_and_refused(kernel):
    # characterize --n 2..2: at one n, (4)'s bytes columns sum to the constant nmb and (E.1)'s n is constant
    U = np.arange(M, 2 * M + 1)
    t = 1e-4 + U * B / 8e9 + np.random.default_rng(0).normal(0, 1e-6, U.shape)
    with pytest.raises(ValueError, match="rank deficient .* n = 2, .* at least 2 sizes n >= 2"):
        fit(kernel, U, 2, t, m=M, b=B)
    with pytest.raises(ValueError, match="no passes"):
        fit(kernel, [], [], [], m=M, b=B)


def test_an_ill_conditioned_fit_warns():
    # two pass sizes, U within 2e-6 of 8n: (E.1)'s columns are nearly dependent, yet of full rank
    n = np.array([2, 2, 3, 3])
    U = n * M + np.array([0, 1e-6, 0, 2e-6])
    with pytest.warns(RuntimeWarning, match=r"fit \(E.1\) of kernel 'dedup' is ill-conditioned: condition number"):
        f = fit("dedup", U, n, 1e-4 + U * B / 8e9 + 1e-5 * n, m=M, b=B)
    assert f.rank == 3 and f.cond > COND_WARN


def test_pass_sizes_of_the_fits():
    assert fit_pass_sizes(range(1, 10)) == list(range(2, 10)) and fit_pass_sizes([3, 2, 2]) == [2, 3]
    for n in ([1], [2], [1, 2], [2, 2]):
        with pytest.raises(ValueError, match="at least 2 sizes n >= 2"):
            fit_pass_sizes(n)


def test_well_posed_fit_does_not_warn_and_cond_ignores_units():
    U, n = chosen_grid()
    t = 1e-4 + U * B / 8e9
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f = fit("dedup", U, n, t, m=M, b=B)
    assert f.cond < 1e3  # the bytes column is ~1e9 times the constant column, yet well conditioned


def test_scoring_and_eps():
    U, n = chosen_grid()
    f = fit("dedup", U, n, 1e-4 + U * B / 8e9 + 1e-5 * n, m=M, b=B)
    t_true = f.predict(U, n)
    assert relative_errors(f, U, n, t_true) == pytest.approx(np.zeros(U.shape), abs=1e-12)
    assert median_relative_error(f, U, n, t_true * 1.25) == pytest.approx(0.2)
    assert eps_kernel([0.01, 0.05, 0.03]) == 0.03
    assert eps_kernel([0.01, 0.02]) == pytest.approx(0.015)
    assert eps_engine(0.054, 0.03) == 0.054
    with pytest.raises(ValueError, match="positive"):
        relative_errors(f, U, n, np.zeros(U.shape))


def test_roundtrip_and_input_checks():
    U, n = chosen_grid()
    f = fit("slot", U, n, 1e-4 + U * B / 8e9 + 0.2 * (n * M - U) * B / 8e9, m=M, b=B)
    assert ExpertFit.from_dict(f.to_dict()) == f
    assert f.to_dict()["re_read_cost"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="unknown kernel"):
        fit("tiled", U, n, U * 1.0, m=M, b=B)
    with pytest.raises(ValueError, match="one time per pass"):
        fit("slot", U, n, np.ones(3), m=M, b=B)
