"""A fast search over the scorer's weights, against relevance judgments (cybmem.retrieval.judgments).

Every query is evaluated as production would have answered it then: only
records with ``endedAt <= asOf`` that were not superseded by then are candidates, the query's own
run is excluded, recency is measured from ``asOf``, the lineage context is the query's
parent / chat session / latest prior run, and the parent, when it is a candidate, is shown first
whatever the weights (exactly :func:`cybmem.retrieval.search.search` with ``as_of`` and ``pin_parent``,
what dispatch runs). So the parent stays out of the pools, every other run ranks one place lower,
and a relevant parent is first under every weighting (a ``parent`` judgment is always met).
Relevant runs that did not exist yet are dropped; a query left with none is skipped. One
deliberate approximation shared with ``search(as_of=...)``: BM25's idf and average length come
from the whole index, not from the records of that moment.

The weight search (:func:`axis_matrices`, :func:`grid_search`):

1. For each judgment, once: the per-axis values of every candidate - normalised BM25,
   age in ms (any half-life is then one ``exp``), lineage affinity (and cosine when the store
   has embeddings) - reduced to a *pool*: the union, per lineage level, of the first ``k``
   skyline layers of (keyword, newness) and of (keyword, row order). A record outside every such
   band is beaten by ``k`` others under every non-negative weighting and every half-life
   (recency is monotone in age for all of them), so for metrics cut at ``k`` the pool is exact,
   up to float32 near-ties. With a vector axis the pool also takes the (cosine, newness) layers,
   which is then an approximation (a record strong on three continuous axes at once but on no
   pair of them could be missed).
2. For each (judgment, relevant run) pair: the pool records that beat it whatever the weights
   are counted once; those it beats whatever the weights are dropped; the rest form a small
   difference matrix ``D`` (records x axes). For a grid of weight vectors ``W`` (axes x G),
   ``D @ W > 0`` counts, at every grid point at once, the records ranked above the relevant run
   (ties go to the higher row, as :func:`cybmem.retrieval.scoring.top_k` breaks them), which gives its rank.
   Weight vectors that are multiples of each other rank identically and are evaluated once.

So the grid costs ``pairs x uncertain records x grid points`` multiply-adds per half-life, with
no re-scoring of the store (benchmarks/bench_tune.py has the figures).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..store.keyword_index import RunLookup
from ..store.embeddings import read_rows
from ..errors import CybmemError, ValidationError
from .judgments import JUDGMENT_KINDS, METRICS, Judgment, JudgmentSet, check_metric, judgment_set, kinds_of
from ..progress import Progress
from .scoring import lineage_affinity, normalize_keyword, ranking_order, recency_of_age
from .search import parent_row, dispatch_context
from ..settings import Settings
from ..store.snapshot import Snapshot, load_snapshot
from ..store.memory_store import MemoryStore
from ..store.tokens import tokenize
from .weights import WEIGHTS_FILE, Weights, check_range, read_evidence, save_weights, tuned_note, weight_files, weights_for

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "DEFAULT_HALF_LIVES",
    "AxisMatrices",
    "axis_matrices",
    "evaluate",
    "comparison_frame",
    "GridResult",
    "grid_search",
    "tune",
    "Validation",
    "time_folds",
    "kind_weights",
    "Evaluation",
    "evaluate_weights",
    "Bench",
    "prepare",
    "check_weights",
    "check_evidence",
    "refusal_of",
    "save_project_weights",
    "evidence_of",
    "auto_tune",
    "retune_due",
    "spawn_auto_tune",
    "RETUNE_MIN_RECORDS",
    "MIN_KEYWORD_JUDGMENTS",
    "MIN_FOLD",
    "MIN_JUDGMENTS",
    "bootstrap_interval",
    "weights_state",
]

DEFAULT_HALF_LIVES = (1.0, 3.0, 7.0, 14.0, 30.0, 60.0, 120.0, 365.0)
_AXES = ("w_kw", "w_rec", "w_lin", "w_vec")
_BLOCK_ROWS = 512  # padded difference rows per block of pairs
_TILE_ELEMENTS = 1 << 17  # float32 elements per tile of D @ W (512 kB: stays in L2)


def _progress(total: int, label: str, progress: bool | None) -> Progress:
    return Progress(total, label, enabled=progress)


# --------------------------------------------------------------------------------------
# Per-query axis values over a candidate pool
# --------------------------------------------------------------------------------------


def _layers(order: np.ndarray, values: np.ndarray, k: int) -> np.ndarray:
    """Entries of ``order`` in the first ``k`` skyline layers of (position in order, value).

    ``order`` lists candidates best-first on one axis; an entry is on the current layer when
    its value beats (strictly) every remaining entry before it. The union of the first k
    layers contains every entry that fewer than k others dominate.
    """
    v = values[order]
    if len(v) > 4 * k:
        # Cheap pre-filter: an entry worse than the k-th best of a prefix before it is
        # dominated k times (prefixes double, so this is O(n)).
        keep = np.ones(len(v), dtype=bool)
        b = k
        while b < len(v):
            t = np.partition(v[:b], b - k)[b - k]
            e = min(2 * b, len(v))
            keep[b:e] = v[b:e] >= t
            b = e
        order, v = order[keep], v[keep]
    kept = []
    rest = np.arange(len(v))
    for _ in range(k):
        if not len(rest):
            break
        vr = v[rest]
        prev = np.empty_like(vr)
        prev[0] = -np.inf
        np.maximum.accumulate(vr[:-1], out=prev[1:])
        on = vr > prev
        kept.append(rest[on])
        rest = rest[~on]
    return order[np.concatenate(kept)] if kept else order[:0]


def _top(order: np.ndarray, values: np.ndarray, k: int) -> np.ndarray:
    """The k entries of ``order`` with the highest values; ties go to the earlier entry."""
    if len(order) <= k:
        return order
    v = values[order]
    t = np.partition(v, len(v) - k)[len(v) - k]
    cand = np.flatnonzero(v >= t)
    pos = cand[ranking_order(v[cand], -cand)[:k]]  # ties: the earlier entry ranks as the newer
    return order[pos]


@dataclass
class AxisMatrices:
    """Per-judgment axis values over each judgment's candidate pool, computed once.

    Pool entries of judgment ``q`` are ``offsets[q]:offsets[q+1]`` of the flat arrays.
    """

    judgments: list[Judgment]  # the evaluable ones, aligned with the pools
    skipped: list[tuple[Judgment, str]]
    k: int
    offsets: np.ndarray  # int64, len(judgments) + 1
    rows: np.ndarray  # int64 snapshot row of each pool entry
    keyword: np.ndarray  # float32 BM25 normalised over the query's candidates
    age_ms: np.ndarray  # float32 asOf - endedAt (clipped at 0): scoring.recency_of_age makes it recency
    lineage: np.ndarray  # float32 lineage affinity
    vector: np.ndarray | None  # float32 cosine, or None (no embeddings)
    relevant: np.ndarray  # bool: entry is a relevant run of its judgment
    n_relevant: np.ndarray  # int64 relevant runs that existed, per judgment
    n_candidates: np.ndarray  # int64 candidates (records existing at asOf), per judgment
    run_ids: list[str] = field(repr=False, default_factory=list)  # snapshot row -> run id
    seconds: float = 0.0  # time to compute
    weights: np.ndarray | None = None  # float64 weight of each judgment in the mean (None: equal)
    # The parent that dispatch shows first (cybmem.retrieval.search.rank_query's pin_parent): its row per
    # judgment (-1: none, e.g. no parent or not a candidate then). It is left out of the pool, and
    # every other run ranks one place lower; a relevant parent ranks first whatever the weights.
    pinned: np.ndarray | None = None  # int64 (judgments,)
    pinned_relevant: np.ndarray | None = None  # bool (judgments,): that parent is a relevant run
    _pairs: "_Pairs | None" = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.pinned is None:
            self.pinned = np.full(len(self.judgments), -1, dtype=np.int64)
        if self.pinned_relevant is None:
            self.pinned_relevant = np.zeros(len(self.judgments), dtype=bool)

    def subset(self, keep: Sequence[int]) -> "AxisMatrices":
        """The same pools for some of the judgments (by position), without recomputing anything."""
        keep = [int(q) for q in keep]
        spans = [np.arange(self.offsets[q], self.offsets[q + 1]) for q in keep]
        flat = np.concatenate(spans) if spans else np.zeros(0, np.int64)
        offsets = np.zeros(len(keep) + 1, dtype=np.int64)
        np.cumsum([len(x) for x in spans], out=offsets[1:])
        pick = lambda a: None if a is None else a[flat]  # noqa: E731
        return AxisMatrices(
            judgments=[self.judgments[q] for q in keep], skipped=[], k=self.k, offsets=offsets, rows=self.rows[flat],
            keyword=self.keyword[flat], age_ms=self.age_ms[flat], lineage=self.lineage[flat], vector=pick(self.vector),
            relevant=self.relevant[flat], n_relevant=self.n_relevant[keep], n_candidates=self.n_candidates[keep],
            run_ids=self.run_ids, weights=None if self.weights is None else self.weights[keep],
            pinned=self.pinned[keep], pinned_relevant=self.pinned_relevant[keep],
        )

    @property
    def n(self) -> int:
        """Number of evaluable judgments."""
        return len(self.judgments)

    @property
    def has_vectors(self) -> bool:
        return self.vector is not None

    def axes(self, half_life_days: float) -> np.ndarray:
        """Pool axis values for one half-life: float32 (entries x 3 or 4): kw, recency, lineage[, cosine]."""
        rec = recency_of_age(self.age_ms, half_life_days)
        cols = [self.keyword, rec, self.lineage] + ([self.vector] if self.vector is not None else [])
        return np.stack(cols, axis=1)

    def ranking(self, q: int, weights: Weights, k: int | None = None) -> list[str]:
        """Top run ids of judgment ``q`` under ``weights`` (from its pool; exact within ``self.k``)."""
        s, e = int(self.offsets[q]), int(self.offsets[q + 1])
        a = self.axes(weights.half_life_days)[s:e]
        w = np.array([weights.w_kw, weights.w_rec, weights.w_lin] + ([weights.w_vec] if self.vector is not None else []),
                     dtype=np.float32)
        total = np.zeros(e - s, dtype=np.float32)
        for c in range(a.shape[1]):  # the order scoring.score adds the axes in
            if w[c] > 0:
                total += a[:, c] * w[c]
        order = ranking_order(total, self.rows[s:e])
        pin = [self.run_ids[int(self.pinned[q])]] if self.pinned[q] >= 0 else []
        return (pin + [self.run_ids[int(self.rows[s + i])] for i in order])[: (k or self.k)]

    def summary(self) -> dict[str, Any]:
        """Sizes, for printing."""
        pools = np.diff(self.offsets)
        return {"judgments": self.n, "skipped": len(self.skipped), "k": self.k,
                "poolMedian": float(np.median(pools)) if len(pools) else 0.0,
                "poolMax": int(pools.max()) if len(pools) else 0,
                "candidatesMedian": float(np.median(self.n_candidates)) if len(pools) else 0.0,
                "seconds": round(self.seconds, 4)}


def _embeddings_matrix(snapshot: Snapshot, model: str | None = None) -> np.ndarray | None:
    """Row-aligned float32 vectors of ``model`` (default: the model most lines of embeddings.jsonl
    name), as search reads them (:func:`cybmem.retrieval.vector_cache.load_index`: the model's newest dimension,
    the last vector of each run), or None when there are none."""
    from .vector_cache import load_index

    if model is None:
        counts: dict[str, int] = {}
        for _, row in read_rows(snapshot.store.embeddings_path)[0]:
            counts[row["model"]] = counts.get(row["model"], 0) + 1
        if not counts:
            return None
        model = max(counts, key=lambda name: (counts[name], name))
    index = load_index(snapshot, model)
    if index is None:
        return None
    mat = np.zeros((index.n, index.dims), dtype=np.float32)
    for b in index.blocks:
        mat[b.start:b.stop] = b.matrix
    return mat


def embed_queries(judgments: Sequence[Judgment], settings: Settings,
                  progress: bool | None = None) -> tuple[dict[str, np.ndarray], str | None]:
    """The embedding of every judgment's query text, as dispatch embeds a task (the configured
    model, CYBERINE_MEMORY_EMBEDDINGS); ({}, why) when they cannot be had. Never the query
    run's stored vector: that one was made from its record, summary and outcome included, which
    dispatch does not know yet."""
    from ..store.embeddings import embedding_text
    from .vectors import embed_config_of

    config, problem = embed_config_of(settings)
    if config is None:
        return {}, problem or "CYBERINE_MEMORY_EMBEDDINGS is not set, so the queries cannot be embedded"
    texts = list(dict.fromkeys(t for t in (embedding_text(j.query) for j in judgments) if t))
    if not texts:
        return {}, "no judgment has query text to embed"
    from ..clients.model_servers import Embedder

    bar = _progress(len(texts), "embedding queries", progress)
    try:
        with Embedder(config) as embedder:
            out: dict[str, np.ndarray] = {}
            for start in range(0, len(texts), 64):
                batch = texts[start:start + 64]
                for text, vec in zip(batch, embedder.embed(batch)):
                    out[text] = np.asarray(vec, dtype=np.float32)
                bar.update(len(batch))
    except CybmemError as exc:
        return {}, f"the queries could not be embedded ({' '.join(str(exc).split())})"
    finally:
        bar.close()
    return out, None


def _query_vectors(snap: Snapshot, judgments: Sequence[Judgment], settings: Settings | None,
                   progress: bool | None) -> tuple[dict[str, np.ndarray] | None, str, str | None]:
    """The queries' embeddings when the store has vectors (else None), why there are none, and the
    model they were made with (the stored vectors of that model are the ones to compare them with)."""
    if not snap.store.embeddings_path.exists():
        return None, "", None
    from .vectors import embed_config_of

    settings = settings or Settings.from_env()
    vecs, why = embed_queries(judgments, settings, progress)
    config, _ = embed_config_of(settings)
    return (vecs or None), ("" if vecs else f"w_vec is not searched: {why}"), (config.model if config else None)


def axis_matrices(snapshot: Snapshot, judgments: Sequence[Judgment], *, k: int = 10,
                  vectors: bool | None = None, query_vectors: dict[str, np.ndarray] | None = None,
                  model: str | None = None, progress: bool | None = None) -> AxisMatrices:
    """Compute, once per judgment, the axis values of the candidates that can matter at cut-off ``k``.

    Args:
        snapshot: the store the judgments are about.
        judgments: queries with their relevant runs (merge them first if lines repeat a query).
        k: the largest cut-off the metrics will use (pool depth, see the module docstring).
        vectors: include the cosine axis from the store's embeddings.jsonl. None: when the store
            has embeddings and ``query_vectors`` are given.
        query_vectors: the embedding of each query text (:func:`embed_queries`); without them
            there is no honest query vector, and the cosine axis is left out.
        progress: draw a progress bar on stderr (None: when stderr is a TTY).

    Returns:
        :class:`AxisMatrices`; judgments that cannot be evaluated (no candidate, or no relevant
        run existed at ``asOf``) are listed in ``skipped`` with the reason.
    """
    if k < 1:
        raise ValidationError(f"k must be at least 1, got {k}")
    t0 = time.perf_counter()
    r = snapshot.records
    n = r.num_rows
    ids = r.column("runId").to_pylist()
    row_of = {rid: i for i, rid in enumerate(ids)}
    ended = snapshot.ended_ms() if n else np.zeros(0, np.int64)
    emb = None
    if vectors is not False and n and (query_vectors or vectors):
        emb = _embeddings_matrix(snapshot, model)
        if vectors and emb is None:
            raise ValidationError(f"project {snapshot.store.slug} has no usable embeddings.jsonl; tune without vectors")
        if vectors and not query_vectors:
            raise ValidationError("the cosine axis needs the queries' embeddings (embed_queries); a query run's stored "
                                  "vector would leak its own outcome")
        if emb is not None and query_vectors and len(next(iter(query_vectors.values()))) != emb.shape[1]:
            raise ValidationError(f"the query embeddings have {len(next(iter(query_vectors.values())))} dimensions, the "
                                  f"stored vectors {emb.shape[1]}: embed with the model the store was embedded with")
    emb_norms = np.linalg.norm(emb, axis=1) if emb is not None else None
    # Supersession: a relevant run corrected by then is represented by its correction.
    corrected_by = snapshot.supersession() if n else {}
    lookup = RunLookup.build(r.column("runId")) if n else None
    cols = {c: r.column(c).combine_chunks() for c in ("runId", "parentRunId", "previousRunId", "rootRunId", "chatSessionId")} if n else {}
    # Newest first (ties: higher row first, as top_k breaks them) and plain row order, once.
    rows_all = np.arange(n, dtype=np.int64)
    by_new = snapshot.newest_first() if n else rows_all
    by_row = rows_all[::-1]

    kept: list[Judgment] = []
    skipped: list[tuple[Judgment, str]] = []
    parts: dict[str, list[np.ndarray]] = {x: [] for x in ("rows", "kw", "age", "lin", "vec", "rel")}
    n_rel: list[int] = []
    n_cand: list[int] = []
    pinned: list[int] = []
    pinned_rel: list[bool] = []
    bar = _progress(len(judgments), "axis values", progress)
    for j in judgments:
        bar.update()
        if not n:
            skipped.append((j, "the store has no records"))
            continue
        mask = snapshot.candidates(j.as_of)
        qrow = row_of.get(j.query_run_id) if j.query_run_id else None
        if qrow is not None:
            mask[qrow] = False
        if not mask.any():
            skipped.append((j, "no run existed at asOf"))
            continue
        rel_rows = []
        for rid in j.relevant:
            seen = set()
            while rid in row_of and not mask[row_of[rid]] and rid in corrected_by and rid not in seen:
                seen.add(rid)
                rid = corrected_by[rid]
            i = row_of.get(rid)
            if i is not None and mask[i] and i not in rel_rows:
                rel_rows.append(i)
        if not rel_rows:
            skipped.append((j, "no relevant run existed at asOf"))
            continue
        kw = normalize_keyword(snapshot.index.scores(tokenize(j.query)), mask)
        ctx = dispatch_context(snapshot, mask, j.parent_run_id, j.chat_session_id)
        pin = parent_row(snapshot, mask, j.parent_run_id, j.as_of)  # shown first by dispatch: out of the pool
        if pin is not None:
            mask = mask.copy()
            mask[pin] = False
        lin = lineage_affinity(cols["runId"], cols["parentRunId"], cols["previousRunId"], cols["rootRunId"],
                               cols["chatSessionId"], ctx, lookup=lookup)
        vec = None
        if emb is not None:
            from ..store.embeddings import embedding_text

            qv = query_vectors.get(embedding_text(j.query) or "")
            qn = float(np.linalg.norm(qv)) if qv is not None else 0.0
            vec = np.zeros(n, dtype=np.float32)
            if qn > 0:
                np.divide(emb @ (qv / np.float32(qn)), emb_norms, out=vec, where=emb_norms > 0)
                np.clip(vec, 0.0, 1.0, out=vec)
        new_order = by_new[mask[by_new]]
        row_order = by_row[mask[by_row]]
        pool = [np.asarray([i for i in rel_rows if i != pin], dtype=np.int64)]
        levels = np.unique(lin[new_order])
        for lv in levels:
            on_new = new_order[lin[new_order] == lv] if len(levels) > 1 else new_order
            on_row = row_order[lin[row_order] == lv] if len(levels) > 1 else row_order
            pool.append(_layers(on_new, kw, k))  # kw and recency, any half-life
            pool.append(_top(on_row, kw, k))  # w_rec = 0: kw alone, ties to the higher row
            pool.append(on_row[:k])  # lineage alone: ties to the higher row
            if vec is not None:
                pool.append(_layers(on_new, vec, k))
                pool.append(_top(on_row, vec, k))
        rows = np.unique(np.concatenate(pool))
        age = np.maximum(np.int64(j.as_of) - ended[rows], 0).astype(np.float32)
        parts["rows"].append(rows)
        parts["kw"].append(kw[rows])
        parts["age"].append(age)
        parts["lin"].append(lin[rows])
        if vec is not None:
            parts["vec"].append(vec[rows])
        parts["rel"].append(np.isin(rows, rel_rows))
        n_rel.append(len(rel_rows))
        n_cand.append(int(mask.sum()) + (pin is not None))
        pinned.append(-1 if pin is None else pin)
        pinned_rel.append(pin is not None and pin in rel_rows)
        kept.append(j)
    bar.close()

    def flat(name: str, dtype) -> np.ndarray:
        return np.concatenate(parts[name]).astype(dtype, copy=False) if parts[name] else np.zeros(0, dtype)

    offsets = np.zeros(len(kept) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in parts["rows"]], out=offsets[1:])
    return AxisMatrices(
        judgments=kept, skipped=skipped, k=k, offsets=offsets, rows=flat("rows", np.int64),
        keyword=flat("kw", np.float32), age_ms=flat("age", np.float32), lineage=flat("lin", np.float32),
        vector=flat("vec", np.float32) if emb is not None else None, relevant=flat("rel", bool),
        n_relevant=np.asarray(n_rel, dtype=np.int64), n_candidates=np.asarray(n_cand, dtype=np.int64),
        run_ids=ids, seconds=time.perf_counter() - t0, pinned=np.asarray(pinned, dtype=np.int64),
        pinned_relevant=np.asarray(pinned_rel, dtype=bool),
    )


# --------------------------------------------------------------------------------------
# Vectorised evaluation over a grid
# --------------------------------------------------------------------------------------


@dataclass
class _Pairs:
    """(judgment, relevant run) pairs with the pool entries whose order against them depends on W."""

    query: np.ndarray  # int64 judgment of each pair
    rel: np.ndarray  # int64 flat pool index of the relevant entry
    always: np.ndarray  # int64 entries ranked above it under every weighting
    ge_idx: np.ndarray  # int64 (pairs x Uge) flat pool indices that win ties (higher row); -1 = pad
    gt_idx: np.ndarray  # int64 (pairs x Ugt) flat pool indices that lose ties; -1 = pad


def _pairs(m: AxisMatrices) -> _Pairs:
    """Classify every pool entry against every relevant entry of its judgment (cached on ``m``)."""
    if m._pairs is None:
        m._pairs = _classify(m)
    return m._pairs


def _classify(m: AxisMatrices) -> _Pairs:
    # Recency is monotone in age, so comparisons on "newness" hold for every half-life.
    cols = [m.keyword, -m.age_ms, m.lineage] + ([m.vector] if m.vector is not None else [])
    feats = np.stack(cols, axis=1)
    q_list, r_list, always, ge_rows, gt_rows = [], [], [], [], []
    for q in range(m.n):
        s, e = int(m.offsets[q]), int(m.offsets[q + 1])
        f = feats[s:e]
        rows = m.rows[s:e]
        for ri in np.flatnonzero(m.relevant[s:e]):
            d = f - f[ri]
            higher = rows > rows[ri]
            ge0 = (d >= 0).all(axis=1)
            le0 = (d <= 0).all(axis=1)
            certain_win = ge0 & higher  # d.w >= 0 always, ties go to it
            never = le0 & ~higher  # d.w <= 0 always, ties go to the relevant run
            never[ri] = True
            n_always = int(certain_win.sum()) + int(m.pinned[q] >= 0)  # the parent shown first
            if n_always >= m.k:
                continue  # below the cut-off under every weighting: contributes 0
            unsure = ~(certain_win | never)
            q_list.append(q)
            r_list.append(s + ri)
            always.append(n_always)
            ge_rows.append(s + np.flatnonzero(unsure & higher))
            gt_rows.append(s + np.flatnonzero(unsure & ~higher))

    def pad(lists: list[np.ndarray]) -> np.ndarray:
        width = max((len(x) for x in lists), default=0)
        out = np.full((len(lists), width), -1, dtype=np.int64)
        for i, x in enumerate(lists):
            out[i, : len(x)] = x
        return out

    order = np.argsort([max(len(a), len(b)) for a, b in zip(ge_rows, gt_rows)], kind="stable")  # similar widths per block
    pick = lambda xs: [xs[i] for i in order]  # noqa: E731
    return _Pairs(query=np.asarray(pick(q_list), dtype=np.int64), rel=np.asarray(pick(r_list), dtype=np.int64),
                  always=np.asarray(pick(always), dtype=np.int64), ge_idx=pad(pick(ge_rows)), gt_idx=pad(pick(gt_rows)))


def _ranks_block(axes: np.ndarray, pairs: _Pairs, sl: slice, W: np.ndarray) -> np.ndarray:
    """Ranks (1-based) of the relevant entries of pairs[sl] at every column of W (axes x G).

    D @ W is computed in cache-sized tiles (a 2-D GEMM with 3-4 inner dims is bound by memory
    traffic, so tiles that stay in L2 run faster than one big product).
    """
    rel = axes[pairs.rel[sl]]  # (b, A)
    b, G = len(rel), W.shape[1]
    counts = np.zeros((b, G), dtype=np.uint16)
    for idx, strict in ((pairs.ge_idx[sl], False), (pairs.gt_idx[sl], True)):
        used = int((idx >= 0).sum(axis=1).max()) if idx.size else 0
        if not used:
            continue
        idx = idx[:, :used]
        pad = idx < 0
        d = axes[np.where(pad, 0, idx)] - rel[:, None, :]  # (b, U, A)
        d[pad] = -1.0  # d.w < 0 for any non-zero w: never counted
        d2 = d.reshape(b * used, -1)
        step = max(1, _TILE_ELEMENTS // (b * used))
        for g0 in range(0, G, step):
            s = d2 @ W[:, g0 : g0 + step]
            hit = (s > 0) if strict else (s >= 0)
            counts[:, g0 : g0 + step] += np.add.reduce(hit.view(np.uint8).reshape(b, used, -1), axis=1, dtype=np.uint16)
    ranks = counts.astype(np.int32)
    ranks += pairs.always[sl, None].astype(np.int32) + 1
    return ranks


def _blocks(pairs: _Pairs) -> list[slice]:
    """Consecutive pair ranges of at most _BLOCK_ROWS padded rows (pairs are sorted by width)."""
    widths = np.maximum((pairs.ge_idx >= 0).sum(axis=1), (pairs.gt_idx >= 0).sum(axis=1))
    out, start, n = [], 0, len(widths)
    while start < n:
        end = start + 1
        while end < n and (end + 1 - start) * max(int(widths[end]), 1) <= _BLOCK_ROWS:
            end += 1
        out.append(slice(start, end))
        start = end
    return out


def _metric_values(m: AxisMatrices, pairs: _Pairs, W_by_h: Sequence[tuple[float, np.ndarray]], metric: str,
                   k: int, bar: Progress | None = None, per_query: bool = False) -> list[np.ndarray]:
    """Mean metric over the judgments for each (half-life, W) block: a list of (G,) arrays
    (``per_query``: of (judgments, G) arrays)."""
    out = []
    n_rel = m.n_relevant.astype(np.float64)
    ideal = np.array([sum(1.0 / math.log2(i + 1) for i in range(1, min(int(c), k) + 1)) for c in m.n_relevant])
    disc = np.zeros(k + 1)
    disc[1:] = 1.0 / np.log2(np.arange(2, k + 2))
    for h, W in W_by_h:
        axes = m.axes(h)
        G = W.shape[1]
        acc = np.zeros((m.n, G), dtype=np.float64)
        for sl in _blocks(pairs):
            ranks = _ranks_block(axes, pairs, sl, W)
            inside = ranks <= k
            q = pairs.query[sl]
            if metric == "mrr":
                np.maximum.at(acc, q, np.where(inside, 1.0 / ranks, 0.0))
            elif metric == "recall":
                np.add.at(acc, q, inside / n_rel[q, None])
            else:
                np.add.at(acc, q, disc[np.minimum(ranks, k) * inside] / ideal[q, None])
            if bar is not None:
                bar.update(0)
        first = np.flatnonzero(m.pinned_relevant)  # a relevant parent: first under every weighting
        if len(first):
            if metric == "mrr":
                acc[first] = 1.0
            elif metric == "recall":
                acc[first] += 1.0 / n_rel[first, None]
            else:
                acc[first] += disc[1] / ideal[first, None]
        if per_query:
            out.append(acc)
        elif m.weights is None:
            out.append(acc.sum(axis=0) / max(m.n, 1))
        else:  # a weighted mean (see tune: kinds of judgments count alike)
            out.append((acc * m.weights[:, None]).sum(axis=0) / max(float(m.weights.sum()), 1e-12))
        if bar is not None:
            bar.update()
    return out


def _weight_vector(w: Weights, with_vec: bool) -> list[float]:
    return [w.w_kw, w.w_rec, w.w_lin] + ([w.w_vec] if with_vec else [])


def evaluate(m: AxisMatrices, weights: Weights, *, metric: str = "mrr", k: int | None = None,
             per_query: bool = False) -> float | np.ndarray:
    """The metric of one weighting over the judgments of ``m``.

    Args:
        m: from :func:`axis_matrices`.
        weights: the weights (and half-life) to evaluate.
        metric: one of :data:`METRICS`.
        k: cut-off (default and maximum: ``m.k``).
        per_query: return each judgment's value instead of the mean.

    Returns:
        The mean metric in [0, 1] (0.0 when there is no judgment), or the per-judgment array.
    """
    k = m.k if k is None else k
    check_metric(metric, k)
    if k > m.k:
        raise ValidationError(f"k={k} is deeper than the pools were built for (k={m.k}); rebuild with axis_matrices(k={k})")
    if not m.n:
        return np.zeros(0) if per_query else 0.0
    W = np.asarray(_weight_vector(weights, m.has_vectors), dtype=np.float32)[:, None]
    if not W.any():
        raise ValidationError("all weights are 0; give at least one axis a positive weight")
    vals = _metric_values(m, _pairs(m), [(weights.half_life_days, W)], metric, k, per_query=per_query)[0]
    return vals[:, 0] if per_query else float(vals[0])


def comparison_frame(m: AxisMatrices, weights: Mapping[str, Weights], *,
                     metrics: Sequence[str] = tuple(METRICS), k: int | None = None) -> "pd.DataFrame":
    """A before/after table: one row per named weighting, its weights and every metric.

    Args:
        m: from :func:`axis_matrices`.
        weights: name -> weights, e.g. ``{"current": result.current, "best": result.best}``.
        metrics: metric names (:data:`METRICS`).
        k: cut-off (default ``m.k``).

    Returns:
        DataFrame indexed by name: w_kw, w_rec, w_lin, w_vec, half_life_days, then ``MRR@k``...
    """
    import pandas as pd

    k = m.k if k is None else k
    rows = {}
    for name, w in weights.items():
        row: dict[str, float] = dict(w.to_dict())
        for metric in metrics:
            row[f"{METRICS[metric]}@{k}"] = round(float(evaluate(m, w, metric=metric, k=k)), 4)
        rows[name] = row
    return pd.DataFrame.from_dict(rows, orient="index")


@dataclass
class GridResult:
    """A weight search: the whole grid of metric values, the best point and the current one."""

    metric: str
    k: int
    axes: dict[str, np.ndarray]  # w_kw, w_rec, w_lin, w_vec, half_life_days -> searched values
    values: np.ndarray  # metric per grid point, shape = lengths of axes (NaN: all weights 0)
    best: Weights
    best_metric: float
    current: Weights
    current_metric: float
    judgments: int
    skipped: int
    points: int  # grid points
    evaluated: int  # distinct rankings actually evaluated (multiples of a weight vector rank alike)
    seconds: float  # grid search time (without the axis precompute)
    precompute_seconds: float = 0.0
    best_in_grid: bool = True  # False: no grid point beat the current weights, best = current
    source: str = ""  # where the judgments came from, for people
    kinds: dict[str, int] = field(default_factory=dict)  # evaluable judgments per kind
    keyword_held: str = ""  # why w_kw was not searched (empty: it was)
    vector_note: str = ""  # why w_vec was not searched although the store has vectors (empty: it was, or none)
    met_note: str = ""  # every judgment is met whatever the weights (empty: not so)
    validation: "Validation | None" = None  # the same search on the earlier judgments, scored on the later
    derived: bool = False  # the judgments were derived from the store
    as_of: int | None = None  # tuned as of this moment (None: everything)
    tests: int = 0  # judgments whose answer depends on the weights (not the pinned parent's)
    state: tuple[int, int, int] | None = None  # weights.json when tuning began (weights_state)
    records: int = 0  # runs the tuning saw
    bench: "Bench | None" = field(default=None, repr=False)  # what tune() scored on (None: a bare grid_search)

    @property
    def saves(self) -> Weights | None:
        """What ``--save`` writes: the weights tuned on the earlier judgments and checked on the
        later ones (None: too few judgments to check any)."""
        return self.validation.tuned if self.validation is not None else None

    @property
    def refusal(self) -> str | None:
        """Why ``cybmem tune --save`` will not save :attr:`saves` without --force (None: it will):
        :func:`refusal_of`, the guard every path that saves weights passes."""
        return refusal_of(self.tests, self.judgments, self.validation, self.current, keyword_held=self.keyword_held)

    @property
    def label(self) -> str:
        """e.g. ``MRR@10``."""
        return f"{METRICS[self.metric]}@{self.k}"

    @property
    def warnings(self) -> list[str]:
        """What reading the judgments skipped (e.g. malformed used.jsonl lines), one line each."""
        return list(self.bench.judgment_set.warnings) if self.bench is not None else []

    @property
    def left_out(self) -> dict[str, int]:
        """The "used" judgments left out, by why (clock, share) and used runs cut (capped)."""
        return dict(self.bench.judgment_set.left_out) if self.bench is not None else {}

    @property
    def improvement(self) -> float:
        return self.best_metric - self.current_metric

    def to_frame(self) -> "pd.DataFrame":
        """The grid as a long DataFrame: one row per point, a column per axis plus ``metric``."""
        import pandas as pd

        names = list(self.axes)
        mesh = np.meshgrid(*[self.axes[a] for a in names], indexing="ij")
        df = pd.DataFrame({a: g.ravel() for a, g in zip(names, mesh)})
        df["metric"] = self.values.ravel()
        return df

    def slice2d(self, x: str, y: str, *, reduce: str = "best") -> np.ndarray:
        """A 2-D view of the grid, shape (len(axes[y]), len(axes[x])).

        ``reduce="best"`` fixes every other axis at the best point's value (when the best point
        is the current one, at the nearest grid value); ``"max"`` takes the max over them.
        """
        names = list(self.axes)
        for a in (x, y):
            if a not in names:
                raise ValidationError(f"unknown grid axis {a!r}; choose from {', '.join(names)}")
        if x == y:
            raise ValidationError("x and y must be different grid axes")
        v = self.values
        if reduce == "max":
            other = tuple(i for i, a in enumerate(names) if a not in (x, y))
            with np.errstate(all="ignore"):
                v = np.nanmax(np.where(np.isnan(v), -np.inf, v), axis=other) if other else v
            v = np.where(np.isinf(v), np.nan, v)
            keep = [a for a in names if a in (x, y)]
        elif reduce == "best":
            best = self.best.to_dict()
            idx = []
            for a in names:
                if a in (x, y):
                    idx.append(slice(None))
                else:
                    idx.append(int(np.argmin(np.abs(self.axes[a] - best[a]))))
            v = v[tuple(idx)]
            keep = [a for a in names if a in (x, y)]
        else:
            raise ValidationError(f"reduce must be 'best' or 'max', not {reduce!r}")
        return v if keep == [y, x] else v.T

    def to_dict(self, *, grid: bool = False) -> dict[str, Any]:
        """JSON-ready summary (``grid=True`` adds every point)."""
        out: dict[str, Any] = {
            "kinds": dict(self.kinds), "keywordHeld": self.keyword_held or None,
            "vectorNote": self.vector_note or None, "metNote": self.met_note or None, "refusal": self.refusal,
            "validation": self.validation.to_dict() if self.validation is not None else None,
            "saves": self.saves.to_dict() if self.saves is not None else None, "asOf": self.as_of,
            "testsWeights": self.tests, "warnings": self.warnings,
            "usedLeftOut": self.left_out,
            "metric": self.metric, "k": self.k, "label": self.label,
            "current": {**self.current.to_dict(), "value": round(self.current_metric, 6)},
            "best": {**self.best.to_dict(), "value": round(self.best_metric, 6)},
            "improvement": round(self.improvement, 6), "bestInGrid": self.best_in_grid,
            "judgments": self.judgments, "skipped": self.skipped, "points": self.points, "evaluated": self.evaluated,
            "source": self.source, "seconds": round(self.seconds, 4), "precomputeSeconds": round(self.precompute_seconds, 4),
            "axes": {a: [float(x) for x in v] for a, v in self.axes.items()},
        }
        if grid:
            out["values"] = [None if math.isnan(x) else round(float(x), 6) for x in self.values.ravel()]
        return out


def _values(v: Iterable[float] | None, default: Sequence[float], name: str) -> np.ndarray:
    arr = np.asarray(sorted(set(round(float(x), 6) for x in (default if v is None else v))), dtype=np.float64)
    if not len(arr):
        raise ValidationError(f"{name}: give at least one value")
    for x in arr:
        check_range(name, x)  # a weight of 1e300 would turn every score into NaN
    return arr


def grid_search(m: AxisMatrices, *, metric: str = "mrr", k: int | None = None, steps: int = 11,
                w_kw: Iterable[float] | None = None, w_rec: Iterable[float] | None = None,
                w_lin: Iterable[float] | None = None, w_vec: Iterable[float] | None = None,
                half_lives: Iterable[float] | None = None, current: Weights | None = None,
                progress: bool | None = None) -> GridResult:
    """Evaluate every combination of weight values and half-lives, reusing ``m``.

    Args:
        m: from :func:`axis_matrices`.
        metric: one of :data:`METRICS`.
        k: cut-off (default and maximum: ``m.k``).
        steps: values per weight when a weight's values are not given: ``linspace(0, 1, steps)``.
        w_kw, w_rec, w_lin, w_vec: explicit values per weight. ``w_vec`` is searched only when
            ``m`` has a vector axis (otherwise it stays at the current value).
        half_lives: days; default :data:`DEFAULT_HALF_LIVES` plus the current half-life.
        current: the weights in use (default: :class:`~cybmem.retrieval.scoring.Weights` defaults).
        progress: progress bar on stderr (None: when stderr is a TTY).

    Returns:
        :class:`GridResult`. Among equal best points the one nearest the current weights
        (direction, then log half-life) wins; if no grid point beats the current weights, the
        current weights are reported as best (``best_in_grid=False``).
    """
    k = m.k if k is None else k
    check_metric(metric, k)
    if k > m.k:
        raise ValidationError(f"k={k} is deeper than the pools were built for (k={m.k}); rebuild with axis_matrices(k={k})")
    if steps < 2 and (w_kw is None or w_rec is None or w_lin is None):
        raise ValidationError(f"steps must be at least 2, got {steps}")
    current = current or Weights()
    lin = np.linspace(0.0, 1.0, steps).round(6).tolist() if steps >= 2 else [1.0]
    axes = {
        "w_kw": _values(w_kw, lin, "w_kw"),
        "w_rec": _values(w_rec, lin, "w_rec"),
        "w_lin": _values(w_lin, lin, "w_lin"),
        "w_vec": _values(w_vec, lin, "w_vec") if m.has_vectors else np.array([current.w_vec]),
        "half_life_days": _values(half_lives, sorted(set(DEFAULT_HALF_LIVES) | {current.half_life_days}), "half_life_days"),
    }
    t0 = time.perf_counter()
    wnames = list(_AXES) if m.has_vectors else list(_AXES[:3])
    mesh = np.stack(np.meshgrid(*[axes[a] for a in wnames], indexing="ij"), axis=-1).reshape(-1, len(wnames))
    sums = mesh.sum(axis=1)
    nonzero = sums > 0
    # Multiples of one weight vector rank identically: evaluate each direction once.
    directions = np.zeros_like(mesh)
    directions[nonzero] = mesh[nonzero] / sums[nonzero, None]
    # Grid values are rounded to 6 decimals, so equal directions agree to ~1e-6; 5 decimals merges them.
    uniq, inverse = np.unique(directions[nonzero].round(5), axis=0, return_inverse=True)
    W = np.ascontiguousarray(uniq.T, dtype=np.float32)
    hs = axes["half_life_days"]
    pairs = _pairs(m)
    bar = _progress(len(hs) + 1, f"grid {metric}@{k}", progress)
    per_h = _metric_values(m, pairs, [(float(h), W) for h in hs], metric, k, bar) if m.n else [np.zeros(W.shape[1]) for _ in hs]
    cur_w = np.asarray(_weight_vector(current, m.has_vectors), dtype=np.float32)[:, None]
    if not cur_w.any():
        current_metric = float("nan")
    elif m.n:
        current_metric = float(_metric_values(m, pairs, [(current.half_life_days, cur_w)], metric, k)[0][0])
    else:
        current_metric = 0.0
    bar.update()
    bar.close()
    flat = np.full((len(hs), len(mesh)), np.nan)
    for i, vals in enumerate(per_h):
        flat[i, nonzero] = vals[inverse.ravel()]
    # values[..., h] with the weight axes first (and w_vec kept as an axis of length 1 without vectors).
    shape_w = [len(axes[a]) for a in wnames]
    vals = flat.reshape([len(hs)] + shape_w)
    vals = np.moveaxis(vals, 0, -1)
    if not m.has_vectors:
        vals = vals[:, :, :, None, :]
    seconds = time.perf_counter() - t0

    best_w, best_v, in_grid = current, current_metric, False
    if np.isfinite(vals).any():
        top = np.nanmax(vals)
        if math.isnan(current_metric) or top > current_metric + 1e-12:
            cand = np.argwhere(vals >= top - 1e-12)
            cur_dir = np.asarray(_weight_vector(current, True))
            cur_dir = cur_dir / cur_dir.sum() if cur_dir.sum() > 0 else cur_dir
            names = list(axes)

            def dist(ix: np.ndarray) -> tuple[float, float]:
                p = np.array([axes[a][i] for a, i in zip(names, ix)])
                d = p[:4] / p[:4].sum()
                return (float(np.abs(d - cur_dir).sum()), abs(math.log(p[4] / current.half_life_days)))

            bi = min(cand, key=dist)
            best_w = dataclasses.replace(current, **{a: float(axes[a][i]) for a, i in zip(names, bi)})
            # Its exact value (the grid evaluated a representative of its direction).
            exact = _metric_values(m, pairs, [(best_w.half_life_days, np.asarray(_weight_vector(best_w, m.has_vectors),
                                                                               dtype=np.float32)[:, None])], metric, k)
            best_v = float(exact[0][0])
            vals[tuple(bi)] = best_v
            in_grid = math.isnan(current_metric) or best_v > current_metric
            if not in_grid:
                best_w, best_v = current, current_metric
    return GridResult(metric=metric, k=k, axes=axes, values=vals, best=best_w, best_metric=float(best_v),
                      current=current, current_metric=current_metric, judgments=m.n, skipped=len(m.skipped),
                      points=int(vals.size), evaluated=int(W.shape[1] * len(hs)), seconds=seconds,
                      precompute_seconds=m.seconds, best_in_grid=in_grid)


# --------------------------------------------------------------------------------------
# One call for the CLI, the widget and notebooks
# --------------------------------------------------------------------------------------


#: Fewer judgments that test keywords than this, and the keyword weight is not searched.
MIN_KEYWORD_JUDGMENTS = 10
#: Fewer judgments that test the weights than this (those lineage decides do not count), and
#: ``tune --save`` keeps the weights there are: below it the later half is too small to tell.
MIN_JUDGMENTS = 30
#: Each time-ordered fold needs at least this many judgments for the check to mean anything.
MIN_FOLD = 5


@dataclass
class Validation:
    """The tuning checked on time: searched on the earlier judgments, scored on the later ones.

    ``tuned`` is what ``cybmem tune --save`` saves: the weights checked here, never ones fitted to
    the judgments they are checked on.
    """

    earlier: int  # judgments tuned on
    later: int  # judgments scored on
    tuned: Weights  # the best weights on the earlier judgments
    tuned_earlier: float
    current_earlier: float
    tuned_later: float
    current_later: float
    interval: tuple[float, float] = (0.0, 0.0)  # 90% bootstrap interval of tuned - current on the later judgments
    # The same check with every judgment asked as text alone (no parent, no chat): None when no
    # judgment names a parent or chat, so the check above already is one.
    text_tuned_later: float | None = None
    text_current_later: float | None = None
    # With "used" judgments: tuned and current weights on the store's own history alone (every other
    # kind of judgment, all of them): None when no "used" judgment is in the set.
    history_judgments: int | None = None
    history_tuned: float | None = None
    history_current: float | None = None

    @property
    def gain(self) -> float:
        return self.tuned_later - self.current_later

    def to_dict(self) -> dict[str, Any]:
        out = {"earlier": self.earlier, "later": self.later, "tuned": self.tuned.to_dict(),
               "tunedEarlier": round(self.tuned_earlier, 6), "currentEarlier": round(self.current_earlier, 6),
               "tunedLater": round(self.tuned_later, 6), "currentLater": round(self.current_later, 6),
               "interval": [round(self.interval[0], 6), round(self.interval[1], 6)]}
        if self.text_tuned_later is not None:
            out["textOnly"] = {"tunedLater": round(self.text_tuned_later, 6),
                               "currentLater": round(self.text_current_later or 0.0, 6)}
        if self.history_tuned is not None:
            out["history"] = {"judgments": self.history_judgments, "tuned": round(self.history_tuned, 6),
                              "current": round(self.history_current or 0.0, 6)}
        return out


def refusal_of(tests: int, judgments: int, v: Validation | None, current: Weights, *,
               keyword_held: str = "") -> str | None:
    """Why checked weights (``v.tuned``) must not be saved without --force (None: they may): the
    one guard of ``cybmem tune --save``, the automatic re-tune and the tuning widget's Save.

    Args:
        tests: judgments that test the weights (not answered by the parent dispatch shows first).
        judgments: evaluable judgments.
        v: the check on time (:func:`check_weights`); None: too few judgments for one.
        current: the weights in use.
        keyword_held: why w_kw was not searched (tune only).
    """
    if tests < MIN_JUDGMENTS:
        lineage = f" (the other {judgments - tests} are answered by the parent dispatch shows first)" \
            if tests < judgments else ""
        return (f"only {tests} judgment(s) test the weights{lineage}; at least {MIN_JUDGMENTS} are needed to "
                "tell tuned weights from noise, so the current weights stay")
    if keyword_held:
        return ("too few of these judgments test keywords, and a larger w_lin also lowers what the words count "
                f"for, which they cannot measure; give at least {MIN_KEYWORD_JUDGMENTS} judgments that test "
                "keywords (e.g. --judgments qrels.jsonl)")
    if v is None:
        return (f"too few judgments ({judgments}) to check the weights on later ones; "
                f"at least {2 * MIN_FOLD} are needed")
    if v.tuned == current:
        return f"no grid point beats the current weights on the earlier {v.earlier} judgments"
    if v.tuned.w_kw == 0:
        return "the tuned weights switch the keyword axis off (w_kw=0): the block would ignore what the task says"
    lo, hi = v.interval
    if not lo > 0:
        return (f"the weights tuned on the earlier {v.earlier} judgments do not beat the current ones on the later "
                f"{v.later} ({v.tuned_later:.4f} vs {v.current_later:.4f}; 90% interval of the difference "
                f"{lo:+.4f} to {hi:+.4f}): the grid would be fitting these judgments, not learning")
    if v.text_tuned_later is not None and v.text_tuned_later < (v.text_current_later or 0.0):
        return (f"asked as text alone (no parent, no chat), the later {v.later} judgments score lower with the tuned "
                f"weights ({v.text_tuned_later:.4f} vs {v.text_current_later:.4f}): lineage would be deciding them")
    if v.history_tuned is not None and v.history_tuned < (v.history_current or 0.0) - 1e-9:
        return (f"on the {v.history_judgments} judgments of the store's own history alone (the ledger and the lineage, "
                f"without what runs said they used) the tuned weights score lower ({v.history_tuned:.4f} vs "
                f"{v.history_current:.4f}): the runs' feedback would be steering them")
    return None


def bootstrap_interval(diff: np.ndarray, *, weights: np.ndarray | None = None, resamples: int = 2000,
                       level: float = 0.9, seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval of the (weighted) mean of paired per-judgment differences."""
    n = len(diff)
    if n == 0:
        return (0.0, 0.0)
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    means = (diff[idx] * w[idx]).sum(axis=1) / np.maximum(w[idx].sum(axis=1), 1e-12)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def time_folds(m: AxisMatrices) -> tuple[AxisMatrices, AxisMatrices] | None:
    """The judgments split in time: the earlier half by asOf and the later half (None: too few)."""
    if m.n < 2 * MIN_FOLD:
        return None
    order = sorted(range(m.n), key=lambda q: (m.judgments[q].as_of, q))
    half = m.n // 2
    return m.subset(order[:half]), m.subset(order[half:])


