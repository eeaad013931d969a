"""A GGUF file's metadata, read from its header with the standard library alone, before llama.cpp
opens the file: llama.cpp aborts the process (no error to catch) on MoE fields that contradict each
other, so they are checked here first (`check_moe_fields`).

The header (GGUF v2/v3): magic "GGUF", version u32, tensor count u64, metadata count u64, then each
metadata entry as key (u64 length + UTF-8), value type u32 and value; arrays hold an element type
u32, a count u64 and the elements. Only the metadata is read, never a tensor.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


def _read(f: BinaryIO, fmt: str):
    size = struct.calcsize(fmt)
    raw = f.read(size)
    if len(raw) != size:
        raise ValueError("the header ends early")
    return struct.unpack(fmt, raw)[0]


def _string(f: BinaryIO) -> str:
    n = _read(f, "<Q")
    raw = f.read(n)
    if len(raw) != n:
        raise ValueError("the header ends early")
    return raw.decode("utf-8", errors="replace")


def _value(f: BinaryIO, kind: int, keep: bool) -> Any:
    """The value of type `kind` at f's position (arrays skipped: None unless `keep`)."""
    if kind in _SCALARS:
        return _read(f, _SCALARS[kind])
    if kind == STRING:
        return _string(f)
    if kind == ARRAY:
        inner, count = _read(f, "<I"), _read(f, "<Q")
        if inner in _SCALARS and not keep:
            f.seek(count * struct.calcsize(_SCALARS[inner]), 1)
            return None
        items = [_value(f, inner, keep) for _ in range(count)]
        return items if keep else None
    raise ValueError(f"unknown metadata value type {kind}")


def read_metadata(path: str | Path, keys: set[str]) -> dict[str, Any]:
    """{key: value} for those of `keys` the file's metadata holds; ValueError naming the file when
    its header is not GGUF or is cut short."""
    path = Path(path)
    found: dict[str, Any] = {}
    try:
        with path.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise ValueError("it does not start with GGUF")
            version = _read(f, "<I")
            if version < 2:
                raise ValueError(f"GGUF version {version} predates the 64-bit header this reader knows")
            _read(f, "<Q")
            for _ in range(_read(f, "<Q")):
                key, kind = _string(f), _read(f, "<I")
                value = _value(f, kind, keep=key in keys)
                if key in keys:
                    found[key] = value
    except (ValueError, struct.error, OSError) as e:
        raise ValueError(f"{path}'s GGUF header cannot be read ({e}); copy or convert the file again") from None
    return found


def check_moe_fields(path: str | Path) -> None:
    """ValueError (the fields, their values, the fix) when the file's expert counts contradict each
    other: more experts used per token than it has, or a zero expert count beside experts used. A
    header this reader cannot parse is left to llama.cpp, which reports those in an error of its own."""
    try:
        arch = read_metadata(path, {"general.architecture"}).get("general.architecture")
        if not isinstance(arch, str):
            return
        total, used = f"{arch}.expert_count", f"{arch}.expert_used_count"
        meta = read_metadata(path, {total, used})
    except ValueError:
        return
    N, m = meta.get(total), meta.get(used)
    if N is None or m is None:
        return
    if m > 0 and N == 0:
        raise ValueError(f"{path} says {total} = 0 but {used} = {m}: a model cannot use experts it does not have; "
                         "convert the model again with llama.cpp's convert_hf_to_gguf.py")
    if m > N:
        raise ValueError(f"{path} says {used} = {m}, more than its {total} = {N}: each token cannot use more experts "
                         "than the model has; convert the model again with llama.cpp's convert_hf_to_gguf.py")
