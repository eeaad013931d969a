"""The built-in prompts the verify passes and sweeps read, cut to a depth, the chat requests, and the
windows that repetitions verify `STRIDE` tokens apart. Imports no torch (the target's greedy
continuation of these prompts is `bench.verified_text`).
"""

from __future__ import annotations

from importlib import resources

PROMPT_COUNT = 6
PROMPT_SEPARATOR = "\n\n"
PREFILL_CHUNK = 512
STRIDE = 3  # tokens between the windows of two repetitions of a verify pass (`verify.run_verify`)


def prompt_texts(count: int = PROMPT_COUNT) -> list[str]:
    """The texts of the first `count` built-in prompts (moespec/data/prompts/p1.txt ...)."""
    if not 1 <= count <= PROMPT_COUNT:
        raise ValueError(f"count must be 1..{PROMPT_COUNT} (the built-in prompts), got {count}")
    folder = resources.files("moespec") / "data" / "prompts"
    return [(folder / f"p{i}.txt").read_text(encoding="utf-8") for i in range(1, count + 1)]


def prompt_ids(tokenizer, length: int, count: int = PROMPT_COUNT) -> list[list[int]]:
    """`count` token-id prompts of exactly `length` tokens each.

    Prompt i is p_i, followed (when p_i alone is shorter than `length` tokens, as with a subword
    tokenizer at depth 4096) by p_{i+1}, p_{i+2}, ... cyclically, joined by a blank line, then cut
    to `length`. With the synthetic presets' byte tokenizer one byte is one token, and each prompt
    of >= 5000 bytes covers depth 4096 plus a pass of 16 on its own.
    """
    if length < 1:
        raise ValueError(f"length must be >= 1 token, got {length}")
    texts = prompt_texts(PROMPT_COUNT)
    if not 1 <= count <= len(texts):
        raise ValueError(f"count must be 1..{len(texts)} (the built-in prompts), got {count}")
    pieces = [tokenizer.encode(t + PROMPT_SEPARATOR) for t in texts]
    if not any(pieces):
        raise ValueError(f"the tokenizer {tokenizer!r} gives no tokens for the built-in prompts")
    out = []
    for i in range(count):
        ids: list[int] = []
        j = i
        while len(ids) < length:
            ids.extend(pieces[j % len(pieces)])
            j += 1
        out.append(ids[:length])
    return out


def vocab_limit(tokenizer) -> int | None:
    """The ids a decode may produce: the tokenizer's length where it has one (the output layer may be padded)."""
    return len(tokenizer) if hasattr(tokenizer, "__len__") else None


def continuation_length(reps: int, n_max: int, stride: int = STRIDE) -> int:
    """Tokens of continuation the verify passes read: the last repetition's window ends there."""
    return stride * (reps - 1) + n_max


def verified_depth(doc_id: str) -> int | None:
    """The depth d of a `verified_routing` document id "d{d}/p{i}", else None."""
    head = str(doc_id).split("/", 1)[0]
    return int(head[1:]) if head.startswith("d") and head[1:].isdigit() else None


CHAT_KINDS = ("edit", "open")  # edit: rewrite/summarize a text the prompt holds; open: open-ended


def chat_prompts(kind: str) -> list[str]:
    """The built-in chat requests of one kind (moespec/data/prompts/chat/KIND.json): `edit` asks to
    rename, fix, convert or summarize a text it quotes (the answer repeats much of the prompt, where
    prompt lookup drafts well); `open` asks for new text."""
    import json

    if kind not in CHAT_KINDS:
        raise ValueError(f"chat prompt kind must be one of {CHAT_KINDS}, got {kind!r}")
    return json.loads((resources.files("moespec") / "data" / "prompts" / "chat" / f"{kind}.json").read_text("utf-8"))


def chat_ids(tokenizer, request: str) -> list[int]:
    """A user request in the tokenizer's chat template, ready for the assistant's answer."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"{tokenizer!r} has no chat template; pass plain prompts instead")
    ids = tokenizer.apply_chat_template([{"role": "user", "content": request}], add_generation_prompt=True)
    if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def batch_prompt_ids(tokenizer, length: int, count: int) -> list[list[int]]:
    """`count` prompts of `length` tokens for a batch: windows spread evenly over the built-in prompts
    joined in a ring (any count >= 1; two windows overlap only when count * length exceeds the ring)."""
    if length < 1 or count < 1:
        raise ValueError(f"need length >= 1 token and count >= 1 prompt, got {length} and {count}")
    ring = [t for text in prompt_texts(PROMPT_COUNT) for t in tokenizer.encode(text + PROMPT_SEPARATOR)]
    if not ring:
        raise ValueError(f"the tokenizer {tokenizer!r} gives no tokens for the built-in prompts")
    step = max(len(ring) // count, 1)
    return [[ring[(i * step + j) % len(ring)] for j in range(length)] for i in range(count)]
