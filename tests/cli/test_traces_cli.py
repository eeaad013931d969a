"""moespec trace and moespec reuse through typer's CliRunner."""

import json

import pytest
import typer
from typer.testing import CliRunner

from moespec import artifacts
from moespec.cli.main import app
from moespec.cli.options import parse_n_range
from moespec.moe.traces import RoutingTrace

runner = CliRunner()


def test_trace_then_reuse(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("first document about routers and experts.\n\f\nsecond one, a little longer than the first.\n")
    out = tmp_path / "t.parquet"
    r = runner.invoke(app, ["trace", "--model", "synthetic:mixtral-tiny", "--corpus", str(corpus),
                            "--max-tokens", "60", "--out", str(out), "--chunk", "32"])
    assert r.exit_code == 0, r.output
    trace = RoutingTrace.load(out)
    assert trace.num_tokens == 60 and trace.doc_ids == ("c:0", "c:1")
    assert trace.model == "synthetic:mixtral-tiny" and trace.corpus == (str(corpus),)

    js, png = tmp_path / "reuse.json", tmp_path / "reuse.png"
    r = runner.invoke(app, ["reuse", str(out), "--n", "1..5", "--out", str(js), "--figure", str(png),
                            "--resamples", "50"])
    assert r.exit_code == 0, r.output
    assert "U/(nm)" in r.output
    payload = artifacts.load(js, "reuse")["payload"]
    assert payload["n_range"] == [1, 5] and payload["analysis"]["n"] == [1, 2, 3, 4, 5]
    assert payload["analysis"]["rho_mean"]["value"][0] == 0.0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.dumps(payload)


def test_trace_uses_the_default_corpus(tmp_path):
    out = tmp_path / "t.parquet"
    r = runner.invoke(app, ["trace", "--model", "synthetic:olmoe-tiny", "--max-tokens", "40", "--out", str(out)])
    assert r.exit_code == 0, r.output
    trace = RoutingTrace.load(out)
    assert trace.num_tokens == 40 and trace.corpus == ("moespec:data/corpus",)


def test_reuse_reports_a_damaged_file(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    r = runner.invoke(app, ["reuse", str(bad)])
    assert r.exit_code == 2 and r.output.startswith(f"error: {bad} ") and "corrupt" in r.output, r.output


def test_parse_n_range():
    assert parse_n_range("1..9") == (1, 9) and parse_n_range("4") == (1, 4) and parse_n_range("2..3") == (2, 3)
    for bad in ("0..3", "5..2", "a..b"):
        with pytest.raises(typer.BadParameter):
            parse_n_range(bad)
