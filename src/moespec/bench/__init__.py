"""Measurement: timing, the expert-operation benchmark, verify times, sweeps, the losslessness gate."""
