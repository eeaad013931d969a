"""The one folder where moespec keeps what it builds or learns on this machine: compiled helpers,
converted test files, tokenized corpora, the warm start's step times. `$MOESPEC_CACHE`, else
~/.cache/moespec."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("MOESPEC_CACHE", Path.home() / ".cache" / "moespec"))
