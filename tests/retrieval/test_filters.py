"""Filters and paging: one record filter (list, search, chain), the issue filter and its window."""

import numpy as np
import pandas as pd
import pytest

from cybmem.settings import Settings
from cybmem.errors import ValidationError
from cybmem.retrieval.filters import IssueFilter, RecordFilter, list_records, record_mask, select_events, select_issues
from cybmem.explore.frames import records_frame
from cybmem.store.ledger import fold
from cybmem.explore.lineage import chain
from cybmem.store.records import IssueEvent
from cybmem.retrieval.search import search
from cybmem.store.snapshot import load_snapshot
from cybmem.store.memory_store import MemoryStore

DAY = 86_400_000


@pytest.fixture
def web(fixture_copy):
    store = MemoryStore(fixture_copy, "web")
    snap = load_snapshot(store)
    return store, snap, records_frame(snap)


def _ms(ts) -> int:
    return int(pd.Timestamp(ts).timestamp() * 1000)


def _kept(snap, f) -> set[str]:
    ids = np.array(snap.records.column("runId").to_pylist(), dtype=object)
    return set(ids[record_mask(snap, f)])


def test_an_empty_filter_keeps_everything(web):
    _, snap, df = web
    f = RecordFilter()
    assert not f.active and f.describe() == ""
    assert record_mask(snap, f).all() and len(record_mask(snap, f)) == len(df)


def test_each_condition_agrees_with_pandas(web):
    """Every condition, checked against the same question asked of the records frame."""
    store, snap, df = web
    since, until = _ms("2026-10-05"), _ms("2026-10-12")
    ended = df["endedAt"].map(lambda t: int(t.timestamp() * 1000))
    cases = {
        RecordFilter(since=since): df[ended >= since],
        RecordFilter(until=until): df[ended <= until],
        RecordFilter(since=since, until=until): df[(ended >= since) & (ended <= until)],
        RecordFilter.make(state="error,cancelled"): df[df["state"].isin(["error", "cancelled"])],
        RecordFilter(grep="CART drawer"): df[df["task"].str.contains("cart drawer", case=False)
                                             | df["summary"].fillna("").str.contains("cart drawer", case=False)],
        RecordFilter(agent="impl-2"): df[df["workerAgents"].map(lambda a: "impl-2" in list(a))],
        RecordFilter(agent="impl"): df.iloc[0:0],  # agent ids match whole, not as prefixes
    }
    for f, expected in cases.items():
        assert f.active
        assert _kept(snap, f) == set(expected["runId"]), f
        assert 0 < len(expected) < len(df) or f.agent == "impl"


def test_grep_reads_the_whole_summary_not_only_the_task(web):
    _, snap, df = web
    only_in_summary = _kept(snap, RecordFilter(grep="transitionend"))
    assert only_in_summary == set(df.loc[df["summary"].str.contains("transitionend"), "runId"]) and only_in_summary
    assert not any("transitionend" in t for t in df.loc[df["runId"].isin(only_in_summary), "task"])


def test_issue_keeps_the_runs_that_raised_or_moved_it(web):
    store, snap, df = web
    opened_by = set(df.loc[df["issues"].map(lambda i: "flaky-cart-drawer-e2e-test" in list(i)), "runId"])
    movers = {e.byRunId for e in store.issue_events() if e.issueId == "flaky-cart-drawer-e2e-test"}
    kept = _kept(snap, RecordFilter(issue="flaky-cart-drawer-e2e-test"))
    assert kept == opened_by | movers
    assert len(kept) >= 2, "the run that opened it and the run that resolved it"
    assert _kept(snap, RecordFilter(issue="no-such-issue")) == set()


def test_conditions_combine(web):
    _, snap, df = web
    both = _kept(snap, RecordFilter.make(state="done", grep="cart"))
    assert both == _kept(snap, RecordFilter.make(state="done")) & _kept(snap, RecordFilter(grep="cart"))


def test_unknown_state_is_named():
    with pytest.raises(ValidationError, match="'finished' is not one of done, error, cancelled"):
        RecordFilter.make(state="done,finished")


