"""The segments of the keyword index: one immutable run of documents each, a sorted vocabulary
and CSC-like postings, built from token lists, merged, and their doc ids packed for the file.

The BM25 kernels (Robertson & Zaragoza 2009; Lucene 8+ BM25Similarity) a segment's postings are
scored with are here too; :class:`cybmem.store.keyword_index.KeywordIndex` sums them over segments.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa

# Arrays built and read through their buffers: pa.array, pa.scalar and to_numpy import pandas.
from ..arrow_numpy import array_of, numpy_of, scalar, string_lists, strings
from .sorted_strings import find_sorted, prefix_keys, string_buffers

__all__ = ["LO_SPAN", "Segment", "as_list_array", "bm25_idf", "bm25_tf", "first_postings", "map_terms",
           "merge_segments", "pack_docs", "segment_from_tokens", "unpack_docs"]

_TF_MAX = np.iinfo(np.uint16).max


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
            self._docs = unpack_docs(self.indptr, *self._packed)
        return self._docs

    def widen(self) -> None:
        """Keep every doc id as np.add.at's own index type (intp), which it otherwise converts to on
        each call (a held index's queries: ~20% of the BM25 scores at 7.7k and 100k records)."""
        if self._docs is None:  # decoded straight into intp: no int32 copy beside it
            self._docs = unpack_docs(self.indptr, *self._packed, dtype=np.intp)
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
        """(doc_lo, term_hi, split_pos, split_hi), the doc ids as the file keeps them (:func:`pack_docs`)."""
        return self._packed if self._packed is not None else pack_docs(self.indptr, self.doc_ids, self.n_docs)

    def lookup(self, terms_b: Sequence[bytes], qkeys: np.ndarray) -> list[int]:
        """Local term id of each query term, -1 when absent."""
        return find_sorted(self.keys, self._voff, self._vmv, terms_b, qkeys)

    def tf_part(self, avgdl: float, s: int, e: int, k1: float, b: float, docs: np.ndarray | None = None) -> np.ndarray:
        """BM25 tf-part of postings [s, e) (one term's, or all), computed from tf and doc length;
        ``docs``: their doc ids when the caller has them already."""
        tf = self.tfs[s:e].astype(np.float32)
        if docs is None:
            docs = self.doc_ids[s:e] if (s, e) == (0, len(self.tfs)) else self.docs(s, e)
        dl = self.doc_len[docs].astype(np.float32)
        return bm25_tf(tf, dl, avgdl, k1, b)

    def df(self) -> np.ndarray:
        return np.diff(self.indptr)


def first_postings(indptr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which terms have postings (a bool per term) and where each such term's first posting is."""
    nonempty = np.diff(indptr) > 0
    return nonempty, indptr[:-1][nonempty]


def pack_docs(indptr: np.ndarray, doc_ids: np.ndarray, n_docs: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(doc_lo, term_hi, split_pos, split_hi) of doc ids ascending within each term (see
    :data:`LO_SPAN`); the last three are empty for a segment of at most 65,536 documents."""
    lo = (doc_ids & (LO_SPAN - 1)).astype(np.uint16)
    if n_docs <= LO_SPAN:
        return lo, np.zeros(0, np.uint16), np.zeros(0, np.int64), np.zeros(0, np.uint16)
    hi = (doc_ids >> 16).astype(np.uint16)
    nonempty, starts = first_postings(indptr)
    term_hi = np.zeros(len(indptr) - 1, dtype=np.uint16)
    term_hi[nonempty] = hi[starts]
    change = np.zeros(len(hi), dtype=bool)
    change[1:] = hi[1:] != hi[:-1]
    change[starts] = False  # a term's first posting: its term_hi
    split_pos = np.flatnonzero(change).astype(np.int64)
    return lo, term_hi, split_pos, hi[split_pos]


def unpack_docs(indptr: np.ndarray, lo: np.ndarray, term_hi: np.ndarray, split_pos: np.ndarray,
                 split_hi: np.ndarray, dtype: Any = np.int32) -> np.ndarray:
    """Every posting's doc id (int32, or ``dtype``) from :func:`pack_docs`' arrays."""
    out = lo.astype(dtype)
    if not len(term_hi):
        return out
    nonempty, firsts = first_postings(indptr)
    at = np.concatenate([firsts, split_pos])
    highs = np.concatenate([term_hi[nonempty], split_hi])
    order = np.argsort(at, kind="stable")
    at, highs = at[order], highs[order]
    out |= np.repeat(highs.astype(dtype) << 16, np.diff(np.append(at, len(lo))))
    return out


def map_terms(src: Segment, dst: Segment) -> np.ndarray:
    """Position of each of src's terms in dst's vocabulary (-1 when absent)."""
    if len(src.vocab) == 0 or len(dst.vocab) == 0:
        return np.full(len(src.vocab), -1, dtype=np.int64)
    if len(src.vocab) <= 512:  # a small delta: binary searches, no hash table of dst
        terms_b = [bytes(src._vmv[src._voff[i] : src._voff[i + 1]]) for i in range(len(src.vocab))]
        return np.asarray(dst.lookup(terms_b, src.keys), dtype=np.int64)
    import pyarrow.compute as pc

    pos = pc.index_in(src.vocab, value_set=dst.vocab)
    return numpy_of(pc.fill_null(pos, scalar(-1, pos.type))).astype(np.int64)


def bm25_tf(tf: np.ndarray, dl: np.ndarray, avgdl: float, k1: float, b: float) -> np.ndarray:
    """tf / (tf + k1 * (1 - b + b * dl / avgdl)), float32, in place on dl.

    Robertson & Zaragoza 2009, eq. 3.15 (saturating tf with length normalisation) without
    the constant (k1 + 1) factor, as Lucene 8+ BM25Similarity and bm25s "lucene" do.
    """
    dl *= np.float32(k1 * b / avgdl)
    dl += np.float32(k1 * (1.0 - b))
    dl += tf
    np.divide(tf, dl, out=dl)
    return dl


def bm25_idf(n_docs: int, df: np.ndarray) -> np.ndarray:
    """Lucene BM25Similarity idf: ln(1 + (N - df + 0.5) / (df + 0.5)), never negative."""
    df = df.astype(np.float64)
    return np.log1p((n_docs - df + 0.5) / (df + 0.5))


def as_list_array(docs: Any) -> pa.Array:
    if isinstance(docs, pa.ChunkedArray):
        docs = docs.combine_chunks()
    if isinstance(docs, (pa.ListArray, pa.LargeListArray)):
        return docs
    return string_lists(docs if isinstance(docs, list) else list(docs), pa.large_list(pa.string()))


def segment_from_tokens(docs: Any) -> Segment:
    """Build a segment: dictionary-encode all tokens in Arrow, sort (term, doc) keys once."""
    import pyarrow.compute as pc  # lazy: a slow import, only paid when building

    la = as_list_array(docs)
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


def merge_segments(segs: Sequence[Segment]) -> Segment:
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
