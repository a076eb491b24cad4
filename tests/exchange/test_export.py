"""Exports: every format read back by the tools it is for, equal to what the store holds."""

import csv
import io
import json
import os
import sqlite3
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from cybmem.cli.app import app
from cybmem.errors import StoreError, ValidationError
from cybmem.exchange.export import (
    EVENT_COLUMNS,
    ISSUES_SCHEMA,
    PARTITION_SCHEMA,
    RECORD_COLUMNS,
    RECORDS_SCHEMA,
    all_stores,
    default_machine,
    export_csv,
    export_ndjson,
    export_parquet,
    export_sqlite,
    read_dataset,
    validate_machine,
)
from cybmem.explore.frames import issue_events_frame, issue_fold, records_frame
from cybmem.store.records import IssueEvent, Lineage, MemoryRecord, Outcome, Worker
from cybmem.store.memory_store import MemoryStore

from conftest import MIN

runner = CliRunner()
SLUGS = ["api", "web", "web-7663e1"]
T_NEW = 1_796_000_000_000  # 2026-11-30, after every fixture record (a new month)


def cli(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


@pytest.fixture
def stores(fixture_copy):
    return all_stores(fixture_copy)


def store_of(root, slug="web"):
    return MemoryStore(root, slug)


def add_record(store, run_id, *, at=T_NEW, summary="Tuned the zeppelin cache.", issues=(), supersedes=None, **extra):
    rec = MemoryRecord(
        runId=run_id, cwd="/home/dev/web", workflowName="implement-task", task=f"Task of {run_id}", state="done",
        startedAt=at - 10 * MIN, endedAt=at, lineage=Lineage(previousRunId=None),
        outcome=Outcome(summary=summary, accomplished=["did it"], issues=list(issues)),
        workers=[Worker(agentId="impl-1", state="done", provider="anthropic")], supersedes=supersedes, **extra,
    )
    store.write_record(rec)
    return rec


def raw_records(root, slug):
    recs = [json.loads(p.read_text()) for p in (Path(root) / slug / "records").glob("*.json")]
    return sorted(recs, key=lambda r: (r["endedAt"], r["runId"]))


def raw_events(root, slug):
    return [json.loads(line) for line in (Path(root) / slug / "issues.jsonl").read_text().splitlines() if line.strip()]


def ms(ts) -> int:
    return int(ts.timestamp() * 1000)


def iso_ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


# --- the export schemas, pinned ----------------------------------------------------------

_S, _TS_UTC, _LS = "string", "timestamp[ms, tz=UTC]", "list<string>"
#: What a user's files hold; a change here is a change of SCHEMA_VERSION, never a side effect.
PINNED_PARQUET_RECORDS = [
    ("runId", _S, False), ("cwd", _S, True), ("workflowName", _S, True), ("task", _S, True), ("state", _S, True),
    ("startedAt", _TS_UTC, True), ("endedAt", _TS_UTC, True), ("parentRunId", _S, True), ("chatSessionId", _S, True),
    ("previousRunId", _S, True), ("rootRunId", _S, True), ("summary", _S, True), ("accomplished", _LS, True),
    ("issues", _LS, True), ("next", _LS, True), ("workerAgents", _LS, True), ("workerStates", _LS, True),
    ("verdictSummary", _S, True), ("supersededBy", _S, True), ("supersedes", _S, True),
]
PINNED_PARQUET_ISSUES = [("issueId", _S, False), ("at", _TS_UTC, True), ("event", _S, True), ("byRunId", _S, True),
                         ("title", _S, True), ("detail", _S, True), ("line", "int64", True)]
PINNED_CSV_RECORDS = (
    "project", "runId", "cwd", "workflowName", "task", "state", "startedAt", "endedAt", "durationS",
    "parentRunId", "chatSessionId", "previousRunId", "rootRunId", "summary", "accomplished", "issues", "next",
    "workerAgents", "workerStates", "verdictSummary", "supersededBy", "supersedes", "superseded",
)
PINNED_CSV_EVENTS = ("project", "issueId", "at", "event", "byRunId", "title", "detail", "line")
_T, _I, _R = "TEXT", "INTEGER", "REAL"
PINNED_SQLITE = {
    "records": [("runId", _T, 1), ("project", _T, 0), ("cwd", _T, 0), ("workflowName", _T, 0), ("task", _T, 0),
                ("state", _T, 0), ("startedAt", _T, 0), ("endedAt", _T, 0), ("durationS", _R, 0), ("parentRunId", _T, 0),
                ("chatSessionId", _T, 0), ("previousRunId", _T, 0), ("rootRunId", _T, 0), ("summary", _T, 0),
                ("accomplished", _T, 0), ("issues", _T, 0), ("next", _T, 0), ("workerAgents", _T, 0),
                ("workerStates", _T, 0), ("verdictSummary", _T, 0), ("supersededBy", _T, 0), ("supersedes", _T, 0),
                ("superseded", _I, 0)],
    "issue_events": [("project", _T, 1), ("issueId", _T, 0), ("at", _T, 0), ("event", _T, 0), ("byRunId", _T, 0),
                     ("title", _T, 0), ("detail", _T, 0), ("line", _I, 2)],
    "issues": [("project", _T, 1), ("issueId", _T, 2), ("title", _T, 0), ("state", _T, 0), ("openedAt", _T, 0),
               ("resolvedAt", _T, 0), ("lastAt", _T, 0), ("ageS", _R, 0), ("reopenCount", _I, 0), ("events", _I, 0),
               ("openedBy", _T, 0), ("resolvedBy", _T, 0)],
}
PINNED_NDJSON_RECORD_KEYS = ["project", "runId", "cwd", "workflowName", "task", "state", "startedAt", "endedAt",
                             "lineage", "outcome", "workers"]  # then verdictSummary, supersededBy, supersedes when set


def _type(t: pa.DataType) -> str:
    """A type as text; a list by its values' type (Parquet names the item "element", Arrow "item")."""
    return f"list<{t.value_type}>" if pa.types.is_list(t) else str(t)


def _fields(schema):
    return [(f.name, _type(f.type), f.nullable) for f in schema]


def test_export_schemas_are_pinned(stores, tmp_path):
    """Every format's columns and types, written out: what a user's files hold does not drift."""
    assert _fields(RECORDS_SCHEMA) == PINNED_PARQUET_RECORDS
    assert _fields(ISSUES_SCHEMA) == PINNED_PARQUET_ISSUES
    assert _fields(PARTITION_SCHEMA) == [("machine", _S, True), ("project", _S, True), ("month", _S, True)]
    assert RECORD_COLUMNS == PINNED_CSV_RECORDS and EVENT_COLUMNS == PINNED_CSV_EVENTS
    out = tmp_path / "ds"
    export_parquet(stores, out, machine="m")
    files = sorted(out.rglob("*.parquet"))
    assert _fields(pq.read_schema(next(f for f in files if "records" in f.parts))) == PINNED_PARQUET_RECORDS
    assert _fields(pq.read_schema(next(f for f in files if "issues" in f.parts))) == PINNED_PARQUET_ISSUES
    export_csv(stores, tmp_path / "r.csv")
    assert tuple(next(csv.reader(io.StringIO((tmp_path / "r.csv").read_text())))) == PINNED_CSV_RECORDS
    db = tmp_path / "m.db"
    export_sqlite(stores, db)
    con = sqlite3.connect(db)
    try:
        for table, want in PINNED_SQLITE.items():
            assert [(r[1], r[2], r[5]) for r in con.execute(f"PRAGMA table_info([{table}])")] == want, table
    finally:
        con.close()
    export_ndjson(stores, tmp_path / "r.ndjson")
    first = json.loads((tmp_path / "r.ndjson").read_text().splitlines()[0])
    assert list(first)[:len(PINNED_NDJSON_RECORD_KEYS)] == PINNED_NDJSON_RECORD_KEYS


def test_export_schema_does_not_follow_the_caches_schema(tmp_path):
    """The cache's Arrow schema (cybmem.store.arrow_records.RECORD_SCHEMA) changes: the Parquet schema does not."""
    code = (
        "import pyarrow as pa, cybmem.store.arrow_records as c\n"
        "c.RECORD_SCHEMA = pa.schema([pa.field('runId', pa.large_string()), ('added', pa.int8())]"
        " + [f for f in c.RECORD_SCHEMA if f.name not in ('runId', 'summary')])\n"
        "from cybmem.exchange.export import RECORDS_SCHEMA\n"
        "print([(f.name, f'list<{f.type.value_type}>' if pa.types.is_list(f.type) else str(f.type), f.nullable)"
        " for f in RECORDS_SCHEMA])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str([tuple(f) for f in PINNED_PARQUET_RECORDS])
    import ast
    import cybmem.exchange.parquet_dataset
    modules = sorted(Path(cybmem.exchange.parquet_dataset.__file__).parent.glob("*.py"))  # export.py was split by job
    assert len(modules) > 10
    for module in modules:
        tree = ast.parse(module.read_text())
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        used |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert "RECORD_SCHEMA" not in used, f"{module.name}: the exports declare their own schemas (parquet_dataset.py)"


# --- NDJSON --------------------------------------------------------------------------------


def test_ndjson_records_are_the_records_as_stored(stores, fixture_copy, tmp_path):
    out = tmp_path / "all.ndjson"
    summary = export_ndjson(stores, out)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == summary.tables[0].rows == 68
    for slug in SLUGS:
        mine = [{k: v for k, v in d.items() if k != "project"} for d in lines if d["project"] == slug]
        assert mine == raw_records(fixture_copy, slug)
    assert all(next(iter(d)) == "project" for d in lines), "project comes first"


def test_ndjson_keeps_unknown_fields(fixture_copy, tmp_path):
    store = store_of(fixture_copy)
    add_record(store, "extra-1", extra={"reviewer": {"name": "ann"}})
    buf = io.StringIO()
    export_ndjson(store, buf)
    last = json.loads(buf.getvalue().splitlines()[-1])
    assert last["runId"] == "extra-1" and last["reviewer"] == {"name": "ann"}


def test_ndjson_issues_are_the_ledger_lines(stores, fixture_copy, tmp_path):
    out = tmp_path / "issues.ndjson"
    export_ndjson(stores, out, table="issues")
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    for slug in SLUGS:
        assert [{k: v for k, v in d.items() if k != "project"} for d in lines if d["project"] == slug] == raw_events(fixture_copy, slug)


def test_ndjson_to_stdout_through_the_cli_matches_the_file(fixture_copy, tmp_path):
    res = cli("export", "ndjson", "--memory-dir", fixture_copy, "-p", "web")
    assert res.exit_code == 0, res.output
    export_ndjson(store_of(fixture_copy), tmp_path / "w.ndjson")
    assert res.stdout == (tmp_path / "w.ndjson").read_text()


def test_unreadable_record_is_skipped_with_a_warning(fixture_copy, tmp_path):
    (fixture_copy / "web" / "records" / "broken.json").write_text("{not json")
    res = cli("export", "ndjson", "--memory-dir", fixture_copy, "-p", "web", "--out", tmp_path / "w.ndjson")
    assert res.exit_code == 0
    assert "warning: web: broken.json: not valid JSON" in res.stderr
    assert res.stdout == f"Wrote 47 records of 1 project to {tmp_path / 'w.ndjson'}.\n"


# --- CSV -----------------------------------------------------------------------------------


def _csv_value(name, text):
    if text == "":
        return [] if name in ("accomplished", "issues", "next", "workerAgents", "workerStates") else None
    if name in ("startedAt", "endedAt", "at"):
        return iso_ms(text)
    if name in ("accomplished", "issues", "next", "workerAgents", "workerStates"):
        return json.loads(text)
    if name == "superseded":
        return {"true": True, "false": False}[text]
    if name == "durationS":
        return float(text)
    if name == "line":
        return int(text)
    return text


def _frame_value(name, v):
    if v is None or v is getattr(__import__("pandas"), "NA") or (isinstance(v, float) and v != v):
        return None
    if name in ("startedAt", "endedAt", "at"):
        return ms(v)
    if name in ("accomplished", "issues", "next", "workerAgents", "workerStates"):
        return list(v)
    if name == "summary" and v == "":
        return None  # CSV has no null: an empty summary reads back as an empty cell
    return v.item() if hasattr(v, "item") else v


@pytest.mark.parametrize("table", ["records", "issues"])
def test_csv_reads_back_equal_to_the_frames(stores, tmp_path, table):
    out = tmp_path / f"{table}.csv"
    export_csv(stores, out, table=table)
    with open(out, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    columns = RECORD_COLUMNS if table == "records" else EVENT_COLUMNS
    assert list(rows[0]) == list(columns)
    got = [{c: _csv_value(c, r[c]) for c in columns} for r in rows]
    want = []
    for store in stores:
        df = records_frame(store) if table == "records" else issue_events_frame(store)
        for rec in df.to_dict("records"):
            want.append({"project": store.slug, **{c: _frame_value(c, rec[c]) for c in columns if c != "project"}})
    assert got == want


def test_csv_quotes_newlines_and_commas(fixture_copy, tmp_path):
    store = store_of(fixture_copy)
    add_record(store, "multi-line", summary='Line one, with a comma\nline two "quoted"')
    buf = io.StringIO()
    export_csv(store, buf)
    rows = list(csv.DictReader(io.StringIO(buf.getvalue())))
    assert rows[-1]["summary"] == 'Line one, with a comma\nline two "quoted"'


# --- Parquet -------------------------------------------------------------------------------


def _frame_table(stores, machine):
    """What the dataset should hold: each store's frame as the records schema, with partitions."""
    parts = []
    for store in stores:
        df = records_frame(store)
        t = pa.Table.from_pandas(df[[f.name for f in RECORDS_SCHEMA]], schema=RECORDS_SCHEMA, preserve_index=False)
        months = pc.strftime(t.column("endedAt"), format="%Y-%m")
        t = t.append_column("machine", pa.array([machine] * t.num_rows, pa.string()))
        t = t.append_column("project", pa.array([store.slug] * t.num_rows, pa.string()))
        parts.append(t.append_column("month", months))
    return pa.concat_tables(parts).replace_schema_metadata(None)


def _sorted(table, keys=("machine", "project", "runId")):
    return table.replace_schema_metadata(None).sort_by([(k, "ascending") for k in keys])


def test_parquet_layout_and_schema(stores, tmp_path):
    out = tmp_path / "fleet"
    summary = export_parquet(stores, out, machine="laptop")
    rec, iss = summary.tables
    assert (rec.rows, rec.new, iss.rows, iss.new) == (68, 68, 33, 33)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.parquet"))
    assert len(files) == 6
    assert all(f.split("/")[1] == "machine=laptop" and f.split("/")[3] == "month=2026-10" for f in files)
    assert {f.split("/")[2] for f in files} == {f"project={s}" for s in SLUGS}
    one = pq.read_schema(out / files[-1])  # records/... sorts after issues/...
    assert one.remove_metadata() == RECORDS_SCHEMA.remove_metadata()
    assert one.metadata[b"cybmem.schema_version"] == b"1"
    assert one.field("endedAt").type == pa.timestamp("ms", tz="UTC")
    assert one.field("accomplished").type == pa.list_(pa.string())
    assert not [p for p in out.rglob("*") if p.name.startswith(".tmp-")], "no temp files left"


def test_parquet_reads_back_equal_to_the_frame_with_pyarrow_dataset(stores, tmp_path):
    export_parquet(stores, tmp_path / "fleet", machine="laptop")
    got = read_dataset(tmp_path / "fleet").to_table()
    assert _sorted(got).equals(_sorted(_frame_table(stores, "laptop")))
    events = read_dataset(tmp_path / "fleet", "issues").to_table()
    assert events.num_rows == 33
    web = events.filter(pc.equal(events.column("project"), "web")).sort_by("line")
    frame = pa.Table.from_pandas(issue_events_frame(store_of(stores[0].root)), schema=ISSUES_SCHEMA, preserve_index=False)
    assert web.select([f.name for f in ISSUES_SCHEMA]).replace_schema_metadata(None).equals(frame.replace_schema_metadata(None))


def test_parquet_plain_hive_discovery_reads_the_same(stores, tmp_path):
    import pyarrow.dataset as ds

    export_parquet(stores, tmp_path / "fleet", machine="laptop")
    t = ds.dataset(tmp_path / "fleet" / "records", format="parquet", partitioning="hive").to_table()
    assert t.num_rows == 68 and set(t.column("project").to_pylist()) == set(SLUGS)


def test_parquet_reads_back_equal_to_the_frame_with_duckdb(stores, tmp_path):
    import duckdb
    export_parquet(stores, tmp_path / "fleet", machine="laptop")
    con = duckdb.connect()
    glob = (tmp_path / "fleet" / "records" / "**" / "*.parquet").as_posix()
    got = pa.table(con.sql(f"SELECT * FROM read_parquet('{glob}', hive_partitioning=true) ORDER BY machine, project, runId"))
    want = _sorted(_frame_table(stores, "laptop"))
    assert sorted(got.column_names) == sorted(want.column_names)  # DuckDB puts the hive columns in its own order
    for name in want.column_names:
        a, b = got.column(name), want.column(name)
        if pa.types.is_timestamp(b.type):
            # DuckDB reads timestamps back in microseconds: compare the instants
            a, b = (x.cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64()) for x in (a, b))
        assert a.to_pylist() == b.to_pylist(), name
    types = dict(con.execute(f"DESCRIBE SELECT * FROM read_parquet('{glob}', hive_partitioning=true)").fetchall()[i][:2]
                 for i in range(len(want.column_names)))
    assert types["endedAt"] == "TIMESTAMP WITH TIME ZONE" and types["accomplished"] == "VARCHAR[]"
    assert types["month"] == "VARCHAR" and types["project"] == "VARCHAR"
    issues_glob = (tmp_path / "fleet" / "issues" / "**" / "*.parquet").as_posix()
    assert con.execute(f"SELECT count(*) FROM read_parquet('{issues_glob}', hive_partitioning=true) "
                       "WHERE project = 'web'").fetchone()[0] == 19


def test_parquet_is_incremental_and_never_rewrites(fixture_copy, tmp_path):
    store = store_of(fixture_copy)
    out = tmp_path / "fleet"
    first = export_parquet(store, out, machine="laptop")
    assert [(t.new, len(t.files)) for t in first.tables] == [(47, 1), (19, 1)]
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.rglob("*.parquet")}

    add_record(store, "new-run", issues=["zeppelin-drift"])
    store.append_issue_events([IssueEvent(issueId="zeppelin-drift", at=T_NEW, event="opened", byRunId="new-run",
                                          title="Zeppelin drift")])
    second = export_parquet(store, out, machine="laptop")
    assert [(t.rows, t.new, len(t.files)) for t in second.tables] == [(48, 1, 1), (20, 1, 1)]
    assert all("month=2026-11" in f for t in second.tables for f in t.files)
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in before} == before, "old files untouched"
    assert pq.read_table(second.tables[0].files[0]).column("runId").to_pylist() == ["new-run"]

    third = export_parquet(store, out, machine="laptop")
    assert [(t.new, t.files) for t in third.tables] == [(0, []), (0, [])]
    assert len(list(out.rglob("*.parquet"))) == 4
    assert read_dataset(out).to_table().num_rows == 48
    assert read_dataset(out, "issues").to_table().num_rows == 20


