"""Filters and paging: which records (and which issues) a read command shows.

One filter for records, :class:`RecordFilter`, applied by one function, :func:`record_mask`,
vectorised over a snapshot's Arrow records: ``cybmem list`` pages what it selects,
``cybmem search`` narrows its candidates with it before ranking, ``cybmem chain`` keeps the
runs of a chain it selects. Issues are filtered on the fold (:mod:`cybmem.store.ledger`) by
:func:`select_issues`, ledger events by :func:`select_events`. Every condition is optional; the
ones given must all hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from ..store import ledger as _issues
from ..errors import ValidationError
from ..store.records import STATES

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from ..store.ledger import IssueState
    from ..store.memory_store import MemoryStore
    from ..store.records import IssueEvent
    from ..store.snapshot import Snapshot

__all__ = ["RecordFilter", "IssueFilter", "Page", "record_mask", "list_records", "select_issues", "select_events",
           "ISSUE_STATE_GROUPS", "IssueListing", "list_issues", "list_issue_events"]

#: ``--state`` names for issues: the four ledger states and two groups of them
ISSUE_STATE_GROUPS = {"open": _issues.OPEN, "closed": _issues.CLOSED,
                      **{s: (s,) for s in _issues.OPEN + _issues.CLOSED}}
_MS_PER_DAY = 86_400_000


def _states(value: str | Sequence[str] | None, allowed: dict[str, tuple[str, ...]], what: str) -> tuple[str, ...]:
    """``"done,error"`` or ``["done"]`` -> the states it names (groups expanded), checked."""
    if value is None:
        return ()
    names = [x.strip() for x in (value.split(",") if isinstance(value, str) else value) if x and x.strip()]
    out: list[str] = []
    for name in names:
        if name not in allowed:
            raise ValidationError(f"{what}: {name!r} is not one of {', '.join(allowed)}")
        out += [s for s in allowed[name] if s not in out]
    return tuple(out)


@dataclass(frozen=True)
class RecordFilter:
    """Which records to keep; every field is optional and the ones set must all hold.

    Attributes:
        since, until: the run ended at or after / at or before (epoch ms, both inclusive).
        states: the run's final state is one of these (done, error, cancelled).
        grep: case-insensitive substring of the task or the outcome summary.
        agent: one of the run's workers has this agent id.
        issue: the run raised this issue id, or wrote an event of it to the ledger (opened,
            resolved, reopened or marked it).
    """

    since: int | None = None
    until: int | None = None
    states: tuple[str, ...] = ()
    grep: str | None = None
    agent: str | None = None
    issue: str | None = None

    @classmethod
    def make(cls, *, since: int | None = None, until: int | None = None, state: str | Sequence[str] | None = None,
             grep: str | None = None, agent: str | None = None, issue: str | None = None) -> "RecordFilter":
        """A filter from command-line style values (``state="done,error"``); empty values mean no condition.

        Raises:
            ValidationError: an unknown state.
        """
        return cls(since=since, until=until, states=_states(state, {s: (s,) for s in STATES}, "state"),
                   grep=grep or None, agent=agent or None, issue=issue or None)

    @property
    def active(self) -> bool:
        """True when some condition is set."""
        return any(getattr(self, f.name) not in (None, ()) for f in fields(self))

    def describe(self) -> str:
        """The conditions in words, for one-line summaries ("" when none)."""
        from ..store.records import ms_to_utc

        parts = []
        if self.since is not None:
            parts.append(f"ended since {ms_to_utc(self.since)}")
        if self.until is not None:
            parts.append(f"ended until {ms_to_utc(self.until)}")
        if self.states:
            parts.append("state " + "/".join(self.states))
        if self.grep:
            parts.append(f"matching {self.grep!r}")
        if self.agent:
            parts.append(f"by agent {self.agent}")
        if self.issue:
            parts.append(f"touching issue {self.issue}")
        return ", ".join(parts)


def _list_contains(column, value: str, n: int) -> "np.ndarray":
    """Rows of a list<string> column that hold ``value`` (vectorised)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from ..arrow_numpy import numpy_of, scalar  # not to_numpy / a str argument: they import pandas

    col = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    flat = pc.list_flatten(col)
    hit = np.zeros(n, dtype=bool)
    if len(flat):
        where = numpy_of(pc.fill_null(pc.equal(flat, scalar(value, flat.type)), scalar(False, pa.bool_())))
        parents = numpy_of(pc.list_parent_indices(col))
        hit[parents[where]] = True
    return hit


