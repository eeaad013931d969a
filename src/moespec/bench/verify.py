"""Verify time τ_p(n) of whole-model passes, the saving S(n) with its bootstrap interval, and the
verify-batch scaling curve.

τ_p(n) is the time of one forward pass of n tokens with kernel p while the KV cache holds a prompt
of depth d (cost-model paper, eq. (5); Sec. 4 and App. D). Each prompt is prefilled once per depth;
then every (n, kernel) pass is timed as `extend(n tokens)` with the cache cut back before each
call, outside the timed interval. The n tokens are the target's greedy continuation of the prompt,
the text a speculative step verifies (the oracle sweep's drafts are those very tokens), and
repetition r verifies the window starting `stride`·r tokens into it, over a cache holding the
prompt and the continuation before the window: the passes, the operation timed between them and
the sweep then verify the same text (Sec. 4: "the recorded routing of the verified continuations").
Kernels alternate call by call and repetitions run in rounds over every n, so slow drift of the machine falls on all points alike. The saving
S(n) = τ_slot(n) − τ_dedup(n) (eq. (6)) gets a 95% bootstrap interval that resamples prompts, then
repetitions within each prompt, pairing the two kernels' samples of the same (prompt, repetition).

The verify-batch scaling curve (engine paper, Sec. 6.5 and 7) is τ(n)/τ(1) for n = 1..16 with one
kernel: how far "parallel" verification is from costing one decode step.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from moespec.bench.timing import CacheFlusher, ModuleClock, Timing, measure

SLOT, DEDUP = "moespec_slot", "moespec_dedup"
KERNELS = (SLOT, DEDUP)
PROMPT_COUNT = 6
PROMPT_SEPARATOR = "\n\n"
PREFILL_CHUNK = 512
STRIDE = 3  # tokens between the windows of two repetitions of a verify pass (`run_verify`)


def prompt_texts(count: int = PROMPT_COUNT) -> list[str]:
    """The texts of the first `count` built-in prompts (moespec/data/prompts/p1.txt ...)."""
    if not 1 <= count <= PROMPT_COUNT:
        raise ValueError(f"count must be 1..{PROMPT_COUNT} (the built-in prompts), got {count}")
    folder = resources.files("moespec") / "data" / "prompts"
    return [(folder / f"p{i}.txt").read_text(encoding="utf-8") for i in range(1, count + 1)]


def prompt_ids(tokenizer, length: int, count: int = PROMPT_COUNT) -> list[list[int]]:
    """`count` token-id prompts of exactly `length` tokens each.

    Prompt i is p_i, followed (when p_i alone is shorter than `length` tokens, as with a subword
    tokenizer at depth 4096) by p_{i+1}, p_{i+2}, ... cyclically, joined by a blank line, then cut
    to `length`. With the synthetic presets' byte tokenizer one byte is one token, and each prompt
    of >= 5000 bytes covers depth 4096 plus a pass of 16 on its own.
    """
    if length < 1:
        raise ValueError(f"length must be >= 1 token, got {length}")
    texts = prompt_texts(PROMPT_COUNT)
    if not 1 <= count <= len(texts):
        raise ValueError(f"count must be 1..{len(texts)} (the built-in prompts), got {count}")
    pieces = [tokenizer.encode(t + PROMPT_SEPARATOR) for t in texts]
    if not any(pieces):
        raise ValueError(f"the tokenizer {tokenizer!r} gives no tokens for the built-in prompts")
    out = []
    for i in range(count):
        ids: list[int] = []
        j = i
        while len(ids) < length:
            ids.extend(pieces[j % len(pieces)])
            j += 1
        out.append(ids[:length])
    return out


def greedy_continuation(model, prompt: Sequence[int], length: int, vocab_limit: int | None = None) -> list[int]:
    """The target's first `length` greedy tokens after `prompt` (untimed): the text a speculative
    step verifies (the oracle draft proposes it, marking some drafts wrong), and the oracle's reference."""
    from moespec.engine.decode import generate

    if length < 1:
        raise ValueError(f"length must be >= 1 token, got {length}")
    avoid_slot_prefill(model)
    return list(generate(model, list(prompt), k=0, temperature=0.0, max_new_tokens=length,
                         vocab_limit=vocab_limit, prefill_last=False).tokens)


