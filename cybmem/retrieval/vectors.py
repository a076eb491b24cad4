"""The vector axis: embeddings.jsonl as row-aligned vectors in the Arrow cache, the cosine kernel,
the query vector, and the backfill behind ``cybmem embed``.

Off unless ``CYBERINE_MEMORY_EMBEDDINGS`` is set (cybmem.clients.model_servers reads the configuration); then:

* :func:`load_index` gives the vectors of one (model, dimensions) aligned with a snapshot's rows
  (a record without such a vector is a zero row and scores 0). Vectors are keyed by model and
  dimension: a model that changes its dimension under the same name (an upgrade, another
  quantisation) makes a new key, and only vectors of one key are ever compared. By default the
  key is the model's newest: the dimension of its last line in embeddings.jsonl (what the server
  answers now); lines of its other dimensions are another key, left out without a warning
  (``cybmem doctor`` counts them; ``cybmem embed`` fills in the newest key). Within a key the
  last line of a run wins, the rule by which ``doctor --repair`` drops the vectors a later one
  replaced. The index is cached in ``<project>/.cache/`` as ``vec-<model key>.json`` plus Arrow
  IPC blocks (contiguous row ranges: runId, the float32 vector, its norm and its sign bits), and
  refreshed incrementally like the records cache refreshes from the ledger: embeddings.jsonl's
  inode and the bytes consumed are kept, only the lines appended since are parsed, new rows
  become a new block, a vector for an older row rewrites the block that holds it, and more than
  :data:`MAX_BLOCKS` blocks are merged into one. A line for a run with no record yet waits
  (``pending``) until the record shows up; lines of another model are never read into this
  model's rows. If the snapshot's rows no longer match (its cache was rebuilt), embeddings.jsonl
  was replaced, or the model's newest dimension changed, the index starts over.
* :meth:`VectorQuery.axis` is the vector axis of a top-k ranking, exact whatever the size: one
  float32 mat-vec up to :data:`EXACT_MAX_FLOATS` numbers, above that only the rows that can still
  reach the top k (bounded by the other axes, then by Hamming distance over sign bits; the method
  says how). ``benchmarks/bench_embed.py`` measures the speed and checks it against the mat-vec.
* :func:`query_vector` embeds the query within ``CYBERINE_MEMORY_EMBED_TIMEOUT``; a failure is
  a one-line warning and search falls back to the other axes.
* :func:`embed_missing` embeds the records that have no vector for the configured model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import socket
import time
import urllib.parse
import functools
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from .. import _io
from ..store import cache as _cache
from .._io import atomic_write, ensure_dir, locked
from ..store.arrow_records import keyword_texts
from ..store.embeddings import MAX_EMBEDDINGS_BYTES, embedding_text, row_problem
from ..errors import CybmemError, StoreError, ValidationError
from ..progress import Progress
from ..settings import Settings
from ..store.snapshot import Snapshot, issue_texts, load_snapshot
from ..store.memory_store import MemoryStore

__all__ = [
    "EXACT_MAX_FLOATS",
    "MAX_BLOCKS",
    "VectorIndex",
    "VectorQuery",
    "EmbedResult",
    "load_index",
    "rescore_count",
    "sign_codes",
    "embed_config_of",
    "query_vector",
    "embed_missing",
]

# One float32 mat-vec is memory-bound at 4 bytes a number; up to this many numbers (16 MB; 10k
# records of 384 dims) the exact scan stays cheap (benchmarks/RESULTS.md, "Figures the module
# docstrings quoted").
EXACT_MAX_FLOATS = 4_000_000
MAX_BLOCKS = 8
_VERSION = 2  # 2: keyed by (model, newest dimension), the last line of a run wins
_WORD = 64  # sign bits are packed in uint64 words


def rescore_count(n: int) -> int:
    """How many rows nearest by Hamming distance are rescored exactly: 1% of the index, at least 256."""
    return max(256, n // 100)


def sign_codes(matrix: np.ndarray) -> np.ndarray:
    """The sign bits of each row (x > 0), packed into uint64 words: (rows, ceil(d / 64))."""
    m = np.asarray(matrix, dtype=np.float32)
    if m.ndim == 1:
        m = m[None, :]
    words = -(-m.shape[1] // _WORD)
    bits = np.packbits(m > 0, axis=1)
    pad = words * 8 - bits.shape[1]
    if pad:
        bits = np.pad(bits, ((0, 0), (0, pad)))
    return np.ascontiguousarray(bits).view(np.uint64).reshape(m.shape[0], words)


# --- the index ------------------------------------------------------------------------------


@dataclass
class _Block:
    start: int
    stop: int
    matrix: np.ndarray  # (rows, d) float32, zero rows for records without a vector
    norms: np.ndarray  # (rows,) float32, 0 for records without a vector
    codes: np.ndarray  # (rows, words) uint64 sign bits


@dataclass
class VectorIndex:
    """Vectors of one model aligned with a snapshot's rows (zero rows: no vector)."""

    model: str
    dims: int
    n: int
    blocks: list[_Block]
    consumed: int = 0  # bytes of embeddings.jsonl it was built from (embed_missing reads on from there)
    problems: list[str] = field(default_factory=list)  # unusable lines, as the cache's manifest lists them

    @classmethod
    def from_matrix(cls, matrix: np.ndarray, model: str = "", *, block_rows: int | None = None) -> "VectorIndex":
        """An in-memory index over a row-aligned matrix (zero rows: no vector), e.g. for benchmarks."""
        m = np.ascontiguousarray(matrix, dtype=np.float32)
        if m.ndim != 2:
            raise ValidationError(f"a vector matrix has two dimensions, got shape {m.shape}")
        step = block_rows or max(len(m), 1)
        blocks = [_Block(i, min(i + step, len(m)), m[i:i + step], np.linalg.norm(m[i:i + step], axis=1).astype(np.float32),
                         sign_codes(m[i:i + step])) for i in range(0, len(m), step)]
        return cls(model, m.shape[1], len(m), blocks)

    @functools.cached_property
    def has(self) -> np.ndarray:
        """True for rows with a vector."""
        return np.concatenate([b.norms > 0 for b in self.blocks]) if self.blocks else np.zeros(0, bool)

    @functools.cached_property
    def count(self) -> int:
        """Rows with a vector."""
        return int(np.count_nonzero(self.has))

    @functools.cached_property
    def _missing(self) -> np.ndarray:
        """Rows without a vector."""
        return np.flatnonzero(~self.has)

    @functools.cached_property
    def _codes_t(self) -> list[np.ndarray]:
        """Per block, the sign words transposed (words, rows): each pass of the Hamming loop is contiguous."""
        return [np.ascontiguousarray(b.codes.T) for b in self.blocks]

    def _check(self, q: np.ndarray) -> np.ndarray:
        q = np.asarray(q, dtype=np.float32).ravel()
        if q.shape[0] != self.dims:
            raise ValidationError(f"the query vector has {q.shape[0]} dimensions, the stored vectors of model "
                                  f"{self.model!r} have {self.dims}; is CYBERINE_MEMORY_EMBED_MODEL the model they were made with?")
        return q

    def exact(self, q: np.ndarray) -> np.ndarray:
        """Cosine of every row with ``q``, clipped to [0, 1] (0 for rows without a vector): one float32 mat-vec."""
        q = self._check(q)
        out = np.zeros(self.n, dtype=np.float32)
        qn = float(np.linalg.norm(q))
        if qn == 0.0:
            return out
        q = q / np.float32(qn)
        for b in self.blocks:
            seg = out[b.start:b.stop]
            np.divide(b.matrix @ q, b.norms, out=seg, where=b.norms > 0)
        np.clip(out, 0.0, 1.0, out=out)
        return out

    _CHUNK = 16384  # rows per pass of the Hamming loop: its three work arrays stay in the L2 cache

    def hamming(self, q: np.ndarray) -> np.ndarray:
        """Hamming distance between the sign bits of ``q`` and of every row (uint16; rows without a vector: dims + 1)."""
        qc = sign_codes(self._check(q))[0]
        out = np.empty(self.n, dtype=np.uint16)
        step = self._CHUNK
        tmp = np.empty(step, dtype=np.uint64)
        cnt = np.empty(step, dtype=np.uint8)
        for b, ct in zip(self.blocks, self._codes_t):
            rows = b.stop - b.start
            for lo in range(0, rows, step):
                hi = min(lo + step, rows)
                acc, t, c = out[b.start + lo:b.start + hi], tmp[:hi - lo], cnt[:hi - lo]
                acc[:] = 0
                for w in range(ct.shape[0]):
                    np.bitwise_xor(ct[w, lo:hi], qc[w], out=t)
                    np.bitwise_count(t, out=c)
                    np.add(acc, c, out=acc)
        out[self._missing] = self.dims + 1
        return out

    def nearest(self, q: np.ndarray, m: int) -> np.ndarray:
        """The ``m`` rows whose sign bits are nearest to the query's, ascending row indices.

        One counting pass finds the distance of the m-th row (Hamming distances are small
        integers); ties at that distance go to the higher (newer) rows. No sort.
        """
        h = self.hamming(q)
        m = min(m, self.count)
        if m <= 0:
            return np.zeros(0, dtype=np.int64)
        cut = int(np.searchsorted(np.cumsum(np.bincount(h, minlength=self.dims + 2)), m))
        rows = np.flatnonzero(h <= cut)
        extra = len(rows) - m
        if extra > 0:  # ties at the cut: drop the lowest (oldest) rows among them
            at = np.flatnonzero(h[rows] == cut)
            keep = np.ones(len(rows), dtype=bool)
            keep[at[:extra]] = False
            rows = rows[keep]
        return rows

    def rescored(self, q: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Exact cosine of some rows (ascending row indices), clipped to [0, 1]."""
        q = self._check(q)
        qn = float(np.linalg.norm(q))
        out = np.zeros(len(rows), dtype=np.float32)
        if qn == 0.0 or not len(rows):
            return out
        q = q / np.float32(qn)
        starts = np.array([b.start for b in self.blocks])
        which = np.searchsorted(starts, rows, side="right") - 1
        for i in np.unique(which):
            b = self.blocks[int(i)]
            sel = np.flatnonzero(which == i)
            local = rows[sel] - b.start
            norms = b.norms[local]
            part = np.zeros(len(sel), dtype=np.float32)
            np.divide(b.matrix[local] @ q, norms, out=part, where=norms > 0)
            out[sel] = part
        np.clip(out, 0.0, 1.0, out=out)
        return out

    def cosine(self, q: np.ndarray, *, rescore: np.ndarray | None = None, method: str = "auto",
               candidates: int | None = None) -> np.ndarray:
        """The vector axis of every row for query vector ``q`` (float32 in [0, 1]).

        Args:
            q: the query vector (same model and dimensions).
            rescore: rows that must get their exact cosine whatever the method (the rows the other
                axes may put on top).
            method: "exact" (one mat-vec), "binary" (Hamming over sign bits, then the
                ``candidates`` nearest rows plus ``rescore`` scored exactly; all other rows 0), or
                "auto": exact up to EXACT_MAX_FLOATS numbers, else binary.
            candidates: rows rescored after the Hamming pass (default :func:`rescore_count`).
        """
        if method == "auto":
            method = "exact" if self.count * self.dims <= EXACT_MAX_FLOATS else "binary"
        if method == "exact":
            return self.exact(q)
        if method != "binary":
            raise ValidationError(f"method {method!r} is not one of auto, exact, binary")
        rows = self.nearest(q, candidates or rescore_count(self.count))
        if rescore is not None and len(rescore):
            rows = np.union1d(rows, np.asarray(rescore, dtype=np.int64))
            rows = rows[self.has[rows]]
        out = np.zeros(self.n, dtype=np.float32)
        out[rows] = self.rescored(q, rows)
        return out


def _best_rows(p: np.ndarray, m: int, k: int) -> np.ndarray:
    """About the ``m`` rows with the highest ``p`` (at least ``k`` of the best when there are k), ascending.

    Not a full selection over every row (introselect over 100k float32 with many ties takes up
    to milliseconds): the j-th best of a strided sample (j >= k, scaled so that about m rows
    reach it) is a threshold at least j rows reach (the sampled ones), and only the rows at or
    above it are selected from.
    """
    n = len(p)
    if n <= m:
        return np.arange(n)
    sample = p[::max(1, n // 2048)]
    j = max(k, -(-m * len(sample) // n))  # about m rows reach the j-th best of the sample; at least j do
    rows = None
    if len(sample) >= j:
        t = sample[np.argpartition(sample, len(sample) - j)[len(sample) - j]]
        if t > -np.inf:
            rows = np.flatnonzero(p >= t)
    if rows is None:
        rows = np.arange(n)
    if len(rows) > m:
        rows = np.sort(rows[np.argpartition(p[rows], len(rows) - m)[len(rows) - m:]])
    return rows


@dataclass
class VectorQuery:
    """A query vector against an index: what :func:`cybmem.retrieval.search.rank_query` takes as its vector axis."""

    index: VectorIndex
    vector: np.ndarray
    method: str = "auto"
    candidates: int | None = None  # rows taken by Hamming distance when that pass runs (default rescore_count)
    stats: dict = field(default_factory=dict, repr=False)  # what the last axis() did
    # Rows that can reach the top k after the last axis() (ascending), or None when every row can
    # (the mat-vec): the rows rank_query has to rank.
    reach: np.ndarray | None = field(default=None, repr=False)

    def rescored(self, rows: np.ndarray) -> np.ndarray:
        """The exact cosine of some rows (ascending row indices)."""
        return self.index.rescored(self.vector, rows)

    def axis(self, partial, mask: np.ndarray, w_vec: float, k: int) -> np.ndarray:
        """The vector axis for a top-``k`` ranking, exact whatever the method.

        Exact method: one mat-vec. Binary: a row whose score on the other axes (``partial()``,
        the dense float32 totals without this axis) is below ``T - w_vec``, where T is the k-th
        best total of any rows scored exactly, cannot reach the top k whatever its cosine
        (cosine <= 1): it scores 0 on this axis and stays out of the top k as it would with
        its exact cosine. T is first taken from the rows best on the other axes (a few
        times k, scored exactly); when w_vec is small against the spread of the other axes,
        the bound then lets in a handful of rows and no pass over the vectors is needed.
        When it lets in more than :func:`rescore_count` rows, the rows nearest by Hamming
        distance over the sign bits are scored exactly too, which raises T; when the bound
        still lets in more than a quarter of the rows, the exact mat-vec is cheaper and is used.
        Afterwards :attr:`reach` holds the rows at or above the bound (every row that can be in
        the top k), so only those need ranking.
        """
        index = self.index
        method = self.method
        if method == "auto":
            method = "exact" if index.count * index.dims <= EXACT_MAX_FLOATS else "binary"
        self.reach = None
        if method == "exact":
            self.stats = {"method": "exact", "rescored": index.count}
            return index.exact(self.vector)
        n, w = index.n, np.float32(w_vec)
        p = np.asarray(partial(), dtype=np.float32)
        if not mask.all():
            p = np.where(mask, p, np.float32(-np.inf))
        out = np.zeros(n, dtype=np.float32)
        done = np.zeros(n, dtype=bool)  # rows scored exactly so far
        scored = 0

        def score_rows(rows: np.ndarray) -> None:
            """Score the rows (ascending) not scored yet that have a vector and are candidates."""
            nonlocal scored
            rows = rows[index.has[rows] & mask[rows] & ~done[rows]]
            out[rows] = index.rescored(self.vector, rows)
            done[rows] = True
            scored += len(rows)

        def bound(rows: np.ndarray) -> np.ndarray | None:
            """Rows that can still reach the top k, given T over ``rows`` (None: too few rows for a T)."""
            if len(rows) < k:
                return None
            totals = p[rows] + out[rows] * w
            t = np.partition(totals, len(totals) - k)[len(totals) - k]
            if not np.isfinite(t):
                return None
            return np.flatnonzero(p >= np.float32(t) - w - np.float32(1e-5))  # margin for float32 rounding

        best = _best_rows(p, 4 * k + 64, k)
        best = best[mask[best]]
        score_rows(best)
        extra = bound(best)
        if extra is None:  # fewer than k rows are candidates: all of them were just scored
            self.reach = best
            self.stats = {"method": "binary", "best": len(best), "nearest": 0, "bound": 0, "rescored": scored}
            return out
        near = np.zeros(0, dtype=np.int64)
        if np.count_nonzero(index.has[extra]) > rescore_count(index.count):
            near = index.nearest(self.vector, self.candidates or rescore_count(index.count))
            score_rows(near)
            extra = bound(np.union1d(best, near[mask[near]]))
            if extra is None or np.count_nonzero(index.has[extra]) > n // 4:
                self.stats = {"method": "exact (the bound let in too many rows)", "rescored": index.count}
                return index.exact(self.vector)
        before = scored
        score_rows(extra)
        self.reach = extra
        self.stats = {"method": "binary", "best": len(best), "nearest": len(near), "bound": scored - before,
                      "rescored": scored}
        return out


# --- parsing embeddings.jsonl ----------------------------------------------------------------


@dataclass
class _Parsed:
    ids: list[str]
    vectors: list[list[float]]
    consumed: int  # bytes of whole lines read
    lines: int
    newest: int | None  # the dimension of the model's last usable line (None: no line of it)
    problems: list[str]

    def of(self, dims: int) -> tuple[list[str], list[list[float]]]:
        """The (runId, vector) lines of one dimension, in file order."""
        keep = [i for i, v in enumerate(self.vectors) if len(v) == dims]
        return [self.ids[i] for i in keep], [self.vectors[i] for i in keep]


def _parse(raw: bytes, model: str, first_line: int, name: str) -> _Parsed:
    """Whole lines of ``raw`` -> this model's (runId, vector) in file order, every dimension; the torn tail is left."""
    end = raw.rfind(b"\n") + 1
    ids: list[str] = []
    vectors: list[list[float]] = []
    problems: list[str] = []
    needle = orjson.dumps(model)
    lines = raw[:end].split(b"\n")[:-1] if end else []
    for i, line in enumerate(lines):
        if needle not in line:
            continue  # another model's line (or a blank one): never parsed
        try:
            row = _io.loads(line)
        except ValueError:
            problems.append(f"{name}:{first_line + i}: not valid JSON; skipped")
            continue
        why = row_problem(row)
        if why is not None:
            problems.append(f"{name}:{first_line + i}: {why}; skipped")
            continue
        if row["model"] != model:
            continue
        ids.append(row["runId"])
        vectors.append(row["vector"])
    return _Parsed(ids, vectors, end, len(lines), len(vectors[-1]) if vectors else None, problems)


# --- the cache ---------------------------------------------------------------------------------


def _key(model: str) -> str:
    """The cache's file prefix for a model (its manifest holds the model's newest dimension)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model)[:40]
    return f"{safe}-{hashlib.sha256(model.encode()).hexdigest()[:8]}"


def _block_table(ids: pa.Array, matrix: np.ndarray) -> pa.Table:
    m = np.ascontiguousarray(matrix, dtype=np.float32)
    d = m.shape[1]
    codes = sign_codes(m)
    return pa.table({
        "runId": ids,
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(m.reshape(-1)), d),
        "norm": pa.array(np.linalg.norm(m, axis=1).astype(np.float32)),
        "codes": pa.FixedSizeBinaryArray.from_buffers(pa.binary(codes.shape[1] * 8), len(m),
                                                       [None, pa.py_buffer(codes.tobytes())]),
    })


def _block_of(table: pa.Table, start: int, dims: int) -> tuple[_Block, pa.ChunkedArray]:
    t = table.combine_chunks() if any(c.num_chunks > 1 for c in table.columns) else table
    rows = t.num_rows
    vec = t.column("vector").chunk(0) if rows else None
    matrix = vec.flatten().to_numpy(zero_copy_only=True).reshape(rows, dims) if rows else np.zeros((0, dims), np.float32)
    norms = t.column("norm").chunk(0).to_numpy(zero_copy_only=True) if rows else np.zeros(0, np.float32)
    words = -(-dims // _WORD)
    if rows:
        codes_arr = t.column("codes").chunk(0)
        buf = codes_arr.buffers()[1]
        codes = np.frombuffer(buf, dtype=np.uint64, count=rows * words, offset=codes_arr.offset * words * 8).reshape(rows, words)
    else:
        codes = np.zeros((0, words), np.uint64)
    return _Block(start, start + rows, matrix, norms, codes), t.column("runId")


@dataclass
class _Manifest:
    model: str
    dims: int | None = None
    ino: int = 0
    mtime_ns: int | None = None  # of the file when everything in it was consumed
    tail: str = ""  # hex of the last bytes consumed: an appended-to file still has them there
    consumed: int = 0
    lines: int = 0
    rows: int = 0
    blocks: list[dict] = field(default_factory=list)  # {"file", "start", "stop"}
    pending: str | None = None  # file with (runId, vector) of runs that have no record row yet
    problems: list[str] = field(default_factory=list)
    next_id: int = 1

    @classmethod
    def read(cls, path: Path, model: str) -> "_Manifest | None":
        try:
            d = _io.loads(_io.read_file(path, limit=64 * 1024 * 1024))
            if d.pop("version", None) != _VERSION or d.get("model") != model:
                return None
            return cls(**d)
        except (OSError, ValueError, TypeError, AttributeError):
            return None

    def write(self, path: Path) -> None:
        atomic_write(path, orjson.dumps({"version": _VERSION, **dataclasses.asdict(self)}), durable=False)

    def new_file(self, key: str) -> str:
        name = f"vec-{key}-{self.next_id}.arrow"
        self.next_id += 1
        return name


_TAIL = 64


def _file_state(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _fresh(man: _Manifest, state: tuple[int, int, int] | None) -> bool:
    """embeddings.jsonl is exactly what the manifest consumed (inode, size and mtime)."""
    return state is not None and man.mtime_ns is not None and state == (man.ino, man.consumed, man.mtime_ns)


def _consumed(man: _Manifest, state: tuple[int, int, int] | None, raw_tail: bytes) -> None:
    """Record the file state after consuming: ``raw_tail`` ends at the new consumed offset."""
    man.tail = raw_tail[-_TAIL:].hex()
    man.mtime_ns = state[2] if state is not None and state[1] == man.consumed else None


def _open_blocks(cache: Path, man: _Manifest) -> tuple[list[_Block], pa.ChunkedArray]:
    blocks, ids = [], []
    for b in man.blocks:
        block, rid = _block_of(_cache.read_table(cache / b["file"]), b["start"], man.dims or 0)
        if block.stop != b["stop"]:
            raise ValueError("a vector block does not hold the rows its manifest says")
        blocks.append(block)
        ids.extend(rid.chunks)
    return blocks, pa.chunked_array(ids, pa.string())


def _aligned(ids: pa.ChunkedArray, records: pa.Table, rows: int) -> bool:
    """The blocks' run ids are the snapshot's first ``rows`` run ids, in order."""
    if rows > records.num_rows or len(ids) != rows:
        return False
    if not rows:
        return True
    eq = pc.equal(ids, records.column("runId").slice(0, rows))
    return bool(pc.all(pc.fill_null(eq, False)).as_py())


def _pending(cache: Path, man: _Manifest) -> dict[str, np.ndarray]:
    if not man.pending:
        return {}
    t = _cache.read_table(cache / man.pending)
    if not t.num_rows:
        return {}
    mat = t.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False).reshape(t.num_rows, man.dims)
    return dict(zip(t.column("runId").to_pylist(), mat))


def _remove_unlisted(cache: Path, key: str, man: _Manifest) -> None:
    keep = {b["file"] for b in man.blocks} | ({man.pending} if man.pending else set())
    prefix = f"vec-{key}-"
    with contextlib.suppress(OSError), os.scandir(cache) as it:
        for entry in it:
            if entry.name.startswith(prefix) and entry.name.endswith(".arrow") and entry.name not in keep:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def _place(records: pa.Table, updates: dict[str, np.ndarray]) -> tuple[np.ndarray, list[np.ndarray], dict[str, np.ndarray]]:
    """Rows of the records that updates name; updates with no record row stay pending."""
    ids = list(updates)
    pos = pc.index_in(pa.array(ids, pa.string()), value_set=records.column("runId")).to_pylist()
    rows, vecs, pending = [], [], {}
    for rid, p in zip(ids, pos):
        if p is None:
            pending[rid] = updates[rid]
        else:
            rows.append(p)
            vecs.append(updates[rid])
    return np.asarray(rows, dtype=np.int64), vecs, pending


class _Builder:
    """Refreshes one model's vector cache under the cache lock (the key: the model's newest
    dimension), or builds the index of one given dimension in memory (``dims``; no cache)."""

    def __init__(self, snap: Snapshot, model: str, cache: Path | None, dims: int | None = None):
        self.snap, self.model, self.cache, self.dims = snap, model, cache, dims
        self.key = _key(model)
        self.path = snap.store.embeddings_path
        self.problems: list[str] = []

    def _read(self, offset: int) -> bytes:
        try:
            return _io.read_file(self.path, limit=MAX_EMBEDDINGS_BYTES, offset=offset)
        except FileNotFoundError:
            return b""

    def full(self) -> tuple[_Manifest, list[_Block], dict[str, np.ndarray]]:
        """Everything from the start: one block over every record row."""
        man = _Manifest(self.model)
        state = _file_state(self.path)
        raw = self._read(0)
        parsed = _parse(raw, self.model, 1, self.path.name)
        man.ino = state[0] if state else 0
        man.consumed, man.lines, man.problems = parsed.consumed, parsed.lines, parsed.problems
        man.dims = self.dims or parsed.newest
        _consumed(man, state, raw[:parsed.consumed])
        n = self.snap.n
        ids, vectors = parsed.of(man.dims) if man.dims else ([], [])
        if not ids:
            man.rows = n
            return man, [], {}
        updates = dict(zip(ids, vectors))  # the last line of a run wins
        matrix = np.zeros((n, man.dims), dtype=np.float32)
        rows, vecs, pending = _place(self.snap.records, updates)
        if len(rows):
            matrix[rows] = np.asarray(vecs, dtype=np.float32)
        blocks = []
        if n:
            blocks.append(self._write_block(man, 0, matrix))
        man.rows = n
        self._write_pending(man, pending)
        return man, blocks, pending

    def _write_block(self, man: _Manifest, start: int, matrix: np.ndarray) -> _Block:
        rows = len(matrix)
        ids = self.snap.records.column("runId").slice(start, rows).combine_chunks()
        table = _block_table(ids, matrix)
        if self.cache is not None:
            name = man.new_file(self.key)
            _cache.write_table(self.cache / name, table)
            man.blocks = [b for b in man.blocks if b["start"] != start] + [{"file": name, "start": start, "stop": start + rows}]
            man.blocks.sort(key=lambda b: b["start"])
        return _block_of(table, start, matrix.shape[1])[0]

    def _write_pending(self, man: _Manifest, pending: dict[str, np.ndarray]) -> None:
        if self.cache is None:
            return
        if not pending:
            man.pending = None
            return
        mat = np.asarray(list(pending.values()), dtype=np.float32)
        name = man.new_file(self.key)
        _cache.write_table(self.cache / name, pa.table({
            "runId": pa.array(list(pending), pa.string()),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(mat.reshape(-1)), mat.shape[1]),
        }))
        man.pending = name

    def incremental(self, man: _Manifest, blocks: list[_Block]) -> tuple[_Manifest, list[_Block]] | None:
        """Bring a cached index up to date (None: start over)."""
        state = _file_state(self.path)
        if state is None:
            return None if man.consumed else self._extend(man, blocks, {})
        ino, size, _ = state
        if ino != man.ino or size < man.consumed:
            return None  # embeddings.jsonl was replaced or cut: it is not the file we read
        start = max(man.consumed - _TAIL, 0)
        raw = self._read(start)
        if raw[: man.consumed - start].hex() != man.tail:
            return None  # replaced by another file (an inode can be reused)
        raw = raw[man.consumed - start:]
        parsed = _parse(raw, self.model, man.lines + 1, self.path.name)
        updates = _pending(self.cache, man) if self.cache is not None else {}
        if parsed.newest is not None and parsed.newest != man.dims:
            return None  # the first vectors of this model, or its newest dimension changed: a new key
        for rid, vec in zip(*parsed.of(man.dims)) if man.dims else ():
            updates[rid] = np.asarray(vec, dtype=np.float32)  # the last line of a run wins
        man.consumed += parsed.consumed
        man.lines += parsed.lines
        if parsed.consumed:
            prev = bytes.fromhex(man.tail)
            _consumed(man, state, prev + raw[:parsed.consumed])
        else:
            _consumed(man, state, bytes.fromhex(man.tail))
        man.problems += [p for p in parsed.problems if p not in man.problems]
        return self._extend(man, blocks, updates)

    def _extend(self, man: _Manifest, blocks: list[_Block], updates: dict[str, np.ndarray]) -> tuple[_Manifest, list[_Block]]:
        n = self.snap.n
        rows, vecs, pending = _place(self.snap.records, updates) if updates else (np.zeros(0, np.int64), [], {})
        d = man.dims
        if d is None:
            man.rows = n
            self._write_pending(man, pending)
            return man, blocks
        # A vector for a row already covered (its first, or a later line of its run): rewrite the block that holds it.
        by_block: dict[int, list[int]] = {}
        for j, r in enumerate(rows):
            if r < man.rows:
                i = next(i for i, b in enumerate(blocks) if b.start <= r < b.stop)
                by_block.setdefault(i, []).append(j)
        for i, js in by_block.items():
            b = blocks[i]
            matrix = np.array(b.matrix, copy=True)
            for j in js:
                matrix[rows[j] - b.start] = vecs[j]
            blocks[i] = self._write_block(man, b.start, matrix)
        if n > man.rows:
            matrix = np.zeros((n - man.rows, d), dtype=np.float32)
            for j, r in enumerate(rows):
                if r >= man.rows:
                    matrix[r - man.rows] = vecs[j]
            blocks.append(self._write_block(man, man.rows, matrix))
            man.rows = n
        if len(blocks) > MAX_BLOCKS:
            whole = np.concatenate([b.matrix for b in blocks])
            man.blocks = []
            blocks = [self._write_block(man, 0, whole)]
        self._write_pending(man, pending)
        return man, blocks


def _index(man: _Manifest, blocks: list[_Block], n: int) -> VectorIndex | None:
    if man.dims is None or not blocks:
        return None
    index = VectorIndex(man.model, man.dims, n, blocks, consumed=man.consumed, problems=list(man.problems))
    return index if index.count else None


#: The vector indexes loaded for each live snapshot: (model, dims) -> index or None (none stored).
#: Kept as long as the snapshot is (a snapshot held by holding_snapshots keeps its vectors warm).
_LOADED: "weakref.WeakKeyDictionary[Snapshot, dict[tuple[str, int | None], VectorIndex | None]]" = weakref.WeakKeyDictionary()
_LOADED_LOCK = threading.Lock()


def _loaded(snap: Snapshot) -> dict[tuple[str, int | None], VectorIndex | None]:
    """The snapshot's loaded vector indexes (created empty on first use)."""
    with _LOADED_LOCK:
        return _LOADED.setdefault(snap, {})