def kind_weights(judgments: Sequence[Judgment]) -> tuple[np.ndarray | None, int]:
    """Weights that make the judgments lineage decides count as much, together, as all the others.

    A derived judgment whose relevant runs include the dispatched run's parent ("parent",
    "issue+parent") is answered whatever the words say (dispatch shows the parent first);
    left to outnumber the others, such judgments would flatten every difference the others make.

    Returns:
        (weights, or None when there is one group only; the number of judgments that test keywords).
    """
    parent = np.array(["parent" in (j.kind or "").split("+") for j in judgments], dtype=bool)
    others = int((~parent).sum())
    if not parent.any() or not others:
        return None, others
    w = np.where(parent, 0.5 / parent.sum(), 0.5 / others)
    return w.astype(np.float64), others


def _without_lineage(js: Sequence[Judgment]) -> list[Judgment]:
    """The judgments asked as text alone: no parent, no chat session (what a task dispatched on its own gets)."""
    return [dataclasses.replace(j, parent_run_id=None, chat_session_id=None) for j in js]


@dataclass
class Bench:
    """A store's judgments made ready to score any weights on: what ``cybmem tune`` and ``eval``,
    the tuning widget and the notebook share (:func:`prepare`), so that each reports the same score
    for the same weights: the same judgments (:func:`cybmem.retrieval.judgments.judgment_set`), the
    same mean (the kinds balanced by :func:`kind_weights`), the same split in time (:func:`time_folds`)."""

    snapshot: Snapshot
    judgment_set: JudgmentSet
    matrices: AxisMatrices  # the evaluable judgments, with their weights in the mean
    text: AxisMatrices | None  # the same asked as text alone (None: no judgment names a parent or chat)
    history: AxisMatrices | None  # with "used" judgments: the store's other judgments alone (else None)
    keyword_tests: int  # judgments that test the weights (not answered by the parent shown first)
    vector_note: str  # why w_vec is not searched although the store has vectors ("" otherwise)
    as_of: int | None
    state: tuple[int, int, int] | None  # weights.json when the bench was made (weights_state)
    records: int  # runs that existed at as_of

    @functools.cached_property
    def folds(self) -> tuple[AxisMatrices, AxisMatrices] | None:
        """The judgments split in time (:func:`time_folds`; None: too few)."""
        return time_folds(self.matrices)

    @property
    def kinds(self) -> dict[str, int]:
        """Evaluable judgments per kind."""
        out: dict[str, int] = {}
        for j in self.matrices.judgments:
            out[j.kind or "given"] = out.get(j.kind or "given", 0) + 1
        return out

    def score(self, weights: Weights, *, metric: str = "mrr", k: int | None = None) -> dict[str, float | None]:
        """``weights``' metric on all judgments and on the earlier and later halves (None: too few to split)."""
        folds = self.folds
        return {"all": float(evaluate(self.matrices, weights, metric=metric, k=k)),
                "earlier": float(evaluate(folds[0], weights, metric=metric, k=k)) if folds else None,
                "later": float(evaluate(folds[1], weights, metric=metric, k=k)) if folds else None}


