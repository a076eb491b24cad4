"""Each judgment's axis values over its candidate pool (cybmem.retrieval.axis_matrices): the pools
reproduce search() itself as dispatch ran it then (as of its moment, the parent pinned first),
hold every top k, and take the cosine axis only from the queries' own embeddings."""

import json

import numpy as np
import pytest

from cybmem.errors import ValidationError
from cybmem.operations.write import write_run
from cybmem.retrieval import axis_matrices as A
from cybmem.retrieval import grid as G
from cybmem.retrieval import judgments as J
from cybmem.retrieval import tuning as T
from cybmem.retrieval.search import search
from cybmem.retrieval.weights import Weights
from cybmem.settings import Settings
from cybmem.store.memory_store import MemoryStore
from cybmem.store.snapshot import load_snapshot

from conftest import T0, make_run

#: These tests check the linear formula's order (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("linear_ranker")

DAY = 86_400_000
SEARCH_WEIGHTS = [
    Weights(),
    Weights(w_kw=1, w_rec=0, w_lin=0),
    Weights(w_kw=0, w_rec=1, w_lin=0, half_life_days=3),
    Weights(w_kw=0, w_rec=0, w_lin=1),
    Weights(w_kw=0.2, w_rec=0.3, w_lin=1, half_life_days=120),
]


@pytest.fixture
def web(fixture_copy):
    store = MemoryStore(fixture_copy, "web")
    return store, load_snapshot(store)


def _search_ids(snap, j, w, k=10, *, scored_only=False):
    res = search(snap, j.query, k=k, weights=w, as_of=j.as_of, exclude=j.query_run_id,
                 parent_run_id=j.parent_run_id, chat_session_id=j.chat_session_id, pin_parent=True, settings=Settings.from_env())
    return [h.run_id for h in res.hits if h.score > 0 or not scored_only]


@pytest.mark.parametrize("project", ["web", "api"])
def test_pool_rankings_equal_search(fixture_copy, project):
    snap = load_snapshot(MemoryStore(fixture_copy, project))
    js = J.judgments_from_store(snap)
    m = A.axis_matrices(snap, js, k=10)
    assert m.n == len(js) > 0
    for q, j in enumerate(m.judgments):
        for w in SEARCH_WEIGHTS:
            if w.w_rec > 0:
                assert m.ranking(q, w) == _search_ids(snap, j, w), (j.query, w)
            else:
                # Without recency, records that score 0 tie; search.py's candidate pool breaks that
                # tie among the newest of them. Only the records that score are compared.
                scored = _search_ids(snap, j, w, scored_only=True)
                assert m.ranking(q, w)[: len(scored)] == scored, (j.query, w)


@pytest.mark.parametrize("metric", list(J.METRICS))
@pytest.mark.parametrize("k", [1, 3, 10])
def test_vectorised_metric_equals_search_then_metric(web, metric, k):
    _, snap = web
    m = A.axis_matrices(snap, J.judgments_from_store(snap), k=10)
    for w in SEARCH_WEIGHTS:
        ref = np.mean([J.metric_at_k(_search_ids(snap, j, w, k), _existing(m, q), metric=metric, k=k)
                       for q, j in enumerate(m.judgments)])
        assert G.evaluate(m, w, metric=metric, k=k) == pytest.approx(ref, abs=1e-12)
        per = G.evaluate(m, w, metric=metric, k=k, per_query=True)
        assert per.mean() == pytest.approx(ref, abs=1e-12)


def _existing(m, q):
    s, e = m.offsets[q], m.offsets[q + 1]
    pinned = {m.run_ids[m.pinned[q]]} if m.pinned_relevant[q] else set()  # the parent dispatch shows first
    return {m.run_ids[r] for r in m.rows[s:e][m.relevant[s:e]]} | pinned


def test_no_peeking_at_the_future(settings):
    """Runs that ended after asOf are neither candidates nor relevant; the query run is excluded."""
    for i, task in enumerate(["Fix the flaky login test", "Add dark mode", "Fix the flaky login test again", "Later login work"]):
        write_run(make_run(f"r{i}", task, start=T0 + i * DAY), settings)
    snap = load_snapshot(MemoryStore(settings.memory_dir, "web"))
    asked = T0 + 2 * DAY  # r2 starts now; r0 and r1 have ended, r3 is in the future
    js = [J.Judgment(query="flaky login test", as_of=asked, relevant=("r0", "r3"), query_run_id="r2"),
          J.Judgment(query="later", as_of=asked, relevant=("r3",))]
    m = A.axis_matrices(snap, js, k=10)
    assert m.n == 1 and m.n_relevant.tolist() == [1] and m.n_candidates.tolist() == [2]
    assert m.skipped == [(js[1], "no relevant run existed at asOf")]
    pool = {m.run_ids[r] for r in m.rows}
    assert pool <= {"r0", "r1"}
    assert G.evaluate(m, Weights(w_kw=1, w_rec=0, w_lin=0), metric="recall") == 1.0


