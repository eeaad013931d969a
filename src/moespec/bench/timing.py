"""The one timer of the project: repeated wall-clock timing with warm-up, cache flush and sync.

Every measurement in moespec goes through `measure`, so the protocol of the cost-model paper
(App. D: warm-up, a cache flush larger than the last-level cache before every timed call, a device
synchronize, the median and interquartile range over repetitions, every raw sample kept) lives in
one place. `read_bandwidth` gives the machine's streaming read bandwidth, the roof of Figure 2.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads only where a timed call is a torch one: ggml's timings need none of it
    import torch

MIN_FLUSH_BYTES = 256 * 1024**2


def _quantile(sorted_samples: tuple[float, ...], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of already sorted samples."""
    if not sorted_samples:
        raise ValueError("no samples: time at least one repetition (reps >= 1)")
    pos = q * (len(sorted_samples) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_samples) - 1)
    return sorted_samples[lo] + (sorted_samples[hi] - sorted_samples[lo]) * (pos - lo)


@dataclass(frozen=True)
class Timing:
    """Raw wall-clock samples of one timed call, in seconds, with their summary statistics."""

    samples: tuple[float, ...]

    def __post_init__(self):
        if not self.samples:
            raise ValueError("Timing needs at least one sample; time with reps >= 1")
        object.__setattr__(self, "samples", tuple(float(s) for s in self.samples))

    @property
    def median(self) -> float:
        return float(statistics.median(self.samples))

    @property
    def q1(self) -> float:
        return _quantile(tuple(sorted(self.samples)), 0.25)

    @property
    def q3(self) -> float:
        return _quantile(tuple(sorted(self.samples)), 0.75)

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def reps(self) -> int:
        return len(self.samples)

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples": list(self.samples),
            "median": self.median,
            "q1": self.q1,
            "q3": self.q3,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Timing":
        return cls(samples=tuple(d["samples"]))


