"""A project's memory as Arrow columns at one moment: the read model every reader ranks and shows.

A :class:`Snapshot` holds the records (one row per record, lineage and outcome flattened,
timestamps ``timestamp[ms, UTC]``, lists as Arrow lists; rows ordered oldest first: endedAt, then
runId, so a higher row is a newer record), the ledger's events and the keyword index over task +
summary + issue titles. What is derived from them (supersession, the issue fold and its tables,
the lineage lookups) is computed on first use and kept with the snapshot, or read from the cache
files it was loaded with. The search hot path works on these tables with numpy and never imports
pandas (``cybmem.explore.frames`` has the pandas views).

Loading one is :func:`cybmem.store.loading.load_snapshot` (the cache's incremental refresh:
:mod:`cybmem.store.refresh`); the issue tables are :mod:`cybmem.store.issue_tables`. Their public
names are importable from here too, as they were before the split.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import cache as _cache, ledger, supersession
from ..arrow_numpy import array_of, numpy_of, pylist, scalar, strings  # not pa.array / to_numpy: they import pandas
from .arrow_records import RECORD_SCHEMA, FEW_ROWS, Cells, parse_files, take_rows
from .issue_tables import (ACTIVITY_SCHEMA, CARRIERS_SCHEMA, carrier_arrays, issue_activity, issue_carriers, issue_index,
                           issue_texts, open_rows, opened_in)
from .keyword_index import KeywordIndex
from .run_ids import IdColumn, RunLookup
from .memory_store import MemoryStore, ReadProblem

__all__ = ["RECORD_SCHEMA", "Snapshot", "CacheFiles", "load_snapshot", "holding_snapshots", "issue_texts", "cache_problem"]

#: Names that were defined here before the split, still importable from here: the module that has them.
_MOVED = {"load_snapshot": "loading", "holding_snapshots": "loading", "verified": "loading",
          "cached_snapshot": "refresh", "cache_problem": "refresh"}


def __getattr__(name: str):
    if name in _MOVED:  # imported on first use: those modules import this one
        import importlib

        return getattr(importlib.import_module(f"{__package__}.{_MOVED[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class CacheFiles:
    """The cache files (``.cache/``) a snapshot takes its derived tables from instead of computing
    them; None: there is none, compute it. Each is checked against the snapshot when read."""

    fold: Path | None = None  # fold.arrow: the issue fold
    issue_index: Path | None = None  # kwi.arrow: the keyword index over the fold (written with it)
    activity: Path | None = None  # act-N.arrow: the fold's issue activity
    carriers: Path | None = None  # car-N.arrow: which record carries which fold row
    checked: Path | None = None  # chk-N.arrow: rows known equal to their file since their segment's read (stale_rows)


#: how often a snapshot writes the rows it settled to the cache, at most (:meth:`Snapshot.stale_rows`)
_SAVE_EVERY_NS = 1_000_000_000


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
    #: rows known equal to their files at a moment later than their segment's read: files.checked
    #: (read when a racy row is first met), and what :meth:`stale_rows` settled since (row -> moment)
    _checked: _cache.Checked | None = field(default=None, init=False, repr=False)
    _settled: dict[int, int] = field(default_factory=dict, init=False, repr=False)
    _unsaved: list[int] = field(default_factory=list, init=False, repr=False)  # settled rows the cache has yet to keep
    _saved_at: int = field(default=0, init=False, repr=False)  # when this snapshot last wrote them (epoch ns)
    #: embeddings.jsonl's stat before the load, when :func:`~cybmem.store.loading.holding_snapshots` watches it (:meth:`current`)
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
    _ended: np.ndarray | None = field(default=None, init=False, repr=False)  # ended_ms()
    _newest: np.ndarray | None = field(default=None, init=False, repr=False)  # newest_first()
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
        pos = pc.index_in(strings(ids), value_set=self.records.column("runId")).to_pylist()
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
            hidden = pc.is_in(self.records.column("runId"), value_set=strings(list(mapping)))
            mask &= ~numpy_of(hidden)
            if as_of is None:
                self._visible_now = mask.copy()
        return mask

    def superseded_mask(self) -> np.ndarray:
        """True for records that a later record supersedes."""
        return ~self.candidates() if self.n else np.zeros(0, dtype=bool)

    def ended_ms(self) -> np.ndarray:
        """endedAt as int64 epoch ms (computed once per snapshot)."""
        if self._ended is None:  # a memo field, not a cached_property: the hot path calls it directly
            self._ended = numpy_of(self.records.column("endedAt").cast(pa.int64())) if self.n else np.zeros(0, np.int64)
        return self._ended

    def newest_first(self) -> np.ndarray:
        """Row indices by endedAt, newest first (ties: higher row first); computed once."""
        if self._newest is None:
            self._newest = np.lexsort((-np.arange(self.n), -self.ended_ms())) if self.n else np.zeros(0, np.int64)
        return self._newest

    @functools.cached_property
    def ended_utc(self) -> bool:
        """Whether endedAt is a UTC ms timestamp without nulls (a loaded table's always is,
        :data:`RECORD_SCHEMA`): then :meth:`ended_ms` counts the ms of the datetimes :meth:`rows`
        gives from the UTC epoch. Asked once per snapshot (a search's hits ask on every call)."""
        if "endedAt" not in self.records.column_names:
            return False
        col = self.records.column("endedAt")
        return col.type == pa.timestamp("ms", tz="UTC") and not col.null_count

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

        The lineage id columns as codes (:class:`~cybmem.store.run_ids.IdColumn`: the rows of a
        chain's root or a chat session without a pass over every record, an id at a row without an
        Arrow call), and a sorted run-id lookup that makes the ancestor walk O(depth log N);
        both cost a little once (benchmarks/RESULTS.md, "Figures the module docstrings
        quoted"). A one-shot query (the CLI) is cheaper without
        them, so they are built only when a long-lived caller (widget, tuning, benchmark) asks.
        """
        self.index.hold()  # impacts and wide doc ids on its second query (KeywordIndex.hold)
        if "_issue_index" in self.__dict__:  # built before (else _issue_index holds it when it is)
            self._issue_index.hold()
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
        :func:`~cybmem.store.loading.holding_snapshots`, embeddings.jsonl's stat. Always False for a snapshot read
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
            if pc.any(pc.equal(ids, scalar(text, ids.type))).as_py():
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
        if not self.n or len(text) >= self.shortest_id:
            return text
        return self.resolve_run_id(text)

    @functools.cached_property
    def shortest_id(self) -> int:
        """The length of the project's shortest run id (0 without records): a pass over every id,
        once per snapshot, not once per dispatch (0.8 ms at 100k)."""
        return pc.min(pc.utf8_length(self.records.column("runId"))).as_py() if self.n else 0

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
        return self._read_file(self.files.fold, ledger.schemas()[1])

    @functools.cached_property
    def _fold(self) -> pa.Table:
        return self._fold_file if self._fold_file is not None else ledger.fold_table(self.events)

    def fold(self, as_of: int | None = None) -> pa.Table:
        """The issue fold (cybmem.store.ledger.fold_table), as of a moment; the current one is cached."""
        if as_of is not None:  # the last past moment asked for is kept (a replay asks for it several times)
            if self._fold_past is None or self._fold_past[0] != as_of:
                self._fold_past = (as_of, ledger.fold_table(self.events, as_of_ms=as_of))
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
            index = issue_index(folded)
        return index.hold() if self._lineage is not None else index  # a prepared (held) snapshot's

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
        return self.fold(as_of).take(array_of(self.open_rows(as_of), pa.int64()))

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
            self._carriers_past = (as_of, carrier_arrays(issue_carriers(self.records, self.fold(as_of))))
        return self._carriers_past[1]

    @functools.cached_property
    def _carriers(self) -> tuple[np.ndarray, np.ndarray]:
        table = self._read_file(self.files.carriers, CARRIERS_SCHEMA)
        col = self.records.column("issues")
        flat = sum(c.offsets[-1].as_py() - c.offsets[0].as_py() for c in col.chunks if len(c))
        if table is None or table.num_rows != flat:
            table = issue_carriers(self.records, self.fold())
        return carrier_arrays(table)

    def stale_rows(self, rows: Iterable[int], *, settle: bool = True) -> list[int]:
        """The rows whose record file changed after this snapshot read it: the file is gone, has
        another inode, or was modified since (an in-place edit, e.g. a hand edit that removes a
        secret; append-only writers never do it). Costs one lstat per row: meant for the rows a
        verb shows, which :func:`~cybmem.store.loading.load_snapshot` then re-reads with ``recheck``.

        A file whose mtime is at or after the moment its row was read, less :data:`cybmem.store.cache.RACY_NS`
        (a coarse clock can stamp an edit made just after the read with a time just before it),
        may have changed or not: it is read again and is stale only when its row now differs. A
        record written a moment before a cache refresh (an inject right after a write), or every
        record of a store copied without its times (``cp -r``, a backup), is such a file.

        Found equal, the row counts as read when that check began (git's racy-git rule, as git
        refreshes its index): once the check began more than RACY_NS after the file's mtime, the
        file is not read again until its mtime moves (any later write, the same clock tick
        included, stamps it within RACY_NS of the check or after); a check within the tick settles
        nothing, and the next one reads the file again. This snapshot keeps what it settled; with
        ``settle`` (doctor's look passes False: it writes nothing) so does the cache, for the next
        process (:func:`cybmem.store.cache.settle`)."""
        checked_at = time.time_ns()  # before any lstat: a write after it is stamped at least checked_at - RACY_NS
        starts, built = self.read_times or (np.zeros(1, np.int64), np.array([checked_at], np.int64))
        rows = [int(r) for r in rows]
        if not rows:
            return []
        if len(rows) <= FEW_ROWS:  # the hits a verb shows: from the buffers, no Arrow call
            ids, inodes = self._values(rows, "runId"), self._values(rows, "inode")
        else:
            picked = take_rows(self.records.select([c for c in ("runId", "inode") if c in self.records.column_names]), rows)
            ids = picked.column("runId").to_pylist()
            inodes = picked.column("inode").to_pylist() if "inode" in picked.column_names else [None] * len(rows)
        racy = _cache.RACY_NS
        if len(starts) == 1:  # one segment (a compacted cache): every row was read at the same moment
            since = [int(built[0]) - racy] * len(rows)
        else:  # when each row was read
            since = (built[np.searchsorted(starts, rows, side="right") - 1] - racy).tolist()
        out = []
        maybe: list[tuple[int, str, int, int]] = []  # (row, file name, inode, mtime): touched around or after the read
        records_dir = str(self.store.records_dir)
        for r, rid, ino, t in zip(rows, ids, inodes, since):
            try:
                st = os.lstat(f"{records_dir}/{rid}.json")
            except OSError:
                out.append(r)
                continue
            if ino and st.st_ino != ino:
                out.append(r)
            elif st.st_mtime_ns >= t and st.st_mtime_ns >= self._checked_at(r) - racy:  # nor settled by a later check
                maybe.append((r, f"{rid}.json", st.st_ino, st.st_mtime_ns))
        if maybe:
            fresh, _texts, _bad, _problems = parse_files(self.store, [(name, ino) for _, name, ino, _ in maybe], {})
            now = {row["runId"]: row for row in pylist(fresh)}
            then = pylist(take_rows(self.records, [r for r, _, _, _ in maybe]))
            same = [now.get(name[:-5]) == row for (_, name, _, _), row in zip(maybe, then)]
            out += [r for (r, _, _, _), eq in zip(maybe, same) if not eq]
            self._settle([(r, mtime) for (r, _, _, mtime), eq in zip(maybe, same) if eq], checked_at, keep=settle)
        if self._unsaved and checked_at - self._saved_at >= _SAVE_EVERY_NS:
            self._save(checked_at)
        return sorted(out)

    def _checked_at(self, row: int) -> int:
        """The latest moment ``row`` was known equal to its file after its segment's read (0: none)."""
        at = self._settled.get(row)
        if at is not None:
            return at
        if self._checked is None:  # the cache's chk-N.arrow, read when a racy row is first met
            self._checked = _cache.read_checked(self.files.checked)
        rows, moments = self._checked
        i = int(np.searchsorted(rows, row))
        return int(moments[i]) if i < len(rows) and rows[i] == row else 0

    def _settle(self, equal: list[tuple[int, int]], checked_at: int, *, keep: bool) -> None:
        """Rows (row, file mtime) just found equal to their files in a check that began at
        ``checked_at``: they count as read then, here and (``keep``) in the cache when that
        settles them (the check began past their mtime's clock tick: :meth:`_save`)."""
        for r, _ in equal:
            self._settled[r] = max(self._checked_at(r), checked_at)
        if keep and self.manifest is not None:
            self._unsaved += [r for r, mtime in equal if mtime < checked_at - _cache.RACY_NS]

    def keep_settled(self) -> None:
        """Write to the cache what this snapshot settled since its last write (:meth:`stale_rows`
        writes at most once every :data:`_SAVE_EVERY_NS`): what a holder does when it lets the
        snapshot go (:func:`~cybmem.store.loading.holding_snapshots`)."""
        if self._unsaved:
            self._save(time.time_ns())

    def _save(self, now: int) -> None:
        """Write the rows this snapshot settled to the cache (:func:`cybmem.store.cache.settle`):
        at most once every :data:`_SAVE_EVERY_NS` (a held snapshot answering many queries
        settles a few rows each), so what it settles in between goes with its next write."""
        rows, self._unsaved, self._saved_at = np.array(sorted(set(self._unsaved)), np.int64), [], now
        if not self.store.symlinked_dirs():
            _cache.settle(_cache.cache_dir(self.store.dir), self.manifest, rows,
                          np.fromiter((self._settled[int(r)] for r in rows), np.int64, len(rows)))

    def row_of(self, run_id: str) -> int:
        """The row of the run ``run_id``, or -1: through the run-id lookup of a prepared snapshot,
        else one pass over the ids."""
        if self._lookup is not None:
            return self._lookup.find(run_id)
        ids = self.records.column("runId")
        return pc.index(ids, scalar(run_id, ids.type)).as_py()

    def task_of(self, run_id: str | None) -> str | None:
        """The task of the run ``run_id`` (None when this snapshot has no such run)."""
        row = self.row_of(run_id) if run_id else -1
        return self._values([row], "task")[0] if row >= 0 else None

    def rows(self, indices: list[int], columns: list[str]) -> list[dict]:
        """Some rows as dicts, only the given columns (cheap for a top-k: a few rows are read
        cell by cell from the columns' buffers, :class:`~cybmem.store.arrow_records.Cells`)."""
        if not indices:
            return []
        if len(indices) > FEW_ROWS:
            return pylist(take_rows(self.records.select(columns), indices))
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
