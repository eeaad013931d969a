"""The warm start's store under concurrent writers and with a damaged entry (`engine.step_store`):
eight processes that each write their own keys at once lose none of them, and one malformed entry is
dropped alone, with a warning naming it, the others kept."""

import json
import multiprocessing as mp

import pytest

from moespec.engine import step_store
from moespec.engine.policy import Learned

PROCESSES, KEYS_EACH, TRIALS = 8, 6, 3  # 48 keys per trial, below MAX_ENTRIES (64), so every one is kept


def _writer(path: str, worker: int, start) -> None:
    import os

    os.environ["MOESPEC_STEP_TIMES"] = path
    start.wait()
    for j in range(KEYS_EACH):
        step_store.remember({"worker": worker, "key": j}, Learned({0: 1e-3, 2: 2e-3}, {0: 4, 2: 4}, (0.5, 0.4)))


@pytest.mark.parametrize("trial", range(TRIALS))
def test_concurrent_writers_lose_no_entry(tmp_path, trial):
    path = tmp_path / "step-times.json"
    ctx = mp.get_context("fork")
    start = ctx.Barrier(PROCESSES)
    procs = [ctx.Process(target=_writer, args=(str(path), w, start)) for w in range(PROCESSES)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    keys = {json.dumps(e["key"], sort_keys=True) for e in json.loads(path.read_text())["entries"].values()}
    assert len(keys) == PROCESSES * KEYS_EACH


def test_a_malformed_entry_is_dropped_alone(tmp_path, monkeypatch):
    path = tmp_path / "step-times.json"
    monkeypatch.setenv("MOESPEC_STEP_TIMES", str(path))
    for j in range(3):
        step_store.remember({"key": j}, Learned({0: 1e-3, 1: 2e-3}, {0: 4, 1: 4}, (0.5,)))
    doc = json.loads(path.read_text())
    broken = sorted(doc["entries"])[1]
    doc["entries"][broken]["measured"]["1"] = "x"  # one edited field
    path.write_text(json.dumps(doc))
    with pytest.warns(UserWarning, match=f"dropping 1 malformed entry.*{broken}.*other 2 are kept"):
        entries = step_store.read_store(path)
    assert sorted(entries) == sorted(set(doc["entries"]) - {broken})
    assert step_store.recall({"key": 0}, 2) is not None or step_store.recall({"key": 2}, 2) is not None
