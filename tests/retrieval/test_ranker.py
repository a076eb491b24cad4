"""The learned ranker (issue 39): numpy trees against LightGBM, the features, training on a small
history, the setting, the dispatch path without LightGBM, and `cybmem ranker`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cybmem.errors import ValidationError
from cybmem.memory import Memory
from cybmem.retrieval import ranker as R
from cybmem.retrieval.features import FEATURES, features, pool
from cybmem.retrieval.trees import Forest, pack
from cybmem.settings import DEFAULT_RANKER, Settings

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "data-fixtures" / "memory"

lgb = pytest.importorskip("lightgbm")


def _booster(n_features: int = 6, leaves: int = 7, rounds: int = 40, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(600, n_features)).astype(np.float32)
    y = ((X[:, 0] + 0.5 * X[:, 1] ** 2 - X[:, 2] * (X[:, 3] > 0) + rng.normal(scale=0.3, size=600)) > 0.5).astype(int)
    data = lgb.Dataset(X, y, group=[20] * 30)
    params = {"objective": "lambdarank", "num_leaves": leaves, "min_data_in_leaf": 5, "verbose": -1, "seed": seed,
              "num_threads": 1}
    return lgb.train(params, data, num_boost_round=rounds), rng


@pytest.mark.parametrize("leaves", [2, 7, 15])
def test_numpy_trees_predict_what_lightgbm_predicts(leaves):
    booster, rng = _booster(leaves=leaves)
    forest = Forest.from_packed(pack(booster.dump_model()))
    X = rng.normal(size=(300, 6)).astype(np.float32)
    X[:5] = 0.0  # values on thresholds' either side and exact zeros
    # float32 values at, just under and just over each threshold (predict compares float32 rows
    # with the thresholds rounded down to float32; LightGBM compares in float64)
    thr = forest.threshold.ravel().astype(np.float32)
    for k, v in enumerate(np.concatenate([thr, np.nextafter(thr, np.float32(-np.inf)), np.nextafter(thr, np.float32(np.inf))])):
        X[5 + k % 295, forest.feature.ravel()[k % len(thr)]] = v
    assert np.allclose(forest.predict(X), booster.predict(X), rtol=0, atol=1e-9)
    assert np.allclose(forest.predict(X.astype(np.float64)), booster.predict(X), rtol=0, atol=1e-9)
    assert np.allclose(forest.predict(X), forest._walk(X), rtol=0, atol=1e-9)  # the table and the walk agree


@pytest.mark.parametrize("leaves", [2, 7, 15])
def test_shap_is_lightgbm_tree_shap(leaves):
    """Forest.shap is path-dependent TreeSHAP: LightGBM's pred_contrib to 1e-9 (a feature split on
    twice on a path included, with 15 leaves), and the values and base add up to the score."""
    booster, rng = _booster(leaves=leaves)
    forest = Forest.from_packed(pack(booster.dump_model()))
    X = rng.normal(size=(200, 6))
    X[:5] = 0.0
    phi, base = forest.shap(X)
    ref = booster.predict(X, pred_contrib=True)
    assert np.allclose(phi, ref[:, :6], rtol=0, atol=1e-9)
    assert np.allclose(base, ref[:, 6], rtol=0, atol=1e-9)
    assert np.allclose(base + phi.sum(axis=1), forest.predict(X), rtol=0, atol=1e-9)


def test_shap_of_the_shipped_model_is_lightgbm_tree_shap(tmp_path):
    """The shipped model's trees, rebuilt as a LightGBM booster (its text format from the packed
    arrays and covers), give the same tree SHAP values as Forest.shap on rows of its features."""
    m = R.model()
    f = m.forest
    booster = lgb.Booster(model_str=_model_text(f, list(m.features)))
    rng = np.random.default_rng(3)
    X = rng.normal(size=(60, len(m.features))) * rng.choice([0.1, 1.0, 10.0], size=(60, len(m.features)))
    X[:20] = np.abs(X[:20])  # most features are shares and counts: non-negative
    assert np.allclose(booster.predict(X), f.predict(X), rtol=0, atol=1e-9)
    phi, base = f.shap(X)
    ref = booster.predict(X, pred_contrib=True)
    assert np.allclose(phi, ref[:, :-1], rtol=0, atol=1e-9)
    assert np.allclose(base, ref[:, -1], rtol=0, atol=1e-9)


def test_a_model_file_without_covers_predicts_but_cannot_explain():
    booster, rng = _booster()
    packed = pack(booster.dump_model())
    del packed["count"], packed["leaf_count"]  # a format 1 file
    forest = Forest.from_packed(packed)
    X = rng.normal(size=(10, 6))
    assert np.allclose(forest.predict(X), booster.predict(X), atol=1e-9)
    with pytest.raises(ValueError, match="no covers"):
        forest.shap(X)


def _model_text(f: Forest, names: list[str]) -> str:
    """LightGBM's text model format for packed trees (what Booster(model_str=...) reads)."""
    F = len(names)
    out = ["tree", "version=v4", "num_class=1", "num_tree_per_iteration=1", "label_index=0",
           f"max_feature_idx={F - 1}", "objective=lambdarank", "feature_names=" + " ".join(names),
           "feature_infos=" + " ".join(["[-1e+300:1e+300]"] * F), ""]  # no tree_sizes: LightGBM then parses in order
    fmt = lambda xs: " ".join(repr(float(x)) if isinstance(x, float) else str(x) for x in xs)  # noqa: E731
    for t in range(f.n_trees):
        single = f.left[t, 0] == -1 and f.right[t, 0] == -1
        ni = 0 if single else int((f.count[t] > 0).sum())  # padding nodes have no rows
        n_leaves = ni + 1
        out += [f"Tree={t}", f"num_leaves={n_leaves}", "num_cat=0"]
        if ni == 0:
            out += [f"leaf_value={fmt([float(f.leaf[t, 0])])}", f"leaf_count={int(f.leaf_count[t, 0])}", "shrinkage=1", ""]
            continue
        out += [f"split_feature={fmt(f.feature[t, :ni].tolist())}", f"split_gain={fmt([1.0] * ni)}",
                f"threshold={fmt([float(x) for x in f.threshold[t, :ni]])}", f"decision_type={fmt([2] * ni)}",
                f"left_child={fmt(f.left[t, :ni].tolist())}", f"right_child={fmt(f.right[t, :ni].tolist())}",
                f"leaf_value={fmt([float(x) for x in f.leaf[t, :n_leaves]])}", f"leaf_weight={fmt([1.0] * n_leaves)}",
                f"leaf_count={fmt(f.leaf_count[t, :n_leaves].tolist())}", f"internal_value={fmt([0.0] * ni)}",
                f"internal_weight={fmt([1.0] * ni)}", f"internal_count={fmt(f.count[t, :ni].tolist())}",
                "is_linear=0", "shrinkage=1", ""]
    out += ["end of trees", "", "pandas_categorical:null", ""]
    return "\n".join(out)


