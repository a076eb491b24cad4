"""`cybmem doctor`: what it finds, what --repair fixes (derived files only), --secrets, --json."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cybmem.cli.app import app
from cybmem.operations.doctor import doctor
from cybmem.store.records import IssueEvent
from cybmem.settings import Settings
from cybmem.store.memory_store import MemoryStore

from conftest import MIN, T0, make_run, write_json

runner = CliRunner()
TRAILER = "Done.\n\nACCOMPLISHED:\n- fixed it\nISSUES:\n- Flaky login test: fails one run in ten\nNEXT:\n- none\n"
AWS = "AKIAIOSFODNN7EXAMPLE"
GITHUB = "ghp_" + "a1B2c3D4e5F6g7H8i9J0" * 2


def doc(*args):
    return runner.invoke(app, ["doctor", *map(str, args)])


@pytest.fixture
def store(memory_root, settings) -> MemoryStore:
    from cybmem.operations.write import write_run

    for i, rid in enumerate(["r1", "r2", "r3"]):
        write_run(make_run(rid, f"Fix the login form, part {i}", start=T0 + i * 60 * MIN, output=TRAILER if i == 1 else None), settings)
    return MemoryStore(memory_root, "web")


def _content(root: Path) -> dict[str, bytes]:
    """Records, ledgers and embeddings: what --repair must never touch."""
    files = list(root.glob("*/records/*.json")) + list(root.glob("*/issues.jsonl")) + list(root.glob("*/embeddings.jsonl"))
    return {str(p): p.read_bytes() for p in files}


def _findings(res) -> list[tuple[str, str, str]]:
    return [(f["check"], f["severity"], Path(f["path"]).name) for f in json.loads(res.stdout)["findings"]]


def test_a_clean_store_is_clean(store, memory_root):
    res = doc("--cwd", "/home/dev/web")
    assert res.exit_code == 0, res.output
    assert res.stdout == (
        f"Memory root: {memory_root}\n"
        "projects.json: ok\n"
        "web: 3 records, 1 ledger events: ok\n"
        "clean: 1 project(s), 3 records checked.\n"
    )


def test_the_fixture_store_is_clean(fixture_copy):
    res = doc("--all", "--memory-dir", fixture_copy, "--secrets")
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[-1] == "clean: 3 project(s), 68 records checked."


def test_json_report(store):
    res = doc("--all", "--json")
    data = json.loads(res.stdout)
    assert data["clean"] is True and data["counts"] == {"error": 0, "repairable": 0, "warning": 0}
    assert data["projects"] == [{"slug": "web", "records": 3, "unreadable": 0, "events": 1, "embeddings": 0}]


def test_bad_records_are_errors_that_repair_leaves_alone(store):
    (store.records_dir / "bad.json").write_text('{"runId": "bad", ')
    (store.records_dir / "other.json").write_text((store.records_dir / "r1.json").read_text())  # runId r1 in other.json
    (store.records_dir / "notes.txt").write_text("hi")
    before = _content(store.root)
    res = doc("--all", "--json", "--repair")
    assert res.exit_code == 1
    found = _findings(res)
    assert ("records", "error", "bad.json") in found and ("records", "error", "other.json") in found
    assert ("records", "warning", "notes.txt") in found
    messages = {Path(f["path"]).name: f["message"] for f in json.loads(res.stdout)["findings"]}
    assert "does not match its file name" in messages["other.json"]
    assert _content(store.root) == before


def test_index_missing_stale_or_damaged_is_rebuilt(store):
    from cybmem.operations.write import write_run

    store.index_path.unlink()
    assert ("index", "repairable", "index.json") in _findings(doc("--all", "--json"))
    store.rebuild_index()
    # A writer killed between linking its record and updating the index:
    write_run(make_run("r4", "Later", start=T0 + 5 * 60 * MIN), Settings.from_env())
    data = json.loads(store.index_path.read_bytes())
    data["entries"] = [e for e in data["entries"] if e["runId"] != "r4"]
    data["count"] -= 1
    store.index_path.write_text(json.dumps(data))
    res = doc("--all", "--json")
    assert res.exit_code == 1
    (msg,) = [f["message"] for f in json.loads(res.stdout)["findings"] if f["check"] == "index"]
    assert msg == "index.json is stale: 1 record(s) missing from it"
    # Readers already see r4 (merged in memory); repair writes it down.
    assert "r4" in [e["runId"] for e in MemoryStore(store.root, "web").index_entries()]
    before = _content(store.root)
    res = doc("--all", "--repair")
    assert res.exit_code == 0, res.output
    assert f"repaired: rebuilt {store.index_path} from 4 records" in res.stdout
    assert _content(store.root) == before
    store.index_path.write_text("{not json")
    assert ("index", "repairable", "index.json") in _findings(doc("--all", "--json"))
    assert doc("--all", "--repair").exit_code == 0
    assert doc("--all").exit_code == 0


def test_ledger_torn_tail_is_a_warning_and_bad_lines_are_errors(store):
    with open(store.issues_path, "ab") as fh:
        fh.write(b'{"issueId": "x", "at": 1, "event": "opened", "byRunId": "r1"}\n')
        fh.write(b'{"issueId": "x", "at": 2, "event": "opened", "byRunId": "r2"}\n')  # opened while open
        fh.write(b'{"issueId": "torn", "at": 1, "ev')
    res = doc("--all", "--json")
    assert res.exit_code == 0, "warnings alone leave a store clean"
    found = _findings(res)
    assert found == [("ledger", "warning", "issues.jsonl:3"), ("ledger", "warning", "issues.jsonl:4")]  # dup "opened", torn
    text = doc("--all").stdout
    assert "torn last line (no newline: a writer was interrupted)" in text
    with open(store.issues_path, "ab") as fh:
        fh.write(b'\n{"issueId": "y", "at": 1, "event": "exploded"}\n')
    res = doc("--all", "--json", "--repair")
    assert res.exit_code == 1
    assert ("ledger", "error", "issues.jsonl:5") in _findings(res)
    assert ("ledger", "warning", "issues.jsonl:4") in _findings(res), "a torn line closed by a later append stays a warning"


def test_repeated_ledger_events_are_reported_as_harmless_warnings(store):
    """An event that does not change its issue's state (two writers at once in an older cybmem, or
    another tool that ignores the lock): opened or reopened while open, resolved while resolved,
    wontfix while wontfix. Each is a warning that says so; the store stays clean."""
    lines = [("x", "opened"), ("x", "reopened"), ("x", "resolved"), ("x", "resolved"), ("x", "wontfix"),
             ("x", "wontfix"), ("x", "opened"), ("x", "reopened"), ("y", "opened"), ("y", "opened")]
    first = len(store.issues_path.read_bytes().splitlines()) + 1
    with open(store.issues_path, "ab") as fh:
        for n, (iid, event) in enumerate(lines):
            fh.write(json.dumps({"issueId": iid, "at": T0 + n, "event": event}).encode() + b"\n")
    res = doc("--all", "--json")
    assert res.exit_code == 0, "repeated events are harmless: warnings alone"
    repeated = [f for f in json.loads(res.stdout)["findings"] if "again while" in f["message"]]
    assert [int(f["path"].rsplit(":", 1)[1]) - first for f in repeated] == [1, 3, 5, 7, 9]
    text = doc("--all").stdout
    assert (f"issues.jsonl:{first + 1}: issue x reopened again while open (so since line {first}): a repeated event, "
            "from writers at once before cybmem checked the state under the lock, or one that ignored it; harmless, the "
            "issue's state is unchanged; reopenCount counts it once more") in text
    assert f"issues.jsonl:{first + 3}: issue x resolved again while resolved (so since line {first + 2})" in text
    assert f"issues.jsonl:{first + 5}: issue x wontfix again while wontfix (so since line {first + 4})" in text
    assert f"issues.jsonl:{first + 9}: issue y opened again while open (so since line {first + 8})" in text
    # The writers themselves never append one.
    assert store.mark_issue("x", "reopened") == [] and store.mark_issue("y", "reopened") == []
    assert store.append_issue_events([IssueEvent(issueId="x", at=T0, event="opened")]) == []


def test_temp_leftovers_old_ones_are_removed_young_ones_kept(store):
    old = store.records_dir / ".tmp-old.part"
    young = store.dir / ".tmp-young.part"
    weights_tmp = store.dir / ".weights.json.abc.tmp"
    for p in (old, young, weights_tmp):
        p.write_text("half")
    past = time.time() - 3600
    os.utime(old, (past, past))
    os.utime(weights_tmp, (past, past))
    res = doc("--all", "--json")
    assert res.exit_code == 1
    found = _findings(res)
    assert ("temp", "repairable", ".tmp-old.part") in found and ("temp", "warning", ".tmp-young.part") in found
    assert ("temp", "repairable", ".weights.json.abc.tmp") in found
    res = doc("--all", "--repair")
    assert res.exit_code == 0, res.output
    assert not old.exists() and not weights_tmp.exists() and young.exists()
    assert doc("--all", "--repair", "--temp-age", "0").exit_code == 0
    assert not young.exists()


def _doctor_under_file_limit(kib: int, memory_root: Path, *args: str) -> subprocess.CompletedProcess:
    """A real `cybmem doctor` under `ulimit -f` (no file it writes may grow past ``kib`` KiB)."""
    exe = shutil.which("cybmem")
    env = {**os.environ, "CYBERINE_MEMORY_DIR": str(memory_root)}
    return subprocess.run(["sh", "-c", f'ulimit -f {kib}; exec "$@"', "sh", exe, "doctor", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_repair_that_cannot_write_says_so_and_is_not_reported_done(store, settings, memory_root):
    """Under a file-size limit the cache cannot be rebuilt: doctor says which repair failed and
    why, never "rebuilt" beside the damage it found again, and exits 1; the repairs that could be
    done are done."""
    from cybmem.operations.write import write_run
    from cybmem.store.snapshot import load_snapshot

    write_run(make_run("big", "Fix the big one " + "word " * 40_000, start=T0 + 5 * 60 * MIN), settings)
    load_snapshot(MemoryStore(memory_root, "web"))  # a cache, then damaged
    manifest = store.dir / ".cache" / "manifest.json"
    assert manifest.exists()
    manifest.write_text("garbage")
    store.index_path.unlink()
    res = _doctor_under_file_limit(64, memory_root, "--all", "--repair")
    cache = store.dir / ".cache"
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"repaired: rebuilt {store.index_path} from 4 records" in res.stdout
    assert f"rebuilt {cache}" not in res.stdout
    assert f"not repaired: rebuilding {cache}: File too large" in res.stdout, res.stdout
    assert res.stdout.rstrip().endswith("1 repair(s) failed (see above); 1 project(s), 4 records checked."), res.stdout
    assert res.stderr == ""
    report = json.loads(_doctor_under_file_limit(64, memory_root, "--all", "--repair", "--json").stdout)
    assert report["clean"] is False and [line.split(":")[0] for line in report["notRepaired"]] == [f"rebuilding {cache}"]
    # Below the size of index.json too: each repair is tried, each failure named, no traceback, no "Error:" halfway.
    store.index_path.unlink()
    res = _doctor_under_file_limit(1, memory_root, "--all", "--repair")
    assert res.returncode == 1 and res.stderr == "", res.stderr
    assert f"not repaired: rebuilding {store.index_path}: cannot write {store.index_path}: File too large" in res.stdout
    assert "repaired: rebuilt" not in res.stdout
    assert doc("--all", "--repair").exit_code == 0, "without the limit the same repair is done"


def test_cache_behind_is_a_warning_damaged_is_repaired(store, settings):
    from cybmem.store.snapshot import load_snapshot
    from cybmem.operations.write import write_run

    load_snapshot(store)
    assert doc("--all").exit_code == 0
    write_run(make_run("r9", "New one", start=T0 + 9 * 60 * MIN), settings)
    res = doc("--all", "--json")
    assert res.exit_code == 0
    assert ("cache", "warning", ".cache") in _findings(res)
    (store.dir / ".cache" / "manifest.json").write_text("garbage")
    assert ("cache", "repairable", ".cache") in _findings(doc("--all", "--json"))
    res = doc("--all", "--repair")
    assert res.exit_code == 0 and "repaired: rebuilt" in res.stdout and ".cache" in res.stdout
    assert "cache" not in {f[0] for f in _findings(doc("--all", "--json"))}
    for seg in (store.dir / ".cache").glob("rec-*.arrow"):
        seg.write_bytes(seg.read_bytes()[:20])
    assert ("cache", "repairable", ".cache") in _findings(doc("--all", "--json"))
    assert doc("--all", "--repair").exit_code == 0
    for seg in (store.dir / ".cache").glob("rec-*.arrow"):  # readable Arrow, not the records: no traceback
        seg.write_bytes((store.dir / ".cache" / "events.arrow").read_bytes())
    res = doc("--all", "--json")
    assert ("cache", "repairable", ".cache") in _findings(res) and "Traceback" not in res.output
    assert doc("--all", "--repair").exit_code == 0
    cache = store.dir / ".cache"  # a keyword index of the issues over the records' one: rows fine, index not
    kw = json.loads((cache / "manifest.json").read_text())["segments"][0]["kw"]
    (cache / "copy").write_bytes((cache / "kwi.arrow").read_bytes())
    os.replace(cache / "copy", cache / kw)
    assert ("cache", "repairable", ".cache") in _findings(doc("--all", "--json"))
    assert doc("--all", "--repair").exit_code == 0 and "cache" not in {f[0] for f in _findings(doc("--all", "--json"))}
    assert doc("--all", "--repair").exit_code == 0
    assert set(load_snapshot(store).records.column("runId").to_pylist()) == {"r1", "r2", "r3", "r9"}


def test_projects_json_checks(store, memory_root):
    (memory_root / "orphan" / "records").mkdir(parents=True)
    (memory_root / "orphan" / "records" / "o1.json").write_text(json.dumps({"runId": "o1", "cwd": "/srv/orphan"}))
    found = _findings(doc("--all", "--json"))
    assert ("projects", "warning", "orphan") in found
    projects = json.loads((memory_root / "projects.json").read_text())
    projects["web-2"] = {"cwd": "/home/dev/web"}
    projects["../up"] = {"cwd": "/x"}
    (memory_root / "projects.json").write_text(json.dumps(projects))
    res = doc("--all", "--json", "--repair")
    assert res.exit_code == 1
    messages = [f["message"] for f in json.loads(res.stdout)["findings"] if f["check"] == "projects" and f["severity"] == "error"]
    assert any("has 2 slugs (web, web-2)" in m for m in messages)
    assert any("'../up' is not a safe directory name" in m for m in messages)
    (memory_root / "projects.json").write_text("{broken")
    res = doc("--all", "--json")
    assert res.exit_code == 1 and ("projects", "error", "projects.json") in _findings(res)


def test_embeddings_checks(store):
    lines = [
        '{"runId": "r1", "model": "m", "vector": [0.1, 0.2, 0.3]}',
        '{"runId": "r2", "model": "m", "vector": [0.1, 0.2, 0.3]}',  # replaced by line 5, of m's newest dimension
        '{"runId": "r3", "model": "other", "vector": [1.0]}',
        '{"runId": "r1", "model": "m", "vector": "nope"}',
        '{"runId": "r2", "model": "m", "vector": [0.5, 0.5]}',
        '{"runId": "r3", "model": "m", "vec',
    ]
    store.embeddings_path.write_text("\n".join(lines))
    res = doc("--all", "--json")
    assert res.exit_code == 1
    findings = [f for f in json.loads(res.stdout)["findings"] if f["check"] == "embeddings"]
    assert [(f["severity"], Path(f["path"]).name) for f in findings] == [
        ("error", "embeddings.jsonl:4"), ("warning", "embeddings.jsonl:6"), ("repairable", "embeddings.jsonl"),
        ("warning", "embeddings.jsonl")]
    assert findings[2]["message"] == ("1 run(s) have more than one vector of a model (1 line(s) replaced by a later one, "
                                      "first at line 2); search uses the last; `cybmem doctor --repair` keeps only it")
    assert findings[3]["message"] == ("model 'm' has vectors of 2 dimensions (1 runs, its newest) and of 3 (1 run); search "
                                      "compares only the newest with a query: `cybmem embed` gives the other runs one")
    assert json.loads(res.stdout)["projects"][0]["embeddings"] == 4
    before = _content(store.root)
    res = doc("--all", "--json", "--repair")
    assert res.exit_code == 1, "the unreadable line still needs a person"
    out = json.loads(res.stdout)
    assert f"dropped 1 replaced vector(s) from {store.embeddings_path}" in out["repaired"]
    assert [(f["severity"], Path(f["path"]).name) for f in out["findings"] if f["check"] == "embeddings"] == [
        ("error", "embeddings.jsonl:3"), ("warning", "embeddings.jsonl:5"), ("warning", "embeddings.jsonl")]
    assert store.embeddings_path.read_text() == "\n".join(lines[:1] + lines[2:]), "only the replaced line went, bytes kept"
    after = _content(store.root)
    assert {k: v for k, v in after.items() if not k.endswith("embeddings.jsonl")} == \
        {k: v for k, v in before.items() if not k.endswith("embeddings.jsonl")}, "records and ledgers never change"


def test_a_record_cached_just_after_it_was_written_is_not_called_edited(store, settings):
    """An inject within 2 s of a write caches the new record inside the cache's racy window (its
    mtime is within RACY_NS of its segment's); once a later read trusts the listing, doctor
    called it "edited in place" (exit 1) for as long as that segment stayed. Now such a row is
    read again and compared: only a real change is reported."""
    from cybmem.operations.write import write_run
    from cybmem.store.snapshot import load_snapshot

    load_snapshot(store)
    write_run(make_run("r4", "Fix the login form, part 4", start=T0 + 4 * 60 * MIN), settings)
    old = time.time_ns() - 10_000_000_000
    os.utime(store.records_dir, ns=(old, old))  # as after the 2 s a later read waits: the listing is trusted
    assert load_snapshot(store).n == 4  # the inject: r4 joins the cache a moment after it was written
    res = doc("--project", "web")
    assert res.exit_code == 0 and res.stdout.endswith("clean: 1 project(s), 4 records checked.\n"), res.output
    path = store.record_path("r4")  # a real edit in place, inside the same window: still found
    ino = path.stat().st_ino
    with open(path, "r+") as fh:
        text = fh.read()
        fh.seek(0)
        fh.write(text.replace("part 4", "part 5"))
    assert path.stat().st_ino == ino
    res = doc("--project", "web", "--json")
    assert res.exit_code == 1 and ("cache", "1 cached record(s) edited in place since they were cached (the cache "
                                   "still holds their old text)") in [(f["check"], f["message"]) for f in json.loads(res.stdout)["findings"]]


def test_selection(store, memory_root):
    res = doc("--cwd", "/somewhere/else")
    assert res.exit_code == 1 and "--all" in res.stderr and res.stderr.startswith("Error: no memory for project")
    assert doc("--project", "web").exit_code == 0
    res = doc("--project", "nope")
    assert res.exit_code == 1 and "known projects: web" in res.stderr
    res = doc("--memory-dir", memory_root / "missing", "--all")
    assert res.exit_code == 1 and "nothing has been written there yet" in res.stderr


# --- secrets ----------------------------------------------------------------------------------


def _secret_run(rid: str):
    out = f"Done.\n\nACCOMPLISHED:\n- rotated {GITHUB}\nISSUES:\n- Key leaked: found {AWS} in logs\nNEXT:\n- none\n"
    return make_run(rid, f"Deploy with AWS key {AWS} and postgres://admin:hunter2pass@db/prod", output=out)


def test_secrets_are_redacted_before_writing_through_the_cli(memory_root, tmp_path):
    path = write_json(tmp_path / "run.json", _secret_run("s1"))
    res = runner.invoke(app, ["write", str(path)])
    assert res.exit_code == 0, res.output
    assert "cybmem: redacted secrets before writing: aws_access_key_id, github_token, url_password" in res.stderr
    raw = (memory_root / "web" / "records" / "s1.json").read_text() + (memory_root / "web" / "issues.jsonl").read_text()
    assert AWS not in raw and GITHUB not in raw and "hunter2pass" not in raw
    assert "[REDACTED:aws_access_key_id]" in raw
    assert doc("--all", "--secrets").exit_code == 0


def test_redaction_off_then_doctor_secrets_reports_without_printing_or_rewriting(memory_root, tmp_path, monkeypatch):
    monkeypatch.setenv("CYBERINE_MEMORY_REDACT", "0")
    path = write_json(tmp_path / "run.json", _secret_run("s1"))
    res = runner.invoke(app, ["write", str(path)])
    assert res.exit_code == 0 and "redacted" not in res.stderr
    assert AWS in (memory_root / "web" / "records" / "s1.json").read_text()
    monkeypatch.delenv("CYBERINE_MEMORY_REDACT")
    before = _content(memory_root)
    assert doc("--all").exit_code == 0, "secrets are only looked for with --secrets"
    res = doc("--all", "--secrets", "--json")
    assert res.exit_code == 1
    found = {(Path(f["path"]).name, f["field"], f["kind"]) for f in json.loads(res.stdout)["findings"] if f["check"] == "secrets"}
    assert found == {
        ("s1.json", "task", "aws_access_key_id"),
        ("s1.json", "task", "url_password"),
        ("s1.json", "outcome.summary", "aws_access_key_id"),
        ("s1.json", "outcome.summary", "url_password"),
        ("s1.json", "outcome.accomplished[0]", "github_token"),
        ("issues.jsonl:1", "detail", "aws_access_key_id"),
        # the derived copies of the task head and summary (repairable: rebuilt from the record)
        ("index.json", "entries[0].task", "aws_access_key_id"),
        ("index.json", "entries[0].task", "url_password"),
        ("index.json", "entries[0].summary", "aws_access_key_id"),
        ("index.json", "entries[0].summary", "url_password"),
    }
    text = doc("--all", "--secrets", "--repair")
    assert text.exit_code == 1
    for out in (res.stdout, text.stdout, text.stderr):
        assert AWS not in out and GITHUB not in out and "hunter2pass" not in out
    assert "[task]: secret of kind aws_access_key_id stored here (value not shown)" in text.stdout
    assert _content(memory_root) == before, "doctor --secrets never rewrites anything"


def test_library_entry_point(store, settings):
    report = doctor(settings, all_projects=True)
    assert report.clean and [p.slug for p in report.projects] == ["web"]
    store.append_issue_events([IssueEvent(issueId="flaky-login-test", at=T0 + 1, event="resolved", byRunId="r3")])
    assert doctor(settings, project="web").clean