def vocab_limit(tokenizer) -> int | None:
    """The ids a decode may produce: the tokenizer's length where it has one (the output layer may be padded)."""
    return len(tokenizer) if hasattr(tokenizer, "__len__") else None


def verified_texts(model, tokenizer, depth: int, prompts: int, length: int) -> list[list[int]]:
    """Per built-in prompt: its first `depth` tokens followed by `length` greedy tokens of the target."""
    limit = vocab_limit(tokenizer)
    return [ids + greedy_continuation(model, ids, length, limit) for ids in prompt_ids(tokenizer, depth, prompts)]


def continuation_length(reps: int, n_max: int, stride: int = STRIDE) -> int:
    """Tokens of continuation the verify passes read: the last repetition's window ends there."""
    return stride * (reps - 1) + n_max


def pass_time(samples: np.ndarray) -> float:
    """A verify time from samples [P, R] (prompt x repetition), seconds: each prompt's median over
    its repetitions, averaged over the prompts.

    The prompts are windows of different text, measured one after another: their routing names
    different numbers of distinct experts (qwen3moe-shaped: 10 against 31 at n = 8), and the machine
    may run at another speed by the next prompt, so their passes fall in separate clusters (40 and
    54 ms at n = 2 there). The median of the pooled passes then lands wherever the two clusters'
    inner tails meet; it missed the average of the prompts' medians by up to 5.4 ms at 70 ms on
    qwen3moe-shaped. The average is the one that the prediction's operation times (22) take over
    their windows, so the two are compared like for like.
    """
    s = np.asarray(samples, dtype=float)
    if s.ndim != 2 or s.size == 0:
        raise ValueError(f"samples must be a non-empty [prompts, repetitions] array, got shape {s.shape}")
    return float(np.median(s, axis=1).mean())


@dataclass(frozen=True)
class Saving:
    """S(n) = τ_slot(n) − τ_dedup(n) (eq. (6)) in seconds, with its bootstrap interval [lo, hi]."""

    n: int
    point: float
    lo: float
    hi: float
    level: float = 0.95

    @property
    def excludes_zero(self) -> bool:
        return self.lo > 0 or self.hi < 0

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "point": self.point, "lo": self.lo, "hi": self.hi, "level": self.level}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Saving":
        return cls(**d)