def test_parquet_new_event_in_an_old_month_gets_its_own_file(fixture_copy, tmp_path):
    store = store_of(fixture_copy)
    out = tmp_path / "fleet"
    export_parquet(store, out, machine="m", tables=["issues"])
    store.append_issue_events([IssueEvent(issueId="late-one", at=1_791_000_000_000, event="opened", title="Late")])
    summary = export_parquet(store, out, machine="m", tables=["issues"])
    assert summary.tables[0].new == 1 and "month=2026-10" in summary.tables[0].files[0]
    assert len(list((out / "issues").rglob("*.parquet"))) == 2
    assert not (out / "records").exists()


def test_two_machines_side_by_side_read_as_one_table(fixture_copy, tmp_path):
    out = tmp_path / "fleet"
    export_parquet(store_of(fixture_copy, "web"), out, machine="laptop")
    export_parquet(all_stores(fixture_copy), out, machine="ci-runner.1")
    t = read_dataset(out).to_table()
    g = t.group_by(["machine", "project"]).aggregate([("runId", "count")])
    counts = {(m, p): n for m, p, n in zip(*(g.column(c).to_pylist() for c in ("machine", "project", "runId_count")))}
    assert counts == {("laptop", "web"): 47, ("ci-runner.1", "api"): 15, ("ci-runner.1", "web"): 47,
                      ("ci-runner.1", "web-7663e1"): 6}
    import duckdb
    glob = (out / "records" / "**" / "*.parquet").as_posix()
    rows = duckdb.connect().execute(f"SELECT machine, count(*), count(DISTINCT runId) FROM read_parquet('{glob}', "
                                    "hive_partitioning=true) GROUP BY machine ORDER BY machine").fetchall()
    assert rows == [("ci-runner.1", 68, 68), ("laptop", 47, 47)]


