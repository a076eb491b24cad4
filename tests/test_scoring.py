"""Tests for cybmem.scoring: kernels on hand-made three-record data, the index, weights."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cybmem import scoring as S
from cybmem.scoring import (
    KeywordIndex,
    LineageContext,
    RunLookup,
    Weights,
    cosine,
    explain,
    lineage_affinity,
    load_weights,
    normalize_keyword,
    rank,
    recency,
    save_weights,
    score,
    tokenize,
    tokenize_many,
    top_k,
)

DAY = 86_400_000


# ---------------------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("parseOutcomeSections", ["parseoutcomesections", "parse", "outcome", "sections"]),
        ("HTTPServer", ["httpserver", "http", "server"]),
        ("getHTTPResponse", ["gethttpresponse", "get", "http", "response"]),
        ("snake_case_name", ["snakecasename", "snake", "case", "name"]),
        ("test_login.py", ["testlogin", "test", "login", "py"]),
        ("testLogin", ["testlogin", "test", "login"]),
        ("src/_pytest/main.py", ["src", "pytest", "main", "py"]),
        ("__init__", ["init"]),
        ("fix-10745-capture", ["fix", "10745", "capture"]),
        ("Fixes #12038.", ["fixes", "12038"]),
        ("py38 and arg2index", ["py38", "py", "38", "arg2index", "arg", "index"]),
        ("The test is in a file", ["test", "file"]),
        ("a b c x1", ["x1"]),
        ("", []),
    ],
)
def test_tokenize_cases(text, expected):
    assert tokenize(text) == expected


def test_tokenize_unicode_casefold_and_nfkc():
    assert tokenize("Straße") == ["strasse"]
    assert tokenize("ÉCOLE école") == ["école", "école"]
    # decomposed e + combining acute compares equal to the composed form
    assert tokenize("e\u0301cole") == tokenize("\u00e9cole")
    assert tokenize("naïveCafé") == ["naïvecafé", "naïve", "café"]
    assert tokenize("ＡＢＣ") == ["abc"]  # fullwidth folded by NFKC


def test_tokenize_keeps_duplicates_and_many():
    assert tokenize("fix fix Fix") == ["fix", "fix", "fix"]
    assert tokenize_many(["fix it", "the Login"]) == [["fix"], ["login"]]


def test_stopwords_are_lowercase_and_dropped():
    assert all(w == w.lower() for w in S.STOPWORDS)
    assert tokenize("THE AND WITH") == []


# ---------------------------------------------------------------------------------------
# BM25 keyword index
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
    assert inc.n_docs == 300 and inc.n_segments <= 1 + S._MAX_DELTA_SEGMENTS
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
    for arr in (seg.doc_ids, seg.impact, seg.indptr, seg.tfs, seg.keys):
        assert not arr.flags.owndata
        assert not arr.flags.writeable
    # a loaded index can still be extended
    ext = back.extend([["w1"]])
    _assert_same_index(ext, KeywordIndex.build(docs + [["w1"]]), [["w1"]])


def test_from_arrow_rejects_foreign_tables():
    with pytest.raises(ValueError, match="keyword index"):
        KeywordIndex.from_arrow(pa.table({"a": [1]}))


# ---------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------


def test_normalize_keyword():
    np.testing.assert_allclose(normalize_keyword(np.array([0.0, 2.0, 4.0])), [0, 0.5, 1])
    assert normalize_keyword(np.zeros(3)).tolist() == [0, 0, 0]
    assert normalize_keyword(np.zeros(0)).shape == (0,)
    # the max is taken over the candidates only
    np.testing.assert_allclose(normalize_keyword(np.array([1.0, 2.0, 8.0]), np.array([True, True, False])),
                               [0.5, 1.0, 4.0])
    assert normalize_keyword(np.array([1.0, 2.0])).dtype == np.float32


def test_recency_zero_one_halflife_and_future():
    now = 1_700_000_000_000
    ended = np.array([now, now - 30 * DAY, now + 5 * DAY], dtype=np.int64)
    r = recency(ended, now, 30.0)
    assert r.dtype == np.float32
    np.testing.assert_allclose(r, [1.0, math.exp(-1.0), 1.0], rtol=1e-6)
    np.testing.assert_allclose(recency(ended[1:2], now, 60.0), [math.exp(-0.5)], rtol=1e-6)
    with pytest.raises(ValueError, match="half_life_days"):
        recency(ended, now, 0.0)


def _lineage_cols():
    #        r0 (root)  <- r1 <- r2 ;  r3 other chain, chat c1 ;  r4 unrelated
    run_ids = np.array(["r0", "r1", "r2", "r3", "r4"], dtype=object)
    parents = np.array([None, "r0", "r1", None, ""], dtype=object)
    previous = np.array([None, "r0", "r1", "r2", "r3"], dtype=object)
    roots = np.array([None, "r0", "r0", "x9", None], dtype=object)
    chats = np.array([None, None, "c0", "c1", ""], dtype=object)
    return run_ids, parents, previous, roots, chats


@pytest.mark.parametrize("mode", ["numpy", "numpy+lookup", "arrow", "dictionary", "chunked+lookup"])
def test_lineage_rules(mode):
    cols = _lineage_cols()
    if mode in ("arrow", "dictionary"):
        cols = tuple(pa.array(list(c), pa.string()) for c in cols)
        if mode == "dictionary":
            cols = tuple(c.dictionary_encode() for c in cols)
    if mode == "chunked+lookup":  # as pyarrow Table columns come: several chunks, some dictionary
        cols = tuple(pa.chunked_array([pa.array(list(c[:2]), pa.string()), pa.array(list(c[2:]), pa.string())])
                     for c in cols)
        cols = cols[:3] + (pa.chunked_array([ch.dictionary_encode() for ch in cols[3].chunks]),) + cols[4:]
    lookup = RunLookup.build(cols[0]) if mode.endswith("+lookup") else None

    def aff(ctx):
        return lineage_affinity(*cols, ctx, lookup=lookup).tolist()

    # ancestor walk: new run dispatched by r2 -> r2, r1, r0 are ancestors
    assert aff(LineageContext(parent_run_id="r2")) == pytest.approx([1.0, 1.0, 1.0, 0.0, 0.0])
    # chat session
    assert aff(LineageContext(chat_session_id="c1")) == pytest.approx([0, 0, 0, 0.8, 0])
    # shared root given explicitly: records with rootRunId r0 and r0 itself
    assert aff(LineageContext(root_run_id="r0")) == pytest.approx([0.6, 0.6, 0.6, 0, 0])
    # previous run
    assert aff(LineageContext(previous_run_id="r4")) == pytest.approx([0, 0, 0, 0, 0.6])
    # max over rules; unknown ids are harmless
    got = aff(LineageContext(parent_run_id="r1", chat_session_id="c0", previous_run_id="r3", root_run_id="x9"))
    assert got == pytest.approx([1.0, 1.0, 0.8, 0.6, 0.0])
    assert aff(LineageContext()) == [0.0] * 5
    assert aff(LineageContext(parent_run_id="missing", chat_session_id="nope")) == [0.0] * 5


def test_lineage_root_comes_from_parent_record():
    run_ids, parents, previous, roots, chats = _lineage_cols()
    # parent r1 has rootRunId r0: r2 shares that root (0.6), r1/r0 are ancestors
    got = lineage_affinity(run_ids, parents, previous, roots, chats, LineageContext(parent_run_id="r1"))
    assert got.tolist() == pytest.approx([1.0, 1.0, 0.6, 0.0, 0.0])
    assert got.dtype == np.float32


def test_lineage_cycle_and_depth_cap():
    run_ids = np.array(["a", "b"], dtype=object)
    parents = np.array(["b", "a"], dtype=object)  # a cycle
    none = np.array([None, None], dtype=object)
    got = lineage_affinity(run_ids, parents, none, none, none, LineageContext(parent_run_id="a"))
    assert got.tolist() == [1.0, 1.0]
    n = 100
    ids = np.array([f"n{i}" for i in range(n)], dtype=object)
    par = np.array([None] + [f"n{i - 1}" for i in range(1, n)], dtype=object)
    nn = np.array([None] * n, dtype=object)
    got = lineage_affinity(ids, par, nn, nn, nn, LineageContext(parent_run_id=f"n{n - 1}"),
                           lookup=RunLookup.build(ids))
    assert int((got == 1.0).sum()) == S.LINEAGE_MAX_DEPTH
    assert got[n - 1] == 1.0 and got[0] == 0.0


def test_run_lookup():
    lk = RunLookup.build(np.array(["c", "a", "b"], dtype=object))
    assert [lk.find(x) for x in ("a", "b", "c", "zz", "")] == [1, 2, 0, -1, -1]
    lk2 = RunLookup.build(pa.array(["c", "a", "b"]))
    assert lk2.find("b") == 2 and lk2.find("q") == -1


def test_cosine():
    m = np.array([[1.0, 0.0], [0.0, 0.0], [-1.0, 0.0], [1.0, 1.0]], dtype=np.float32)
    got = cosine(m, np.array([2.0, 0.0]))
    np.testing.assert_allclose(got, [1.0, 0.0, 0.0, 1 / math.sqrt(2)], rtol=1e-6)
    assert got.dtype == np.float32
    assert cosine(None, None, n=3).tolist() == [0, 0, 0]
    assert cosine(m, np.zeros(2)).tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="dims"):
        cosine(m, np.zeros(3))
    with pytest.raises(ValueError, match="n="):
        cosine(None, None)


def test_top_k_ties_newer_first_and_mask():
    s = np.array([0.5, 0.9, 0.5, 0.9, 0.1], dtype=np.float32)
    assert top_k(s, 3).tolist() == [3, 1, 2]
    assert top_k(s, 10).tolist() == [3, 1, 2, 0, 4]
    mask = np.array([True, False, True, True, False])
    assert top_k(s, 2, mask).tolist() == [3, 2]
    assert top_k(s, 0).tolist() == []
    assert top_k(np.zeros(0, np.float32), 3).tolist() == []
    assert top_k(s, 5, np.zeros(5, bool)).tolist() == []
    assert top_k(np.zeros(4), 2).tolist() == [3, 2]


def _ref_top_k(s, k, mask=None):
    """Full sort by (score desc, index desc): the specification top_k must match."""
    idx = np.arange(len(s)) if mask is None else np.flatnonzero(mask)
    return idx[np.lexsort((-idx, -s[idx].astype(np.float64)))][:k].tolist()


@pytest.mark.parametrize("kind", ["random", "sparse", "zeros", "coarse"])
@pytest.mark.parametrize("n", [50, 5_000, 70_000])
def test_top_k_matches_reference_on_large_inputs(kind, n):
    rng = np.random.default_rng(n)
    s = rng.random(n).astype(np.float32)
    if kind == "sparse":
        s[rng.random(n) < 0.95] = 0
    elif kind == "zeros":
        s[:] = 0
    elif kind == "coarse":
        s = np.round(s * 3).astype(np.float32)
    for mask in (None, rng.random(n) < 0.3, rng.random(n) < 0.0005):
        for k in (1, 10, 40):
            assert top_k(s, k, mask).tolist() == _ref_top_k(s, k, mask)


# ---------------------------------------------------------------------------------------
# weights
# ---------------------------------------------------------------------------------------


def test_weights_defaults_and_dict_round_trip():
    w = Weights()
    assert w.to_dict() == {"w_kw": 0.45, "w_rec": 0.4, "w_lin": 0.15, "w_vec": 0.0, "half_life_days": 30.0}
    assert Weights.from_dict(w.to_dict()) == w
    assert Weights.from_dict({"w_vec": 0.2}).w_vec == 0.2


@pytest.mark.parametrize(
    ("d", "match"),
    [
        ({"w_kw": 1, "bogus": 2, "zzz": 1}, "bogus, zzz"),
        ({"w_rec": -0.1}, "w_rec"),
        ({"w_lin": float("nan")}, "w_lin"),
        ({"w_kw": float("inf")}, "w_kw"),
        ({"half_life_days": 0}, "half_life_days"),
        ({"w_vec": "0.3"}, "w_vec"),
        ({"w_vec": True}, "w_vec"),
    ],
)
def test_weights_validation(d, match):
    with pytest.raises(ValueError, match=match):
        Weights.from_dict(d)


def test_load_weights_precedence(tmp_path):
    f1 = tmp_path / "global.json"
    f2 = tmp_path / "project.json"
    f1.write_text(json.dumps({"w_kw": 0.1, "w_rec": 0.2, "half_life_days": 10}))
    f2.write_text(json.dumps({"w_rec": 0.3, "savedAt": 123}))
    w = load_weights([f1, tmp_path / "missing.json", f2], env={"CYBERINE_MEMORY_HALF_LIFE_DAYS": "7",
                                                               "CYBERINE_MEMORY_W_VEC": " 0.5 ",
                                                               "CYBERINE_MEMORY_W_LIN": ""})
    assert w == Weights(w_kw=0.1, w_rec=0.3, w_lin=0.15, w_vec=0.5, half_life_days=7)
    assert load_weights([], env={}) == Weights()


def test_load_weights_errors_name_the_source(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        load_weights([bad], env={})
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="bad.json.*JSON object"):
        load_weights([bad], env={})
    bad.write_text(json.dumps({"w_kw": -1}))
    with pytest.raises(ValueError, match="bad.json.*w_kw"):
        load_weights([bad], env={})
    bad.write_text(json.dumps({"weight": 1}))
    with pytest.raises(ValueError, match="unknown weight key.*weight"):
        load_weights([bad], env={})
    with pytest.raises(ValueError, match="CYBERINE_MEMORY_W_KW='abc'"):
        load_weights([], env={"CYBERINE_MEMORY_W_KW": "abc"})
    with pytest.raises(ValueError, match="CYBERINE_MEMORY_W_REC"):
        load_weights([], env={"CYBERINE_MEMORY_W_REC": "-2"})


def test_save_weights_atomic_sorted_with_saved_at(tmp_path):
    p = tmp_path / "sub" / "weights.json"
    w = Weights(w_kw=0.7, w_rec=0.2, w_lin=0.1)
    save_weights(w, p)
    text = p.read_text()
    data = json.loads(text)
    assert list(data) == sorted(data)
    assert isinstance(data["savedAt"], int) and data["savedAt"] > 1_600_000_000_000
    assert load_weights([p], env={}) == w
    assert [x.name for x in p.parent.iterdir()] == ["weights.json"]  # no temp file left
    save_weights(Weights(), p)  # replace in place
    assert load_weights([p], env={}) == Weights()


# ---------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------


def test_score_rank_explain_three_records():
    now = 1_700_000_000_000
    ended = np.array([now - 30 * DAY, now - 1 * DAY, now], dtype=np.int64)
    raw = np.array([4.0, 2.0, 0.0], dtype=np.float32)
    lin = np.array([0.0, 1.0, 0.6], dtype=np.float32)
    w = Weights(w_kw=0.5, w_rec=0.3, w_lin=0.2, half_life_days=30)
    sc = score(keyword_raw=raw, ended_at_ms=ended, now_ms=now, lineage=lin, vector_cos=None, weights=w)
    np.testing.assert_allclose(sc.keyword, [0.5, 0.25, 0.0], rtol=1e-6)
    np.testing.assert_allclose(sc.recency, 0.3 * np.exp(-np.array([1.0, 1 / 30, 0.0])), rtol=1e-6)
    np.testing.assert_allclose(sc.lineage, [0.0, 0.2, 0.12], rtol=1e-6)
    assert sc.vector is None
    np.testing.assert_allclose(sc.total, sc.keyword + sc.recency + sc.lineage, rtol=1e-6)
    assert sc.total.dtype == np.float32
    assert rank(sc, 3) == np.argsort(-sc.total).tolist()
    ex = explain(sc, 1)
    assert ex["index"] == 1 and ex["total"] == pytest.approx(float(sc.total[1]))
    assert ex["contributions"]["lineage"] == pytest.approx(0.2)
    assert ex["values"]["keyword"] == pytest.approx(0.5)
    assert ex["contributions"]["vector"] == 0.0
    assert sum(ex["contributions"].values()) == pytest.approx(ex["total"], rel=1e-6)
    json.dumps(ex)  # plain JSON types


def test_score_mask_vector_and_validation():
    now = 10 * DAY
    ended = np.array([now, now, now], dtype=np.int64)
    raw = np.array([1.0, 8.0, 2.0])
    vec = np.array([0.2, 0.0, 1.0])
    mask = np.array([True, False, True])
    w = Weights(w_kw=1.0, w_rec=0.0, w_lin=0.0, w_vec=0.5)
    sc = score(keyword_raw=raw, ended_at_ms=ended, now_ms=now, lineage=None, vector_cos=vec, weights=w, mask=mask)
    assert sc.recency is None and sc.lineage is None
    np.testing.assert_allclose(sc.keyword, [0.5, 4.0, 1.0])  # normalised over the mask
    assert rank(sc, 3) == [2, 0]
    with pytest.raises(ValueError, match="lineage has 2 entries"):
        score(keyword_raw=raw, ended_at_ms=ended, now_ms=now, lineage=np.zeros(2), vector_cos=None, weights=w)
    with pytest.raises(ValueError, match="mask"):
        score(keyword_raw=raw, ended_at_ms=ended, now_ms=now, lineage=None, vector_cos=None, weights=w,
              mask=np.ones(2, bool))


def test_end_to_end_three_records():
    texts = ["Fix flaky login test in test_login.py", "Add HTTPServer retries", "Refactor login page styles"]
    idx = KeywordIndex.build(tokenize_many(texts))
    now = 1_700_000_000_000
    ended = np.array([now - 90 * DAY, now - 2 * DAY, now - DAY], dtype=np.int64)
    ids = np.array(["a", "b", "c"], dtype=object)
    nothing = np.array([None] * 3, dtype=object)
    lin = lineage_affinity(ids, nothing, nothing, nothing, nothing, LineageContext(parent_run_id="a"))
    sc = score(keyword_raw=idx.scores(tokenize("flaky testLogin")), ended_at_ms=ended, now_ms=now,
               lineage=lin, vector_cos=None, weights=Weights())
    assert rank(sc, 1) == [0]
    assert explain(sc, 0)["values"]["lineage"] == pytest.approx(1.0)


def test_public_api_is_explicit():
    for name in S.__all__:
        assert hasattr(S, name), name
