"""The llama.cpp backend: a GGUF file decoded by llama.cpp, as a `SpecModel` (engine paper Sec. 4).

One `extend` is one `llama_decode` of its tokens (split in llama.cpp's own way, chunks of `batch`,
only for long prefills) with logits at every position asked for; `truncate` removes the rolled-back
positions with `llama_memory_seq_rm`. The weights stay in the file's own quantization: llama.cpp
reads them, not a dequantized copy.

Weight repacking (llama.cpp's extra buffer types, `--repack`) is off by default: on this project's
machines (Xeon with AMX) llama.cpp 0.3.36's AMX repack crashes the process (SIGSEGV) on the first
pass of every quantized file tried (Q4_1, Q8_0, Q4_K_M). The benchmarks run llama.cpp's own tools
with repacking off too, so both engines run the same kernels.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections import Counter
from pathlib import Path
from typing import Collection

import numpy as np
import torch

from moespec.backends import llama_lib, llama_steps
from moespec.backends.protocol import GreedyByLogits, NoMaximum, StepStop, argmax_rows, output_rows

DEFAULT_CONTEXT = 8192  # positions, unless the file was trained on fewer (n_ctx)
DEFAULT_BATCH = 512  # tokens per llama_decode call (n_batch = n_ubatch), llama.cpp's default
VOCAB_LIMIT_KEY = "moespec.vocab_limit"  # written by `moespec export-gguf` where the output layer is padded
OPEN: Counter = Counter()  # live llama.cpp models per resolved file: a chain holds at most one of each


def open_models() -> dict[str, int]:
    """{file: llama.cpp models of it loaded and not yet closed} in this process."""
    return {path: n for path, n in OPEN.items() if n > 0}


def default_threads() -> int:
    """All the cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class LlamaModel(GreedyByLogits):
    """A GGUF model on llama.cpp with one sequence's KV cache.

    path: the .gguf file. threads: llama.cpp's threads for every pass (default: all cores). n_ctx:
    positions the cache holds (default min(trained context, 8192)). batch: the most tokens one
    llama_decode takes. repack: llama.cpp's weight repacking (see the module docstring). flash_attn:
    llama.cpp's flash attention (None: its own choice, on for these CPUs). eval_callback: a
    `ggml_backend_sched_eval_callback` the scheduler asks about every node of every pass
    (`llama_routing` reads the router's choice with one); it must outlive the model. sequences:
    the KV caches the context holds, each of n_ctx positions in a stream of its own (`llama_batch`
    decodes them together; this class uses the first). Free the C handles with `close()` or a
    `with` block; garbage collection also frees them.
    """

    def __init__(self, path: str | Path, *, threads: int | None = None, n_ctx: int | None = None,
                 batch: int = DEFAULT_BATCH, repack: bool = False, flash_attn: bool | None = None,
                 eval_callback=None, sequences: int = 1):
        L = llama_lib.bindings()
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be an int >= 1, got {threads!r}; omit it to use all {default_threads()} cores")
        if threads is not None and threads > default_threads():
            raise ValueError(f"threads={threads} is more than the {default_threads()} cores this process may run on; "
                             f"give {default_threads()} or fewer (more threads than cores only slow llama.cpp down)")
        if n_ctx is not None and n_ctx < 2:
            raise ValueError(f"n_ctx must be >= 2 positions, got {n_ctx}")
        if batch < 2:
            raise ValueError(f"batch must be >= 2 tokens, got {batch}")
        if isinstance(sequences, bool) or not isinstance(sequences, int) or sequences < 1:
            raise ValueError(f"sequences must be an int >= 1, got {sequences!r}")
        self.path = llama_lib.check_gguf(path)
        self.threads = threads or default_threads()
        self._L, self._model, self._ctx, self._batch = L, None, None, None
        self._identity: dict | None = None  # `identity`, taken on first use
        params = L.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_extra_bufts = repack
        self._model = L.llama_model_load_from_file(str(self.path).encode(), params)
        if not self._model:
            raise llama_lib.load_failure(self.path)
        OPEN[str(Path(self.path).resolve())] += 1
        self._vocab = L.llama_model_get_vocab(self._model)
        self.n_vocab = L.llama_vocab_n_tokens(self._vocab)
        trained = L.llama_model_n_ctx_train(self._model)
        ctx = L.llama_context_default_params()
        ctx.n_ctx = (n_ctx or min(trained, DEFAULT_CONTEXT)) * sequences  # one stream of n_ctx per sequence
        ctx.n_seq_max = sequences
        ctx.n_batch = ctx.n_ubatch = batch
        ctx.n_threads = ctx.n_threads_batch = self.threads
        ctx.no_perf = True
        ctx.flash_attn_type = {None: -1, False: 0, True: 1}[flash_attn]
        if eval_callback is not None:
            ctx.cb_eval = eval_callback
        self._ctx = L.llama_init_from_model(self._model, ctx)
        if not self._ctx:
            self.close()
            raise ValueError(f"llama.cpp could not make a context of {ctx.n_ctx} positions for {self.path}: "
                             f"{llama_lib.last_log()}; try a smaller n_ctx")
        self.sequences = sequences
        self.capacity = L.llama_n_ctx(self._ctx) // sequences  # positions of one sequence
        self.batch = batch
        self._memory = L.llama_get_memory(self._ctx)
        self._batch = L.llama_batch_init(batch, 0, sequences)
        limit = llama_lib.meta(self._model, VOCAB_LIMIT_KEY)
        self.vocab_limit = int(limit) if limit is not None else None
        self.architecture = llama_lib.meta(self._model, "general.architecture")
        self._logits_at, self._logits_view = None, None
        self.tokens: list[int] = []  # the positions the cache holds
        self.forward_s = 0.0
        self.device = None

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def width(self) -> int:
        return self.n_vocab

    def reset(self) -> None:
        self._L.llama_memory_clear(self._memory, True)
        self.tokens = []
        self.forward_s = 0.0

    def truncate(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"truncate() needs n >= 0, got {n}")
        if n < len(self.tokens):
            self._L.llama_memory_seq_rm(self._memory, 0, n, -1)
            del self.tokens[n:]

    def extend(self, tokens: torch.Tensor, outputs: int | None = None) -> torch.Tensor:
        """Append tokens [n]; logits of the new positions (the last `outputs`), [rows, n_vocab] float32 CPU."""
        ids = tokens.reshape(-1).tolist() if isinstance(tokens, torch.Tensor) else [int(t) for t in tokens]
        rows = output_rows(len(ids), outputs)
        out = [torch.from_numpy(a) for a in self.decode(ids, first_out=len(ids) - rows)]
        return out[0] if len(out) == 1 else torch.cat(out)

    def extend_argmax(self, tokens: torch.Tensor, limit: int, outputs: int | None = None) -> list[int]:
        """`extend`, returning each new row's greedy token: the argmax below `limit`, read in place from
        llama.cpp's logits buffer by compiled code (`llama_steps`), no row copied."""
        ids = tokens.reshape(-1).tolist() if isinstance(tokens, torch.Tensor) else [int(t) for t in tokens]
        rows = output_rows(len(ids), outputs)
        last = (len(ids) - 1) % self.batch + 1  # tokens of the last llama_decode call
        if rows > last or not llama_steps.available():  # rows across calls, or no helper: read the logits
            return argmax_rows(self.extend(torch.tensor(ids), outputs), limit)
        self.decode(ids, first_out=len(ids) - rows, keep=False)
        got = llama_steps.rows_argmax(self._ctx, last - rows, rows, limit)
        if isinstance(got, int):
            row = self._logits()[last - rows + got, :limit]
            raise NoMaximum.in_row(got, row)
        return got.tolist()

    def greedy_steps(self, token: int, steps: int, limit: int, eos: Collection[int] = (),
                     stop: StepStop | None = None) -> tuple[list[int], list[float]]:
        """The protocol's greedy steps, every one in compiled code: one llama_decode of one token and
        the argmax of its row per step, and the stop rule's check, with no Python between them
        (`llama_steps`)."""
        if not llama_steps.available():
            return GreedyByLogits.greedy_steps(self, token, steps, limit, eos, stop)
        start = len(self.tokens)
        if start + steps > self.capacity:
            raise ValueError(f"{self.path.name}: {start} + {steps} positions exceed the context of {self.capacity}; "
                             "load the model with a larger n_ctx")
        produced, seconds, status, bad = llama_steps.greedy_steps(
            self._ctx, self._batch, 0, int(token), start, steps, limit, np.fromiter(eos, dtype=np.int32, count=len(eos)),
            stop)
        llama_lib.count_pass()
        self.tokens.extend([int(token), *produced.tolist()] if bad is not None else
                           [int(token), *produced[:-1].tolist()] if len(produced) else [])
        if status:
            self.truncate(start)
            raise ValueError(f"llama_decode failed at position {start + len(produced)} (code {status}): "
                             f"{llama_lib.last_log()}")
        if bad is not None:
            row = self._logits()[0, :limit]
            raise NoMaximum.in_row(bad, row)
        self.forward_s += float(seconds.sum())
        return produced.tolist(), seconds.tolist()

    def decode(self, ids: list[int], *, first_out: int, keep: bool = True) -> list[np.ndarray]:
        """Append token ids with llama.cpp computing the logits of ids[first_out:]; copies of those
        rows, one [rows, n_vocab] array per llama_decode call, or none unless `keep`."""
        n = len(ids)
        start = len(self.tokens)
        if start + n > self.capacity:
            raise ValueError(f"{self.path.name}: {start} + {n} positions exceed the context of {self.capacity}; "
                             "load the model with a larger n_ctx")
        if min(ids) < 0 or max(ids) >= self.n_vocab:
            bad = next(t for t in ids if not 0 <= t < self.n_vocab)
            raise ValueError(f"token id {bad} is outside {self.path.name}'s vocabulary of {self.n_vocab}")
        out = []
        t0 = time.perf_counter()
        for lo in range(0, n, self.batch):
            chunk = ids[lo: lo + self.batch]
            wanted = self._fill(chunk, start + lo, first_out - lo)
            rc = self._L.llama_decode(self._ctx, self._batch)
            llama_lib.count_pass()
            if rc != 0:
                self._L.llama_memory_seq_rm(self._memory, 0, start, -1)
                raise ValueError(f"llama_decode failed on {len(chunk)} tokens at position {start + lo} "
                                 f"(code {rc}): {llama_lib.last_log()}")
            if wanted and keep:
                out.append(self._logits()[:wanted].copy())
        self.forward_s += time.perf_counter() - t0
        self.tokens.extend(ids)
        return out

    def _logits(self) -> np.ndarray:
        """[batch, n_vocab] a view of llama.cpp's logits buffer (llama_get_logits), remade only when it moves."""
        ptr = self._L.llama_get_logits(self._ctx)
        address = ctypes.addressof(ptr.contents)
        if address != self._logits_at:
            self._logits_at, self._logits_view = address, np.ctypeslib.as_array(ptr, shape=(self.batch, self.n_vocab))
        return self._logits_view

    def _fill(self, chunk: list[int], position: int, first_out: int) -> int:
        """Write one llama_batch: tokens at consecutive positions of sequence 0, logits from index
        `first_out` on. Returns how many rows of logits it asks for."""
        b = self._batch
        b.n_tokens = len(chunk)
        for i, t in enumerate(chunk):
            b.token[i] = t
            b.pos[i] = position + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = i >= first_out
        return len(chunk) - max(first_out, 0) if first_out < len(chunk) else 0

    def identity(self) -> dict:
        """What its pass times depend on: the file (its resolved path and `provenance.file_fingerprint`,
        which reads 4 MiB of it: 3 ms, taken once per loaded model, the file it loaded) and llama.cpp's
        threads."""
        from moespec.provenance import file_fingerprint

        if self._identity is None:
            path = Path(self.path).resolve()
            self._identity = {"backend": "llama.cpp", "gguf": str(path), "fingerprint": file_fingerprint(path),
                              "threads": self.threads}
        return dict(self._identity)

    def close(self) -> None:
        """Free llama.cpp's batch, context and model (idempotent)."""
        L = self._L
        if self._batch is not None:
            L.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            L.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            L.llama_model_free(self._model)
            self._model = None
            OPEN[str(Path(self.path).resolve())] -= 1

    def __enter__(self) -> "LlamaModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the bindings may already be gone
            pass

    def __repr__(self) -> str:
        return f"LlamaModel({self.path.name}, {self.architecture}, threads={self.threads}, length={self.length})"
