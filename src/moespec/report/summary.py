"""The run's summary: the fidelity goals and the rules of Table 8 per depth and prediction version,
the crossover, k̂*(a) against the measured k*(a), the sweep's noise and the versions left unpredicted.

`summary_blocks` builds it once, as paragraphs and `Table`s; `report.html` renders those blocks in
the report and `as_text` renders the same blocks as summary.txt, so the two cannot disagree.
"""

from __future__ import annotations

import math
import textwrap
import unicodedata
from typing import Any

import numpy as np

from moespec.costmodel.sweep_cells import ACCEPTANCE_LEVEL, cell_throughput
from moespec.report.html import Table, Verdict

LOSS_GOAL, TAU_GOAL, GAP_GOAL = 0.05, 0.10, 0.05  # the project's goals; k̂* within one at >= A − 1 of A


def k_within_one(s: dict[str, Any]) -> int:
    """The acceptance values at which |k̂*(a) − k*(a)| <= 1 (Table 3)."""
    return sum(abs(p - m) <= 1 for p, m in zip(s["k_star_predicted"], s["k_star_measured"]))


def goals(s: dict[str, Any]) -> dict[str, tuple[float, bool]]:
    """The project's prediction-fidelity goals on one scored version: {goal: (value, met)}.

    k_within_one: k̂* within one at >= A − 1 of A values; loss: at k̂*, <= 5%; tau: the verify-time
    error <= 10%, out of sample (on verify passes the prediction did not read), with deduplication
    on, as the paper's Table 7 gives it (the kernel the step times V(k) are built on);
    gap: the sweep's best speedup within 5% of G_a(k)V(0)/V(k) (App. E).
    """
    A, within = len(s["acceptance"]), k_within_one(s)
    loss, tau, gap = max(s["loss"]), s["tau_error_dedup"], max(abs(g) for g in s["oracle_gap"])
    return {"k_within_one": (within, within >= A - 1), "loss": (loss, loss <= LOSS_GOAL),
            "tau": (tau, tau <= TAU_GOAL), "gap": (gap, gap <= GAP_GOAL)}


def crossover_shown(c: int | None) -> str:
    return "none" if c is None else str(c)


