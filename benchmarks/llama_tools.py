"""llama.cpp's own tools (llama-bench, llama-speculative-simple; llama-server by `build_server`) and a
libllama without llamafile's sgemm, built from the llama.cpp source that the installed
llama-cpp-python vendors: the benchmarks' name for `moespec.models.llama_tools`, where they are built
(once, niced, under a lock, cached under ~/.cache/moespec/).

    python benchmarks/llama_tools.py          # builds (or finds) them and prints their paths
"""

from __future__ import annotations

from moespec.models.llama_tools import SERVER, TOOLS, build_library, build_server, build_tools, cache_dir

__all__ = ["CACHE", "SERVER", "TOOLS", "build_library", "build_server", "build_tools"]

CACHE = cache_dir()


if __name__ == "__main__":
    print(f"libllama without llamafile: {build_library(llamafile=False)}")
    for name, path in build_tools().items():
        print(f"{name}: {path}")
    print(f"{SERVER}: {build_server()}")