def load_index(snap: Snapshot, model: str, *, dims: int | None = None, use_cache: bool = True) -> VectorIndex | None:
    """The vectors of ``model`` (and ``dims``) aligned with the snapshot's rows, or None when it has none.

    Args:
        snap: the snapshot whose rows the vectors align with.
        model: the embedding model.
        dims: the dimension (the key is (model, dims)); None: the model's newest, the dimension
            of its last line in embeddings.jsonl. Only the newest is cached; another dimension
            is read in memory (``cybmem embed`` asks for it when the server's answer changed).
        use_cache: False reads embeddings.jsonl without the Arrow cache.

    Loaded once per snapshot and key; the Arrow cache is refreshed incrementally (module
    docstring). Unusable lines are reported once each in ``snap.problems``.

    Raises:
        StoreError: embeddings.jsonl cannot be read at all (a symlink, not a regular file).
    """
    key = (model, dims)
    loaded = _loaded(snap)
    if key in loaded:
        return loaded[key]
    store = snap.store
    if store is None or not (store.embeddings_path.exists() or store.embeddings_path.is_symlink()):
        loaded[key] = None
        return None
    if dims is not None:
        newest = load_index(snap, model, use_cache=use_cache)
        if newest is not None and newest.dims == dims:
            loaded[key] = newest
            return newest
    cache = _cache.cache_dir(store.dir)
    if dims is not None or not (use_cache and cache.is_dir()) or snap.uncached or store.symlinked_dirs():
        cache = None  # another dimension, or a snapshot loaded without the cache: vectors in memory too
    index = _load(snap, model, cache, dims)
    if index is not None:
        from ..store.memory_store import ReadProblem

        for message in index.problems:
            problem = ReadProblem(str(store.embeddings_path), message)
            if problem not in snap.problems:
                snap.problems.append(problem)
    loaded[key] = index
    return index


