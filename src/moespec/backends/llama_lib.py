"""llama.cpp's C API (llama.h) through llama-cpp-python's low-level bindings, and ggml's (ggml.h,
ggml-cpu.h) through ctypes on the copy of libggml that llama.cpp loaded: the one place that imports
them, checks a GGUF file before llama.cpp reads it, and quantizes with llama.cpp's own quantizer.

llama.cpp aborts the process on some bad input instead of returning an error, so callers check
first what it would abort on; a file it refuses to load (not GGUF, cut short, an architecture it
does not know) comes back as NULL, and `load_failure` words its reason. Its log goes to a short
buffer instead of stderr; errors quote its last lines.
"""

from __future__ import annotations

import ctypes
import os
from collections import deque
from functools import cache
from pathlib import Path

from moespec.backends.gguf_header import check_moe_fields

BUILD_FLAGS = "-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF"
INSTALL_HINT = f"CMAKE_ARGS=\"{BUILD_FLAGS}\" pip install 'moespec[llama]' (builds llama-cpp-python, about 3 min)"
GGUF_MAGIC = b"GGUF"
# llama.cpp's quantizer by the names `moespec export-gguf --type` takes (llama_ftype of llama.h)
FTYPES = {"f32": 0, "f16": 1, "q8_0": 7, "q4_k": 15}  # q4_k: llama.cpp's Q4_K_M mix (some tensors Q6_K)
_LOG: deque[str] = deque(maxlen=64)  # llama.cpp's recent log lines, quoted in errors
_PASSES = [0]  # llama_decode calls made in this process (ggml fixes some settings at its first)


@cache
def bindings():
    """The `llama_cpp` module, its backend initialized once and its log captured; a clear error without it."""
    try:
        import llama_cpp
    except ImportError as e:
        raise ValueError(f"the llama.cpp backend needs llama-cpp-python ({e}); install it with: {INSTALL_HINT}") from None
    llama_cpp.llama_log_set(_log_callback(llama_cpp), ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    return llama_cpp


@cache
def _log_callback(llama_cpp):
    """The C callback that keeps llama.cpp's log lines (cached: it must outlive every call into the library)."""

    @llama_cpp.llama_log_callback
    def keep(level: int, text: bytes, user_data) -> None:
        _LOG.append(text.decode("utf-8", errors="replace"))

    return keep


def available() -> bool:
    """True when llama-cpp-python imports here."""
    try:
        bindings()
    except ValueError:
        return False
    return True


def count_pass() -> None:
    """Note one llama_decode call of this process."""
    _PASSES[0] += 1


def decoded() -> bool:
    """True once this process has run a llama_decode (through `LlamaModel`)."""
    return _PASSES[0] > 0


def last_log(lines: int = 3) -> str:
    """llama.cpp's last non-empty log lines, joined: what it said before failing."""
    kept = [line.strip() for line in "".join(_LOG).splitlines() if line.strip()]
    return " | ".join(kept[-lines:])


def check_gguf(path: str | Path) -> Path:
    """The path, after raising ValueError (naming the file and the fix) unless it is a GGUF file whose
    expert counts agree (`gguf_header.check_moe_fields`)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"{path} is no file; give the path of a .gguf model file")
    with path.open("rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise ValueError(f"{path} is not a GGUF file (it starts with {head!r}, not {GGUF_MAGIC!r}); convert the "
                         "model with llama.cpp's convert_hf_to_gguf.py or `moespec export-gguf`")
    check_moe_fields(path)  # llama.cpp aborts the process on contradicting expert counts
    return path


def load_failure(path: Path) -> ValueError:
    """The error for a file llama.cpp refused to load: its own reason and what to do about it."""
    said = [line.split("error loading model:", 1)[1].strip() for line in "".join(_LOG).splitlines()
            if "error loading model:" in line]
    reason = said[-1] if said else last_log()
    fix = ("load it with --backend torch, or convert it for the llama.cpp that supports it"
           if "unknown model architecture" in reason else
           "the file is damaged or cut short: copy or convert it again" if "file bounds" in reason else
           "check that the file is a complete GGUF model")
    return ValueError(f"llama.cpp could not load {path}: {reason}; {fix}")


def meta(model, key: str) -> str | None:
    """A model's GGUF metadata value as a string (llama_model_meta_val_str), or None when absent."""
    llama_cpp = bindings()
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return None if n < 0 else buf.value.decode("utf-8", errors="replace")


def quantize(source: str | Path, out: str | Path, kind: str, *, threads: int | None = None) -> Path:
    """Write `out`, the GGUF file `source` quantized by llama.cpp (llama_model_quantize) to `kind`."""
    if kind not in FTYPES:
        raise ValueError(f"quantization type {kind!r} is not one of {', '.join(FTYPES)}")
    llama_cpp = bindings()
    check_gguf(source)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[kind]
    params.nthread = threads or os.cpu_count() or 1
    params.allow_requantize = True
    rc = llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), ctypes.byref(params))
    if rc != 0:
        raise ValueError(f"llama.cpp could not quantize {source} to {kind} (code {rc}): {last_log()}")
    return Path(out)


