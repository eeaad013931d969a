"""llama.cpp's own tools (llama-bench, llama-speculative-simple; llama-server by `build_server`), built
from the llama.cpp source that the installed llama-cpp-python vendors, so that a benchmark compares
moespec with the same llama.cpp; and a variant libllama built without llamafile's sgemm
(-DGGML_LLAMAFILE=OFF), which llama-cpp-python loads instead of its own when LLAMA_CPP_LIB_PATH names
its folder.

The source comes from llama-cpp-python's sdist (`moespec.models.llama_convert.source_dir`), the builds use the flags
moespec's README gives for llama-cpp-python (GGML_NATIVE=ON), and everything is cached under
~/.cache/moespec/. Each build takes a few minutes on 2 cores, once.

    python benchmarks/llama_tools.py          # builds (or finds) them and prints their paths
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
from pathlib import Path

from moespec.models.llama_convert import cache_dir, source_dir

TOOLS = ("llama-bench", "llama-speculative-simple")
SERVER = "llama-server"
CACHE = cache_dir()


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.run(cmd, cwd=cwd, check=True)


def _build(targets: tuple[str, ...], *, server: bool) -> dict[str, Path]:
    """{target: path} in the tools' build folder, configured and built once (each call adds its targets)."""
    version = importlib.metadata.version("llama-cpp-python")
    build = CACHE / f"llama-tools-{version}"
    paths = {t: build / "bin" / t for t in targets}
    if all(p.is_file() for p in paths.values()):
        return paths
    src = source_dir(version)
    # the server embeds its web UI, which the build would fetch or build with npm: neither, an empty UI
    ui = ["-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF"] if server else []
    _run(["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
          "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
          f"-DLLAMA_BUILD_SERVER={'ON' if server else 'OFF'}", *ui])
    _run(["cmake", "--build", str(build), "--target", *targets, "-j", str(os.cpu_count() or 2)])
    return paths


def build_tools() -> dict[str, Path]:
    """{tool: path} of llama-bench and llama-speculative-simple for the installed llama-cpp-python."""
    return _build(TOOLS, server=False)


def build_server() -> Path:
    """llama-server for the installed llama-cpp-python, in the same build folder as the tools."""
    return _build((SERVER,), server=True)[SERVER]


def build_library(llamafile: bool = False) -> Path:
    """The folder of a libllama built from the same source with llamafile's sgemm on or off."""
    version = importlib.metadata.version("llama-cpp-python")
    build = CACHE / f"libllama-{version}-llamafile-{'on' if llamafile else 'off'}"
    if (build / "bin" / "libllama.so").is_file():
        return build / "bin"
    src = source_dir(version)
    _run(["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
          "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
          "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DBUILD_SHARED_LIBS=ON",
          f"-DGGML_LLAMAFILE={'ON' if llamafile else 'OFF'}"])
    _run(["cmake", "--build", str(build), "--target", "llama", "-j", str(os.cpu_count() or 2)])
    return build / "bin"


if __name__ == "__main__":
    print(f"libllama without llamafile: {build_library(llamafile=False)}")
    for name, path in build_tools().items():
        print(f"{name}: {path}")
    print(f"{SERVER}: {build_server()}")
