"""The tuning widget driven without a browser: sliders, query box, Save / Reload, and the real CLI after Save."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from cybmem.retrieval import tuning as T
from cybmem.retrieval.weights import Weights, save_weights
from cybmem.settings import Settings
from cybmem.store.memory_store import MemoryStore
from cybmem.explore.widgets import TuningView, tuning_view


#: These tests check the linear formula's order, or outputs written with it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("linear_ranker")

NOW = 1_793_491_200_000  # 2026-11-01, after the fixture runs (2026-10-01 .. 2026-10-27)
QUERY = "Fix the flaky cart drawer test"


@pytest.fixture
def view(fixture_copy):
    settings = Settings.from_env(memory_dir=fixture_copy)
    return tuning_view(MemoryStore(fixture_copy, "web"), settings=settings, query=QUERY, k=5, now_ms=NOW)


def _ranking(v: TuningView) -> list[str]:
    return [h.run_id for h in v.result.hits]


def test_sliders_start_at_the_weights_production_uses(view):
    assert view.weights() == Weights()
    assert set(view.sliders) == {"w_kw", "w_rec", "w_lin", "w_vec", "half_life_days"}
    assert len(view.result.hits) == 5
    assert "<table" in view.table.value and view.rows()[0]["run"] in view.table.value


def test_moving_a_slider_changes_the_ranking(view):
    before = _ranking(view)
    assert "cart drawer" in view.result.hits[0].task.lower()
    view.sliders["w_kw"].value = 0.0  # recency and lineage only: the newest runs come first
    after = _ranking(view)
    assert after != before
    ended = [h.ended_at_ms for h in view.result.hits]
    assert ended == sorted(ended, reverse=True)
    assert all(h.contributions["keyword"] == 0 for h in view.result.hits)
    assert "<td style='padding:2px 6px'>0.0</td>" in view.table.value


def test_half_life_and_query_box_rerun_the_search(view):
    view.sliders["w_kw"].value = 0.0
    view.sliders["half_life_days"].value = 1.0
    rec = [h.contributions["recency"] for h in view.result.hits]
    view.sliders["half_life_days"].value = 300.0
    assert [h.contributions["recency"] for h in view.result.hits] != rec
    view.sliders["w_kw"].value = 1.0
    view.query.value = "Stripe webhook signature"  # an api-project topic: nothing in web matches well
    assert view.result.query == "Stripe webhook signature"


def test_metric_line_tracks_the_sliders(view):
    assert view.matrices is not None and view.matrices.n > 0
    default = T.evaluate(view.matrices, Weights())
    assert view.current_metric() == pytest.approx(default)
    assert f"MRR@10 = {default:.4f}" in view.score.value
    view.sliders["w_lin"].value = 0.0
    view.sliders["w_kw"].value = 0.0
    worse = T.evaluate(view.matrices, view.weights())
    assert f"MRR@10 = {worse:.4f}" in view.score.value
    assert f"default weights (nothing saved): {default:.4f}" in view.score.value, "never 'saved weights' when none are"
    assert "saved weights" not in view.score.value
    view.metric.value = "recall"
    assert "recall@10 = " in view.score.value
    view.sliders["w_rec"].value = 0.0
    view.sliders["w_vec"].value = 0.0
    assert "n/a (all weights 0)" in view.score.value and view.weights() is None
    assert "All weights are 0" in view.table.value
    view.save_button.click()
    assert view.save() is None and "Not saved: the weights are all 0" in view.status.value
    assert not (view.store.dir / "weights.json").exists()
    view.sliders["w_kw"].value = 0.6
    assert view.weights().floor == Weights().floor, "the sliders keep the project's floors"


def test_save_writes_the_file_that_cybmem_search_then_uses(view, fixture_copy):
    view.sliders["w_kw"].value = 0.8
    view.sliders["w_rec"].value = 0.05
    view.sliders["w_lin"].value = 0.3
    view.sliders["half_life_days"].value = 7.0
    path = fixture_copy / "web" / "weights.json"
    view.save_button.click()
    assert not path.exists(), "9 judgments test the weights here: too few, as tune --save refuses"
    assert "Not saved: only 9 judgment(s) test the weights" in view.status.value and "Tick Force" in view.status.value
    view.force.value = True  # the twin of --force
    view.save_button.click()
    saved = json.loads(path.read_text())
    assert saved["tuned"]["saved"].startswith("set by hand in the tuning view, checked on the later 12 judgments; "
                                              "saved with Force although only 9 judgment(s)")
    assert saved["tuned"]["kinds"] == {"parent": 14, "resolved": 9} and saved["tuned"]["label"] == "MRR@10"
    assert "Forced:" in view.status.value
    assert f"saved weights: {view.current_metric():.4f}" in view.score.value, "now there are saved weights"
    assert {k: saved[k] for k in ("w_kw", "w_rec", "w_lin", "w_vec")} == {"w_kw": 0.8, "w_rec": 0.05, "w_lin": 0.3, "w_vec": 0.0}
    assert saved["half_life_days"] == pytest.approx(7.0)
    assert "Saved to" in view.status.value

    exe = shutil.which("cybmem")
    cmd = [exe] if exe else [sys.executable, "-c", "from cybmem.cli.app import main; main()"]
    # the widget shows the formula's ranking: the CLI's, with the learned ranker set aside
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("CYBERINE_")}, "CYBERINE_MEMORY_RANKER": "linear"}
    p = subprocess.run(cmd + ["search", QUERY, "--json", "--explain", "-k", "5", "--as-of", str(NOW),
                              "--memory-dir", str(fixture_copy), "--project", "web"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["weights"]["w_kw"] == 0.8 and out["weights"]["w_lin"] == 0.3
    assert out["weights"]["half_life_days"] == pytest.approx(7.0)
    assert [h["runId"] for h in out["hits"]] == _ranking(view), "the CLI ranks exactly as the widget showed"


def test_reload_restores_the_sliders_from_the_saved_file(view, fixture_copy):
    save_weights(Weights(w_kw=0.6, w_rec=0.1, w_lin=0.3, half_life_days=90), fixture_copy / "web" / "weights.json")
    view.sliders["w_kw"].value = 0.0
    view.reload_button.click()
    assert view.weights() == Weights(w_kw=0.6, w_rec=0.1, w_lin=0.3, half_life_days=90)
    fresh = TuningView(MemoryStore(fixture_copy, "web"), settings=Settings.from_env(memory_dir=fixture_copy), now_ms=NOW)
    assert fresh.weights() == view.weights(), "a new view starts from the saved file"


def test_weights_above_one_widen_the_slider(view):
    view.set_weights(Weights(w_kw=2.5, w_rec=0.1, w_lin=0.0, half_life_days=2000))
    assert view.sliders["w_kw"].max >= 2.5 and view.weights().w_kw == 2.5
    assert view.weights().half_life_days == pytest.approx(2000)


def test_static_rendering_for_exports(view):
    bundle = view._repr_mimebundle_()
    assert "text/html" in bundle and "<table" in bundle["text/html"] and "static snapshot" in bundle["text/html"]
    assert bundle["text/plain"].startswith("TuningView(project='web'")


def test_without_judgments_the_metric_line_says_so(fixture_copy):
    v = TuningView(MemoryStore(fixture_copy, "web"), settings=Settings.from_env(memory_dir=fixture_copy), judgments=[],
                   now_ms=NOW)
    assert v.matrices is None and "No judgments" in v.score.value


def test_metric_line_shows_the_later_half_in_time(view):
    """The view says whether weights hold on later judgments (what tune --save checks)."""
    early, late = view.fold_metrics()
    assert view.folds is not None and view.folds[0].n + view.folds[1].n == view.matrices.n
    assert f"earlier half {early:.4f}, <b>later half {late:.4f}</b>" in view.score.value
    view.sliders["w_kw"].value = 0.0
    assert view.fold_metrics() != (early, late)
