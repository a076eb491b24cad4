"""Frames and the Arrow cache: one loader, incremental refresh, never trusted blindly."""

import json
import os
import shutil

import pandas as pd
import pyarrow as pa
import pytest

from cybmem.store import cache as cache_module
from cybmem.store import arrow_records as columns_module
from cybmem.explore.frames import issue_events_frame, issue_fold, lineage_edges, records_frame
from cybmem.store.snapshot import load_snapshot
from cybmem.operations.write import write_run


def open_states(snap):
    """Open issue ids of a snapshot, oldest opened first (the order of MemoryStore.open_issues)."""
    rows = snap.open_issues().to_pylist()
    return [type("S", (), r) for r in sorted(rows, key=lambda r: (r["openedAt"], r["issueId"]))]
from cybmem.store.memory_store import MemoryStore

from conftest import MIN, T0, make_run

TRAILER = "x\n\nACCOMPLISHED:\n- a\nISSUES:\n- {title}\nNEXT:\n- none\n"


@pytest.fixture(autouse=True)
def _no_racy_window(monkeypatch):
    # Tests write and read within milliseconds; the racy-mtime rule would (correctly)
    # force a directory scan every time. Tests of that rule set it back.
    monkeypatch.setattr(cache_module, "RACY_NS", -1)


@pytest.fixture
def store(settings):
    for i in range(5):
        out = TRAILER.format(title=f"Problem {i}") if i % 2 == 0 else None
        write_run(make_run(f"r{i}", f"task number {i} about logins", start=T0 + i * 60 * MIN, output=out), settings)
    return MemoryStore(settings.memory_dir, "web")


def add(settings, rid, i, **kw):
    return write_run(make_run(rid, f"task {rid}", start=T0 + i * 60 * MIN, **kw), settings)


def test_records_frame_dtypes(store):
    df = records_frame(store)
    assert len(df) == 5 and list(df["runId"]) == [f"r{i}" for i in range(5)]
    assert str(df["endedAt"].dtype) == "datetime64[ms, UTC]"
    assert isinstance(df["issues"].dtype, pd.ArrowDtype) and pa.types.is_list(df["issues"].dtype.pyarrow_dtype)
    assert df.loc[0, "issues"] == ["problem-0"]
    assert df["previousRunId"].tolist()[1:] == [f"r{i}" for i in range(4)]
    assert df["superseded"].dtype == bool and not df["superseded"].any()
    assert (df["durationS"] == 600).all()


def test_cold_then_warm_then_one_new_record(store, settings):
    cold = load_snapshot(store)
    assert (cold.from_cache, cold.parsed, cold.n) == (False, 5, 5)
    warm = load_snapshot(store)
    assert (warm.from_cache, warm.parsed, warm.n) == (True, 0, 5)
    add(settings, "r5", 5)
    fresh = load_snapshot(store)
    assert (fresh.parsed, fresh.n) == (1, 6), "only the new file is parsed"
    assert fresh.records.column("runId").to_pylist()[-1] == "r5"
    assert load_snapshot(store).parsed == 0


def test_index_after_refresh_equals_a_full_build(store, settings):
    load_snapshot(store)
    add(settings, "r5", 5)
    add(settings, "r6", 6)
    inc = load_snapshot(store)
    full = load_snapshot(store, use_cache=False)
    for q in (["logins"], ["task", "r6"], ["number", "3"]):
        assert inc.index.scores(q).tolist() == pytest.approx(full.index.scores(q).tolist(), abs=1e-5)


def test_removed_record_is_detected(store):
    load_snapshot(store)
    os.unlink(store.records_dir / "r2.json")
    snap = load_snapshot(store)
    assert "r2" not in snap.records.column("runId").to_pylist() and snap.n == 4


def test_replaced_record_is_detected(store):
    load_snapshot(store)
    path = store.records_dir / "r1.json"
    data = json.loads(path.read_text())
    data["task"] = "rewritten by another tool"
    tmp = store.records_dir / ".tmp-x.part"
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)  # a new inode under the same name
    snap = load_snapshot(store)
    row = snap.records.column("runId").to_pylist().index("r1")
    assert snap.records.column("task")[row].as_py() == "rewritten by another tool"


def test_superseding_record_masks_the_old_one(store, settings):
    load_snapshot(store)
    write_run(make_run("r1-fix", "corrected", start=T0 + 10 * 60 * MIN), settings, supersedes="r1")
    snap = load_snapshot(store)
    ids = snap.records.column("runId").to_pylist()
    assert snap.superseded_mask()[ids.index("r1")] and not snap.superseded_mask()[ids.index("r1-fix")]


