"""The candidate pool of one query: the rows that can reach the top k, found without scoring the
rest, so that scoring only these is exact (:func:`candidate_pool`, bounded as WAND bounds a
document; every candidate below :data:`DENSE_BELOW` records), and the lineage affinity of a
snapshot's records for a dispatch context, kept per snapshot with the rows it links
(:func:`lineage_of`). :func:`cybmem.retrieval.search.rank_query` scores the pool.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from ..store.snapshot import Snapshot
from .scoring import LINEAGE_ANCESTOR, LineageContext, ScoreBlocks, lineage_affinity, recency, top_k_candidates, totals
from .weights import Weights

__all__ = ["DENSE_BELOW", "candidate_pool", "union_rows", "newest_candidates", "lineage_of"]


#: Below this many records every candidate is scored: the pool's own steps cost more than scoring
#: them all (benchmarks/bench_query.py: 0.7 against 1.2 ms at 7,761 records, even at 30k).
DENSE_BELOW = 20_000


def candidate_pool(snap: Snapshot, mask: np.ndarray, kw: np.ndarray | None, lin: np.ndarray | None, k: int,
          weights: Weights, now_ms: int, *, vec: np.ndarray | None = None) -> np.ndarray:
    """Row indices that can reach the top k, ascending; scoring only these is exact.

    Every axis is non-negative, recency is at most ``w_rec`` and lineage at most
    ``LINEAGE_ANCESTOR``, so a record's total is bounded, as WAND bounds a document (Broder et al., CIKM
    2003), and the k-th best exact total of any k candidates (the *threshold*) is at most the
    true k-th best. The rows likely to be good are scored first (those best on keywords and on
    vectors, and the latest rows with either); then:

    - a record with a keyword or a vector score (often a quarter of the project or more: one
      common word does it) is kept when those scores plus the highest recency it can have plus
      ``w_lin`` times the highest affinity there is reach the threshold. That recency is
      ``w_rec``, or, with the keyword axis alone, the recency of the newest record in its block of
      rows (:meth:`Snapshot.newest_in_blocks`): rows come oldest first, so in most blocks a
      record needs nearly the threshold on keywords alone (benchmarks/RESULTS.md, "Recency
      bounded per block");
    - a record with neither scores ``w_lin * lineage + w_rec * recency``, and lineage takes only a
      few levels (see scoring.lineage_affinity), so among records of one level the newer always
      scores at least as high: only the k newest of each level can reach the top k (with recency
      off they tie, and the ranking breaks ties by the higher row, so then the k highest rows of
      each level). None of them is needed when the threshold is above what they can score.
      Newer means a higher row only when the rows are in time order: otherwise two runs whose
      totals tie in float32 may rank against recency, and every such record is kept.
    """
    n = snap.n
    if n < DENSE_BELOW:  # every row, when every one is a candidate: no pass to find them
        return np.arange(n, dtype=np.int64) if mask.all() else np.flatnonzero(mask)
    everyone = bool(mask.all())  # every record is a candidate: no mask to apply below
    by_recency = weights.w_rec > 0
    step = 4 * k + 64
    order = snap.newest_first() if by_recency else None
    lin_top = weights.w_lin * LINEAGE_ANCESTOR if lin is not None and weights.w_lin > 0 else 0.0  # the highest affinity
    margin = 1e-5  # float32 rounding of the exact totals is far below it: the rows kept are a superset

    def scored(rows: np.ndarray | slice) -> np.ndarray:
        return _has_score(kw, vec, rows)

    def newest(keep_row, want: int) -> np.ndarray:
        """The first ``want`` candidate rows that ``keep_row`` (rows -> bool) keeps, newest first
        (highest rows without recency)."""
        out, got, start, size = [], 0, 0, max(8 * step, n // 16)
        while got < want and start < n:
            size = min(size, n - start)
            chunk = order[start:start + size] if order is not None else np.arange(n - start - size, n - start)[::-1]
            start += size
            size *= 2  # a long run of rows that do not qualify (one long chain, say) is crossed in few steps
            ok = keep_row(chunk)
            if not everyone:
                ok &= mask[chunk]
            chunk = chunk[ok][: want - got]
            out.append(chunk)
            got += len(chunk)
        return (out[0] if len(out) == 1 else np.concatenate(out)) if out else np.zeros(0, np.int64)

    def newest_of(group: np.ndarray) -> np.ndarray:
        """The k rows of ``group`` (ascending row indices) that rank first on recency alone."""
        if len(group) <= k:
            return group
        if not by_recency:
            return group[-k:]  # a tie: the higher rows win
        ended = snap.ended_ms()[group]
        cut = np.partition(ended, len(group) - k)[len(group) - k]
        return group[ended >= cut]  # the k newest, plus any tied with the k-th (a superset is exact)

    parts: list[np.ndarray] = []
    threshold = -np.inf
    if kw is not None or vec is not None:
        blocks = ScoreBlocks(kw, k) if kw is not None else None
        # The latest matches (a loaded store's rows come oldest first: the newest) join the seeds.
        lo = max(0, n - 8 * step)
        hot = scored(slice(lo, n))
        if not everyone:
            hot &= mask[lo:]
        seed, kw_top = _seeds(mask, everyone, kw, vec, k, lo + np.flatnonzero(hot)[-k:], blocks)
        kw_max = None if kw_top is None else float(kw[kw_top])  # the keyword axis' normalising max
        if len(seed) >= k:
            sub = lambda a: None if a is None else a[seed]  # noqa: E731
            exact = totals(keyword_raw=sub(kw), ended_at_ms=snap.ended_ms()[seed], now_ms=now_ms, lineage=sub(lin),
                           vector_cos=sub(vec), weights=weights, keyword_max=kw_max)
            threshold = float(np.partition(exact, len(exact) - k)[len(exact) - k])
        # A block of rows is bounded by the recency of its newest record (rows are appended as runs
        # end, so most blocks are old: their rows need nearly the threshold on keywords alone).
        rec_bound = None
        if by_recency and blocks is not None and blocks.maxima is not None and np.isfinite(threshold):
            rec_bound = recency(snap.newest_in_blocks(blocks.block), now_ms, weights.half_life_days, weight=weights.w_rec)
        # Every seed that can reach the top k is among these rows; the normalising max's row is
        # added, so that the pool's own maximum is the candidates'.
        rows = _reaching(mask, everyone, kw, vec, weights, threshold - lin_top - margin, kw_max, blocks, rec_bound)
        parts = [rows if kw_top is None else _with(rows, kw_top)]
    if threshold - margin > weights.w_rec + lin_top:
        return parts[0]  # a record with neither a keyword nor a vector score cannot reach the top k
    if by_recency and not snap.in_time_order:  # the newest are not the best of their ties: keep them all
        parts.append(np.flatnonzero(mask))
        return union_rows(n, parts)
    # Records with no score but recency: the k newest (they are most records); then the linked ones.
    parts.append(newest((lambda r: ~scored(r) & (lin[r] <= 0)) if lin is not None else lambda r: ~scored(r), k))
    if lin is not None:
        linked = _linked(snap, lin)
        linked = linked[~scored(linked) & mask[linked]]
        if len(linked) <= step:
            parts.append(linked)
        else:
            levels = lin[linked]
            for level in np.unique(levels):
                parts.append(newest_of(linked[levels == level]))
    return union_rows(n, parts)


def _seeds(mask: np.ndarray, everyone: bool, kw: np.ndarray | None, vec: np.ndarray | None, k: int,
           newest: np.ndarray, blocks: ScoreBlocks | None) -> tuple[np.ndarray, int | None]:
    """:func:`candidate_pool`'s first rows, distinct and ascending (a superset of the best k candidates on
    keywords and on vectors, and ``newest``), and the row of the candidates' best keyword score."""
    parts = [newest]
    kw_top = None
    if kw is not None:
        best = top_k_candidates(kw, k, None if everyone else mask, blocks=blocks)
        if len(best):
            kw_top = int(best[np.argmax(kw[best])])
        parts.append(best)
    if vec is not None:
        parts.append(top_k_candidates(vec, k, None if everyone else mask))
    seed = union_rows(len(mask), parts)
    return (seed if everyone else seed[mask[seed]]), kw_top


