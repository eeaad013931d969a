"""This run's analogues of Figures 3–6 of the cost-model paper (Figures 1 and 2: fig_reuse, fig_bandwidth).

- Figure 3 (bytes): the share of a pass's nm slots that name distinct experts, U/(nm), and the
  byte share ū(n), from the routing trace with their bootstrap intervals, between 1/n and 1.
- Figure 4 (saving): S(n) measured with its 95% interval, each prediction version, and the band (18).
- Figure 5 (best draft length and bounds): k̂*(a) of each version against the measured k*(a);
  the throughput lost at k̂* against (20); the predicted best speedup against the interval (21).
- Figure 6 (verify time): τ̂_p(n) of each version against the measured τ_p(n), both kernels.

Each function takes artifact payloads (plain dicts) and writes one PNG.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from moespec.kernel_names import COST_KERNELS, TO_ENGINE
from moespec.costmodel.bounds import speedup_bounds
from moespec.report.plotting import plt
from moespec.report.plotting import save as _save

VERSION_STYLE = {"prediction": ("C0", "-"), "prediction-outside": ("C3", "-."), "measured-time": ("C1", "--"),
                 "calibrated": ("C2", ":")}


def plot_bytes(analysis, path: str | Path) -> Path:
    """Figure 3: U/(nm) and ū(n) against n with 95% bootstrap bands; dotted 1/n and 1 frame them.

    analysis: a `moespec.moe.reuse.ReuseAnalysis` of the run's trace.
    """
    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=150)
    n = list(analysis.n)
    for band, label, color in ((analysis.distinct_share, "distinct share U/(nm)", "C0"),
                               (analysis.u_bar, r"byte share $\bar u(n)$", "C3")):
        ax.plot(n, band.value, marker="o", ms=3.5, color=color, label=label)
        ax.fill_between(n, band.lo, band.hi, color=color, alpha=0.2, lw=0)
    ax.plot(n, [1 / x for x in n], ls=":", color="0.4", label="1/n (every token repeats)")
    ax.axhline(1, ls=":", color="0.6")
    ax.set_xlabel("tokens per pass n")
    ax.set_ylabel("share of slots / bytes")
    ax.set_ylim(0, 1.05)
    ax.set_xticks(n)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, frameon=False)
    return _save(fig, path)


def plot_saving(versions: Mapping[str, Mapping[str, Any]], verify: Mapping[str, Any], path: str | Path,
                title: str = "") -> Path:
    """Figure 4: measured S(n) with its 95% interval; each version's Ŝ(n); the band (18) of the first.

    versions: {version: Prediction dict}; verify: one depth's entry of the measurement's "verify".
    """
    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=150)
    band_drawn = False
    for version, p in versions.items():
        color, ls = VERSION_STYLE.get(version, ("C4", "-"))
        n = [x for x in p["n"] if x >= 2]
        i = [p["n"].index(x) for x in n]
        ax.plot(n, [1e3 * p["S"][j] for j in i], color=color, ls=ls, label=version)
        if not band_drawn and p["eps"] < 1:  # at ε >= 1 the band is unbounded (stored as null)
            ax.fill_between(n, [1e3 * p["S_lo"][j] for j in i], [1e3 * p["S_hi"][j] for j in i], color=color,
                            alpha=0.15, lw=0, label=f"band (18), ε = {p['eps']:.3f}")
            band_drawn = True
    s = [x for x in verify.get("saving", []) if x["n"] >= 2]
    if s:
        ax.errorbar([x["n"] for x in s], [1e3 * x["point"] for x in s],
                    yerr=[[1e3 * (x["point"] - x["lo"]) for x in s], [1e3 * (x["hi"] - x["point"]) for x in s]],
                    fmt="o", color="k", ms=4, capsize=2, label="measured S(n), 95% interval")
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set_xlabel("tokens per pass n")
    ax.set_ylabel("saving S(n) (ms)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, frameon=False)
    return _save(fig, path)


def plot_staircase(prediction: Mapping[str, Any], scores: Mapping[str, Mapping[str, Any]], path: str | Path,
                   title: str = "") -> Path:
    """Figure 5: k̂*(a) vs measured k*(a); loss at k̂* vs (20); predicted best speedup vs (21).

    prediction: the Prediction dict of the staircase drawn (its kernel is the scores' kernel);
    scores: {version: Score dict}.
    """
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), dpi=150)
    ax = axes[0]
    first = next(iter(scores.values()))
    a = first["acceptance"]
    for version, s in scores.items():
        color, ls = VERSION_STYLE.get(version, ("C4", "-"))
        ax.step(a, s["k_star_predicted"], where="post", color=color, ls=ls, label=f"k̂* {version}")
    ax.plot(a, first["k_star_measured"], "ko", ms=4, label="k* measured (sweep)")
    ax.fill_between(a, [k - 1 for k in first["k_star_measured"]], [k + 1 for k in first["k_star_measured"]],
                    color="0.5", alpha=0.15, lw=0, label="within one")
    ax.set_xlabel("acceptance a")
    ax.set_ylabel("draft length k")
    ax.set_ylim(-0.5, prediction["n"][-1] - 0.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, frameon=False)
    for version, s in scores.items():
        color, _ = VERSION_STYLE.get(version, ("C4", "-"))
        delta = s["delta"]
        bound20 = 2 * delta / (1 + delta) if delta < 1 else 1.0
        axes[1].plot(a, [100 * x for x in s["loss"]], marker="o", ms=3, color=color, label=f"{version} (sweep)")
        axes[1].axhline(100 * bound20, color=color, ls="--", lw=0.8)
        ratio = [p / m for p, m in zip(s["speedup_predicted"], s["speedup_measured"])]
        axes[2].plot(a, ratio, marker="o", ms=3, color=color, label=version)
        if delta < 1:
            for bound in speedup_bounds(delta):
                axes[2].axhline(float(bound), color=color, ls="--", lw=0.6)
    axes[1].set_xlabel("acceptance a")
    axes[1].set_ylabel("throughput lost at k̂* (%)")
    axes[1].set_title("dashed: bound (20), 2δ/(1+δ)", fontsize=8)
    axes[2].set_xlabel("acceptance a")
    axes[2].set_ylabel("predicted / measured best speedup")
    axes[2].set_title("dashed: interval (21)", fontsize=8)
    for x in axes[1:]:
        x.grid(alpha=0.3)
        x.legend(fontsize=6, frameon=False)
    fig.suptitle(title, fontsize=9)
    return _save(fig, path)


def plot_verify(versions: Mapping[str, Mapping[str, Any]], verify: Mapping[str, Any], path: str | Path,
                title: str = "") -> Path:
    """Figure 6 (this run's analogue): τ̂_p(n) of each version and the measured τ_p(n), per kernel."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), dpi=150, sharey=True)
    for ax, kernel in zip(axes, COST_KERNELS):
        for version, p in versions.items():
            color, ls = VERSION_STYLE.get(version, ("C4", "-"))
            ax.plot(p["n"], [1e3 * t for t in p["tau"][kernel]], color=color, ls=ls, label=version)
        measured = verify["tau"].get(TO_ENGINE[kernel], {})
        ns = sorted(int(n) for n in measured)
        ax.plot(ns, [1e3 * measured[str(n)] for n in ns], "ko", ms=4, label="measured (median)")
        ax.set_title(f"{kernel} kernel", fontsize=9)
        ax.set_xlabel("tokens per pass n")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, frameon=False)
    axes[0].set_ylabel("verify time τ(n) (ms)")
    fig.suptitle(title, fontsize=9)
    return _save(fig, path)


def plot_schedule(score: Mapping[str, Any], path: str | Path, version: str | None = None) -> Path:
    """Figure 7: k̂*(a, B) of `version` (default: "prediction", else the first scored) against a, one
    staircase per batch size B, the sweep's measured best k as dots of the same colour (a "batch-score"
    payload, `chain.batch_prediction.score_batch`)."""
    version = version or ("prediction" if "prediction" in score["versions"] else next(iter(score["versions"])))
    cells_all = score["versions"][version]["cells"]
    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=150)
    sizes = sorted({c["B"] for c in cells_all})
    for i, B in enumerate(sizes):  # each B a little higher, so equal staircases stay apart
        cells, lift = [c for c in cells_all if c["B"] == B], 0.06 * (i - (len(sizes) - 1) / 2)
        line, = ax.step([c["a"] for c in cells], [c["k_hat"] + lift for c in cells], where="post", label=f"B = {B}")
        ax.plot([c["a"] for c in cells], [c["k_measured"] + lift for c in cells], "o", color=line.get_color(),
                alpha=0.6)
    ax.set_xlabel("acceptance a")
    ax.set_ylabel("draft length k")
    ax.set_title(f"k̂*(a, B): lines {version}, dots measured best", fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, path)