def test_a_half_written_file_is_invisible_to_readers(fixture_copy, tmp_path):
    out = tmp_path / "fleet"
    export_parquet(store_of(fixture_copy), out, machine="m")
    month = next((out / "records").rglob("month=*"))
    (month / ".part-abc.parquet.tmp").write_bytes(b"PAR1 half a file")  # a concurrent writer, mid-write
    assert read_dataset(out).to_table().num_rows == 47
    import duckdb
    glob = (out / "records" / "**" / "*.parquet").as_posix()
    assert duckdb.connect().execute(f"SELECT count(*) FROM read_parquet('{glob}', hive_partitioning=true)").fetchone()[0] == 47
    assert export_parquet(store_of(fixture_copy), out, machine="m").tables[0].new == 0


def test_a_replaced_ledger_is_refused(fixture_copy, tmp_path):
    store = store_of(fixture_copy)
    export_parquet(store, tmp_path / "fleet", machine="m")
    lines = store.issues_path.read_text().splitlines(keepends=True)
    store.issues_path.write_text("".join(lines[:3]))
    with pytest.raises(StoreError, match="the ledger was replaced"):
        export_parquet(store, tmp_path / "fleet", machine="m")


def test_an_odd_slug_round_trips_through_the_partition_path(tmp_path):
    store = MemoryStore(tmp_path / "root", "my web=2024%")
    add_record(store, "r1")
    export_parquet(store, tmp_path / "fleet", machine="m")
    assert (tmp_path / "fleet" / "records" / "machine=m" / "project=my%20web%3D2024%25").is_dir()
    assert read_dataset(tmp_path / "fleet").to_table().column("project").to_pylist() == ["my web=2024%"]


