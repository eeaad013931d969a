"""Greedy decoding's per-token work on llama.cpp in compiled code (csrc/llama_steps.c): the argmax of
logits rows read in place from llama.cpp's buffer, and runs of one-token greedy steps with no
Python call per token.

On a model whose passes take well under a millisecond, the Python between two passes (a logits
copy, a numpy argmax, ctypes calls to fill the batch) is a tenth of the step; these functions take
it to a few microseconds. The C file is compiled on first use with the machine's C compiler into
the cache folder (`moespec.cache`), keyed by its source; it is handed llama.cpp's own `llama_decode`
and `llama_get_logits_ith` from the libllama llama-cpp-python loaded. Without a compiler, or with
`MOESPEC_NO_COMPILE=1`, `available()` is False and `LlamaModel` falls back to its Python path (one
warning says why).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import warnings
from functools import cache
from pathlib import Path

import numpy as np

from moespec.backends import llama_lib
from moespec.backends.protocol import StepStop
from moespec.cache import cache_dir

SOURCE = Path(__file__).parent / "csrc" / "llama_steps.c"
NO_COMPILE = "MOESPEC_NO_COMPILE"
NO_ROW, NOT_FINITE, BAD_ROW = -1, -2, 1_000_000  # the C file's STEPS_* codes
_I32P, _F64P, _U8P = ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_uint8)


def _build() -> Path:
    """The compiled library, built once per source and kept in the cache folder."""
    text = SOURCE.read_bytes()
    out = cache_dir() / "llama-steps" / f"llama_steps-{hashlib.sha256(text).hexdigest()[:12]}.so"
    if not out.is_file():
        compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            raise OSError("no C compiler (cc or gcc) on PATH")
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(f"{out.name}.{os.getpid()}.partial")
        subprocess.run([compiler, "-O3", "-march=native", "-shared", "-fPIC", str(SOURCE), "-o", str(partial), "-lm"],
                       check=True, capture_output=True, text=True)
        partial.replace(out)
    return out


@cache
def library():
    """The loaded helper with its argument types set, or None (with one warning saying why)."""
    if os.environ.get(NO_COMPILE) == "1":
        return None
    try:
        lib = ctypes.CDLL(str(_build()))
    except (OSError, subprocess.CalledProcessError) as e:
        said = getattr(e, "stderr", "") or str(e)
        warnings.warn(f"moespec could not build its greedy-step helper ({said.strip()[-300:]}); llama.cpp's greedy "
                      "decoding takes the slower Python path", stacklevel=2)
        return None
    L = llama_lib.bindings()
    lib.moespec_steps_init.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.moespec_steps_init.restype = None
    lib.moespec_steps_init(ctypes.cast(L.llama_decode, ctypes.c_void_p), ctypes.cast(L.llama_get_logits_ith,
                                                                                     ctypes.c_void_p))
    lib.moespec_rows_argmax.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, _I32P, _I32P]
    lib.moespec_rows_argmax.restype = ctypes.c_int32
    lib.moespec_greedy_steps.argtypes = [ctypes.c_void_p, L.llama_batch, ctypes.c_int32, ctypes.c_int32,
                                         ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, _I32P, ctypes.c_int32, _U8P,
                                         _I32P, ctypes.c_uint64, ctypes.c_int32, _I32P, _I32P, _F64P, _I32P]
    lib.moespec_greedy_steps.restype = ctypes.c_int32
    lib.moespec_batch_greedy_steps.argtypes = [ctypes.c_void_p, L.llama_batch, ctypes.c_int32, _I32P, _I32P, _I32P,
                                               ctypes.c_int32, ctypes.c_int32, _I32P, ctypes.c_int32, _I32P, _F64P,
                                               _I32P]
    lib.moespec_batch_greedy_steps.restype = ctypes.c_int32
    return lib


def available() -> bool:
    return library() is not None


def rows_argmax(ctx, first: int, rows: int, limit: int) -> np.ndarray | int:
    """[rows] int32: the argmax below `limit` of output rows first..first+rows-1, or the index of the
    first row without a finite maximum (a negative code is never returned: such a row is an int)."""
    out = np.empty(rows, dtype=np.int32)
    failed = ctypes.c_int32(0)
    code = library().moespec_rows_argmax(ctx, first, rows, limit, out.ctypes.data_as(_I32P), ctypes.byref(failed))
    if code == NO_ROW:
        raise RuntimeError(f"llama.cpp kept no logits for output row {failed.value}")
    return int(failed.value) if code == NOT_FINITE else out


def greedy_steps(ctx, batch, seq: int, token: int, pos: int, steps: int, limit: int, eos: np.ndarray,
                 stop: StepStop | None = None) -> tuple[np.ndarray, np.ndarray, int, int | None]:
    """Up to `steps` greedy steps from `token` fed at `pos` of sequence `seq`: (tokens produced [s] int32,
    seconds of each [s], llama_decode's status (0: none failed), the step whose row had no finite
    maximum or None). A step that produced an id of eos ([e] int32), or a token `stop` fires on (its
    arrays updated in place, as `StepStop.fires` would), is the last."""
    out = np.empty(steps, dtype=np.int32)
    seconds = np.empty(steps, dtype=np.float64)
    status = ctypes.c_int32(0)
    seen, pool, tail = _stop_arrays(stop)
    done = library().moespec_greedy_steps(
        ctx, batch, seq, token, pos, steps, limit, eos.ctypes.data_as(_I32P), len(eos),
        None if seen is None else seen.ctypes.data_as(_U8P), None if pool is None else pool.ctypes.data_as(_I32P),
        0 if pool is None else len(pool), 0 if tail is None else len(tail) + 1,
        None if tail is None else tail.ctypes.data_as(_I32P), out.ctypes.data_as(_I32P),
        seconds.ctypes.data_as(_F64P), ctypes.byref(status))
    if done <= -BAD_ROW:
        bad = -done - BAD_ROW
        return out[:bad], seconds[:bad], 0, bad
    if done < 0:
        return out[: -done - 1], seconds[: -done - 1], int(status.value), None
    return out[:done], seconds[:done], 0, None


def _stop_arrays(stop: StepStop | None) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """The stop rule's arrays as the C loop reads and updates them: (seen uint8, pool int32, tail int32)."""
    if stop is None:
        return None, None, None
    for name, dtype in (("seen", np.uint8), ("pool", np.int32), ("tail", np.int32)):
        a = getattr(stop, name)
        if a is not None and (a.dtype != dtype or not a.flags.c_contiguous):
            raise ValueError(f"StepStop.{name} must be a contiguous {np.dtype(dtype).name} array, got {a.dtype}")
    if (stop.pool is None) != (stop.tail is None):
        raise ValueError("StepStop needs pool and tail together (or neither)")
    return stop.seen, stop.pool, stop.tail


