"""Shared by the compiled-kernel tests: a build that fails is a failure unless the run opted out."""

import os

import pytest

from moespec.models import synthetic
from moespec.moe import compiled, dense

# A machine without a compiler runs the suite with MOESPEC_NO_COMPILE=1 (the fallbacks' tests still
# run); anywhere else an unavailable build fails the test instead of skipping it.
EXPECT_COMPILER = os.environ.get(compiled.NO_COMPILE, "") in ("", "0")


def moe_presets() -> list[str]:
    """Every tiny synthetic preset with experts, read from the presets: a new MoE preset is tested
    wherever this list is (the dense ones, which have no experts, are left out)."""
    return [name for name in synthetic.preset_names()
            if name.endswith("-tiny") and synthetic.PRESETS[name].experts_key is not None]


def needs_compiler(module) -> None:
    """Return if `module` (compiled or dense) built; else fail, or skip under MOESPEC_NO_COMPILE=1."""
    if module.available():
        return
    if EXPECT_COMPILER:
        pytest.fail(f"{module.__name__} did not build: {module.unavailable_reason()}")
    pytest.skip(f"{compiled.NO_COMPILE}=1: the compiled kernels are off")


@pytest.fixture
def fresh(monkeypatch):
    """A fresh build state before and after: monkeypatched builds must not leak into other tests."""
    monkeypatch.delenv(compiled.NO_COMPILE, raising=False)
    monkeypatch.delenv(compiled.FORCE_ISA, raising=False)
    compiled.reset()
    dense.reset()
    yield
    compiled.reset()
    dense.reset()
