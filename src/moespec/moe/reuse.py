"""Reuse estimators on routing traces: rho_l(n), U_l(n), E_slot, E_dedup, u_bar, rho_bar_k (App. D.2).

Terms (cost-model paper, Sec. 1): S_{l,t} is the set of m experts token t selects in MoE layer l.
A window is n consecutive tokens of one document. The estimator of App. D.2 counts, for every
window, the last token's experts that an earlier token of the window also selected, and divides
the sum over windows by m times the number of windows: that is rho_l(n) of eq. (1), rho_l(1) = 0.

Everything else follows from rho_l by the paper's identities, so the reported numbers satisfy them
exactly: U_l(n) = m sum_{j<=n} (1 - rho_l(j)) (2), E_dedup(n) = sum_l w_l U_l(n), E_slot(n) = mnW (3),
u_bar(n) = E_dedup(n)/E_slot(n), rho_bar_k = (1/kW) sum_{j=2}^{k+1} sum_l w_l rho_l(j) (11).

Computation: for each (token s, expert e) the gap to the last earlier token of the document that
chose e in the same layer is found with one stable radix sort per layer; e counts as reused in the
window of n tokens ending at s exactly when gap <= n - 1 and s >= n - 1. Per-document counts make
the bootstrap over documents a matrix product.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

DEFAULT_RESAMPLES = 2000
DEFAULT_N_MAX = 9


def uniform_reuse(n: int, m: int, N: int) -> float:
    """rho(n) = 1 - q^(n-1), q = 1 - m/N, under independent uniform routing (Sec. 1, Huang et al.)."""
    return 1.0 - (1.0 - m / N) ** (n - 1)


def uniform_union(n: int, m: int, N: int) -> float:
    """U(n) = N (1 - q^n) under independent uniform routing, the sum (2) of `uniform_reuse`."""
    return N * (1.0 - (1.0 - m / N) ** n)


def _document_counts(doc: np.ndarray, n_max: int) -> np.ndarray:
    """R[l, n-1] = sum over windows of n tokens of the last token's reused experts; doc [T, L, m]."""
    T, L, m = doc.shape
    R = np.zeros((L, n_max), dtype=np.int64)
    if T < 2 or n_max < 2:
        return R
    t = np.repeat(np.arange(T, dtype=np.int64), m)  # token of each flattened slot, [T*m]
    for l in range(L):
        e = doc[:, l, :].ravel()
        order = np.argsort(e, kind="stable")  # radix sort on int16; keeps t ascending per expert
        es, ts = e[order], t[order]
        same = es[1:] == es[:-1]
        gap = (ts[1:] - ts[:-1])[same]
        s = ts[1:][same]
        near = gap < n_max
        gap, s = gap[near], s[near]
        R[l, 1:] = np.cumsum(np.bincount(gap, minlength=n_max))[1:n_max]  # #{gap <= n-1}
        early = s[s < n_max - 1]  # tokens too early to end a window of n: s <= n-2 (then gap <= s too)
        R[l, 1:] -= np.cumsum(np.bincount(early, minlength=n_max))[: n_max - 1]
    return R


def reuse_counts(trace, n_max: int) -> tuple[np.ndarray, np.ndarray]:
    """(R [D, L, n_max], windows [D, n_max]): per-document numerators and window counts of rho_l(n)."""
    if n_max < 1:
        raise ValueError(f"n must be >= 1; got {n_max}")
    cached = trace._cache.get("counts")
    if cached is not None and cached[0] >= n_max:
        return cached[1][:, :, :n_max], cached[2][:, :n_max]
    R = np.stack([_document_counts(d, n_max) for d in trace.documents])
    T = np.array([d.shape[0] for d in trace.documents], dtype=np.int64)
    windows = np.maximum(T[:, None] - np.arange(n_max)[None, :], 0)  # T - n + 1 for n = 1..n_max
    trace._cache["counts"] = (n_max, R, windows)
    return R, windows


