"""Seeded runs of `generate` decoded side by side on torch models, for the gate's sampled legs.

Each run is an ordinary single-sequence `generate` call, in a thread of its own, on a `Lane`: a
`SpecModel` whose passes go to a `Passes` shared by the runs. When every run waits on a pass, one
batched forward per model serves them all (`Schedule`), so the weights are read once per step of all
the runs instead of once per step of each: 20 runs of SmolLM2-135M side by side on one CPU core took
a third to a fifth of the time of 20 runs one after another. The decode loop, the sampler and the draft
are generate's own; a run's logits differ from a lone call's by float rounding only (a batched
matrix product), so its tokens follow the same law. A fresh lane's prompt is prefilled alone (the
same pass as a lone call's), once per distinct prompt.

Layout: each run keeps its keys and values per layer in buffers of its own (its positions, no
padding); a pass stacks the waiting runs' caches right-aligned to the longest, appends each run's n
tokens right-aligned in N columns, and masks the padding out (attention follows the 2D mask, RoPE
the positions), so a pass serves exactly the runs that wait on it, however far out of step they are.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import torch
from transformers.cache_utils import DynamicLayer

from moespec.backends.protocol import GreedyByLogits, output_rows
from moespec.backends.torch_model import CachedModel
from moespec.engine.decode import generate


class RoomLayer(DynamicLayer):
    """A cache layer over stacked caches [B', kv heads, T + N, head dim] whose first T columns are
    held: the pass writes its N new columns into the room (`DynamicLayer` would copy the whole cache)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, held: int):
        super().__init__()
        self.lazy_initialization(keys, values)
        self.room, self.held = (keys, values), held
        self.keys, self.values = keys[:, :, :held], values[:, :, :held]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        n = key_states.shape[-2]
        for room, new in zip(self.room, (key_states, value_states), strict=True):
            room[:, :, self.held: self.held + n] = new
        self.held += n
        self.keys, self.values = (room[:, :, : self.held] for room in self.room)
        return self.keys, self.values


GQA_SWITCH = "TRANSFORMERS_SDPA_FORCE_GQA"  # transformers: sdpa's grouped-query attention under a mask too


