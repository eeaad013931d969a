"""KV-consistency battery (engine paper Sec. 4): after random extend/truncate sequences, a cached
model's logits equal a fresh forward of the same tokens, for every synthetic *-tiny preset.

Tolerance: max abs difference <= 1e-4 on float32 CPU logits (observed ~1e-6; batching a different
number of positions only reorders float32 sums).
"""

import pytest
import torch

from moespec.backends.torch_model import CachedModel
from moespec.models import synthetic
from tests.backends.conftest import kv_battery

TINY = [n for n in synthetic.preset_names() if n.endswith("-tiny")]
TOL = 1e-4


@pytest.mark.parametrize("name", TINY)
def test_random_extend_truncate_matches_fresh_forward(name):
    model, _ = synthetic.build(name, seed=0)

    def fresh(tokens, logits):
        with torch.inference_mode():
            again = model(input_ids=tokens[None]).logits[0, -logits.shape[0]:].float()
        assert (logits - again).abs().max().item() <= TOL, name

    assert kv_battery(CachedModel(model), fresh, steps=8, seed=len(name)) >= 5


def test_truncate_contract():
    model, _ = synthetic.build("dense-tiny", seed=0)
    cached = CachedModel(model)
    cached.extend(torch.arange(5))
    cached.truncate(9)  # longer than the cache: a no-op
    assert cached.length == 5
    with pytest.raises(ValueError, match="n >= 0"):
        cached.truncate(-1)
    with pytest.raises(ValueError, match="at least one token"):
        cached.extend(torch.zeros(0, dtype=torch.long))
    with pytest.raises(TypeError):
        CachedModel(object())


def test_sliding_window_past_its_window_cannot_roll_back():
    model, _ = synthetic.build("gptoss-tiny", seed=0, layer_types=["sliding_attention"] * 2, sliding_window=4)
    cached = CachedModel(model)
    cached.extend(torch.arange(10))
    with pytest.raises(ValueError, match="DynamicCache.*DynamicSlidingWindowLayer"):
        cached.truncate(7)


def test_a_prompt_and_budget_beyond_the_model_positions_are_refused_before_any_pass():
    """A torch model holds its config's max_position_embeddings (8192 for the synthetic presets); a
    budget past them was decoded until killed (max_new_tokens 10^9) or silently past the rope table."""
    from typer.testing import CliRunner

    from moespec.cli.main import app
    from moespec.engine.decode import generate
    from moespec.models import load

    model, _ = load("synthetic:olmoe-tiny")
    cached = CachedModel(model)
    assert cached.capacity == model.config.max_position_embeddings == 8192
    with pytest.raises(ValueError, match="context holds 8192 positions, but a 8000-token prompt, max_new_tokens=500"):
        generate(cached, list(range(1, 201)) * 40, max_new_tokens=500)
    assert cached.forward_s == 0.0  # refused before any pass
    r = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["generate", "--target", "synthetic:olmoe-tiny", "--prompt", "x",
                                                       "--max-new-tokens", "1000000000"])
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert r.exit_code != 0 and len(lines) == 1 and "context holds 8192 positions" in lines[0], r.output
