"""A GGUF file's metadata read by streaming its key-value section (GGUF v2/v3, little-endian), with
the standard library alone, before llama.cpp or the gguf package opens the file.

Two uses: llama.cpp aborts the process (no error to catch) on MoE fields that contradict each other,
so `check_moe_fields` reads them first; and `gguf.GGUFReader` (`models.gguf_info`) maps the whole
file and builds a view for every array element and tensor (tens of seconds on a 128k-token
vocabulary on a loaded machine), so a check that needs a few keys before anything is loaded (the
draft's vocabulary, `bench.candidate`) reads them here: one pass over the header, stopping once the
keys asked for are found. Layout from ggml's docs/gguf.md: magic "GGUF", u32 version, u64 tensor
count, u64 key-value count, then per pair a string key, a u32 value type and the value; an array
holds an element type u32, a count u64 and the elements. No tensor is read.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import BinaryIO, Iterable

MAGIC = b"GGUF"
# value type -> struct format of one scalar (ggml docs/gguf.md, gguf_type); 8 = string, 9 = array
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


def read_exact(f: BinaryIO, n: int) -> bytes:
    """n bytes, or a ValueError naming the file when it ends first (a damaged or cut file); a length
    past the file's end is refused before it is read (a flipped length asked for 1 TB: MemoryError)."""
    if n > os.fstat(f.fileno()).st_size - f.tell():
        raise ValueError(f"{f.name} ends inside its GGUF metadata; copy or convert the file again")
    data = f.read(n)
    if len(data) != n:
        raise ValueError(f"{f.name} ends inside its GGUF metadata; copy or convert the file again")
    return data


def read_string(f: BinaryIO) -> str:
    (n,) = struct.unpack("<Q", read_exact(f, 8))
    return read_exact(f, n).decode("utf-8", errors="replace")


def read_value(f: BinaryIO, kind: int, keep: bool):
    """One value of type `kind`; skipped (None returned) unless `keep`, without decoding what is skipped."""
    if kind in SCALARS:
        fmt = SCALARS[kind]
        data = read_exact(f, struct.calcsize(fmt))
        return struct.unpack(fmt, data)[0] if keep else None
    if kind == STRING:
        (n,) = struct.unpack("<Q", read_exact(f, 8))
        data = read_exact(f, n)
        return data.decode("utf-8", errors="replace") if keep else None
    if kind == ARRAY:
        inner, count = struct.unpack("<IQ", read_exact(f, 12))
        if inner in SCALARS and not keep:
            f.seek(count * struct.calcsize(SCALARS[inner]), 1)
            return None
        items = [read_value(f, inner, keep) for _ in range(count)]
        return items if keep else None
    raise ValueError(f"{f.name} has a GGUF value of unknown type {kind}; is it a GGUF v2/v3 file?")


def read_metadata(path: str | Path, keys: Iterable[str]) -> dict:
    """{key: value} for each of `keys` the file holds (an array as a list); absent keys are left out."""
    wanted = set(keys)
    path = Path(path).expanduser()
    with path.open("rb") as f:
        if read_exact(f, 4) != MAGIC:
            raise ValueError(f"{path} is not a GGUF file; convert the model with llama.cpp's convert_hf_to_gguf.py")
        version, _, n_kv = struct.unpack("<IQQ", read_exact(f, 20))
        if version not in (2, 3):
            raise ValueError(f"{path} is GGUF version {version} (or big-endian); this reader takes v2 and v3")
        found = {}
        for _ in range(n_kv):
            key = read_string(f)
            (kind,) = struct.unpack("<I", read_exact(f, 4))
            value = read_value(f, kind, key in wanted)
            if key in wanted:
                found[key] = value
                if len(found) == len(wanted):
                    break
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