def test_list_records_pages_newest_first(web):
    _, snap, df = web
    newest = df.sort_values(["endedAt", "runId"], ascending=False)["runId"].tolist()
    page = list_records(snap, offset=0, limit=10)
    assert [e["runId"] for e in page.items] == newest[:10] and page.total == len(df) and page.remaining == len(df) - 10
    assert page.footer("records") == f"Showing 1-10 of {len(df)} records; --offset 10 for the next page, --limit 0 for all."
    nxt = list_records(snap, offset=10, limit=10)
    assert [e["runId"] for e in nxt.items] == newest[10:20]
    last = list_records(snap, offset=len(df) - 3, limit=10)
    assert last.shown == 3 and last.remaining == 0 and "next page" not in last.footer("records")
    assert list_records(snap).footer("records") is None, "everything on one page: no footer"
    beyond = list_records(snap, offset=len(df) + 5, limit=10)
    assert beyond.items == [] and beyond.footer("records") == f"No records at offset {len(df) + 5}; {len(df)} in all."


def test_list_records_entries(web):
    _, snap, df = web
    items = list_records(snap, RecordFilter.make(state="error")).items
    assert {e["state"] for e in items} == {"error"} and len(items) == int((df["state"] == "error").sum())
    e = items[0]
    assert isinstance(e["endedAt"], int) and isinstance(e["startedAt"], int) and e["superseded"] is False
    row = df.set_index("runId").loc[e["runId"]]
    assert e["task"] == row["task"] and e["summary"] == row["summary"], "the whole task and summary"


def test_list_records_marks_superseded(web):
    store, snap, df = web
    fixed = set(df.loc[df["superseded"], "runId"])
    assert fixed
    items = list_records(snap).items
    marked = {e["runId"]: e for e in items if e["superseded"]}
    assert set(marked) == fixed and all(e["supersededBy"] for e in marked.values())


def test_search_narrows_candidates_before_ranking(web):
    store, snap, df = web
    f = RecordFilter.make(state="error")
    res = search(snap, "cart drawer test", k=20, filter=f, now_ms=_ms("2026-11-01"), settings=Settings.from_env())
    assert res.hits and {h.state for h in res.hits} == {"error"}
    assert res.candidates == int((df["state"] == "error").sum())
    assert {h.run_id for h in res.hits} == set(df.loc[df["state"] == "error", "runId"]), "k=20: every candidate ranks"
    assert [h.score for h in res.hits] == sorted((h.score for h in res.hits), reverse=True)
    top = search(snap, "cart drawer test", k=1, filter=f, now_ms=_ms("2026-11-01"), settings=Settings.from_env()).hits
    assert top[0].run_id == res.hits[0].run_id, "narrowed before ranking: the top hit is a filtered run, not cut after"
    assert search(snap, "cart", k=5, filter=RecordFilter(grep="no such words"), settings=Settings.from_env()).hits == []


def test_chain_window_and_filters(web):
    store, snap, df = web
    mid = df.sort_values("endedAt")["runId"].iloc[20]
    full = chain(store, mid)
    assert full.length == len(full.runs) and len(full.previous) >= 10
    w = full.window(context=3)
    ids = [e["runId"] for e in w.runs]
    assert len(ids) == 7 and ids[3] == mid and w.previous == ids[:3] and w.next == ids[4:]
    assert w.omitted_before == len(full.previous) - 3 and w.omitted_after == len(full.next) - 3
    assert w.to_dict()["omitted"] == {"before": w.omitted_before, "after": w.omitted_after, "unmatched": 0}
    everything = full.window(context=None)
    assert len(everything.runs) == full.length and everything.omitted_before == everything.omitted_after == 0
    errors = _kept(snap, RecordFilter.make(state="error"))
    fw = full.window(keep=errors, context=None)
    shown = [e["runId"] for e in fw.runs]
    assert mid in shown, "the run itself always shows"
    assert set(shown) - {mid} == errors & {e["runId"] for e in full.runs}
    assert fw.unmatched == full.length - len(shown)
    page = full.window(offset=5, limit=4)
    assert [e["runId"] for e in page.runs] == [e["runId"] for e in full.runs][5:9]
    assert page.omitted_before == 5 and page.omitted_after == full.length - 9


def _state(issue, state, opened, last, **kw):
    from cybmem.store.ledger import IssueState

    return IssueState(issueId=issue, title=kw.pop("title", issue.replace("-", " ")), state=state, openedAt=opened,
                      openedBy="r1", lastAt=last, lastBy="r2",
                      resolvedAt=last if state in ("resolved", "wontfix") else None, **kw)


