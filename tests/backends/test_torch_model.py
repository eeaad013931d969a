"""KV-consistency battery (engine paper Sec. 4): after random extend/truncate sequences, a cached
model's logits equal a fresh forward of the same tokens, for every synthetic *-tiny preset.

Tolerance: max abs difference <= 1e-4 on float32 CPU logits (observed ~1e-6; batching a different
number of positions only reorders float32 sums).
"""

import pytest
import torch

from moespec.backends.torch_model import CachedModel
from moespec.models import synthetic

TINY = [n for n in synthetic.preset_names() if n.endswith("-tiny")]
TOL = 1e-4


@pytest.mark.parametrize("name", TINY)
def test_random_extend_truncate_matches_fresh_forward(name):
    model, _ = synthetic.build(name, seed=0)
    cached = CachedModel(model)
    g = torch.Generator().manual_seed(len(name))
    tokens = torch.zeros(0, dtype=torch.long)
    for step in range(8):
        if step % 3 == 2 and cached.length > 1:
            n = int(torch.randint(0, cached.length, (1,), generator=g))
            cached.truncate(n)
            tokens = tokens[:n]
            assert cached.length == n
            continue
        new = torch.randint(0, 259, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g)
        logits = cached.extend(new)
        tokens = torch.cat((tokens, new))
        assert cached.length == tokens.shape[0]
        with torch.inference_mode():
            fresh = model(input_ids=tokens[None]).logits[0, -new.shape[0]:].float()
        assert logits.dtype == torch.float32 and logits.shape == (new.shape[0], cached.width)
        assert (logits - fresh).abs().max().item() <= TOL, (name, step)


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
