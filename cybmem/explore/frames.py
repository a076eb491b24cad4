"""pandas views of a project's memory, for people and notebooks.

Every view comes from the Arrow snapshot (:func:`cybmem.store.loading.load_snapshot`) and the shared
rules (the issue fold of :mod:`cybmem.store.ledger`, supersession of :mod:`cybmem.store.supersession`); none
computes a rule of its own. Each takes the project (a store or its snapshot) first. Timestamps
are tz-aware UTC, lists are Arrow-backed, text columns are pandas strings and a run's ``state`` is
a categorical of :data:`cybmem.store.records.STATES`. Also the numbers of the issue-age histograms
(:class:`IssueAgeData`), which :mod:`cybmem.explore.plots` draws and the fleet's partitions count without
importing matplotlib. Nothing in the write or inject path imports this module.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ..store import ledger as issues, supersession
from ..store.records import STATES
from ..store.loading import load_snapshot
from ..store.snapshot import Snapshot
from ..store.memory_store import MemoryStore

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "records_frame", "issue_events_frame", "issue_fold", "lineage_edges", "tree_roots", "lineage_lanes", "dispatch_trees",
    "tree_members", "resolve_run", "epoch_days", "natural_key", "period_starts",
    "SHORTEST_AGE_S", "AGE_PANELS", "age_edges", "age_counts", "Histogram", "issue_age_values", "IssueAgeData",
]

_FOLD_COLUMNS = ["issueId", "title", "state", "openedAt", "resolvedAt", "lastAt", "openAge", "timeToResolve",
                 "reopenCount", "events", "openedBy", "resolvedBy", "lastBy", "detail"]
_DIGITS = re.compile(r"(\d+)")


def _snapshot(source: MemoryStore | Snapshot) -> Snapshot:
    return source if isinstance(source, Snapshot) else load_snapshot(source)


def types_mapper(typ: pa.DataType):
    import pandas as pd

    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return pd.ArrowDtype(typ)
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return pd.StringDtype()
    return None


def records_frame(source: MemoryStore | Snapshot, *, as_of: int | None = None,
                  include_superseded: bool = True) -> "pd.DataFrame":
    """A project's records, one row each, oldest first.

    Columns: the record's fields (lineage and outcome flattened, ``workerAgents`` and
    ``workerStates`` lists), ``superseded`` (a correction exists, by the supersession rule, as of
    ``as_of`` when given) and ``durationS``. ``state`` is a categorical whose categories are
    done, error, cancelled (in that order, whether or not they occur), so counts and tables
    list every state.

    Args:
        source: the project's store, or a loaded snapshot.
        as_of: only records that had ended by then (epoch ms).
        include_superseded: False drops superseded records.
    """
    import pandas as pd

    snap = _snapshot(source)
    df = snap.records.drop_columns(["inode"]).to_pandas(types_mapper=types_mapper)
    df["superseded"] = ~snap.candidates(as_of)  # for the rows kept below: superseded as of then
    df["durationS"] = (df["endedAt"] - df["startedAt"]).dt.total_seconds()
    df["state"] = df["state"].astype(pd.CategoricalDtype(STATES))  # the snapshot holds no other state
    if as_of is not None:
        df = df[snap.ended_ms() <= as_of]
    if not include_superseded:
        df = df[~df["superseded"]]
    return df.sort_values(["endedAt", "runId"], kind="stable").reset_index(drop=True)


def natural_key(values: "pd.Series") -> "pd.Series":
    """A sort key that orders the numbers inside ids by value: ticket-9, ticket-10, ticket-998, ticket-10001.

    For ``sort_values(key=natural_key)`` (pandas passes the column): the rank of each value
    when the digit runs compare as numbers and the text between them as text (case-folded,
    ties broken by the text itself). Missing values sort last.
    """
    import pandas as pd

    def parts(text: str) -> tuple:
        # re.split with a group alternates text and digits, text first: positions never mix types
        return tuple(int(p) if i % 2 else p.casefold() for i, p in enumerate(_DIGITS.split(text))), text

    present = values.dropna()
    order = {v: i for i, v in enumerate(sorted(set(present.astype(str)), key=parts))}
    return pd.Series([order[str(v)] if not pd.isna(v) else len(order) for v in values], index=values.index,
                     dtype="int64")


def issue_events_frame(source: MemoryStore | Snapshot) -> "pd.DataFrame":
    """The issue ledger, one row per event, in file order (``line``: its line in issues.jsonl)."""
    return _snapshot(source).events.to_pandas(types_mapper=types_mapper)


def _events_table(events: "pd.DataFrame") -> pa.Table:
    """An events DataFrame (e.g. a filtered :func:`issue_events_frame`) back as the Arrow events table."""
    import pandas as pd

    schema = issues.events_table([]).schema
    cols = {}
    for f in schema:
        if f.name in events.columns:
            cols[f.name] = pa.array(events[f.name].tolist(), type=pa.int64() if f.name == "line" else None, from_pandas=True)
        else:
            cols[f.name] = pa.nulls(len(events), f.type)
    at = events["at"]
    if hasattr(at, "dt"):
        if at.dt.tz is None:
            at = at.dt.tz_localize("UTC")
        ms = ((at - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(1, "ms")).astype("int64")
        cols["at"] = pa.array(ms.tolist(), pa.int64()).cast(schema.field("at").type)
    else:
        cols["at"] = pa.array(at.tolist(), pa.int64()).cast(schema.field("at").type)
    return pa.table({f.name: cols[f.name].cast(f.type) for f in schema}, schema=schema)


def issue_fold(events: "pd.DataFrame | MemoryStore | Snapshot", *, now: "pd.Timestamp | None" = None) -> "pd.DataFrame":
    """Current state per issue (the fold of :mod:`cybmem.store.ledger`), one row per issue.

    Args:
        events: a project (its whole ledger) or an events DataFrame (any subset of
            :func:`issue_events_frame`, in file order).
        now: the moment open issues' ages are measured to (default: now).

    Returns:
        Columns issueId, title, state, openedAt, resolvedAt, lastAt, ``openAge`` (open and
        reopened issues: ``now - openedAt``; NaT once closed), ``timeToResolve`` (resolved and
        wontfix issues: ``resolvedAt - openedAt``, from the first opening; NaT while open),
        reopenCount, events, openedBy, resolvedBy, lastBy, detail. Both durations are clipped at
        0: events out of time order (a resolution stamped before the opening, an opening after
        ``now``) give 0, never a negative duration.
    """
    import pandas as pd

    table = events.events if isinstance(events, Snapshot) else (
        load_snapshot(events).events if isinstance(events, MemoryStore) else _events_table(events))
    out = issues.fold_table(table).to_pandas(types_mapper=types_mapper)
    now = now if now is not None else pd.Timestamp.now(tz="UTC")
    open_ = out["state"].isin(list(issues.OPEN))
    zero = pd.Timedelta(0)
    out["openAge"] = (now - out["openedAt"]).where(open_).clip(lower=zero)
    out["timeToResolve"] = (out["resolvedAt"] - out["openedAt"]).where(~open_).clip(lower=zero)
    return out[_FOLD_COLUMNS]


def lineage_edges(source: "MemoryStore | Snapshot | pd.DataFrame") -> "pd.DataFrame":
    """Edges between runs: previous, parent, chat (consecutive runs of a session), superseded.

    Args:
        source: a project (a store or its snapshot: all its records) or a records DataFrame
            (any subset of :func:`records_frame`, e.g. one time window); edges to runs outside
            it are left out.

    Returns:
        Columns src, dst, kind (a categorical). ``src`` is the earlier run (the predecessor,
        the parent, the superseded record), ``dst`` the later one. Supersession follows
        cybmem.store.supersession's rule over the records given.
    """
    import pandas as pd

    records = source if isinstance(source, pd.DataFrame) else records_frame(source)
    frames = []
    ids = set(records["runId"])
    for col, kind in (("previousRunId", "previous"), ("parentRunId", "parent")):
        sub = records.loc[records[col].notna() & records[col].isin(ids), [col, "runId"]]
        frames.append(pd.DataFrame({"src": sub[col].astype(str), "dst": sub["runId"].astype(str), "kind": kind}))
    chat = records.loc[records["chatSessionId"].notna(), ["chatSessionId", "runId", "endedAt"]].sort_values(["chatSessionId", "endedAt"])
    prev = chat.groupby("chatSessionId")["runId"].shift(1)
    sub = chat[prev.notna()]
    frames.append(pd.DataFrame({"src": prev[prev.notna()].astype(str), "dst": sub["runId"].astype(str), "kind": "chat"}))
    linked = records.loc[records["supersedes"].notna() | records["supersededBy"].notna()]
    ended_ms = ((records["endedAt"] - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(1, "ms")).astype("int64")
    ended = dict(zip(records["runId"].astype(str), ended_ms))
    links = [(str(r), int(ended[str(r)]), None if pd.isna(a) else str(a), None if pd.isna(b) else str(b))
             for r, a, b in zip(linked["runId"], linked["supersedes"], linked["supersededBy"])]
    mapping = supersession.resolve(links, ended) if links else {}
    frames.append(pd.DataFrame({"src": list(mapping), "dst": list(mapping.values()), "kind": "superseded"}))
    out = pd.concat(frames, ignore_index=True).drop_duplicates().reset_index(drop=True)
    return out.astype({"src": "string", "dst": "string", "kind": "category"})


def _auto_freq(span_days: float) -> tuple[str, str]:
    if span_days <= 60:
        return "D", "day"
    if span_days <= 2 * 365:
        return "W", "week"
    if span_days <= 25 * 365:
        return "MS", "month"
    return "YS", "year"


def period_starts(times: "pd.Series", freq: str | None = None) -> tuple["pd.Series", str]:
    """Each tz-aware timestamp's period start (naive UTC) and the period's name (day, week, month,
    year); ``freq`` a pandas frequency (``"D"``, ``"W"``, ``"MS"``, ``"YS"``), None: by the span
    (days up to 60 days, weeks up to 2 years, months up to 25, else years)."""
    naive = times.dt.tz_convert("UTC").dt.tz_localize(None)
    name = {"D": "day", "W": "week", "MS": "month", "YS": "year"}.get(freq or "", freq)
    if freq is None:
        freq, name = _auto_freq((naive.max() - naive.min()).total_seconds() / 86400 if len(naive) else 0.0)
    return naive.dt.to_period(freq[0] if freq in ("MS", "YS") else freq).dt.start_time, name


# --- issue-age histograms: the numbers (cybmem.explore.plots draws them; fleet partitions count them) ---


#: Durations shorter than this (seconds) are counted at it: the figure's log axis has no zero.
SHORTEST_AGE_S = 60.0


def age_edges(n: int, longest: float) -> np.ndarray:
    """Bin edges (seconds) of an age histogram of ``n`` durations, the longest ``longest`` seconds.

    Log-spaced from one minute (shorter durations are counted at one minute) to a little past
    the longest, ``sqrt(n) + 6`` edges within [8, 40].
    """
    lo, hi = SHORTEST_AGE_S, max(max(float(longest), SHORTEST_AGE_S) * 1.05, SHORTEST_AGE_S * 10)
    return np.geomspace(lo, hi, min(40, max(8, int(math.sqrt(n)) + 6)))


def age_counts(seconds: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """How many of ``seconds`` fall in each bin of ``edges`` (durations under a minute count at one)."""
    return np.histogram(np.clip(np.asarray(seconds, dtype=float), SHORTEST_AGE_S, None), edges)[0].astype(np.int64)


@dataclass
class Histogram:
    """An age histogram's numbers: the count, bin edges and counts, the median and how many are under a minute.

    A collection counted in parts (the partitions of a fleet) sums its parts' :func:`age_counts`
    over the :func:`age_edges` of the whole and gets the same numbers.
    """

    n: int
    edges: np.ndarray
    counts: np.ndarray
    median: float | None
    short: int = 0  # durations under a minute (counted at one minute)

    @classmethod
    def of(cls, seconds: np.ndarray) -> "Histogram":
        seconds = np.asarray(seconds, dtype=float)
        if not len(seconds):
            return cls(0, np.zeros(0), np.zeros(0, dtype=np.int64), None, 0)
        edges = age_edges(len(seconds), float(seconds.max()))
        return cls(len(seconds), edges, age_counts(seconds, edges), float(np.median(seconds)),
                   int((seconds < SHORTEST_AGE_S).sum()))

    def to_dict(self) -> dict:
        return {"n": self.n, "edges": self.edges.tolist(), "counts": self.counts.tolist(), "median": self.median,
                "short": self.short}


#: The panels of :func:`issue_age_histograms` that count durations.
AGE_PANELS = ("open", "resolved")


def issue_age_values(fold: "pd.DataFrame") -> dict[str, np.ndarray]:
    """What the issue-age figure counts, from a fold (:func:`cybmem.explore.frames.issue_fold`).

    Returns:
        ``open``: ``openAge`` in seconds of open (opened / reopened) issues; ``resolved``:
        ``timeToResolve`` in seconds of resolved issues (wontfix left out); ``reopens``: each
        issue's reopen count. Missing durations dropped.
    """
    if not len(fold):
        return {"open": np.zeros(0), "resolved": np.zeros(0), "reopens": np.zeros(0, dtype=np.int64)}
    open_ = fold["state"].isin(["opened", "reopened"])
    resolved = fold["state"].eq("resolved")
    return {
        "open": fold.loc[open_, "openAge"].dt.total_seconds().dropna().to_numpy(dtype=float),
        "resolved": fold.loc[resolved, "timeToResolve"].dt.total_seconds().dropna().to_numpy(dtype=float),
        "reopens": fold["reopenCount"].to_numpy(dtype=np.int64),
    }


@dataclass
class IssueAgeData:
    """What :func:`issue_age_histograms` draws: ages of open issues, times to resolve, reopen counts."""

    issues: int
    open: Histogram
    resolved: Histogram
    reopens: dict[int, int]  # reopen count -> issues, ascending

    @classmethod
    def of(cls, fold: "pd.DataFrame") -> "IssueAgeData":
        """From one fold (:func:`cybmem.explore.frames.issue_fold`); ages as measured when it was folded."""
        v = issue_age_values(fold)
        counts = np.unique(v["reopens"], return_counts=True)
        return cls(len(fold), Histogram.of(v["open"]), Histogram.of(v["resolved"]),
                   {int(a): int(b) for a, b in zip(*counts)})

    def to_dict(self) -> dict:
        return {"issues": self.issues, "open": self.open.to_dict(), "resolved": self.resolved.to_dict(),
                "reopens": {str(k): v for k, v in self.reopens.items()}}


# -- dispatch trees: a run and everything dispatched from it (parentRunId, transitively) --------------

def epoch_days(ts: "pd.Series") -> np.ndarray:
    """tz-aware timestamps -> days since 1970-01-01 (matplotlib's date numbers)."""
    import pandas as pd

    ms = (ts - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(1, "ms")
    return ms.to_numpy(dtype=np.float64) / 86_400_000


def tree_roots(records: "pd.DataFrame") -> "pd.Series":
    """The root of each run's dispatch tree (follow parentRunId up while the parent is in ``records``)."""
    import pandas as pd

    ids = records["runId"].astype(str).tolist()
    known = set(ids)
    parent = {r: (p if isinstance(p, str) and p in known else None) for r, p in zip(ids, records["parentRunId"].tolist())}
    root: dict[str, str] = {}
    for r in ids:
        path, cur = [], r
        while cur not in root and parent.get(cur) and cur not in path and len(path) < 10_000:
            path.append(cur)
            cur = parent[cur]
        top = root.get(cur, cur)
        for x in path + [cur]:
            root[x] = top
    return pd.Series([root[r] for r in ids], index=records.index)


def lineage_lanes(records: "pd.DataFrame") -> "pd.DataFrame":
    """One row per run: its dispatch-tree root and the lane it is drawn in.

    A dispatch tree is a run plus everything dispatched from it (parentRunId, transitively).
    Runs that neither have nor are a parent share lane 0; each tree gets a lane of its own,
    re-used by later trees that start after it ended (interval packing), so hundreds of runs
    stay within a few lanes.

    Returns:
        DataFrame indexed like ``records`` with columns ``treeRoot`` and ``lane``.
    """
    import pandas as pd

    roots = tree_roots(records)
    sizes = roots.value_counts()
    start = epoch_days(records["startedAt"])
    end = epoch_days(records["endedAt"])
    span = pd.DataFrame({"root": roots, "start": start, "end": end})
    trees = span[span["root"].map(sizes) > 1].groupby("root").agg(start=("start", "min"), end=("end", "max"))
    trees = trees.sort_values(["start", "end"])
    gap = max((np.nanmax(end) - np.nanmin(start)) * 0.01, 1e-6) if len(records) else 0.0
    lane_end: list[float] = []
    lane_of: dict[str, int] = {}
    for r, row in trees.iterrows():
        for i, e in enumerate(lane_end):
            if e + gap < row["start"]:
                lane_end[i] = row["end"]
                lane_of[r] = i + 1
                break
        else:
            lane_end.append(row["end"])
            lane_of[r] = len(lane_end)
    lanes = roots.map(lambda x: lane_of.get(x, 0)).astype("int64")
    return pd.DataFrame({"treeRoot": roots.astype("string"), "lane": lanes}, index=records.index)


def dispatch_trees(records: "pd.DataFrame", *, by: str = "largest") -> "pd.DataFrame":
    """The project's dispatch trees (a run and everything it dispatched, at least two runs).

    Args:
        records: a records DataFrame.
        by: ``"largest"`` (most runs first, then the most recent) or ``"recent"`` (latest
            run ended first).

    Returns:
        One row per tree: ``root`` (run id), ``runs``, ``first`` and ``last`` (when its first
        run started and its last ended), ``task`` (the root's task).
    """
    import pandas as pd

    if by not in ("largest", "recent"):
        from ..errors import ValidationError

        raise ValidationError(f"by must be 'largest' or 'recent', not {by!r}")
    roots = tree_roots(records)
    df = pd.DataFrame({"root": roots.astype(str), "start": records["startedAt"], "end": records["endedAt"]})
    trees = df.groupby("root").agg(runs=("root", "size"), first=("start", "min"), last=("end", "max")).reset_index()
    trees = trees[trees["runs"] > 1]
    tasks = dict(zip(records["runId"].astype(str), records["task"]))
    trees["task"] = trees["root"].map(tasks)
    keys = (["runs", "last", "root"], [False, False, True]) if by == "largest" else (["last", "runs", "root"], [False, False, True])
    return trees.sort_values(keys[0], ascending=keys[1], kind="stable").reset_index(drop=True)


def tree_members(records: "pd.DataFrame", run_id: str) -> set[str]:
    """The runs drawn with ``run_id``: its dispatch tree and every run of the chat sessions in it."""
    lanes = lineage_lanes(records)
    root = lanes.loc[records["runId"] == run_id, "treeRoot"]
    members = set(records.loc[lanes["treeRoot"] == root.iloc[0], "runId"]) if len(root) else {run_id}
    chats = set(records.loc[records["runId"].isin(members), "chatSessionId"].dropna())
    if chats:
        members |= set(records.loc[records["chatSessionId"].isin(chats), "runId"])
    return members


def resolve_run(records: "pd.DataFrame", run: str | None) -> str | None:
    """The one run id of ``records`` that starts with ``run`` (None for none asked)."""
    if not run:
        return None
    ids = records["runId"].astype(str)
    hit = ids[ids.str.startswith(run)]
    if len(hit) != 1:
        from ..errors import AmbiguousError, NotFoundError

        if len(hit) == 0:
            raise NotFoundError(f"no run starts with {run!r} in these records")
        raise AmbiguousError(f"run prefix {run!r} matches {len(hit)} runs: {', '.join(hit.str[:8].head(5))}…; give more characters")
    return str(hit.iloc[0])