class CacheFlusher:
    """Evicts the last-level cache by writing and reading a buffer larger than it.

    The default size is twice the LLC that the machine reports, and at least 256 MiB (also the size
    used where the LLC cannot be read), so no byte of the timed operation survives in cache. The buffer
    is made at the first flush: a phase that times nothing flushed (the demo's sweep phase, whose verify
    passes come back from the point log) holds none of it (600 MiB on a host whose LLC is 300 MiB).
    """

    def __init__(self, nbytes: int | None = None, device: torch.device | str | None = None):
        import torch

        from moespec.device import last_level_cache_bytes, resolve_device

        if nbytes is None:
            llc = last_level_cache_bytes() or 0
            nbytes = max(2 * llc, MIN_FLUSH_BYTES)
        if nbytes <= 0:
            raise ValueError(f"flush buffer size must be positive, got nbytes={nbytes}")
        self.nbytes = int(nbytes)
        self.device = resolve_device(device)
        self._buffer: torch.Tensor | None = None  # int64 words, ceil(nbytes / 8) of them, made at the first flush

    def __call__(self) -> None:
        import torch

        from moespec.device import synchronize

        if self._buffer is None:  # a normal tensor even where the first flush runs under inference_mode
            with torch.inference_mode(False):
                self._buffer = torch.zeros((self.nbytes + 7) // 8, dtype=torch.int64, device=self.device)
        self._buffer.add_(1)
        synchronize(self.device)


def _synchronizer(device) -> Callable[[], None]:
    """The device synchronize `measure` runs around each call: none for "cpu" (without importing torch)."""
    if device == "cpu":
        return lambda: None
    from moespec.device import resolve_device, synchronize

    resolved = resolve_device(device)
    return lambda: synchronize(resolved)


def measure(
    fn: Callable[[], Any],
    *,
    reps: int = 20,
    warmup: int = 3,
    flush: Callable[[], None] | None = None,
    device: torch.device | str | None = None,
) -> Timing:
    """Time `fn()` `reps` times after `warmup` untimed calls (App. D protocol).

    `flush`, when given, runs before every call (warm-up and timed) outside the timed interval; the
    device is synchronized before the clock starts and before it stops.
    """
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    synchronize = _synchronizer(device)
    for _ in range(warmup):
        if flush is not None:
            flush()
        fn()
    synchronize()
    samples = []
    for _ in range(reps):
        if flush is not None:
            flush()
        synchronize()
        start = time.perf_counter()
        fn()
        synchronize()
        samples.append(time.perf_counter() - start)
    return Timing(samples=tuple(samples))


class ModuleClock:
    """Seconds spent inside the forwards of some modules during a larger timed call.

    Used as a context manager, it hooks each module's forward; `take()` returns the seconds inside
    them since the last `take()` (summed over modules and calls) and starts afresh. A verify pass
    timed whole by `measure` is so split into its expert operation and the time outside it, both
    from the same pass (`bench.verify.time_passes`). On CUDA each forward is bracketed by device
    events, so the pass is not synchronized inside; elsewhere by the wall clock after a device
    synchronize (a no-op on the CPU).
    """

    def __init__(self, modules: Iterable[torch.nn.Module]):
        import torch

        from moespec.device import synchronize

        self._sync = synchronize
        self.modules = list(modules)
        if not self.modules:
            raise ValueError("ModuleClock needs at least one module to time")
        param = next(self.modules[0].parameters(), None)
        self.device = param.device if param is not None else torch.device("cpu")
        self._events = self.device.type == "cuda"
        self._spans: list[tuple[Any, Any]] = []
        self._open: Any = None
        self._handles: list[Any] = []

    def _now(self) -> Any:
        if self._events:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        self._sync(self.device)
        return time.perf_counter()

    def _start(self, module, args) -> None:
        self._open = self._now()

    def _stop(self, module, args, output) -> None:
        self._spans.append((self._open, self._now()))

    def __enter__(self) -> "ModuleClock":
        for module in self.modules:
            self._handles.append(module.register_forward_pre_hook(self._start))
            self._handles.append(module.register_forward_hook(self._stop))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def take(self) -> float:
        """Seconds inside the modules since the last take (0.0 if none ran); resets the count."""
        spans, self._spans = self._spans, []
        if self._events:
            self._sync(self.device)
            return sum(a.elapsed_time(b) for a, b in spans) / 1e3
        return float(sum(b - a for a, b in spans))


class RoofReader:
    """One streaming read of a buffer far larger than the LLC per call: the roof at that moment.

    On a shared machine the read bandwidth moves by half between minutes (26-52 GB/s here), so a
    share of the roof is only meaningful against a reading taken beside the timed call: call it
    right before each timed call and divide sample by sample (`share_of_roof`).
    """

    def __init__(self, nbytes: int = 256_000_000, device: torch.device | str | None = None):
        if nbytes < 4:
            raise ValueError(f"nbytes must be at least one float32 (4 bytes), got {nbytes}")
        import torch

        from moespec.device import resolve_device

        self.device = resolve_device(device)
        self._buffer = torch.ones(nbytes // 4, dtype=torch.float32, device=self.device)
        self.nbytes = self._buffer.numel() * 4
        self._buffer.sum()  # first touch outside any timing

    def __call__(self) -> float:
        """Bytes/s of one read of the buffer, now."""
        return self.nbytes / measure(lambda: self._buffer.sum(), reps=1, warmup=0, device=self.device).samples[0]


def share_of_roof(nbytes: float, seconds: Sequence[float], roofs: Sequence[float]) -> float:
    """Median over paired samples of (nbytes / seconds_i) / roof_i: a call's read rate as a share of
    the roof read beside it (`RoofReader`)."""
    if len(seconds) != len(roofs) or not seconds:
        raise ValueError(f"share_of_roof needs one roof reading per timed sample, got {len(seconds)} and {len(roofs)}")
    return float(statistics.median(nbytes / t / r for t, r in zip(seconds, roofs)))


def read_bandwidth(
    nbytes: int = 512_000_000, reps: int = 5, device: torch.device | str | None = None
) -> float:
    """Streaming read bandwidth in bytes/s: the median time to sum a buffer of `nbytes` (STREAM-like).

    The buffer is far larger than the LLC, so each pass reads it from memory; this is the roof
    that Figure 2 draws above the kernels' effective bandwidths.
    """
    if nbytes < 4:
        raise ValueError(f"nbytes must be at least one float32 (4 bytes), got {nbytes}")
    import torch

    from moespec.device import resolve_device

    device = resolve_device(device)
    buffer = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    timing = measure(lambda: buffer.sum(), reps=reps, warmup=1, device=device)
    return buffer.numel() * 4 / timing.median