def _rho_table(trace, n_max: int) -> np.ndarray:
    """rho_l(n) for n = 1..n_max, [L, n_max]."""
    R, windows = reuse_counts(trace, n_max)
    total = windows.sum(axis=0)
    if total[-1] == 0:
        longest = max(d.shape[0] for d in trace.documents)
        raise ValueError(f"no document has n={n_max} tokens (longest has {longest}); use a smaller n")
    return R.sum(axis=0) / (trace.top_k * total)[None, :]


def _check_n(n: int) -> int:
    if int(n) != n or n < 1:
        raise ValueError(f"n must be an integer >= 1; got {n!r}")
    return int(n)


def reuse(trace, n: int) -> np.ndarray:
    """rho_l(n) per layer, [L]: the App. D.2 estimator of eq. (1)."""
    n = _check_n(n)
    return _rho_table(trace, n)[:, n - 1]


def mean_union(trace, n: int) -> np.ndarray:
    """U_l(n) = m sum_{j<=n} (1 - rho_l(j)) per layer, [L], eq. (2) with the estimated rho_l."""
    n = _check_n(n)
    return trace.top_k * (1.0 - _rho_table(trace, n)).sum(axis=1)


def e_slot(trace, n: int) -> float:
    """E_slot(n) = m n W, the bytes a per-slot kernel requests on a pass of n tokens (Sec. 1)."""
    return float(trace.top_k * _check_n(n) * trace.W)


def e_dedup(trace, n: int) -> float:
    """E_dedup(n) = sum_l w_l U_l(n), the expected union bytes of a pass of n tokens (Sec. 1, (3))."""
    return float(np.dot(trace.expert_bytes, mean_union(trace, n)))


def u_bar(trace, n: int) -> float:
    """u_bar(n) = E_dedup(n) / E_slot(n), the share of per-slot bytes deduplication requests (Sec. 2)."""
    return e_dedup(trace, n) / e_slot(trace, n)


def rho_bar(trace, k: int) -> float:
    """rho_bar_k = (1/kW) sum_{j=2}^{k+1} sum_l w_l rho_l(j), byte-weighted reuse of k drafts (11)."""
    if int(k) != k or k < 1:
        raise ValueError(f"rho_bar needs a draft length k >= 1; got {k!r}")
    rho = _rho_table(trace, int(k) + 1)
    return float(np.dot(trace.expert_bytes, rho[:, 1:].sum(axis=1)) / (k * trace.W))


def distinct_share(trace, n: int) -> np.ndarray:
    """U_l(n) / (n m) per layer, [L]: the share of a pass's n m slots that name distinct experts."""
    n = _check_n(n)
    return mean_union(trace, n) / (n * trace.top_k)


