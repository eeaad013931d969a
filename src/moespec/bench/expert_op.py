"""The one-layer expert-operation benchmark (cost-model paper, Sec. 2 and App. E).

Times one MoE layer's expert operation alone, with no other part of the model, for each kernel:
moespec's per-slot ("slot") and deduplicating ("dedup") kernels (compiled; "torch_slot" and
"torch_dedup" are the torch ones) and, for comparison, any
transformers experts implementation by name ("eager", "grouped_mm", "batched_mm"). Each pass gets
its expert ids from one of two sources:

- chosen ids: at each pass size n, a distinct-expert count U from m (every token repeats the first
  token's experts) to min(N, nm) (no repeats), each token's m experts distinct, the repeats placed
  either in the same slot position as their first read ("same") or at random ("shuffled");
- recorded ids: windows of n consecutive tokens of a routing trace.

Protocol (App. D/E): warm-up; a cache flush larger than the LLC before every timed call; device
synchronize; median and IQR over repetitions, every raw timing kept (`moespec.bench.timing`).
Repetitions run in rounds over all points (each round in a fresh seeded order), so drift of a busy
machine falls on every point alike. Every sample goes to a `PointLog` as it is taken and is read
back on a rerun, so an interrupted run resumes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from moespec.pointlog import PointLog
from moespec.bench.timing import Timing, measure
from moespec.moe import compiled, kernels
from moespec.kernel_names import COST_DEDUP, COST_SLOT, requests_per_slot
from moespec.moe.experts import expert_bytes, find_experts

# T = n tokens of a pass, m = experts per token, H = hidden size, N = experts of the layer
PLACEMENTS = ("same", "shuffled")
# "slot" and "dedup" are the compiled kernels (the torch ones where they cannot build), as the engine runs them
MOESPEC_KERNELS = {COST_SLOT: compiled.compiled_slot, COST_DEDUP: compiled.compiled_dedup,
                   "torch_slot": kernels.per_slot, "torch_dedup": kernels.dedup}
TRANSFORMERS_KERNELS = ("eager", "grouped_mm", "batched_mm")


def kernel_fn(name: str, experts: torch.nn.Module) -> Callable:
    """The experts function of kernel `name`: f(experts, hidden [T, H], index [T, m], weights [T, m])."""
    if name in MOESPEC_KERNELS:
        return MOESPEC_KERNELS[name]
    if name in TRANSFORMERS_KERNELS:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

        original = getattr(type(experts).forward, "__wrapped__", type(experts).forward)
        return original if name == "eager" else ALL_EXPERTS_FUNCTIONS.get_interface(name, original)
    raise ValueError(f"unknown kernel {name!r}; use one of {sorted(MOESPEC_KERNELS) + list(TRANSFORMERS_KERNELS)}")


def u_grid(n: int, m: int, N: int, points: int | None = None) -> list[int]:
    """Distinct-expert counts U at pass size n: all of m..min(N, nm), or `points` evenly spaced ones."""
    hi = min(N, n * m)
    if points is None or hi - m + 1 <= points:
        return list(range(m, hi + 1))
    if points < 2:
        raise ValueError(f"u_points={points} must be >= 2 to span U from m to min(N, nm)")
    return sorted({int(round(u)) for u in np.linspace(m, hi, points)})


def chosen_ids(n: int, U: int, m: int, N: int, placement: str, rng: np.random.Generator) -> np.ndarray:
    """Expert ids [n, m] of a pass naming exactly U distinct experts, each row m distinct (Sec. 2).

    Token 0 reads m experts; the U - m new experts spread as evenly as possible over tokens 1..n-1;
    every other slot repeats an expert read earlier in the pass. "same": a repeat sits in the slot
    position where token 0 read that expert. "shuffled": repeats are drawn from every expert read so
    far and each row's slots are permuted.
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; use one of {PLACEMENTS}")
    if not m <= U <= min(N, n * m):
        raise ValueError(f"U={U} outside [m, min(N, nm)] = [{m}, {min(N, n * m)}] for n={n}, m={m}, N={N}")
    experts = rng.permutation(N)[:U]
    new = np.zeros(n, dtype=int)
    if n > 1:
        new[1:] = (U - m) // (n - 1)
        new[1 : 1 + (U - m) % (n - 1)] += 1
    ids = np.empty((n, m), dtype=np.int64)
    ids[0] = experts[:m]
    seen = m
    for t in range(1, n):
        fresh = experts[seen : seen + new[t]]
        if placement == "same":
            ids[t] = ids[0]
            ids[t, m - new[t] :] = fresh
        else:
            repeats = rng.choice(experts[:seen], size=m - new[t], replace=False)
            ids[t] = rng.permutation(np.concatenate([repeats, fresh]))
        seen += new[t]
    assert len(np.unique(ids)) == U and all(len(set(row)) == m for row in ids.tolist())
    return ids


