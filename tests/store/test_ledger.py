"""The issue fold, one rule in three forms: streaming (store, CLI), Arrow (snapshot, inject) and
pandas (notebooks) agree on every ledger, including hostile ones written by other tools."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cybmem.store import ledger as issues
from cybmem.explore.frames import issue_events_frame, issue_fold
from cybmem.store.records import IssueEvent
from cybmem.store.snapshot import load_snapshot
from cybmem.store.memory_store import MemoryStore

IDS = ["a", "b", "flaky-x", "c.d"]
EVENTS = ["opened", "resolved", "reopened", "wontfix"]

event_dicts = st.fixed_dictionaries(
    {"issueId": st.sampled_from(IDS), "at": st.integers(0, 50), "event": st.sampled_from(EVENTS)},
    optional={
        "byRunId": st.one_of(st.none(), st.just(""), st.sampled_from(["r1", "r2", "r3"])),
        "title": st.one_of(st.none(), st.just(""), st.sampled_from(["Flaky X test", "Title B", "flaky-x"])),
        "detail": st.one_of(st.none(), st.just(""), st.sampled_from(["one in ten", "see CI"])),
    },
)
# Lines another tool may write: unknown events, missing fields, garbage; every reader skips them.
junk_lines = st.sampled_from([
    b'{"issueId": "a", "at": 3, "event": "snoozed"}',
    b'{"issueId": "a", "event": "opened"}',
    b'{"at": 1, "event": "opened"}',
    b"not json",
    b"[1, 2]",
])
lines = st.lists(st.one_of(event_dicts.map(lambda d: json.dumps(d).encode()), junk_lines), max_size=40)


def _as_dict(state: issues.IssueState) -> dict:
    return state.to_dict()


def _arrow_rows(table: pa.Table) -> list[dict]:
    out = []
    for row in table.to_pylist():
        row = dict(row)
        for key in ("openedAt", "lastAt", "resolvedAt"):
            if row[key] is not None:
                row[key] = int(row[key].timestamp() * 1000)
        out.append(row)
    return out


def _pandas_rows(df: pd.DataFrame) -> list[dict]:
    out = []
    for row in df.drop(columns=["openAge", "timeToResolve"]).to_dict("records"):
        row = {k: (None if v is None or v is pd.NA or (isinstance(v, float) and v != v) or v is pd.NaT else v) for k, v in row.items()}
        for key in ("openedAt", "lastAt", "resolvedAt"):
            if row[key] is not None:
                row[key] = int(pd.Timestamp(row[key]).timestamp() * 1000)
        row["reopenCount"], row["events"] = int(row["reopenCount"]), int(row["events"])
        out.append(row)
    return out


@settings(max_examples=150, deadline=None)
@given(lines)
def test_streaming_arrow_and_pandas_folds_agree(raw_lines):
    raw = b"".join(line + b"\n" for line in raw_lines)
    parsed, consumed, n, problems = issues.parse_ledger(raw)
    assert consumed == len(raw) and n == len(raw_lines)
    python = [_as_dict(s) for s in issues.fold(ev for _, ev in parsed).values()]
    table = issues.events_table(parsed)
    arrow = _arrow_rows(issues.fold_table(table))
    assert arrow == python
    folded = issues.fold(ev for _, ev in parsed)
    back = issues.states_from_table(issues.fold_table(table))
    assert back == list(folded.values()), "the table folds back to the same states"
    cols = ["issueId", "title", "state", "openedAt", "openedBy", "lastAt", "lastBy", "resolvedAt", "resolvedBy",
            "reopenCount", "events", "detail"]
    frame = issue_fold(table.to_pandas())
    assert [{k: r[k] for k in cols} for r in _pandas_rows(frame)] == [{k: r[k] for k in cols} for r in python]


def test_the_rule_in_words():
    evs = [
        IssueEvent("flaky-x", 5, "opened", "r1"),  # no title: the id stands in until one comes
        IssueEvent("flaky-x", 3, "opened", "r2", "Flaky X test", "one in ten"),  # earlier `at`, later line
        IssueEvent("flaky-x", 3, "resolved", "r3", "Another title"),
        IssueEvent("flaky-x", 9, "reopened", "r4"),
        IssueEvent("flaky-x", 9, "wontfix", None),
    ]
    (st_,) = issues.fold(evs).values()
    assert st_.title == "Flaky X test", "the first non-empty title, whatever came before it"
    assert (st_.state, st_.openedAt, st_.openedBy, st_.lastAt, st_.lastBy) == ("wontfix", 5, "r1", 9, None)
    assert (st_.resolvedAt, st_.resolvedBy, st_.reopenCount, st_.events, st_.detail) == (9, None, 1, 5, "one in ten")
    assert not st_.is_open


def test_a_title_equal_to_its_id_is_still_a_title():
    evs = [IssueEvent("ssr-hydration", 1, "opened", "r1", "ssr-hydration"), IssueEvent("ssr-hydration", 2, "opened", "r2", "SSR hydration")]
    assert issues.fold(evs)["ssr-hydration"].title == "ssr-hydration"


def test_as_of_folds_only_the_past():
    evs = [IssueEvent("a", 1, "opened", "r1", "A"), IssueEvent("a", 5, "resolved", "r2")]
    table = issues.events_table(list(enumerate(evs, 1)))
    assert issues.fold_table(table, as_of_ms=4).column("state").to_pylist() == ["opened"]
    assert issues.open_table(table, as_of_ms=4).column("issueId").to_pylist() == ["a"]
    assert issues.open_table(table).num_rows == 0


@pytest.mark.parametrize("title", [None, "Flaky X test"])
def test_store_snapshot_and_frame_show_the_same_titles(memory_root, title):
    """The user-visible bug the rule fixes: `cybmem issues` and the MEMORY block disagreed."""
    store = MemoryStore(memory_root, "web")
    store.append_issue_events([IssueEvent("flaky-x", 1, "opened", "r1", title)])
    with open(store.issues_path, "ab") as fh:
        fh.write(json.dumps({"issueId": "flaky-x", "at": 2, "event": "reopened", "title": "Flaky X test"}).encode() + b"\n")
    (st_,) = store.open_issues()
    snap = load_snapshot(store)
    assert snap.open_issues().column("title").to_pylist() == [st_.title] == ["Flaky X test"]
    assert issue_fold(issue_events_frame(snap))["title"].tolist() == ["Flaky X test"]
    assert snap.open_issues().column("openedBy").to_pylist() == [st_.openedBy] == ["r1"]


@settings(max_examples=150, deadline=None)
@given(lines, st.sets(st.sampled_from(IDS + ["nowhere", "a.b", "x|y"]), max_size=4), st.booleans())
def test_the_write_paths_partial_fold_is_the_full_fold_of_those_ids(tmp_path_factory, raw_lines, ids, compact):
    """issue_states_for reads only the lines naming the ids, and folds them as the whole ledger would."""
    root = tmp_path_factory.mktemp("ledger")
    store = MemoryStore(root, "p")
    store.dir.mkdir()
    body = [json.dumps(json.loads(line), separators=(",", ":")).encode() if compact and line.startswith(b'{"issueId"')
            else line for line in raw_lines]
    store.issues_path.write_bytes(b"".join(line + b"\n" for line in body) + b'{"issueId": "a", "at": 1, "ev')
    full = store.issue_states()
    assert store.issue_states_for(ids) == {k: v for k, v in full.items() if k in ids}
