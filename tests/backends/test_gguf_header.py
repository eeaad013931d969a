"""`backends.gguf_header` reads the metadata of files llama.cpp's own converter wrote (two MoE
architectures and types, SmolLM2's 49,152-token vocabulary in the header) as the gguf package reads
them (`tests/backends/test_gguf_metadata.py` covers every value type on a file written here)."""

import gguf
import pytest

from moespec.backends.gguf_header import read_metadata

FILES = (("olmoe", "q8_0"), ("deepseek2", "f32"))  # GGUFReader takes seconds per file on this vocabulary


def test_the_header_reads_as_the_gguf_package_reads_it(converted):
    for arch, kind in FILES:
        path = converted[arch][kind]
        reader = gguf.GGUFReader(path)
        name = reader.fields["general.architecture"].contents()
        keys = {"general.architecture", f"{name}.expert_count", f"{name}.expert_used_count", f"{name}.block_count",
                "tokenizer.ggml.tokens", "tokenizer.ggml.bos_token_id"}
        want = {k: reader.fields[k].contents() for k in keys if k in reader.fields}
        assert len(want) >= 5, (arch, kind, sorted(want))
        assert read_metadata(path, keys) == want, (arch, kind)


def test_a_header_cut_short_is_named(converted, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(converted["olmoe"]["q8_0"].read_bytes()[:4096])  # inside the vocabulary's array
    with pytest.raises(ValueError, match="cut.gguf ends inside its GGUF metadata"):
        read_metadata(cut, {"no.such.key"})  # read to the end of the section


def test_a_file_with_an_impossible_key_length_is_named_by_the_cached_reader(converted, tmp_path):
    """gguf's reader stops on such a file with an IndexError deep inside it; moespec's one reader
    (`models.gguf_info.reader`, which every header read and the embedding go through) names the file."""
    from moespec.models import gguf_info

    bad = tmp_path / "key-length.gguf"
    data = bytearray(converted["olmoe"]["q8_0"].read_bytes())
    data[24:32] = (2 ** 40).to_bytes(8, "little")  # the first key's length
    bad.write_bytes(bytes(data))
    with pytest.raises(IndexError):
        gguf.GGUFReader(bad)  # what the package itself does: the case this test is about
    with pytest.raises(ValueError, match="key-length.gguf is not a readable GGUF file"):
        gguf_info.reader(bad)
