"""The one runner of a run folder's steps (`moespec demo`, `moespec batch`, `moespec measure`).

A `Step` declares the artifacts it reads and the one it writes, and its work: a function called with
plain values (`args`), plus the chain's loaded model where the step says it needs it. The runner
reuses a finished artifact, runs the step otherwise, times it and records its peak resident memory
(`peak_memory`, anonymous and file-backed apart) in the artifact's header and in the folder's
memory.json. Before a step that opens the model file itself, the model the chain holds is closed,
so that one process holds at most one open instance of a file (issue 55). The file names and kinds
are `run_files`'.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moespec import artifacts, run_files
from moespec.locking import exclusive
from moespec.peak_memory import PeakMemory

HELD, OWN = "held", "own"  # a step that runs on the chain's loaded model / opens the model file itself


DEMO_ARTIFACTS = (run_files.CHARACTERIZATION, run_files.MEASUREMENT_BASE, run_files.MEASUREMENT,
                  run_files.PREDICTION, run_files.SCORE)  # the JSON artifacts a folder's model is checked against


@dataclass(frozen=True)
class Step:
    """name: shown as "[name]"; writes: the artifact; work(**args) writes it; reads: the artifacts it
    reads (they come before it); model: HELD to be called with model= and tokenizer= the chain holds,
    OWN when the work opens the file itself, "" when it needs no model."""

    name: str
    writes: Path
    work: Callable[..., Any]
    args: Mapping[str, Any] = field(default_factory=dict)
    reads: tuple[Path, ...] = ()
    model: str = ""

    def __post_init__(self):
        if self.model not in ("", HELD, OWN):
            raise ValueError(f"Step {self.name!r}: model={self.model!r}; choose '', {HELD!r} or {OWN!r}")


class Held:
    """The model the chain loads on first use and shares between its steps; `release()` closes it."""

    def __init__(self, load: Callable[[], tuple[Any, Any]]):
        self._load, self._pair = load, None

    def loaded(self) -> tuple[Any, Any]:
        if self._pair is None:
            self._pair = self._load()
        return self._pair

    def release(self) -> None:
        if self._pair is not None and hasattr(self._pair[0], "close"):
            self._pair[0].close()
        self._pair = None


@dataclass
class Runner:
    """Runs steps into the folder `out`, logging through echo; `ran` and `seconds` say what ran."""

    out: Path
    echo: Callable[[str], None] = print
    held: Held | None = None
    ran: list = field(default_factory=list)
    seconds: dict = field(default_factory=dict)

    def run(self, steps: Iterable[Step]) -> None:
        for step in steps:
            self.step(step)

    def step(self, step: Step) -> None:
        """Run `step` unless its artifact exists; log it, its time and its peak memory."""
        if step.writes.exists():
            stale = artifacts.changed_parents(step.writes)
            if not stale:
                self.echo(f"[{step.name}] reusing {step.writes}")
                return
            self.echo(f"[{step.name}] {step.writes.name} was made from another {', '.join(stale)}: making it again")
            move_aside([step.writes])
        missing = [p for p in step.reads if not p.exists()]
        if missing:
            raise FileNotFoundError(f"step {step.name} reads {', '.join(map(str, missing))}: run the steps before it")
        if step.model == OWN and self.held is not None:
            self.held.release()  # the step opens the file itself: one open instance at a time
        args = dict(step.args)
        if step.model == HELD:
            if self.held is None:
                raise ValueError(f"step {step.name} runs on the chain's model; give the Runner one (held=)")
            args["model"], args["tokenizer"] = self.held.loaded()
        self.echo(f"[{step.name}] running")
        t0 = time.perf_counter()
        with PeakMemory() as peak:
            step.work(**args)
        self.seconds[step.name] = time.perf_counter() - t0
        self.ran.append(step.name)
        record_memory(self.out, step, peak.record(), parents=artifacts.parents_of(step.writes, step.reads))
        self.echo(f"[{step.name}] done in {self.seconds[step.name]:.0f} s -> {step.writes}")


@contextlib.contextmanager
def holding(out: Path, command: str, echo: Callable[[str], None] = print) -> Iterator[None]:
    """The run folder `out` for one chain at a time (a lock the process holds, gone with it): a second
    chain is refused in one line naming the folder; an interrupted one says how to resume."""
    with exclusive(out, wait=False) as held:  # the folder's own lock: nothing is left in it
        if not held:
            raise ValueError(f"another moespec run is working in {out} (it holds the folder's lock); wait "
                             f"for it to end, or give this run another --out-dir")
        try:
            yield
        except KeyboardInterrupt:
            echo(f"\ninterrupted: the finished steps are kept in {out}; run `{command}` again to resume from them "
                 "(--restart starts over)")
            raise


def record_memory(out: Path, step: Step, peak: dict, parents: dict[str, str] | None = None) -> None:
    """The step's peak memory as a "memory" field of its artifact's header (JSON artifacts), with the
    files it was made from ("parents": name -> `artifacts.file_digest`, so a changed parent makes it
    stale), and under its name in the folder's memory.json."""
    if step.writes.suffix == ".json" and artifacts.kind_of(step.writes) is not None:
        doc = artifacts.load(step.writes, artifacts.kind_of(step.writes))
        doc["memory"] = peak
        if parents:
            doc["parents"] = parents
        artifacts.dump_json(step.writes, doc)
    path = out / run_files.MEMORY
    steps = artifacts.load(path, "memory")["payload"]["steps"] if path.exists() else {}
    steps[step.name] = {**peak, "artifact": step.writes.name}
    artifacts.write(path, "memory", {"steps": steps})


