"""The per-snapshot and per-index memos of the ranking's hot path (issue 31, kernel round 7): each
gives what the work it saves gave, and goes when what it depends on changes (a new record, a
refresh, an extended index)."""

from __future__ import annotations

import os
import time

import numpy as np
import pyarrow as pa
import pytest

from cybmem.settings import Settings
from cybmem.operations.write import write_run
from cybmem.retrieval import scoring as S
from cybmem.retrieval.search import search
from cybmem.retrieval.weights import Weights
from cybmem.store import keyword_index as B
from cybmem.store.keyword_index import KeywordIndex
from cybmem.store.loading import holding_snapshots, load_snapshot
from cybmem.store.memory_store import MemoryStore

from conftest import MIN, T0, make_run

DAY = 24 * 60 * MIN

NOW = T0 + 30 * DAY
W = Weights(w_kw=0.5, w_rec=0.3, w_lin=0.2, w_vec=0)


def _store(settings, tasks):
    for i, task in enumerate(tasks):
        write_run(make_run(f"r{i:03d}", task, start=T0 + i * DAY), settings)
    return MemoryStore(settings.memory_dir, "web")


def _age_records(settings):
    """records/' mtime well in the past: a held snapshot trusts it (cybmem.store.cache.RACY_NS)."""
    os.utime(settings.memory_dir / "web" / "records", ns=(time.time_ns() - 10**10,) * 2)


# --- KeywordIndex._postings: a term's postings found once per index -----------------------------


def test_postings_memo_gives_the_lookup_scores():
    docs = [["flaky", "login"], ["dark", "mode"], ["flaky", "deploy", "login"], []]
    idx = KeywordIndex.build(docs)
    cold = idx.scores(["login", "flaky", "nothere"]).copy()
    assert set(idx._postings) == {"login", "flaky", "nothere"} and idx._postings["nothere"] == ()
    np.testing.assert_array_equal(idx.scores(["login", "flaky", "nothere"]), cold)  # warm: the same floats
    np.testing.assert_array_equal(KeywordIndex.build(docs).scores(["flaky", "login"]), idx.scores(["flaky", "login"]))


def test_postings_memo_is_the_index_s_own_and_bounded(monkeypatch):
    docs = [["flaky", "login"], ["dark", "mode"]]
    idx = KeywordIndex.build(docs)
    idx.scores(["zebra", "flaky"])
    assert idx._postings["zebra"] == ()
    more = idx.extend([["zebra", "importer"], ["zebra"]])  # a new index: its own lookups
    assert more._postings == {}
    got = more.scores(["zebra", "flaky"])
    assert got[2] > 0 and got[3] > 0 and got[0] > 0
    np.testing.assert_array_equal(got, KeywordIndex.build(docs + [["zebra", "importer"], ["zebra"]]).scores(["zebra", "flaky"]))
    assert idx._postings["zebra"] == ()  # the old index still knows no zebra
    monkeypatch.setattr(B, "_POSTINGS_KEPT", 2)
    idx.scores(["dark", "mode", "login"])  # over the cap: the kept lookups are let go, these kept
    assert set(idx._postings) == {"dark", "mode", "login"}
    np.testing.assert_array_equal(idx.scores(["dark", "flaky"]), KeywordIndex.build(docs).scores(["dark", "flaky"]))


def test_a_held_snapshot_sees_a_new_record_s_terms(settings):
    store = _store(settings, ["Fix the flaky login test", "Add dark mode", "Document the deploy"])
    load_snapshot(store)
    _age_records(settings)
    with holding_snapshots():
        first = load_snapshot(store)
        assert [h.run_id for h in search(store, "zebrafish importer", k=3, weights=W, now_ms=NOW, settings=Settings.from_env()).hits
                if h.contributions["keyword"] > 0] == []
        assert "zebrafish" in first.index._postings
        write_run(make_run("r999", "Port the zebrafish importer", start=T0 + 10 * DAY), settings)
        res = search(store, "zebrafish importer", k=3, weights=W, now_ms=NOW, settings=Settings.from_env())  # a refresh: another index
        assert res.snapshot is not first and res.hits[0].run_id == "r999" and res.hits[0].contributions["keyword"] > 0


