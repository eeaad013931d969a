"""The text the trained presets learn from, and the fixed split that holds part of it back.

Two sources, both on every machine: the Python standard library's own source (its `.py` files,
without `test/` and `site-packages/`, about 13 MB) and the corpus shipped in `moespec/data/corpus`.
A document is a whole stdlib file or one document of a corpus file. Whether it is held out depends
on its name only (sha256 of the name), so the split is the same on every machine and never changes
when files are added: one stdlib file in `STDLIB_HOLDOUT`, one corpus document in
`CORPUS_HOLDOUT`. Held-out documents are never trained on; the benchmarks read them.

>>> split = training_text()
>>> split.train_ids().shape, len(split.held_out)
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moespec.models.tokenizer import BOS_ID
from moespec.moe.corpus import default_corpus

STDLIB_HOLDOUT = 20  # one stdlib file in 20 is held out
CORPUS_HOLDOUT = 5  # one shipped corpus document in 5 (the corpus is small; prose needs a held-out share)
# The genre of a shipped corpus file, by its stem; stdlib files are code.
_CODE = {"code_python", "code_systems", "code_web", "config_data"}
_PROSE = {"prose", "news", "technical", "dialogue", "poetry_lists", "math"}


@dataclass(frozen=True)
class Document:
    name: str  # "stdlib/json/decoder.py" or "corpus/prose:3"
    kind: str  # "code", "prose" or "other"
    text: str

    @property
    def ids(self) -> np.ndarray:
        """[1 + bytes] int16: BOS, then the UTF-8 bytes."""
        return np.concatenate([[BOS_ID], np.frombuffer(self.text.encode("utf-8"), dtype=np.uint8)]).astype(np.int16)


def held_out(name: str, every: int) -> bool:
    """The stable rule: held out when the first 8 bytes of sha256(name), big-endian, are 0 modulo `every`."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % every == 0


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_documents(root: Path | None = None) -> list[Document]:
    """Every `.py` file of the standard library outside `test/` and `site-packages/`, sorted by path."""
    root = stdlib_root() if root is None else Path(root)
    docs = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if {"test", "site-packages"} & set(rel.parts[:-1]):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a handful of stdlib files are deliberately not UTF-8
        docs.append(Document(f"stdlib/{rel.as_posix()}", "code", text))
    if not docs:
        raise ValueError(f"found no .py files under {root}; is this Python's standard library?")
    return docs


def corpus_documents() -> list[Document]:
    """The shipped corpus, one Document per corpus document, with its genre."""
    docs = []
    for doc_id, text in default_corpus():
        stem = doc_id.split(":")[0]
        kind = "code" if stem in _CODE else "prose" if stem in _PROSE else "other"
        docs.append(Document(f"corpus/{doc_id}", kind, text))
    return docs


@dataclass(frozen=True)
class TextSplit:
    """Training and held-out documents of both sources."""

    train: tuple  # (stdlib documents, corpus documents), each a tuple of Document
    held_out: tuple  # Document, stdlib first

    def train_ids(self, source: int = 0) -> np.ndarray:
        """[tokens] int16: the training documents of source 0 (stdlib) or 1 (corpus), concatenated."""
        return np.concatenate([d.ids for d in self.train[source]])

    def held_out_ids(self, kind: str | None = None) -> np.ndarray:
        """[tokens] int16: held-out documents of one kind (all when None), concatenated."""
        docs = [d for d in self.held_out if kind is None or d.kind == kind]
        if not docs:
            raise ValueError(f"no held-out documents of kind {kind!r}")
        return np.concatenate([d.ids for d in docs])

    def fingerprint(self) -> dict:
        """sha256 of the training and held-out names and bytes: what a manifest records."""
        out = {}
        for label, docs in (("train", [*self.train[0], *self.train[1]]), ("held_out", list(self.held_out))):
            h = hashlib.sha256()
            for d in docs:
                h.update(d.name.encode() + b"\0" + d.text.encode("utf-8") + b"\0")
            out[label] = {"documents": len(docs), "bytes": sum(len(d.text.encode()) for d in docs), "sha256": h.hexdigest()}
        return out


def training_text(stdlib: Path | None = None) -> TextSplit:
    """The split of the standard library at `stdlib` (this interpreter's by default) and the corpus."""
    lib, corpus = stdlib_documents(stdlib), corpus_documents()
    lib_out = [held_out(d.name, STDLIB_HOLDOUT) for d in lib]
    corpus_out = [held_out(d.name, CORPUS_HOLDOUT) for d in corpus]
    return TextSplit(
        train=(tuple(d for d, o in zip(lib, lib_out) if not o), tuple(d for d, o in zip(corpus, corpus_out) if not o)),
        held_out=tuple([d for d, o in zip(lib, lib_out) if o] + [d for d, o in zip(corpus, corpus_out) if o]),
    )
