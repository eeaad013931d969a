"""Measurement: timing, the expert-operation benchmark, characterization, verify times, sweeps."""
