"""A project's memory as Arrow columns: the loader, the snapshot and its refresh.

The loader parses ``records/*.json`` and ``issues.jsonl`` into Arrow tables (one row per record,
lineage and outcome flattened, timestamps ``timestamp[ms, UTC]``, lists as Arrow lists) and
builds the keyword index over task + summary + issue titles. Rows are ordered oldest first
(endedAt, then runId), so a higher row is a newer record. The search hot path works on these
tables with numpy and never imports pandas (``cybmem.explore.frames`` has the pandas views).

:func:`load_snapshot` keeps the Arrow cache (``cybmem.store.cache``) up to date incrementally: only
record files that are new since the last refresh are parsed (one new segment each time); a record
replaced by rename (another writer added ``supersededBy``) is parsed again and its row patched
in place when its keyword text did not change; a record that vanished, or whose text changed,
makes the cache start over. The ledger is re-read from the byte offset it had reached.

A long-lived reader (``cybmem mcp``) loads inside :func:`holding_snapshots`: a project's snapshot
is then kept between loads, with its warm state, for as long as :meth:`Snapshot.current` holds.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import _io
from . import cache as _cache, ledger as issues, supersession
from .._io import ensure_dir, locked
from .keyword_index import IdColumn, KeywordIndex, RunLookup
from .arrow_records import RECORD_SCHEMA, FEW_ROWS, Cells, arrow_indices, empty_table, keyword_text_array, load_records, parse_files, take_rows
from .embeddings import issue_text
from ..errors import StoreError
from ..progress import Notice
from .memory_store import MAX_LEDGER_BYTES, MemoryStore, ReadProblem
from .tokens import tokenize_arrow

__all__ = ["RECORD_SCHEMA", "Snapshot", "load_snapshot", "holding_snapshots", "issue_texts", "cache_problem"]

_PROGRESS_AFTER_S = 1.0


def issue_texts(events: pa.Table, ids: list[str] | None = None) -> dict[str, str]:
    """issueId -> its title and detail by the fold's rule (cybmem.store.ledger), for all issues or only
    ``ids``: the text a run that raised the issue is also found by."""
    if ids is not None:
        if not ids or not events.num_rows:
            return {}
        events = events.filter(pc.is_in(events.column("issueId"), value_set=pa.array(sorted(set(ids)), pa.string())))
    folded = issues.fold_table(events)
    return {i: issue_text(t, d) for i, t, d in zip(
        folded.column("issueId").to_pylist(), folded.column("title").to_pylist(), folded.column("detail").to_pylist())}


#: What :func:`issue_carriers` and :func:`issue_activity` return (and the cache's car-N and act-N hold).
CARRIERS_SCHEMA = pa.schema([("record", pa.int32()), ("foldRow", pa.int32())])
ACTIVITY_SCHEMA = pa.schema([("lastActivity", pa.int64()), ("titleKey", pa.int32()), ("openOrder", pa.int32())])


def issue_carriers(records: pa.Table, folded: pa.Table) -> pa.Table:
    """Every issue id the records' outcomes carry, in ``list_flatten`` order of their ``issues``
    column: ``record`` (the carrying row) and ``foldRow`` (the issue's row in ``folded``, -1 when
    the fold has no such issue). Query-independent: the current one is cached with the snapshot."""
    col = records.column("issues")
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not records.num_rows or not len(flat := pc.list_flatten(col)):
        return CARRIERS_SCHEMA.empty_table()
    rows = pc.list_parent_indices(col).cast(pa.int32())
    at = pc.fill_null(pc.index_in(flat, value_set=folded.column("issueId")), -1).cast(pa.int32())
    return pa.table({"record": rows, "foldRow": at}, schema=CARRIERS_SCHEMA)


def _arrays(carried: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    return (carried.column("record").to_numpy().astype(np.int64),
            carried.column("foldRow").to_numpy().astype(np.int64))


def issue_activity(records: pa.Table, folded: pa.Table, carriers_ok: np.ndarray, ended: np.ndarray,
                   carried: tuple[np.ndarray, np.ndarray] | None = None) -> pa.Table:
    """Query-independent arrays over the rows of a fold, for the dispatch ranking of open issues:
    ``lastActivity`` (epoch ms: the issue's last event, or later the end of the last run among
    ``carriers_ok`` that carries it in its outcome: a run that carries an open issue is activity
    on it, even when it wrote no event), ``titleKey`` (a code per :func:`cybmem.store.ledger.title_key`:
    the same code, the same title) and ``openOrder`` (:func:`open_rows`, then -1 to the length).
    ``carried``: :func:`issue_carriers` of the same two tables, as arrays (:meth:`Snapshot.carriers`)."""
    m = folded.num_rows
    last = folded.column("lastAt").cast(pa.int64()).to_numpy().copy() if m else np.zeros(0, np.int64)
    if m:
        rows, at = carried if carried is not None else _arrays(issue_carriers(records, folded))
        ok = (at >= 0) & carriers_ok[rows]
        np.maximum.at(last, at[ok], ended[rows[ok]])
    codes = np.zeros(m, np.int32)
    if m:
        enc = pc.dictionary_encode(pc.fill_null(folded.column("title"), "")).combine_chunks()
        by_key: dict[str, int] = {}
        per_title = np.array([by_key.setdefault(issues.title_key(t), len(by_key)) for t in enc.dictionary.to_pylist()],
                             dtype=np.int32)
        codes = per_title[enc.indices.to_numpy(zero_copy_only=False)]
    order = np.full(m, -1, np.int32)  # the open rows, newest opened first (open_rows), then -1s
    opened = open_rows(folded)
    order[: len(opened)] = opened
    return pa.table({"lastActivity": last, "titleKey": codes, "openOrder": order}, schema=ACTIVITY_SCHEMA)


def opened_in(activity: pa.Table) -> np.ndarray:
    """:func:`open_rows` as an :func:`issue_activity` table holds them (its ``openOrder``)."""
    order = activity.column("openOrder").to_numpy()
    return order[: int((order >= 0).sum())].astype(np.int64)


def open_rows(folded: pa.Table) -> np.ndarray:
    """The rows of a fold whose issue is open, newest opened first (ties by id). Touches three
    columns only: the fold's text columns stay on disk."""
    if not folded.num_rows:
        return np.zeros(0, dtype=np.int64)
    is_open = pc.is_in(folded.column("state"), value_set=pa.array(issues.OPEN, pa.string()))
    rows = np.flatnonzero(is_open.to_numpy(zero_copy_only=False))
    at = arrow_indices(rows)
    keys = pa.table({"openedAt": folded.column("openedAt").take(at), "issueId": folded.column("issueId").take(at)})
    order = pc.sort_indices(keys, sort_keys=[("openedAt", "descending"), ("issueId", "ascending")])
    return rows[order.to_numpy(zero_copy_only=False)]


