"""Versioned JSON artifacts: atomic write and load with a schema check (point logs: `pointlog`).

An artifact is one JSON object with a header (`kind`, `schema_version`, `created`, `machine`,
`command`) and a `payload`. Long measurements also keep a JSON-lines point log beside the artifact
(`<name>.points.jsonl`): each finished point is appended and flushed at once, so an interrupted run
loses at most the point it was measuring and resumes by skipping the keys already there.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

from moespec.artifact_schema import check as check_fields

SCHEMA_VERSION = 2


def json_safe(value: Any) -> Any:
    """JSON-safe copy: numpy scalars and arrays to Python, non-finite floats to None."""
    if hasattr(value, "to_dict") and callable(value.to_dict):
        return json_safe(value.to_dict())
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "tolist"):
        return json_safe(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value


def dump_json(path: str | Path, obj: Any, *, compact: bool = False) -> Path:
    """Write `obj` as JSON atomically: a temporary file in the same folder, then a rename. `compact`:
    one line through the C encoder (indentation takes Python's slower encoder), for files written on
    a decode's clock such as the step-time store."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(json_safe(obj), f, indent=None if compact else 1, allow_nan=False,
                      separators=(",", ":") if compact else None)
            f.write("\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it owner-only; an artifact is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict:
    """What every artifact records about where it was made.

    Versions come from the installed packages, so the torch-free chain (predict, score, report)
    records them without importing torch; torch's threads and device are added once it is loaded.
    """
    info = {
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "torch": metadata.version("torch"),
        "transformers": metadata.version("transformers"),
        "platform": platform.platform(),
    }
    if "torch" in sys.modules:
        from moespec.device import torch_info

        info.update(torch_info())
    return info


def write(path: str | Path, kind: str, payload: Any, *, machine: dict | None = None,
          parents: Sequence[str | Path] = ()) -> Path:
    """Write an artifact of `kind` with the standard header around `payload`; `parents`, the files it
    was made from, go in the header with their digests (`parents_of`, `changed_parents`)."""
    if machine is None:
        machine = machine_info()
    doc = {
        "kind": kind,
        "schema_version": SCHEMA_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(sys.argv),
        "machine": machine,
        "payload": payload,
    }
    if parents:
        doc["parents"] = parents_of(path, parents)
    return dump_json(path, doc)


def file_digest(path: str | Path) -> str:
    """sha256 of a file's bytes (its first 16 hex digits): which file an artifact was made from."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def parents_of(child: str | Path, parents) -> dict[str, str]:
    """{path of each parent relative to the child's folder: `file_digest`}: the header's "parents"."""
    return {os.path.relpath(p, Path(child).parent): file_digest(p) for p in parents}


def changed_parents(path: str | Path) -> list[str]:
    """The parents an artifact's header names ("parents": {path relative to its folder: digest}) that
    are gone or hold other bytes now: a child made from them is stale. [] when it names none."""
    path = Path(path)
    try:
        parents = json.loads(path.read_text(encoding="utf-8")).get("parents") or {}
    except (OSError, ValueError, AttributeError):
        return []
    return [name for name, digest in parents.items()
            if not (path.parent / name).exists() or file_digest(path.parent / name) != digest]


def kind_of(path: str | Path) -> str | None:
    """The kind an artifact's header names (None for a file that is not one), read before `load`."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return doc.get("kind") if isinstance(doc, dict) else None


def load(path: str | Path, kind: str, needs: tuple[str, ...] = ()) -> dict:
    """Read an artifact and check its kind, schema version and the fields its readers need
    (`artifact_schema`: every field it names where present, and the top-level fields in `needs`);
    returns the whole document."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no {kind} artifact at {path}; create it with `moespec {kind}`")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:  # a damaged file, or not text at all
        raise ValueError(f"{path} is not valid JSON ({e}); delete it and run `moespec {kind}` again") from e
    if not isinstance(doc, dict) or "payload" not in doc:
        raise ValueError(f"{path} is not a moespec artifact (no header/payload)")
    if doc.get("kind") != kind:
        raise ValueError(f"{path} holds a {doc.get('kind')!r} artifact, expected {kind!r}")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(
            f"{path} has schema version {doc.get('schema_version')}, this moespec reads "
            f"{SCHEMA_VERSION}; run `moespec {kind}` again to regenerate it"
        )
    check_fields(kind, doc["payload"], path, needs)  # a field the readers need, missing or edited: named here
    return doc
