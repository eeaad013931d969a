"""The hostile files of the robustness probes (`robustness_probes.py`): GGUF files, Parquet traces and
chain artifacts cut, flipped, emptied or edited, each derived from a good one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable


def patch_gguf_int(src: Path, dst: Path, key: str, value: int) -> None:
    """A copy of the GGUF file `src` whose integer metadata `key` holds `value` (patched in place)."""
    import struct

    data = bytearray(src.read_bytes())
    at = data.index(key.encode()) + len(key)
    kind = struct.unpack_from("<I", data, at)[0]
    struct.pack_into({4: "<I", 5: "<i", 10: "<Q", 11: "<q"}[kind], data, at + 4, value)
    dst.write_bytes(bytes(data))


def flipped(src: Path, dst: Path, at: int, count: int = 8) -> None:
    """A copy of `src` with `count` bytes from offset `at` (negative: from the end) inverted."""
    data = bytearray(src.read_bytes())
    start = at % len(data)
    for i in range(start, min(start + count, len(data))):
        data[i] ^= 0xFF
    dst.write_bytes(bytes(data))


def truncated(src: Path, dst: Path, size: int) -> None:
    dst.write_bytes(src.read_bytes()[:size])


def hostile_ggufs(cache: Path, good: Path) -> dict[str, Path]:
    h = cache / "hostile"
    h.mkdir(exist_ok=True)
    size = good.stat().st_size
    files = {name: h / f"{name}.gguf" for name in (
        "empty", "text", "header-cut", "half", "magic", "version", "kv-count", "used-above-count", "count-zero",
        "key-length", "tensor-bytes")}
    files["empty"].write_bytes(b"")
    files["text"].write_text("this is not a model\n")
    truncated(good, files["header-cut"], 2000)
    truncated(good, files["half"], size // 2)
    flipped(good, files["magic"], 0, 1)
    data = bytearray(good.read_bytes())
    data[4:8] = (99).to_bytes(4, "little")
    files["version"].write_bytes(bytes(data))
    data = bytearray(good.read_bytes())
    data[16:24] = (2 ** 60).to_bytes(8, "little")  # key-value count
    files["kv-count"].write_bytes(bytes(data))
    patch_gguf_int(good, files["used-above-count"], "olmoe.expert_used_count", 100)
    patch_gguf_int(good, files["count-zero"], "olmoe.expert_count", 0)
    data = bytearray(good.read_bytes())
    data[24:32] = (2 ** 40).to_bytes(8, "little")  # the first key's length
    files["key-length"].write_bytes(bytes(data))
    flipped(good, files["tensor-bytes"], -200_000, 64)  # inside the last tensor's data: no checksum can tell
    return files


def hostile_traces(cache: Path, good: Path, other: Path, json_file: Path) -> dict[str, Path]:
    h = cache / "hostile"
    h.mkdir(exist_ok=True)
    files = {name: h / f"{name}.parquet" for name in ("empty", "text", "half", "footer", "magic", "json")}
    files["empty"].write_bytes(b"")
    files["text"].write_text("doc,token\n")
    truncated(good, files["half"], good.stat().st_size // 2)
    flipped(good, files["footer"], -8, 4)  # the footer's length
    flipped(good, files["magic"], -4, 4)
    shutil.copy(json_file, files["json"])
    files["other-model"] = other
    files["missing"] = h / "missing.parquet"
    files["folder"] = h / "folder.parquet"
    files["folder"].mkdir(exist_ok=True)
    return files


def edited(src: Path, dst: Path, edit: Callable[[dict], None]) -> Path:
    doc = json.loads(src.read_text())
    edit(doc)
    dst.write_text(json.dumps(doc))
    return dst


def other_model(doc: dict) -> None:
    doc["payload"]["model"] = "synthetic:mixtral-tiny"
    prov = doc["payload"].get("provenance")
    if isinstance(prov, dict):
        prov["model"], prov["fingerprint"] = "synthetic:mixtral-tiny", "0123456789abcdef"


GENERIC_EDITS: dict[str, Callable[[dict], None]] = {
    "kind": lambda d: d.update(kind="bogus"),
    "schema": lambda d: d.update(schema_version=99),
    "no-payload": lambda d: d.pop("payload"),
    "payload-list": lambda d: d.update(payload=[]),
    "other-model": other_model,
}


def hostile_artifacts(cache: Path, good: Path) -> dict[str, Path]:
    """Broken copies of the artifact `good`: cut, not UTF-8, not JSON, a list, edited header fields,
    another model's; and a missing file and a folder in its place."""
    h = cache / "hostile" / good.stem
    h.mkdir(parents=True, exist_ok=True)
    files = {name: h / f"{name}.json" for name in ("empty", "half", "latin1", "text", "list")}
    files["empty"].write_bytes(b"")
    truncated(good, files["half"], good.stat().st_size // 2)
    files["latin1"].write_bytes(good.read_bytes().replace(b'"payload"', '"payload" \xff'.encode("latin-1"), 1))
    files["text"].write_text("not json\n")
    files["list"].write_text("[1, 2, 3]")
    for name, edit in GENERIC_EDITS.items():
        files[name] = edited(good, h / f"{name}.json", edit)
    files["missing"] = h / "missing.json"
    files["folder"] = h / "folder.json"
    files["folder"].mkdir(exist_ok=True)
    return files


# field edits of one kind of artifact: (file, name, edit)
def drop_field(*path):
    def edit(doc):
        node = doc["payload"]
        for p in path[:-1]:
            node = node[p]
        node.pop(path[-1]) if isinstance(node, dict) else node.pop(int(path[-1]))
    return edit


def set_field(value, *path):
    def edit(doc):
        node = doc["payload"]
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value
    return edit


FIELD_EDITS = [
    ("characterization", "no-fits", drop_field("fits")),
    ("characterization", "eps-text", set_field("x", "eps")),
    ("characterization", "no-layers", drop_field("layers")),
    ("characterization", "N-3", set_field(3, "N")),
    ("characterization", "u_bar-null", set_field(None, "u_bar")),
    ("measurement-base", "no-verify", drop_field("verify")),
    ("measurement-base", "h-text", set_field("x", "h")),
    ("measurement-base", "verify-empty", set_field([], "verify")),
    ("prediction", "no-depths", drop_field("depths")),
    ("prediction", "V-text", set_field("x", "depths", 0, "versions", "calibrated", "V")),
    ("prediction", "depths-empty", set_field([], "depths")),
    ("prediction", "V-negative", set_field([-1.0, -2.0, -3.0], "depths", 0, "versions", "calibrated", "V", "dedup")),
    ("measurement", "no-oracle", drop_field("oracle"), "exit1"),  # nothing to score: exit 1, nothing written
    ("measurement", "oracle-text", set_field("x", "oracle")),
]