def test_grown_ledger_is_read_from_its_offset(store, settings):
    snap = load_snapshot(store)
    assert [s.issueId for s in open_states(snap)] == ["problem-0", "problem-2", "problem-4"]
    with store.issues_path.open("ab") as fh:
        fh.write(b'{"issueId": "problem-0", "at": 1761999999000, "event": "resolved", "byRunId": "r4"}\n')
    snap = load_snapshot(store)
    assert [s.issueId for s in open_states(snap)] == ["problem-2", "problem-4"]
    assert snap.events.column("line").to_pylist() == [1, 2, 3, 4]


def test_torn_ledger_tail_is_skipped_then_picked_up(store):
    load_snapshot(store)
    line = b'{"issueId": "late", "at": 1761999999000, "event": "opened", "byRunId": "r4", "title": "Late"}\n'
    with store.issues_path.open("ab") as fh:
        fh.write(line[:30])
    snap = load_snapshot(store)
    assert "late" not in snap.events.column("issueId").to_pylist()
    assert any("torn last line" in p.message for p in snap.problems)
    with store.issues_path.open("ab") as fh:
        fh.write(line[30:])
    snap = load_snapshot(store)
    assert "late" in snap.events.column("issueId").to_pylist()
    assert not any("torn" in p.message for p in snap.problems)


def test_unreadable_records_reported_once_and_not_reparsed(store):
    (store.records_dir / "broken.json").write_bytes(b"{\"runId\": ")
    snap = load_snapshot(store)
    assert snap.n == 5 and [p.message.split(":")[0] for p in snap.problems] == ["broken.json"]
    again = load_snapshot(store)
    assert again.parsed == 0 and len(again.problems) == 1


def test_deleting_or_corrupting_the_cache_only_costs_time(store):
    first = load_snapshot(store)
    shutil.rmtree(store.dir / ".cache")
    assert load_snapshot(store).records.equals(first.records)
    (store.dir / ".cache" / "manifest.json").write_text("{garbage")
    snap = load_snapshot(store)
    assert snap.parsed == 5 and snap.records.equals(first.records)
    for seg in (store.dir / ".cache").glob("rec-*.arrow"):
        seg.write_bytes(b"not arrow")
    assert load_snapshot(store).n == 5


@pytest.mark.parametrize("source, target", [("events.arrow", "rec"), ("kwi.arrow", "kw"), ("fold.arrow", "events.arrow")])
def test_a_cache_file_that_is_arrow_but_not_what_the_manifest_lists_is_rebuilt(store, source, target):
    """Another cache file copied over a segment (or a restore from another copy) is readable Arrow:
    it used to be taken, and every read of the project failed the same way until a rebuild."""
    first = load_snapshot(store)
    want = (first.records.to_pylist(), first.index.scores(["task"]).tolist())
    cache = store.dir / ".cache"
    manifest = json.loads((cache / "manifest.json").read_text())
    shutil.copyfile(cache / source, cache / "copy")
    os.replace(cache / "copy", cache / (manifest["segments"][0][target] if target in ("rec", "kw") else target))
    snap = load_snapshot(store)
    assert snap.parsed == 5 and snap.records.to_pylist() == want[0]
    assert snap.index.scores(["task"]).tolist() == pytest.approx(want[1])
    assert load_snapshot(store).parsed == 0, "the rebuilt cache is used again"


@pytest.mark.parametrize("source, target", [("events.arrow", "fold.arrow"), ("carry", "act"), ("act", "carry")])
def test_an_issue_file_of_the_cache_that_is_another_table_is_computed_instead(store, source, target):
    """fold.arrow and the issue activity and carriers are read when first asked for; another cache
    file copied over one of them is not taken for it (the fold's columns were missing: every
    inject answered "memory not injected")."""
    first = load_snapshot(store)
    want = (first.fold().to_pylist(), first.activity().to_pylist(), [a.tolist() for a in first.carriers()],
            first.open_issues().column("issueId").to_pylist())
    assert want[3] and want[2][0]
    cache = store.dir / ".cache"
    manifest = json.loads((cache / "manifest.json").read_text())
    name = lambda key: manifest[key] if key in ("act", "carry") else key  # noqa: E731
    shutil.copyfile(cache / name(source), cache / "copy")
    os.replace(cache / "copy", cache / name(target))  # a new file (the old one stays mapped by `first`)
    snap = load_snapshot(store)
    assert snap.parsed == 0, "the warm load reads the issue files only when asked"
    assert (snap.fold().to_pylist(), snap.activity().to_pylist(), [a.tolist() for a in snap.carriers()],
            snap.open_issues().column("issueId").to_pylist()) == want


