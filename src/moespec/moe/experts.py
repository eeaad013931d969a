"""Reading a transformers experts module: its layout, its sizes, and per-expert views of its weights.

transformers stores the N experts of an MoE layer as 3-D tensors and marks the layout with
attributes that `use_experts_implementation` sets on the module:

- concatenated gate/up (OLMoE, Qwen3-MoE, Mixtral, DeepSeek-V2 routed experts):
  `gate_up_proj` [N, 2I, H] with gate rows first, `down_proj` [N, H, I];
- gpt-oss: transposed weights `gate_up_proj` [N, H, 2I] and `down_proj` [N, I, H], biases
  `gate_up_proj_bias` [N, 2I] and `down_proj_bias` [N, H], gate and up interleaved along the last
  axis, and its own clamped gate activation `_apply_gate`;
- no gate (e.g. NemotronH): `up_proj` [N, I, H] and `act_fn`.

`expert_views` turns any of these into one normal form, per expert e: a matrix `up[e]` [O, H] with
`up(x) = up[e] @ x (+ up_bias[e])`, where O = 2I with a gate and I without, and `down[e]` [H, I].
Every entry is a view into the module's own storage: no expert's weights are ever copied, and the
kernels index these tuples with Python ints instead of indexing a weight tensor with an id tensor.
Sizes come from the weights' shapes, never from the config.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable

import torch

# H = hidden size, I = intermediate size of one expert, O = I or 2I (with a gate), N = experts


@dataclass(frozen=True)
class ExpertViews:
    """Per-expert views of an experts module's weights in the normal form `y = A @ x + b`."""

    num_experts: int  # N
    hidden_size: int  # H
    intermediate_size: int  # I
    has_gate: bool
    dtype: torch.dtype
    up: tuple[torch.Tensor, ...]  # N views [O, H]
    down: tuple[torch.Tensor, ...]  # N views [H, I]
    up_bias: tuple[torch.Tensor, ...] | None  # N views [O]
    down_bias: tuple[torch.Tensor, ...] | None  # N views [H]
    activation: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]  # (experts, [S, O]) -> [S, I]
    has_post_norm: bool  # apply the module's `post_expert_norm` to each expert's output

    @property
    def up_width(self) -> int:
        """O: the output width of the up (or gate/up) projection."""
        return 2 * self.intermediate_size if self.has_gate else self.intermediate_size


def _weights(experts: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None, bool]:
    """(up or gate_up [N, ., .], down [N, ., .], up bias or None, down bias or None, has_gate)."""
    has_gate = bool(getattr(experts, "has_gate", hasattr(experts, "gate_up_proj")))
    name = "gate_up_proj" if has_gate else "up_proj"
    up = getattr(experts, name, None)
    down = getattr(experts, "down_proj", None)
    if not isinstance(up, torch.Tensor) or not isinstance(down, torch.Tensor):
        raise TypeError(
            f"{type(experts).__name__} is not a transformers experts module: it needs 3-D tensors `{name}` and "
            "`down_proj` (a class decorated with transformers' `use_experts_implementation`)"
        )
    if up.dim() != 3 or down.dim() != 3:
        raise ValueError(
            f"{type(experts).__name__}: expected 3-D expert weights, got {name} {tuple(up.shape)} and "
            f"down_proj {tuple(down.shape)}"
        )
    has_bias = bool(getattr(experts, "has_bias", hasattr(experts, f"{name}_bias")))
    up_bias = getattr(experts, f"{name}_bias", None) if has_bias else None
    down_bias = getattr(experts, "down_proj_bias", None) if has_bias else None
    return up, down, up_bias, down_bias, has_gate


