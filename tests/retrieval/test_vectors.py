"""The vector axis: the cosine kernels, the row-aligned vector cache, embedding on write, the
backfill, search and inject with embeddings, against the real test servers of tests/servers.py.

Tests marked ``model`` use the real all-MiniLM-L6-v2 model (skip them with ``-m "not model"``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import numpy as np
import orjson
import pytest
from hypothesis import given, settings as settings_, strategies as st

from cybmem.operations.write import write_run
from cybmem.retrieval.search import search
from cybmem.settings import Settings
from cybmem.store.snapshot import load_snapshot
from cybmem.store.memory_store import MemoryStore
from cybmem.retrieval.embed_backfill import embed_missing
from cybmem.retrieval.vector_cache import load_index
from cybmem.retrieval.vectors import EXACT_MAX_FLOATS, VectorIndex, sign_codes
from cybmem.retrieval.weights import DEFAULT_W_VEC, Weights, weights_for

from conftest import T0, make_run
from servers import HASH_DIMS, MINILM_NAME, Drip, embed_server, hash_encode, minilm, minilm_server  # noqa: F401

DAY = 86_400_000


def embed_env(server, **extra) -> dict:
    """Embeddings through the server's OpenAI form (the Ollama form is tested in tests/clients/test_embeddings.py)."""
    return {"CYBERINE_MEMORY_EMBEDDINGS": f"{server.url}/v1", "CYBERINE_MEMORY_EMBED_MODEL": server.model, **extra}


def settings_with(memory_root, env=None) -> Settings:
    return Settings.from_env(env or {}, memory_dir=memory_root)


