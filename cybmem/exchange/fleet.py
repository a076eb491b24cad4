"""The fleet: many machines' exported memory read as one history, on Dask.

Every orchestrator appends its memory to one Hive-partitioned Parquet dataset
(:mod:`cybmem.exchange.export`); a :class:`Fleet` opens it in this process or on a Dask cluster and runs
the single-process rules over it unchanged: the issue fold (:func:`cybmem.explore.frames.issue_fold`),
search with the kernels of :func:`cybmem.retrieval.search.search`, and the figures of :mod:`cybmem.explore.plots`
fed with counts summed over partitions. A (machine, project) is never split.

Rules (in full: USAGE.md, "The fleet", "How it is computed" and "Damaged files, copies and claims"):

- What is global: BM25's statistics (summed over partitions) and the keyword maximum, so a fleet
  search ranks as one store holding every record; lineage stays inside a (machine, project); the
  merge of each partition's top k breaks ties as :func:`cybmem.retrieval.scoring.top_k` does.
- Who speaks for a run id: the (machine, project) that exported it first owns it; the others'
  copies leave search and the counts, and the hit names every claimant (:attr:`FleetHit.claimed_by`).
- A part file that is not what an export writes is skipped and named (:attr:`Fleet.skipped`).
- ``scheduler="auto"`` runs inline up to :data:`INLINE_MAX_BYTES`; :attr:`Fleet.ran_on` says where.

Nothing in the write or inject path imports this module; Dask is imported when a cluster is used.
"""

from __future__ import annotations

import dataclasses
import html
import logging
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import _io
from ..errors import CybmemError, NotFoundError, StoreError, ValidationError
from .export import ISSUES_SCHEMA, RECORDS_SCHEMA
from ..retrieval.search import Hit
from ..retrieval.weights import Weights

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ..explore.frames import IssueAgeData
    from ..store.snapshot import Snapshot

__all__ = [
    "FleetError",
    "Group",
    "scan_dataset",
    "Fleet",
    "FleetHit",
    "FleetSearchResult",
    "FleetReport",
    "Claim",
    "INLINE_MAX_BYTES",
]

#: Default Parquet bytes per partition when packing small (machine, project)s together.
PARTITION_BYTES = 64 << 20
#: ``scheduler="auto"`` runs in this process up to this much Parquet: where a LocalCluster of 2
#: workers starts to win a one-shot ``cybmem fleet search`` on a quiet 2-core machine
#: (``benchmarks/bench_fleet.py --crossover``; benchmarks/RESULTS.md, "One-shot search").
INLINE_MAX_BYTES = 100_000_000
_SEARCH_COLUMNS = ("runId", "task", "state", "endedAt", "parentRunId", "chatSessionId", "previousRunId", "rootRunId",
                   "summary", "issues", "next", "supersededBy", "supersedes")
_LINEAGE_COLUMNS = ("runId", "state", "endedAt", "parentRunId", "chatSessionId", "previousRunId", "supersededBy",
                    "supersedes")
_EVENT_COLUMNS = ("issueId", "at", "event", "byRunId", "title", "detail", "line")
_STATES = ("done", "error", "cancelled")
_LINKS = ("previous", "parent", "chat", "superseded")


class FleetError(CybmemError):
    """The Dask cluster cannot be reached or used."""


# --- the dataset ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """One machine's export of one project: its record and ledger-event Parquet files.

    ``hidden``: run ids this (machine, project) exported that another one owns (it exported them
    first); readers leave them out (module docstring: who speaks for a run id).
    """

    machine: str
    project: str
    records: tuple[str, ...] = ()
    issues: tuple[str, ...] = ()
    size: int = 0  # bytes of Parquet
    hidden: frozenset[str] = field(default=frozenset(), repr=False)

    @property
    def key(self) -> tuple[str, str]:
        return (self.machine, self.project)


def _parts(pdir: Path) -> list[Path]:
    """A partition's part files in month order; temp and hidden files (``.*``, ``_*``) skipped, as readers do."""
    return sorted(p for p in pdir.glob("month=*/*.parquet") if not p.name.startswith((".", "_"))
                  and not p.parent.name.startswith((".", "_")))


# What every file must hold, and of which kind, for its rows to mean anything.
_REQUIRED = {"records": ("runId", "endedAt"), "issues": ("issueId", "at", "event", "line")}
_SCHEMAS = {"records": RECORDS_SCHEMA, "issues": ISSUES_SCHEMA}


def _kind(t: pa.DataType) -> str:
    """The kind of a column type, as far as reading it into the export's schema goes."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "text"
    if pa.types.is_dictionary(t):
        return _kind(t.value_type)
    if pa.types.is_timestamp(t):
        return "time"
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_floating(t):
        return "number"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"list of {_kind(t.value_type)}"
    if pa.types.is_null(t):
        return "null"  # a column that is all nulls: read as nulls of any kind
    return str(t)


def _part_problem(path: Path, table: str) -> str | None:
    """Why a part file cannot be read as the export's ``table`` (its footer only), or None."""
    import pyarrow.parquet as pq

    try:
        with _io.open_regular(path, follow=True) as fh:  # a FIFO here would hang the footer's read
            schema = pq.read_schema(fh)
    except StoreError:
        return "not a regular file (a FIFO, socket, device or directory)"
    except (pa.ArrowException, OSError) as exc:
        why = re.sub(r"^Could not open Parquet input source '[^']*': ", "", " ".join(str(exc).split()))
        return f"not a readable Parquet file ({why[:160]})"
    want = _SCHEMAS[table]
    missing = [c for c in _REQUIRED[table] if c not in schema.names]
    if missing:
        return f"no {missing[0]} column"
    for name in schema.names:
        if name in want.names:
            have, need = _kind(schema.field(name).type), _kind(want.field(name).type)
            if have not in (need, "null"):
                return f"its {name} column holds {have}, not {need}"
    return None


