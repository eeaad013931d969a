"""Crash-safe point logs: finished measurement points, appended one JSON line each, for resumption.

A point log (`<name>.points.jsonl` beside an artifact) starts with a header line
`{"provenance": {...}}` and holds one `{"key": ..., "value": ...}` line per finished point, flushed
and fsynced at once, so an interrupted run loses at most the point it was measuring. It resumes
only under the provenance it was made with; otherwise it refuses, or with `restart=True` moves the
old log to `<name>.old` and starts again.

A kill mid-write leaves a partial last line. Every line is read on its own: a damaged one is
skipped and counted (one `PointLogWarning`), and the rest are kept. Before its first append a log
ends a partial last line with "\\n", so a new point never glues onto the fragment.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

from moespec.artifacts import json_safe
from moespec.provenance import ProvenanceMismatch, canonical, check


class PointLogWarning(UserWarning):
    """Damaged lines were skipped while reading a point log."""


def _fix(path: Path) -> str:
    return (f"pass --restart to move it to {path.name}.old and measure again, "
            "or write to another output path")


def _row(line: bytes) -> tuple[str, Any] | None:
    """(key, value) of a point line, or None if the line is damaged."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    if not isinstance(row, dict) or not isinstance(row.get("key"), str) or "value" not in row:
        return None
    return row["key"], row["value"]


def _header(line: bytes) -> dict | None:
    """The provenance of a header line, or None if the line is no intact header."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    if isinstance(row, dict) and "key" not in row and isinstance(row.get("provenance"), dict):
        return row["provenance"]
    return None


class PointLog:
    """Append-only JSON-lines log of finished points of one provenance, keyed for resumption.

    >>> log = PointLog("out/measure.points.jsonl", {"model": "synthetic:olmoe-tiny", ...})
    >>> if not log.has(key): log.append(key, result)

    provenance: None or a JSON-safe dict (see `moespec.provenance`); None is the empty provenance.
    damaged: how many lines were skipped when the log was read.
    """

    def __init__(self, path: str | Path, provenance: dict | None = None, *, restart: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.provenance = canonical(provenance)
        if restart and self.path.exists():
            os.replace(self.path, self.path.with_name(self.path.name + ".old"))
        if not self.path.exists() or self.path.stat().st_size == 0:
            self._create()
        found, self._points, self.damaged = self._read()
        if found is None:
            raise ProvenanceMismatch(
                f"the point log {self.path} has no intact provenance header (written by an older moespec, "
                f"or its first line is damaged), so its {len(self._points)} points cannot be matched to "
                f"this run\n{_fix(self.path)}", ["provenance: header missing or damaged"])
        check(self.provenance, found, what=f"the point log {self.path}", fix=_fix(self.path))
        if self.damaged:
            warnings.warn(f"{self.path}: {self.damaged} damaged line(s) skipped (cut by an interruption or "
                          f"edited); kept the other {len(self._points)} points", PointLogWarning, stacklevel=2)
        self._tail_checked = False

    def _create(self) -> None:
        """Write the header to a temporary file and rename it: the log exists only with its header."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(json.dumps({"provenance": self.provenance}, sort_keys=True).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def _read(self) -> tuple[dict | None, dict[str, Any], int]:
        """(header provenance or None, points with the last of each key winning, damaged lines)."""
        lines = self.path.read_bytes().split(b"\n")
        found = _header(lines[0])
        points, damaged = {}, 0
        for line in lines[1:] if found is not None else lines:
            if not line.strip():
                continue
            row = _row(line)
            if row is None:
                damaged += 1
            else:
                points[row[0]] = row[1]
        return found, points, damaged

    @staticmethod
    def _key(key: Any) -> str:
        return key if isinstance(key, str) else json.dumps(json_safe(key), sort_keys=True)

    def has(self, key: Any) -> bool:
        return self._key(key) in self._points

    def get(self, key: Any) -> Any:
        return self._points[self._key(key)]

    def append(self, key: Any, value: Any) -> None:
        """Append one whole line in one write, then flush and fsync."""
        k, v = self._key(key), json_safe(value)
        line = json.dumps({"key": k, "value": v}, allow_nan=False).encode() + b"\n"
        if not self._tail_checked:
            with open(self.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    line = b"\n" + line  # ends the fragment a kill left, as a line of its own
            self._tail_checked = True
        with open(self.path, "ab") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self._points[k] = v

    def __len__(self) -> int:
        return len(self._points)

    def items(self) -> Iterator[tuple[str, Any]]:
        return iter(self._points.items())


OnPoint = Callable[[dict, bool], None]  # (key, resumed) after each point, measured or read back


def logged_point(log: PointLog | None, key: dict, compute: Callable[[], Any], on_point: OnPoint | None) -> Any:
    """The value of point `key`: from the log when there, else computed and appended at once."""
    resumed = log is not None and log.has(key)
    if resumed:
        value = log.get(key)
    else:
        value = compute()
        if log is not None:
            log.append(key, value)
    if on_point is not None:
        on_point(key, resumed)
    return value
