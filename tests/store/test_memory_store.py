import json
import os
import stat

import pytest

from cybmem.errors import AmbiguousError, ConflictError, NotFoundError, ValidationError
from cybmem.explore.lineage import chain
from cybmem.store.records import IssueEvent, Lineage, MemoryRecord, Outcome
from cybmem.store.ledger import fold as fold_issues
from cybmem.store.memory_store import MemoryStore

from conftest import T0


def rec(run_id, ended=T0, *, previous=None, parent=None, chat=None, issues=(), **kw):
    return MemoryRecord(
        runId=run_id, cwd="/home/dev/web", workflowName="implement-task", task=kw.pop("task", f"task of {run_id}"),
        state=kw.pop("state", "done"), startedAt=ended - 1000, endedAt=ended,
        lineage=Lineage(previousRunId=previous, parentRunId=parent, chatSessionId=chat),
        outcome=Outcome(summary=f"summary {run_id}", issues=list(issues)), **kw,
    )


@pytest.fixture
def store(memory_root):
    return MemoryStore(memory_root, "web")


def test_write_then_read_round_trips_and_files_are_private(store):
    path = store.write_record(rec("r1"))
    assert store.read_record("r1") == rec("r1")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.records_dir.stat().st_mode) == 0o700
    assert not [n for n in os.listdir(store.records_dir) if n.startswith(".tmp-")]


def test_existing_run_id_is_never_overwritten(store):
    store.write_record(rec("r1", task="original"))
    with pytest.raises(ConflictError, match="append-only"):
        store.write_record(rec("r1", task="changed"))
    assert store.read_record("r1").task == "original"


def test_prefix_resolution(store):
    for rid in ("3f2a-1", "3f2c-1", "9abc"):
        store.write_record(rec(rid))
    assert store.resolve_run_id("9") == "9abc"
    assert store.resolve_run_id("3f2a-1") == "3f2a-1"
    with pytest.raises(AmbiguousError) as err:
        store.resolve_run_id("3f2")
    assert "3f2a-1" in str(err.value) and "3f2c-1" in str(err.value)
    with pytest.raises(NotFoundError, match="no record matches 'zz'"):
        store.resolve_run_id("zz")


def test_duplicate_open_issue_is_not_reopened(store):
    ev = lambda e, at, by: IssueEvent(issueId="flaky-login", at=at, event=e, byRunId=by, title="Flaky login")  # noqa: E731
    assert len(store.append_issue_events([ev("opened", 1, "r1")])) == 1
    assert store.append_issue_events([ev("opened", 2, "r2")]) == []
    assert len(store.append_issue_events([ev("resolved", 3, "r3")])) == 1
    written = store.append_issue_events([ev("opened", 4, "r4")])
    assert [e.event for e in written] == ["reopened"], "opening a resolved issue again is a reopen"
    lines = store.issues_path.read_text().splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["opened", "resolved", "reopened"]
    state = store.issue_states()["flaky-login"]
    assert (state.state, state.reopenCount, state.openedBy) == ("reopened", 1, "r1")
    assert [s.issueId for s in store.open_issues()] == ["flaky-login"]


def test_fold_last_event_wins():
    events = [
        IssueEvent("a", 1, "opened", "r1", "A"), IssueEvent("b", 2, "opened", "r1", "B"),
        IssueEvent("a", 3, "resolved", "r2"), IssueEvent("b", 4, "wontfix", "r3"), IssueEvent("b", 5, "reopened", "r4"),
    ]
    folded = fold_issues(events)
    assert folded["a"].state == "resolved" and folded["a"].resolvedBy == "r2" and folded["a"].title == "A"
    assert folded["b"].state == "reopened" and folded["b"].resolvedAt is None and folded["b"].reopenCount == 1


def test_torn_last_ledger_line_is_skipped_and_reported(store):
    store.append_issue_events([IssueEvent("a", 1, "opened", "r1", "A")])
    with open(store.issues_path, "ab") as fh:
        fh.write(b'{"issueId": "b", "at": 2, "ev')
    assert [e.issueId for e in store.issue_events()] == ["a"]
    assert len(store.problems) == 1 and "issues.jsonl:2" in store.problems[0].path
    # the next append starts on a fresh line; nothing is glued to the torn one
    store.append_issue_events([IssueEvent("c", 3, "opened", "r2", "C")])
    assert [e.issueId for e in store.issue_events()] == ["a", "c"]