@dataclass(frozen=True)
class Pass:
    """One pass of the benchmark: its expert ids and where they came from."""

    source: str  # "chosen", "recorded" or "verified"
    n: int
    placement: str  # "same" / "shuffled" for chosen ids, "window" for recorded ones, the document for verified
    index: int  # the draw at this (n, U, placement), or the window's number at this n
    ids: tuple  # [n, m] expert ids as nested tuples

    @property
    def U(self) -> int:
        return len({e for row in self.ids for e in row})

    @property
    def key(self) -> tuple:
        return (self.source, self.n, self.U, self.placement, self.index)


def chosen_passes(
    n_values: Iterable[int], m: int, N: int, *, u_points: int | None = None, seed: int = 0
) -> list[Pass]:
    """Chosen-id passes at each n: U over `u_grid`, both placements (one pass where they coincide)."""
    rng = np.random.default_rng(seed)
    passes = []
    for n in n_values:
        for U in u_grid(n, m, N, u_points):
            placements = ("same",) if n == 1 or U == n * m else PLACEMENTS
            for placement in placements:
                ids = chosen_ids(n, U, m, N, placement, rng)
                passes.append(Pass("chosen", n, placement, 0, tuple(map(tuple, ids.tolist()))))
    return passes


def recorded_passes(
    documents: Sequence[np.ndarray], layer: int, n_values: Iterable[int], *, windows: int = 8, seed: int = 0
) -> list[Pass]:
    """Recorded-id passes: `windows` windows of n consecutive tokens per n from the trace's layer.

    documents: the trace's [T, L, m] arrays; layer: the MoE-layer column. Window starts are drawn
    once (seeded, uniform over every token that starts a window of the largest n) and shared by all n.
    """
    n_values = list(n_values)
    n_max = max(n_values)
    starts = [(d, t) for d, doc in enumerate(documents) for t in range(doc.shape[0] - n_max + 1)]
    if not starts:
        longest = max(doc.shape[0] for doc in documents)
        raise ValueError(f"no trace document has {n_max} tokens (longest: {longest}); trace longer documents")
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(starts), size=min(windows, len(starts)), replace=False)
    passes = []
    for n in n_values:
        for w, i in enumerate(sorted(picks)):
            d, t = starts[i]
            ids = np.asarray(documents[d][t : t + n, layer], dtype=np.int64)
            passes.append(Pass("recorded", n, "window", w, tuple(map(tuple, ids.tolist()))))
    return passes


def verified_passes(trace, layer: int, n_values: Iterable[int]) -> list[Pass]:
    """The verify passes' own windows: for each document of a `verify.verified_routing` trace and each
    n, its first n tokens of `layer`, labelled with the document id ("d{depth}/p{i}")."""
    passes = []
    for n in n_values:
        for w, (doc_id, doc) in enumerate(zip(trace.doc_ids, trace.documents)):
            if doc.shape[0] < n:
                raise ValueError(f"verified window {doc_id!r} has {doc.shape[0]} tokens, fewer than n = {n}; "
                                 "record it with n_max >= the largest pass size")
            ids = np.asarray(doc[:n, layer], dtype=np.int64)
            passes.append(Pass("verified", n, str(doc_id), w, tuple(map(tuple, ids.tolist()))))
    return passes