def prepare(store: MemoryStore | Snapshot, *, judgments: Sequence[Judgment] | str | Path | None = None,
            kinds: Sequence[str] = JUDGMENT_KINDS, as_of: int | None = None, k: int = 10,
            settings: Settings | None = None, vectors: bool = True, progress: bool | None = None) -> Bench:
    """The judgments (:func:`cybmem.retrieval.judgments.judgment_set`: a list, a file the user
    names, or None for those the store implies) and their axis values, once.

    Args:
        vectors: embed the queries when the store has vectors (False: score without the vector axis).

    Raises:
        ValidationError: no judgment, or none that can be evaluated against the store.
    """
    snap = store if isinstance(store, Snapshot) else load_snapshot(store)
    state = weights_state(snap.store) if snap.store is not None else None
    jset = judgment_set(snap, judgments, kinds=kinds, as_of=as_of)
    js = jset.judgments
    if jset.derived and not js:
        when = f" as of {as_of}" if as_of is not None else ""
        wanted, why = kinds_of(kinds), []
        if set(wanted) - {"used"}:
            why.append("no run raised, resolved or reopened an issue that earlier runs carried, or was dispatched "
                       "by a finished parent")
        if "used" in wanted:
            why.append("no written run used an earlier run it was shown: used.jsonl notes that for runs "
                       "dispatched through `cybmem inject` or served by `cybmem mcp`")
        raise ValidationError(f"project {snap.store.slug} implies no judgments yet{when} ({'; '.join(why)}); pass a "
                              "judgments file with --judgments")
    if not jset.derived and as_of is not None:
        js = jset.judgments = [j for j in js if j.as_of <= as_of]
        if not js:
            raise ValidationError(f"no judgment was asked by {as_of} (--as-of); give a later moment")
    qv, vector_note, model = _query_vectors(snap, js, settings, progress) if vectors else (None, "", None)
    m = axis_matrices(snap, js, k=k, query_vectors=qv, model=model, progress=progress)
    if not m.n:
        reasons = sorted({why for _, why in m.skipped})
        raise ValidationError(f"none of the {len(js)} judgments can be evaluated ({'; '.join(reasons)}); "
                              "check their asOf and relevant run ids against this project")
    m.weights, keyword_tests = kind_weights(m.judgments)
    text = None
    if any(j.parent_run_id or j.chat_session_id for j in m.judgments):
        text = axis_matrices(snap, _without_lineage(m.judgments), k=k, query_vectors=qv, model=model, progress=progress)
        text.weights = m.weights
        if text.n != m.n:  # a judgment answerable only through its parent: compare like with like
            text = None
    history = None
    if any(j.kind == "used" for j in m.judgments) and jset.history:
        history = axis_matrices(snap, jset.history, k=k, query_vectors=qv, model=model, progress=progress)
        history.weights = kind_weights(history.judgments)[0]
        history = history if history.n else None
    records = int(snap.candidates(as_of).sum()) if snap.n else 0
    return Bench(snap, jset, m, text, history, keyword_tests, vector_note, as_of, state, records)


