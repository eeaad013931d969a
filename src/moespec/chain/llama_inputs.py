"""The chain's inputs on llama.cpp: the GGUF file it runs, and the routing that file computes.

The routing is read from llama.cpp itself while it evaluates the file (`backends.llama_routing`):
the experts each token selected in each MoE layer of the user's own quantized file, for every MoE
architecture llama.cpp runs, in about the memory llama.cpp needs for the file. The trace carries the
file's identity and the bytes of one expert in the file's own types (`models.gguf_info`), so ū(n)
and the prediction's bytes are the file's: a q8_0 expert is about a quarter of an f32 one.

`label_with_file` keeps the older route for `moespec trace --backend torch --for-gguf`: routing
recorded through transformers on the weights the file was made from, labelled with the file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from moespec.models import gguf_info
from moespec.moe.routing import DEFAULT_CHUNK
from moespec.moe.traces import ID_DTYPE, RoutingTrace, TraceWriter


def export_target(spec: str, out: Path, kind: str) -> Path:
    """`spec` written as a GGUF file of type `kind` at `out` (kept: a rerun reuses it)."""
    from moespec.models.gguf_export import export_gguf

    if not out.exists():
        tmp = out.with_name(out.name + ".partial")
        export_gguf(spec, tmp, kind)
        tmp.replace(out)
    return out


def label_with_file(trace: RoutingTrace, gguf: Path, source: str) -> RoutingTrace:
    """`trace` carrying the identity and per-layer expert bytes of `gguf`; refused unless its MoE shape matches."""
    ident = gguf_info.identity(gguf)
    shape = (trace.num_experts, trace.top_k, trace.num_layers)
    if shape != (ident["num_experts"], ident["top_k"], ident["num_layers"]):
        raise ValueError(f"the routing of {source} has (N, m, L) = {shape}, the file {gguf.name} "
                         f"({ident['num_experts']}, {ident['top_k']}, {ident['num_layers']}); record it with the "
                         "model the file was exported from")
    return replace(trace, expert_bytes=tuple(gguf_info.expert_bytes(gguf)), model=ident["model"],
                   dtype=ident["dtype"], model_fingerprint=ident["fingerprint"],
                   corpus=(*trace.corpus, f"routing recorded through transformers on {source}"), _cache={})


TRACE_CONTEXT = 4096  # positions of the routing model's cache; a longer document is read in pieces of this


def _pieces(doc_id: str, ids: list[int], size: int) -> list[tuple[str, list[int]]]:
    """A document cut into pieces of at most `size` tokens, each read over a fresh cache ("id", "id#2", ...)."""
    return [(doc_id if i == 0 else f"{doc_id}#{i + 1}", ids[a : a + size]) for i, a in enumerate(range(0, len(ids), size))]


def record_gguf_routing(gguf: str | Path, out: str | Path, *, texts: Sequence[tuple[str, str]] | None = None,
                        tokens: int | None = None, threads: int | None = None, chunk: int = DEFAULT_CHUNK,
                        corpus: Sequence[str] = ("moespec:data/corpus",), per_document: int | None = None,
                        on_tokens: Callable[[int], None] | None = None) -> tuple[int, int]:
    """Write to `out` the routing llama.cpp computes for `gguf` on documents [(doc id, text)] (default:
    the shipped corpus), tokenized by the file's own tokenizer without special tokens and read by
    teacher forcing, `chunk` tokens per pass, at most `tokens` tokens in all and `per_document` in each
    (many short documents, as a trace for batches of different requests wants). Returns (documents,
    tokens) written; `on_tokens(t)` after each pass of t tokens."""
    from moespec.backends.llama_routing import RoutingModel
    from moespec.backends.llama_tokenizer import LlamaTokenizer
    from moespec.texts import default_corpus
    from moespec.moe.routing import tokenize

    lay = gguf_info.layout(gguf)  # refuses a dense or unreadable file before llama.cpp loads it
    ident = gguf_info.identity(gguf)
    with RoutingModel(gguf, threads=threads, n_ctx=TRACE_CONTEXT, batch=chunk) as reader:
        tok = LlamaTokenizer(reader.model)
        text_only = SimpleNamespace(encode=lambda text: tok.encode(text, add_bos=False))  # as the torch trace reads
        if per_document is not None:
            text_only = SimpleNamespace(encode=lambda text: tok.encode(text, add_bos=False)[:per_document])
        docs = tokenize(text_only, default_corpus() if texts is None else texts, tokens)
        with TraceWriter(out, num_experts=lay.num_experts, top_k=lay.top_k, expert_bytes=lay.expert_bytes,
                         layers=lay.moe_layers, model=ident["model"], dtype=ident["dtype"],
                         corpus=[*corpus, "routing recorded by llama.cpp"],
                         model_fingerprint=ident["fingerprint"]) as writer:
            for doc_id, ids in docs:
                for piece_id, piece in _pieces(doc_id, ids, reader.capacity):
                    reader.reset()
                    for a in range(0, len(piece), chunk):
                        writer.append(piece_id, _stack(reader.read(piece[a : a + chunk]), lay, gguf))
                        if on_tokens is not None:
                            on_tokens(len(piece[a : a + chunk]))
            total = writer.num_tokens
    return len(docs), total


def record_gguf_verified(gguf: str | Path, out: str | Path, *, depths: Sequence[int], prompts: int, n_max: int,
                         length: int, threads: int | None = None) -> RoutingTrace:
    """The routing of the text a llama.cpp chain's verify passes verify (`bench.verify.verified_routing`:
    the file's greedy continuation of each prompt cut to each depth), as llama.cpp routes it, written
    to `out`. The measured-time version times the expert operation on these windows: a random-weight
    file's greedy text often loops, and its windows then reach fewer experts than the corpus's."""
    from moespec.bench.verify import verified_routing
    from moespec.models import load

    # the context the deepest continuation reaches (the file's trained context may be shorter)
    net, tok = load(str(gguf), backend="llama.cpp", threads=threads, n_ctx=max(depths) + length + 1)

    def record(docs, chunk, corpus):
        net.close()  # the continuations are decoded: one instance of the file open at a time
        return gguf_routing(gguf, docs, threads=threads, chunk=chunk, corpus=corpus)

    try:
        trace = verified_routing(net, tok, depths=depths, prompts=prompts, n_max=n_max, length=length,
                                 model_spec=str(gguf), record=record)
    finally:
        net.close()
    trace.save(out)
    return trace


def gguf_routing(gguf: str | Path, documents: Sequence[tuple[str, Sequence[int]]], *, threads: int | None = None,
                 chunk: int = DEFAULT_CHUNK, corpus: Sequence[str] = ()) -> RoutingTrace:
    """An in-memory RoutingTrace of token-id documents [(doc id, ids)] as llama.cpp routes them in
    `gguf`, each read over a fresh cache, `chunk` tokens per pass (`moe.routing.record` on torch)."""
    from moespec.backends.llama_routing import RoutingModel

    lay = gguf_info.layout(gguf)
    ident = gguf_info.identity(gguf)
    longest = max(len(ids) for _, ids in documents)
    docs = []
    with RoutingModel(gguf, threads=threads, n_ctx=longest + 1, batch=chunk) as reader:
        for _, ids in documents:
            reader.reset()
            ids = [int(t) for t in ids]
            docs.append(np.concatenate([_stack(reader.read(ids[a : a + chunk]), lay, gguf)
                                        for a in range(0, len(ids), chunk)]))
    return RoutingTrace(docs, lay.num_experts, lay.expert_bytes, tuple(i for i, _ in documents), ident["model"],
                        ident["dtype"], (*corpus, "routing recorded by llama.cpp"), lay.moe_layers,
                        model_fingerprint=ident["fingerprint"])


def _stack(found: dict[int, np.ndarray], lay: gguf_info.MoELayout, gguf: str | Path) -> np.ndarray:
    """[t, L, m] int16 from llama.cpp's {block: [t, m]}; refused when a MoE block reported nothing."""
    missing = [b for b in lay.moe_layers if b not in found]
    if missing:
        raise ValueError(f"llama.cpp evaluated {Path(gguf).name} ({lay.architecture}) without an ffn_moe_topk node in "
                         f"blocks {missing}: its routing cannot be read this way; record it with "
                         "`moespec trace --backend torch` on the checkpoint the file was made from")
    return np.stack([found[b] for b in lay.moe_layers], axis=1).astype(ID_DTYPE)