def test_numeric_looking_partitions_stay_strings(tmp_path):
    store = MemoryStore(tmp_path / "root", "2024")
    add_record(store, "r1")
    export_parquet(store, tmp_path / "fleet", machine="01")
    t = read_dataset(tmp_path / "fleet").to_table()
    assert t.schema.field("project").type == pa.string() and t.column("machine").to_pylist() == ["01"]


@pytest.mark.parametrize("name", ["../x", ".hidden", "a/b", "", "x" * 65, "a b", "machine=1"])
def test_machine_must_be_one_safe_segment(name):
    with pytest.raises(ValidationError, match="one safe path segment"):
        validate_machine(name)


def test_default_machine_is_a_valid_segment():
    assert validate_machine(default_machine()) == default_machine()


# --- SQLite --------------------------------------------------------------------------------


def _db_rows(path, table, order):
    con = sqlite3.connect(path)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute(f"SELECT * FROM [{table}] ORDER BY {order}")]
    finally:
        con.close()


def _want_record_rows(stores):
    out = []
    for store in stores:
        for rec in records_frame(store).to_dict("records"):
            row = {"project": store.slug}
            for c in RECORD_COLUMNS[1:]:
                v = _frame_value(c, rec[c]) if c != "summary" else rec[c]
                if c in ("startedAt", "endedAt"):
                    v = datetime.fromtimestamp(v / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + f"{v % 1000:03d}Z"
                elif c in ("accomplished", "issues", "next", "workerAgents", "workerStates"):
                    v = json.dumps(v, ensure_ascii=False)
                elif c == "superseded":
                    v = int(v)
                row[c] = v
            out.append(row)
    return sorted(out, key=lambda r: r["runId"])


def test_sqlite_rows_equal_the_frames(stores, tmp_path):
    db = tmp_path / "memory.db"
    summary = export_sqlite(stores, db)
    assert [(t.table, t.rows, t.new) for t in summary.tables] == [("records", 68, 68), ("issue_events", 33, 33), ("issues", 18, 18)]
    got = _db_rows(db, "records", "runId")
    assert list(got[0]) == ["runId", "project"] + list(RECORD_COLUMNS[2:])
    assert [{k: r[k] for k in RECORD_COLUMNS} for r in got] == _want_record_rows(stores)
    events = _db_rows(db, "issue_events", "project, line")
    assert [(e["project"], e["line"], e["issueId"], e["event"]) for e in events] == [
        (s.slug, int(r["line"]), r["issueId"], r["event"]) for s in stores for r in issue_events_frame(s).to_dict("records")]
    issues = _db_rows(db, "issues", "project, issueId")
    want = []
    for s in stores:
        fold = issue_fold(issue_events_frame(s))
        want += [(s.slug, r["issueId"], r["state"], r["openedBy"], int(r["reopenCount"])) for r in fold.to_dict("records")]
    assert [(i["project"], i["issueId"], i["state"], i["openedBy"], i["reopenCount"]) for i in issues] == sorted(want)


def test_sqlite_full_text_search_finds_a_run_by_a_word_of_its_summary(stores, tmp_path):
    db = tmp_path / "memory.db"
    export_sqlite(stores, db)
    con = sqlite3.connect(db)
    hits = con.execute("SELECT runId FROM records WHERE rowid IN (SELECT rowid FROM records_fts WHERE records_fts MATCH ?)",
                       ("transitionend",)).fetchall()
    assert hits == [("9b6b1e00-90b4-579e-9d84-2170f292abf9",)]  # "waiting for the transitionend event fixed it"
    con.execute("INSERT INTO records_fts(records_fts) VALUES('integrity-check')")
    con.close()


def test_sqlite_utils_and_datasette_conventions(stores, tmp_path):
    import sqlite_utils
    db_path = tmp_path / "memory.db"
    export_sqlite(stores, db_path)
    db = sqlite_utils.Database(db_path)
    assert db["records"].detect_fts() == "records_fts"
    assert db["records"].pks == ["runId"] and db["issue_events"].pks == ["project", "line"]
    assert db["issues"].pks == ["project", "issueId"]
    assert {t.name for t in db["records"].triggers} == {"records_ai", "records_ad", "records_au"}
    hits = list(db["records"].search("hydration", columns=["runId"]))
    assert hits and hits[0]["runId"].startswith("d4f2f94c")
    assert {fk.column for fk in db["records"].foreign_keys} == {"parentRunId", "previousRunId"}


def test_sqlite_reexport_updates_without_duplicates(fixture_copy, tmp_path):
    db = tmp_path / "memory.db"
    store = store_of(fixture_copy)
    export_sqlite(store, db)
    again = export_sqlite(store, db)
    assert [(t.new, t.updated) for t in again.tables] == [(0, 0), (0, 0), (0, 0)]

    add_record(store, "fix-run", summary="Corrected the zeppelin numbers.", supersedes="ed2a7f4d-" + _tail(store, "ed2a7f4d"))
    store.append_issue_events([IssueEvent(issueId="zeppelin-drift", at=T_NEW, event="opened", byRunId="fix-run", title="Z")])
    third = export_sqlite(store, db)
    assert [(t.table, t.rows, t.new, t.updated) for t in third.tables] == [
        ("records", 48, 1, 1), ("issue_events", 20, 1, 0), ("issues", 11, 1, 0)]
    con = sqlite3.connect(db)
    assert con.execute("SELECT count(*), count(DISTINCT runId) FROM records").fetchone() == (48, 48)
    assert con.execute("SELECT superseded FROM records WHERE runId LIKE 'ed2a7f4d%'").fetchone() == (1,)
    assert con.execute("SELECT runId FROM records WHERE rowid IN (SELECT rowid FROM records_fts "
                       "WHERE records_fts MATCH 'zeppelin')").fetchall() == [("fix-run",)]
    con.execute("INSERT INTO records_fts(records_fts) VALUES('integrity-check')")  # the index followed the update
    con.close()


def _tail(store, prefix):
    return store.resolve_run_id(prefix).split("-", 1)[1]


def test_sqlite_keeps_other_projects_rows(fixture_copy, tmp_path):
    db = tmp_path / "memory.db"
    export_sqlite(all_stores(fixture_copy), db)
    export_sqlite(store_of(fixture_copy, "api"), db)
    con = sqlite3.connect(db)
    assert con.execute("SELECT project, count(*) FROM records GROUP BY project ORDER BY project").fetchall() == [
        ("api", 15), ("web", 47), ("web-7663e1", 6)]


def test_sqlite_refuses_a_foreign_database(tmp_path, fixture_copy):
    db = tmp_path / "other.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE records (id INTEGER PRIMARY KEY, name TEXT)")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="not written by this version"):
        export_sqlite(store_of(fixture_copy), db)


