"""Every text moespec ships or reads, in one place: the corpora that routing traces read, the built-in
prompts that verify passes, sweeps and chat requests read, and the text the trained presets learn
from with the fixed split that holds part of it back. Imports no torch.

Corpora. A file is split into documents in one of two ways:
- if it has a line holding only a form feed (``\\f``), those lines separate its documents;
- otherwise its blank-line-separated paragraphs are joined, in order, into documents of at least
  `MIN_DOC_BYTES` bytes of UTF-8 (a shorter remainder joins the last document).
Document ids are ``<file stem>:<index>``.

Prompts. The built-in prompts cut to a depth, the chat requests, and the windows that repetitions
verify `STRIDE` tokens apart (the target's greedy continuation of them is `bench.verified_text`).

Training text. Two sources, both on every machine: the Python standard library's own source (its
`.py` files, without `test/` and `site-packages/`, about 13 MB) and the corpus shipped in
`moespec/data/corpus`. A document is a whole stdlib file or one document of a corpus file. Whether
it is held out depends on its name only (sha256 of the name), so the split is the same on every
machine and never changes when files are added: one stdlib file in `STDLIB_HOLDOUT`, one corpus
document in `CORPUS_HOLDOUT`. Held-out documents are never trained on; the benchmarks read them.
"""

from __future__ import annotations

import hashlib
import json
import re
import sysconfig
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterable

import numpy as np

# The byte tokenizer's ids: 0..255 the UTF-8 bytes, then BOS (`models.tokenizer` builds on it).
BOS_ID = 256


# ---- corpora ----

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


# ---- prompts ----

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


# ---- training text ----

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
