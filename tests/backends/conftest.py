"""The KV-consistency battery every backend runs (engine paper Sec. 4)."""

from typing import Callable

import torch


def kv_battery(model, fresh: Callable[[torch.Tensor, int], torch.Tensor], *, steps: int, seed: int,
               max_new: int = 5, first: int = 0) -> int:
    """Random extends (1..max_new tokens) and truncates (every third step, to first..length-1) of
    `model`; after each extend, `fresh(tokens, n)` must give the last n rows of a fresh evaluation of
    all tokens, compared by the caller's assertion inside it. Returns the extends checked."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.zeros(0, dtype=torch.long)
    checked = 0
    for step in range(steps):
        if step % 3 == 2 and model.length > first + 1:
            n = int(torch.randint(first, model.length, (1,), generator=g))
            model.truncate(n)
            tokens = tokens[:n]
            assert model.length == n
            continue
        new = torch.randint(0, 259, (int(torch.randint(1, max_new + 1, (1,), generator=g)),), generator=g)
        logits = model.extend(new)
        tokens = torch.cat((tokens, new))
        assert model.length == tokens.shape[0]
        assert logits.dtype == torch.float32 and logits.shape == (new.shape[0], model.width)
        fresh(tokens, logits)
        checked += 1
    return checked
