"""The Parquet dataset many machines append to: its layout and schemas, appending to it, reading it,
and the one rewrite (after ``cybmem redact``).

The dataset is ``DIR/<records|issues>/machine=<m>/project=<slug>/month=<YYYY-MM>/part-<UTC
time>-<hex>.parquet`` (files: :data:`RECORDS_SCHEMA`, :data:`ISSUES_SCHEMA`; path columns:
:data:`PARTITION_SCHEMA`, strings; :func:`read_dataset` opens it), written incrementally and never
rewritten (but by :func:`refresh_dataset` after ``cybmem redact``), each file under a dot-name
then renamed, so many machines append to one DIR side by side. What the dataset leaves out
(``superseded``, ``durationS``) and why: USAGE.md, "Exporting: ``cybmem export``".
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import pyarrow as pa

from .. import _io
from ..errors import StoreError, ValidationError
from ..store.memory_store import MemoryStore
from .destination import check_out
from .export_log import note_export
from .rows import TABLES, as_stores, check_table, progress_bar, project_frames
from .summary import ExportSummary, TableSummary

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    import pyarrow.dataset as pads

__all__ = [
    "SCHEMA_VERSION",
    "RECORDS_SCHEMA",
    "ISSUES_SCHEMA",
    "PARTITION_SCHEMA",
    "default_machine",
    "validate_machine",
    "NOT_REGULAR",
    "part_files",
    "read_part",
    "export_parquet",
    "read_dataset",
    "refresh_dataset",
]

SCHEMA_VERSION = 1

_TS = pa.timestamp("ms", tz="UTC")
_STR_LIST = pa.list_(pa.string())

#: Columns of ``DIR/records/**/*.parquet``, in file order (the partition columns are in the path):
#: a record with lineage and outcome flattened. Written out here, not taken from the cache's
#: schema (cybmem.store.arrow_records.RECORD_SCHEMA), so that a change to the cache cannot change a user's
#: files; a change here is a new SCHEMA_VERSION (tests/exchange/test_export.py pins it).
RECORDS_SCHEMA = pa.schema(
    [
        pa.field("runId", pa.string(), nullable=False),
        ("cwd", pa.string()),
        ("workflowName", pa.string()),
        ("task", pa.string()),
        ("state", pa.string()),  # done | error | cancelled
        ("startedAt", _TS),
        ("endedAt", _TS),
        ("parentRunId", pa.string()),
        ("chatSessionId", pa.string()),
        ("previousRunId", pa.string()),
        ("rootRunId", pa.string()),
        ("summary", pa.string()),
        ("accomplished", _STR_LIST),
        ("issues", _STR_LIST),
        ("next", _STR_LIST),
        ("workerAgents", _STR_LIST),  # workers[].agentId
        ("workerStates", _STR_LIST),  # workers[].state
        ("verdictSummary", pa.string()),
        ("supersededBy", pa.string()),
        ("supersedes", pa.string()),
    ],
    metadata={"cybmem.table": "records", "cybmem.schema_version": str(SCHEMA_VERSION)},
)

#: Columns of ``DIR/issues/**/*.parquet``: one ledger event a row.
ISSUES_SCHEMA = pa.schema(
    [
        pa.field("issueId", pa.string(), nullable=False),
        ("at", _TS),
        ("event", pa.string()),  # opened | resolved | reopened | wontfix
        ("byRunId", pa.string()),
        ("title", pa.string()),
        ("detail", pa.string()),
        ("line", pa.int64()),  # 1-based line of the event in the project's issues.jsonl
    ],
    metadata={"cybmem.table": "issues", "cybmem.schema_version": str(SCHEMA_VERSION)},
)

#: The Hive partition columns, in path order; all strings.
PARTITION_SCHEMA = pa.schema([("machine", pa.string()), ("project", pa.string()), ("month", pa.string())])
_MACHINE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def default_machine() -> str:
    """This host's name, as a partition value (the first label of the name, made safe)."""
    name = socket.gethostname().split(".")[0]
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-_") or "localhost"
    return name[:64]


def validate_machine(name: object) -> str:
    """Return ``name`` if it is one safe path segment (``[A-Za-z0-9][A-Za-z0-9._-]{0,63}``)."""
    if not isinstance(name, str) or not _MACHINE_RE.fullmatch(name):
        raise ValidationError(
            f"machine name {name!r} is not one safe path segment; use 1-64 characters from A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit"
        )
    return name


def _segment(value: str) -> str:
    """A Hive partition value, URI-encoded as pyarrow's hive partitioning decodes it."""
    return quote(value, safe="-_.~")


