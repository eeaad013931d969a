"""The real-size benchmarks draw their checkpoints tensor by tensor from a name -> shape map
(`layer_tensors`): each map must be what transformers itself saves for the architecture, or
llama.cpp's converter refuses the checkpoint (or, worse, maps a tensor wrongly)."""

import importlib.util
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
safe_open = pytest.importorskip("safetensors").safe_open

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def saved_layers(model, folder: Path) -> dict[str, tuple[int, ...]]:
    """The decoder layers' tensors transformers writes for `model`: name -> shape."""
    model.save_pretrained(folder)
    out = {}
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            out.update({k: tuple(f.get_slice(k).get_shape()) for k in f.keys() if k.startswith("model.layers.")})
    return out


def test_deepseek_v2_lite_layers_are_what_transformers_saves(tmp_path):
    ds = script("deepseek_v2_lite_real_size")
    s = {**ds.TINY, "num_hidden_layers": 3, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32, "vocab_size": 256}
    config = transformers.DeepseekV2Config(**s, rope_parameters=dict(ds.YARN))
    drawn = {k: v for l in range(3) for k, v in ds.layer_tensors(l, s).items()}
    assert "model.layers.0.mlp.down_proj.weight" in drawn and "model.layers.0.mlp.gate.weight" not in drawn  # dense
    assert drawn["model.layers.1.mlp.shared_experts.up_proj.weight"] == (2 * 32, 64)
    assert drawn == saved_layers(transformers.DeepseekV2ForCausalLM(config), tmp_path)


def test_gpt_oss_layers_are_what_transformers_saves_with_the_experts_in_mxfp4(tmp_path):
    oss = script("gpt_oss_20b_real_size")
    s = {**oss.TINY, "hidden_size": 64, "intermediate_size": 96, "num_local_experts": 4, "num_experts_per_tok": 2,
         "vocab_size": 256}
    drawn = {k: v for l in range(2) for k, v in oss.layer_tensors(l, s).items()}
    saved = saved_layers(transformers.GptOssForCausalLM(transformers.GptOssConfig(**s)), tmp_path)
    for key, (E, rows, blocks, sixteen) in [(k, v) for k, v in drawn.items() if k.endswith("_blocks")]:
        base = key.removesuffix("_blocks")
        assert saved.pop(base) == (E, blocks * 32, rows) and sixteen == 16  # transformers keeps [E, in, out]
        assert drawn.pop(base + "_scales") == (E, rows, blocks)
        drawn.pop(key)
    assert drawn == saved