def _pct(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


def _goal(value: str, met: bool) -> Verdict:
    return Verdict(f"{value} {'met' if met else 'missed'}", met)


def _best(measurement: dict, depth: int) -> tuple[float, int, float] | None:
    """(best measured speedup over plain decoding, its k, its a) in the oracle sweep at `depth`."""
    for e in measurement.get("oracle", []):
        if int(e["depth"]) == depth:
            def gain(c):
                base = e["plain"]  # plain decoding, pooled over every acceptance
                return cell_throughput(c) / cell_throughput(base) if base else float("nan")
            drafting = [c for c in e["cells"] if c["k"]]
            if not drafting:
                return None
            c = max(drafting, key=gain)
            return gain(c), c["k"], c["a"]
    return None


def _median_factor(s: dict[str, Any]) -> float | None:
    """The paper's figure (App. E): the median factor of the sweep's speedup at k* over G_a(k)V(0)/V(k),
    where k* >= 1 (at k* = 0 the two are one by definition)."""
    spec = [g for g, k in zip(s["oracle_gap"], s["k_star_measured"]) if k >= 1]
    return 1 + float(np.median(spec)) if spec else None


def _goals(scored: list) -> list:
    rows, notes = [], []
    for d, version, s in scored:
        g = goals(s)
        rows.append([d, version, _goal(f"{g['k_within_one'][0]}/{len(s['acceptance'])}", g["k_within_one"][1]),
                     _goal(_pct(g["loss"][0]), g["loss"][1]), _pct(s.get("loss_floor")),
                     _goal(_pct(g["tau"][0]), g["tau"][1]), _pct(s["tau_error_dedup_in_sample"]),
                     _goal(_pct(g["gap"][0]), g["gap"][1])])
        floor = s.get("loss_floor")
        if floor is not None and floor > LOSS_GOAL:
            notes.append(f"d = {d}, {version}: the loss goal is below this sweep's resolution: its loss floor is "
                         f"{100 * floor:.1f}% (more --oracle-reps lower it)")
    table = Table("Fidelity goals: k̂* within one of the measured k* at >= A−1 of A acceptances; the largest "
                  "throughput lost at k̂*, beside its floor (what the measured k* itself loses on resamples of the "
                  "sweep, 95th percentile); the verify-time error with deduplication on, judged on the verify "
                  "repetitions the prediction did not read, beside the in-sample figure; the largest gap of the "
                  "sweep's speedup to G_a(k)V(0)/V(k)",
                  ["d", "version", "k̂* within one", f"loss ≤ {100 * LOSS_GOAL:.0f}%", "loss floor",
                   f"verify-time error ≤ {100 * TAU_GOAL:.0f}%, out of sample", "in-sample",
                   f"gap ≤ {100 * GAP_GOAL:.0f}%"], rows)
    return [table, *notes]


def _rules(scored: list) -> Table:
    rows = [[d, version, r["name"], f"{r['value']:.4g}", f"{r['threshold']:.4g}",
             Verdict("passed" if r["passed"] else "failed", r["passed"])]
            for d, version, s in scored for r in s["rules"]]
    return Table("Table 8: scoring rules", ["d", "version", "rule", "value", "threshold", "verdict"], rows)


def _crossover(run: dict, measured: dict[int, dict]) -> Table:
    rows = [[e["depth"], version, crossover_shown(p["crossover"]),
             crossover_shown(measured[e["depth"]]["crossover_measured"]) if e["depth"] in measured else "—"]
            for e in run.get("prediction", {}).get("depths", []) for version, p in e["versions"].items()]
    return Table("Crossover: the smallest n from which deduplication saves time, predicted / measured",
                 ["d", "version", "predicted", "measured"], rows)


def _staircase(d: int, versions: dict[str, dict]) -> Table:
    m = next(iter(versions.values()))  # the measured figures are the same in every version's score
    rows = [[f"{a:.2f}", *(v["k_star_predicted"][i] for v in versions.values()), m["k_star_measured"][i],
             f"{100 * m['oracle_gap'][i]:+.1f}"] for i, a in enumerate(m["acceptance"])]
    return Table(f"Best draft length k̂*(a) of each version vs the measured k*(a), and the sweep's speedup at k* "
                 f"over G_a(k)V(0)/V(k) (gap, %), d = {d}",
                 ["a", *(f"k̂* {v}" for v in versions), "k* measured", "gap at k*"], rows)


def _measured(run: dict, measured: dict[int, dict]) -> Table | None:
    rows, sweeps = [], run.get("measurement", {})
    for d in sorted({int(e["depth"]) for e in sweeps.get("oracle", [])} | set(measured)):
        best, factor = _best(sweeps, d), _median_factor(measured[d]) if d in measured else None
        if best is not None or factor is not None:
            rows.append([d, "—" if best is None else f"{best[0]:.3f}x at k = {best[1]}, a = {best[2]}",
                         "—" if factor is None else f"{factor:.3f}"])
    return Table("Measured: the oracle sweep's best speedup over plain decoding; the median factor of the "
                 "speedup at k* over G_a(k)V(0)/V(k) where k* >= 1 (App. E: 0.93 to 1.04 on CUDA)",
                 ["d", "best measured speedup", "median factor at k* ≥ 1"], rows) if rows else None


def _figures(scored: list) -> Table:
    rows = [[d, version, _pct(s["tau_error"]), _pct(s["tau_error_in_sample"]),
             _pct(s["saving_error_beyond_interval"]), f"{s['delta']:.3f}"] for d, version, s in scored]
    return Table("Other scored figures: the verify-time error over every measured kernel (out of sample, and in-sample); "
                 "the saving error beyond the measured S(n)'s 95% interval, as a share of τ_dedup(n) (for the "
                 "calibrated version, the verify-time error that noise cannot explain); δ, the step-time error",
                 ["d", "version", "verify-time error, every kernel", "in-sample", "saving error beyond interval",
                  "δ"], rows)


def _noise(scored: list) -> Table | None:
    rows = [[d, version, s["resamples"], "{:.0f} to {:.0f}".format(*s["k_within_one_interval"]),
             " to ".join(map(_pct, s["max_loss_interval"])), " to ".join(map(_pct, s["oracle_gap_interval"]))]
            for d, version, s in scored if s["resamples"]]
    return Table("Sweep noise: 95% intervals of the scored figures over resamples of the sweep's passes",
                 ["d", "version", "resamples", "k̂* within one", "max loss", "largest gap"], rows) if rows else None


def _steadiness(run: dict) -> list:
    """The machine's speed round by round in each timing phase (`costmodel.steadiness`), and, when it
    moved enough to spoil the scores, the warning with the figure and the fix."""
    found = run.get("score", {}).get("steadiness")
    if not found:
        return []
    rows = [[p["name"], len(p["factors"]), p["slow_rounds"], f"{max(p['factors'], default=1):.2f}x",
             Verdict("steady" if p["steady"] else "moved", p["steady"])] for p in found["phases"]]
    table = Table(f"Machine steadiness: each timing phase's rounds, those {100 * found['slow']:.0f}% or more slower "
                  f"than the phase's usual speed (flagged from {100 * found['slow_share']:.0f}% of the rounds), "
                  "and the slowest", ["phase", "rounds", "slow rounds", "slowest", "verdict"], rows)
    return [table] if found["steady"] else [f"WARNING: {found['message']}", table]


def sweep_acceptance_line(rows: list[dict] | None) -> str | None:
    """One sentence: did the oracle sweep run at the acceptances it is labeled with, and which did the
    score refuse (`costmodel.sweep_cells.acceptance_rows`); None without rows."""
    if not rows:
        return None
    if not all(r["checked"] for r in rows):
        return "the oracle sweep's realized acceptance was not checked (its measurement records no tested drafts)"
    refused = [r for r in rows if r["refused"]]
    level = f"{100 * ACCEPTANCE_LEVEL:.0f}% sampling interval"
    if not refused:
        return f"the oracle sweep ran at its set acceptance: every cell realized it within its {level}"
    said = ", ".join(f"a = {r['a']:.2f} (realized {r['realized']:.2f})" for r in refused)
    kept = len(rows) - len(refused)
    return (f"the oracle sweep missed its set acceptance, outside the {level}, at {said}: the score refuses "
            + (f"those and covers the other {kept} of {len(rows)}" if kept else "every acceptance and scores nothing"))


def _acceptance(depths: list[dict]) -> list:
    """The oracle sweep's set and realized acceptance per a of the grid, and the score's use of each."""
    rows = [[e["depth"], f"{r['a']:.2f}", "—" if r["realized"] is None else f"{r['realized']:.3f}", r["tested"],
             "—" if r["interval"] is None else "{:.3f} to {:.3f}".format(*r["interval"]),
             ", ".join(map(str, r["cells_outside"])) or "none",
             Verdict("refused" if r["refused"] else "scored", not r["refused"])]
            for e in depths for r in e.get("oracle_acceptance") or []]
    if not rows:
        return []
    lines = [line for e in depths if (line := sweep_acceptance_line(e.get("oracle_acceptance")))]
    return [Table(f"Oracle sweep: set and realized acceptance (accepted over tested drafts, k >= 1 pooled), its "
                  f"{100 * ACCEPTANCE_LEVEL:.0f}% sampling interval a ± z·sqrt(a(1−a)/tested), the k of cells "
                  "outside their own interval; a refused acceptance is left out of the score",
                  ["d", "a set", "a realized", "tested drafts", "interval", "cells outside", "score"], rows),
            *[line[0].upper() + line[1:] + "." for line in lines]]


def _unavailable(run: dict) -> Table | None:
    missing: dict[tuple[int, str], Any] = {}
    for source in ("prediction", "score"):
        for e in run.get(source, {}).get("depths", []):
            for version, why in e.get("unavailable", {}).items():
                missing.setdefault((e["depth"], version), why)
    rows = [[d, version, why["reason"], why["message"]] for (d, version), why in missing.items()]
    return Table("Unavailable versions", ["d", "version", "reason", "message"], rows) if rows else None


def summary_blocks(run: dict[str, Any]) -> list:
    """The summary of a loaded run (`report.build`) as paragraphs (str) and `Table`s."""
    pred = run.get("prediction", {})
    blocks: list = []
    if pred.get("bounds_vacuous"):
        blocks.append(f"characterized ε = {pred['eps_characterized']:.3f} >= 1/2: the bounds (20)-(21) say nothing "
                      "here (δ >= 1), nor, at ε >= 1, the band (18); τ̂, Ŝ, the crossover and k̂* still stand")
    every = run.get("score", {}).get("depths", [])
    depths = [e for e in every if e["versions"]]
    scored = [(e["depth"], version, s) for e in depths for version, s in e["versions"].items()]
    measured = {e["depth"]: next(iter(e["versions"].values())) for e in depths}
    steadiness = _steadiness(run)
    if steadiness and isinstance(steadiness[0], str):  # a warning: before the scores it spoils
        blocks += steadiness
    if scored:
        blocks += [*_goals(scored), _rules(scored)]
    blocks += _acceptance(every)
    if pred.get("depths") and not pred.get("dense"):  # a dense model has one kernel: nothing to cross over
        blocks.append(_crossover(run, measured))
    blocks += [_staircase(e["depth"], e["versions"]) for e in depths]
    blocks.append(_measured(run, measured))
    if scored:
        blocks += [_figures(scored), _noise(scored)]
    if steadiness and not isinstance(steadiness[0], str):
        blocks += steadiness
    blocks.append(_unavailable(run))
    blocks.append(memory_line(run.get("memory", {})))
    return [b for b in blocks if b]


def memory_line(memory: dict[str, Any]) -> str:
    """The largest peak resident memory of the run's steps (memory.json, `chain.run_folder`), or ""."""
    steps = {n: s for n, s in memory.get("steps", {}).items() if s.get("anon_bytes") is not None}
    if not steps:
        return ""
    name = max(steps, key=lambda n: steps[n]["anon_bytes"] + steps[n]["file_bytes"])
    s = steps[name]
    return (f"peak resident memory: {(s['anon_bytes'] + s['file_bytes']) / 1e9:.2f} GB in step {name} "
            f"(anonymous {s['anon_bytes'] / 1e9:.2f} GB, file-backed {s['file_bytes'] / 1e9:.2f} GB; "
            f"{len(steps)} steps recorded in memory.json)")


def backends_table(runs: dict[str, dict[str, Any]]) -> Table | None:
    """The same model on each backend's chain ({backend: loaded run}): per scored version, τ(1), the
    fidelity goals and the sweep's best speedup, one row per backend, depth and version."""
    rows = []
    for backend, run in runs.items():
        meas = run.get("measurement", {})
        tau1 = {int(v["depth"]): v.get("tau_meas_1") for v in meas.get("verify", [])}
        for e in run.get("score", {}).get("depths", []):
            best = _best(meas, e["depth"])
            for version, s in e["versions"].items():
                g = goals(s)
                rows.append([backend, run.get("score", {}).get("model", "—"), e["depth"], version,
                             "—" if tau1.get(e["depth"]) is None else f"{1e3 * tau1[e['depth']]:.2f}",
                             f"{g['k_within_one'][0]}/{len(s['acceptance'])}", _pct(g["loss"][0]), _pct(g["tau"][0]),
                             "—" if best is None else f"{best[0]:.3f}x at k = {best[1]}, a = {best[2]}"])
    if len({r[0] for r in rows}) < 2:
        return None
    return Table("Both backends: the chain on each, scored alike (k̂* within one at A−1 of A, loss at k̂* ≤ 5%, "
                 "verify-time error ≤ 10% out of sample, deduplicating kernel; on llama.cpp its grouped mul_mat_id)",
                 ["backend", "model", "d", "version", "τ(1) ms", "k̂* within one", "loss", "verify-time error",
                  "best measured speedup"], rows)


def _width(text: str) -> int:
    return sum(not unicodedata.combining(c) for c in text)  # k̂ is two code points, one column


def _fill(text: str) -> str:
    """`text` wrapped at 100 columns between words only: a settings line such as
    `--spec-ngram-mod-n-max 2` or a path is never split at a hyphen, so it pastes as printed."""
    return textwrap.fill(text, 100, break_on_hyphens=False, break_long_words=False)


def as_text(blocks: list) -> str:
    """The blocks as plain text: paragraphs and captions wrapped at 100 columns (`_fill`), each table
    under its caption in aligned columns."""
    out = []
    for block in blocks:
        if isinstance(block, Table):
            cells = [[str(c) for c in row] for row in [block.header, *block.rows]]
            widths = [max(_width(row[i]) for row in cells) for i in range(len(block.header))]
            out.append(_fill(block.caption))
            out += ["  " + "  ".join(c + " " * (w - _width(c)) for c, w in zip(row, widths)).rstrip() for row in cells]
        else:
            out.append(_fill(block))
        out.append("")
    return "\n".join(out)
