"""Tests for cybmem.retrieval.scoring: kernels on hand-made three-record data, the index, weights."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pytest

from cybmem.retrieval import scoring as S
from cybmem.store.keyword_index import KeywordIndex
from cybmem.store.run_ids import IdColumn, RunLookup
from cybmem.retrieval.scoring import (
    LineageContext,
    cosine,
    explain,
    lineage_affinity,
    normalize_keyword,
    rank,
    recency,
    score,
    top_k,
)
from cybmem.store.tokens import tokenize, tokenize_many
from cybmem.retrieval.weights import Weights

DAY = 86_400_000


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


def test_recency_of_age_is_recency_with_its_clips():
    """tuning scores its pools from ages taken once: the same kernel, the same floor (exp(-87),
    out of float32 subnormals) and the same clip of ages below 0."""
    now = 1_700_000_000_000
    ended = np.array([now, now - DAY // 3, now - 30 * DAY, now - 900 * DAY, now - 40_000 * DAY], dtype=np.int64)
    age = (now - ended).astype(np.float32)
    got = S.recency_of_age(age, 30.0)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, recency(ended, now, 30.0), rtol=1e-5)  # float32 exponents of up to 87 e-folds
    assert got[-1] == recency(ended[-1:], now, 30.0)[0] == np.float32(math.exp(-87.0))  # floored, not subnormal
    assert S.recency_of_age(np.array([-5 * DAY], np.float32), 30.0).tolist() == [1.0]
    with pytest.raises(ValueError, match="half_life_days"):
        S.recency_of_age(age, -1.0)


def test_recency_weight_is_folded_into_the_same_kernel():
    now = 1_700_000_000_000
    ended = np.array([now + DAY, now, now - 7 * DAY, now - 10_000 * DAY], dtype=np.int64)
    got = recency(ended, now, 7.0, weight=0.35)
    np.testing.assert_allclose(got[:3], [0.35, 0.35, 0.35 * math.exp(-1.0)], rtol=1e-6)
    assert got[3] == np.float32(math.exp(-87.0))


def test_ranking_order_is_the_tie_rule_of_top_k():
    """One ranking order: score descending, then the newer (higher) key; top_k is its prefix."""
    rng = np.random.default_rng(7)
    s = np.round(rng.random(5000) * 4).astype(np.float32)  # heavy ties
    order = S.ranking_order(s, np.arange(len(s)))
    for k in (1, 10, 300):
        assert top_k(s, k).tolist() == order[:k].tolist()
    assert S.ranking_order(np.array([0.5, 0.5, 0.9]), np.array([3, 9, 0])).tolist() == [2, 1, 0]
    assert S.ranking_order(np.array([0.5, 0.5]), np.array([4, 4])).tolist() == [0, 1]  # equal pairs keep their order


def test_recency_and_the_ranking_order_are_written_once():
    """The issue ranking and tuning's grid call scoring's kernel and order, they do not write their
    own (issue 19: a copy kept equal only by equivalence tests)."""
    import ast
    from pathlib import Path

    import cybmem

    pkg = Path(cybmem.__file__).parent
    for name in ("retrieval/issue_ranking.py", "dispatch/inject.py", "retrieval/tuning.py", "retrieval/search.py"):
        tree = ast.parse((pkg / name).read_text())
        calls = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
        assert not calls & {"exp", "lexsort"}, f"{name} computes recency or the ranking order itself"


def _lineage_cols():
    #        r0 (root)  <- r1 <- r2 ;  r3 other chain, chat c1 ;  r4 unrelated
    run_ids = np.array(["r0", "r1", "r2", "r3", "r4"], dtype=object)
    parents = np.array([None, "r0", "r1", None, ""], dtype=object)
    previous = np.array([None, "r0", "r1", "r2", "r3"], dtype=object)
    roots = np.array([None, "r0", "r0", "x9", None], dtype=object)
    chats = np.array([None, None, "c0", "c1", ""], dtype=object)
    return run_ids, parents, previous, roots, chats


@pytest.mark.parametrize("mode", ["numpy", "numpy+lookup", "arrow", "dictionary", "chunked+lookup", "prepared+lookup"])
def test_lineage_rules(mode):
    cols = _lineage_cols()
    if mode == "prepared+lookup":  # as Snapshot.prepare holds them: run ids as Arrow, the others as IdColumn codes
        cols = (pa.chunked_array([pa.array(list(cols[0]), pa.string())]),) + tuple(
            IdColumn(pa.array(list(c), pa.string())) for c in cols[1:])
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


def test_id_columns_give_the_lineage_of_the_arrow_columns():
    """A prepared snapshot's IdColumn codes give lineage_affinity's values float for float, for
    drawn columns (missing ids as null and as "") and contexts; rows_of is the rows holding an id."""
    import random

    rng = random.Random(5)
    n = 500
    ids = [f"r{i}" for i in range(n)]
    parents = [rng.choice([None, "", *ids[:i]]) if i else None for i in range(n)]
    roots = [rng.choice([None, "", "r0", "r7", "r250", "zz"]) for _ in range(n)]
    chats = [rng.choice([None, "", "c0", "c1"]) for _ in range(n)]
    arrow = tuple(pa.array(c, pa.string()) for c in (ids, parents, [None] * n, roots, chats))
    prepared = (pa.chunked_array([arrow[0]]),) + tuple(IdColumn(c) for c in arrow[1:])
    lookup = RunLookup.build(arrow[0])
    for _ in range(80):
        ctx = LineageContext(parent_run_id=rng.choice([None, "missing", *ids]), chat_session_id=rng.choice([None, "", "c0", "c1", "c9"]),
                             previous_run_id=rng.choice([None, *ids]), root_run_id=rng.choice([None, None, "", "r0", "zz", "nope"]))
        want = lineage_affinity(*arrow, ctx)
        got = lineage_affinity(*prepared, ctx, lookup=lookup)
        assert got.dtype == np.float32 and got.tolist() == want.tolist(), ctx
    col = prepared[3]
    for value in ("r0", "zz", "", "nope"):
        assert col.rows_of(value).tolist() == [i for i, r in enumerate(roots) if r == value and value], value
    assert [col.at(i) for i in range(n)] == [r or None for r in roots]


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


def test_totals_are_the_total_of_score():
    """totals() (a ranking's seed rows) is score()'s total, float for float, for any weights."""
    rng = np.random.default_rng(4)
    for _ in range(50):
        n = int(rng.integers(1, 300))
        raw = (rng.random(n) * 9).astype(np.float32)
        raw[rng.random(n) < 0.3] = 0
        ended = (1_790_000_000_000 + rng.integers(0, 90 * 86_400_000, n)).astype(np.int64)
        lin = rng.choice(np.array([0, 0.6, 0.8, 1.0], np.float32), n)
        cos = rng.random(n).astype(np.float32)
        mix = {a: float(rng.choice([0.0, rng.random()])) for a in ("w_kw", "w_rec", "w_lin", "w_vec")}
        if not any(mix.values()):
            mix["w_rec"] = 0.5
        w = Weights(**mix, half_life_days=float(rng.choice([1.0, 30.0])))
        top = float(raw.max())
        want = score(keyword_raw=raw, ended_at_ms=ended, now_ms=1_800_000_000_000, lineage=lin, vector_cos=cos, weights=w).total
        got = S.totals(keyword_raw=raw, ended_at_ms=ended, now_ms=1_800_000_000_000, lineage=lin, vector_cos=cos,
                       weights=w, keyword_max=top)
        assert got.tolist() == want.tolist()


def test_run_lookup():
    lk = RunLookup.build(np.array(["c", "a", "b"], dtype=object))
    assert [lk.find(x) for x in ("a", "b", "c", "zz", "")] == [1, 2, 0, -1, -1]
    lk2 = RunLookup.build(pa.array(["c", "a", "b"]))
    assert lk2.find("b") == 2 and lk2.find("q") == -1
    # ids sharing 8-byte prefixes, missing ones, non-ASCII: find and id_at invert each other
    import random

    rng = random.Random(2)
    ids = [rng.choice([None, f"run-0000-{i}", f"run-0000-{i}-é", f"{i:08d}"]) for i in range(3000)]
    lk3 = RunLookup.build(pa.array(ids, pa.string()))
    assert [lk3.id_at(i) for i in range(len(ids))] == ids
    assert all(lk3.find(x) == i for i, x in enumerate(ids) if x is not None and ids.index(x) == i)
    assert lk3.find("run-0000-") == -1 and lk3.find("run-0000-99999") == -1


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
@pytest.mark.parametrize("n", [50, 2_047, 5_000, 70_000])
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


@pytest.mark.parametrize("n", [100, 2_048, 5_000, 70_001])
def test_score_blocks_find_the_entries_that_reach_their_blocks_value(n):
    """ScoreBlocks.at_least_each (the bounded pool's per-block recency bound) gives, ascending,
    exactly the entries >= their block's value, the shorter last block included."""
    rng = np.random.default_rng(n)
    s = rng.random(n).astype(np.float32)
    s[rng.random(n) < 0.7] = 0
    for k in (1, 10, 40):
        b = S.ScoreBlocks(s, k)
        nblocks = -(-n // b.block) if b.maxima is not None else 1
        for spread in (0.0, 0.5, 2.0):  # one value, values that skip some blocks, most blocks skipped
            t = (rng.random(nblocks) * spread + 0.3).astype(np.float32)
            per_row = np.repeat(t, b.block)[:n] if b.maxima is not None else np.full(n, t[0])
            assert b.at_least_each(t).tolist() == np.flatnonzero(s >= per_row).tolist(), (k, spread)
        assert b.at_least_each(np.full(nblocks, np.float32(1e-45))).tolist() == np.flatnonzero(s > 0).tolist()


def test_a_snapshot_bounds_each_block_by_its_newest_row_and_knows_its_time_order():
    from cybmem.store.snapshot import Snapshot

    def snap(ended):
        nulls = pa.nulls(len(ended), pa.string())
        table = pa.table({"runId": [f"r{i}" for i in range(len(ended))], "parentRunId": nulls, "previousRunId": nulls,
                          "rootRunId": nulls, "chatSessionId": nulls, "supersedes": nulls, "supersededBy": nulls,
                          "endedAt": pa.array(ended, pa.int64()).cast(pa.timestamp("ms", tz="UTC"))})
        return Snapshot(None, table, None, KeywordIndex.build([["x"]] * len(ended)))

    s = snap([5, 3, 9, 9, 1, 2, 8])
    assert s.newest_in_blocks(3).tolist() == [9, 9, 8]
    assert s.newest_in_blocks(2).tolist() == [5, 9, 2, 8]
    assert s.newest_in_blocks(7).tolist() == [9]
    assert not s.in_time_order
    assert snap([1, 2, 2, 7]).in_time_order and snap([4]).in_time_order and snap([]).in_time_order
    assert snap([]).newest_in_blocks(4).tolist() == []


# ---------------------------------------------------------------------------------------


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
