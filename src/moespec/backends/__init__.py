"""Backends: the implementations of the one protocol the engine sees a model through
(`protocol.SpecModel`): transformers models on torch (`torch_model`), llama.cpp on GGUF files
(`llama_model`), and deterministic tables for tests (`table_model`)."""