def _load(snap: Snapshot, model: str, cache: Path | None, dims: int | None = None) -> VectorIndex | None:
    builder = _Builder(snap, model, cache, dims)
    if cache is None:
        man, blocks, _ = builder.full()
        return _index(man, blocks, snap.n)
    man_path = cache / f"vec-{builder.key}.json"
    for attempt in range(3):
        try:
            man = _Manifest.read(man_path, model)
            state = _file_state(builder.path)
            if man is not None and man.rows == snap.n and _fresh(man, state):
                if man.dims is None and not man.blocks:
                    return None  # no vector of this model in the file
                blocks, ids = _open_blocks(cache, man)
                if _aligned(ids, snap.records, man.rows):
                    return _index(man, blocks, snap.n)
            ensure_dir(cache)
            with locked(cache / ".lock"):
                man = _Manifest.read(man_path, model)
                result = None
                if man is not None:
                    try:
                        blocks, ids = _open_blocks(cache, man)
                        if _aligned(ids, snap.records, man.rows):
                            result = builder.incremental(man, blocks)
                    except (OSError, ValueError, KeyError, pa.ArrowException):
                        result = None
                if result is None:
                    man, blocks, _ = builder.full()
                else:
                    man, blocks = result
                man.write(man_path)
                _remove_unlisted(cache, builder.key, man)
                return _index(man, blocks, snap.n)
        except StoreError:
            raise
        except FileNotFoundError:
            if attempt == 2:
                raise
        except OSError:
            man, blocks, _ = _Builder(snap, model, None).full()  # a read-only cache: in memory
            return _index(man, blocks, snap.n)
    raise AssertionError("unreachable")