def _record_issue_ids(table: pa.Table) -> list[str]:
    return pc.unique(pc.list_flatten(table.column("issues"))).to_pylist() if table.num_rows else []


def _parse_ledger(raw: bytes, first_line: int, path) -> tuple[pa.Table, int, int, list[ReadProblem]]:
    """Ledger bytes -> events table, bytes and lines consumed, problems (torn tail included)."""
    events, consumed, lines, bad = issues.parse_ledger(raw, first_line=first_line)
    problems = [ReadProblem(f"{path}:{n}", f"{path.name}:{n}: {why}") for n, why in bad]
    if raw[consumed:].strip():
        n = first_line + lines
        problems.append(ReadProblem(f"{path}:{n}", f"{path.name}:{n}: skipped a torn last line (no newline yet)"))
    return issues.events_table(events), consumed, lines, problems


# --- the snapshot ---------------------------------------------------------------------


@dataclass(frozen=True)
class CacheFiles:
    """The cache files (``.cache/``) a snapshot takes its derived tables from instead of computing
    them; None: there is none, compute it. Each is checked against the snapshot when read."""

    fold: Path | None = None  # fold.arrow: the issue fold
    issue_index: Path | None = None  # kwi.arrow: the keyword index over the fold (written with it)
    activity: Path | None = None  # act-N.arrow: the fold's issue activity
    carriers: Path | None = None  # car-N.arrow: which record carries which fold row


