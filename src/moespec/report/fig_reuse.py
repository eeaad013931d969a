"""Figure 1 of the cost-model paper: layer-mean consecutive-token reuse rho(n) against n.

One line per trace with its bootstrap band, and the independent-uniform baseline 1 - q^(n-1)
dotted for each distinct m/N.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Sequence

from moespec.moe.reuse import ReuseAnalysis, uniform_reuse
from moespec.report.plotting import plt, save


def plot_reuse(analyses: Sequence[tuple[str, ReuseAnalysis]], path: str | Path) -> Path:
    """Write a PNG of layer-mean rho(n) with its interval, per labelled analysis, and the uniform baseline."""
    if not analyses:
        raise ValueError("plot_reuse needs at least one (label, ReuseAnalysis)")
    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=150)
    baselines = {}
    for label, a in analyses:
        line, = ax.plot(a.n, a.rho_mean.value, marker="o", ms=3.5, label=label)
        ax.fill_between(a.n, a.rho_mean.lo, a.rho_mean.hi, color=line.get_color(), alpha=0.2, lw=0)
        share = Fraction(a.top_k, a.num_experts)
        baselines.setdefault(share, (a.top_k, a.num_experts, max(a.n)))
    for share, (m, N, n_max) in baselines.items():
        n = list(range(1, n_max + 1))
        ax.plot(n, [uniform_reuse(k, m, N) for k in n], ls=":", color="0.4", label=f"uniform, m/N = {share}")
    ax.set_xlabel("consecutive tokens n")
    ax.set_ylabel(r"reuse $\rho_l(n)$, layer mean")
    ax.set_ylim(0, 1)
    ax.set_xticks(range(1, max(max(a.n) for _, a in analyses) + 1))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, frameon=False)
    return save(fig, path)
