"""`backends.gguf_header` reads the metadata of files llama.cpp's own converter wrote (seven MoE
architectures, SmolLM2's 49,152-token vocabulary in the header) as the gguf package reads them."""

import gguf
import pytest

from moespec.backends.gguf_header import read_metadata

TYPES = ("f32", "q8_0")


def test_the_header_reads_as_the_gguf_package_reads_it(converted):
    for arch, files in converted.items():
        for kind in TYPES:
            reader = gguf.GGUFReader(files[kind])
            name = reader.fields["general.architecture"].contents()
            keys = {"general.architecture", f"{name}.expert_count", f"{name}.expert_used_count", f"{name}.block_count",
                    "tokenizer.ggml.tokens", "tokenizer.ggml.bos_token_id"}
            want = {k: reader.fields[k].contents() for k in keys if k in reader.fields}
            assert len(want) >= 5, (arch, kind, sorted(want))
            assert read_metadata(files[kind], keys) == want, (arch, kind)


def test_a_header_cut_short_is_named(converted, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(converted["olmoe"]["q8_0"].read_bytes()[:4096])  # inside the vocabulary's array
    with pytest.raises(ValueError, match="cut.gguf ends inside its GGUF metadata"):
        read_metadata(cut, {"no.such.key"})  # read to the end of the section