def test_rebuild_equals_incremental_index(store):
    store.write_record(rec("r1", T0))
    store.write_record(rec("r3", T0 + 3000, previous="r1"))
    store.write_record(rec("r2", T0 + 2000, previous="r1"))  # arrives late
    store.supersede("r1", rec("r1b", T0 + 4000))
    incremental = store.index_path.read_bytes()
    entries = json.loads(incremental)["entries"]
    assert [e["runId"] for e in entries] == ["r1b", "r3", "r2", "r1"]
    assert entries[3]["supersededBy"] == "r1b"
    store.index_path.unlink()
    assert store.latest_run_id() == "r1b", "readers work without index.json"
    assert store.rebuild_index() == 4
    assert store.index_path.read_bytes() == incremental


def test_supersede_keeps_old_content_and_show_follows(store):
    store.write_record(rec("r1", task="wrong summary run"))
    old_bytes = store.record_path("r1").read_bytes()
    old_inode = store.record_path("r1").stat().st_ino
    store.supersede("r1", rec("r1-fix", T0 + 10))
    # The one change ever made to a record: supersededBy added by atomic replace, every other byte kept.
    new_bytes = store.record_path("r1").read_bytes()
    assert new_bytes == old_bytes.rstrip()[:-1].rstrip() + b',\n  "supersededBy": "r1-fix"\n}\n'
    assert store.record_path("r1").stat().st_ino != old_inode, "replaced by rename, never edited in place"
    assert store.read_record("r1").supersededBy == "r1-fix"
    assert store.read_record("r1-fix").supersedes == "r1"
    assert store.supersession_chain("r1") == ["r1-fix"]
    assert store.newest_truth("r1") == "r1-fix"
    with pytest.raises(ConflictError, match="already superseded by r1-fix"):
        store.supersede("r1", rec("r1-fix2", T0 + 20))
    store.supersede("r1-fix", rec("r1-fix2", T0 + 20))
    assert store.supersession_chain("r1") == ["r1-fix", "r1-fix2"]


def test_superseded_by_written_by_another_tool_is_honoured(store):
    store.write_record(rec("new", T0 + 5))
    store.write_record(rec("old", T0, supersededBy="new"))
    assert store.supersession_chain("old") == ["new"]
    assert [e["runId"] for e in store.index_entries() if e.get("supersededBy")] == ["old"]


def test_chain_both_directions_with_parent_and_chat(store):
    store.write_record(rec("a", T0))
    store.write_record(rec("b", T0 + 1000, previous="a", chat="chat-1"))
    store.write_record(rec("c", T0 + 2000, previous="b", parent="b", chat="chat-1", issues=["x"]))
    store.write_record(rec("d", T0 + 3000, previous="c"))
    store.append_issue_events([IssueEvent("x", T0 + 2000, "opened", "c", "X")])
    res = chain(store, "b")
    assert res.previous == ["a"] and res.next == ["c", "d"]
    assert [r["runId"] for r in res.runs] == ["a", "b", "c", "d"]
    assert res.children == ["c"] and res.chat_runs == ["b", "c"]
    res_c = chain(store, "c")
    assert res_c.parent == "b" and res_c.parent_known and res_c.open_issues == ["x"]


def test_chain_walks_the_cached_columns_and_follows_a_link_edited_in_place(store):
    """chain walks the snapshot (its cache), not index.json; a record of the chain edited in place
    after it was cached (same inode: a hand edit) is read again, and the walk follows its new link."""
    import time as _time

    from cybmem.store.snapshot import load_snapshot

    for i, rid in enumerate("abcd"):
        store.write_record(rec(rid, T0 + i * 1000, previous="abcd"[i - 1] if i else None))
    store.index_path.unlink()  # not needed: the walk reads the snapshot
    assert chain(store, "d").previous == ["a", "b", "c"]
    assert load_snapshot(store).from_cache
    _time.sleep(2.1)  # past the cache's racy window, so that only a real edit makes a row stale
    path = store.record_path("c")
    data = json.loads(path.read_text())
    data["lineage"]["previousRunId"] = "a"  # c now follows a directly
    ino = path.stat().st_ino
    with open(path, "r+") as fh:
        fh.write(json.dumps(data, indent=2))
        fh.truncate()
    assert path.stat().st_ino == ino
    res = chain(store, "d")
    assert res.previous == ["a", "c"] and chain(store, "b").next == []


