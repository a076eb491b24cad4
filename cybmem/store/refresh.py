"""Reading a project's files into a snapshot: through the Arrow cache, brought up to date incrementally.

The loader parses ``records/*.json`` and ``issues.jsonl`` into Arrow tables and builds the keyword
index over task + summary + issue titles (:mod:`cybmem.store.arrow_records`). Through the cache
(``cybmem.store.cache``) only record files that are new since the last refresh are parsed (one new
segment each time, with the moment the scan that read them began); a record replaced by rename
(another writer added ``supersededBy``) is parsed again and its row patched in place when its
keyword text did not change (the moment it was read again kept in chk-N.arrow: the segment's own
moment stays that of its other rows); a record that vanished, or whose text changed, makes the
cache start over. The ledger is re-read from the byte offset it
had reached. Each refresh writes the issue tables of the current fold with its manifest
(:mod:`cybmem.store.issue_tables`).

:func:`read` is the one call a load makes (cybmem.store.loading): it picks the cache or a whole
parse, retries a read that raced a compaction and falls back to memory when the cache cannot be
written, and returns the :class:`~cybmem.store.snapshot.Snapshot`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import _io
from . import cache as _cache, ledger
from .._io import ensure_dir, locked
from ..arrow_numpy import array_of, strings  # not pa.array: it imports pandas
from .arrow_records import RECORD_SCHEMA, empty_table, keyword_text_array, load_records, parse_files
from ..errors import StoreError
from .issue_tables import carrier_arrays, issue_activity, issue_carriers, issue_index, issue_texts
from .keyword_index import KeywordIndex
from .memory_store import MAX_LEDGER_BYTES, MemoryStore, ReadProblem
from ..progress import Notice
from .snapshot import CacheFiles, Snapshot
from .tokens import tokenize_arrow

__all__ = ["read", "cached_snapshot", "cache_problem"]

_PROGRESS_AFTER_S = 1.0
_LEDGER_TAIL = 64  # bytes before the consumed offset kept in the manifest: an edit there is seen
_NO_LEDGER = {"size": 0, "mtime_ns": 0, "ino": 0}


def read(store: MemoryStore, *, use_cache: bool = True, recheck: Sequence[str] = (), strict: bool = False) -> Snapshot:
    """The project's snapshot as its files are now (what :func:`cybmem.store.loading.load_snapshot`
    returns when it holds none): through the cache when it may be used, else parsed whole.

    ``strict``: a cache that cannot be written raises (doctor's rebuild says so) instead of being
    left out.

    Raises:
        StoreError: records/ or the ledger cannot be read at all.
        OSError: with ``strict``, the cache cannot be written.
    """
    cache = _cache.usable_dir(store.dir, store.root) if use_cache else None
    linked = store.symlinked_dirs()
    if cache is None or linked:
        return _uncached(store, linked)
    for attempt in range(3):
        try:
            try:
                snap = None if recheck else _read_warm(store, cache)
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
            if strict:
                raise
            return _uncached(store, [])
    raise AssertionError("unreachable")


def cached_snapshot(store: MemoryStore) -> Snapshot | None:
    """The snapshot the cache holds when it is fresh, read without writing anything (doctor's
    view); None when there is no fresh cache."""
    cache = _cache.usable_dir(store.dir, store.root)
    if cache is None or store.symlinked_dirs():
        return None
    try:
        return _read_warm(store, cache)
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None


def cache_problem(store: MemoryStore) -> str | None:
    """Why a load would not use the cache's segments and events (the checks it makes of them: see
    ``_segments``), or None when it would (or there is no readable manifest: cache.check says so)."""
    cache = _cache.cache_dir(store.dir)
    manifest = _cache.Manifest.read(cache)
    if manifest is None:
        return None
    try:
        _records, index, _events = _segments(cache, manifest)
        index.validate()  # every posting: what a load does not check
        kwi = _cache.read_tables(cache, ["kwi.arrow"], missing_ok=("kwi.arrow",))[0]
        if kwi is not None:  # the issues' keyword index, checked the same way
            KeywordIndex.from_arrow(kwi).validate()
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


# --- reading ------------------------------------------------------------------------------


def _uncached(store: MemoryStore, linked: list[Path]) -> Snapshot:
    """The whole project parsed in memory, the cache neither read nor written."""
    read_at = time.time_ns()
    cache = _cache.cache_dir(store.dir)
    table, events, index, _bad, problems, _, _ = _build_full(store, nocache=_cache.disabled(store.root))
    problems += [ReadProblem(str(d), f"{d} is a symbolic link; the cache is neither read nor written through it "
                                     "(remove the link, see `cybmem doctor`)") for d in linked if d == cache]
    snap = _snapshot(store, table, events, index, problems, None, from_cache=False, parsed=table.num_rows,
                     read_at=read_at)
    snap.uncached = True  # derived layers (cybmem.retrieval.vector_cache) stay in memory too
    return snap


def _read_warm(store: MemoryStore, cache: Path) -> Snapshot | None:
    manifest, fresh = _cache.Manifest.read_fresh(cache, store.records_dir, store.issues_path)
    if not fresh:
        return None
    records, index, events = _segments(cache, manifest)
    return _snapshot(store, records, events, index, _problems_of(manifest), cache, from_cache=True, parsed=0,
                     manifest=manifest)


def _segments(cache: Path, manifest: _cache.Manifest) -> tuple[pa.Table, KeywordIndex, pa.Table]:
    """The cached records, their keyword index and the ledger's events (one read of the cache). A
    file that is readable Arrow but not what the manifest lists (another cache file copied over
    it, a restore from another copy) raises ValueError, as a damaged one does: the cache is
    rebuilt, never used."""
    segs = manifest.segments
    *tables, events = _cache.read_tables(cache, [s[k] for s in segs for k in ("rec", "kw")] + ["events.arrow"],
                                         missing_ok=("events.arrow",))
    rec = tables[0::2]
    kw = [KeywordIndex.from_arrow(t) for t in tables[1::2]]
    for seg, table, index in zip(segs, rec, kw):
        if not table.schema.equals(RECORD_SCHEMA) or not table.num_rows == index.n_docs == seg["rows"]:
            raise ValueError(f"{seg['rec']} and {seg['kw']} do not hold the {seg['rows']} records the cache manifest lists")
    events = events if events is not None else ledger.events_table([])
    if not events.schema.equals(ledger.schemas()[0]):
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
                           carriers=cache / manifest.carry if manifest is not None and manifest.carry else None,
                           checked=cache / manifest.checked if manifest is not None and manifest.checked else None)
    # When each row's record file was read: the moment its segment's scan began (for stale_rows;
    # a segment without one counts as read at 0: every row of it is checked against its file).
    read_times = None
    if manifest is not None and manifest.segments:
        starts = np.cumsum([0] + [seg["rows"] for seg in manifest.segments[:-1]])
        times = [seg.get("read_ns", 0) for seg in manifest.segments]
        read_times = (np.asarray(starts, np.int64), np.asarray(times, np.int64))
    elif read_at is not None:
        read_times = (np.zeros(1, np.int64), np.array([read_at], np.int64))
    return Snapshot(store, records, events, index, problems, from_cache=from_cache, parsed=parsed,
                    manifest=manifest, files=files, read_times=read_times)


def _concat_indexes(parts: list[KeywordIndex]) -> KeywordIndex:
    return parts[0] if len(parts) == 1 else KeywordIndex.concat(parts)


# --- parsing --------------------------------------------------------------------------------


def _record_issue_ids(table: pa.Table) -> list[str]:
    return pc.unique(pc.list_flatten(table.column("issues"))).to_pylist() if table.num_rows else []


def _parse_ledger(raw: bytes, first_line: int, path) -> tuple[pa.Table, int, int, list[ReadProblem]]:
    """Ledger bytes -> events table, bytes and lines consumed, problems (torn tail included)."""
    events, consumed, lines, bad = ledger.parse_ledger(raw, first_line=first_line)
    problems = [ReadProblem(f"{path}:{n}", f"{path.name}:{n}: {why}") for n, why in bad]
    if raw[consumed:].strip():
        n = first_line + lines
        problems.append(ReadProblem(f"{path}:{n}", f"{path.name}:{n}: skipped a torn last line (no newline yet)"))
    return ledger.events_table(events), consumed, lines, problems


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


def _build_full(store: MemoryStore, listing: dict[str, int] | None = None, *, nocache: bool = False,
                ) -> tuple[pa.Table, pa.Table, KeywordIndex, dict[str, int], list[ReadProblem], int, int]:
    """Parse the whole project (``listing``: records/ as just listed, else listed here; ``nocache``:
    the root has a .nocache file, which the notice names)."""
    led_problems: list[ReadProblem] = []
    raw = _read_ledger_all(store, led_problems)
    events, consumed, lines, problems = _parse_ledger(raw, 1, store.issues_path)
    problems = led_problems + problems
    if listing is None:
        listing = store.listing()
    later = "every read of a root with .nocache does this" if nocache else "once; later reads use the cache"
    notice = Notice(f"cybmem: indexing {len(listing)} records of project {store.slug} ({later})", _PROGRESS_AFTER_S)
    try:
        table, texts, bad, rec_problems = load_records(store, sorted(listing.items()), issue_texts(events))
        index = KeywordIndex.build(tokenize_arrow(texts))
    finally:
        notice.done()
    return table, events, index, bad, problems + rec_problems, consumed, lines


# --- writing the cache ------------------------------------------------------------------------


def _ledger_files(events: pa.Table) -> tuple[pa.Table, dict[str, pa.Table]]:
    """The fold of ``events``, and the cached ledger, that fold and the fold's keyword index as
    the cache's files (written together)."""
    folded = ledger.fold_table(events)
    return folded, {"events.arrow": events, "fold.arrow": folded, "kwi.arrow": issue_index(folded).to_arrow()}