def test_racy_directory_mtime_is_not_trusted(store, settings, monkeypatch):
    monkeypatch.setattr(cache_module, "RACY_NS", 10**12)
    load_snapshot(store)
    manifest = json.loads((store.dir / ".cache" / "manifest.json").read_text())
    assert manifest["dir_mtime_ns"] is None, "a just-modified dir forces a rescan next time"
    add(settings, "r5", 5)
    assert load_snapshot(store).n == 6


def test_segments_are_compacted(store, settings, monkeypatch):
    monkeypatch.setattr(cache_module, "MAX_SEGMENTS", 3)
    load_snapshot(store)
    for i in range(5, 10):
        add(settings, f"r{i}", i)
        load_snapshot(store)
    manifest = json.loads((store.dir / ".cache" / "manifest.json").read_text())
    assert len(manifest["segments"]) <= 3
    assert len(list((store.dir / ".cache").glob("rec-*.arrow"))) == len(manifest["segments"])
    # Each refresh writes the issue activity and carriers anew; the ones it replaced are gone.
    assert [p.name for p in (store.dir / ".cache").glob("act-*.arrow")] == [manifest["act"]]
    assert [p.name for p in (store.dir / ".cache").glob("car-*.arrow")] == [manifest["carry"]]
    snap = load_snapshot(store)
    full = load_snapshot(store, use_cache=False)
    assert snap.records.column("runId").to_pylist() == full.records.column("runId").to_pylist()
    assert snap.index.scores(["task"]).tolist() == pytest.approx(full.index.scores(["task"]).tolist(), abs=1e-5)


def test_unwritable_cache_falls_back_to_memory(store):
    (store.dir / ".cache").write_text("a file where the cache dir should be")
    snap = load_snapshot(store)
    assert (snap.n, snap.from_cache) == (5, False)
    assert (store.dir / ".cache").read_text().startswith("a file")


def test_issue_fold_matches_the_store_fold(fixture_copy):
    store = MemoryStore(fixture_copy, "web")
    snap = load_snapshot(store)
    fold = issue_fold(issue_events_frame(snap), now=pd.Timestamp("2026-01-01", tz="UTC"))
    expected = store.issue_states()
    assert set(fold["issueId"]) == set(expected)
    for row in fold.itertuples():
        st = expected[row.issueId]
        assert (row.state, row.title, row.reopenCount, row.openedBy) == (st.state, st.title, st.reopenCount, st.openedBy)
        assert int(row.openedAt.timestamp() * 1000) == st.openedAt
    resolved = fold[fold["state"] == "resolved"]
    assert (resolved["timeToResolve"] == resolved["resolvedAt"] - resolved["openedAt"]).all()
    assert resolved["openAge"].isna().all()
    later = issue_fold(snap, now=pd.Timestamp("2027-01-01", tz="UTC"))
    open_ = later[later["state"].isin(["opened", "reopened"])]
    assert len(open_) and (open_["openAge"] == pd.Timestamp("2027-01-01", tz="UTC") - open_["openedAt"]).all()
    assert open_["timeToResolve"].isna().all()
    assert (fold.loc[open_.index, "openAge"] == pd.Timedelta(0)).all(), "measured before they opened: 0, not negative"
    assert [s.issueId for s in open_states(snap)] == [s.issueId for s in store.open_issues()]


def test_issue_fold_never_gives_a_negative_duration(tmp_path):
    """Events out of time order (a resolution stamped before the opening, an opening after now) give 0."""
    from cybmem.store.records import IssueEvent

    store = MemoryStore(tmp_path, "web")
    store.dir.mkdir(parents=True)
    hour = 3_600_000
    t = 1_790_000_000_000
    store.append_issue_events([
        IssueEvent("early-fix", t, "opened", "r1", "Fixed before it was opened"),
        IssueEvent("early-fix", t - 5 * hour, "resolved", "r2"),
        IssueEvent("from-the-future", t + 3 * hour, "opened", "r3", "Opened after now"),
        IssueEvent("plain", t - 2 * hour, "opened", "r4", "Opened two hours before now"),
    ])
    fold = issue_fold(store, now=pd.Timestamp(t, unit="ms", tz="UTC")).set_index("issueId")
    assert fold.loc["early-fix", "timeToResolve"] == pd.Timedelta(0)
    assert fold.loc["from-the-future", "openAge"] == pd.Timedelta(0)
    assert fold.loc["plain", "openAge"] == pd.Timedelta(hours=2)
    assert list(fold.columns[5:7]) == ["openAge", "timeToResolve"], "two durations, each with one meaning"


