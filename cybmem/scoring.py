"""Vectorised multi-axis scorer: pure kernels over numpy arrays plus one entry point.

    score = w_kw * keyword + w_rec * exp(-ageDays / halfLife) + w_lin * lineage [+ w_vec * cosine]

computed over all records at once. The frame/cache layer pulls its columns once and calls
:func:`score`, :func:`rank` and :func:`explain`; the kernels (:func:`normalize_keyword`,
:func:`recency`, :func:`lineage_affinity`, :func:`cosine`, :func:`top_k`) are usable alone.

Tokenizer (:func:`tokenize`)
----------------------------
1. Text that is not pure ASCII is NFKC-normalised first (composed and decomposed accents
   compare equal), then everything is Unicode case-folded (``str.casefold``: "Straße" ->
   "strasse").
2. Words are runs of letters and digits, optionally joined by underscores; everything else
   splits (spaces, dots, dashes, slashes, ``#``, quotes...). "src/_pytest/main.py" ->
   src, pytest, main, py. Leading/trailing underscores are dropped ("__init__" -> init).
3. Identifiers are split into parts at underscores, lower->Upper changes, acronym ends
   ("HTTPServer" -> http, server) and letter<->digit changes ("py38" -> py, 38). When a word
   has more than one part, the whole word is kept too, case-folded with its underscores
   removed, so snake and camel spellings of one identifier meet:
   "parseOutcomeSections" -> parseoutcomesections, parse, outcome, sections;
   "test_login.py" -> testlogin, test, login, py; "testLogin" -> testlogin, test, login.
4. Tokens of one character and a small English stopword list (Lucene's EnglishAnalyzer stop
   set plus a few pronouns/auxiliaries, :data:`STOPWORDS`) are dropped.
5. Numbers are kept as tokens ("fixes #12038" -> fixes, 12038).
6. No stemming. A tiny suffix stripper (-ies/-ing/-ed/-es/-s) was measured on the pytest
   corpus qrels (132 queries, ``python benchmarks/bench_query.py --quality``): MRR@10
   0.221 -> 0.223 for BM25 alone and 0.376 -> 0.384 with the default weights, well inside
   the noise of so few queries (one query moves MRR by up to 0.008), so tokens stay exact
   and identifiers match as written.

Keyword axis: BM25 (Robertson & Sparck Jones; Robertson & Zaragoza, "The Probabilistic
Relevance Framework: BM25 and Beyond", 2009) with Lucene's non-negative idf
``ln(1 + (N - df + 0.5) / (df + 0.5))`` and term weight ``tf / (tf + k1 * (1 - b + b * dl /
avgdl))``, k1=1.2, b=0.75: Lucene 8+ BM25Similarity, which drops Robertson's constant (k1 + 1)
numerator (rankings unchanged). Scores equal bm25s ``method="lucene"``. See :class:`KeywordIndex`.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import re
import tempfile
import time
import unicodedata
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa

__all__ = [
    "STOPWORDS",
    "LINEAGE_ANCESTOR",
    "LINEAGE_CHAT",
    "LINEAGE_PREVIOUS",
    "LINEAGE_ROOT",
    "LINEAGE_MAX_DEPTH",
    "ENV_PREFIX",
    "MS_PER_DAY",
    "tokenize",
    "tokenize_many",
    "KeywordIndex",
    "normalize_keyword",
    "recency",
    "LineageContext",
    "RunLookup",
    "lineage_affinity",
    "cosine",
    "top_k",
    "Weights",
    "load_weights",
    "save_weights",
    "Scored",
    "score",
    "rank",
    "explain",
]

# --------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------

#: Lucene EnglishAnalyzer.ENGLISH_STOP_WORDS_SET (33 words) plus a few pronouns and
#: auxiliaries that carry no topic in commit/task text.
STOPWORDS: frozenset[str] = frozenset(
    """a an and are as at be but by for if in into is it no not of on or such that the their
    then there these they this to was will with
    we you our your its been has have had were which from so do does can would should""".split()
)

# A word: alphanumeric runs joined by single or repeated underscores ([^\W_] is "\w minus _",
# i.e. Unicode letters and digits).
_WORD_RE = re.compile(r"[^\W_]+(?:_+[^\W_]+)*")
# Parts of an ASCII identifier: acronym not followed by a lowercase letter (HTTP in
# HTTPServer), a capitalised or lowercase run, a digit run.
_ASCII_PART_RE = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def _unicode_parts(word: str) -> list[str]:
    """Split a non-ASCII word like :data:`_ASCII_PART_RE` does, using str predicates."""
    parts: list[str] = []
    for chunk in word.split("_"):
        if not chunk:
            continue
        start = 0
        n = len(chunk)
        for i in range(1, n):
            a, c = chunk[i - 1], chunk[i]
            boundary = (
                (a.isdigit() != c.isdigit())
                or (a.islower() and c.isupper())
                or (a.isupper() and c.isupper() and i + 1 < n and chunk[i + 1].islower())
            )
            if boundary:
                parts.append(chunk[start:i])
                start = i
        parts.append(chunk[start:])
    return parts


def tokenize(text: str) -> list[str]:
    """Split text into index terms (rules in the module docstring).

    Args:
        text: any text; None-like empty input gives [].

    Returns:
        Tokens in text order, duplicates kept (term frequency matters to BM25).

    Example:
        >>> tokenize("Fix parseOutcomeSections in src/_pytest/main.py (#12038)")
        ['fix', 'parseoutcomesections', 'parse', 'outcome', 'sections', 'src', 'pytest', 'main', 'py', '12038']
    """
    if not text:
        return []
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text)
    out: list[str] = []
    cache = _WORD_CACHE
    for word in _WORD_RE.findall(text):
        toks = cache.get(word)
        if toks is None:
            toks = _word_tokens(word)
            if len(cache) < _WORD_CACHE_MAX:
                cache[word] = toks
        out += toks
    return out


# Words repeat heavily across records (identifiers, paths, English), so each distinct word
# is split once: a dict lookup per word instead of regex work. Bounded, never evicted.
_WORD_CACHE: dict[str, tuple[str, ...]] = {}
_WORD_CACHE_MAX = 1_000_000


def _word_tokens(word: str) -> tuple[str, ...]:
    """The tokens of one word (see :func:`tokenize`)."""
    stop = STOPWORDS
    # Fast path: a plain lowercase word or a plain number (the vast majority).
    if word.isascii() and (word.isdigit() or (word.islower() and word.isalpha())):
        return (word,) if len(word) > 1 and word not in stop else ()
    out: list[str] = []
    parts = _ASCII_PART_RE.findall(word) if word.isascii() else _unicode_parts(word)
    if len(parts) > 1:
        whole = word.replace("_", "").casefold()
        if len(whole) > 1 and whole not in stop:
            out.append(whole)
    for part in parts:
        part = part.casefold()
        if len(part) > 1 and part not in stop:
            out.append(part)
    return tuple(out)


def tokenize_many(texts: Iterable[str]) -> list[list[str]]:
    """:func:`tokenize` over many texts."""
    return [tokenize(t) for t in texts]




# --------------------------------------------------------------------------------------
# Keyword index (BM25 over segmented postings)
# --------------------------------------------------------------------------------------

_K1 = 1.2
_B = 0.75
_TF_MAX = np.iinfo(np.uint16).max
#: A delta segment is merged with the other deltas once there are this many of them, so an
#: index refreshed one record at a time keeps a bounded number of segments (main + 1 delta
#: after each merge); the main segment is only rewritten by :meth:`KeywordIndex.compact`.
_MAX_DELTA_SEGMENTS = 8
_SCHEMA_VERSION = "2"


def _prefix_keys(offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
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


def _query_key(b: bytes) -> int:
    return int.from_bytes(b[:8].ljust(8, b"\0"), "big")


def _string_buffers(arr: pa.Array) -> tuple[np.ndarray, memoryview, np.ndarray]:
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
    out = []
    for b, lo, hi in zip(terms_b, los, his):
        if lo == hi:
            out.append(-1)
            continue
        j = lo
        if hi - lo > 1:
            j = lo + bisect.bisect_left(range(lo, hi), b, key=lambda i: bytes(mv[off[i] : off[i + 1]]))
        out.append(j if j < hi and mv[off[j] : off[j + 1]] == b else -1)
    return out


def _query_keys(terms_b: Sequence[bytes]) -> np.ndarray:
    return np.fromiter((_query_key(x) for x in terms_b), dtype=np.uint64, count=len(terms_b))


class _Segment:
    """One immutable run of documents: local sorted vocabulary + CSC-like postings.

    ``impact`` (optional) holds the full BM25 weight ``idf * tf-part`` of every posting for
    the index statistics ``impact_key = (N, total_len)`` it was computed under; it is only
    set on a segment created for (or loaded with) that index.
    """

    __slots__ = (
        "n_docs", "vocab", "keys", "indptr", "doc_ids", "tfs", "doc_len", "total_len",
        "impact", "impact_key", "_voff", "_vmv",
    )

    def __init__(self, vocab, keys, indptr, doc_ids, tfs, doc_len, impact=None, impact_key=None):
        self.vocab: pa.Array = vocab  # sorted byte-wise, unique
        self.keys: np.ndarray = keys  # uint64 prefix keys of vocab
        self.indptr: np.ndarray = indptr  # int64, len(vocab) + 1
        self.doc_ids: np.ndarray = doc_ids  # int32 local doc id per posting, sorted per term
        self.tfs: np.ndarray = tfs  # uint16 term frequency per posting
        self.doc_len: np.ndarray = doc_len  # int32 tokens per doc
        self.n_docs = len(doc_len)
        self.total_len = int(doc_len.sum(dtype=np.int64))
        self.impact: np.ndarray | None = impact  # float32 idf * tf-part per posting
        self.impact_key: tuple[int, int] | None = impact_key
        self._voff, self._vmv, _ = _string_buffers(vocab)

    def lookup(self, terms_b: Sequence[bytes], qkeys: np.ndarray) -> list[int]:
        """Local term id of each query term, -1 when absent."""
        return _find_sorted(self.keys, self._voff, self._vmv, terms_b, qkeys)

    def tf_part(self, avgdl: float, s: int, e: int, k1: float, b: float) -> np.ndarray:
        """BM25 tf-part of postings [s, e), computed from tf and doc length."""
        tf = self.tfs[s:e].astype(np.float32)
        dl = self.doc_len[self.doc_ids[s:e]].astype(np.float32)
        return _bm25_tf(tf, dl, avgdl, k1, b)

    def df(self) -> np.ndarray:
        return np.diff(self.indptr)


def _map_terms(src: _Segment, dst: _Segment) -> np.ndarray:
    """Position of each of src's terms in dst's vocabulary (-1 when absent)."""
    if len(src.vocab) == 0 or len(dst.vocab) == 0:
        return np.full(len(src.vocab), -1, dtype=np.int64)
    if len(src.vocab) <= 512:  # a small delta: binary searches, no hash table of dst
        terms_b = [bytes(src._vmv[src._voff[i] : src._voff[i + 1]]) for i in range(len(src.vocab))]
        return np.asarray(dst.lookup(terms_b, src.keys), dtype=np.int64)
    import pyarrow.compute as pc

    pos = pc.index_in(src.vocab, value_set=dst.vocab)
    return pc.fill_null(pos, -1).to_numpy().astype(np.int64)


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
    return pa.array(docs if isinstance(docs, list) else list(docs), type=pa.large_list(pa.string()))


def _segment_from_tokens(docs: Any) -> _Segment:
    """Build a segment: dictionary-encode all tokens in Arrow, sort (term, doc) keys once."""
    import pyarrow.compute as pc  # lazy: ~50 ms import, only paid when building

    la = _as_list_array(docs)
    n = len(la)
    loff = la.offsets.to_numpy().astype(np.int64)
    doc_len = np.diff(loff).astype(np.int32)
    flat = la.values.slice(int(loff[0]), int(loff[-1] - loff[0])) if n else pa.array([], pa.string())
    if len(flat) == 0:
        vocab = pa.array([], type=pa.string())
        seg = _Segment(vocab, np.zeros(0, np.uint64), np.zeros(1, np.int64), np.zeros(0, np.int32),
                       np.zeros(0, np.uint16), doc_len)
        return seg
    enc = pc.dictionary_encode(flat)
    uniq = enc.dictionary.cast(pa.string())
    order = pc.sort_indices(uniq).to_numpy()  # byte-wise order for strings
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    term = rank[enc.indices.to_numpy()]
    doc = np.repeat(np.arange(n, dtype=np.int64), doc_len)
    # One sort of packed (term << 32 | doc) keys groups postings by term, docs ascending.
    key = np.sort((term << 32) | doc)
    starts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
    ukey = key[starts]
    tf = np.diff(np.append(starts, len(key)))
    vocab = uniq.take(pa.array(order))
    V = len(vocab)
    indptr = np.zeros(V + 1, dtype=np.int64)
    np.cumsum(np.bincount(ukey >> 32, minlength=V), out=indptr[1:])
    doc_ids = (ukey & 0xFFFFFFFF).astype(np.int32)
    tfs = np.minimum(tf, _TF_MAX).astype(np.uint16)
    voff, _, vdata = _string_buffers(vocab)
    return _Segment(vocab, _prefix_keys(voff, vdata), indptr, doc_ids, tfs, doc_len)


def _merge_segments(segs: Sequence[_Segment]) -> _Segment:
    """Merge segments (in doc order) into one without re-tokenising: counting-sort scatter."""
    import pyarrow.compute as pc

    if len(segs) == 1:
        return segs[0]
    allv = pa.concat_arrays([s.vocab.cast(pa.string()) for s in segs])
    uniq = pc.unique(allv)
    gvocab = uniq.take(pc.sort_indices(uniq))
    G = len(gvocab)
    gmaps = [pc.index_in(s.vocab, value_set=gvocab).to_numpy().astype(np.int64) for s in segs]
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
        within = np.arange(len(s.doc_ids), dtype=np.int64) - np.repeat(s.indptr[:-1], lens)
        dest = np.repeat(fill[gm], lens) + within
        doc_ids[dest] = s.doc_ids + np.int32(offset)
        tfs[dest] = s.tfs
        fill[gm] += lens
        offset += s.n_docs
    doc_len = np.concatenate([s.doc_len for s in segs])
    voff, _, vdata = _string_buffers(gvocab)
    return _Segment(gvocab, _prefix_keys(voff, vdata), indptr, doc_ids, tfs, doc_len)


class KeywordIndex:
    """BM25 over append-only segments of postings.

    Storage per segment (CSC-like): a byte-wise sorted vocabulary (pyarrow string array) with
    uint64 8-byte prefix keys for binary search, ``indptr`` int64, ``doc_ids`` int32 (local,
    ascending within a term), ``tfs`` uint16, ``doc_len`` int32, and precomputed float32
    impacts ``idf * tf / (tf + k1 * (1 - b + b * dl / avgdl))`` per posting, valid for the
    index statistics (N, total length) they were computed under. A query looks up its terms
    by binary search (no dict is ever built) and adds their impacts into one dense float32
    array of length ``n_docs`` (idf and avgdl are over the union of segments).

    Doc ids are global: segment offset + local id, in the order documents were added (the
    caller orders records oldest -> newest). :meth:`extend` appends a delta segment and
    leaves the main one untouched; the main segment's impacts go stale because N and avgdl
    moved, so until they are recomputed (lazily, on the second query, or by :meth:`compact`)
    its query-term postings are scored from tf and doc length directly: the same numbers,
    a little slower. Removal is a mask (:meth:`remove`): removed docs score 0 and still
    count in N/df/avgdl, as in Lucene until a merge.

    Query terms are de-duplicated: each distinct query term counts once (the tokenizer
    already repeats identifier parts, so query multiplicity would mostly double-count them).
    """

    def __init__(self, segments: Sequence[_Segment], *, k1: float = _K1, b: float = _B,
                 removed: np.ndarray | None = None):
        self._segments = tuple(segments)
        self.k1 = float(k1)
        self.b = float(b)
        self.n_docs = sum(s.n_docs for s in self._segments)
        self.total_len = sum(s.total_len for s in self._segments)
        self.avgdl = self.total_len / self.n_docs if self.n_docs and self.total_len else 1.0
        self._key = (self.n_docs, self.total_len)
        self._removed = removed if removed is not None and len(removed) else None
        self._stale_queries = 0
        self._fresh: dict[int, np.ndarray] = {}

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
        segs: list[_Segment] = []
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
            seg = _Segment(seg.vocab, seg.keys, seg.indptr, seg.doc_ids, seg.tfs, seg.doc_len)
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
        tfp = seg.tf_part(self.avgdl, 0, len(seg.doc_ids), self.k1, self.b)
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
        b = term.encode()
        qk = _query_keys([b])
        df = 0
        for s in self._segments:
            t = s.lookup([b], qk)[0]
            if t >= 0:
                df += int(s.indptr[t + 1] - s.indptr[t])
        return df

    # -- query ----------------------------------------------------------------------------
    def _segment_impacts(self, i: int, seg: _Segment) -> np.ndarray | None:
        if seg.impact is not None and seg.impact_key == self._key:
            return seg.impact
        return self._fresh.get(i)

    def scores(self, query_tokens: Sequence[str], *, out: np.ndarray | None = None) -> np.ndarray:
        """Raw BM25 score of every document, float32 of length ``n_docs``.

        Args:
            query_tokens: tokens (e.g. ``tokenize(query)``); duplicates count once; unknown
                terms contribute nothing.
            out: optional float32 buffer of length n_docs to write into (avoids allocating).

        Returns:
            The scores; removed documents are 0.
        """
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
        terms_b = [t.encode() for t in terms]
        qkeys = _query_keys(terms_b)
        hits = []
        df = np.zeros(len(terms), dtype=np.int64)
        for si, seg in enumerate(self._segments):
            ip = seg.indptr
            for ti, t in enumerate(seg.lookup(terms_b, qkeys)):
                if t >= 0:
                    s, e = int(ip[t]), int(ip[t + 1])
                    df[ti] += e - s
                    hits.append((si, ti, s, e))
        if not hits:
            return res
        stale = False
        offset = 0
        hi = 0
        idf: list[np.float32] | None = None
        for si, seg in enumerate(self._segments):
            view = res if seg.n_docs == N else res[offset : offset + seg.n_docs]
            imp = self._segment_impacts(si, seg)
            while hi < len(hits) and hits[hi][0] == si:
                _, ti, s, e = hits[hi]
                hi += 1
                if imp is not None:
                    w = imp[s:e]
                else:
                    stale = True
                    if idf is None:  # Lucene idf per distinct query term, as plain floats
                        idf = [np.float32(math.log1p((N - d + 0.5) / (d + 0.5))) for d in df.tolist()]
                    w = seg.tf_part(self.avgdl, s, e, self.k1, self.b)
                    w *= idf[ti]
                # A term's postings hold each doc once, so `view[docs] += w` would be exact
                # too, but numpy >= 2's np.add.at fast path is ~2x faster than that gather +
                # scatter (measured: 100 vs 200 us for a 19k-posting query at 100k docs).
                np.add.at(view, seg.doc_ids[s:e], w)
            offset += seg.n_docs
        if stale:
            self._stale_queries += 1
            if self._stale_queries >= 2:  # a long-lived process: recompute impacts once
                self._refresh_impacts()
        if self._removed is not None:
            res[self._removed] = 0.0
        return res

    def _refresh_impacts(self) -> None:
        for i, seg in enumerate(self._segments):
            if self._segment_impacts(i, seg) is None:
                self._fresh[i] = self._compute_impacts(i)

    # -- Arrow serialisation --------------------------------------------------------------
    _ARROW_SCHEMA = pa.schema([
        ("n_docs", pa.int64()),
        ("impact_n_docs", pa.int64()),  # index statistics the impacts are valid for
        ("impact_total_len", pa.int64()),
        ("vocab", pa.large_list(pa.string())),
        ("term_keys", pa.large_list(pa.uint64())),
        ("indptr", pa.large_list(pa.int64())),
        ("doc_ids", pa.large_list(pa.int32())),
        ("tfs", pa.large_list(pa.uint16())),
        ("doc_len", pa.large_list(pa.int32())),
        ("impact", pa.large_list(pa.float32())),
        ("removed", pa.large_list(pa.int64())),
    ])

    def to_arrow(self) -> pa.Table:
        """One row per segment (list columns) plus schema metadata (k1, b, version).

        Impacts are written for the current statistics, so a reloaded index is warm. Write
        it with ``pyarrow.ipc.new_file`` and read it back memory-mapped with :meth:`from_arrow`.
        """
        rows: dict[str, list] = {f.name: [] for f in self._ARROW_SCHEMA}
        list_cols = ("vocab", "term_keys", "indptr", "doc_ids", "tfs", "doc_len", "impact", "removed")
        cols: dict[str, list[pa.Array]] = {n: [] for n in list_cols}
        for i, seg in enumerate(self._segments):
            imp = self._segment_impacts(i, seg)
            if imp is None:
                imp = self._compute_impacts(i)
            rows["n_docs"].append(seg.n_docs)
            rows["impact_n_docs"].append(self.n_docs)
            rows["impact_total_len"].append(self.total_len)
            cols["vocab"].append(seg.vocab.cast(pa.string()))
            cols["term_keys"].append(pa.array(seg.keys, type=pa.uint64()))
            cols["indptr"].append(pa.array(seg.indptr, type=pa.int64()))
            cols["doc_ids"].append(pa.array(seg.doc_ids, type=pa.int32()))
            cols["tfs"].append(pa.array(seg.tfs, type=pa.uint16()))
            cols["doc_len"].append(pa.array(seg.doc_len, type=pa.int32()))
            cols["impact"].append(pa.array(imp, type=pa.float32()))
            rem = self._removed if (i == 0 and self._removed is not None) else np.zeros(0, np.int64)
            cols["removed"].append(pa.array(rem, type=pa.int64()))
        arrays = [pa.array(rows[name], pa.int64()) for name in ("n_docs", "impact_n_docs", "impact_total_len")]
        for name in cols:
            vals = cols[name]
            typ = self._ARROW_SCHEMA.field(name).type
            lens = np.array([len(v) for v in vals], dtype=np.int64)
            offs = np.zeros(len(vals) + 1, dtype=np.int64)
            np.cumsum(lens, out=offs[1:])
            flat = pa.concat_arrays(vals) if vals else pa.array([], typ.value_type)
            arrays.append(pa.LargeListArray.from_arrays(pa.array(offs), flat, type=typ))
        meta = {b"cybmem.kind": b"keyword-index", b"cybmem.version": _SCHEMA_VERSION.encode(),
                b"k1": repr(self.k1).encode(), b"b": repr(self.b).encode()}
        return pa.Table.from_arrays(arrays, schema=self._ARROW_SCHEMA.with_metadata(meta))

    @classmethod
    def from_arrow(cls, table: pa.Table | pa.RecordBatch) -> KeywordIndex:
        """Rebuild from :meth:`to_arrow` output; numpy arrays are views of the Arrow buffers
        (zero-copy, so an IPC memory map stays a memory map)."""
        meta = table.schema.metadata or {}
        if meta.get(b"cybmem.kind") != b"keyword-index":
            raise ValueError("not a cybmem keyword index table (missing cybmem.kind metadata); "
                             "rebuild it with KeywordIndex.build(...).to_arrow()")
        if meta.get(b"cybmem.version") != _SCHEMA_VERSION.encode():
            raise ValueError(f"keyword index format {meta.get(b'cybmem.version')!r} is not "
                             f"{_SCHEMA_VERSION!r}; rebuild the cache")
        k1 = float(meta[b"k1"])
        b = float(meta[b"b"])
        batches = table.to_batches() if isinstance(table, pa.Table) else [table]
        segs: list[_Segment] = []
        removed: list[np.ndarray] = []
        base = 0
        for batch in batches:
            c = {name: batch.column(name) for name in batch.schema.names}
            nd = c["n_docs"].to_numpy()
            ikey = list(zip(c["impact_n_docs"].to_pylist(), c["impact_total_len"].to_pylist()))
            views = {}
            for name in ("term_keys", "indptr", "doc_ids", "tfs", "doc_len", "impact", "removed"):
                la = c[name]
                views[name] = (la.offsets.to_numpy(), la.values.to_numpy(zero_copy_only=True))
            vl = c["vocab"]
            voffs = vl.offsets.to_numpy()
            for r in range(len(batch)):
                def part(name, r=r):
                    o, v = views[name]
                    return v[o[r] : o[r + 1]]
                vocab = vl.values.slice(int(voffs[r]), int(voffs[r + 1] - voffs[r]))
                seg = _Segment(vocab, part("term_keys"), part("indptr"), part("doc_ids"),
                               part("tfs"), part("doc_len"), part("impact"), ikey[r])
                if seg.n_docs != nd[r]:
                    raise ValueError(f"keyword index segment {r} is inconsistent ({seg.n_docs} doc "
                                     f"lengths for n_docs={nd[r]}); rebuild the cache")
                rem = part("removed")
                if len(rem):
                    removed.append(rem + base)
                base += seg.n_docs
                segs.append(seg)
        rem_all = np.unique(np.concatenate(removed)) if removed else None
        return cls(segs, k1=k1, b=b, removed=rem_all)


# --------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------

MS_PER_DAY = 86_400_000


def normalize_keyword(raw: np.ndarray, mask: np.ndarray | None = None, *, scale: float = 1.0) -> np.ndarray:
    """Scale non-negative raw keyword scores to [0, 1] by their max over the candidates.

    Args:
        raw: raw scores (e.g. :meth:`KeywordIndex.scores`).
        mask: optional bool array; the max is taken over True entries only.
        scale: multiply the result by this (lets :func:`score` fold in w_kw for free).

    Returns:
        float32 array; all-zero (or empty) input stays zero.
    """
    raw = np.asarray(raw, dtype=np.float32)
    m = float(np.max(raw, where=mask, initial=0.0)) if mask is not None else float(raw.max(initial=0.0))
    if not m > 0.0 or not math.isfinite(m):
        return np.zeros(len(raw), dtype=np.float32)
    return raw * np.float32(scale / m)


# exp() of float32 arguments below about -87.3 lands in subnormals (< FLT_MIN = 1.18e-38),
# which x86 handles ~10x slower; with most records many e-folds old that dominated the
# whole query. Arguments are floored here, so recency >= exp(-87) = 1.6e-38: a deviation
# below float32's normal range, order preserved (non-increasing in age).
_EXP_FLOOR = np.float32(-87.0)


def _recency_into(ended_at_ms: np.ndarray, now_ms: int, half_life_days: float, weight: float) -> np.ndarray:
    """weight * exp(-ageDays / half_life_days), float32, in four passes.

    Computed as exp(clip((ended - now') * c, floor, ln w)) with c = 1 / (ms per day * h) and
    now' = now - ln(w) / c, which folds the weight into the exponent (exp(y) * w =
    exp(y + ln w)) and the future clip (age >= 0) into the clip's upper bound.
    """
    if not half_life_days > 0 or not math.isfinite(half_life_days):
        raise ValueError(f"half_life_days must be a positive finite number, got {half_life_days!r}")
    ended = np.asarray(ended_at_ms)
    if ended.dtype.kind not in "iuf":
        ended = ended.astype(np.int64)
    c = 1.0 / (MS_PER_DAY * half_life_days)
    lnw = math.log(weight)
    shifted_now = now_ms - lnw / c
    if ended.dtype.kind == "f":
        # float64 epoch ms (exact below 2**53) skips numpy's non-SIMD int64 -> float cast
        diff = np.subtract(ended, np.float64(shifted_now), dtype=np.float64)
    else:
        diff = np.subtract(ended, np.int64(round(shifted_now)), dtype=np.int64)
    x = np.empty(len(ended), dtype=np.float32)
    np.multiply(diff, np.float32(c), out=x, casting="unsafe")
    np.clip(x, _EXP_FLOOR, np.float32(lnw), out=x)
    np.exp(x, out=x)
    return x


def recency(ended_at_ms: np.ndarray, now_ms: int, half_life_days: float) -> np.ndarray:
    """exp(-ageDays / half_life_days), float32 in (0, 1].

    As written the formula makes ``half_life_days`` an e-folding time (a record that old
    scores 1/e = 0.37, not 0.5); a true half-life h corresponds to h / ln 2 here. Ages of
    records ending after ``now_ms`` are clipped to 0 (score 1). Values are floored at
    exp(-87) ~ 1.6e-38 to keep float32 exp out of slow subnormals.

    ``ended_at_ms`` may be int64 or float64 epoch ms; float64 (exact for epoch ms) is
    faster because numpy converts int64 to float without SIMD, so a caller scoring many
    queries should convert once and keep it.
    """
    return _recency_into(ended_at_ms, now_ms, half_life_days, 1.0)


#: Lineage affinity table (max over the rules that apply; otherwise 0).
LINEAGE_ANCESTOR = 1.0  # record is the new run's parent, grandparent, ... (parentRunId walk)
LINEAGE_CHAT = 0.8  # record was dispatched from the same chat session
LINEAGE_PREVIOUS = 0.6  # record is context.previous_run_id
LINEAGE_ROOT = 0.6  # record shares the new run's dispatch-chain root (or is that root)
LINEAGE_MAX_DEPTH = 64  # ancestor walk cap


@dataclass(frozen=True)
class LineageContext:
    """Lineage of the NEW run being dispatched (ids of prior runs; None when unknown)."""

    parent_run_id: str | None = None
    chat_session_id: str | None = None
    previous_run_id: str | None = None
    root_run_id: str | None = None


def _to_id_array(a: Any) -> Any:
    """Normalise an id column: numpy and pyarrow arrays stay (a one-chunk ChunkedArray is
    unwrapped; several chunks are kept, never copied); other sequences become object arrays."""
    if isinstance(a, pa.ChunkedArray):
        return a.chunk(0) if a.num_chunks == 1 else a
    if isinstance(a, (pa.Array, np.ndarray)):
        return a
    return np.asarray(a, dtype=object)


def _eq_mask(ids: Any, value: str) -> np.ndarray:
    """Bool array ``ids == value`` (missing ids never match).

    Fastest input is a pyarrow DictionaryArray (one lookup in the dictionary, then an
    integer compare over the codes); pyarrow string arrays use compute.equal; numpy arrays
    (object, str, StringDType) use ==.
    """
    if isinstance(ids, pa.ChunkedArray):
        if ids.num_chunks == 0:
            return np.zeros(0, dtype=bool)
        return np.concatenate([_eq_mask(c, value) for c in ids.chunks])
    if isinstance(ids, pa.DictionaryArray):
        d = ids.dictionary
        if len(d) <= 64:  # the usual case (few roots/chats): no compute-kernel overhead
            codes = np.array([i for i, v in enumerate(d.to_pylist()) if v == value], dtype=np.int64)
        else:
            codes = np.flatnonzero(_pa_equal(d, value))
        if len(codes) == 0:
            return np.zeros(len(ids), dtype=bool)
        idx = ids.indices
        if idx.null_count:
            import pyarrow.compute as pc

            idx = pc.fill_null(idx, -1)
        icodes = idx.to_numpy(zero_copy_only=False)
        if len(codes) == 1:
            return icodes == codes[0]
        return np.isin(icodes, codes)
    if isinstance(ids, pa.Array):
        return _pa_equal(ids, value)
    return np.asarray(ids == value, dtype=bool)


def _pa_equal(arr: pa.Array, value: str) -> np.ndarray:
    import pyarrow.compute as pc

    eq = pc.equal(arr, value)
    if eq.null_count:
        eq = pc.fill_null(eq, False)
    return eq.to_numpy(zero_copy_only=False)


def _id_at(ids: Any, i: int) -> str | None:
    v = ids[i]
    if isinstance(v, pa.Scalar):
        v = v.as_py()
    if v is None or v == "" or (isinstance(v, float) and math.isnan(v)):
        return None
    return str(v)


class RunLookup:
    """run id -> row position in O(log N), without a dict.

    Holds the run ids sorted byte-wise as one Arrow string array, their uint64 8-byte
    prefix keys and their row positions (the same binary search as the keyword vocabulary).
    Build it once per frame (one Arrow sort, O(N log N)) and pass it to
    :func:`lineage_affinity`; the ancestor walk then costs O(depth * log N).
    """

    __slots__ = ("sorted_ids", "keys", "positions", "_off", "_mv")

    def __init__(self, sorted_ids: pa.Array, keys: np.ndarray, positions: np.ndarray):
        self.sorted_ids = sorted_ids
        self.keys = keys
        self.positions = positions
        self._off, self._mv, _ = _string_buffers(sorted_ids)

    @classmethod
    def build(cls, run_ids: Any) -> RunLookup:
        """From a numpy (object/str) or pyarrow (string/dictionary) id column; missing
        (None/null) ids are left out."""
        import pyarrow.compute as pc

        ids = _to_id_array(run_ids)
        if isinstance(ids, np.ndarray):
            ids = pa.array(ids.tolist(), type=pa.string(), from_pandas=True)
        if ids.type != pa.string():  # dictionary / large_string columns
            ids = ids.cast(pa.string())
        order = pc.sort_indices(ids)  # nulls sort last by default
        order = order.slice(0, len(ids) - ids.null_count)
        sorted_ids = ids.take(order)
        off, _, data = _string_buffers(sorted_ids)
        return cls(sorted_ids, _prefix_keys(off, data), order.to_numpy().astype(np.int64))

    def find(self, run_id: str) -> int:
        """Row of ``run_id``, or -1."""
        b = run_id.encode()
        j = _find_sorted(self.keys, self._off, self._mv, [b], _query_keys([b]))[0]
        return int(self.positions[j]) if j >= 0 else -1


def _find_scan(ids: Any, run_id: str) -> int:
    hit = np.flatnonzero(_eq_mask(ids, run_id))
    return int(hit[0]) if len(hit) else -1


def lineage_affinity(run_ids: Any, parent_ids: Any, previous_ids: Any, root_ids: Any,
                     chat_ids: Any, context: LineageContext, *,
                     lookup: RunLookup | None = None) -> np.ndarray:
    """How closely each record is related to the new run, float32 in [0, 1].

    Rules (max over those that apply, module constants):

    ========================================================  =====
    record is an ancestor of the new run (parentRunId walk     1.0
    from context.parent_run_id upward, depth <= 64, cycles
    stop the walk)
    record.chatSessionId == context.chat_session_id            0.8
    record.runId == context.previous_run_id                    0.6
    record.rootRunId == context root, or record IS that root   0.6
    otherwise                                                  0.0
    ========================================================  =====

    Context root = context.root_run_id, else the parent record's rootRunId, else the
    topmost ancestor reached by the walk (a chain's first run has no rootRunId).

    Args:
        run_ids, parent_ids, previous_ids, root_ids, chat_ids: equal-length id columns,
            numpy object/str arrays (None or "" = missing) or pyarrow string / dictionary
            arrays. ``previous_ids`` is accepted for symmetry with the record schema; no rule
            uses a record's own previousRunId.
        context: lineage of the new run.
        lookup: a :class:`RunLookup` over ``run_ids`` (walk is O(depth log N)); without it
            each step is one vectorised O(N) scan.

    Returns:
        float32 array of affinities.
    """
    del previous_ids  # no rule needs it (see docstring)
    run_ids = _to_id_array(run_ids)
    n = len(run_ids)
    aff = np.zeros(n, dtype=np.float32)
    if n == 0:
        return aff
    parent_ids = _to_id_array(parent_ids)
    root_ids = _to_id_array(root_ids)
    chat_ids = _to_id_array(chat_ids)

    def find(rid: str) -> int:
        return lookup.find(rid) if lookup is not None else _find_scan(run_ids, rid)

    # Ancestors: walk parentRunId upward from the new run's parent.
    ancestors: list[int] = []
    seen: set[str] = set()
    cur = context.parent_run_id or None
    while cur and cur not in seen and len(ancestors) < LINEAGE_MAX_DEPTH:
        seen.add(cur)
        i = find(cur)
        if i < 0:
            break
        ancestors.append(i)
        cur = _id_at(parent_ids, i)

    root = context.root_run_id or None
    if root is None and ancestors:
        root = _id_at(root_ids, ancestors[0])
        if root is None:
            top = ancestors[-1]
            root = _id_at(root_ids, top) or _id_at(run_ids, top)
    if root:
        # aff is still all zero here: one pass writes the root rule
        np.multiply(_eq_mask(root_ids, root), np.float32(LINEAGE_ROOT), out=aff)
        i = find(root)
        if i >= 0:
            aff[i] = max(aff[i], LINEAGE_ROOT)
    if context.previous_run_id:
        i = find(context.previous_run_id)
        if i >= 0:
            aff[i] = max(aff[i], LINEAGE_PREVIOUS)
    if context.chat_session_id:
        m = _eq_mask(chat_ids, context.chat_session_id)
        np.maximum(aff, np.float32(LINEAGE_CHAT), out=aff, where=m)
    if ancestors:
        aff[np.asarray(ancestors, dtype=np.int64)] = LINEAGE_ANCESTOR
    return aff


def cosine(matrix: np.ndarray | None, qvec: np.ndarray | None, *, n: int | None = None,
           row_norms: np.ndarray | None = None) -> np.ndarray:
    """Cosine similarity of each row with ``qvec``, clipped to [0, 1], float32.

    Rows of zeros (records without an embedding) score 0. With ``matrix`` or ``qvec`` None
    the result is ``n`` zeros (the vector axis is off). ``row_norms`` may be passed when
    precomputed (it is the only O(N*d) work besides the mat-vec).
    """
    if matrix is None or qvec is None:
        if n is None:
            raise ValueError("cosine(None, ...) needs n= (the number of records)")
        return np.zeros(n, dtype=np.float32)
    m = np.asarray(matrix, dtype=np.float32)
    q = np.asarray(qvec, dtype=np.float32).ravel()
    if m.ndim != 2 or m.shape[1] != q.shape[0]:
        raise ValueError(f"matrix is {m.shape}, query vector has {q.shape[0]} dims; they must match")
    qn = float(np.linalg.norm(q))
    if qn == 0.0:
        return np.zeros(m.shape[0], dtype=np.float32)
    norms = np.linalg.norm(m, axis=1) if row_norms is None else np.asarray(row_norms, np.float32)
    dots = m @ (q / np.float32(qn))
    out = np.zeros(m.shape[0], dtype=np.float32)
    np.divide(dots, norms, out=out, where=norms > 0)
    np.clip(out, 0.0, 1.0, out=out)
    return out


def _select_top(s32: np.ndarray, cand: np.ndarray, k: int) -> np.ndarray:
    """Top k of ``s32[cand]`` by (score desc, index desc), best first.

    Each candidate gets a unique uint64 key: the float32 score's bits made order-preserving
    as unsigned (Herf, "Radix Tricks", 2001: flip all bits of negatives, the sign bit of
    positives) in the high word, the index in the low word. Unique keys keep argpartition
    away from its slow path on heavily tied inputs (most scores 0 is the common case), and
    the index in the key breaks ties newer-first for free.
    """
    v = s32[cand] + np.float32(0.0)  # copy; turns -0.0 into +0.0
    v[np.isnan(v)] = -np.inf
    bits = v.view(np.uint32)
    bits = np.where(bits >> np.uint32(31), ~bits, bits | np.uint32(0x80000000))
    keys = (bits.astype(np.uint64) << np.uint64(32)) | cand.astype(np.uint64)
    m = len(keys)
    if k < m:
        keys = keys[np.argpartition(keys, m - k)[m - k :]]
    keys.sort()
    return (keys[::-1] & np.uint64(0xFFFFFFFF)).astype(np.int64)


def top_k(scores: np.ndarray, k: int, mask: np.ndarray | None = None) -> np.ndarray:
    """Indices of the k highest scores, best first.

    Ties are broken by index descending: with documents ordered oldest -> newest, equal
    scores list the newer record first. ``mask`` False entries are never returned. Scores
    are compared as float32 (NaN counts as -inf). Cost: one blocked max pass picks the
    blocks that can hold a winner (the k-th largest block maximum t is a lower bound of the
    k-th largest score, so only entries >= t in blocks whose max >= t can win), then
    argpartition over those candidates and a sort of the k winners only.

    Returns:
        int64 array of length min(k, number of eligible entries).
    """
    s = np.ascontiguousarray(scores, dtype=np.float32)
    n = len(s)
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        if len(mask) != n:
            raise ValueError(f"mask has {len(mask)} entries for {n} scores")
    if k <= 0 or n == 0:
        return np.zeros(0, dtype=np.int64)
    if n >= (1 << 32):
        raise ValueError("top_k supports fewer than 2**32 scores")
    cand = None
    block = min(1024, n // (8 * k))
    if n >= 2048 and block >= 16:
        nb = n // block
        body = s[: nb * block].reshape(nb, block)
        bm = body.max(axis=1)
        t = np.partition(bm, nb - k)[nb - k]
        blocks = np.flatnonzero(bm >= t)
        if len(blocks) * 4 <= nb:
            rows = body[blocks]
            hit = rows >= t
            c = (blocks[:, None] * block + np.arange(block))[hit]
            tail = np.flatnonzero(s[nb * block :] >= t) + nb * block
            c = np.concatenate((c, tail)) if len(tail) else c
            if mask is not None:
                c = c[mask[c]]
            if len(c) >= k:
                cand = c
        else:
            # Heavy ties at t (typically most scores 0): everything above t, then the
            # highest-index entries equal to t, the exact answer set by the tie rule.
            above = np.flatnonzero(s > t)
            if mask is not None:
                above = above[mask[above]]
            if len(above) >= k:
                cand = above
            else:
                eq = np.flatnonzero(s == t)
                if mask is not None:
                    eq = eq[mask[eq]]
                need = k - len(above)
                if len(eq) >= need:
                    cand = np.concatenate((above, eq[len(eq) - need :]))
    if cand is None:
        cand = np.flatnonzero(mask) if mask is not None else np.arange(n, dtype=np.int64)
    if len(cand) == 0:
        return np.zeros(0, dtype=np.int64)
    return _select_top(s, cand, min(k, len(cand)))


# --------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------

ENV_PREFIX = "CYBERINE_MEMORY_"


@dataclass(frozen=True)
class Weights:
    """Axis weights and the recency time constant: the ONE place defaults live.

    Defaults measured on the pytest corpus qrels (132 queries, each scored as of its asOf;
    ``python benchmarks/bench_query.py --quality``), MRR@10 / recall@10: these defaults
    0.376 / 0.556; BM25 alone 0.221 / 0.322; recency alone 0.246 / 0.400; the earlier
    placeholder (0.6, 0.25, 0.15) 0.319 / 0.468. The optimum is a broad plateau (recency
    at 40-55% of the keyword+recency mass, time constant 14-120 days); 30 days keeps the
    last month's runs on top in a live orchestrator. The corpus has one chain root, so
    lineage is flat there; w_lin is set for live use, where parents and chats matter.
    """

    w_kw: float = 0.45
    w_rec: float = 0.4
    w_lin: float = 0.15
    w_vec: float = 0.0
    half_life_days: float = 30.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"weight {f.name} must be a number, got {v!r}")
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"weight {f.name} must be finite and >= 0, got {v!r}")
            object.__setattr__(self, f.name, float(v))
        if self.half_life_days <= 0:
            raise ValueError(f"weight half_life_days must be > 0, got {self.half_life_days!r}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, base: Weights | None = None) -> Weights:
        """Weights from a mapping of some of the fields (others from ``base`` or defaults)."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise ValueError(f"unknown weight key(s) {', '.join(unknown)}; allowed: {', '.join(names)}")
        merged = (base or cls()).to_dict()
        merged.update(d)
        return cls(**merged)

    def to_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_ENV_KEYS = {
    "w_kw": "W_KW",
    "w_rec": "W_REC",
    "w_lin": "W_LIN",
    "w_vec": "W_VEC",
    "half_life_days": "HALF_LIFE_DAYS",
}


def load_weights(files: Sequence[Path | str] = (), env: Mapping[str, str] | None = None) -> Weights:
    """Defaults, then each existing JSON file in order, then CYBERINE_MEMORY_W_* env vars.

    Files may carry a "savedAt" key (written by :func:`save_weights`); it is ignored.
    Missing files are skipped. A malformed file or env value raises ValueError naming it.
    """
    w = Weights()
    for f in files:
        p = Path(f)
        if not p.is_file():
            continue
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"weights file {p} is not valid JSON ({e}); fix it or delete it "
                             "to fall back to the defaults") from None
        if not isinstance(data, dict):
            raise ValueError(f"weights file {p} must hold a JSON object like "
                             '{"w_kw": 0.6, "w_rec": 0.25}; fix it or delete it')
        data = {k: v for k, v in data.items() if k != "savedAt"}
        try:
            w = Weights.from_dict(data, base=w)
        except ValueError as e:
            raise ValueError(f"weights file {p}: {e}; fix it or delete it") from None
    env = os.environ if env is None else env
    over: dict[str, float] = {}
    for key, suffix in _ENV_KEYS.items():
        var = ENV_PREFIX + suffix
        raw = env.get(var)
        if raw is None or raw.strip() == "":
            continue
        try:
            val = float(raw)
        except ValueError:
            raise ValueError(f"{var}={raw!r} is not a number; set it to e.g. {var}=0.3 or unset it") from None
        over[key] = val
    if over:
        try:
            w = Weights.from_dict(over, base=w)
        except ValueError as e:
            names = ", ".join(ENV_PREFIX + _ENV_KEYS[k] for k in over)
            raise ValueError(f"{e} (from environment {names}); use a finite value >= 0") from None
    return w


def save_weights(weights: Weights, path: Path | str) -> None:
    """Write weights as JSON (sorted keys + "savedAt" epoch ms) atomically: temp file in
    the same directory, fsync, os.replace."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    payload = dict(weights.to_dict(), savedAt=int(time.time() * 1000))
    text = json.dumps(payload, sort_keys=True, indent=2) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------

_AXES = ("keyword", "recency", "lineage", "vector")


@dataclass(frozen=True, eq=False)
class Scored:
    """Per-axis contributions (weight * axis value, float32; None = axis off) and total."""

    total: np.ndarray
    keyword: np.ndarray | None
    recency: np.ndarray | None
    lineage: np.ndarray | None
    vector: np.ndarray | None
    weights: Weights
    mask: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.total)


def score(*, keyword_raw: np.ndarray | None, ended_at_ms: np.ndarray, now_ms: int,
          lineage: np.ndarray | None, vector_cos: np.ndarray | None, weights: Weights,
          mask: np.ndarray | None = None) -> Scored:
    """Combine the axes over all records.

    Args:
        keyword_raw: raw BM25 (normalised here by its max over ``mask``), or None.
        ended_at_ms: int64 endedAt per record (for recency).
        now_ms: the dispatch time, epoch ms.
        lineage: :func:`lineage_affinity` output, or None.
        vector_cos: :func:`cosine` output, or None.
        weights: axis weights; an axis with weight 0 is skipped (contribution None).
        mask: bool array, False = not a candidate (kept for :func:`rank`).

    Returns:
        :class:`Scored`.
    """
    ended = np.asarray(ended_at_ms)
    n = len(ended)
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        if len(mask) != n:
            raise ValueError(f"mask has {len(mask)} entries for {n} records")

    def check(name: str, a: np.ndarray | None) -> np.ndarray | None:
        if a is None:
            return None
        a = np.asarray(a, dtype=np.float32)
        if len(a) != n:
            raise ValueError(f"{name} has {len(a)} entries for {n} records")
        return a

    kw = rec = lin = vec = None
    raw = check("keyword_raw", keyword_raw)
    if raw is not None and weights.w_kw > 0:
        kw = normalize_keyword(raw, mask, scale=weights.w_kw)
    if weights.w_rec > 0:
        rec = _recency_into(ended, now_ms, weights.half_life_days, weights.w_rec)
    la = check("lineage", lineage)
    if la is not None and weights.w_lin > 0:
        lin = la * np.float32(weights.w_lin)
    va = check("vector_cos", vector_cos)
    if va is not None and weights.w_vec > 0:
        vec = va * np.float32(weights.w_vec)
    parts = [c for c in (kw, rec, lin, vec) if c is not None]
    if not parts:
        total = np.zeros(n, dtype=np.float32)
    elif len(parts) == 1:
        total = parts[0].copy()
    else:
        total = parts[0] + parts[1]
        for c in parts[2:]:
            total += c
    return Scored(total=total, keyword=kw, recency=rec, lineage=lin, vector=vec,
                  weights=weights, mask=mask)


def rank(scored: Scored, k: int) -> list[int]:
    """Top-k record indices by total score (ties: newer/higher index first), mask applied."""
    return top_k(scored.total, k, scored.mask).tolist()


def explain(scored: Scored, idx: int) -> dict[str, Any]:
    """Per-axis breakdown of one record's score.

    Returns:
        {"index", "total", "contributions": {axis: w*value}, "values": {axis: value},
        "weights": {...}} with plain floats (0.0 for an axis that is off).
    """
    w = scored.weights
    wmap = {"keyword": w.w_kw, "recency": w.w_rec, "lineage": w.w_lin, "vector": w.w_vec}
    contrib: dict[str, float] = {}
    values: dict[str, float] = {}
    for axis in _AXES:
        arr = getattr(scored, axis)
        c = float(arr[idx]) if arr is not None else 0.0
        contrib[axis] = c
        values[axis] = c / wmap[axis] if wmap[axis] > 0 else 0.0
    return {"index": int(idx), "total": float(scored.total[idx]), "contributions": contrib,
            "values": values, "weights": w.to_dict()}
