"""What `import moespec.x` loads, and when moespec's kernels join transformers' ExpertsInterface.

Each check runs in a fresh interpreter: in this one, other tests have long since loaded torch and
registered the kernels.
"""

import subprocess
import sys
import textwrap

import pytest

# The numbers-in, numbers-out side: the cost model, the report, and the artifact-side scoring.
TORCH_FREE = [
    "moespec",
    "moespec.kernel_names",
    "moespec.engine.policy",
    "moespec.pointlog",
    "moespec.provenance",
    "moespec.artifacts",
    "moespec.costmodel",
    "moespec.costmodel.bandwidth",
    "moespec.costmodel.settings",
    "moespec.models.gguf_info",
    "moespec.costmodel.bounds",
    "moespec.costmodel.dedup",
    "moespec.costmodel.fit",
    "moespec.costmodel.predict",
    "moespec.costmodel.score",
    "moespec.costmodel.steptime",
    "moespec.costmodel.theory",
    "moespec.report",
    "moespec.report.build",
    "moespec.report.fig_bandwidth",
    "moespec.report.fig_reuse",
    "moespec.report.figures",
    "moespec.report.html",
    "moespec.report.plotting",
    "moespec.chain.prediction",
    "moespec.texts",
    "moespec.costmodel.sweep_cells",
    "moespec.costmodel.verify_times",
    "moespec.moe.reuse",
    "moespec.moe.traces",
    "moespec.costmodel.positional",
    "moespec.costmodel.steadiness",
    "moespec.artifact_schema",
    "moespec.run_files",
    "moespec.peak_memory",
    "moespec.locking",
    "moespec.chain.run_folder",
    "moespec.backends.gguf_header",
]

NO_TORCH = "loaded = {'torch', 'transformers'} & set(sys.modules); assert not loaded, loaded"


def run(code: str) -> None:
    """Run `code` in a fresh interpreter; fail with its stderr unless it exits 0."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_imports_neither_torch_nor_transformers(module):
    run(f"import sys, {module}\n{NO_TORCH}")


def test_an_artifact_records_the_versions_without_importing_torch(tmp_path):
    run(f"""
        import sys
        from importlib import metadata
        from moespec import artifacts
        doc = artifacts.load(artifacts.write({str(tmp_path / "a.json")!r}, "predict", {{}}), "predict")
        {NO_TORCH}
        assert doc["machine"]["torch"] == metadata.version("torch")
        assert doc["machine"]["transformers"] == metadata.version("transformers")
    """)


def test_register_kernels_adds_the_three_names_and_import_alone_does_not():
    run("""
        import moespec
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
        from moespec.kernel_names import AUTO, DEDUP, SLOT
        from moespec.moe.registry import IMPLEMENTATIONS
        assert not {SLOT, DEDUP, AUTO} & set(ALL_EXPERTS_FUNCTIONS)
        moespec.register_kernels()
        moespec.register_kernels()
        assert all(ALL_EXPERTS_FUNCTIONS[name] is IMPLEMENTATIONS[name] for name in (SLOT, DEDUP, AUTO))
    """)


def test_an_engine_name_loads_the_engine_and_registers_on_first_use():
    run(f"""
        import sys, moespec
        {NO_TORCH}
        generate = moespec.generate
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
        from moespec.engine.decode import generate as engine_generate
        assert generate is engine_generate and "moespec_auto" in ALL_EXPERTS_FUNCTIONS
        assert moespec.OracleDraft.__module__ == "moespec.engine.proposers"
        try:
            moespec.no_such_name
        except AttributeError as e:
            assert "no_such_name" in str(e)
        else:
            raise AssertionError("an unknown name must raise AttributeError")
    """)


def test_import_after_transformers_registers_at_once():
    run("""
        import transformers, moespec
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
        assert "moespec_auto" in ALL_EXPERTS_FUNCTIONS
    """)


def test_a_model_loaded_through_moespec_accepts_its_kernels_without_registration():
    run("""
        from moespec.models.synthetic import config  # moespec first: no transformers yet, so no registration
        import transformers
        plain = transformers.AutoModelForCausalLM.from_config(config("olmoe-tiny"))
        try:
            plain.set_experts_implementation("moespec_auto")
        except ValueError:
            pass
        else:
            raise AssertionError("moespec_auto was registered before any model was loaded")
        from moespec.models import load
        model, _ = load("synthetic:olmoe-tiny")
        model.set_experts_implementation("moespec_auto")
        assert model.config._experts_implementation == "moespec_auto"
    """)