def test_records_state_is_a_categorical_of_every_state(fixture_copy):
    df = records_frame(MemoryStore(fixture_copy, "api"))
    assert isinstance(df["state"].dtype, pd.CategoricalDtype)
    assert list(df["state"].cat.categories) == ["done", "error", "cancelled"]
    assert set(df["state"].value_counts().index) == {"done", "error", "cancelled"}
    assert (df["state"] == "error").sum() == 2, "compares with plain strings"


def test_natural_key_orders_numbers_by_value():
    from cybmem.explore.frames import natural_key

    ids = pd.Series(["ticket-998", "ticket-10001", None, "ticket-10", "Ticket-9", "ticket-10b2", "ticket-10b10"],
                    dtype="string")
    assert ids.sort_values(key=natural_key).tolist()[:-1] == [
        "Ticket-9", "ticket-10", "ticket-10b2", "ticket-10b10", "ticket-998", "ticket-10001"]
    assert ids.sort_values(key=natural_key).isna().tolist()[-1], "missing last"


def test_lineage_edges_takes_the_store_like_its_siblings(fixture_copy):
    store = MemoryStore(fixture_copy, "web")
    from_store = lineage_edges(store)
    assert from_store.equals(lineage_edges(load_snapshot(store)))
    assert from_store.equals(lineage_edges(records_frame(store))), "a records frame still works (e.g. a subset)"
    part = records_frame(store).tail(10)
    assert set(lineage_edges(part)["dst"]) <= set(part["runId"])


def test_lineage_edges(fixture_copy):
    df = records_frame(MemoryStore(fixture_copy, "web"))
    edges = lineage_edges(df)
    kinds = edges["kind"].value_counts().to_dict()
    assert kinds["previous"] == len(df) - 1
    assert kinds["parent"] >= 10 and kinds["chat"] >= 5 and kinds["superseded"] == 1
    ids = set(df["runId"])
    assert set(edges["src"]) <= ids and set(edges["dst"]) <= ids


def test_bulk_and_per_file_parsing_agree(fixture_copy, monkeypatch):
    store = MemoryStore(fixture_copy, "web")
    recdir = store.records_dir
    (recdir / "garbage.json").write_bytes(b"\xff\xfe not json")
    (recdir / "wrongid.json").write_text((recdir / os.listdir(recdir)[0]).read_text())
    src = json.loads((recdir / sorted(os.listdir(recdir))[1]).read_text())
    (recdir / "floaty.json").write_text(json.dumps(dict(src, runId="floaty", startedAt=float(src["startedAt"]))))
    (recdir / "badstate.json").write_text(json.dumps(dict(src, runId="badstate", state="finished")))
    (recdir / "nullworker.json").write_text(json.dumps(dict(src, runId="nullworker", workers=[{"agentId": None, "state": "done"}])))
    per_file = load_snapshot(store, use_cache=False)
    monkeypatch.setattr(columns_module, "_BULK_MIN", 1)
    bulk = load_snapshot(store, use_cache=False)
    assert bulk.records.equals(per_file.records)
    assert sorted(p.message for p in bulk.problems) == sorted(p.message for p in per_file.problems)
    assert {p.path.rsplit("/", 1)[1] for p in bulk.problems} == {"garbage.json", "wrongid.json", "badstate.json", "nullworker.json"}
    assert "floaty" in bulk.records.column("runId").to_pylist(), "valid but unusual records are kept"
    for q in (["cart"], ["drawer", "flaky"]):
        assert bulk.index.scores(q).tolist() == per_file.index.scores(q).tolist()


def test_bulk_path_sets_aside_garbage_and_keeps_the_rest(fixture_copy, monkeypatch):
    store = MemoryStore(fixture_copy, "web")
    (store.records_dir / "garbage.json").write_bytes(b"\xff\xfe not json")
    calls = []
    real = columns_module._bulk_table
    monkeypatch.setattr(columns_module, "_bulk_table", lambda *a: calls.append(len(a[0])) or real(*a))
    monkeypatch.setattr(columns_module, "_BULK_MIN", 1)
    snap = load_snapshot(store, use_cache=False)
    assert snap.n == 47 and [p.path.rsplit("/", 1)[1] for p in snap.problems] == ["garbage.json"]
    assert calls == [48, 47], "one bulk try with everything, one without the garbage"


def test_cached_open_issue_fold_follows_the_ledger(store):
    from cybmem.store.ledger import open_table

    load_snapshot(store)
    warm = load_snapshot(store)
    assert warm.from_cache and warm.open_issues().equals(open_table(warm.events))
    with store.issues_path.open("ab") as fh:
        fh.write(b'{"issueId": "problem-2", "at": 1761999999000, "event": "resolved", "byRunId": "r4"}\n')
    load_snapshot(store)
    again = load_snapshot(store)
    assert again.open_issues().column("issueId").to_pylist() == ["problem-4", "problem-0"]
