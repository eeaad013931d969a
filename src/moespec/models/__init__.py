"""Where models come from: seeded synthetic presets, trained presets and local checkpoints.

`load` and `ByteTokenizer` are imported on first use, so that the GGUF metadata of `gguf_info` is
read without torch."""


def __getattr__(name: str):
    if name == "load":
        from moespec.models.specs import load

        return load
    if name == "ByteTokenizer":
        from moespec.models.tokenizer import ByteTokenizer

        return ByteTokenizer
    raise AttributeError(f"module 'moespec.models' has no attribute {name!r}")


__all__ = ["ByteTokenizer", "load"]
