"""The keyword index: BM25 over append-only segments of postings, and the byte-wise sorted string
search its vocabulary (and :mod:`cybmem.store.run_ids`) is looked up with.

Keyword axis: BM25 (Robertson & Sparck Jones; Robertson & Zaragoza, "The Probabilistic
Relevance Framework: BM25 and Beyond", 2009) with Lucene's non-negative idf
``ln(1 + (N - df + 0.5) / (df + 0.5))`` and term weight ``tf / (tf + k1 * (1 - b + b * dl /
avgdl))``, k1=1.2, b=0.75: Lucene 8+ BM25Similarity, which drops Robertson's constant (k1 + 1)
numerator (rankings unchanged). Scores equal bm25s ``method="lucene"``. See :class:`KeywordIndex`.
Its file (the segments as one Arrow table) is :mod:`cybmem.store.keyword_index_file`.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import pyarrow as pa

# Arrays built and read through their buffers: pa.array, pa.scalar and to_numpy import pandas.
from ..arrow_numpy import array_of, numpy_of, scalar, string_lists, strings
from ..errors import StoreError

__all__ = ["KeywordIndex", "LO_SPAN", "QueryStats", "Segment", "TermHits", "in_run", "prefix_keys", "query_key",
           "string_buffers"]

_K1 = 1.2
_B = 0.75
_TF_MAX = np.iinfo(np.uint16).max
#: A delta segment is merged with the other deltas once there are this many of them, so an
#: index refreshed one record at a time keeps a bounded number of segments (main + 1 delta
#: after each merge); the main segment is only rewritten by :meth:`KeywordIndex.compact`.
_MAX_DELTA_SEGMENTS = 8


def prefix_keys(offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
    """First 8 UTF-8 bytes of each string as a big-endian uint64, zero padded.

    For byte-wise sorted strings these keys are non-decreasing, so np.searchsorted finds the
    run of vocabulary entries sharing a query term's 8-byte prefix.
    """
    starts = offsets[:-1].astype(np.int64)
    lens = np.diff(offsets).astype(np.int64)
    keys = np.zeros(len(starts), dtype=np.uint64)
    last = max(len(data) - 1, 0)
    for j in range(8):
        has = lens > j
        byte = np.where(has, data[np.minimum(starts + j, last)] if len(data) else 0, 0)
        keys |= byte.astype(np.uint64) << np.uint64(8 * (7 - j))
    return keys


def query_key(b: bytes) -> int:
    return int.from_bytes(b[:8].ljust(8, b"\0"), "big")


def string_buffers(arr: pa.Array) -> tuple[np.ndarray, memoryview, np.ndarray]:
    """Zero-copy (offsets, data memoryview, data uint8) of a pyarrow string array."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if arr.type == pa.large_string():
        odt = np.int64
    elif arr.type == pa.string():
        odt = np.int32
    else:
        raise TypeError(f"vocabulary must be a string array, got {arr.type}")
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=odt)[arr.offset : arr.offset + len(arr) + 1]
    if bufs[2] is None:
        data = np.zeros(0, dtype=np.uint8)
    else:
        data = np.frombuffer(bufs[2], dtype=np.uint8)
    return offsets, memoryview(data), data


def _find_sorted(keys: np.ndarray, off: np.ndarray, mv: memoryview, terms_b: Sequence[bytes],
                 qkeys: np.ndarray) -> list[int]:
    """Positions of byte strings in a byte-wise sorted string array, -1 when absent.

    One vectorised searchsorted over the uint64 prefix keys finds each term's run of
    entries sharing its first 8 bytes; a run longer than one is bisected on the full bytes.
    O(log V) per term, and nothing is built at load time (no dict).
    """
    los = np.searchsorted(keys, qkeys, side="left").tolist()
    his = np.searchsorted(keys, qkeys, side="right").tolist()
    return [in_run(off, mv, b, lo, hi) for b, lo, hi in zip(terms_b, los, his)]


def in_run(off: np.ndarray, mv: memoryview, b: bytes, lo: int, hi: int) -> int:
    """Position of ``b`` among the sorted entries [lo, hi) sharing its 8-byte prefix, or -1."""
    if lo == hi:
        return -1
    j = lo
    if hi - lo > 1:
        j = lo + bisect.bisect_left(range(lo, hi), b, key=lambda i: bytes(mv[off[i] : off[i + 1]]))
    return j if j < hi and mv[off[j] : off[j + 1]] == b else -1


def _query_keys(terms_b: Sequence[bytes]) -> np.ndarray:
    return np.fromiter((query_key(x) for x in terms_b), dtype=np.uint64, count=len(terms_b))


#: A posting's doc id is kept on disk as its low 16 bits (``doc_lo``); a segment of more documents
#: than this also keeps each term's high part at its first posting (``term_hi``) and the postings
#: within a term where the high part changes (``split_pos`` / ``split_hi``): ids are ascending within
#: a term, so these are few (at 1M documents 1.2M (term, high part) runs for 19.8M postings).
LO_SPAN = 1 << 16


