"""What a prediction version was built from, and why a version could not be built.

The "predict" payload records these as enum values, so readers compare members, not prose.
"""

from __future__ import annotations

from enum import StrEnum


class Unavailable(StrEnum):
    """The kinds of reason a prediction version (or its score) cannot be computed."""

    NO_H = "no-h"  # the base measurement has no h(k) at this depth
    TOO_FEW_PASS_SIZES = "too-few-pass-sizes"  # characterization and verify times share no n = 1..n_max >= 2
    NO_OPERATION_TIMES = "no-operation-times"  # measured-time: no measured operation time for a layer and n
    NO_PASS_SPLIT = "no-pass-split"  # calibrated: the per-slot passes were not split into inside and outside
    NO_OUTSIDE_TERMS = "no-outside-terms"  # prediction-outside: the characterization timed no D(n) (torch times none)
    NONPOSITIVE_TIME = "nonpositive-time"  # an operation or predicted verify time <= 0 (a fit below zero, say)
    NO_SWEEP = "no-sweep"  # score: the measurement lacks the oracle sweep's kernel, depth or cells


class VersionUnavailable(Exception):
    """A prediction version (or its score) that the given artifacts cannot give; `reason` says which input lacks."""

    def __init__(self, reason: Unavailable, message: str):
        super().__init__(message)
        self.reason = reason

    def to_dict(self) -> dict[str, str]:
        """The payload entry of an unavailable version: {"reason": enum value, "message": text}."""
        return {"reason": self.reason.value, "message": str(self)}


class WindowSource(StrEnum):
    """Which operation times the measured-time version takes (`measured_time_windows`)."""

    BETWEEN_PASSES = "between-passes"  # the verified windows, timed between the base measurement's passes
    VERIFIED = "verified"  # the verified windows, timed by the characterization
    RECORDED = "recorded"  # windows of the corpus trace, timed by the characterization


class CalibratedOn(StrEnum):
    """The version whose operation times the calibrated version adds g(n) to (`calibrated_on`)."""

    MEASURED_TIME = "measured-time"
    PREDICTION = "prediction"
