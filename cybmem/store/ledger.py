"""The issue ledger's one rule: parsing its lines and folding its events into current states.

``issues.jsonl`` is append-only; an issue's current state is the fold of its events in file
order (store-format.md). The fold, written once here in two forms that are tested equal
(tests/store/test_ledger.py, hypothesis over generated ledgers):

- :func:`fold` / :func:`fold_into`: streaming, over :class:`~cybmem.store.records.IssueEvent` objects
  (the write path and the CLI; no pyarrow);
- :func:`fold_table`: vectorised over the Arrow events table (snapshots, notebooks, the
  dispatch hot path); ``cybmem.explore.frames.issue_fold`` is its pandas view.

The rule, per issue id, over its events in file order (``at`` never reorders them):

- ``state``: the last event (opened | resolved | reopened | wontfix);
- ``title``: the first non-empty title, else the issue id; ``detail``: the first non-empty detail;
- ``openedAt`` / ``openedBy``: the first event's ``at`` / ``byRunId``;
- ``lastAt`` / ``lastBy``: the last event's;
- ``resolvedAt`` / ``resolvedBy``: the last event's when the state is resolved or wontfix, else
  none;
- ``reopenCount``: the number of ``reopened`` events; ``events``: the number of events.

A line that is not a valid event (bad JSON, unknown event name, missing id) is skipped by every
reader and reported once; a torn last line (no newline yet) is left for the next read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import _io
from ..errors import ValidationError
from .records import ISSUE_EVENTS, ISSUE_ID_RE, IssueEvent

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

__all__ = [
    "MAX_LEDGER_BYTES",
    "OPEN",
    "CLOSED",
    "IssueState",
    "event_from_dict",
    "parse_ledger",
    "iter_ledger",
    "states_from_table",
    "title_key",
    "fold",
    "fold_into",
    "repeats",
    "open_states",
    "EVENT_COLUMNS",
    "events_table",
    "fold_table",
    "schemas",
    "open_table",
]

#: the largest ledger (and index.json, archive-summary.md) the store reads whole
MAX_LEDGER_BYTES = 4 * 1024 * 1024 * 1024
OPEN = ("opened", "reopened")
CLOSED = ("resolved", "wontfix")
_EVENT_KEYS = frozenset(IssueEvent._KNOWN)


@dataclass
class IssueState:
    """The fold of one issue's events: current state and its history (rule: module docstring)."""

    issueId: str
    title: str
    state: str
    openedAt: int
    openedBy: str | None
    lastAt: int
    lastBy: str | None
    resolvedAt: int | None = None
    resolvedBy: str | None = None
    reopenCount: int = 0
    events: int = 0
    detail: str | None = None
    titled: bool = field(default=False, repr=False, compare=False)

    @property
    def is_open(self) -> bool:
        return self.state in OPEN

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "titled"}


def event_from_dict(d: Any) -> IssueEvent:
    """A decoded ledger line as an IssueEvent (fast path for well-formed lines, else full validation).

    Raises:
        ValidationError: naming the field at fault.
    """
    if (
        type(d) is dict and d.get("event") in ISSUE_EVENTS and type(d.get("issueId")) is str
        and type(d.get("at")) is int and 0 <= d["at"] < 10**14 and ISSUE_ID_RE.fullmatch(d["issueId"]) is not None
        and d["issueId"].strip(".") != ""
    ):
        by, title, detail = d.get("byRunId"), d.get("title"), d.get("detail")
        if (by is None or type(by) is str) and (title is None or type(title) is str) and (detail is None or type(detail) is str):
            extra = {k: v for k, v in d.items() if k not in _EVENT_KEYS} if len(d) > 3 else {}
            return IssueEvent(issueId=d["issueId"], at=d["at"], event=d["event"], byRunId=by or None,
                              title=title, detail=detail, extra=extra)
    return IssueEvent.from_dict(d)


def iter_ledger(raw: bytes, problems: list[tuple[int, str]], *, first_line: int = 1) -> Iterator[tuple[int, IssueEvent]]:
    """The events of the whole lines of ledger bytes, one at a time, in file order: a fold of a
    ledger of millions of events never holds them all. Unreadable lines are appended to
    ``problems`` as (line number, reason); a torn last line (no newline) is not read.

    Args:
        raw: bytes read from the ledger, starting at a line boundary.
        problems: where skipped lines are reported.
        first_line: the line number of the first line in ``raw``.
    """
    end = raw.rfind(b"\n") + 1
    lineno, pos = first_line - 1, 0
    while pos < end:
        nl = raw.index(b"\n", pos)
        lineno += 1
        line = raw[pos:nl]
        pos = nl + 1
        if not line.strip():
            continue
        try:
            yield lineno, event_from_dict(_io.loads(line))
        except (ValueError, ValidationError) as exc:
            problems.append((lineno, f"skipped unreadable ledger line ({exc})"))


