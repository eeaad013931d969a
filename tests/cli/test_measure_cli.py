"""moespec measure through typer's CliRunner on olmoe-tiny with tiny settings."""

from typer.testing import CliRunner

import moespec.cli.main  # noqa: F401  (registers the other commands, so `measure` is a subcommand)
import moespec.cli.measure  # noqa: F401  (registers the command)
from moespec import artifacts
from moespec.cli.app import app


def test_measure_writes_a_resumable_artifact(tmp_path):
    out = tmp_path / "m.json"
    args = ["measure", "--model", "synthetic:olmoe-tiny", "--depth", "16", "--prompts", "1", "--reps", "1",
            "--n-max", "2", "--scaling-n-max", "3", "--k", "0", "--k", "2", "--acceptance", "0.6", "--new-tokens", "8", "--no-flush",
            "--prompt-lookup", "2", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    payload = artifacts.load(out, "measure")["payload"]
    assert [v["depth"] for v in payload["verify"]] == [16]
    assert payload["verify"][0]["tau_meas_1"] > 0
    assert payload["scaling"][0]["ratio"]["1"] == 1.0
    assert [c["k"] for c in payload["oracle"][0]["cells"]] == [0, 2]
    assert payload["draft_sweep"][0]["draft"] == "prompt-lookup:2"
    points = out.with_name("m.points.jsonl")
    before = points.read_text()
    again = CliRunner().invoke(app, args)  # every point is in the log: nothing is measured again
    assert again.exit_code == 0, again.output
    assert points.read_text() == before


def test_measure_rejects_two_drafts(tmp_path):
    out = tmp_path / "m.json"
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["measure", "--model", "synthetic:olmoe-tiny", "--draft",
                                                            "synthetic:dense-tiny", "--prompt-lookup", "2", "--out",
                                                            str(out)])
    # a usage error (click's exit code 2, by SystemExit) that names the clash, not a crash
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), (result.exception, result.output)
    assert "Traceback" not in result.output
    assert "one draft" in result.output and "not both" in result.output, result.output
    assert not out.exists() and not list(tmp_path.iterdir())  # nothing measured, nothing written


def test_the_scaling_curve_is_read_from_the_verify_passes_that_hold_it(tmp_path):
    from moespec.bench.measure import measure

    seen = []
    out = tmp_path / "m.json"
    payload = measure("synthetic:olmoe-tiny", out=out, progress=False, depths=(16,), ns=(1, 2, 3), reps=2,
                      scaling_ns=(2, 3), ks=(0,), acceptances=(0.5,), new_tokens=2, flush=False,
                      on_point=lambda key, _: seen.append(key["part"]))
    assert "scaling" not in seen  # no pass timed twice
    curve, verify = payload["scaling"][0], payload["verify"][0]
    assert curve["kernel"] == "moespec_dedup" and sorted(curve["samples"]) == ["1", "2", "3"]
    for n in ("1", "2", "3"):
        assert curve["samples"][n] == verify["samples"]["moespec_dedup"][n]


def test_operation_between_the_passes_needs_layers_and_windows_together(tmp_path):
    import pytest

    from moespec.bench.measure import measure

    with pytest.raises(ValueError, match="needs both"):
        measure("synthetic:olmoe-tiny", out=tmp_path / "m.json", progress=False, op_layers=(0,))
    with pytest.raises(ValueError, match="needs both"):
        measure("synthetic:olmoe-tiny", out=tmp_path / "m.json", progress=False, verified=tmp_path / "v.parquet")
    assert not (tmp_path / "m.json").exists()


