"""Timing verify passes: τ_p(n) of whole-model passes (cost-model paper, eq. (5)), the expert
operation timed between them, and the verify-batch scaling curve. Their statistics live in
`verify_times`.

τ_p(n) is the time of one forward pass of n tokens with kernel p while the KV cache holds a prompt
of depth d (cost-model paper, eq. (5); Sec. 4 and App. D). Each prompt is prefilled once per depth;
then every (n, kernel) pass is timed as `extend(n tokens)` with the cache cut back before each
call, outside the timed interval. The n tokens are the target's greedy continuation of the prompt,
the text a speculative step verifies (the oracle sweep's drafts are those very tokens), and
repetition r verifies the window starting `stride`·r tokens into it, over a cache holding the
prompt and the continuation before the window: the passes, the operation timed between them and
the sweep then verify the same text (Sec. 4: "the recorded routing of the verified continuations").
Kernels alternate call by call and repetitions run in rounds over every n, so slow drift of the
machine falls on all points alike.

The verify-batch scaling curve (engine paper, Sec. 6.5 and 7) is τ(n)/τ(1) for n = 1..16 with one
kernel: how far "parallel" verification is from costing one decode step.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import torch

from moespec.pointlog import OnPoint, logged_point
from moespec.backends.protocol import as_spec_model
from moespec.bench.prefilled import avoid_slot_prefill, switch_kernel
from moespec.texts import PREFILL_CHUNK, PROMPT_COUNT, STRIDE, continuation_length, prompt_ids
from moespec.bench.verified_text import verified_texts
from moespec.bench.timing import CacheFlusher, ModuleClock, Timing, measure
from moespec.costmodel.verify_times import ScalingCurve, VerifyTimes
from moespec.kernel_names import DEDUP, ENGINE_KERNELS, TO_COST
from moespec.moe.experts import find_experts


def time_passes(
    model, ids: Sequence[int], depth: int, ns: Iterable[int], kernels: Sequence[str | None], *, reps: int = 5,
    warmup: int = 1, flush: Callable[[], None] | None = None,
    between: Callable[[int, str, int], list[float]] | None = None,
    outside: Callable[..., Mapping[str, float]] | None = None, stride: int = 0,
) -> dict[str, dict[str, list[float]]]:
    """Seconds of `reps` passes of n tokens on one prompt prefilled to `depth`, per kernel and n.

    `ids` holds the prompt: its first `depth` tokens fill the cache once, and repetition r's pass of
    n tokens is ids[s : s + n] with s = depth + stride·r, the cache holding ids[:s] (extended by the
    stride between rounds, outside the timing; warm-up passes read s = depth). Kernels are switched
    with `model.set_experts_implementation` (None keeps the model's current one) and alternate call
    by call; repetitions run in rounds over every n, so a shared machine's drift falls on all pass
    sizes alike (timed n by n, one n could land on a slow minute and the verify times would not even
    grow with n). Returns {kernel: {str(n): [R]}}, keyed as JSON keeps it (a fresh result and one read
    back from a point log look alike).

    between(n, kernel, start): called after each timed pass (and after each warm-up pass, its result
    dropped) with the pass's n, kernel and window start s - depth; what it returns is kept under
    "ops" as {kernel: {str(n): [R] results}}. `run_verify` times the expert operation on the pass's
    own window there, so that operation and pass share the machine's moment.

    outside(n, depth, warmup=): {term: seconds} of the pass's terms outside the expert operation
    (`ggml_outside.OutsideOfPass`), called after `between` on the even repetitions only (the half
    `predict` reads; warm-ups: warmup=1, dropped), kept under "outside" as {term: {str(n): [ceil(R/2)]}}.

    "inside" ({kernel: {str(n): [R]}}, where the model has experts modules): the seconds each timed
    pass spent inside its experts modules, summed over the layers (`ModuleClock`), so the pass's
    time outside the expert operation is its time minus these, read from the pass itself.
    """
    ns = _checked_pass_sizes(ns, len(ids), depth, reps, stride)
    ids = torch.as_tensor(list(ids), dtype=torch.int64)  # [len(ids)]
    cached = _prefilled(model, ids, depth)
    names = [str(k) for k in kernels]
    out, ops, inside = ({name: {str(n): [] for n in ns} for name in names} for _ in range(3))
    terms: dict[str, dict[str, list[float]]] = {}
    experts = find_experts(model) if isinstance(model, torch.nn.Module) else []
    clock = ModuleClock(experts) if experts else None
    with clock if clock is not None else contextlib.nullcontext():
        _warm_up(model, cached, ids, depth, ns, kernels, flush=flush, warmup=warmup, between=between,
                 outside=outside)
        base = depth  # the cache's length before each pass
        for rep in range(reps):  # rounds over every n, in an order that rotates by one each round
            base = _window_at(cached, ids, base, depth + stride * rep)
            for n in ns[rep % len(ns):] + ns[: rep % len(ns)]:
                for kernel, name in zip(kernels, names):
                    seconds, spent = _time_pass(model, cached, ids[base : base + n], base, kernel, flush, clock)
                    out[name][str(n)].append(seconds)
                    if clock is not None:
                        inside[name][str(n)].append(spent)
                    if between is not None:
                        ops[name][str(n)].append(between(n, name, base - depth))
                    for term, seconds in (outside(n, depth) if outside is not None and rep % 2 == 0 else {}).items():
                        terms.setdefault(term, {str(m): [] for m in ns})[str(n)].append(seconds)
    cached.truncate(depth)
    parts = {"ops": ops if between is not None else None, "inside": inside if clock is not None else None,
             "outside": terms if outside is not None else None}
    return {**out, **{k: v for k, v in parts.items() if v is not None}}


def _warm_up(model, cached, ids: torch.Tensor, depth: int, ns: Sequence[int], kernels: Sequence[str | None], *,
             flush: Callable[[], None] | None, warmup: int,
             between: Callable[[int, str, int], list[float]] | None,
             outside: Callable[..., Mapping[str, float]] | None = None) -> None:
    """`warmup` untimed passes of every n with every kernel at the first window, each followed by
    `between` and `outside` (their results dropped), as the timed passes will be."""
    for n in ns:
        for kernel in kernels:
            switch_kernel(model, kernel)
            _timed_extend(cached, ids[depth : depth + n], depth, flush, warmup=warmup)
            if between is not None and warmup:
                between(n, str(kernel), 0)
            if outside is not None and warmup:
                outside(n, depth, warmup=1)


def _checked_pass_sizes(ns: Iterable[int], length: int, depth: int, reps: int, stride: int) -> list[int]:
    """The pass sizes, sorted, after checking them, the stride, and that ids of `length` tokens hold
    the depth and every repetition's window."""
    ns = sorted(set(int(n) for n in ns))
    if not ns or ns[0] < 1:
        raise ValueError(f"pass sizes must be >= 1, got {ns}")
    if stride < 0:
        raise ValueError(f"stride must be >= 0 tokens, got {stride}")
    need = depth + continuation_length(reps, ns[-1], stride)
    if depth < 1 or length < need:
        raise ValueError(f"ids of {length} tokens cannot hold depth {depth} plus {reps} passes of up to "
                         f"{ns[-1]} tokens {stride} apart ({need} tokens)")
    return ns


def _prefilled(model, ids: torch.Tensor, depth: int):
    """The model's cache, emptied and filled with ids[:depth] in the prefill's chunks."""
    avoid_slot_prefill(model)
    cached = as_spec_model(model)
    cached.reset()  # a llama.cpp model is its own cache: start it empty, as a fresh CachedModel is
    for start in range(0, depth, PREFILL_CHUNK):  # chunks bound the [chunk, V] logits of a subword vocabulary
        cached.extend(ids[start : min(start + PREFILL_CHUNK, depth)], outputs=1)  # untimed: one row
    return cached


def _window_at(cached, ids: torch.Tensor, base: int, start: int) -> int:
    """Cut the cache back to `base` and extend it, untimed, with the continuation up to `start`,
    where the next round's window begins; returns `start`, the cache's length before its passes."""
    cached.truncate(base)
    if cached.length < start:
        cached.extend(ids[cached.length : start], outputs=1)
    return start


def _timed_extend(cached, tokens: torch.Tensor, base: int, flush: Callable[[], None] | None,
                  warmup: int = 0) -> Timing:
    """One timed pass of `tokens` (after `warmup` untimed ones), the cache cut back to `base` and
    flushed before each call, outside the timed interval."""
    def cut_back() -> None:
        cached.truncate(base)
        if flush is not None:
            flush()

    return measure(lambda: cached.extend(tokens), reps=1, warmup=warmup, flush=cut_back)


def _time_pass(model, cached, tokens: torch.Tensor, base: int, kernel: str | None,
               flush: Callable[[], None] | None, clock: ModuleClock | None) -> tuple[float, float | None]:
    """(seconds of one pass of `tokens` with `kernel`, seconds of it inside the experts modules, or
    None without a clock)."""
    switch_kernel(model, kernel)
    if clock is not None:
        clock.take()  # drop what ran since the last timed pass
    seconds = _timed_extend(cached, tokens, base, flush).samples[0]
    return seconds, clock.take() if clock is not None else None


def verified_routing(model, tokenizer, *, depths: Sequence[int] = (512,), prompts: int = PROMPT_COUNT,
                     n_max: int = 9, length: int | None = None, model_spec: str = "", record=None):
    """The routing of the text the verify passes verify: one trace document per (depth, prompt).

    Document "d{depth}/p{i}" holds the routing [length, L, m] of the target's greedy continuation of
    prompt i cut to `depth` (default length n_max), recorded after the prompt in the prefill's
    chunks, so each token sees the same context: `run_verify`'s repetition r passes its rows
    [stride·r, stride·r + n). The measured-time version of the prediction times the expert operation
    on these windows (cost-model paper, Sec. 4: "the recorded routing of the verified continuations").
    record(documents, chunk, corpus) -> RoutingTrace records the routing; default: transformers'
    (`moe.routing.record` on `model`); a GGUF file's comes from llama.cpp (`chain.llama_inputs.gguf_routing`).
    """
    from moespec.moe.traces import RoutingTrace

    if record is None:
        from moespec.moe.routing import record as on_torch

        record = lambda docs, chunk, corpus: on_torch(model, docs, chunk=chunk, model_spec=model_spec,  # noqa: E731
                                                      corpus=corpus)

    if n_max < 1:
        raise ValueError(f"n_max={n_max} must be >= 1 (the largest verify pass size)")
    length = n_max if length is None else int(length)
    if length < n_max:
        raise ValueError(f"length={length} must be >= n_max={n_max}, the largest verify pass")
    docs = [(f"d{d}/p{i}", ids) for d in depths
            for i, ids in enumerate(verified_texts(model, tokenizer, d, prompts, length))]
    full = record(docs, PREFILL_CHUNK, ["moespec:data/prompts, greedy continuations"])
    return RoutingTrace([doc[-length:] for doc in full.documents], full.num_experts, full.expert_bytes,
                        full.doc_ids, full.model, full.dtype, full.corpus, full.layers,
                        model_fingerprint=full.model_fingerprint)


def verified_depth(doc_id: str) -> int | None:
    """The depth d of a `verified_routing` document id "d{d}/p{i}", else None."""
    head = str(doc_id).split("/", 1)[0]
    return int(head[1:]) if head.startswith("d") and head[1:].isdigit() else None


def default_flusher(enabled: bool, model=None) -> Callable[[], None] | None:
    """The cache flush before every timed pass (the 256 MiB flush App. D runs before the expert
    operation's timings), or None when `enabled` is False or the model's weights fit in the
    last-level cache (`fits_in_cache`): decoding then finds them there, and a pass timed cold would
    measure a state no decoding step sees."""
    if not enabled or fits_in_cache(model):
        return None
    return CacheFlusher()


def weight_bytes(model) -> int | None:
    """The bytes of the model's weights: a GGUF file's size, a torch module's parameters; None if unknown."""
    path = getattr(model, "path", None)
    if path is not None and str(path).endswith(".gguf"):
        return Path(path).stat().st_size
    parameters = getattr(model, "parameters", None)
    if callable(parameters):
        return sum(p.numel() * p.element_size() for p in parameters())
    return None


def fits_in_cache(model) -> bool:
    """Whether the model's weights fit in half the last-level cache the machine reports (half: the
    cache is shared with the KV cache, the activations and, on a shared machine, other processes)."""
    from moespec.device import last_level_cache_bytes

    size, llc = (weight_bytes(model) if model is not None else None), last_level_cache_bytes()
    return size is not None and llc is not None and size <= llc // 2


def verify_points(depths: Sequence[int], prompts: int) -> int:
    """How many points `run_verify` logs: one per (depth, prompt)."""
    return len(depths) * prompts


def run_verify(
    model,
    tokenizer,
    *,
    depths: Sequence[int] = (512, 4096),
    ns: Sequence[int] = range(1, 10),
    kernels: Sequence[str] = ENGINE_KERNELS,
    prompts: int = PROMPT_COUNT,
    reps: int = 5,
    warmup: int = 1,
    flush: Callable[[], None] | None = None,
    log=None,
    on_point: OnPoint | None = None,
    windows=None,
    op_layers: Sequence[int] = (),
    stride: int = STRIDE,
    outside: bool = False,
) -> list[VerifyTimes]:
    """τ_p(n) at each depth on `prompts` built-in prompts; one logged point per (depth, prompt).

    The passes verify the target's greedy continuation of each prompt cut to the depth, repetition
    r the window `stride`·r tokens into it (`time_passes`); the continuation is decoded before the
    timing. `log` is a `moespec.pointlog.PointLog`: finished points are read back instead of measured.
    windows: the `verified_routing` trace of these passes, and op_layers: MoE layers; given both,
    the expert operation of each of those layers is timed on each pass's own window right after
    the pass, with the same kernel (`VerifyTimes.ops`), so that the measured-time version's saving
    and the measured one share the machine's moments (a block timed minutes apart missed the
    measured saving by up to 14-21% of τ_dedup, one timed between the passes by 4-8%:
    benchmarks/interleaved_saving.py).
    outside: on a llama.cpp target, time D(n) and R_d(n) right after each pass (`ggml_outside`;
    `VerifyTimes.outside`); a torch pass splits itself at its experts modules instead ("inside").
    """
    ns = sorted(set(int(n) for n in ns))
    if outside and isinstance(model, torch.nn.Module):
        raise ValueError("outside=True times a llama.cpp pass's dense products and rest beside it; a torch pass is "
                         "split at its experts modules by itself (\"inside\"): drop outside")
    op_layers = [int(l) for l in op_layers] if windows is not None else []
    # only passes through experts modules record "inside" (`time_passes`)
    moe = isinstance(model, torch.nn.Module) and bool(find_experts(model))
    length = continuation_length(reps, ns[-1], stride)
    if op_layers:
        _check_continuations(windows, length, reps=reps, stride=stride, n_max=ns[-1])
    with _outside_timer(model, outside, ns[-1], flush) as timer, \
            _operation_timers(model, windows, op_layers, ns, flush) as op_timer:
        return [_verify_at(model, tokenizer, depth, ns=ns, kernels=kernels, prompts=prompts, reps=reps, warmup=warmup,
                           flush=flush, log=log, on_point=on_point, op_timer=op_timer, op_layers=op_layers,
                           stride=stride, length=length, moe=moe, timer=timer)
                for depth in depths]


@contextlib.contextmanager
def _outside_timer(model, outside: bool, n_max: int, flush):
    """The llama.cpp target's `OutsideOfPass` when `outside`, else None; closed on exit."""
    if not outside:
        yield None
        return
    from moespec.bench.ggml_outside import OutsideOfPass

    with OutsideOfPass(model.path, threads=model.threads, max_n=n_max, flush=flush) as timer:
        yield timer


@contextlib.contextmanager
def _operation_timers(model, windows, op_layers: Sequence[int], ns: Sequence[int], flush):
    """doc_id -> the `between` of that verified continuation's passes (None without op_layers): the
    torch module's experts (`operation_timer`), or llama.cpp's on the file (`ggml_expert_op.WindowTimer`)."""
    if not op_layers:
        yield None
        return
    if isinstance(model, torch.nn.Module):
        yield lambda doc_id: operation_timer(model, windows, doc_id, op_layers, ns, flush)
        return
    from moespec.bench.ggml_expert_op import WindowTimer

    with WindowTimer(model.path, op_layers, threads=model.threads, flush=flush) as timer:
        yield lambda doc_id: timer.for_document(_document(windows, doc_id))


def _document(windows, doc_id: str) -> np.ndarray:
    """The verified continuation `doc_id`'s routing [T, L, m], else a ValueError naming the fix."""
    if doc_id not in windows.doc_ids:
        raise ValueError(f"the verified windows have no document {doc_id!r} (they have {list(windows.doc_ids)}); "
                         "record them with verify.verified_routing at the same depths and prompts")
    return windows.documents[list(windows.doc_ids).index(doc_id)]


def _verify_at(model, tokenizer, depth: int, *, ns, kernels, prompts, reps, warmup, flush, log, on_point, op_timer,
               op_layers, stride, length, moe, timer) -> VerifyTimes:
    """One depth of `run_verify`: a logged point per prompt, stacked."""
    per_prompt = []
    texts: list[list[int]] = []
    for i in range(prompts):
        key = {"part": "verify", "depth": depth, "prompt": i, "ns": ns, "kernels": list(kernels), "reps": reps,
               "text": "greedy continuation", "stride": stride}
        between = None
        if op_layers:
            key["op_layers"] = op_layers
            between = op_timer(f"d{depth}/p{i}")
        if timer is not None:
            key["outside"] = "dense+rest"

        def compute(i=i, between=between):
            if not texts:  # decoded once per depth, only when some point of it is measured
                texts.extend(verified_texts(model, tokenizer, depth, prompts, length))
            return time_passes(model, texts[i], depth, ns, kernels, reps=reps, warmup=warmup, flush=flush,
                               between=between, outside=timer, stride=stride)

        per_prompt.append(logged_point(log, key, compute, on_point))
    return _stacked(depth, per_prompt, ns, kernels, op_layers=op_layers, moe=moe, outside=timer is not None)


def _check_continuations(windows, length: int, *, reps: int, stride: int, n_max: int) -> None:
    """The verified continuations hold the `length` tokens the passes read, else a ValueError."""
    short = [i for i, doc in zip(windows.doc_ids, windows.documents) if len(doc) < length]
    if short:
        raise ValueError(f"the verified continuations {short} are shorter than the {length} tokens that {reps} "
                         f"repetitions {stride} apart with passes up to {n_max} read; record them with "
                         f"verified_routing(length={length}) "
                         f"(`moespec trace-verified --reps {reps} --stride {stride}`)")


def _stacked(depth: int, per_prompt: list[dict], ns: Sequence[int], kernels: Sequence[str], *,
             op_layers: Sequence[int], moe: bool, outside: bool = False) -> VerifyTimes:
    """One depth's `time_passes` results of every prompt as VerifyTimes: arrays [P, R] per kernel
    (per term, for `outside`) and n."""
    def stack(part, keys=kernels):  # {key: {n: [P, R]}} of one part of every prompt's result
        return {str(p): {n: np.array([part(pp)[str(p)][str(n)] for pp in per_prompt]) for n in ns} for p in keys}

    return VerifyTimes(depth=depth, samples=stack(lambda pp: pp),
                       ops=stack(lambda pp: pp["ops"]) if op_layers else None, op_layers=tuple(op_layers),
                       inside=stack(lambda pp: pp["inside"]) if moe else None,
                       outside=stack(lambda pp: pp["outside"], list(per_prompt[0]["outside"])) if outside else None)


def operation_timer(model, windows, doc_id: str, layers: Sequence[int], ns: Sequence[int],
                     flush: Callable[[], None] | None) -> Callable[[int, str], list[float]]:
    """f(n, kernel, start) -> [L] seconds: each layer's expert operation with `kernel` on rows
    [start, start + n) of the verified continuation `doc_id` (the window of the pass just timed),
    one timed call each, flushed before."""
    from moespec.bench import expert_op

    doc = _document(windows, doc_id)  # [T, L, m]
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
        fn = expert_op.kernel_fn(TO_COST[kernel], experts[layers[0]])
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
        value = logged_point(
            log,
            key,
            lambda: time_passes(model, ids, depth, ns, [kernel], reps=reps, warmup=warmup, flush=flush),
            on_point,
        )
        rows.append(value[str(kernel)])
    samples = {n: np.array([r[str(n)] for r in rows]) for n in ns}
    return ScalingCurve(depth=depth, kernel=str(kernel), samples=samples)
