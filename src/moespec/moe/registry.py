"""moespec's kernels inside transformers: "moespec_slot", "moespec_dedup", "moespec_auto" run the
compiled kernels (`moespec.moe.compiled`: each expert read once per group, at the memory roof; the
torch kernels where they cannot build or run); "moespec_torch_slot", "moespec_torch_dedup" and
"moespec_torch_auto" are the torch kernels (`moespec.moe.kernels`) with the same semantics.

The compiled kernels became the default once the benchmarks decided (BENCHMARKS.md, "Compiled
kernels"): at OLMoE widths, in one run, they read 1.8x the torch kernels' bytes per second in
float32 and 3.5x in bfloat16, with r(n) = 0.97-1.10 on random routing in float32 (0.77-1.01 where
several tokens share an expert).

`register()` adds the six to transformers' `ExpertsInterface`, so that

    model = AutoModelForCausalLM.from_pretrained(path, experts_implementation="moespec_auto")
    model.set_experts_implementation("moespec_auto")

both work. `moespec.register_kernels()` calls it, as does loading a model through `moespec.models`.

"moespec_auto" runs the per-slot kernel on passes of fewer than c tokens and the deduplicating
kernel from c tokens on, where c is the crossover: the smallest pass size from which
deduplication is faster (Section 2; it is where u_bar(n) < r(n), eq. (7)). c comes, in this order,
from a model's own setting (`set_crossover(c, model=model)`), the global one (`set_crossover(c)`),
or the default 2 (deduplicate every pass of two tokens or more). c = None means deduplication
never pays on verify passes: every pass of up to LONGEST_VERIFY_PASS tokens runs per-slot, and
only longer passes (prefills, where per-slot would read n*m experts) deduplicate.
`crossover_from_characterization` reads c from the artifact that `moespec characterize` writes.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers.integrations.moe import ExpertsInterface

from moespec import artifacts
from moespec.kernel_names import AUTO, COST_DEDUP, COST_SLOT, DEDUP, SLOT, TORCH_AUTO, TORCH_DEDUP, TORCH_SLOT
from moespec.moe.compiled import compiled_dedup, compiled_slot
from moespec.moe.experts import find_experts
from moespec.moe.kernels import dedup, per_slot

DEFAULT_CROSSOVER = 2
# Passes longer than any verify pass (a prefill) always deduplicate: per-slot would read n*m experts.
LONGEST_VERIFY_PASS = 16
_MODEL_ATTR = "_moespec_crossover"  # per-module override, set on each experts module of a model
_UNSET = object()
_global_crossover: int | None = DEFAULT_CROSSOVER


def _validate(c: object) -> int | None:
    if c is None:
        return None
    if isinstance(c, bool) or not isinstance(c, int) or c < 1:
        raise ValueError(f"crossover must be a pass size >= 1 (an int) or None for 'never deduplicate', got {c!r}")
    return c


def set_crossover(c: int | None, *, model: torch.nn.Module | None = None) -> None:
    """Set the crossover c of "moespec_auto": dedup on passes of >= c tokens, per-slot below.

    Without `model`, sets the global default; with `model`, sets it on that model's experts modules
    only (it then wins over the global value). None: deduplication never pays, always per-slot.
    """
    c = _validate(c)
    if model is None:
        global _global_crossover
        _global_crossover = c
        return
    found = find_experts(model)
    if not found:
        raise ValueError(f"{type(model).__name__} has no transformers experts modules; set_crossover needs an MoE model")
    for experts in found:
        setattr(experts, _MODEL_ATTR, c)


def crossover(experts: torch.nn.Module | None = None) -> int | None:
    """The crossover that "moespec_auto" uses for `experts` (its model's, else the global one)."""
    if experts is not None:
        value = getattr(experts, _MODEL_ATTR, _UNSET)
        if value is not _UNSET:
            return value
    return _global_crossover


def crossover_from_characterization(path: str | Path) -> int | None:
    """The crossover a characterization artifact records (payload["crossover"]): an int, or None."""
    doc = artifacts.load(path, "characterize")
    payload = doc.get("payload") or {}
    if "crossover" not in payload:
        raise ValueError(f"{path}: the characterization has no 'crossover' in its payload; rerun `moespec characterize`")
    try:
        return _validate(payload["crossover"])
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def dispatch(experts: torch.nn.Module, n: int) -> str:
    """COST_SLOT or COST_DEDUP: what "moespec_auto" runs on a pass of n tokens (prefills dedup)."""
    c = crossover(experts)
    return COST_DEDUP if (c is not None and n >= c) or n > LONGEST_VERIFY_PASS else COST_SLOT


def by_crossover(dedup_kernel: str, slot_kernel: str, name: str, doc: str):
    """An experts function (transformers' signature: experts, hidden_states [T, H], top_k_index [T, m],
    top_k_weights [T, m] -> [T, H]) running this module's `slot_kernel` below the crossover and its
    `dedup_kernel` from it on; T is the pass size n (`dispatch`). The kernels are looked up by name at
    each call, as a function body would, so a patched kernel is the one that runs."""
    def run(experts: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
            top_k_weights: torch.Tensor) -> torch.Tensor:
        chosen = dedup_kernel if dispatch(experts, hidden_states.shape[0]) == COST_DEDUP else slot_kernel
        return globals()[chosen](experts, hidden_states, top_k_index, top_k_weights)

    run.__name__ = run.__qualname__ = name
    run.__doc__ = doc
    return run


auto = by_crossover("compiled_dedup", "compiled_slot", "auto",
                    "Compiled per-slot below the crossover, compiled dedup from it on; T is the pass size n.")
torch_auto = by_crossover("dedup", "per_slot", "torch_auto", "`auto` on the torch kernels.")


IMPLEMENTATIONS = {SLOT: compiled_slot, DEDUP: compiled_dedup, AUTO: auto,
                   TORCH_SLOT: per_slot, TORCH_DEDUP: dedup, TORCH_AUTO: torch_auto}


def register() -> None:
    """Add moespec's kernels to transformers' ExpertsInterface (idempotent)."""
    for name, fn in IMPLEMENTATIONS.items():
        ExpertsInterface.register(name, fn)
