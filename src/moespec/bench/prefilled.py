"""A target whose KV cache holds one prompt's prefill, shared by every run of a sweep on it."""

from __future__ import annotations

import time
from typing import Sequence

import torch

from moespec.backends.protocol import GreedyByLogits, as_spec_model, output_rows
from moespec.texts import PREFILL_CHUNK, prompt_ids
from moespec.device import synchronize
from moespec.kernel_names import DEDUP, SLOT


class PrefilledTarget(GreedyByLogits):
    """A target whose cache holds one prompt's prefill, reused by every `generate` call on it.

    It speaks the `SpecModel` protocol, over any backend. Positions inside the prompt are served from
    the logits kept at prefill (the last `keep` rows of [P, V]); positions past it run the model on the
    real cache, which always holds the prompt.
    Extending a prompt position with any other token than the prompt's raises ValueError.
    `hold(tokens)` makes the prompt longer by `tokens`, so that runs can start further into a text.
    """

    def __init__(self, model, prompt: torch.Tensor, keep: int | None = None):  # prompt: [P] int64
        """keep: how many of the prompt's last logit rows are kept (None: all of them). A run asks for
        the last row alone; every row of a 4,096-token prompt is 0.8 GB at a vocabulary of 50k."""
        if keep is not None and keep < 1:
            raise ValueError(f"keep={keep}; keep at least the prompt's last row (1), or None for every row")
        self.inner = as_spec_model(model)
        self.inner.reset()  # a llama.cpp model is its own cache, and may hold the previous prompt's
        self.prompt = torch.as_tensor(prompt, dtype=torch.long).reshape(-1)
        self.keep = keep
        P = self.prompt.shape[0]
        self.device = getattr(self.inner, "device", None)
        synchronize(self.device)
        t0 = time.perf_counter()
        rows = [self.inner.extend(self.prompt[s : s + PREFILL_CHUNK], outputs=self._outputs(P - s))
                for s in range(0, P, PREFILL_CHUNK)]
        synchronize(self.device)
        self.prefill_s = time.perf_counter() - t0
        self.logits = self._kept(torch.cat(rows))  # [kept, V] float32 CPU, row j predicts the token after row j's
        self.forward_s = 0.0
        self._length = 0

    def _outputs(self, left: int) -> int | None:
        """The rows a chunk's pass returns, `left` tokens of the prompt from the chunk's start on."""
        chunk = min(left, PREFILL_CHUNK)
        return None if self.keep is None else max(1, min(chunk, self.keep - (left - chunk)))

    def _kept(self, rows: torch.Tensor) -> torch.Tensor:
        return rows if self.keep is None else rows[-self.keep:]

    @property
    def first_row(self) -> int:
        """The prompt position whose logits are the first kept row."""
        return self.prompt.shape[0] - self.logits.shape[0]

    @property
    def length(self) -> int:
        return self._length

    @property
    def width(self) -> int:
        return self.inner.width

    @property
    def vocab_limit(self) -> int | None:
        return self.inner.vocab_limit

    def reset(self) -> None:
        self._length = 0
        self.forward_s = 0.0
        self.inner.truncate(self.prompt.shape[0])

    def hold(self, tokens: torch.Tensor) -> None:
        """Hold `tokens` [t] after the prompt as well: run on the cache (untimed), their logits kept."""
        tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        self.reset()
        if tokens.numel():
            outputs = None if self.keep is None else min(tokens.numel(), self.keep)  # one pass, unchunked
            self.logits = self._kept(torch.cat([self.logits, self.inner.extend(tokens, outputs=outputs)]))
            self.prompt = torch.cat([self.prompt, tokens])

    def truncate(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"truncate() needs n >= 0, got {n}")
        self._length = min(self._length, n)
        self.inner.truncate(max(self._length, self.prompt.shape[0]))

    def extend(self, tokens: torch.Tensor, outputs: int | None = None) -> torch.Tensor:
        """Append tokens [n]; returns the logits of the n new positions (the last `outputs`), [n, V] float32 CPU."""
        tokens = tokens.reshape(-1)
        rows = output_rows(tokens.numel(), outputs)
        P, start, n = self.prompt.shape[0], self._length, int(tokens.shape[0])
        inside = max(0, min(start + n, P) - start)
        if inside and not torch.equal(tokens[:inside], self.prompt[start : start + inside]):
            raise ValueError(
                f"PrefilledTarget holds one prompt; positions {start}..{start + inside - 1} were extended "
                "with other tokens. Build one PrefilledTarget per prompt."
            )
        outside = min(rows, n - inside)  # rows from the model, the rest from the kept rows
        parts = [self._rows(start + inside - (rows - outside), start + inside)]
        if inside < n:
            before = self.inner.forward_s
            parts.append(self.inner.extend(tokens[inside:], outputs=outside))
            self.forward_s += self.inner.forward_s - before
        self._length = start + n
        return torch.cat(parts)  # a copy of the rows asked for alone

    def _rows(self, a: int, b: int) -> torch.Tensor:
        """The kept logits of prompt positions a..b-1 (a view, not a copy)."""
        if a < self.first_row:
            raise ValueError(f"the logits of prompt position {a} were not kept (keep={self.keep} rows from "
                             f"{self.first_row} on); ask for fewer outputs, or hold the prompt with keep=None")
        return self.logits[a - self.first_row : b - self.first_row]

    def extend_argmax(self, tokens: torch.Tensor, limit: int, outputs: int | None = None) -> list[int]:
        """Past the prompt, the backend's own (`SpecModel.extend_argmax`: compiled on llama.cpp), as a run
        on the bare model takes it; inside it, off the kept rows."""
        if self._length < self.prompt.shape[0]:
            return super().extend_argmax(tokens, limit, outputs)
        return self._past_prompt(lambda: self.inner.extend_argmax(tokens, limit, outputs))

    def greedy_steps(self, token: int, steps: int, limit: int, eos=(), stop=None) -> tuple[list[int], list[float]]:
        """Past the prompt, the backend's own greedy steps (one compiled call on llama.cpp), so that a run
        on a prefilled prompt decodes plainly as one on the bare model does."""
        if self._length < self.prompt.shape[0]:
            return super().greedy_steps(token, steps, limit, eos, stop)
        return self._past_prompt(lambda: self.inner.greedy_steps(token, steps, limit, eos, stop))

    def _past_prompt(self, call):
        """`call()` on the real cache, which holds this target's text; the positions it fed counted."""
        before, seconds = self.inner.length, self.inner.forward_s
        try:
            return call()
        finally:
            self._length += self.inner.length - before
            self.forward_s += self.inner.forward_s - seconds


