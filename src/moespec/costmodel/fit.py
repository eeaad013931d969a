"""Least-squares fits of one layer's expert-operation time to its bytes: eqs. (4) and (E.1).

On passes with chosen ids, U of the nm slots are the first read of their expert and nm - U repeat
one. The per-slot fit (4) separates the time per byte of a first read (c_u) from that of a repeated
slot (c_re); the deduplicating fit (E.1) charges the union bytes (c_g) and a time per token (c_t):

    t_slot  = t_op + c_u U b + c_re (nm - U) b          (4)
    t_dedup = t_op + c_g U b + c_t n                    (E.1)

with b the bytes of one expert of the timed layer. Fits are scored on windows of recorded routing,
which they never see (Sec. 4): each fit's median relative error per layer, eps_p the median over
layers (and models), and the engine's eps the larger of the two kernels' values.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from moespec.kernel_names import COST_DEDUP, COST_KERNELS, COST_SLOT

COEFFICIENTS = {COST_SLOT: ("t_op", "c_u", "c_re"), COST_DEDUP: ("t_op", "c_g", "c_t")}
COND_WARN = 1e6  # condition number of the column-scaled design above which a fit is unreliable
MIN_FIT_SIZES = 2  # pass sizes n >= 2 the fits need: at one n, t_op is collinear with the other columns


def design(kernel: str, U, n, m: int, b: float) -> np.ndarray:
    """Design matrix [P, 3] of (4) (kernel "slot") or (E.1) (kernel "dedup") at P passes.

    U: [P] distinct experts of each pass; n: [P] tokens of each pass; m: slots per token;
    b: bytes of one expert.
    """
    if kernel not in COST_KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; use one of {COST_KERNELS}")
    U = np.asarray(U, dtype=float)
    n = np.broadcast_to(np.asarray(n, dtype=float), U.shape)
    ones = np.ones_like(U)
    if kernel == COST_SLOT:
        return np.stack([ones, U * b, (n * m - U) * b], axis=-1)
    return np.stack([ones, U * b, n], axis=-1)


@dataclass(frozen=True)
class ExpertFit:
    """A fitted eq. (4) or (E.1) for one layer: coefficients in seconds and seconds per byte."""

    kernel: str
    coef: tuple[float, float, float]  # (t_op, c_u, c_re) for "slot"; (t_op, c_g, c_t) for "dedup"
    m: int
    b: float
    residuals: tuple[float, ...]  # measured minus fitted time at each fitted pass, seconds
    rank: int
    cond: float  # condition number of the design with columns scaled to unit norm

    @property
    def names(self) -> tuple[str, str, str]:
        return COEFFICIENTS[self.kernel]

    @property
    def coefficients(self) -> dict[str, float]:
        return dict(zip(self.names, self.coef))

    @property
    def t_op(self) -> float:
        return self.coef[0]

    @property
    def re_read_cost(self) -> float:
        """c_re / c_u of (4): 1 when a repeated slot is read again from memory, near 0 when cached."""
        if self.kernel != COST_SLOT:
            raise ValueError(f"re_read_cost is defined for the per-slot fit (4), not for kernel {self.kernel!r}")
        return self.coef[2] / self.coef[1]

    @property
    def rms_residual(self) -> float:
        return float(np.sqrt(np.mean(np.square(self.residuals)))) if self.residuals else 0.0

    def predict(self, U, n, m: int | None = None, b: float | None = None) -> np.ndarray:
        """Fitted time in seconds at U distinct experts and n tokens (m, b default to the fitted layer's)."""
        X = design(self.kernel, U, n, self.m if m is None else m, self.b if b is None else b)
        return X @ np.asarray(self.coef, dtype=float)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "coefficients": self.coefficients,
            "m": self.m,
            "b": self.b,
            "residuals": list(self.residuals),
            "rank": self.rank,
            "cond": self.cond,
            **({"re_read_cost": self.re_read_cost} if self.kernel == COST_SLOT else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ExpertFit":
        names = COEFFICIENTS[d["kernel"]]
        return cls(
            kernel=d["kernel"],
            coef=tuple(float(d["coefficients"][k]) for k in names),
            m=int(d["m"]),
            b=float(d["b"]),
            residuals=tuple(float(r) for r in d["residuals"]),
            rank=int(d["rank"]),
            cond=float(d["cond"]),
        )


def _span(values) -> str:
    v = np.atleast_1d(np.asarray(values, dtype=float))
    return f"{v.min():g}" if v.min() == v.max() else f"{v.min():g}..{v.max():g}"


def fit_pass_sizes(n_values) -> list[int]:
    """The pass sizes n >= 2 of `n_values` that the fits (4) and (E.1) use; ValueError when fewer than
    MIN_FIT_SIZES: at a single n, (4)'s bytes columns sum to n m b and (E.1)'s n column is constant."""
    sizes = sorted({int(x) for x in n_values if x >= 2})
    if len(sizes) < MIN_FIT_SIZES:
        raise ValueError(f"the fits (4) and (E.1) need passes of at least {MIN_FIT_SIZES} sizes n >= 2, got n = "
                         f"{sorted({int(x) for x in n_values})}; give n from 1 to 3 or more, such as 1..9")
    return sizes


def fit(kernel: str, U, n, t, *, m: int, b: float) -> ExpertFit:
    """Least squares of (4) (kernel "slot") or (E.1) (kernel "dedup") on passes with chosen ids.

    U: [P] distinct experts per pass; n: [P] tokens per pass; t: [P] median operation times, seconds;
    m: slots per token; b: bytes of one expert. Raises ValueError when the design is rank deficient
    (its coefficients are not identified: one pass size, or no pass repeats an expert, so c_re is
    not separated) and warns when it is ill-conditioned.
    """
    X = design(kernel, U, n, m, b)
    t = np.asarray(t, dtype=float)
    if t.shape != X.shape[:1]:
        raise ValueError(f"t has shape {t.shape}, expected one time per pass: ({X.shape[0]},)")
    if b <= 0 or m < 1:
        raise ValueError(f"need b > 0 bytes and m >= 1 slots per token, got b={b}, m={m}")
    # Unit-norm columns: the bytes columns are ~1e9 times the constant one, and that scale is not
    # an ill-conditioning of the fit.
    norms = np.linalg.norm(X, axis=0)
    scale = np.where(norms > 0, norms, 1.0)
    Xs = X / scale
    coef_s, _, rank, sv = np.linalg.lstsq(Xs, t, rcond=None)
    name = f"fit ({'4' if kernel == COST_SLOT else 'E.1'}) of kernel {kernel!r}"
    if rank < X.shape[1]:
        spans = f"{len(t)} passes at n = {_span(n)}, U = {_span(U)}" if len(t) else "no passes"
        raise ValueError(
            f"{name} is rank deficient (rank {rank} of {X.shape[1]}, {spans}): {', '.join(COEFFICIENTS[kernel])} "
            f"are not identified; time passes of at least {MIN_FIT_SIZES} sizes n >= 2 with several U at each n, "
            "with and without repeats")
    coef = coef_s / scale
    cond = float(sv[0] / sv[-1])
    if cond > COND_WARN:
        warnings.warn(
            f"{name} is ill-conditioned: condition number {cond:.3g} (above {COND_WARN:.0e}), so its coefficients "
            "are unreliable; time passes of more sizes n and more U at each n, with and without repeats",
            RuntimeWarning,
            stacklevel=2,
        )
    return ExpertFit(
        kernel=kernel,
        coef=tuple(float(c) for c in coef),
        m=int(m),
        b=float(b),
        residuals=tuple(float(r) for r in t - X @ coef),
        rank=int(rank),
        cond=cond,
    )


def relative_errors(expert_fit: ExpertFit, U, n, t) -> np.ndarray:
    """|t_hat - t| / t at each recorded window: U, n, t each [W] (t the measured median, seconds)."""
    t = np.asarray(t, dtype=float)
    if np.any(t <= 0):
        raise ValueError(f"measured times must be positive, got min {t.min()}")
    return np.abs(expert_fit.predict(U, n) - t) / t


def median_relative_error(expert_fit: ExpertFit, U, n, t) -> float:
    """A fit's score on one layer's recorded windows (Sec. 4): the median relative error."""
    return float(np.median(relative_errors(expert_fit, U, n, t)))


def eps_kernel(per_layer_errors: Sequence[float]) -> float:
    """eps_p: the median over layers (and models) of a kernel's per-layer median relative errors."""
    if len(per_layer_errors) == 0:
        raise ValueError("eps_p needs at least one scored layer")
    return float(np.median(np.asarray(per_layer_errors, dtype=float)))


def eps_engine(eps_slot: float, eps_dedup: float) -> float:
    """The engine's bandwidth error eps: the larger of its two kernels' eps_p (Sec. 4)."""
    return max(eps_slot, eps_dedup)