def test_the_shipped_model_reads_the_features_this_cybmem_computes():
    m = R.model()
    assert m.features == FEATURES
    assert m.forest.n_trees > 0
    prov = m.provenance
    assert {h["name"] for h in prov["histories"]} >= {"pytest-memory", "mypy-memory", "sphinx-memory", "celery-memory"}
    assert prov["lightgbm"] and prov["commit"]


def test_pool_takes_the_first_stage_top_bm25_top_and_the_newest():
    n = 400
    total = np.linspace(0, 1, n).astype(np.float32)
    kw = np.zeros(n, np.float32)
    kw[5] = 9.0  # the best BM25 match, far down the first stage
    ended = np.arange(n, dtype=np.int64)
    ended[0] = 10**9  # the newest run, last on the first stage
    got = pool(total, kw, ended)
    assert {5, 0, n - 1} <= set(got.tolist())
    assert list(got) == sorted(got)


def test_pool_tops_break_ties_as_a_full_sort_does_on_a_large_store():
    """The pool's tops are selected (top_k, a partition) rather than sorted over every candidate:
    the same rows as the full lexsort, ties to the higher row, with heavy ties and 30k candidates."""
    from cybmem.retrieval.features import _order_desc

    rng = np.random.default_rng(5)
    n = 30_000
    for _ in range(5):
        total = rng.choice([0.0, 0.25, 0.5, 1.0], n).astype(np.float32)
        kw = np.where(rng.random(n) < 0.01, rng.integers(1, 4, n), 0).astype(np.float32)
        ended = rng.integers(0, 20, n).astype(np.int64)
        tie = np.arange(n)
        want = np.unique(np.concatenate([_order_desc(total, tie)[:120], [i for i in _order_desc(kw, tie)[:40] if kw[i] > 0],
                                         np.lexsort((-tie, -ended))[:8]]))
        assert pool(total, kw, ended).tolist() == want.tolist()


