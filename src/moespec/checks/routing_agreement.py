"""How far llama.cpp's routing of a GGUF file agrees with transformers' routing of the checkpoint it
was converted from: the share of (token, MoE layer) pairs whose expert sets are equal, and how near
the router was to a tie where they differ.

Both engines read the same token ids in one pass each. transformers' choice comes from the experts
modules' inputs (`moe.routing.RoutingRecorder`), llama.cpp's from its graph (`backends.llama_routing`),
with the scores its top-k chose from, whose gap between the m-th and (m+1)-th best (`top_margin`)
says how near a different choice was. A file of the same weights routes alike up to such near
ties; quantization and different kernels move only those (docs/methodology.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np


@dataclass(frozen=True)
class Agreement:
    """tokens T and MoE layers L compared; agreement: the share of the T*L pairs with equal expert
    sets; by_layer [L]; margins_at_differences: the top-m margin (llama.cpp's scores) of every pair
    that differs; median_margin: over every pair, for scale."""

    architecture: str
    weight_type: str
    tokens: int
    layers: int
    agreement: float
    by_layer: tuple[float, ...]
    margins_at_differences: tuple[float, ...]
    median_margin: float

    @property
    def differences(self) -> int:
        return len(self.margins_at_differences)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "differences": self.differences}


def transformers_routing(folder: str | Path, ids: Sequence[int]) -> tuple[np.ndarray, list[int]]:
    """(experts [T, L, m], the decoder-layer index of each MoE layer) of a checkpoint reading ids in one pass."""
    import torch

    from moespec.models import load
    from moespec.moe.routing import RoutingRecorder

    model, _ = load(str(folder), backend="torch")
    with RoutingRecorder(model) as rec, torch.inference_mode():
        model(input_ids=torch.tensor([list(ids)]), logits_to_keep=1)
        experts, _ = rec.take()
    return experts, [i for i, _ in rec.layers]


def llama_routing(gguf: str | Path, ids: Sequence[int], *, threads: int | None = None) -> tuple[dict, dict]:
    """({block: [T, m]}, {block: [T, N] scores}) of a GGUF file reading ids in one pass on llama.cpp."""
    from moespec.backends.llama_routing import RoutingModel

    with RoutingModel(gguf, threads=threads, n_ctx=len(ids) + 1, batch=len(ids), scores=True) as reader:
        experts = reader.read(ids)
        return experts, reader.last_scores


def compare(folder: str | Path, gguf: str | Path, ids: Sequence[int], *, threads: int | None = None) -> Agreement:
    """The agreement of `gguf`'s routing on llama.cpp with the checkpoint `folder`'s on transformers."""
    from moespec.backends.llama_routing import top_margin
    from moespec.models import gguf_info

    lay = gguf_info.layout(gguf)
    reference, blocks = transformers_routing(folder, ids)
    if blocks != list(lay.moe_layers):
        raise ValueError(f"{folder} has MoE layers {blocks}, the file {Path(gguf).name} {list(lay.moe_layers)}; "
                         "compare a file with the checkpoint it was converted from")
    found, scores = llama_routing(gguf, ids, threads=threads)
    same = np.stack([[set(a) == set(b) for a, b in zip(found[block], reference[:, j])]
                     for j, block in enumerate(blocks)], axis=1)  # [T, L]
    margins = np.stack([top_margin(scores[block], lay.top_k) for block in blocks], axis=1)  # [T, L]
    return Agreement(lay.architecture, lay.weight_type, len(ids), len(blocks), float(same.mean()),
                     tuple(float(x) for x in same.mean(axis=0)), tuple(float(x) for x in margins[~same]),
                     float(np.median(margins)))