def check_weights(bench: Bench, weights: Weights, current: Weights, *, metric: str = "mrr", k: int | None = None,
                  earlier: float | None = None) -> Validation | None:
    """Weights chosen on the earlier judgments (the grid's, or set by hand) checked against the
    current ones on the later judgments, as text alone, and on the store's own history alone
    (None: too few judgments to split in time). :func:`refusal_of` reads the answer.

    Args:
        earlier: their metric on the earlier judgments when already known (the grid's).
    """
    folds = bench.folds
    if folds is None:
        return None
    early, late = folds
    cur_ok = any(_weight_vector(current, True))
    per_t = evaluate(late, weights, metric=metric, k=k, per_query=True)
    per_c = evaluate(late, current, metric=metric, k=k, per_query=True) if cur_ok else np.zeros(late.n)
    mean = lambda v: float((v * late.weights).sum() / late.weights.sum()) if late.weights is not None else float(v.mean())  # noqa: E731
    v = Validation(earlier=early.n, later=late.n, tuned=weights,
                   tuned_earlier=float(evaluate(early, weights, metric=metric, k=k)) if earlier is None else earlier,
                   current_earlier=float(evaluate(early, current, metric=metric, k=k)) if cur_ok else 0.0,
                   tuned_later=mean(per_t), current_later=mean(per_c),
                   interval=bootstrap_interval(per_t - per_c, weights=late.weights))
    if bench.text is not None:
        t_late = time_folds(bench.text)[1]
        v.text_tuned_later = float(evaluate(t_late, weights, metric=metric, k=k))
        v.text_current_later = float(evaluate(t_late, current, metric=metric, k=k)) if cur_ok else 0.0
    if bench.history is not None:
        v.history_judgments = bench.history.n
        v.history_tuned = float(evaluate(bench.history, weights, metric=metric, k=k))
        v.history_current = float(evaluate(bench.history, current, metric=metric, k=k)) if cur_ok else 0.0
    return v


