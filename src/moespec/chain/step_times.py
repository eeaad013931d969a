"""A prediction's step times read back: V̂(0..kmax) of one version, kernel and depth of a predict
artifact, for `moespec settings` (a named version must be there) and `generate --step-times-from`
(`k="auto"` seeded; it falls back to the next version available). The one reader of V̂ from a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from moespec.chain.prediction import KIND, payload_of
from moespec.costmodel.predict import loop_step_times, preferred_version


class StepTimesNotFound(ValueError):
    """A prediction artifact lacks the step times asked for; `argument` names what to change
    ("path", "depth", "version", "kernel" or "max_k")."""

    def __init__(self, message: str, argument: str):
        super().__init__(message)
        self.argument = argument


LLAMA_CPP = "llama.cpp"  # the engine a prediction's provenance names where its passes are llama.cpp's


@dataclass(frozen=True)
class PredictedStepTimes:
    """V(0..kmax) in seconds read from a prediction artifact, with the version and depth read; `loop`:
    τ̂(1..kmax+1) alone where the passes are llama.cpp's (`loop_step_times`), else None."""

    V: list[float]
    version: str
    depth: int
    loop: list[float] | None = None


def predicted_step_times(path: str | Path, *, kernel: str, version: str | None = None, depth: int | None = None,
                         fallback: bool = False, max_k: int | None = None) -> PredictedStepTimes:
    """The step times (22) of one version and kernel at one depth (default: the first) of a predict
    artifact. `version` None reads the first available in PREFERENCE order; a named one must be
    there, or with `fallback` it is tried first and then that order. `max_k` keeps V(0..max_k)."""
    try:
        payload = payload_of(path, KIND)
    except (ValueError, FileNotFoundError) as e:
        raise StepTimesNotFound(str(e), "path") from None
    depths = payload.get("depths") or []
    entries = {int(e["depth"]): e for e in depths}
    if not entries:
        raise StepTimesNotFound(f"{path} predicts no depth; run `moespec predict` again", "path")
    entry = depths[0] if depth is None else entries.get(depth)
    if entry is None:
        raise StepTimesNotFound(f"{path} predicts depths {sorted(entries)}, not {depth}; pass one of them", "depth")
    found, unavailable = entry.get("versions", {}), entry.get("unavailable", {})
    if version is None or fallback:
        chosen = preferred_version(found, version)
        if chosen is None:
            why = "; ".join(f"{v}: {u.get('message')}" for v, u in unavailable.items())
            raise StepTimesNotFound(f"{path} holds no predicted version at depth {entry['depth']} ({why or 'none'})",
                                    "path")
    elif version not in found:
        why = unavailable.get(version, {}).get("message")
        raise StepTimesNotFound(f"{path} has no {version!r} version at depth {entry['depth']}"
                                f"{f' ({why})' if why else ''}; use one of {sorted(found)}", "version")
    else:
        chosen = version
    V = found[chosen].get("V", {}).get(kernel)
    if V is None:
        raise StepTimesNotFound(f"kernel {kernel!r} is not in the {chosen!r} version of {path}; "
                                f"use one of {sorted(found[chosen].get('V', {}))}", "kernel")
    if max_k is not None and len(V) < max_k + 1:
        raise StepTimesNotFound(f"{path} predicts V(k) up to k = {len(V) - 1}; pass --max-k {len(V) - 1} or less",
                                "max_k")
    keep = None if max_k is None else max_k + 1
    llama = payload.get("provenance", {}).get("experts") == LLAMA_CPP and "tau" in found[chosen]
    return PredictedStepTimes([float(v) for v in V[:keep]], chosen, int(entry["depth"]),
                              loop_step_times(found[chosen], kernel)[:keep] if llama else None)


def seed_step_times(path: str | Path, *, max_k: int, kernel: str = "auto", version: str = "calibrated",
                    depth: int | None = None) -> list[float]:
    """V(0..max_k) in seconds from a prediction artifact, to seed `generate(k="auto", step_times=...)`:
    `predicted_step_times` of `version` (falling back to the next available one) and `kernel` ("slot",
    "dedup" or "auto": the faster of the two at each pass size) at `depth` (default: the first)."""
    return predicted_step_times(path, kernel=kernel, version=version, depth=depth, fallback=True, max_k=max_k).V
