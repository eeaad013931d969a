"""The batch measurement (`bench.batch_measure`) on trained:olmoe's q8_0 export at smoke settings:
what it holds per batch size, h_B from the rounds' own split, and an interrupted run resuming."""

import pytest

from moespec import artifacts
from moespec.bench.batch_measure import KIND, measure_batch, timed_step_times


class Stop(Exception):
    pass


@pytest.fixture(scope="module")
def setup(gguf_files):
    from moespec.texts import batch_prompt_ids
    from moespec.models.specs import load

    path = gguf_files["olmoe-q8_0"]
    _, tok = load(str(path), backend="llama.cpp", threads=1)
    return path, batch_prompt_ids(tok, 16, 2), len(tok)


def _measure(setup, out, progress=None):
    path, prompts, limit = setup
    return measure_batch(path, prompts, sizes=[1, 2], max_k=2, acceptances=[0.5, 0.9], new_tokens=8, reps=1,
                         threads=1, vocab_limit=limit, out=out, progress=progress)


def test_an_interrupted_measurement_keeps_finished_sizes_and_resumes(setup, tmp_path):
    out = tmp_path / "m.json"

    def stop_at_two(label, done, total):
        if label == "B = 2":
            raise Stop

    with pytest.raises(Stop):
        _measure(setup, out, stop_at_two)
    kept = artifacts.load(out, KIND)["payload"]
    assert list(kept["by_batch"]) == ["1"]  # B = 1 was written before B = 2 began
    seen = []
    full = _measure(setup, out, lambda label, d, t: seen.append(label))
    assert set(seen) == {"B = 2"}  # B = 1 was not measured again...
    assert full["by_batch"]["1"] == kept["by_batch"]["1"]  # ...but read back
    assert sorted(full["by_batch"]) == ["1", "2"]


def test_each_batch_size_holds_passes_h_and_the_sweep(setup, tmp_path):
    got = _measure(setup, tmp_path / "m.json")
    for B, row in got["by_batch"].items():
        assert {int(n) for n in row["tau"]} == {1, 2, 3}
        assert len(row["h"]) == 3 and all(h >= 0 for h in row["h"])  # 0 at k = 0: plain rounds run compiled
        assert row["plain_pass"]["median"] > 0 and len(row["plain_pass"]["samples"]) >= 8 - 1
        assert set(row["sweep"]["T"]) == {0.5, 0.9} and all(len(T) == 3 for T in row["sweep"]["T"].values())
    # timed: each measured pass plus h at that k
    V = timed_step_times(got)
    tau1 = {int(n): t["median"] for n, t in got["by_batch"]["2"]["tau"].items()}
    assert V[2] == pytest.approx([tau1[k + 1] + got["by_batch"]["2"]["h"][k] for k in range(3)])
    # the settings are recorded, and another setting starts the measurement over
    assert got["sizes"] == [1, 2] and got["max_k"] == 2 and got["depth"] == 16 + 8 // 2