@dataclass(frozen=True)
class Band:
    """A point estimate with its bootstrap interval, one entry per n (or k)."""

    value: tuple
    lo: tuple
    hi: tuple

    def to_dict(self) -> dict:
        return {k: list(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> "Band":
        return cls(tuple(d["value"]), tuple(d["lo"]), tuple(d["hi"]))


def _derived(rho: np.ndarray, w: np.ndarray, m: int) -> dict[str, np.ndarray]:
    """Layer-mean rho(n), rho_bar_k, u_bar(n), layer-mean U/(nm) from rho [..., L, n_max]."""
    n_max = rho.shape[-1]
    n = np.arange(1, n_max + 1)
    W = w.sum()
    weighted = np.einsum("l,...ln->...n", w, rho)  # sum_l w_l rho_l(n)
    cum = np.cumsum(weighted, axis=-1)
    union = m * np.cumsum(1.0 - rho, axis=-1)  # U_l(n), eq. (2)
    return {
        "rho_mean": rho.mean(axis=-2),
        "rho_bar": cum[..., 1:] / (n[:-1] * W),  # k = n - 1 = 1..n_max-1, eq. (11)
        "u_bar": 1.0 - cum / (n * W),  # E_dedup / E_slot by (2) and (3)
        "distinct_share": union.mean(axis=-2) / (n * m),
    }


@dataclass(frozen=True)
class ReuseAnalysis:
    """Reuse, union and byte figures of a trace for n = 1..n_max, with bootstrap intervals."""

    n: tuple
    num_experts: int
    top_k: int
    num_documents: int
    num_tokens: int
    expert_bytes: tuple
    rho: tuple  # rho_l(n), [L][n_max]
    rho_mean: Band  # layer mean of rho_l(n), over n (Figure 1)
    rho_bar: Band  # byte-weighted rho_bar_k, over k = 1..n_max-1, eq. (11)
    u_bar: Band  # E_dedup(n) / E_slot(n), over n
    distinct_share: Band  # layer mean of U_l(n) / (n m), over n
    e_slot: tuple  # bytes, over n
    e_dedup: tuple  # bytes, over n
    uniform: tuple  # 1 - q^(n-1), over n
    resamples: int
    seed: int
    confidence: float

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        for k in ("rho_mean", "rho_bar", "u_bar", "distinct_share"):
            d[k] = d[k].to_dict()
        d["rho"] = [list(r) for r in self.rho]
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict) -> "ReuseAnalysis":
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown ReuseAnalysis fields {sorted(unknown)}")
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        for k in ("rho_mean", "rho_bar", "u_bar", "distinct_share"):
            kw[k] = Band.from_dict(d[k])
        kw["rho"] = tuple(tuple(r) for r in d["rho"])
        return cls(**kw)


def _resample_counts(D: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """How often each of D documents is drawn in each bootstrap resample, [resamples, D]."""
    draws = rng.integers(0, D, size=(resamples, D)) + D * np.arange(resamples)[:, None]
    return np.bincount(draws.ravel(), minlength=resamples * D).reshape(resamples, D).astype(np.float64)


def analyze(trace, n_max: int = DEFAULT_N_MAX, *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
            confidence: float = 0.95) -> ReuseAnalysis:
    """All figures for n = 1..n_max, with percentile intervals from `resamples` bootstrap resamples
    of documents (App. D.2: 2000 resamples of fit documents)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1); got {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1; got {resamples}")
    n_max = _check_n(n_max)
    m, w = trace.top_k, np.asarray(trace.expert_bytes, dtype=np.float64)
    rho = _rho_table(trace, n_max)
    point = _derived(rho, w, m)
    R, windows = reuse_counts(trace, n_max)
    c = _resample_counts(len(trace.documents), resamples, np.random.default_rng(seed))
    with np.errstate(invalid="ignore", divide="ignore"):
        rho_b = np.einsum("bd,dln->bln", c, R) / (m * (c @ windows))[:, None, :]
    boot = _derived(rho_b, w, m)
    alpha = 100 * (1 - confidence) / 2

    def band(key: str) -> Band:
        if boot[key].shape[-1] == 0:  # rho_bar_k at n_max = 1: no draft length k = n - 1 >= 1
            return Band((), (), ())
        lo, hi = np.nanpercentile(boot[key], [alpha, 100 - alpha], axis=0)
        return Band(tuple(point[key].tolist()), tuple(lo.tolist()), tuple(hi.tolist()))

    n = np.arange(1, n_max + 1)
    return ReuseAnalysis(
        n=tuple(n.tolist()), num_experts=trace.num_experts, top_k=m, num_documents=len(trace.documents),
        num_tokens=trace.num_tokens, expert_bytes=tuple(trace.expert_bytes),
        rho=tuple(tuple(r) for r in rho.tolist()), rho_mean=band("rho_mean"), rho_bar=band("rho_bar"),
        u_bar=band("u_bar"), distinct_share=band("distinct_share"),
        e_slot=tuple(float(m * k * w.sum()) for k in n),
        e_dedup=tuple((np.dot(w, m * np.cumsum(1.0 - rho, axis=1))).tolist()),
        uniform=tuple(uniform_reuse(int(k), m, trace.num_experts) for k in n),
        resamples=resamples, seed=seed, confidence=confidence,
    )
