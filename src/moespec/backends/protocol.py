"""The one protocol through which the engine sees a model (engine paper Sec. 4, Model abstraction).

A `SpecModel` is a causal LM with a KV cache of one sequence:

- `extend(tokens, outputs=None)` appends tokens [n] (int64) to the cache and returns float32 CPU
  logits [n, W] of the new positions, or of only the last `outputs` of them (a prefill needs one row);
- `truncate(n)` rolls the cache back to its first n positions, a no-op when it holds n or fewer, the
  contract that makes the cleanup after a rejection uniform;
- `length`, positions held; `width` W, logits per position (padded rows included); `vocab_limit`,
  the ids a decode may produce (None: all W); `reset()`; `forward_s`, seconds inside forward passes;
- `identity()`, what its pass times depend on (its weights, settings, threads) as a JSON-safe dict,
  the warm start's store key (`engine.step_store`); None: no key, k="auto" decodes cold;
- optionally `capacity`, the most positions the cache can hold (None or absent: no limit).

The decode loop, the proposers, the policies and the gate use nothing else, so a backend is one
class: `torch_model.CachedModel` (transformers models), `llama_model.LlamaModel` (llama.cpp),
`table_model.TableLM` (deterministic tables for tests).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class SpecModel(Protocol):
    forward_s: float

    @property
    def length(self) -> int: ...

    @property
    def width(self) -> int: ...

    @property
    def vocab_limit(self) -> int | None: ...

    def reset(self) -> None: ...

    def extend(self, tokens: torch.Tensor, outputs: int | None = None) -> torch.Tensor: ...

    def truncate(self, n: int) -> None: ...

    def identity(self) -> dict | None:
        """What this model's pass times depend on, as JSON values (the store's key of it); None: no key."""


def as_spec_model(model) -> SpecModel:
    """`model` itself when it speaks the protocol; a transformers causal LM wrapped as CachedModel."""
    if hasattr(model, "extend") and hasattr(model, "truncate"):
        return model
    if callable(model) and hasattr(model, "config"):
        from moespec.backends.torch_model import CachedModel

        return CachedModel(model)
    raise TypeError(f"expected a transformers causal LM or a SpecModel (extend, truncate, length, width, "
                    f"vocab_limit, reset), got {type(model).__name__}")


def output_rows(n: int, outputs: int | None) -> int:
    """How many logit rows `extend` returns for n tokens: all of them, or the last `outputs` (1..n)."""
    if n < 1:
        raise ValueError("extend() needs at least one token")
    if outputs is None:
        return n
    if not 1 <= outputs <= n:
        raise ValueError(f"outputs must be in 1..{n} (the tokens of this pass) or None, got {outputs}")
    return outputs