# --- configuration and the query vector --------------------------------------------------------


def embed_config_of(settings: Settings):
    """``remote.embed_config(settings.env)`` without importing httpx when embeddings are off.

    Returns:
        (config or None, warning or None): a value that is not understood is a warning, not an error.
    """
    if not settings.env.get("CYBERINE_MEMORY_EMBEDDINGS", "").strip():
        return None, None
    from ..clients.model_servers import embed_config

    try:
        return embed_config(settings.env), None
    except ValidationError as exc:
        return None, f"vector axis off: {exc}"


def query_vector(config, text: str) -> tuple[np.ndarray | None, str | None]:
    """Embed a dispatch-time query within the short query timeout; (vector, None) or (None, warning).

    The budget counts from here: the reachability probe and the HTTP client's import and setup
    are spent from it (an import cannot be cut short, the exchange can: it ends by the deadline
    whatever the server sends).
    Retries inside that budget back off briefly (20 ms, then 40): a dispatch waits for this
    call, and a stopped server refuses at once.
    """
    started = time.monotonic()
    clipped = embedding_text(text)
    if clipped is None:
        return None, None
    refused = _refused(config)
    if refused:
        return None, f"vector axis skipped, ranked by the other axes: {refused}"
    from ..clients.model_servers import Embedder

    quick = dataclasses.replace(config, backoff=min(config.backoff, 0.02))
    try:
        with Embedder(quick) as embedder:
            left = config.query_timeout - (time.monotonic() - started)
            return embedder.embed_query(clipped, timeout=left, budget=config.query_timeout), None
    except CybmemError as exc:
        return None, f"vector axis skipped, ranked by the other axes: {' '.join(str(exc).split())}"


