"""One process at a time on a file or a folder: an advisory lock (`fcntl.flock`) on a `.lock` file
beside a file, or on a folder itself (nothing is left in it).

Used where several processes read, edit and replace one file (the warm start's store) and where a
run folder must not be worked on by two chains at once. The lock goes with the process: a killed
holder leaves nothing held. POSIX only (`fcntl`); elsewhere the lock is a no-op.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # Windows: no advisory locks here
    fcntl = None


def lock_path(path: Path) -> Path:
    """The lock file of `path`: `path` with `.lock` added to its name."""
    return path.with_name(path.name + ".lock")


@contextlib.contextmanager
def exclusive(path: str | Path, *, wait: bool = True) -> Iterator[bool]:
    """Hold `path`'s lock (a folder's own, a file's `lock_path`) for the block; yields True when held.
    With `wait=False` a lock another process holds is not waited for: the block runs with False, so
    the caller can say who holds it."""
    path = Path(path)
    if path.is_dir():
        fd = os.open(path, os.O_RDONLY)
    else:
        lock = lock_path(path)
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fcntl is None:
            yield True
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
