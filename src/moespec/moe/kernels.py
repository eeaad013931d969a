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


def _needs_grad(views: ExpertViews, hidden_states: torch.Tensor) -> bool:
    """True where autograd must see the products, so they cannot write into preallocated `out=` rows."""
    return torch.is_grad_enabled() and (hidden_states.requires_grad or views.up[0].requires_grad)


def _slot_products(
    mats: tuple[torch.Tensor, ...],  # N views [R, C]
    biases: tuple[torch.Tensor, ...] | None,  # N views [R]
    ids: list[int],  # [S]
    vectors: list[torch.Tensor],  # S views [C]
    out: torch.Tensor | None,  # [S, R], or None to build the result for autograd
) -> torch.Tensor:  # [S, R]
    """y_s = mats[ids[s]] @ vectors[s] (+ biases[ids[s]]): one matrix-vector product per slot."""
    if out is None:
        if biases is None:
            return torch.stack([torch.mv(mats[e], v) for e, v in zip(ids, vectors)])
        return torch.stack([torch.addmv(biases[e], mats[e], v) for e, v in zip(ids, vectors)])
    if biases is None:
        for e, v, y in zip(ids, vectors, out.unbind(0)):
            torch.mv(mats[e], v, out=y)
    else:
        for e, v, y in zip(ids, vectors, out.unbind(0)):
            torch.addmv(biases[e], mats[e], v, out=y)
    return out


def _group_products(
    mats: tuple[torch.Tensor, ...],  # N views [R, C]
    biases: tuple[torch.Tensor, ...] | None,  # N views [R]
    groups: list[tuple[int, int, int]],  # (expert, start, end) over the grouped rows
    rows: torch.Tensor,  # [S, C], grouped by expert
    out: torch.Tensor | None,  # [S, R], or None to build the result for autograd
) -> torch.Tensor:  # [S, R]
    """Y[lo:hi] = rows[lo:hi] @ mats[e].T (+ biases[e]): one product per distinct expert.

    Computed as (W X^T)^T with the expert W [R, C] on the left: with torch's default 2 threads here
    this ran 1.3-2.2x faster than X W^T for 2-9 tokens per expert (1 thread: 0.7-1.3x; the A/B,
    benchmarks/dedup_orientation.py, is in BENCHMARKS.md). A group of one token is a mat-vec product;
    a group of three is padded with a zero row to four, which the same benchmark ran 1.3-1.5x faster
    (tiles of 4 beyond that were not faster).
    """
    if out is None:
        parts = [torch.mm(mats[e], rows[lo:hi].t()).t() for e, lo, hi in groups]
        if biases is not None:
            parts = [y + biases[e] for y, (e, _, _) in zip(parts, groups)]
        return torch.cat(parts)
    for e, lo, hi in groups:
        if hi - lo == 1:
            torch.mv(mats[e], rows[lo], out=out[lo])
        elif hi - lo == 3:  # padded to 4 tokens: BLAS ran 1.3-1.5x faster at 4 than at 3 here
            padded = torch.cat((rows[lo:hi], rows.new_zeros(1, rows.shape[1])))
            out[lo:hi].copy_(torch.mm(mats[e], padded.t())[:, :3].t())
        else:
            out[lo:hi].copy_(torch.mm(mats[e], rows[lo:hi].t()).t())
        if biases is not None:
            out[lo:hi] += biases[e]
    return out


def _buffer(S: int, width: int, views: ExpertViews, like: torch.Tensor, grad: bool) -> torch.Tensor | None:
    return None if grad else torch.empty(S, width, dtype=views.dtype, device=like.device)


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
    grad = _needs_grad(views, hidden_states)
    T, m = top_k_index.shape
    S = T * m
    x_rows = hidden_states.to(views.dtype).unbind(0)  # T views [H]
    slot_x = [x for x in x_rows for _ in range(m)]  # S views [H]
    ids = top_k_index.reshape(-1).tolist()  # the one host sync
    up_out = _slot_products(views.up, views.up_bias, ids, slot_x, _buffer(S, views.up_width, views, hidden_states, grad))
    act = views.activation(experts, up_out)  # [S, I]
    down_out = _slot_products(
        views.down, views.down_bias, ids, list(act.unbind(0)), _buffer(S, views.hidden_size, views, hidden_states, grad)
    )
    return _finish(experts, views, down_out, top_k_weights, hidden_states.dtype)


def dedup(
    experts: torch.nn.Module,
    hidden_states: torch.Tensor,  # [T, H]
    top_k_index: torch.Tensor,  # [T, m]
    top_k_weights: torch.Tensor,  # [T, m]
) -> torch.Tensor:  # [T, H]
    """One matrix product per distinct expert over its tokens: requests the union bytes Ub (Section 1).

    A one-token pass has nothing to deduplicate (its m experts are distinct, U = m), so it runs the
    per-slot kernel, as the paper's engines do at n = 1 with deduplication on (Table 6).
    """
    if hidden_states.shape[0] == 1:
        return per_slot(experts, hidden_states, top_k_index, top_k_weights)
    views = expert_views(experts)
    _check(hidden_states, top_k_index, top_k_weights, views)
    grad = _needs_grad(views, hidden_states)
    T, m = top_k_index.shape
    S = T * m
    sorted_ids, order = torch.sort(top_k_index.reshape(-1), stable=True)  # slots grouped by expert
    present, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
    x = hidden_states.to(views.dtype).index_select(0, order // m)  # [S, H], tokens in grouped order
    bounds = torch.cumsum(counts, 0).tolist()
    groups = list(zip(present.tolist(), [0] + bounds[:-1], bounds))  # (expert, start, end)
    up_out = _group_products(views.up, views.up_bias, groups, x, _buffer(S, views.up_width, views, hidden_states, grad))
    act = views.activation(experts, up_out)  # [S, I]
    down_out = _group_products(
        views.down, views.down_bias, groups, act, _buffer(S, views.hidden_size, views, hidden_states, grad)
    )
    slot_out = torch.zeros_like(down_out).index_add(0, order, down_out)  # back to slot order
    return _finish(experts, views, slot_out, top_k_weights, hidden_states.dtype)


def union_size(top_k_index: torch.Tensor) -> int:  # top_k_index [T, m]
    """U: the number of distinct experts a pass names, so that dedup requests U * w_l bytes."""
    return int(torch.unique(top_k_index).numel())
