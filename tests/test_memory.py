"""The library handle (cybmem.memory.Memory): the rules every front used to keep for itself live
here once. The dispatch block never fails the dispatcher with ``never_fail``; hook mode's failure
is one line; the default issue view keeps a closed issue for the window; a query ranks the open
issues and is not mixed with a listing; a held handle keeps snapshots between loads; a handle
built from settings reads no environment."""

from __future__ import annotations

import json

import pytest

from cybmem.errors import ValidationError
from cybmem.memory import Memory, NotWritten, not_written
from cybmem.settings import Settings
from cybmem.store.loading import load_snapshot

from conftest import FIXTURES, LEFTOVERS, T0, make_run, write_json

DAY = 86_400_000


@pytest.fixture
def memory(tmp_path):
    import shutil

    root = tmp_path / "memory"
    shutil.copytree(FIXTURES, root, ignore=LEFTOVERS)
    (root / ".nocache").unlink()  # the Arrow cache in play, as on a real root (a held snapshot is a cached one)
    return Memory(Settings.from_env({}, memory_dir=root), project="web")


def test_the_block_never_fails_the_dispatcher_only_when_asked(memory):
    """An unexpected failure (a task that is no text) gives the task back with one warning under
    never_fail, and raises without it; a known one (no such project) is a warning too."""
    given = memory.memory_block(b"Fix the cart drawer", never_fail=True)
    assert given.task == b"Fix the cart drawer" and given.block == "" and given.project == "web"
    assert [w.split(":")[0] for w in given.warnings] == ["memory not injected (unexpected TypeError"]
    with pytest.raises(TypeError):
        memory.memory_block(b"Fix the cart drawer")
    lost = Memory(memory.settings, project="nope").memory_block("Fix it", never_fail=True)
    assert lost.block == "" and lost.warnings[0].startswith("no memory yet for project 'nope'")
    with pytest.raises(Exception, match="no memory yet for project 'nope'"):
        Memory(memory.settings, project="nope").memory_block("Fix it")
    assert memory.memory_block("Fix the flaky cart drawer test", keep=False).block.startswith("MEMORY")


def test_hook_mode_is_one_line_whatever_failed(memory, tmp_path):
    """Hook mode gives back NotWritten (the front warns and exits 0): a library error by its
    message, an unreadable file too, an error of the front's own that it names, anything else as
    unexpected; without hook mode each raises."""
    bad = memory.write(b"{not json", hook=True)
    assert isinstance(bad, NotWritten) and bad.message.startswith("memory record not written: input is not valid JSON")
    with pytest.raises(ValidationError, match="input is not valid JSON"):
        memory.write(b"{not json")
    missing = memory.write(tmp_path / "nope.json", hook=True)
    assert missing.message == f"memory record not written: {tmp_path / 'nope.json'}: no such file"

    class UsageMistake(Exception):
        pass

    assert not_written(UsageMistake("give the run\n  on stdin"), named=(UsageMistake,)).message == \
        "memory record not written: give the run on stdin"
    assert not_written(KeyError("x")).message == "memory record not written: unexpected KeyError: 'x'"
    run = write_json(tmp_path / "run.json", make_run("hook-run", "Fix the login form", start=T0))
    with open(run, "rb") as stream:
        written = memory.write(stream, hook=True)
    assert not isinstance(written, NotWritten) and written.record.runId == "hook-run"


def test_the_default_issue_view_keeps_a_closed_issue_for_the_window(memory):
    """The issue-window rule, once: the default view leaves out issues closed longer ago than
    settings.issue_window_days before the moment asked (and counts them), ``all`` keeps them."""
    every = memory.issues(memory.issue_filter(all=True), limit=0)
    closed = [s for s in every.page.items if not s.is_open]
    latest = max(s.lastAt for s in closed)
    at = latest + (memory.settings.issue_window_days + 1) * DAY
    windowed = memory.issues(as_of=at, limit=0)
    assert windowed.page.items == [s for s in every.page.items if s.is_open] and windowed.hidden == len(closed)
    assert memory.issue_filter().window_days == memory.settings.issue_window_days == 90
    assert memory.issue_filter(all=True).window_days is None


def test_a_query_ranks_the_open_issues_and_mixes_with_no_listing(memory):
    ranked = memory.issues(query="consent banner analytics", limit=0)
    assert [r.state.is_open for r in ranked.page.items] == [True] and ranked.page.total == 1
    for mixed in ({"filter": memory.issue_filter(all=True)}, {"events": True}, {"newest_first": False}):
        with pytest.raises(ValidationError, match="a query ranks the open issues"):
            memory.issues(query="consent banner", **mixed)


def test_a_held_handle_keeps_snapshots_between_loads(memory):
    store = memory.store()
    assert load_snapshot(store) is not load_snapshot(store)
    with Memory(memory.settings, hold=True) as held:
        assert held is not None and load_snapshot(store) is load_snapshot(store)
    assert load_snapshot(store) is not load_snapshot(store), "let go when the handle is left"
    with memory:  # a handle without hold holds nothing
        assert load_snapshot(store) is not load_snapshot(store)


def test_a_handle_reads_the_environment_only_through_from_env(memory, monkeypatch):
    """Memory(settings) uses the settings it was given; Memory.from_env reads the environment."""
    monkeypatch.setenv("CYBERINE_MEMORY_TOPK", "1")
    monkeypatch.setenv("CYBERINE_MEMORY_DIR", str(memory.root))
    assert memory.settings.topk == 8 and len(memory.memory_block("Fix the flaky cart drawer test", keep=False).runs) > 1
    from_env = Memory.from_env(project="web")
    assert from_env.settings.topk == 1 and from_env.root == memory.root
    assert len(from_env.memory_block("Fix the flaky cart drawer test", keep=False).runs) <= 1 + from_env.settings.pointers


def test_the_tuning_says_where_it_would_save(memory):
    """The weights file's place is the library's (Tuning.target): the command line prints it."""
    done = memory.tune(metric="mrr", k=10, progress=False)
    assert done.target == memory.store().dir / "weights.json" and done.saved is None
    assert json.loads(json.dumps(done.to_dict()))["saved"] is None
