"""`moespec theory` through typer's CliRunner."""

import json

from typer.testing import CliRunner

from moespec.cli.main import app

runner = CliRunner()


def test_theory_prints_staircase_and_best_lengths(tmp_path):
    out = tmp_path / "theory.json"
    result = runner.invoke(
        app, ["theory", "--step-times", "10,11,13,16,20", "--acceptance", "0.5", "-a", "9/10", "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    for text in ("staircase", "step points", "a0 = V(1)/V(0) - 1 = 0.1", "best draft length"):
        assert text in result.output
    payload = json.loads(out.read_text())["payload"]
    assert payload["first_draft_threshold"] == 0.1
    assert [p["k_star"] for p in payload["at"]] == [1, 3]
    assert payload["at"][0]["speedup"] == 1.5 * 10 / 11
    assert [s["k"] for s in payload["stairs"]] == [0, 1, 2, 3]
    assert payload["step_points"][-1] == 1  # k = 4 is never best


def test_theory_jump_example():
    result = runner.invoke(app, ["theory", "--step-times", "1,2,2", "-a", "0.5", "-a", "0.9"])
    assert result.exit_code == 0, result.output
    assert "0.618034" in result.output


def test_theory_rejects_bad_input():
    for args, text in [
        (["--step-times", "1,0"], "V[1] = 0"),
        (["--step-times", "1,2", "-a", "1"], "outside [0, 1)"),
        (["--step-times", "1,x"], "not a number"),
    ]:
        result = runner.invoke(app, ["theory", *args])
        assert result.exit_code != 0
        assert text in result.output, result.output


def test_step_times_past_the_longest_draft_are_refused_at_once():
    """200 step times ran past a minute in the step points (O(kmax^3)); they are refused before any work."""
    import time

    from moespec.cli.options import MAX_K

    times = ",".join(str(10 + k) for k in range(200))
    for command in (["theory", "--step-times", times], ["settings", "--step-times", times, "-a", "0.5"]):
        start = time.perf_counter()
        result = runner.invoke(app, command)
        words = " ".join(result.output.replace("│", " ").split())  # the error box, unwrapped
        assert result.exit_code == 2 and f"kmax = 199, above the {MAX_K} this calculator takes" in words, words
        assert time.perf_counter() - start < 10  # the refusal, not the calculation (which took > 60 s)
    ok = runner.invoke(app, ["theory", "--step-times", ",".join(str(10 + k) for k in range(MAX_K + 1))])
    assert ok.exit_code == 0, ok.output
