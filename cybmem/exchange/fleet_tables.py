"""The fleet's issue and lineage tables, computed one partition at a time.

Each function takes one partition's frame (:mod:`cybmem.exchange.fleet_dataset`) and applies the
single-process rule to each (machine, project) in it: the issue fold
(:func:`cybmem.explore.frames.issue_fold`), counts per state, the passes of the issue-age
histograms (ranges, counts over the fleet's edges, the values around each median) and the lineage
summary (:func:`cybmem.explore.frames.lineage_edges`). The fleet sums what they return;
:func:`issue_age_data` sums the histograms' passes into the fleet's figure data.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .fleet_dataset import by_group
from .parquet_dataset import ISSUES_SCHEMA

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ..explore.frames import IssueAgeData

__all__ = [
    "LINEAGE_COLUMNS",
    "fold_part",
    "issue_summary_part",
    "age_range_part",
    "age_counts_part",
    "age_middle_part",
    "issue_age_data",
    "lineage_part",
]

#: The record columns :func:`lineage_part` reads.
LINEAGE_COLUMNS = ("runId", "state", "endedAt", "parentRunId", "chatSessionId", "previousRunId", "supersededBy",
                   "supersedes")
_EVENT_COLUMNS = tuple(ISSUES_SCHEMA.names)
_STATES = ("done", "error", "cancelled")
_LINKS = ("previous", "parent", "chat", "superseded")


def fold_part(events: "pd.DataFrame", now: "pd.Timestamp") -> "pd.DataFrame":
    """The issue fold of each (machine, project) of a partition: :func:`cybmem.explore.frames.issue_fold`."""
    import pandas as pd

    from ..explore.frames import issue_fold

    out = []
    for machine, project, rows in by_group(events):
        f = issue_fold(rows[list(_EVENT_COLUMNS)], now=now)
        f.insert(0, "project", pd.array([project] * len(f), dtype=events["project"].dtype))
        f.insert(0, "machine", pd.array([machine] * len(f), dtype=events["machine"].dtype))
        out.append(f)
    if not out:
        f = issue_fold(events[list(_EVENT_COLUMNS)].iloc[0:0], now=now)
        f.insert(0, "project", events["project"].iloc[0:0])
        f.insert(0, "machine", events["machine"].iloc[0:0])
        return f
    return pd.concat(out, ignore_index=True) if len(out) > 1 else out[0]


def issue_summary_part(fold: "pd.DataFrame") -> "pd.DataFrame":
    """Per (machine, project): issues by state, reopens, median age of the open ones (days)."""
    import pandas as pd

    from ..explore.frames import issue_age_values

    rows = []
    for machine, project, f in by_group(fold):
        states = f["state"].value_counts()
        ages = issue_age_values(f)["open"] / 86400
        rows.append({"machine": machine, "project": project, "issues": len(f),
                     **{s: int(states.get(s, 0)) for s in ("opened", "reopened", "resolved", "wontfix")},
                     "reopens": int(f["reopenCount"].sum()),
                     "medianOpenDays": float(np.median(ages)) if len(ages) else float("nan")})
    cols = ["machine", "project", "issues", "opened", "reopened", "resolved", "wontfix", "reopens", "medianOpenDays"]
    return pd.DataFrame(rows, columns=cols).astype({c: "int64" for c in cols[2:-1]} | {"medianOpenDays": "float64"})


def age_range_part(fold: "pd.DataFrame") -> dict:
    """Pass 1 of the fleet's age histograms: per panel, how many durations, the longest, how many under a minute."""
    from ..explore.frames import AGE_PANELS, SHORTEST_AGE_S, issue_age_values

    v = issue_age_values(fold)
    out: dict[str, Any] = {p: (len(v[p]), float(v[p].max()) if len(v[p]) else -math.inf, int((v[p] < SHORTEST_AGE_S).sum()))
                           for p in AGE_PANELS}
    uniq, counts = np.unique(v["reopens"], return_counts=True)
    out["reopens"] = dict(zip(uniq.tolist(), counts.tolist()))
    out["issues"] = len(fold)
    return out