def _validate(bench: Bench, axes: dict[str, Any], metric: str, k: int, current: Weights,
              progress: bool | None = False) -> Validation | None:
    """Search on the earlier half of the judgments (by asOf), check the best there (:func:`check_weights`)."""
    if bench.folds is None:
        return None
    g = grid_search(bench.folds[0], metric=metric, k=k, progress=progress, **axes)
    return check_weights(bench, g.best, current, metric=metric, k=k, earlier=g.best_metric)


def tune(store: MemoryStore | Snapshot, *, judgments: Sequence[Judgment] | str | Path | None = None,
         as_of: int | None = None, metric: str = "mrr", k: int = 10, steps: int = 11,
         half_lives: Iterable[float] | None = None, w_kw: Iterable[float] | None = None,
         w_rec: Iterable[float] | None = None, w_lin: Iterable[float] | None = None,
         w_vec: Iterable[float] | None = None, current: Weights | None = None, settings: Settings | None = None,
         kinds: Sequence[str] = JUDGMENT_KINDS, hold_few: bool = True, topk: int | None = None,
         progress: bool | None = None, bench: Bench | None = None) -> GridResult:
    """Search the weights for a project: judgments -> axis values -> grid, checked on time.

    Args:
        store: the project (or its snapshot).
        judgments: a list, a judgments JSONL path, or None to derive them from the store
            (:func:`cybmem.retrieval.judgments.judgment_set` with ``kinds``).
        as_of: tune as of this moment (epoch ms): only the runs, ledger events and judgments that
            existed then, so that the result can be checked on what came after.
        metric, k, steps, half_lives, w_kw, w_rec, w_lin, w_vec: see :func:`grid_search`.
        current: the weights to compare with (default: what production reads for the project).
        hold_few: with fewer than MIN_KEYWORD_JUDGMENTS judgments that test keywords, search w_lin only
            (False: search every axis anyway).
        topk: accepted for callers of earlier versions; the block has no floor to learn any more
            (its evidence is judged per run: cybmem.retrieval.evidence).
        settings: for the production weights (default: from the environment).
        progress: progress bars on stderr (None: when stderr is a TTY).
        bench: judgments already prepared (:func:`prepare`; ``store``, ``judgments``, ``as_of``
            and ``kinds`` are then not read again).

    Returns:
        :class:`GridResult`: the best weights on all judgments (:attr:`~GridResult.best`), the
        weights tuned on the earlier half and scored on the later half (:attr:`~GridResult.validation`,
        what ``--save`` saves) and why they would not be saved (:attr:`~GridResult.refusal`).
    """
    check_metric(metric, k)
    settings = settings or Settings.from_env()
    if bench is None:
        bench = prepare(store, judgments=judgments, kinds=kinds, as_of=as_of, k=k, settings=settings, progress=progress)
    snap, m, keyword_tests = bench.snapshot, bench.matrices, bench.keyword_tests
    if current is None:
        current = weights_for(settings, snap.store).weights
    held = ""
    if hold_few and keyword_tests < MIN_KEYWORD_JUDGMENTS and all(x is None for x in (w_kw, w_rec, half_lives)):
        # Judgments that lineage decides say nothing about words or time: they tune w_lin only.
        w_kw, w_rec, half_lives = [current.w_kw], [current.w_rec], [current.half_life_days]
        why = ("the others include the run's parent, which dispatch shows first whatever the words say"
               if keyword_tests < m.n else f"fewer than {MIN_KEYWORD_JUDGMENTS} would tune them to noise")
        held = (f"only {keyword_tests} judgment(s) test keywords ({why}), so only w_lin is searched; w_kw, "
                f"w_rec and the half-life stay at {current.w_kw:g}, {current.w_rec:g} and "
                f"{current.half_life_days:g} days (--all-weights searches them anyway)")
    axes = dict(steps=steps, w_kw=w_kw, w_rec=w_rec, w_lin=w_lin, w_vec=w_vec, half_lives=half_lives, current=current)
    result = grid_search(m, metric=metric, k=k, progress=progress, **axes)
    result.bench = bench
    result.source = bench.judgment_set.source
    result.derived = bench.judgment_set.derived
    result.as_of = bench.as_of
    result.keyword_held = held
    result.vector_note = bench.vector_note
    result.tests = keyword_tests
    result.state = bench.state
    result.records = bench.records
    met = m.pinned_relevant & ((m.n_relevant == 1) | (metric == "mrr"))  # the parent shown first is all they ask
    if m.n and met.all():
        result.met_note = ("every judgment is met whatever the weights (each asks for the run's parent, which dispatch "
                           "shows first), so there is nothing to tune here; tune on judgments of your own "
                           "(--judgments, e.g. qrels.jsonl or ids from `cybmem search --json`)")
    result.kinds = bench.kinds
    # Tune for the dispatch runs will get: judgments that name a parent or chat are also checked as text alone.
    result.validation = _validate(bench, axes, metric, k, current, progress)
    return result


