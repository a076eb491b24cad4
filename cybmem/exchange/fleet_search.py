"""Search over the fleet: one ranking of every machine's records, as the linear formula ranks one
store holding them all (the learned ranker's second stage does not apply: several of its features,
the runs since and the project's pace, belong to one project's history).

Each partition's (machine, project)s are loaded as search loads a store (a :class:`Shard` of
snapshots, built and kept where it runs); a search is three passes over the shards: BM25's
statistics and the newest candidate, the keyword maximum under the fleet's statistics, each
(machine, project)'s top k; then the merge breaks ties as :func:`cybmem.retrieval.scoring.top_k`
does. Lineage stays inside a (machine, project).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np
import pyarrow as pa

from ..retrieval.search import Hit
from ..retrieval.weights import Weights
from .fleet_dataset import Group, group_events, group_records
from .parquet_dataset import ISSUES_SCHEMA

if TYPE_CHECKING:  # pragma: no cover
    from ..store.snapshot import Snapshot
    from .fleet_claims import Claim

__all__ = ["Shard", "FleetHit", "FleetSearchResult", "search"]

_SEARCH_COLUMNS = ("runId", "task", "state", "endedAt", "parentRunId", "chatSessionId", "previousRunId", "rootRunId",
                   "summary", "issues", "next", "supersededBy", "supersedes")
_EVENT_COLUMNS = tuple(ISSUES_SCHEMA.names)


class Shard:
    """The snapshots of one partition's (machine, project)s, as search loads a store.

    Each group's snapshot is built by the same steps as a store's first load
    (:mod:`cybmem.store.refresh`): issue texts (title and detail) from the fold of its ledger, keyword texts, tokens, one
    :class:`KeywordIndex`. Pickles its indexes as Arrow (a worker may hand a shard to another).
    """

    def __init__(self, dataset: str, parts: list[tuple[str, str, pa.Table, pa.Table, Any]]):
        self.dataset = dataset
        self.parts = parts  # (machine, project, records, events, KeywordIndex)
        self._snaps: list | None = None

    @classmethod
    def build(cls, dataset: str, groups: tuple[Group, ...]) -> "Shard":
        from ..store.keyword_index import KeywordIndex
        from ..store.arrow_records import keyword_text_array
        from ..store.issue_tables import issue_texts
        from ..store.tokens import tokenize_arrow

        parts = []
        for g in groups:
            records = group_records(g, _SEARCH_COLUMNS)
            events = group_events(g, _EVENT_COLUMNS)
            texts = keyword_text_array(records, issue_texts(events))  # as a project's snapshot indexes them
            parts.append((g.machine, g.project, records, events, KeywordIndex.build(tokenize_arrow(texts))))
        return cls(dataset, parts)

    def snapshots(self) -> list[tuple[str, str, "Snapshot"]]:
        if self._snaps is None:
            from ..store.snapshot import Snapshot
            from ..store.memory_store import MemoryStore

            self._snaps = []
            for machine, project, records, events, index in self.parts:
                # The store only names the project; nothing is read from it (the snapshot holds the data).
                store = MemoryStore(Path(self.dataset) / "records" / f"machine={machine}", project)
                self._snaps.append((machine, project, Snapshot(store, records, events, index)))
        return self._snaps

    @property
    def nbytes(self) -> int:
        """About the memory it holds (tables, plus ~10 bytes a posting and 8 a document for the index)."""
        return sum(r.nbytes + e.nbytes + 10 * i.total_len + 8 * i.n_docs for _m, _p, r, e, i in self.parts)

    def __getstate__(self):
        return {"dataset": self.dataset,
                "parts": [(m, p, r, e, i.to_arrow()) for m, p, r, e, i in self.parts]}

    def __setstate__(self, state):
        from ..store.keyword_index import KeywordIndex

        self.dataset = state["dataset"]
        self.parts = [(m, p, r, e, KeywordIndex.from_arrow(i)) for m, p, r, e, i in state["parts"]]
        self._snaps = None


try:  # tell Dask what a shard weighs, so the scheduler runs queries where it lives instead of copying it
    from dask.sizeof import sizeof as _sizeof
except ImportError:  # pragma: no cover - the fleet itself needs Dask; inline use does not
    pass
else:
    _sizeof.register(Shard)(lambda shard: shard.nbytes)


def _shard_stats(shard: Shard, tokens: list[str], as_of: int | None) -> tuple[Any, int, tuple | None]:
    """Phase 1: the shard's BM25 statistics, its candidates and its newest candidate (endedAt, runId)."""
    from ..store.keyword_index import QueryStats

    stats = QueryStats(tuple(dict.fromkeys(tokens)), 0, 0, (0,) * len(dict.fromkeys(tokens)))
    newest = None
    candidates = 0
    for _m, _p, snap in shard.snapshots():
        stats = stats + snap.index.query_stats(tokens)
        mask = snap.candidates(as_of)
        candidates += int(mask.sum())
        if snap.n and mask.any():
            order = snap.newest_first()
            i = int(order[np.argmax(mask[order])])
            key = (int(snap.ended_ms()[i]), snap.records.column("runId")[i].as_py())
            newest = key if newest is None or key > newest else newest
    return stats, candidates, newest


