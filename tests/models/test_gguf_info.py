"""The MoE layout of GGUF files llama.cpp's converter wrote (`tests/converted.py`), read from the file
(`models.gguf_info.layout`) and checked against what the transformers config says, computed here
by hand: N, m, the MoE blocks, the bytes of one expert in the file's own types (biases included),
the bytes every pass reads once (shared experts and their gate), leading dense blocks."""

import json

import pytest

from moespec.models import gguf_info
from tests.converted import RECIPES

# bytes per weight of each file type, for the 2-D expert matrices; 1-D biases and gates stay f32
PER_WEIGHT = {"f32": 4, "f16": 2, "q8_0": 34 / 32}
EXPERT_COUNT = ("num_experts", "num_local_experts", "n_routed_experts")


def config(converted, arch: str) -> dict:
    return json.loads((converted[arch]["checkpoint"] / "config.json").read_text())


@pytest.mark.parametrize("kind", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("arch", sorted(RECIPES))
def test_the_layout_is_the_checkpoints(converted, arch, kind):
    c = config(converted, arch)
    lay = gguf_info.layout(converted[arch][kind])
    H = c["hidden_size"]
    F = c.get("moe_intermediate_size") or c["intermediate_size"]
    N = next(c[k] for k in EXPERT_COUNT if k in c)
    dense = c.get("first_k_dense_replace", 0)
    assert lay.architecture == RECIPES[arch][2]
    assert (lay.num_experts, lay.top_k, lay.hidden, lay.expert_ffn) == (N, c["num_experts_per_tok"], H, F)
    assert lay.moe_layers == tuple(range(dense, c["num_hidden_layers"])) and lay.dense_blocks == tuple(range(dense))
    biases = 4 * (2 * F + H) if arch == "gpt-oss" else 0  # gate/up and down biases, f32
    assert lay.expert_bytes == (round(3 * H * F * PER_WEIGHT[kind]) + biases,) * lay.num_layers
    assert lay.expert_biases == (arch == "gpt-oss")
    assert lay.activation == ("swiglu_oai" if arch == "gpt-oss" else "silu")
    shared_ffn = c.get("shared_expert_intermediate_size") or F * c.get("n_shared_experts", 0)
    shared_gate = 4 * H if arch == "qwen2moe" else 0  # Qwen2-MoE's sigmoid gate of its shared expert, [H] f32
    assert lay.shared_bytes == (round(3 * H * shared_ffn * PER_WEIGHT[kind]) + shared_gate,) * lay.num_layers
    assert lay.weight_type == kind
    ident = gguf_info.identity(converted[arch][kind])
    assert (ident["num_experts"], ident["top_k"], ident["num_layers"]) == (N, lay.top_k, lay.num_layers)


def test_a_dense_file_and_a_file_without_the_expert_counts_are_refused(converted, smollm2_gguf, tmp_path):
    with pytest.raises(ValueError, match="dense model"):
        gguf_info.layout(smollm2_gguf)
    bare = without_key(converted["olmoe"]["f16"], "olmoe.expert_used_count", tmp_path / "bare.gguf")
    with pytest.raises(ValueError, match="no olmoe.expert_used_count metadata"):
        gguf_info.layout(bare)
    assert gguf_info.moe_shape(smollm2_gguf) == {"num_experts": None, "top_k": None, "num_layers": None}


def without_key(path, key: str, out):
    """A copy of the GGUF file `path` at `out` without the metadata `key` (gguf-py's writer)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(out), arch)
    for name, f in reader.fields.items():
        if name == key or name.startswith("GGUF.") or name == "general.architecture":
            continue
        kind = f.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_array(name, f.contents())
        else:
            writer.add_key_value(name, f.contents(), kind)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
