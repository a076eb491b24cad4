"""Each relevance judgment's axis values over its candidate pool, computed once: what the grid
kernel (:mod:`cybmem.retrieval.grid`) scores any weights on.

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

For each judgment, once: the per-axis values of every candidate - normalised BM25,
age in ms (any half-life is then one ``exp``), lineage affinity (and cosine when the store
has embeddings) - reduced to a *pool*: the union, per lineage level, of the first ``k``
skyline layers of (keyword, newness) and of (keyword, row order). A record outside every such
band is beaten by ``k`` others under every non-negative weighting and every half-life
(recency is monotone in age for all of them), so for metrics cut at ``k`` the pool is exact,
up to float32 near-ties. With a vector axis the pool also takes the (cosine, newness) layers,
which is then an approximation (a record strong on three continuous axes at once but on no
pair of them could be missed). The queries' own embeddings come from
:func:`cybmem.retrieval.vectors.query_vectors`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ValidationError
from ..progress import Progress
from ..store.embeddings import read_rows
from ..store.run_ids import RunLookup
from ..store.snapshot import Snapshot
from ..store.tokens import tokenize
from .judgments import Judgment
from .scoring import lineage_affinity, normalize_keyword, ranking_order, recency_of_age
from .search import dispatch_context, parent_row
from .weights import Weights

__all__ = ["AxisMatrices", "axis_matrices"]


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
    # The grid kernel's (judgment, relevant run) pairs, classified once (cybmem.retrieval.grid fills it).
    pairs: Any = field(default=None, init=False, repr=False, compare=False)

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
        query_vectors: the embedding of each query text (:func:`cybmem.retrieval.vectors.query_vectors`); without them
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
    bar = Progress(len(judgments), "axis values", enabled=progress)
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