def _refused(config) -> str | None:
    """Why a plain-http embeddings server cannot be reached at all (nothing listens), else None.

    One TCP connect (at most 0.2 s) before anything else: a configured but stopped local Ollama
    is common, and the dispatch then skips importing the HTTP client and its retries. Not done
    for https URLs (a remote server costs a round trip; its failures go through the client).
    """
    parts = urllib.parse.urlsplit(config.base_url)
    if parts.scheme != "http" or not parts.hostname:
        return None
    try:
        with socket.create_connection((parts.hostname, parts.port or 80), timeout=min(0.2, config.query_timeout)):
            return None
    except OSError as exc:
        why = "connection refused" if isinstance(exc, ConnectionRefusedError) else (
            "no answer within 0.2 s" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__))
        hint = (f"is Ollama running (`ollama serve`) at OLLAMA_HOST={config.base_url}?" if config.kind == "ollama"
                else "check that the server at CYBERINE_MEMORY_EMBEDDINGS is up")
        return f"nothing answers at {config.url} ({why}); {hint}"


# --- the backfill ---------------------------------------------------------------------------------


@dataclass
class EmbedResult:
    """What :func:`embed_missing` did."""

    project: str
    model: str
    records: int  # records in the project
    had: int  # records that already had a vector
    embedded: int
    empty: int  # records with no text to embed
    seconds: float
    dims: int | None
    warnings: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        """Records embedded per second."""
        return self.embedded / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {"project": self.project, "model": self.model, "records": self.records, "had": self.had,
                "embedded": self.embedded, "empty": self.empty, "dims": self.dims, "seconds": round(self.seconds, 3),
                "recordsPerSecond": round(self.rate, 1), "warnings": list(self.warnings)}


