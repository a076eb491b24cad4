"""Chains: previous / next along previousRunId, parent and children, chat sessions, supersession;
a run's chain as ``cybmem chain`` and the MCP chain tool show it (:func:`chain_view`); and one
record as ``cybmem show`` shows it (:func:`show_record`: the newest truth of a run)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import CybmemError, NotFoundError
from ..store.arrow_records import take_rows, with_ms_times
from ..store.records import MemoryRecord
from ..store.loading import load_snapshot, verified
from ..store.snapshot import Snapshot
from ..store.index import entry_of, index_entry
from ..store.memory_store import MemoryStore

if TYPE_CHECKING:  # pragma: no cover
    from ..retrieval.filters import RecordFilter

__all__ = ["ChainResult", "Shown", "chain", "chain_view", "show_record"]

_MAX_WALK = 100_000  # guards against cycles written by other tools


@dataclass
class ChainResult:
    """A run's place in its project's history."""

    run_id: str
    runs: Sequence[dict]  # index entries, oldest first: earlier runs, the run, later runs (made when read)
    previous: list[str]
    next: list[str]
    parent: str | None
    parent_known: bool
    root: str | None
    children: list[str] = field(default_factory=list)
    chat_session: str | None = None
    chat_runs: list[str] = field(default_factory=list)
    open_issues: list[str] = field(default_factory=list)
    length: int = 0  # runs in the whole chain, the run included
    omitted_before: int = 0  # runs of the chain before those shown (that passed the filter), not shown
    omitted_after: int = 0  # ... after those shown
    unmatched: int = 0  # runs of the chain a filter left out
    ids: list[str] | None = field(default=None, repr=False)  # the runs' ids (None: read from runs)
    #: The whole task of each run shown (:func:`chain_view` with ``whole_tasks``): an entry holds
    #: only the task's first line, and a table shows its subject line, which for a merge commit is
    #: on a later one.
    tasks: dict[str, str] = field(default_factory=dict, repr=False)

    def run_ids(self) -> list[str]:
        """The ids of :attr:`runs`, in order (without making the entries)."""
        return self.ids if self.ids is not None else [e["runId"] for e in self.runs]

    def verified(self, store: MemoryStore) -> "ChainResult":
        """The same chain with its shown runs checked against their files (:func:`verified_runs`)."""
        runs = verified_runs(store, self.runs)
        ids = [e["runId"] for e in runs]
        kept = set(ids)
        return replace(self, runs=runs, ids=ids, previous=[i for i in self.previous if i in kept],
                       next=[i for i in self.next if i in kept])

    def window(self, *, keep: set[str] | None = None, context: int | None = 5, offset: int = 0,
               limit: int | None = None) -> "ChainResult":
        """Part of the chain: ``context`` runs each side of the run, or one page of it.

        Args:
            keep: run ids to keep (e.g. those a :class:`cybmem.retrieval.filters.RecordFilter` selects);
                None keeps every run. In context mode the run itself is always kept.
            context: runs each side of the run (0 or None: all of them); ignored when paging.
            offset, limit: page through the (kept) chain oldest first instead (limit 0 or None:
                to the end).

        Returns:
            A new ChainResult whose ``runs``, ``previous`` and ``next`` hold the runs shown and
            whose ``omitted_*`` and ``unmatched`` say how many were left out.
        """
        ids = self.run_ids()
        me = ids.index(self.run_id) if self.run_id in ids else 0
        paging = bool(offset or limit)
        sel = [i for i, rid in enumerate(ids) if keep is None or rid in keep or (i == me and not paging)]
        unmatched = len(ids) - len(sel) if keep is not None else 0
        if paging:
            lo, hi = offset, (offset + limit if limit else len(sel))
        else:
            pos = sel.index(me)
            lo, hi = (max(pos - context, 0), pos + context + 1) if context else (0, len(sel))
        shown = sel[lo:hi]
        return replace(
            self,
            runs=self.runs.pick(shown) if isinstance(self.runs, _Entries) else [self.runs[i] for i in shown],
            ids=[ids[i] for i in shown],
            previous=[ids[i] for i in shown if i < me],
            next=[ids[i] for i in shown if i > me],
            omitted_before=min(lo, len(sel)),
            omitted_after=max(len(sel) - hi, 0),
            unmatched=unmatched,
        )

    def to_dict(self) -> dict:
        return {
            "runId": self.run_id,
            "chainLength": self.length,
            "omitted": {"before": self.omitted_before, "after": self.omitted_after, "unmatched": self.unmatched},
            "previous": self.previous,
            "next": self.next,
            "parentRunId": self.parent,
            "rootRunId": self.root,
            "children": self.children,
            "chatSessionId": self.chat_session,
            "chatRuns": self.chat_runs,
            "openIssues": self.open_issues,
            "runs": list(self.runs),
        }


@dataclass
class Shown:
    """A record as ``cybmem show`` shows it: the newest truth of the run that was asked for."""

    record: MemoryRecord  # the record shown
    asked: str  # the run id the id or prefix named
    chain: list[str]  # the runs that superseded it, in order, ending with the one shown ([] if none)

    @property
    def superseded(self) -> list[str]:
        """The runs the one shown supersedes, from the one asked for on ([] when it was not corrected)."""
        return [self.asked] + self.chain[:-1] if self.chain else []

    def to_dict(self) -> dict:
        """What ``cybmem show --json`` prints: the record's fields, and ``_supersededChain`` (the
        :attr:`superseded` runs) when it was corrected."""
        data = self.record.to_dict()
        return {**data, "_supersededChain": self.superseded} if self.chain else data


def show_record(store: MemoryStore, run_id: str, *, original: bool = False, snap: Snapshot | None = None) -> Shown:
    """The record ``run_id`` (an id or a unique prefix) names, following supersession to the newest
    truth as the snapshot holds it (``original``: the asked record itself).

    Raises:
        NotFoundError / AmbiguousError: no record, or several, match the prefix (the message lists
            them); ValidationError / StoreError: the record cannot be read.
    """
    if original:
        asked = store.resolve_run_id(run_id)
        return Shown(store.read_record(asked), asked, [])
    snap = snap if snap is not None else load_snapshot(store)
    store.note_problems(snap.problems)
    asked = snap.resolve_run_id(run_id)
    chain = store.supersession_chain(asked, snap.supersession())
    return Shown(store.read_record(chain[-1] if chain else asked), asked, chain)


#: Above this many runs shown, the index entries are trusted as they are (reading every record
#: of a whole 100k chain would take seconds).
VERIFY_MAX = 500


def verified_runs(store: MemoryStore, runs: list[dict]) -> list[dict]:
    """The runs a chain shows, each checked against its record file: a record that no longer
    reads (corrupted after it was indexed) is left out with a problem on ``store``, and one
    edited in place is shown as it reads now (the index entry of its current content)."""
    if len(runs) > VERIFY_MAX:
        return runs
    out = []
    for entry in runs:
        try:
            rec, st = store.read_record_st(entry["runId"])
        except NotFoundError:
            out.append(entry)  # the run a chain starts from may have no record here
            continue
        except CybmemError as exc:
            store._problem(str(store.records_dir / f"{entry['runId']}.json"), f"{exc}; not shown")
            continue
        out.append({**entry, **index_entry(rec, st.st_ino)})
    return out


def chain(store: MemoryStore, run_id: str, snap: Snapshot | None = None) -> ChainResult:
    """Walk previousRunId both directions from ``run_id`` and collect its parent and chat links.

    Backwards follows each record's previousRunId; forwards follows the records that name the
    current one as previous (the earliest-ended one when several runs started from the same
    predecessor). Walked over the snapshot's columns (``snap``, default: the store's, from its
    cache), so the chain reaches every record, those compaction moved out of index.json
    included, without reading index.json; a record of the chain edited in place since it was
    cached is read again (one lstat per run of the chain).
    """
    snap = snap if snap is not None else load_snapshot(store)
    walked = _Walk(snap, run_id)
    # A link edited in place since the cache read it (one lstat per run of the chain): those
    # records are read again and the chain walked again.
    stale = snap.stale_rows(walked.rows())
    if stale:
        snap = verified(snap, stale)
        walked = _Walk(snap, run_id)
    store.note_problems(snap.problems)  # what could not be read: said once
    recs, n, ids, order = snap.records, snap.n, walked.ids, walked.order
    previous, me, nxt, row_of = walked.previous, walked.me, walked.next, walked.row_of
    walk = previous + [me if me is not None else -1] + nxt
    entries = _Entries(recs, walk, {"runId": run_id, "endedAt": 0, "state": "?", "task": ""})
    mine = entries[len(previous)]
    parent, chat = mine.get("parentRunId"), mine.get("chatSessionId")

    def linked(column: str, value: str | None) -> list[str]:
        if not value or not n:
            return []
        hit = pc.fill_null(pc.equal(recs.column(column), value), False).to_numpy(zero_copy_only=False)
        return [ids[i] for i in order[hit[order]].tolist()]

    states = store.issue_states_for(mine.get("issues", []))
    return ChainResult(
        run_id=run_id,
        runs=entries,
        ids=[ids[i] if i >= 0 else run_id for i in walk],
        length=len(entries),
        previous=[ids[i] for i in previous],
        next=[ids[i] for i in nxt],
        parent=parent,
        parent_known=parent in row_of,
        root=mine.get("rootRunId"),
        children=linked("parentRunId", run_id),
        chat_session=chat,
        chat_runs=linked("chatSessionId", chat),
        open_issues=[i for i in mine.get("issues", []) if states.get(i) and states[i].state in ("opened", "reopened")],
    )


def chain_view(store: MemoryStore, run_id: str, *, filter: "RecordFilter | None" = None, context: int | None = 5,
               offset: int = 0, limit: int | None = None, whole_tasks: bool = False) -> ChainResult:
    """A run's chain as ``cybmem chain`` and the MCP chain tool show it: the part around the run
    (or one page), its shown runs checked against their files (:meth:`ChainResult.verified`).

    Args:
        store: the project.
        run_id: the run (an id or a unique prefix).
        filter: keep only the chain's runs it selects (the run itself always shows).
        context, offset, limit: see :meth:`ChainResult.window`.
        whole_tasks: also read the whole task of each run shown (:attr:`ChainResult.tasks`).

    Raises:
        NotFoundError / AmbiguousError: no run, or several, match the prefix.
    """
    snap = load_snapshot(store)
    full = chain(store, snap.resolve_run_id(run_id), snap)
    keep = None
    if filter is not None and filter.active:
        from ..retrieval.filters import record_mask

        ids = snap.records.column("runId").to_numpy(zero_copy_only=False)
        keep = set(ids[record_mask(snap, filter)].tolist())
    result = full.window(keep=keep, context=context, offset=offset, limit=limit).verified(store)
    if whole_tasks:  # a few: read from their files; a filtered chain from the snapshot it was read from
        result.tasks = _whole_tasks(store, [e["runId"] for e in result.runs], snap if keep is not None else None)
    return result


def _whole_tasks(store: MemoryStore, ids: list[str], snap: Snapshot | None = None) -> dict[str, str]:
    """The whole task of each run: a few records are read; for many, the snapshot."""
    if snap is None and len(ids) <= 200:
        out = {}
        for rid in ids:
            try:
                out[rid] = store.read_record(rid).task
            except CybmemError:
                continue
        return out
    if snap is None:
        snap = load_snapshot(store)
    rows = snap.records.filter(pc.is_in(snap.records.column("runId"), value_set=pa.array(ids, pa.string())))
    return dict(zip(rows.column("runId").to_pylist(), rows.column("task").to_pylist()))


class _Walk:
    """previousRunId walked both ways from a run over a snapshot's columns (rows, oldest first)."""

    def __init__(self, snap: Snapshot, run_id: str):
        recs = snap.records
        self.ids = ids = recs.column("runId").to_pylist()
        self.row_of = row_of = {rid: i for i, rid in enumerate(ids)}
        prev = recs.column("previousRunId").to_pylist()
        # (endedAt, runId) order: the earliest-ended follower first, and the order of children and chats
        self.order = pc.sort_indices(pa.table({"e": snap.ended_ms(), "r": recs.column("runId")}),
                                     sort_keys=[("e", "ascending"), ("r", "ascending")]).to_numpy() \
            if snap.n else np.zeros(0, np.int64)
        followers: dict[str, list[int]] = {}
        for i in self.order.tolist():
            if prev[i]:
                followers.setdefault(prev[i], []).append(i)
        self.me = me = row_of.get(run_id)
        seen = {run_id}
        previous: list[int] = []
        cur = me
        while cur is not None and prev[cur] in row_of and prev[cur] not in seen and len(previous) < _MAX_WALK:
            cur = row_of[prev[cur]]
            seen.add(ids[cur])
            previous.append(cur)
        previous.reverse()
        nxt: list[int] = []
        cur_id = run_id
        while followers.get(cur_id) and len(nxt) < _MAX_WALK:
            cand = [f for f in followers[cur_id] if ids[f] not in seen]
            if not cand:
                break
            cur_id = ids[cand[0]]
            seen.add(cur_id)
            nxt.append(cand[0])
        self.previous, self.next = previous, nxt

    def rows(self) -> list[int]:
        return self.previous + ([self.me] if self.me is not None else []) + self.next


