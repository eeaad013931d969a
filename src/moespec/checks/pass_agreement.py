"""Which pass sizes compute the same function: a token's logits as a function of how its pass was cut.

Speculative decoding verifies k + 1 tokens in one pass where plain decoding feeds one; it returns
the target's own tokens only if a token's logits do not depend on that (engine paper Sec. 6.1 and
Limitation 5: "batch-invariance of logits is a backend property"). `pass_sizes` feeds the same text
after the same prefill in passes of n tokens for each n and groups the n whose logits agree bit for
bit; `prefill_chunks` cuts the prefill in chunks of c tokens for each c and compares the logits of
the text after it. Both run on any `SpecModel`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class Agreement:
    """Sizes grouped by bit-identical logits, and how far each size strays from the first.

    sizes: the pass sizes (or prefill chunks) tried, the first the reference. classes: lists of sizes
    whose logits are identical, in order of first appearance. max_diff[i], argmax_flips[i]: for
    sizes[i], the largest |logit difference| from the reference and the positions whose argmax differs.
    """

    sizes: tuple[int, ...]
    classes: tuple[tuple[int, ...], ...]
    max_diff: tuple[float, ...]
    argmax_flips: tuple[int, ...]
    positions: int

    @property
    def uniform(self) -> bool:
        """Every size computes the same function."""
        return len(self.classes) == 1

    def to_dict(self) -> dict:
        return asdict(self)


def _agreement(sizes: Sequence[int], logits: list[torch.Tensor]) -> Agreement:
    """Group `sizes` by bit-identical logits ([T, W] each, same positions)."""
    classes: list[list[int]] = []
    reps: list[torch.Tensor] = []
    for size, x in zip(sizes, logits, strict=True):
        for members, rep in zip(classes, reps):
            if torch.equal(rep, x):
                members.append(size)
                break
        else:
            classes.append([size])
            reps.append(x)
    ref = logits[0]
    return Agreement(tuple(sizes), tuple(tuple(c) for c in classes),
                     tuple(float((x - ref).abs().max()) for x in logits),
                     tuple(int((x.argmax(-1) != ref.argmax(-1)).sum()) for x in logits), ref.shape[0])


def cuts(T: int, n: int) -> list[int]:
    """Pass sizes that feed T tokens n at a time: the remainder is the last pass, except a remainder of
    one token, which joins the pass before it (a one-token pass is the case compared, n = 1)."""
    sizes = [n] * (T // n) + ([T % n] if T % n else [])
    if n > 1 and len(sizes) > 1 and sizes[-1] == 1:
        sizes[-2:] = [n + 1]
    return sizes


def fed_in_passes(model, prompt: Sequence[int], text: Sequence[int], n: int) -> torch.Tensor:
    """Logits [len(text), W] of `text` fed after `prompt` in passes of n tokens (`cuts`). The prompt is
    prefilled when the cache is shorter; a longer cache must start with this prompt (it is rolled back
    to it)."""
    if model.length < len(prompt):
        model.reset()
        model.extend(torch.tensor(list(prompt)), outputs=1)
    model.truncate(len(prompt))
    t, rows, i = torch.tensor(list(text)), [], 0
    for size in cuts(len(text), n):
        rows.append(model.extend(t[i: i + size]))
        i += size
    return torch.cat(rows)


def pass_sizes(model, prompt: Sequence[int], text: Sequence[int], sizes: Sequence[int] = range(1, 65)) -> Agreement:
    """Which pass sizes give the same logits over `text` after one prefill of `prompt`."""
    model.reset()
    return _agreement(list(sizes), [fed_in_passes(model, prompt, text, n) for n in sizes])


def prefill_chunks(model, prompt: Sequence[int], text: Sequence[int], chunks: Sequence[int], n: int = 2) -> Agreement:
    """Which prefill chunkings of `prompt` give the same logits over `text` (fed in passes of n)."""
    logits = []
    p = torch.tensor(list(prompt))
    for c in chunks:
        model.reset()
        for i in range(0, len(prompt), c):
            model.extend(p[i: i + c], outputs=1)
        logits.append(fed_in_passes(model, prompt, text, n))
    return _agreement(list(chunks), logits)


def margins(logits: torch.Tensor) -> torch.Tensor:
    """[T] the gap between the largest and the second largest logit of each row of [T, W]."""
    top = logits.topk(2, dim=-1).values
    return top[:, 0] - top[:, 1]
