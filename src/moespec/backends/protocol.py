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

A `BatchModel` is the same for several sequences at once (`engine.batch`): every method takes a
sequence id, and one pass feeds a `Part` (sequence id, its tokens) of each
(`llama_batch.LlamaBatch`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Collection, Protocol, Sequence, runtime_checkable

import numpy as np
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

    def extend_argmax(self, tokens: torch.Tensor, limit: int, outputs: int | None = None) -> list[int]:
        """`extend`, returning only each new row's greedy token: its first maximal id below `limit`."""

    def greedy_steps(self, token: int, steps: int, limit: int, eos: Collection[int] = (),
                     stop: StepStop | None = None) -> tuple[list[int], list[float]]:
        """Up to `steps` greedy one-token steps: feed `token`, take its row's greedy token, feed that, ...;
        (the tokens produced, each step's seconds). A step that produces an id of `eos`, or a token
        `stop` fires on, is the last; the last token produced is not fed (the round invariant: the
        cache lags the text by one). NoMaximum names the step whose row had no finite maximum."""

    def identity(self) -> dict | None:
        """What this model's pass times depend on, as JSON values (the store's key of it); None: no key."""


Part = tuple[int, Sequence[int]]  # (sequence id, the tokens it feeds)


@runtime_checkable
class BatchModel(Protocol):
    """A model holding several sequences' caches, fed together (`backends.llama_batch.LlamaBatch`).
    `extend_parts` returns each part's logits [n_i, n_vocab]; `argmax_parts` each part's greedy ids."""

    sequences: int
    batch: int  # the most tokens one pass holds
    n_vocab: int
    vocab_limit: int | None
    forward_s: float

    @property
    def compiled_steps(self) -> bool:
        """Whether `batch_greedy_steps` runs plain greedy rounds in one compiled call."""

    def reset(self) -> None: ...

    def seq_length(self, seq: int) -> int: ...

    def truncate_seq(self, seq: int, n: int) -> None: ...

    def move(self, src: int, dst: int) -> None: ...

    def extend_parts(self, parts: Sequence[Part]) -> list[torch.Tensor]: ...

    def argmax_parts(self, parts: Sequence[Part], limit: int) -> list[list[int]]: ...

    def batch_greedy_steps(self, parts: Sequence[tuple[int, int]], steps: int, limit: int,
                           eos: Collection[int] = ()) -> tuple[np.ndarray, list[float]]:
        """Up to `steps` greedy steps of every (sequence id, token) part in one call: (the ids produced
        [steps', parts], each step's seconds)."""


MOD_MULTIPLIER = 6364136223846793005  # llama.cpp's ngram-mod hash: res = res * this + token, in uint64
UINT64 = (1 << 64) - 1


def fold(tokens) -> int:
    """llama.cpp ngram-mod's hash of an n-gram: the uint64 fold res = res * MOD_MULTIPLIER + token."""
    res = 0
    for token in tokens:
        res = (res * MOD_MULTIPLIER + int(token)) & UINT64
    return res


@dataclass
class StepStop:
    """Where a run of greedy steps stops early: after a token that may let a host drafter propose
    (`engine.proposers.HostDrafter.quiet`), so that the rounds in which it proposes nothing run as
    plain greedy steps, in one call. Fired on each produced token, in order; it keeps its state.

    seen: [W] uint8 or None: a token already marked fires; every produced token is then marked.
    pool, tail: [P] int32 and [n - 1] int32, or None: `fold(tail + [token]) % P` indexes pool and an
    entry >= 0 fires; the tail then drops its first token and takes this one (n = len(tail) + 1).
    A backend's compiled steps run the same rule (csrc/llama_steps.c, `stop_after`).
    """

    seen: np.ndarray | None = None
    pool: np.ndarray | None = None
    tail: np.ndarray | None = None

    def fires(self, token: int) -> bool:
        fire = False
        if self.seen is not None:
            fire = bool(self.seen[token])
            self.seen[token] = 1
        if self.pool is not None:
            fire |= bool(self.pool[fold([*self.tail.tolist(), token]) % len(self.pool)] >= 0)
            if len(self.tail):
                self.tail[:-1], self.tail[-1] = self.tail[1:].copy(), token
        return fire


class NoMaximum(ValueError):
    """A logits row without a finite maximum below the vocabulary limit: `row` (of the pass's returned
    rows) and `what` it held ("NaN", "+inf", "-inf at every allowed id", or "no finite maximum")."""

    def __init__(self, row: int, what: str):
        super().__init__(f"the model returned logits with {what} at row {row}; check its weights and dtype "
                         "(try dtype=float32)")
        self.row, self.what = row, what

    @classmethod
    def in_row(cls, row: int, allowed: np.ndarray) -> "NoMaximum":
        """The error for row `row` whose allowed logits `allowed` [limit] have no finite maximum."""
        return cls(row, "NaN" if np.isnan(allowed).any() else "+inf" if np.isposinf(allowed).any()
                   else "-inf at every allowed id")


def argmax_rows(logits: torch.Tensor, limit: int) -> list[int]:
    """The first maximal id below `limit` of each row of logits [n, V]; NoMaximum for a row whose
    maximum is not finite (NaN counts as the maximum)."""
    allowed = logits.detach().float().numpy()[:, :limit]  # [n, limit]
    best = allowed.argmax(-1)
    top = allowed[np.arange(len(best)), best]
    if not np.isfinite(top).all():
        row = int(np.flatnonzero(~np.isfinite(top))[0])
        raise NoMaximum.in_row(row, allowed[row])
    return best.tolist()


class GreedyByLogits:
    """`extend_argmax` and `greedy_steps` read off `extend`'s logits, in Python: the path of every
    backend without a faster one of its own."""

    def extend_argmax(self, tokens: torch.Tensor, limit: int, outputs: int | None = None) -> list[int]:
        return argmax_rows(self.extend(tokens, outputs), limit)

    def greedy_steps(self, token: int, steps: int, limit: int, eos: Collection[int] = (),
                     stop: StepStop | None = None) -> tuple[list[int], list[float]]:
        produced, seconds = [], []
        for step in range(steps):
            t0 = time.perf_counter()
            try:
                token = self.extend_argmax(torch.tensor([token]), limit)[0]
            except NoMaximum as e:
                raise NoMaximum(step, e.what) from None
            produced.append(token)
            fired = stop is not None and stop.fires(token)
            seconds.append(time.perf_counter() - t0)
            if token in eos or fired:
                break
        return produced, seconds


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