def test_unreadable_records_are_skipped_once(store):
    store.write_record(rec("good"))
    store.records_dir.joinpath("bad.json").write_bytes(b"\x00\xff garbage")
    store.records_dir.joinpath("mismatch.json").write_text(json.dumps(rec("other").to_dict()))
    store.records_dir.joinpath(".tmp-abc.part").write_text("{")
    assert [r.runId for r in store.records()] == ["good"]
    assert sorted(p.path.rsplit("/", 1)[1] for p in store.problems) == ["bad.json", "mismatch.json"]
    assert any("does not match its file name" in p.message for p in store.problems)
    list(store.iter_records())
    assert len(store.problems) == 2, "each problem is reported once"


def test_invalid_record_is_rejected_before_writing(store):
    bad = rec("r1")
    bad.state = "finished"
    with pytest.raises(ValidationError, match="state"):
        store.write_record(bad)
    assert not store.records_dir.exists() or not os.listdir(store.records_dir)


def test_no_module_reaches_into_a_snapshots_state():
    """A project's read state is the Snapshot's typed fields and methods: no other module reads
    or writes its private attributes (issue 19: vectors.py wrote its indexes into
    ``snap._cache`` from outside)."""
    import ast
    import dataclasses
    from pathlib import Path

    import cybmem
    from cybmem.store.snapshot import Snapshot

    private = {n for n in vars(Snapshot) if n.startswith("_") and not n.startswith("__")}
    private |= {f.name for f in dataclasses.fields(Snapshot) if f.name.startswith("_")} | {"_cache"}
    pkg = Path(cybmem.__file__).parent
    reached = []
    for path in sorted(pkg.rglob("*.py")):
        if path.name == "snapshot.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in private and not (
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                reached.append(f"{path.relative_to(pkg)}:{node.lineno}: .{node.attr}")
    assert not reached, reached


def test_the_first_write_on_a_store_without_index_json_reads_each_record_once(memory_root, settings, monkeypatch):
    """Issue 27: the first write on a large store built index.json inline twice over (the lineage
    lookup, then the index update each read every record). Now once, and the write says so when slow."""
    from conftest import make_run
    from cybmem.operations.write import write_run

    for i in range(300):
        write_run(make_run(f"old-{i:03d}", f"Task {i}", start=T0 + i * 60_000), settings)
    (memory_root / "web" / "index.json").unlink()
    reads: list[str] = []
    real = MemoryStore.read_record_st

    def counted(self, run_id, *args, **kwargs):
        reads.append(run_id)
        return real(self, run_id, *args, **kwargs)

    monkeypatch.setattr(MemoryStore, "read_record_st", counted)
    write_run(make_run("new-1", "Fix the login form", start=T0 + 400 * 60_000), settings)
    old = [r for r in reads if r.startswith("old-")]
    assert len(old) == len(set(old)) == 300, "each existing record read once"
    monkeypatch.undo()
    index = json.loads((memory_root / "web" / "index.json").read_text())
    assert index["count"] + len(index.get("archived", [])) == 301


# --- a racily-clean record, checked once (issue 41, finding 10) -------------------------------

_READS_CHILD = r"""
import json, os, sys, time
from cybmem.retrieval.search import search
from cybmem.settings import Settings
from cybmem.store.loading import holding_snapshots, load_snapshot
from cybmem.store.memory_store import MemoryStore

root, queries, wait = sys.argv[1], sys.argv[2].split(","), float(sys.argv[3])
store = MemoryStore(root, "web")
records = str(store.records_dir) + os.sep
reads = []  # record files opened (os.open raises the "open" audit event too)
sys.addaudithook(lambda event, args: reads.append(args[0]) if event == "open" and str(args[0]).startswith(records) else None)
settings = Settings.from_env({}, memory_dir=root)
out = {"searches": [], "hits": []}
with holding_snapshots():
    snap = load_snapshot(store)
    out["load"] = len(reads)
    time.sleep(wait)
    for query in queries * 2:
        del reads[:]
        hits = search(store, query, k=5, settings=settings).hits
        out["searches"].append(len(reads))
        out["hits"].append([h.run_id for h in hits])
    out["held"] = load_snapshot(store) is snap
print(json.dumps(out))
"""


def _reads(root, wait: float) -> dict:
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _READS_CHILD, str(root), "login form,cart drawer", str(wait)], capture_output=True,
                       text=True, env={"PATH": os.environ["PATH"], "HOME": str(root)}, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _racy_copy(fixture_copy):
    """The fixtures as a store restored without its times (``cp -r``, a backup): every record
    written a moment before the first load caches it (the cache is used: no .nocache)."""
    (fixture_copy / ".nocache").unlink()
    for path in (fixture_copy / "web" / "records").iterdir():
        os.utime(path)
    return fixture_copy


