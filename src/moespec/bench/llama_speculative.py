"""llama.cpp's own speculative decoding timed on the held-out prompts (issue 50, item 4): one
`llama-speculative-simple` process per (setting, prompt, rep), bounded by a timeout, its printed
counts and decode time parsed.

Plain decoding runs through the same binary and decode loop at `bench.llama_settings.PLAIN_ARGS` (a
drafter that drafts nothing) rather than through llama-simple or llama-cli: llama-simple takes no
thread count, llama-cli runs a chat loop with its own timing, and only the same loop makes plain and
speculative times a ratio of like with like. The binary times decoding alone (the prompt, the draft
model's included, is processed before its decode clock starts), as moespec's check does. Sampling is
greedy (`--temp 0`: llama.cpp keeps the top logit alone), so every setting decodes the same text, and
weight repacking is off (`--no-repack`), as in moespec's llama.cpp backend (`backends.llama_model`: the
AMX repack crashes on this project's Xeons), so both engines run the same kernels.
Settings are interleaved within each rep and prompt, so a slow spell of the machine falls on all.
"""

from __future__ import annotations

import math
import re
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from moespec.bench.llama_settings import LlamaSetting

# what examples/speculative-simple/speculative-simple.cpp prints at its end (its LOG_INF formats)
DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([-0-9.naif]+) seconds, speed:\s+([-0-9.naif]+) t/s")
ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([-0-9.naif]+) seconds")
COUNTS = {"drafted": re.compile(r"n_drafted = (-?\d+)"), "accepted": re.compile(r"n_accept\s+= (-?\d+)"),
          "predicted": re.compile(r"n_predict = (-?\d+)")}
TIMEOUT_S = 300.0  # one process: load, prompt and new tokens; a hung run fails the check instead of the chain
OUTPUT_TAIL = 8  # lines of a failed run's output quoted in its error


@dataclass(frozen=True)
class SpecRun:
    """One run's figures as llama-speculative-simple prints them: tokens decoded and the seconds its
    decode loop took, the prompt's tokens, draft tokens proposed and accepted."""

    decoded: int
    seconds: float
    prompt_tokens: int
    drafted: int
    accepted: int

    @property
    def tokens_per_s(self) -> float:
        return self.decoded / self.seconds if self.seconds > 0 else math.nan

    def to_dict(self) -> dict:
        return {"decoded": self.decoded, "seconds": self.seconds, "prompt_tokens": self.prompt_tokens,
                "drafted": self.drafted, "accepted": self.accepted}


def parse_output(text: str) -> SpecRun:
    """The figures of one run from its printed output (stdout and stderr together)."""
    decoded, encoded = DECODED.search(text), ENCODED.search(text)
    counts = {name: pattern.search(text) for name, pattern in COUNTS.items()}
    if decoded is None or encoded is None or any(m is None for m in counts.values()):
        said = [line for line in text.splitlines() if line.strip()][-OUTPUT_TAIL:]
        raise ValueError("llama-speculative-simple printed no decode summary (did it fail?): " + " | ".join(said))
    return SpecRun(int(decoded.group(1)), float(decoded.group(2)), int(encoded.group(1)),
                   int(counts["drafted"].group(1)), int(counts["accepted"].group(1)))


def command(binary: str | Path, *, target: str | Path, prompt_file: str | Path, setting: LlamaSetting,
            threads: int | None, new_tokens: int, context: int) -> list[str]:
    """The command line of one run: greedy, `new_tokens`, the target and the setting's flags."""
    cmd = [str(binary), "-m", str(target), "-f", str(prompt_file), "-n", str(new_tokens), "-c", str(context),
           "--temp", "0", "--seed", "0", "--no-repack"]
    if threads:
        cmd += ["-t", str(threads), "-tb", str(threads), "-td", str(threads), "-tbd", str(threads)]
    return cmd + list(setting.args)


SUMMARY_TRIES = 3  # llama.cpp logs from a worker thread: on a loaded machine a run can exit 0 before it wrote


def run_once(cmd: Sequence[str], *, timeout: float = TIMEOUT_S, run=subprocess.run) -> SpecRun:
    """One bounded run of `cmd`, parsed; a non-zero exit or a timeout is a ValueError naming the fix.
    A run that exits 0 without its summary (its asynchronous log lost at exit) is run again, up to
    SUMMARY_TRIES times in all."""
    for attempt in range(SUMMARY_TRIES):
        try:
            return attempt_once(cmd, timeout=timeout, run=run)
        except MissingSummary:
            if attempt + 1 == SUMMARY_TRIES:
                raise