def bootstrap_saving(
    slot: np.ndarray,  # [P, R] seconds, per-slot kernel, prompt x repetition
    dedup: np.ndarray,  # [P, R] seconds, deduplicating kernel, paired with `slot`
    *,
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(point, lo, hi) of S = τ_slot − τ_dedup, eq. (6), each τ a `pass_time`, with a percentile
    interval.

    Each resample draws P prompts with replacement, then R repetitions with replacement within
    each drawn prompt; the same (prompt, repetition) indices go to both kernels, which were timed
    back to back.
    """
    slot, dedup = np.asarray(slot, dtype=float), np.asarray(dedup, dtype=float)
    if slot.ndim != 2 or slot.shape != dedup.shape or slot.size == 0:
        raise ValueError(
            f"slot and dedup must be non-empty [prompts, reps] arrays of one shape, got {slot.shape} and {dedup.shape}"
        )
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    P, R = slot.shape
    rng = np.random.default_rng(seed)
    pi = rng.integers(P, size=(resamples, P, 1))
    ri = rng.integers(R, size=(resamples, P, R))
    stats = np.median(slot[pi, ri], axis=2).mean(axis=1) - np.median(dedup[pi, ri], axis=2).mean(axis=1)
    point = pass_time(slot) - pass_time(dedup)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(stats, [alpha, 1 - alpha])
    return point, float(lo), float(hi)


def _as_samples(d: dict) -> dict[int, np.ndarray]:
    return {int(n): np.asarray(v, dtype=float) for n, v in d.items()}


@dataclass(frozen=True)
class VerifyTimes:
    """Verify-pass samples at one depth d.

    samples[kernel][n] holds seconds shaped [P, R] (prompt x repetition); τ_p(n) is their `pass_time`.
    ops[kernel][n], where timed (`run_verify` with verified windows), holds the expert operation's
    seconds on each pass's own window, shaped [P, R, L] over `op_layers`, each taken right after
    its pass. inside[kernel][n], where recorded, holds the seconds each pass spent inside its experts
    modules, summed over the layers, shaped [P, R] like the samples (`time_passes`).
    """

    depth: int
    samples: dict[str, dict[int, np.ndarray]]
    ops: dict[str, dict[int, np.ndarray]] | None = None
    op_layers: tuple[int, ...] = ()
    inside: dict[str, dict[int, np.ndarray]] | None = None

    @property
    def kernels(self) -> tuple[str, ...]:
        return tuple(self.samples)

    @property
    def ns(self) -> tuple[int, ...]:
        return tuple(sorted(next(iter(self.samples.values()))))

    def tau(self, kernel: str) -> dict[int, float]:
        """τ_p(n): each prompt's median over repetitions, averaged over prompts (`pass_time`), seconds."""
        return {n: pass_time(s) for n, s in sorted(self.samples[kernel].items())}

    @property
    def tau_meas_1(self) -> float:
        """τ_meas(1), the one-token verify time of eq. (22): the per-slot kernel's (or the only one's)."""
        kernel = SLOT if SLOT in self.samples else self.kernels[0]
        return self.tau(kernel)[1] if 1 in self.samples[kernel] else float("nan")

    def op_times(self, kernel: str) -> dict[int, np.ndarray]:
        """Each of `op_layers`' operation time on the verified windows, timed between the passes: the
        median over repetitions, averaged over prompts (the windows), {n: [L]} seconds."""
        if not self.ops:
            raise ValueError(f"no operation times at depth {self.depth}; run_verify times them when given the "
                             "verified windows and op_layers")
        return {n: np.median(s, axis=1).mean(axis=0) for n, s in sorted(self.ops[kernel].items())}

    def savings(self, *, resamples: int = 2000, seed: int = 0) -> list[Saving]:
        """S(n) with its 95% bootstrap interval at every measured n; empty unless both kernels ran."""
        if not (SLOT in self.samples and DEDUP in self.samples):
            return []
        out = []
        for n in self.ns:
            point, lo, hi = bootstrap_saving(
                self.samples[SLOT][n], self.samples[DEDUP][n], resamples=resamples, seed=seed + n
            )
            out.append(Saving(n=n, point=point, lo=lo, hi=hi))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "depth": self.depth,
            "ns": list(self.ns),
            "tau": {p: {str(n): t for n, t in self.tau(p).items()} for p in self.kernels},
            "tau_meas_1": self.tau_meas_1,
            "saving": [s.to_dict() for s in self.savings()],
            "samples": {p: {str(n): s.tolist() for n, s in sorted(ns.items())} for p, ns in self.samples.items()},
            **({"op_layers": list(self.op_layers),
                "ops": {p: {str(n): s.tolist() for n, s in sorted(ns.items())} for p, ns in self.ops.items()}}
               if self.ops else {}),
            **({"inside": {p: {str(n): s.tolist() for n, s in sorted(ns.items())} for p, ns in self.inside.items()}}
               if self.inside else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "VerifyTimes":
        ops = {p: _as_samples(v) for p, v in d["ops"].items()} if d.get("ops") else None
        inside = {p: _as_samples(v) for p, v in d["inside"].items()} if d.get("inside") else None
        return cls(depth=int(d["depth"]), samples={p: _as_samples(v) for p, v in d["samples"].items()}, ops=ops,
                   op_layers=tuple(int(l) for l in d.get("op_layers", ())), inside=inside)


@dataclass(frozen=True)
class ScalingCurve:
    """Verify-batch scaling at depth d with one kernel: samples[n] seconds shaped [P, R]."""

    depth: int
    kernel: str
    samples: dict[int, np.ndarray]

    @property
    def ratio(self) -> dict[int, float]:
        """τ(n)/τ(1): an n-token pass over a 1-token pass (engine paper, Sec. 6.5)."""
        t1 = pass_time(self.samples[1])
        return {n: pass_time(s) / t1 for n, s in sorted(self.samples.items())}

    def to_dict(self) -> dict[str, Any]:
        return {
            "depth": self.depth,
            "kernel": self.kernel,
            "ratio": {str(n): r for n, r in self.ratio.items()},
            "samples": {str(n): s.tolist() for n, s in sorted(self.samples.items())},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ScalingCurve":
        return cls(depth=int(d["depth"]), kernel=d["kernel"], samples=_as_samples(d["samples"]))


def time_passes(
    model,
    ids: Sequence[int],
    depth: int,
    ns: Iterable[int],
    kernels: Sequence[str | None],
    *,
    reps: int = 5,
    warmup: int = 1,
    flush: Callable[[], None] | None = None,
    between: Callable[[int, str, int], list[float]] | None = None,
    stride: int = 0,
) -> dict[str, dict[str, list[float]]]:
    """Seconds of `reps` passes of n tokens on one prompt prefilled to `depth`, per kernel and n.

    `ids` holds the prompt: its first `depth` tokens fill the cache once, and repetition r's pass of
    n tokens is ids[s : s + n] with s = depth + stride·r, the cache holding ids[:s] (extended by the
    stride between rounds, outside the timing; warm-up passes read s = depth). Kernels are switched
    with `model.set_experts_implementation` (None keeps the model's current one) and alternate call
    by call; repetitions run in rounds
    over every n, so a shared machine's drift falls on all pass sizes alike (timed n by n, one n
    could land on a slow minute and the verify times would not even grow with n). Returns
    {kernel: {str(n): [R]}}, keyed as JSON keeps it, so a fresh result and one read back from a
    point log look alike.

    between(n, kernel, start): called after each timed pass (and after each warm-up pass, its result
    dropped) with the pass's n, kernel and window start s - depth; what it returns is kept under
    "ops" as {kernel: {str(n): [R] results}}. `run_verify` times the expert operation on the pass's
    own window there, so that operation and pass share the machine's moment.

    "inside" ({kernel: {str(n): [R]}}, where the model has experts modules): the seconds each timed
    pass spent inside its experts modules, summed over the layers (`ModuleClock`), so the pass's
    time outside the expert operation is its time minus these, read from the pass itself.
    """
    from moespec.engine.cached import CachedModel
    from moespec.moe.experts import find_experts

    ns = sorted(set(int(n) for n in ns))
    if not ns or ns[0] < 1:
        raise ValueError(f"pass sizes must be >= 1, got {ns}")
    if stride < 0:
        raise ValueError(f"stride must be >= 0 tokens, got {stride}")
    need = depth + continuation_length(reps, ns[-1], stride)
    if depth < 1 or len(ids) < need:
        raise ValueError(f"ids of {len(ids)} tokens cannot hold depth {depth} plus {reps} passes of up to "
                         f"{ns[-1]} tokens {stride} apart ({need} tokens)")
    ids = torch.as_tensor(list(ids), dtype=torch.int64)  # [len(ids)]
    avoid_slot_prefill(model)
    cached = CachedModel(model)
    for start in range(0, depth, PREFILL_CHUNK):  # chunks bound the [chunk, V] logits of a subword vocabulary
        cached.extend(ids[start : min(start + PREFILL_CHUNK, depth)])
    base = depth  # the cache's length before each pass

    def cut_back() -> None:
        cached.truncate(base)
        if flush is not None:
            flush()

    def switch(kernel: str | None) -> None:
        if kernel is not None:
            model.set_experts_implementation(kernel)

    names = [str(k) for k in kernels]
    out: dict[str, dict[str, list[float]]] = {name: {str(n): [] for n in ns} for name in names}
    ops: dict[str, dict[str, list]] = {name: {str(n): [] for n in ns} for name in names}
    inside: dict[str, dict[str, list[float]]] = {name: {str(n): [] for n in ns} for name in names}
    experts = find_experts(model)
    clock = ModuleClock(experts) if experts else None
    with clock if clock is not None else contextlib.nullcontext():
        for n in ns:
            tokens = ids[depth : depth + n]
            for kernel, name in zip(kernels, names):
                switch(kernel)
                measure(lambda: cached.extend(tokens), reps=1, warmup=warmup, flush=cut_back)
                if between is not None and warmup:
                    between(n, name, 0)
        for rep in range(reps):  # rounds over every n, in an order that rotates by one each round
            cached.truncate(base)
            base = depth + stride * rep
            if cached.length < base:  # untimed: the continuation before this round's window
                cached.extend(ids[cached.length : base])
            for n in ns[rep % len(ns):] + ns[: rep % len(ns)]:
                tokens = ids[base : base + n]
                for kernel, name in zip(kernels, names):
                    switch(kernel)
                    if clock is not None:
                        clock.take()  # drop what ran since the last timed pass
                    t: Timing = measure(lambda: cached.extend(tokens), reps=1, warmup=0, flush=cut_back)
                    out[name][str(n)].append(t.samples[0])
                    if clock is not None:
                        inside[name][str(n)].append(clock.take())
                    if between is not None:
                        ops[name][str(n)].append(between(n, name, base - depth))
    cached.truncate(depth)
    return {**out, **({"ops": ops} if between is not None else {}), **({"inside": inside} if clock is not None else {})}


def verified_routing(model, tokenizer, *, depths: Sequence[int] = (512,), prompts: int = PROMPT_COUNT,
                     n_max: int = 9, length: int | None = None, model_spec: str = ""):
    """The routing of the text the verify passes verify: one trace document per (depth, prompt).

    Document "d{depth}/p{i}" holds the routing [length, L, m] of the target's greedy continuation of
    prompt i cut to `depth` (default length n_max), recorded after the prompt in the prefill's
    chunks, so each token sees the same context: `run_verify`'s repetition r passes its rows
    [stride·r, stride·r + n). The measured-time version of the prediction times the expert operation
    on these windows (cost-model paper, Sec. 4: "the recorded routing of the verified continuations").
    """
    from moespec.moe.routing import record
    from moespec.moe.traces import RoutingTrace

    if n_max < 1:
        raise ValueError(f"n_max={n_max} must be >= 1 (the largest verify pass size)")
    length = n_max if length is None else int(length)
    if length < n_max:
        raise ValueError(f"length={length} must be >= n_max={n_max}, the largest verify pass")
    docs = [(f"d{d}/p{i}", ids) for d in depths
            for i, ids in enumerate(verified_texts(model, tokenizer, d, prompts, length))]
    full = record(model, docs, chunk=PREFILL_CHUNK, model_spec=model_spec,
                  corpus=["moespec:data/prompts, greedy continuations"])
    return RoutingTrace([doc[-length:] for doc in full.documents], full.num_experts, full.expert_bytes,
                        full.doc_ids, full.model, full.dtype, full.corpus, full.layers)


def verified_depth(doc_id: str) -> int | None:
    """The depth d of a `verified_routing` document id "d{d}/p{i}", else None."""
    head = str(doc_id).split("/", 1)[0]
    return int(head[1:]) if head.startswith("d") and head[1:].isdigit() else None


def avoid_slot_prefill(model) -> None:
    """Leave the per-slot kernel before a prefill: it reads one expert per (token, slot), d*m reads."""
    if getattr(model.config, "_experts_implementation", None) == SLOT:
        model.set_experts_implementation(DEDUP)


def default_flusher(enabled: bool) -> Callable[[], None] | None:
    """The App. D cache flush before every timed pass, or None when `enabled` is False."""
    return CacheFlusher() if enabled else None


OnPoint = Callable[[dict, bool], None]  # (key, resumed) after each point, measured or read back


def _logged(log, key: dict, compute: Callable[[], Any], on_point: OnPoint | None) -> Any:
    """The value of point `key`: from the log when there, else computed and appended at once."""
    resumed = log is not None and log.has(key)
    if resumed:
        value = log.get(key)
    else:
        value = compute()
        if log is not None:
            log.append(key, value)
    if on_point is not None:
        on_point(key, resumed)
    return value


def verify_points(depths: Sequence[int], prompts: int) -> int:
    """How many points `run_verify` logs: one per (depth, prompt)."""
    return len(depths) * prompts


def run_verify(
    model,
    tokenizer,
    *,
    depths: Sequence[int] = (512, 4096),
    ns: Sequence[int] = range(1, 10),
    kernels: Sequence[str] = KERNELS,
    prompts: int = PROMPT_COUNT,
    reps: int = 5,
    warmup: int = 1,
    flush: Callable[[], None] | None = None,
    log=None,
    on_point: OnPoint | None = None,
    windows=None,
    op_layers: Sequence[int] = (),
    stride: int = STRIDE,
) -> list[VerifyTimes]:
    """τ_p(n) at each depth on `prompts` built-in prompts; one logged point per (depth, prompt).

    The passes verify the target's greedy continuation of each prompt cut to the depth, repetition
    r the window `stride`·r tokens into it (`time_passes`); the continuation is decoded before the
    timing. `log` is a `moespec.artifacts.PointLog`: finished points are read back instead of measured.
    windows: the `verified_routing` trace of these passes, and op_layers: MoE layers; given both,
    the expert operation of each of those layers is timed on each pass's own window right after
    the pass, with the same kernel (`VerifyTimes.ops`), so that the measured-time version's saving
    and the measured one share the machine's moments (a block timed minutes apart missed the
    measured saving by up to 14-21% of τ_dedup, one timed between the passes by 4-8%:
    benchmarks/interleaved_saving.py).
    """
    ns = sorted(set(int(n) for n in ns))
    op_layers = [int(l) for l in op_layers] if windows is not None else []
    length = continuation_length(reps, ns[-1], stride)
    short = [i for i, doc in zip(windows.doc_ids, windows.documents) if len(doc) < length] if op_layers else []
    if short:
        raise ValueError(f"the verified continuations {short} are shorter than the {length} tokens that {reps} "
                         f"repetitions {stride} apart with passes up to {ns[-1]} read; record them with "
                         f"verified_routing(length={length}) (`moespec trace-verified --reps {reps} --stride {stride}`)")
    out = []
    for depth in depths:
        per_prompt = []
        texts: list[list[int]] = []
        for i in range(prompts):
            key = {"part": "verify", "depth": depth, "prompt": i, "ns": ns, "kernels": list(kernels), "reps": reps,
                   "text": "greedy continuation", "stride": stride}
            between = None
            if op_layers:
                key["op_layers"] = op_layers
                between = operation_timer(model, windows, f"d{depth}/p{i}", op_layers, ns, flush)

            def compute(i=i, between=between):
                if not texts:  # decoded once per depth, only when some point of it is measured
                    texts.extend(verified_texts(model, tokenizer, depth, prompts, length))
                return time_passes(model, texts[i], depth, ns, kernels, reps=reps, warmup=warmup, flush=flush,
                                   between=between, stride=stride)

            per_prompt.append(_logged(log, key, compute, on_point))
        samples = {
            str(p): {n: np.array([pp[str(p)][str(n)] for pp in per_prompt]) for n in ns} for p in kernels
        }
        ops = ({str(p): {n: np.array([pp["ops"][str(p)][str(n)] for pp in per_prompt]) for n in ns} for p in kernels}
               if op_layers else None)
        # a point read back from a log written before the passes were split has no "inside"
        inside = ({str(p): {n: np.array([pp["inside"][str(p)][str(n)] for pp in per_prompt]) for n in ns}
                   for p in kernels} if all("inside" in pp for pp in per_prompt) else None)
        out.append(VerifyTimes(depth=depth, samples=samples, ops=ops, op_layers=tuple(op_layers), inside=inside))
    return out


OPERATION_KERNEL = {SLOT: "slot", DEDUP: "dedup"}  # a whole-model kernel -> the same kernel on the operation


def operation_timer(model, windows, doc_id: str, layers: Sequence[int], ns: Sequence[int],
                     flush: Callable[[], None] | None) -> Callable[[int, str], list[float]]:
    """f(n, kernel, start) -> [L] seconds: each layer's expert operation with `kernel` on rows
    [start, start + n) of the verified continuation `doc_id` (the window of the pass just timed),
    one timed call each, flushed before."""
    from moespec.bench import expert_op

    if doc_id not in windows.doc_ids:
        raise ValueError(f"the verified windows have no document {doc_id!r} (they have {list(windows.doc_ids)}); "
                         "record them with verify.verified_routing at the same depths and prompts")
    doc = windows.documents[list(windows.doc_ids).index(doc_id)]  # [T, L, m]
    experts = {l: expert_op.layer_experts(model, l) for l in layers}
    param = next(experts[layers[0]].parameters())
    hidden = param.shape[1] if getattr(experts[layers[0]], "is_transposed", False) else param.shape[-1]
    inputs: dict[tuple, Any] = {}

    def window(l: int, n: int, start: int):
        if (l, n, start) not in inputs:
            if start + n > doc.shape[0]:
                raise ValueError(f"the verified continuation {doc_id!r} has {doc.shape[0]} tokens, the pass reads "
                                 f"[{start}, {start + n}); record it with verified_routing(length=) >= "
                                 "continuation_length(reps, n_max, stride)")
            ids = tuple(map(tuple, np.asarray(doc[start : start + n, l], dtype=np.int64).tolist()))
            p = expert_op.Pass("verified", n, doc_id, 0, ids)
            inputs[(l, n, start)] = expert_op.pass_inputs(p, hidden, param.dtype, param.device)
        return inputs[(l, n, start)]

    def timed(n: int, kernel: str, start: int = 0) -> list[float]:
        fn = expert_op.kernel_fn(OPERATION_KERNEL[kernel], experts[layers[0]])
        times = []
        with torch.inference_mode():
            for l in layers:
                h, index, weights = window(l, n, start)
                times.append(measure(lambda: fn(experts[l], h, index, weights), reps=1, warmup=0,
                                     flush=flush).samples[0])
        return times

    return timed


def run_scaling(
    model,
    tokenizer,
    *,
    depth: int = 512,
    ns: Sequence[int] = range(1, 17),
    kernel: str | None = DEDUP,
    prompts: int = 2,
    reps: int = 3,
    warmup: int = 1,
    flush: Callable[[], None] | None = None,
    log=None,
    on_point: OnPoint | None = None,
) -> ScalingCurve:
    """The verify-batch scaling curve τ(n)/τ(1), n = 1..16, at one depth with one kernel."""
    ns = sorted(set(int(n) for n in ns) | {1})
    rows = []
    for i, ids in enumerate(prompt_ids(tokenizer, depth + ns[-1], prompts)):
        key = {"part": "scaling", "depth": depth, "prompt": i, "ns": ns, "kernel": kernel, "reps": reps}
        value = _logged(
            log,
            key,
            lambda: time_passes(model, ids, depth, ns, [kernel], reps=reps, warmup=warmup, flush=flush),
            on_point,
        )
        rows.append(value[str(kernel)])
    samples = {n: np.array([r[str(n)] for r in rows]) for n in ns}
    return ScalingCurve(depth=depth, kernel=str(kernel), samples=samples)
