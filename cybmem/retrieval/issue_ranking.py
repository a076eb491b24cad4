"""Open issues ranked for a task on the runs' axes: one scorer for runs and issues.

Every open issue is scored ``w_kw * keyword + w_lin * lineage + w_rec * recency`` with recency at
:data:`~cybmem.retrieval.weights.ISSUE_REC_SHARE` of the weights
(:meth:`~cybmem.retrieval.weights.Weights.for_issues`): keyword the better of its own title and detail
and the runs that raised or carry it (:func:`cybmem.retrieval.search.search` scored them), lineage from
that best run, recency from its last activity; the kernels and the order are the runs' own
(:mod:`cybmem.retrieval.scoring`). Only issues with evidence are listed, by the runs' rule: their own
title or detail holds a task term that is not common in the store, or a run with evidence carries
them. Dispatch (:mod:`cybmem.dispatch.inject`) lists the first distinct titles; `cybmem issues
--query` and the MCP ``issues`` tool, :func:`rank_open_issues`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..store.issue_tables import opened_in
from ..store.tokens import tokenize
from .scoring import normalize_keyword, ranking_order, recency
from .search import SearchResult, search
from .weights import Weights

__all__ = ["ChosenIssue", "IssueRanking", "RankedIssue", "score_issues", "rank_issues", "rank_open_issues"]


@dataclass
class ChosenIssue:
    """An open issue considered for the block, with why it ranks where it does."""

    ids: list[str]  # the issue id, then any other ids with the same title
    title: str
    opened_at_ms: int
    last_at_ms: int
    by_run_id: str | None
    score: float
    keyword: float  # w_kw * normalised keyword score of its best run
    lineage: float  # w_lin * lineage affinity of that run
    recency: float  # w_rec * recency of the issue's last event
    via: str | None  # the run that raised it and matched best, if any
    listed: str = "no"  # "issues": in the issues section; "raised": on a shown run's raised line; "no"
    own_evidence: bool = True  # its own title or detail holds a task term that is not common (or none was judged)
    tier: str = "full"  # how the block's issue section shows it: "full", or "pointer" (no evidence about the task)

    def to_dict(self) -> dict:
        return {"ids": self.ids, "title": self.title, "openedAt": self.opened_at_ms, "lastAt": self.last_at_ms,
                "openedBy": self.by_run_id, "score": round(self.score, 6), "listed": self.listed, "via": self.via,
                "ownEvidence": self.own_evidence, "tier": self.tier,
                "contributions": {"keyword": round(self.keyword, 6), "lineage": round(self.lineage, 6),
                                  "recency": round(self.recency, 6)}}



class IssueRanking:
    """Every open issue scored against the task, as arrays over the open rows of the issue fold;
    :class:`ChosenIssue` objects are made only for the rows a block needs (a store can hold tens
    of thousands of open issues)."""

    def __init__(self, folded: pa.Table, rows: np.ndarray, total: np.ndarray,
                 keyword: np.ndarray, lineage: np.ndarray, recency: np.ndarray, last_at: np.ndarray,
                 best_row: np.ndarray, run_ids: Any, title_codes: np.ndarray, related: np.ndarray | None = None,
                 own_evidence: np.ndarray | None = None):
        self.folded, self.rows, self.total = folded, rows, total
        # Which open issues have evidence about the task (all of them when none was judged).
        self.related = np.ones(len(rows), dtype=bool) if related is None else related
        # Which hold a task term that is not common in their own text (all when none was judged).
        self.own_evidence = np.ones(len(rows), dtype=bool) if own_evidence is None else own_evidence
        self._kw, self._lin, self._rec, self._last_at, self._best_row = keyword, lineage, recency, last_at, best_row
        self._run_ids = run_ids
        self._keys = title_codes
        self._order: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def _sorted(self, at: np.ndarray) -> np.ndarray:
        """``at`` (positions in :attr:`rows`, ascending) best first: score, then latest activity."""
        return at[ranking_order(self.total[at], self._last_at[at])]

    @property
    def order(self) -> np.ndarray:
        """Every open issue's position in :attr:`rows`, best first."""
        if self._order is None:
            self._order = self._sorted(np.arange(len(self.rows)))
        return self._order

    def top(self, count: int, skip: np.ndarray | None = None) -> np.ndarray:
        """The first ``count`` of :attr:`order` leaving out ``skip`` (a mask), without sorting the
        rest (tens of thousands of open issues, a handful shown)."""
        ok = np.arange(len(self.rows)) if skip is None else np.flatnonzero(~skip)
        if count < len(ok):
            t = self.total[ok]
            kth = np.partition(t, len(t) - count)[len(t) - count]
            ok = ok[t >= kth]  # every tie of the last place too: the exact prefix of the order
        return self._sorted(ok)[:count]

    def _cell(self, name: str, i: int) -> Any:
        return self.folded.column(name)[int(self.rows[i])].as_py()

    def issue_id(self, i: int) -> str:
        return self._cell("issueId", i)

    def issue(self, i: int) -> ChosenIssue:
        """Open issue ``i`` (a position in :attr:`rows`) as a :class:`ChosenIssue`."""
        r = int(self._best_row[i])
        opened = self.folded.column("openedAt")[int(self.rows[i])].cast(pa.int64()).as_py()
        return ChosenIssue(ids=[self.issue_id(i)], title=self._cell("title", i), opened_at_ms=int(opened),
                           last_at_ms=int(self._last_at[i]), by_run_id=self._cell("openedBy", i),
                           score=float(self.total[i]), keyword=float(self._kw[i]), lineage=float(self._lin[i]),
                           recency=float(self._rec[i]), via=self._run_ids[r].as_py() if r >= 0 else None,
                           own_evidence=bool(self.own_evidence[i]))

    def title_keys(self) -> np.ndarray:
        """A code per open issue; issues with the same :func:`cybmem.store.ledger.title_key` share it."""
        return self._keys

    def with_ids(self, ids: set[str]) -> np.ndarray:
        """A mask of the open issues whose id is in ``ids``."""
        if not ids or not len(self.rows):
            return np.zeros(len(self), dtype=bool)
        col = self.folded.column("issueId")
        hit = pc.is_in(col, value_set=pa.array(sorted(ids), pa.string())).to_numpy(zero_copy_only=False)
        return hit[self.rows]

    def distinct_titles(self, skip: np.ndarray, cap: int) -> tuple[list[ChosenIssue], int]:
        """The first ``cap`` distinct titles among the related ranked rows not in ``skip`` (ids of a
        repeated title join the first), and how many open issues not in ``skip`` are left beyond them."""
        left = int((~skip).sum())
        out = skip | ~self.related  # what may not be chosen
        available = int((~out).sum())
        if not left or cap <= 0 or not available:
            return [], left
        all_keys = self.title_keys()
        size = 4 * cap
        while True:  # a prefix of the order long enough to hold `cap` distinct titles
            order = self.top(size, out)
            keys = all_keys[order]
            _, first = np.unique(keys, return_index=True)
            if len(first) >= cap or len(order) >= available:
                break
            size *= 4
        leaders = np.sort(first)[:cap]  # positions in `order` of each chosen title's best row
        lead_keys = keys[leaders]
        members = np.isin(all_keys, lead_keys) & ~skip  # every open issue under a chosen title, in rank order
        chosen = {int(k): self.issue(int(order[p])) for k, p in zip(lead_keys.tolist(), leaders.tolist())}
        for i in self._sorted(np.flatnonzero(members)).tolist():
            c = chosen[int(all_keys[i])]
            if self.issue_id(i) != c.ids[0]:
                c.ids.append(self.issue_id(i))
        return list(chosen.values()), left - int(members.sum())