class MissingSummary(ValueError):
    """A run that exited 0 but printed no decode summary."""


def attempt_once(cmd: Sequence[str], *, timeout: float, run) -> SpecRun:
    """One run of `cmd`; MissingSummary when it exited 0 without its summary."""
    try:
        # errors="replace": a model's text may end inside a multi-byte character (a random model's often does)
        done = run(list(cmd), capture_output=True, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise ValueError(f"llama-speculative-simple ran past {timeout:g} s ({' '.join(cmd[:3])} ...); "
                         "give fewer new tokens or a longer timeout") from exc
    text = (done.stdout or "") + "\n" + (done.stderr or "")
    if done.returncode != 0:
        said = [line for line in text.splitlines() if line.strip()][-OUTPUT_TAIL:]
        raise ValueError(f"llama-speculative-simple exited {done.returncode} on {' '.join(cmd)}: " + " | ".join(said))
    try:
        return parse_output(text)
    except ValueError as e:
        raise MissingSummary(str(e)) from None


@dataclass(frozen=True)
class SettingTimes:
    """One setting over the prompts: per prompt, the tokens decoded (first rep) and the median decode
    seconds over reps; tokens/s per prompt and pooled (all tokens over the summed medians), as
    moespec's held-out check pools its own."""

    setting: LlamaSetting
    tokens: tuple
    seconds: tuple
    drafted: int
    accepted: int

    @property
    def per_prompt(self) -> tuple:
        return tuple(n / s for n, s in zip(self.tokens, self.seconds))

    @property
    def tokens_per_s(self) -> float:
        return sum(self.tokens) / sum(self.seconds)

    def to_dict(self) -> dict:
        return {**self.setting.to_dict(), "tokens": list(self.tokens), "seconds": list(self.seconds),
                "per_prompt": list(self.per_prompt), "tokens_per_s": self.tokens_per_s,
                "drafted": self.drafted, "accepted": self.accepted}


def pooled(setting: LlamaSetting, runs: Sequence[Sequence[SpecRun]]) -> SettingTimes:
    """runs[prompt][rep] of one setting summarized (SettingTimes)."""
    return SettingTimes(setting, tuple(r[0].decoded for r in runs),
                        tuple(statistics.median(x.seconds for x in r) for r in runs),
                        sum(x.drafted for r in runs for x in r), sum(x.accepted for r in runs for x in r))


def time_settings(binary: str | Path, *, target: str | Path, prompts: Sequence[str],
                  settings: Sequence[LlamaSetting], threads: int | None, new_tokens: int, reps: int = 1,
                  context: int = 2048, timeout: float = TIMEOUT_S, run=subprocess.run,
                  progress: Callable[[str], None] | None = None) -> list[SettingTimes]:
    """Every setting on every prompt `reps` times, interleaved (rep > prompt > setting), each run a
    bounded process; one SettingTimes per setting, in order. Settings with the same flags (emitted
    `--spec-type none` and plain) run once and share their times: one command, one figure."""
    if not prompts:
        raise ValueError("no prompts to time llama.cpp on; give at least one held-out prompt")
    if reps < 1 or new_tokens < 1:
        raise ValueError(f"reps {reps} and new tokens {new_tokens} must be >= 1")
    distinct = list(dict.fromkeys(s.args for s in settings))
    runs = [[[] for _ in prompts] for _ in distinct]
    with tempfile.TemporaryDirectory(prefix="moespec-llama-") as tmp:
        files = []
        for i, text in enumerate(prompts):
            files.append(Path(tmp) / f"prompt-{i}.txt")
            files[-1].write_text(text + "\n", encoding="utf-8")  # -f drops one final newline
        for rep in range(reps):
            for i, prompt_file in enumerate(files):
                for j, args in enumerate(distinct):
                    cmd = command(binary, target=target, prompt_file=prompt_file, setting=LlamaSetting("", args, None),
                                  threads=threads, new_tokens=new_tokens, context=context)
                    runs[j][i].append(run_once(cmd, timeout=timeout, run=run))
                if progress is not None:
                    progress(f"llama.cpp: rep {rep + 1}/{reps}, prompt {i + 1}/{len(files)}: "
                             f"{len(distinct)} settings timed")
    return [pooled(s, runs[distinct.index(s.args)]) for s in settings]