def record_mask(snap: "Snapshot", f: RecordFilter) -> "np.ndarray":
    """The rows of ``snap.records`` that pass ``f`` (a boolean array; all True for an empty filter).

    The one record filter: ``list``, ``search`` and ``chain`` all select with it.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from ..arrow_numpy import numpy_of, scalar, strings  # not pa.array / to_numpy: they import pandas

    n = snap.n
    mask = np.ones(n, dtype=bool)
    if not n or not f.active:
        return mask
    r = snap.records
    if f.since is not None or f.until is not None:
        ended = snap.ended_ms()
        if f.since is not None:
            mask &= ended >= f.since
        if f.until is not None:
            mask &= ended <= f.until
    if f.states:
        mask &= numpy_of(pc.is_in(r.column("state"), value_set=strings(list(f.states))))
    if f.grep:
        hit = np.zeros(n, dtype=bool)
        for name in ("task", "summary"):
            m = pc.match_substring(r.column(name), f.grep, ignore_case=True)
            hit |= numpy_of(pc.fill_null(m, scalar(False, pa.bool_())))
        mask &= hit
    if f.agent:
        mask &= _list_contains(r.column("workerAgents"), f.agent, n)
    if f.issue:
        carried = _list_contains(r.column("issues"), f.issue, n)
        ev = snap.events
        if ev.num_rows:
            by = ev.filter(pc.equal(ev.column("issueId"), scalar(f.issue, pa.string()))).column("byRunId").drop_null()
            if len(by):
                carried |= numpy_of(pc.is_in(r.column("runId"), value_set=pc.unique(by)))
        mask &= carried
    return mask


@dataclass
class Page:
    """One page of a selection: the items shown and how many there were in all."""

    items: list[Any]
    total: int  # items that passed the filter
    offset: int
    limit: int | None
    snapshot: Any = field(default=None, repr=False, compare=False)  # list_records: what the page was read from

    @property
    def shown(self) -> int:
        return len(self.items)

    @property
    def remaining(self) -> int:
        """Items after this page."""
        return max(self.total - self.offset - len(self.items), 0)

    def footer(self, noun: str) -> str | None:
        """"Showing 1-50 of 7761 records; ..." when the page is not everything, else None."""
        if self.offset == 0 and not self.remaining:
            return None
        if not self.items:
            return f"No {noun} at offset {self.offset}; {self.total} in all."
        first, last = self.offset + 1, self.offset + len(self.items)
        hints = []
        if self.remaining:
            hints.append(f"--offset {last} for the next page")
        hints.append("--limit 0 for all")
        return f"Showing {first}-{last} of {self.total} {noun}; " + ", ".join(hints) + "."


def _page(items: Sequence[Any], offset: int, limit: int | None) -> list[Any]:
    if offset < 0 or (limit is not None and limit < 0):
        raise ValidationError("offset and limit must be 0 or more")
    return list(items[offset: None if not limit else offset + limit])


def _entry(row: dict, superseded_by: str | None) -> dict:
    """A record as ``cybmem list --json`` shows it (the fields of index.json's entries, whole)."""
    out = {
        "runId": row["runId"],
        "startedAt": row["startedAt"],
        "endedAt": row["endedAt"],
        "state": row["state"],
        "workflowName": row["workflowName"],
        "task": row["task"],
        "summary": row["summary"] or "",
        "issues": list(row["issues"] or []),
    }
    for key in ("previousRunId", "parentRunId", "chatSessionId", "rootRunId", "supersedes"):
        if row.get(key):
            out[key] = row[key]
    if superseded_by:
        out["supersededBy"] = superseded_by
    out["superseded"] = superseded_by is not None
    return out


def list_records(snap: "Snapshot | MemoryStore", f: RecordFilter | None = None, *, offset: int = 0,
                 limit: int | None = None) -> Page:
    """Records that pass ``f``, newest first, one page of them (what ``cybmem list`` shows).

    Args:
        snap: the project (its snapshot is loaded), or its snapshot.
        f: the filter (default: none).
        offset: records to skip from the newest.
        limit: records on the page (None or 0: all).

    Returns:
        A :class:`Page` of dicts: runId, startedAt, endedAt (epoch ms), state, workflowName,
        task, summary, issues, the lineage links that are set, ``superseded`` and the
        correction as ``supersededBy``.
    """
    import numpy as np

    from ..store.arrow_records import take_rows, with_ms_times
    from ..store.loading import load_snapshot, verified
    from ..store.snapshot import Snapshot

    if not isinstance(snap, Snapshot):
        snap = load_snapshot(snap)
    for attempt in range(2):
        mask = record_mask(snap, f or RecordFilter())
        order = snap.newest_first()
        picked = order[mask[order]] if snap.n else np.zeros(0, np.int64)
        rows = _page(picked, offset, limit)
        fresh = verified(snap, rows) if attempt == 0 else snap  # a row edited in place is read again
        if fresh is snap:
            break
        snap = fresh
    mapping = snap.supersession()
    cols = ["runId", "startedAt", "endedAt", "state", "workflowName", "task", "summary", "issues",
            "previousRunId", "parentRunId", "chatSessionId", "rootRunId", "supersedes"]
    table = with_ms_times(take_rows(snap.records.select(cols), rows))
    items = [_entry(row, mapping.get(row["runId"])) for row in table.to_pylist()]
    return Page(items, int(len(picked)), offset, limit or None, snapshot=snap)


# --- issues ----------------------------------------------------------------------------


@dataclass(frozen=True)
class IssueFilter:
    """Which issues (folded states) to keep; the fields set must all hold.

    Attributes:
        states: the issue's current state is one of these.
        since, until: the issue's life, from its first event to its last, overlaps this window
            (epoch ms, inclusive): it was opened by ``until`` and still had an event at or after
            ``since``.
        grep: case-insensitive substring of the title or the detail (or the id).
        window_days: closed issues (resolved, wontfix) whose last event is more than this many
            days before ``now`` are left out; None keeps them all.
    """

    states: tuple[str, ...] = ()
    since: int | None = None
    until: int | None = None
    grep: str | None = None
    window_days: float | None = None

    @classmethod
    def make(cls, *, state: str | Sequence[str] | None = None, since: int | None = None, until: int | None = None,
             grep: str | None = None, window_days: float | None = None) -> "IssueFilter":
        """A filter from command-line style values (``state="open"``, ``"resolved,wontfix"``).

        Raises:
            ValidationError: an unknown state.
        """
        return cls(states=_states(state, ISSUE_STATE_GROUPS, "state"), since=since, until=until, grep=grep or None,
                   window_days=window_days)

    def keeps(self, s: "IssueState", now_ms: int) -> bool:
        """Whether the folded issue ``s`` passes (``now_ms``: the moment the window is measured to)."""
        if self.states and s.state not in self.states:
            return False
        if self.since is not None and s.lastAt < self.since:
            return False
        if self.until is not None and s.openedAt > self.until:
            return False
        if self.grep:
            needle = self.grep.casefold()
            if not any(needle in (t or "").casefold() for t in (s.title, s.detail, s.issueId)):
                return False
        if self.window_days is not None and s.state in _issues.CLOSED:
            if s.lastAt < now_ms - self.window_days * _MS_PER_DAY:
                return False
        return True


def select_issues(states: Iterable["IssueState"], f: IssueFilter, *, now_ms: int, offset: int = 0,
                  limit: int | None = None, newest_first: bool = True) -> tuple[Page, int]:
    """Folded issues that pass ``f``: open ones first (newest opened first, so a page starts with
    what is new; oldest first with ``newest_first=False``), then closed ones (most recently closed
    first); one page of them. The order of `cybmem issues` and of the MCP ``issues`` tool.

    Returns:
        The page and the number of closed issues the window left out (they would pass otherwise).
    """
    from dataclasses import replace

    unwindowed = replace(f, window_days=None)
    kept, hidden = [], 0
    for s in states:
        if f.keeps(s, now_ms):
            kept.append(s)
        elif f.window_days is not None and unwindowed.keeps(s, now_ms):
            hidden += 1
    open_ = _issues.open_states(kept)
    if newest_first:
        open_.reverse()
    closed = sorted((s for s in kept if not s.is_open), key=lambda s: (-s.lastAt, s.issueId))
    ordered = open_ + closed
    return Page(_page(ordered, offset, limit), len(ordered), offset, limit or None), hidden


def select_events(events: Iterable[tuple[int, "IssueEvent"]] | Iterable["IssueEvent"], *, since: int | None = None,
                  until: int | None = None, events_named: Sequence[str] = (), grep: str | None = None,
                  titles: dict[str, str] | None = None, offset: int = 0, limit: int | None = None) -> Page:
    """Ledger events in file order that pass: ``at`` in [since, until], the event is one of
    ``events_named``, ``grep`` in the title or detail (or the issue's folded title); one page."""
    if offset < 0 or (limit is not None and limit < 0):
        raise ValidationError("offset and limit must be 0 or more")
    needle = grep.casefold() if grep else None
    titles = titles or {}
    stop = None if not limit else offset + limit
    kept, total = [], 0  # only the page is kept: a ledger can hold millions of events
    for ev in events:
        ev = ev[1] if isinstance(ev, tuple) else ev
        if since is not None and ev.at < since:
            continue
        if until is not None and ev.at > until:
            continue
        if events_named and ev.event not in events_named:
            continue
        if needle and not any(needle in (t or "").casefold()
                              for t in (ev.title, ev.detail, ev.issueId, titles.get(ev.issueId))):
            continue
        if total >= offset and (stop is None or total < stop):
            kept.append(ev)
        total += 1
    return Page(kept, total, offset, limit or None)


@dataclass
class IssueListing:
    """What ``cybmem issues`` shows: one page of folded issues (or of ledger events), and what to say about it.

    Attributes:
        page: the issues (:class:`cybmem.store.ledger.IssueState`) or events (:class:`cybmem.store.records.IssueEvent`).
        hidden: closed issues the window left out (issue view).
        titles: issue id -> its folded title (event view: an event may carry none).
        warnings: the ledger's read problems, each once.
    """

    page: Page
    hidden: int = 0
    titles: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def list_issues(store, f: IssueFilter, *, as_of: int | None = None, offset: int = 0, limit: int | None = 50,
                now_ms: int | None = None, newest_first: bool = True, snap: "Snapshot | None" = None) -> IssueListing:
    """One page of a project's folded issues that pass ``f`` (:func:`select_issues`, whose order
    ``newest_first`` chooses), the ledger as it was at ``as_of`` (epoch ms; None: now), its window
    measured from then (or ``now_ms``). ``snap``: the store's snapshot when the caller has loaded it."""
    import time

    from ..store.loading import load_snapshot

    if snap is None:
        snap = load_snapshot(store)  # the fold is cached with the snapshot: a long ledger is not re-read
    folded = _issues.states_from_table(snap.fold(as_of))
    now = as_of if as_of is not None else int(time.time() * 1000) if now_ms is None else now_ms
    page, hidden = select_issues(folded, f, now_ms=now, offset=offset, limit=limit, newest_first=newest_first)
    ledger = str(store.issues_path)
    warnings = list(dict.fromkeys(p.message for p in [*store.problems, *snap.problems] if p.path.startswith(ledger)))
    return IssueListing(page, hidden, warnings=warnings)


def list_issue_events(store, *, since: int | None = None, until: int | None = None, events_named: Sequence[str] = (),
                      grep: str | None = None, as_of: int | None = None, offset: int = 0,
                      limit: int | None = 50) -> IssueListing:
    """One page of a project's ledger events in file order (:func:`select_events`), streamed, as
    the ledger was at ``as_of``; ``titles`` gives each issue's folded title for the events that carry none."""
    from ..store.loading import load_snapshot

    folded = load_snapshot(store).fold()
    titles = dict(zip(folded.column("issueId").to_pylist(), folded.column("title").to_pylist()))
    ledger = (ev for _, ev in store.iter_issue_events() if as_of is None or ev.at <= as_of)  # streamed
    page = select_events(ledger, since=since, until=until, events_named=events_named, grep=grep, titles=titles,
                         offset=offset, limit=limit)
    return IssueListing(page, titles=titles, warnings=[p.message for p in store.problems])
