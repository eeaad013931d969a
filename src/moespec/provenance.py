"""Provenance: what a measured value depends on, and the checks that keep unlike results apart.

A provenance is a small JSON-safe dict: the model spec, a fingerprint of the model's config and
weights, the dtype, the experts implementation, and whatever else the caller adds (a trace's
fingerprint, the options that change a measured value). Point logs resume only under the same
provenance, and the chain's commands combine only artifacts of the same model.

>>> check(model_provenance("synthetic:olmoe-tiny", model), log_header, what="the point log q.points.jsonl")
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

import numpy as np

from moespec.artifacts import json_safe

# Config keys that say how a model is run or where it was read from, not what it computes.
_VOLATILE = frozenset({
    "transformers_version", "architectures", "dtype", "torch_dtype",
    "use_cache", "return_dict", "output_attentions", "output_hidden_states",
})
_ROWS = 64  # each tensor's words are summed in this many row blocks
_SAMPLE = 4096  # words of each tensor hashed verbatim, at a fixed stride
_DIGITS = 16  # hex digits kept of a sha256


class ProvenanceMismatch(ValueError):
    """Results of different provenance were about to be combined; `differences` lists each field."""

    def __init__(self, message: str, differences: list[str]):
        super().__init__(message)
        self.differences = differences


def canonical(provenance: Mapping | None) -> dict:
    """The JSON form of `provenance` (tuples as lists, numpy as Python), as a point log stores it."""
    return json.loads(json.dumps(json_safe(dict(provenance or {})), sort_keys=True))


def _stable_config(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _stable_config(v) for k, v in d.items() if k not in _VOLATILE and not str(k).startswith("_")}
    return d


def _digest_tensor(h, name: str, tensor) -> None:
    """Name, shape, dtype, and the words' exact integer sums in row blocks plus a strided sample.

    Integer sums of the raw bits are order-free, so any thread count gives the same digest, and
    changing any one element changes its block's sum.
    """
    import torch

    t = tensor.detach()
    h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
    raw = t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    words = raw.view(np.int32) if raw.size % 4 == 0 else raw.view(np.int16) if raw.size % 2 == 0 else raw
    whole = words.size - words.size % _ROWS
    h.update(words[:whole].reshape(_ROWS, -1).sum(axis=1, dtype=np.int64).tobytes())
    h.update(words[whole:].sum(dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(words[:: max(1, words.size // _SAMPLE)]).tobytes())


def model_fingerprint(model) -> str:
    """A short sha256 of the model's config (less run-time keys) and of every parameter and buffer.

    Two loads of the same weights agree; one changed element, another dtype or another config value
    disagree. The experts implementation is not part of it (`model_provenance` records it beside).
    """
    h = hashlib.sha256()
    config = _stable_config(model.config.to_dict())
    h.update(json.dumps(json_safe(config), sort_keys=True, default=str).encode())
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        _digest_tensor(h, name, tensor)
    return h.hexdigest()[:_DIGITS]


_FILE_SPANS, _FILE_SPAN_BYTES = 64, 1 << 16  # a file's fingerprint reads 64 spans of 64 KiB across it


def file_fingerprint(path) -> str:
    """A short sha256 of a model file's size and of 64 spans of 64 KiB spread over it (its header
    included): cheap on a multi-GB GGUF file, and any re-export or re-quantization changes it. The one
    identity of a file, for lineage and for the warm start's store alike."""
    from pathlib import Path

    p = Path(path).expanduser()
    size = p.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(p, "rb") as f:
        for i in range(_FILE_SPANS):
            f.seek(i * max(0, size - _FILE_SPAN_BYTES) // max(1, _FILE_SPANS - 1))
            h.update(f.read(_FILE_SPAN_BYTES))
    return h.hexdigest()[:_DIGITS]


def trace_fingerprint(trace) -> str:
    """A short sha256 of a RoutingTrace's routing: N, w_l, the layers, every document's ids and weights."""
    h = hashlib.sha256()
    head = {"num_experts": trace.num_experts, "expert_bytes": trace.expert_bytes, "layers": trace.layers}
    h.update(json.dumps(json_safe(head), sort_keys=True).encode())
    for i, doc in enumerate(trace.documents):
        arrays = [doc] if trace.weights is None else [doc, trace.weights[i]]
        for a in arrays:
            a = np.ascontiguousarray(a)
            h.update(f"{a.shape}|{a.dtype}|".encode())
            h.update(a.data)
    return h.hexdigest()[:_DIGITS]


def model_provenance(spec: str, model, *, dtype=None, experts: str | None = None) -> dict:
    """{"model", "fingerprint", "dtype", "experts"} of a loaded model.

    dtype and experts default to what the model holds: its first parameter's dtype and its
    config's experts implementation, so `--dtype` omitted and `--dtype float32` agree.
    """
    if dtype is None:
        dtype = next(model.parameters()).dtype
    if experts is None:
        experts = getattr(model.config, "_experts_implementation", None)
    return {
        "model": spec,
        "fingerprint": model_fingerprint(model),
        "dtype": str(dtype).removeprefix("torch."),
        "experts": experts,
    }


def _flatten(d: Mapping, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


_ABSENT = object()


def diff(expected: Mapping, found: Mapping) -> list[str]:
    """One line "field: expected X, found Y" per differing field; nested dicts as dotted fields."""
    e, f = _flatten(canonical(expected)), _flatten(canonical(found))
    lines = []
    for key in sorted(set(e) | set(f)):
        a, b = e.get(key, _ABSENT), f.get(key, _ABSENT)
        if a != b:
            shown = ["nothing" if v is _ABSENT else _show(v) for v in (a, b)]
            lines.append(f"{key}: expected {shown[0]}, found {shown[1]}")
    return lines


def check(expected: Mapping, found: Mapping, *, what: str,
          fix: str = "make it again with the same model and options") -> None:
    """Raise ProvenanceMismatch naming every field where `found` (what `what` holds) differs."""
    lines = diff(expected, found)
    if lines:
        listing = "".join(f"\n  {line}" for line in lines)
        raise ProvenanceMismatch(f"{what} was made under another provenance:{listing}\n{fix}", lines)


def check_same_model(named: Mapping[str, Mapping]) -> None:
    """Check that artifacts to be combined describe one model: same values in every shared field.

    named: {artifact name: its provenance and shape, e.g. model, fingerprint, num_experts, top_k,
    layers}. A field is compared among the artifacts that have it (absent or None: not compared).
    """
    flat = {name: {k: v for k, v in _flatten(canonical(p)).items() if v is not None} for name, p in named.items()}
    lines = []
    for key in sorted({k for fields in flat.values() for k in fields}):
        held = {name: fields[key] for name, fields in flat.items() if key in fields}
        first = next(iter(held.values()))
        if any(v != first for v in held.values()):
            lines.append(f"{key}: " + "; ".join(f"{name} has {_show(v)}" for name, v in held.items()))
    if lines:
        listing = "".join(f"\n  {line}" for line in lines)
        raise ProvenanceMismatch(
            f"the artifacts {', '.join(named)} do not describe the same model:{listing}\n"
            "make them all from one model (same --model, --dtype and trace)", lines)