def _activation(experts: torch.nn.Module, has_gate: bool) -> Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]:
    """The module's own gate (`_apply_gate`, e.g. gpt-oss's clamped one) or activation, as f(experts, x).

    Unbound, so the cached views hold no reference to the module they were read from.
    """
    if has_gate and hasattr(experts, "_apply_gate"):
        return type(experts)._apply_gate
    if getattr(experts, "act_fn", None) is None:
        raise TypeError(f"{type(experts).__name__} has neither `_apply_gate` nor `act_fn`; cannot apply its activation")
    if not has_gate:
        return lambda module, up: module.act_fn(up)
    if getattr(experts, "is_concatenated", True):
        def gate_concatenated(module: torch.nn.Module, gate_up: torch.Tensor) -> torch.Tensor:
            gate, up = gate_up.chunk(2, dim=-1)
            return module.act_fn(gate) * up
        return gate_concatenated

    def gate_interleaved(module: torch.nn.Module, gate_up: torch.Tensor) -> torch.Tensor:
        return module.act_fn(gate_up[..., ::2]) * gate_up[..., 1::2]
    return gate_interleaved


def _build_views(experts: torch.nn.Module) -> ExpertViews:
    up, down, up_bias, down_bias, has_gate = _weights(experts)
    transposed = bool(getattr(experts, "is_transposed", False))
    if transposed:  # gpt-oss: up [N, H, O], down [N, I, H]
        N, H, O = up.shape
        I = down.shape[1]
        down_shape = (N, I, H)
    else:  # up [N, O, H], down [N, H, I]
        N, O, H = up.shape
        I = down.shape[2]
        down_shape = (N, H, I)
    expected_O = 2 * I if has_gate else I
    if tuple(down.shape) != down_shape or O != expected_O:
        raise ValueError(
            f"{type(experts).__name__}: inconsistent expert weights: up {tuple(up.shape)}, down "
            f"{tuple(down.shape)} (has_gate={has_gate}, is_transposed={transposed}); expected down {down_shape} "
            f"and an up width of {expected_O}"
        )
    up_rows = up.unbind(0)
    down_rows = down.unbind(0)
    if transposed:  # stored [H, O] and [I, H]: the views are their transposes
        up_rows = tuple(w.t() for w in up_rows)
        down_rows = tuple(w.t() for w in down_rows)
    return ExpertViews(
        num_experts=N,
        hidden_size=H,
        intermediate_size=I,
        has_gate=has_gate,
        dtype=up.dtype,
        up=up_rows,
        down=down_rows,
        up_bias=None if up_bias is None else up_bias.unbind(0),
        down_bias=None if down_bias is None else down_bias.unbind(0),
        activation=_activation(experts, has_gate),
        has_post_norm=bool(getattr(experts, "has_post_expert_norm", False)),
    )


_CACHE: "weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple, ExpertViews]]" = weakref.WeakKeyDictionary()


def _key(experts: torch.nn.Module) -> tuple:
    """Changes whenever a weight tensor is replaced (`.to()`, `load_state_dict(assign=True)`, ...)."""
    return tuple(
        (name, t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))
        for name, t in experts.named_parameters(recurse=False)
    ) + tuple((name, t.data_ptr()) for name, t in experts.named_buffers(recurse=False))


def expert_views(experts: torch.nn.Module) -> ExpertViews:
    """The per-expert views of `experts`, built once and reused while its weights stay in place."""
    key = _key(experts)
    cached = _CACHE.get(experts)
    if cached is not None and cached[0] == key:
        return cached[1]
    views = _build_views(experts)
    _CACHE[experts] = (key, views)
    return views


def expert_bytes(experts: torch.nn.Module) -> int:
    """w_l: the bytes of one expert's weights (projections and biases) in their stored dtype.

    This is the byte unit b = w_l of the cost-model paper's Section 1 and fit (4).
    """
    up, down, up_bias, down_bias, _ = _weights(experts)
    N = up.shape[0]
    total = sum(t.numel() * t.element_size() for t in (up, down, up_bias, down_bias) if t is not None)
    return total // N


def find_experts(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every experts module of `model` that transformers' `use_experts_implementation` dispatches."""
    return [m for m in model.modules() if hasattr(m, "has_gate") and hasattr(m, "down_proj")]