def pass_inputs(p: Pass, hidden_size: int, dtype: torch.dtype, device, seed: int = 0):
    """(hidden [n, H], index [n, m], weights [n, m]) for a pass: seeded activations, softmax weights."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + p.n)
    hidden = torch.randn(p.n, hidden_size, generator=g).to(dtype=dtype, device=device)
    index = torch.tensor(p.ids, dtype=torch.long, device=device)
    weights = torch.softmax(torch.randn(index.shape, generator=g), dim=-1).to(dtype=dtype, device=device)
    return hidden, index, weights


def requested_bytes(kernel: str, p: Pass, b: int) -> int:
    """Expert bytes kernel `kernel` requests on pass p: nmb (per-slot) or Ub (deduplicating)."""
    m = len(p.ids[0])
    return p.n * m * b if requests_per_slot(kernel) else p.U * b


def sample_key(layer: int, kernel: str, p: Pass, rep: int) -> str:
    """Log key of repetition `rep` of a point: the log keeps every sample as it is taken."""
    return json.dumps([layer, kernel, *p.key, "rep", rep])


def run(
    experts: torch.nn.Module,
    passes: Sequence[Pass],
    kernels_: Sequence[str],
    *,
    layer: int,
    reps: int,
    warmup: int = 1,
    flush: Callable[[], None] | None = None,
    log: PointLog | None = None,
    on_point: Callable[[float], None] | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Time every (pass, kernel) of one layer; returns one record per point, in the order given.

    Repetitions run in rounds: each round times every point once, in a fresh seeded order, so that
    a point's `reps` samples spread over the whole run. On a shared machine the memory bandwidth
    drifts by several percent over minutes; timing a point's repetitions back to back would give
    each point its own moment of that drift, an error no fit can follow (it raised eps by about a
    third on this project's 2-core machine). Each sample is appended to `log` as it is taken and
    read back on a rerun, so an interrupted run resumes mid-round. `on_point(bytes)` is called after
    each sample with the point's requested bytes over `reps` (a progress bar weighted by work).
    """
    if reps < 1:
        raise ValueError(f"reps={reps} must be >= 1")
    points = [(p, k) for p in passes for k in kernels_]
    b, device, calls = _calls(experts, points, seed)
    samples: dict[int, dict[int, float]] = {i: {} for i in range(len(points))}
    if log is not None:
        for i, (p, k) in enumerate(points):
            for rep in range(reps):
                key = sample_key(layer, k, p, rep)
                if log.has(key):
                    samples[i][rep] = float(log.get(key))
                    if on_point is not None:
                        on_point(requested_bytes(k, p, b) / reps)

    call = calls.__getitem__
    order_rng = np.random.default_rng(seed + 104729 * (layer + 1))
    with torch.inference_mode():
        todo = [i for i in range(len(points)) if len(samples[i]) < reps]
        for i in todo:  # warm-up: first calls allocate and fault pages in
            for _ in range(warmup):
                call(i)()
        for rep in range(reps):
            for i in order_rng.permutation(len(points)).tolist():
                if rep in samples[i]:
                    continue
                p, k = points[i]
                (t,) = measure(call(i), reps=1, warmup=0, flush=flush, device=device).samples
                samples[i][rep] = t
                if log is not None:
                    log.append(sample_key(layer, k, p, rep), t)
                if on_point is not None:
                    on_point(requested_bytes(k, p, b) / reps)
    return [point_record(layer, k, p, b, Timing(tuple(samples[i][r] for r in range(reps))))
            for i, (p, k) in enumerate(points)]


def _calls(experts: Any, points: Sequence[tuple[Pass, str]], seed: int) -> tuple[int, Any, list[Callable]]:
    """(expert bytes b, device, one zero-argument call per point) for a transformers experts module,
    or for an operation of another engine (`bench.ggml_expert_op.ExpertLayer`: llama.cpp's own
    ggml kernels, "slot" as n one-token products, "dedup" as its grouped `mul_mat_id`)."""
    if hasattr(experts, "prepare"):
        return experts.expert_bytes, None, [experts.prepare(np.asarray(p.ids), grouped=k == COST_DEDUP)
                                            for p, k in points]
    params = next(experts.parameters())
    dtype, device = params.dtype, params.device
    H = params.shape[-1] if not getattr(experts, "is_transposed", False) else params.shape[1]
    fns = {k: kernel_fn(k, experts) for k in {k for _, k in points}}
    inputs = {p.key: pass_inputs(p, H, dtype, device, seed) for p, _ in points}

    def call(p: Pass, k: str) -> Callable[[], Any]:
        hidden, index, weights = inputs[p.key]
        fn = fns[k]
        return lambda: fn(experts, hidden, index, weights)

    return expert_bytes(experts), device, [call(p, k) for p, k in points]


def point_record(layer: int, kernel: str, p: Pass, b: int, timing: Timing) -> dict[str, Any]:
    """What the artifact keeps of one timed point: the pass, its bytes and every raw timing."""
    return {
        "layer": layer,
        "kernel": kernel,
        "source": p.source,
        "n": p.n,
        "m": len(p.ids[0]),
        "U": p.U,
        "placement": p.placement,
        "index": p.index,
        "ids": [list(row) for row in p.ids],
        "b": b,
        "bytes": requested_bytes(kernel, p, b),
        "timing": timing.to_dict(),
    }


def layer_experts(model: torch.nn.Module, layer: int) -> torch.nn.Module:
    """The experts module of MoE layer `layer` (an index into the model's MoE layers)."""
    found = find_experts(model)
    if not found:
        raise ValueError(f"{type(model).__name__} has no transformers experts module; give an MoE model")
    if not -len(found) <= layer < len(found):
        raise ValueError(f"layer {layer} out of range: the model has {len(found)} MoE layers")
    return found[layer]