def weights_state(store: MemoryStore) -> tuple[int, int, int] | None:
    """What ``<project>/weights.json`` is now (inode, size, mtime ns; None: no file), to tell
    whether another tuning saved it since (:func:`save_project_weights`)."""
    try:
        st = (store.dir / WEIGHTS_FILE).stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class Evaluation:
    """Fixed weights scored on judgments: overall, per kind and on the earlier / later halves."""

    metric: str
    k: int
    judgments: int
    skipped: int
    source: str
    rows: dict[str, dict[str, Any]]  # name -> {"weights", "all", "earlier", "later", "kinds": {kind: value}}
    warnings: list[str] = field(default_factory=list)  # e.g. malformed used.jsonl lines skipped

    @property
    def label(self) -> str:
        return f"{METRICS[self.metric]}@{self.k}"

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "k": self.k, "label": self.label, "judgments": self.judgments,
                "skipped": self.skipped, "source": self.source, "warnings": self.warnings,
                "rows": {n: {**r, "weights": r["weights"].to_dict()} for n, r in self.rows.items()}}


def evaluate_weights(store: MemoryStore | Snapshot | Bench, weights: Mapping[str, Weights], *,
                     judgments: Sequence[Judgment] | str | Path | None = None, metric: str = "mrr", k: int = 10,
                     kinds: Sequence[str] = JUDGMENT_KINDS, progress: bool | None = None) -> Evaluation:
    """Score fixed weights on judgments (what ``cybmem eval`` prints).

    Args:
        store: the project (or its snapshot, or judgments already prepared: :func:`prepare`).
        weights: name -> weights to score, e.g. ``{"current": ..., "given": ...}``.
        judgments: a list, a JSONL path, or None to derive them from the store.
        metric, k: the metric and its cut-off.

    Returns:
        :class:`Evaluation`: each weighting's metric over all judgments, per kind, and on the
        earlier and the later half of the judgments in time: the numbers ``cybmem tune`` reports
        for the same weights (the same judgments, mean and split: :class:`Bench`).
    """
    check_metric(metric, k)
    for name, w in weights.items():
        if not any(_weight_vector(w, True)):
            raise ValidationError(f"weights {name!r} are all 0; give at least one axis a positive weight")
    bench = store if isinstance(store, Bench) else prepare(
        store, judgments=judgments, kinds=kinds, k=k, vectors=any(w.w_vec > 0 for w in weights.values()),
        progress=progress)
    m = bench.matrices
    by_kind: dict[str, list[int]] = {}
    for q, j in enumerate(m.judgments):
        by_kind.setdefault(j.kind or "given", []).append(q)
    subsets = {kind: m.subset(qs) for kind, qs in by_kind.items()} if len(by_kind) > 1 else {}
    rows: dict[str, dict[str, Any]] = {}
    for name, w in weights.items():
        row: dict[str, Any] = {"weights": w, **bench.score(w, metric=metric, k=k)}
        row["kinds"] = {kind: float(evaluate(sub, w, metric=metric, k=k)) for kind, sub in subsets.items()}
        rows[name] = row
    return Evaluation(metric=metric, k=k, judgments=m.n, skipped=len(m.skipped), source=bench.judgment_set.source,
                      rows=rows, warnings=list(bench.judgment_set.warnings))


