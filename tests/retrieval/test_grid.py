"""The grid kernel and the grid search (cybmem.retrieval.grid): every grid point's value is the one
evaluate() gives it alone, the best point's value is real, and the current weights stay best when
no grid point beats them."""

import numpy as np
import pytest

from cybmem.errors import ValidationError
from cybmem.retrieval import axis_matrices as A
from cybmem.retrieval import grid as G
from cybmem.retrieval import judgments as J
from cybmem.retrieval.weights import Weights
from cybmem.store.memory_store import MemoryStore
from cybmem.store.snapshot import load_snapshot

#: These tests check the linear formula's order (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("linear_ranker")


@pytest.fixture
def web(fixture_copy):
    store = MemoryStore(fixture_copy, "web")
    return store, load_snapshot(store)


def test_grid_search_is_at_least_as_good_as_the_defaults_on_fixture_judgments(web):
    _, snap = web
    m = A.axis_matrices(snap, J.judgments_from_store(snap), k=10)
    for metric in J.METRICS:
        res = G.grid_search(m, metric=metric, k=3, steps=6, half_lives=[3, 30, 120], current=Weights())
        default = G.evaluate(m, Weights(), metric=metric, k=3)
        assert res.current_metric == pytest.approx(default)
        assert res.best_metric >= default
        assert G.evaluate(m, res.best, metric=metric, k=3) == pytest.approx(res.best_metric), "the best point's value is real"
        assert res.values.shape == (6, 6, 6, 1, 3) and res.points == 6 * 6 * 6 * 3
        assert np.isnan(res.values[0, 0, 0]).all(), "all-zero weights rank nothing"
        assert np.nanmax(res.values) <= res.best_metric + 1e-12


def test_grid_values_match_pointwise_evaluation(web):
    _, snap = web
    m = A.axis_matrices(snap, J.judgments_from_store(snap, kinds=["issue"]), k=5)
    res = G.grid_search(m, metric="ndcg", w_kw=[0, 0.5, 1], w_rec=[0, 0.25, 1], w_lin=[0, 1], half_lives=[1, 30])
    df = res.to_frame()
    assert len(df) == 3 * 3 * 2 * 2 and set(df.columns) == {"w_kw", "w_rec", "w_lin", "w_vec", "half_life_days", "metric"}
    for row in df.dropna().itertuples():
        w = Weights(w_kw=row.w_kw, w_rec=row.w_rec, w_lin=row.w_lin, half_life_days=row.half_life_days)
        assert row.metric == pytest.approx(G.evaluate(m, w, metric="ndcg", k=5), abs=1e-12)
    assert res.slice2d("w_kw", "w_rec").shape == (3, 3)
    assert res.slice2d("w_lin", "half_life_days", reduce="max").shape == (2, 2)
    with pytest.raises(ValidationError):
        res.slice2d("w_kw", "w_kw")


def test_best_is_the_current_weights_when_nothing_beats_them(web):
    _, snap = web
    m = A.axis_matrices(snap, J.judgments_from_store(snap), k=10)
    res = G.grid_search(m, w_kw=[0], w_rec=[1], w_lin=[0], half_lives=[0.1], current=Weights())
    assert not res.best_in_grid and res.best == Weights() and res.improvement == 0.0