def resolve_layers(layers: Iterable[int | str], num_layers: int) -> list[int]:
    """MoE-layer indices from ints and "mid" (= L // 2), negatives from the end, duplicates dropped."""
    out = []
    for spec in layers:
        if spec == "mid":
            index = num_layers // 2
        else:
            try:
                index = int(spec)
            except (TypeError, ValueError):
                raise ValueError(f"layer {spec!r} is neither an int nor 'mid'") from None
        if not -num_layers <= index < num_layers:
            raise ValueError(f"layer {spec!r} out of range for {num_layers} MoE layers")
        index %= num_layers
        if index not in out:
            out.append(index)
    return out


# Per-expert checkpoint names of the gate, up and down projections (HF Mixtral uses w1/w3/w2).
_PER_EXPERT_NAMES = {"gate": ("gate_proj", "w1"), "up": ("up_proj", "w3"), "down": ("down_proj", "w2")}


def _weight_map(path) -> dict[str, str]:
    """Tensor name -> shard file of a safetensors checkpoint folder (sharded or single-file)."""
    from pathlib import Path

    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.exists():
        return {k: str(path / v) for k, v in json.loads(index.read_text())["weight_map"].items()}
    single = path / "model.safetensors"
    if single.exists():
        from safetensors import safe_open

        with safe_open(str(single), framework="pt") as f:
            return {k: str(single) for k in f.keys()}
    raise ValueError(f"{path} has neither model.safetensors.index.json nor model.safetensors; save it with safetensors")


def _read(weight_map: dict[str, str], names: Sequence[str]) -> list[torch.Tensor]:
    """Read only the named tensors, opening each shard once."""
    from safetensors import safe_open

    by_file: dict[str, list[str]] = {}
    for name in names:
        by_file.setdefault(weight_map[name], []).append(name)
    out = {}
    for file, keys in by_file.items():
        with safe_open(file, framework="pt") as f:
            for k in keys:
                out[k] = f.get_tensor(k)
    return [out[k] for k in names]


def _checkpoint_tensor(weight_map: dict[str, str], prefix: str, param: str, num_experts: int) -> torch.Tensor:
    """Parameter `param` of the experts at `prefix`, fused as stored or stacked from per-expert tensors."""
    prefixes = [prefix, prefix.replace(".mlp.", ".block_sparse_moe.")]
    for pre in prefixes:
        if f"{pre}.{param}" in weight_map:
            return _read(weight_map, [f"{pre}.{param}"])[0]
    parts = {"gate_up_proj": ("gate", "up"), "down_proj": ("down",), "up_proj": ("up",)}.get(param)
    for pre in prefixes if parts else ():
        for names in zip(*(_PER_EXPERT_NAMES[part] for part in parts)):
            keys = [[f"{pre}.{e}.{name}.weight" for name in names] for e in range(num_experts)]
            if all(k in weight_map for row in keys for k in row):
                tensors = _read(weight_map, [k for row in keys for k in row])
                rows = [torch.cat(tensors[i * len(names) : (i + 1) * len(names)], dim=0) for i in range(num_experts)]
                return torch.stack(rows)
    raise ValueError(
        f"checkpoint has no tensor for {prefix}.{param}, fused or per expert (tried {prefixes}); "
        "this architecture's checkpoint layout is not supported for one-layer loading"
    )


def load_layer_experts(path, layer: int | str, *, dtype=None, device=None) -> torch.nn.Module:
    """One MoE layer's experts module from a local checkpoint, without loading the rest of the model.

    The model is built on the meta device from its config (no memory), the experts module of MoE
    layer `layer` is given real storage, and only that layer's tensors are read from the
    safetensors shards (through the index json), so a model larger than memory can be timed. The
    weights keep their stored dtype unless `dtype` is given.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from moespec.device import resolve_device, resolve_dtype

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    named = [(name, mod) for name, mod in model.named_modules() if any(mod is e for e in find_experts(model))]
    if not named:
        raise ValueError(f"{path}: {type(model).__name__} has no transformers experts module")
    (index,) = resolve_layers([layer], len(named))
    prefix, experts = named[index]
    experts.to_empty(device=resolve_device(device or "cpu"))
    weight_map = _weight_map(path)
    num_experts = next(experts.parameters()).shape[0]
    for pname, param in list(experts.named_parameters(recurse=False)):
        tensor = _checkpoint_tensor(weight_map, prefix, pname, num_experts)
        if tuple(tensor.shape) != tuple(param.shape):
            raise ValueError(f"{prefix}.{pname}: checkpoint shape {tuple(tensor.shape)} != model {tuple(param.shape)}")
        if dtype is not None:
            tensor = tensor.to(resolve_dtype(dtype))
        setattr(experts, pname, torch.nn.Parameter(tensor.to(param.device), requires_grad=False))
    experts.moespec_layer = index
    return experts.eval()
