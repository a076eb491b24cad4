"""The exports' public names, as USAGE.md documents them: one import for every format.

``cybmem export`` and a notebook call the same functions: :func:`export_ndjson`, :func:`export_csv`
(:mod:`cybmem.exchange.stream_export`), :func:`export_parquet`, :func:`read_dataset`
(:mod:`cybmem.exchange.parquet_dataset`) and :func:`export_sqlite` (:mod:`cybmem.exchange.sqlite_export`).
Every row carries the project slug; :func:`check_out` (:mod:`cybmem.exchange.destination`) is the one
rule for a destination, and every export is noted in ``exports.json`` (:func:`note_export`,
:mod:`cybmem.exchange.export_log`) so that a redaction reaches it.
"""

from __future__ import annotations

from .destination import Sink, check_out
from .export_log import EXPORTS_FILE, known_exports, note_export, redo_command
from .parquet_dataset import (
    ISSUES_SCHEMA,
    PARTITION_SCHEMA,
    RECORDS_SCHEMA,
    SCHEMA_VERSION,
    default_machine,
    export_parquet,
    read_dataset,
    refresh_dataset,
    validate_machine,
)
from .rows import EVENT_COLUMNS, RECORD_COLUMNS, TABLES, all_stores
from .sqlite_export import export_sqlite, refresh_sqlite
from .stream_export import export_csv, export_ndjson
from .summary import ExportSummary, TableSummary

__all__ = [
    "SCHEMA_VERSION",
    "RECORDS_SCHEMA",
    "ISSUES_SCHEMA",
    "PARTITION_SCHEMA",
    "RECORD_COLUMNS",
    "EVENT_COLUMNS",
    "TABLES",
    "ExportSummary",
    "TableSummary",
    "all_stores",
    "default_machine",
    "validate_machine",
    "export_ndjson",
    "export_csv",
    "export_parquet",
    "export_sqlite",
    "read_dataset",
    "check_out",
    "Sink",
    "EXPORTS_FILE",
    "known_exports",
    "note_export",
    "redo_command",
    "refresh_dataset",
    "refresh_sqlite",
]
