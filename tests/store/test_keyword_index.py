"""Tests for cybmem.store.keyword_index: the keyword index on hand-made documents."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cybmem.store import keyword_index as B
from cybmem.store.keyword_index import KeywordIndex

DAY = 86_400_000


# ---------------------------------------------------------------------------------------

DOCS = [["apple", "banana", "apple"], ["banana", "cherry"], ["cherry", "cherry", "cherry", "date"]]


def _bm25(tf, dl, avgdl, df, n, k1=1.2, b=0.75):
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
    return idf * tf / (tf + k1 * (1 - b + b * dl / avgdl))


def test_bm25_exact_values_three_docs():
    idx = KeywordIndex.build(DOCS)
    assert idx.n_docs == 3 and idx.avgdl == pytest.approx(3.0)
    got = idx.scores(["apple", "cherry", "nope"])
    want = [
        _bm25(2, 3, 3.0, 1, 3),
        _bm25(1, 2, 3.0, 2, 3),
        _bm25(3, 4, 3.0, 2, 3),
    ]
    assert got.dtype == np.float32 and got.shape == (3,)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # duplicates in the query count once; unknown and empty queries give zeros
    np.testing.assert_allclose(idx.scores(["apple", "apple", "cherry"]), got)
    assert not idx.scores(["nope"]).any()
    assert not idx.scores([]).any()
    assert idx.document_frequency("cherry") == 2 and idx.document_frequency("zzz") == 0


def test_bm25_out_buffer_is_reused_and_cleared():
    idx = KeywordIndex.build(DOCS)
    buf = np.full(3, 7.0, dtype=np.float32)
    res = idx.scores(["date"], out=buf)
    assert res is buf
    assert buf[0] == 0 and buf[1] == 0 and buf[2] > 0


def test_long_and_unicode_terms_lookup():
    terms = ["pytestcollectionmodifyitems", "pytestcollectionfinish", "pytestcollection",
             "pytestcollect", "pytestco", "pytestc", "école", "日本語テキスト"]
    docs = [[t] for t in terms] + [["filler"]]
    idx = KeywordIndex.build(docs)
    for i, t in enumerate(terms):
        s = idx.scores([t])
        assert np.flatnonzero(s).tolist() == [i], t
    assert not idx.scores(["pytestcollectionmodify"]).any()
    assert not idx.scores(["pytestcollectionmodifyitemsx"]).any()


def test_empty_index_and_empty_docs():
    idx = KeywordIndex.build([[], []])
    assert idx.n_docs == 2 and not idx.scores(["x"]).any()
    idx2 = idx.extend([["apple"]])
    assert np.flatnonzero(idx2.scores(["apple"])).tolist() == [2]


def _random_docs(rng, n, vocab=40):
    words = [f"w{i}" for i in range(vocab)] + ["pytestcollectionmodifyitems", "pytestcollectionfinish"]
    return [[words[j] for j in rng.integers(0, len(words), rng.integers(0, 12))] for _ in range(n)]


def test_extend_equals_build_on_union():
    rng = np.random.default_rng(7)
    docs = _random_docs(rng, 300)
    full = KeywordIndex.build(docs)
    inc = KeywordIndex.build(docs[:200])
    for lo in range(200, 300, 7):  # many small deltas: exercises the delta merge too
        inc = inc.extend(docs[lo : min(lo + 7, 300)])
    assert inc.n_docs == 300 and inc.n_segments <= 1 + B._MAX_DELTA_SEGMENTS
    queries = [["w1", "w2"], ["w3"], ["pytestcollectionmodifyitems", "w5", "w5"], ["zzz", "w39"]]
    for q in queries * 3:  # repeated: stale impacts, then refreshed ones
        np.testing.assert_allclose(inc.scores(q), full.scores(q), rtol=1e-5, atol=1e-6)
    comp = inc.compact()
    assert comp.n_segments == 1
    for q in queries:
        np.testing.assert_allclose(comp.scores(q), full.scores(q), rtol=1e-5, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["aa", "bb", "cc", "dd", "eeeeeeeeeex", "eeeeeeeeeey"]),
                         max_size=6), min_size=1, max_size=25),
       st.integers(min_value=0, max_value=25))
def test_extend_equals_build_property(docs, cut):
    cut = min(cut, len(docs))
    base = KeywordIndex.build(docs[:cut])
    inc = base.extend(docs[cut:])
    full = KeywordIndex.build(docs)
    for q in (["aa"], ["bb", "cc"], ["eeeeeeeeeex", "dd"]):
        np.testing.assert_allclose(inc.scores(q), full.scores(q), rtol=1e-5, atol=1e-6)


def test_extend_with_large_vocabularies_and_sibling_extends():
    # > 512 distinct terms on both sides exercises the hash-join path of the df merge
    base = [[f"t{i}", f"t{i + 1}", "common"] for i in range(0, 1400, 2)]
    delta_a = [[f"t{i}", f"u{i}"] for i in range(600, 1900)]
    delta_b = [[f"t{i}", f"v{i}"] for i in range(600, 1900)]
    idx = KeywordIndex.build(base)
    a = idx.extend(delta_a)
    b = idx.extend(delta_b)  # a sibling sharing the main segment, same sizes
    qs = [["t700", "u700"], ["common", "t1500"], ["v1000", "t3"]]
    for q in qs * 3:
        np.testing.assert_allclose(a.scores(q), KeywordIndex.build(base + delta_a).scores(q), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(b.scores(q), KeywordIndex.build(base + delta_b).scores(q), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(idx.scores(qs[1]), KeywordIndex.build(base).scores(qs[1]), rtol=1e-6)


def test_concat_equals_build_on_union():
    rng = np.random.default_rng(11)
    docs = _random_docs(rng, 90)
    parts = [KeywordIndex.build(docs[:40]), KeywordIndex.build(docs[40:41]).remove([0]),
             KeywordIndex.build(docs[41:])]
    joined = KeywordIndex.concat(parts)
    full = KeywordIndex.build(docs)
    assert joined.n_docs == 90 and joined.live_mask.tolist().count(False) == 1 and not joined.live_mask[40]
    for q in (["w1", "w2"], ["pytestcollectionfinish"], ["w3"]):
        want = full.scores(q)
        want[40] = 0.0
        np.testing.assert_allclose(joined.scores(q), want, rtol=1e-5, atol=1e-7)
    assert KeywordIndex.concat([]).n_docs == 0
    with pytest.raises(ValueError, match="k1"):
        KeywordIndex.concat([parts[0], KeywordIndex.build(docs, k1=2.0)])


def test_extend_leaves_main_segment_untouched():
    idx = KeywordIndex.build(DOCS)
    main = idx._segments[0]
    before = main.impact.copy()
    idx2 = idx.extend([["apple"]])
    assert idx2._segments[0] is main and np.array_equal(main.impact, before)
    assert idx.n_docs == 3 and idx2.n_docs == 4  # the original is unchanged


def test_remove_masks_docs():
    idx = KeywordIndex.build(DOCS).remove([1])
    s = idx.scores(["cherry"])
    assert s[1] == 0 and s[2] > 0
    assert idx.live_mask.tolist() == [True, False, True]
    assert KeywordIndex.build(DOCS).live_mask is None
    with pytest.raises(ValueError, match="doc ids"):
        idx.remove([3])


def _assert_same_index(a: KeywordIndex, b: KeywordIndex, queries):
    assert a.n_docs == b.n_docs and a.avgdl == pytest.approx(b.avgdl)
    for q in queries:
        np.testing.assert_allclose(a.scores(q), b.scores(q), rtol=1e-6)


def test_arrow_round_trip_in_memory():
    rng = np.random.default_rng(3)
    docs = _random_docs(rng, 120)
    idx = KeywordIndex.build(docs[:100]).extend(docs[100:]).remove([5])
    table = idx.to_arrow()
    assert isinstance(table, pa.Table) and table.num_rows == 2
    back = KeywordIndex.from_arrow(table)
    assert back.n_segments == 2 and back.live_mask[5] == False  # noqa: E712
    _assert_same_index(idx, back, [["w1", "w2"], ["pytestcollectionfinish"], ["w0"]])


def test_arrow_round_trip_through_ipc_memory_map(tmp_path):
    rng = np.random.default_rng(4)
    docs = _random_docs(rng, 200)
    idx = KeywordIndex.build(docs)
    path = tmp_path / "kw.arrow"
    table = idx.to_arrow()
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    mm = pa.memory_map(str(path), "r")
    back = KeywordIndex.from_arrow(pa.ipc.open_file(mm).read_all())
    _assert_same_index(idx, back, [["w1", "w2"], ["w7", "pytestcollectionmodifyitems"]])
    seg = back._segments[0]
    # zero-copy: the numpy arrays are views of the mapped file, not copies
    for arr in (seg.doc_ids, seg.indptr, seg.tfs, seg.keys):
        assert not arr.flags.owndata
        assert not arr.flags.writeable
    # impacts are not on disk (4 of a posting's 10 bytes), tfs take a byte when they fit
    assert seg.impact is None and seg.tfs.dtype == np.uint8 and "impact" not in table.schema.names
    q = ["w1", "w2"]
    first = back.scores(q)  # from tf and doc length
    back.scores(q)
    back.scores(q)  # a one-shot process's few queries (cybmem inject): nothing computed for every posting
    assert back._segment_impacts(0, seg) is None and seg.doc_ids.dtype == np.uint16
    back.hold()  # a long-lived reader's (Snapshot.prepare): its next query settles it, once
    assert np.array_equal(back.scores(q), first)
    assert back._segment_impacts(0, seg) is not None and seg.doc_ids.dtype == np.intp
    assert np.array_equal(back.scores(q), first) and np.array_equal(first, idx.scores(q))
    # not held: it settles after B._SETTLE_AFTER queries (a notebook's loop), with the same scores
    other = KeywordIndex.from_arrow(pa.ipc.open_file(mm).read_all())
    for i in range(B._SETTLE_AFTER):
        assert other._segment_impacts(0, other._segments[0]) is None
        assert np.array_equal(other.scores(q), first)
    assert other._segment_impacts(0, other._segments[0]) is not None and np.array_equal(other.scores(q), first)
    # a loaded index can still be extended
    ext = back.extend([["w1"]])
    _assert_same_index(ext, KeywordIndex.build(docs + [["w1"]]), [["w1"]])


def test_a_term_frequency_over_a_byte_round_trips(tmp_path):
    """A segment whose tfs do not all fit a byte keeps them in two bytes on disk."""
    docs = [["w1"] * 300 + ["w2"], ["w1", "w3"], ["w2"] * 7]
    idx = KeywordIndex.build(docs)
    table = idx.to_arrow()
    back = KeywordIndex.from_arrow(table)
    assert back._segments[0].tfs.dtype == np.uint16 and int(back._segments[0].tfs.max()) == 300
    assert len(table.column("tfs8")[0]) == 0
    _assert_same_index(idx, back, [["w1"], ["w2", "w3"]])
    narrow = KeywordIndex.from_arrow(KeywordIndex.build(docs[1:]).to_arrow())
    assert narrow._segments[0].tfs.dtype == np.uint8
    # a table whose tfs do not match its postings is refused, not read wrong
    bad = table.set_column(table.schema.get_field_index("tfs16"), "tfs16",
                           pa.array([[1, 2]], type=pa.large_list(pa.uint16())))
    with pytest.raises(ValueError, match="term frequencies"):
        KeywordIndex.from_arrow(bad)


def test_from_arrow_rejects_foreign_tables():
    with pytest.raises(ValueError, match="keyword index"):
        KeywordIndex.from_arrow(pa.table({"a": [1]}))


def test_a_segment_over_65536_documents_round_trips_with_two_byte_doc_ids(tmp_path):
    """Past 65,536 documents a posting's doc id is kept as its low 16 bits plus each term's high
    part and where it changes (a term that starts past the first 65,536 documents, one that spans
    all four 65,536-document spans, one that skips a span); the loaded index gives every score,
    term hit and merge the built one gives, from the memory-mapped file and after a full decode."""
    n = 4 * 65536 + 300
    rng = np.random.default_rng(7)
    docs = [[f"w{int(x)}"] for x in rng.integers(0, 400, size=n)]
    for i in (3, 65535, 65536, 70000, 140000, 200000, n - 1):
        docs[i] = docs[i] + ["spans"]
    for i in (70000, 70001, 140000):
        docs[i] = docs[i] + ["late"]  # its first posting past the first span
    for i in (5, 200000):
        docs[i] = docs[i] + ["skips"]  # one span to the third, none in between
    idx = KeywordIndex.build(docs)
    path = tmp_path / "kw.arrow"
    table = idx.to_arrow()
    assert table.schema.field("doc_lo").type == pa.large_list(pa.uint16()) and "doc_ids" not in table.schema.names
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    back = KeywordIndex.from_arrow(pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all())
    seg = back._segments[0]
    assert seg._docs is None  # nothing decoded at load
    queries = [["spans"], ["late"], ["skips"], ["w1", "late", "spans"], ["w7"], ["absent"]]
    for q in queries:  # the first query of each scores from tf and doc length, per term
        np.testing.assert_array_equal(back.scores(q), idx.scores(q))
    rows = np.array([3, 4, 65535, 65536, 70000, 70001, 131072, 140000, 200000, n - 1])
    for q in queries:
        got, want = back.term_hits(q, rows), idx.term_hits(q, rows)
        assert np.array_equal(got.held, want.held) and np.array_equal(got.df, want.df)
    assert np.flatnonzero(back.term_hits(["late"], np.arange(n)).held[:, 0]).tolist() == [70000, 70001, 140000]
    held = KeywordIndex.from_arrow(table).hold()
    for q in queries:  # settled on the second: every id decoded straight into intp, the same scores
        np.testing.assert_array_equal(held.scores(q), idx.scores(q))
    assert held._segments[0].doc_ids.dtype == np.intp
    assert np.array_equal(held._segments[0].doc_ids, idx._segments[0].doc_ids)
    assert np.array_equal(seg.doc_ids, idx._segments[0].doc_ids)  # the whole decode, as a held index makes it
    for q in queries:
        np.testing.assert_array_equal(back.scores(q), idx.scores(q))
    ext = back.extend([["spans", "late"]])
    _assert_same_index(ext.compact(), idx.extend([["spans", "late"]]), queries)
    # the high parts must fit the postings, or the table is refused, not read wrong
    bad = table.set_column(table.schema.get_field_index("split_pos"), "split_pos",
                           pa.array([[len(table.column("doc_lo")[0]) + 5]], type=pa.large_list(pa.int64())))
    bad = bad.set_column(bad.schema.get_field_index("split_hi"), "split_hi", pa.array([[1]], type=pa.large_list(pa.uint16())))
    with pytest.raises(ValueError, match="high parts"):
        KeywordIndex.from_arrow(bad)
    # ... or a high part past the segment's documents (a doc id no document has)
    term_hi = np.array(table.column("term_hi")[0].values)
    term_hi[0] = 9
    bad = table.set_column(table.schema.get_field_index("term_hi"), "term_hi",
                           pa.array([term_hi], type=pa.large_list(pa.uint16())))
    with pytest.raises(ValueError, match="high parts"):
        KeywordIndex.from_arrow(bad)


def test_validate_finds_every_kind_of_damaged_posting():
    """KeywordIndex.validate (what doctor runs): a doc id past the segment's documents, ids not
    ascending within a term, a tf of 0, term offsets that do not cover the postings; a sound index,
    small or over 65,536 documents, passes. A query of a damaged one says so (StoreError)."""
    from cybmem.errors import StoreError

    docs = [["w1", "w2"], ["w2", "w3"], ["w1", "w3", "w3"], ["w4"]]
    table = KeywordIndex.build(docs).to_arrow()
    KeywordIndex.from_arrow(table).validate()
    big = KeywordIndex.build([[f"w{i % 7}"] for i in range(70_000)])
    KeywordIndex.from_arrow(big.to_arrow()).validate()

    def with_column(name, values, typ):
        return KeywordIndex.from_arrow(table.set_column(table.schema.get_field_index(name), name,
                                                        pa.array([values], type=pa.large_list(typ))))

    lo = table.column("doc_lo")[0].values.to_pylist()
    out_of_range = with_column("doc_lo", [9] + lo[1:], pa.uint16())
    with pytest.raises(ValueError, match="names document 9 of 4"):
        out_of_range.validate()
    with pytest.raises(StoreError, match="damaged.*doctor --repair"):
        out_of_range.scores(["w1"])
    swapped = lo[:]
    swapped[0], swapped[1] = swapped[1], swapped[0]  # w1's postings: docs 0 and 2, now 2 and 0
    with pytest.raises(ValueError, match="not ascending"):
        with_column("doc_lo", swapped, pa.uint16()).validate()
    tfs = table.column("tfs8")[0].values.to_pylist()
    with pytest.raises(ValueError, match="term frequency of 0"):
        with_column("tfs8", [0] + tfs[1:], pa.uint8()).validate()
    ip = table.column("indptr")[0].values.to_pylist()
    with pytest.raises(ValueError, match="term offsets"):
        with_column("indptr", ip[:-1] + [ip[-1] - 1], pa.int64()).validate()
