"""The summary on a payload built by hand: its HTML tables, their verdict cells, and summary.txt's
text, which must hold the same rows."""

import html
import re
from html.parser import HTMLParser

from moespec.report.html import Section, render
from moespec.report.summary import as_text, goals, summary_blocks


def _version(**kw) -> dict:
    """A scored version on the grid a = 0.5, 0.7, 0.9; the measured figures are the same in every version."""
    s = dict(acceptance=[0.5, 0.7, 0.9], k_star_measured=[0, 1, 3], oracle_gap=[0.0, 0.04, -0.02],
             crossover_measured=3, tau_error=0.2, tau_error_in_sample=0.1, saving_error_beyond_interval=0.5,
             delta=0.123, resamples=0)
    s.update(kw)
    return s


def _run() -> dict:
    prediction = _version(
        k_star_predicted=[0, 3, 4], loss=[0.0, 0.08, 0.01], tau_error_dedup=0.12, tau_error_dedup_in_sample=0.04,
        loss_floor=0.06, resamples=100, k_within_one_interval=[1.0, 2.0], max_loss_interval=[0.05, 0.09],
        oracle_gap_interval=[0.02, 0.05],
        rules=[dict(name="crossover within one", threshold=1, value=2, passed=False)])
    calibrated = _version(
        k_star_predicted=[0, 1, 2], loss=[0.0, 0.0, 0.02], tau_error_dedup=0.07, tau_error_dedup_in_sample=0.05,
        loss_floor=0.01, tau_error=0.09, tau_error_in_sample=0.06, saving_error_beyond_interval=0.015, delta=0.04,
        rules=[dict(name="k* within one at >= 2 of 3 values", threshold=2, value=3, passed=True)])
    missing = {"measured-time": {"reason": "no-operation-times", "message": "the trace has <no> windows & more"}}
    return {
        "prediction": {"bounds_vacuous": False, "depths": [
            {"depth": 16, "versions": {"prediction": {"crossover": None}, "calibrated": {"crossover": 4}},
             "unavailable": missing}]},
        "score": {"depths": [{"depth": 16, "versions": {"prediction": prediction, "calibrated": calibrated},
                              "unavailable": dict(missing)}]},
        "measurement": {"oracle": [{"depth": 16, "plain": {"step_throughput": 100.0}, "cells": [
            {"k": 1, "a": 0.5, "step_throughput": 120.0}, {"k": 2, "a": 0.9, "step_throughput": 250.0},
            {"k": 1, "a": 0.9, "step_throughput": 180.0}]}]},
    }


class _Tables(HTMLParser):
    """{caption up to its colon: [rows of (class, text)]}, the header row first (class "th")."""

    def __init__(self):
        super().__init__()
        self.tables, self.caption, self.cell = {}, None, None

    def handle_starttag(self, tag, attrs):
        if tag == "caption":
            self.caption = ""
        elif tag == "tr":
            self.row = []
            self.tables[self.name].append(self.row)
        elif tag in ("td", "th"):
            self.cell = ["th" if tag == "th" else dict(attrs).get("class"), ""]

    def handle_endtag(self, tag):
        if tag == "caption":
            self.name, self.caption = self.caption.split(":")[0], None
            self.tables[self.name] = []
        elif tag in ("td", "th"):
            self.row.append(tuple(self.cell))
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell[1] += data
        elif self.caption is not None:
            self.caption += data


def _render(tmp_path):
    blocks = summary_blocks(_run())
    page = render("r", [Section("Summary", blocks)], tmp_path / "r.html").read_text()
    parser = _Tables()
    parser.feed(page)
    return page, parser.tables, as_text(blocks)


def test_goal_cells_carry_the_verdict_in_class_and_words_with_the_in_sample_error_beside(tmp_path):
    _, tables, _ = _render(tmp_path)
    header, pred, cal = tables["Fidelity goals"]
    assert [t for _, t in header][5:7] == ["verify-time error ≤ 10%, out of sample", "in-sample"]
    # prediction: |k̂* − k*| = 0, 2, 1 -> 2 of 3 within one (goal: 2); loss 8% > 5%; 12% > 10%; gap 4% <= 5%
    assert pred[:2] == [(None, "16"), (None, "prediction")]
    assert pred[2:] == [("pass", "2/3 met"), ("miss", "8.0% missed"), (None, "6.0%"), ("miss", "12.0% missed"),
                        (None, "4.0%"), ("pass", "4.0% met")]
    assert cal[2:] == [("pass", "3/3 met"), ("pass", "2.0% met"), (None, "1.0%"), ("pass", "7.0% met"),
                       (None, "5.0%"), ("pass", "4.0% met")]


