import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import moespec
from moespec.pointlog import PointLog, PointLogWarning, logged_point
from moespec.provenance import ProvenanceMismatch

PROV = {"model": "synthetic:olmoe-tiny", "fingerprint": "0123abcd", "dtype": "float32", "experts": "moespec_slot"}

# Appends N points through PointLog, then half a line with a raw write (what a kill mid-write
# leaves), says "ready" and waits to be killed.
WRITER = """
import os, sys, time
from moespec.pointlog import PointLog
path, n = sys.argv[1], int(sys.argv[2])
log = PointLog(path, {"model": "synthetic:olmoe-tiny", "fingerprint": "0123abcd", "dtype": "float32",
                      "experts": "moespec_slot"})
for i in range(n):
    log.append({"i": i}, [i, i * i])
fd = os.open(path, os.O_WRONLY | os.O_APPEND)
os.write(fd, b'{"key": "{\\\\"i\\\\": 99}", "value": [99, 98')
print("ready", flush=True)
time.sleep(120)
"""


def reopen(path, provenance=PROV, **kw):
    """PointLog(path), returning the log and the PointLogWarnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        log = PointLog(path, provenance, **kw)
    return log, [w for w in caught if issubclass(w.category, PointLogWarning)]


def test_writer_killed_mid_line_loses_nothing_already_written(tmp_path):
    path, n = tmp_path / "q.points.jsonl", 5
    src = str(Path(moespec.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(n)], stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout.readline() == b"ready\n"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert not path.read_bytes().endswith(b"\n")

    log, caught = reopen(path)
    assert len(caught) == 1 and "1 damaged line" in str(caught[0].message) and str(path) in str(caught[0].message)
    assert dict(log.items()) == {json.dumps({"i": i}): [i, i * i] for i in range(n)}
    log.append({"i": n}, [n, n * n])
    lines = path.read_bytes().split(b"\n")
    assert lines[-2] == b'{"key": "{\\"i\\": 5}", "value": [5, 25]}' and lines[-1] == b""

    again, caught = reopen(path)
    assert len(caught) == 1 and again.damaged == 1
    assert len(again) == n + 1 and again.get({"i": n}) == [n, n * n] and again.get({"i": 0}) == [0, 0]


def test_next_append_after_a_cut_tail_starts_on_a_fresh_line(tmp_path):
    path = tmp_path / "p.jsonl"
    PointLog(path, PROV).append("a", 1)
    with open(path, "ab") as f:
        f.write(b'{"key": "b", "val')
    log, _ = reopen(path)
    log.append("c", 3)
    log.append("d", 4)
    assert path.read_bytes().count(b"\n") == 5  # header, a, the ended fragment, c, d
    again, caught = reopen(path)
    assert dict(again.items()) == {"a": 1, "c": 3, "d": 4} and again.damaged == 1 and len(caught) == 1


def test_damaged_lines_are_skipped_counted_and_the_rest_kept(tmp_path):
    path = tmp_path / "p.jsonl"
    PointLog(path, PROV)
    with open(path, "ab") as f:
        f.write(b"\x00garbage\xff{{\n")  # the first point line
    log, _ = reopen(path)
    log.append("a", 1)
    with open(path, "ab") as f:
        f.write(b'{}\n{"key": "b"}\n[1, 2]\n"text"\n{"key": 7, "value": 1}\n')
    log.append("c", {"x": [1.5, None]})
    log.append("a", 2)

    log, caught = reopen(path)
    assert log.damaged == 6 and len(caught) == 1 and "6 damaged line(s)" in str(caught[0].message)
    assert dict(log.items()) == {"a": 2, "c": {"x": [1.5, None]}}  # a later duplicate wins
    assert not log.has("b") and "kept the other 2 points" in str(caught[0].message)


def test_an_intact_log_reads_without_warning(tmp_path):
    log = PointLog(tmp_path / "p.jsonl", PROV)
    log.append({"n": 1, "kernel": "dedup"}, 0.25)
    again, caught = reopen(tmp_path / "p.jsonl")
    assert caught == [] and again.damaged == 0 and again.get({"kernel": "dedup", "n": 1}) == 0.25


def test_another_provenance_is_refused_naming_both_values(tmp_path):
    path = tmp_path / "q.points.jsonl"
    PointLog(path, PROV).append("a", 1)
    other = {**PROV, "model": "synthetic:mixtral-tiny", "dtype": "bfloat16"}
    with pytest.raises(ProvenanceMismatch) as err:
        PointLog(path, other)
    message = str(err.value)
    assert 'model: expected "synthetic:mixtral-tiny", found "synthetic:olmoe-tiny"' in message
    assert 'dtype: expected "bfloat16", found "float32"' in message
    assert "--restart" in message and str(path) in message and "fingerprint" not in message
    assert isinstance(err.value, ValueError) and len(err.value.differences) == 2
    assert dict(PointLog(path, PROV).items()) == {"a": 1}  # refusing changed nothing


def test_a_new_option_in_the_provenance_is_a_mismatch(tmp_path):
    path = tmp_path / "q.points.jsonl"
    PointLog(path, PROV)
    with pytest.raises(ProvenanceMismatch, match=r"options\.reps: expected 5, found nothing"):
        PointLog(path, {**PROV, "options": {"reps": 5}})


def test_same_provenance_resumes_even_with_tuples_for_lists(tmp_path):
    path = tmp_path / "q.points.jsonl"
    PointLog(path, {**PROV, "ns": [1, 2]}).append("a", 1)
    assert dict(PointLog(path, {**PROV, "ns": (1, 2)}).items()) == {"a": 1}


def test_restart_starts_fresh_and_keeps_the_old_log_aside(tmp_path):
    path = tmp_path / "q.points.jsonl"
    PointLog(path, PROV).append("a", 1)
    old = path.with_name("q.points.jsonl.old")
    old.write_text("a previous old log\n")
    other = {**PROV, "model": "synthetic:mixtral-tiny"}
    log = PointLog(path, other, restart=True)
    assert len(log) == 0 and log.provenance == other
    log.append("b", 2)
    assert dict(PointLog(path, other).items()) == {"b": 2}
    assert dict(PointLog(old, PROV).items()) == {"a": 1}


def test_a_log_without_header_is_refused_unless_restart(tmp_path):
    path = tmp_path / "q.points.jsonl"
    path.write_text(json.dumps({"key": "a", "value": 1}) + "\n" + json.dumps({"key": "b", "value": 2}) + "\n")
    with pytest.raises(ProvenanceMismatch, match=r"(?s)no intact provenance header.*its 2 points.*--restart"):
        PointLog(path, PROV)
    assert PointLog(path, PROV, restart=True).provenance == PROV
    assert path.with_name("q.points.jsonl.old").read_text().count("\n") == 2


def test_a_damaged_header_is_refused(tmp_path):
    path = tmp_path / "q.points.jsonl"
    PointLog(path, PROV).append("a", 1)
    path.write_bytes(b"\x00" + path.read_bytes()[1:])
    with pytest.raises(ProvenanceMismatch, match="no intact provenance header"):
        PointLog(path, PROV)


def test_no_provenance_is_the_empty_one(tmp_path):
    path = tmp_path / "p.jsonl"
    PointLog(path).append("a", 1)
    assert dict(PointLog(path).items()) == {"a": 1}
    with pytest.raises(ProvenanceMismatch, match='model: expected "synthetic:olmoe-tiny", found nothing'):
        PointLog(path, PROV)


def test_logged_point_reads_back_instead_of_computing(tmp_path):
    calls, seen = [], []
    log = PointLog(tmp_path / "p.jsonl", PROV)
    compute = lambda: calls.append(1) or 0.5  # noqa: E731
    on_point = lambda key, resumed: seen.append(resumed)  # noqa: E731
    assert logged_point(log, {"n": 2}, compute, on_point) == 0.5
    again = PointLog(tmp_path / "p.jsonl", PROV)
    assert logged_point(again, {"n": 2}, compute, on_point) == 0.5
    assert logged_point(None, {"n": 3}, compute, None) == 0.5
    assert calls == [1, 1] and seen == [False, True]
