"""The vector axis of a ranking: row-aligned vectors, the cosine kernel and the query vector.

Off unless ``CYBERINE_MEMORY_EMBEDDINGS`` is set. :class:`VectorIndex` holds one (model,
dimensions) key's vectors aligned with a snapshot's rows (a zero row: no vector, scores 0);
:meth:`VectorQuery.axis` is the exact top-k cosine axis, by one float32 mat-vec up to
:data:`EXACT_MAX_FLOATS` numbers and by sign bits then exact rescoring above; :func:`query_vector`
embeds a query within its short deadline, :func:`query_vectors` the queries of relevance judgments
as dispatch would have embedded them (what tuning's cosine axis compares). The cached index is
:mod:`cybmem.retrieval.vector_cache`, the backfill of ``cybmem embed``
:mod:`cybmem.retrieval.embed_backfill`.
"""

from __future__ import annotations

import dataclasses
import socket
import time
import urllib.parse
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..store.embeddings import embedding_text
from ..errors import CybmemError, ValidationError
from ..progress import Progress
from ..settings import Settings

if TYPE_CHECKING:  # pragma: no cover
    from ..store.snapshot import Snapshot
    from .judgments import Judgment

__all__ = [
    "EXACT_MAX_FLOATS",
    "WORD_BITS",
    "VectorBlock",
    "VectorIndex",
    "VectorQuery",
    "rescore_count",
    "sign_codes",
    "embed_config_of",
    "query_vector",
    "embed_queries",
    "query_vectors",
]

# One float32 mat-vec is memory-bound at 4 bytes a number; up to this many numbers (16 MB; 10k
# records of 384 dims) the exact scan stays cheap (benchmarks/RESULTS.md, "Figures the module
# docstrings quoted").
EXACT_MAX_FLOATS = 4_000_000
WORD_BITS = 64  #: sign bits are packed in uint64 words


def rescore_count(n: int) -> int:
    """How many rows nearest by Hamming distance are rescored exactly: 1% of the index, at least 256."""
    return max(256, n // 100)


def sign_codes(matrix: np.ndarray) -> np.ndarray:
    """The sign bits of each row (x > 0), packed into uint64 words: (rows, ceil(d / 64))."""
    m = np.asarray(matrix, dtype=np.float32)
    if m.ndim == 1:
        m = m[None, :]
    words = -(-m.shape[1] // WORD_BITS)
    bits = np.packbits(m > 0, axis=1)
    pad = words * 8 - bits.shape[1]
    if pad:
        bits = np.pad(bits, ((0, 0), (0, pad)))
    return np.ascontiguousarray(bits).view(np.uint64).reshape(m.shape[0], words)


# --- the index ------------------------------------------------------------------------------


@dataclass
class VectorBlock:
    """Contiguous rows of a vector index: the float32 vectors, their norms and their sign bits."""

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
    blocks: list[VectorBlock]
    consumed: int = 0  # bytes of embeddings.jsonl it was built from (embed_missing reads on from there)
    problems: list[str] = field(default_factory=list)  # unusable lines, as the cache's manifest lists them

    @classmethod
    def from_matrix(cls, matrix: np.ndarray, model: str = "", *, block_rows: int | None = None) -> "VectorIndex":
        """An in-memory index over a row-aligned matrix (zero rows: no vector), e.g. for benchmarks."""
        m = np.ascontiguousarray(matrix, dtype=np.float32)
        if m.ndim != 2:
            raise ValidationError(f"a vector matrix has two dimensions, got shape {m.shape}")
        step = block_rows or max(len(m), 1)
        blocks = [VectorBlock(i, min(i + step, len(m)), m[i:i + step], np.linalg.norm(m[i:i + step], axis=1).astype(np.float32),
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


# --- configuration and the query vectors --------------------------------------------------------


def embed_config_of(settings: Settings):
    """``remote.embed_config(settings.embeddings)`` without importing httpx when embeddings are off.

    Returns:
        (config or None, warning or None): a value that is not understood is a warning, not an error.
    """
    if not settings.embeddings.on:
        return None, None
    from ..clients.embeddings import embed_config

    try:
        return embed_config(settings.embeddings), None
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
    from ..clients.embeddings import Embedder

    quick = dataclasses.replace(config, backoff=min(config.backoff, 0.02))
    try:
        with Embedder(quick) as embedder:
            left = config.query_timeout - (time.monotonic() - started)
            return embedder.embed_query(clipped, timeout=left, budget=config.query_timeout), None
    except CybmemError as exc:
        return None, f"vector axis skipped, ranked by the other axes: {' '.join(str(exc).split())}"


def embed_queries(judgments: Sequence[Judgment], settings: Settings,
                  progress: bool | None = None) -> tuple[dict[str, np.ndarray], str | None]:
    """The embedding of every judgment's query text, as dispatch embeds a task (the configured
    model, CYBERINE_MEMORY_EMBEDDINGS); ({}, why) when they cannot be had. Never the query
    run's stored vector: that one was made from its record, summary and outcome included, which
    dispatch does not know yet."""
    config, problem = embed_config_of(settings)
    if config is None:
        return {}, problem or "CYBERINE_MEMORY_EMBEDDINGS is not set, so the queries cannot be embedded"
    texts = list(dict.fromkeys(t for t in (embedding_text(j.query) for j in judgments) if t))
    if not texts:
        return {}, "no judgment has query text to embed"
    from ..clients.embeddings import Embedder

    bar = Progress(len(texts), "embedding queries", enabled=progress)
    try:
        with Embedder(config) as embedder:
            out: dict[str, np.ndarray] = {}
            for start in range(0, len(texts), 64):
                batch = texts[start:start + 64]
                for text, vec in zip(batch, embedder.embed(batch)):
                    out[text] = np.asarray(vec, dtype=np.float32)
                bar.update(len(batch))
    except CybmemError as exc:
        return {}, f"the queries could not be embedded ({' '.join(str(exc).split())})"
    finally:
        bar.close()
    return out, None


def query_vectors(snap: Snapshot, judgments: Sequence[Judgment], settings: Settings,
                  progress: bool | None) -> tuple[dict[str, np.ndarray] | None, str, str | None]:
    """The queries' embeddings when the store has vectors (else None), why there are none, and the
    model they were made with (the stored vectors of that model are the ones to compare them with)."""
    if not snap.store.embeddings_path.exists():
        return None, "", None
    vecs, why = embed_queries(judgments, settings, progress)
    config, _ = embed_config_of(settings)
    return (vecs or None), ("" if vecs else f"w_vec is not searched: {why}"), (config.model if config else None)


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