class Passes:
    """The batched passes of one transformers causal LM for `rows` runs: each row's keys and values
    per layer in buffers of its own ([kv heads, room, head dim], its positions first), stacked for each
    pass."""

    def __init__(self, model, rows: int):
        self.model, self.rows = model, rows
        self.device = next(model.parameters()).device
        self.kv: list[list[torch.Tensor] | None] = [None] * rows  # per row: keys and values of each layer
        self.lengths = [0] * rows
        self.forward_s = 0.0

    def truncate(self, row: int, n: int) -> None:
        """Row `row` keeps its first n positions."""
        self.lengths[row] = min(self.lengths[row], n)

    @torch.inference_mode()
    def run(self, requests: dict[int, tuple[list[int], int]]) -> dict[int, torch.Tensor]:
        """{row: (tokens, rows of logits wanted)} -> {row: [rows, W] float32 logits of its last tokens}."""
        t0 = time.perf_counter()
        fresh = {r: q for r, q in requests.items() if not self.lengths[r]}
        out = self._prefill(fresh) if fresh else {}
        rest = {r: q for r, q in requests.items() if r not in fresh}
        if rest:
            out.update(self._step(rest))
        self.forward_s += time.perf_counter() - t0
        return out

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache, keep: int):
        # under a padding mask transformers would copy every key/value head once per query head
        # (`repeat_kv`); sdpa's own grouped-query attention computes the same attention without the copies
        old = os.environ.get(GQA_SWITCH)
        os.environ[GQA_SWITCH] = "1"
        try:
            return self.model(input_ids=ids.to(self.device), position_ids=positions.to(self.device),
                              attention_mask=None if mask is None else mask.to(self.device), cache=cache,
                              use_cache=True, logits_to_keep=keep).logits
        finally:
            if old is None:
                del os.environ[GQA_SWITCH]
            else:
                os.environ[GQA_SWITCH] = old

    def _prefill(self, fresh: dict[int, tuple[list[int], int]]) -> dict[int, torch.Tensor]:
        """Rows without positions: each distinct prompt in a pass of its own (a lone call's prefill),
        its keys and values shared by the rows that feed it."""
        from transformers import DynamicCache

        done, out = {}, {}
        for r, (ids, rows) in fresh.items():
            if tuple(ids) not in done:
                cache, n = DynamicCache(config=self.model.config), len(ids)
                logits = self._forward(torch.tensor([ids]), torch.arange(n).unsqueeze(0), None, cache,
                                       0 if rows == n else rows)
                done[tuple(ids)] = [t[0] for layer in cache.layers for t in (layer.keys, layer.values)], logits[0]
            kv, logits = done[tuple(ids)]
            self.kv[r], self.lengths[r] = [self._room(t, t.shape[1], 2 * t.shape[1]) for t in kv], len(ids)
            out[r] = logits[-rows:].to(device="cpu", dtype=torch.float32)
        return out

    def _step(self, requests: dict[int, tuple[list[int], int]]) -> dict[int, torch.Tensor]:
        """One pass of the requesting rows: their caches right-aligned in T columns (T the longest), their
        N new columns after (a row's n tokens right-aligned); padding masked out."""
        from transformers import DynamicCache

        rows = sorted(requests)
        T, N = max(self.lengths[r] for r in rows), max(len(requests[r][0]) for r in rows)
        ids = torch.zeros(len(rows), N, dtype=torch.long)
        positions = torch.zeros(len(rows), N, dtype=torch.long)
        mask = torch.zeros(len(rows), T + N, dtype=torch.bool)
        for j, r in enumerate(rows):
            n, held = len(requests[r][0]), self.lengths[r]
            ids[j, N - n:] = torch.tensor(requests[r][0])
            positions[j, N - n:] = torch.arange(held, held + n)
            mask[j, T - held: T], mask[j, T + N - n:] = True, True
        cache = DynamicCache(config=self.model.config)
        cache.layers = [RoomLayer(self._stack(rows, 2 * i, T, N), self._stack(rows, 2 * i + 1, T, N), T)
                        for i in range(len(cache.layers))]
        logits = self._forward(ids, positions, None if mask.all() else mask, cache,
                               max(requests[r][1] for r in rows))
        for j, r in enumerate(rows):
            n, held = len(requests[r][0]), self.lengths[r]
            new = [t[j, :, T + N - n:] for layer in cache.layers for t in (layer.keys, layer.values)]  # views
            self.kv[r] = [self._room(buf, held, held + n) for buf in self.kv[r]]
            for buf, t in zip(self.kv[r], new, strict=True):
                buf[:, held: held + n] = t
            self.lengths[r] = held + n
        return {r: logits[j, -requests[r][1]:].to(device="cpu", dtype=torch.float32) for j, r in enumerate(rows)}

    def _stack(self, rows: list[int], index: int, T: int, N: int) -> torch.Tensor:
        """[B', kv heads, T + N, head dim]: buffer `index` (layer index // 2, keys or values) of each row,
        its L positions in the last L of the first T columns, zeros before; N columns of room after."""
        first = self.kv[rows[0]][index]
        out = first.new_empty(len(rows), first.shape[0], T + N, first.shape[2])
        for j, r in enumerate(rows):
            held = self.lengths[r]
            out[j, :, : T - held] = 0.0
            out[j, :, T - held: T] = self.kv[r][index][:, :held]
        return out

    @staticmethod
    def _room(buf: torch.Tensor, held: int, need: int) -> torch.Tensor:
        """`buf` ([kv heads, room, head dim], its first `held` columns in use) with room for `need` columns."""
        if buf.shape[1] >= need:
            return buf
        out = buf.new_empty(buf.shape[0], max(need, 2 * buf.shape[1]), buf.shape[2])
        out[:, :held] = buf[:, :held]
        return out


