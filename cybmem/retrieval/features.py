"""What the learned ranker sees of each (task, candidate run): numbers normalised per task.

The second stage of retrieval (:mod:`cybmem.retrieval.ranker`) reorders a pool of candidates the
first stage (the linear formula of :mod:`cybmem.retrieval.scoring`) found: its top
:data:`POOL_FIRST`, the top :data:`POOL_KEYWORD` on BM25 alone and the :data:`POOL_NEWEST` newest
(:func:`pool`). For each candidate :func:`features` computes :data:`FEATURES`, in that order:

- the first stage: its total, that total over the pool's best, its rank (log), its axes' values
  (keyword, recency, lineage);
- lexical views: BM25 rank (log); BM25 over the subject (the task's first line) and over the
  body apart, each over the pool's best; the idf-weighted share of the task's terms the run holds,
  the plain share, the share of the task's rare terms (held by under 1% of the runs) and the
  best single term's idf over the task's best;
- time: age on several scales (log hours; exp(-age / 1 h, 1 d, 7 d, 30 d, 365 d)); the lag behind
  the newest candidate (so a project paused for months still has a "latest"); the run's position
  in the project's history (runs that ended since, log; not as a share of the history, which
  reads a run 20 back in a store of 50 as ancient: it cost nothing to leave out, 0.612 -> 0.610
  leave-one-out); a burst: how many of the first
  stage's top 50 ended within a day of it; the project's pace (the median gap between its last
  100 runs) and the age counted in such gaps (log; exp(-age / 5 and 50 gaps));
- the task's shape: tokens (log), distinct terms, rare terms, the largest idf; the run's subject
  and body length (log).

No feature says whether a run mentions a ticket or raised one: in the judged corpora relevance
is "both runs name the same ticket", so such a prior would score how the labels were made
(issue 39). The issue ledger is not read here.
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..store.tokens import tokenize

if TYPE_CHECKING:  # pragma: no cover
    from ..store.snapshot import Snapshot
    from .scoring import Scored

__all__ = ["FEATURES", "POOL_FIRST", "POOL_KEYWORD", "POOL_NEWEST", "pool", "features", "pool_features", "axis_value"]

#: The first stage's top this many join the pool (issue 39: 100-150).
POOL_FIRST = 120
#: The top this many on BM25 alone join it.
POOL_KEYWORD = 40
#: The newest this many candidates join it.
POOL_NEWEST = 8
#: Of the first stage's top, how many count as the matches a burst is made of.
BURST_TOP = 50
#: What :func:`features` reads of a task's body (its head: a changelog-sized task is not read whole).
BODY_CHARS = 1200
#: The project's pace is the median gap between this many of its last runs.
PACE_RUNS = 100
#: A term held by fewer than this share of the runs is rare.
RARE_SHARE = 0.01

HOUR_MS = 3_600_000.0
DAY_MS = 24 * HOUR_MS

FEATURES: tuple[str, ...] = (
    "first_total", "first_total_rel", "first_rank_log", "first_keyword", "first_recency", "first_lineage",
    "bm25_rank_log", "bm25_subject_rel", "bm25_body_rel", "title_title_rel", "title_coverage", "coverage_idf", "coverage_share", "rare_share",
    "best_idf_rel",
    "age_log_hours", "age_1h", "age_1d", "age_7d", "age_30d", "age_365d",
    "lag_log_hours", "lag_1d", "lag_7d", "runs_since_log", "burst",
    "pace_log_hours", "age_gaps_log", "age_5gaps", "age_50gaps",
    "task_tokens_log", "task_terms_log", "task_rare", "task_max_idf", "subject_len_log", "body_len_log",
)
_F = {name: i for i, name in enumerate(FEATURES)}

_K1, _B = 1.2, 0.75  # the subject and body BM25 (the store index's own k1 and b)


def _order_desc(values: np.ndarray, newer: np.ndarray) -> np.ndarray:
    """Indices by ``values`` descending, ties to the newer (higher ``newer``) first."""
    return np.lexsort((-newer, -values))


def _top(values: np.ndarray, k: int) -> np.ndarray:
    """The first ``k`` of :func:`_order_desc` (ties: the higher row) without sorting every value: a
    store of 100k runs is scored whole on each query. float32 scores go through the first stage's
    own selection (:func:`cybmem.retrieval.scoring.top_k`, the same ties); other values (endedAt in
    ms) are partitioned at the k-th largest and only those at or above it are sorted."""
    n = len(values)
    if n <= k:
        return _order_desc(values, np.arange(n))
    if values.dtype == np.float32 and not np.isnan(values).any():
        from .scoring import top_k

        return top_k(values, k)
    kth = np.partition(values, n - k)[n - k]
    cand = np.flatnonzero(values >= kth)
    return cand[_order_desc(values[cand], cand)[:k]]


def pool(total: np.ndarray, kw_raw: np.ndarray | None, ended: np.ndarray) -> np.ndarray:
    """The second stage's candidates among the first stage's scored rows (indices into these
    arrays): the top :data:`POOL_FIRST` on ``total``, the top :data:`POOL_KEYWORD` on BM25 with
    any score, the :data:`POOL_NEWEST` newest; ascending."""
    parts = [_top(total, POOL_FIRST)]
    if kw_raw is not None:
        best = _top(kw_raw, POOL_KEYWORD)
        parts.append(best[kw_raw[best] > 0])
    parts.append(_top(ended, POOL_NEWEST))
    rows = np.sort(np.concatenate(parts))  # np.unique's answer without its first call's imports (numpy.ma: 20 ms)
    keep = np.empty(len(rows), dtype=bool)
    keep[:1] = True
    np.not_equal(rows[1:], rows[:-1], out=keep[1:])
    return rows[keep]


def _field_counts(texts: list[str], terms: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """How often each of the task's ``terms`` occurs in each text's subject (first line; rows
    ``0..n-1``) and body (rows ``n..2n-1``), and each field's length in tokens.

    Each field is tokenized by :func:`cybmem.store.tokens.tokenize` (through its word cache) and
    only the task's terms are counted: for a pool of a few hundred short texts this is cheaper than
    :func:`cybmem.store.tokens.tokenize_arrow` (the same tokens), whose Arrow kernels cost more on
    their first call in a process (dispatch asks one query a process) than this whole count."""
    n, T = len(texts), len(terms)
    at = {term: j for j, term in enumerate(terms)}
    lens = np.empty(2 * n)
    cells: list[int] = []
    for i, text in enumerate(texts):
        head, body = _fields_of(text)
        for k, part in ((i, head), (n + i, body)):
            toks = tokenize(part)
            lens[k] = len(toks)
            if T:
                cells += [k * T + j for j in map(at.get, toks) if j is not None]
    tf = np.bincount(np.asarray(cells, np.int64), minlength=2 * n * T).reshape(2 * n, T) if cells else np.zeros((2 * n, T))
    return tf.astype(np.float64), lens


def _fields_of(text: str | None) -> tuple[str, str]:
    """A task's subject (its first line) and body, each cut at :data:`BODY_CHARS`."""
    head, _, rest = (text or "").partition("\n")
    return head[:BODY_CHARS], rest[:BODY_CHARS]


