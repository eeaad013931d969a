"""The base measurement that `predict` reads (cost-model paper, Sec. 4): the verify times, and h(k)
from an oracle probe at an acceptance off the scored grid, so no scored cell is run before the
prediction is written. `moespec measure --base` and the demo's base phase both write it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Mapping

from moespec.kernel_names import DEDUP


class HSource(StrEnum):
    """Where the base measurement's h(k) came from (`h_source`)."""

    ORACLE_PROBE = "oracle-probe"  # the demo's oracle probe at an acceptance off the scored grid
    GIVEN = "given"  # an "h" section written without a recorded source


# The h(k) probe's acceptance: off the scored grid (`costmodel.predict.ACCEPTANCE_GRID`).
H_PROBE_ACCEPTANCE = 0.75
# The measure knobs that the base phase sets, whatever was asked: one probe cell per k, no scaling curve.
BASE_KNOBS = dict(acceptances=(H_PROBE_ACCEPTANCE,), scaling_ns=(), oracle_kernels=(DEDUP,), oracle_reps=1)


def base_knobs(knobs: Mapping[str, Any]) -> dict[str, Any]:
    """`knobs` (`bench.measure.MeasureConfig` fields) with the base phase's own on top."""
    return {**knobs, **BASE_KNOBS}


def base_payload(phase1: Mapping[str, Any]) -> dict[str, Any]:
    """The base measurement from a measurement made with `base_knobs`: its verify times, and h(k)
    per depth from the probe, the oracle sweep's entries moved to "h_probe"."""
    probe = [e for e in phase1["oracle"] if e["kernel"] == DEDUP] or phase1["oracle"]
    return {**{k: v for k, v in phase1.items() if k != "oracle"},
            "h": {str(e["depth"]): e["h"] for e in probe},
            "h_source": HSource.ORACLE_PROBE,
            "h_probe": phase1["oracle"], "oracle": []}