def _partition_dir(out_dir: Path, table: str, machine: str, project: str) -> Path:
    return out_dir / table / f"machine={_segment(machine)}" / f"project={_segment(project)}"


#: Why a dataset entry is not read: the one wording of every reader of the dataset.
NOT_REGULAR = "not a regular file (a FIFO, socket, device or directory)"


def part_files(pdir: Path, skipped: list[str] | None = None) -> list[Path]:
    """A partition's part files (``month=*/*.parquet``) in month order; temp and hidden files
    (``.*``, ``_*``) skipped, as every reader of the dataset skips them, and what is not a regular
    file (a FIFO, socket, device or directory so named: it holds no rows, and reading a FIFO would
    wait forever), each with one line in ``skipped`` when given."""
    if not pdir.is_dir():
        return []
    out = []
    for p in sorted(pdir.glob("month=*/*.parquet")):
        if p.name.startswith((".", "_")):
            continue
        if p.is_file():  # a symbolic link to a regular file is read as the file (read_part follows it)
            out.append(p)
        elif skipped is not None:
            skipped.append(f"skipped {p}: {NOT_REGULAR}")
    return out


def read_part(path: str | os.PathLike, *, columns: list[str] | None = None,
              schema: pa.Schema | None = None) -> pa.Table:
    """One part file (or any Parquet file), the one way every reader of a dataset reads it.

    Mapped into memory by the one rule (:func:`cybmem._io.map_regular`: a file swapped for a FIFO
    cannot hang the read) and decoded in this thread. A read that Arrow's thread pools
    decode makes the process abort at exit now and then ("terminate called without an active
    exception", apache/arrow#34314 and #50482): under load, 32 of 100 processes that read a part
    through a file handle that way, 17 of 100 through a buffer, none of 100 read this way
    (benchmarks/exit_aborts.py). Part files are small: the threads bought nothing.

    Args:
        columns: the columns to read (all when None).
        schema: the dataset's schema: a column an older file lacks is read as nulls of its type.

    Raises:
        StoreError: not a regular file.
        pyarrow.ArrowException, OSError: not a readable Parquet file (the caller says which file).
    """
    source = pa.BufferReader(pa.py_buffer(_io.map_regular(path, follow=True)))
    if schema is None:
        import pyarrow.parquet as pq

        return pq.read_table(source, columns=columns, use_threads=False, pre_buffer=False)
    import pyarrow.dataset as ds

    return ds.ParquetFileFormat().make_fragment(source).to_table(schema=schema, columns=columns, use_threads=False)


def _read_column(files: list[Path], column: str) -> pa.ChunkedArray | None:
    if not files:
        return None
    parts = []
    for f in files:
        try:
            parts.append(read_part(f, columns=[column]).column(column))
        except (pa.ArrowException, OSError) as exc:
            raise StoreError(
                f"cannot read {f} ({exc}); the dataset holds a file cybmem did not write or a damaged one: "
                "move it aside and export again"
            ) from None
    return pa.chunked_array([c for part in parts for c in part.chunks], type=parts[0].type)


def _months(ts: pa.ChunkedArray | pa.Array) -> list[str]:
    import pyarrow.compute as pc

    return pc.strftime(ts, format="%Y-%m").to_pylist()


def _write_part(month_dir: Path, table: pa.Table) -> Path:
    """Write one part file atomically (a temp file readers skip, fsync, then a link to a new name)."""
    import pyarrow.parquet as pq

    month_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    final = month_dir / f"part-{stamp}-{uuid.uuid4().hex[:12]}.parquet"
    with _io.atomic_file(final, private=False, overwrite=False) as fh:
        pq.write_table(table, fh, compression="zstd")
    return final


@contextlib.contextmanager
def _dataset_lock(out_dir: Path, machine: str) -> Iterator[None]:
    out_dir.mkdir(parents=True, exist_ok=True)
    with _io.locked(out_dir / f".lock-{machine}"):
        yield


def _records_arrow(df: "pd.DataFrame") -> pa.Table:
    cols = [f.name for f in RECORDS_SCHEMA]
    table = pa.Table.from_pandas(df[cols], schema=RECORDS_SCHEMA, preserve_index=False)
    return table.replace_schema_metadata(RECORDS_SCHEMA.metadata)


def _events_arrow(df: "pd.DataFrame") -> pa.Table:
    cols = [f.name for f in ISSUES_SCHEMA]
    table = pa.Table.from_pandas(df[cols], schema=ISSUES_SCHEMA, preserve_index=False)
    return table.replace_schema_metadata(ISSUES_SCHEMA.metadata)


