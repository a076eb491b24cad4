"""Retrieval: score every record of a project on every axis at once and take the top k.

This is the read path production dispatch calls on every run (through :mod:`cybmem.dispatch.inject`):
load the project's snapshot (warm from the Arrow cache), score the records that can reach the
top k exactly as scoring all of them would (the candidate pool, :mod:`cybmem.retrieval.candidates`),
and return the hits with their per-axis contributions. Nothing here imports pandas.

The vector axis (cosine with the query's embedding, cybmem.retrieval.vectors) is on when the project has
vectors for the configured embedding model and w_vec > 0; the query is embedded within
CYBERINE_MEMORY_EMBED_TIMEOUT, and when that fails the other axes rank alone, with one warning.

Evidence (dispatch only: ``rank_query(evidence=True)``). A run enters the MEMORY block only on
evidence about the task, judged per run (:mod:`cybmem.retrieval.evidence`): the ranking is taken over
the runs that hold a task term that is not common in the store (or whose cosine reaches
``weights.floor_vec``), and each ranked run is then shown in full or as a pointer by the surprise
of the terms it holds. Recency and lineage order the runs that qualify; they never let a run in
alone. The parent a dispatcher names is shown whatever its evidence. A task without a single
indexable word (the block a chat session gets at its start, "what were we doing") has nothing to
judge evidence by: every candidate may enter, and the latest runs lead.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.compute as pc

from .filters import RecordFilter, record_mask
from ..errors import CybmemError, NotFoundError, ValidationError
from .scoring import LineageContext, Scored, explain_rows, rank, score, top_k
from ..settings import Settings
from ..arrow_numpy import numpy_of, scalar  # not pa.scalar / to_numpy: they import pandas
from ..store.loading import load_snapshot, verified
from ..store.snapshot import Snapshot
from ..store.memory_store import MemoryStore
from ..store.tokens import tokenize
from .candidates import candidate_pool, lineage_of, newest_candidates, union_rows
from .evidence import Evidence, RunEvidence, judge, specific_terms
from .features import POOL_FIRST, POOL_KEYWORD, POOL_NEWEST
from .weights import DEFAULT_W_VEC, LoadedWeights, Weights, weights_for

if TYPE_CHECKING:  # pragma: no cover
    from .ranker import LearnedOrder
    from .vectors import VectorQuery

__all__ = ["Hit", "Ranked", "SearchResult", "dispatch_context", "dispatch_parent", "rank_query", "search"]


@dataclass
class Hit:
    """One retrieved record with its rank, score and per-axis contributions."""

    rank: int
    run_id: str
    score: float
    contributions: dict[str, float]
    values: dict[str, float]
    ended_at_ms: int
    state: str
    task: str
    summary: str
    issues: list[str]
    next: list[str]
    pinned: str | None = None  # "parent": shown first as the parent of the run dispatched, whatever its score
    evidence: RunEvidence | None = None  # its evidence about the task and tier (search(evidence=True))
    first_stage: float | None = None  # the linear formula's total, when the learned ranker placed it (``score`` is then the trees')
    learned: "tuple[LearnedOrder, int] | None" = field(default=None, repr=False)  # the learned order and its place in it

    @property
    def tier(self) -> str:
        """How the MEMORY block shows it: "full" or "pointer" (always "full" without evidence asked for)."""
        return self.evidence.tier if self.evidence is not None else "full"

    def to_dict(self, *, explain: bool = False) -> dict:
        out = {
            "rank": self.rank, "runId": self.run_id, "score": round(self.score, 6), "endedAt": self.ended_at_ms,
            "state": self.state, "task": self.task, "summary": self.summary, "issues": self.issues, "next": self.next,
        }
        if self.pinned:
            out["pinned"] = self.pinned
        if explain:
            out["contributions"] = {k: round(v, 6) for k, v in self.contributions.items()}
            out["values"] = {k: round(v, 6) for k, v in self.values.items()}
            if self.evidence is not None:
                out["evidence"] = self.evidence.to_dict()
            if self.learned is not None:
                out["learned"] = self.explain_learned()
        return out

    def explain_learned(self) -> dict | None:
        """What placed it, when the learned ranker did: its score (the trees' ``raw`` score through the
        logistic function), the first stage's total, each feature's value and its contribution to the
        raw score (its tree SHAP value, ``method``; ``(base)`` is the trees' expected value: they add
        up to ``raw``), and whether it shares a word or a lineage link with the query."""
        if self.learned is None:
            return None
        order, at = self.learned
        out = {"score": round(self.score, 6), "raw": round(float(order.scores[at]), 6),
               "firstStage": round(self.first_stage or 0.0, 6), "method": "tree SHAP",
               "contributions": order.contributions([at])[0], "values": order.values(at)}
        out["sharesWithQuery"] = order.shares(at)
        return out


@dataclass
class SearchResult:
    """Hits plus what they were computed against."""

    query: str
    hits: list[Hit]
    weights: Weights
    now_ms: int
    as_of: int | None
    candidates: int
    context: LineageContext
    snapshot: Snapshot = field(repr=False)
    ranked: Ranked | None = field(default=None, repr=False)
    warnings: list[str] = field(default_factory=list)  # e.g. the query could not be embedded
    vector: bool = False  # the vector axis took part

    def to_dict(self, *, explain: bool = False) -> dict:
        out = {
            "query": self.query, "asOf": self.as_of, "now": self.now_ms, "candidates": self.candidates,
            "weights": self.weights.to_dict(), "hits": [h.to_dict(explain=explain) for h in self.hits],
        }
        if self.warnings:
            out["warnings"] = list(self.warnings)
        return out


def dispatch_parent(snap: Snapshot, parent_run_id: str | None, settings: Settings, *,
                    pinned: bool = False) -> tuple[str | None, str | None]:
    """The parent of the run being dispatched, the one rule search and inject (and so every front
    end) take it by: the id given, else CYBERINE_PARENT_RUN_ID, an abbreviation of it (the 8
    characters the MEMORY block prints) resolved among the project's runs
    (:meth:`~cybmem.store.snapshot.Snapshot.resolve_link`).

    Returns:
        The parent's run id (None: none given, or it names no run) and, when it names no run of
        the project or several, the warning that says so (``pinned``: the parent was to be shown
        first, else it only fed the lineage axis).
    """
    try:
        return snap.resolve_link(parent_run_id or settings.parent_run_id), None
    except NotFoundError as exc:
        use = "shown first" if pinned else "for the lineage axis"
        return None, f"no parent run {use} (--parent / CYBERINE_PARENT_RUN_ID): {exc}"


def dispatch_context(snap: Snapshot, mask: np.ndarray, parent: str | None, chat: str | None) -> LineageContext:
    """The lineage of the run about to be dispatched: its parent, chat, predecessor and chain root.

    The predecessor is the newest candidate record (what the write path will link as
    previousRunId).
    """
    previous = None
    if snap.n and mask.any():
        order = snap.newest_first()
        i = int(order[0]) if mask[order[0]] else int(order[np.argmax(mask[order])])
        lookup = snap.run_lookup()
        previous = lookup.id_at(i) if lookup is not None else snap.records.column("runId")[i].as_py()
    return LineageContext(parent_run_id=parent, chat_session_id=chat, previous_run_id=previous, root_run_id=None)


@dataclass
class Ranked:
    """The ranking core of a query: top row indices and the scores of the pool they came from."""

    top: list[int]  # row indices into the snapshot, best first
    local: list[int]  # the same rows as indices into ``scored``
    scored: Scored | None
    mask: np.ndarray
    context: LineageContext
    now_ms: int
    keyword: np.ndarray | None = None  # raw BM25 of every row (None: the axis is off)
    lineage: np.ndarray | None = None  # lineage affinity of every row (None: the axis is off)
    pinned: int | None = None  # the row put first whatever its score (the parent of the run dispatched)
    evidence: Evidence | None = None  # the task's terms in this store (rank_query(evidence=True))
    tiers: list[RunEvidence] | None = None  # each of ``top``'s evidence and tier (rank_query(evidence=True))
    candidates: np.ndarray | None = None  # the rows the moment and filters allow, before evidence narrowed ``mask`` (None: ``mask``)
    learned: "LearnedOrder | None" = None  # the learned ranker's order of the pool (None: the linear formula's)

    @property
    def allowed(self) -> np.ndarray:
        """Every row the query may see (its moment, its filters), evidence or not: what an issue's
        last activity counts, while only ``mask``'s rows lend an issue their keyword score."""
        return self.mask if self.candidates is None else self.candidates


