"""A speculative call beside plain decoding of the same prompt, and the speedup between them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from moespec.engine.decode import generate
from moespec.engine.stats import GenerationResult

# Tokens of the untimed call that warms each path up before it is timed.
WARM_UP_TOKENS = 4


@dataclass(frozen=True)
class Comparison:
    """The speculative call's result and, when compared, plain decoding's (None otherwise)."""

    result: GenerationResult
    plain: GenerationResult | None = None

    @property
    def speedup(self) -> float:
        """Tokens per second of the speculative call over plain decoding's (NaN when plain took no time)."""
        if self.plain is None:
            raise ValueError("no plain decoding to compare with; call generate_compared with compare=True")
        tps = self.plain.stats.tokens_per_s
        return self.result.stats.tokens_per_s / tps if tps else float("nan")

    @property
    def same_tokens(self) -> bool:
        """Whether both produced the same tokens (always so when greedy: decoding is lossless)."""
        return self.plain is not None and self.plain.tokens == self.result.tokens


def generate_compared(target, input_ids: Sequence[int], *, draft, k, step_times: Sequence[float] | None = None,
                      warm_start: bool = True, compare: bool = False, max_new_tokens: int = 128,
                      **kwargs) -> Comparison:
    """`decode.generate` with `draft`, and with `compare` plain decoding of the same prompt after it.
    Compared, each path first runs one short untimed call, so that neither timing carries first-call
    warm-up; `kwargs` are the sampling and stopping arguments both calls share."""
    if compare:
        warm = {**kwargs, "max_new_tokens": min(WARM_UP_TOKENS, max_new_tokens)}
        generate(target, input_ids, draft=draft, k=k, step_times=step_times, warm_start=False, **warm)
        generate(target, input_ids, k=0, **warm)
    result = generate(target, input_ids, draft=draft, k=k, step_times=step_times, warm_start=warm_start,
                      max_new_tokens=max_new_tokens, **kwargs)
    plain = generate(target, input_ids, draft=None, k=0, max_new_tokens=max_new_tokens, **kwargs) if compare else None
    return Comparison(result, plain)
