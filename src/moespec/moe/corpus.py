"""Text corpora for routing traces: the default corpus shipped with moespec, or the user's files.

A file is split into documents in one of two ways:
- if it has a line holding only a form feed (``\\f``), those lines separate its documents;
- otherwise its blank-line-separated paragraphs are joined, in order, into documents of at least
  `MIN_DOC_BYTES` bytes of UTF-8 (a shorter remainder joins the last document).
Document ids are ``<file stem>:<index>``.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Iterable

MIN_DOC_BYTES = 2000
_FORM_FEED_LINE = re.compile(r"^[ \t]*\f[ \t]*$", re.MULTILINE)
_BLANK = re.compile(r"\n[ \t]*\n")


def split_documents(text: str, min_bytes: int = MIN_DOC_BYTES) -> list[str]:
    """The documents of one file's text, by the rule in the module docstring."""
    if _FORM_FEED_LINE.search(text):
        return [d.strip("\n") for d in _FORM_FEED_LINE.split(text) if d.strip()]
    docs: list[str] = []
    current: list[str] = []
    size = 0
    for para in _BLANK.split(text):
        if not para.strip():
            continue
        current.append(para.strip("\n"))
        size += len(para.encode("utf-8"))
        if size >= min_bytes:
            docs.append("\n\n".join(current))
            current, size = [], 0
    if current:
        if docs:
            docs[-1] = docs[-1] + "\n\n" + "\n\n".join(current)
        else:
            docs.append("\n\n".join(current))
    return docs


def _named_texts(items: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(f"{stem}:{i}", doc) for stem, text in items for i, doc in enumerate(split_documents(text))]


def read_text(path) -> str:
    """A UTF-8 text file's contents (a Path or a package resource); ValueError naming the file if not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte {e.start}: {e.reason}); convert it to UTF-8") from None


def read_corpus(files: Iterable[str | Path]) -> list[tuple[str, str]]:
    """(doc id, text) for every document of the given UTF-8 text files, in order."""
    items = []
    for f in files:
        path = Path(f)
        if not path.is_file():
            raise ValueError(f"corpus file {path} does not exist; pass UTF-8 text files to --corpus")
        items.append((path.stem, read_text(path)))
    return _named_texts(items)


def default_corpus() -> list[tuple[str, str]]:
    """(doc id, text) for the corpus shipped in the package at ``moespec/data/corpus/*.txt``."""
    root = resources.files("moespec").joinpath("data", "corpus")
    files = sorted((p for p in root.iterdir() if p.name.endswith(".txt")), key=lambda p: p.name) if root.is_dir() else []
    if not files:
        raise ValueError("the default corpus moespec/data/corpus/*.txt is missing; reinstall moespec or pass --corpus")
    return _named_texts((p.name[: -len(".txt")], read_text(p)) for p in files)


def spread(texts: Iterable[tuple[str, str]], chars: int) -> list[tuple[str, str]]:
    """Many short documents from every file: `texts` taken in turn from each file (the stem before the
    ':' of their ids), each cut to its first `chars` characters. What a trace for a batch of
    different requests reads (`moe.batch_union`): a window from each of B distinct documents."""
    if chars < 1:
        raise ValueError(f"chars must be >= 1, got {chars}")
    by_file: dict[str, list[tuple[str, str]]] = {}
    for doc_id, text in texts:
        by_file.setdefault(doc_id.split(":", 1)[0], []).append((doc_id, text[:chars]))
    queues = list(by_file.values())
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]
