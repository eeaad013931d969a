"""The peak resident memory of a stretch of this process, anonymous and file-backed apart.

Linux counts a process's resident pages as RssAnon (its own allocations: tensors, KV caches,
repacked weights) and RssFile (mapped files: a GGUF file llama.cpp maps, shared libraries). A
thread samples both from /proc/self/status every `interval` seconds and keeps each one's peak; the
kernel's own peak (VmHWM, reset at the start through /proc/self/clear_refs where the kernel allows
it) bounds their sum from above between two samples. Sampling rather than VmHWM alone, because VmHWM
does not say which kind of page it counted. Elsewhere than Linux the fields are None.

RssFile counts a page once per mapping: where one process maps a file twice (llama.cpp's map of a
GGUF file, and the map through which the base measurement's ggml graphs read some of its tensors
in place, `bench.ggml_graph`), those tensors' pages count twice here though memory holds them once.
"""

from __future__ import annotations

import threading
from pathlib import Path

STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")
FIELDS = ("RssAnon", "RssFile", "RssShmem", "VmHWM")


def status() -> dict[str, int]:
    """The FIELDS of /proc/self/status in bytes; {} where there is none."""
    try:
        lines = STATUS.read_text().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        name, _, value = line.partition(":")
        if name in FIELDS:
            found[name] = int(value.split()[0]) * 1024  # reported in kB
    return found


class PeakMemory:
    """Context manager: `with PeakMemory() as peak: work()`, then `peak.record()`; the peaks are taken
    over the block."""

    def __init__(self, interval: float = 0.05):
        if interval <= 0:
            raise ValueError(f"interval={interval}; sample at a positive interval in seconds")
        self.interval = interval
        self.anon = self.file = 0
        self.hwm_reset = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        got = status()
        self.anon = max(self.anon, got.get("RssAnon", 0))
        self.file = max(self.file, got.get("RssFile", 0) + got.get("RssShmem", 0))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> "PeakMemory":
        try:
            CLEAR_REFS.write_text("5")  # resets VmHWM to the present resident size
            self.hwm_reset = True
        except OSError:
            self.hwm_reset = False
        self._sample()
        self._thread = threading.Thread(target=self._run, name="peak-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()

    def record(self) -> dict:
        """{"anon_bytes", "file_bytes": sampled peaks; "hwm_bytes": the kernel's peak over the block (None
        where it could not be reset); "method"} — None everywhere without /proc."""
        if not status():
            return {"anon_bytes": None, "file_bytes": None, "hwm_bytes": None, "method": "unavailable"}
        hwm = status().get("VmHWM") if self.hwm_reset else None
        return {"anon_bytes": self.anon, "file_bytes": self.file, "hwm_bytes": hwm,
                "method": f"/proc/self/status sampled every {self.interval:g} s"}