def _append_partitioned(pdir: Path, table: pa.Table, time_column: str, bar, ts: TableSummary) -> None:
    """Write the new rows of one machine/project, one part file per month."""
    import pyarrow.compute as pc

    if not table.num_rows:
        return
    months = pa.array(_months(table.column(time_column)))
    for month in sorted(set(months.to_pylist())):
        part = table.filter(pc.equal(months, month))
        path = _write_part(pdir / f"month={_segment(month)}", part)
        ts.files.append(str(path))
        ts.new += part.num_rows
        bar.update(part.num_rows)


def export_parquet(
    stores: MemoryStore | Iterable[MemoryStore],
    out_dir: str | os.PathLike,
    *,
    machine: str | None = None,
    tables: Iterable[str] = TABLES,
    progress: bool | None = None,
    note: bool = True,
) -> ExportSummary:
    """Append a project's records and ledger events to a Hive-partitioned Parquet dataset.

    Only what the dataset does not hold yet for this machine and project is written
    (records by ``runId``, events past the last exported ledger ``line``), as new part
    files under ``DIR/<table>/machine=<m>/project=<slug>/month=<YYYY-MM>/``; existing
    files are never touched (but by :func:`refresh_dataset`). See the module docstring for the
    layout and schemas; each export is noted in the projects' ``exports.json`` (:func:`note_export`).

    Args:
        stores: one project's store, or several (``--all``).
        out_dir: the dataset directory (created).
        machine: the ``machine`` partition (default: :func:`default_machine`).
        tables: which of ``records`` and ``issues`` to export.
        progress: draw a progress bar on stderr (default: when stderr is a terminal).
        note: note the dataset in the projects' ``exports.json`` (:func:`note_export`); False for
            a temporary dataset its maker removes (a report's), which no redaction need reach.

    Returns:
        An :class:`ExportSummary`: per table, the source rows, the rows newly written and the files.

    Raises:
        ValidationError: a bad machine name or table.
        StoreError: the dataset holds an unreadable file, or a ledger is shorter than what
            was already exported from it (it was replaced; appending would mix two ledgers).
    """
    import pyarrow.compute as pc

    started = time.perf_counter()
    stores = as_stores(stores)
    tables = [check_table(t) for t in tables]
    machine = validate_machine(machine if machine is not None else default_machine())
    out_dir = check_out(out_dir, roots=[s.root for s in stores], directory=True)
    summary = ExportSummary("parquet", str(out_dir), [s.slug for s in stores], machine=machine)
    for t in tables:
        summary.table(t)
    if note:  # before the dataset lock is taken, which a redaction takes after its own
        note_export(stores, {"format": "parquet", "out": str(out_dir), "machine": machine, "tables": tables,
                             "all": len(stores) > 1}, summary.warnings)
    with _dataset_lock(out_dir, machine):
        for store in stores:
            records, events = project_frames(store, summary.warnings)
            if "records" in tables:
                ts = summary.table("records")
                pdir = _partition_dir(out_dir, "records", machine, store.slug)
                have = _read_column(part_files(pdir, summary.warnings), "runId")
                table = _records_arrow(records)
                ts.rows += table.num_rows
                if have is not None and len(have):
                    table = table.filter(pc.invert(pc.is_in(table.column("runId"), value_set=have.combine_chunks())))
                with progress_bar(table.num_rows, f"parquet records {store.slug}", progress) as bar:
                    _append_partitioned(pdir, table, "endedAt", bar, ts)
            if "issues" in tables:
                ts = summary.table("issues")
                pdir = _partition_dir(out_dir, "issues", machine, store.slug)
                lines = _read_column(part_files(pdir, summary.warnings), "line")
                last = pc.max(lines).as_py() if lines is not None and len(lines) else 0
                table = _events_arrow(events)
                ts.rows += table.num_rows
                if last:
                    newest = pc.max(table.column("line")).as_py() if table.num_rows else 0
                    if newest < last:
                        raise StoreError(
                            f"{store.issues_path} ends at line {newest or 0} but line {last} of project "
                            f"{store.slug} was already exported to {pdir}: the ledger was replaced. Export to a new "
                            "directory, or move that partition aside and export again"
                        )
                    table = table.filter(pc.greater(table.column("line"), last))
                with progress_bar(table.num_rows, f"parquet issues {store.slug}", progress) as bar:
                    _append_partitioned(pdir, table, "at", bar, ts)
    summary.seconds = time.perf_counter() - started
    return summary