# --- the CLI -------------------------------------------------------------------------------


def test_cli_parquet_text_and_json(fixture_copy, tmp_path):
    out = tmp_path / "fleet"
    res = cli("export", "parquet", "--memory-dir", fixture_copy, "--all", "--out", out, "--machine", "laptop")
    assert res.exit_code == 0, res.output
    assert res.stdout == (f"Wrote 68 new records (3 files; 0 already there) and 33 new issue events (3 files; "
                          f"0 already there) to {out} as machine laptop.\n")
    res = cli("export", "parquet", "--memory-dir", fixture_copy, "-p", "web", "--out", out, "--machine", "laptop", "--json")
    data = json.loads(res.stdout)
    assert data["machine"] == "laptop" and data["projects"] == ["web"]
    assert [(t["table"], t["rows"], t["new"], t["files"]) for t in data["tables"]] == [("records", 47, 0, []), ("issues", 19, 0, [])]


def test_cli_sqlite_and_csv(fixture_copy, tmp_path):
    res = cli("export", "sqlite", "--memory-dir", fixture_copy, "--all", "--out", tmp_path / "m.db")
    assert res.exit_code == 0, res.output
    assert res.stdout == (f"Wrote {tmp_path / 'm.db'}: records 68 (68 new, 0 updated), issue_events 33 (33 new, 0 updated), "
                          "issues 18 (18 new); full-text search on task and summary (records_fts).\n")
    res = cli("export", "csv", "--memory-dir", fixture_copy, "-p", "api", "--table", "issues")
    assert res.exit_code == 0 and res.stdout.splitlines()[0] == ",".join(EVENT_COLUMNS)
    assert len(res.stdout.splitlines()) == 10