def _snapshot():
    from cybmem.store.loading import load_snapshot
    from cybmem.store.memory_store import MemoryStore

    return load_snapshot(MemoryStore(FIXTURES, "web-7663e1"))


def test_features_are_finite_and_normalised_per_task():
    snap = _snapshot()
    rows = np.arange(snap.n)
    now = int(snap.ended_ms().max()) + 3_600_000
    X = features(snap, "deploy fails over SFTP", rows, total=np.linspace(1, 0, snap.n), keyword=np.zeros(snap.n),
                 recency=np.zeros(snap.n), lineage=np.zeros(snap.n), kw_raw=snap.index.scores(["deploy"]), now_ms=now)
    assert X.shape == (snap.n, len(FEATURES)) and X.dtype == np.float32
    assert np.isfinite(X).all()
    f = {name: X[:, i] for i, name in enumerate(FEATURES)}
    for name in ("first_total_rel", "bm25_subject_rel", "bm25_body_rel", "coverage_idf", "coverage_share", "age_1h",
                 "age_365d", "lag_1d"):
        assert (f[name] >= 0).all() and (f[name] <= 1 + 1e-6).all(), name
    assert f["lag_1d"].max() == pytest.approx(1.0)  # the newest candidate: no lag
    assert f["runs_since_log"].min() == 0.0


def test_a_held_snapshot_keeps_its_runs_fields_and_computes_the_same_features():
    """A prepared (held) snapshot keeps its runs' subject and body as token ids between queries;
    its features equal a one-shot snapshot's, query after query, and a full keep starts over."""
    from cybmem.retrieval import features as F

    plain, held = _snapshot(), _snapshot().prepare()
    rng = np.random.default_rng(2)
    tasks = plain.records.column("task").to_pylist()
    for q in range(12):
        rows = np.sort(rng.choice(plain.n, min(plain.n, 5), replace=False))
        args = dict(total=rng.random(len(rows)).astype(np.float32), keyword=rng.random(len(rows)),
                    recency=rng.random(len(rows)), lineage=np.zeros(len(rows)), kw_raw=rng.random(len(rows)).astype(np.float32),
                    now_ms=int(plain.ended_ms().max()))
        query = tasks[q % len(tasks)]
        want = features(plain, query, rows, **args)
        assert np.array_equal(features(held, query, rows, **args), want)
        assert np.array_equal(features(plain, query, rows, tasks=tasks, **args), want)
    kept = F._HELD_FIELDS[held]
    assert kept.rows and set(kept.rows) <= set(range(held.n))
    kept.MAX_ROWS = 2  # a full keep starts over and still answers
    rows = np.arange(min(plain.n, 4))
    args = dict(total=np.ones(len(rows), np.float32), keyword=np.ones(len(rows)), recency=np.ones(len(rows)),
                lineage=np.zeros(len(rows)), kw_raw=np.ones(len(rows), np.float32), now_ms=int(plain.ended_ms().max()))
    assert np.array_equal(features(held, tasks[0], rows, **args), features(plain, tasks[0], rows, **args))


def test_search_is_learned_by_default_and_linear_one_setting_away():
    assert DEFAULT_RANKER == "learned"
    learned = Memory(Settings.from_env({}, memory_dir=FIXTURES), project="web-7663e1")
    linear = Memory(Settings.from_env({"CYBERINE_MEMORY_RANKER": "linear"}, memory_dir=FIXTURES), project="web-7663e1")
    a = learned.search("deploy fails over SFTP", k=5)
    b = linear.search("deploy fails over SFTP", k=5)
    assert a.hits and b.hits
    assert all(h.learned is not None for h in a.hits) and all(h.learned is None for h in b.hits)
    assert [h.score for h in a.hits] == sorted((h.score for h in a.hits), reverse=True)
    out = a.hits[0].to_dict(explain=True)
    assert set(out["contributions"]) >= {"keyword", "recency"}  # the first stage's axes, beside
    learned_part = out["learned"]
    assert set(learned_part["values"]) == set(FEATURES)
    assert sum(learned_part["contributions"].values()) == pytest.approx(learned_part["raw"], abs=1e-4)
    assert 0 < learned_part["score"] < 1
    assert "learned" not in b.hits[0].to_dict(explain=True)


