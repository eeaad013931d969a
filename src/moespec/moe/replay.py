"""Replaying recorded routing: a model routes, position by position, as a trained model did.

The timing presets (`*-shaped`) are too large to train here, and random routers reuse experts
only as much as their embedding scale lets them. `RoutingReplay` makes such a model's MoE layers
take the experts a trained model chose: a forward pre-hook on every experts module (the module
every kernel runs in, called as ``experts(hidden_states, top_k_index, top_k_weights)``) swaps in
the trace's expert ids for the positions being processed. Everything after the router — every
expert kernel, deduplication, the verify pass — then sees trained reuse; the router still runs, so
a pass costs what it did.

Position p takes row p of the trace's documents concatenated (modulo its length), so a window of
consecutive positions sees a window of consecutive trained routing. The model's MoE layer i of L
takes the trace's layer at the same relative depth, floor((i + 1/2) L_trace / L). The trace must
have the model's N and m.

>>> replay = RoutingReplay(model, RoutingTrace.load("trained-olmoe.parquet"))   # replay.remove() undoes it
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from moespec.moe.routing import experts_modules
from moespec.moe.traces import RoutingTrace
from moespec.provenance import trace_fingerprint


def layer_map(model_layers: int, trace_layers: int) -> list[int]:
    """The trace layer each of the model's MoE layers replays: the one at the same relative depth."""
    return [min(trace_layers - 1, int((i + 0.5) * trace_layers / model_layers)) for i in range(model_layers)]


def _positions(kwargs: dict, tokens: int) -> torch.Tensor:
    """[tokens] int64: the absolute positions of the tokens a decoder forward call reads."""
    pos = kwargs.get("position_ids")
    if pos is not None:
        return pos.reshape(-1)
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    past = cache.get_seq_length() if cache is not None else 0
    return torch.arange(past, past + tokens)


class RoutingReplay:
    """Hooks that make `model` route as `trace` did; `remove()` restores its own routing."""

    def __init__(self, model: nn.Module, trace: RoutingTrace, source: str = "the trace"):
        layers = experts_modules(model)
        if not layers:
            raise ValueError(f"{type(model).__name__} has no MoE layers; routing replay needs an MoE model")
        stream = np.concatenate(trace.documents)  # [T, L_trace, m]
        n, m = int(layers[0][1].num_experts), int(model.config.num_experts_per_tok)
        if (trace.num_experts, stream.shape[2]) != (n, m):
            raise ValueError(f"{source} routes {stream.shape[2]} of {trace.num_experts} experts per token; the model "
                             f"routes {m} of {n}; record the trace from a model with the same N and m "
                             f"(trained:olmoe has 64 and 8, like synthetic:olmoe-shaped)")
        self.rows = torch.from_numpy(stream.astype(np.int64))  # [T, L_trace, m]
        self.layers = layer_map(len(layers), stream.shape[1])
        self._positions: torch.Tensor | None = None
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
        self._handles = [decoder.register_forward_pre_hook(self._take_positions, with_kwargs=True)]
        for i, (_, module) in enumerate(layers):
            self._handles.append(module.register_forward_pre_hook(self._hook(self.layers[i]), with_kwargs=True))
        model.config.moespec_routing = trace_fingerprint(trace)  # enters the model's fingerprint

    def _take_positions(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        embeds = kwargs.get("inputs_embeds")
        tokens = (ids if ids is not None else embeds[..., 0]).numel()
        self._positions = _positions(kwargs, tokens)

    def _hook(self, trace_layer: int):
        def hook(module, args, kwargs):
            args = list(args)
            index = args[1] if len(args) > 1 else kwargs["top_k_index"]  # [tokens, m]
            pos = self._positions
            if pos is None or pos.numel() != index.shape[0]:
                raise RuntimeError("routing replay saw an experts call outside a decoder forward pass")
            replayed = self.rows[pos % len(self.rows), trace_layer].to(index.dtype)
            if len(args) > 1:
                args[1] = replayed
            else:
                kwargs["top_k_index"] = replayed
            return tuple(args), kwargs
        return hook

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def replay_routing(model: nn.Module, trace: RoutingTrace | str | Path) -> RoutingReplay:
    """Make `model` route as the trace (or the trace file) recorded; returns the hooks' handle. A file
    that does not fit the model is named in the refusal."""
    if isinstance(trace, RoutingTrace):
        return RoutingReplay(model, trace)
    return RoutingReplay(model, RoutingTrace.load(trace), source=f"the trace {trace}")