class _FieldTokens:
    """The subject and body of a held snapshot's runs as token ids (a vocabulary of its own), kept
    as rows are asked for: a long-lived caller (the MCP server, a notebook, a benchmark; what
    :meth:`cybmem.store.snapshot.Snapshot.prepare` is for) asks about the same runs query after query,
    and then counting a task's terms is a few numpy passes instead of tokenizing every candidate again.
    At most :data:`MAX_ROWS` rows are kept (then it starts over): ~1 kB a run."""

    MAX_ROWS = 100_000

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self.rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.lock = threading.Lock()  # a held snapshot may be searched from several threads: ids stay distinct

    def _ids(self, text: str) -> np.ndarray:
        vocab = self.vocab
        return np.fromiter((vocab.setdefault(t, len(vocab)) for t in tokenize(text)), np.int32)

    def counts(self, snap: "Snapshot", rows: np.ndarray, terms: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """:func:`_field_counts` of ``rows``' tasks."""
        with self.lock:
            return self._counts(snap, rows, terms)

    def _counts(self, snap: "Snapshot", rows: np.ndarray, terms: list[str]) -> tuple[np.ndarray, np.ndarray]:
        missing = [r for r in rows.tolist() if r not in self.rows]
        if len(self.rows) + len(missing) > self.MAX_ROWS:
            self.rows.clear()
            missing = rows.tolist()
        if missing:
            for r, text in zip(missing, _task_heads(snap, np.asarray(missing, np.int64))):
                head, body = _fields_of(text)
                self.rows[r] = (self._ids(head), self._ids(body))
        n, T = len(rows), len(terms)
        parts = [self.rows[r][0] for r in rows.tolist()] + [self.rows[r][1] for r in rows.tolist()]
        lens = np.fromiter(map(len, parts), np.int64, 2 * n)
        if T == 0 or not lens.any():
            return np.zeros((2 * n, T)), lens.astype(np.float64)
        flat = np.concatenate(parts)
        pos = np.full(len(self.vocab), -1, np.int64)
        for j, term in enumerate(terms):
            tid = self.vocab.get(term)
            if tid is not None:
                pos[tid] = j
        hit = pos[flat]
        owner = np.repeat(np.arange(2 * n, dtype=np.int64), lens)
        ok = hit >= 0
        tf = np.bincount(owner[ok] * T + hit[ok], minlength=2 * n * T).reshape(2 * n, T)
        return tf.astype(np.float64), lens.astype(np.float64)


#: Each held snapshot's :class:`_FieldTokens`.
_HELD_FIELDS: "weakref.WeakKeyDictionary[Snapshot, _FieldTokens]" = weakref.WeakKeyDictionary()


def _bm25_fields(tf: np.ndarray, lens: np.ndarray, idf: np.ndarray,
                 title: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """BM25 of the task's terms over each text's subject and body apart (``tf``, ``lens``: from
    :func:`_field_counts`), with the store's idf, lengths averaged over these texts; each field's
    length in tokens; and BM25 of the task's own title terms (``title``: a mask over the terms)
    over each subject."""
    n = len(lens) // 2
    s_len, b_len = lens[:n], lens[n:]
    zero = np.zeros(n)
    if tf.shape[1] == 0 or not tf.any():
        return zero, zero.copy(), s_len, b_len, zero.copy()
    out = []
    for part, lens_part in ((tf[:n], s_len), (tf[n:], b_len)):
        avg = float(lens_part.mean()) if n and lens_part.mean() > 0 else 1.0
        norm = _K1 * (1 - _B + _B * lens_part / avg)
        out.append(part / (part + norm[:, None]) * idf[None, :])
    subj, body = out
    tt = subj @ title.astype(np.float64) if title is not None else zero.copy()
    return subj.sum(axis=1), body.sum(axis=1), s_len, b_len, tt


#: What :func:`features` reads of a task: its subject line and body up to :data:`BODY_CHARS` fit.
HEAD_CHARS = 4 * BODY_CHARS


def _task_heads(snap: "Snapshot", rows: np.ndarray) -> list[str]:
    """The first :data:`HEAD_CHARS` of each of ``rows``' tasks, sliced in Arrow (a task may be megabytes)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from ..arrow_numpy import array_of

    col = snap.records.column("task").take(array_of(rows, pa.int64()))
    return [t or "" for t in pc.utf8_slice_codeunits(col, 0, HEAD_CHARS).to_pylist()]


#: Every run's endedAt, sorted, per snapshot (a snapshot's records do not change).
_SORTED: "weakref.WeakKeyDictionary[Snapshot, np.ndarray]" = weakref.WeakKeyDictionary()


def _ended_sorted(snap: "Snapshot") -> np.ndarray:
    """Every run's endedAt, ascending: the snapshot's own column when its rows are in time order (as
    a load leaves them; no sort of 100k values on dispatch's one query), else sorted once."""
    if snap.in_time_order:
        return snap.ended_ms()
    times = _SORTED.get(snap)
    if times is None:
        times = _SORTED[snap] = np.sort(snap.ended_ms())
    return times


def _rel(x: np.ndarray) -> np.ndarray:
    top = float(x.max()) if len(x) else 0.0
    return x / top if top > 0 else np.zeros_like(x)


def features(snap: "Snapshot", query: str, rows: np.ndarray, *, total: np.ndarray, keyword: np.ndarray,
             recency: np.ndarray, lineage: np.ndarray, kw_raw: np.ndarray, now_ms: int,
             tasks: Sequence[str] | None = None, tokens: list[str] | None = None) -> np.ndarray:
    """:data:`FEATURES` of each of ``rows`` (snapshot rows: the pool) for the task ``query``.

    Args:
        total, keyword, recency, lineage: the first stage's total and axis values, per row.
        kw_raw: the raw BM25 of each row.
        now_ms: the moment the task is asked at (age is measured from it).
        tasks: every snapshot row's task, by row (default: the pool's read from the snapshot).
        tokens: the task's tokens (default: :func:`tokenize` of ``query``).

    Returns:
        float32 (rows, len(FEATURES)).
    """
    rows = np.asarray(rows, dtype=np.int64)
    n = len(rows)
    X = np.zeros((n, len(FEATURES)), dtype=np.float64)
    if n == 0:
        return X.astype(np.float32)
    tokens = tokenize(query) if tokens is None else tokens
    ended_all = snap.ended_ms()
    ended = ended_all[rows].astype(np.float64)
    tie = rows.astype(np.float64)
    total = np.asarray(total, np.float64)
    X[:, _F["first_total"]] = total
    X[:, _F["first_total_rel"]] = _rel(np.maximum(total, 0))
    rank = np.empty(n)
    rank[_order_desc(total, tie)] = np.arange(n)
    X[:, _F["first_rank_log"]] = np.log1p(rank)
    X[:, _F["first_keyword"]] = keyword
    X[:, _F["first_recency"]] = recency
    X[:, _F["first_lineage"]] = lineage
    kw_raw = np.asarray(kw_raw, np.float64)
    krank = np.empty(n)
    krank[_order_desc(kw_raw, tie)] = np.arange(n)
    X[:, _F["bm25_rank_log"]] = np.where(kw_raw > 0, np.log1p(krank), math.log1p(1000))

    # Lexical views over the task's distinct terms, with the store's idf.
    index = snap.index
    hits = index.term_hits(tokens, rows)
    n_docs = max(int(index.n_docs), 1)
    df = hits.df.astype(np.float64)
    idf = np.log1p((n_docs - df + 0.5) / (df + 0.5)) if len(df) else np.zeros(0)
    held = hits.held
    if len(idf):
        mass = float(idf.sum())
        X[:, _F["coverage_idf"]] = held @ idf / mass if mass > 0 else 0.0
        X[:, _F["coverage_share"]] = held.mean(axis=1)
        rare = (df > 0) & (df < RARE_SHARE * n_docs)
        X[:, _F["rare_share"]] = held[:, rare].mean(axis=1) if rare.any() else 0.0
        top = float(idf.max())
        X[:, _F["best_idf_rel"]] = (held * idf).max(axis=1) / top if top > 0 else 0.0
        X[:, _F["task_rare"]] = math.log1p(int(rare.sum()))
        X[:, _F["task_max_idf"]] = float(idf[df > 0].max()) if (df > 0).any() else 0.0
    X[:, _F["task_tokens_log"]] = math.log1p(len(tokens))
    X[:, _F["task_terms_log"]] = math.log1p(len(hits.terms))
    if tasks is not None:
        tf, lens = _field_counts([(tasks[r] or "")[:HEAD_CHARS] for r in rows.tolist()], hits.terms)
    elif snap.run_lookup() is not None:  # a held snapshot (prepared): its runs' fields are kept
        held_fields = _HELD_FIELDS.get(snap)
        if held_fields is None:
            held_fields = _HELD_FIELDS[snap] = _FieldTokens()
        tf, lens = held_fields.counts(snap, rows, hits.terms)
    else:
        tf, lens = _field_counts(_task_heads(snap, rows), hits.terms)
    title_terms = set(tokenize(query.strip().split("\n", 1)[0])) if query else set()
    title = np.array([t in title_terms for t in hits.terms], dtype=bool)
    subj, body, s_len, b_len, tt = _bm25_fields(tf, lens, idf, title)
    X[:, _F["title_title_rel"]] = _rel(tt)
    if title.any() and len(idf) and float(idf[title].sum()) > 0:
        X[:, _F["title_coverage"]] = held[:, title] @ idf[title] / float(idf[title].sum())
    X[:, _F["bm25_subject_rel"]] = _rel(subj)
    X[:, _F["bm25_body_rel"]] = _rel(body)
    X[:, _F["subject_len_log"]] = np.log1p(s_len)
    X[:, _F["body_len_log"]] = np.log1p(b_len)

    # Time: age from the task's moment, lag behind the newest candidate, position, bursts.
    age = np.maximum(float(now_ms) - ended, 0.0)
    X[:, _F["age_log_hours"]] = np.log1p(age / HOUR_MS)
    for name, scale in (("age_1h", HOUR_MS), ("age_1d", DAY_MS), ("age_7d", 7 * DAY_MS), ("age_30d", 30 * DAY_MS),
                        ("age_365d", 365 * DAY_MS)):
        X[:, _F[name]] = np.exp(-age / scale)
    lag = np.maximum(float(ended.max()) - ended, 0.0)
    X[:, _F["lag_log_hours"]] = np.log1p(lag / HOUR_MS)
    X[:, _F["lag_1d"]] = np.exp(-lag / DAY_MS)
    X[:, _F["lag_7d"]] = np.exp(-lag / (7 * DAY_MS))
    times = _ended_sorted(snap)
    upto = int(np.searchsorted(times, now_ms, side="right"))
    since = upto - np.searchsorted(times, ended, side="right")
    since = np.maximum(since, 0).astype(np.float64)
    X[:, _F["runs_since_log"]] = np.log1p(since)
    best = np.sort(ended[_order_desc(total, tie)[:BURST_TOP]])
    # The project's pace: the median gap between its last runs, and age counted in such gaps.
    tail = times[max(upto - PACE_RUNS, 0):upto]
    gap = float(np.median(np.diff(tail))) if len(tail) > 2 else DAY_MS
    gap = max(gap, 60_000.0)
    X[:, _F["pace_log_hours"]] = math.log1p(gap / HOUR_MS)
    X[:, _F["age_gaps_log"]] = np.log1p(age / gap)
    X[:, _F["age_5gaps"]] = np.exp(-age / (5 * gap))
    X[:, _F["age_50gaps"]] = np.exp(-age / (50 * gap))
    X[:, _F["burst"]] = np.searchsorted(best, ended + DAY_MS, side="right") - np.searchsorted(best, ended - DAY_MS, side="left")
    return X.astype(np.float32)


def axis_value(contrib: np.ndarray | None, weight: float, local: np.ndarray) -> np.ndarray:
    """An axis' value (its contribution over its weight) at ``local``; 0 when the axis is off."""
    return contrib[local] / np.float32(weight) if contrib is not None and weight > 0 else np.zeros(len(local), np.float32)


def pool_features(snap: "Snapshot", query: str, idx: np.ndarray, scored: "Scored", kw_raw: np.ndarray, now_ms: int, *,
                  tokens: list[str] | None = None, tasks: Sequence[str] | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The second stage's pool among the first stage's scored rows ``idx`` (``scored`` aligned with
    them, ``kw_raw`` their raw BM25), its features and its first-stage order: ``(local, X, first)``,
    ``local`` indices into ``idx``, ``first`` the rank of each (0 best; ties: the higher row). The one
    path training (:mod:`cybmem.retrieval.ranker_training`) and dispatch (:mod:`cybmem.retrieval.ranker`) take."""
    w = scored.weights
    ended = snap.ended_ms()[idx]
    local = pool(scored.total, kw_raw, ended)
    rows = idx[local]
    X = features(snap, query, rows, total=scored.total[local], keyword=axis_value(scored.keyword, w.w_kw, local),
                 recency=axis_value(scored.recency, w.w_rec, local), lineage=axis_value(scored.lineage, w.w_lin, local),
                 kw_raw=kw_raw[local], now_ms=now_ms, tasks=tasks, tokens=tokens)
    first = np.empty(len(rows), np.int64)
    first[np.lexsort((-rows, -scored.total[local]))] = np.arange(len(rows))
    return local, X, first