class Schedule:
    """Runs a batch of pending passes when all `live` runs wait on one (one `Passes.run` per model)."""

    def __init__(self, live: int):
        self.cond = threading.Condition()
        self.live = live
        self.pending: list[tuple[Passes, int, list[int], int, dict]] = []

    def call(self, passes: Passes, row: int, ids: list[int], rows: int) -> torch.Tensor:
        box: dict = {}
        with self.cond:
            self.pending.append((passes, row, ids, rows, box))
            self._serve_if_all_wait()
            while not box:
                self.cond.wait()
        if "error" in box:
            raise box["error"]
        return box["logits"]

    def leave(self) -> None:
        """A run ended: the others no longer wait for it."""
        with self.cond:
            self.live -= 1
            self._serve_if_all_wait()

    def _serve_if_all_wait(self) -> None:
        if not self.pending or len(self.pending) < self.live:
            return
        by_model: dict[int, tuple[Passes, dict]] = {}
        for passes, row, ids, rows, box in self.pending:
            by_model.setdefault(id(passes), (passes, {}))[1][row] = (ids, rows, box)
        self.pending = []
        for passes, asked in by_model.values():
            try:
                got = passes.run({r: (ids, rows) for r, (ids, rows, _) in asked.items()})
                for r, (_, _, box) in asked.items():
                    box["logits"] = got[r]
            except Exception as e:  # every run waiting on this model fails with it
                for _, _, box in asked.values():
                    box["error"] = e
        self.cond.notify_all()


class Lane(GreedyByLogits):
    """Row `row` of a `Passes` as a single-sequence `SpecModel` for one `generate` call."""

    def __init__(self, passes: Passes, row: int, schedule: Schedule):
        self.passes, self.row, self.schedule = passes, row, schedule
        view = CachedModel(passes.model)
        self.width, self.vocab_limit, self.capacity = view.width, view.vocab_limit, view.capacity
        self.forward_s = 0.0

    @property
    def length(self) -> int:
        return self.passes.lengths[self.row]

    def reset(self) -> None:
        if self.length:
            raise ValueError("a Lane decodes one run: make a new Passes for the next runs")
        self.forward_s = 0.0

    def extend(self, tokens: torch.Tensor, outputs: int | None = None) -> torch.Tensor:
        ids = torch.as_tensor(tokens).reshape(-1).tolist()
        t0 = time.perf_counter()
        logits = self.schedule.call(self.passes, self.row, ids, output_rows(len(ids), outputs))
        self.forward_s += time.perf_counter() - t0
        return logits

    def truncate(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"truncate() needs n >= 0, got {n}")
        with self.schedule.cond:
            self.passes.truncate(self.row, n)

    def identity(self) -> None:
        return None


def check_model(role: str, model) -> None:
    """TypeError unless `model` is a transformers causal LM whose every layer attends to all positions
    (a `DynamicLayer` cache): the stacked caches hold padding, which a sliding window would count."""
    if not (callable(model) and hasattr(model, "config")):
        raise TypeError(f"runs side by side need transformers models; the {role} is a {type(model).__name__}")
    from transformers import DynamicCache

    kinds = {type(layer).__name__ for layer in DynamicCache(config=model.config).layers}
    if kinds != {"DynamicLayer"}:
        raise TypeError(f"runs side by side need full-attention layers; the {role}'s cache has {sorted(kinds)}: "
                        "decode its runs one after another (batch=1)")


def side_by_side(target, draft, k, prompts: list[list[int]], *, runs: int, tokens: int, seed: int, max_k: int,
                 limit: int, batch: int) -> np.ndarray:
    """[runs, tokens] ids of the runs `gate._sample` decodes (run i: prompt i mod len, seed + i, temperature
    1), `batch` of them side by side at a time. target, draft: transformers causal LMs (draft None: plain)."""
    for role, m in (("target", target), ("draft", draft)):
        if m is not None:
            check_model(role, m)
    out: list = [None] * runs
    for start in range(0, runs, batch):
        chunk = list(range(start, min(start + batch, runs)))
        schedule, errors = Schedule(len(chunk)), []
        passes = [Passes(m, len(chunk)) if m is not None else None for m in (target, draft)]

        def run(i: int, row: int) -> None:
            try:
                lane, drafter = (Lane(p, row, schedule) if p is not None else None for p in passes)
                out[i] = generate(lane, prompts[i % len(prompts)], draft=drafter, k=k, max_k=max_k, temperature=1.0,
                                  max_new_tokens=tokens, seed=seed + i, vocab_limit=limit).tokens
            except BaseException as e:  # noqa: BLE001 -- raised again below, in the caller's thread
                errors.append(e)
            finally:
                schedule.leave()

        threads = [threading.Thread(target=run, args=(i, row)) for row, i in enumerate(chunk)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
    return np.array(out)