def test_the_shared_options_may_come_before_the_format(fixture_copy, tmp_path):
    """`cybmem export --memory-dir DIR csv ...`, as when export was one command: the options reach
    the format's sub-command, and a word that is no format is named as such."""
    res = cli("export", "--memory-dir", fixture_copy, "-p", "api", "csv", "--table", "issues")
    assert res.exit_code == 0, res.output
    assert res.stdout == cli("export", "csv", "--memory-dir", fixture_copy, "-p", "api", "--table", "issues").stdout
    res = cli("export", "--memory-dir", fixture_copy, "--all", "sqlite", "--out", tmp_path / "m.db")
    assert res.exit_code == 0 and (tmp_path / "m.db").is_file(), res.output
    res = cli("export", "--memory-dir", fixture_copy, "xml")
    assert res.exit_code == 2 and "'xml' is not one of ndjson, csv, parquet, sqlite, prov" in res.stderr


@pytest.mark.parametrize("args, hint", [
    (["xml"], "FORMAT"),
    (["parquet"], "--out"),
    (["sqlite"], "--out"),
    (["ndjson", "--table", "runs"], "--table"),
    (["ndjson", "--json"], "--json"),
    (["csv", "--machine", "m"], "--machine"),
    (["ndjson", "--provn"], "--provn"),
    (["parquet", "--out", "x", "--machine", "../etc"], "--machine"),
    (["prov", "--out", "x", "--chain", "r", "--all"], "--chain"),
    (["prov", "--out", "x", "--table", "records"], "--table"),
    (["ndjson", "--all", "-p", "web"], "--all"),
])
def test_cli_usage_errors_exit_2(fixture_copy, args, hint):
    res = cli("export", *args, "--memory-dir", fixture_copy)
    assert res.exit_code == 2, res.output
    assert hint in res.stderr