def test_rules_crossover_staircase_measured_and_unavailable_tables(tmp_path):
    page, tables, _ = _render(tmp_path)

    def texts(name):
        return [[t for _, t in row] for row in tables[name][1:]]

    assert [row[-1] for row in tables["Table 8"][1:]] == [("miss", "failed"), ("pass", "passed")]
    assert texts("Crossover") == [["16", "prediction", "none", "3"], ["16", "calibrated", "4", "3"]]
    staircase = next(name for name in tables if name.startswith("Best draft length"))
    header = ["a", "k̂* prediction", "k̂* calibrated", "k* measured", "gap at k*"]
    assert [t for _, t in tables[staircase][0]] == header
    assert texts(staircase) == [["0.50", "0", "0", "0", "+0.0"], ["0.70", "3", "1", "1", "+4.0"],
                                ["0.90", "4", "2", "3", "-2.0"]]
    # best: 250/100 at k = 2; median factor over k* >= 1 only: 1 + median(4%, -2%) = 1.010 (with k* = 0's: 1.000)
    assert texts("Measured") == [["16", "2.500x at k = 2, a = 0.9", "1.010"]]
    assert texts("Other scored figures") == [["16", "prediction", "20.0%", "10.0%", "50.0%", "0.123"],
                                             ["16", "calibrated", "9.0%", "6.0%", "1.5%", "0.040"]]
    assert texts("Sweep noise") == [["16", "prediction", "100", "1 to 2", "5.0% to 9.0%", "2.0% to 5.0%"]]
    assert texts("Unavailable versions") == [
        ["16", "measured-time", "no-operation-times", "the trace has <no> windows & more"]]
    assert "&lt;no&gt; windows &amp; more" in page and "<no>" not in page
    assert "<pre" not in page


def test_summary_txt_holds_the_same_rows_as_the_tables(tmp_path):
    page, tables, text = _render(tmp_path)
    html_rows = [[t for _, t in row] for rows in tables.values() for row in rows]
    text_rows = [re.split(r" {2,}", line.strip()) for line in text.splitlines() if line.startswith("  ")]
    assert text_rows == html_rows and len(text_rows) == 22
    note = "d = 16, prediction: the loss goal is below this sweep's resolution: its loss floor is 6.0%"
    assert note in " ".join(text.split()) and html.escape(note) in page  # calibrated's floor, 1%, is under the goal
    assert "calibrated: the loss goal" not in text


def test_a_version_predicted_but_not_scored_is_listed_once_with_the_score_s_reason(tmp_path):
    why = {"reason": "no-operation-times", "message": "m"}
    run = {"prediction": {"depths": [{"depth": 8, "versions": {"calibrated": {"crossover": 4}},
                                      "unavailable": {"measured-time": why}}]},
           "score": {"depths": [{"depth": 8, "versions": {}, "unavailable": {
               "measured-time": why, "calibrated": {"reason": "no-sweep", "message": "no k = 3"}}}]}}
    parser = _Tables()
    parser.feed(render("r", [Section("s", summary_blocks(run))], tmp_path / "r.html").read_text())
    assert [[t for _, t in row] for row in parser.tables["Crossover"][1:]] == [["8", "calibrated", "4", "—"]]
    assert [[t for _, t in row] for row in parser.tables["Unavailable versions"][1:]] == [
        ["8", "measured-time", "no-operation-times", "m"], ["8", "calibrated", "no-sweep", "no k = 3"]]
    assert "Fidelity goals" not in parser.tables and "Table 8" not in parser.tables


def test_goals_take_the_verify_time_error_with_deduplication_on():
    A = 11
    s = dict(acceptance=[0.5] * A, k_star_predicted=[0] * 9 + [5, 8], k_star_measured=[0] * 9 + [3, 7],
             loss=[0.0] * 10 + [0.049], tau_error=0.15, tau_error_dedup=0.08, oracle_gap=[0.0] * 10 + [-0.06])
    g = goals(s)
    # 10 of 11 within one (one miss by two), loss 4.9%, the per-slot error left out (Table 7), gap 6%
    assert g == {"k_within_one": (10, True), "loss": (0.049, True), "tau": (0.08, True), "gap": (0.06, False)}
    s.update(tau_error_dedup=0.101, k_star_measured=[0] * 9 + [3, 5])
    g = goals(s)
    assert g["tau"] == (0.101, False) and g["k_within_one"] == (9, False)


def test_as_text_never_splits_a_settings_line_or_a_path():
    """Every start column of the fragment in a paragraph of 100-column lines: the fragment's tokens
    each stay whole on one line (textwrap's default would split `--spec-ngram-mod-n-max` at a hyphen),
    and no line passes 100 columns unless it is one token."""
    fragment = "--spec-type ngram-mod --spec-ngram-mod-n-match 2 --spec-ngram-mod-n-max 2 --spec-ngram-mod-n-min 1"
    path = "/root/.cache/moespec/candidates/a-draft-with-a-long-hyphenated-name-q8_0.gguf"
    for pad in range(0, 101):
        text = as_text(["x" * pad + " llama-server: " + fragment + " and " + path + " end."])
        lines = text.rstrip("\n").split("\n")
        words = text.split()
        for token in fragment.split() + [path]:
            assert token in words, (pad, token)
        assert all(len(line) <= 100 or len(line.split()) == 1 for line in lines), pad
