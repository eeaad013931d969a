"""The answer for the user's own drafts, in words, a table and a figure (`chain.candidate_steps`).

Reads candidates.json (each candidate's prediction and the answer over them) and, once the held-out
check ran, candidates-score.json. The words name the best candidate, its k̂* and speedup with its
band and the lines for llama-server, vLLM and SGLang, or "decode plainly" with the best figure any
candidate predicts; then how the answer held on the held-out prompts, each figure beside its goal
(issue 50: k̂* within one, throughput lost <= 3%, speedup error <= 5%, the named best within 2%).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moespec.costmodel.positional import PositionalAnswer
from moespec.costmodel.predict import TIMED_PASSES
from moespec.report.html import Table
from moespec.report.plotting import plt, save

LOST_GOAL, SPEEDUP_GOAL = 0.03, 0.05
GOAL_BEST, GOAL_DEFAULTS, GOAL_PLAIN = 0.97, 1.1, 1.0  # llama.cpp at the emitted settings against its own


def engine_lines(settings: dict) -> list[str]:
    """One line per engine: the flags to paste (and why, where a line is priced otherwise than the answer)."""
    names = {"llama.cpp": "llama-server", "vllm": "vLLM", "sglang": "SGLang"}
    return [f"  {names.get(e, e)}: {s['fragment']}" + (f" ({s['why']})" if s.get("why") else "")
            for e, s in settings.items()]


def answer_lines(candidates: dict[str, Any], prompts: dict[str, Any] | None = None) -> list[str]:
    """The answer for the candidates, in words, with the engines' lines when one pays."""
    ans = candidates["answer"]
    where = ""
    if prompts is not None:
        where = (f" on {'your prompts' if prompts['source'] != 'shipped' else 'the shipped prompts'} "
                 f"({len(prompts['calibration'])} calibrate, {len(prompts['heldout'])} held out)")
    names = ", ".join(ans["candidates"])
    mine = tie_lines(candidates) + llama_best_lines(ans.get("llama")) + unpredicted_lines(candidates)
    if ans["best"] is None:
        return [f"Your drafts ({names}){where}: decode plainly. No candidate pays on this machine: the best "
                f"drafting any of them predicts is {ans['best_drafting']:.2f}x plain decoding.", *mine]
    best = next(c for c in candidates["candidates"] if c["name"] == ans["best"])
    return [f"Your drafts ({names}){where}: the best is {ans['best']}, at draft length k = {ans['k_star']}, "
            f"{ans['speedup']:.2f}x plain decoding{band_words(best['answer'], ans['k_star'])}. Its settings:",
            *engine_lines(ans["settings"]), *mine]


def band_words(a: dict[str, Any], k: int) -> str:
    """The band of the speedup at k̂* = k and of the best speedup over every k, from a stored answer."""
    high = a["speedup_high"]  # None in JSON where the band is unbounded (δ >= 1: the bounds are vacuous)
    if high is None or high == float("inf"):
        return " (no band: the prediction's step-time error bound is vacuous)"
    best = f"{a['speedup_low']:.2f}x to {high:.2f}x"
    if not a.get("high_by_k"):  # an answer made before the band at each k was kept
        return f" (band {best})"
    return f" (at k = {k}: {a['low_by_k'][k]:.2f}x to {a['high_by_k'][k]:.2f}x; the best speedup over every k: {best})"


def tie_lines(candidates: dict[str, Any]) -> list[str]:
    """A line per candidate whose drafting pays only inside how far the price of its rounds moved while
    the target's passes were timed (`costmodel.positional.paying`): a tie, decoded plainly."""
    out = []
    for c in candidates.get("candidates", []):
        a = PositionalAnswer.from_dict(c["answer"])
        gains = [e * a.step_times[0] / v for e, v in zip(a.expected, a.step_times)]
        if a.ties:
            k = max(a.ties, key=lambda j: gains[j])
            out.append(f"{c['name']} ties plain decoding: at k = {k} it predicts {gains[k]:.2f}x, inside how far "
                       f"the price of a round against a plain step moved while the target's passes were timed "
                       f"(up to {100 * (a.price_high[k] - 1):.0f}% over {len(c.get('passes', {}).get('blocks', []))} "
                       "blocks), so it decodes plainly.")
    return out


