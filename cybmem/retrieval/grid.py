"""The grid kernel of the weight search: every judgment's axis values, once, then any grid of weights
scored against relevance judgments (cybmem.retrieval.judgments) at once.

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
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..errors import CybmemError, ValidationError
from ..progress import Progress
from ..settings import Settings
from ..store.embeddings import read_rows
from ..store.run_ids import RunLookup
from ..store.snapshot import Snapshot
from ..store.tokens import tokenize
from .judgments import METRICS, Judgment, JudgmentSet, check_metric
from .scoring import lineage_affinity, normalize_keyword, ranking_order, recency_of_age
from .search import dispatch_context, parent_row
from .validation import refusal_of
from .weights import Weights, check_range

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from .validation import Validation

__all__ = ["DEFAULT_HALF_LIVES", "AxisMatrices", "axis_matrices", "embed_queries", "query_vectors", "weight_vector",
           "evaluate", "comparison_frame", "GridResult", "grid_search"]

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
    from ..clients.embeddings import Embedder

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


def query_vectors(snap: Snapshot, judgments: Sequence[Judgment], settings: Settings,
                  progress: bool | None) -> tuple[dict[str, np.ndarray] | None, str, str | None]:
    """The queries' embeddings when the store has vectors (else None), why there are none, and the
    model they were made with (the stored vectors of that model are the ones to compare them with)."""
    if not snap.store.embeddings_path.exists():
        return None, "", None
    from .vectors import embed_config_of

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


def weight_vector(w: Weights, with_vec: bool) -> list[float]:
    """The axis weights in the kernel's order (keyword, recency, lineage, and cosine ``with_vec``)."""
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
    W = np.asarray(weight_vector(weights, m.has_vectors), dtype=np.float32)[:, None]
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


class ScoredOn(Protocol):
    """What a grid was scored on, as far as its result reads it (:class:`cybmem.retrieval.tuning.Bench`)."""

    judgment_set: JudgmentSet


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
    bench: "ScoredOn | None" = field(default=None, repr=False)  # what tune() scored on, a tuning.Bench (None: a bare grid_search)

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
    cur_w = np.asarray(weight_vector(current, m.has_vectors), dtype=np.float32)[:, None]
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
            cur_dir = np.asarray(weight_vector(current, True))
            cur_dir = cur_dir / cur_dir.sum() if cur_dir.sum() > 0 else cur_dir
            names = list(axes)

            def dist(ix: np.ndarray) -> tuple[float, float]:
                p = np.array([axes[a][i] for a, i in zip(names, ix)])
                d = p[:4] / p[:4].sum()
                return (float(np.abs(d - cur_dir).sum()), abs(math.log(p[4] / current.half_life_days)))

            bi = min(cand, key=dist)
            best_w = dataclasses.replace(current, **{a: float(axes[a][i]) for a, i in zip(names, bi)})
            # Its exact value (the grid evaluated a representative of its direction).
            exact = _metric_values(m, pairs, [(best_w.half_life_days, np.asarray(weight_vector(best_w, m.has_vectors),
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
