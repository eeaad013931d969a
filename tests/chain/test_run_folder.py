"""The one runner of a run folder (`chain.run_folder`): reuse, the peak memory each step records, one
open instance of the model at a time, restart and stale settings."""

import json

import pytest

from moespec import artifacts, run_files
from moespec.chain.run_folder import HELD, OWN, Held, Runner, Step, move_aside, settings_changed


class Model:
    """A stand-in for a llama.cpp model: counts the instances open at once."""

    open_now = 0
    most = 0

    def __init__(self):
        Model.open_now += 1
        Model.most = max(Model.most, Model.open_now)

    def close(self):
        Model.open_now -= 1


def write_json(path, kind="characterize", **_):
    artifacts.write(path, kind, {"x": 1})


def own_work(path):
    """A step that opens the file itself, as record_gguf_routing and the batch measurement do."""
    m = Model()
    try:
        write_json(path)
    finally:
        m.close()


def held_work(model, tokenizer, path):
    assert isinstance(model, Model) and tokenizer == "tok"
    write_json(path)


def test_each_step_records_its_peak_memory_in_its_artifact_and_in_memory_json(tmp_path):
    big = []

    def allocate(path):
        big.append(bytearray(64 << 20))  # 64 MiB of anonymous memory, touched
        write_json(path)

    runner = Runner(tmp_path, echo=lambda _: None)
    runner.run([Step("a", tmp_path / "a.json", allocate, dict(path=tmp_path / "a.json")),
                Step("b", tmp_path / "b.txt", lambda path: path.write_text("x"), dict(path=tmp_path / "b.txt"))])
    assert runner.ran == ["a", "b"]
    header = json.loads((tmp_path / "a.json").read_text())
    assert header["payload"] == {"x": 1}  # the old fields kept
    mem = header["memory"]
    assert mem["anon_bytes"] >= 64 << 20 and mem["file_bytes"] > 0
    steps = artifacts.load(tmp_path / run_files.MEMORY, "memory")["payload"]["steps"]
    assert set(steps) == {"a", "b"} and steps["b"]["artifact"] == "b.txt"
    assert steps["a"]["anon_bytes"] == mem["anon_bytes"]


def test_a_finished_artifact_is_reused_and_records_nothing_new(tmp_path):
    (tmp_path / "a.json").write_text("{}")
    lines = []
    runner = Runner(tmp_path, echo=lines.append)
    runner.run([Step("a", tmp_path / "a.json", write_json, dict(path=tmp_path / "a.json"))])
    assert runner.ran == [] and lines == [f"[a] reusing {tmp_path / 'a.json'}"]
    assert not (tmp_path / run_files.MEMORY).exists()


def test_the_chain_holds_one_instance_of_its_model_at_a_time(tmp_path):
    Model.open_now = Model.most = 0
    held = Held(lambda: (Model(), "tok"))
    p = tmp_path.joinpath
    steps = [Step("h1", p("h1.json"), held_work, dict(path=p("h1.json")), model=HELD),
             Step("h2", p("h2.json"), held_work, dict(path=p("h2.json")), model=HELD),
             Step("own", p("own.json"), own_work, dict(path=p("own.json")), model=OWN),
             Step("h3", p("h3.json"), held_work, dict(path=p("h3.json")), model=HELD)]
    Runner(tmp_path, echo=lambda _: None, held=held).run(steps)
    held.release()
    assert Model.most == 1  # the held model was closed before the step that opens its own
    assert Model.open_now == 0


def test_without_the_release_the_count_sees_two_instances(tmp_path):
    """The check above can fail: a step that opens the file while the chain holds it counts two."""
    Model.open_now = Model.most = 0
    held = Held(lambda: (Model(), "tok"))
    held.loaded()
    own_work(tmp_path / "x.json")
    assert Model.most == 2
    held.release()


def test_a_step_reading_a_missing_artifact_is_refused(tmp_path):
    step = Step("p", tmp_path / "p.json", write_json, dict(path=tmp_path / "p.json"), reads=(tmp_path / "m.json",))
    with pytest.raises(FileNotFoundError, match="m.json"):
        Runner(tmp_path, echo=lambda _: None).run([step])
    with pytest.raises(ValueError, match="model="):
        Step("p", tmp_path / "p.json", write_json, model="mine")