def unpredicted_lines(candidates: dict[str, Any]) -> list[str]:
    """A line where the rounds were priced without the chain's prediction (it fitted no version:
    `candidate_answer.base_passes`)."""
    if not any(c.get("version") == TIMED_PASSES for c in candidates.get("candidates", [])):
        return []
    return ["The chain's prediction fitted no version on these timings, so the rounds are priced with the target's "
            "passes timed on your prompts and the engine's time per round from the base measurement, with no band "
            "from the prediction's error bound (rerun the demo with nothing else running for one)."]


def llama_best_lines(llama: dict | None) -> list[str]:
    """llama.cpp's own best where it differs from the answer's (`candidate_answer.llama_pick`)."""
    if not llama:
        return []
    return [f"On llama.cpp, whose loop spends next to nothing beyond the pass, the best is {llama['name']} at "
            f"n-max {llama['k_star']}, {llama['speedup']:.2f}x plain decoding:",
            f"  llama-server: {llama['line']['fragment']}"]


def batch_lines(candidates: dict[str, Any]) -> list[str]:
    """Each candidate's k̂*(B) at the batch chain's batch sizes (with its own drafting time per round
    of the batch at k̂*, where stored), and vLLM's per-batch-size line."""
    lines = []
    headline = {c["name"]: c["answer"]["k_star"] for c in candidates.get("candidates", [])}
    for name, s in candidates.get("batch", {}).items():
        if "B" not in s:
            lines.append(f"At batch size B, {name}: no schedule ({s['unavailable']}).")
            continue
        steps = ", ".join(f"k = {x['k_star']} at B = {B} ({x['speedup']:.2f}x{drafting(x)})" for B, x in s["B"].items())
        lines.append(f"At batch size B ({s['version']} of the batch chain), {name}: {steps}.")
        one = s["B"].get("1")
        if one is not None and name in headline and one["k_star"] != headline[name]:
            lines.append(f"  At B = 1 this differs from the answer above (k = {headline[name]}): the batch chain times "
                         "its own, shorter prompts, and a small model's step times move with the context's depth.")
        if s.get("vllm") and s["vllm"]["speculate"]:
            lines.append(f"  vLLM: {s['vllm']['fragment']}")
    return lines


def drafting(at_batch: dict[str, Any]) -> str:
    """", drafting X ms a round": the candidate's own cost of a round of the batch at k̂* (none at k = 0)."""
    k, h = at_batch["k_star"], at_batch.get("h")
    return f", drafting {h[k] * 1e3:.2f} ms a round" if h and k > 0 else ""


def score_lines(score: dict[str, Any]) -> list[str]:
    """How the answer held on the held-out prompts, each figure beside its goal."""
    s = score["scores"]
    within = sum(x["within_one"] for x in s)
    lost = max(x["throughput_lost"] for x in s)
    err = max(abs(x["speedup_error"]) for x in s)
    named = score["named"] or "decode plainly"
    best = score["measured_best"] or "plain decoding"
    floors = [x["loss_floor"] for x in s if x.get("loss_floor") is not None]
    floor = f", the check's own noise charging its measured best k up to {max(floors):.1%}" if floors else ""
    return [f"Checked on the held-out prompts (out of sample), moespec's engine at every fixed k: k̂* within one of "
            f"the measured best for {within} of {len(s)} candidates; throughput lost at k̂* at most {lost:.1%} "
            f"(goal {LOST_GOAL:.0%}{floor}); predicted speedup off by at most {err:.1%} (goal {SPEEDUP_GOAL:.0%}). "
            f"The answer named {named} ({score['named_speedup']:.2f}x measured at its best k); {best} measured "
            f"best ({score['measured_best_speedup']:.2f}x): {'within' if score['named_ok'] else 'more than'} 2% "
            "(goal: within 2%)."] + moved_lines(s)


def moved_lines(scores: list[dict[str, Any]]) -> list[str]:
    """Where a candidate's k̂* missed and its tokens per round at the measured best k moved by over 10%
    between the halves: the acceptance did not carry from the calibration prompts to the held-out ones."""
    out = []
    for x in scores:
        e, m = x.get("predicted_tokens"), x.get("measured_tokens")
        if x["k_hat"] != x["k_best"] and e and m and abs(m / e - 1) > 0.10:
            out.append(f"{x['name']}: at k = {x['k_best']} the held-out prompts gave {m:.2f} tokens a round against "
                       f"{e:.2f} on the calibration half: its acceptance differs between your prompts, so more "
                       "(or more alike) prompts would steady its answer.")
    return out