_TINY = np.nextafter(np.float32(0), np.float32(1))  # the least positive float32: "a keyword score at all"


def _has_score(kw: np.ndarray | None, vec: np.ndarray | None, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
    """Which of ``rows`` (row indices, or a slice when an axis is on) have a keyword or a vector score."""
    if kw is None and vec is None:
        return np.zeros(len(rows), bool)
    hot = kw[rows] > 0 if kw is not None else vec[rows] > 0
    if kw is not None and vec is not None:
        hot |= vec[rows] > 0
    return hot


def _reaching(mask: np.ndarray, everyone: bool, kw: np.ndarray | None, vec: np.ndarray | None, weights: Weights,
              bound: float, kw_max: float | None, blocks: ScoreBlocks | None,
              rec_bound: np.ndarray | None = None) -> np.ndarray:
    """Candidate rows whose total can reach ``bound`` (the threshold less the lineage's highest
    contribution) with the highest recency their rows can have: ``w_rec``, or per block of
    ``blocks`` ``rec_bound`` (:meth:`ScoreBlocks.at_least_each`'s blocks; keyword axis only).
    Every row with a keyword or vector score when that needs nothing of them; ascending; keyword
    rows are looked for only in the ``blocks`` that can hold them."""
    need = bound - weights.w_rec
    scale = np.float32(weights.w_kw / kw_max) if kw is not None and kw_max and weights.w_kw > 0 else None
    if rec_bound is not None and scale is not None and vec is None:
        # A row with no keyword score is not one of these (the least positive float32 is asked for).
        t = np.maximum((bound - rec_bound.astype(np.float64)) / np.float64(scale), np.float64(_TINY)).astype(np.float32)
        rows = blocks.at_least_each(t)
    elif need <= 0 or (scale is None and vec is None):
        rows = np.flatnonzero(_has_score(kw, vec)) if need <= 0 else np.zeros(0, np.int64)
    elif vec is None:
        rows = blocks.at_least(np.float32(need) / scale) if blocks is not None else np.flatnonzero(kw >= np.float32(need) / scale)
    else:
        total = vec * np.float32(weights.w_vec)
        if scale is not None:
            total += kw * scale
        rows = np.flatnonzero(total >= np.float32(need))
    return rows if everyone else rows[mask[rows]]


def _with(rows: np.ndarray, row: int) -> np.ndarray:
    """Ascending distinct ``rows`` with ``row`` among them."""
    at = int(np.searchsorted(rows, row))
    return rows if at < len(rows) and rows[at] == row else np.concatenate((rows[:at], [row], rows[at:]))


def union_rows(n: int, parts: list[np.ndarray]) -> np.ndarray:
    """The distinct rows of ``parts`` (row indices below ``n``), ascending: a sort of the few, or a
    pass over a mask of ``n`` when they are many."""
    if sum(map(len, parts)) <= n // 64:
        rows = np.sort(np.concatenate(parts))  # np.unique's answer in fewer steps (a ranking's hot path)
        keep = np.empty(len(rows), dtype=bool)
        keep[:1] = True
        np.not_equal(rows[1:], rows[:-1], out=keep[1:])
        return rows[keep]
    keep = np.zeros(n, dtype=bool)
    for part in parts:
        keep[part] = True
    return np.flatnonzero(keep)


def newest_candidates(snap: Snapshot, mask: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` newest rows ``mask`` keeps, newest first (ties: the higher row). Rows in time order
    (as a load leaves them) are the last ``n`` kept rows: no sort of every endedAt, which a one-shot
    query at 100k runs paid (~10 ms) for these few rows; otherwise the order of
    :meth:`cybmem.store.snapshot.Snapshot.newest_first`."""
    if snap.in_time_order:
        return np.flatnonzero(mask)[::-1][:n]
    order = snap.newest_first()
    out = order[:max(4 * n, 64)]
    out = out[mask[out]][:n]
    return out if len(out) >= n else order[mask[order]][:n]


#: The last lineage affinity computed on each snapshot, with its context (a snapshot is hashed by
#: identity; a held one lives as long as the files are unchanged). One client's searches share
#: their context (the parent and chat it dispatches from, the newest candidate), so a held
#: snapshot walks the lineage once for them, not on every call (~10% of a query at 100k).
#: Kept with it: the rows it is positive on (:func:`candidate_pool` asks for them; a pass over every record).
_AFFINITY: "weakref.WeakKeyDictionary[Snapshot, _Affinity]" = weakref.WeakKeyDictionary()


@dataclass
class _Affinity:
    context: LineageContext
    values: np.ndarray
    linked: np.ndarray | None = None


def lineage_of(snap: Snapshot, ctx: LineageContext) -> np.ndarray:
    """:func:`lineage_affinity` of ``snap``'s records for ``ctx`` (read-only: it may be shared)."""
    kept = _AFFINITY.get(snap)
    if kept is not None and kept.context == ctx:
        return kept.values
    lin = lineage_affinity(*snap.lineage_columns(), ctx, lookup=snap.run_lookup())
    lin.flags.writeable = False
    _AFFINITY[snap] = _Affinity(ctx, lin)
    return lin


def _linked(snap: Snapshot, lin: np.ndarray) -> np.ndarray:
    """The rows ``lin`` (a lineage affinity of ``snap``'s records) is positive on, ascending."""
    kept = _AFFINITY.get(snap)
    if kept is None or kept.values is not lin:
        return np.flatnonzero(lin > 0)
    if kept.linked is None:
        kept.linked = np.flatnonzero(lin > 0)
        kept.linked.flags.writeable = False
    return kept.linked