GGML_MAX_DIMS, GGML_MAX_OP_PARAMS, GGML_MAX_SRC, GGML_MAX_NAME = 4, 64, 10, 64  # ggml.h


class GgmlTensor(ctypes.Structure):
    """struct ggml_tensor (ggml.h): what an eval callback reads of a node (type, ne, nb, data, name)."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
                ("nb", ctypes.c_size_t * GGML_MAX_DIMS), ("op", ctypes.c_int),
                ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)), ("flags", ctypes.c_int32),
                ("src", ctypes.c_void_p * GGML_MAX_SRC), ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
                ("data", ctypes.c_void_p), ("name", ctypes.c_char * GGML_MAX_NAME), ("extra", ctypes.c_void_p),
                ("padding", ctypes.c_char * 8)]


class InitParams(ctypes.Structure):
    """struct ggml_init_params (ggml.h)."""

    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class CPlan(ctypes.Structure):
    """struct ggml_cplan (ggml-cpu.h): the work buffer and threads of one graph compute."""

    _fields_ = [("work_size", ctypes.c_size_t), ("work_data", ctypes.c_void_p), ("n_threads", ctypes.c_int),
                ("threadpool", ctypes.c_void_p), ("abort_callback", ctypes.c_void_p),
                ("abort_callback_data", ctypes.c_void_p), ("use_ref", ctypes.c_bool)]


_P, _I64, _SZ, _INT, _BOOL, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t, ctypes.c_int, ctypes.c_bool, ctypes.c_float
GGML_SIGNATURES = {  # name: (library, result type, argument types), as declared in ggml.h and ggml-cpu.h
    "ggml_init": ("base", _P, [InitParams]),
    "ggml_free": ("base", None, [_P]),
    "ggml_tensor_overhead": ("base", _SZ, []),
    "ggml_graph_overhead_custom": ("base", _SZ, [_SZ, _BOOL]),
    "ggml_type_name": ("base", ctypes.c_char_p, [_INT]),
    "ggml_get_name": ("base", ctypes.c_char_p, [_P]),
    "ggml_op_desc": ("base", ctypes.c_char_p, [_P]),
    "ggml_set_name": ("base", _P, [_P, ctypes.c_char_p]),
    "ggml_new_tensor_1d": ("base", _P, [_P, _INT, _I64]),
    "ggml_new_tensor_2d": ("base", _P, [_P, _INT, _I64, _I64]),
    "ggml_new_tensor_3d": ("base", _P, [_P, _INT, _I64, _I64, _I64]),
    "ggml_get_data": ("base", _P, [_P]),
    "ggml_nbytes": ("base", _SZ, [_P]),
    "ggml_mul_mat": ("base", _P, [_P, _P, _P]),
    "ggml_mul_mat_id": ("base", _P, [_P, _P, _P, _P]),
    "ggml_add_id": ("base", _P, [_P, _P, _P, _P]),
    "ggml_swiglu_split": ("base", _P, [_P, _P, _P]),
    "ggml_swiglu_oai": ("base", _P, [_P, _P, _P, _F, _F]),
    "ggml_geglu_split": ("base", _P, [_P, _P, _P]),
    "ggml_silu": ("base", _P, [_P, _P]),
    "ggml_mul": ("base", _P, [_P, _P, _P]),
    "ggml_add": ("base", _P, [_P, _P, _P]),
    "ggml_cont": ("base", _P, [_P, _P]),
    "ggml_view_2d": ("base", _P, [_P, _P, _I64, _I64, _SZ, _SZ]),
    "ggml_view_3d": ("base", _P, [_P, _P, _I64, _I64, _I64, _SZ, _SZ, _SZ]),
    "ggml_rms_norm": ("base", _P, [_P, _P, _F]),  # these ten: the rest of a pass (`bench.ggml_rest_op`)
    "ggml_rope_ext": ("base", _P, [_P, _P, _P, _P, _INT, _INT, _INT, _F, _F, _F, _F, _F, _F]),
    "ggml_flash_attn_ext": ("base", _P, [_P, _P, _P, _P, _P, _F, _F, _F]),
    "ggml_prec_set_acc": ("base", _BOOL, [_P, _INT]),
    "ggml_permute": ("base", _P, [_P, _P, _INT, _INT, _INT, _INT]),
    "ggml_reshape_3d": ("base", _P, [_P, _P, _I64, _I64, _I64]),
    "ggml_set_rows": ("base", _P, [_P, _P, _P, _P]),
    "ggml_get_rows": ("base", _P, [_P, _P, _P]),
    "ggml_soft_max": ("base", _P, [_P, _P]),
    "ggml_argsort_top_k": ("base", _P, [_P, _P, _INT]),
    "ggml_new_graph_custom": ("base", _P, [_P, _SZ, _BOOL]),
    "ggml_build_forward_expand": ("base", None, [_P, _P]),
    "ggml_backend_cpu_buffer_from_ptr": ("base", _P, [_P, _SZ]),  # these three: weights read in place (`ggml_graph`)
    "ggml_backend_tensor_alloc": ("base", _INT, [_P, _P, _P]),
    "ggml_backend_buffer_free": ("base", None, [_P]),
    "ggml_cpu_init": ("cpu", None, []),
    "ggml_graph_plan": ("cpu", CPlan, [_P, _INT, _P]),
    "ggml_graph_compute": ("cpu", _INT, [_P, ctypes.POINTER(CPlan)]),
}


def _load_ggml(llama_cpp, stem: str) -> ctypes.CDLL:
    """The copy of lib{stem} that llama.cpp itself loaded: by its soname first (glibc hands back the
    loaded object), else from llama-cpp-python's lib folder. Loading `libggml-base.so` by path would
    map a second copy of ggml (the .so and .so.0 files are copies, not links)."""
    folder = Path(llama_cpp.__file__).parent / "lib"
    tried = []
    for name in (f"lib{stem}.so.0", *(str(folder / f"lib{stem}{ext}") for ext in (".so.0", ".so", ".dylib"))):
        try:
            return ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            tried.append(f"{name}: {e}")
    raise ValueError(f"cannot load ggml's lib{stem} from llama-cpp-python ({'; '.join(tried)}); "
                     f"reinstall it: {INSTALL_HINT}")


@cache
def ggml():
    """ggml's functions (a namespace of ctypes functions, `GGML_SIGNATURES`), ggml-cpu initialized once."""
    llama_cpp = bindings()
    libs = {"base": _load_ggml(llama_cpp, "ggml-base"), "cpu": _load_ggml(llama_cpp, "ggml-cpu")}

    class Functions:
        pass

    for name, (lib, restype, argtypes) in GGML_SIGNATURES.items():
        fn = getattr(libs[lib], name)
        fn.restype, fn.argtypes = restype, argtypes
        setattr(Functions, name, staticmethod(fn))
    Functions.ggml_cpu_init()
    return Functions
