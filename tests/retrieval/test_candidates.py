"""The candidate pool (cybmem.retrieval.candidates): scoring only the rows it keeps ranks exactly as
scoring every record does, whatever the weights, matches, ties, lineage groups, candidates and
vector axis, on the fixture store, on synthetic stores and on random cases."""

import numpy as np
import pytest

from cybmem.retrieval.weights import Weights
from cybmem.store.memory_store import MemoryStore

from conftest import T0, synthetic_snapshot


#: These tests check the linear formula's order (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("linear_ranker")

NOW = 1_793_491_200_000  # 2026-11-01, a fixed "now" for the fixture store (runs 2026-10-01 .. 2026-10-27)
KW = Weights(w_kw=1, w_rec=0, w_lin=0, w_vec=0)
REC = Weights(w_kw=0, w_rec=1, w_lin=0, w_vec=0, half_life_days=10)
LIN = Weights(w_kw=0, w_rec=0, w_lin=1, w_vec=0)


@pytest.fixture(autouse=True)
def _pool_at_any_size(monkeypatch):
    """The bounded pool at every store size here (production scores every record below
    candidates.DENSE_BELOW)."""
    monkeypatch.setattr("cybmem.retrieval.candidates.DENSE_BELOW", 0)


@pytest.mark.parametrize("weights", [Weights(), KW, REC, LIN, Weights(w_kw=0.3, w_rec=0, w_lin=0.7), Weights(w_kw=0.1, w_rec=0.8, w_lin=0.1, half_life_days=2)])
def test_pool_ranking_equals_scoring_every_record(fixture_copy, weights):
    from cybmem.store.snapshot import load_snapshot
    from cybmem.retrieval.scoring import lineage_affinity, rank, score
    from cybmem.store.tokens import tokenize
    from cybmem.retrieval.search import dispatch_context, rank_query

    snap = load_snapshot(MemoryStore(fixture_copy, "web"))
    r = snap.records
    for query in ("cart drawer flaky test", "checkout", "zzz nothing matches", "react router upgrade"):
        for parent in (None, r.column("runId")[5].as_py()):
            ranked = rank_query(snap, query, k=10, weights=weights, now_ms=NOW, parent_run_id=parent)
            mask = snap.candidates(None)
            ctx = dispatch_context(snap, mask, parent, None)
            kw = snap.index.scores(tokenize(query)) if weights.w_kw else None
            lin = lineage_affinity(r.column("runId"), r.column("parentRunId"), r.column("previousRunId"),
                                   r.column("rootRunId"), r.column("chatSessionId"), ctx) if weights.w_lin else None
            dense = score(keyword_raw=kw, ended_at_ms=snap.ended_ms(), now_ms=NOW, lineage=lin, vector_cos=None,
                          weights=weights, mask=mask)
            assert ranked.top == rank(dense, 10), (query, parent)
            if lin is not None:  # the affinity kept per snapshot is this context's, and reused for it
                assert (ranked.lineage == lin).all()
                again = rank_query(snap, query, k=10, weights=weights, now_ms=NOW, parent_run_id=parent)
                assert again.lineage is ranked.lineage and again.top == ranked.top


@pytest.mark.parametrize("weights", [Weights(), Weights(w_kw=0.9, w_rec=0.1, w_lin=0.0), Weights(w_kw=0.3, w_rec=0.3, w_lin=0.4, half_life_days=3)])
def test_pool_ranks_exactly_with_many_matches_and_big_lineage_groups(weights):
    from cybmem.retrieval.scoring import lineage_affinity, rank, score
    from cybmem.store.tokens import tokenize
    from cybmem.retrieval.search import dispatch_context, rank_query

    snap = synthetic_snapshot()
    r = snap.records
    now = T0 + 3001 * 3_600_000
    for query in ("cart drawer", "flaky login test", "fix", "checkout page api search", "teardown order fixture"):
        for parent in (None, "r02100", "r02996"):
            ranked = rank_query(snap, query, k=10, weights=weights, now_ms=now, parent_run_id=parent)
            mask = snap.candidates(None)
            ctx = dispatch_context(snap, mask, parent, None)
            kw = snap.index.scores(tokenize(query))
            lin = lineage_affinity(r.column("runId"), r.column("parentRunId"), r.column("previousRunId"),
                                   r.column("rootRunId"), r.column("chatSessionId"), ctx)
            dense = score(keyword_raw=kw, ended_at_ms=snap.ended_ms(), now_ms=now, lineage=lin, vector_cos=None,
                          weights=weights, mask=mask)
            assert ranked.top == rank(dense, 10), (query, parent)
            assert len(ranked.scored.total) < snap.n, "the pool is smaller than the store"