def test_issue_window_keeps_recently_closed_ones():
    now = 1_800_000_000_000
    states = [
        _state("old-open", "opened", now - 400 * DAY, now - 400 * DAY),
        _state("fresh-fix", "resolved", now - 20 * DAY, now - 10 * DAY),
        _state("old-fix", "resolved", now - 300 * DAY, now - 200 * DAY),
        _state("wont", "wontfix", now - 50 * DAY, now - 89 * DAY),
        _state("back", "reopened", now - 30 * DAY, now - 1 * DAY, detail="Fails on Windows only"),
    ]
    page, hidden = select_issues(states, IssueFilter(window_days=90), now_ms=now)
    assert [s.issueId for s in page.items] == ["back", "old-open", "fresh-fix", "wont"], \
        "open ones first (newest opened first), then closed ones, most recently closed first"
    assert hidden == 1
    page, _ = select_issues(states, IssueFilter(window_days=90), now_ms=now, newest_first=False)
    assert [s.issueId for s in page.items] == ["old-open", "back", "fresh-fix", "wont"], "open ones oldest first"
    page, hidden = select_issues(states, IssueFilter(window_days=0), now_ms=now)
    assert [s.issueId for s in page.items] == ["back", "old-open"] and hidden == 3, "window 0: closed issues drop at once"
    page, hidden = select_issues(states, IssueFilter(), now_ms=now)
    assert page.total == 5 and hidden == 0
    page, _ = select_issues(states, IssueFilter.make(state="closed"), now_ms=now)
    assert {s.issueId for s in page.items} == {"fresh-fix", "old-fix", "wont"}
    page, _ = select_issues(states, IssueFilter.make(state="open", grep="WINDOWS"), now_ms=now)
    assert [s.issueId for s in page.items] == ["back"], "grep reads the detail too"
    page, _ = select_issues(states, IssueFilter(since=now - 15 * DAY), now_ms=now)
    assert {s.issueId for s in page.items} == {"fresh-fix", "back"}, "since: still had an event then"
    page, _ = select_issues(states, IssueFilter(until=now - 250 * DAY), now_ms=now)
    assert {s.issueId for s in page.items} == {"old-open", "old-fix"}, "until: opened by then"
    page, _ = select_issues(states, IssueFilter(), now_ms=now, offset=1, limit=2)
    assert page.shown == 2 and page.total == 5 and page.remaining == 2
    with pytest.raises(ValidationError, match="'shut' is not one of open, closed"):
        IssueFilter.make(state="shut")


def test_select_events_filters_the_ledger():
    evs = [IssueEvent(issueId="a", at=10, event="opened", byRunId="r1", title="Alpha broke"),
           IssueEvent(issueId="a", at=20, event="resolved", byRunId="r2"),
           IssueEvent(issueId="b", at=30, event="opened", byRunId="r3", title="Beta", detail="slow ALPHA path")]
    titles = {k: v.title for k, v in fold(evs).items()}
    assert [e.at for e in select_events(evs, grep="alpha", titles=titles).items] == [10, 20, 30]
    assert [e.at for e in select_events(evs, since=15, until=25).items] == [20]
    assert [e.at for e in select_events(evs, events_named=("opened",)).items] == [10, 30]
    page = select_events(evs, offset=1, limit=1)
    assert [e.at for e in page.items] == [20] and page.total == 3


def test_a_memory_root_with_nocache_gets_no_cache(fixture_copy):
    """The bundled fixtures carry .nocache: reading them (or a copy) leaves no .cache/ behind."""
    from cybmem.store.cache import NO_CACHE_FILE

    assert (fixture_copy / NO_CACHE_FILE).exists(), "copied with the fixtures"
    snap = load_snapshot(MemoryStore(fixture_copy, "web"))
    assert snap.n == 47 and not snap.from_cache
    assert not list(fixture_copy.rglob(".cache"))
    (fixture_copy / NO_CACHE_FILE).unlink()
    load_snapshot(MemoryStore(fixture_copy, "web"))
    assert (fixture_copy / "web" / ".cache").is_dir(), "without it, the cache is written as usual"
