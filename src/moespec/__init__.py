"""moespec: lossless speculative decoding that knows when it pays, above all on MoE models.

`import moespec` registers the expert kernels "moespec_slot", "moespec_dedup" and "moespec_auto"
in transformers' ExpertsInterface.
"""

from moespec.engine.decode import generate
from moespec.engine.proposers import DraftModel, OracleDraft, PromptLookup
from moespec.engine.stats import GenerationResult
from moespec.moe.registry import register as _register_kernels

__version__ = "0.1.0"
__all__ = ["DraftModel", "GenerationResult", "OracleDraft", "PromptLookup", "generate"]

_register_kernels()