def _random_ranking_case(rng):
    """A snapshot, weights and a query drawn from ``rng`` (random.Random): many or few matches,
    words that drift with time (old matches, new records without), ties in time, chains, chats,
    parents, candidates narrowed by as_of and a row mask, a vector axis."""
    import pyarrow as pa

    from cybmem.store.keyword_index import KeywordIndex
    from cybmem.store.snapshot import Snapshot
    from cybmem.store.tokens import tokenize

    n = rng.choice([20, 300, 2100, 2500, 4000])  # from 2,048 rows the seeds are a few rows
    words = [f"w{i}" for i in range(rng.randint(2, 40))]
    drift = rng.random() < 0.5

    def word(i: int) -> str:
        if not drift:
            return rng.choice(words)
        return words[min(max(i * len(words) // n + rng.randint(-1, 1), 0), len(words) - 1)]

    texts = [" ".join(word(i) for _ in range(rng.randint(0, 10))) for i in range(n)]
    ids = [f"r{i:05d}" for i in range(n)]
    per_time = rng.choice([1, 1, 3, n])  # runs ending at one moment: many means heavy ties in recency
    ended = sorted(T0 + rng.randrange(max(1, n // per_time)) * 3_600_000 for _ in range(n))
    if rng.random() < 0.2:  # rows out of time order (a block's recency is its newest row's, wherever it is)
        ended = [e + rng.choice([0, 0, -1, 1]) * rng.randrange(1, 20) * 3_600_000 for e in ended]
    chain = rng.randint(1, n)
    roots = [f"r{(i // chain) * chain:05d}" for i in range(n)]
    parents = [ids[i - 1] if i and rng.random() < 0.3 else None for i in range(n)]
    chats = [f"chat-{rng.randrange(3)}" if rng.random() < 0.2 else None for i in range(n)]
    nulls = pa.nulls(n, pa.string())
    snap = Snapshot(None, pa.table({
        "runId": ids, "parentRunId": pa.array(parents, pa.string()), "previousRunId": pa.array([None] + ids[:-1], pa.string()),
        "rootRunId": roots, "chatSessionId": pa.array(chats, pa.string()),
        "endedAt": pa.array(ended, pa.int64()).cast(pa.timestamp("ms", tz="UTC")), "supersedes": nulls, "supersededBy": nulls,
    }), None, KeywordIndex.build([tokenize(t) for t in texts]))
    if rng.random() < 0.5:
        snap.prepare()
    w = {axis: 0.0 if rng.random() < 0.3 else rng.uniform(0.02, 1.0) for axis in ("w_kw", "w_rec", "w_lin", "w_vec")}
    if not any(w.values()):
        w["w_kw"] = 0.5
    weights = Weights(**w, half_life_days=rng.choice([0.01, 1.0, 30.0, 30.0]))
    vrng = np.random.default_rng(rng.randrange(2**32))
    case = dict(
        snap=snap, weights=weights, k=rng.choice([1, 3, 10, 40]),
        query=" ".join(rng.choice(words + ["unknown"]) for _ in range(rng.randint(0, 5))),
        cos=np.clip(vrng.standard_normal(n).astype(np.float32), 0, 1) if weights.w_vec > 0 and rng.random() < 0.7 else None,
        as_of=rng.choice([None, None, rng.randint(min(ended), max(ended))]),
        where=vrng.random(n) < 0.7 if rng.random() < 0.3 else None,
        parent=rng.choice([None, rng.choice(ids)]), chat=rng.choice([None, "chat-1"]),
    )
    case["now"] = case["as_of"] if case["as_of"] is not None else max(ended) + 3_600_000
    return case


def test_the_bounded_pool_ranks_as_scoring_every_record_does():
    """The pool's bound (candidates.candidate_pool) leaves out only rows that cannot reach the top k, whatever the
    weights, matches, ties, lineage groups, candidates and vector axis: the top k, and the scores
    shown, are those of scoring every record. (Each bound loosened by a fifth fails this, the
    recency bound of a block of rows included.)"""
    import random

    from cybmem.retrieval.scoring import lineage_affinity, rank, score
    from cybmem.retrieval.search import dispatch_context, rank_query
    from cybmem.store.tokens import tokenize

    for trial in range(400):
        c = _random_ranking_case(random.Random(trial))
        snap, weights, k = c["snap"], c["weights"], c["k"]
        ranked = rank_query(snap, c["query"], k=k, weights=weights, as_of=c["as_of"], now_ms=c["now"],
                            parent_run_id=c["parent"], chat_session_id=c["chat"], where=c["where"], vector=c["cos"])
        mask = snap.candidates(c["as_of"])
        ctx = dispatch_context(snap, mask, c["parent"], c["chat"])
        if c["where"] is not None:
            mask = mask & c["where"]
        if not mask.any():
            assert ranked.top == [], trial
            continue
        r = snap.records
        kw = snap.index.scores(tokenize(c["query"])) if weights.w_kw else None
        lin = lineage_affinity(r.column("runId"), r.column("parentRunId"), r.column("previousRunId"),
                               r.column("rootRunId"), r.column("chatSessionId"), ctx) if weights.w_lin else None
        dense = score(keyword_raw=kw, ended_at_ms=snap.ended_ms(), now_ms=c["now"], lineage=lin,
                      vector_cos=c["cos"] if weights.w_vec > 0 else None, weights=weights, mask=mask)
        assert ranked.top == rank(dense, k), (trial, weights, c["query"], k)
        for local, row in zip(ranked.local, ranked.top):
            assert ranked.scored.total[local] == pytest.approx(float(dense.total[row]), abs=1e-6), trial


def test_a_new_run_with_no_match_outranks_an_old_weak_match_in_a_large_store():
    """The pool skips the records without a match only when the threshold is above what recency can
    give them: here it is not (one old match at 0.30, the newest run at w_rec = 0.35)."""
    import pyarrow as pa

    from cybmem.retrieval.search import rank_query
    from cybmem.store.keyword_index import KeywordIndex
    from cybmem.store.snapshot import Snapshot

    n = 3000
    nulls = pa.nulls(n, pa.string())
    snap = Snapshot(None, pa.table({
        "runId": [f"r{i:05d}" for i in range(n)], "parentRunId": nulls, "previousRunId": nulls, "rootRunId": nulls,
        "chatSessionId": nulls, "endedAt": pa.array([T0 + i * 3_600_000 for i in range(n)], pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
        "supersedes": nulls, "supersededBy": nulls,
    }), None, KeywordIndex.build([["alpha", "alpha"]] + [["beta"]] * (n - 1)))
    weights = Weights(w_kw=0.3, w_rec=0.35, w_lin=0.0, half_life_days=30)
    ranked = rank_query(snap, "alpha", k=1, weights=weights, now_ms=T0 + n * 3_600_000)
    assert ranked.top == [n - 1]
    assert ranked.scored.total[ranked.local[0]] == pytest.approx(0.35 * np.exp(-1 / (24 * 30)), rel=1e-5)
    assert rank_query(snap, "alpha", k=2, weights=weights, now_ms=T0 + n * 3_600_000).top == [n - 1, n - 2]


class _Recorded:
    """A vector axis that keeps the cosine it handed to rank_query (to score densely with it)."""

    def __init__(self, query):
        self.query, self.cos = query, None

    def axis(self, partial, mask, w_vec, k):
        self.cos = self.query.axis(partial, mask, w_vec, k)
        return self.cos

    @property
    def reach(self):
        return self.query.reach


@pytest.mark.parametrize("weights", [Weights(w_vec=0.3), Weights(w_kw=0, w_rec=0.5, w_lin=0.2, w_vec=1),
                                     Weights(w_kw=0.2, w_rec=0, w_lin=0.3, w_vec=0.5), Weights(w_kw=0.9, w_rec=0.1, w_lin=0, w_vec=0.05)])
@pytest.mark.parametrize("method, candidates", [("exact", None), ("binary", None), ("binary", 12)])
def test_pool_ranks_exactly_with_a_vector_axis(weights, method, candidates):
    import numpy as np

    from cybmem.retrieval.scoring import lineage_affinity, rank, score
    from cybmem.retrieval.search import dispatch_context, rank_query
    from cybmem.store.tokens import tokenize
    from cybmem.retrieval.vectors import VectorIndex, VectorQuery

    snap = synthetic_snapshot()
    r = snap.records
    rng = np.random.default_rng(5)
    vectors = rng.standard_normal((snap.n, 24)).astype(np.float32)
    vectors[rng.random(snap.n) < 0.2] = 0  # records without a vector
    index = VectorIndex.from_matrix(vectors, block_rows=700)
    now = T0 + 3001 * 3_600_000
    for query in ("cart drawer", "zzz nothing matches", "teardown order fixture"):
        for parent in (None, "r02100"):
            qvec = rng.standard_normal(24).astype(np.float32)
            axis = _Recorded(VectorQuery(index, qvec, method, candidates))
            ranked = rank_query(snap, query, k=10, weights=weights, now_ms=now, parent_run_id=parent, vector=axis)
            mask = snap.candidates(None)
            ctx = dispatch_context(snap, mask, parent, None)
            kw = snap.index.scores(tokenize(query))
            lin = lineage_affinity(r.column("runId"), r.column("parentRunId"), r.column("previousRunId"),
                                   r.column("rootRunId"), r.column("chatSessionId"), ctx)
            dense = score(keyword_raw=kw, ended_at_ms=snap.ended_ms(), now_ms=now, lineage=lin, vector_cos=axis.cos,
                          weights=weights, mask=mask)
            assert ranked.top == rank(dense, 10), (query, parent)
            exact = rank_query(snap, query, k=10, weights=weights, now_ms=now, parent_run_id=parent, vector=index.exact(qvec))
            assert ranked.top == exact.top, "binary quantisation with the bound ranks as exact cosines do"
            if method == "binary" and weights.w_vec == 0.05:
                stats = axis.query.stats
                assert stats["method"] == "binary"
                if query == "zzz nothing matches":  # recency alone leaves many rows within reach
                    assert stats["nearest"] > 0, "the Hamming pass tightens the bound"
                else:
                    assert stats["nearest"] == 0 and stats["rescored"] <= 4 * 10 + 64, \
                        "the rows best on the other axes bound the axis without a pass over the vectors"
            if method == "binary" and axis.query.stats["method"] == "binary":
                assert axis.query.stats["rescored"] < snap.n, "fewer rows than the mat-vec"
                scored = axis.cos > 0
                assert np.allclose(axis.cos[scored], index.exact(qvec)[scored], atol=1e-6)