class Segment:
    """One immutable run of documents: local sorted vocabulary + CSC-like postings.

    ``impact`` (optional) holds the full BM25 weight ``idf * tf-part`` of every posting for
    the index statistics ``impact_key = (N, total_len)`` it was computed under; it is only
    set on a segment created for (or loaded with) that index.

    Doc ids: a built segment holds them as int32; a loaded one of at most 65,536 documents reads
    them in place as uint16 (``doc_lo``); a loaded larger one rebuilds a term's ids from
    ``doc_lo`` and its high parts when the term is asked for (:meth:`docs`), and all of them once
    when every posting is needed (:attr:`doc_ids`: a held index's impacts, a merge).
    """

    __slots__ = (
        "n_docs", "vocab", "keys", "indptr", "tfs", "doc_len", "total_len",
        "impact", "impact_key", "_voff", "_vmv", "_docs", "_packed",
    )

    def __init__(self, vocab, keys, indptr, doc_ids, tfs, doc_len, impact=None, impact_key=None, *,
                 packed: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None):
        self.vocab: pa.Array = vocab  # sorted byte-wise, unique
        self.keys: np.ndarray = keys  # uint64 prefix keys of vocab
        self.indptr: np.ndarray = indptr  # int64, len(vocab) + 1
        #: local doc id per posting, ascending per term (int32, or uint16 below 65,536 docs); None
        #: until decoded when the segment was loaded with ``packed``
        self._docs: np.ndarray | None = doc_ids
        #: (doc_lo, term_hi, split_pos, split_hi) of a loaded segment over 65,536 documents
        self._packed = packed
        self.tfs: np.ndarray = tfs  # uint16 term frequency per posting
        self.doc_len: np.ndarray = doc_len  # int32 tokens per doc
        self.n_docs = len(doc_len)
        self.total_len = int(doc_len.sum(dtype=np.int64))
        self.impact: np.ndarray | None = impact  # float32 idf * tf-part per posting
        self.impact_key: tuple[int, int] | None = impact_key
        self._voff, self._vmv, _ = string_buffers(vocab)

    @property
    def doc_ids(self) -> np.ndarray:
        """Every posting's local doc id (decoded once for a packed segment, then kept)."""
        if self._docs is None:
            self._docs = _unpack_docs(self.indptr, *self._packed)
        return self._docs

    def widen(self) -> None:
        """Keep every doc id as np.add.at's own index type (intp), which it otherwise converts to on
        each call (a held index's queries: ~20% of the BM25 scores at 7.7k and 100k records)."""
        if self._docs is None:  # decoded straight into intp: no int32 copy beside it
            self._docs = _unpack_docs(self.indptr, *self._packed, dtype=np.intp)
        elif self._docs.dtype != np.intp:
            self._docs = self._docs.astype(np.intp)

    def docs(self, s: int, e: int) -> np.ndarray:
        """Local doc ids of one term's postings [s, e)."""
        if self._docs is not None:
            return self._docs[s:e]
        lo, term_hi, split_pos, split_hi = self._packed
        t = int(np.searchsorted(self.indptr, s, side="right")) - 1
        out = lo[s:e].astype(np.int32)
        a, z = int(np.searchsorted(split_pos, s, side="right")), int(np.searchsorted(split_pos, e, side="left"))
        bounds = [s, *split_pos[a:z].tolist(), e]
        highs = [int(term_hi[t]), *split_hi[a:z].tolist()]
        for i, h in enumerate(highs):
            if h:
                out[bounds[i] - s : bounds[i + 1] - s] |= np.int32(h << 16)
        return out

    def packed_docs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(doc_lo, term_hi, split_pos, split_hi), the doc ids as the file keeps them (:func:`_pack_docs`)."""
        return self._packed if self._packed is not None else _pack_docs(self.indptr, self.doc_ids, self.n_docs)

    def lookup(self, terms_b: Sequence[bytes], qkeys: np.ndarray) -> list[int]:
        """Local term id of each query term, -1 when absent."""
        return _find_sorted(self.keys, self._voff, self._vmv, terms_b, qkeys)

    def tf_part(self, avgdl: float, s: int, e: int, k1: float, b: float, docs: np.ndarray | None = None) -> np.ndarray:
        """BM25 tf-part of postings [s, e) (one term's, or all), computed from tf and doc length;
        ``docs``: their doc ids when the caller has them already."""
        tf = self.tfs[s:e].astype(np.float32)
        if docs is None:
            docs = self.doc_ids[s:e] if (s, e) == (0, len(self.tfs)) else self.docs(s, e)
        dl = self.doc_len[docs].astype(np.float32)
        return _bm25_tf(tf, dl, avgdl, k1, b)

    def df(self) -> np.ndarray:
        return np.diff(self.indptr)


def _first_postings(indptr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which terms have postings (a bool per term) and where each such term's first posting is."""
    nonempty = np.diff(indptr) > 0
    return nonempty, indptr[:-1][nonempty]


def _pack_docs(indptr: np.ndarray, doc_ids: np.ndarray, n_docs: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(doc_lo, term_hi, split_pos, split_hi) of doc ids ascending within each term (see
    :data:`LO_SPAN`); the last three are empty for a segment of at most 65,536 documents."""
    lo = (doc_ids & (LO_SPAN - 1)).astype(np.uint16)
    if n_docs <= LO_SPAN:
        return lo, np.zeros(0, np.uint16), np.zeros(0, np.int64), np.zeros(0, np.uint16)
    hi = (doc_ids >> 16).astype(np.uint16)
    nonempty, starts = _first_postings(indptr)
    term_hi = np.zeros(len(indptr) - 1, dtype=np.uint16)
    term_hi[nonempty] = hi[starts]
    change = np.zeros(len(hi), dtype=bool)
    change[1:] = hi[1:] != hi[:-1]
    change[starts] = False  # a term's first posting: its term_hi
    split_pos = np.flatnonzero(change).astype(np.int64)
    return lo, term_hi, split_pos, hi[split_pos]


def _unpack_docs(indptr: np.ndarray, lo: np.ndarray, term_hi: np.ndarray, split_pos: np.ndarray,
                 split_hi: np.ndarray, dtype: Any = np.int32) -> np.ndarray:
    """Every posting's doc id (int32, or ``dtype``) from :func:`_pack_docs`' arrays."""
    out = lo.astype(dtype)
    if not len(term_hi):
        return out
    nonempty, firsts = _first_postings(indptr)
    at = np.concatenate([firsts, split_pos])
    highs = np.concatenate([term_hi[nonempty], split_hi])
    order = np.argsort(at, kind="stable")
    at, highs = at[order], highs[order]
    out |= np.repeat(highs.astype(dtype) << 16, np.diff(np.append(at, len(lo))))
    return out


def _map_terms(src: Segment, dst: Segment) -> np.ndarray:
    """Position of each of src's terms in dst's vocabulary (-1 when absent)."""
    if len(src.vocab) == 0 or len(dst.vocab) == 0:
        return np.full(len(src.vocab), -1, dtype=np.int64)
    if len(src.vocab) <= 512:  # a small delta: binary searches, no hash table of dst
        terms_b = [bytes(src._vmv[src._voff[i] : src._voff[i + 1]]) for i in range(len(src.vocab))]
        return np.asarray(dst.lookup(terms_b, src.keys), dtype=np.int64)
    import pyarrow.compute as pc

    pos = pc.index_in(src.vocab, value_set=dst.vocab)
    return numpy_of(pc.fill_null(pos, scalar(-1, pos.type))).astype(np.int64)


def _bm25_tf(tf: np.ndarray, dl: np.ndarray, avgdl: float, k1: float, b: float) -> np.ndarray:
    """tf / (tf + k1 * (1 - b + b * dl / avgdl)), float32, in place on dl.

    Robertson & Zaragoza 2009, eq. 3.15 (saturating tf with length normalisation) without
    the constant (k1 + 1) factor, as Lucene 8+ BM25Similarity and bm25s "lucene" do.
    """
    dl *= np.float32(k1 * b / avgdl)
    dl += np.float32(k1 * (1.0 - b))
    dl += tf
    np.divide(tf, dl, out=dl)
    return dl


def _bm25_idf(n_docs: int, df: np.ndarray) -> np.ndarray:
    """Lucene BM25Similarity idf: ln(1 + (N - df + 0.5) / (df + 0.5)), never negative."""
    df = df.astype(np.float64)
    return np.log1p((n_docs - df + 0.5) / (df + 0.5))


def _as_list_array(docs: Any) -> pa.Array:
    if isinstance(docs, pa.ChunkedArray):
        docs = docs.combine_chunks()
    if isinstance(docs, (pa.ListArray, pa.LargeListArray)):
        return docs
    return string_lists(docs if isinstance(docs, list) else list(docs), pa.large_list(pa.string()))


def _segment_from_tokens(docs: Any) -> Segment:
    """Build a segment: dictionary-encode all tokens in Arrow, sort (term, doc) keys once."""
    import pyarrow.compute as pc  # lazy: a slow import, only paid when building

    la = _as_list_array(docs)
    n = len(la)
    loff = numpy_of(la.offsets).astype(np.int64)
    doc_len = np.diff(loff).astype(np.int32)
    flat = la.values.slice(int(loff[0]), int(loff[-1] - loff[0])) if n else strings([])
    if len(flat) == 0:
        vocab = strings([])
        seg = Segment(vocab, np.zeros(0, np.uint64), np.zeros(1, np.int64), np.zeros(0, np.int32),
                       np.zeros(0, np.uint16), doc_len)
        return seg
    enc = pc.dictionary_encode(flat)
    uniq = enc.dictionary.cast(pa.string())
    order = numpy_of(pc.sort_indices(uniq))  # byte-wise order for strings
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    term = rank[numpy_of(enc.indices)]
    doc = np.repeat(np.arange(n, dtype=np.int64), doc_len)
    # One sort of packed (term << 32 | doc) keys groups postings by term, docs ascending.
    key = np.sort((term << 32) | doc)
    starts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
    ukey = key[starts]
    tf = np.diff(np.append(starts, len(key)))
    vocab = uniq.take(array_of(order))
    V = len(vocab)
    indptr = np.zeros(V + 1, dtype=np.int64)
    np.cumsum(np.bincount(ukey >> 32, minlength=V), out=indptr[1:])
    doc_ids = (ukey & 0xFFFFFFFF).astype(np.int32)
    tfs = np.minimum(tf, _TF_MAX).astype(np.uint16)
    voff, _, vdata = string_buffers(vocab)
    return Segment(vocab, prefix_keys(voff, vdata), indptr, doc_ids, tfs, doc_len)


def _merge_segments(segs: Sequence[Segment]) -> Segment:
    """Merge segments (in doc order) into one without re-tokenising: counting-sort scatter."""
    import pyarrow.compute as pc

    if len(segs) == 1:
        return segs[0]
    allv = pa.concat_arrays([s.vocab.cast(pa.string()) for s in segs])
    uniq = pc.unique(allv)
    gvocab = uniq.take(pc.sort_indices(uniq))
    G = len(gvocab)
    gmaps = [numpy_of(pc.index_in(s.vocab, value_set=gvocab)).astype(np.int64) for s in segs]
    df = np.zeros(G, dtype=np.int64)
    for s, gm in zip(segs, gmaps):
        df[gm] += np.diff(s.indptr)  # gm is injective per segment
    indptr = np.zeros(G + 1, dtype=np.int64)
    np.cumsum(df, out=indptr[1:])
    P = int(indptr[-1])
    doc_ids = np.empty(P, dtype=np.int32)
    tfs = np.empty(P, dtype=np.uint16)
    fill = indptr[:-1].copy()
    offset = 0
    for s, gm in zip(segs, gmaps):
        lens = np.diff(s.indptr)
        within = np.arange(len(s.tfs), dtype=np.int64) - np.repeat(s.indptr[:-1], lens)
        dest = np.repeat(fill[gm], lens) + within
        doc_ids[dest] = s.doc_ids + np.int32(offset)
        tfs[dest] = s.tfs
        fill[gm] += lens
        offset += s.n_docs
    doc_len = np.concatenate([s.doc_len for s in segs])
    voff, _, vdata = string_buffers(gvocab)
    return Segment(gvocab, prefix_keys(voff, vdata), indptr, doc_ids, tfs, doc_len)


@dataclass(frozen=True)
class QueryStats:
    """The collection statistics BM25 needs for one query: N, total length and each term's df.

    An index split into shards (one per machine and project of a fleet) scores a query exactly
    as one index over all documents would when every shard is scored under the statistics summed
    over the shards: ``sum(shard.query_stats(q) for shard in shards)`` (:meth:`KeywordIndex.query_stats`,
    then :meth:`KeywordIndex.scores` with ``stats=``).
    """

    terms: tuple[str, ...]  # the query's distinct terms, in query order
    n_docs: int = 0
    total_len: int = 0
    df: tuple[int, ...] = ()  # documents holding each term

    def __add__(self, other: "QueryStats") -> "QueryStats":
        if not isinstance(other, QueryStats):
            return NotImplemented
        if other.terms != self.terms:
            raise ValueError("cannot add statistics of different queries")
        df = tuple(a + b for a, b in zip(self.df, other.df)) if self.df and other.df else (self.df or other.df)
        return QueryStats(self.terms, self.n_docs + other.n_docs, self.total_len + other.total_len, df)

    def __radd__(self, other):  # sum() starts from 0
        return self if other == 0 else self.__add__(other)


@dataclass(frozen=True)
class TermHits:
    """A query's distinct terms, their document frequencies and which of some rows hold each
    (:meth:`KeywordIndex.term_hits`)."""

    terms: list[str]
    df: np.ndarray  # int64 per term
    held: np.ndarray  # bool, rows x terms


#: A loaded index scores its query terms' postings from tf and doc length (the impacts are not on
#: disk); one queried this often (a notebook, a tuning, a benchmark), or held and queried twice
#: (:meth:`KeywordIndex.hold`), computes every impact once and widens its doc ids. A one-shot process
#: (``cybmem inject`` asks two or three queries) never pays for that: 20 ms at 100k records, 0.2-1 s at 1M.
_SETTLE_AFTER = 8

#: Query terms whose postings an index keeps found (:meth:`KeywordIndex._postings_of`): a long-lived
#: reader's vocabulary of queries, a few hundred KB at most.
_POSTINGS_KEPT = 4096


def _damaged(exc: IndexError) -> StoreError:
    """What a query says of an index whose postings name a document it does not have (a cache file
    damaged on disk: :meth:`KeywordIndex.validate` finds it)."""
    return StoreError(f"the keyword index in the project's .cache is damaged ({exc}); run `cybmem doctor "
                      "--repair` (or delete the .cache directory) and it is rebuilt from the store's files")


def _df(postings: tuple[tuple[int, int, int], ...]) -> int:
    """Documents holding a term: the lengths of its postings (:meth:`KeywordIndex._postings_of`) summed."""
    return sum(e - s for _, s, e in postings)


class KeywordIndex:
    """BM25 over append-only segments of postings.

    Storage per segment (CSC-like): a byte-wise sorted vocabulary (pyarrow string array) with
    uint64 8-byte prefix keys for binary search, ``indptr`` int64, ``doc_ids`` int32 (local,
    ascending within a term), ``tfs`` uint16, ``doc_len`` int32, and precomputed float32
    impacts ``idf * tf / (tf + k1 * (1 - b + b * dl / avgdl))`` per posting, valid for the
    index statistics (N, total length) they were computed under. A query looks up its terms
    by binary search (no dict is ever built) and adds their impacts into one dense float32
    array of length ``n_docs`` (idf and avgdl are over the union of segments). The impacts live
    in memory only (:meth:`to_arrow` leaves them out): a loaded index scores its query terms'
    postings from tf and doc length, the same floats, and a long-lived one computes every impact
    once (on its second query when held, :meth:`hold`; else its :data:`_SETTLE_AFTER`-th). On disk
    a posting is 3 bytes: its doc id's low 16 bits and a one-byte tf (two when one does not fit); a
    segment over 65,536 documents adds each term's high part and where it changes within the term
    (:func:`_pack_docs`), about 0.2 bytes a posting at 1M.

    Doc ids are global: segment offset + local id, in the order documents were added (the
    caller orders records oldest -> newest). :meth:`extend` appends a delta segment and
    leaves the main one untouched; the main segment's impacts go stale because N and avgdl
    moved, so until they are recomputed (when the index settles, or by :meth:`compact`)
    its query-term postings are scored from tf and doc length directly: the same numbers,
    a little slower. Removal is a mask (:meth:`remove`): removed docs score 0 and still
    count in N/df/avgdl, as in Lucene until a merge.

    Query terms are de-duplicated: each distinct query term counts once (the tokenizer
    already repeats identifier parts, so query multiplicity would mostly double-count them).
    """

    def __init__(self, segments: Sequence[Segment], *, k1: float = _K1, b: float = _B,
                 removed: np.ndarray | None = None):
        self._segments = tuple(segments)
        self.k1 = float(k1)
        self.b = float(b)
        self.n_docs = sum(s.n_docs for s in self._segments)
        self._starts = tuple(itertools.accumulate((s.n_docs for s in self._segments[:-1]), initial=0))  # each segment's first doc id
        self.total_len = sum(s.total_len for s in self._segments)
        self.avgdl = self.total_len / self.n_docs if self.n_docs and self.total_len else 1.0
        self._key = (self.n_docs, self.total_len)
        self._removed = removed if removed is not None and len(removed) else None
        self._queries = 0
        self._held = False
        self._settled = False
        self._fresh: dict[int, np.ndarray] = {}
        #: each query term looked up so far -> its postings, ((segment, start, end), ...): an index
        #: never changes (extend, remove and a refresh make another), so a held one finds a term once
        self._postings: dict[str, tuple[tuple[int, int, int], ...]] = {}

    # -- construction -------------------------------------------------------------------
    @classmethod
    def build(cls, docs: Sequence[list[str]] | pa.Array, *, k1: float = _K1, b: float = _B) -> KeywordIndex:
        """Index token lists (one list per document, e.g. from :func:`tokenize_many`).

        Args:
            docs: token lists, or a pyarrow list<string> array of them.
            k1, b: BM25 parameters.

        Returns:
            A one-segment index with precomputed impacts.
        """
        idx = cls([_segment_from_tokens(docs)], k1=k1, b=b)
        idx._attach_impacts(0)
        return idx

    def extend(self, new_docs: Sequence[list[str]] | pa.Array) -> KeywordIndex:
        """Return an index with ``new_docs`` appended as a delta segment (no rebuild).

        Their global ids are ``n_docs, n_docs + 1, ...``. Deltas are merged among themselves
        once there are more than a handful; the main segment is never rewritten here. Cost:
        proportional to the new docs (plus the deltas when they are merged), not to N.
        """
        la = _as_list_array(new_docs)
        if len(la) == 0:
            return self
        segs = list(self._segments) + [_segment_from_tokens(la)]
        if len(segs) - 1 > _MAX_DELTA_SEGMENTS:
            segs = [segs[0], _merge_segments(segs[1:])]
        idx = KeywordIndex(segs, k1=self.k1, b=self.b, removed=self._removed)
        # Fresh impacts for the (small) delta segments; the main one is scored from tf until
        # it is refreshed (see the class docstring).
        for i in range(1, len(segs)):
            idx._attach_impacts(i)
        return idx

    @classmethod
    def concat(cls, parts: Sequence[KeywordIndex]) -> KeywordIndex:
        """Join indexes over consecutive runs of documents (ids shift by the earlier parts'
        sizes). Segments are shared, not copied; scores equal a build over all documents."""
        if not parts:
            return cls.build([])
        k1, b = parts[0].k1, parts[0].b
        if any((p.k1, p.b) != (k1, b) for p in parts):
            raise ValueError("cannot concat keyword indexes built with different k1/b")
        segs: list[Segment] = []
        removed: list[np.ndarray] = []
        base = 0
        for p in parts:
            segs.extend(p._segments)
            if p._removed is not None:
                removed.append(p._removed + base)
            base += p.n_docs
        return cls(segs, k1=k1, b=b, removed=np.concatenate(removed) if removed else None)

    def compact(self) -> KeywordIndex:
        """Merge all segments into one with fresh impacts (same doc ids, same scores)."""
        if len(self._segments) == 1 and self._segment_impacts(0, self._segments[0]) is not None:
            return self
        seg = _merge_segments(self._segments)
        if seg is self._segments[0]:  # one stale segment: copy it so the original stays as is
            seg = Segment(seg.vocab, seg.keys, seg.indptr, seg.doc_ids, seg.tfs, seg.doc_len)
        idx = KeywordIndex([seg], k1=self.k1, b=self.b, removed=self._removed)
        idx._attach_impacts(0)
        return idx

    def _global_df(self, i: int) -> np.ndarray:
        """Document frequency over all segments of each term of segment i."""
        seg = self._segments[i]
        df = seg.df().astype(np.int64)
        for j, other in enumerate(self._segments):
            if j == i or other.n_docs == 0:
                continue
            if len(other.vocab) <= len(seg.vocab):
                pos = _map_terms(other, seg)
                ok = pos >= 0
                df[pos[ok]] += other.df()[ok]
            else:
                pos = _map_terms(seg, other)
                ok = pos >= 0
                df[ok] += other.df()[pos[ok]]
        return df

    def _compute_impacts(self, i: int) -> np.ndarray:
        """idf * tf-part for every posting of segment i under this index's statistics."""
        seg = self._segments[i]
        tfp = seg.tf_part(self.avgdl, 0, len(seg.tfs), self.k1, self.b)
        idf = _bm25_idf(self.n_docs, self._global_df(i)).astype(np.float32)
        tfp *= np.repeat(idf, seg.df())
        return tfp

    def _attach_impacts(self, i: int) -> None:
        """Store impacts on a segment this index just created (not shared with another)."""
        seg = self._segments[i]
        seg.impact = self._compute_impacts(i)
        seg.impact_key = self._key

    def remove(self, doc_ids: Iterable[int] | np.ndarray) -> KeywordIndex:
        """Return an index where these global doc ids are masked out (score 0)."""
        ids = np.asarray(list(doc_ids) if not isinstance(doc_ids, np.ndarray) else doc_ids, dtype=np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.n_docs):
            raise ValueError(f"doc ids must be in [0, {self.n_docs}); got {ids.min()}..{ids.max()}")
        old = self._removed if self._removed is not None else np.zeros(0, np.int64)
        return KeywordIndex(self._segments, k1=self.k1, b=self.b, removed=np.union1d(old, ids))

    # -- introspection --------------------------------------------------------------------
    @property
    def n_segments(self) -> int:
        return len(self._segments)

    @property
    def live_mask(self) -> np.ndarray | None:
        """Bool array (True = live) or None when nothing was removed; pass to :func:`top_k`."""
        if self._removed is None:
            return None
        m = np.ones(self.n_docs, dtype=bool)
        m[self._removed] = False
        return m

    def __len__(self) -> int:
        return self.n_docs

    def __repr__(self) -> str:
        return (f"KeywordIndex(n_docs={self.n_docs}, segments={len(self._segments)}, "
                f"avgdl={self.avgdl:.2f})")

    def document_frequency(self, term: str) -> int:
        """Number of docs containing ``term`` across all segments."""
        return _df(self._postings_of([term])[0])

    def idf_mass(self, query_tokens: Sequence[str], *, n_docs: int | None = None) -> tuple[float, float]:
        """The sum of the idf of a query's distinct terms, terms no document holds included (at
        the idf of df 0), and that largest idf: what :func:`cybmem.retrieval.search.keyword_match`
        divides a score by (the square root of their product). ``n_docs``: the idf as if the
        collection had that many documents (the others holding none of the terms)."""
        n = self.n_docs if n_docs is None else int(n_docs)
        terms = list(dict.fromkeys(query_tokens))
        top = float(_bm25_idf(n, np.zeros(1, dtype=np.int64))[0])
        if not terms:
            return 0.0, top
        df = np.array([self.document_frequency(t) for t in terms], dtype=np.int64)
        return float(_bm25_idf(n, df).sum()), top

    # -- query ----------------------------------------------------------------------------
    def _segment_impacts(self, i: int, seg: Segment) -> np.ndarray | None:
        if seg.impact is not None and seg.impact_key == self._key:
            return seg.impact
        return self._fresh.get(i)

    def query_stats(self, query_tokens: Sequence[str]) -> QueryStats:
        """This index's share of the statistics a query is scored under (see :class:`QueryStats`)."""
        terms = tuple(dict.fromkeys(query_tokens))
        return QueryStats(terms, self.n_docs, self.total_len, tuple(self.document_frequency(t) for t in terms))

    def _postings_of(self, terms: list[str]) -> list[tuple[tuple[int, int, int], ...]]:
        """Each term's postings in each segment that has it: (segment, start, end) into its doc ids,
        looked up once per index (``_postings``; at most :data:`_POSTINGS_KEPT` terms are kept)."""
        kept = self._postings
        out = [kept.get(t) for t in terms]
        missing = [i for i, got in enumerate(out) if got is None]
        if missing:
            if len(kept) + len(missing) > _POSTINGS_KEPT:
                kept.clear()
            terms_b = [terms[i].encode() for i in missing]
            qkeys = _query_keys(terms_b)
            got: list[list[tuple[int, int, int]]] = [[] for _ in missing]
            for si, seg in enumerate(self._segments):
                ip = seg.indptr
                for j, t in enumerate(seg.lookup(terms_b, qkeys)):
                    if t >= 0:
                        got[j].append((si, int(ip[t]), int(ip[t + 1])))
            for i, posts in zip(missing, got):
                out[i] = kept[terms[i]] = tuple(posts)
        return out

    def scores(self, query_tokens: Sequence[str], *, out: np.ndarray | None = None,
               stats: QueryStats | None = None) -> np.ndarray:
        """Raw BM25 score of every document, float32 of length ``n_docs``.

        Args:
            query_tokens: tokens (e.g. ``tokenize(query)``); duplicates count once; unknown
                terms contribute nothing.
            out: optional float32 buffer of length n_docs to write into (avoids allocating).
            stats: score under these collection statistics instead of this index's own: this
                index is one shard of a larger collection (the sum of every shard's
                :meth:`query_stats`). The result equals that collection's index scores for
                these documents, float for float.

        Returns:
            The scores; removed documents are 0.
        """
        if stats is not None:
            return self._scores_under(query_tokens, stats, out)
        N = self.n_docs
        if out is None:
            res = np.zeros(N, dtype=np.float32)
        else:
            if out.dtype != np.float32 or out.shape != (N,):
                raise ValueError(f"out must be a float32 array of shape ({N},), got {out.dtype} {out.shape}")
            res = out
            res.fill(0.0)
        terms = list(dict.fromkeys(query_tokens))
        if not terms or N == 0:
            return res
        found = self._postings_of(terms)
        # by segment, then in query order: the order the scores are summed in
        hits = sorted((si, ti, s, e) for ti, posts in enumerate(found) for si, s, e in posts)
        if not hits:
            return res
        df = [_df(posts) for posts in found]
        try:
            self._add_hits(res, hits, df)
            self._queries += 1
            if not self._settled and self._queries >= (2 if self._held else _SETTLE_AFTER):
                self._settle()
        except IndexError as exc:
            raise _damaged(exc) from None
        if self._removed is not None:
            res[self._removed] = 0.0
        return res

    def _add_hits(self, res: np.ndarray, hits: list[tuple[int, int, int, int]], df: list[int]) -> None:
        """:meth:`scores`' sums: each hit (segment, query term, postings [s, e)) added into ``res``."""
        N, hi = self.n_docs, 0
        idf: list[np.float32] | None = None
        for si, seg in enumerate(self._segments):
            start = self._starts[si]
            view = res if seg.n_docs == N else res[start : start + seg.n_docs]
            imp = self._segment_impacts(si, seg)
            while hi < len(hits) and hits[hi][0] == si:
                _, ti, s, e = hits[hi]
                hi += 1
                docs = seg.docs(s, e)
                if imp is not None:
                    w = imp[s:e]
                else:
                    if idf is None:  # Lucene idf per distinct query term, as plain floats
                        idf = [np.float32(math.log1p((N - d + 0.5) / (d + 0.5))) for d in df]
                    w = seg.tf_part(self.avgdl, s, e, self.k1, self.b, docs)
                    w *= idf[ti]
                # A term's postings hold each doc once, so `view[docs] += w` would be exact
                # too, but numpy >= 2's np.add.at fast path is faster than that gather +
                # scatter (benchmarks/RESULTS.md, "Figures the module docstrings quoted").
                np.add.at(view, docs, w)

    def _scores_under(self, query_tokens: Sequence[str], stats: QueryStats, out: np.ndarray | None) -> np.ndarray:
        """:meth:`scores` under given statistics: the tf-part and idf from the same kernels
        (:func:`_bm25_tf`, :func:`_bm25_idf`, as :meth:`_compute_impacts` applies them), added per
        term in query order, so each document's sum is the one a single index computes."""
        N = self.n_docs
        res = np.zeros(N, dtype=np.float32) if out is None else out
        if out is not None:
            if out.dtype != np.float32 or out.shape != (N,):
                raise ValueError(f"out must be a float32 array of shape ({N},), got {out.dtype} {out.shape}")
            res.fill(0.0)
        terms = list(dict.fromkeys(query_tokens))
        if tuple(terms) != stats.terms:
            raise ValueError("stats were computed for another query")
        if not terms or N == 0 or stats.n_docs == 0:
            return res
        avgdl = stats.total_len / stats.n_docs if stats.total_len else 1.0
        idf = _bm25_idf(stats.n_docs, np.asarray(stats.df, dtype=np.int64)).astype(np.float32)
        # by segment, then in query order: the order :meth:`scores` sums in
        for si, ti, s, e in sorted((si, ti, s, e) for ti, posts in enumerate(self._postings_of(terms)) for si, s, e in posts):
            seg, start = self._segments[si], self._starts[si]
            view = res if seg.n_docs == N else res[start : start + seg.n_docs]
            docs = seg.docs(s, e)
            try:
                w = seg.tf_part(avgdl, s, e, self.k1, self.b, docs)
                w *= idf[ti]
                np.add.at(view, docs, w)
            except IndexError as exc:
                raise _damaged(exc) from None
        if self._removed is not None:
            res[self._removed] = 0.0
        return res

    def term_hits(self, query_tokens: Sequence[str], rows: np.ndarray) -> TermHits:
        """Which of a query's distinct terms each of ``rows`` holds, and each term's document
        frequency: what a run's evidence is judged by (cybmem.retrieval.evidence). Postings are
        found by binary search within each term's (ascending) doc ids, so the cost grows with the
        few rows asked about, not with the collection.

        Returns:
            A :class:`TermHits`: ``terms`` (distinct, in query order), ``df`` per term (0: no
            document holds it) and ``held``, a bool matrix rows x terms.
        """
        terms = list(dict.fromkeys(query_tokens))
        rows = np.asarray(rows, dtype=np.int64)
        held = np.zeros((len(rows), len(terms)), dtype=bool)
        postings = self._postings_of(terms) if terms else []
        df = np.array([_df(posts) for posts in postings], dtype=np.int64)
        if not terms or not len(rows):
            return TermHits(terms, df, held)
        for ti, posts in enumerate(postings):
            for si, s, e in posts:
                local = rows - self._starts[si]
                inside = (local >= 0) & (local < self._segments[si].n_docs)
                if inside.any():
                    docs = self._segments[si].docs(s, e)
                    want = local[inside].astype(docs.dtype)  # inside: below the segment's n_docs, so it fits
                    at = np.searchsorted(docs, want)
                    found = np.zeros(len(want), dtype=bool)
                    ok = at < len(docs)
                    found[ok] = docs[at[ok]] == want[ok]
                    held[np.flatnonzero(inside), ti] |= found
        if self._removed is not None:
            held[np.isin(rows, self._removed)] = False
        return TermHits(terms, df, held)

    def validate(self) -> None:
        """Check every posting (O(postings): ``cybmem doctor``, not every load): each doc id below its
        segment's documents and ascending within its term, each tf at least 1, the term offsets
        ascending to the postings' count. A cache file that reads as Arrow but holds other numbers
        (a flipped bit, a file written by another tool) would otherwise score a document that is not
        there, or fail a query.

        Raises:
            ValueError: what is wrong, and that the cache is to be rebuilt.
        """
        for r, seg in enumerate(self._segments):
            P = len(seg.tfs)
            ip = seg.indptr
            if len(ip) != len(seg.vocab) + 1 or (len(ip) and (ip[0] != 0 or ip[-1] != P or np.any(np.diff(ip) < 0))):
                raise ValueError(f"keyword index segment {r}: its term offsets do not cover its {P} postings; rebuild the cache")
            if not P:
                continue
            ids = seg.doc_ids
            if int(ids.max()) >= seg.n_docs:
                raise ValueError(f"keyword index segment {r}: a posting names document {int(ids.max())} of "
                                 f"{seg.n_docs}; rebuild the cache")
            starts = np.zeros(P, dtype=bool)
            starts[_first_postings(ip)[1]] = True
            if np.any((np.diff(ids.astype(np.int64)) <= 0) & ~starts[1:]):
                raise ValueError(f"keyword index segment {r}: a term's doc ids are not ascending; rebuild the cache")
            if int(seg.tfs.min()) < 1:
                raise ValueError(f"keyword index segment {r}: a posting has a term frequency of 0; rebuild the cache")

    def hold(self) -> KeywordIndex:
        """Mark this index as a long-lived reader's (the snapshots ``cybmem mcp`` holds,
        :meth:`cybmem.store.snapshot.Snapshot.prepare`): it settles (:meth:`_settle`) on its second
        query rather than its :data:`_SETTLE_AFTER`-th. Returns self."""
        self._held = True
        return self

    def _settle(self) -> None:
        """What pays off over many queries and not over one: every posting's impact (where a segment
        has none for this index's statistics) and wide doc ids (:meth:`Segment.widen`). Done once."""
        self._settled = True
        self._refresh_impacts()
        for seg in self._segments:
            seg.widen()

    def _refresh_impacts(self) -> None:
        for i, seg in enumerate(self._segments):
            if self._segment_impacts(i, seg) is None:
                self._fresh[i] = self._compute_impacts(i)

    # -- Arrow serialisation (the file: :mod:`cybmem.store.keyword_index_file`) ------------
    def to_arrow(self) -> pa.Table:
        """One row per segment (list columns) plus schema metadata (k1, b, version), impacts left
        out (:func:`cybmem.store.keyword_index_file.to_table`). Write it with ``pyarrow.ipc.new_file``
        and read it back memory-mapped with :meth:`from_arrow`."""
        from .keyword_index_file import to_table  # here: the file module builds this module's segments

        return to_table(self._segments, [seg.packed_docs() for seg in self._segments], self._removed, self.k1, self.b)

    @classmethod
    def from_arrow(cls, table: pa.Table | pa.RecordBatch) -> KeywordIndex:
        """Rebuild from :meth:`to_arrow` output; numpy arrays are views of the Arrow buffers
        (zero-copy, so an IPC memory map stays a memory map)."""
        from .keyword_index_file import from_table

        segments, removed, k1, b = from_table(table)
        return cls(segments, k1=k1, b=b, removed=removed)