def _issue_files(store: MemoryStore, manifest: _cache.Manifest, records: pa.Table, events: pa.Table,
                 index: KeywordIndex, folded: pa.Table, names: list[str] | None = None) -> dict[str, pa.Table]:
    """The current fold's issue activity and carriers (cybmem.store.issue_tables) as the cache's
    files, named in the manifest (``names``: the two names, already drawn from it)."""
    snap = Snapshot(store, records, events, index)  # for the runs no correction hides
    carried = issue_carriers(records, folded)
    table = issue_activity(records, folded, snap.candidates(None), snap.ended_ms(), carrier_arrays(carried))
    manifest.act, manifest.carry = names or manifest.new_files("act", "car")
    return {manifest.act: table, manifest.carry: carried}


def _cached_fold(cache: Path, events: pa.Table) -> pa.Table:
    """fold.arrow as the cache holds it, or the fold of ``events`` when it cannot be used."""
    try:
        folded = _cache.read_tables(cache, ["fold.arrow"], missing_ok=("fold.arrow",))[0]
    except (OSError, pa.ArrowException):
        folded = None
    return folded if folded is not None and folded.schema.equals(ledger.schemas()[1]) else ledger.fold_table(events)


def _start_over(store: MemoryStore, cache: Path, scanned_at: int, listing: dict[str, int] | None = None) -> Snapshot:
    table, events, index, bad, problems, consumed, lines = _build_full(store, listing)
    led = _cache.ledger_stat(store.issues_path) or _NO_LEDGER
    manifest = _cache.Manifest()
    rec, kw, *issue_names = manifest.new_files("rec", "kw", "act", "car")
    manifest.segments = [{"rec": rec, "kw": kw, "rows": table.num_rows, "read_ns": scanned_at}]
    manifest.bad = bad
    manifest.ledger = {"size": consumed, "mtime_ns": led["mtime_ns"] if consumed == led["size"] else None,
                       "ino": led["ino"], "lines": lines, "tail": _ledger_tail(store, consumed)}
    folded, files = _ledger_files(events)
    files = {rec: table, kw: index.to_arrow(), **files,
             **_issue_files(store, manifest, table, events, index, folded, issue_names)}
    manifest.problems = [[p.path, p.message] for p in problems]
    manifest.publish(cache, store.records_dir, scanned_at, files)
    snap = _snapshot(store, table, events, index, problems, cache, from_cache=False, parsed=table.num_rows,
                     manifest=manifest)
    snap.files = CacheFiles(activity=cache / manifest.act, carriers=cache / manifest.carry)
    return snap