def _work(snap: Snapshot, index: VectorIndex | None) -> tuple[list[tuple[str, str]], int, int]:
    """(runId, text) of the records without a vector in ``index``, how many of those have no text, how many have one."""
    has = index.has if index is not None else np.zeros(snap.n, bool)
    missing = np.flatnonzero(~has)
    sub = snap.records.take(pa.array(missing, pa.int64())) if len(missing) else snap.records.slice(0, 0)
    ids = sub.column("runId").to_pylist()
    titles = issue_texts(snap.events, sorted({i for lst in sub.column("issues").to_pylist() for i in lst or ()})) if sub.num_rows else {}
    texts = [embedding_text(t) for t in keyword_texts(sub, titles)] if sub.num_rows else []
    work = [(rid, t) for rid, t in zip(ids, texts) if t is not None]
    return work, len(ids) - len(work), int(has.sum())


def _probe_text(snap: Snapshot) -> str | None:
    """The newest record's embedding text (what a probe of the server's current dimension embeds)."""
    for row in range(snap.n - 1, -1, -1):
        one = snap.records.slice(row, 1)
        text = embedding_text(keyword_texts(one, issue_texts(snap.events, list(one.column("issues")[0].as_py() or ())))[0])
        if text is not None:
            return text
    return None


def embed_missing(store: MemoryStore, settings: Settings, *, progress: bool | None = None, batch_size: int | None = None,
                  embedder=None) -> EmbedResult:
    """Embed every record of a project that has no vector for the configured model (``cybmem embed``).

    Texts are the keyword index's (task, summary, titles of the raised issues), cut to
    EMBED_TEXT_CHARS; batches go to the server in one request each and are appended to
    embeddings.jsonl as they come back (at most one line per record and model, checked under the
    project lock against other writers), so an interrupted backfill keeps what it did.

    Vectors are keyed by model and dimension: when the project has vectors of the model, one
    text goes to the server first, and if its answer has another dimension than the stored ones
    (the model changed under the same name) every record is embedded again for the new key.

    Raises:
        ValidationError: embeddings are not configured.
        RemoteError: the server failed after its retries (what was embedded before stays).
    """
    config, problem = embed_config_of(settings)
    if config is None:
        raise ValidationError(problem or "embeddings are off: set CYBERINE_MEMORY_EMBEDDINGS to `ollama` or an "
                                         "OpenAI-compatible base URL (and CYBERINE_MEMORY_EMBED_MODEL)")
    from ..clients.model_servers import Embedder, RemoteError

    t0 = time.perf_counter()
    snap = load_snapshot(store)
    warnings = [p.message for p in snap.problems]
    index = load_index(snap, config.model)
    work, empty, had = _work(snap, index)
    own = embedder is None
    embedder = embedder or Embedder(config)
    size = batch_size or config.batch_size
    done = 0
    dims = index.dims if index is not None else None
    ready: dict[str, np.ndarray] = {}  # texts already embedded (the first batch, or the probe)
    since: int | None = None  # the offset up to which no line of the key is unknown (append_embeddings)
    bar = None
    try:
        # The first batch goes out first (when every record has a vector of the stored key, the
        # newest record's text does): its answer says which key is current.
        first = [t for _, t in work[:size]] or ([text] if index is not None and (text := _probe_text(snap)) else [])
        if first:
            try:
                ready = dict(zip(first, embedder.embed(first)))
            except RemoteError as exc:
                raise RemoteError(f"embedded 0 of {len(work)} records, then: {exc}; run `cybmem embed` again") from None
            got = len(next(iter(ready.values())))
            if index is not None and got != index.dims:
                warnings.append(f"{config.model} now answers with {got} dimensions, the stored vectors have {index.dims}: "
                                "every record is embedded again (`cybmem doctor --repair` then drops the old ones)")
                index = load_index(snap, config.model, dims=got)
                work, empty, had = _work(snap, index)
                dims = got
                if index is None:  # no line of the new key anywhere: none can predate the file's end
                    since = store.embeddings_path.stat().st_size
        if since is None:
            since = index.consumed if index is not None else 0
        bar = Progress(len(work), f"embedding {store.slug}", enabled=progress)
        for i in range(0, len(work), size):
            chunk = work[i:i + size]
            try:
                asked = [t for _, t in chunk if t not in ready]
                fresh = dict(zip(asked, embedder.embed(asked))) if asked else {}
            except RemoteError as exc:
                raise RemoteError(f"embedded {done} of {len(work)} records, then: {exc}; run `cybmem embed` again to "
                                  "continue (what was embedded is kept)") from None
            vecs = [ready[t] if t in ready else fresh[t] for _, t in chunk]
            dims = len(vecs[0])
            wrote, since = store.append_embeddings([(rid, config.model, v) for (rid, _), v in zip(chunk, vecs)], since=since)
            done += wrote
            bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
        if own:
            embedder.close()
    return EmbedResult(store.slug, config.model, snap.n, had, done, empty, time.perf_counter() - t0, dims, warnings)