def test_restart_moves_files_aside_and_stale_settings_name_what_differs(tmp_path):
    (tmp_path / "a.json").write_text("1")
    (tmp_path / "b.json.old").write_text("2")
    lines = []
    assert move_aside([tmp_path / "a.json", tmp_path / "b.json.old", tmp_path / "c"], lines.append, tmp_path) == 1
    assert (tmp_path / "a.json.old").read_text() == "1" and lines == [f"[restart] moved 1 file(s) of {tmp_path} to *.old"]
    assert settings_changed({"reps": 6, "ns": [1, 2]}, {"reps": 8, "ns": range(1, 3), "new": 1}) == "reps 6, this run 8"
    assert settings_changed({}, {"new": 1}, missing_differs=True) == "new None, this run 1"


def test_a_folder_one_chain_holds_refuses_a_second_and_an_interrupt_says_how_to_resume(tmp_path):
    """A second `demo` in the same folder died on the first one's .partial file, naming nothing; a
    SIGINT ended a demo with no word on resuming."""
    import subprocess
    import sys

    from typer.testing import CliRunner

    from moespec.chain.run_folder import holding
    from moespec.cli.main import app

    said = []
    with holding(tmp_path, "moespec demo --out-dir X", said.append):
        with pytest.raises(ValueError, match=f"another moespec run is working in {tmp_path}.*another --out-dir"):
            with holding(tmp_path, "moespec demo --out-dir X"):
                pass
    with pytest.raises(KeyboardInterrupt):
        with holding(tmp_path, "moespec demo --out-dir X", said.append):
            raise KeyboardInterrupt
    assert "interrupted: the finished steps are kept" in said[-1] and "run `moespec demo --out-dir X` again" in said[-1]
    with holding(tmp_path, "moespec demo --out-dir X"):  # released after the interrupt
        pass
    # another process holding the folder: the CLI refuses before any step, naming it
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys; from pathlib import Path; from moespec.chain.run_folder import holding\n"
        f"with holding(Path({str(tmp_path)!r}), 'x'):\n    print('held', flush=True); sys.stdin.readline()")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = CliRunner(env={"COLUMNS": "300"}).invoke(app, ["demo", "--smoke", "--out-dir", str(tmp_path)])
    finally:
        holder.communicate("\n", timeout=60)
    words = " ".join(r.output.replace("│", " ").split())
    assert r.exit_code == 2 and f"another moespec run is working in {tmp_path}" in words and "Traceback" not in words
    assert not (tmp_path / run_files.TRACES).exists()


def test_a_child_made_from_another_parent_is_made_again(tmp_path):
    """A child artifact names its parents' digests; replacing a parent makes the child stale: the runner
    makes it again (it used to reuse a score paired with another prediction)."""
    parent, child = tmp_path / "a.json", tmp_path / "b.json"
    made = []

    def make_child(path):
        made.append(artifacts.load(parent, "characterize")["payload"]["x"])
        write_json(path)

    def steps():
        return [Step("a", parent, write_json, {"path": parent}),
                Step("b", child, make_child, {"path": child}, reads=(parent,))]

    said = []
    Runner(tmp_path, said.append).run(steps())
    assert artifacts.changed_parents(child) == [] and made == [1]
    assert json.loads(child.read_text())["parents"] == {"a.json": artifacts.file_digest(parent)}
    Runner(tmp_path, said.append).run(steps())
    assert made == [1] and "[b] reusing" in said[-1]
    artifacts.write(parent, "characterize", {"x": 2})  # another parent in the folder
    assert artifacts.changed_parents(child) == ["a.json"]
    Runner(tmp_path, said.append).run(steps())
    assert made == [1, 2] and any("b.json was made from another a.json: making it again" in s for s in said)
    assert (tmp_path / ("b.json" + run_files.OLD)).exists() and artifacts.changed_parents(child) == []