def batch_greedy_steps(ctx, batch, seqs: np.ndarray, tokens: np.ndarray, pos: np.ndarray, steps: int, limit: int,
                       eos: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, tuple[int, int] | None]:
    """Up to `steps` greedy steps of every sequence seqs [B] int32 at once, each from its token fed at its
    pos: (tokens produced [s, B] int32, seconds of each step [s], llama_decode's status (0: none failed),
    (step, sequence index) whose row had no finite maximum, or None). A step where some sequence
    produced an id of eos ([e] int32) is the last."""
    B = len(seqs)
    out = np.empty((steps, B), dtype=np.int32)
    seconds = np.empty(steps, dtype=np.float64)
    status = ctypes.c_int32(0)
    fed = np.ascontiguousarray(tokens, dtype=np.int32)
    done = library().moespec_batch_greedy_steps(
        ctx, batch, B, seqs.ctypes.data_as(_I32P), fed.ctypes.data_as(_I32P), pos.ctypes.data_as(_I32P), steps, limit,
        eos.ctypes.data_as(_I32P), len(eos), out.ctypes.data_as(_I32P), seconds.ctypes.data_as(_F64P),
        ctypes.byref(status))
    if done <= -BAD_ROW:
        step, j = divmod(-done - BAD_ROW, B)
        return out[:step], seconds[:step], 0, (step, j)
    if done < 0:
        return out[: -done - 1], seconds[: -done - 1], int(status.value), None
    return out[:done], seconds[:done], 0, None