_ENTRY_COLUMNS = ["runId", "startedAt", "endedAt", "state", "workflowName", "task", "summary", "issues", "previousRunId",
                  "parentRunId", "chatSessionId", "rootRunId", "supersedes", "supersededBy", "inode"]


class _Entries(Sequence):
    """A chain's index entries, each made from its snapshot row when first read: a window shows
    a few runs of a chain that may hold 100k (making all of them takes seconds). Row -1 is the
    stand-in for a run the store does not hold."""

    def __init__(self, recs: pa.Table, rows: list[int], stand_in: dict):
        self._recs, self._rows = recs, rows
        self._made: list[dict | None] = [stand_in if r < 0 else None for r in rows]

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.pick(range(*i.indices(len(self))))
        return self.pick([range(len(self))[i]])[0]

    def __iter__(self):
        return iter(self.pick(range(len(self))))

    def pick(self, positions) -> list[dict]:
        """The entries at some positions, the missing ones made together."""
        positions = list(positions)
        todo = [p for p in positions if self._made[p] is None]
        for p, e in zip(todo, _entries(self._recs, [self._rows[p] for p in todo])):
            self._made[p] = e
        return [self._made[p] for p in positions]


def _entries(recs: pa.Table, rows: list[int]) -> list[dict]:
    """The index entries (:func:`cybmem.store.index.entry_of`) of some snapshot rows, in that order."""
    if not rows:
        return []
    return [entry_of(row) for row in with_ms_times(take_rows(recs.select(_ENTRY_COLUMNS), rows)).to_pylist()]
