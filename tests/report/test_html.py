"""The HTML report is self-contained and its figures decode."""

import base64
import io
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import pytest

from moespec.report.html import Figure, Section, Table, Verdict, render


def _png() -> bytes:
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [1, 0])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def test_report_is_self_contained_and_figures_decode(tmp_path):
    sections = [
        Section("One", ["a <b>paragraph</b> with markup", Table("t", ["x", "y"], [[1, "pass"], [2, "fail"]])]),
        Section("Two", [Figure("a line", _png())]),
    ]
    path = render("Report & title", sections, tmp_path / "r.html")
    text = path.read_text()
    assert "<b>paragraph" not in text and "&lt;b&gt;paragraph" in text
    assert not re.search(r"""(src|href)=["'](?!data:)""", text)
    uris = re.findall(r'src="data:image/png;base64,([^"]+)"', text)
    assert len(uris) == 1
    image = mpimg.imread(io.BytesIO(base64.b64decode(uris[0])), format="png")
    assert image.shape[0] > 10 and image.shape[1] > 10


def test_verdict_cells_are_classed_by_their_verdict_and_plain_cells_are_not(tmp_path):
    rows = [[Verdict("3.0% met", True), Verdict("12.0% <missed>", False), "pass"]]
    text = render("r", [Section("s", [Table("t", ["a", "b", "c"], rows)])], tmp_path / "r.html").read_text()
    cells = re.findall(r"<td[^>]*>[^<]*</td>", text)
    assert cells == ['<td class="pass">3.0% met</td>', '<td class="miss">12.0% &lt;missed&gt;</td>', "<td>pass</td>"]


def test_non_png_figure_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not a PNG"):
        render("r", [Section("s", [Figure("bad", b"GIF89a")])], tmp_path / "r.html")