def _patch_replaced(store: MemoryStore, cache: Path, manifest: _cache.Manifest, records: pa.Table,
                    replaced: list[tuple[int, str, int]], events: pa.Table) -> tuple[pa.Table, list[int]] | None:
    """Re-read records replaced by rename and patch their rows in their segments.

    Returns the patched records table and the rows patched, or None when a replacement changed a
    row's keyword text or cannot be read (then the cache starts over: the index must change too).
    """
    names = [(name, ino) for _, name, ino in replaced]
    rows = [row for row, _, _ in replaced]
    titles = issue_texts(events, sorted({i for lst in records.take(array_of(rows, pa.int64())).column("issues").to_pylist() for i in lst or ()}))
    new, texts, bad, _ = parse_files(store, names, titles)
    if bad or new.num_rows != len(names):
        return None
    if not keyword_text_array(records.take(array_of(rows, pa.int64())), titles).equals(texts):
        return None
    starts = np.cumsum([0] + [s["rows"] for s in manifest.segments])
    by_segment: dict[int, list[tuple[int, int]]] = {}
    for j, row in enumerate(rows):
        seg = int(np.searchsorted(starts, row, side="right") - 1)
        by_segment.setdefault(seg, []).append((row - int(starts[seg]), j))
    tables = _cache.read_tables(cache, [s["rec"] for s in manifest.segments])
    patched: dict[str, pa.Table] = {}
    for seg, hits in by_segment.items():
        table = tables[seg]
        take = np.arange(table.num_rows, dtype=np.int64)
        for local, j in hits:
            take[local] = table.num_rows + j
        tables[seg] = pa.concat_tables([table, new]).take(array_of(take))
        name = manifest.new_file("rec")
        patched[name] = tables[seg]
        manifest.segments[seg] = {**manifest.segments[seg], "rec": name}
    _cache.write_tables(cache, patched)
    return pa.concat_tables(tables), rows


