"""What an export did: per table, the rows read, written new and updated, the files; warnings and time.

The ``--json`` of every ``cybmem export FORMAT`` is :meth:`ExportSummary.to_dict`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["TableSummary", "ExportSummary"]


@dataclass
class TableSummary:
    """What one export did to one table."""

    table: str
    rows: int = 0  # rows in the source (the store's records or events)
    new: int = 0  # rows written that the destination did not have
    updated: int = 0  # rows the destination had and that changed (SQLite)
    files: list[str] = field(default_factory=list)  # files written

    def to_dict(self) -> dict:
        return {"table": self.table, "rows": self.rows, "new": self.new, "updated": self.updated, "files": self.files}


@dataclass
class ExportSummary:
    """What an export wrote: format, destination, projects, per-table counts, warnings, time."""

    format: str
    out: str | None
    projects: list[str]
    tables: list[TableSummary] = field(default_factory=list)
    machine: str | None = None
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    def table(self, name: str) -> TableSummary:
        for t in self.tables:
            if t.table == name:
                return t
        t = TableSummary(name)
        self.tables.append(t)
        return t

    def to_dict(self) -> dict:
        out = {
            "format": self.format,
            "out": self.out,
            "projects": self.projects,
            "tables": [t.to_dict() for t in self.tables],
        }
        if self.machine is not None:
            out["machine"] = self.machine
        out.update(self.extra)
        out["warnings"] = self.warnings
        out["seconds"] = round(self.seconds, 3)
        return out