def test_the_setting_is_read_once_and_checked():
    assert Settings.from_env({"CYBERINE_MEMORY_RANKER": " Linear "}).ranker == "linear"
    with pytest.raises(ValidationError, match="CYBERINE_MEMORY_RANKER"):
        Settings.from_env({"CYBERINE_MEMORY_RANKER": "neural"})
    lenient = Settings.from_env({"CYBERINE_MEMORY_RANKER": "neural"}, lenient=True)
    assert lenient.ranker == "learned" and any("CYBERINE_MEMORY_RANKER" in p for p in lenient.problems)


def test_the_dispatch_path_never_imports_lightgbm():
    code = ("import sys\nfrom cybmem.memory import Memory\nfrom cybmem.settings import Settings\n"
            f"m = Memory(Settings.from_env({{}}, memory_dir={str(FIXTURES)!r}), project='web-7663e1')\n"
            "hits = m.search('deploy fails over SFTP', k=3).hits\n"
            "assert hits and hits[0].learned is not None\n"
            "print(sorted(x for x in ('lightgbm', 'sklearn', 'scipy') if x in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _two_roots(corpus: Path, tmp_path: Path) -> list[Path]:
    """The 1k corpus as two histories: its judged queries split in two halves."""
    lines = [ln for ln in (corpus / "qrels.jsonl").read_text().splitlines() if ln.strip()]
    roots = []
    for i, part in enumerate((lines[: len(lines) // 2], lines[len(lines) // 2:])):
        root = tmp_path / f"half{i}"
        shutil.copytree(corpus, root, ignore=shutil.ignore_patterns(".cache*", "cache"))
        (root / "qrels.jsonl").write_text("\n".join(part) + "\n")
        roots.append(root)
    return roots


def test_training_on_small_histories_writes_a_model_search_can_use(corpus_1k, tmp_path):
    from cybmem.retrieval import ranker_training as RT

    roots = _two_roots(corpus_1k, tmp_path)
    out = tmp_path / "model.json"
    done = RT.train_roots(roots, out=out, rounds=20)
    assert out.is_file() and done["trees"] == 20
    loo = done["leaveOneOut"]
    assert [h["name"] for h in loo["histories"]] == ["half0", "half1"]
    for h in loo["histories"]:
        assert 0 <= h["learned_mrr"] <= 1 and 0 <= h["linear_mrr"] <= 1 and h["queries"] > 0
    m = R.load_model(out)
    assert m.features == FEATURES and m.provenance["histories"][0]["records"] == 1000
    assert m.provenance["leaveOneOut"]["meanLearned"] == loo["meanLearned"]


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cybmem.cli", *args], capture_output=True, text=True, env=env)


def test_cybmem_ranker_show_prints_the_provenance():
    out = _cli("ranker", "show")
    assert out.returncode == 0, out.stderr
    assert f"trees over {len(FEATURES)} features" in out.stdout and "mypy-memory" in out.stdout
    js = _cli("ranker", "show", "--json")
    assert js.returncode == 0
    data = json.loads(js.stdout)
    assert data["features"] == list(FEATURES) and data["trees"] == R.model().forest.n_trees


def test_cybmem_ranker_train_exit_codes(tmp_path):
    missing = _cli("ranker", "train", str(tmp_path / "nowhere"))
    assert missing.returncode == 1 and "projects.json" in missing.stderr
    as_json = _cli("ranker", "train", str(tmp_path / "nowhere"), "--json")
    assert as_json.returncode == 1 and json.loads(as_json.stderr)["exitCode"] == 1
    usage = _cli("ranker", "train")
    assert usage.returncode == 2
    assert _cli("ranker", "nonsense").returncode == 2


def test_cybmem_ranker_train_json(corpus_1k, tmp_path):
    roots = _two_roots(corpus_1k, tmp_path)
    out = tmp_path / "m.json"
    done = _cli("ranker", "train", *map(str, roots), "--out", str(out), "--json", "--no-progress")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["model"] == str(out) and len(data["leaveOneOut"]["histories"]) == 2
    shown = _cli("ranker", "show", "--model", str(out), "--json")
    assert json.loads(shown.stdout)["leaveOneOut"] == data["leaveOneOut"]


def test_a_merge_commits_pointer_says_what_was_merged():
    from cybmem.dispatch.preamble import PreambleEntry, _entry_lines

    task = "Merge pull request #14774 from The-Compiler/deprecate-class-scope\n\nDeprecate class-scoped fixtures"
    line = _entry_lines(PreambleEntry("d724e161-aaaa-bbbb-cccc-123456789012", 1_700_000_000_000, "done", task, "", [], [],
                                      tier="pointer"))[0]
    assert "Deprecate class-scoped fixtures" in line and "Merge pull request" not in line
    plain = _entry_lines(PreambleEntry("x1", 1_700_000_000_000, "done", "Fix the cache\nbody", "", [], [], tier="pointer"))[0]
    assert plain.endswith(": Fix the cache")


def test_inject_json_says_which_runs_were_cut_to_pointers():
    from cybmem.dispatch import inject as dispatch
    from cybmem.retrieval.weights import LoadedWeights, Weights
    from cybmem.store.memory_store import MemoryStore

    settings = Settings.from_env({"CYBERINE_MEMORY_TOPK": "1", "CYBERINE_MEMORY_ISSUES": "0"}, memory_dir=FIXTURES)
    inj = dispatch._build(MemoryStore(FIXTURES, "web-7663e1"), "deploy fails over SFTP", settings,
                          LoadedWeights(Weights(), {}), as_of=None, now_ms=None, parent_run_id=None, chat_session_id=None)
    runs = inj.to_dict()["runs"]
    assert runs[0]["shown"] == "full" and not runs[0]["cutToPointer"]
    cut = [r for r in runs if r["cutToPointer"]]
    assert cut and all(r["shown"] == "pointer" and r["evidence"]["tier"] == "full" for r in cut)


def test_ledger_features_see_the_ledger_as_of_the_task_moment():
    """The issue-ledger features (evaluation only, issue 39) read no event after the task's moment:
    the run that opened an issue has it open until it is resolved, then not; the resolving run
    counts only once it has resolved."""
    from cybmem.retrieval import ranker_training as RT
    from cybmem.store.loading import load_snapshot
    from cybmem.store.memory_store import MemoryStore
    from cybmem.store.tokens import tokenize

    snap = load_snapshot(MemoryStore(FIXTURES, "web"))
    led = RT.Ledger.of(snap)
    row = {rid: i for i, rid in enumerate(snap.records.column("runId").to_pylist())}
    opener, resolver = row["769e85fa-06fa-5cd5-91e7-798a9e54c884"], row["e4c50011-c025-5969-bc82-196f1d34425d"]
    tokens = tokenize("API 500 for ids with a dash")
    before, after = 1790840000000, 1790850000000  # between the opening and its resolution; after it
    f = dict(zip(RT.LEDGER_FEATURES, RT.ledger_features(led, tokens, np.array([opener]), before)[0]))
    assert f["ledger_opened_open"] == 1 and f["ledger_opened_log"] > 0 and f["ledger_open_match"] > 0.3
    f = dict(zip(RT.LEDGER_FEATURES, RT.ledger_features(led, tokens, np.array([opener]), after)[0]))
    assert f["ledger_opened_open"] == 0 and f["ledger_open_match"] == 0 and f["ledger_opened_log"] > 0
    assert RT.ledger_features(led, tokens, np.array([resolver]), before)[0, 1] == 0
    assert RT.ledger_features(led, tokens, np.array([resolver]), after)[0, 1] == 1


def test_the_shipped_model_is_never_trained_with_the_ledger_features():
    from cybmem.retrieval import ranker_training as RT

    h = RT.History("h", 1, np.zeros((0, len(FEATURES) + len(RT.LEDGER_FEATURES)), np.float32), np.zeros(0, np.int32),
                   np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0, bool),
                   features=FEATURES + RT.LEDGER_FEATURES)
    with pytest.raises(ValueError, match="ledger"):
        RT.train([h], loo=False)