def test_a_racily_clean_record_checked_once_is_not_read_again(fixture_copy):
    """Every record of a store restored without its times is cached within the racy window of its
    write, so each query that showed one read its file again and compared it, for as long as the
    cache segment stayed (the files were never found to differ: nothing recorded that they had
    been checked). Now a check that begins past the file's clock tick settles it: the held
    snapshot does not read it again, nor does the next process (the cache keeps the check; what
    the held snapshot settled within a second of its last write, the second query's hits, goes
    to the cache when it is let go)."""
    root = _racy_copy(fixture_copy)
    first = _reads(root, wait=2.1)  # past the files' clock tick (cybmem.store.cache.RACY_NS)
    assert first["held"] and first["load"] > 40, first
    assert first["searches"][0] > 0 and first["searches"][1] > 0 and first["searches"][2:] == [0, 0], first["searches"]
    second = _reads(root, wait=0)
    assert second["searches"] == [0, 0, 0, 0], second["searches"]
    assert first["hits"] == second["hits"] and first["hits"][:2] == first["hits"][2:]


def _edit_in_place(path, old: str, new: str, mtime_ns: int | None = None) -> None:
    """A hand edit (same inode), its mtime set where a coarse clock could have stamped it."""
    ino = path.stat().st_ino
    text = path.read_text()
    assert old in text
    with open(path, "r+") as fh:
        fh.write(text.replace(old, new))
        fh.truncate()
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))
    assert path.stat().st_ino == ino


def _row(snap, run_id: str) -> int:
    return snap.records.column("runId").to_pylist().index(run_id)


def _checked_rows(store) -> set[int]:
    from cybmem.store import cache as cache_module

    cache = cache_module.cache_dir(store.dir)
    manifest = cache_module.Manifest.read(cache)
    return set(cache_module.read_checked(cache / manifest.checked if manifest.checked else None)[0].tolist())


def test_an_edit_in_the_clock_tick_of_a_check_is_found_and_a_settled_file_edited_later_too(store):
    """A check settles a file only when it began past the file's clock tick: an edit stamped with
    the same tick as the checked content (a 1 s or 2 s clock) is found, and so is an edit made
    after a settle that a coarse clock stamps up to a tick before the check."""
    import time

    from cybmem.store import cache as cache_module
    from cybmem.store.loading import load_snapshot, verified

    for i in range(3):
        store.write_record(rec(f"r{i}", T0 + i))
    snap = load_snapshot(store)  # the files a moment old: every row racy
    r1 = store.record_path("r1")
    m = r1.stat().st_mtime_ns
    assert snap.stale_rows([_row(snap, "r1")]) == []  # equal, but checked within its tick: nothing settled
    _edit_in_place(r1, "task of r1", "task of r1, edited", mtime_ns=m)  # the same tick as the content checked
    assert snap.stale_rows([_row(snap, "r1")]) == [_row(snap, "r1")]
    fresh = load_snapshot(store)
    assert fresh.stale_rows([_row(fresh, "r1")]) == [_row(fresh, "r1")]
    assert verified(fresh, [_row(fresh, "r1")]).records.column("task")[_row(fresh, "r1")].as_py() == "task of r1, edited"

    time.sleep(cache_module.RACY_NS / 1e9 + 0.1)  # past the files' tick: a check now settles them
    look = load_snapshot(store)
    rows = [_row(look, "r0"), _row(look, "r2")]
    assert look.stale_rows(rows, settle=False) == [] and not _checked_rows(store), "doctor's look writes nothing"
    snap = load_snapshot(store)
    before = time.time_ns()
    assert snap.stale_rows(rows) == []
    assert time.time_ns() - before < 400_000_000
    assert _checked_rows(store) == set(rows), "kept for the next process"
    # Edited after the settle, stamped half a tick before the check began: still found, by the
    # snapshot that settled it and by a load that reads the settle from the cache.
    _edit_in_place(store.record_path("r2"), "task of r2", "task of r2, edited", mtime_ns=before - 1_500_000_000)
    assert snap.stale_rows(rows) == [rows[1]]
    fresh = load_snapshot(store)
    assert fresh.stale_rows([_row(fresh, "r0"), _row(fresh, "r2")]) == [_row(fresh, "r2")]
    _edit_in_place(store.record_path("r0"), "task of r0", "task of r0, edited")  # now: the plain case
    assert snap.stale_rows([rows[0]]) == [rows[0]]


