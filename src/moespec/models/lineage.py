"""Lineage: which model an artifact of the chain was made from, and the check that a command combines
only one model's artifacts.

An artifact's identity is the `IDENTITY` fields of the "provenance" entry of its payload: the model
spec, the fingerprint of its config and weights (`moespec.provenance`), the dtype, and its MoE
shape N, m, L. A routing trace carries the same in its header. A payload without a provenance entry
(one assembled by hand) is known by the model and the N, m it names.
"""

from __future__ import annotations

from typing import Any, Mapping

from moespec.moe.traces import FORMAT as TRACE_FORMAT
from moespec.moe.traces import RoutingTrace
from moespec.provenance import ProvenanceMismatch, check_same_model, model_provenance

IDENTITY = ("model", "fingerprint", "dtype", "num_experts", "top_k", "num_layers")
# The experts implementation of a benchmark that sets each point's kernel itself: the model's own,
# which those switches change as they run, says nothing about a point.
PER_POINT = "per point: the kernel in its key"


def of_model(spec: str | None, model, *, experts: str | None = None) -> dict[str, Any]:
    """`provenance.model_provenance` of a loaded model plus its MoE shape (`moe.routing.moe_shape`);
    a llama.cpp model is known by its GGUF file (`backends.gguf_info.identity`)."""
    from moespec.moe.routing import moe_shape

    if hasattr(model, "path") and str(getattr(model, "path", "")).endswith(".gguf"):
        from moespec.models import gguf_info

        return gguf_info.identity(model.path)

    return {**model_provenance(spec, model, experts=experts), **moe_shape(model)}


def identity(source: Mapping[str, Any] | RoutingTrace) -> dict[str, Any]:
    """The IDENTITY fields of a RoutingTrace, a trace header or an artifact's payload; unknown ones None."""
    if isinstance(source, RoutingTrace):
        source = source.header()
    if source.get("format") == TRACE_FORMAT:
        found = {**source, "fingerprint": source.get("model_fingerprint")}
    elif "provenance" in source:
        found = source["provenance"]
    else:  # a payload assembled by hand, without a provenance entry
        found = {"model": source.get("model"), "num_experts": source.get("N"), "top_k": source.get("m")}
    return {k: found.get(k) or None for k in IDENTITY}  # "" (an unnamed trace's model) is unknown too


def check_chain(named: Mapping[str, Mapping[str, Any] | RoutingTrace], *, fix: str | None = None) -> dict[str, Any]:
    """Refuse artifacts of different models (`provenance.check_same_model` on their identities);
    return the identity they share. named: {name shown in the message: payload, trace or header}.
    fix: the message's last line, in place of check_same_model's."""
    for name, source in named.items():
        _check_own_shape(name, source)
    ids = {name: identity(source) for name, source in named.items()}
    try:
        check_same_model(ids)
    except ProvenanceMismatch as e:
        if fix is None:
            raise
        raise ProvenanceMismatch(str(e).rsplit("\n", 1)[0] + "\n" + fix, e.differences) from None
    return {k: next((i[k] for i in ids.values() if i[k] is not None), None) for k in IDENTITY}


# a payload's own MoE fields and the identity fields its provenance states for them
OWN_SHAPE = {"N": "num_experts", "m": "top_k"}


def _check_own_shape(name: str, source: Mapping[str, Any] | RoutingTrace) -> None:
    """Refuse a payload whose own N or m differs from its provenance's: one of the two was edited, and
    the chain would otherwise compute with the edited value while its identity check passes."""
    if isinstance(source, RoutingTrace) or "provenance" not in source:
        return
    stated = source["provenance"]
    for field, key in OWN_SHAPE.items():
        own, said = source.get(field), stated.get(key) if isinstance(stated, Mapping) else None
        if own is not None and said is not None and own != said:
            raise ValueError(f"{name}: its {field} = {own!r} but its provenance says {key} = {said!r}; the artifact "
                             "was edited or mixes two models: make it again with the moespec step that writes it")