def parse_ledger(raw: bytes, *, first_line: int = 1) -> tuple[list[tuple[int, IssueEvent]], int, int, list[tuple[int, str]]]:
    """Parse the whole lines of ledger bytes (:func:`iter_ledger`, collected).

    Args:
        raw: bytes read from the ledger, starting at a line boundary.
        first_line: the line number of the first line in ``raw``.

    Returns:
        ``(events, consumed, lines, problems)``: (line number, event) pairs in file order; the
        bytes consumed (up to and including the last newline: a torn last line is left for the
        next read); the number of whole lines consumed; (line number, reason) of lines skipped.
    """
    problems: list[tuple[int, str]] = []
    events = list(iter_ledger(raw, problems, first_line=first_line))
    end = raw.rfind(b"\n") + 1
    return events, end, raw.count(b"\n", 0, end), problems


def fold_into(states: dict[str, IssueState], ev: IssueEvent) -> IssueState:
    """Fold one event into ``states`` (in place) and return the issue's state."""
    st = states.get(ev.issueId)
    if st is None:
        st = states[ev.issueId] = IssueState(
            issueId=ev.issueId, title=ev.title or ev.issueId, state=ev.event, openedAt=ev.at, openedBy=ev.byRunId,
            lastAt=ev.at, lastBy=ev.byRunId, detail=ev.detail or None, titled=bool(ev.title),
        )
    else:
        st.state = ev.event
        st.lastAt, st.lastBy = ev.at, ev.byRunId
        if ev.title and not st.titled:
            st.title, st.titled = ev.title, True
        if ev.detail and st.detail is None:
            st.detail = ev.detail
    st.events += 1
    if ev.event == "reopened":
        st.reopenCount += 1
    if ev.event in CLOSED:
        st.resolvedAt, st.resolvedBy = ev.at, ev.byRunId
    else:
        st.resolvedAt = st.resolvedBy = None
    return st


def repeats(state: str | None, event: str) -> bool:
    """Whether ``event`` leaves an issue whose fold says ``state`` (None: no event yet) in the same
    state: opened or reopened while open, resolved while resolved, wontfix while wontfix. Writers
    do not append such an event; doctor reports one another writer left (the state is unchanged)."""
    if state is None:
        return False
    return state in OPEN if event in OPEN else state == event


def fold(events: Iterable[IssueEvent]) -> dict[str, IssueState]:
    """Current state per issue, in order of first appearance."""
    states: dict[str, IssueState] = {}
    for ev in events:
        fold_into(states, ev)
    return states


def states_from_table(table: "pa.Table") -> list[IssueState]:
    """The rows of a fold table (:func:`fold_table`) as IssueStates, in its order: the same
    states :func:`fold` makes of the same events (``titled``, which only the write path reads,
    is not kept by the table)."""
    cols = {name: table.column(name).cast("int64").to_pylist() if name in _TIME_COLUMNS
            else table.column(name).to_pylist() for name in table.column_names}
    out = []
    for i, iid in enumerate(cols["issueId"]):
        title = cols["title"][i]
        out.append(IssueState(
            issueId=iid, title=title or iid, state=cols["state"][i], openedAt=cols["openedAt"][i],
            openedBy=cols["openedBy"][i], lastAt=cols["lastAt"][i], lastBy=cols["lastBy"][i],
            resolvedAt=cols["resolvedAt"][i], resolvedBy=cols["resolvedBy"][i],
            reopenCount=cols["reopenCount"][i], events=cols["events"][i], detail=cols["detail"][i] or None,
            titled=bool(title)))
    return out


_TIME_COLUMNS = ("openedAt", "lastAt", "resolvedAt")


def title_key(title: str | None) -> str:
    """What makes two issue titles the same title (case and spacing aside): one line of the
    block stands for every open issue with that key."""
    return " ".join((title or "").casefold().split())


def title_keys(titles: Iterable[str | None]) -> list[str]:
    """:func:`title_key` of each title: a fold's column at once."""
    return [" ".join((title or "").casefold().split()) for title in titles]


def open_states(states: Iterable[IssueState]) -> list[IssueState]:
    """The open ones, oldest opened first (ties by id)."""
    return sorted((s for s in states if s.is_open), key=lambda s: (s.openedAt, s.issueId))


# --- the Arrow form -------------------------------------------------------------------

#: Columns of the events table (``line``: the 1-based ledger line the event came from).
EVENT_COLUMNS = ("issueId", "at", "event", "byRunId", "title", "detail", "line")


def schemas():
    """The Arrow schemas of the events table (:func:`events_table`) and of the fold
    (:func:`fold_table`): what the cache's events.arrow and fold.arrow hold."""
    import pyarrow as pa

    ts = pa.timestamp("ms", tz="UTC")
    events = pa.schema([("issueId", pa.string()), ("at", ts), ("event", pa.string()), ("byRunId", pa.string()),
                        ("title", pa.string()), ("detail", pa.string()), ("line", pa.int64())])
    folded = pa.schema([
        ("issueId", pa.string()), ("title", pa.string()), ("state", pa.string()),
        ("openedAt", ts), ("openedBy", pa.string()), ("lastAt", ts), ("lastBy", pa.string()),
        ("resolvedAt", ts), ("resolvedBy", pa.string()), ("reopenCount", pa.int64()), ("events", pa.int64()),
        ("detail", pa.string()),
    ])
    return events, folded