def _refresh(store: MemoryStore, cache: Path, recheck: Sequence[str] = ()) -> Snapshot:
    """Bring the cache up to date under its lock, in a few steps: the cached state (or start over),
    the ledger from its offset, the records replaced in place, the records that are new, then
    publish the files and the manifest together."""
    ensure_dir(cache)
    with locked(cache / ".lock"):
        manifest, fresh = _cache.Manifest.read_fresh(cache, store.records_dir, store.issues_path)
        if fresh and not recheck:
            records, index, events = _segments(cache, manifest)  # another process just refreshed
            return _snapshot(store, records, events, index, _problems_of(manifest), cache, from_cache=True, parsed=0,
                             manifest=manifest)
        scanned_at = time.time_ns()
        listing = store.listing()
        cached = _cached_state(store, cache, manifest, listing, recheck)
        if cached is None:
            return _start_over(store, cache, scanned_at, listing)
        records, index, events, changes = cached
        events, folded, files, problems = _refresh_ledger(store, cache, manifest, events)
        checked = None
        if changes.replaced:
            patched = _patch_replaced(store, cache, manifest, records, changes.replaced, events)
            if patched is None:
                return _start_over(store, cache, scanned_at, listing)
            records, rows = patched
            # When rows were read later than their segment (chk-N.arrow): changed only by a patch or a compaction.
            checked = _cache.merge_checked(_cache.read_checked(cache / manifest.checked if manifest.checked else None),
                                           np.asarray(sorted(rows), np.int64), np.full(len(rows), scanned_at, np.int64),
                                           replace=True)  # what they hold now was read then
        records, index, parsed, problems, checked = _add_new(store, cache, manifest, changes, listing, records, index,
                                                              events, problems, checked, scanned_at, files)
        if checked is not None:
            files.update(_cache.checked_file(manifest, checked))
        files.update(_issue_files(store, manifest, records, events, index, folded))
        manifest.problems = [[p.path, p.message] for p in problems]
        manifest.publish(cache, store.records_dir, scanned_at, files)
        return _snapshot(store, records, events, index, problems, cache, from_cache=True, parsed=parsed,
                         manifest=manifest)


def _cached_state(store: MemoryStore, cache: Path, manifest: _cache.Manifest | None, listing: dict[str, int],
                  recheck: Sequence[str]) -> tuple[pa.Table, KeywordIndex, pa.Table, _cache.ListingChanges] | None:
    """The cached records, index and events, and how records/ changed since (``recheck``'s files
    counted as replaced); None when the cache must start over (no manifest, unreadable segments,
    a record that vanished)."""
    if manifest is None:
        return None
    try:
        records, index, events = _segments(cache, manifest)
    except (OSError, ValueError, KeyError, pa.ArrowException):
        return None
    changes = _cache.listing_changes(records, listing)
    if changes.vanished:
        return None  # a record vanished: append-only was broken
    if recheck:  # edited in place (same inode): read again like a replaced file
        known = {row for row, _, _ in changes.replaced}
        at = pc.index_in(strings(list(recheck)), value_set=records.column("runId")).to_pylist()
        changes.replaced += [(row, f"{rid}.json", listing[f"{rid}.json"]) for rid, row in zip(recheck, at)
                             if row is not None and row not in known and f"{rid}.json" in listing]
    return records, index, events, changes


