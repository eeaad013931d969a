"""The answer a user runs the chain for, in words and numbers: does speculation pay on this model and
machine, from which acceptance, at which draft length, with which settings to paste, and how far
to trust it (the score on sweeps the prediction never read, and whether the machine was steady).

It reads the preferred prediction version (`costmodel.predict.preferred_version`) at the run's first
depth: V̂(k) of the kernel the engine runs (llama.cpp: its grouped mul_mat_id, "dedup"; torch: the
faster at each n, "auto"), where drafting first pays and each draft length's first acceptance from
the staircase of V̂ (`costmodel.theory.summarize`, the step points (B.31) that `moespec theory`
prints, so the words agree with the table for any V̂, monotone or not), k̂*(a) and speedup (9) on
the grid, and llama.cpp's settings from `costmodel.settings.recommend`.
"""

from __future__ import annotations

from typing import Any

from moespec.costmodel.predict import loop_step_times, preferred_version
from moespec.costmodel.settings import DRAFT_PLACEHOLDER, recommend
from moespec.costmodel.theory import summarize
from moespec.report.html import Table
from moespec.report.summary import LOSS_GOAL, TAU_GOAL, goals, sweep_acceptance_line


def _engine(run: dict[str, Any]) -> tuple[str, str, Any]:
    """(engine, its kernel's name in the prediction, threads) of the run's measurement."""
    prov = run.get("measurement", {}).get("provenance") or run.get("prediction", {}).get("provenance", {})
    if prov.get("experts") == "llama.cpp":
        return "llama.cpp", "dedup", prov.get("options", {}).get("threads")
    return "torch", "auto", None


def verdict(V: list[float], acceptance: list[float], gain: list[float]) -> str:
    """Does speculation pay, from which acceptance, at which draft lengths: read off the staircase of
    V (its step points, (B.31)); a0 = V(1)/V(0) − 1 (B.4) is named where it is that first step."""
    s = summarize(V)
    paying = [(lo, k) for lo, _, k in s.stairs if k >= 1]
    a0 = float(s.first_draft_threshold)
    if not paying:
        return (f"speculation does not pay: no draft length beats plain decoding at any acceptance a < 1 "
                f"(a0 = V̂(1)/V̂(0) − 1 = {a0:.2f}, and no longer draft pays below 1 either); decode plainly.")
    first = float(paying[0][0])
    named = f"a0 = {first:.2f}" if abs(first - a0) <= 1e-9 else f"a_1 = {first:.2f} (B.31; one draft alone would pay from a0 = {a0:.2f})"
    steps = ", ".join(f"k = {k} from a = {float(lo):.2f}" for lo, k in paying)
    best = max(range(len(acceptance)), key=lambda i: gain[i])
    return (f"speculation pays once your draft's acceptance rate is above {named}; below it, decode plainly (k = 0). "
            f"Above it the best draft length grows with acceptance ({steps}); at a = {acceptance[best]:.2f} it "
            f"predicts {gain[best]:.2f}x plain decoding's tokens per second.")


def answer_blocks(run: dict[str, Any]) -> list:
    """The answer (module docstring) as paragraphs and one Table; [] before a prediction exists."""
    pred = run.get("prediction")
    if not pred or not pred.get("depths"):
        return []
    entry = pred["depths"][0]
    version = preferred_version(entry["versions"])
    if version is None:
        return []
    engine, kernel, threads = _engine(run)
    p = entry["versions"][version]
    V, acceptance = p["V"][kernel], p["acceptance"]
    k_star, gain = p["k_star"][kernel], p["speedup"][kernel]
    where = f"{engine}{f', {threads} thread' + 's' * (threads != 1) if threads else ''}, context depth {entry['depth']}"
    model = run.get("measurement", {}).get("provenance", {}).get("model") or pred.get("model", "the model")
    verdict_text = verdict(V, acceptance, gain)
    blocks: list = [f"The answer for {model} on this machine ({where}), from the {version} prediction: {verdict_text}"]
    rec = recommend(loop_step_times(p, kernel) if engine == "llama.cpp" else V, acceptance, engines=("llama.cpp",))
    rows = [[f"{a:.2f}", k, f"{g:.2f}x", r.engine("llama.cpp").fragment]
            for a, k, g, r in zip(acceptance, k_star, gain, rec.rows)]
    loop = (", priced on llama.cpp's own loop (the passes τ̂(k + 1) alone, without the time moespec's engine spends "
            "around them)" if engine == "llama.cpp" else "")
    blocks.append(Table(f"Best draft length k̂*(a) and predicted speedup at each acceptance a of your draft, and "
                        f"llama-server's settings{loop} ({DRAFT_PLACEHOLDER}: your draft's GGUF file; `moespec settings "
                        f"--prediction prediction.json --draft FILE` writes them for vLLM and SGLang too)",
                        ["a", "k̂*", "speedup", "llama-server settings"], rows))
    blocks.append(_trust(run, entry["depth"], version))
    return blocks


def _trust(run: dict[str, Any], depth: int, version: str) -> str:
    """How far to trust the answer: the version's score out of sample, and the machine's steadiness."""
    score = run.get("score", {})
    at = next((e for e in score.get("depths", []) if e["depth"] == depth), {})
    scored, ran = at.get("versions", {}).get(version), sweep_acceptance_line(at.get("oracle_acceptance"))
    steadiness = score.get("steadiness")
    if scored is None and run.get("prediction", {}).get("dense"):
        said = ("a dense model runs no oracle sweep to score it against (the sweep tests the MoE cost model); the "
                "held-out check of your drafts, where the run priced any, measures it.")
    elif scored is None and version in at.get("unavailable", {}):
        said = f"it could not be scored against this machine's sweep: {at['unavailable'][version]['message']}."
    elif scored is None:
        said = "it has not been scored against this machine's sweep yet (run the chain to its score step)."
    else:
        g = goals(scored)
        within, loss, tau = g["k_within_one"], g["loss"], g["tau"]
        trusted = within[1] and loss[1] and tau[1]
        said = (f"scored on this machine against oracle-sweep runs and verify passes it never read, k̂* was within one "
                f"of the measured best at {within[0]} of {len(scored['acceptance'])} acceptances, lost at most "
                f"{100 * loss[0]:.1f}% of the best throughput (goal {100 * LOSS_GOAL:.0f}%), and its verify times were "
                f"off by {100 * tau[0]:.1f}% (goal {100 * TAU_GOAL:.0f}%): "
                + ("trust it as measured." if trusted else "trust its broad shape more than its exact values."))
    if ran is not None and scored is not None:  # unscored, its reason says why
        said += " " + ran[0].upper() + ran[1:] + "."
    if steadiness is not None:
        said += " " + steadiness["message"][0].upper() + steadiness["message"][1:] + "."
    return "How far to trust it: " + said
