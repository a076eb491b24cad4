"""The keyword index's file: its segments as one Arrow table (one row per segment, list columns,
the format version and BM25 parameters in the schema metadata), written and read back.

A posting is 3 bytes on disk: its doc id's low 16 bits and a one-byte tf (two when one does not
fit); a segment over 65,536 documents adds each term's high part and where it changes within the
term (:meth:`cybmem.store.keyword_index.Segment.packed_docs`). Impacts are not written. Reading checks
what a damaged file could make a query index out of bounds with, and says to rebuild the cache.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from ..arrow_numpy import array_of, numpy_of, strings
from .keyword_index import LO_SPAN, Segment

__all__ = ["SCHEMA", "VERSION", "from_table", "to_table"]

VERSION = "4"  # 4: doc ids as their low 16 bits + the high parts per term; 3: no impacts on disk; tfs in one byte when they fit

#: One row per segment, its arrays as list columns.
SCHEMA = pa.schema([
    ("n_docs", pa.int64()),
    ("vocab", pa.large_list(pa.string())),
    ("term_keys", pa.large_list(pa.uint64())),
    ("indptr", pa.large_list(pa.int64())),
    ("doc_lo", pa.large_list(pa.uint16())),  # each posting's doc id, low 16 bits ...
    ("term_hi", pa.large_list(pa.uint16())),  # ... the high 16 at each term's first posting (empty: all 0) ...
    ("split_pos", pa.large_list(pa.int64())),  # ... the postings within a term where they change ...
    ("split_hi", pa.large_list(pa.uint16())),  # ... and to what (see keyword_index.Segment.packed_docs)
    ("tfs8", pa.large_list(pa.uint8())),  # a segment's tfs when every one fits a byte (tfs16 empty) ...
    ("tfs16", pa.large_list(pa.uint16())),  # ... else here (tfs8 empty)
    ("doc_len", pa.large_list(pa.int32())),
    ("removed", pa.large_list(pa.int64())),
])


def to_table(segments: Sequence[Segment], packed: Sequence[tuple[np.ndarray, ...]], removed: np.ndarray | None,
             k1: float, b: float) -> pa.Table:
    """One row per segment (list columns) plus schema metadata (k1, b, version).

    Impacts are not written: they are 4 of a posting's 10 bytes, and what a fresh process
    reads of them is the few query terms' postings, which it scores from tf and doc length
    as fast (a held index computes them once, on its second query). A segment's tfs take one
    byte each when they fit. Write it with ``pyarrow.ipc.new_file`` and read it back
    memory-mapped with :func:`from_table`. ``packed``: each segment's doc ids as the file keeps
    them (:meth:`~cybmem.store.keyword_index.Segment.packed_docs`).
    """
    rows: dict[str, list] = {"n_docs": []}
    list_cols = ("vocab", "term_keys", "indptr", "doc_lo", "term_hi", "split_pos", "split_hi", "tfs8", "tfs16",
                 "doc_len", "removed")
    cols: dict[str, list[pa.Array]] = {n: [] for n in list_cols}
    for i, (seg, docs) in enumerate(zip(segments, packed)):
        rows["n_docs"].append(seg.n_docs)
        cols["vocab"].append(seg.vocab.cast(pa.string()))
        cols["term_keys"].append(array_of(seg.keys, pa.uint64()))
        cols["indptr"].append(array_of(seg.indptr, pa.int64()))
        for name, arr, typ in zip(("doc_lo", "term_hi", "split_pos", "split_hi"), docs,
                                  (pa.uint16(), pa.uint16(), pa.int64(), pa.uint16())):
            cols[name].append(array_of(arr, typ))
        narrow = not len(seg.tfs) or int(seg.tfs.max()) <= 0xFF
        cols["tfs8"].append(array_of(seg.tfs.astype(np.uint8) if narrow else np.zeros(0, np.uint8), pa.uint8()))
        cols["tfs16"].append(array_of(np.zeros(0, np.uint16) if narrow else seg.tfs.astype(np.uint16), pa.uint16()))
        cols["doc_len"].append(array_of(seg.doc_len, pa.int32()))
        rem = removed if (i == 0 and removed is not None) else np.zeros(0, np.int64)
        cols["removed"].append(array_of(rem, pa.int64()))
    arrays = [array_of(rows["n_docs"], pa.int64())]
    for name in cols:
        vals = cols[name]
        typ = SCHEMA.field(name).type
        lens = np.array([len(v) for v in vals], dtype=np.int64)
        offs = np.zeros(len(vals) + 1, dtype=np.int64)
        np.cumsum(lens, out=offs[1:])
        flat = pa.concat_arrays(vals) if vals else strings([]) if typ.value_type == pa.string() else array_of([], typ.value_type)
        arrays.append(pa.LargeListArray.from_arrays(array_of(offs), flat, type=typ))
    meta = {b"cybmem.kind": b"keyword-index", b"cybmem.version": VERSION.encode(),
            b"k1": repr(k1).encode(), b"b": repr(b).encode()}
    return pa.Table.from_arrays(arrays, schema=SCHEMA.with_metadata(meta))

def from_table(table: pa.Table | pa.RecordBatch) -> tuple[list[Segment], np.ndarray | None, float, float]:
    """The segments, removed doc ids, k1 and b of a :func:`to_table` table; numpy arrays are views
    of the Arrow buffers (zero-copy, so an IPC memory map stays a memory map)."""
    meta = table.schema.metadata or {}
    if meta.get(b"cybmem.kind") != b"keyword-index":
        raise ValueError("not a cybmem keyword index table (missing cybmem.kind metadata); "
                         "rebuild it with KeywordIndex.build(...).to_arrow()")
    if meta.get(b"cybmem.version") != VERSION.encode():
        raise ValueError(f"keyword index format {meta.get(b'cybmem.version')!r} is not "
                         f"{VERSION!r}; rebuild the cache")
    k1 = float(meta[b"k1"])
    b = float(meta[b"b"])
    batches = table.to_batches() if isinstance(table, pa.Table) else [table]
    segs: list[Segment] = []
    removed: list[np.ndarray] = []
    base = 0
    for batch in batches:
        c = {name: batch.column(name) for name in batch.schema.names}
        nd = numpy_of(c["n_docs"])
        views = {}
        for name in ("term_keys", "indptr", "doc_lo", "term_hi", "split_pos", "split_hi", "tfs8", "tfs16",
                     "doc_len", "removed"):
            la = c[name]
            views[name] = (numpy_of(la.offsets), numpy_of(la.values))
        vl = c["vocab"]
        voffs = numpy_of(vl.offsets)
        for r in range(len(batch)):
            def part(name, r=r):
                o, v = views[name]
                return v[o[r] : o[r + 1]]
            vocab = vl.values.slice(int(voffs[r]), int(voffs[r + 1] - voffs[r]))
            lo = part("doc_lo")
            tfs = part("tfs8")
            if len(tfs) != len(lo):
                tfs = part("tfs16")
            if len(tfs) != len(lo):
                raise ValueError(f"keyword index segment {r} is inconsistent ({len(tfs)} term frequencies for "
                                 f"{len(lo)} postings); rebuild the cache")
            indptr, doc_len = part("indptr"), part("doc_len")
            packed = (lo, part("term_hi"), part("split_pos"), part("split_hi"))
            wide = len(doc_len) > LO_SPAN
            top = (len(doc_len) - 1) >> 16  # the highest high part a doc id of this segment has
            if (len(packed[1]) != (len(indptr) - 1 if wide else 0) or len(packed[2]) != len(packed[3])
                    or (len(packed[2]) and not 0 < packed[2][0] <= packed[2][-1] < len(lo))
                    or (len(packed[1]) and int(packed[1].max()) > top)
                    or (len(packed[3]) and int(packed[3].max()) > top)):
                raise ValueError(f"keyword index segment {r} is inconsistent (the high parts of its doc ids do "
                                 f"not fit its {len(indptr) - 1} terms and {len(lo)} postings); rebuild the cache")
            if wide:
                seg = Segment(vocab, part("term_keys"), indptr, None, tfs, doc_len, packed=packed)
            else:
                seg = Segment(vocab, part("term_keys"), indptr, lo, tfs, doc_len)
            if seg.n_docs != nd[r]:
                raise ValueError(f"keyword index segment {r} is inconsistent ({seg.n_docs} doc "
                                 f"lengths for n_docs={nd[r]}); rebuild the cache")
            rem = part("removed")
            if len(rem):
                removed.append(rem + base)
            base += seg.n_docs
            segs.append(seg)
    rem_all = np.unique(np.concatenate(removed)) if removed else None
    return segs, rem_all, k1, b
