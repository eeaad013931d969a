"""What each chain artifact must hold for the steps that read it, checked when it is read.

A reader that meets a missing or edited field should not stop on `KeyError: 'fits'` or "could not
convert string to float: 'x'": `check(kind, payload, path, needs)` walks the payload against the
kind's schema and names the file, the field (as `depths[0].versions.calibrated.V.dedup[2]`), what it
held and what it should hold, and how to make it again. Every field the schema names is checked
where it is present; the top-level fields a reader `needs` must be there, with every field the
schema names inside them. A schema lists only what readers use; other fields may come and go.

A schema is a small tree: a type (NUM, POS, INT, STR, BOOL, DICT, LIST), `Optional(t)` (None allowed),
`[t]` (a list whose every element is t), `NonEmpty([t])` (the same, holding at least one),
`{"name": t, ...}` (a record that must hold these names) and `{EVERY: t}` (a mapping whose every value is t, keyed by layer, kernel, n or version).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EVERY = "*"
NUM, INT, STR, BOOL, DICT, LIST = "number", "integer", "string", "true/false", "mapping", "list"
POS = "positive number"  # a time: finite and > 0


@dataclass(frozen=True)
class Optional:
    inner: Any  # the schema of the value when it is not None


@dataclass(frozen=True)
class NonEmpty:
    inner: Any  # the schema of a list that must hold at least one element


NUMS = [NUM]
BY_KERNEL = {EVERY: [NUM]}

SCHEMAS: dict[str, Any] = {
    "characterize": {
        "layers": [INT], "n": [INT], "m": INT, "N": INT, "expert_bytes": {EVERY: INT},
        "fits": {EVERY: {EVERY: {"coefficients": {EVERY: NUM}, "m": INT, "b": NUM}}},
        "eps": {EVERY: NUM}, "r": {EVERY: NUM}, "u_bar": {EVERY: NUM}, "crossover": Optional(INT),
        "beta": {EVERY: {EVERY: {"median": NUM}}},
    },
    "characterize-dense": {"n": [INT], "dense": {"median": {EVERY: POS}}, "rest": {"median": {EVERY: {EVERY: POS}}}},
    "measure": {
        "config": DICT, "h": {EVERY: {EVERY: NUM}},
        "verify": [{"depth": INT, "ns": [INT], "tau": {EVERY: {EVERY: NUM}}}],
        "oracle": [{"kernel": STR, "depth": INT, "V": {EVERY: NUM}, "h": {EVERY: NUM},
                    "cells": [{"k": INT, "a": NUM, "throughput": NUM, "step_s": NUM}]}],
    },
    "predict": {
        "depths": NonEmpty([{"depth": INT, "versions": {EVERY: {
            "n": [INT], "V": {EVERY: [POS]}, "acceptance": NUMS, "k_star": {EVERY: [INT]}, "speedup": BY_KERNEL,
            "a0": {EVERY: NUM}, "step_points": BY_KERNEL}}}]),
    },
    "score": {
        "depths": [{"depth": INT, "versions": {EVERY: {
            "acceptance": NUMS, "k_star_predicted": [INT], "k_star_measured": [INT], "loss": NUMS}}}],
    },
}
# how each kind is made again, for the message's fix
MAKERS = {"characterize": "moespec characterize", "characterize-dense": "moespec demo --model FILE.gguf", "measure": "moespec measure", "predict": "moespec predict",
          "score": "moespec score"}


class ArtifactFieldError(ValueError):
    """An artifact lacks a field its readers need, or holds a value of the wrong kind there."""


def _is(value: Any, kind: str) -> bool:
    if kind == NUM:
        return isinstance(value, (int, float)) and not isinstance(value, bool)  # NaN too: an empty cell's figure
    if kind == POS:
        return _is(value, NUM) and math.isfinite(value) and value > 0
    if kind == INT:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, {STR: str, BOOL: bool, DICT: dict, LIST: list}[kind])


def problems(value: Any, schema: Any, where: str = "", *, whole: bool = True) -> list[str]:
    """Each place where `value` departs from `schema`, as "field: what is wrong" (empty: it fits). A
    record's missing fields count only when `whole`."""
    if isinstance(schema, Optional):
        return [] if value is None else problems(value, schema.inner, where, whole=whole)
    if isinstance(schema, NonEmpty):
        return [f"{where or 'the payload'} is empty"] if value == [] else problems(value, schema.inner, where, whole=whole)
    if isinstance(schema, str):
        return [] if _is(value, schema) else [f"{where or 'the payload'} holds {_shown(value)}, not a {schema}"]
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{where or 'the payload'} holds {_shown(value)}, not a list"]
        return [p for i, v in enumerate(value) for p in problems(v, schema[0], f"{where}[{i}]", whole=whole)]
    if not isinstance(value, dict):
        return [f"{where or 'the payload'} holds {_shown(value)}, not a mapping"]
    if EVERY in schema:
        return [p for k, v in value.items()
                for p in problems(v, schema[EVERY], f"{where}.{k}" if where else str(k), whole=whole)]
    found = []
    for name, inner in schema.items():
        at = f"{where}.{name}" if where else name
        if name in value:
            found += problems(value[name], inner, at, whole=whole)
        elif whole:
            found.append(f"{at} is missing")
    return found


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check(kind: str, payload: Any, path: str | Path, needs: tuple[str, ...] = ()) -> None:
    """ArtifactFieldError naming the file, the first field that departs from the kind's schema and the
    fix. Fields present are checked; those of `needs` (top-level names) must be present and whole.
    Kinds without a schema pass."""
    schema = SCHEMAS.get(kind)
    if schema is None:
        return
    if not isinstance(payload, dict):
        found = problems(payload, schema)
    else:
        found = [f"{name} is missing" for name in needs if name not in payload]
        found += problems(payload, {k: v for k, v in schema.items() if k not in needs}, whole=False)
        found += problems(payload, {k: v for k, v in schema.items() if k in needs and k in payload}, whole=True)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ArtifactFieldError(f"{path}: {found[0]}{more}; this {kind} artifact was edited or cut short: make it "
                                 f"again with `{MAKERS[kind]}` (or rerun the demo step that writes it)")
