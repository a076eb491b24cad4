"""index.json and compaction: the derived projection of a project's records, kept newest first.

:class:`ProjectIndex` is the index of one :class:`~cybmem.store.memory_store.MemoryStore`, which holds
it (``store.index``): reading, checking against records/, merging, writing and compacting
index.json, and the one-line ``archive-summary.md`` of the runs compaction moved out. It reads
the records through what it is given (:class:`IndexedRecords`: the listing and one record's read)
and reports what it cannot read through the callback it is given.

index.json is one projection per record, rebuilt from records/ alone and checked against the
directory listing (names and inode numbers) on every read. Compaction keeps the newest
``index_cap`` entries (default 500, ``CYBERINE_MEMORY_INDEX_CAP``, 0 = no cap); older ones leave
on the next update and collapse into ``archive-summary.md``, one line each, appended and never
rewritten, while index.json keeps each as a compact row (runId, endedAt, inode, supersession
links). ``rebuild_index(full=True)`` (``cybmem rebuild --full``) writes the full index.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol

import orjson

from .. import _io
from .._io import append_lines, atomic_write, ensure_dir, locked
from ..errors import NotFoundError, StoreError, ValidationError
from ..progress import Notice
from .ledger import MAX_LEDGER_BYTES
from .display import head_line, shorten
from .records import MemoryRecord, ms_to_utc

__all__ = ["ProjectIndex", "IndexedRecords", "index_entry", "entry_of", "ARCHIVE_FILE", "INDEX_VERSION"]

ARCHIVE_FILE = "archive-summary.md"
INDEX_LOCK_FILE = ".index.lock"
INDEX_VERSION = 1


def index_entry(rec: MemoryRecord, inode: int) -> dict:
    """index.json's projection of one record (links as written on the record, plus its inode)."""
    lin = rec.lineage
    return entry_of({
        "runId": rec.runId, "startedAt": rec.startedAt, "endedAt": rec.endedAt, "state": rec.state,
        "workflowName": rec.workflowName, "task": rec.task, "summary": rec.outcome.summary, "issues": rec.outcome.issues,
        "previousRunId": lin.previousRunId, "parentRunId": lin.parentRunId, "chatSessionId": lin.chatSessionId,
        "rootRunId": lin.rootRunId, "supersedes": rec.supersedes, "supersededBy": rec.supersededBy, "inode": inode,
    })


def entry_of(fields: dict) -> dict:
    """The index entry of a record's fields (a record's, or a snapshot row's with times in epoch
    ms): task and summary cut, lineage and supersession links only when set, then the inode."""
    entry = {
        "runId": fields["runId"],
        "startedAt": fields["startedAt"],
        "endedAt": fields["endedAt"],
        "state": fields["state"],
        "workflowName": fields["workflowName"],
        "task": head_line(fields["task"], 100),
        "summary": shorten(fields["summary"] or "", 200),
        "issues": list(fields["issues"] or ()),
    }
    for key in ("previousRunId", "parentRunId", "chatSessionId", "rootRunId", "supersedes", "supersededBy"):
        if fields.get(key):
            entry[key] = fields[key]
    entry["inode"] = fields["inode"]
    return entry


def _sort_key(entry: dict) -> tuple:
    return (entry["endedAt"], entry["runId"])


class IndexedRecords(Protocol):
    """What a :class:`ProjectIndex` reads its project's records through (a MemoryStore)."""

    slug: str
    dir: Path
    records_dir: Path
    index_cap: int  # entries index.json keeps (0: no cap); read when it compacts

    def listing(self) -> dict[str, int]: ...

    def read_record_st(self, run_id: str) -> tuple[MemoryRecord, os.stat_result]: ...

    def check_writable(self) -> None: ...


