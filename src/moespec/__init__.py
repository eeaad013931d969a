"""moespec: lossless speculative decoding that knows when it pays, above all on MoE models.

`import moespec` loads neither torch nor transformers: the engine names below (`generate`,
`DraftModel`, ...) are imported on first use (PEP 562), so `moespec.costmodel` and
`moespec.report` stay torch-free. moespec's expert kernels ("moespec_slot", "moespec_dedup",
"moespec_auto") are registered in transformers' ExpertsInterface by `register_kernels()`, which
runs on first use of an engine name, whenever `moespec.models` loads or builds a model, and at
`import moespec` if transformers is already imported.
"""

import sys
from importlib import import_module

__version__ = "0.1.0"
__all__ = ["AutoK", "DraftModel", "GenerationResult", "OracleDraft", "PromptLookup", "Proposal", "Proposer", "check_pairing",
           "fast_linear", "generate", "generate_batch", "register_kernels", "run_gate"]

_ENGINE = {
    "generate": "moespec.engine.decode",
    "generate_batch": "moespec.engine.batch",
    "AutoK": "moespec.engine.policy",
    "check_pairing": "moespec.engine.decode",
    "Proposal": "moespec.engine.proposers",
    "Proposer": "moespec.engine.proposers",
    "DraftModel": "moespec.engine.proposers",
    "OracleDraft": "moespec.engine.proposers",
    "PromptLookup": "moespec.engine.proposers",
    "GenerationResult": "moespec.engine.stats",
    "run_gate": "moespec.checks.gate",
    "fast_linear": "moespec.moe.dense",
}


def register_kernels() -> None:
    """Add moespec's kernels to transformers' ExpertsInterface (idempotent; imports torch)."""
    from moespec.moe.registry import register

    register()


def __getattr__(name: str):
    if name not in _ENGINE:
        raise AttributeError(f"module 'moespec' has no attribute {name!r}")
    register_kernels()
    value = getattr(import_module(_ENGINE[name]), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_ENGINE})


# A user who imported transformers first may set "moespec_auto" on a model built by transformers.
if "transformers" in sys.modules:
    register_kernels()
