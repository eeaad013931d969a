"""The two expert kernels of the cost-model paper: per-slot and deduplicating.

Terms (Section 1): a pass of n tokens (T = n here) with m selected experts each has nm slots. The
per-slot kernel multiplies each token by each of its selected experts separately, so it requests
nmb expert bytes, one expert read per slot. The deduplicating kernel groups the pass's slots by
expert and reads each of the U distinct experts once, so it requests the union bytes Ub.

Both have the signature of a transformers experts implementation (`ExpertsInterface`):
f(experts, hidden_states [T, H], top_k_index [T, m], top_k_weights [T, m]) -> [T, H], and accept
every layout `moespec.moe.experts` reads. Neither gathers or copies expert weights (no
`W[expert_ids]`): each product reads a view of one expert in place. Python overhead is kept to one
host sync for the ids and one BLAS call per product, since at n <= 9 a pass has at most a few
hundred products.
"""

from __future__ import annotations

import torch

from moespec.moe.experts import ExpertViews, expert_views

# T = tokens in the pass, m = experts per token, S = T*m slots, H = hidden, I = intermediate,
# O = up width (2I with a gate, I without), U = distinct experts in the pass


def _check(hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, views: ExpertViews) -> None:
    if hidden_states.dim() != 2 or hidden_states.shape[1] != views.hidden_size:
        raise ValueError(
            f"hidden_states must be [T, {views.hidden_size}], got {tuple(hidden_states.shape)}; "
            "flatten batch and sequence first"
        )
    if top_k_index.dim() != 2 or top_k_index.shape[0] != hidden_states.shape[0]:
        raise ValueError(
            f"top_k_index must be [T, m] with T = {hidden_states.shape[0]}, got {tuple(top_k_index.shape)}"
        )
    if tuple(top_k_weights.shape) != tuple(top_k_index.shape):
        raise ValueError(
            f"top_k_weights {tuple(top_k_weights.shape)} must have the shape of top_k_index {tuple(top_k_index.shape)}"
        )


def _finish(
    experts: torch.nn.Module,
    views: ExpertViews,
    out_slots: torch.Tensor,  # [S, H], expert outputs in slot order
    top_k_weights: torch.Tensor,  # [T, m]
    dtype: torch.dtype,
) -> torch.Tensor:
    """Post-expert norm (where the architecture has one), routing weights, sum over each token's slots."""
    if views.has_post_norm:
        out_slots = experts.post_expert_norm(out_slots)
    T, m = top_k_weights.shape
    weighted = out_slots.view(T, m, views.hidden_size) * top_k_weights.unsqueeze(-1)
    return weighted.sum(dim=1).to(dtype)


def per_slot(
    experts: torch.nn.Module,
    hidden_states: torch.Tensor,  # [T, H]
    top_k_index: torch.Tensor,  # [T, m]
    top_k_weights: torch.Tensor,  # [T, m]
) -> torch.Tensor:  # [T, H]
    """One matrix-vector product per slot and projection: requests nmb expert bytes (Section 1).

    Slots run token by token, as a per-slot engine visits them; an expert named by two slots is
    read twice.
    """
    views = expert_views(experts)
    _check(hidden_states, top_k_index, top_k_weights, views)
    T, m = top_k_index.shape
    S = T * m
    x_rows = hidden_states.to(views.dtype).unbind(0)  # T views [H]
    slot_x = [x for x in x_rows for _ in range(m)]  # S views [H]
    ids = top_k_index.reshape(-1).tolist()  # the one host sync

    up_out = torch.empty(S, views.up_width, dtype=views.dtype, device=hidden_states.device)
    up, up_bias = views.up, views.up_bias
    if up_bias is None:
        for e, x, y in zip(ids, slot_x, up_out.unbind(0)):
            torch.mv(up[e], x, out=y)
    else:
        for e, x, y in zip(ids, slot_x, up_out.unbind(0)):
            torch.addmv(up_bias[e], up[e], x, out=y)

    act = views.activation(experts, up_out)  # [S, I]
    down_out = torch.empty(S, views.hidden_size, dtype=views.dtype, device=hidden_states.device)
    down, down_bias = views.down, views.down_bias
    if down_bias is None:
        for e, a, y in zip(ids, act.unbind(0), down_out.unbind(0)):
            torch.mv(down[e], a, out=y)
    else:
        for e, a, y in zip(ids, act.unbind(0), down_out.unbind(0)):
            torch.addmv(down_bias[e], down[e], a, out=y)
    return _finish(experts, views, down_out, top_k_weights, hidden_states.dtype)


def dedup(
    experts: torch.nn.Module,
    hidden_states: torch.Tensor,  # [T, H]
    top_k_index: torch.Tensor,  # [T, m]
    top_k_weights: torch.Tensor,  # [T, m]
) -> torch.Tensor:  # [T, H]
    """One matrix product per distinct expert over its tokens: requests the union bytes Ub (Section 1)."""
    views = expert_views(experts)
    _check(hidden_states, top_k_index, top_k_weights, views)
    T, m = top_k_index.shape
    S = T * m
    flat_ids = top_k_index.reshape(-1)
    sorted_ids, order = torch.sort(flat_ids, stable=True)  # slots grouped by expert
    present, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
    x = hidden_states.to(views.dtype).index_select(0, order // m)  # [S, H], tokens in grouped order
    bounds = torch.cumsum(counts, 0).tolist()
    groups = list(zip(present.tolist(), [0] + bounds[:-1], bounds))  # (expert, start, end)

    up_out = torch.empty(S, views.up_width, dtype=views.dtype, device=hidden_states.device)
    up_t, up_bias = views.up_t, views.up_bias
    if up_bias is None:
        for e, lo, hi in groups:
            torch.mm(x[lo:hi], up_t[e], out=up_out[lo:hi])
    else:
        for e, lo, hi in groups:
            torch.addmm(up_bias[e], x[lo:hi], up_t[e], out=up_out[lo:hi])

    act = views.activation(experts, up_out)  # [S, I]
    down_out = torch.empty(S, views.hidden_size, dtype=views.dtype, device=hidden_states.device)
    down_t, down_bias = views.down_t, views.down_bias
    if down_bias is None:
        for e, lo, hi in groups:
            torch.mm(act[lo:hi], down_t[e], out=down_out[lo:hi])
    else:
        for e, lo, hi in groups:
            torch.addmm(down_bias[e], act[lo:hi], down_t[e], out=down_out[lo:hi])

    slot_out = torch.empty_like(down_out).index_copy_(0, order, down_out)  # back to slot order
    return _finish(experts, views, slot_out, top_k_weights, hidden_states.dtype)


def union_size(top_k_index: torch.Tensor) -> int:  # top_k_index [T, m]
    """U: the number of distinct experts a pass names, so that dedup requests U * w_l bytes."""
    return int(torch.unique(top_k_index).numel())
