"""Where models come from: seeded synthetic presets and local checkpoints."""

from moespec.models.load import load
from moespec.models.tokenizer import ByteTokenizer

__all__ = ["ByteTokenizer", "load"]