def _refresh_ledger(store: MemoryStore, cache: Path, manifest: _cache.Manifest, events: pa.Table
                    ) -> tuple[pa.Table, pa.Table, dict[str, pa.Table], list[ReadProblem]]:
    """The ledger from its last offset (from the start if it was replaced): the events, their fold,
    the ledger's cache files to write (none when it did not change) and the problems so far;
    ``manifest.ledger`` is updated."""
    problems = _problems_of(manifest)
    led = _cache.ledger_stat(store.issues_path) or _NO_LEDGER
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
    files: dict[str, pa.Table] = {}
    if (consumed, lines) != (prev.get("size", 0), prev.get("lines", 0)) or not same_file:
        folded, files = _ledger_files(events)
    else:
        folded = _cached_fold(cache, events)
    manifest.ledger = {"size": consumed, "mtime_ns": led["mtime_ns"] if consumed == led["size"] else None,
                       "ino": led["ino"], "lines": lines, "tail": _ledger_tail(store, consumed)}
    return events, folded, files, problems


def _add_new(store: MemoryStore, cache: Path, manifest: _cache.Manifest, changes: _cache.ListingChanges,
             listing: dict[str, int], records: pa.Table, index: KeywordIndex, events: pa.Table,
             problems: list[ReadProblem], checked, scanned_at: int, files: dict[str, pa.Table]
             ) -> tuple[pa.Table, KeywordIndex, int, list[ReadProblem], Any]:
    """Parse the records that are new (listed, neither cached nor a known-bad file with the same
    inode) into one more segment, or into one compacted segment once there are MAX_SEGMENTS;
    its files go into ``files``. Returns the records, index, rows parsed, problems and checked rows."""
    new = sorted(e for e in changes.added if manifest.bad.get(e[0]) != e[1])
    for name in [n for n in manifest.bad if listing.get(n) != manifest.bad[n]]:
        manifest.bad.pop(name)
        problems = [p for p in problems if not p.path.endswith(os.sep + name)]
    parsed = 0
    if not new:
        return records, index, parsed, problems, checked
    seg_table, texts, bad, rec_problems = load_records(store, new, {})
    if seg_table.num_rows:
        # Issue titles for the keyword text: only the few ids these records raise.
        titles = issue_texts(events, _record_issue_ids(seg_table))
        texts = keyword_text_array(seg_table, titles) if titles else texts
    manifest.bad.update(bad)
    problems += rec_problems
    if not seg_table.num_rows:
        return records, index, parsed, problems, checked
    seg_index = KeywordIndex.build(tokenize_arrow(texts))
    parsed = seg_table.num_rows
    records = pa.concat_tables([records, seg_table])
    index = _concat_indexes([index, seg_index])
    rec, kw = manifest.new_files("rec", "kw")
    if len(manifest.segments) >= _cache.MAX_SEGMENTS:
        records = records.combine_chunks()
        index = index.compact()
        # One segment of rows read at several moments: the earliest is the segment's,
        # each later one goes to chk-N.arrow with its rows.
        segs = manifest.segments + [{"rows": seg_table.num_rows, "read_ns": scanned_at}]
        read_ns = min(seg.get("read_ns", 0) for seg in segs)
        sizes, moments = np.array([seg["rows"] for seg in segs]), np.array([seg.get("read_ns", 0) for seg in segs])
        later = np.repeat(moments > read_ns, sizes)
        if later.any():
            if checked is None:
                checked = _cache.read_checked(cache / manifest.checked if manifest.checked else None)
            checked = _cache.merge_checked(checked, np.flatnonzero(later), np.repeat(moments, sizes)[later])
        manifest.segments = [{"rec": rec, "kw": kw, "rows": records.num_rows, "read_ns": read_ns}]
        files.update({rec: records, kw: index.to_arrow()})
    else:
        manifest.segments.append({"rec": rec, "kw": kw, "rows": seg_table.num_rows, "read_ns": scanned_at})
        files.update({rec: seg_table, kw: seg_index.to_arrow()})
    return records, index, parsed, problems, checked
