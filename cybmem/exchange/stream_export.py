"""NDJSON and CSV: a project's records or ledger events, streamed to a file or stdout.

NDJSON holds the records as stored (unknown fields kept) or the ledger events as written; CSV the
flat rows of :mod:`cybmem.exchange.rows`, with a text a spreadsheet would run quoted (:func:`_csv_cell`).
Both go through one :class:`~cybmem.exchange.destination.Sink` and are noted in ``exports.json``.
"""

from __future__ import annotations

import csv
import io
import os
import re
import time
from collections.abc import Iterable
from typing import IO

import orjson

from ..store.memory_store import MemoryStore
from .destination import Sink, check_out, out_name
from .export_log import note_export
from .rows import EVENT_COLUMNS, RECORD_COLUMNS, as_stores, check_table, flat_rows, progress_bar, project_frames
from .summary import ExportSummary

__all__ = ["export_ndjson", "export_csv"]


def _stream_sink(stores: list[MemoryStore], out, force: bool, entry: dict, summary: ExportSummary) -> Sink:
    """The sink of a file export, noted in each project's exports.json once the path passed the checks."""
    sink = Sink(out, force=force, roots=[s.root for s in stores])
    if isinstance(out, (str, os.PathLike)) and out != "-":
        check_out(out, force=force, roots=sink.roots)
        note_export(stores, {**entry, "out": str(out), "all": len(stores) > 1}, summary.warnings)
    return sink


# --- NDJSON ------------------------------------------------------------------------------


def export_ndjson(
    stores: MemoryStore | Iterable[MemoryStore],
    out: str | os.PathLike | IO | None = None,
    *,
    table: str = "records",
    progress: bool | None = None,
    force: bool = False,
) -> ExportSummary:
    """Write records (as stored) or ledger events as newline-delimited JSON, with a ``project`` key first.

    Args:
        stores: one project's store, or several (``--all``).
        out: a file path (written atomically; see :func:`check_out` for what is refused), a
            stream, or None / ``"-"`` for stdout.
        table: ``records`` (each record as written on disk, unknown fields kept; oldest first)
            or ``issues`` (each ledger event as written, in file order).
        progress: draw a progress bar on stderr (default: when stderr is a terminal).
        force: replace an existing regular file at ``out``.

    Returns:
        An :class:`ExportSummary`; unreadable files are skipped and listed in ``warnings``.
    """
    started = time.perf_counter()
    stores = as_stores(stores)
    check_table(table)
    summary = ExportSummary("ndjson", out_name(out), [s.slug for s in stores])
    ts = summary.table(table)
    with _stream_sink(stores, out, force, {"format": "ndjson", "table": table}, summary) as fh:
        for store in stores:
            items = store.records() if table == "records" else store.issue_events()
            with progress_bar(len(items), f"ndjson {store.slug}", progress) as bar:
                for i, item in enumerate(items, 1):
                    d = item.to_dict()
                    # project first; a field of the record named "project" (none in the spec) is shadowed.
                    line = {"project": store.slug, **{k: v for k, v in d.items() if k != "project"}}
                    fh.write(orjson.dumps(line) + b"\n")
                    if i % 256 == 0:
                        bar.update(256)
                bar.update(len(items) % 256)
            ts.rows += len(items)
            ts.new += len(items)
            summary.warnings += [f"{store.slug}: {p.message}" for p in store.problems]
    if summary.out:
        ts.files.append(summary.out)
    summary.seconds = time.perf_counter() - started
    return summary


# --- CSV ---------------------------------------------------------------------------------


def export_csv(
    stores: MemoryStore | Iterable[MemoryStore],
    out: str | os.PathLike | IO | None = None,
    *,
    table: str = "records",
    progress: bool | None = None,
    force: bool = False,
) -> ExportSummary:
    """Write records or ledger events as CSV (RFC 4180, UTF-8, a header row).

    Records: :data:`RECORD_COLUMNS` (the frame with lineage and outcome flattened, plus
    ``project``); events: :data:`EVENT_COLUMNS`. Times are ISO 8601 UTC
    (``2026-10-01T00:18:00.000Z``), lists JSON text (``["a", "b"]``), booleans
    ``true``/``false``; a missing value is an empty cell (CSV has no null). A text a
    spreadsheet would run as a formula gets a leading ``'`` (:func:`_csv_cell`).

    Args:
        stores: one project's store, or several (``--all``).
        out: a file path (written atomically; see :func:`check_out` for what is refused), a
            stream, or None / ``"-"`` for stdout.
        table: ``records`` or ``issues``.
        progress: draw a progress bar on stderr (default: when stderr is a terminal).
        force: replace an existing regular file at ``out``.
    """
    started = time.perf_counter()
    stores = as_stores(stores)
    check_table(table)
    columns = RECORD_COLUMNS if table == "records" else EVENT_COLUMNS
    summary = ExportSummary("csv", out_name(out), [s.slug for s in stores])
    ts = summary.table(table)
    with _stream_sink(stores, out, force, {"format": "csv", "table": table}, summary) as fh:
        text = io.TextIOWrapper(fh, encoding="utf-8", newline="", write_through=True)
        try:
            writer = csv.writer(text, lineterminator="\r\n")
            writer.writerow(columns)
            for store in stores:
                records, events = project_frames(store, summary.warnings)
                rows = flat_rows(records if table == "records" else events, store.slug, columns)
                with progress_bar(len(rows), f"csv {store.slug}", progress) as bar:
                    for i, row in enumerate(rows, 1):
                        writer.writerow([_csv_cell(v) for v in row.values()])
                        if i % 256 == 0:
                            bar.update(256)
                    bar.update(len(rows) % 256)
                ts.rows += len(rows)
                ts.new += len(rows)
            text.flush()
        finally:
            text.detach()  # leave the underlying stream (stdout) open
    if summary.out:
        ts.files.append(summary.out)
    summary.seconds = time.perf_counter() - started
    return summary


# Cells a spreadsheet reads as a formula (OWASP, "CSV Injection"): = + - @, a tab or a carriage
# return first, or = + - @ after blanks the spreadsheet trims on import.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def _csv_cell(value) -> object:
    """One CSV cell: booleans as ``true``/``false``, None as empty, and a text that a spreadsheet
    would run (``=HYPERLINK(...)``, ``@SUM(...)``, ``\\t=1+1``, `` -2+3``) with a ``'`` put
    first, so the spreadsheet shows it as text; a plain number (``-5``, ``+1.5e3``) is left as it
    is. The NDJSON, Parquet and SQLite exports hold the raw values."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return ""
    if isinstance(value, str) and value and (
        value.startswith(_FORMULA_START) or value.lstrip().startswith(_FORMULA_START[:4])
    ) and not _PLAIN_NUMBER.fullmatch(value.strip()):
        return "'" + value
    return value
