"""The fleet's reading of an exported Parquet dataset: its (machine, project)s and their rows.

:func:`scan_dataset` finds each machine's export of each project (a :class:`Group`), leaving out a
part file that is not what an export writes; groups are packed into partitions of about a size,
none split; a group's records and events are read once per run id (its last export) and ledger
line, without the run ids another group owns (:mod:`cybmem.exchange.fleet_claims`). The
``*_part`` readers give one partition as a pandas frame with ``machine``, ``project``, ``month``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import _io
from ..errors import NotFoundError, StoreError, ValidationError
from .parquet_dataset import ISSUES_SCHEMA, NOT_REGULAR, RECORDS_SCHEMA, part_files, read_part

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "Group",
    "scan_dataset",
    "select_groups",
    "pack_groups",
    "group_records",
    "group_events",
    "records_part",
    "events_part",
    "by_group",
]


@dataclass(frozen=True)
class Group:
    """One machine's export of one project: its record and ledger-event Parquet files.

    ``hidden``: run ids this (machine, project) exported that another one owns (it exported them
    first); readers leave them out (:mod:`cybmem.exchange.fleet_claims`: who speaks for a run id).
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
        return NOT_REGULAR
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
                files = part_files(pdir, skipped)
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


def select_groups(groups: list[Group], machines: Sequence[str] | None, projects: Sequence[str] | None,
                  where: Path) -> list[Group]:
    """The groups of ``machines`` and ``projects`` (None: all); a name the dataset lacks is an error naming those it has."""
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


def pack_groups(groups: list[Group], limit: int) -> list[tuple[Group, ...]]:
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
    cols = list(columns) if columns is not None else schema.names
    out = pa.schema([schema.field(c) for c in cols] + ([pa.field("__file", pa.int32())] if with_file else []))
    tables = []
    for i, f in enumerate(files):
        try:
            t = read_part(f, schema=schema, columns=cols)  # the export's schema fills what an older file lacks
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


def group_records(g: Group, columns: Sequence[str] | None = None, *, with_file: bool = False) -> pa.Table:
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


def group_events(g: Group, columns: Sequence[str] | None = None) -> pa.Table:
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


def records_part(groups: tuple[Group, ...], columns: tuple[str, ...] | None = None) -> "pd.DataFrame":
    """One partition of :meth:`Fleet.records`: the groups' records with machine, project, month."""
    schema = RECORDS_SCHEMA if columns is None else pa.schema([RECORDS_SCHEMA.field(c) for c in columns])
    parts = [_with_partition(group_records(g, columns), g, "endedAt") for g in groups]
    if not parts:
        parts = [_with_partition(schema.empty_table(), Group("", ""), "endedAt")]
    return _to_pandas(pa.concat_tables(parts).replace_schema_metadata(None))


def events_part(groups: tuple[Group, ...]) -> "pd.DataFrame":
    """One partition of :meth:`Fleet.events`: the groups' ledger events, in ledger order."""
    parts = [_with_partition(group_events(g), g, "at") for g in groups]
    if not parts:
        parts = [_with_partition(ISSUES_SCHEMA.empty_table(), Group("", ""), "at")]
    return _to_pandas(pa.concat_tables(parts).replace_schema_metadata(None))


def by_group(df: "pd.DataFrame"):
    """(machine, project, rows) of a partition, in the order they appear (each group's rows are contiguous)."""
    if not len(df):
        return
    m = df["machine"].to_numpy(dtype=object)
    p = df["project"].to_numpy(dtype=object)
    starts = np.flatnonzero(np.r_[True, (m[1:] != m[:-1]) | (p[1:] != p[:-1])])
    ends = np.r_[starts[1:], len(df)]
    for s, e in zip(starts.tolist(), ends.tolist()):
        yield str(m[s]), str(p[s]), df.iloc[s:e]
