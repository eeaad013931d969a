"""llama.cpp's own converter (`convert_hf_to_gguf.py`), the one that ships with the installed
llama-cpp-python: a transformers checkpoint folder written as a GGUF file the way llama.cpp's users
write theirs, for the tests and benchmarks that check moespec on files it did not write itself.

The converter, its `conversion` package and its gguf-py come from llama-cpp-python's sdist, which
vendors llama.cpp's source: fetched once with pip (the configured index) and unpacked under
~/.cache/moespec (MOESPEC_CACHE moves it). The converter runs in a subprocess of this Python; it
needs torch, transformers and, for Llama-family tokenizers, sentencepiece (`moespec[test]`).
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import subprocess
import sys
import tarfile
from contextlib import contextmanager
from pathlib import Path

from moespec.cache import cache_dir  # noqa: F401  (also this module's API: the tests and benchmarks use it)

CONVERTER = "convert_hf_to_gguf.py"
OUTTYPES = ("f32", "f16", "bf16", "q8_0")  # what the converter writes itself; other types: llama_lib.quantize


@contextmanager
def locked(path: Path):
    """An exclusive lock on `path` (created), so that two processes (pytest workers) build a thing once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def source_dir(version: str | None = None) -> Path:
    """vendor/llama.cpp of llama-cpp-python `version`'s sdist (default: the installed one), fetched
    and unpacked once."""
    version = version or importlib.metadata.version("llama-cpp-python")
    root = cache_dir() / f"llama-cpp-python-{version}"
    src = root / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    with locked(root.with_name(root.name + ".lock")):
        if not (src / CONVERTER).is_file():
            root.mkdir(parents=True, exist_ok=True)
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                            f"llama-cpp-python=={version}", "-d", str(root)], check=True)
            (archive,) = root.glob("llama_cpp_python-*.tar.gz")
            with tarfile.open(archive) as tar:
                tar.extractall(root, filter="data")
            archive.unlink()
    return src


def convert(folder: str | Path, out: str | Path, outtype: str = "f16") -> Path:
    """Write `out`, the transformers checkpoint `folder` converted by llama.cpp's converter to `outtype`
    (one of OUTTYPES); the converter's own output is quoted when it fails."""
    if outtype not in OUTTYPES:
        raise ValueError(f"the converter writes {', '.join(OUTTYPES)}, not {outtype!r}; quantize its f16 output "
                         "with llama.cpp's quantizer for other types")
    folder, out = Path(folder), Path(out)
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder} has no config.json; give a transformers checkpoint folder")
    script = source_dir() / CONVERTER
    partial = out.with_name(out.name + ".partial")
    done = subprocess.run([sys.executable, str(script), str(folder), "--outtype", outtype, "--outfile", str(partial)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        said = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()][-6:]
        raise ValueError(f"llama.cpp's converter could not convert {folder}: " + " | ".join(said))
    partial.replace(out)
    return out
