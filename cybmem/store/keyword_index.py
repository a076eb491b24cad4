"""The keyword index: BM25 over append-only segments of postings.

Keyword axis: BM25 (Robertson & Sparck Jones; Robertson & Zaragoza, "The Probabilistic
Relevance Framework: BM25 and Beyond", 2009) with Lucene's non-negative idf
``ln(1 + (N - df + 0.5) / (df + 0.5))`` and term weight ``tf / (tf + k1 * (1 - b + b * dl /
avgdl))``, k1=1.2, b=0.75: Lucene 8+ BM25Similarity, which drops Robertson's constant (k1 + 1)
numerator (rankings unchanged). Scores equal bm25s ``method="lucene"``. See :class:`KeywordIndex`.

Its segments are :mod:`cybmem.store.keyword_segments`; its file, :mod:`cybmem.store.keyword_index_file`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pyarrow as pa

from ..errors import StoreError
from .keyword_index_file import from_table, to_table
from .keyword_segments import Segment, as_list_array, bm25_idf, first_postings, map_terms, merge_segments, segment_from_tokens
from .sorted_strings import query_keys

__all__ = ["KeywordIndex", "QueryStats", "TermHits"]

_K1 = 1.2
_B = 0.75
#: A delta segment is merged with the other deltas once there are this many of them, so an
#: index refreshed one record at a time keeps a bounded number of segments (main + 1 delta
#: after each merge); the main segment is only rewritten by :meth:`KeywordIndex.compact`.
_MAX_DELTA_SEGMENTS = 8


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
    (:func:`~cybmem.store.keyword_segments.pack_docs`), about 0.2 bytes a posting at 1M.

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
        idx = cls([segment_from_tokens(docs)], k1=k1, b=b)
        idx._attach_impacts(0)
        return idx

    def extend(self, new_docs: Sequence[list[str]] | pa.Array) -> KeywordIndex:
        """Return an index with ``new_docs`` appended as a delta segment (no rebuild).

        Their global ids are ``n_docs, n_docs + 1, ...``. Deltas are merged among themselves
        once there are more than a handful; the main segment is never rewritten here. Cost:
        proportional to the new docs (plus the deltas when they are merged), not to N.
        """
        la = as_list_array(new_docs)
        if len(la) == 0:
            return self
        segs = list(self._segments) + [segment_from_tokens(la)]
        if len(segs) - 1 > _MAX_DELTA_SEGMENTS:
            segs = [segs[0], merge_segments(segs[1:])]
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
        seg = merge_segments(self._segments)
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
                pos = map_terms(other, seg)
                ok = pos >= 0
                df[pos[ok]] += other.df()[ok]
            else:
                pos = map_terms(seg, other)
                ok = pos >= 0
                df[ok] += other.df()[pos[ok]]
        return df

    def _compute_impacts(self, i: int) -> np.ndarray:
        """idf * tf-part for every posting of segment i under this index's statistics."""
        seg = self._segments[i]
        tfp = seg.tf_part(self.avgdl, 0, len(seg.tfs), self.k1, self.b)
        idf = bm25_idf(self.n_docs, self._global_df(i)).astype(np.float32)
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
        top = float(bm25_idf(n, np.zeros(1, dtype=np.int64))[0])
        if not terms:
            return 0.0, top
        df = np.array([self.document_frequency(t) for t in terms], dtype=np.int64)
        return float(bm25_idf(n, df).sum()), top

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
            qkeys = query_keys(terms_b)
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
        (:func:`~cybmem.store.keyword_segments.bm25_tf`, :func:`~cybmem.store.keyword_segments.bm25_idf`, as :meth:`_compute_impacts` applies them), added per
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
        idf = bm25_idf(stats.n_docs, np.asarray(stats.df, dtype=np.int64)).astype(np.float32)
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
            starts[first_postings(ip)[1]] = True
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
        has none for this index's statistics) and wide doc ids (:meth:`~cybmem.store.keyword_segments.Segment.widen`). Done once."""
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
        return to_table(self._segments, self._removed, self.k1, self.b)

    @classmethod
    def from_arrow(cls, table: pa.Table | pa.RecordBatch) -> KeywordIndex:
        """Rebuild from :meth:`to_arrow` output; numpy arrays are views of the Arrow buffers
        (zero-copy, so an IPC memory map stays a memory map)."""
        segments, removed, k1, b = from_table(table)
        return cls(segments, k1=k1, b=b, removed=removed)