def parent_row(snap: Snapshot, mask: np.ndarray, parent: str | None, as_of: int | None = None) -> int | None:
    """The row dispatch shows first for the run being dispatched's parent: the parent's record,
    or the correction that supersedes it (as of ``as_of``), when that is a candidate; else None
    (e.g. the parent is still running: no record yet)."""
    if not parent or not snap.n:
        return None
    row, seen = snap.row_of(parent), {parent}
    while row >= 0 and not mask[row]:
        parent = snap.supersession(as_of).get(parent)  # a corrected parent: its correction
        if parent is None or parent in seen:
            return None
        seen.add(parent)
        row = snap.row_of(parent)
    return row if row >= 0 else None


def _pin_first(local: list[int], at: int | None, k: int) -> list[int]:
    """``local`` (best first) with ``at`` first and the rest in order, ``k`` in all."""
    if at is None:
        return local
    return [at, *[i for i in local if i != at]][:k]


def rank_query(
    snap: Snapshot,
    query: str,
    *,
    k: int,
    weights: Weights,
    as_of: int | None = None,
    now_ms: int | None = None,
    parent_run_id: str | None = None,
    chat_session_id: str | None = None,
    exclude: str | None = None,
    where: np.ndarray | None = None,
    vector: "VectorQuery | np.ndarray | None" = None,
    pin_parent: bool = False,
    evidence: bool = False,
    ranker: str = "linear",
) -> Ranked:
    """Score a query over a snapshot and return the top ``k`` row indices (no rows built).

    Exactly the ranking of scoring every record (:func:`~cybmem.retrieval.candidates.candidate_pool`); this is the part
    the latency benchmark compares with other BM25 engines' retrieval. ``where`` (a row mask,
    e.g. :func:`cybmem.retrieval.filters.record_mask`) narrows the candidates; the dispatch context (the
    predecessor) is still taken from every candidate.

    ``vector`` is the vector axis (used when ``weights.w_vec > 0``): the cosine of every row
    with the query (a float32 array aligned with the rows), or a :class:`cybmem.retrieval.vectors.VectorQuery`,
    which computes it by one mat-vec or, on a large index, by binary quantisation with exact
    rescoring of the nearest rows and of every row the other axes could still lift into the top
    k (:meth:`~cybmem.retrieval.vectors.VectorQuery.axis`). Either way the top k is that of exact cosines.

    ``pin_parent``: the parent of the run being dispatched (``parent_run_id``), when it is a
    candidate, comes first whatever its score, and the top k - 1 others follow (a dispatcher
    that names the run it follows up always gets that run back; its scores are still computed).

    ``evidence``: only runs with evidence about the task may be ranked, and each ranked run gets its
    tier (module docstring, "Evidence"; what dispatch does); the pinned parent is exempt. With a
    vector axis this takes every row's exact cosine (one mat-vec), so that a run only the vectors
    relate can qualify.

    ``ranker``: "learned" reorders the formula's pool by the shipped trees (:mod:`cybmem.retrieval.ranker`;
    not with the vector axis on, whose ranking stays the formula's); "linear" is the formula alone.
    """
    now = as_of if as_of is not None else (now_ms if now_ms is not None else int(time.time() * 1000))
    mask = snap.candidates(as_of)
    if exclude is not None and snap.n:
        ids = snap.records.column("runId")
        mask &= ~numpy_of(pc.equal(ids, scalar(exclude, ids.type)))
    ctx = dispatch_context(snap, mask, parent_run_id, chat_session_id)
    if where is not None:
        mask = mask & where
    if not (snap.n and mask.any()):
        return Ranked([], [], None, mask, ctx, now)
    tokens = tokenize(query)
    # Without a word to judge by (a chat session's block at its start) there is no evidence to ask for.
    ev = specific_terms(snap.index, tokens) if evidence else None
    raw = snap.index.scores(tokens) if weights.w_kw else None
    kw = raw
    lin = None
    if weights.w_lin:
        lin = lineage_of(snap, ctx)
    pin = parent_row(snap, mask, parent_run_id, as_of) if pin_parent and k > 0 else None
    with_vec = vector is not None and weights.w_vec > 0
    if ev is not None:
        ev.candidates = int(np.count_nonzero(mask))
    if ev is not None and ev.judged:
        if with_vec and not isinstance(vector, np.ndarray):
            vector = vector.index.exact(vector.vector)  # every row's cosine: a run only the vectors relate can qualify
        ok = snap.index.scores(ev.specific) > 0 if ev.specific else np.zeros(snap.n, dtype=bool)
        if with_vec and weights.floor_vec > 0:
            ok |= vector >= np.float32(weights.floor_vec)
        allowed, mask = mask, mask & ok
        if pin is not None:
            mask[pin] = True
        if not mask.any():
            return Ranked([], [], None, mask, ctx, now, kw, lin, evidence=ev, tiers=[], candidates=allowed)
    else:
        allowed = None
    if k <= 0:
        return Ranked([], [], None, mask, ctx, now, kw, lin, evidence=ev, tiers=[], candidates=allowed)  # no runs asked for; the axes still serve issues
    cos = None
    if vector is not None and weights.w_vec > 0:
        dense: list[Scored] = []
        if isinstance(vector, np.ndarray):
            cos = vector
        else:
            def partial() -> np.ndarray:  # every row on the other axes (the bound of a binary axis)
                dense.append(score(keyword_raw=kw, ended_at_ms=snap.ended_ms(), now_ms=now, lineage=lin, vector_cos=None,
                                   weights=weights, mask=mask))
                return dense[0].total

            cos = vector.axis(partial, mask, weights.w_vec, k)
        if dense:
            # Every row is scored on the other axes already: add the vector axis, in the order
            # score() adds it (the same floats as scoring every record), and rank the rows that
            # can reach the top k (all of them after a mat-vec).
            d = dense[0]
            reach = getattr(vector, "reach", None)
            if reach is not None and pin is not None:
                at = int(np.searchsorted(reach, pin))
                if at == len(reach) or reach[at] != pin:  # out of reach of the top k, but shown
                    cos[pin] = vector.rescored(np.array([pin]))[0]
                    reach = np.insert(reach, at, pin)
            rows = slice(None) if reach is None else reach
            sub = lambda a: None if a is None else a[rows]  # noqa: E731
            vec = np.asarray(cos[rows], dtype=np.float32) * np.float32(weights.w_vec)
            scored = Scored(total=d.total[rows] + vec, keyword=sub(d.keyword), recency=sub(d.recency), lineage=sub(d.lineage),
                            vector=vec, weights=weights, mask=mask[rows])
            at = None if pin is None else (pin if reach is None else int(np.searchsorted(reach, pin)))
            local = _pin_first(rank(scored, k), at, k)
            top = list(local) if reach is None else [int(reach[i]) for i in local]
            return _judged(Ranked(top, local, scored, mask, ctx, now, kw, lin, pin, ev, candidates=allowed), snap, cos, weights)
    learned = ranker == "learned" and cos is None
    if learned and raw is None:
        raw = snap.index.scores(tokens)  # the second stage reads BM25 whatever the first stage's weight
    # Rows with a vector score join the pool like keyword hits (see candidate_pool).
    idx = candidate_pool(snap, mask, kw, lin, max(k, POOL_FIRST) if learned else k, weights, now, vec=cos)
    if learned and len(idx) < snap.n:  # the BM25 top and the newest candidates join the second stage's pool
        idx = union_rows(snap.n, [idx, top_k(raw, POOL_KEYWORD, mask), newest_candidates(snap, mask, POOL_NEWEST)])
    if pin is not None:
        idx = np.union1d(idx, [pin])
    # Distinct ascending rows: as many as there are records is every row, taken as it is (no copies).
    sub = (lambda a: a) if len(idx) == snap.n else (lambda a: None if a is None else a[idx])  # noqa: E731
    # Every pool row is a candidate (the pinned parent was made one above): no mask to apply.
    scored = score(keyword_raw=sub(kw), ended_at_ms=sub(snap.ended_ms()), now_ms=now, lineage=sub(lin),
                   vector_cos=sub(cos), weights=weights)
    order = None
    if learned:
        from .ranker import learned_order  # the trees are read on the first learned query

        order = learned_order(snap, query, idx, scored, sub(raw), now, tokens=tokens)
        first = order.local[:k + 1].tolist()
        if len(first) < k + 1:  # more asked for than the pool holds: the formula's order goes on
            seen = set(first)
            first += [i for i in rank(scored, k + 1) if i not in seen][:k + 1 - len(first)]
    else:
        first = rank(scored, k)
    local = _pin_first(first, None if pin is None else int(np.searchsorted(idx, pin)), k)[:k]
    return _judged(Ranked([int(idx[i]) for i in local], local, scored, mask, ctx, now, kw, lin, pin, ev, candidates=allowed,
                          learned=order), snap, cos, weights)


