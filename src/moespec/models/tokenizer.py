"""The byte-level tokenizer shared by every synthetic preset.

Ids 0..255 are the bytes of the UTF-8 encoding, so any text round-trips exactly; three specials
follow. Every preset uses this one tokenizer, which is why any preset can draft for any other.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch

from moespec.texts import BOS_ID

EOS_ID, PAD_ID = BOS_ID + 1, BOS_ID + 2
MARKER_FILE = "moespec_tokenizer.json"  # names the tokenizer of a checkpoint folder moespec wrote
SPECIALS = {"<bos>": BOS_ID, "<eos>": EOS_ID, "<pad>": PAD_ID}


class ByteTokenizer:
    """UTF-8 bytes as ids, with the small part of the Hugging Face tokenizer API the engine uses."""

    vocab_size = 256 + len(SPECIALS)
    bos_token_id = BOS_ID
    eos_token_id = EOS_ID
    pad_token_id = PAD_ID
    name_or_path = "moespec-bytes"

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [BOS_ID, *ids] if add_bos else ids

    def decode(self, ids: Sequence[int] | torch.Tensor, skip_special_tokens: bool = True) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        names = {v: k for k, v in SPECIALS.items()}
        out, buf = [], bytearray()
        for i in ids:
            i = int(i)
            if i < 256:
                buf.append(i)
                continue
            out.append(buf.decode("utf-8", errors="replace"))
            buf = bytearray()
            if not skip_special_tokens:
                out.append(names.get(i, f"<{i}>"))
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def get_vocab(self) -> dict[str, int]:
        vocab = {f"<0x{i:02X}>": i for i in range(256)}
        vocab.update(SPECIALS)
        return vocab

    def save_pretrained(self, path: str | Path) -> None:
        """Mark a checkpoint folder as using this tokenizer (there is nothing else to save)."""
        Path(path, MARKER_FILE).write_text(json.dumps({"tokenizer": "moespec-bytes", "vocab_size": self.vocab_size}))

    def __len__(self) -> int:
        return self.vocab_size

    def __call__(self, text: str, return_tensors: str | None = None) -> dict:
        ids = self.encode(text)
        return {"input_ids": torch.tensor([ids]) if return_tensors == "pt" else ids}

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={self.vocab_size})"


def marked_tokenizer(folder: str | Path):
    """The tokenizer a folder's MARKER_FILE names (ByteTokenizer, or SmolLM2's read from the installed
    GGUF file), or None when the folder has no marker."""
    path = Path(folder, MARKER_FILE)
    if not path.exists():
        return None
    name = json.loads(path.read_text()).get("tokenizer")
    if name == "moespec-bytes":
        return ByteTokenizer()
    if name == "smollm2":
        from moespec.models import gguf

        try:
            return gguf.tokenizer(gguf.SMOLLM2)
        except ValueError as e:
            raise ValueError(f"{folder} uses SmolLM2's tokenizer: {e}") from None
    raise ValueError(f"{path} names tokenizer {name!r}, which this moespec does not know")
