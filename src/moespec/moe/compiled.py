"""Compiled expert kernels: each distinct expert read once, by both cores, at the memory roof.

A decode or verify pass reads far more expert bytes than it computes on, so its time is bytes over
the read bandwidth. The torch kernels (`moespec.moe.kernels`) lose that at small n: one BLAS call per
product, two separate passes over each expert (gate/up, then down), and small-row products that
BLAS runs at a fraction of the roof (BENCHMARKS.md, "Dedup orientation"). `csrc/experts.cpp` does a
whole layer in one call: for each group of slots it streams the expert's gate/up rows once against
all the group's tokens in register tiles, applies the gate, streams the down rows once and adds the
routing-weighted rows into the output. Both threads share every expert: each owns half its
intermediate units (their gate/up rows and the matching down columns) and its own output copy, so
the threads meet once per call. While a tile of rows meets its tokens, the next tile's rows stream
into L2 by software prefetch; in a scratch comparison (OLMoE widths, n = 1, 4, 8, float32 and
bfloat16, one roof reading) the kernels read at 63-83% of the roof without it and 88-98% with it. A first version split the down rows
instead and met once per expert; on this 2-core machine under load that barrier waited out
scheduler slices (OLMoE widths, n = 1, float32: 63 ms against 25 ms barrier-free, same run, torch
per-slot 33 ms). float32 and bfloat16 weights, float32 accumulation, `vdpbf16ps` dot products where
the CPU has AVX512_BF16. The weights are read in place from the module's own 3-D tensors (no gather,
no packed copy).

Why a torch C++ extension: it reads the module's storage directly, names the bf16 instructions, and
keeps one OpenMP team for the whole layer. Inductor's CPU GEMM templates were not measured against
it. The extension is built with the machine's g++ on first use (`torch.utils.cpp_extension.load`),
once per ISA: AVX-512 with AVX512_BF16, AVX-512, or AVX2 + FMA, the best the CPU reports, chosen at
run time (`MOESPEC_COMPILED_ISA=avx2` forces a lower one). Builds are cached under
~/.cache/moespec/torch_extensions. Without a compiler, on another CPU, or with `MOESPEC_NO_COMPILE=1`
every call runs the torch kernel, after one warning naming the reason (none for the variable).

Two groupings, one code path: `compiled_dedup` makes one group per distinct expert (requests the
union bytes Ub); `compiled_slot` makes one group per slot, so it reads one expert per slot and
requests nmb bytes, the per-slot semantics the cost model prices. With both on one code path,
r(n) = beta_dedup / beta_slot measures the grouping alone. They are registered as "moespec_slot" and
"moespec_dedup" (and "moespec_auto" switches between them; `moespec.moe.registry`).

Compiled: gate/up concatenated or interleaved with SiLU, gpt-oss's clamped gate (transposed,
interleaved, biases). Falls back to the torch kernel (`unsupported` says why): no gate, a
post-expert norm, another activation, another dtype or device, non-contiguous weights, autograd.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import shutil
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch

from moespec.moe import kernels
from moespec.moe.experts import expert_views

# T = tokens in the pass, m = experts per token, N = experts, H = hidden, I = intermediate, O = 2I

NO_COMPILE = "MOESPEC_NO_COMPILE"  # "1": never build, always the torch kernels
TORCH_LOCK = "lock"  # the file torch.utils.cpp_extension holds while it builds in a build directory
FORCE_ISA = "MOESPEC_COMPILED_ISA"  # build a lower ISA than the CPU's best (to test the AVX2 path)
SILU_CONCAT, SILU_INTERLEAVED, GPTOSS = 0, 1, 2  # activation codes of csrc/experts.cpp
# Build name -> (CPU flags it needs as /proc/cpuinfo spells them, compiler flags), best first.
ISAS = {
    "avx512bf16": ({"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "fma"},
                   ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma"]),
    "avx512": ({"avx512f", "avx512bw", "avx512vl", "fma"}, ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mfma"]),
    "avx2": ({"avx2", "fma"}, ["-mavx2", "-mfma"]),
}
SOURCE = Path(__file__).parent / "csrc" / "experts.cpp"
_log = logging.getLogger(__name__)
_builds: dict[str, tuple[object | None, str | None]] = {}  # ISA -> (torch.ops namespace or None, why not)


def reset() -> None:
    """Forget built or failed builds (tests start from a fresh state; the disk cache stays)."""
    _builds.clear()
    _cpu_flags.cache_clear()


@functools.cache  # read once: /proc/cpuinfo costs ~70 us, more than a tiny layer's whole call
def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: torch's own capability probe, without the bf16 detail
        cap = torch.backends.cpu.get_cpu_capability()
        return ISAS["avx512"][0] if cap.startswith("AVX512") else ISAS["avx2"][0] if cap == "AVX2" else set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def isa() -> str | None:
    """The build this process uses: the CPU's best of ISAS, or MOESPEC_COMPILED_ISA; None if neither fits."""
    flags = _cpu_flags()
    forced = os.environ.get(FORCE_ISA)
    if forced:
        if forced not in ISAS:
            raise ValueError(f"{FORCE_ISA}={forced!r}: use one of {list(ISAS)}")
        return forced if ISAS[forced][0] <= flags else None
    return next((name for name, (needs, _) in ISAS.items() if needs <= flags), None)


