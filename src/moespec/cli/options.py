"""Parsers of option text that several commands share: step times, acceptances, batch sizes, pass-size
ranges and MoE layers. Each returns the parsed value or raises typer.BadParameter naming the text and
what is valid. (`checks` holds the typer callbacks that check one value as it is parsed.)
"""

from __future__ import annotations

from fractions import Fraction

import typer

from moespec.costmodel.predict import ACCEPTANCE_GRID
from moespec.costmodel.theory import check_acceptance, check_step_times

# The longest draft the calculator takes: its step points cost O(kmax^3) root searches (64: well under
# a second; 200 step times ran past a minute), and no engine drafts near 64 tokens a step.
MAX_K = 64


def parse_number(text: str, option: str) -> Fraction:
    """A decimal or a ratio such as 7/20, kept exact so that the calculator computes exactly."""
    try:
        value = Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        raise typer.BadParameter(f"{text!r} is not a number (write 12.5 or 25/2)", param_hint=option) from None
    try:
        tiny = float(value) == 0 != value  # the calculator's floats must hold it: 1e999 is exact here but no float
    except OverflowError:
        tiny = None
    if tiny is not False:
        raise typer.BadParameter(f"{text!r} is beyond a float's range (about 1e-308 to 1.8e308)", param_hint=option)
    return value


def parse_step_times(text: str, option: str = "'--step-times'") -> list:
    """V(0..kmax) from "10,11,13": every entry a positive number (an empty one is a typo, not skipped);
    errors name `option`."""
    entries = text.split(",")
    if len(entries) > MAX_K + 1:
        raise typer.BadParameter(f"{len(entries)} step times give kmax = {len(entries) - 1}, above the {MAX_K} this "
                                 f"calculator takes; give V(0),...,V(kmax) with kmax <= {MAX_K}", param_hint=option)
    for i, entry in enumerate(entries):
        if not entry.strip():
            raise typer.BadParameter(f"entry {i + 1} of {text!r} is empty; write V(0),V(1),... such as 10,11,13",
                                     param_hint=option)
    try:
        V = check_step_times([parse_number(v, option) for v in entries])
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint=option) from None
    try:
        float(max(V) / min(V))  # the step points divide one step time by another
    except OverflowError:
        raise typer.BadParameter(f"{text!r}: the step times span more than a float's range; give them in one unit "
                                 "such as ms", param_hint=option) from None
    return V


def parse_acceptances(texts: list[str]) -> list:
    """Acceptance rates a in [0, 1), exact, from ["0.5", "9/10"]."""
    out = []
    for a in texts:
        try:
            out.append(check_acceptance(parse_number(a, "'--acceptance'")))
        except ValueError as e:  # name the text as written (-0.1), not only its exact value (-1/10)
            raise typer.BadParameter(f"{a}: {e}", param_hint="'--acceptance'") from None
    return out


def acceptance_grid(texts: list[str] | None) -> list:
    """The acceptances given, else the paper's grid (`costmodel.predict.ACCEPTANCE_GRID`), exact."""
    return parse_acceptances(texts) if texts else [Fraction(str(a)) for a in ACCEPTANCE_GRID]


def parse_batch_step_times(texts: list[str]) -> dict:
    """{B: V_B in ms} from ["1=10,11,13", "4=14,17,22"]."""
    out = {}
    for text in texts:
        B, sep, times = text.partition("=")
        if not sep or not B.strip().isdigit() or int(B) < 1:
            raise typer.BadParameter(f"{text!r} is not B=V(0),V(1),... with a batch size B >= 1, such as 4=14,17,22",
                                     param_hint="'--batch-step-times'")
        if int(B) in out:
            raise typer.BadParameter(f"batch size {int(B)} is given twice", param_hint="'--batch-step-times'")
        V = parse_step_times(times, f"'--batch-step-times' {B.strip()}=")
        if len(V) < 2:
            raise typer.BadParameter(f"{text!r} gives only V(0); give V(0),V(1),... (kmax >= 1)",
                                     param_hint="'--batch-step-times'")
        out[int(B)] = V
    return out


def parse_sizes(text: str) -> list[int]:
    """Distinct batch sizes >= 1 from "1,2,4,8", sorted."""
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1 or len(set(sizes)) != len(sizes):
        raise typer.BadParameter(f"{text!r} is not a list of distinct batch sizes >= 1 such as 1,2,4,8",
                                 param_hint="'--batch-sizes'")
    return sorted(sizes)


def parse_n_range(text: str) -> tuple[int, int]:
    """'1..9' -> (1, 9); a single number '9' means 1..9."""
    lo, sep, hi = text.partition("..")
    try:
        a, b = (int(lo), int(hi)) if sep else (1, int(lo))
    except ValueError:
        raise typer.BadParameter(f"--n takes a range like 1..9 or a largest n like 9; got {text!r}") from None
    if not 1 <= a <= b:
        raise typer.BadParameter(f"--n needs 1 <= first <= last; got {text!r}")
    return a, b


def parse_layers(text: str) -> list[int | str]:
    """MoE-layer indices from "0,mid" (ints, negatives from the end, or "mid")."""
    layers: list[int | str] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part == "mid":
            layers.append(part)
        else:
            try:
                layers.append(int(part))
            except ValueError:
                raise typer.BadParameter(f"layer {part!r} must be an integer or 'mid'") from None
    if not layers:
        raise typer.BadParameter("give at least one layer, e.g. --layers 0,mid")
    return layers
