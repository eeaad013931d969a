"""Routing traces: the experts each token selected, per MoE layer, stored as Parquet.

A trace is the recorded expert sets S_{l,t} of a set of token sequences (the cost-model paper,
Sec. 1): for each document an int array [T, L, m] — T tokens, L MoE layers, m experts per token —
plus the expert count N, the bytes w_l of one expert of each layer, and where it came from.

On disk a trace is one Parquet file with one row per recorded chunk of a document (columns
`doc_index`, `doc_id`, `start`, `experts`, optional `weights`, the last two flattened [T_chunk*L*m]),
and the trace's header as JSON in the schema metadata. `TraceWriter` appends chunk by chunk, so a
long corpus never sits in memory whole; it writes to a temporary file renamed on `close()`.

The estimators of App. D.2 live in `moespec.moe.reuse` and are re-exported here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from moespec.texts import default_corpus, read_corpus  # noqa: F401  (public re-export)
from moespec.moe.reuse import (  # noqa: F401  (public re-export)
    ReuseAnalysis,
    analyze,
    distinct_share,
    e_dedup,
    e_slot,
    mean_union,
    reuse,
    rho_bar,
    u_bar,
    uniform_reuse,
    uniform_union,
)

FORMAT = "moespec-routing-trace"
FORMAT_VERSION = 1
_META_KEY = b"moespec.trace"
ID_DTYPE = np.int16  # expert ids; N must stay below 2**15


@dataclass(frozen=True)
class RoutingTrace:
    """Recorded routing of D documents through L MoE layers of N experts, m per token.

    documents: D int16 arrays [T_d, L, m]; expert_bytes: w_l, [L]; weights: None or D float32
    arrays [T_d, L, m] (the router's weights of the selected experts); layers: the decoder-layer
    index of each MoE layer, [L]; model_fingerprint: `provenance.model_fingerprint` of the model
    that routed ("" when unknown).
    """

    documents: list
    num_experts: int
    expert_bytes: tuple
    doc_ids: tuple = ()
    model: str = ""
    dtype: str = ""
    corpus: tuple = ()
    layers: tuple = ()
    weights: list | None = None
    model_fingerprint: str = ""
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        docs = [np.asarray(d) for d in self.documents]
        if not docs:
            raise ValueError("a RoutingTrace needs at least one document; got none")
        shape = docs[0].shape[1:]
        if len(shape) != 2:
            raise ValueError(f"each document must be [T, L, m]; got shape {docs[0].shape}")
        L, m = shape
        N = int(self.num_experts)
        if not 1 <= m < N < 2**15:
            raise ValueError(f"need 1 <= m < N < 32768; got m={m}, N={N}")
        for i, d in enumerate(docs):
            if d.ndim != 3 or d.shape[1:] != shape:
                raise ValueError(f"document {i} has shape {d.shape}; every document must be [T, {L}, {m}]")
            if not np.issubdtype(d.dtype, np.integer):
                raise TypeError(f"document {i} has dtype {d.dtype}; expert ids must be integers")
            if d.size and (d.min() < 0 or d.max() >= N):
                raise ValueError(f"document {i} has expert ids in [{d.min()}, {d.max()}], outside [0, {N})")
        docs = [d.astype(ID_DTYPE, copy=False) for d in docs]
        w = tuple(int(x) for x in self.expert_bytes)
        if len(w) != L or min(w) <= 0:
            raise ValueError(f"expert_bytes must be {L} positive byte counts (one per layer); got {w}")
        ids = tuple(str(x) for x in self.doc_ids) or tuple(str(i) for i in range(len(docs)))
        if len(ids) != len(docs):
            raise ValueError(f"{len(ids)} doc_ids for {len(docs)} documents")
        layers = tuple(int(x) for x in self.layers) or tuple(range(L))
        if len(layers) != L:
            raise ValueError(f"layers names {len(layers)} decoder layers for L={L} MoE layers")
        weights = None
        if self.weights is not None:
            weights = [np.asarray(g, dtype=np.float32) for g in self.weights]
            if [g.shape for g in weights] != [d.shape for d in docs]:
                raise ValueError("weights must have one [T, L, m] array per document, shaped like its experts")
        for name, value in [("documents", docs), ("num_experts", N), ("expert_bytes", w), ("doc_ids", ids),
                            ("corpus", tuple(self.corpus)), ("layers", layers), ("weights", weights)]:
            object.__setattr__(self, name, value)

    @property
    def num_layers(self) -> int:
        return self.documents[0].shape[1]

    @property
    def top_k(self) -> int:
        return self.documents[0].shape[2]

    @property
    def num_tokens(self) -> int:
        return sum(d.shape[0] for d in self.documents)

    @property
    def W(self) -> int:
        """W = sum_l w_l, the bytes of one expert in every layer (Sec. 1)."""
        return sum(self.expert_bytes)

    def header(self) -> dict:
        """The JSON header stored in the Parquet schema metadata."""
        return {
            "format": FORMAT, "version": FORMAT_VERSION, "num_experts": self.num_experts,
            "num_layers": self.num_layers, "top_k": self.top_k, "expert_bytes": list(self.expert_bytes),
            "layers": list(self.layers), "model": self.model, "dtype": self.dtype, "corpus": list(self.corpus),
            "has_weights": self.weights is not None, "model_fingerprint": self.model_fingerprint,
        }

    def save(self, path: str | Path) -> Path:
        """Write the trace as Parquet, one row per document (see `TraceWriter`)."""
        with TraceWriter(path, **_writer_kwargs(self.header())) as writer:
            for i, (doc_id, doc) in enumerate(zip(self.doc_ids, self.documents)):
                writer.append(doc_id, doc, None if self.weights is None else self.weights[i])
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> "RoutingTrace":
        """Read and validate a trace written by `save` or `TraceWriter`."""
        return _load(Path(path))


def _writer_kwargs(h: dict) -> dict:
    keys = ("num_experts", "top_k", "expert_bytes", "layers", "model", "dtype", "corpus", "has_weights",
            "model_fingerprint")
    return {k: h[k] for k in keys}


class TraceWriter:
    """Append documents (or consecutive chunks of one document) to a trace file as they are recorded.

    >>> with TraceWriter("t.parquet", num_experts=64, top_k=8, expert_bytes=[w] * 16) as tw:
    ...     tw.append("doc-0", experts)            # experts [T, L, m]
    """

    def __init__(self, path: str | Path, *, num_experts: int, top_k: int, expert_bytes: Sequence[int],
                 layers: Sequence[int] = (), model: str = "", dtype: str = "", corpus: Sequence[str] = (),
                 has_weights: bool = False, model_fingerprint: str = ""):
        self.path = Path(path)
        self.L, self.m, self.N = len(expert_bytes), int(top_k), int(num_experts)
        if not 1 <= self.m < self.N < 2**15 or self.L < 1 or min(expert_bytes) <= 0:
            raise ValueError(f"bad trace header: N={num_experts}, m={top_k}, expert_bytes={list(expert_bytes)}")
        header = {
            "format": FORMAT, "version": FORMAT_VERSION, "num_experts": self.N, "num_layers": self.L,
            "top_k": self.m, "expert_bytes": [int(x) for x in expert_bytes],
            "layers": [int(x) for x in layers] or list(range(self.L)), "model": model, "dtype": dtype,
            "corpus": list(corpus), "has_weights": bool(has_weights), "model_fingerprint": model_fingerprint,
        }
        fields = [("doc_index", pa.int32()), ("doc_id", pa.string()), ("start", pa.int64()),
                  ("experts", pa.large_list(pa.int16()))]
        if has_weights:
            fields.append(("weights", pa.large_list(pa.float32())))
        self.schema = pa.schema(fields, metadata={_META_KEY: json.dumps(header).encode()})
        self.has_weights = bool(has_weights)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(self.path.name + ".partial")
        self._writer = pq.ParquetWriter(self._tmp, self.schema, compression="zstd")
        self._docs: dict[str, tuple[int, int]] = {}  # doc_id -> (doc_index, next start)
        self.num_tokens = 0

    def append(self, doc_id: str, experts: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Append experts [T, L, m] (and weights [T, L, m]) of `doc_id`, continuing it if already begun."""
        experts = np.asarray(experts)
        if experts.ndim != 3 or experts.shape[1:] != (self.L, self.m):
            raise ValueError(f"experts of {doc_id!r} have shape {experts.shape}; expected [T, {self.L}, {self.m}]")
        if experts.size and (experts.min() < 0 or experts.max() >= self.N):
            raise ValueError(f"experts of {doc_id!r} hold ids outside [0, {self.N})")
        if (weights is None) == self.has_weights:
            raise ValueError(f"this writer {'needs' if self.has_weights else 'takes no'} weights (has_weights)")
        index, start = self._docs.get(doc_id, (len(self._docs), 0))
        cols = {
            "doc_index": pa.array([index], pa.int32()), "doc_id": pa.array([doc_id]),
            "start": pa.array([start], pa.int64()),
            "experts": pa.array([experts.astype(ID_DTYPE).ravel()], pa.large_list(pa.int16())),
        }
        if self.has_weights:
            w = np.asarray(weights, dtype=np.float32)
            if w.shape != experts.shape:
                raise ValueError(f"weights of {doc_id!r} have shape {w.shape}, experts {experts.shape}")
            cols["weights"] = pa.array([w.ravel()], pa.large_list(pa.float32()))
        self._writer.write_table(pa.table(cols, schema=self.schema))
        self._docs[doc_id] = (index, start + experts.shape[0])
        self.num_tokens += experts.shape[0]

    def close(self) -> None:
        """Finish the file (writes the Parquet footer) and move it to its final path."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            os.replace(self._tmp, self.path)

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close() if exc_type is None else self.abort()


def _open(path: Path) -> tuple[pq.ParquetFile, dict]:
    """The Parquet file at `path` and its trace header, checked for format and version."""
    if not path.exists():
        raise FileNotFoundError(f"no routing trace at {path}; record one with `moespec trace`")
    try:
        pf = pq.ParquetFile(path)
        meta = pf.schema_arrow.metadata or {}
    except (pa.ArrowInvalid, OSError) as e:
        raise ValueError(f"{path} is not a readable Parquet file ({e}); it may be truncated or corrupt — "
                         f"record it again with `moespec trace`") from e
    if _META_KEY not in meta:
        raise ValueError(f"{path} is a Parquet file but not a moespec routing trace (no {_META_KEY.decode()} header)")
    h = json.loads(meta[_META_KEY])
    if h.get("format") != FORMAT or h.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path} has trace format {h.get('format')!r} v{h.get('version')}; this moespec "
                         f"reads {FORMAT!r} v{FORMAT_VERSION}; record it again with `moespec trace`")
    return pf, h


def read_header(path: str | Path) -> dict:
    """The header of the trace at `path` (`RoutingTrace.header`'s keys), without reading its routing."""
    return _open(Path(path))[1]


def _load(path: Path) -> RoutingTrace:
    pf, h = _open(path)
    L, m = h["num_layers"], h["top_k"]
    docs: dict[int, list] = {}
    try:
        for batch in pf.iter_batches():
            idx = batch.column("doc_index").to_numpy()
            starts = batch.column("start").to_numpy()
            names = batch.column("doc_id").to_pylist()
            cols = [batch.column("experts")] + ([batch.column("weights")] if h["has_weights"] else [])
            flats = [(c.values.to_numpy(zero_copy_only=False), c.offsets.to_numpy()) for c in cols]
            for r in range(batch.num_rows):
                parts = [flat[off[r] : off[r + 1]] for flat, off in flats]
                if parts[0].size % (L * m):
                    raise ValueError(f"{path}: row {r} of document {names[r]!r} holds {parts[0].size} ids, "
                                     f"not a multiple of L*m = {L * m}; the file does not match its header")
                arrays = [p.reshape(-1, L, m) for p in parts] + [None]
                docs.setdefault(int(idx[r]), []).append((int(starts[r]), names[r], arrays[0], arrays[1]))
    except (pa.ArrowInvalid, OSError) as e:
        raise ValueError(f"{path} is corrupt ({e}); record it again with `moespec trace`") from e
    if sorted(docs) != list(range(len(docs))):
        raise ValueError(f"{path}: document indices {sorted(docs)[:10]}... are not 0..D-1; the file is damaged")
    documents, weights, ids = [], [], []
    for i in range(len(docs)):
        chunks = docs[i]
        pos = 0
        for start, name, a, _ in chunks:
            if start != pos or name != chunks[0][1]:
                raise ValueError(f"{path}: document {chunks[0][1]!r} has a chunk at {start}, expected {pos}; "
                                 f"the file is damaged or was written out of order")
            pos += a.shape[0]
        ids.append(chunks[0][1])
        documents.append(np.concatenate([c[2] for c in chunks]))
        if h["has_weights"]:
            weights.append(np.concatenate([c[3] for c in chunks]))
    try:
        return RoutingTrace(documents, h["num_experts"], tuple(h["expert_bytes"]), tuple(ids), h["model"],
                            h["dtype"], tuple(h["corpus"]), tuple(h["layers"]), weights if h["has_weights"] else None,
                            h.get("model_fingerprint", ""))
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path} does not match its own header: {e}") from e
