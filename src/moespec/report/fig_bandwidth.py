"""Figure 2 of the cost-model paper: effective bandwidth of each kernel against the pass size n.

Per-slot kernels on requested bytes nmb (solid, filled markers), deduplicating kernels on union
bytes Ub (dashed, open markers); median and interquartile range over the characterized layers and
windows of recorded routing; dotted: this machine's measured streaming read bandwidth (the roof).
"""

from __future__ import annotations

from pathlib import Path

from moespec.kernel_names import requests_per_slot
from moespec.report.plotting import plt, save


def plot_bandwidth(payload: dict, path: str | Path) -> Path:
    """Write a PNG of beta_p(n) (GB/s) per kernel from a "characterize" payload, with the read roof."""
    beta = payload["beta"]
    if not beta:
        raise ValueError("the characterization holds no bandwidths; run `moespec characterize` first")
    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=150)
    for kernel, per_n in beta.items():
        n = sorted(int(x) for x in per_n)
        row = [per_n[x] if x in per_n else per_n[str(x)] for x in n]
        med = [r["median"] / 1e9 for r in row]
        lo = [(r["median"] - r["q1"]) / 1e9 for r in row]
        hi = [(r["q3"] - r["median"]) / 1e9 for r in row]
        slot = requests_per_slot(kernel)
        label = f"{kernel} ({'on nmb' if slot else 'on Ub'})"
        ax.errorbar(n, med, yerr=[lo, hi], marker="o", ms=4, capsize=2, ls="-" if slot else "--",
                    mfc=None if slot else "white", label=label)
    roof = payload.get("read_bandwidth")
    if roof:
        ax.axhline(roof / 1e9, ls=":", color="0.3", label=f"measured read bandwidth ({roof / 1e9:.1f} GB/s)")
    ax.set_xlabel("tokens per pass n")
    ax.set_ylabel("effective bandwidth (GB/s)")
    ax.set_ylim(bottom=0)
    ax.set_xticks(sorted(int(x) for x in next(iter(beta.values()))))
    ax.set_title(str(payload.get("model", "")), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, frameon=False)
    return save(fig, path)
