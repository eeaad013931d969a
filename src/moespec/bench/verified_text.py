"""The text a speculative step verifies: the target's greedy continuation of the built-in prompts
(the oracle draft proposes it, marking some drafts wrong; the verify passes read it)."""

from __future__ import annotations

from typing import Sequence

from moespec.bench.prefilled import avoid_slot_prefill
from moespec.texts import prompt_ids, vocab_limit
from moespec.engine.decode import generate


def greedy_continuation(model, prompt: Sequence[int], length: int, vocab_limit: int | None = None) -> list[int]:
    """The target's first `length` greedy tokens after `prompt` (untimed): the text a speculative
    step verifies (the oracle draft proposes it, marking some drafts wrong), and the oracle's reference."""
    if length < 1:
        raise ValueError(f"length must be >= 1 token, got {length}")
    avoid_slot_prefill(model)
    return list(generate(model, list(prompt), k=0, temperature=0.0, max_new_tokens=length,
                         vocab_limit=vocab_limit, prefill_last=False).tokens)


def verified_texts(model, tokenizer, depth: int, prompts: int, length: int) -> list[list[int]]:
    """Per built-in prompt: its first `depth` tokens followed by `length` greedy tokens of the target."""
    limit = vocab_limit(tokenizer)
    return [ids + greedy_continuation(model, ids, length, limit) for ids in prompt_ids(tokenizer, depth, prompts)]