def evidence_of(result: GridResult, *, forced: bool = False) -> dict[str, Any]:
    """What weights.json keeps of the tuning that wrote it (under "tuned"): the judgments used (per
    kind, and the "used" ones left out), the metric before and after on the later half, its bootstrap
    interval, when, and what was saved (``forced``: saved with --force, and what it overrode)."""
    v = result.validation
    saved = (f"tuned on the earlier {v.earlier} judgments, checked on the later {v.later}" if v is not None else
             "the best on all judgments (too few to check on later ones; saved with --force)")
    if forced and v is not None and result.refusal:
        saved += f"; saved with --force although {result.refusal}"
    out = _evidence(result.bench, v, result.metric, result.k, saved, tests=result.tests, judgments=result.judgments,
                    kinds=result.kinds, source=result.source, derived=result.derived, as_of=result.as_of,
                    records=result.records)
    return out


def _evidence(bench: Bench | None, v: Validation | None, metric: str, k: int, saved: str, *, tests: int,
              judgments: int, kinds: Mapping[str, int], source: str, derived: bool, as_of: int | None,
              records: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "at": int(time.time() * 1000), "asOf": as_of, "records": records,
        "source": "derived" if derived else source.removeprefix("from "),
        "kinds": dict(kinds), "judgments": judgments, "testsWeights": tests,
        "metric": metric, "k": k, "label": f"{METRICS[metric]}@{k}", "saved": saved,
    }
    if bench is not None and bench.judgment_set.left_out:
        out["usedLeftOut"] = dict(sorted(bench.judgment_set.left_out.items()))
    if v is not None:
        out["earlier"] = {"judgments": v.earlier, "before": round(v.current_earlier, 6), "after": round(v.tuned_earlier, 6)}
        out["later"] = {"judgments": v.later, "before": round(v.current_later, 6), "after": round(v.tuned_later, 6),
                        "interval90": [round(v.interval[0], 6), round(v.interval[1], 6)]}
        if v.text_tuned_later is not None:
            out["later"]["textOnly"] = {"before": round(v.text_current_later or 0.0, 6), "after": round(v.text_tuned_later, 6)}
        if v.history_tuned is not None:
            out["history"] = {"judgments": v.history_judgments, "before": round(v.history_current or 0.0, 6),
                              "after": round(v.history_tuned, 6)}
    return out


