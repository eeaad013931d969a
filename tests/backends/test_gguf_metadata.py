"""The streaming metadata reader (backends.gguf_header) agrees with gguf.GGUFReader on every value type."""

import gguf
import numpy as np
import pytest

from moespec.backends.gguf_header import read_metadata

VALUES = {
    "t.u8": (7, gguf.GGUFValueType.UINT8), "t.i8": (-7, gguf.GGUFValueType.INT8),
    "t.u16": (700, gguf.GGUFValueType.UINT16), "t.i16": (-700, gguf.GGUFValueType.INT16),
    "t.u32": (70000, gguf.GGUFValueType.UINT32), "t.i32": (-70000, gguf.GGUFValueType.INT32),
    "t.f32": (0.5, gguf.GGUFValueType.FLOAT32), "t.bool": (True, gguf.GGUFValueType.BOOL),
    "t.str": ("héllo", gguf.GGUFValueType.STRING), "t.u64": (1 << 40, gguf.GGUFValueType.UINT64),
    "t.i64": (-(1 << 40), gguf.GGUFValueType.INT64), "t.f64": (0.25, gguf.GGUFValueType.FLOAT64),
}


def write(path):
    w = gguf.GGUFWriter(str(path), "llama")
    for key, (value, kind) in VALUES.items():
        w.add_key_value(key, value, kind)
    w.add_array("t.ints", [3, 1, 4, 1, 5])
    w.add_token_list(["<s>", "a", "ß", ""])
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_agrees_with_gguf_reader(tmp_path):
    path = write(tmp_path / "m.gguf")
    keys = [*VALUES, "t.ints", "tokenizer.ggml.tokens", "general.architecture"]
    ours, reader = read_metadata(path, keys + ["t.absent"]), gguf.GGUFReader(str(path))
    assert set(ours) == set(keys)
    for key in keys:
        assert ours[key] == reader.fields[key].contents(), key
    assert read_metadata(path, ["tokenizer.ggml.tokens"]) == {"tokenizer.ggml.tokens": ["<s>", "a", "ß", ""]}


def test_refuses_what_is_not_gguf(tmp_path):
    text = tmp_path / "x.gguf"
    text.write_bytes(b"PK\x03\x04....................")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        read_metadata(text, ["a"])
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(write(tmp_path / "m.gguf").read_bytes()[:60])
    with pytest.raises(ValueError, match="ends inside its GGUF metadata"):
        read_metadata(cut, ["tokenizer.ggml.tokens"])