def _judged(ranked: Ranked, snap: Snapshot, cos: np.ndarray | None, weights: Weights) -> Ranked:
    """``ranked`` with each top row's evidence and tier, when evidence was asked for."""
    if ranked.evidence is not None:
        ranked.tiers = judge(snap.index, ranked.evidence, ranked.top, cosine=cos, floor_vec=weights.floor_vec,
                             pinned=ranked.pinned)
    return ranked


def search(
    store: MemoryStore | Snapshot,
    query: str,
    *,
    k: int = 10,
    offset: int = 0,
    weights: Weights | LoadedWeights | None = None,
    settings: Settings,
    as_of: int | None = None,
    now_ms: int | None = None,
    parent_run_id: str | None = None,
    chat_session_id: str | None = None,
    exclude: str | None = None,
    filter: "RecordFilter | None" = None,
    query_vector: np.ndarray | None = None,
    pin_parent: bool = False,
    evidence: bool = False,
) -> SearchResult:
    """Score every record of a project against ``query`` and return the top ``k``.

    Args:
        store: the project (or an already loaded snapshot).
        query: free text (task of the new run).
        k: how many hits.
        offset: hits to skip first (the next page starts at the last one shown); the hits keep
            their ranks (``offset + 1`` on).
        weights: axis weights; default: what production reads (:func:`weights_for`).
        settings: the weights' sources, the embeddings, the lineage of the run being dispatched.
        as_of: only records that existed then count, and recency is measured from then.
        now_ms: the moment recency is measured from when ``as_of`` is not given.
        parent_run_id / chat_session_id: lineage of the run being dispatched (default:
            CYBERINE_PARENT_RUN_ID / CYBERINE_CHAT_SESSION_ID from ``settings``); the parent may be
            an abbreviation (:func:`dispatch_parent`; one that names no run is left out with a
            warning).
        exclude: a run id never to return (e.g. the query's own run).
        filter: only records that pass it are ranked (:func:`cybmem.retrieval.filters.record_mask`).
        query_vector: the query's embedding, if already known (else it is embedded when the
            vector axis is on: CYBERINE_MEMORY_EMBEDDINGS set, vectors stored, w_vec > 0).
        pin_parent: put the parent run (``parent_run_id``) first whatever its score, when it is
            a candidate (what dispatch does; see :func:`rank_query`).
        evidence: only runs with evidence about the task are ranked, each with its tier (what
            dispatch does; module docstring, "Evidence"); ``result.ranked.tiers`` says which.

    Returns:
        A :class:`SearchResult` whose hits carry rank, score and per-axis contributions, and a
        warning when the parent names no run or the vector axis had to be left out.
    """
    if offset < 0:
        raise ValidationError("offset must be 0 or more")
    snap = store if isinstance(store, Snapshot) else load_snapshot(store)
    parent_run_id, no_parent = dispatch_parent(snap, parent_run_id, settings, pinned=pin_parent)
    weights, vector, warnings = _vector_axis(snap, query, settings, weights, query_vector)
    warnings = [no_parent, *warnings] if no_parent else warnings
    chat_session_id = chat_session_id or settings.chat_session_id
    for attempt in range(2):
        where = record_mask(snap, filter) if filter is not None and filter.active else None
        ranked = rank_query(snap, query, k=k + offset, weights=weights, as_of=as_of, now_ms=now_ms,
                            parent_run_id=parent_run_id, chat_session_id=chat_session_id, exclude=exclude,
                            where=where, vector=vector, pin_parent=pin_parent, evidence=evidence, ranker=settings.ranker)
        # A hit whose file was edited in place since it was cached is read again, and the
        # ranking redone: what is shown (and injected) is what the file says now.
        fresh = verified(snap, ranked.top) if attempt == 0 else snap
        if fresh is snap:
            break
        snap = fresh
        if vector is not None:  # rows moved: the vectors again, the query's embedding reused
            weights, vector, more = _vector_axis(snap, query, settings, weights, vector.vector)
            warnings = list(dict.fromkeys([*warnings, *more]))
    hits: list[Hit] = []
    shown = ranked.top[offset:]
    ended = _shown_ended_ms(snap, shown)
    rows = snap.rows(shown, ["runId", "state", "task", "summary", "issues", "next"] + (["endedAt"] if ended is None else []))
    explained = explain_rows(ranked.scored, ranked.local[offset:]) if shown else []
    placed = ({int(i): p for p, i in enumerate(ranked.learned.local.tolist())} if ranked.learned is not None else {})
    for pos, (ex, row) in enumerate(zip(explained, rows), offset + 1):
        at = placed.get(ranked.local[pos - 1])
        learned = None if at is None else (ranked.learned, at)
        hits.append(Hit(
            rank=pos, run_id=row["runId"], score=float(ex["total"]) if at is None else ranked.learned.shown_score(at),
            first_stage=None if at is None else float(ex["total"]), learned=learned, contributions=ex["contributions"],
            values=ex["values"], state=row["state"],
            ended_at_ms=ended[pos - 1 - offset] if ended is not None else int(row["endedAt"].timestamp() * 1000),
            task=row["task"], summary=row["summary"] or "", issues=list(row["issues"] or []), next=list(row["next"] or []),
            pinned="parent" if ranked.pinned is not None and ranked.top[pos - 1] == ranked.pinned else None,
            evidence=ranked.tiers[pos - 1] if ranked.tiers else None,
        ))
    return SearchResult(query=query, hits=hits, weights=weights, now_ms=ranked.now_ms, as_of=as_of,
                        candidates=int(np.count_nonzero(ranked.mask)), context=ranked.context, snapshot=snap,
                        ranked=ranked, warnings=warnings, vector=vector is not None)