def lines_of(path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


# --- kernels --------------------------------------------------------------------------------


def test_sign_codes_and_hamming_match_a_bit_by_bit_count():
    rng = np.random.default_rng(1)
    m = rng.standard_normal((50, 70)).astype(np.float32)  # 70 dims: two words, the second padded
    q = rng.standard_normal(70).astype(np.float32)
    index = VectorIndex.from_matrix(m, block_rows=16)
    expected = ((m > 0) != (q > 0)).sum(axis=1)
    assert sign_codes(m).shape == (50, 2)
    np.testing.assert_array_equal(index.hamming(q), expected)


def test_exact_cosine_is_clipped_and_zero_for_rows_without_a_vector():
    m = np.array([[1, 0], [0, 1], [-1, 0], [0, 0], [1, 1]], dtype=np.float32)
    index = VectorIndex.from_matrix(m, block_rows=2)
    cos = index.exact(np.array([2, 0], dtype=np.float32))
    np.testing.assert_allclose(cos, [1, 0, 0, 0, 2 ** -0.5], rtol=1e-6)
    assert index.count == 4 and list(index.has) == [True, True, True, False, True]


def test_binary_axis_rescoring_every_row_is_the_exact_axis_and_misses_score_zero():
    rng = np.random.default_rng(2)
    m = rng.standard_normal((400, 32)).astype(np.float32)
    m[7] = 0  # no vector
    index = VectorIndex.from_matrix(m, block_rows=100)
    q = rng.standard_normal(32).astype(np.float32)
    np.testing.assert_allclose(index.cosine(q, method="binary", candidates=400), index.exact(q), rtol=1e-5, atol=1e-6)
    few = index.cosine(q, method="binary", candidates=20, rescore=np.array([3, 7]))
    scored = np.flatnonzero(few > 0)
    assert 3 in index.nearest(q, 20) or few[3] == pytest.approx(index.exact(q)[3], abs=1e-6)
    np.testing.assert_allclose(few[scored], index.exact(q)[scored], rtol=1e-5, atol=1e-6)
    assert few[7] == 0 and len(index.nearest(q, 20)) >= 20


@given(st.lists(st.sampled_from([-np.inf, 0.0, 0.1, 0.25, 0.5, 0.7, 1.0]) | st.floats(0, 2, width=32), min_size=1, max_size=700),
       st.integers(1, 12), st.integers(1, 30), st.integers(0, 200))
@settings_(max_examples=300, deadline=None)
def test_the_best_rows_are_a_top_set_of_at_least_k_rows(values, repeats, k, extra):
    """_best_rows (the rows the vector axis' bound starts from) is a top set: nothing left out
    beats anything taken, and at least k rows are taken (ties and masked rows included; up to
    8,400 rows, so the strided sample is taken too)."""
    from cybmem.retrieval.vectors import _best_rows

    p = np.tile(np.array(values, dtype=np.float32), repeats)
    m = 4 * k + extra
    rows = _best_rows(p, m, k)
    assert np.all(np.diff(rows) > 0), "ascending, no repeats"
    assert len(rows) >= min(k, len(p))
    rest = np.setdiff1d(np.arange(len(p)), rows)
    if len(rows) and len(rest):
        assert p[rows].min() >= p[rest].max()


def test_auto_is_exact_below_the_threshold_and_binary_above():
    assert EXACT_MAX_FLOATS >= 7761 * 384, "the dev corpus is scored exactly"
    rng = np.random.default_rng(3)
    q = rng.standard_normal(4).astype(np.float32)
    small = VectorIndex.from_matrix(rng.standard_normal((100, 4)).astype(np.float32))
    np.testing.assert_array_equal(small.cosine(q), small.exact(q))


# --- the vector cache ------------------------------------------------------------------------


def _store_with_runs(settings, n=6):
    for i in range(n):
        write_run(make_run(f"r{i}", f"Task number {i}", start=T0 + i * DAY), settings)
    return MemoryStore(settings.memory_dir, "web")


def _vec(text: str) -> np.ndarray:
    return hash_encode([text])[0]


def _assert_same_as_a_full_build(store, model="m"):
    warm = load_index(load_snapshot(store), model)
    cold = load_index(load_snapshot(store, use_cache=False), model)
    q = _vec("query")
    if cold is None:
        assert warm is None
        return None
    np.testing.assert_array_equal(warm.has, cold.has)
    np.testing.assert_allclose(warm.exact(q), cold.exact(q), rtol=1e-6)
    return warm


def test_the_cache_refreshes_incrementally_and_equals_a_full_build(settings):
    store = _store_with_runs(settings)
    assert load_index(load_snapshot(store), "m") is None, "no embeddings.jsonl: no vector axis"
    assert store.append_embeddings([(f"r{i}", "m", _vec(f"t{i}")) for i in (0, 2, 4)]) == (3, store.embeddings_path.stat().st_size)
    idx = _assert_same_as_a_full_build(store)
    assert list(idx.has) == [True, False, True, False, True, False]
    # a vector for an older row, one for a run with no record yet, another model's line, then the record
    store.append_embeddings([("r1", "m", _vec("t1")), ("r9", "m", _vec("t9")), ("r3", "other", np.ones(5))])
    write_run(make_run("r6", "Task number 6", start=T0 + 6 * DAY), settings)
    idx = _assert_same_as_a_full_build(store)
    assert list(idx.has) == [True, True, True, False, True, False, False]
    write_run(make_run("r9", "Task number 9", start=T0 + 9 * DAY), settings)
    idx = _assert_same_as_a_full_build(store)
    assert idx.has[-1] and idx.count == 5, "the waiting vector found its record"
    for i in range(12):  # many small refreshes: blocks are merged, never more than MAX_BLOCKS
        write_run(make_run(f"s{i}", f"More {i}", start=T0 + (20 + i) * DAY), settings)
        store.append_embeddings([(f"s{i}", "m", _vec(f"s{i}"))])
        idx = _assert_same_as_a_full_build(store)
    assert len(idx.blocks) <= 8 and idx.count == 17
    assert load_index(load_snapshot(store), "other").count == 1 and load_index(load_snapshot(store), "nope") is None


def test_a_snapshot_keeps_its_vectors_and_lets_them_go_with_it(settings):
    """vector_cache.py keeps the indexes it loaded for a snapshot itself (not in the snapshot's
    state): loaded once per snapshot and model, another snapshot loads its own, and they are
    let go with their snapshot."""
    import gc
    import weakref

    store = _store_with_runs(settings, 3)
    store.append_embeddings([(f"r{i}", "m", _vec(f"t{i}")) for i in range(3)])
    snap = load_snapshot(store)
    idx = load_index(snap, "m")
    assert idx is not None and load_index(snap, "m") is idx and load_index(snap, "nope") is None
    other = load_snapshot(store)
    assert other is not snap and load_index(other, "m") is not idx
    gone = weakref.ref(idx)
    del snap, idx
    gc.collect()
    assert gone() is None, "a snapshot's vectors outlived it"
    assert load_index(other, "m").count == 3


def test_vectors_are_keyed_by_model_and_dimension_and_the_last_line_of_a_run_wins(settings):
    store = _store_with_runs(settings, 2)
    first, second, small = _vec("first"), _vec("second"), np.ones(3)
    with open(store.embeddings_path, "ab") as fh:  # another tool, writing what cybmem never would
        for rid, vec in (("r0", first), ("r0", second), ("r1", small)):
            fh.write(orjson.dumps({"runId": rid, "model": "m", "vector": vec.tolist()}) + b"\n")
    snap = load_snapshot(store)
    newest = load_index(snap, "m")  # the key of the model's last line: (m, 3)
    assert (newest.dims, list(newest.has)) == (3, [False, True])
    eight = load_index(snap, "m", dims=8)
    assert (eight.dims, list(eight.has)) == (8, [True, False])
    np.testing.assert_allclose(eight.exact(second)[0], 1.0, rtol=1e-5)  # r0's last 8-dimension line
    assert load_index(snap, "m", dims=5) is None
    assert not [p for p in snap.problems if "embeddings" in p.path], "another dimension is another key, not a fault"


def test_a_model_that_changes_its_dimension_starts_a_new_key_in_the_cache(settings):
    """The warm index follows the model's newest dimension as lines come in, as a full build does."""
    store = _store_with_runs(settings, 3)
    store.append_embeddings([(f"r{i}", "m", _vec(f"t{i}")) for i in range(3)])
    assert _assert_same_as_a_full_build(store).dims == 8
    store.append_embeddings([("r1", "m", np.arange(1, 5, dtype=np.float32))], since=store.embeddings_path.stat().st_size)
    snap = load_snapshot(store)
    warm, cold = load_index(snap, "m"), load_index(load_snapshot(store, use_cache=False), "m")
    assert (warm.dims, list(warm.has)) == (cold.dims, list(cold.has)) == (4, [False, True, False])
    assert not snap.problems
    store.append_embeddings([("r2", "m", _vec("again"))], since=store.embeddings_path.stat().st_size)  # back to 8
    idx = _assert_same_as_a_full_build(store)
    assert (idx.dims, list(idx.has)) == (8, [True, True, True])
    np.testing.assert_allclose(idx.exact(_vec("again"))[2], 1.0, rtol=1e-5)  # r2's last line


def test_a_replaced_embeddings_file_or_a_rebuilt_records_cache_starts_over(settings):
    store = _store_with_runs(settings, 3)
    store.append_embeddings([("r0", "m", _vec("a"))])
    _assert_same_as_a_full_build(store)
    store.embeddings_path.unlink()
    store.append_embeddings([("r2", "m", _vec("b"))])  # a new file (new inode)
    idx = _assert_same_as_a_full_build(store)
    assert list(idx.has) == [False, False, True]
    for f in (store.dir / ".cache").glob("rec-*.arrow"):
        f.unlink()  # the records cache is damaged and rebuilt: rows may move
    (store.dir / ".cache" / "manifest.json").unlink()
    idx = _assert_same_as_a_full_build(store)
    assert list(idx.has) == [False, False, True]


def test_append_embeddings_writes_one_line_per_run_and_model(settings):
    store = _store_with_runs(settings, 2)
    wrote, size = store.append_embeddings([("r0", "m", _vec("a")), ("r0", "m", _vec("b")), ("r0", "m2", _vec("c"))])
    assert wrote == 2
    assert store.append_embeddings([("r0", "m", _vec("a")), ("r1", "m", _vec("d"))], since=0)[0] == 1
    rows = lines_of(store.embeddings_path)
    assert [(r["runId"], r["model"], len(r["vector"])) for r in rows] == [("r0", "m", 8), ("r0", "m2", 8), ("r1", "m", 8)]
    assert all(set(r) == {"runId", "model", "vector"} for r in rows), "the line store-format.md specifies, nothing more"
    np.testing.assert_array_equal(np.array(rows[0]["vector"], dtype=np.float32), _vec("a"))


# --- embedding on write, the backfill ---------------------------------------------------------------


def test_a_record_is_embedded_when_written(memory_root, embed_server):
    settings = settings_with(memory_root, embed_env(embed_server))
    res = write_run(make_run("r1", "Fix the login form", output="Done.\n\nACCOMPLISHED:\n- x\nISSUES:\n- Slow CI: 20 min\nNEXT:\n- none"), settings)
    assert res.embedded and res.warnings == [] and res.to_dict()["embedded"] is True
    row, = lines_of(res.store.embeddings_path)
    assert (row["runId"], row["model"], len(row["vector"])) == ("r1", "hash-embed", HASH_DIMS)
    text = embed_server.requests[-1].body["input"]
    assert text == ["Fix the login form\nFix the login form. Ended done. Done.\nSlow CI\n20 min"], "the keyword index's text"


def test_a_failed_embedding_never_fails_the_write(memory_root, embed_server, tmp_path):
    embed_server.stop()
    settings = settings_with(memory_root, embed_env(embed_server))
    res = write_run(make_run("r1"), settings)
    assert res.record.runId == "r1" and not res.embedded and res.store.record_path("r1").exists()
    assert len(res.warnings) == 1 and res.warnings[0].startswith("embedding not written: ") and "cybmem embed" in res.warnings[0]
    assert "connection refused" in res.warnings[0] and "\n" not in res.warnings[0]
    exe = shutil.which("cybmem")
    env = {**os.environ, "CYBERINE_MEMORY_DIR": str(memory_root), **embed_env(embed_server)}
    path = tmp_path / "r2.json"
    path.write_text(json.dumps(make_run("r2", start=T0 + DAY)))
    p = subprocess.run([exe, "write", str(path)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == "Wrote r2 (done) to project web.\n"
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("warning: embedding not written: ")
    path.write_text(json.dumps(make_run("r3", start=T0 + 2 * DAY)))
    p = subprocess.run([exe, "write", str(path), "--json"], env=env, capture_output=True, text=True, timeout=60)
    data = json.loads(p.stdout)
    assert data["embedded"] is False and len(data["warnings"]) == 1 and data["warnings"][0].startswith("embedding not written")


def test_embed_backfills_the_missing_vectors(memory_root, embed_server, tmp_path):
    plain = settings_with(memory_root)
    for i in range(5):
        write_run(make_run(f"r{i}", f"Task {i}", start=T0 + i * DAY), plain)
    settings = settings_with(memory_root, embed_env(embed_server))
    store = MemoryStore(memory_root, "web")
    store.append_embeddings([("r2", "hash-embed", hash_encode(["whatever"])[0])])
    result = embed_missing(store, settings, batch_size=2)
    assert (result.records, result.had, result.embedded, result.dims) == (5, 1, 4, HASH_DIMS) and result.rate > 0
    assert [len(r.body["input"]) for r in embed_server.requests] == [2, 2]
    assert sorted(r["runId"] for r in lines_of(store.embeddings_path)) == ["r0", "r1", "r2", "r3", "r4"]
    assert embed_missing(store, settings).embedded == 0
    exe = shutil.which("cybmem")
    env = {**os.environ, "CYBERINE_MEMORY_DIR": str(memory_root), **embed_env(embed_server)}
    write_run(make_run("r5", "Task 5", start=T0 + 9 * DAY), plain)
    p = subprocess.run([exe, "embed", "--project", "web"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"Embedded 1 records of project web with hash-embed ({HASH_DIMS} dimensions) in ")
    assert "records/s; 6 of 6 records have a vector now." in p.stdout
    p = subprocess.run([exe, "embed", "--project", "web", "--json"], env=env, capture_output=True, text=True, timeout=60)
    data = json.loads(p.stdout)
    assert (data["embedded"], data["had"], data["records"]) == (0, 6, 6) and "recordsPerSecond" in data
    p = subprocess.run([exe, "embed", "--project", "web"], env={**env, "CYBERINE_MEMORY_EMBEDDINGS": ""},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and p.stderr.startswith("Error: embeddings are off: set CYBERINE_MEMORY_EMBEDDINGS")


# --- search and inject ----------------------------------------------------------------------------


def test_search_uses_the_vector_axis_with_the_measured_default_weight(memory_root, embed_server):
    settings = settings_with(memory_root, embed_env(embed_server))
    for i in range(4):
        write_run(make_run(f"r{i}", f"Task {i}", start=T0 + i * DAY), settings)
    store = MemoryStore(memory_root, "web")
    loaded = weights_for(settings, store, vectors=True)
    assert loaded.weights.w_vec == DEFAULT_W_VEC and loaded.sources["w_vec"] == "default (embeddings)"
    r1_text = embed_server.requests[1].body["input"][0]  # what r1 was embedded with
    res = search(store, r1_text, settings=settings, now_ms=T0 + 10 * DAY)
    assert res.vector and res.weights.w_vec == DEFAULT_W_VEC and res.warnings == []
    by = {h.run_id: h for h in res.hits}
    assert by["r1"].values["vector"] == pytest.approx(1.0, abs=1e-5), "the query is r1's text"
    assert by["r1"].score > by["r2"].score > by["r0"].score, "the vector lifts r1 over the newer r2"
    off = search(store, "Task 1", settings=settings_with(memory_root), now_ms=T0 + 10 * DAY)
    assert not off.vector and off.weights.w_vec == 0
    pinned = search(store, "Task 1", settings=settings_with(memory_root, embed_env(embed_server, CYBERINE_MEMORY_W_VEC="0")))
    assert not pinned.vector and pinned.weights.w_vec == 0, "a variable that sets w_vec wins"


def test_search_over_a_large_index_ranks_as_the_mat_vec_does(memory_root, embed_server, monkeypatch):
    """Above EXACT_MAX_FLOATS only the rows that can still reach the top k get their exact cosine;
    the hits, their scores and their vector values are the mat-vec's (the threshold is lowered
    here so that a small store takes that path)."""
    import cybmem.retrieval.vectors as vectors

    settings = settings_with(memory_root, embed_env(embed_server))
    words = ["login", "cache", "fixture", "report", "parser", "docs", "release", "warning", "plugin", "marker"]
    for i in range(400):  # many more rows than the first stage scores (4k + 64)
        write_run(make_run(f"r{i:03d}", f"Fix the {words[i % 10]} {words[(i * 3) % 7]} bug number {i}",
                           start=T0 + i * 3_600_000), settings_with(memory_root))
    store = MemoryStore(memory_root, "web")
    assert embed_missing(store, settings, progress=False).embedded == 400
    queries = ["login cache", "the fixture report parser", "release warning docs", "nothing in common"]
    paths: dict[float, list[dict]] = {}
    for w_vec in (DEFAULT_W_VEC, 0.5, 2.0):
        weights = Weights(w_vec=w_vec)
        exact = [search(store, q, k=5, weights=weights, settings=settings, now_ms=T0 + 500 * 3_600_000) for q in queries]
        monkeypatch.setattr(vectors, "EXACT_MAX_FLOATS", 0)
        real_axis = vectors.VectorQuery.axis

        def axis(self, *args):
            out = real_axis(self, *args)
            paths.setdefault(w_vec, []).append(self.stats)
            return out

        monkeypatch.setattr(vectors.VectorQuery, "axis", axis)
        bounded = [search(store, q, k=5, weights=weights, settings=settings, now_ms=T0 + 500 * 3_600_000) for q in queries]
        monkeypatch.undo()
        for e, b in zip(exact, bounded):
            assert e.vector and b.vector and not b.warnings
            assert [h.run_id for h in b.hits] == [h.run_id for h in e.hits]
            for he, hb in zip(e.hits, b.hits):
                assert hb.score == pytest.approx(he.score, abs=1e-6)
                assert hb.values["vector"] == pytest.approx(he.values["vector"], abs=1e-6)
    assert all(p["method"] == "binary" and p["rescored"] < 400 for p in paths[DEFAULT_W_VEC]), "a small w_vec: a few rows"
    assert any(p["method"] == "binary" and p["bound"] for p in paths[0.5]), "rows beyond the first stage were in reach"
    assert all(p["method"].startswith("exact") for p in paths[2.0]), "w_vec 2: the bound lets in too many, the mat-vec"


def test_search_falls_back_with_one_warning_when_the_query_cannot_be_embedded(memory_root, embed_server):
    settings = settings_with(memory_root, embed_env(embed_server))
    for i in range(4):
        write_run(make_run(f"r{i}", f"Fix bug {i}", start=T0 + i * DAY), settings)
    store = MemoryStore(memory_root, "web")
    embed_server.stop()
    t = time.monotonic()
    res = search(store, "Fix bug 2", settings=settings, now_ms=T0 + 10 * DAY)
    assert time.monotonic() - t < 1.0, "a stopped server refuses at once; the retries back off briefly"
    assert not res.vector and len(res.warnings) == 1
    assert res.warnings[0].startswith("vector axis skipped, ranked by the other axes: nothing answers at http://127.0.0.1:")
    assert "(connection refused); check that the server at CYBERINE_MEMORY_EMBEDDINGS is up" in res.warnings[0]
    plain = search(store, "Fix bug 2", settings=settings, weights=res.weights, now_ms=T0 + 10 * DAY)
    assert [h.run_id for h in plain.hits] == [h.run_id for h in res.hits]


def test_inject_with_the_embeddings_server_stopped_is_as_quick_and_warns_once(memory_root, embed_server):
    settings = settings_with(memory_root, embed_env(embed_server))
    for i in range(5):
        write_run(make_run(f"r{i}", f"Fix the login form, part {i}", start=T0 + i * DAY), settings)
    embed_server.stop()
    exe = shutil.which("cybmem")
    base = {**os.environ, "CYBERINE_MEMORY_DIR": str(memory_root)}
    args = [exe, "inject", "The login form rejects valid emails", "--cwd", "/home/dev/web"]

    def timed(env):
        best, out = None, None
        for _ in range(2):
            t = time.monotonic()
            p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
            took = time.monotonic() - t
            best = took if best is None else min(best, took)
            out = p
        return best, out

    off_s, off = timed(base)
    on_s, on = timed({**base, **embed_env(embed_server)})
    assert off.returncode == on.returncode == 0
    assert on.stdout == off.stdout, "the same task and preamble, ranked by the other axes"
    assert on.stdout.startswith("MEMORY (prior runs") and on.stdout.endswith("\n\nThe login form rejects valid emails")
    assert off.stderr == "" and on.stderr.count("\n") == 1
    assert on.stderr.startswith("warning: vector axis skipped, ranked by the other axes: ")
    # Generous (a shared machine's load varies), but far below the 2 s query budget being waited for.
    assert on_s < 1.5 * off_s + 0.75, f"inject took {on_s:.2f}s with the server down vs {off_s:.2f}s with embeddings off"


def test_a_model_that_changes_its_dimension_under_the_same_name_is_embedded_again(memory_root, embed_server):
    """The server's model changes its dimension (8 -> 16) under the same name. Before, every new
    vector was skipped with a warning, `cybmem embed` kept adding lines that were skipped too, and
    doctor called it "to fix by hand"; now the new dimension is a new key that search uses at once,
    `cybmem embed` fills it in, and `doctor --repair` keeps one vector per run."""
    from cybmem.operations.doctor import doctor

    settings = settings_with(memory_root, embed_env(embed_server))
    for i in range(4):
        write_run(make_run(f"r{i}", f"Fix the login form, part {i}", start=T0 + i * DAY), settings)
    embed_server.encode = lambda texts: np.repeat(hash_encode(texts), 2, axis=1)  # 16 dimensions now
    res = write_run(make_run("r4", "Fix the login form, part 4", start=T0 + 4 * DAY), settings)
    assert res.embedded and res.warnings == []
    store = MemoryStore(memory_root, "web")

    def text_of(part: int) -> str:  # what a run was embedded with (its task, summary...): a query its vector equals
        return next(t for r in reversed(embed_server.requests) for t in r.body["input"] if t.startswith(f"Fix the login form, part {part}"))

    found = search(store, text_of(4), settings=settings, now_ms=T0 + 5 * DAY)
    assert found.vector and found.warnings == [], "the newest key (16 dimensions) is searched, without a warning"
    assert found.hits[0].run_id == "r4" and found.hits[0].values["vector"] == pytest.approx(1.0, abs=1e-5)
    result = embed_missing(store, settings)
    assert (result.had, result.embedded, result.dims) == (1, 4, 16)
    assert result.warnings == [], "r4's vector already made 16 the newest key: nothing to warn about"
    assert embed_missing(store, settings).embedded == 0
    report = doctor(settings, project="web")
    assert [(f.severity, f.message.split(" (")[0]) for f in report.findings if f.check == "embeddings"] == [
        ("repairable", "4 run(s) have more than one vector of a model")]
    report = doctor(settings, project="web", repair=True)
    assert report.clean, report.lines()
    rows = lines_of(store.embeddings_path)
    assert sorted(r["runId"] for r in rows) == [f"r{i}" for i in range(5)] and {len(r["vector"]) for r in rows} == {16}
    found = search(store, text_of(1), settings=settings, now_ms=T0 + 5 * DAY)
    assert found.vector and found.warnings == []
    assert {h.run_id: h for h in found.hits}["r1"].values["vector"] == pytest.approx(1.0, abs=1e-5), "r1's new vector"


def test_embed_sees_a_changed_dimension_before_any_new_record_has_one(memory_root, embed_server):
    settings = settings_with(memory_root, embed_env(embed_server))
    for i in range(3):
        write_run(make_run(f"r{i}", f"Task {i}", start=T0 + i * DAY), settings)
    store = MemoryStore(memory_root, "web")
    assert embed_missing(store, settings).embedded == 0
    embed_server.encode = lambda texts: np.repeat(hash_encode(texts), 2, axis=1)
    result = embed_missing(store, settings)
    assert (result.had, result.embedded, result.dims) == (0, 3, 16)
    assert result.warnings == ["hash-embed now answers with 16 dimensions, the stored vectors have 8: every record is "
                               "embedded again (`cybmem doctor --repair` then drops the old ones)"]
    assert load_index(load_snapshot(store), "hash-embed").dims == 16


@pytest.mark.parametrize("headers", [False, True], ids=["drip-body", "drip-headers"])
def test_inject_and_write_keep_their_budget_against_a_dripping_server(memory_root, embed_server, tmp_path, headers):
    """A server that sends a byte every 0.2 s held inject for minutes against its 2 s budget
    (httpx's timeout is per read) and write past 60 s; both now end on time, the record written."""
    settings = settings_with(memory_root, embed_env(embed_server))
    for i in range(5):
        write_run(make_run(f"r{i}", f"Fix the login form, part {i}", start=T0 + i * DAY), settings)
    embed_server.delivery = Drip(interval=0.2, headers=headers)  # a ~200-byte reply: 40 s and more
    exe = shutil.which("cybmem")
    base = {**os.environ, "CYBERINE_MEMORY_DIR": str(memory_root)}
    env = {**base, **embed_env(embed_server, CYBERINE_MEMORY_EMBED_TIMEOUT="1", CYBERINE_MEMORY_EMBED_WRITE_TIMEOUT="1.5")}
    args = [exe, "inject", "The login form rejects valid emails", "--cwd", "/home/dev/web"]
    t = time.monotonic()
    off = subprocess.run(args, env=base, capture_output=True, text=True, timeout=120)
    off_s = time.monotonic() - t
    t = time.monotonic()
    on = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    on_s = time.monotonic() - t
    assert on.returncode == 0 and on.stdout == off.stdout, "the task and its block, ranked by the other axes"
    assert on.stderr.count("\n") == 1 and on.stderr.startswith("warning: vector axis skipped, ranked by the other axes: ")
    assert "(time budget used up)" in on.stderr and "CYBERINE_MEMORY_EMBED_TIMEOUT" in on.stderr
    # Generous for a loaded machine (the vectors' first load, the HTTP client's import), far below the 40 s drip.
    assert on_s < off_s + 1.0 + 3.0, f"inject took {on_s:.2f}s (without embeddings {off_s:.2f}s; budget 1 s)"
    run = tmp_path / "run.json"
    run.write_text(json.dumps(make_run("r9", "Fix the login form, part 9", start=T0 + 9 * DAY)))
    t = time.monotonic()
    w = subprocess.run([exe, "write", str(run)], env=env, capture_output=True, text=True, timeout=120)
    w_s = time.monotonic() - t
    assert w.returncode == 0 and w.stdout.startswith("Wrote r9 (done)")
    assert w.stderr.startswith("warning: embedding not written: ") and "no complete reply within 1.5 s" in w.stderr
    assert w_s < off_s + 1.5 + 4.0, f"write took {w_s:.2f}s against a 1.5 s embedding budget"
    assert (memory_root / "web" / "records" / "r9.json").exists()


@pytest.mark.model
def test_a_paraphrase_finds_its_run_only_with_embeddings(memory_root, minilm_server):
    settings = settings_with(memory_root, embed_env(minilm_server))
    tasks = [
        "Fix the flaky login test in CI",
        "Add dark mode to the settings page",
        "Reduce the memory footprint of the image thumbnail service",  # the target: fourth newest
        "Document the deploy pipeline for new contributors",
        "Speed up the database migrations",
        "Upgrade the payment provider SDK",
    ]
    for i, task in enumerate(tasks):
        res = write_run(make_run(f"r{i}", task, start=T0 + i * DAY, output="Done."), settings)
        assert res.embedded and not res.warnings
    store = MemoryStore(memory_root, "web")
    query = "the picture preview backend eats too much RAM"
    snap = load_snapshot(store)
    from cybmem.store.tokens import tokenize

    assert not snap.index.scores(tokenize(query)).any(), "the query shares no keyword with any run"
    now = T0 + 7 * DAY
    on = search(store, query, k=3, settings=settings, now_ms=now)
    off = search(store, query, k=3, settings=settings_with(memory_root, {"CYBERINE_MEMORY_RANKER": "linear"}), now_ms=now)  # the formula: recency and lineage alone
    assert on.vector and not on.warnings
    assert on.weights.w_vec == DEFAULT_W_VEC
    assert "r2" in [h.run_id for h in on.hits], [(h.run_id, h.contributions) for h in on.hits]
    assert "r2" not in [h.run_id for h in off.hits], "by recency and lineage alone the three newest rank first"
    assert minilm_server.requests[-1].body["model"] == MINILM_NAME


def test_weights_without_vectors_keep_w_vec_zero(settings):
    assert Weights().w_vec == 0
    loaded = weights_for(settings, None)
    assert loaded.weights.w_vec == 0 and loaded.sources["w_vec"] == "default"


def test_an_unreadable_embeddings_file_only_turns_the_axis_off(memory_root, embed_server, tmp_path):
    settings = settings_with(memory_root, embed_env(embed_server))
    for i in range(3):
        write_run(make_run(f"r{i}", f"Task {i}", start=T0 + i * DAY), settings)
    store = MemoryStore(memory_root, "web")
    target = tmp_path / "elsewhere.jsonl"
    store.embeddings_path.rename(target)
    store.embeddings_path.symlink_to(target)  # readers never follow a link out of the memory root
    res = search(store, "Task 1", settings=settings, now_ms=T0 + 10 * DAY)
    assert [h.run_id for h in res.hits] and not res.vector
    assert len(res.warnings) == 1 and res.warnings[0].startswith("vector axis off: ") and "symbolic link" in res.warnings[0]


def test_tune_embeds_the_query_texts_through_the_server(memory_root, embed_server):
    """`tune` on a store with vectors asks the embeddings server for each judgment's query text
    (never reuses the query run's stored vector) and searches w_vec."""
    from cybmem.retrieval import tuning as T
    from cybmem.retrieval.judgments import Judgment
    from cybmem.retrieval.weights import Weights

    settings = settings_with(memory_root, embed_env(embed_server))
    for i, task in enumerate(["Fix the login form", "Speed up the CI cache", "Add dark mode", "Login form again"]):
        write_run(make_run(f"t{i}", task, start=1_761_955_200_000 + i * DAY), settings)
    seen = len(embed_server.requests)
    js = [Judgment(query=f"login form problem {i}", as_of=1_761_955_200_000 + 4 * DAY, relevant=("t0",)) for i in range(3)]
    res = T.tune(MemoryStore(memory_root, "web"), judgments=js, settings=settings, progress=False, current=Weights(),
                 hold_few=False)
    asked = [t for r in embed_server.requests[seen:] for t in r.body["input"]]
    assert sorted(asked) == sorted(j.query for j in js)
    assert res.vector_note == "" and len(res.axes["w_vec"]) > 1