def _shard_keyword_max(shard: Shard, tokens: list[str], stats, as_of: int | None) -> float:
    """Phase 2: the shard's max raw keyword score over its candidates, under the fleet's statistics."""
    from ..retrieval.scoring import keyword_max

    return max((keyword_max(snap.index.scores(tokens, stats=stats), snap.candidates(as_of))
                for _m, _p, snap in shard.snapshots() if snap.n), default=0.0)


def _shard_top(shard: Shard, tokens: list[str], stats, kw_max: float, context, now: int, weights: Weights,
               k: int, as_of: int | None) -> list[dict]:
    """Phase 3: score the shard's records as :func:`cybmem.retrieval.search.rank_query` does, top k per (machine, project)."""
    from ..retrieval.scoring import explain, lineage_affinity, score, top_k

    out = []
    for machine, project, snap in shard.snapshots():
        mask = snap.candidates(as_of)
        if not (snap.n and k > 0 and mask.any()):
            continue
        kw = snap.index.scores(tokens, stats=stats) if weights.w_kw else None
        lin = lineage_affinity(*snap.lineage_columns(), context) if weights.w_lin else None
        scored = score(keyword_raw=kw, ended_at_ms=snap.ended_ms(), now_ms=now, lineage=lin, vector_cos=None,
                       weights=weights, mask=mask, keyword_max=kw_max)
        top = top_k(scored.total, k, mask).tolist()
        rows = snap.rows(top, ["runId", "endedAt", "state", "task", "summary", "issues", "next"])
        ended = snap.ended_ms()
        for i, row in zip(top, rows):
            ex = explain(scored, i)
            out.append({"machine": machine, "project": project, "runId": row["runId"], "total": scored.total[i],
                        "ended": int(ended[i]), "contributions": ex["contributions"], "values": ex["values"],
                        "state": row["state"], "task": row["task"], "summary": row["summary"] or "",
                        "issues": list(row["issues"] or []), "next": list(row["next"] or [])})
    return out


@dataclass
class FleetHit(Hit):
    """A search hit with the machine and project its record came from.

    ``claimed_by``: when more than one (machine, project) exported this run id, all of them as
    ``machine/project``, the owner (shown) first; ``conflict``: their records of it differ.
    """

    machine: str = ""
    project: str = ""
    claimed_by: list[str] = field(default_factory=list)
    conflict: bool = False

    def to_dict(self, *, explain: bool = False) -> dict:
        out = {"rank": self.rank, "machine": self.machine, "project": self.project}
        out.update((k, v) for k, v in super().to_dict(explain=explain).items() if k != "rank")
        out.update(claimedBy=list(self.claimed_by), conflict=self.conflict)
        return out