def scan_dataset(dataset: str | os.PathLike, *, skipped: list[str] | None = None) -> list[Group]:
    """The (machine, project)s of an exported Parquet dataset, sorted, with their files.

    A part file that cannot be read as an export's (not Parquet, no runId / issueId column, a
    column of another kind) is left out; ``skipped`` (when given) gets one line naming it.

    Raises:
        NotFoundError: there is no such directory.
        ValidationError: it is not a dataset ``cybmem export parquet`` wrote.
    """
    root = Path(dataset)
    if not root.exists():
        raise NotFoundError(f"no dataset at {root}; write one with `cybmem export parquet --out {root}`")
    if not root.is_dir():
        raise ValidationError(f"{root} is a file; give the dataset directory `cybmem export parquet --out` wrote")
    tables = [t for t in ("records", "issues") if (root / t).is_dir()]
    if not tables:
        raise ValidationError(f"{root} is not a cybmem Parquet dataset (no records/ or issues/ directory in it); "
                              f"write one with `cybmem export parquet --out {root}`")
    found: dict[tuple[str, str], dict[str, list[Path]]] = {}
    for table in tables:
        for mdir in sorted((root / table).glob("machine=*")):
            if not mdir.is_dir():
                continue
            for pdir in sorted(mdir.glob("project=*")):
                files = _parts(pdir) if pdir.is_dir() else []
                good = []
                for f in files:
                    why = _part_problem(f, table)
                    if why is None:
                        good.append(f)
                    elif skipped is not None:
                        skipped.append(f"skipped {f}: {why}")
                files = good
                if files:
                    key = (unquote(mdir.name[len("machine="):]), unquote(pdir.name[len("project="):]))
                    found.setdefault(key, {"records": [], "issues": []})[table] = files
    groups = []
    for (machine, project), files in sorted(found.items()):
        size = sum(p.stat().st_size for t in files.values() for p in t)
        groups.append(Group(machine, project, tuple(map(str, files["records"])), tuple(map(str, files["issues"])), size))
    if not groups:
        raise ValidationError(f"the dataset {root} holds no Parquet files yet; export to it with "
                              f"`cybmem export parquet --out {root}`" + (" (every file in it was skipped)" if skipped else ""))
    return groups


def _select(groups: list[Group], machines: Sequence[str] | None, projects: Sequence[str] | None, where: Path) -> list[Group]:
    for name, wanted in (("machine", machines), ("project", projects)):
        if not wanted:
            continue
        have = sorted({getattr(g, name) for g in groups})
        missing = [w for w in wanted if w not in have]
        if missing:
            raise NotFoundError(f"no {name} {missing[0]!r} in the dataset {where}; it holds {name}s {', '.join(have)}")
        groups = [g for g in groups if getattr(g, name) in wanted]
    if not groups:
        raise NotFoundError(f"no project of machines {', '.join(machines or ())} is named {', '.join(projects or ())} "
                            f"in the dataset {where}")
    return groups


def _pack(groups: list[Group], limit: int) -> list[tuple[Group, ...]]:
    """Consecutive (machine, project)s packed into partitions of about ``limit`` bytes; none split."""
    out: list[list[Group]] = []
    size = 0
    for g in groups:
        if not out or size + g.size > limit:
            out.append([])
            size = 0
        out[-1].append(g)
        size += g.size
    return [tuple(p) for p in out]


# --- reading partitions -------------------------------------------------------------------


def _read(files: Sequence[str], schema: pa.Schema, columns: Sequence[str] | None, *, with_file: bool = False) -> pa.Table:
    """The rows of ``files`` in file order (``with_file``: plus ``__file``, the index of each row's file)."""
    import pyarrow.dataset as ds

    cols = list(columns) if columns is not None else schema.names
    out = pa.schema([schema.field(c) for c in cols] + ([pa.field("__file", pa.int32())] if with_file else []))
    tables = []
    fmt = ds.ParquetFileFormat()
    for i, f in enumerate(files):
        try:
            # Opened by the one rule (a file swapped for a FIFO since the scan cannot hang the read);
            # the export's schema fills the columns an older file lacks.
            with _io.open_regular(f, follow=True) as fh:
                t = fmt.make_fragment(fh).to_table(schema=schema, columns=cols)
        except StoreError:
            raise  # not a regular file: the one rule's message names it
        except (pa.ArrowException, OSError) as exc:
            raise StoreError(f"cannot read {f} ({' '.join(str(exc).split())[:160]}); a damaged file: move it aside") from None
        if with_file:
            t = t.append_column("__file", pa.array(np.full(t.num_rows, i, np.int32)))
        tables.append(t)
    return pa.concat_tables(tables).replace_schema_metadata(None) if tables else out.empty_table()


def _last_per(t: pa.Table, key: str, *, keep_null: bool = False) -> pa.Table:
    """One row per value of ``key``, the last in the table (the last exported), order kept; rows
    without a key are dropped (a run without its id is no run), or kept as they are with ``keep_null``."""
    valid = pc.is_valid(t.column(key)).to_numpy(zero_copy_only=False)
    if not keep_null and not valid.all():
        t, valid = t.filter(pa.array(valid)), np.ones(int(valid.sum()), bool)
    if t.num_rows < 2:
        return t
    rows = np.arange(t.num_rows)
    keyed = pa.table({key: t.column(key).filter(pa.array(valid)), "__i": rows[valid]})
    last = keyed.group_by(key, use_threads=False).aggregate([("__i", "max")]).column("__i_max").to_numpy()
    keep = np.sort(np.concatenate([last, rows[~valid]]))
    return t if len(keep) == t.num_rows else t.take(pa.array(keep))