def score_issues(result: SearchResult, weights: Weights, *, as_of: int | None = None) -> IssueRanking:
    """Every open issue (as of ``as_of``) scored against the task of ``result`` (rule: module docstring).

    Args:
        result: the runs' ranking for the task (its snapshot, scored axes, evidence and moment).
        weights: the runs' weights; issues take :meth:`~cybmem.retrieval.weights.Weights.for_issues`.
        as_of: the moment of the issue fold (None: now).

    Returns:
        An :class:`IssueRanking` over the open issues, best first in its :attr:`~IssueRanking.order`.
    """
    weights = weights.for_issues()  # recency weighs more for an open issue than for a run
    snap = result.snapshot  # the one the hits were ranked over (search may have read the store again)
    folded = snap.fold(as_of)
    ranked = result.ranked
    n = snap.n
    mask = ranked.mask if ranked is not None else np.zeros(n, dtype=bool)
    # Last activity, title codes and the open rows do not depend on the task: cached with the snapshot.
    # Every run the moment allows counts for an issue's last activity, evidence or not (a run only
    # lends an issue its keyword score on evidence, below): an issue touched yesterday by a run that
    # shares no word with the task is as fresh as it is for any other task.
    activity = snap.activity(as_of, ranked.allowed if ranked is not None else mask)
    rows = opened_in(activity)
    m = len(rows)
    kw = np.zeros(n, dtype=np.float32)
    if ranked is not None and ranked.keyword is not None and weights.w_kw > 0:
        kw = normalize_keyword(ranked.keyword, mask, scale=weights.w_kw)
    lin = np.zeros(n, dtype=np.float32)
    if ranked is not None and ranked.lineage is not None and weights.w_lin > 0:
        lin = ranked.lineage.astype(np.float32) * np.float32(weights.w_lin)
    # The issue's own title and detail against the task (the issue index is row-aligned with the
    # current fold; a past fold maps into it by id), normalised like the runs' keyword axis.
    own = np.zeros(m, dtype=np.float32)
    ev = ranked.evidence if ranked is not None else None
    judged = ev is not None and ev.judged
    own_match = np.zeros(m, dtype=bool)  # the issue's own text holds a task term that is not common
    if (weights.w_kw > 0 or judged) and m:
        tokens = tokenize(result.query)
        raw = snap.issue_index().scores(tokens)
        if as_of is None:
            def pick(a: np.ndarray) -> np.ndarray:
                return a[rows].astype(np.float32)
        else:
            ids = folded.column("issueId").take(pa.array(rows))
            at = pc.fill_null(pc.index_in(ids, value_set=snap.fold().column("issueId")), -1).to_numpy().astype(np.int64)

            def pick(a: np.ndarray) -> np.ndarray:
                return np.where(at >= 0, a[np.maximum(at, 0)], 0).astype(np.float32)
        own = pick(raw)
        # not common among the runs (a word only the issue holds counts: another tool may have opened it)
        own_terms = [t for t, d in zip(ev.terms, ev.df.tolist()) if d < ev.common_df] if judged else []
        if own_terms:
            own_match = pick(snap.issue_index().scores(own_terms)) > 0
        own = normalize_keyword(own, scale=weights.w_kw) if weights.w_kw > 0 else np.zeros(m, np.float32)
    best = np.zeros(m, dtype=np.float32)
    best_row = np.full(m, -1, dtype=np.int64)
    last_at = activity.column("lastActivity").to_numpy()[rows] if m else np.zeros(0, np.int64)
    codes = activity.column("titleKey").to_numpy()[rows] if m else np.zeros(0, np.int32)
    # The best run per open issue: among the runs the task scored, the one that carries it
    # (which record carries which fold row is cached with the snapshot: no id matching here).
    val = kw + lin
    if m and n:
        record, fold_row = snap.carriers(as_of)
        where = np.full(folded.num_rows + 1, -1, dtype=np.int64)  # fold row -> place among the open (-1: not open)
        where[rows] = np.arange(m)
        pos = where[fold_row]
        take = np.flatnonzero((pos >= 0) & mask[record] & (val[record] > 0))
        carrier, pos = record[take], pos[take]
        cval = val[carrier]
        np.maximum.at(best, pos, cval)
        top = np.flatnonzero(cval == best[pos])  # each issue's best runs; of equals, the last one
        last = np.full(m, -1, dtype=np.int64)
        np.maximum.at(last, pos[top], top)
        found = last >= 0
        best_row[found] = carrier[last[found]]
    # The issue's keyword part: its own text or its best run, whichever matches better.
    has = best_row >= 0
    at_row = np.maximum(best_row, 0)
    carrier_kw = np.where(has, kw[at_row] if n else 0, 0).astype(np.float32)
    best = best + np.maximum(own - carrier_kw, 0)
    now = ranked.now_ms if ranked is not None else result.now_ms
    rec = recency(last_at, now, weights.half_life_days, weight=weights.w_rec) if weights.w_rec > 0 \
        else np.zeros(m, dtype=np.float32)
    total = best + rec
    keyword = np.maximum(carrier_kw, own)
    lineage = np.where(has, lin[at_row] if n else 0, 0).astype(np.float32)
    # When no run has evidence about the task (the block's one line), an open issue is listed only on
    # evidence of its own: its title or detail holds a task term that is not common in the store.
    # Otherwise the issues rank as the runs do, on the same axes (a run with evidence that carries
    # an issue lends it its keyword part). Listing only issues of their own evidence beside pointers
    # alone named the judged open issue less often (bench_block: 87 against 94 of 122 on pytest).
    found = ranked is not None and any(r != ranked.pinned for r in ranked.top)
    related = own_match | has if judged and not found else None
    return IssueRanking(folded, rows, total, keyword, lineage, rec, last_at, best_row,
                        snap.records.column("runId"), codes, related, own_match if judged else None)


