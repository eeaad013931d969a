"""The torch backend: a transformers causal LM with a KV cache that can be extended and rolled back.

`CachedModel` wraps any transformers causal LM (with moespec's kernels where set) as a `SpecModel`
(`backends.protocol`). Every forward is timed (device-synchronized) into `forward_s`, so the
engine's own overhead is the wall time that remains.
"""

from __future__ import annotations

import time
import weakref

import torch

from moespec.backends.protocol import GreedyByLogits, output_rows
from moespec.device import synchronize

_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> its model_fingerprint


class CachedModel(GreedyByLogits):
    """Stateful incremental view of a transformers causal LM (batch 1).

    >>> m = CachedModel(model); logits = m.extend(torch.tensor([1, 2, 3]))  # [3, V]
    >>> m.truncate(1); m.length
    1
    """

    def __init__(self, model):
        if not callable(model) or not hasattr(model, "config"):
            raise TypeError(f"CachedModel wraps a transformers causal LM, got {type(model).__name__}")
        self.model = model
        self.device = next(model.parameters()).device
        self.forward_s = 0.0
        self._cache = None
        self._length = 0

    @property
    def length(self) -> int:
        """Number of positions held in the KV cache."""
        return self._length

    @property
    def vocab_limit(self) -> int | None:
        """The real vocabulary size the model's config declares (`moespec_vocab_limit`), or None.

        Synthetic presets record it, so padded output rows are never sampled even when the caller
        passes no tokenizer; other checkpoints need `vocab_limit=len(tokenizer)` from the caller.
        """
        value = getattr(self.model.config, "moespec_vocab_limit", None)
        return None if value is None else int(value)

    @property
    def capacity(self) -> int | None:
        """The most positions the model was built for (its config's `max_position_embeddings`; None when
        it declares none): past them a position embedding or a rope table runs out, so the engine
        refuses a prompt and budget beyond them before any pass, as llama.cpp's context does."""
        value = getattr(self.model.config.get_text_config(), "max_position_embeddings", None)
        return None if value is None else int(value)

    @property
    def width(self) -> int:
        """Number of logits per position (the output layer's rows, padding included)."""
        head = self.model.get_output_embeddings()
        if head is not None and getattr(head, "weight", None) is not None:
            return int(head.weight.shape[0])
        return int(self.model.config.get_text_config().vocab_size)

    def reset(self) -> None:
        """Drop the cache (length 0) and the forward-time counter."""
        self._cache = None
        self._length = 0
        self.forward_s = 0.0

    def _new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def extend(self, tokens: torch.Tensor, outputs: int | None = None) -> torch.Tensor:
        """Append tokens [n] (int64); the logits of the n new positions (or the last `outputs`), [n, V] float32 CPU."""
        n = int(tokens.shape[-1])
        rows = output_rows(n, outputs)
        if self._cache is None:
            self._cache = self._new_cache()
        ids = tokens.reshape(1, n).to(self.device)
        positions = torch.arange(self._length, self._length + n, device=self.device).unsqueeze(0)  # [1, n]
        synchronize(self.device)
        t0 = time.perf_counter()
        out = self.model(input_ids=ids, position_ids=positions, cache=self._cache, use_cache=True,
                         logits_to_keep=0 if rows == n else rows)
        synchronize(self.device)
        self.forward_s += time.perf_counter() - t0
        self._length += n
        return out.logits[0, -rows:].to(device="cpu", dtype=torch.float32)

    def truncate(self, n: int) -> None:
        """Roll the cache back to its first n positions; a no-op when it holds n or fewer."""
        if n < 0:
            raise ValueError(f"truncate() needs n >= 0, got {n}")
        remove = self._length - n
        if remove <= 0:
            return
        try:
            self._cache.crop(-remove)  # transformers 5.x: a negative count of positions to drop
        except (RuntimeError, ValueError) as e:
            raise ValueError(
                f"the KV cache ({type(self._cache).__name__} with layers "
                f"{sorted({type(layer).__name__ for layer in self._cache.layers})}) cannot roll back "
                f"{remove} positions from {self._length}: {e}. Speculative decoding needs a cache that "
                f"can be cropped; sliding-window layers past their window cannot be."
            ) from e
        self._length = n

    def identity(self) -> dict:
        """What its pass times depend on: `provenance.model_fingerprint` (config and weights, hashed once
        per loaded module), dtype, device, experts implementation, linear-layer classes, routing
        replay, and torch's threads."""
        from moespec.provenance import model_fingerprint

        module = self.model
        if module not in _FINGERPRINTS:
            _FINGERPRINTS[module] = model_fingerprint(module)
        p = next(module.parameters())
        return {"backend": "torch", "fingerprint": _FINGERPRINTS[module], "dtype": str(p.dtype),
                "device": str(p.device), "experts": getattr(module.config, "_experts_implementation", None),
                "linear": sorted({type(m).__name__ for m in module.modules() if isinstance(m, torch.nn.Linear)}),
                "replay": getattr(module, "moespec_replay", None) is not None, "threads": torch.get_num_threads()}

    def __repr__(self) -> str:
        return f"CachedModel({type(self.model).__name__}, length={self._length})"