@pytest.mark.parametrize("rewrite", ["patched", "compacted"])
def test_a_record_edited_before_its_segment_is_rewritten_is_still_found(store, monkeypatch, rewrite):
    """When a refresh rewrites a segment (a record of it replaced by rename: its row patched; or
    the segments compacted into one), its rows were still read when the segment was first
    written. A row's read moment was taken from its segment file's mtime, so a record edited in
    place between the first read and the rewrite counted as read after the edit: never read
    again, its old text served for good. Now a segment keeps the moment its files were read."""
    import time

    from cybmem.store import cache as cache_module
    from cybmem.store.loading import load_snapshot, verified

    monkeypatch.setattr(cache_module, "RACY_NS", 300_000_000)  # the same rule, a shorter tick
    for i in range(3):
        store.write_record(rec(f"r{i}", T0 + i))
    assert load_snapshot(store).n == 3
    time.sleep(0.4)
    _edit_in_place(store.record_path("r1"), "task of r1", "task of r1, edited")
    time.sleep(0.4)
    if rewrite == "patched":  # r2 replaced by rename (as a correction adds supersededBy), same text
        path = store.record_path("r2")
        raw, ino = path.read_bytes(), path.stat().st_ino
        tmp = path.with_name(".tmp-r2.part")
        tmp.write_bytes(raw)
        os.replace(tmp, path)
        assert path.stat().st_ino != ino
        snap = load_snapshot(store)
    else:
        for i in range(cache_module.MAX_SEGMENTS):
            store.write_record(rec(f"n{i}", T0 + 10 + i))
            snap = load_snapshot(store)
        assert len(snap.manifest.segments) == 1 and snap.n == 3 + cache_module.MAX_SEGMENTS
        # The rows read after the first segment keep their own moments (not checked again for it).
        assert _checked_rows(store) == {_row(snap, f"n{i}") for i in range(cache_module.MAX_SEGMENTS)}
    row = _row(snap, "r1")
    assert snap.records.column("task")[row].as_py() == "task of r1"
    assert snap.stale_rows([row]) == [row]
    assert verified(snap, [row]).records.column("task")[row].as_py() == "task of r1, edited"


def test_a_snapshot_does_not_settle_rows_the_cache_has_since_read_again(store, monkeypatch):
    """A held snapshot's check is kept in the cache only while the cache holds the rows it
    checked: a record edited in place, read again by another load (its row patched), then edited
    back to what the held snapshot holds is equal for that snapshot, not for the cache."""
    import time

    from cybmem.store import cache as cache_module
    from cybmem.store.loading import load_snapshot

    monkeypatch.setattr(cache_module, "RACY_NS", 300_000_000)
    for i in range(2):
        store.write_record(rec(f"r{i}", T0 + i))
    held = load_snapshot(store)
    time.sleep(0.4)
    path = store.record_path("r1")
    original = path.read_text()
    _edit_in_place(path, "task of r1", "task of r1, edited")
    patched = load_snapshot(store, recheck=["r1"])
    assert patched.records.column("task")[_row(patched, "r1")].as_py() == "task of r1, edited"
    time.sleep(0.4)
    _edit_in_place(path, "task of r1, edited", "task of r1")
    assert path.read_text() == original
    time.sleep(0.4)
    assert held.stale_rows([_row(held, "r1")]) == []  # the held snapshot's text is the file's again
    fresh = load_snapshot(store)
    assert fresh.records.column("task")[_row(fresh, "r1")].as_py() == "task of r1, edited"
    assert fresh.stale_rows([_row(fresh, "r1")]) == [_row(fresh, "r1")]


def test_a_settle_is_not_written_through_a_symlinked_cache(store, monkeypatch, tmp_path):
    """The cache's one path guard holds for the settle too: a .cache/ swapped for a link after the
    load (to a copy of it outside the memory root) gets no file written through it."""
    import shutil
    import time

    from cybmem.store import cache as cache_module
    from cybmem.store.loading import load_snapshot

    monkeypatch.setattr(cache_module, "RACY_NS", 300_000_000)
    for i in range(3):
        store.write_record(rec(f"r{i}", T0 + i))
    snap = load_snapshot(store)
    cache = cache_module.cache_dir(store.dir)
    outside = tmp_path / "elsewhere"
    shutil.move(cache, outside)
    cache.symlink_to(outside)
    before = sorted(p.name for p in outside.iterdir())
    time.sleep(0.4)
    assert snap.stale_rows(range(snap.n)) == []  # equal, and past the tick: settled in memory
    snap.keep_settled()
    assert sorted(p.name for p in outside.iterdir()) == before and not any(outside.glob("chk-*"))
