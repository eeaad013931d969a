"""The chain's report: one self-contained HTML file with the summary's tables (`report.summary`),
Figures 1–6 and Tables 1, 3, 4, 7 and 8 of this run (cost-model paper, Sec. 2 and 4–4.4, App. E), and
the same summary as plain text (summary.txt).

Reads a run folder as `moespec demo` leaves it (traces.parquet, characterization.json,
prediction.json, measurement.json, score.json, and on llama.cpp batch-score.json: Figure 7 and
Table 9, the schedule at batch size B); a missing artifact drops the parts that need it, and
artifacts of different models are refused (`models.lineage.check_chain`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from moespec import artifacts, run_files
from moespec.models.lineage import check_chain
from moespec.moe.traces import read_header
from moespec.report.answer import answer_blocks
from moespec.report.batch import batch_blocks
from moespec.report.html import Figure, Section, Table, render
from moespec.report.summary import as_text, backends_table, crossover_shown, k_within_one, summary_blocks
from moespec.run_files import ANSWER, LLAMA_FOLDER, MEMORY, SUMMARY

FILES = {"traces": run_files.TRACES, "characterization": run_files.CHARACTERIZATION,
         "prediction": run_files.PREDICTION, "measurement": run_files.MEASUREMENT, "score": run_files.SCORE,
         "batch_score": run_files.BATCH_SCORE}


def _load_run(run_dir: Path) -> dict[str, Any]:
    """The folder's artifacts; refused when one was made from a file that has changed since (a score
    beside another prediction than the one it scored)."""
    got: dict[str, Any] = {}
    for name, file in FILES.items():
        path = run_dir / file
        if path.exists():
            stale = artifacts.changed_parents(path)
            if stale:
                raise ValueError(f"{path} was made from another {', '.join(stale)} than the one in {run_dir}; "
                                 f"rerun `moespec demo --out-dir {run_dir}` to make it again from these")
            got[name] = path if name == "traces" else artifacts.load(path, run_files.KINDS[file])["payload"]
    return got


def _candidates(run_dir: Path) -> dict[str, Any]:
    """The user's drafts' artifacts (`chain.candidate_steps`), where the run priced them."""
    got = {}
    for name, file in (("prompts", run_files.PROMPTS), ("candidates", run_files.CANDIDATES),
                       ("candidates_score", run_files.CANDIDATES_SCORE), ("llama", run_files.CANDIDATES_LLAMA)):
        path = run_dir / file
        if path.exists():
            if artifacts.changed_parents(path):
                continue  # made from other calibrations or checks: the next `moespec demo` remakes it
            got[name] = artifacts.load(path, run_files.KINDS[file])["payload"]
    return got


def _candidate_blocks(mine: dict[str, Any]) -> tuple[list, list]:
    """(the answer's blocks for the user's drafts, the report's table) when the run priced any."""
    from moespec.report.candidates import answer_lines, batch_lines, candidates_table, llama_check_lines, score_lines

    if "candidates" not in mine:
        return [], []
    words = answer_lines(mine["candidates"], mine.get("prompts")) + batch_lines(mine["candidates"])
    if "candidates_score" in mine:
        words += score_lines(mine["candidates_score"])
    if "llama" in mine:
        words += llama_check_lines(mine["llama"])
    return words, [candidates_table(mine["candidates"], mine.get("candidates_score"))]


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{1e3 * x:.2f}"


def _first(d: dict, *names: str):
    """The first present version of `names` in d, as (name, value), else (None, None)."""
    for n in names:
        if n in d:
            return n, d[n]
    return None, None


def _verdict(v: Any) -> str:
    """(7) with its margin (19): which kernel is faster and whether ε leaves the sign certain."""
    if not isinstance(v, dict):
        return str(v)
    faster = "dedup faster" if v.get("dedup_faster") else "per-slot faster"
    return f"{faster} ({'certain' if v.get('certain') else 'not certain'})"


def _table1(char: dict) -> Table:
    beta = char["beta"]
    ns = sorted(int(n) for n in char["n"])
    kernels = sorted(beta)
    rows = [[n, *(f"{beta[k][str(n)]['aggregate'] / 1e9:.1f}" for k in kernels), f"{char['r'][str(n)]:.3f}",
             f"{char['u_bar'][str(n)]:.3f}", _verdict(char["verdict"][str(n)])] for n in ns]
    return Table("Table 1: effective bandwidth (GB/s) of each kernel on the recorded windows, r(n), ū(n), verdict (7)",
                 ["n", *(f"β {k}" for k in kernels), "r(n)", "ū(n)", "verdict"], rows)


def _score_tables(run: dict) -> list:
    rows3, rows4, rows7 = [], [], []
    for entry in run.get("score", {}).get("depths", []):
        d = entry["depth"]
        for version, s in entry["versions"].items():
            within, A = k_within_one(s), len(s["acceptance"])
            one = not s["saving_error_by_n"]  # an engine with one kernel: no measured saving
            rows3.append([d, version, "—" if one else _ms(max(s["saving_error_by_n"])),
                          f"{crossover_shown(s['crossover_predicted'])} / {crossover_shown(s['crossover_measured'])}", f"{within}/{A}"])
            noise = ["", ""]
            if s.get("resamples"):
                lo, hi = s["max_loss_interval"]
                noise = [f"{100 * lo:.1f} to {100 * hi:.1f}%", f"{100 * s['loss_floor']:.1f}%"]
            rows4.append([d, version, f"{s['sign_agree']} of {s['sign_points']}", f"{within}/{A}",
                          f"{100 * max(s['loss']):.1f}%", *noise, f"{100 * s['tau_error']:.1f}%", f"{s['delta']:.3f}"])
            if not one:
                rows7.append([d, version, f"{min(s['amplification']):.1f} to {max(s['amplification']):.1f}",
                              f"{s['eps_implied']:.3f}", f"{s['eps']:.3f}", f"{sum(s['inside_band'])}/{len(s['n'])}"])
    if not rows3:
        return []
    return [Table("Table 3: saving error (ms), crossover predicted / measured, k̂* within one", ["d", "version",
                  "saving error", "crossover", "k* within one"], rows3),
            Table("Table 4: sign of S(n), k̂* within one, loss at k̂* (with its 95% interval over resamples of the "
                  "sweep's passes, and the loss floor: what the measured k* itself loses on them, 95th percentile), "
                  "verify-time error, δ", ["d", "version", "sign", "k*", "loss", "loss, 95%", "loss floor", "τ error",
                                          "δ"], rows4),
            *([Table("Table 7: amplification, implied ε, engine ε, measured savings inside the band (18)",
                     ["d", "version", "amplification", "implied ε", "ε", "inside band"], rows7)] if rows7 else [])]


def _figures(run: dict, tmp: Path) -> list:
    from moespec.report import figures
    from moespec.report.fig_bandwidth import plot_bandwidth
    from moespec.report.fig_reuse import plot_reuse

    out = []
    if "traces" in run:
        from moespec.moe.reuse import analyze
        from moespec.moe.traces import RoutingTrace

        tr = RoutingTrace.load(run["traces"])
        a = analyze(tr, 9, resamples=200)
        out.append(Figure("Figure 1: consecutive-token reuse ρ(n), layer mean, with its 95% interval",
                          plot_reuse([(tr.model or "trace", a)], tmp / "fig1.png")))
        out.append(Figure("Figure 3: distinct share U/(nm) and byte share ū(n) of the trace, 95% intervals",
                          figures.plot_bytes(a, tmp / "fig3.png")))
    if "characterization" in run:
        out.append(Figure("Figure 2: effective bandwidth of each kernel on the expert operation",
                          plot_bandwidth(run["characterization"], tmp / "fig2.png")))
    verify = {int(v["depth"]): v for v in run.get("measurement", {}).get("verify", [])}
    scores = {e["depth"]: e["versions"] for e in run.get("score", {}).get("depths", [])}
    for entry in run.get("prediction", {}).get("depths", []):
        d, versions = entry["depth"], entry["versions"]
        if d in verify and versions:
            out.append(Figure(f"Figure 4: saving S(n), d = {d}: measured with 95% interval, predicted, band (18)",
                              figures.plot_saving(versions, verify[d], tmp / f"fig4-{d}.png", f"d = {d}")))
            out.append(Figure(f"Figure 6: verify time predicted vs measured, d = {d}",
                              figures.plot_verify(versions, verify[d], tmp / f"fig6-{d}.png", f"d = {d}")))
        if scores.get(d):
            _, p = _first(versions, "calibrated", "measured-time", "prediction")
            out.append(Figure(f"Figure 5: best draft length k̂*(a) vs measured, loss vs (20), speedup vs (21), d = {d}",
                              figures.plot_staircase(p, scores[d], tmp / f"fig5-{d}.png", f"d = {d}")))
    if "batch_score" in run:
        out.append(Figure("Figure 7: best draft length per batch size, k̂*(a, B) predicted (lines) and the sweep's "
                          "best (dots)", figures.plot_schedule(run["batch_score"], tmp / "fig7.png")))
    return sorted(out, key=lambda f: f.caption)


def _both_backends(run_dir: Path, run: dict[str, Any]) -> Table | None:
    """The side-by-side table when the other backend's chain lies beside this one: `moespec demo
    --backend llama.cpp` runs into the torch run folder's llama.cpp/ subfolder."""
    llama = run_dir.name == LLAMA_FOLDER
    other = run_dir.parent if llama else run_dir / LLAMA_FOLDER
    if not (other / FILES["score"]).exists():
        return None
    runs = {"torch": _load_run(other) if llama else run, "llama.cpp": run if llama else _load_run(other)}
    return backends_table(runs)


def build_report(run_dir: str | Path, out: str | Path = run_files.REPORT) -> Path:
    """Write the HTML report of the run in `run_dir` to `out`, and beside it summary.txt (the answer,
    then every scored figure) and answer.txt; returns `out`."""
    run_dir = Path(run_dir)
    run = _load_run(run_dir)
    if not run:
        raise FileNotFoundError(f"{run_dir} holds no artifact of the chain; run `moespec demo --out-dir {run_dir}`")
    check_chain({FILES[name]: read_header(got) if name == "traces" else got for name, got in run.items()},
                fix=f"make every artifact in {run_dir} with one model, or move the others away")
    if (run_dir / MEMORY).exists():  # each step's peak memory (`chain.run_folder`), for the summary's line
        run["memory"] = artifacts.load(run_dir / MEMORY, run_files.KINDS[MEMORY])["payload"]
    out = Path(out)
    summary = summary_blocks(run)
    batch_lines, batch_table = batch_blocks(run["batch_score"]) if "batch_score" in run else ([], None)
    summary += batch_lines
    sides = _both_backends(run_dir, run)
    if sides is not None:
        summary.insert(0, sides)
    mine = _candidates(run_dir)
    drafts, drafts_table = _candidate_blocks(mine)
    answer = drafts + answer_blocks(run)
    (out.parent / SUMMARY).write_text(as_text(answer + summary), encoding="utf-8")
    (out.parent / ANSWER).write_text(as_text(answer), encoding="utf-8")
    sections = [Section("The answer", answer or ["nothing predicted yet"]),
                Section("Summary", summary or ["nothing predicted or scored yet"])]
    with tempfile.TemporaryDirectory() as tmp:
        shown = _figures(run, Path(tmp))
        if "candidates" in mine:
            from moespec.report.candidates import plot_candidates

            shown.append(Figure("Figure 8: your drafts, predicted speedup per draft length (lines) and measured on "
                                "the held-out prompts (dots)", plot_candidates(
                                    mine["candidates"], mine.get("candidates_score"), Path(tmp) / "fig8.png")))
        sections.append(Section("Figures", shown))
        tables = ([_table1(run["characterization"])] if "characterization" in run else []) + _score_tables(run)
        tables += ([batch_table] if batch_table is not None else []) + drafts_table
        sections.append(Section("Tables", tables or ["no scored measurement yet"]))
        model = run.get("prediction", {}).get("model") or run.get("measurement", {}).get("model") or str(run_dir)
        return render(f"moespec report: {model}", sections, out)
