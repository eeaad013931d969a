"""The chain's routing through transformers: a model loaded on torch reads a corpus by teacher
forcing, and every MoE layer's selected experts go to a Parquet trace, chunk by chunk.

The torch counterpart of `chain.llama_inputs.record_gguf_routing` (`moespec trace --backend torch`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from moespec.moe.routing import DEFAULT_CHUNK


def record_torch_routing(model: str, out: str | Path, *, texts: Sequence[tuple[str, str]], corpus: Sequence[str],
                         max_tokens: int | None = None, chunk: int = DEFAULT_CHUNK, dtype: str = "float32",
                         weights: bool = False, seed: int = 0, routing: str | Path | None = None,
                         on_total: Callable[[int], None] | None = None,
                         on_tokens: Callable[[int], None] | None = None) -> tuple[int, int]:
    """Load `model` on torch, read `texts` [(doc id, text)] up to `max_tokens` tokens in all, and
    write the routing (with the router's weights of the selected experts when `weights`) to `out`.
    `corpus` names the texts in the trace; `on_total(tokens)` is called once the texts are
    tokenized, `on_tokens(t)` after each chunk. Returns (documents, tokens) written."""
    from moespec.models import load
    from moespec.moe.routing import record_to_file, tokenize

    net, tok = load(model, dtype=dtype, seed=seed, routing=routing, backend="torch")
    docs = tokenize(tok, texts, max_tokens)
    if on_total is not None:
        on_total(sum(len(ids) for _, ids in docs))
    return record_to_file(net, docs, out, chunk=chunk, model_spec=model, corpus=list(corpus), with_weights=weights,
                          on_tokens=on_tokens)