@dataclass
class FleetSearchResult:
    """Hits over the fleet, and what they were computed against."""

    query: str
    hits: list[FleetHit]
    weights: Weights
    now_ms: int
    as_of: int | None
    records: int  # records searched (BM25's N)
    candidates: int  # of those, records a search may return (not superseded, ended by as_of)
    partitions: int
    seconds: float = 0.0
    scheduler: str = ""  # where it ran: "inline", "local" (a LocalCluster) or a scheduler's address

    def to_dict(self, *, explain: bool = False) -> dict:
        return {"query": self.query, "asOf": self.as_of, "now": self.now_ms, "records": self.records,
                "candidates": self.candidates, "partitions": self.partitions, "weights": self.weights.to_dict(),
                "hits": [h.to_dict(explain=explain) for h in self.hits], "seconds": round(self.seconds, 3),
                "scheduler": self.scheduler}


def search(run: Callable[..., list], claims: Mapping[str, "Claim"], query: str, *, k: int = 10,
           weights: Weights | None = None, as_of: int | None = None, now_ms: int | None = None,
           parent_run_id: str | None = None, chat_session_id: str | None = None, partitions: int = 0,
           scheduler: str = "", started: float | None = None) -> FleetSearchResult:
    """The top ``k`` of the fleet's records for ``query``: what :meth:`cybmem.exchange.fleet.Fleet.search` returns.

    Args:
        run: ``run(fn, *args)`` calls ``fn(shard, *args)`` on every :class:`Shard` of the fleet (here
            or where it lives on the cluster) and returns the results in order.
        claims: the run ids more than one (machine, project) exported (:mod:`cybmem.exchange.fleet_claims`).
        query, k, weights, as_of, now_ms, parent_run_id, chat_session_id: as :meth:`Fleet.search` takes them.
        partitions, scheduler: what the result says the search ran over, and where.
        started: when the search began (``time.perf_counter()``; default: now), for ``seconds``.
    """
    from ..retrieval.scoring import LineageContext
    from ..store.tokens import tokenize

    started = time.perf_counter() if started is None else started
    weights = weights or Weights()
    tokens = tokenize(query)
    now = as_of if as_of is not None else (now_ms if now_ms is not None else int(time.time() * 1000))
    phase1 = run(_shard_stats, tokens, as_of)
    stats = sum(s for s, _, _ in phase1)
    candidates = sum(c for _, c, _ in phase1)
    newest = max((x for _, _, x in phase1 if x is not None), default=None)
    hits: list[FleetHit] = []
    if k > 0 and candidates:
        kw_max = max(run(_shard_keyword_max, tokens, stats, as_of)) if weights.w_kw else 0.0
        context = LineageContext(parent_run_id=parent_run_id, chat_session_id=chat_session_id,
                                 previous_run_id=newest[1] if newest else None, root_run_id=None)
        found = [h for part in run(_shard_top, tokens, stats, kw_max, context, now, weights, k, as_of)
                 for h in part]
        # ties: the newer record first (endedAt, then runId), as top_k breaks them in a store ordered oldest first
        found.sort(key=lambda h: (np.float32(h["total"]), h["ended"], h["runId"], h["machine"], h["project"]),
                   reverse=True)
        for rank, h in enumerate(found[:k], 1):
            claim = claims.get(h["runId"])
            hits.append(FleetHit(rank=rank, run_id=h["runId"], score=float(h["total"]),
                                 contributions=h["contributions"], values=h["values"], ended_at_ms=h["ended"],
                                 state=h["state"], task=h["task"], summary=h["summary"], issues=h["issues"],
                                 next=h["next"], machine=h["machine"], project=h["project"],
                                 claimed_by=claim.claimants if claim else [], conflict=bool(claim and claim.differ)))
    return FleetSearchResult(query=query, hits=hits, weights=weights, now_ms=now, as_of=as_of,
                             records=stats.n_docs if stats else 0, candidates=candidates,
                             partitions=partitions, seconds=time.perf_counter() - started,
                             scheduler=scheduler)