@dataclass(eq=False)
class Snapshot:
    """A project's records, issue events and keyword index, as loaded (and cached) at one moment.

    The derived state (the fold, the issue index and activity, the lookups) is computed on first
    use and kept with the snapshot, or read from the cache files it was loaded with (``files``).
    Compared and hashed by identity: a snapshot is one moment's state, not a value.
    """

    store: MemoryStore
    records: pa.Table
    events: pa.Table
    index: KeywordIndex
    problems: list[ReadProblem] = field(default_factory=list)
    from_cache: bool = False
    parsed: int = 0  # record files parsed by this load (0 on a warm load)
    #: read without the cache (use_cache=False, a .nocache root, a linked dir): layers derived
    #: from it (cybmem.retrieval.vector_cache) stay in memory too
    uncached: bool = False
    manifest: _cache.Manifest | None = field(default=None, repr=False)  # the cache manifest it was read from (:meth:`current`)
    files: CacheFiles = field(default_factory=CacheFiles)
    #: (first row of each segment, when that segment's files were read, epoch ns): :meth:`stale_rows`
    read_times: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    #: embeddings.jsonl's stat before the load, when :func:`holding_snapshots` watches it (:meth:`current`)
    embeddings_stat: dict | None = field(default=None, repr=False)
    watches_embeddings: bool = field(default=False, repr=False)
    # Memos of what depends on a moment (the last one asked for) or is built on request.
    _supersession: dict[int | None, dict[str, str]] = field(default_factory=dict, init=False, repr=False)
    _visible_now: np.ndarray | None = field(default=None, init=False, repr=False)  # candidates(None), handed out as copies
    _fold_past: tuple[int, pa.Table] | None = field(default=None, init=False, repr=False)
    _carriers_past: tuple[int, tuple[np.ndarray, np.ndarray]] | None = field(default=None, init=False, repr=False)
    _activity: pa.Table | None = field(default=None, init=False, repr=False)
    _lineage: tuple | None = field(default=None, init=False, repr=False)
    _lookup: RunLookup | None = field(default=None, init=False, repr=False)
    _block_newest: tuple[int, np.ndarray] | None = field(default=None, init=False, repr=False)  # (block size, maxima)
    _cells: dict[str, Cells] = field(default_factory=dict, init=False, repr=False)  # by column: :meth:`rows`

    @property
    def n(self) -> int:
        return self.records.num_rows

    def _links(self, rows: np.ndarray | None = None) -> list[supersession.Link]:
        r = self.records
        has = pc.or_(pc.is_valid(r.column("supersedes")), pc.is_valid(r.column("supersededBy")))
        sub = r.filter(has).select(["runId", "endedAt", "supersedes", "supersededBy"])
        ended = sub.column("endedAt").cast(pa.int64()).to_pylist()
        return list(zip(sub.column("runId").to_pylist(), ended, sub.column("supersedes").to_pylist(),
                        sub.column("supersededBy").to_pylist()))

    def _ended_of(self, ids: list[str]) -> list[int | None]:
        """endedAt of each run id (None for ids with no record)."""
        pos = pc.index_in(pa.array(ids, pa.string()), value_set=self.records.column("runId")).to_pylist()
        ended = self.ended_ms()
        return [None if p is None else int(ended[p]) for p in pos]

    def supersession(self, as_of: int | None = None) -> dict[str, str]:
        """superseded runId -> direct correction, by cybmem.store.supersession's rule (as of a moment)."""
        if as_of not in self._supersession:
            links = self._links() if self.n else []
            self._supersession[as_of] = supersession.resolve(links, self._ended_of, as_of=as_of) if links else {}
        return self._supersession[as_of]

    def candidates(self, as_of: int | None = None) -> np.ndarray:
        """Records that retrieval may return: existing at ``as_of`` and not superseded as of then."""
        if as_of is None and self._visible_now is not None:
            return self._visible_now.copy()  # the corrections' lookup over every run id is done once
        mapping = self.supersession(as_of)
        mask = np.ones(self.n, dtype=bool) if as_of is None else self.ended_ms() <= as_of
        if mapping:
            hidden = pc.is_in(self.records.column("runId"), value_set=pa.array(list(mapping), pa.string()))
            mask &= ~hidden.to_numpy(zero_copy_only=False)
            if as_of is None:
                self._visible_now = mask.copy()
        return mask

    def superseded_mask(self) -> np.ndarray:
        """True for records that a later record supersedes."""
        return ~self.candidates() if self.n else np.zeros(0, dtype=bool)

    @functools.cached_property
    def _ended(self) -> np.ndarray:
        return self.records.column("endedAt").cast(pa.int64()).to_numpy() if self.n else np.zeros(0, np.int64)

    def ended_ms(self) -> np.ndarray:
        """endedAt as int64 epoch ms (computed once per snapshot)."""
        return self._ended

    @functools.cached_property
    def _newest(self) -> np.ndarray:
        return np.lexsort((-np.arange(self.n), -self.ended_ms())) if self.n else np.zeros(0, np.int64)

    def newest_first(self) -> np.ndarray:
        """Row indices by endedAt, newest first (ties: higher row first); computed once."""
        return self._newest

    @functools.cached_property
    def in_time_order(self) -> bool:
        """Whether a higher row never ended earlier (as a load orders them; a table built
        otherwise, or a refresh that appended a run that ended before the last, may not)."""
        ended = self.ended_ms()
        return bool(np.all(ended[1:] >= ended[:-1]))

    def newest_in_blocks(self, block: int) -> np.ndarray:
        """The latest endedAt (epoch ms) of each ``block`` consecutive rows, the last, shorter block
        included: what a ranking bounds a block's recency by. Kept for the last block size asked."""
        if self._block_newest is None or self._block_newest[0] != block:
            ended = self.ended_ms()
            starts = np.arange(0, len(ended), block)
            self._block_newest = (block, np.maximum.reduceat(ended, starts) if len(ended) else ended)
        return self._block_newest[1]

    def prepare(self) -> "Snapshot":
        """Build the per-snapshot lookups that pay off over many queries (returns self).

        The lineage id columns as codes (:class:`~cybmem.store.keyword_index.IdColumn`: the rows of a
        chain's root or a chat session without a pass over every record, an id at a row without an
        Arrow call), and a sorted run-id lookup that makes the ancestor walk O(depth log N);
        both cost a little once (benchmarks/RESULTS.md, "Figures the module docstrings
        quoted"). A one-shot query (the CLI) is cheaper without
        them, so they are built only when a long-lived caller (widget, tuning, benchmark) asks.
        """
        if self._lineage is None:
            self._lookup = RunLookup.build(self.records.column("runId"))
            self._lineage = tuple(
                # run ids stay Arrow (the RunLookup indexes them); no lineage rule reads previousRunId
                self.records.column(n) if n in ("runId", "previousRunId") else IdColumn(self.records.column(n))
                for n in ("runId", "parentRunId", "previousRunId", "rootRunId", "chatSessionId")
            )
        return self

    def current(self) -> bool:
        """True while the files this snapshot was read from are unchanged: the cache's freshness
        rule (:func:`cybmem.store.cache.is_fresh`: records/' mtime, the ledger's size, mtime and inode;
        a records/ mtime too close to the scan is never trusted) and, when it was loaded under
        :func:`holding_snapshots`, embeddings.jsonl's stat. Always False for a snapshot read
        without the cache (nothing records what it was read from)."""
        if self.manifest is None or self.store is None:
            return False
        if self.watches_embeddings and self.embeddings_stat != _cache.ledger_stat(self.store.embeddings_path):
            return False
        return _cache.is_fresh(self.store.records_dir, self.store.issues_path, self.manifest)

    def resolve_run_id(self, prefix: str) -> str:
        """The run id ``prefix`` names (exact, or a unique prefix), found among this snapshot's
        records without listing records/ (tens of ms for thousands of files); when the snapshot
        has no single match, :meth:`MemoryStore.resolve_run_id` decides, with its messages."""
        text = (prefix or "").strip()
        if text and self.n:
            ids = self.records.column("runId")
            if pc.any(pc.equal(ids, text)).as_py():
                return text
            hits = ids.filter(pc.starts_with(ids, text))
            if len(hits) == 1:
                return hits[0].as_py()
        return self.store.resolve_run_id(prefix)

    def resolve_link(self, run_id: str | None) -> str | None:
        """The run a lineage id given to dispatch names (``--parent``, CYBERINE_PARENT_RUN_ID).

        An id shorter than every run id of the project can only be an abbreviation, such as the
        8 characters the MEMORY block prints: it is resolved as ``cybmem show`` resolves one
        (:meth:`resolve_run_id`). Any other id is a whole id, taken as given: a run with a
        record, or one not recorded yet (a parent still running) or of another project.

        Raises:
            NotFoundError: an abbreviation that starts no run id of the project.
            AmbiguousError: an abbreviation that starts several.
        """
        text = (run_id or "").strip()
        if not text:
            return None
        ids = self.records.column("runId")
        if not self.n or len(text) >= pc.min(pc.utf8_length(ids)).as_py():
            return text
        return self.resolve_run_id(text)

    def lineage_columns(self) -> tuple:
        """runId, parentRunId, previousRunId, rootRunId, chatSessionId (encoded after :meth:`prepare`)."""
        if self._lineage is not None:
            return self._lineage
        return tuple(self.records.column(n) for n in ("runId", "parentRunId", "previousRunId", "rootRunId", "chatSessionId"))

    def run_lookup(self) -> RunLookup | None:
        """The sorted run-id lookup built by :meth:`prepare`, else None (the kernel scans)."""
        return self._lookup

    @staticmethod
    def _read_file(path: Path | None, schema: pa.Schema | None = None) -> pa.Table | None:
        """A cache file of :attr:`files`, or None when there is none, it cannot be read or it is
        not a table of ``schema`` (another cache file copied over it): the caller computes the
        table instead."""
        if path is None:
            return None
        try:
            table = _cache.read_table(path)
        except (OSError, pa.ArrowException):
            return None
        return table if schema is None or table.schema.equals(schema) else None

    @functools.cached_property
    def _fold_file(self) -> pa.Table | None:
        """The current fold as the cache holds it (fold.arrow), or None."""
        return self._read_file(self.files.fold, issues.schemas()[1])

    @functools.cached_property
    def _fold(self) -> pa.Table:
        return self._fold_file if self._fold_file is not None else issues.fold_table(self.events)

    def fold(self, as_of: int | None = None) -> pa.Table:
        """The issue fold (cybmem.store.ledger.fold_table), as of a moment; the current one is cached."""
        if as_of is not None:  # the last past moment asked for is kept (a replay asks for it several times)
            if self._fold_past is None or self._fold_past[0] != as_of:
                self._fold_past = (as_of, issues.fold_table(self.events, as_of_ms=as_of))
            return self._fold_past[1]
        return self._fold

    @functools.cached_property
    def _issue_index(self) -> KeywordIndex:
        folded = self.fold()
        index = None
        # kwi.arrow is written with fold.arrow: it is row-aligned with the fold only when that was read too
        table = self._read_file(self.files.issue_index) if self._fold_file is not None else None
        if table is not None:
            try:
                index = KeywordIndex.from_arrow(table)
            except (ValueError, pa.ArrowException):
                index = None
        if index is None or index.n_docs != folded.num_rows:
            index = _issue_index(folded)
        return index

    def issue_index(self) -> KeywordIndex:
        """A keyword index over every issue's title and detail, row-aligned with :meth:`fold`
        (cached with the snapshot; the open-issue ranking of cybmem.retrieval.issue_ranking uses it)."""
        return self._issue_index

    def open_rows(self, as_of: int | None = None) -> np.ndarray:
        """The rows of :meth:`fold` (``as_of``) whose issue is open, newest opened first (ties by
        id) (:func:`open_rows`). The current ones come with the cached activity when there is one."""
        if as_of is None and (self._activity is not None or self.files.activity is not None):
            return opened_in(self.activity())
        return open_rows(self.fold(as_of))

    def open_issues(self, as_of: int | None = None) -> pa.Table:
        """Open issues of :meth:`fold`, newest opened first (ties by id)."""
        return self.fold(as_of).take(pa.array(self.open_rows(as_of)))

    def activity(self, as_of: int | None = None, carriers_ok: np.ndarray | None = None) -> pa.Table:
        """:func:`issue_activity` of :meth:`fold` (``as_of``), runs counted where ``carriers_ok``
        (default: :meth:`candidates`). The current one is cached with the snapshot (act-N.arrow):
        dispatch reads it instead of matching every record's issues on every call."""
        default = carriers_ok is None
        if default:
            carriers_ok = self.candidates(as_of)
        if as_of is None and (default or np.array_equal(carriers_ok, self.candidates(None))):
            if self._activity is None:
                table = self._read_file(self.files.activity, ACTIVITY_SCHEMA)
                if table is None or table.num_rows != self.fold().num_rows:
                    table = issue_activity(self.records, self.fold(), carriers_ok, self.ended_ms(), self.carriers())
                self._activity = table
            return self._activity
        return issue_activity(self.records, self.fold(as_of), carriers_ok, self.ended_ms(), self.carriers(as_of))

    def carriers(self, as_of: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """:func:`issue_carriers` of :meth:`fold` (``as_of``) as two int64 arrays (carrying
        record row, fold row or -1). The current one is cached with the snapshot (car-N.arrow):
        dispatch finds the open issues its best runs carry without matching ids on every call."""
        if as_of is None:
            return self._carriers
        if self._carriers_past is None or self._carriers_past[0] != as_of:  # the last past moment asked for
            self._carriers_past = (as_of, _arrays(issue_carriers(self.records, self.fold(as_of))))
        return self._carriers_past[1]

    @functools.cached_property
    def _carriers(self) -> tuple[np.ndarray, np.ndarray]:
        table = self._read_file(self.files.carriers, CARRIERS_SCHEMA)
        col = self.records.column("issues")
        flat = sum(c.offsets[-1].as_py() - c.offsets[0].as_py() for c in col.chunks if len(c))
        if table is None or table.num_rows != flat:
            table = issue_carriers(self.records, self.fold())
        return _arrays(table)

    def stale_rows(self, rows: Iterable[int]) -> list[int]:
        """The rows whose record file changed after this snapshot read it: the file is gone, has
        another inode, or was modified since (an in-place edit, e.g. a hand edit that removes a
        secret; append-only writers never do it). Costs one lstat per row: meant for the rows a
        verb shows, which :func:`load_snapshot` then re-reads with ``recheck``.

        A file whose mtime is at or after the moment its row was read, less :data:`cybmem.store.cache.RACY_NS`
        (a coarse clock can stamp an edit made just after the read with a time just before it),
        may have changed or not: it is read again and is stale only when its row now differs. A
        record written a moment before a cache refresh (an inject right after a write) is such a
        file for as long as its segment stays; it is not an edit, and reporting it as one was
        doctor's false "edited in place"."""
        starts, built = self.read_times or (np.zeros(1, np.int64), np.array([time.time_ns()], np.int64))
        rows = np.asarray(list(rows), dtype=np.int64)
        if not len(rows):
            return []
        if len(rows) <= FEW_ROWS:  # the hits a verb shows: from the buffers, no Arrow call
            ids, inodes = self._values(rows.tolist(), "runId"), self._values(rows.tolist(), "inode")
        else:
            picked = take_rows(self.records.select([c for c in ("runId", "inode") if c in self.records.column_names]), rows)
            ids = picked.column("runId").to_pylist()
            inodes = picked.column("inode").to_pylist() if "inode" in picked.column_names else [None] * len(rows)
        since = built[np.searchsorted(starts, rows, side="right") - 1] - _cache.RACY_NS  # when each row was read
        out = []
        maybe: list[tuple[int, str, int]] = []  # (row, file name, inode): touched around or after the read
        records_dir = str(self.store.records_dir)
        for r, rid, ino, t in zip(rows.tolist(), ids, inodes, since.tolist()):
            try:
                st = os.lstat(f"{records_dir}/{rid}.json")
            except OSError:
                out.append(r)
                continue
            if ino and st.st_ino != ino:
                out.append(r)
            elif st.st_mtime_ns >= t:
                maybe.append((r, f"{rid}.json", st.st_ino))
        if maybe:
            fresh, _texts, _bad, _problems = parse_files(self.store, [(name, ino) for _, name, ino in maybe], {})
            now = {row["runId"]: row for row in fresh.to_pylist()}
            then = take_rows(self.records, [r for r, _, _ in maybe]).to_pylist()
            out += [r for (r, name, _), row in zip(maybe, then) if now.get(name[:-5]) != row]
        return sorted(out)

    def rows(self, indices: list[int], columns: list[str]) -> list[dict]:
        """Some rows as dicts, only the given columns (cheap for a top-k: a few rows are read
        cell by cell from the columns' buffers, :class:`~cybmem.store.arrow_records.Cells`)."""
        if not indices:
            return []
        if len(indices) > FEW_ROWS:
            return take_rows(self.records.select(columns), indices).to_pylist()
        rows = [int(i) for i in indices]
        values = [self._values(rows, c) for c in columns]
        return [dict(zip(columns, cells)) for cells in zip(*values)]

    def _values(self, rows: list[int], column: str) -> list:
        """``column``'s values at ``rows`` (None each when the table has no such column)."""
        cells = self._cells.get(column)
        if cells is None:
            if column not in self.records.column_names:
                if column == "inode":  # a table written before inodes were kept
                    return [None] * len(rows)
                raise KeyError(column)
            cells = self._cells[column] = Cells(self.records.column(column))
        return cells.take(rows)


# --- loading and the cache -------------------------------------------------------------


def _concat_indexes(parts: list[KeywordIndex]) -> KeywordIndex:
    return parts[0] if len(parts) == 1 else KeywordIndex.concat(parts)


_LEDGER_TAIL = 64  # bytes before the consumed offset kept in the manifest: an edit there is seen


def _ledger_tail(store: MemoryStore, consumed: int) -> str | None:
    """The hex of the last bytes folded so far (checked before folding only what was appended)."""
    if not consumed:
        return None
    start = max(consumed - _LEDGER_TAIL, 0)
    try:
        return _io.read_file(store.issues_path, limit=MAX_LEDGER_BYTES, offset=start)[: consumed - start].hex()
    except (OSError, StoreError):
        return None


def _read_ledger_all(store: MemoryStore, problems: list[ReadProblem]) -> bytes:
    """The ledger's bytes; an unreadable ledger is reported in ``problems`` and read as empty, so
    retrieval still works on the records (the issues are missing, and every verb says why)."""
    try:
        return store.ledger_bytes()
    except StoreError as exc:
        problems.append(ReadProblem(str(store.issues_path), f"{exc}; issues are left out"))
        return b""


def _build_full(store: MemoryStore, listing: dict[str, int] | None = None) -> tuple[pa.Table, pa.Table, KeywordIndex, dict[str, int], list[ReadProblem], int, int]:
    """Parse the whole project (``listing``: records/ as just listed, else listed here)."""
    led_problems: list[ReadProblem] = []
    raw = _read_ledger_all(store, led_problems)
    events, consumed, lines, problems = _parse_ledger(raw, 1, store.issues_path)
    problems = led_problems + problems
    if listing is None:
        listing = store.listing()
    later = ("every read of a root with .nocache does this" if _cache.disabled(store.root)
             else "once; later reads use the cache")
    notice = Notice(f"cybmem: indexing {len(listing)} records of project {store.slug} ({later})", _PROGRESS_AFTER_S)
    try:
        table, texts, bad, rec_problems = load_records(store, sorted(listing.items()), issue_texts(events))
        index = KeywordIndex.build(tokenize_arrow(texts))
    finally:
        notice.done()
    return table, events, index, bad, problems + rec_problems, consumed, lines


def _segments(cache, manifest: _cache.Manifest) -> tuple[pa.Table, KeywordIndex, pa.Table]:
    """The cached records, their keyword index and the ledger's events. A file that is readable
    Arrow but not what the manifest lists (another cache file copied over it, a restore from
    another copy) raises ValueError, as a damaged one does: the cache is rebuilt, never used."""
    rec = [_cache.read_table(cache / s["rec"]) for s in manifest.segments]
    kw = [KeywordIndex.from_arrow(_cache.read_table(cache / s["kw"])) for s in manifest.segments]
    for seg, table, index in zip(manifest.segments, rec, kw):
        if not table.schema.equals(RECORD_SCHEMA) or not table.num_rows == index.n_docs == seg["rows"]:
            raise ValueError(f"{seg['rec']} and {seg['kw']} do not hold the {seg['rows']} records the cache manifest lists")
    events = _cache.read_table(cache / "events.arrow") if (cache / "events.arrow").exists() else issues.events_table([])
    if not events.schema.equals(issues.schemas()[0]):
        raise ValueError("events.arrow does not hold the issue ledger's events")
    records = pa.concat_tables(rec) if rec else empty_table()
    index = _concat_indexes(kw) if kw else KeywordIndex.build([])
    return records, index, events


def _problems_of(manifest: _cache.Manifest) -> list[ReadProblem]:
    return [ReadProblem(p, m) for p, m in manifest.problems]


def _snapshot(store, records, events, index, problems, cache, *, from_cache: bool, parsed: int,
              manifest: _cache.Manifest | None = None, read_at: int | None = None) -> Snapshot:
    files = CacheFiles()
    if cache is not None and from_cache:
        files = CacheFiles(fold=cache / "fold.arrow", issue_index=cache / "kwi.arrow",
                           activity=cache / manifest.act if manifest is not None and manifest.act else None,
                           carriers=cache / manifest.carry if manifest is not None and manifest.carry else None)
    # When each row's record file was read: its segment's write time (for stale_rows).
    read_times = None
    if manifest is not None and manifest.segments:
        try:
            times = [os.stat(cache / seg["rec"]).st_mtime_ns for seg in manifest.segments]
            starts = np.cumsum([0] + [seg["rows"] for seg in manifest.segments[:-1]])
            read_times = (np.asarray(starts, np.int64), np.asarray(times, np.int64))
        except OSError:
            pass
    elif read_at is not None:
        read_times = (np.zeros(1, np.int64), np.array([read_at], np.int64))
    return Snapshot(store, records, events, index, problems, from_cache=from_cache, parsed=parsed,
                    manifest=manifest, files=files, read_times=read_times)


def _load_warm(store: MemoryStore, cache) -> Snapshot | None:
    manifest = _cache.Manifest.read(cache)
    if manifest is None or not _cache.is_fresh(store.records_dir, store.issues_path, manifest):
        return None
    records, index, events = _segments(cache, manifest)
    return _snapshot(store, records, events, index, _problems_of(manifest), cache, from_cache=True, parsed=0,
                     manifest=manifest)


def _issue_index(folded: pa.Table) -> KeywordIndex:
    """A keyword index over the issues of a fold (title and detail), row-aligned with it."""
    texts = [issue_text(t, d) for t, d in zip(folded.column("title").to_pylist(), folded.column("detail").to_pylist())]
    return KeywordIndex.build(tokenize_arrow(texts))


def _write_events(cache, manifest: _cache.Manifest, events: pa.Table) -> None:
    """The cached ledger, its fold and the fold's keyword index, written together."""
    folded = issues.fold_table(events)
    _cache.write_table(cache / "events.arrow", events)
    _cache.write_table(cache / "fold.arrow", folded)
    _cache.write_table(cache / "kwi.arrow", _issue_index(folded).to_arrow())


def _write_activity(store: MemoryStore, cache, manifest: _cache.Manifest, records: pa.Table, events: pa.Table,
                    index: KeywordIndex) -> None:
    """The current fold's issue activity and carriers (:func:`issue_activity`, :func:`issue_carriers`),
    written with the manifest."""
    fold = cache / "fold.arrow"
    snap = Snapshot(store, records, events, index, files=CacheFiles(fold=fold if fold.exists() else None))
    carried = issue_carriers(records, snap.fold())
    table = issue_activity(records, snap.fold(), snap.candidates(None), snap.ended_ms(), _arrays(carried))
    manifest.act, manifest.carry = manifest.new_file("act"), manifest.new_file("car")
    _cache.write_table(cache / manifest.act, table)
    _cache.write_table(cache / manifest.carry, carried)


def _start_over(store: MemoryStore, cache, scanned_at: int, listing: dict[str, int] | None = None) -> Snapshot:
    table, events, index, bad, problems, consumed, lines = _build_full(store, listing)
    led = _cache.ledger_stat(store.issues_path) or {"size": 0, "mtime_ns": 0, "ino": 0}
    manifest = _cache.Manifest()
    seg = {"rec": manifest.new_file("rec"), "kw": manifest.new_file("kw"), "rows": table.num_rows}
    _cache.write_table(cache / seg["rec"], table)
    _cache.write_table(cache / seg["kw"], index.to_arrow())
    manifest.segments = [seg]
    manifest.bad = bad
    manifest.ledger = {"size": consumed, "mtime_ns": led["mtime_ns"] if consumed == led["size"] else None,
                       "ino": led["ino"], "lines": lines, "tail": _ledger_tail(store, consumed)}
    _write_events(cache, manifest, events)
    _write_activity(store, cache, manifest, table, events, index)
    manifest.problems = [[p.path, p.message] for p in problems]
    manifest.publish(cache, store.records_dir, scanned_at)
    snap = _snapshot(store, table, events, index, problems, cache, from_cache=False, parsed=table.num_rows,
                     read_at=scanned_at)
    snap.files = CacheFiles(activity=cache / manifest.act, carriers=cache / manifest.carry)
    snap.manifest = manifest
    return snap


def _patch_replaced(store: MemoryStore, cache, manifest: _cache.Manifest, records: pa.Table,
                    replaced: list[tuple[int, str, int]], events: pa.Table) -> pa.Table | None:
    """Re-read records replaced by rename and patch their rows in their segments.

    Returns the patched records table, or None when a replacement changed a row's keyword text or
    cannot be read (then the cache starts over: the index must change too).
    """
    names = [(name, ino) for _, name, ino in replaced]
    rows = [row for row, _, _ in replaced]
    titles = issue_texts(events, sorted({i for lst in records.take(pa.array(rows)).column("issues").to_pylist() for i in lst or ()}))
    new, texts, bad, _ = parse_files(store, names, titles)
    if bad or new.num_rows != len(names):
        return None
    if not keyword_text_array(records.take(pa.array(rows)), titles).equals(texts):
        return None
    starts = np.cumsum([0] + [s["rows"] for s in manifest.segments])
    by_segment: dict[int, list[tuple[int, int]]] = {}
    for j, row in enumerate(rows):
        seg = int(np.searchsorted(starts, row, side="right") - 1)
        by_segment.setdefault(seg, []).append((row - int(starts[seg]), j))
    for seg, hits in by_segment.items():
        table = _cache.read_table(cache / manifest.segments[seg]["rec"])
        take = np.arange(table.num_rows, dtype=np.int64)
        for local, j in hits:
            take[local] = table.num_rows + j
        patched = pa.concat_tables([table, new]).take(pa.array(take))
        name = manifest.new_file("rec")
        _cache.write_table(cache / name, patched)
        manifest.segments[seg] = {**manifest.segments[seg], "rec": name}
    return pa.concat_tables([_cache.read_table(cache / s["rec"]) for s in manifest.segments])


def _refresh(store: MemoryStore, cache, recheck: Sequence[str] = ()) -> Snapshot:
    ensure_dir(cache)
    with locked(cache / ".lock"):
        manifest = _cache.Manifest.read(cache)
        if manifest is not None and not recheck and _cache.is_fresh(store.records_dir, store.issues_path, manifest):
            records, index, events = _segments(cache, manifest)  # another process just refreshed
            return _snapshot(store, records, events, index, _problems_of(manifest), cache, from_cache=True, parsed=0,
                             manifest=manifest)
        scanned_at = time.time_ns()
        listing = store.listing()
        if manifest is None:
            return _start_over(store, cache, scanned_at, listing)
        try:
            records, index, events = _segments(cache, manifest)
        except (OSError, ValueError, KeyError, pa.ArrowException):
            return _start_over(store, cache, scanned_at, listing)
        changes = _cache.listing_changes(records, listing)
        if changes.vanished:
            return _start_over(store, cache, scanned_at, listing)  # a record vanished: append-only was broken
        if recheck:  # edited in place (same inode): read again like a replaced file
            known = {row for row, _, _ in changes.replaced}
            at = pc.index_in(pa.array(list(recheck), pa.string()), value_set=records.column("runId")).to_pylist()
            changes.replaced += [(row, f"{rid}.json", listing[f"{rid}.json"]) for rid, row in zip(recheck, at)
                                 if row is not None and row not in known and f"{rid}.json" in listing]

        # The ledger from its last offset (from the start if it was replaced).
        problems = _problems_of(manifest)
        led = _cache.ledger_stat(store.issues_path) or {"size": 0, "mtime_ns": 0, "ino": 0}
        prev = manifest.ledger
        # Appended to, not rewritten: the same file, not shorter, and when no longer, not touched
        # (a same-length edit of a line changes the mtime only); the bytes read last time are
        # checked below when it grew.
        same_file = prev.get("ino") == led["ino"] and led["size"] >= prev.get("size", 0) and not (
            led["size"] == prev.get("size", 0) and prev.get("mtime_ns") is not None and led["mtime_ns"] != prev["mtime_ns"])
        problems = [p for p in problems if p.path != str(store.issues_path)]
        unreadable: list[ReadProblem] = []
        raw_all = None
        if same_file and led["size"] > prev.get("size", 0):
            raw_all = _read_ledger_all(store, unreadable)
            start = prev.get("size", 0)
            if prev.get("tail") is not None and raw_all[max(start - _LEDGER_TAIL, 0):start].hex() != prev["tail"]:
                same_file = False  # what was read before changed: fold it all again
        if not same_file:
            events, consumed, lines, led_problems = _parse_ledger(_read_ledger_all(store, unreadable), 1, store.issues_path)
            led_problems = unreadable + led_problems
            problems = [p for p in problems if ".jsonl:" not in p.path]
        elif led["size"] > prev.get("size", 0):
            raw = raw_all[prev.get("size", 0):]
            more, consumed, lines, led_problems = _parse_ledger(raw, prev.get("lines", 0) + 1, store.issues_path)
            led_problems = unreadable + led_problems
            consumed += prev.get("size", 0)
            lines += prev.get("lines", 0)
            if more.num_rows:
                events = pa.concat_tables([events, more]).combine_chunks()
            problems = [p for p in problems if "torn last line" not in p.message]
        else:
            consumed, lines, led_problems = prev.get("size", 0), prev.get("lines", 0), []
        problems += [p for p in led_problems if p not in problems]
        if (consumed, lines) != (prev.get("size", 0), prev.get("lines", 0)) or not same_file:
            _write_events(cache, manifest, events)
        manifest.ledger = {"size": consumed, "mtime_ns": led["mtime_ns"] if consumed == led["size"] else None,
                           "ino": led["ino"], "lines": lines, "tail": _ledger_tail(store, consumed)}

        if changes.replaced:
            patched = _patch_replaced(store, cache, manifest, records, changes.replaced, events)
            if patched is None:
                return _start_over(store, cache, scanned_at, listing)
            records = patched

        # Everything listed that is neither cached nor a known-bad file (with the same inode) is new.
        new = sorted(e for e in changes.added if manifest.bad.get(e[0]) != e[1])
        for name in [n for n in manifest.bad if listing.get(n) != manifest.bad[n]]:
            manifest.bad.pop(name)
            problems = [p for p in problems if not p.path.endswith(os.sep + name)]
        parsed = 0
        if new:
            seg_table, texts, bad, rec_problems = load_records(store, new, {})
            if seg_table.num_rows:
                # Issue titles for the keyword text: only the few ids these records raise.
                titles = issue_texts(events, _record_issue_ids(seg_table))
                texts = keyword_text_array(seg_table, titles) if titles else texts
            manifest.bad.update(bad)
            problems += rec_problems
            if seg_table.num_rows:
                seg_index = KeywordIndex.build(tokenize_arrow(texts))
                parsed = seg_table.num_rows
                records = pa.concat_tables([records, seg_table])
                index = _concat_indexes([index, seg_index])
                if len(manifest.segments) >= _cache.MAX_SEGMENTS:
                    records = records.combine_chunks()
                    index = index.compact()
                    seg = {"rec": manifest.new_file("rec"), "kw": manifest.new_file("kw"), "rows": records.num_rows}
                    _cache.write_table(cache / seg["rec"], records)
                    _cache.write_table(cache / seg["kw"], index.to_arrow())
                    manifest.segments = [seg]
                else:
                    seg = {"rec": manifest.new_file("rec"), "kw": manifest.new_file("kw"), "rows": seg_table.num_rows}
                    _cache.write_table(cache / seg["rec"], seg_table)
                    _cache.write_table(cache / seg["kw"], seg_index.to_arrow())
                    manifest.segments.append(seg)
        _write_activity(store, cache, manifest, records, events, index)
        manifest.problems = [[p.path, p.message] for p in problems]
        manifest.publish(cache, store.records_dir, scanned_at)
        return _snapshot(store, records, events, index, problems, cache, from_cache=True, parsed=parsed,
                         manifest=manifest)


#: Snapshots kept by :func:`holding_snapshots`: cache dir -> the snapshot last loaded from it.
_HELD: dict = {}
_HOLDERS = 0
_HELD_LOCK = threading.Lock()


@contextlib.contextmanager
def holding_snapshots() -> Iterator[None]:
    """Within it, :func:`load_snapshot` gives back the snapshot it last loaded for a project for as
    long as it is :meth:`~Snapshot.current`, with its warm state (the lookups of
    :meth:`Snapshot.prepare`, the issue fold and index, the vectors): what a long-lived reader
    (``cybmem mcp``) keeps between calls, so that a call costs milliseconds. A write by any
    process makes the next load refresh the cache as usual. May be nested and entered from
    several threads; the snapshots are let go when the last one leaves.
    """
    global _HOLDERS
    with _HELD_LOCK:
        _HOLDERS += 1
    try:
        yield
    finally:
        with _HELD_LOCK:
            _HOLDERS -= 1
            if not _HOLDERS:
                _HELD.clear()


def load_snapshot(store: MemoryStore, *, use_cache: bool = True, recheck: Iterable[str] = ()) -> Snapshot:
    """Load a project's memory, refreshing its Arrow cache incrementally.

    Args:
        store: the project's store.
        use_cache: False parses everything and neither reads nor writes the cache (as does a
            memory root holding a ``.nocache`` file, :data:`cybmem.store.cache.NO_CACHE_FILE`).
        recheck: run ids whose files changed in place (:meth:`Snapshot.stale_rows`): they are
            read again, and a record that no longer parses is dropped with a problem.

    Returns:
        A :class:`Snapshot`; unreadable records and ledger lines are listed in ``problems``
        (each once) and skipped.

    Raises:
        StoreError: records/ or the ledger cannot be read at all.
    """
    recheck = sorted(set(recheck))
    if not (_HOLDERS and use_cache):
        return _load(store, use_cache, recheck)
    key = _cache.cache_dir(store.dir)
    with _HELD_LOCK:
        held = _HELD.get(key)
    if held is not None and not recheck and held.current():
        return held
    embeddings = _cache.ledger_stat(store.embeddings_path)  # before the load: a later change is seen
    snap = _load(store, use_cache, recheck)
    if snap.manifest is not None:  # read through the cache: it can tell when it goes stale
        snap.embeddings_stat, snap.watches_embeddings = embeddings, True
        snap.prepare()
        with _HELD_LOCK:
            if _HOLDERS:
                _HELD[key] = snap
    return snap


def _load(store: MemoryStore, use_cache: bool, recheck: list[str]) -> Snapshot:
    cache = _cache.cache_dir(store.dir)
    linked = store.symlinked_dirs()
    if not use_cache or _cache.disabled(store.root) or linked:
        read_at = time.time_ns()
        table, events, index, _bad, problems, _, _ = _build_full(store)
        problems += [ReadProblem(str(d), f"{d} is a symbolic link; the cache is neither read nor written through it "
                                         "(remove the link, see `cybmem doctor`)") for d in linked if d == cache]
        snap = _snapshot(store, table, events, index, problems, None, from_cache=False, parsed=table.num_rows,
                         read_at=read_at)
        snap.uncached = True  # derived layers (cybmem.retrieval.vector_cache) stay in memory too
        return snap
    for attempt in range(3):
        try:
            try:
                snap = None if recheck else _load_warm(store, cache)
            except (pa.ArrowException, ValueError, KeyError, TypeError, StoreError):
                # A damaged cache file, or one that is no regular file (a FIFO: _io's one rule
                # refused it unread): rebuild it.
                snap = None
                _cache.discard(cache)
            if snap is not None:
                return snap
            return _refresh(store, cache, recheck)
        except StoreError:
            raise  # the store itself (records/, the ledger) cannot be read: say so
        except FileNotFoundError:
            # A concurrent compaction removed a segment between manifest and read: retry.
            if attempt == 2:
                raise
        except OSError:
            # The cache cannot be written (a read-only store, a full disk, .cache not a dir):
            # memory still works, parsed in memory.
            return _load(store, False, [])
    raise AssertionError("unreachable")


def cache_problem(store: MemoryStore) -> str | None:
    """Why a load would not use the cache's segments and events (the checks it makes of them: see
    ``_segments``), or None when it would (or there is no readable manifest: cache.check says so)."""
    cache = _cache.cache_dir(store.dir)
    manifest = _cache.Manifest.read(cache)
    if manifest is None:
        return None
    try:
        _segments(cache, manifest)
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def cached_snapshot(store: MemoryStore) -> Snapshot | None:
    """The snapshot the cache holds when it is fresh, read without writing anything (doctor's
    view); None when there is no fresh cache."""
    cache = _cache.cache_dir(store.dir)
    if store.symlinked_dirs() or _cache.disabled(store.root):
        return None
    try:
        return _load_warm(store, cache)
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None


def verified(snap: Snapshot, rows: Iterable[int]) -> Snapshot:
    """``snap``, or a fresh load when any of ``rows`` (the ones about to be shown) changed in place
    since it was read (:meth:`Snapshot.stale_rows`): what a verb shows is what the files say now."""
    stale = snap.stale_rows(rows)
    if not stale:
        return snap
    ids = snap.records.column("runId").take(pa.array(stale, pa.int64())).to_pylist()
    return load_snapshot(snap.store, use_cache=not snap.uncached, recheck=ids)