def _shown_ended_ms(snap: Snapshot, rows: list[int]) -> list[int] | None:
    """A hit's ``ended_at_ms`` for each of ``rows``, as ``int(endedAt.timestamp() * 1000)`` gives it
    for the UTC datetime :meth:`Snapshot.rows` reads (the float division and product too, not the
    stored ms as they are), from :meth:`Snapshot.ended_ms` without a datetime a hit; None when
    endedAt is not a UTC ms timestamp without nulls (:attr:`Snapshot.ended_utc`: then the rows'
    datetimes are read)."""
    if not snap.ended_utc:
        return None
    # An aware datetime's timestamp() is its timedelta from the epoch in exact microseconds divided
    # by 10**6 (correctly rounded); ms / 1000 is that same quotient.
    return [int(m / 1000 * 1000) for m in snap.ended_ms()[rows].tolist()]


def _vector_axis(snap: Snapshot, query: str, settings: Settings, weights: Weights | LoadedWeights | None,
                 query_vector: np.ndarray | None) -> tuple[Weights, "VectorQuery | None", list[str]]:
    """The weights to rank with and the vector axis (None: off), plus at most one warning.

    Without CYBERINE_MEMORY_EMBEDDINGS nothing here touches embeddings.jsonl or the network.
    """
    loaded = None
    if weights is None:
        loaded = weights_for(settings, snap.store)
    elif isinstance(weights, LoadedWeights):
        loaded = weights
    if loaded is not None:
        weights = loaded.weights
    if not settings.embeddings.on or snap.store is None:
        return weights, None, []
    wanted = weights.w_vec > 0 or (loaded is not None and loaded.sources["w_vec"] == "default")
    if not wanted:
        return weights, None, []
    from .vector_cache import load_index
    from .vectors import VectorQuery, embed_config_of, query_vector as embed_query

    config, problem = embed_config_of(settings)
    if config is None:
        return weights, None, [problem] if problem else []
    try:
        index = load_index(snap, config.model)
    except CybmemError as exc:  # embeddings.jsonl unreadable (a symlink, not a file): rank without it
        return weights, None, [f"vector axis off: {exc}"]
    if index is None:
        return weights, None, []
    if loaded is not None and loaded.sources["w_vec"] == "default":
        weights = dataclasses.replace(weights, w_vec=DEFAULT_W_VEC)  # cybmem.retrieval.weights: "default (embeddings)"
    if weights.w_vec <= 0:
        return weights, None, []
    vec, problem = (query_vector, None) if query_vector is not None else embed_query(config, query)
    if vec is None:
        return weights, None, [problem] if problem else []
    if np.asarray(vec).size != index.dims:
        return weights, None, [f"vector axis skipped: the query vector has {np.asarray(vec).size} dimensions, the stored "
                               f"{config.model} vectors {index.dims}; re-embed with `cybmem embed` after changing the model"]
    return weights, VectorQuery(index, np.asarray(vec, dtype=np.float32)), []
