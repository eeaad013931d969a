"""A GGUF file's own tokenizer, through llama.cpp: the small part of the Hugging Face tokenizer API
that moespec uses (encode, decode, eos/bos ids, len, the chat template).

llama.cpp decodes token ids and never re-tokenizes (engine paper Sec. 4, One tokenizer): this is
the tokenizer a user of llama.cpp would get for the file, so plain decoding sees the same ids.
"""

from __future__ import annotations

import ctypes
from typing import Sequence

import torch


class LlamaTokenizer:
    """The vocabulary of a loaded `LlamaModel`."""

    def __init__(self, model):
        self._L = model._L
        self._vocab = model._vocab
        self._model = model  # keeps the C model alive
        L = self._L
        self.n_vocab = model.n_vocab
        self.limit = model.vocab_limit or model.n_vocab
        self.bos_token_id = _id(L.llama_vocab_bos(self._vocab))
        self.eos_token_id = _id(L.llama_vocab_eos(self._vocab))
        self.add_bos = bool(L.llama_vocab_get_add_bos(self._vocab))
        template = L.llama_model_chat_template(model._model, None)
        self.chat_template = template.decode("utf-8") if template else None
        self.name_or_path = str(model.path)

    def __len__(self) -> int:
        """The ids a decode may produce (the file's vocabulary, less padding `moespec export-gguf` marked)."""
        return self.limit

    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = False) -> list[int]:
        """llama_tokenize; add_bos: None follows the file (tokenizer.ggml.add_bos_token)."""
        raw = text.encode("utf-8")
        add = self.add_bos if add_bos is None else add_bos
        room = len(raw) + 8
        buf = (ctypes.c_int32 * room)()
        n = self._L.llama_tokenize(self._vocab, raw, len(raw), buf, room, add, parse_special)
        if n < 0:  # more tokens than bytes: never for byte-level vocabularies, cheap to handle
            room = -n
            buf = (ctypes.c_int32 * room)()
            n = self._L.llama_tokenize(self._vocab, raw, len(raw), buf, room, add, parse_special)
        return list(buf[:n])

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token (llama_token_to_piece); control tokens are empty unless `special`."""
        buf = ctypes.create_string_buffer(64)
        n = self._L.llama_token_to_piece(self._vocab, int(token), buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._L.llama_token_to_piece(self._vocab, int(token), buf, len(buf), 0, special)
        return buf.raw[:n]

    def decode(self, ids: Sequence[int] | torch.Tensor, skip_special_tokens: bool = True) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        return b"".join(self.piece(i, not skip_special_tokens) for i in ids).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """The messages in the file's chat template (llama.cpp's built-in templates), tokenized."""
        if self.chat_template is None:
            raise ValueError(f"{self.name_or_path} has no chat template; pass plain prompts instead")
        L = self._L
        chat = (L.llama_chat_message * len(messages))()
        keep = []
        for m, msg in zip(chat, messages):
            keep += [msg["role"].encode(), msg["content"].encode()]
            m.role, m.content = keep[-2], keep[-1]
        template = self.chat_template.encode()
        size = 4 * sum(len(x) for x in keep) + 1024
        buf = ctypes.create_string_buffer(size)
        n = L.llama_chat_apply_template(template, chat, len(messages), add_generation_prompt, buf, size)
        if n < 0:
            raise ValueError(f"llama.cpp does not know the chat template of {self.name_or_path}")
        if n > size:
            buf = ctypes.create_string_buffer(n)
            n = L.llama_chat_apply_template(template, chat, len(messages), add_generation_prompt, buf, n)
        return self.encode(buf.raw[:n].decode("utf-8"), add_bos=False, parse_special=True)

    def __repr__(self) -> str:
        return f"LlamaTokenizer({self.name_or_path}, {self.limit} ids)"


def _id(token: int) -> int | None:
    """llama.cpp's LLAMA_TOKEN_NULL (-1) as None."""
    return None if token < 0 else int(token)
