"""Compiled small-n dense layers: the attention projections and the output head of a decode or
verify pass read at the memory roof, as `compiled` does for the experts.

A pass of n = 1..16 rows multiplies each dense weight by a few rows only, so its time is the
weight's bytes over the read bandwidth. torch's `F.linear` misses that here: a 2048x1024 bfloat16
weight reads at ~11 GB/s at n = 1, and float32 falls to 10-13 GB/s at n = 4..8, against a read roof
of ~26 GB/s (issue 24). `csrc/linear.cpp` splits the weight's output rows between the cores (one
OpenMP team per call, no barrier but its end), streams each block of rows once for all n input rows,
accumulates in float32 (`vdpbf16ps` on bfloat16 where the CPU has AVX512_BF16) and rounds once.

Why here, in `moespec.moe`, and not in `engine/`: it is a kernel beside the compiled experts, built
by the same code (`compiled.build_extension`, the ISA chosen at run time, the disk cache under
~/.cache/moespec, `MOESPEC_NO_COMPILE=1`) from the same csrc/ folder; the engine would only call
`fast_linear` on its model.

`linear` runs `F.linear` instead (no warning, the same result) for more than MAX_ROWS rows
(prefills), other dtypes or devices, mixed dtypes, a non-contiguous weight or bias, autograd and
autocast; and everywhere, after one warning, where the extension cannot be built.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F

from moespec.moe import compiled

# Decode and verify passes; more rows (a prefill) run F.linear, whose GEMM gains there, while these
# tiles are FMA-bound from n ~ 8 (one core, in cache: ~11 GB/s at n = 16, ~50 at n = 1)
MAX_ROWS = 16
DTYPES = (torch.float32, torch.bfloat16)
SOURCE = Path(__file__).parent / "csrc" / "linear.cpp"
_builds: dict[str, tuple[object | None, str | None]] = {}  # ISA -> (torch.ops namespace or None, why not)
_linear_ops: dict[tuple, object | None] = {}  # (NO_COMPILE, FORCE_ISA) -> the linear op or None


def reset() -> None:
    """Forget built or failed builds (tests start from a fresh state; the disk cache stays)."""
    _builds.clear()
    _linear_ops.clear()
    compiled._cpu_flags.cache_clear()


def _build(name: str):
    """Compile (or load from the cache) linear.cpp for ISA `name`; its torch.ops namespace."""
    return compiled.build_extension("linear", SOURCE, name)


def _ops():
    """The built op namespace, building it on first use; None where F.linear must run."""
    return compiled.load_ops(_builds, _build, "compiled dense layers", "F.linear")


def _linear_op():
    """The compiled op or None, looked up once per setting of the two variables: `_ops` takes
    ~3 us, more than a small layer's F.linear (~2 us)."""
    key = (os.environ.get(compiled.NO_COMPILE), os.environ.get(compiled.FORCE_ISA))
    if key not in _linear_ops:
        ops = _ops()
        _linear_ops[key] = None if ops is None else ops.linear.default
    return _linear_ops[key]


def available() -> bool:
    """Whether the compiled layers run here: builds once per process (see `reset`), warns once if not."""
    return _ops() is not None


def unavailable_reason() -> str | None:
    """Why `available()` is False (None when it is True)."""
    if os.environ.get(compiled.NO_COMPILE, "") not in ("", "0"):
        return f"{compiled.NO_COMPILE}=1"
    if _ops() is not None:
        return None
    return _builds[compiled.isa() or "none"][1]


def unsupported(
    x: torch.Tensor,  # [..., C]
    weight: torch.Tensor,  # [R, C]
    bias: torch.Tensor | None = None,  # [R]
) -> str | None:
    """Why `linear` must run F.linear on these arguments, or None when the compiled layer can."""
    if weight.dtype not in DTYPES:
        return f"weights in {weight.dtype}"
    if x.dtype != weight.dtype or (bias is not None and bias.dtype != weight.dtype):
        return "inputs, weights and bias in different dtypes"
    if x.device.type != "cpu" or weight.device.type != "cpu" or (bias is not None and bias.device.type != "cpu"):
        return "not on the CPU"
    if weight.dim() != 2 or x.dim() == 0 or x.shape[-1] != weight.shape[1] or (bias is not None and bias.dim() != 1):
        return "shapes F.linear must judge"  # its own error message, or its broadcasting
    n = x.numel() // max(1, x.shape[-1])
    if not 1 <= n <= MAX_ROWS:
        return f"{n} rows (compiled for 1..{MAX_ROWS})"
    if not weight.is_contiguous() or (bias is not None and not bias.is_contiguous()):
        return "non-contiguous weight or bias"
    if torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    ):
        return "autograd (the compiled layer has no backward)"
    if torch.is_autocast_enabled("cpu"):
        return "autocast (F.linear casts under it)"
    return None


def linear(
    x: torch.Tensor,  # [..., C], n = x.numel() / C rows
    weight: torch.Tensor,  # [R, C]
    bias: torch.Tensor | None = None,  # [R]
) -> torch.Tensor:  # [..., R]
    """`F.linear(x, weight, bias)`, compiled for 1..MAX_ROWS rows of float32 or bfloat16."""
    op = None if unsupported(x, weight, bias) is not None else _linear_op()
    if op is None:
        return F.linear(x, weight, bias)
    return op(x, weight, bias)


class FastLinear(torch.nn.Linear):
    """An `nn.Linear` whose forward is `linear`: `fast_linear` sets it as the class of existing
    modules, so they keep their parameters, hooks and state-dict keys."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # [..., in_features] -> [..., out_features]
        return linear(input, self.weight, self.bias)


def fast_linear(model: torch.nn.Module) -> int:
    """Switch every plain `nn.Linear` of `model` (itself included; the output head too) to the
    compiled path, in place; the number switched. Subclasses of nn.Linear are left alone: their
    forward may differ. Undo with `restore_linear`."""
    switched = [m for m in model.modules() if type(m) is torch.nn.Linear]
    for m in switched:
        m.__class__ = FastLinear
    return len(switched)


def restore_linear(model: torch.nn.Module) -> int:
    """Undo `fast_linear`: every `FastLinear` of `model` is a plain `nn.Linear` again; the number restored."""
    restored = [m for m in model.modules() if type(m) is FastLinear]
    for m in restored:
        m.__class__ = torch.nn.Linear
    return len(restored)