def read_dataset(out_dir: str | os.PathLike, table: str = "records") -> "pads.Dataset":
    """Open one table of an exported Parquet dataset (every machine and project) with pyarrow.dataset.

    ``machine``, ``project`` and ``month`` come from the path, as strings.

    Example:
        >>> read_dataset("fleet").to_table(filter=pc.field("project") == "web").to_pandas()  # doctest: +SKIP
    """
    import pyarrow.dataset as ds

    check_table(table)
    schema = RECORDS_SCHEMA if table == "records" else ISSUES_SCHEMA
    full = pa.schema(list(schema) + list(PARTITION_SCHEMA), metadata=schema.metadata)
    return ds.dataset(
        str(Path(out_dir) / table), format="parquet", schema=full,
        partitioning=ds.partitioning(PARTITION_SCHEMA, flavor="hive"),
    )


def refresh_dataset(
    store: MemoryStore,
    out_dir: str | os.PathLike,
    machine: str,
    *,
    run_ids: Iterable[str] = (),
    issue_ids: Iterable[str] = (),
    holds: Callable[[str], bool] | None = None,
) -> tuple[list[str], list[str]]:
    """Bring one machine's rows of a project in an exported dataset in line with the store, after
    ``cybmem redact`` rewrote records and ledger lines (the one time a part file is rewritten).

    Records: each row of a run in ``run_ids``, or whose ``issues`` names one of ``issue_ids``
    (ids the redaction renamed), becomes the store's row of that run now. Events: each row that
    differs from the ledger's event at its ``line`` becomes that event. A file with a changed row
    is replaced whole under its own name (a temp file, fsync, rename: a reader sees the old file
    or the new one), under the machine's dataset lock; the others are not touched. Temp files a
    killed writer of this machine left in the partition are removed.

    Returns:
        The files rewritten, and each file with a text for which ``holds`` says yes (with its
        runs or ledger lines).
    """
    import pyarrow.parquet as pq

    from ..store.loading import load_snapshot

    out_dir = Path(out_dir)
    machine = validate_machine(machine)
    snap = load_snapshot(store)  # Arrow, no pandas: `cybmem redact` and `doctor --repair` stay lean
    runs, olds = set(run_ids), set(issue_ids)
    rewritten: list[str] = []
    holding: list[str] = []
    # The lock file only: a dataset that is gone is not made again.
    with _io.locked(out_dir / f".lock-{machine}"):
        for table in TABLES:
            pdir = _partition_dir(out_dir, table, machine, store.slug)
            _remove_debris(pdir)
            files = part_files(pdir)
            if not files:
                continue
            if table == "records":
                schema, key, source = RECORDS_SCHEMA, "runId", snap.records
                wanted = (lambda row: row["runId"] in runs or bool(olds.intersection(row.get("issues") or ())))
            else:
                schema, key, source = ISSUES_SCHEMA, "line", snap.events
                wanted = (lambda row: True)
            current = pa.Table.from_pylist(source.select(schema.names).to_pylist(), schema=schema)
            now = {r[key]: r for r in current.to_pylist()}
            for f in files:
                try:
                    rows = read_part(f).to_pylist()
                except (pa.ArrowException, OSError) as exc:
                    raise StoreError(f"cannot read {f} ({exc}); the dataset holds a file cybmem did not write or a "
                                     "damaged one: move it aside and export again") from None
                new = [now.get(row[key], row) if wanted(row) else row for row in rows]
                if new != rows:
                    with _io.atomic_file(f, private=False) as fh:
                        pq.write_table(pa.Table.from_pylist(new, schema=schema), fh, compression="zstd")
                    rewritten.append(str(f))
                held = [str(row[key]) for row in new if holds is not None and _row_holds(row, holds)]
                if held:
                    what = "runs" if table == "records" else "ledger lines"
                    holding.append(f"{f} ({what} {', '.join(held[:5])}{', ...' if len(held) > 5 else ''}: "
                                   "`cybmem redact --everywhere` with the same text)")
    return rewritten, holding


def _row_holds(row: dict, holds: Callable[[str], bool]) -> bool:
    return any(isinstance(item, str) and holds(item)
               for v in row.values() for item in (v if isinstance(v, list) else [v]))


def _remove_debris(pdir: Path) -> None:
    """Remove the temp files of killed writers from a partition (its machine's lock held)."""
    if not pdir.is_dir():
        return
    for tmp in pdir.glob(f"month=*/{_io.TMP_PREFIX}*"):
        with contextlib.suppress(OSError):
            if tmp.is_file() and not tmp.is_symlink():
                tmp.unlink()