def test_a_parent_that_is_not_relevant_pushes_the_relevant_runs_down_one_place(settings):
    """Tuning replays dispatch: the parent it shows first takes a place whether or not it is
    relevant, so every other run ranks one lower (checked against search itself)."""
    DAY = 86_400_000
    tasks = ["Fix the flaky login test", "Add dark mode to the settings page", "Fix the login redirect loop",
             "Write the release notes", "Refactor the login form", "Bump the dependencies", "Speed up the login page"]
    for i, task in enumerate(tasks):
        write_run(make_run(f"r{i}", task, start=T0 + i * DAY), settings)
    snap = load_snapshot(MemoryStore(settings.memory_dir, "web"))
    asked = T0 + 10 * DAY
    js = [J.Judgment(query="login test flaky", as_of=asked, relevant=("r0", "r2"), parent_run_id="r3"),  # parent not relevant
          J.Judgment(query="login page", as_of=asked, relevant=("r6",), parent_run_id="r6"),  # the parent is the relevant run
          J.Judgment(query="dark mode", as_of=asked, relevant=("r1",), parent_run_id="gone")]  # no such record: nothing pinned
    m = A.axis_matrices(snap, js, k=5)
    assert [m.run_ids[p] if p >= 0 else None for p in m.pinned.tolist()] == ["r3", "r6", None]
    assert m.pinned_relevant.tolist() == [False, True, False]
    for w in SEARCH_WEIGHTS:
        for q, j in enumerate(m.judgments):
            assert m.ranking(q, w, k=5) == _search_ids(snap, j, w, k=5), (j.query, w)
        for metric in J.METRICS:
            for k in (1, 2, 5):
                ref = [J.metric_at_k(_search_ids(snap, j, w, k), set(j.relevant), metric=metric, k=k) for j in m.judgments]
                assert G.evaluate(m, w, metric=metric, k=k, per_query=True).tolist() == pytest.approx(ref, abs=1e-12), (w, metric, k)
    assert G.evaluate(m, Weights(), metric="mrr", k=1, per_query=True)[0] == 0.0, "the parent holds the first place"


def test_pool_covers_every_top_k(web):
    """The pool holds the top k of the whole candidate set for random weightings (exact pruning)."""
    _, snap = web
    m = A.axis_matrices(snap, J.judgments_from_store(snap), k=3)
    rng = np.random.default_rng(7)
    for _ in range(15):
        w = Weights(w_kw=float(rng.random()), w_rec=float(rng.random()), w_lin=float(rng.random()),
                    half_life_days=float(rng.choice([0.5, 2, 30, 400])))
        for q, j in enumerate(m.judgments):
            assert m.ranking(q, w, k=3) == _search_ids(snap, j, w, k=3)


def test_layers_keep_everything_dominated_fewer_than_k_times():
    rng = np.random.default_rng(0)
    for trial in range(150):
        n = int(rng.integers(1, 300))
        vals = rng.random(n).astype(np.float32)
        if trial % 2:
            vals[rng.random(n) < 0.6] = 0.0
        order = rng.permutation(n)
        k = int(rng.integers(1, 12))
        got = set(A._layers(order, vals, k).tolist())
        v = vals[order]
        need = {int(order[i]) for i in range(n) if (v[:i] >= v[i]).sum() < k}
        assert need <= got


# --- the cosine axis ----------------------------------------------------------------------


def test_vector_axis_from_embeddings(settings):
    """With embeddings.jsonl the cosine axis joins the search; the query vector is the embedding
    of the query text, as dispatch makes it."""
    from cybmem.store.embeddings import embedding_text

    for i, task in enumerate(["alpha work", "beta work", "gamma work", "delta query"]):
        write_run(make_run(f"v{i}", task, start=T0 + i * DAY), settings)
    store = MemoryStore(settings.memory_dir, "web")
    vecs = {"v0": [1, 0, 0], "v1": [0, 1, 0], "v2": [0, 0, 1], "v3": [0, 0, 1]}
    store.embeddings_path.write_text("".join(json.dumps({"runId": r, "model": "m", "vector": v}) + "\n" for r, v in vecs.items()))
    snap = load_snapshot(store)
    j = J.Judgment(query="delta query", as_of=T0 + 3 * DAY, relevant=("v0",), query_run_id="v3")
    m = A.axis_matrices(snap, [j], k=1, query_vectors={embedding_text("delta query"): np.array([0.9, 0.1, 0], np.float32)})
    assert m.has_vectors
    assert G.evaluate(m, Weights(w_kw=0, w_rec=1, w_lin=0, w_vec=0), k=1) == 0.0, "recency alone picks v2"
    assert G.evaluate(m, Weights(w_kw=0, w_rec=0.1, w_lin=0, w_vec=1), k=1) == 1.0
    res = G.grid_search(m, k=1, steps=3, half_lives=[30], current=Weights())
    assert len(res.axes["w_vec"]) == 3 and res.best.w_vec > 0 and res.best_metric == 1.0


def test_the_query_runs_own_vector_never_stands_in_for_the_query(settings):
    """A query run's stored vector was made from its whole record (summary, outcome): using it as
    the query leaks what dispatch cannot know. Without the queries' embeddings there is no axis."""
    for i, task in enumerate(["alpha work", "delta query"]):
        write_run(make_run(f"v{i}", task, start=T0 + i * DAY), settings)
    store = MemoryStore(settings.memory_dir, "web")
    store.embeddings_path.write_text(json.dumps({"runId": "v0", "model": "m", "vector": [1, 0]}) + "\n"
                                     + json.dumps({"runId": "v1", "model": "m", "vector": [1, 0]}) + "\n")
    snap = load_snapshot(store)
    j = J.Judgment(query="delta query", as_of=T0 + 2 * DAY, relevant=("v0",), query_run_id="v1")
    assert not A.axis_matrices(snap, [j], k=1).has_vectors
    with pytest.raises(ValidationError, match="leak"):
        A.axis_matrices(snap, [j], k=1, vectors=True)
    res = T.tune(snap, judgments=[j], progress=False, current=Weights(), settings=Settings.from_env(env={}))
    assert res.vector_note.startswith("w_vec is not searched: CYBERINE_MEMORY_EMBEDDINGS is not set")
    assert res.axes["w_vec"].tolist() == [0.0]