def check_evidence(bench: Bench, v: Validation | None, *, metric: str, k: int, saved: str) -> dict[str, Any]:
    """The evidence of weights checked on ``bench`` by :func:`check_weights` (the tuning widget's Save),
    in the shape :func:`evidence_of` gives ``cybmem tune --save``'s."""
    jset = bench.judgment_set
    return _evidence(bench, v, metric, k, saved, tests=bench.keyword_tests, judgments=bench.matrices.n,
                     kinds=bench.kinds, source=jset.source, derived=jset.derived, as_of=bench.as_of,
                     records=bench.records)


def save_project_weights(store: MemoryStore, weights: Weights, settings: Settings | None = None, *,
                         evidence: Mapping[str, Any] | None = None,
                         expect: tuple[int, int, int] | None | bool = False) -> tuple[Path, list[str]]:
    """Write ``<project dir>/weights.json`` (what ``cybmem search`` / ``inject`` read for the project).

    Args:
        evidence: the tuning's evidence (:func:`evidence_of`), kept under "tuned".
        expect: what weights.json was when the tuning began (:func:`weights_state`; None: no file);
            when it changed since (another ``tune --save`` finished meanwhile) nothing is written
            and :class:`~cybmem.errors.ConflictError` says so. False: write whatever is there.

    Returns:
        The path written, and what still overrides it for production (a
        CYBERINE_MEMORY_WEIGHTS file, CYBERINE_MEMORY_W_* variables), empty when nothing does.
    """
    from .. import _io
    from ..errors import ConflictError

    settings = settings or Settings.from_env()
    path = store.dir / WEIGHTS_FILE
    with _io.locked(store.dir / ".weights.lock"):
        if expect is not False and weights_state(store) != expect:
            ev = read_evidence(path)
            when = f" (saved {tuned_note(ev)})" if ev else ""
            raise ConflictError(f"{path} changed while this tuning ran{when}, so these weights were not saved; "
                                "run `cybmem tune --save` again to tune on top of them")
        save_weights(weights, path, evidence=evidence)
    over = [str(p) for p in weight_files(settings, store)[2:] if p.is_file()]
    over += sorted(name for name, _ in settings.weights.variables)
    return path, over


#: Fewer runs than this and a store is not re-tuned on its own (CYBERINE_MEMORY_RETUNE).
RETUNE_MIN_RECORDS = 50
_RETUNE_LOCK = ".retune.lock"
_RETUNE_STATE = ".retune.json"


def retune_due(store: MemoryStore, settings: Settings, records: int | None = None) -> bool:
    """Has the history grown by CYBERINE_MEMORY_RETUNE percent since the last tuning (or never been
    tuned and reached :data:`RETUNE_MIN_RECORDS` runs)? False when the setting is 0."""
    if settings.retune <= 0:
        return False
    n = len(store.listing()) if records is None else records
    last = _last_tuned_at(store)
    if last <= 0:
        return n >= RETUNE_MIN_RECORDS
    return n >= max(RETUNE_MIN_RECORDS, last * (100 + settings.retune) / 100)


def _last_tuned_at(store: MemoryStore) -> int:
    """Runs the history had at the last tuning, saved or not (weights.json's evidence, .retune.json)."""
    ev = read_evidence(store.dir / WEIGHTS_FILE) or {}
    seen = [ev.get("records")]
    try:
        seen.append(json.loads((store.dir / _RETUNE_STATE).read_text()).get("records"))
    except (OSError, ValueError, AttributeError):
        pass
    return max([x for x in seen if isinstance(x, int)], default=0)


def auto_tune(store: MemoryStore, settings: Settings | None = None, *, progress: bool | None = False) -> str:
    """Tune on the store's own judgments and save only what passes every check (what
    CYBERINE_MEMORY_RETUNE runs): one line saying what happened. Never raises for a tuning that
    cannot be done; a second auto-tuning of the same store while one runs returns at once."""
    import fcntl

    settings = settings or Settings.from_env()
    lock = store.dir / _RETUNE_LOCK
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        return f"not re-tuned: {lock} cannot be opened ({exc.strerror})"
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return f"not re-tuned: another tuning of project {store.slug} is running"
        from .. import _io

        try:
            result = tune(store, settings=settings, progress=progress)
        except Exception as exc:  # noqa: BLE001 - a detached re-tune has no one to raise to: it says why in .retune.json
            why = ' '.join(str(exc).split()) if isinstance(exc, CybmemError) else f"unexpected {type(exc).__name__}: {exc}"
            line = f"not re-tuned: {why}"
            try:
                _io.atomic_write(store.dir / _RETUNE_STATE, json.dumps(
                    {"records": _last_tuned_at(store), "at": int(time.time() * 1000), "result": line}).encode())
            except OSError:
                pass
            return line

        # The next check waits for the history to grow again, whatever this one decides.
        _io.atomic_write(store.dir / _RETUNE_STATE, json.dumps({"records": result.records, "at": int(time.time() * 1000)}).encode())
        if result.refusal is not None or result.saves is None or result.saves == result.current:
            why = result.refusal or "the checked weights are the current ones"
            return f"kept the weights of project {store.slug}: {why}"
        try:
            path, _ = save_project_weights(store, result.saves, settings, evidence=evidence_of(result), expect=result.state)
        except CybmemError as exc:
            return f"not re-tuned: {' '.join(str(exc).split())}"
        v = result.validation
        return (f"re-tuned project {store.slug} on {result.judgments} judgments ({result.records} runs): "
                f"{result.label} on the later {v.later} {v.current_later:.4f} -> {v.tuned_later:.4f}; saved to {path}")
    finally:
        os.close(fd)


def spawn_auto_tune(store: MemoryStore, settings: Settings) -> bool:
    """Start ``cybmem tune --auto`` for the store in a detached process (the write path's hook for
    CYBERINE_MEMORY_RETUNE: the write returns at once, dispatch only reads what it saves). True
    when one was started; False when one is already running or it could not start."""
    import fcntl
    import subprocess
    import sys

    try:
        fd = os.open(store.dir / _RETUNE_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: nobody is tuning; let go for the child
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)
        # sh starts the tuning in the background and ends at once: the tuning is nobody's child to
        # wait for (no zombie in a long-lived caller), in a session of its own.
        subprocess.run(["sh", "-c", 'exec "$@" </dev/null >/dev/null 2>&1 &', "sh", sys.executable, "-m", "cybmem.cli",
                        "tune", "--auto", "--memory-dir", str(settings.memory_dir), "--project", store.slug],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       start_new_session=True, timeout=10, check=False)
        return True
    except (OSError, subprocess.SubprocessError):
        return False
