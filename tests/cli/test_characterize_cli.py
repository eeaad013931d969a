"""`moespec characterize` end to end on olmoe-tiny: artifact, table, figure, resumption."""

import json

import numpy as np
from typer.testing import CliRunner

import moespec.cli.characterize  # noqa: F401  (registers the command until cli/main imports it)
from moespec.artifacts import load
from moespec.cli.main import app
from moespec.moe.experts import expert_bytes, find_experts
from moespec.models.synthetic import build
from moespec.moe.synthetic_routing import sticky
from moespec.moe.traces import RoutingTrace


def olmoe_tiny_trace(path):
    model, _ = build("olmoe-tiny")
    w = [expert_bytes(e) for e in find_experts(model)]
    rng = np.random.default_rng(0)
    docs = [sticky(24, len(w), 4, 16, 0.4, rng) for _ in range(2)]
    return RoutingTrace(documents=docs, num_experts=16, expert_bytes=w, model="synthetic:olmoe-tiny").save(path)


def test_characterize_cli_writes_artifact_figure_and_resumes(tmp_path):
    traces = olmoe_tiny_trace(tmp_path / "traces.parquet")
    out = tmp_path / "char.json"
    args = ["characterize", "--model", "synthetic:olmoe-tiny", "--traces", str(traces), "--layers", "0,mid",
            "--n", "1..3", "--reps", "1", "--u-points", "2", "--windows", "2", "--flush-mib", "1", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "crossover:" in result.output and "characterization of" in result.output
    payload = load(out, "characterize")["payload"]
    assert "crossover" in payload and (payload["crossover"] is None or payload["crossover"] >= 2)
    assert payload["layers"] == [0, 1]
    assert set(payload["fits"]["0"]) == {"slot", "dedup"}
    assert set(payload["beta"]) == {"slot", "dedup"} and set(payload["r"]) == {"1", "2", "3"}
    assert all(len(p["timing"]["samples"]) == 1 for p in payload["points"])
    assert (tmp_path / "char.png").stat().st_size > 0
    log = tmp_path / "char.json.points.jsonl"
    lines = log.read_text().splitlines()
    header = json.loads(lines[0])["provenance"]  # the header: what the points depend on beyond their keys
    assert header == payload["provenance"] and header["model"] == "synthetic:olmoe-tiny" and header["trace"]
    assert len(lines) == 1 + len(payload["points"])

    # A rerun measures nothing new: every sample is read back from the log.
    rerun = CliRunner().invoke(app, args)
    assert rerun.exit_code == 0, rerun.output
    assert "resuming" in rerun.output
    assert log.read_text().splitlines() == lines
    assert json.loads(out.read_text())["payload"]["points"] == payload["points"]

    # More reps keep the logged sample of each point and add two.
    more = CliRunner().invoke(app, args[:-6] + ["--reps", "3"] + args[-6:])
    assert more.exit_code == 0, more.output
    assert log.read_text().splitlines()[: len(lines)] == lines
    again = json.loads(out.read_text())["payload"]
    assert len(log.read_text().splitlines()) == 1 + 3 * len(payload["points"])
    for old, new in zip(payload["points"], again["points"]):
        assert new["timing"]["samples"][0] == old["timing"]["samples"][0] and len(new["timing"]["samples"]) == 3


def test_characterize_cli_rejects_bad_ranges(tmp_path):
    result = CliRunner().invoke(app, ["characterize", "--model", "synthetic:olmoe-tiny", "--traces",
                                      str(tmp_path / "t.parquet"), "--n", "0..3"])
    assert result.exit_code != 0
    assert "--n needs" in result.output


def test_trace_verified_then_characterize_times_the_verified_windows(tmp_path):
    verified = tmp_path / "verified.parquet"
    made = CliRunner().invoke(app, ["trace-verified", "--model", "synthetic:olmoe-tiny", "--depth", "16",
                                    "--prompts", "2", "--n-max", "3", "--out", str(verified)])
    assert made.exit_code == 0, made.output
    windows = RoutingTrace.load(verified)
    # the continuation 3 verify repetitions (the default), 3 tokens apart, read with passes up to 3: 2 * 3 + 3
    assert windows.doc_ids == ("d16/p0", "d16/p1") and [d.shape[0] for d in windows.documents] == [9, 9]

    traces = olmoe_tiny_trace(tmp_path / "traces.parquet")
    out = tmp_path / "char.json"
    result = CliRunner().invoke(app, [
        "characterize", "--model", "synthetic:olmoe-tiny", "--traces", str(traces), "--layers", "0", "--n", "1..3",
        "--reps", "1", "--u-points", "2", "--windows", "2", "--flush-mib", "1", "--verified", str(verified),
        "--verified-reps", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    payload = load(out, "characterize")["payload"]
    points = [p for p in payload["points"] if p["source"] == "verified"]
    # 2 windows x n = 1..3 x 2 kernels, each with the routing of the window's first n tokens of layer 0
    assert len(points) == 12 and all(len(p["timing"]["samples"]) == 2 for p in points)
    for p in points:
        doc = windows.documents[windows.doc_ids.index(p["placement"])]
        assert p["ids"] == doc[: p["n"], 0].tolist()
    # the fits and eps see only the chosen and recorded passes: without the windows' points, the same
    from moespec.bench.characterize import summarize

    others = [p for p in payload["points"] if p["source"] != "verified"]
    again = json.loads(json.dumps(summarize(others, RoutingTrace.load(traces), [0], [1, 2, 3])))
    assert again["fits"] == payload["fits"] and again["eps"] == payload["eps"]
    assert payload["settings"]["verified_reps"] == 2 and payload["verified"]["documents"] == ["d16/p0", "d16/p1"]


def unnamed_trace(path):
    """A trace of 16 experts, top-4, 2 layers of olmoe-tiny's expert bytes, naming no model: any model of
    that shape (olmoe-tiny, qwen3moe-tiny) may be characterized on it."""
    model, _ = build("olmoe-tiny")
    w = [expert_bytes(e) for e in find_experts(model)]
    docs = [sticky(24, len(w), 4, 16, 0.4, np.random.default_rng(0)) for _ in range(2)]
    return RoutingTrace(documents=docs, num_experts=16, expert_bytes=w).save(path)


def test_a_rerun_of_another_model_or_dtype_refuses_the_point_log_until_restart(tmp_path):
    traces = unnamed_trace(tmp_path / "traces.parquet")
    out = tmp_path / "char.json"
    log = tmp_path / "char.json.points.jsonl"
    args = ["characterize", "--traces", str(traces), "--layers", "0", "--n", "1..3", "--reps", "1", "--u-points",
            "2", "--windows", "1", "--flush-mib", "1", "--out", str(out)]
    first = CliRunner().invoke(app, args + ["--model", "synthetic:olmoe-tiny"])
    assert first.exit_code == 0, first.output
    before = log.read_bytes()
    changes = {  # a rerun's options -> what the refusal names
        ("--model", "synthetic:qwen3moe-tiny"): 'model: expected "synthetic:qwen3moe-tiny", found "synthetic:olmoe-tiny"',
        ("--model", "synthetic:olmoe-tiny", "--dtype", "bfloat16"): 'dtype: expected "bfloat16", found "float32"',
    }
    for change, field in changes.items():
        refused = CliRunner().invoke(app, args + list(change))
        flat = " ".join(refused.output.replace("│", " ").split())  # the error box wraps long lines
        assert refused.exit_code == 2 and field in flat and "--restart" in flat, refused.output
        assert log.read_bytes() == before and load(out, "characterize")["payload"]["model"] == "synthetic:olmoe-tiny"
    again = CliRunner().invoke(app, args + ["--model", "synthetic:qwen3moe-tiny", "--restart"])
    assert again.exit_code == 0, again.output
    assert load(out, "characterize")["payload"]["provenance"]["model"] == "synthetic:qwen3moe-tiny"
    assert (tmp_path / "char.json.points.jsonl.old").read_bytes() == before


def test_characterize_refuses_a_trace_of_another_model(tmp_path):
    traces = olmoe_tiny_trace(tmp_path / "traces.parquet")  # names synthetic:olmoe-tiny: 16 experts, top-4
    result = CliRunner().invoke(app, ["characterize", "--model", "synthetic:mixtral-tiny", "--traces", str(traces),
                                      "--out", str(tmp_path / "c.json")])
    flat = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2 and "num_experts:" in flat and "top_k:" in flat and "moespec trace" in flat
    assert not (tmp_path / "c.json.points.jsonl").exists()


def test_a_pass_longer_than_every_trace_document_is_refused_before_any_work(tmp_path, monkeypatch):
    """--n 2..5000 on a trace of 24-token documents built passes for 100 s before its check."""
    import moespec.cli.characterize as command

    traces = olmoe_tiny_trace(tmp_path / "traces.parquet")
    monkeypatch.setattr(command, "run_characterize", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    result = CliRunner(env={"COLUMNS": "300"}).invoke(app, ["characterize", "--model", "synthetic:olmoe-tiny",
                                                            "--traces", str(traces), "--n", "2..5000"])
    words = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2 and "n = 5000, is longer than the trace's longest document (24 tokens" in words, words


def test_a_trained_preset_is_a_model_here_as_in_measure(tmp_path):
    """`characterize --model trained:olmoe` said it was no model though `measure` takes it; now it loads,
    and a trace of another model is what stops it (the lineage check names both)."""
    traces = olmoe_tiny_trace(tmp_path / "traces.parquet")
    result = CliRunner(env={"COLUMNS": "300"}).invoke(app, ["characterize", "--model", "trained:olmoe", "--traces",
                                                            str(traces), "--n", "1..3"])
    assert result.exit_code != 0 and "is neither" not in result.output
    assert "trained:olmoe" in result.output and "synthetic:olmoe-tiny" in result.output, result.output
