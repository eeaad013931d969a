"""chain.prediction.predicted_step_times: the one reader of V(k) from a predict artifact, for
`moespec settings` (a named version must be there) and `generate --step-times-from` (falls back)."""

import pytest

from moespec import artifacts
from moespec.chain.step_times import StepTimesNotFound, predicted_step_times, seed_step_times

V = [0.010, 0.011, 0.013, 0.016]


def _prediction(path):
    versions = {"prediction": {"V": {"slot": [0.01, 0.02, 0.03, 0.04], "dedup": V, "auto": V}}}
    unavailable = {"calibrated": {"reason": "no-outside", "message": "the base measurement has no o(n)"}}
    return artifacts.write(path, "predict", {"depths": [{"depth": 512, "versions": versions,
                                                          "unavailable": unavailable}]})


def test_the_preferred_available_version_at_the_first_depth(tmp_path):
    read = predicted_step_times(_prediction(tmp_path / "p.json"), kernel="dedup")
    assert (read.V, read.version, read.depth) == (V, "prediction", 512)


def test_max_k_keeps_the_first_step_times_and_agrees_with_seed_step_times(tmp_path):
    pred = _prediction(tmp_path / "p.json")
    read = predicted_step_times(pred, kernel="auto", version="calibrated", fallback=True, max_k=2)
    assert read.V == V[:3] == seed_step_times(pred, max_k=2)
    with pytest.raises(StepTimesNotFound, match="--max-k 3") as e:
        predicted_step_times(pred, kernel="auto", max_k=4)
    assert e.value.argument == "max_k"


@pytest.mark.parametrize("kw, argument, text", [
    (dict(version="calibrated"), "version", "no o(n)"),
    (dict(kernel="fused"), "kernel", "'fused' is not in the 'prediction' version"),
    (dict(depth=4096), "depth", "[512], not 4096"),
])
def test_each_miss_names_what_to_change(tmp_path, kw, argument, text):
    with pytest.raises(StepTimesNotFound) as e:
        predicted_step_times(_prediction(tmp_path / "p.json"), **{"kernel": "dedup", **kw})
    assert e.value.argument == argument and text in str(e.value)
    assert isinstance(e.value, ValueError)


def test_a_missing_or_empty_artifact(tmp_path):
    with pytest.raises(StepTimesNotFound, match="no predict artifact") as e:
        predicted_step_times(tmp_path / "none.json", kernel="dedup")
    assert e.value.argument == "path"
    empty = artifacts.write(tmp_path / "empty.json", "predict", {"depths": []})
    with pytest.raises(StepTimesNotFound, match="empty.json: depths is empty"):  # the schema names file and field
        predicted_step_times(empty, kernel="dedup")