def rank_issues(result: SearchResult, weights: Weights, *, as_of: int | None = None,
                limit: int | None = None) -> list[ChosenIssue]:
    """Every open issue (as of ``as_of``) scored against the task (rule: module docstring), best
    first; only the first ``limit`` when given (a store can hold tens of thousands of open issues)."""
    return _page(score_issues(result, weights, as_of=as_of), 0, limit)


def _page(ranking: IssueRanking, offset: int, limit: int | None) -> list[ChosenIssue]:
    """The issues of ``ranking`` from ``offset`` on, at most ``limit`` (None: all), best first; only
    the page is sorted when a limit is given."""
    order = ranking.order if limit is None else ranking.top(offset + limit)
    return [ranking.issue(i) for i in order.tolist()[offset:]]


@dataclass
class RankedIssue:
    """An open issue as the issue view lists it (:class:`~cybmem.store.ledger.IssueState`), with its
    score against a query and why (:class:`ChosenIssue`)."""

    state: Any  # IssueState
    chosen: ChosenIssue

    def to_dict(self) -> dict:
        scored = self.chosen.to_dict()
        return {**self.state.to_dict(), "score": scored["score"], "contributions": scored["contributions"], "via": scored["via"]}


def rank_open_issues(snap: Any, query: str, *, settings: Any, as_of: int | None = None, offset: int = 0,
                     limit: int | None = None, states: dict | None = None) -> tuple[list[RankedIssue], int, list[str]]:
    """A project's open issues ranked against ``query``, best first: what `cybmem issues --query` and
    the MCP ``issues`` tool answer.

    Args:
        snap: the project's snapshot.
        query: the text to rank against (a task, a question).
        settings: the weights' source and the vector axis (:class:`~cybmem.settings.Settings`).
        as_of: the ledger and the runs as they were then (epoch ms; None: now).
        offset / limit: the page (None: every open issue; a store can hold tens of thousands).
        states: issue id -> IssueState of the same snapshot, when the caller holds them already.

    Returns:
        The page, the number of open issues in all, and the search's warnings.
    """
    from ..store.ledger import states_from_table

    result = search(snap, query, k=1, settings=settings, as_of=as_of)
    if states is None:
        states = {s.issueId: s for s in states_from_table(snap.fold(as_of))}
    ranking = score_issues(result, result.weights, as_of=as_of)
    page = _page(ranking, offset, limit)
    return [RankedIssue(states[c.ids[0]], c) for c in page if c.ids[0] in states], len(ranking), list(result.warnings)