def events_table(events: Iterable[tuple[int, IssueEvent]]) -> "pa.Table":
    """(line, event) pairs as the Arrow events table (schema: :data:`EVENT_COLUMNS`)."""
    import pyarrow as pa

    from ..arrow_numpy import array_of, strings

    schema, _ = schemas()
    cols: dict[str, list] = {name: [] for name in EVENT_COLUMNS}
    for line, ev in events:
        cols["issueId"].append(ev.issueId)
        cols["at"].append(ev.at)
        cols["event"].append(ev.event)
        cols["byRunId"].append(ev.byRunId)
        cols["title"].append(ev.title)
        cols["detail"].append(ev.detail)
        cols["line"].append(line)
    # Built from buffers: pa.array would import pandas (cybmem.arrow_numpy).
    arrays = [array_of(cols[f.name], pa.int64()).cast(f.type) if f.name == "at"
              else array_of(cols[f.name], f.type) if f.name == "line" else strings(cols[f.name], f.type)
              for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def _first_where(codes, ok, n_codes: int):
    """Row of the first True of ``ok`` per code (-1 where there is none)."""
    import numpy as np

    out = np.full(n_codes, -1, dtype=np.int64)
    rows = np.flatnonzero(ok)
    if len(rows):
        uniq, first = np.unique(codes[rows], return_index=True)
        out[uniq] = rows[first]
    return out


def fold_table(events: "pa.Table", *, as_of_ms: int | None = None) -> "pa.Table":
    """The fold of an events table, vectorised: one row per issue, in order of first appearance.

    Args:
        events: the events table (file order), e.g. ``Snapshot.events``.
        as_of_ms: fold only the events with ``at <= as_of_ms`` (replaying the past).

    Returns:
        Columns issueId, title, state, openedAt, openedBy, lastAt, lastBy, resolvedAt,
        resolvedBy, reopenCount, events, detail (timestamps ``timestamp[ms, UTC]``).
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from ..arrow_numpy import array_of, numpy_of, scalar, strings  # not pa.array / to_numpy: they import pandas

    _, schema = schemas()
    if as_of_ms is not None and events.num_rows:
        events = events.filter(pc.less_equal(events.column("at"), scalar(as_of_ms, pa.timestamp("ms", tz="UTC"))))
    n = events.num_rows
    if not n:
        return schema.empty_table()
    enc = pc.dictionary_encode(events.column("issueId")).combine_chunks()
    codes = numpy_of(enc.indices).astype(np.int64)
    m = len(enc.dictionary)
    first = _first_where(codes, np.ones(n, dtype=bool), m)
    last = n - 1 - _first_where(codes[::-1], np.ones(n, dtype=bool), m)
    order = np.argsort(first, kind="stable")  # issues in order of first appearance
    first, last = first[order], last[order]

    def text_first(name: str) -> pa.Array:
        """The first non-empty value of a text column per issue (null where there is none)."""
        col = events.column(name)
        ok = numpy_of(pc.fill_null(pc.not_equal(col, scalar("", pa.string())), scalar(False, pa.bool_())))
        rows = _first_where(codes, ok, m)[order]
        taken = col.take(array_of(np.where(rows >= 0, rows, 0), pa.int64()))
        return pc.if_else(array_of(rows >= 0, pa.bool_()), taken, scalar(None, pa.string()))

    ids = enc.dictionary.take(array_of(order, pa.int64()))
    event_col = events.column("event")
    state = event_col.take(array_of(last, pa.int64()))
    closed = pc.is_in(state, value_set=strings(CLOSED))
    at, by = events.column("at"), events.column("byRunId")
    last_at, last_by = at.take(array_of(last, pa.int64())), by.take(array_of(last, pa.int64()))
    reopened = numpy_of(pc.equal(event_col, scalar("reopened", pa.string())))
    counts = np.bincount(codes, minlength=m)[order]
    reopens = np.bincount(codes, weights=reopened, minlength=m).astype(np.int64)[order]
    table = pa.table({
        "issueId": ids,
        "title": pc.coalesce(text_first("title"), ids),
        "state": state,
        "openedAt": at.take(array_of(first, pa.int64())),
        "openedBy": by.take(array_of(first, pa.int64())),
        "lastAt": last_at,
        "lastBy": last_by,
        "resolvedAt": pc.if_else(closed, last_at, scalar(None, last_at.type)),
        "resolvedBy": pc.if_else(closed, last_by, scalar(None, pa.string())),
        "reopenCount": array_of(reopens, pa.int64()),
        "events": array_of(counts.astype(np.int64), pa.int64()),
        "detail": text_first("detail"),
    })
    return table.cast(schema)


def open_table(events: "pa.Table", *, as_of_ms: int | None = None) -> "pa.Table":
    """The open issues of :func:`fold_table`, newest opened first (ties by id)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    folded = fold_table(events, as_of_ms=as_of_ms)
    if not folded.num_rows:
        return folded
    opened = folded.filter(pc.is_in(folded.column("state"), value_set=pa.array(OPEN)))
    return opened.take(pc.sort_indices(opened, sort_keys=[("openedAt", "descending"), ("issueId", "ascending")]))