def avoid_slot_prefill(model) -> None:
    """Leave the per-slot kernel before a prefill: it reads one expert per (token, slot), d*m reads."""
    if getattr(getattr(model, "config", None), "_experts_implementation", None) == SLOT:
        model.set_experts_implementation(DEDUP)


def switch_kernel(model, kernel: str | None) -> None:
    """Set the model's experts implementation to `kernel` (None keeps the current one); a model of
    another backend (llama.cpp) runs its own kernel and has none to set."""
    if kernel is not None and hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(kernel)


class PrefilledPrompts:
    """Prompts at one depth, each prefilled on first use only (a resumed sweep may need none).

    `target(i, text)` holds prompt i's `text` (by default the prompt itself): a run may start
    further into the target's greedy text (`run_oracle`'s `start_stride`). Each target keeps its
    prompt's last logit row alone (`PrefilledTarget(keep=1)`): at depth 4,096 every row was 0.8 GB
    held, and 0.8 GB copied before each run's timed pass."""

    def __init__(self, model, tokenizer, depth: int, count: int, prefill_last: bool = True):
        self.model, self.ids = model, prompt_ids(tokenizer, depth, count)
        self.prefill_last = prefill_last  # False: the targets hold all but the last token (its pass is a round's)
        self._targets: dict[int, PrefilledTarget] = {}

    def target(self, i: int, text: Sequence[int] | None = None) -> PrefilledTarget:
        text = list(self.ids[i] if text is None else text)
        held = torch.tensor(text if self.prefill_last else text[:-1])
        have = self._targets.get(i)
        if have is None or not (have.prompt.shape[0] <= held.shape[0]
                                and torch.equal(have.prompt, held[: have.prompt.shape[0]])):
            self._targets.clear()  # one prompt's cache at a time
            avoid_slot_prefill(self.model)
            self._targets[i] = PrefilledTarget(self.model, held, keep=1)  # a run reads the last row alone
        elif have.prompt.shape[0] < held.shape[0]:  # a later start on the same text: hold the tokens between
            avoid_slot_prefill(self.model)
            have.hold(held[have.prompt.shape[0]:])
        return self._targets[i]
