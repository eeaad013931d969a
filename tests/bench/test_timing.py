"""Tests of the one timer: structure and statistics of Timing, the flush buffer, the protocol."""

import numpy as np
import pytest

import torch

from moespec.bench import timing
from moespec.bench.timing import (MIN_FLUSH_BYTES, CacheFlusher, ModuleClock, RoofReader, Timing, measure,
                                  read_bandwidth, share_of_roof)
from moespec.device import last_level_cache_bytes


def test_timing_statistics_match_numpy():
    samples = (0.5, 0.1, 0.4, 0.2, 0.3, 0.9, 0.7)
    t = Timing(samples=samples)
    assert t.median == pytest.approx(np.median(samples))
    assert t.q1 == pytest.approx(np.percentile(samples, 25))
    assert t.q3 == pytest.approx(np.percentile(samples, 75))
    assert t.iqr == pytest.approx(np.percentile(samples, 75) - np.percentile(samples, 25))
    assert t.reps == len(samples)


def test_timing_roundtrip_keeps_raw_samples_in_order():
    t = Timing(samples=(3.0, 1.0, 2.0))
    back = Timing.from_dict(t.to_dict())
    assert back == t
    assert back.samples == (3.0, 1.0, 2.0)
    assert t.to_dict()["median"] == 2.0


def test_timing_is_frozen_and_needs_samples():
    t = Timing(samples=(1.0,))
    with pytest.raises(AttributeError):
        t.samples = (2.0,)
    with pytest.raises(ValueError, match="reps >= 1"):
        Timing(samples=())


def test_measure_calls_warmup_plus_reps_and_flushes_before_each():
    events = []
    t = measure(lambda: events.append("call"), reps=5, warmup=2, flush=lambda: events.append("flush"))
    assert t.reps == 5
    assert events == ["flush", "call"] * 7
    assert all(s >= 0 for s in t.samples)
    assert t.q1 <= t.median <= t.q3


def test_measure_rejects_bad_counts():
    with pytest.raises(ValueError, match="reps"):
        measure(lambda: None, reps=0)
    with pytest.raises(ValueError, match="warmup"):
        measure(lambda: None, warmup=-1)


def test_flusher_default_is_twice_llc_and_at_least_256_mib():
    flusher = CacheFlusher()
    llc = last_level_cache_bytes() or 0
    assert flusher.nbytes == max(2 * llc, MIN_FLUSH_BYTES)
    assert flusher.nbytes >= 256 * 1024**2
    flusher()  # the buffer is made at the first flush
    assert flusher._buffer.numel() * flusher._buffer.element_size() >= flusher.nbytes


def test_flusher_touches_every_word():
    flusher = CacheFlusher(nbytes=1000)
    flusher()
    flusher()
    assert int(flusher._buffer.min()) == 2 and int(flusher._buffer.max()) == 2
    with pytest.raises(ValueError, match="nbytes"):
        CacheFlusher(nbytes=0)


def test_read_bandwidth_is_positive_and_finite():
    bw = read_bandwidth(nbytes=4_000_000, reps=3)
    assert bw > 0 and np.isfinite(bw)
    reader = RoofReader(nbytes=4_000_000)
    assert reader.nbytes == 4_000_000 and reader() > 0 and np.isfinite(reader())
    with pytest.raises(ValueError, match="nbytes"):
        RoofReader(nbytes=2)


def test_share_of_roof_pairs_each_sample_with_its_reading():
    # 100 bytes in 1, 2, 4 s against roofs of 100, 25, 50 B/s: shares 1, 2, 0.5, median 1
    assert share_of_roof(100, [1.0, 2.0, 4.0], [100.0, 25.0, 50.0]) == 1.0
    # shares 0.5, 4, 2: median 2
    assert share_of_roof(100, [2.0, 1.0, 1.0], [100.0, 25.0, 50.0]) == 2.0
    with pytest.raises(ValueError, match="one roof reading per timed sample"):
        share_of_roof(100, [1.0], [1.0, 2.0])


class _Counted(torch.nn.Module):
    """A module whose forward advances the fake clock by `cost` ticks."""

    def __init__(self, clock: list, cost: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.clock, self.cost = clock, cost

    def forward(self, x):
        self.clock[0] += self.cost
        return x


def test_module_clock_sums_the_time_inside_the_modules_and_resets(monkeypatch):
    """A fake wall clock that only the modules and the code between them advance: the clock reads
    exactly the ticks spent inside the hooked modules."""
    ticks = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: ticks[0])
    a, b = _Counted(ticks, 3), _Counted(ticks, 5)
    outside = _Counted(ticks, 100)  # not hooked: its ticks are outside

    def model(x):
        return b(outside(a(b(x))))

    with ModuleClock([a, b]) as clock:
        model(torch.ones(1))
        assert clock.take() == 3 + 5 + 5
        assert clock.take() == 0.0  # reset by the take
        model(torch.ones(1))
        ticks[0] += 50  # between passes: not inside
        a(torch.ones(1))
        assert clock.take() == 13 + 3
    model(torch.ones(1))  # the hooks are gone after the block
    assert clock.take() == 0.0
    with pytest.raises(ValueError, match="at least one module"):
        ModuleClock([])


def test_the_flush_buffer_is_made_at_the_first_flush():
    """A flusher that never flushes (the demo's sweep phase, whose verify passes come back from the point
    log) holds no buffer; the first flush makes ceil(nbytes / 8) int64 words, and later ones reuse them."""
    flush = CacheFlusher(nbytes=1001)
    assert flush._buffer is None
    with torch.inference_mode():  # a first flush inside inference_mode (as the characterization's) ...
        flush()
    first = flush._buffer
    flush()  # ... and the next outside it write the same buffer
    assert first.numel() == 126 and flush._buffer is first and int(first.min()) == 2