def test_only_a_held_snapshot_s_indexes_compute_every_impact(settings, monkeypatch):
    """A one-shot process (cybmem inject: two or three queries of the records index) computed every
    posting's impact on its second query, 0.1-0.2 s at 100k records, for nothing: a loaded index
    settles (every impact, wide doc ids) only when a long-lived reader holds its snapshot, on its
    second query, and both indexes of a held snapshot do; the rankings are the same either way."""
    store = _store(settings, ["Fix the flaky login test", "Add dark mode", "Document the deploy login"])
    load_snapshot(store)  # writes the cache: later loads read the index from it
    _age_records(settings)
    settled = []
    real = B.KeywordIndex._settle
    monkeypatch.setattr(B.KeywordIndex, "_settle", lambda self: settled.append(self.n_docs) or real(self))
    once = [search(store, "login test", k=3, weights=W, now_ms=NOW, settings=Settings.from_env()).hits for _ in range(3)]
    snap = load_snapshot(store)
    snap.index.scores(["login"]), snap.index.scores(["login"])
    assert settled == [] and snap.index._segment_impacts(0, snap.index._segments[0]) is None
    with holding_snapshots():
        held = [search(store, "login test", k=3, weights=W, now_ms=NOW, settings=Settings.from_env()).hits for _ in range(3)]
        snap = load_snapshot(store)
        assert snap.index._settled and snap.issue_index()._held
    assert settled and settled[0] == 3
    assert [[(h.run_id, h.score) for h in hits] for hits in held] == [[(h.run_id, h.score) for h in hits] for hits in once]


# --- search()'s hits: explain_rows, Snapshot.ended_utc ------------------------------------------


def test_explain_rows_is_explain_of_each():
    rng = np.random.default_rng(3)
    n = 50
    scored = S.score(keyword_raw=rng.random(n).astype(np.float32), ended_at_ms=T0 + rng.integers(0, 10**9, n),
                     now_ms=NOW, lineage=(rng.random(n) < 0.1).astype(np.float32) * np.float32(0.6), vector_cos=None,
                     weights=W)
    rows = [7, 0, 49, 7, 13]
    assert S.explain_rows(scored, rows) == [S.explain(scored, i) for i in rows]
    assert S.explain_rows(scored, []) == []


def test_hit_ended_at_is_the_datetime_s_timestamp(settings):
    store = _store(settings, ["Fix the flaky login test", "Add dark mode", "Document the deploy"])
    snap = load_snapshot(store)
    assert snap.ended_utc
    res = search(snap, "login mode deploy", k=3, weights=W, now_ms=NOW, settings=Settings.from_env())
    rows = snap.rows(res.ranked.top, ["endedAt"])
    assert [h.ended_at_ms for h in res.hits] == [int(r["endedAt"].timestamp() * 1000) for r in rows]
    # a table whose endedAt is not a UTC ms timestamp: the hits' datetimes are read, as before
    naive = snap.records.set_column(snap.records.schema.get_field_index("endedAt"), "endedAt",
                                    snap.records.column("endedAt").cast(pa.timestamp("ms")))
    other = type(snap)(store=snap.store, records=naive, events=snap.events, index=snap.index)
    assert not other.ended_utc
    got = search(other, "login mode deploy", k=3, weights=W, now_ms=NOW, settings=Settings.from_env())
    assert [h.ended_at_ms for h in got.hits] == \
        [int(r["endedAt"].timestamp() * 1000) for r in other.rows(got.ranked.top, ["endedAt"])]


@pytest.mark.parametrize("ms", [1_700_000_000_123, 1_795_997_763_001, 86_399_999, 0, 2**41 - 1])
def test_ms_over_1000_times_1000_is_timestamp_times_1000(ms):
    from datetime import datetime, timedelta, timezone

    dt = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=ms)
    assert int(ms / 1000 * 1000) == int(dt.timestamp() * 1000)


# --- top_k: a few candidates sorted as they are -------------------------------------------------


@pytest.mark.parametrize("n", [3000, 9000])
def test_top_k_few_candidates_order_is_select_top_s(n):
    rng = np.random.default_rng(n)
    s = rng.random(n).astype(np.float32)
    s[rng.integers(0, n, 40)] = np.float32(0.97)  # ties among the best
    s[5] = np.float32(-0.0)
    few = 0
    for k in (1, 10, 60):
        cand = S.top_k_candidates(s, k)
        few += len(cand) <= S._FEW_CANDIDATES
        np.testing.assert_array_equal(S.top_k(s, k), S._select_top(s, cand, k))
    assert few >= 2
    s[6], s[7] = np.nan, -np.inf  # NaN counts as -inf, -0.0 as 0.0, either way
    cand = np.array([5, 6, 7, 8, 9, 4, 3], dtype=np.int64)
    s[8] = np.float32(0.0)
    np.testing.assert_array_equal(S._order(s, cand), S._select_top(s, cand, len(cand)))