def build_extension(stem: str, source: Path, name: str):
    """Compile (or load from the cache) `source` for ISA `name`; its torch.ops namespace
    moespec_<stem>_<name>. Every csrc/ file builds this way (`moespec.moe.dense` builds linear.cpp)."""
    from torch.utils import cpp_extension

    compiler = (os.environ.get("CXX") or "c++").split()[0]
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler: {compiler!r} is not on PATH (install g++ or set CXX)")
    ops = f"moespec_{stem}_{name}"
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "moespec" / "torch_extensions"
    build_dir = root / f"torch-{torch.__version__}" / ops  # the ABI follows torch's version
    build_dir.mkdir(parents=True, exist_ok=True)
    _log.info("building moespec's %s (%s) in %s", stem, name, build_dir)
    with _build_lock(build_dir):
        cpp_extension.load(
            name=ops,
            sources=[str(source)],
            extra_cflags=["-O3", "-fopenmp", *ISAS[name][1], f"-DMOESPEC_OPS={ops}"],
            extra_ldflags=["-fopenmp"],  # the same libgomp.so.1 soname torch has loaded: one OpenMP runtime
            build_directory=str(build_dir),
            is_python_module=False,
        )
    return getattr(torch.ops, ops)


@contextmanager
def _build_lock(build_dir: Path):
    """Hold an flock on `build_dir` while torch builds or loads there. torch's own lock is a file that
    a killed build leaves behind, and every later process then waits on it forever; an flock ends with
    its holder, so whoever holds ours is the only builder, and a torch lock file it finds is stale."""
    with open(build_dir / "moespec-build.flock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        stale = build_dir / TORCH_LOCK
        if stale.exists():
            _log.warning("removing %s, left by a build that was killed", stale)
            stale.unlink(missing_ok=True)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(name: str):
    """Compile (or load from the cache) the experts extension for ISA `name`; its torch.ops namespace."""
    return build_extension("experts", SOURCE, name)


def load_ops(builds: dict, build: Callable[[str], object], what: str, fallback: str):
    """`build`'s namespace for this process's ISA, built once into `builds` (ISA -> (namespace, why
    not)); None where `fallback` must run, after one warning naming the reason (none for NO_COMPILE)."""
    if os.environ.get(NO_COMPILE, "") not in ("", "0"):
        return None
    name = isa()
    key = name or "none"
    if key not in builds:
        if name is None:
            builds[key] = (None, "this CPU has neither AVX2 + FMA nor AVX-512 (or lacks the forced ISA)")
        else:
            try:
                builds[key] = (build(name), None)
            except Exception as e:  # no compiler, no ninja, a failed build: all mean the same fallback
                first = (str(e).strip().splitlines() or [""])[0]
                builds[key] = (None, f"building the {name} extension failed: {type(e).__name__}: {first}")
        if builds[key][0] is None:
            warnings.warn(f"moespec: {what} unavailable ({builds[key][1]}); running {fallback}", RuntimeWarning,
                          stacklevel=4)
    return builds[key][0]


def _ops():
    """The built op namespace, building it on first use; None where the fallback must run."""
    return load_ops(_builds, _build, "compiled expert kernels", "the torch kernels")


def available() -> bool:
    """Whether the compiled kernels run here: builds once per process (see `reset`), warns once if not."""
    return _ops() is not None


def unavailable_reason() -> str | None:
    """Why `available()` is False (None when it is True)."""
    if os.environ.get(NO_COMPILE, "") not in ("", "0"):
        return f"{NO_COMPILE}=1"
    if _ops() is not None:
        return None
    return _builds[isa() or "none"][1]


def _activation(experts: torch.nn.Module) -> tuple[int, float, float] | None:
    """(code, alpha, limit) of the module's gate when the compiled kernel has it; else None.

    Mirrors `experts._activation`: the module's `_apply_gate` when it has one (transformers' default
    chunks gate|up; gpt-oss's is recognized by identity, any other is not compiled), else act_fn.
    """
    from transformers.activations import SiLUActivation
    from transformers.integrations import moe

    default_gate = getattr(moe, "_default_apply_gate", None)  # private in transformers: may move

    silu = type(getattr(experts, "act_fn", None)) in (torch.nn.SiLU, SiLUActivation)
    gate = getattr(type(experts), "_apply_gate", None)
    if gate is None:
        concatenated = getattr(experts, "is_concatenated", True)
        return ((SILU_CONCAT if concatenated else SILU_INTERLEAVED), 0.0, 0.0) if silu else None
    if default_gate is not None and gate is default_gate:
        return (SILU_CONCAT, 0.0, 0.0) if silu else None
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    if gate is GptOssExperts._apply_gate:
        return GPTOSS, float(experts.alpha), float(experts.limit)
    return None


def _plan(experts: torch.nn.Module, hidden_states: torch.Tensor) -> tuple | str:
    """The op's weight arguments (up, down, up bias, down bias, transposed, act, alpha, limit) and
    dtype, or why this call must run the torch kernel instead."""
    views = expert_views(experts)
    if not views.has_gate:
        return "no gate: only gated SiLU and gpt-oss's gate are compiled"
    if views.has_post_norm:
        return "post-expert norm"
    activation = _activation(experts)
    if activation is None:
        return f"activation {type(getattr(experts, 'act_fn', None)).__name__} of {type(experts).__name__}"
    if views.dtype not in (torch.float32, torch.bfloat16):
        return f"weights in {views.dtype}"
    tensors = [experts.gate_up_proj, experts.down_proj]  # [N, O, H] and [N, H, I], or transposed
    tensors += [experts.gate_up_proj_bias, experts.down_proj_bias] if views.up_bias is not None else [None, None]
    present = [t for t in tensors if t is not None]
    if hidden_states.device.type != "cpu" or any(t.device.type != "cpu" for t in present):
        return "not on the CPU"
    if not all(t.is_contiguous() for t in present):
        return "non-contiguous weights"
    if any(t.dtype != views.dtype for t in present):
        return "biases in another dtype than the weights"
    if torch.is_grad_enabled() and (hidden_states.requires_grad or any(t.requires_grad for t in present)):
        return "autograd (the compiled kernel has no backward)"
    return (*tensors, bool(getattr(experts, "is_transposed", False)), *activation), views.dtype


def unsupported(experts: torch.nn.Module, hidden_states: torch.Tensor) -> str | None:
    """Why this call must run the torch kernel instead, or None when the compiled one can run it."""
    plan = _plan(experts, hidden_states)
    return plan if isinstance(plan, str) else None


def _run(experts, hidden_states, top_k_index, top_k_weights, dedup: bool) -> torch.Tensor | None:
    """The compiled kernel's [T, H] output, or None where the torch kernel must run."""
    if hidden_states.dim() != 2:
        return None  # wrong shapes get the torch kernel's error messages
    plan = _plan(experts, hidden_states)
    ops = None if isinstance(plan, str) else _ops()
    if ops is None:
        return None
    weights, dtype = plan
    out = ops.experts(
        hidden_states.to(dtype).contiguous(),  # [T, H]
        top_k_index.to(torch.long).contiguous(),  # [T, m]
        top_k_weights.to(torch.float32).contiguous(),  # [T, m]
        *weights,
        dedup=dedup,
    )
    return out.to(hidden_states.dtype)


def _with_fallback(dedup: bool, fallback, name: str, doc: str):
    """The compiled kernel (dedup or per slot) as an experts function (transformers' signature:
    experts, hidden_states [T, H], top_k_index [T, m], top_k_weights [T, m] -> [T, H]), the torch
    kernel `fallback` where the extension does not run."""
    def run(experts: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
            top_k_weights: torch.Tensor) -> torch.Tensor:
        out = _run(experts, hidden_states, top_k_index, top_k_weights, dedup=dedup)
        return fallback(experts, hidden_states, top_k_index, top_k_weights) if out is None else out

    run.__name__ = run.__qualname__ = name
    run.__doc__ = doc
    return run


compiled_dedup = _with_fallback(True, kernels.dedup, "compiled_dedup",
                                "Each distinct expert read once for all its tokens (requests Ub); "
                                "else `kernels.dedup`.")
compiled_slot = _with_fallback(False, kernels.per_slot, "compiled_slot",
                               "One expert read per slot, token by token (requests nmb); else `kernels.per_slot`.")
