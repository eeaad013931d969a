"""llama.cpp's own tools (llama-speculative-simple, llama-bench, llama-server), built from the llama.cpp
source that the installed llama-cpp-python vendors (`llama_convert.source_dir`), so that moespec is
compared with the same llama.cpp it runs on; and a variant libllama built without llamafile's sgemm
(-DGGML_LLAMAFILE=OFF), which llama-cpp-python loads instead of its own when LLAMA_CPP_LIB_PATH names
its folder.

Everything is cached under ~/.cache/moespec/ (MOESPEC_CACHE moves it) and built once: a lock keeps two
processes (pytest workers, a benchmark beside the chain) from building at the same time, and the one
that waited finds the other's build. The builds run under `nice -n 10` with the flags moespec's README
gives for llama-cpp-python (GGML_NATIVE=ON); each takes a few minutes on 2 cores.

It lives beside the converter in `models` (not `backends`): it needs the sdist that `llama_convert`
fetches, and `backends` sits below `models` in the layers.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

from moespec.models.llama_convert import cache_dir, locked, source_dir

SPECULATIVE = "llama-speculative-simple"
BENCH = "llama-bench"
SERVER = "llama-server"
TOOLS = (BENCH, SPECULATIVE)
NICE = ("nice", "-n", "10")  # the machine is shared: a build must not starve the timed runs beside it
LOG_TAIL = 12  # lines of the build's own output quoted when it fails


def progress_line(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def missing_build_tools() -> list[str]:
    """The build programs that are not on PATH (cmake, ninja), in that order."""
    return [name for name in ("cmake", "ninja") if shutil.which(name) is None]


def run_build(cmd: Sequence[str], log: Path) -> None:
    """Run one build command niced, its output appended to `log`; on failure a ValueError quoting the
    log's last lines."""
    nice = list(NICE) if shutil.which("nice") else []
    with log.open("a") as handle:
        handle.write("+ " + " ".join(map(str, cmd)) + "\n")
        handle.flush()
        done = subprocess.run([*nice, *map(str, cmd)], stdout=handle, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-LOG_TAIL:]
        raise ValueError(f"building llama.cpp's tools failed ({' '.join(map(str, cmd[:3]))} ... exited "
                         f"{done.returncode}; full log {log}): " + " | ".join(tail))


def configure_args(src: Path, build: Path, extra: Sequence[str]) -> list[str]:
    return ["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
            "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", *extra]


def built(build: Path, targets: Sequence[str], outputs: dict[str, Path], extra: Sequence[str],
          progress: Callable[[str], None]) -> dict[str, Path]:
    """{target: path}: each of `outputs` built once in `build` from the vendored source, under a lock."""
    if all(p.is_file() for p in outputs.values()):
        return outputs
    missing = missing_build_tools()
    if missing:
        raise ValueError(f"building llama.cpp's {', '.join(targets)} needs {' and '.join(missing)} on PATH; "
                         "install them (apt-get install cmake ninja-build, or pip install cmake ninja)")
    with locked(build.with_name(build.name + ".lock")):
        if all(p.is_file() for p in outputs.values()):  # another process built them while this one waited
            return outputs
        version = importlib.metadata.version("llama-cpp-python")
        progress(f"building llama.cpp's {', '.join(targets)} from llama-cpp-python {version}'s source, once "
                 f"(a few minutes on 2 cores, niced) into {build}")
        src = source_dir(version)
        build.mkdir(parents=True, exist_ok=True)
        log = build / "moespec-build.log"
        if not (build / "CMakeCache.txt").is_file():
            run_build(configure_args(src, build, extra), log)
        run_build(["cmake", "--build", str(build), "--target", *targets, "-j", str(os.cpu_count() or 2)], log)
    return outputs


def tools_dir() -> Path:
    """The build folder of llama.cpp's tools for the installed llama-cpp-python."""
    return cache_dir() / f"llama-tools-{importlib.metadata.version('llama-cpp-python')}"


def build_tools(targets: Sequence[str] = TOOLS, progress: Callable[[str], None] = progress_line) -> dict[str, Path]:
    """{tool: path} of llama.cpp's tools `targets` (default llama-bench and llama-speculative-simple),
    built once. The server is configured too (an empty web UI: the build would fetch or npm-build it)."""
    build = tools_dir()
    extra = ["-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF"]
    return built(build, tuple(targets), {t: build / "bin" / t for t in targets}, extra, progress)


def build_speculative(progress: Callable[[str], None] = progress_line) -> Path:
    """llama-speculative-simple for the installed llama-cpp-python."""
    return build_tools((SPECULATIVE,), progress)[SPECULATIVE]


def build_server(progress: Callable[[str], None] = progress_line) -> Path:
    """llama-server for the installed llama-cpp-python, in the same build folder as the tools."""
    return build_tools((SERVER,), progress)[SERVER]


def build_library(llamafile: bool = False, progress: Callable[[str], None] = progress_line) -> Path:
    """The folder of a libllama built from the same source with llamafile's sgemm on or off."""
    version = importlib.metadata.version("llama-cpp-python")
    build = cache_dir() / f"libllama-{version}-llamafile-{'on' if llamafile else 'off'}"
    extra = ["-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
             "-DBUILD_SHARED_LIBS=ON", f"-DGGML_LLAMAFILE={'ON' if llamafile else 'OFF'}"]
    built(build, ("llama",), {"llama": build / "bin" / "libllama.so"}, extra, progress)
    return build / "bin"
