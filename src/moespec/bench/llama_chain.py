"""The chain's inputs on llama.cpp: the GGUF file it runs, and routing traces labelled with that file.

llama.cpp does not report which experts its routers chose, so the routing of a GGUF file is recorded
through transformers on the same weights: those the file was exported from (`source`, the demo's
preset), or the file itself, dequantized (`models.gguf`). The trace then carries the file's identity
(`backends.gguf_info.identity`) and the bytes of one expert in the file's own type, so that ū(n)
and the prediction's bytes are the file's: a q8_0 expert is about a quarter of the f32 one the
routing was recorded on. Quantization can move a near-tied router choice; the recorded routing is
that of the weights before it (docs/methodology.md, "The chain on llama.cpp").
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from moespec.models import gguf_info
from moespec.moe.traces import RoutingTrace


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


def record_gguf_routing(gguf: Path, out: Path, *, tokens: int, source: str | None = None) -> RoutingTrace:
    """The routing of the shipped corpus (`tokens` tokens) for `gguf`, recorded on `source` (default:
    the file dequantized by transformers), labelled with the file, and saved to `out`."""
    from moespec.models import load
    from moespec.moe.corpus import default_corpus
    from moespec.moe.routing import record, tokenize

    net, tok = load(source or str(gguf), backend="torch")
    docs = tokenize(tok, default_corpus(), tokens)
    trace = record(net, docs, model_spec=source or str(gguf), corpus=["moespec:data/corpus"])
    labelled = label_with_file(trace, gguf, source or f"{gguf.name}, dequantized")
    labelled.save(out)
    return labelled
