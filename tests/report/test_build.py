"""build_report on a smoke run: self-contained HTML, every figure decodes, summary tables, summary.txt written."""

import base64
import io
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.image as mpimg
import pytest

from moespec.chain.demo import DemoConfig, run_demo
from moespec.report.build import build_report

# the module's fixture is built once: its tests run in one pytest-xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("build")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    run_demo(out, config=DemoConfig.smoke(), progress=False, echo=lambda _: None)
    return out


def test_report_is_self_contained_with_figures_1_to_6_and_tables(run, tmp_path):
    path = build_report(run, out=tmp_path / "r.html")
    text = path.read_text()
    assert not re.search(r"""(src|href)=["'](?!data:)""", text)
    uris = re.findall(r'src="data:image/png;base64,([^"]+)"', text)
    for i in range(1, 7):
        assert f"Figure {i}:" in text
    assert len(uris) == 6  # one depth: one of each figure
    for uri in uris:
        image = mpimg.imread(io.BytesIO(base64.b64decode(uri)), format="png")
        assert image.shape[0] > 100 and image.shape[1] > 100
    for t in ("Table 1:", "Table 3:", "Table 4:", "Table 7:", "Table 8:", "Fidelity goals:", "Crossover:"):
        assert t in text
    assert "<pre" not in text and re.search(r'<td class="(pass|miss)">[^<]* (met|missed)</td>', text)
    summary = (tmp_path / "summary.txt").read_text()
    assert "Fidelity goals:" in summary and "best measured speedup" in summary
    assert not re.search(r"</?[a-z]+[ >]", summary)  # plain text: no HTML tag leaks into summary.txt


def test_report_of_an_empty_folder_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="moespec demo"):
        build_report(tmp_path, out=tmp_path / "r.html")
