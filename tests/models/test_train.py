"""Training: seeded and deterministic, lowers the loss, and resumes from its checkpoint to the same weights."""

import dataclasses
import json
from pathlib import Path

import pytest

from moespec import texts as text
from moespec.models import train
from moespec.models.train import RECIPES

TINY = dataclasses.replace(RECIPES["tiny-moe"], steps=12, checkpoint_every=4, lr=1e-2)


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    root = tmp_path_factory.mktemp("stdlib")
    for i in range(40):
        (root / f"m{i}.py").write_text(f"import os\n\n\ndef function_{i}(path):\n    return os.path.join(path, '{i}')\n" * 8)
    return text.training_text(root)


def _run(out: Path, split, stop_at: int | None = None) -> tuple[dict, list[float]]:
    losses = []

    def on_step(step, bpb, tps):
        losses.append(bpb)
        if step == stop_at:
            raise KeyboardInterrupt

    return train.train("tiny-moe", out, r=TINY, split=split, threads=1, on_step=on_step), losses


def test_same_seed_same_weights_and_the_loss_falls(tmp_path, split):
    m1, l1 = _run(tmp_path / "a", split)
    m2, l2 = _run(tmp_path / "b", split)
    assert l1 == l2 and m1["files"] == m2["files"]
    assert sum(l1[-3:]) / 3 < sum(l1[:3]) / 3 - 0.5  # bits per byte, from ~8 at random init
    assert m1["tokens_seen"] == TINY.steps * TINY.batch * TINY.seq
    assert not (tmp_path / "a" / train.CHECKPOINT).exists()
    saved = json.loads((tmp_path / "a" / train.MANIFEST).read_text())
    assert saved["held_out_bits_per_byte"]["code"] > 0 and saved["recipe"]["steps"] == TINY.steps


def test_an_interrupted_run_resumes_to_the_same_weights(tmp_path, split):
    whole, losses = _run(tmp_path / "whole", split)
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path / "cut", split, stop_at=6)  # checkpointed at step 4: steps 5-6 are redone
    resumed, later = _run(tmp_path / "cut", split)
    assert resumed["files"] == whole["files"]
    assert later == losses[4:]


def test_a_checkpoint_of_another_recipe_is_refused(tmp_path, split):
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path / "x", split, stop_at=5)
    other = dataclasses.replace(TINY, lr=5e-3)
    with pytest.raises(ValueError, match="another recipe"):
        train.train("tiny-moe", tmp_path / "x", r=other, split=split, threads=1)


def test_unknown_recipe_names_the_known_ones():
    with pytest.raises(ValueError, match="olmoe"):
        train.recipe("gpt5")