class ProjectIndex:
    """index.json of one project, held by its store (``store.index``).

    Args:
        records: the project's records (:class:`IndexedRecords`).
        report: called with (path, message) for each file it cannot read (the store notes it once).
    """

    def __init__(self, records: IndexedRecords, report: Callable[[str, str], None]):
        self.records = records
        self._problem = report
        self.index_path = records.dir / "index.json"
        self.archive_path = records.dir / ARCHIVE_FILE
        #: What :meth:`_unindexed` read of records/ when index.json was missing (entries, skipped).
        self._fresh: tuple[list[dict], dict[str, str]] | None = None

    @contextlib.contextmanager
    def index_lock(self) -> Iterator[None]:
        """Exclusive lock for rewriting index.json.

        Separate from :meth:`lock` so that index updates coalesce: a writer links its record
        under the project lock, then takes this one and merges every record the index does not
        have yet, its own and those of writers that linked meanwhile; the writers queued behind
        it find nothing left to do and skip the rewrite (group commit).
        """
        self.records.check_writable()
        with locked(self.records.dir / INDEX_LOCK_FILE):
            yield

    # --- the derived index -------------------------------------------------------
    #
    # index.json: {"version": 1, "count": N, "entries": [...newest first...],
    #              "archived": [[runId, endedAt, inode(, supersedes, supersededBy)], ...newest first],
    #              "skipped": {runId: why}}.
    # Each entry is the projection of one record file (index_entry), with the file's inode.
    # "archived" holds the runs compaction moved out of "entries" (their one-liners are in
    # archive-summary.md); "skipped" names the record files that could not be read. Together they
    # let the index be checked against records/ with one directory listing: entry names and inodes
    # + archived names and inodes + skipped names == the listing. A record replaced by rename
    # (another writer adding supersededBy) has a new inode and is read again; a writer killed
    # between linking its record and updating the index leaves it stale, and the next write (or
    # any reader) merges the missing records in.

    def read_index(self) -> tuple[list[dict], dict[str, str], dict[str, tuple]] | None:
        """index.json as stored: entries, skipped files and archived runs (runId -> (endedAt, inode,
        supersedes, supersededBy)), or None if it is missing or damaged (reported)."""
        try:
            data = _io.loads(_io.read_file(self.index_path, limit=MAX_LEDGER_BYTES))
        except FileNotFoundError:
            return None
        except (StoreError, ValueError):
            self._problem(str(self.index_path), "index.json is unreadable; run `cybmem rebuild` (or `cybmem doctor --repair`)")
            return None
        entries = data.get("entries") if isinstance(data, dict) else None
        skipped = data.get("skipped", {}) if isinstance(data, dict) else None
        rows = data.get("archived", []) if isinstance(data, dict) else None
        ok = isinstance(entries, list) and data.get("count") == len(entries) and isinstance(skipped, dict) and isinstance(rows, list)
        if ok:
            for e in entries:
                if (type(e) is not dict or type(e.get("runId")) is not str or type(e.get("endedAt")) is not int
                        or type(e.get("state")) is not str):
                    ok = False
                    break
        archived: dict[str, tuple] = {}
        if ok:
            for row in rows:  # a hot loop at 100k archived runs: the cheapest checks first
                if type(row) is not list or type(row[0]) is not str or type(row[1]) is not int or type(row[2]) is not int:
                    ok = False
                    break
                if len(row) == 3:
                    archived[row[0]] = (row[1], row[2], None, None)
                elif len(row) == 5 and (row[3] is None or type(row[3]) is str) and (row[4] is None or type(row[4]) is str):
                    archived[row[0]] = (row[1], row[2], row[3], row[4])
                else:
                    ok = False
                    break
        if not ok:
            self._problem(str(self.index_path), "index.json is damaged; run `cybmem rebuild` (or `cybmem doctor --repair`)")
            return None
        return entries, {str(k): str(v) for k, v in skipped.items()}, archived

    def _project(self, names: Iterable[str], skipped: dict[str, str]) -> list[dict]:
        """Index entries of these record files; unreadable ones go to ``skipped`` (name -> why)."""
        out = []
        for name in names:
            rid = name[:-5]
            try:
                rec, st = self.records.read_record_st(rid)
            except NotFoundError:
                continue
            except (ValidationError, StoreError) as exc:
                skipped[rid] = str(exc)
                continue
            out.append(index_entry(rec, st.st_ino))
        return out

    def _merge_index(self, entries: list[dict], skipped: dict[str, str], listing: dict[str, int],
                     archived: dict[str, tuple] | None = None) -> tuple[list[dict], dict[str, str], dict[str, tuple], bool]:
        """Bring the index up to date with the record files listed: drop vanished or replaced
        entries, add new ones, follow archived records that vanished or were replaced."""
        archived = dict(archived or {})
        by_id = {e["runId"]: e for e in entries}
        changed = len(by_id) != len(entries)
        for rid, e in list(by_id.items()):
            if listing.get(rid + ".json") != e.get("inode"):
                del by_id[rid]  # vanished, or replaced by another file (a new inode): read again below
                changed = True
        for rid in [r for r in skipped if r + ".json" not in listing]:
            del skipped[rid]
            changed = True
        # Archived runs whose file vanished or was replaced, by set operations (100k archived runs
        # must not cost a Python loop on every read).
        names = [rid + ".json" for rid in archived]
        inodes = list(map(listing.get, names))
        moved = {rid for rid, row, ino in zip(archived, archived.values(), inodes) if ino != row[1]}
        moved |= archived.keys() & by_id.keys()
        for rid in moved:
            changed = True
            del archived[rid]
            if rid + ".json" not in listing or rid in by_id:
                continue  # vanished (or listed twice by a hand-edited index: the entry wins)
            # Replaced (a correction added supersededBy): it stays archived with its new links.
            for e in self._project([rid + ".json"], skipped):
                archived[rid] = _archived_row(e)
        known = set(names) | {rid + ".json" for rid in by_id} | {rid + ".json" for rid in skipped}
        new = sorted(listing.keys() - known - {rid + ".json" for rid in archived})
        if not new and not changed:
            return entries, skipped, archived, False
        for e in self._project(new, skipped):
            by_id[e["runId"]] = e
        return sorted(by_id.values(), key=_sort_key, reverse=True), skipped, archived, True

    def _report_skipped(self, skipped: dict[str, str]) -> None:
        for rid, why in sorted(skipped.items()):
            self._problem(str(self.records.records_dir / f"{rid}.json"), why)

    def current(self) -> tuple[list[dict], dict[str, str], dict[str, tuple]]:
        """The index as stored, checked against records/ (one directory listing) and completed in memory.

        With no usable index.json, records/ is read whole once per store object: what was read is
        kept (:meth:`_unindexed`), so the index update of a write that follows merges only what
        is new instead of reading every record again."""
        doc = self.read_index()
        if doc is None:
            entries, skipped = self._unindexed()
            archived: dict[str, tuple] = {}
        else:
            entries, skipped, archived, _ = self._merge_index(doc[0], doc[1], self.records.listing(), doc[2])
        self._report_skipped(skipped)
        return entries, skipped, archived

    def index_entries(self) -> list[dict]:
        """index.json's entries, newest first, checked against records/ (one directory listing).

        Records the index does not know yet (a writer was killed before updating it, one is
        writing right now, another writer replaced a record) are merged in memory; a missing or
        damaged index is rebuilt in memory. Unreadable record files are reported once in
        ``self.problems``. Archived runs are not among them (see :meth:`all_entries`).
        """
        return self.current()[0]

    def archived_ids(self) -> list[str]:
        """Run ids compaction moved out of index.json, newest first (their records stay in records/)."""
        archived = self.current()[2]
        return [rid for rid, _ in sorted(archived.items(), key=lambda kv: (kv[1][0], kv[0]), reverse=True)]

    def _entries_newest_first(self, _index: tuple | None = None) -> Iterator[dict]:
        """Every record's index entry, newest first; archived records are read from records/ lazily.

        Entries newer than every archived run (the usual case: compaction archives the oldest)
        come first without sorting the archived ones, so a short listing reads nothing more.
        """
        entries, _, archived = _index or self.current()
        newest = max(((row[0], rid) for rid, row in archived.items()), default=None)
        i = 0
        while i < len(entries) and (newest is None or (entries[i]["endedAt"], entries[i]["runId"]) > newest):
            yield entries[i]
            i += 1
        if newest is None:
            return
        keys = [((e["endedAt"], e["runId"]), e) for e in entries[i:]]
        keys += [((row[0], rid), None) for rid, row in archived.items()]
        keys.sort(key=lambda kv: kv[0], reverse=True)
        for (_, rid), entry in keys:
            if entry is not None:
                yield entry
                continue
            skipped: dict[str, str] = {}
            got = self._project([rid + ".json"], skipped)
            self._report_skipped(skipped)
            yield from got

    def all_entries(self) -> list[dict]:
        """Index entries of every record, archived ones included (read from records/), newest first."""
        return list(self._entries_newest_first())

    def _unindexed(self) -> tuple[list[dict], dict[str, str]]:
        """The index of records/ when index.json is missing or damaged: read whole the first time
        (:meth:`fresh_index`, with a line on stderr when that takes a while), then the entries read
        before, merged with the listing (only records that are new or were replaced are read)."""
        kept = self._fresh
        if kept is None:
            notice = Notice(f"cybmem: indexing the records of project {self.records.slug} into index.json "
                           "(once; later writes add only their own)")
            try:
                entries, skipped = self.fresh_index()
            finally:
                notice.done()
        else:
            entries, skipped, _, _ = self._merge_index(list(kept[0]), dict(kept[1]), self.records.listing())
        self._fresh = (list(entries), dict(skipped))
        return entries, skipped

    def fresh_index(self) -> tuple[list[dict], dict[str, str]]:
        """Index entries (newest first) and unreadable files (runId -> why), from records/ alone."""
        skipped: dict[str, str] = {}
        entries = self._project(sorted(self.records.listing()), skipped)
        entries.sort(key=_sort_key, reverse=True)
        return entries, skipped

    def rebuild_index(self, *, full: bool = False) -> int:
        """Regenerate index.json from records/ alone; returns the record count.

        Compacted to ``index_cap`` entries (older ones archived, archive-summary.md appended
        with those it does not list yet), or with ``full`` every record as an entry. The store
        checks first that it may write there (:meth:`MemoryStore.rebuild_index`).
        """
        ensure_dir(self.records.dir)
        with self.index_lock():
            entries, skipped = self.fresh_index()
            self._report_skipped(skipped)
            archived: dict[str, tuple] = {}
            if not full:
                entries, archived = self._compact_locked(entries, archived)
            self._write_index_locked(entries, skipped, archived)
        return len(entries) + len(archived)

    @staticmethod
    def _index_bytes(entries: list[dict], skipped: dict[str, str], archived: dict[str, tuple] | None = None) -> bytes:
        # One compact JSON object per line: diff- and grep-friendly, still one JSON document.
        body = b",\n".join(b"  " + orjson.dumps(e) for e in entries)
        data = (
            b'{"version": ' + str(INDEX_VERSION).encode() + b', "count": ' + str(len(entries)).encode()
            + b', "entries": [\n' + body + (b"\n" if entries else b"") + b"]"
        )
        if archived:
            rows = sorted(archived.items(), key=lambda kv: (kv[1][0], kv[0]), reverse=True)
            data += b', "archived": [\n' + b",\n".join(
                b"  " + orjson.dumps([rid, row[0], row[1], *(row[2:] if row[2] or row[3] else ())]) for rid, row in rows
            ) + b"\n]"
        if skipped:
            data += b', "skipped": ' + orjson.dumps(dict(sorted(skipped.items())))
        return data + b"}\n"

    def _write_index_locked(self, entries: list[dict], skipped: dict[str, str] | None = None,
                            archived: dict[str, tuple] | None = None) -> None:
        # Derived and checked against records/ on every read: no fsync (a lost index is rebuilt).
        if self.index_path.is_dir():
            raise StoreError(f"{self.index_path} is a directory; remove it (the index is derived) and run `cybmem rebuild`")
        try:
            atomic_write(self.index_path, self._index_bytes(entries, skipped or {}, archived), durable=False)
        except OSError as exc:
            if isinstance(exc, StoreError):
                raise
            raise StoreError(f"cannot write {self.index_path}: {exc.strerror or exc}") from None

    def _compact_locked(self, entries: list[dict], archived: dict[str, tuple]) -> tuple[list[dict], dict[str, tuple]]:
        """Move the entries past ``index_cap`` (the oldest) to ``archived`` (index lock held).

        Each gets one line in archive-summary.md unless the file lists it already (it was
        archived before a ``rebuild --full``); lines are appended before index.json is written,
        so a writer killed in between leaves an entry that the next compaction archives without
        a second line.
        """
        if not self.records.index_cap or len(entries) <= self.records.index_cap:
            return entries, archived
        keep, leave = entries[: self.records.index_cap], entries[self.records.index_cap:]
        archived = dict(archived)
        for e in leave:
            archived[e["runId"]] = _archived_row(e)
        listed = self._summarized([e["runId"] for e in leave])
        lines = [_summary_line(e) for e in reversed(leave) if e["runId"] not in listed]
        if lines:
            if not self.archive_path.exists():
                lines[:0] = [f"# Archived index entries of project {self.records.slug}".encode(), b"",
                             b"Entries compaction moved out of index.json, oldest first as they left it: ended (UTC), "
                             b"state, run id, task. The records stay in records/ (`cybmem show`, `cybmem chain`, "
                             b"`cybmem search` reach them); `cybmem rebuild --full` puts them back into index.json.", b""]
            try:
                append_lines(self.archive_path, lines, sync=False)
            except OSError as exc:
                raise StoreError(f"cannot append to {self.archive_path}: {exc.strerror or exc}") from None
        return keep, archived

    def _summarized(self, run_ids: list[str]) -> set[str]:
        """Which of these run ids archive-summary.md already has a line for."""
        try:
            raw = _io.read_file(self.archive_path, limit=MAX_LEDGER_BYTES)
        except FileNotFoundError:
            return set()
        if len(run_ids) <= 16:
            return {rid for rid in run_ids if f"  {rid}  ".encode() in raw}
        listed = {m.group(1).decode() for m in _SUMMARY_ID.finditer(raw)}
        return listed & set(run_ids)

    def update_locked(self, run_id: str | None = None) -> None:
        """Bring index.json up to date with records/ (call with :meth:`index_lock` held).

        The directory is listed after the lock is taken, so every record linked before this
        call is merged; when another writer already merged ours, nothing is rewritten.
        Entries past the cap are archived (:meth:`_compact_locked`).
        """
        if run_id is not None:
            # Group commit, the cheap way: if a writer that took the lock after our record was
            # linked has merged it already (and, for a correction, the corrected record, which
            # was replaced before the link), there is nothing to do. Entries are written by
            # orjson with runId first, and inside a JSON string every quote is escaped, so this
            # byte pattern only ever matches the start of the entry itself.
            try:
                raw = _io.read_file(self.index_path, limit=MAX_LEDGER_BYTES)
            except (OSError, StoreError):
                raw = b""
            if b'{"runId":' + orjson.dumps(run_id) + b"," in raw:
                return
        doc = self.read_index()
        if doc is None:
            entries, skipped = self._unindexed()  # missing or damaged: the full truth is records/
            archived: dict[str, tuple] = {}
        else:
            entries, skipped, archived, changed = self._merge_index(doc[0], doc[1], self.records.listing(), doc[2])
            if not changed:
                return
        entries, archived = self._compact_locked(entries, archived)
        self._write_index_locked(entries, skipped, archived)

    def latest_run_id(self, *, before_ms: int | None = None, exclude: str | None = None) -> str | None:
        """The latest record (by endedAt, then runId) that ended at or before ``before_ms``, archived ones too."""
        entries, _, archived = self.current()
        best: tuple[int, str] | None = None
        for entry in entries:  # newest first: the first that qualifies is the newest of them
            if entry["runId"] != exclude and (before_ms is None or entry["endedAt"] <= before_ms):
                best = (entry["endedAt"], entry["runId"])
                break
        for rid, row in archived.items():
            if rid != exclude and (before_ms is None or row[0] <= before_ms) and (best is None or (row[0], rid) > best):
                best = (row[0], rid)
        return best[1] if best else None


_SUMMARY_ID = re.compile(rb"^- \d{4}-\d\d-\d\d \d\d:\d\d UTC  \S+  (\S+)  ", re.MULTILINE)


def _archived_row(entry: dict) -> tuple:
    """An index entry as an archived row: (endedAt, inode, supersedes, supersededBy)."""
    return (entry["endedAt"], entry.get("inode", 0), entry.get("supersedes"), entry.get("supersededBy"))


def _summary_line(entry: dict) -> bytes:
    """archive-summary.md's line for an entry: ``- <ended> UTC  <state>  <runId>  <task head>``."""
    task = " ".join(str(entry.get("task") or "").split()) or "-"
    return f"- {ms_to_utc(entry['endedAt'])} UTC  {entry['state']}  {entry['runId']}  {task}".encode("utf-8", "replace")