def _group_records(g: Group, columns: Sequence[str] | None = None, *, with_file: bool = False) -> pa.Table:
    """A (machine, project)'s records in snapshot order (oldest first by endedAt, then runId): one
    row per run id (its last export), none of the ids it does not own (``g.hidden``)."""
    keys = ("endedAt", "runId")
    cols = None if columns is None else list(columns) + [c for c in keys if c not in columns]
    t = _last_per(_read(g.records, RECORDS_SCHEMA, cols, with_file=with_file), "runId")
    if g.hidden and t.num_rows:
        t = t.filter(pc.invert(pc.is_in(t.column("runId"), value_set=pa.array(sorted(g.hidden), pa.string()))))
    if t.num_rows > 1:
        t = t.take(pc.sort_indices(t, sort_keys=[(c, "ascending") for c in keys]))
    return t if columns is None else t.select(list(columns) + (["__file"] if with_file else []))


def _group_events(g: Group, columns: Sequence[str] | None = None) -> pa.Table:
    """A (machine, project)'s ledger events in ledger order (``line``), a line exported twice once,
    none by a run it does not own (``g.hidden``: those are the owner's to tell)."""
    cols = None if columns is None else list(columns) + [c for c in ("line", "byRunId") if c not in columns]
    t = _last_per(_read(g.issues, ISSUES_SCHEMA, cols), "line", keep_null=True)
    if g.hidden and t.num_rows:
        by = t.column("byRunId")
        t = t.filter(pc.or_kleene(pc.is_null(by), pc.invert(pc.is_in(by, value_set=pa.array(sorted(g.hidden), pa.string())))))
    if t.num_rows > 1:
        t = t.take(pc.sort_indices(t, sort_keys=[("line", "ascending")]))
    return t if columns is None else t.select(list(columns))


def _with_partition(t: pa.Table, g: Group, time_column: str) -> pa.Table:
    n = t.num_rows
    t = t.append_column("machine", pa.array([g.machine] * n, pa.string()))
    t = t.append_column("project", pa.array([g.project] * n, pa.string()))
    if time_column in t.column_names:
        t = t.append_column("month", pc.strftime(t.column(time_column), format="%Y-%m"))
    return t


def _to_pandas(t: pa.Table) -> "pd.DataFrame":
    from ..explore.frames import types_mapper

    return t.to_pandas(types_mapper=types_mapper)


def _records_part(groups: tuple[Group, ...], columns: tuple[str, ...] | None = None) -> "pd.DataFrame":
    """One partition of :meth:`Fleet.records`: the groups' records with machine, project, month."""
    schema = RECORDS_SCHEMA if columns is None else pa.schema([RECORDS_SCHEMA.field(c) for c in columns])
    parts = [_with_partition(_group_records(g, columns), g, "endedAt") for g in groups]
    if not parts:
        parts = [_with_partition(schema.empty_table(), Group("", ""), "endedAt")]
    return _to_pandas(pa.concat_tables(parts).replace_schema_metadata(None))


def _events_part(groups: tuple[Group, ...]) -> "pd.DataFrame":
    """One partition of :meth:`Fleet.events`: the groups' ledger events, in ledger order."""
    parts = [_with_partition(_group_events(g), g, "at") for g in groups]
    if not parts:
        parts = [_with_partition(ISSUES_SCHEMA.empty_table(), Group("", ""), "at")]
    return _to_pandas(pa.concat_tables(parts).replace_schema_metadata(None))


def _by_group(df: "pd.DataFrame"):
    """(machine, project, rows) of a partition, in the order they appear (each group's rows are contiguous)."""
    if not len(df):
        return
    m = df["machine"].to_numpy(dtype=object)
    p = df["project"].to_numpy(dtype=object)
    starts = np.flatnonzero(np.r_[True, (m[1:] != m[:-1]) | (p[1:] != p[:-1])])
    ends = np.r_[starts[1:], len(df)]
    for s, e in zip(starts.tolist(), ends.tolist()):
        yield str(m[s]), str(p[s]), df.iloc[s:e]


# --- who speaks for a run id, per partition ------------------------------------------------------

_CLAIM_COLUMNS = ("runId", "cwd", "workflowName", "task", "state", "startedAt", "endedAt", "summary", "verdictSummary")
_EXPORTED = re.compile(r"part-(\d{8}T\d{6,12}Z)")


