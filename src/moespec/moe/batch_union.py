"""The expected expert union of a verify pass at batch size B: B sequences, each verifying a window of
n consecutive tokens of its own text (cost-model paper, Sec. 5's third extension: batches "change
both the routing union and the kernels' bandwidths").

A pass of B sequences with k drafts each holds B(k + 1) tokens, and on a deduplicating kernel its
expert bytes in layer l are w_l times the number of distinct experts those tokens select. The
sequences are different requests, so their windows come from different documents and reuse each
other's experts far less than consecutive tokens of one document do.

Sampling model: B distinct documents are drawn, document d with weight proportional to its count of
n-windows c_d (a long request spends more rounds in the batch), and one window uniformly from each.
With x_d(e) the share of document d's n-windows that do *not* select expert e in layer l,

    U_l^B(n) = sum_e [1 - e_B(c * x(e)) / e_B(c)],

e_B the elementary symmetric polynomial of degree B over the documents (the sum over B-subsets of
the products of their entries). Each product multiplies per-document shares of *different*
documents, which are independent, so it is unbiased for the product of their expectations; a
window paired with another of the same document (a draw with replacement) would not be: the App.
D.2 care, applied across sequences. At B = 1 it is the mean union of the trace's n-windows, which
the D.2 estimator of `moe.reuse.mean_union` gives up to document edges (it counts a token's reuse
over every window ending at it, this counts every window whole). Uniform routing gives
N(1 - q^{Bn}), q = 1 - m/N (`uniform_union` at Bn tokens).
"""

from __future__ import annotations

import numpy as np

from moespec.moe.reuse import uniform_union


def window_misses(doc: np.ndarray, n: int, N: int) -> np.ndarray:
    """x[l, e]: the share of doc's n-windows (doc [T, L, m]) in which layer l's tokens never select e, [L, N]."""
    T, L, _ = doc.shape
    windows = T - n + 1
    if windows < 1:
        raise ValueError(f"a document of {T} tokens has no window of n = {n}")
    hit = np.zeros((T + 1, L, N), dtype=np.int32)
    rows = np.arange(1, T + 1)[:, None, None]
    np.add.at(hit, (rows, np.arange(L)[None, :, None], doc.astype(np.int64)), 1)
    counts = np.cumsum(hit, axis=0)  # [T+1, L, N]: selections of e in tokens < t
    inside = counts[n:] - counts[:-n]  # [windows, L, N]
    return (inside == 0).mean(axis=0)


def _log_elementary(log_values: np.ndarray, B: int) -> np.ndarray:
    """log e_B over axis 0 of exp(log_values) [D, ...], by the recurrence e_j += v_d e_{j-1}, in logs."""
    shape = log_values.shape[1:]
    log_e = np.full((B + 1, *shape), -np.inf)
    log_e[0] = 0.0
    for v in log_values:
        log_e[1:] = np.logaddexp(log_e[1:], v + log_e[:-1])  # the right side reads e_{j-1} before this document
    return log_e[B]


def batch_union(trace, n: int, B: int) -> np.ndarray:
    """U_l^B(n) per layer, [L]: the expected number of distinct experts B windows of n tokens from
    distinct documents select (module docstring). Needs B <= documents with an n-window."""
    if int(n) != n or n < 1 or int(B) != B or B < 1:
        raise ValueError(f"n and B must be integers >= 1; got n={n!r}, B={B!r}")
    docs = [d for d in trace.documents if d.shape[0] >= n]
    if len(docs) < B:
        raise ValueError(f"a batch of B = {B} sequences needs {B} distinct documents with {n} tokens; the trace has "
                         f"{len(docs)}: record more documents (moespec trace --corpus ...), or give a smaller B")
    x = np.stack([window_misses(d, n, trace.num_experts) for d in docs])  # [D, L, N]
    c = np.array([d.shape[0] - n + 1 for d in docs], dtype=float)
    c = c / c.mean()  # weights of mean 1 keep e_B in range; the ratio does not depend on their scale
    with np.errstate(divide="ignore"):
        log_cx = np.log(c)[:, None, None] + np.log(x)
    ratio = np.exp(_log_elementary(log_cx, B) - _log_elementary(np.log(c), B))  # [L, N]
    return (1.0 - ratio).sum(axis=-1)


def batch_union_uniform(n: int, B: int, m: int, N: int) -> float:
    """U^B(n) under independent uniform routing: the union of B n tokens, N(1 - q^{Bn})."""
    return uniform_union(B * n, m, N)
