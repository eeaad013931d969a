"""The one place for device, dtype, synchronization and memory figures.

Everything that times or places tensors asks here, so a CUDA or MPS run differs from a CPU run in
this file alone.
"""

from __future__ import annotations

import os
import resource
import sys

import torch

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    """A torch dtype from a name such as "float32" or "bf16"; None means float32."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)}") from None


def default_device() -> torch.device:
    """CUDA if present, else MPS if present, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def resolve_device(device: str | torch.device | None) -> torch.device:
    return default_device() if device in (None, "auto") else torch.device(device)


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued kernels so that a wall-clock reading covers them (no-op on the CPU)."""
    device = torch.device(device) if device is not None else default_device()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far, in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def peak_device_bytes(device: torch.device | str | None = None) -> int | None:
    """Peak allocated accelerator memory, or None on the CPU."""
    device = torch.device(device) if device is not None else default_device()
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return None


def last_level_cache_bytes() -> int | None:
    """Size of the largest CPU cache that sysfs reports, or None where it cannot be read."""
    best = None
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = os.listdir(base)
    except OSError:
        return None
    for entry in entries:
        try:
            with open(os.path.join(base, entry, "size")) as f:
                text = f.read().strip()
        except OSError:
            continue
        scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
        value = int(text.rstrip("KMG")) * scale
        best = value if best is None else max(best, value)
    return best


def torch_info(device: torch.device | str | None = None) -> dict:
    """The torch side of an artifact's machine record (`artifacts.machine_info`)."""
    device = resolve_device(device)
    info = {"threads": torch.get_num_threads(), "device": str(device)}
    if device.type == "cuda":
        info["accelerator"] = torch.cuda.get_device_name(device)
    return info
