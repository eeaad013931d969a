"""The one kernel vocabulary: the names moespec's expert kernels go by, and how they map.

transformers knows the kernels by their experts-implementation names (`SLOT`, `DEDUP`, `AUTO`,
registered by `moespec.moe.registry`); the cost model (`moespec.costmodel`) names the two operations
it prices "slot" (one expert read per (token, slot), eq. (4)) and "dedup" (each distinct expert read
once, eq. (E.1)). "auto" runs per-slot below the crossover and dedup from it.

The three run the compiled kernels (`moespec.moe.compiled`), which fall back to the torch ones where
no compiler is found; `TORCH_SLOT`, `TORCH_DEDUP` and `TORCH_AUTO` name the torch kernels
(`moespec.moe.kernels`) with the same semantics, for comparison ("torch_slot", "torch_dedup" in the
expert-operation benchmark).
"""

SLOT, DEDUP, AUTO = "moespec_slot", "moespec_dedup", "moespec_auto"
TORCH_SLOT, TORCH_DEDUP, TORCH_AUTO = "moespec_torch_slot", "moespec_torch_dedup", "moespec_torch_auto"
ENGINE_KERNELS = (SLOT, DEDUP)  # the two whole-model kernels the measurements compare
COST_SLOT, COST_DEDUP, COST_AUTO = "slot", "dedup", "auto"
COST_KERNELS = (COST_SLOT, COST_DEDUP)
TO_COST = {SLOT: COST_SLOT, DEDUP: COST_DEDUP}  # experts implementation -> cost-model kernel
TO_ENGINE = {COST_SLOT: SLOT, COST_DEDUP: DEDUP}  # cost-model kernel -> experts implementation
# The bytes each operation requests: "slot" = n*m*b (one read per slot), "dedup" = U*b (the union);
# transformers' own kernels by what they read.
REQUESTED_BYTES = {COST_SLOT: COST_SLOT, COST_DEDUP: COST_DEDUP, "torch_slot": COST_SLOT,
                   "torch_dedup": COST_DEDUP, "eager": COST_DEDUP, "grouped_mm": COST_DEDUP, "batched_mm": COST_SLOT}


def requests_per_slot(kernel: str) -> bool:
    """Whether `kernel` requests n*m*b bytes (a read per slot) rather than U*b (the union, the default)."""
    return REQUESTED_BYTES.get(kernel, COST_DEDUP) == COST_SLOT
