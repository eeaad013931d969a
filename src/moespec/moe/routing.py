"""Record the experts each token selects in each MoE layer while a model reads documents.

Every MoE architecture in transformers (OLMoE, Qwen3-MoE, Mixtral, DeepSeek-V2, gpt-oss, ...)
calls its experts module as ``experts(hidden_states, top_k_index, top_k_weights)`` with
``top_k_index`` [T, m] — the module that `use_experts_implementation` decorates. A forward
pre-hook on those modules therefore sees the router's choice uniformly, whatever the router looks
like and whichever experts implementation (eager, moespec_*, grouped_mm) then runs.

Documents are read by teacher forcing, in chunks that continue one key-value cache, so a long
document costs bounded memory and no position is lost: a chunked trace equals a one-pass trace.
A trace records the model's spec, dtype and fingerprint (`provenance.model_fingerprint`).
"""

from __future__ import annotations

import inspect
import re
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from moespec.moe.experts import expert_bytes
from moespec.moe.traces import RoutingTrace, TraceWriter
from moespec.provenance import model_fingerprint

DEFAULT_CHUNK = 512


def experts_modules(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """(decoder-layer index, experts module) of every MoE layer, in depth order.

    An experts module is one decorated by transformers' `use_experts_implementation` (it carries
    `num_experts` and the `has_gate`/`is_transposed` layout flags the decorator sets).
    """
    found = []
    for name, module in model.named_modules():
        if all(hasattr(module, a) for a in ("num_experts", "has_gate", "is_transposed")):
            digits = re.search(r"\.(\d+)\.", f".{name}.")
            found.append((int(digits.group(1)) if digits else len(found), module))
    return found


class RoutingRecorder:
    """Forward pre-hooks that collect top_k_index (and top_k_weights) of every MoE layer.

    >>> with RoutingRecorder(model) as rec:
    ...     model(input_ids)
    ...     experts, weights = rec.take()      # [T, L, m] int16, [T, L, m] float32
    """

    def __init__(self, model: nn.Module):
        self.layers = experts_modules(model)
        if not self.layers:
            raise ValueError(f"{type(model).__name__} has no MoE experts modules; trace an MoE model "
                             f"(e.g. synthetic:olmoe-tiny), not a dense one")
        self.num_experts = {int(mod.num_experts) for _, mod in self.layers}
        if len(self.num_experts) != 1:
            raise ValueError(f"MoE layers disagree on the expert count: {sorted(self.num_experts)}")
        self.num_experts = self.num_experts.pop()
        self.expert_bytes = tuple(expert_bytes(mod) for _, mod in self.layers)
        self._index: list[list[torch.Tensor]] = [[] for _ in self.layers]
        self._weights: list[list[torch.Tensor]] = [[] for _ in self.layers]
        self._handles = []

    def _hook(self, slot: int) -> Callable:
        def hook(module, args, kwargs):
            bound = inspect.signature(module.forward).bind(*args, **kwargs)
            values = list(bound.arguments.values())  # hidden_states, top_k_index, top_k_weights
            self._index[slot].append(values[1].detach().reshape(-1, values[1].shape[-1]).cpu())
            self._weights[slot].append(values[2].detach().reshape(-1, values[2].shape[-1]).float().cpu())

        return hook

    def __enter__(self) -> "RoutingRecorder":
        self._handles = [mod.register_forward_pre_hook(self._hook(i), with_kwargs=True)
                         for i, (_, mod) in enumerate(self.layers)]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        """The routing recorded since the last take: experts [T, L, m] int16, weights [T, L, m] float32."""
        if any(len(x) != len(self._index[0]) for x in self._index):
            raise RuntimeError("MoE layers ran a different number of times; was a layer skipped?")
        idx = np.stack([torch.cat(x).numpy() for x in self._index], axis=1).astype(np.int16)
        wts = np.stack([torch.cat(x).numpy() for x in self._weights], axis=1)
        self._index = [[] for _ in self.layers]
        self._weights = [[] for _ in self.layers]
        return idx, wts


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.inference_mode()
def record_chunks(model: nn.Module, ids: Sequence[int], *, chunk: int = DEFAULT_CHUNK,
                  recorder: RoutingRecorder | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Teacher-force `ids` through `model` `chunk` tokens at a time over one cache; yield each
    chunk's (experts [t, L, m], weights [t, L, m])."""
    from transformers import DynamicCache

    if chunk < 1:
        raise ValueError(f"chunk must be >= 1 token; got {chunk}")
    own = recorder is None
    rec = RoutingRecorder(model) if own else recorder
    cache = DynamicCache(config=model.config)
    device = _device(model)
    with rec if own else nullcontext():
        for a in range(0, len(ids), chunk):
            piece = torch.tensor([list(ids[a : a + chunk])], dtype=torch.long, device=device)
            model(input_ids=piece, cache=cache, use_cache=True, logits_to_keep=1)
            yield rec.take()


def record(model: nn.Module, documents: Iterable[tuple[str, Sequence[int]]], *, chunk: int = DEFAULT_CHUNK,
           model_spec: str = "", corpus: Sequence[str] = (), with_weights: bool = False) -> RoutingTrace:
    """An in-memory RoutingTrace of token-id documents [(doc id, ids)] (for small corpora and tests)."""
    rec = RoutingRecorder(model)
    ids, docs, weights = [], [], []
    with rec:
        for doc_id, tokens in documents:
            parts = list(record_chunks(model, tokens, chunk=chunk, recorder=rec))
            if not parts:
                continue
            ids.append(doc_id)
            docs.append(np.concatenate([p[0] for p in parts]))
            weights.append(np.concatenate([p[1] for p in parts]))
    return RoutingTrace(docs, rec.num_experts, rec.expert_bytes, tuple(ids), model_spec, str(_dtype(model)),
                        tuple(corpus), tuple(i for i, _ in rec.layers), weights if with_weights else None,
                        model_fingerprint(model))


def _dtype(model: nn.Module) -> str:
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def tokenize(tokenizer, texts: Iterable[tuple[str, str]], max_tokens: int | None = None) -> list[tuple[str, list[int]]]:
    """[(doc id, tokenizer.encode(text))], empty documents dropped, cut after `max_tokens` tokens in all."""
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1; got {max_tokens}")
    out, total = [], 0
    for doc_id, text in texts:
        ids = list(tokenizer.encode(text))
        if max_tokens is not None:
            ids = ids[: max_tokens - total]
        if ids:
            out.append((doc_id, ids))
            total += len(ids)
        if max_tokens is not None and total >= max_tokens:
            break
    if not out:
        raise ValueError("the corpus gave no tokens to trace; pass non-empty --corpus files")
    return out


def record_to_file(model: nn.Module, documents: Iterable[tuple[str, Sequence[int]]], out: str | Path, *,
                   chunk: int = DEFAULT_CHUNK, model_spec: str = "", corpus: Sequence[str] = (),
                   with_weights: bool = False, on_tokens: Callable[[int], None] | None = None) -> tuple[int, int]:
    """Append the routing of token-id documents [(doc id, ids)] to a Parquet trace at `out`, chunk by
    chunk, so that only one chunk's routing is in memory. Returns (documents, tokens) written;
    `on_tokens(t)` is called after each chunk of t tokens."""
    rec = RoutingRecorder(model)
    docs = 0
    with rec, TraceWriter(out, num_experts=rec.num_experts, top_k=_top_k(model), expert_bytes=rec.expert_bytes,
                          layers=[i for i, _ in rec.layers], model=model_spec, dtype=_dtype(model),
                          corpus=corpus, has_weights=with_weights,
                          model_fingerprint=model_fingerprint(model)) as writer:
        for doc_id, ids in documents:
            docs += bool(len(ids))
            for experts, weights in record_chunks(model, ids, chunk=chunk, recorder=rec):
                writer.append(doc_id, experts, weights if with_weights else None)
                if on_tokens is not None:
                    on_tokens(experts.shape[0])
        tokens = writer.num_tokens
    return docs, tokens


def _top_k(model: nn.Module) -> int:
    m = getattr(model.config, "num_experts_per_tok", None)
    if m is None:
        raise ValueError(f"{type(model.config).__name__} has no num_experts_per_tok; is this an MoE model?")
    return int(m)


def moe_shape(model: nn.Module) -> dict[str, int | None]:
    """{"num_experts": N, "top_k": m, "num_layers": L} of an MoE model; every value None for a dense one."""
    layers = experts_modules(model)
    if not layers:
        return {"num_experts": None, "top_k": None, "num_layers": None}
    return {"num_experts": int(layers[0][1].num_experts), "top_k": _top_k(model), "num_layers": len(layers)}