def test_cli_errors_exit_1(fixture_copy, tmp_path):
    res = cli("export", "csv", "--memory-dir", fixture_copy, "-p", "nope")
    assert res.exit_code == 1 and res.stderr.startswith("Error: no project 'nope'")
    res = cli("export", "csv", "--memory-dir", fixture_copy, "-p", "web", "--out", tmp_path / "missing" / "x.csv")
    assert res.exit_code == 1 and "does not exist" in res.stderr
    res = cli("export", "csv", "--memory-dir", tmp_path / "empty", "--all")
    assert res.exit_code == 1 and res.stderr.startswith("Error: no projects under")


def test_cli_progress_bar_on_request(fixture_copy, tmp_path):
    res = cli("export", "csv", "--memory-dir", fixture_copy, "-p", "web", "--out", tmp_path / "w.csv", "--progress")
    assert res.exit_code == 0 and "csv web [" in res.stderr and "47/47" in res.stderr
    res = cli("export", "csv", "--memory-dir", fixture_copy, "-p", "web", "--out", tmp_path / "w.csv", "--force")
    assert res.stderr == ""


def test_console_script_streams_ndjson_to_a_pipe(fixture_copy):
    env = {**os.environ, "CYBERINE_MEMORY_DIR": str(fixture_copy)}
    proc = subprocess.run([sys.executable, "-m", "cybmem.cli", "export", "ndjson", "--all", "--table", "issues"],
                          env=env, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode("utf-8").splitlines()
    assert len(lines) == 33 and json.loads(lines[0])["project"] == "api"


def test_every_parquet_read_of_the_package_goes_through_read_part():
    """CI run of stop 33: an exporter that read the parts its peer had written aborted at exit
    ("terminate called without an active exception"): Arrow's thread pools decoding through a
    Python file handle (apache/arrow#34314, #50482). read_part decodes in the calling thread from
    a memory map (benchmarks/exit_aborts.py measures both ways); no other reader may come back."""
    import ast

    import cybmem

    readers = {"read_table", "ParquetFile", "make_fragment", "read_pandas", "ParquetDataset", "read_parquet"}
    pkg = Path(cybmem.__file__).parent
    found = []
    for path in sorted(pkg.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.name == "read_part":
                continue
            for node in ast.walk(fn):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                owner = node.func.value.id if isinstance(node.func.value, ast.Name) else "?"
                # the store's cache reads Arrow IPC files (store.cache.read_table), not Parquet
                if node.func.attr in readers and not (node.func.attr == "read_table" and owner not in ("pq", "parquet")):
                    found.append(f"{path.relative_to(pkg)}:{node.lineno}: {owner}.{node.func.attr}")
    assert not found, found


def test_read_part_reads_a_part_and_fills_what_an_older_file_lacks(tmp_path):
    from cybmem.exchange.parquet_dataset import RECORDS_SCHEMA, read_part

    old = pa.table({"runId": ["r1", "r2"]})
    pq.write_table(old, tmp_path / "old.parquet")
    assert read_part(tmp_path / "old.parquet").to_pylist() == [{"runId": "r1"}, {"runId": "r2"}]
    t = read_part(tmp_path / "old.parquet", schema=RECORDS_SCHEMA, columns=["runId", "task"])
    assert t.schema.field("task").type == RECORDS_SCHEMA.field("task").type
    assert t.to_pylist() == [{"runId": "r1", "task": None}, {"runId": "r2", "task": None}]
    (tmp_path / "empty.parquet").write_bytes(b"")
    with pytest.raises(pa.ArrowException):
        read_part(tmp_path / "empty.parquet")
    os.mkfifo(tmp_path / "fifo.parquet")
    with pytest.raises(StoreError, match="not a regular file"):
        read_part(tmp_path / "fifo.parquet")


def test_concurrent_exporters_of_one_machine_write_each_row_once(fixture_copy, tmp_path):
    env = {**os.environ, "CYBERINE_MEMORY_DIR": str(fixture_copy)}
    cmd = [sys.executable, "-m", "cybmem.cli", "export", "parquet", "--all", "--out", str(tmp_path / "fleet"),
           "--machine", "m", "--json"]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [r[1] for r in results]
    new = sorted(json.loads(out)["tables"][0]["new"] for out, _ in results)
    assert new == [0, 0, 68], "one exporter wrote everything, the others found it there"
    t = read_dataset(tmp_path / "fleet").to_table()
    assert t.num_rows == 68 == len(set(t.column("runId").to_pylist()))
