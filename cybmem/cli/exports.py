"""``cybmem export FORMAT``: a project's memory (or every project's) as NDJSON, CSV, Parquet, SQLite or
W3C PROV, one sub-command per format, each a call of :meth:`cybmem.memory.Memory.export`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import CybmemError
from ..memory import EXPORT_FORMATS, Memory
from . import signals
from .framework import Ctx, ProgressOpt, WordGroup, app, command, short_help
from .render import count, echo, print_json, warn

__all__ = ["EXPORT_FORMATS", "export_app"]



class _FormatGroup(WordGroup):
    """``cybmem export FORMAT``: one sub-command per format."""

    words, hint = EXPORT_FORMATS, "FORMAT"


export_app = typer.Typer(
    cls=_FormatGroup, no_args_is_help=True, rich_markup_mode=None, add_completion=False,
    help="""Export a project's memory (or, with --all, every project's) for other tools.

    ndjson: the records as stored, one a line; csv: flat columns, lists as JSON text; parquet: a
    Hive-partitioned dataset (DIR/records|issues/machine=/project=/month=/) that each export
    appends to; sqlite: records (full-text search), issue_events and issues, for Datasette;
    prov: W3C PROV-JSON (and PROV-N) of the history. Every row carries its project.

    Example: cybmem export parquet --out ~/fleet --all
    """,
)
app.add_typer(export_app, name="export", short_help=short_help(export_app.info.help))

AllOpt = Annotated[bool, typer.Option("--all", help="Export every project of the memory root.")]
TableOpt = Annotated[Optional[str], typer.Option("--table", help="records or issues (default: records for ndjson/csv, both for parquet/sqlite).", show_default=False)]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace an existing regular file at --out (never a link, a device or a FIFO, never inside a memory root).")]


def _export_stores(ctx: Ctx, all_projects: bool) -> list:
    """The stores an export reads: the project (--cwd / --project) or, with --all, every one. Every
    export asks for them first; from then on a SIGTERM unwinds it as Ctrl-C does, so its temp
    file (or SQLite transaction) is cleaned up at once."""
    signals.catch_sigterm()
    if all_projects and ctx.project is not None:
        raise typer.BadParameter("give --project or --all, not both", param_hint="--all")
    return ctx.memory.export_stores(all_projects=all_projects)


def _export_tables(table: Optional[str]) -> None:
    """--table: one of the tables (None: the format's default)."""
    try:
        Memory.export_tables(table)
    except CybmemError as exc:
        raise typer.BadParameter(str(exc), param_hint="--table") from None


def _export_text(fmt: str, ctx: Ctx, out: Optional[Path], table: Optional[str], all_projects: bool,
                 progress: Optional[bool], force: bool) -> None:
    """ndjson and csv: to --out, or to stdout without it (or with --out -)."""
    if out is not None and str(out) == "-":
        out = None  # stdout
    _export_tables(table)
    if ctx.json and out is None:
        raise typer.BadParameter(f"--json prints a summary, but without --out the {fmt} data goes to stdout; add --out FILE", param_hint="--json")
    result = ctx.memory.export(fmt, out, stores=_export_stores(ctx, all_projects), table=table, progress=progress, force=force)
    warn(result.warnings)
    if ctx.json:
        print_json(result.to_dict())
    elif out is not None:  # else the data went to stdout
        t = result.tables[0]
        echo(f"Wrote {count(t.rows, 'record' if t.table == 'records' else 'issue event')} of "
              f"{count(len(result.projects), 'project')} to {out}.")


TextOutOpt = Annotated[Optional[Path], typer.Option("--out", "-o", help="The file to write (default, or -: stdout).", show_default=False)]


@command("ndjson", group=export_app)
def export_ndjson_cmd(ctx: Ctx, out: TextOutOpt = None, table: TableOpt = None, all_projects: AllOpt = False,
                      progress: ProgressOpt = None, force: ForceOpt = False):
    """The records as stored (unknown fields kept), or with --table issues the ledger events, one JSON object a line.

    Example: cybmem export ndjson --project api | head -n 1
    """
    _export_text("ndjson", ctx, out, table, all_projects, progress, force)


@command("csv", group=export_app)
def export_csv_cmd(ctx: Ctx, out: TextOutOpt = None, table: TableOpt = None, all_projects: AllOpt = False,
                   progress: ProgressOpt = None, force: ForceOpt = False):
    """The records flattened (lineage and outcome as columns, lists as JSON text, times ISO 8601 UTC), or the events.

    Example: cybmem export csv --project api --table issues --out issues.csv
    """
    _export_text("csv", ctx, out, table, all_projects, progress, force)


@command("parquet", group=export_app, teardown=False)
def export_parquet_cmd(
    ctx: Ctx,
    out: Annotated[Path, typer.Option("--out", "-o", help="The dataset directory (created; each export appends to it).", show_default=False)],
    machine: Annotated[Optional[str], typer.Option("--machine", help="The machine partition (default: this host's name).", show_default=False)] = None,
    table: TableOpt = None,
    all_projects: AllOpt = False,
    progress: ProgressOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Accepted as by the other formats; a dataset is appended to, never replaced.")] = False,
):
    """Append to a Hive-partitioned Parquet dataset (DIR/records|issues/machine=/project=/month=/); many machines side by side.

    Example: cybmem export parquet --out ~/fleet --all --machine laptop
    """
    _export_tables(table)
    try:
        Memory.check_machine(machine)
    except CybmemError as exc:
        raise typer.BadParameter(str(exc), param_hint="--machine") from None
    result = ctx.memory.export("parquet", out, stores=_export_stores(ctx, all_projects), table=table, machine=machine,
                               progress=progress)
    warn(result.warnings)
    if ctx.json:
        print_json(result.to_dict())
        return
    what = {"records": "record", "issues": "issue event"}
    parts = [f"{count(t.new, 'new ' + what[t.table])} ({count(len(t.files), 'file')}; {t.rows - t.new} already there)"
             for t in result.tables]
    echo(f"Wrote {' and '.join(parts)} to {out} as machine {result.machine}.")


@command("sqlite", group=export_app)
def export_sqlite_cmd(
    ctx: Ctx,
    out: Annotated[Path, typer.Option("--out", "-o", help="The database file (created, or updated in place).", show_default=False)],
    table: TableOpt = None,
    all_projects: AllOpt = False,
    progress: ProgressOpt = None,
    force: ForceOpt = False,
):
    """records (full-text search), issue_events and issues (the current fold), for Datasette and sqlite-utils.

    Example: cybmem export sqlite --all --out memory.db
    """
    _export_tables(table)
    result = ctx.memory.export("sqlite", out, stores=_export_stores(ctx, all_projects), table=table, progress=progress,
                               force=force)
    warn(result.warnings)
    if ctx.json:
        print_json(result.to_dict())
        return
    parts = [f"{t.table} {t.rows} ({t.new} new" + (f", {t.updated} updated)" if t.table != "issues" else ")") for t in result.tables]
    echo(f"Wrote {out}: {', '.join(parts)}"
          + ("; full-text search on task and summary (records_fts)." if any(t.table == "records" for t in result.tables) else "."))


@command("prov", group=export_app)
def export_prov_cmd(
    ctx: Ctx,
    out: Annotated[Path, typer.Option("--out", "-o", help="The PROV-JSON file.", show_default=False)],
    chain: Annotated[Optional[str], typer.Option("--chain", help="Only the previousRunId chain of this run (id or unique prefix), walked both ways.", show_default=False)] = None,
    provn: Annotated[bool, typer.Option("--provn", help="Also write PROV-N next to the PROV-JSON file (same name, .provn).")] = False,
    all_projects: AllOpt = False,
    force: ForceOpt = False,
):
    """W3C PROV-JSON of the history (or of one --chain), plus PROV-N with --provn.

    Example: cybmem export prov --project web --chain 9b6b1e00 --out chain.prov.json --provn
    """
    if chain is not None and all_projects:
        raise typer.BadParameter("a chain lies inside one project: drop --all", param_hint="--chain")
    result = ctx.memory.export("prov", out, stores=_export_stores(ctx, all_projects), chain=chain, provn=provn, force=force)
    warn(result.warnings)
    if ctx.json:
        print_json(result.to_dict())
        return
    c = result.counts
    files = " and ".join(f"{p} ({'PROV-N' if k == 'provn' else 'PROV-JSON'})" for k, p in result.files.items())
    echo(f"Wrote {files}: {c['activities']} activities, {c['entities']} entities, {c['agents']} agents, "
          f"{c['relations']} relations ({', '.join(f'{k} {v}' for k, v in c.items() if k not in ('activities', 'entities', 'agents', 'relations'))}).")

