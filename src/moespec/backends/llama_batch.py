"""B sequences of one GGUF model decoded together on llama.cpp: one llama_decode holds every
sequence's tokens, each with its own sequence id and positions in a KV stream of its own, and each
sequence rolls back on its own (llama_memory_seq_rm). The batched verify pass of `engine.batch`.

llama.cpp cuts a pass into ubatches of equal token counts over consecutive sequence ids
(`llama_batch_allocr::split_equal`): a pass where every live sequence feeds as many tokens, over
ids 0..B'-1, is one ubatch, one read of the weights. `move` lets the caller keep its live sequences
at the lowest ids as others finish (llama_memory_seq_cp copies a stream's cache into another).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from pathlib import Path

import numpy as np
import torch

from moespec.backends import llama_lib, llama_steps
from moespec.backends.llama_model import DEFAULT_BATCH, LlamaModel
from moespec.backends.protocol import NoMaximum, Part, argmax_rows


class LlamaBatch(LlamaModel):
    """A GGUF model on llama.cpp with `sequences` KV caches of n_ctx positions each (LlamaModel's
    arguments otherwise). Sequence 0 is also the single-sequence `SpecModel` of its base class.
    exact: no pass of one token (`backends.exact`): a lone token is fed again with the one before it,
    so every pass of every batch size computes one function (with flash attention off and
    `exact_llama_environment`, which `models.load(..., exact=True)` set)."""

    def __init__(self, path: str | Path, *, sequences: int, threads: int | None = None, n_ctx: int | None = None,
                 batch: int = DEFAULT_BATCH, repack: bool = False, flash_attn: bool | None = None, exact: bool = False):
        super().__init__(path, threads=threads, n_ctx=n_ctx, batch=batch, repack=repack, flash_attn=flash_attn,
                         sequences=sequences)
        self.exact = exact
        self.held: list[list[int]] = [[] for _ in range(sequences)]  # the tokens each sequence's cache holds
        self.tokens = self.held[0]

    def reset(self) -> None:
        super().reset()
        self.held = [[] for _ in range(self.sequences)]
        self.tokens = self.held[0]

    def seq_length(self, seq: int) -> int:
        return len(self.held[seq])

    def truncate_seq(self, seq: int, n: int) -> None:
        """Roll sequence `seq` back to its first n positions (a no-op when it holds n or fewer)."""
        if n < 0:
            raise ValueError(f"truncate_seq() needs n >= 0, got {n}")
        if n < len(self.held[seq]):
            self._L.llama_memory_seq_rm(self._memory, seq, n, -1)
            del self.held[seq][n:]

    def move(self, src: int, dst: int) -> None:
        """Sequence src's cache becomes sequence dst's (dst's is dropped), src is left empty."""
        self.truncate_seq(dst, 0)
        self._L.llama_memory_seq_cp(self._memory, src, dst, -1, -1)
        self._L.llama_memory_seq_rm(self._memory, src, 0, -1)
        self.held[dst], self.held[src] = self.held[src], []
        self.tokens = self.held[0]

    def decode_parts(self, parts: Sequence[Part]) -> list[tuple[int, int]]:
        """One llama_decode of every part's tokens at its sequence's next positions, logits at every
        token; each part's (first row in the pass, rows), its own tokens' rows only."""
        total = sum(len(ids) for _, ids in parts)
        if self.exact and total == 1 and self.held[parts[0][0]]:  # no one-token pass: feed the one before again
            (seq, ids), = parts
            last = self.held[seq][-1]
            self.truncate_seq(seq, len(self.held[seq]) - 1)
            return [(1, 1)] if self.decode_parts([(seq, [last, *ids])]) else []
        if not 1 <= total <= self.batch:
            raise ValueError(f"a batched pass holds 1..{self.batch} tokens (the batch size), got {total}")
        rows, i, b = [], 0, self._batch
        for seq, ids in parts:
            if not 0 <= seq < self.sequences:
                raise ValueError(f"sequence {seq} is outside 0..{self.sequences - 1}")
            start = len(self.held[seq])
            if start + len(ids) > self.capacity:
                raise ValueError(f"{self.path.name}: sequence {seq} holds {start} positions; {len(ids)} more exceed "
                                 f"its context of {self.capacity}")
            if any(not 0 <= t < self.n_vocab for t in ids):
                bad = next(t for t in ids if not 0 <= t < self.n_vocab)
                raise ValueError(f"token id {bad} is outside {self.path.name}'s vocabulary of {self.n_vocab}")
            rows.append((i, len(ids)))
            for j, t in enumerate(ids):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = int(t), start + j, 1, 1
                b.seq_id[i][0] = seq
                i += 1
        b.n_tokens = total
        t0 = time.perf_counter()
        rc = self._L.llama_decode(self._ctx, b)
        self.forward_s += time.perf_counter() - t0
        llama_lib.count_pass()
        if rc != 0:
            for seq, _ in parts:  # the pass may have stored some rows: drop them
                self._L.llama_memory_seq_rm(self._memory, seq, len(self.held[seq]), -1)
            raise ValueError(f"llama_decode failed on a batched pass of {total} tokens (code {rc}): "
                             f"{llama_lib.last_log()}")
        for seq, ids in parts:
            self.held[seq].extend(int(t) for t in ids)
        return rows

    def extend_parts(self, parts: Sequence[Part]) -> list[torch.Tensor]:
        """One pass of every part; each part's logits [len(ids), n_vocab] float32, copied."""
        rows = self.decode_parts(parts)
        logits = self._logits()
        return [torch.from_numpy(logits[first: first + n].copy()) for first, n in rows]

    def argmax_parts(self, parts: Sequence[Part], limit: int) -> list[list[int]]:
        """One pass of every part; each part's greedy tokens, one per fed token (`extend_argmax`)."""
        rows = self.decode_parts(parts)
        if not llama_steps.available():
            view = torch.from_numpy(self._logits())
            return [argmax_rows(view[first: first + n], limit) for first, n in rows]
        out = []
        for first, n in rows:
            got = llama_steps.rows_argmax(self._ctx, first, n, limit)
            if isinstance(got, int):
                row = self._logits()[first + got, :limit]
                raise NoMaximum.in_row(got, row)
            out.append(got.tolist())
        return out

    @property
    def compiled_steps(self) -> bool:
        """Whether `batch_greedy_steps` runs (not under exact passes, whose one-token pass at B = 1 is two)."""
        return not self.exact and llama_steps.available()

    def batch_greedy_steps(self, parts: Sequence[tuple[int, int]], steps: int, limit: int,
                           eos: Collection[int] = ()) -> tuple[np.ndarray, list[float]]:
        """Up to `steps` plain greedy steps of every sequence at once, in compiled code (`llama_steps`):
        each step one llama_decode of one token per part (seq, the token it feeds first), then each
        row's argmax fed at the next step. Returns (the tokens produced [s, len(parts)], each step's
        seconds); a step where some sequence produced an id of `eos` is the last. The last tokens
        produced are not fed (as `greedy_steps`)."""
        seqs = np.array([q for q, _ in parts], dtype=np.int32)
        start = np.array([len(self.held[q]) for q in seqs], dtype=np.int32)
        if not 1 <= len(parts) <= self.batch or int(start.max()) + steps > self.capacity:
            raise ValueError(f"{self.path.name}: {len(parts)} sequences x {steps} steps from positions {start.tolist()} "
                             f"do not fit a pass of {self.batch} and a context of {self.capacity}")
        first = np.array([t for _, t in parts], dtype=np.int32)
        produced, seconds, status, bad = llama_steps.batch_greedy_steps(
            self._ctx, self._batch, seqs, first, start, steps, limit, np.fromiter(eos, dtype=np.int32, count=len(eos)))
        llama_lib.count_pass()
        fed = len(produced) + (bad is not None)  # steps whose tokens the caches now hold
        for j, q in enumerate(seqs):
            self.held[q].extend([int(first[j]), *produced[: fed - 1, j].tolist()] if fed else [])
        if status:
            for j, q in enumerate(seqs):
                self.truncate_seq(int(q), int(start[j]))
            raise ValueError(f"llama_decode failed on a batched greedy step (code {status}): {llama_lib.last_log()}")
        if bad is not None:
            row = self._logits()[bad[1], :limit]
            raise NoMaximum.in_row(bad[0], row)
        self.forward_s += float(seconds.sum())
        return produced, seconds.tolist()

    def __repr__(self) -> str:
        return (f"LlamaBatch({self.path.name}, {self.architecture}, sequences={self.sequences}, threads={self.threads}, "
                f"lengths={[len(h) for h in self.held]})")