def _exported_at(path: str) -> str:
    """When a part file was exported, sortable: the time in its name (``part-<UTC time>-...``), else its mtime."""
    m = _EXPORTED.search(Path(path).name)
    if m:
        return m.group(1)
    try:
        ns = os.stat(path).st_mtime_ns
    except OSError:
        return "~"  # unknown: after every known time
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(ns // 10**9)) + f"{ns % 10**9 // 1000:06d}Z"


def _hash_ids(ids) -> np.ndarray:
    """uint64 hashes of run ids, the same in every process (pandas' keyed hash, not Python's salted one)."""
    import pandas as pd

    ids = np.asarray(ids, dtype=object)
    return pd.util.hash_array(ids) if len(ids) else np.zeros(0, np.uint64)


def _id_hashes_part(groups: tuple[Group, ...]) -> list[np.ndarray]:
    """Ownership, pass 1: the hashes of each group's run ids (every id it exported, owned or not)."""
    return [_hash_ids(_group_records(dataclasses.replace(g, hidden=frozenset()), ["runId"]).column("runId").to_pylist())
            for g in groups]


def _claims_part(groups: tuple[Group, ...], wanted: np.ndarray) -> list[tuple[str, str, str, str, str]]:
    """Ownership, pass 2: (runId, machine, project, exported, digest of the record) of the groups'
    run ids whose hash is in ``wanted`` (ids some other group exported too)."""
    import hashlib

    out = []
    for g in groups:
        t = _group_records(dataclasses.replace(g, hidden=frozenset()), _CLAIM_COLUMNS, with_file=True)
        hit = np.isin(_hash_ids(t.column("runId").to_pylist()), wanted)
        if not hit.any():
            continue
        for row in t.filter(pa.array(hit)).to_pylist():
            digest = hashlib.sha256(repr([row[c] for c in _CLAIM_COLUMNS]).encode()).hexdigest()[:16]
            out.append((row["runId"], g.machine, g.project, _exported_at(g.records[row["__file"]]), digest))
    return out


@dataclass(frozen=True)
class Claim:
    """A run id that more than one (machine, project) exported: ``owner`` exported it first and
    speaks for it; ``differ``: the claimants' records of it are not the same."""

    run_id: str
    owner: tuple[str, str]
    others: tuple[tuple[str, str], ...]
    differ: bool

    @property
    def claimants(self) -> list[str]:
        """Every claimant as ``machine/project``, the owner first."""
        return [f"{m}/{p}" for m, p in (self.owner, *self.others)]


def _resolve_claims(rows: list[tuple[str, str, str, str, str]]) -> dict[str, Claim]:
    """Each run id claimed by more than one (machine, project): its owner is the first to export it
    (then machine and project by name)."""
    by: dict[str, list[tuple[str, str, str, str]]] = {}
    for rid, machine, project, exported, digest in rows:
        by.setdefault(rid, []).append((exported, machine, project, digest))
    out = {}
    for rid, found in sorted(by.items()):
        if len(found) < 2:
            continue  # two ids that share a hash: each has one claimant
        found.sort()
        out[rid] = Claim(rid, found[0][1:3], tuple(f[1:3] for f in found[1:]), len({f[3] for f in found}) > 1)
    return out


# --- the fold, per partition ------------------------------------------------------------------


def _fold_part(events: "pd.DataFrame", now: "pd.Timestamp") -> "pd.DataFrame":
    """The issue fold of each (machine, project) of a partition: :func:`cybmem.explore.frames.issue_fold`."""
    import pandas as pd

    from ..explore.frames import issue_fold

    out = []
    for machine, project, rows in _by_group(events):
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


def _issue_summary_part(fold: "pd.DataFrame") -> "pd.DataFrame":
    """Per (machine, project): issues by state, reopens, median age of the open ones (days)."""
    import pandas as pd

    from ..explore.frames import issue_age_values

    rows = []
    for machine, project, f in _by_group(fold):
        states = f["state"].value_counts()
        ages = issue_age_values(f)["open"] / 86400
        rows.append({"machine": machine, "project": project, "issues": len(f),
                     **{s: int(states.get(s, 0)) for s in ("opened", "reopened", "resolved", "wontfix")},
                     "reopens": int(f["reopenCount"].sum()),
                     "medianOpenDays": float(np.median(ages)) if len(ages) else float("nan")})
    cols = ["machine", "project", "issues", "opened", "reopened", "resolved", "wontfix", "reopens", "medianOpenDays"]
    return pd.DataFrame(rows, columns=cols).astype({c: "int64" for c in cols[2:-1]} | {"medianOpenDays": "float64"})


def _age_range_part(fold: "pd.DataFrame") -> dict:
    """Pass 1 of the fleet's age histograms: per panel, how many durations, the longest, how many under a minute."""
    from ..explore.frames import AGE_PANELS, SHORTEST_AGE_S, issue_age_values

    v = issue_age_values(fold)
    out: dict[str, Any] = {p: (len(v[p]), float(v[p].max()) if len(v[p]) else -math.inf, int((v[p] < SHORTEST_AGE_S).sum()))
                           for p in AGE_PANELS}
    uniq, counts = np.unique(v["reopens"], return_counts=True)
    out["reopens"] = dict(zip(uniq.tolist(), counts.tolist()))
    out["issues"] = len(fold)
    return out


def _age_counts_part(fold: "pd.DataFrame", edges: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Pass 2: each panel's counts over the fleet-wide edges (:func:`cybmem.explore.frames.age_counts`)."""
    from ..explore.frames import age_counts, issue_age_values

    v = issue_age_values(fold)
    return {p: age_counts(v[p], e) for p, e in edges.items()}


def _age_middle_part(fold: "pd.DataFrame", bins: dict[str, tuple[float, float, bool]]) -> dict[str, np.ndarray]:
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


def _lineage_part(records: "pd.DataFrame") -> "pd.DataFrame":
    """Per (machine, project): runs by state, lineage links by kind (:func:`cybmem.explore.frames.lineage_edges`), span."""
    import pandas as pd

    from ..explore.frames import lineage_edges

    rows = []
    for machine, project, r in _by_group(records):
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


# --- search, per partition ----------------------------------------------------------------


class _Shard:
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
    def build(cls, dataset: str, groups: tuple[Group, ...]) -> "_Shard":
        from ..store.keyword_index import KeywordIndex
        from ..store.arrow_records import keyword_text_array
        from ..store.issue_tables import issue_texts
        from ..store.tokens import tokenize_arrow

        parts = []
        for g in groups:
            records = _group_records(g, _SEARCH_COLUMNS)
            events = _group_events(g, _EVENT_COLUMNS)
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
    _sizeof.register(_Shard)(lambda shard: shard.nbytes)


def _shard_stats(shard: _Shard, tokens: list[str], as_of: int | None) -> tuple[Any, int, tuple | None]:
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


def _shard_keyword_max(shard: _Shard, tokens: list[str], stats, as_of: int | None) -> float:
    """Phase 2: the shard's max raw keyword score over its candidates, under the fleet's statistics."""
    from ..retrieval.scoring import keyword_max

    return max((keyword_max(snap.index.scores(tokens, stats=stats), snap.candidates(as_of))
                for _m, _p, snap in shard.snapshots() if snap.n), default=0.0)


def _shard_top(shard: _Shard, tokens: list[str], stats, kw_max: float, context, now: int, weights: Weights,
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


@dataclass
class FleetReport:
    """What :meth:`Fleet.report` wrote."""

    out: str
    files: list[str]
    machines: int
    projects: int  # distinct project names (one project exported by two machines is one)
    runs: int  # distinct run ids (a run id claimed by two machines counts once)
    issues: int
    seconds: float = 0.0
    claimed: int = 0  # run ids exported by more than one (machine, project)
    scheduler: str = ""

    def to_dict(self) -> dict:
        return {"out": self.out, "files": self.files, "machines": self.machines, "projects": self.projects,
                "runs": self.runs, "issues": self.issues, "claimed": self.claimed, "seconds": round(self.seconds, 3),
                "scheduler": self.scheduler}


# --- the fleet ------------------------------------------------------------------------------


def _now_ts(now: "pd.Timestamp | int | None") -> "pd.Timestamp":
    import pandas as pd

    if now is None:
        return pd.Timestamp.now(tz="UTC")
    if isinstance(now, (int, np.integer)):
        return pd.Timestamp(int(now), unit="ms", tz="UTC")
    ts = pd.Timestamp(now)
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


class Fleet:
    """An exported Parquet dataset of many machines, opened on a Dask cluster.

    Use it as a context manager: it starts (or connects to) the cluster and closes what it
    started. Results are pandas objects computed on the cluster.

    Args:
        dataset: the directory ``cybmem export parquet --out`` writes.
        scheduler: ``"auto"``: in this process up to :data:`INLINE_MAX_BYTES` of Parquet, else
            a LocalCluster; ``"inline"`` uses no Dask at all (every partition function runs here,
            one after another); ``"local"`` or None starts a ``LocalCluster`` of ``workers``
            processes; else a Dask scheduler's address (``tcp://host:8786``). :attr:`ran_on`
            says which one runs.
        machines, projects: only these (default: all).
        workers, threads_per_worker, processes: the LocalCluster's shape (processes=False:
            threads in this process, quick to start, for small data and tests).
        partition_bytes: pack (machine, project)s into partitions of about this much Parquet.
        progress: draw a progress bar on stderr (default: when stderr is a terminal).
        timeout: seconds to wait for a scheduler's answer.

    Attributes:
        skipped: one line per part file left out (not Parquet, no runId / issueId, a column of
            another kind).
        ran_on: where the partition functions run, in words (``where``: as a value).
        claims: the run ids more than one (machine, project) exported, with their owners.

    Example:
        >>> with Fleet("fleet") as fleet:  # doctest: +SKIP
        ...     fleet.search("flaky login test", k=5).hits
    """

    def __init__(self, dataset: str | os.PathLike, *, scheduler: str | None = "auto",
                 machines: Sequence[str] | None = None, projects: Sequence[str] | None = None,
                 workers: int = 2, threads_per_worker: int = 1, processes: bool = True,
                 partition_bytes: int = PARTITION_BYTES, progress: bool | None = None, timeout: float = 10.0):
        self.dataset = Path(dataset)
        self.skipped: list[str] = []
        self.groups = _select(scan_dataset(self.dataset, skipped=self.skipped), machines, projects, self.dataset)
        self._partitions = _pack(self.groups, partition_bytes)
        self._claims: dict[str, Claim] | None = None
        size = sum(g.size for g in self.groups)
        if scheduler == "auto":
            small = size <= INLINE_MAX_BYTES
            scheduler = "inline" if small else None
            self.ran_on = (f"in this process (under {_mb(INLINE_MAX_BYTES)} of Parquet, a LocalCluster costs more than it saves)"
                           if small else f"on a LocalCluster of {workers} workers (over {_mb(INLINE_MAX_BYTES)} of Parquet)")
        elif scheduler in ("inline", "local", None):
            scheduler = None if scheduler == "local" else scheduler
            self.ran_on = "in this process" if scheduler == "inline" else f"on a LocalCluster of {workers} workers"
        else:
            self.ran_on = f"on the Dask scheduler at {scheduler}"
        self.scheduler = scheduler
        if progress is None:
            import sys

            progress = bool(getattr(sys.stderr, "isatty", lambda: False)())
        self.progress = progress
        self.client = None
        self._cluster = None
        self._shards: list | None = None
        self._closed = False
        if scheduler == "inline":
            return
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise FleetError("the fleet needs Dask: pip install 'cybmem[fleet]'") from None
        if scheduler is None:
            self._cluster = LocalCluster(n_workers=workers, threads_per_worker=threads_per_worker, processes=processes,
                                         dashboard_address=":0", silence_logs=logging.ERROR)
            self.client = Client(self._cluster, set_as_default=False)
        else:
            _probe(scheduler, timeout)
            error = None
            try:
                self.client = Client(scheduler, timeout=timeout, set_as_default=False)
            except (OSError, TimeoutError) as exc:
                error = (f"cannot reach the Dask scheduler at {scheduler} within {timeout:g} s ({exc}); "
                         "is `dask scheduler` running there?")
            except Exception as exc:  # something answered, but not as a scheduler (garbage in the handshake)
                error = (f"{scheduler} answered, but not as a Dask scheduler ({type(exc).__name__}); "
                         "give the address `dask scheduler` prints (tcp://host:8786)")
            if error is not None:
                _collect_quietly()  # the half-started client complains as it is collected
                raise FleetError(error)

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Release the cluster's data; close the client and the LocalCluster this fleet started."""
        if self._closed:
            return
        self._closed = True
        self._shards = None
        if self.client is not None:
            self.client.close()
        if self._cluster is not None:
            self._cluster.close()

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def partitions(self) -> list[tuple[Group, ...]]:
        """The packed (machine, project)s, each knowing the run ids it does not own (:attr:`claims`)."""
        self.claims  # noqa: B018 - resolved once, before any reader sees a partition
        return self._partitions

    @property
    def where(self) -> str:
        """Where the partition functions run: ``"inline"``, ``"local"`` (a LocalCluster) or the scheduler's address."""
        return "inline" if self.client is None else (self.scheduler or "local")

    def __repr__(self) -> str:
        return (f"Fleet({str(self.dataset)!r}, {len(self.machines)} machines, {len(self.groups)} projects, "
                f"{len(self._partitions)} partitions, {self.where})")

    @property
    def machines(self) -> list[str]:
        return sorted({g.machine for g in self.groups})

    @property
    def inline(self) -> bool:
        return self.client is None

    def compute(self, *collections: Any) -> Any:
        """Compute Dask collections (e.g. from :meth:`records`) on this fleet's cluster; one result or a tuple.

        Example:
            >>> fleet.compute(fleet.records().groupby("machine")["runId"].count())  # doctest: +SKIP
        """
        if self.inline:
            import dask

            out = dask.compute(*collections, scheduler="sync")
        else:
            out = tuple(self.client.gather(self.client.compute(list(collections))))
        return out[0] if len(out) == 1 else out

    # -- running ---------------------------------------------------------------------------
    def _wait(self, futures: list, label: str) -> None:
        from distributed import as_completed

        from ..progress import Progress

        with self.client.as_current(), Progress(len(futures), label, enabled=self.progress) as bar:
            for _ in as_completed(futures):
                bar.update()

    def _frame(self, reader: Callable, fn: Callable | None, label: str, *args: Any) -> "pd.DataFrame":
        """Read the partitions, apply ``fn`` to each (``map_partitions``), and gather one pandas frame."""
        import pandas as pd

        if self.inline:
            frames = []
            for part in self.partitions:
                df = reader(part)
                frames.append(fn(df, *args) if fn is not None else df)
            return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        ddf = self._dask_frame(reader)
        if fn is not None:
            ddf = ddf.map_partitions(fn, *args, meta=fn(reader(()), *args))
        from distributed import futures_of

        done = self.client.persist(ddf)
        self._wait(futures_of(done), label)
        return self.client.compute(done).result().reset_index(drop=True)

    def _dask_frame(self, reader: Callable):
        import dask.dataframe as dd

        return dd.from_map(reader, self.partitions, meta=reader(()), enforce_metadata=False,
                           label=getattr(reader, "__name__", "cybmem").strip("_"))

    def _each(self, fn: Callable, parts: list, *args: Any) -> list:
        """``fn(partition, *args)`` over some partitions, here or on the cluster."""
        if self.inline:
            return [fn(p, *args) for p in parts]
        return self.client.gather([self.client.submit(fn, p, *args, pure=False) for p in parts])

    # -- who speaks for a run id -------------------------------------------------------------
    @property
    def claims(self) -> dict[str, Claim]:
        """The run ids more than one (machine, project) exported, each with its owner (module docstring).

        Found once, in two passes: the hashes of every group's run ids, then the records of the
        few ids whose hash is in more than one group. Afterwards each group's ``hidden`` holds the
        ids it does not own, which every reader of records leaves out.
        """
        if self._claims is None:
            hashes = self._each(_id_hashes_part, self._partitions)
            flat = [h for part in hashes for h in part]
            every = np.concatenate(flat) if flat else np.zeros(0, np.uint64)
            uniq, counts = np.unique(every, return_counts=True)
            wanted = uniq[counts > 1]
            claims: dict[str, Claim] = {}
            if len(wanted):
                parts = [p for p, hs in zip(self._partitions, hashes) if any(np.isin(h, wanted).any() for h in hs)]
                claims = _resolve_claims([r for rows in self._each(_claims_part, parts, wanted) for r in rows])
            hidden: dict[tuple[str, str], set[str]] = {}
            for c in claims.values():
                for key in c.others:
                    hidden.setdefault(key, set()).add(c.run_id)
            if hidden:
                def own(g: Group) -> Group:
                    return dataclasses.replace(g, hidden=frozenset(hidden.get(g.key, ())))

                self.groups = [own(g) for g in self.groups]
                self._partitions = [tuple(own(g) for g in part) for part in self._partitions]
            self._claims = claims
        return self._claims

    def _map(self, fn: Callable, label: str | None, *args: Any) -> list:
        """``fn(shard, *args)`` over every shard (built and kept on the cluster on first use)."""
        shards = self._shard_handles()
        if self.inline:
            return [fn(s, *args) for s in shards]
        futures = [self.client.submit(fn, s, *args, pure=False) for s in shards]
        if label:
            self._wait(futures, label)
        return self.client.gather(futures)

    def _shard_handles(self) -> list:
        if self._shards is None:
            dataset = str(self.dataset)
            if self.inline:
                self._shards = [_Shard.build(dataset, part) for part in self.partitions]
            else:
                self._shards = [self.client.submit(_Shard.build, dataset, part, pure=False) for part in self.partitions]
                self._wait(self._shards, "fleet index")
        return self._shards

    # -- frames ------------------------------------------------------------------------------
    def records(self, columns: Sequence[str] | None = None):
        """The records of the fleet as a ``dask.dataframe`` (a pandas frame when inline).

        Columns: the dataset's (:data:`cybmem.exchange.export.RECORDS_SCHEMA`, or ``columns``) plus
        ``machine``, ``project`` and ``month``; one partition per packed set of (machine, project)s,
        rows oldest first within each; each run id once, in the (machine, project) that owns it.
        """
        reader = _Reader(_records_part, tuple(columns) if columns else None)
        if self.inline:
            import pandas as pd

            return pd.concat([reader(p) for p in self.partitions], ignore_index=True)
        return self._dask_frame(reader)

    def events(self):
        """The ledger events of the fleet as a ``dask.dataframe`` (pandas when inline), in ledger order."""
        if self.inline:
            import pandas as pd

            return pd.concat([_events_part(p) for p in self.partitions], ignore_index=True)
        return self._dask_frame(_events_part)

    # -- issues ------------------------------------------------------------------------------
    def issues(self, *, now: "pd.Timestamp | int | None" = None) -> "pd.DataFrame":
        """The issue fold of every (machine, project): :func:`cybmem.explore.frames.issue_fold`, with machine and project.

        Args:
            now: the moment open issues' ages are measured to (default: now), one for the fleet.

        Returns:
            One row per issue, ordered by machine, project and first appearance in the ledger.
        """
        return self._frame(_events_part, _fold_part, "fleet issues", _now_ts(now))

    def open_issues(self, *, now: "pd.Timestamp | int | None" = None) -> "pd.DataFrame":
        """The fleet's open (opened or reopened) issues, oldest opened first (then machine, project,
        id), with ``ageDays``: their open age in days at ``now``."""
        fold = self.issues(now=now)
        opened = fold[fold["state"].isin(["opened", "reopened"])].sort_values(
            ["openedAt", "machine", "project", "issueId"], kind="stable")
        return opened.assign(ageDays=opened["openAge"].dt.total_seconds() / 86400)

    def issue_summary(self, *, now: "pd.Timestamp | int | None" = None) -> "pd.DataFrame":
        """Per machine and project: issues by state, reopens and the median age of the open ones (days)."""
        return self._frame(_events_part, _FoldThen(_issue_summary_part), "fleet issues", _now_ts(now))

    def issue_age_data(self, *, now: "pd.Timestamp | int | None" = None) -> "IssueAgeData":
        """The fleet's issue-age histograms (:class:`cybmem.explore.frames.IssueAgeData`), counted per partition.

        Equal to ``IssueAgeData.of(fleet.issues(now=now))`` without gathering the fold: the
        ranges, then the counts over the fleet-wide bin edges, then the values of the bin that
        holds each median are summed over the partitions.
        """
        from ..explore.frames import AGE_PANELS, Histogram, IssueAgeData, age_edges

        now = _now_ts(now)
        folds = self._fold_handles(now)
        ranges = self._on_folds(folds, _age_range_part)
        n = {p: sum(r[p][0] for r in ranges) for p in AGE_PANELS}
        edges = {p: age_edges(n[p], max(r[p][1] for r in ranges)) for p in AGE_PANELS if n[p]}
        counts = {p: sum(c[p] for c in self._on_folds(folds, _age_counts_part, edges)) for p in edges}
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
        values = self._on_folds(folds, _age_middle_part, middle) if middle else []
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

    def _fold_handles(self, now: "pd.Timestamp") -> list:
        """The fold of each partition, kept (on the cluster) for the passes over it."""
        if self.inline:
            return [_fold_part(_events_part(p), now) for p in self.partitions]
        from distributed import futures_of

        ddf = self._dask_frame(_events_part)
        folded = self.client.persist(ddf.map_partitions(_fold_part, now, meta=_fold_part(_events_part(()), now)))
        futures = futures_of(folded)
        self._wait(futures, "fleet issues")
        return futures

    def _on_folds(self, folds: list, fn: Callable, *args: Any) -> list:
        if self.inline:
            return [fn(f, *args) for f in folds]
        return self.client.gather([self.client.submit(fn, f, *args, pure=False) for f in folds])

    # -- lineage -----------------------------------------------------------------------------
    def lineage_summary(self) -> "pd.DataFrame":
        """Per machine and project: runs by state, lineage links by kind, chat sessions, first and last run.

        Links are :func:`cybmem.explore.frames.lineage_edges` (previous, parent, chat, superseded) within
        each (machine, project); runs are those it owns (a run id claimed by two counts once).
        """
        return self._frame(_Reader(_records_part, _LINEAGE_COLUMNS), _lineage_part, "fleet lineage")

    # -- search ------------------------------------------------------------------------------
    def search(self, query: str, *, k: int = 10, weights: Weights | None = None, as_of: int | None = None,
               now_ms: int | None = None, parent_run_id: str | None = None,
               chat_session_id: str | None = None) -> FleetSearchResult:
        """Score every record of the fleet against ``query`` and return the top ``k``.

        The ranking equals :func:`cybmem.retrieval.search.search` over one store holding the fleet's
        records (module docstring: what is global). The first search builds each partition's
        keyword index and keeps it on the cluster; later searches reuse it.

        Args:
            query: free text.
            k: how many hits.
            weights: axis weights (default: :class:`Weights` defaults).
            as_of: only records that existed then count, and recency is measured from then.
            now_ms: the moment recency is measured from when ``as_of`` is not given.
            parent_run_id / chat_session_id: lineage of a run being dispatched.

        Returns:
            A :class:`FleetSearchResult`.
        """
        from ..retrieval.scoring import LineageContext
        from ..store.tokens import tokenize

        started = time.perf_counter()
        weights = weights or Weights()
        tokens = tokenize(query)
        now = as_of if as_of is not None else (now_ms if now_ms is not None else int(time.time() * 1000))
        phase1 = self._map(_shard_stats, None, tokens, as_of)
        stats = sum(s for s, _, _ in phase1)
        candidates = sum(c for _, c, _ in phase1)
        newest = max((x for _, _, x in phase1 if x is not None), default=None)
        hits: list[FleetHit] = []
        if k > 0 and candidates:
            kw_max = max(self._map(_shard_keyword_max, None, tokens, stats, as_of)) if weights.w_kw else 0.0
            context = LineageContext(parent_run_id=parent_run_id, chat_session_id=chat_session_id,
                                     previous_run_id=newest[1] if newest else None, root_run_id=None)
            found = [h for part in self._map(_shard_top, None, tokens, stats, kw_max, context, now, weights, k, as_of)
                     for h in part]
            # ties: the newer record first (endedAt, then runId), as top_k breaks them in a store ordered oldest first
            found.sort(key=lambda h: (np.float32(h["total"]), h["ended"], h["runId"], h["machine"], h["project"]),
                       reverse=True)
            for rank, h in enumerate(found[:k], 1):
                claim = self.claims.get(h["runId"])
                hits.append(FleetHit(rank=rank, run_id=h["runId"], score=float(h["total"]),
                                     contributions=h["contributions"], values=h["values"], ended_at_ms=h["ended"],
                                     state=h["state"], task=h["task"], summary=h["summary"], issues=h["issues"],
                                     next=h["next"], machine=h["machine"], project=h["project"],
                                     claimed_by=claim.claimants if claim else [], conflict=bool(claim and claim.differ)))
        return FleetSearchResult(query=query, hits=hits, weights=weights, now_ms=now, as_of=as_of,
                                 records=stats.n_docs if stats else 0, candidates=candidates,
                                 partitions=len(self.partitions), seconds=time.perf_counter() - started,
                                 scheduler=self.where)

    # -- report ------------------------------------------------------------------------------
    def report(self, out: str | os.PathLike, *, now: "pd.Timestamp | int | None" = None) -> FleetReport:
        """Write the fleet's figures and tables into ``out`` (created).

        Files: ``issue-ages.png`` (:func:`cybmem.explore.plots.issue_age_histograms` over the whole
        fleet), ``lineage-summary.png`` (:func:`cybmem.explore.plots.lineage_summary`, one row per machine
        and project), ``lineage-summary.csv``, ``issue-summary.csv`` and ``index.html`` showing them.
        """
        from .. import _io
        from ..explore import plots

        started = time.perf_counter()
        now = _now_ts(now)
        out = Path(out)
        if out.exists() and not out.is_dir():
            raise ValidationError(f"{out} is a file; give a directory to write the report into")
        out.mkdir(parents=True, exist_ok=True)
        lineage = self.lineage_summary()
        ages = self.issue_age_data(now=now)
        summary = self.issue_summary(now=now)
        runs = int(lineage["runs"].sum())
        files = []

        def save(name: str, data: bytes) -> None:
            _io.atomic_write(out / name, data)
            files.append(str(out / name))

        def png(fig) -> bytes:
            import io

            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=110)
            return buf.getvalue()

        machines, projects = len(self.machines), len({g.project for g in self.groups})  # a project on two machines is one
        save("issue-ages.png", png(plots.issue_age_histograms(
            ages, title=f"Issue ages across {machines} machine{'s' if machines != 1 else ''} "
                        f"({ages.issues:,} issues, measured at {now:%Y-%m-%d %H:%M} UTC)")))
        save("lineage-summary.png", png(plots.lineage_summary(lineage)))
        save("lineage-summary.csv", lineage.to_csv(index=False).encode())
        save("issue-summary.csv", summary.to_csv(index=False).encode())
        page = _report_html(self, lineage, summary, ages, now, machines, projects)
        save("index.html", page.encode())
        return FleetReport(out=str(out), files=files, machines=machines, projects=projects, runs=runs,
                           issues=int(ages.issues), seconds=time.perf_counter() - started, claimed=len(self.claims),
                           scheduler=self.where)


def _collect_quietly() -> None:
    import gc
    import sys

    hook = sys.unraisablehook
    sys.unraisablehook = lambda _unraisable: None
    try:
        gc.collect()
    finally:
        sys.unraisablehook = hook


def _probe(address: str, timeout: float) -> None:
    """Fail fast, naming the address, when nothing listens there (Dask would retry until the timeout)."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(address if "://" in address else f"tcp://{address}")
    if url.scheme not in ("tcp", "tls") or not url.hostname:
        return  # inproc://, ucx://...: leave it to Dask
    try:
        with socket.create_connection((url.hostname, url.port or 8786), timeout=timeout):
            pass
    except OSError as exc:
        why = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc)).lower()
        raise FleetError(f"cannot reach the Dask scheduler at {address} within {timeout:g} s ({why}); "
                         "is `dask scheduler` running there?") from None


class _Reader:
    """A partition reader with fixed columns (a picklable partial with a name for Dask's task keys)."""

    def __init__(self, fn: Callable, columns: tuple[str, ...] | None):
        self.fn, self.columns = fn, columns
        self.__name__ = fn.__name__

    def __call__(self, groups: tuple[Group, ...]) -> "pd.DataFrame":
        return self.fn(groups, self.columns)


class _FoldThen:
    """Fold a partition's events, then apply ``fn`` to the fold."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.__name__ = fn.__name__

    def __call__(self, events: "pd.DataFrame", now: "pd.Timestamp") -> "pd.DataFrame":
        return self.fn(_fold_part(events, now))


def _mb(size: int) -> str:
    return f"{size / 1e6:,.0f} MB"


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'s' * (n != 1)}"


def _report_html(fleet: Fleet, lineage: "pd.DataFrame", summary: "pd.DataFrame", ages: "IssueAgeData",
                 now: "pd.Timestamp", machines: int, projects: int) -> str:
    def table(df: "pd.DataFrame") -> str:
        return df.to_html(index=False, border=0, na_rep="-", float_format=lambda v: f"{v:.1f}")

    shown = lineage.assign(firstEnded=lineage["firstEnded"].dt.strftime("%Y-%m-%d"),
                           lastEnded=lineage["lastEnded"].dt.strftime("%Y-%m-%d"))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>cybmem fleet report: {html.escape(str(fleet.dataset))}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:80em}} table{{border-collapse:collapse;font-size:90%}}
td,th{{padding:2px 8px;text-align:right}} td:first-child,td:nth-child(2){{text-align:left}} img{{max-width:100%}}</style>
</head><body>
<h1>Fleet report</h1>
<p>Dataset <code>{html.escape(str(fleet.dataset))}</code>: {_plural(int(lineage['runs'].sum()), 'run')} and
{_plural(ages.issues, 'issue')} of {_plural(projects, 'project')} on {_plural(machines, 'machine')}; issue ages measured at
{now:%Y-%m-%d %H:%M} UTC.{_claims_html(fleet)}{_skipped_html(fleet)}</p>
<h2>Issue ages</h2>
<img src="issue-ages.png" alt="Issue-age histograms">
{table(summary)}
<h2>Lineage</h2>
<img src="lineage-summary.png" alt="Runs by state and lineage links per machine and project">
{table(shown)}
</body></html>
"""


def _claims_html(fleet: Fleet) -> str:
    claims = fleet.claims
    if not claims:
        return ""
    differ = sum(c.differ for c in claims.values())
    return (f" {_plural(len(claims), 'run id')} exported by more than one machine or project count once, for the "
            f"first that exported them ({differ} of them with other records elsewhere).")


def _skipped_html(fleet: Fleet) -> str:
    if not fleet.skipped:
        return ""
    return " Left out: " + "; ".join(html.escape(line) for line in fleet.skipped) + "."