def candidates_table(candidates: dict[str, Any], score: dict[str, Any] | None) -> Table:
    """One row per candidate: its acceptance at positions 1-3, its own cost at k = 1, k̂*, the
    predicted speedup, and (checked) the measured best k and the measured speedup at k̂*."""
    by = {x["name"]: x for x in (score or {}).get("scores", [])}
    rows = []
    for c in candidates["candidates"]:
        a, e = c["answer"], survival(c)
        alpha = [x / y if y else 0.0 for x, y in zip(e[1:], e[:-1])][:3]
        got = by.get(c["name"])
        rows.append([c["name"], " ".join(f"{x:.2f}" for x in alpha), f"{c['h'][1] * 1e3:.2f}" if len(c["h"]) > 1
                     else "-", a["k_star"], f"{a['speedup']:.2f}x",
                     got["k_best"] if got else "-", f"{got['measured_speedup']:.2f}x" if got else "-"])
    return Table("Table 10: your drafts, predicted from the calibration half and measured on the held-out half",
                 ["candidate", "α by position", "ĥ(1) ms", "k̂*", "predicted", "measured best k", "measured at k̂*"],
                 rows)


def survival(candidate: dict[str, Any]) -> list[float]:
    """Survival products of the positional acceptance, recovered from E(k): P(all of 1..k accepted)."""
    e = [float(x) for x in candidate["answer"]["expected"]]
    return [1.0] + [e[k] - e[k - 1] for k in range(1, len(e))]


def plot_candidates(candidates: dict[str, Any], score: dict[str, Any] | None, path: str | Path) -> Path:
    """Predicted speedup E(k) V̂(0)/V̂(k) per candidate and k (lines), the held-out measured speedup (dots)."""
    checks = {c["candidate"]["name"]: c for c in (score or {}).get("checks", [])}
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for i, c in enumerate(candidates["candidates"]):
        a = c["answer"]
        V, E = [float(x) for x in a["step_times"]], [float(x) for x in a["expected"]]
        ks = range(len(V))
        color = f"C{i % 10}"
        ax.plot(ks, [E[k] * V[0] / V[k] for k in ks], "-", color=color, label=f"{c['name']} predicted")
        if c["name"] in checks:
            ax.plot(ks, checks[c["name"]]["speedup"][: len(V)], "o", color=color, label=f"{c['name']} measured")
    ax.axhline(1.0, color="gray", lw=0.8, ls=":")
    ax.set_xlabel("draft length k")
    ax.set_ylabel("speedup over plain decoding")
    ax.legend(fontsize=7)
    return save(fig, path)


def met_word(g: dict[str, Any]) -> str:
    return "n/a" if not g["applies"] else ("met" if g["met"] else "NOT met")


def llama_check_lines(payload: dict[str, Any]) -> list[str]:
    """The summary's lines: per candidate llama.cpp's plain, emitted, defaults and best n-max tokens/s,
    and each goal beside its figure."""
    lines = [f"llama.cpp's own speculative decoding on {payload['prompts']} held-out prompts "
             f"({payload['new_tokens']} new tokens, {payload['reps']} rep(s), n-max 0..{payload['kmax']}):"]
    for c in payload["candidates"]:
        if c.get("skipped"):
            lines.append(f"  {c['name']}: not run ({c['skipped']})")
            continue
        g, plain = c["goals"], c["plain_tokens_per_s"]
        lines.append(f"  {c['name']}: plain {plain:.1f} tok/s; emitted (n-max {c['emitted_n_max']}) "
                     f"{c['emitted_tokens_per_s']:.1f} ({c['emitted_tokens_per_s'] / plain:.2f}x); defaults "
                     f"{c['defaults_tokens_per_s']:.1f} ({c['defaults_tokens_per_s'] / plain:.2f}x); best in "
                     f"hindsight n-max {c['best_n_max']} {c['best_tokens_per_s']:.1f} "
                     f"({c['best_tokens_per_s'] / plain:.2f}x)")
        lines.append(f"    emitted/best {g['emitted_vs_best']['value']:.2f} (goal >= {GOAL_BEST}: "
                     f"{met_word(g['emitted_vs_best'])}); emitted/defaults {g['emitted_vs_defaults']['value']:.2f} "
                     f"(goal >= {GOAL_DEFAULTS} where speculation pays: {met_word(g['emitted_vs_defaults'])}); "
                     f"emitted/plain {g['emitted_vs_plain']['value']:.2f} (goal >= {GOAL_PLAIN} where the answer "
                     f"pays: {met_word(g['emitted_vs_plain'])})")
    return lines
