"""The settings llama.cpp's own speculative decoding is run at, beside moespec's held-out check (issue 50,
item 4): for one candidate, plain decoding, moespec's emitted settings, llama.cpp's defaults and each
n-max = 1..kmax (the best of those, in hindsight, is what a user tuning n-max by hand would find).

Each setting is the flags after `llama-speculative-simple -m TARGET`, the same flags llama-server takes:

- plain: `--spec-type ngram-mod --spec-ngram-mod-n-max 0 --spec-ngram-mod-n-min 0`, a drafter that never
  drafts, so plain decoding runs through the same binary and loop as the others (the binary refuses to
  run without a drafter, and a draft model at n-max 0 would still decode every token itself);
- emitted: the candidate's llama.cpp fragment from candidates.json as written (`--spec-type none`: plain);
- defaults: the drafter alone (draft file, n-match, size-n), its lengths at llama.cpp's defaults, which
  `header_defaults` reads from the vendored common/common.h that the binary was built from;
- n-max k: the drafter with its length flag at k, the rest at llama.cpp's defaults (ngram-mod: n-min
  min(the candidate's n-min, k), as moespec's engine runs it; llama.cpp's 48 drafts nothing at short k).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

PLAIN, EMITTED, DEFAULTS = "plain", "emitted", "defaults"
DRAFT_SIMPLE, NGRAM_MOD, NGRAM_SIMPLE = "draft-simple", "ngram-mod", "ngram-simple"
PLAIN_ARGS = ("--spec-type", NGRAM_MOD, "--spec-ngram-mod-n-max", "0", "--spec-ngram-mod-n-min", "0")
# the flag that sets the draft length per llama.cpp drafter (common/arg.cpp)
LENGTH_FLAG = {DRAFT_SIMPLE: "--spec-draft-n-max", NGRAM_MOD: "--spec-ngram-mod-n-max",
               NGRAM_SIMPLE: "--spec-ngram-simple-size-m"}
# the structs of common/common.h whose defaults each drafter runs at, and the fields read
HEADER_STRUCTS = {DRAFT_SIMPLE: ("common_params_speculative_draft", ("n_max", "n_min", "p_min")),
                  NGRAM_MOD: ("common_params_speculative_ngram_mod", ("n_match", "n_max", "n_min")),
                  NGRAM_SIMPLE: ("common_params_speculative_ngram_map", ("size_n", "size_m", "min_hits"))}


@dataclass(frozen=True)
class LlamaSetting:
    """One setting: its name in tables ("plain", "emitted", "defaults", "n-max 3"), the flags after
    `-m TARGET`, and n_max, the draft length it runs at (0 plain, None where llama.cpp's default is)."""

    name: str
    args: tuple
    n_max: int | None

    def to_dict(self) -> dict:
        return {"name": self.name, "args": list(self.args), "fragment": shlex.join(self.args), "n_max": self.n_max}


def header_defaults(header: str | Path) -> dict[str, dict[str, float]]:
    """{drafter: {field: default}} read from llama.cpp's common/common.h (HEADER_STRUCTS)."""
    text = Path(header).read_text(encoding="utf-8")
    found = {}
    for drafter, (struct, fields) in HEADER_STRUCTS.items():
        body = re.search(r"struct\s+" + struct + r"\s*\{(.*?)\n\};", text, re.S)
        if body is None:
            raise ValueError(f"{header} has no struct {struct}; is it llama.cpp's common/common.h?")
        values = {}
        for field in fields:
            m = re.search(r"\b" + field + r"\s*=\s*([-0-9.]+)f?\s*;", body.group(1))
            if m is None:
                raise ValueError(f"struct {struct} of {header} sets no default for {field}")
            values[field] = float(m.group(1)) if "." in m.group(1) else int(m.group(1))
        found[drafter] = values
    return found


def drafter_args(candidate: Mapping) -> tuple[str, tuple]:
    """(llama.cpp drafter, its identifying flags) for a candidate (`Candidate.to_dict()`): the draft
    file, or the n-gram rule with its match size. An oracle has no llama.cpp drafter: ValueError."""
    kind = candidate["kind"]
    if kind == "draft":
        return DRAFT_SIMPLE, ("--spec-type", DRAFT_SIMPLE, "-md", str(candidate["draft"]))
    if kind in ("prompt-lookup", NGRAM_MOD):  # llama.cpp's line for moespec's lookup is ngram-mod
        return NGRAM_MOD, ("--spec-type", NGRAM_MOD, "--spec-ngram-mod-n-match", str(candidate["n"]))
    if kind == NGRAM_SIMPLE:
        return NGRAM_SIMPLE, ("--spec-type", NGRAM_SIMPLE, "--spec-ngram-simple-size-n", str(candidate["n"]),
                              "--spec-ngram-simple-min-hits", str(candidate.get("min_hits", 1)))
    raise ValueError(f"candidate {candidate.get('name', kind)!r} ({kind}) has no llama.cpp drafter; "
                     "llama.cpp runs draft files, prompt lookup (ngram-mod), ngram-mod and ngram-simple")


def emitted_setting(fragment: str, draft: str | None = None) -> LlamaSetting:
    """The emitted settings as run: the fragment's flags (`--spec-type none`: plain, through PLAIN_ARGS),
    its -md file replaced by `draft` where given (the file a draft spec such as `smollm2` resolves to)."""
    args = list(shlex.split(fragment))
    if draft is not None and "-md" in args:
        args[args.index("-md") + 1] = draft
    args = tuple(args)
    if "--spec-type" not in args:
        raise ValueError(f"the llama.cpp fragment {fragment!r} names no --spec-type; take it from candidates.json")
    drafter = args[args.index("--spec-type") + 1]
    if drafter == "none":
        return LlamaSetting(EMITTED, PLAIN_ARGS, 0)
    flag = LENGTH_FLAG.get(drafter)
    if flag is None:
        raise ValueError(f"the fragment's drafter {drafter!r} is not one of {sorted(LENGTH_FLAG)}")
    return LlamaSetting(EMITTED, args, int(args[args.index(flag) + 1]) if flag in args else None)


def n_max_setting(candidate: Mapping, k: int) -> LlamaSetting:
    """The candidate's drafter at draft length k, the rest at llama.cpp's defaults (module docstring)."""
    if k < 1:
        raise ValueError(f"n-max {k} drafts nothing; use the plain setting for k = 0")
    drafter, base = drafter_args(candidate)
    extra = ("--spec-ngram-mod-n-min", str(min(int(candidate.get("n_min", 1)), k))) if drafter == NGRAM_MOD else ()
    return LlamaSetting(f"n-max {k}", (*base, LENGTH_FLAG[drafter], str(k), *extra), k)


def settings_for(candidate: Mapping, fragment: str, kmax: int) -> list[LlamaSetting]:
    """plain, emitted, defaults and n-max 1..kmax for one candidate (`Candidate.to_dict()`) whose emitted
    llama.cpp fragment is `fragment`."""
    if kmax < 1:
        raise ValueError(f"kmax {kmax} leaves no n-max to try; give kmax >= 1")
    drafter, base = drafter_args(candidate)
    emitted = emitted_setting(fragment, str(candidate["draft"]) if drafter == DRAFT_SIMPLE else None)
    return [LlamaSetting(PLAIN, PLAIN_ARGS, 0), emitted, LlamaSetting(DEFAULTS, base, None),
            *(n_max_setting(candidate, k) for k in range(1, kmax + 1))]
