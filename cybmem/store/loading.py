"""``load_snapshot``, the one way to a project's snapshot, and the snapshots a long-lived reader holds.

A load reads the files as they are now (:func:`cybmem.store.refresh.read`: the Arrow cache,
refreshed incrementally). A long-lived reader (``cybmem mcp``) loads inside
:func:`holding_snapshots`: a project's snapshot is then kept between loads, with its warm state,
for as long as :meth:`~cybmem.store.snapshot.Snapshot.current` holds. :func:`verified` reloads
when rows about to be shown changed in place since they were read.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator

import pyarrow as pa

from . import cache as _cache, refresh
from ..arrow_numpy import array_of
from .memory_store import MemoryStore
from .snapshot import Snapshot

__all__ = ["load_snapshot", "holding_snapshots", "verified"]

#: Snapshots kept by :func:`holding_snapshots`: project dir (one cache dir each) -> the snapshot last loaded from it.
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
            gone = list(_HELD.values()) if not _HOLDERS else []
            if gone:
                _HELD.clear()
        for snap in gone:  # what they settled since their last write (Snapshot.stale_rows)
            snap.keep_settled()


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
        return refresh.read(store, use_cache=use_cache, recheck=recheck)
    key = store.dir  # one cache dir per project dir (cache.cache_dir); a Path keeps its hash: no new one a call
    with _HELD_LOCK:
        held = _HELD.get(key)
    if held is not None and not recheck and held.current():
        return held
    if held is not None:  # let go: what it settled since its last write goes to the cache
        held.keep_settled()
    embeddings = _cache.ledger_stat(store.embeddings_path)  # before the load: a later change is seen
    snap = refresh.read(store, use_cache=use_cache, recheck=recheck)
    if snap.manifest is not None:  # read through the cache: it can tell when it goes stale
        snap.embeddings_stat, snap.watches_embeddings = embeddings, True
        snap.prepare()
        with _HELD_LOCK:
            if _HOLDERS:
                _HELD[key] = snap
    return snap


def verified(snap: Snapshot, rows: Iterable[int]) -> Snapshot:
    """``snap``, or a fresh load when any of ``rows`` (the ones about to be shown) changed in place
    since it was read (:meth:`Snapshot.stale_rows`): what a verb shows is what the files say now."""
    stale = snap.stale_rows(rows)
    if not stale:
        return snap
    ids = snap.records.column("runId").take(array_of(stale, pa.int64())).to_pylist()
    return load_snapshot(snap.store, use_cache=not snap.uncached, recheck=ids)
