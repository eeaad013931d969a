"""A recipe's vocabulary (`models.train`): its token ids, and the training text as id streams.

The byte tokenizer's 259 ids padded to 272 logits (`trained:olmoe`, `trained:draft`), or SmolLM2's
49,152 (`trained:smollm2-draft`, its tokenizer read from the installed GGUF file; the text is
tokenized once and cached on disk).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moespec.cache import cache_dir
from moespec.texts import TextSplit
from moespec.models.tokenizer import BOS_ID, EOS_ID, PAD_ID, ByteTokenizer

VOCAB = 272  # the byte tokenizer's ids padded to a multiple of 16, as in the synthetic presets
SMOLLM2 = "smollm2"


@dataclass(frozen=True)
class Vocabulary:
    """A recipe's token ids: `width` logits, of which the first `limit` are real tokens."""

    name: str
    width: int
    limit: int
    bos: int
    eos: int
    pad: int

    def tokenizer(self):
        if self.name == "bytes":
            return ByteTokenizer()
        from moespec.models import gguf

        return gguf.tokenizer(gguf.SMOLLM2)

    def encode(self, docs) -> np.ndarray:
        """[tokens] int32: each document as its ids, each led by `bos` (the byte tokenizer's BOS,
        SmolLM2's <|endoftext|>)."""
        if not docs:
            return np.zeros(0, dtype=np.int32)
        if self.name == "bytes":
            return np.concatenate([d.ids for d in docs]).astype(np.int32)
        ids = self.tokenizer()([d.text for d in docs], add_special_tokens=False)["input_ids"]
        return np.concatenate([np.asarray([self.bos, *x], dtype=np.int32) for x in ids])


def vocabulary(name: str) -> Vocabulary:
    if name == "bytes":
        return Vocabulary("bytes", VOCAB, ByteTokenizer.vocab_size, BOS_ID, EOS_ID, PAD_ID)
    if name == SMOLLM2:
        # SmolLM2's 49,152 ids are all real; <|endoftext|> (0) separates documents, <|im_end|> (2) ends a turn.
        return Vocabulary(SMOLLM2, 49152, 49152, 0, 2, 2)
    raise ValueError(f"unknown tokenizer {name!r}; recipes use 'bytes' or '{SMOLLM2}'")


def _cache_dir() -> Path:
    return cache_dir() / "tokens"


def token_streams(split: TextSplit, v: Vocabulary) -> list[np.ndarray]:
    """[stdlib training ids, corpus training ids] in vocabulary `v`; SmolLM2's are cached on disk,
    keyed by the text's fingerprint (tokenizing 13 MB takes a few seconds, loading the tokenizer more)."""
    if v.name == "bytes":
        return [split.train_ids(0), split.train_ids(1)]
    key = hashlib.sha256(json.dumps([v.name, split.fingerprint()["train"]], sort_keys=True).encode()).hexdigest()[:16]
    path = _cache_dir() / f"{v.name}-{key}.npz"
    if path.exists():
        with np.load(path) as z:
            return [z["stdlib"], z["corpus"]]
    streams = [v.encode(split.train[0]), v.encode(split.train[1])]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, stdlib=streams[0], corpus=streams[1])
    os.replace(tmp, path)
    return streams


def held_out_tokens(split: TextSplit, v: Vocabulary, kind: str) -> np.ndarray:
    """[tokens] int32: the held-out documents of `kind` in vocabulary `v`."""
    docs = [d for d in split.held_out if d.kind == kind]
    if not docs:
        raise ValueError(f"no held-out documents of kind {kind!r}")
    return v.encode(docs)