def test_measure_times_the_operation_between_the_passes_of_the_verified_windows(tmp_path):
    import moespec.cli.traces  # noqa: F401  (registers trace-verified)

    verified = tmp_path / "v.parquet"
    made = CliRunner().invoke(app, ["trace-verified", "--model", "synthetic:olmoe-tiny", "--depth", "16", "--prompts",
                                    "1", "--n-max", "2", "--out", str(verified)])
    assert made.exit_code == 0, made.output
    out = tmp_path / "m.json"
    args = ["measure", "--model", "synthetic:olmoe-tiny", "--depth", "16", "--prompts", "1", "--reps", "2",
            "--n-max", "2", "--scaling-n-max", "0", "--k", "0", "--acceptance", "0.6", "--new-tokens", "4",
            "--no-flush", "--verified", str(verified), "--op-layers", "mid", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    v = artifacts.load(out, "measure")["payload"]["verify"][0]
    assert v["op_layers"] == [1]  # olmoe-tiny has 2 MoE layers: "mid" is layer 1
    assert [len(s[0]) for s in v["ops"]["moespec_dedup"].values()] == [2, 2]  # [P, R, L]: 2 repetitions at n = 1, 2
    missing = CliRunner().invoke(app, args[:-4] + ["--verified", str(tmp_path / "none.parquet"), "--out", str(out)])
    flat = "".join(c for c in missing.output if not c.isspace() and c != "│")  # the error box wraps long paths
    assert missing.exit_code != 0 and "none.parquet" in flat


def test_a_negative_start_stride_names_the_value_and_the_fix(tmp_path):
    result = CliRunner().invoke(app, ["measure", "--model", "synthetic:olmoe-tiny", "--start-stride", "-3",
                                      "--out", str(tmp_path / "m.json")])
    assert result.exit_code != 0
    assert "oracle_start_stride" in result.output and "-3" in result.output


TINY = ["--depth", "16", "--prompts", "1", "--reps", "1", "--n-max", "2", "--scaling-n-max", "0", "--k", "0",
        "--acceptance", "0.6", "--new-tokens", "2", "--no-flush"]


def test_a_rerun_with_another_model_refuses_the_point_log_until_restart(tmp_path):
    import json

    out = tmp_path / "q.json"
    points = tmp_path / "q.points.jsonl"
    first = CliRunner().invoke(app, ["measure", "--model", "synthetic:olmoe-tiny", *TINY, "--out", str(out)])
    assert first.exit_code == 0, first.output
    before = points.read_bytes()
    other = ["measure", "--model", "synthetic:mixtral-tiny", *TINY, "--out", str(out)]
    refused = CliRunner().invoke(app, other)
    flat = " ".join(refused.output.replace("│", " ").split())  # the error box wraps long lines
    assert refused.exit_code == 2 and '"synthetic:mixtral-tiny", found "synthetic:olmoe-tiny"' in flat
    assert "--restart" in flat and points.read_bytes() == before  # nothing measured, nothing written
    assert artifacts.load(out, "measure")["payload"]["model"] == "synthetic:olmoe-tiny"

    again = CliRunner().invoke(app, other + ["--restart"])
    assert again.exit_code == 0, again.output
    payload = artifacts.load(out, "measure")["payload"]
    assert payload["provenance"]["model"] == "synthetic:mixtral-tiny" and payload["provenance"]["num_experts"] == 8
    assert json.loads(points.read_text().splitlines()[0])["provenance"]["model"] == "synthetic:mixtral-tiny"
    assert (tmp_path / "q.points.jsonl.old").read_bytes() == before  # the old log kept aside
    # every point of the new log was measured afresh for mixtral: as many as olmoe's
    assert len(points.read_bytes().splitlines()) == len(before.splitlines())


def test_the_base_measurement_holds_the_verify_times_and_h_and_shares_the_sweeps_log(tmp_path):
    base, sweep = tmp_path / "measurement-base.json", tmp_path / "measurement.json"
    log = tmp_path / "measurement.points.jsonl"
    common = ["measure", "--model", "synthetic:olmoe-tiny", *TINY[:8], "--k", "0", "--k", "1", "--new-tokens", "2",
              "--no-flush"]
    made = CliRunner().invoke(app, common + ["--base", "--points", str(log), "--out", str(base)])
    assert made.exit_code == 0, made.output
    payload = artifacts.load(base, "measure")["payload"]
    assert payload["oracle"] == [] and payload["h"]["16"].keys() == {"0", "1"} and payload["h_source"] == "oracle-probe"
    assert {c["a"] for c in payload["h_probe"][0]["cells"]} - {None} == {0.75}  # off the scored grid
    seen = []
    from moespec.bench.measure import measure

    measure("synthetic:olmoe-tiny", out=sweep, progress=False, depths=(16,), prompts=1, reps=1, ns=(1, 2),
            scaling_ns=(), ks=(0, 1), acceptances=(0.6,), new_tokens=2, flush=False,
            on_point=lambda key, resumed: seen.append((key["part"], resumed)))
    assert ("verify", True) in seen and ("verify", False) not in seen  # read back from the base's points
    refused = CliRunner().invoke(app, common + ["--base", "--acceptance", "0.5", "--out", str(base)])
    assert refused.exit_code == 2 and "--acceptance" in refused.output


def test_measure_refuses_the_verified_routing_of_another_model(tmp_path):
    import moespec.cli.traces  # noqa: F401  (registers trace-verified)

    verified = tmp_path / "v.parquet"
    made = CliRunner().invoke(app, ["trace-verified", "--model", "synthetic:mixtral-tiny", "--depth", "16",
                                    "--prompts", "1", "--n-max", "2", "--out", str(verified)])
    assert made.exit_code == 0, made.output
    result = CliRunner().invoke(app, ["measure", "--model", "synthetic:olmoe-tiny", *TINY, "--verified",
                                      str(verified), "--op-layers", "0", "--out", str(tmp_path / "m.json")])
    flat = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2 and "top_k: the model synthetic:olmoe-tiny has 4; the verified routing has 2" in flat
    assert not (tmp_path / "m.points.jsonl").exists()