def age_counts_part(fold: "pd.DataFrame", edges: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Pass 2: each panel's counts over the fleet-wide edges (:func:`cybmem.explore.frames.age_counts`)."""
    from ..explore.frames import age_counts, issue_age_values

    v = issue_age_values(fold)
    return {p: age_counts(v[p], e) for p, e in edges.items()}


def age_middle_part(fold: "pd.DataFrame", bins: dict[str, tuple[float, float, bool]]) -> dict[str, np.ndarray]:
    """Pass 3: the durations in the bin(s) holding each panel's median (so the median is exact).

    Bins count durations clipped at a minute; clipping keeps the order, so the values of the bins
    around the middle rank, sorted, hold the middle values themselves.
    """
    from ..explore.frames import SHORTEST_AGE_S, issue_age_values

    v = issue_age_values(fold)
    out = {}
    for p, (lo, hi, last) in bins.items():
        x = v[p]
        c = np.clip(x, SHORTEST_AGE_S, None)
        out[p] = x[(c >= lo) & ((c <= hi) if last else (c < hi))]
    return out


def issue_age_data(on_folds: Callable[..., list]) -> "IssueAgeData":
    """The fleet's issue-age histograms from three passes over its partitions' folds.

    ``on_folds(fn, *args)`` runs ``fn(fold, *args)`` on every partition's fold (here or on the
    cluster) and returns the results. The ranges give the fleet-wide bin edges, the counts over
    them are summed, then the values of the bins that hold each median give it exactly; equal to
    ``IssueAgeData.of`` of the whole fold.
    """
    from ..explore.frames import AGE_PANELS, Histogram, IssueAgeData, age_edges

    ranges = on_folds(age_range_part)
    n = {p: sum(r[p][0] for r in ranges) for p in AGE_PANELS}
    edges = {p: age_edges(n[p], max(r[p][1] for r in ranges)) for p in AGE_PANELS if n[p]}
    counts = {p: sum(c[p] for c in on_folds(age_counts_part, edges)) for p in edges}
    # The median: the one or two middle values by rank, found in the bins that hold them.
    middle: dict[str, tuple[float, float, bool]] = {}
    ranks: dict[str, tuple[int, int, int]] = {}
    for p in edges:
        cum = np.cumsum(counts[p])
        lo_rank, hi_rank = (n[p] - 1) // 2, n[p] // 2
        b0, b1 = (int(np.searchsorted(cum, r, side="right")) for r in (lo_rank, hi_rank))
        before = int(cum[b0 - 1]) if b0 else 0
        middle[p] = (float(edges[p][b0]), float(edges[p][b1 + 1]), b1 == len(counts[p]) - 1)
        ranks[p] = (before, lo_rank, hi_rank)
    values = on_folds(age_middle_part, middle) if middle else []
    reopens: dict[int, int] = {}
    for r in ranges:
        for key, c in r["reopens"].items():
            reopens[int(key)] = reopens.get(int(key), 0) + int(c)
    hists = {}
    for p in AGE_PANELS:
        if p not in edges:
            hists[p] = Histogram(0, np.zeros(0), np.zeros(0, dtype=np.int64), None, 0)
            continue
        mid = np.sort(np.concatenate([v[p] for v in values]))
        before, lo_rank, hi_rank = ranks[p]
        median = float(np.mean(mid[[lo_rank - before, hi_rank - before]]) if lo_rank != hi_rank
                       else mid[lo_rank - before])
        hists[p] = Histogram(n[p], edges[p], counts[p], median, sum(r[p][2] for r in ranges))
    return IssueAgeData(sum(r["issues"] for r in ranges), hists["open"], hists["resolved"], dict(sorted(reopens.items())))


def lineage_part(records: "pd.DataFrame") -> "pd.DataFrame":
    """Per (machine, project): runs by state, lineage links by kind (:func:`cybmem.explore.frames.lineage_edges`), span."""
    import pandas as pd

    from ..explore.frames import lineage_edges

    rows = []
    for machine, project, r in by_group(records):
        edges = lineage_edges(r)["kind"].astype(str).value_counts()
        states = r["state"].value_counts()
        rows.append({"machine": machine, "project": project, "runs": len(r),
                     **{s: int(states.get(s, 0)) for s in _STATES},
                     **{k: int(edges.get(k, 0)) for k in _LINKS},
                     "chats": int(r["chatSessionId"].nunique()),
                     "firstEnded": r["endedAt"].min(), "lastEnded": r["endedAt"].max()})
    cols = ["machine", "project", "runs", *_STATES, *_LINKS, "chats", "firstEnded", "lastEnded"]
    out = pd.DataFrame(rows, columns=cols)
    out = out.astype({c: "int64" for c in cols[2:-2]})
    for c in ("firstEnded", "lastEnded"):
        out[c] = pd.to_datetime(out[c], utc=True).astype("datetime64[ms, UTC]")
    return out