def move_aside(paths: Iterable[Path], echo: Callable[[str], None] | None = None, where: Path | None = None) -> int:
    """`--restart`: each existing path moved to `<name>.old` (said through echo); returns how many."""
    moved = [p for p in dict.fromkeys(paths) if p.exists() and not p.name.endswith(run_files.OLD)]
    for path in moved:
        os.replace(path, path.with_name(path.name + run_files.OLD))
    if echo is not None:
        echo(f"[restart] moved {len(moved)} file(s) of {where} to *.old")
    return len(moved)


def run_folder_files(out: Path) -> list[Path]:
    """What a restart of the run folder `out` moves aside: its artifacts, reports and point logs."""
    return [*(out / n for n in run_files.RESTARTED), *out.glob("*.points.jsonl"), *out.glob("batch-*"),
            *out.glob(run_files.CANDIDATE + "*")]


def drop(out: Path, names: Iterable[str]) -> None:
    """Remove the stale artifacts `names` of `out` (and what was made from them: the caller names those too)."""
    for name in names:
        (out / name).unlink(missing_ok=True)


def settings_changed(got: Mapping[str, Any], want: Mapping[str, Any], *, missing_differs: bool = False) -> str:
    """"" when an artifact made with settings `got` was made with `want`'s, else what differs
    ("reps 6, this run 8; ..."); a setting `got` lacks differs only with `missing_differs`."""
    def plain(x: Any) -> Any:
        return [plain(y) for y in x] if isinstance(x, (list, tuple, range)) else x

    differ = [k for k in want if (k in got or missing_differs) and plain(got.get(k)) != plain(want[k])]
    return "; ".join(f"{k} {got.get(k)}, this run {want[k]}" for k in differ)


def set_partial(path: Path, kind: str) -> None:
    """Set an unfinished artifact aside as `<name>.partial`, which its step resumes from."""
    payload = artifacts.load(path, kind)["payload"]
    path.unlink()
    artifacts.write(path.with_name(path.name + run_files.PARTIAL), kind, payload)


def check_folder(out: Path, this_run: str, provenance: Callable[[], dict], fix: str) -> None:
    """Refuse a run folder holding artifacts of another model than this run's (`models.lineage`);
    this_run names it in the message, provenance() gives its identity (called only when needed)."""
    from moespec.models.lineage import check_chain
    from moespec.moe.traces import read_header

    named: dict[str, Any] = {n: read_header(out / n) for n in (run_files.TRACES, run_files.VERIFIED)
                             if (out / n).exists()}
    named.update({n: artifacts.load(out / n, kind)["payload"] for n, kind in run_files.KINDS.items()
                  if n in DEMO_ARTIFACTS and (out / n).exists()})
    if named:
        named[this_run] = {"provenance": provenance()}
        check_chain(named, fix=fix)
