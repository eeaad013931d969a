"""moespec: lossless speculative decoding that knows when it pays, above all on MoE models."""

__version__ = "0.1.0"
