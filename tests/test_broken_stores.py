"""Every verb against every kind of broken store: an `Error: ...` line or a warning, never a
traceback; inject still gives the task back (exit 0) unless --strict."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cybmem.cli.app import app

from conftest import FIXTURES, LEFTOVERS, make_run, write_json

runner = CliRunner()


def _root_is_file(root: Path) -> Path:
    shutil.rmtree(root)
    root.write_text("not a directory")
    return root


def _index_is_dir(root: Path) -> Path:
    (root / "web" / "index.json").unlink()
    (root / "web" / "index.json").mkdir()
    return root


def _ledger_is_dir(root: Path) -> Path:
    (root / "web" / "issues.jsonl").unlink()
    (root / "web" / "issues.jsonl").mkdir()
    return root


def _records_unreadable(root: Path) -> Path:
    records = root / "web" / "records"
    if os.geteuid() == 0:  # permissions do not stop root: a file in its place does
        shutil.rmtree(records)
        records.write_text("not a directory")
    else:
        records.chmod(0)
    return root


def _weights_is_dir(root: Path) -> Path:
    (root / "web" / "weights.json").mkdir()
    return root


BROKEN = {
    "root-is-a-file": _root_is_file,
    "index-json-is-a-directory": _index_is_dir,
    "issues-jsonl-is-a-directory": _ledger_is_dir,
    "records-unreadable": _records_unreadable,
    "weights-json-is-a-directory": _weights_is_dir,
}


def _verbs(tmp: Path) -> dict[str, list[str]]:
    run = write_json(tmp / "run.json", make_run("broken-new", "Fix the logout button", cwd="/home/dev/web"))
    judgments = tmp / "judgments.jsonl"
    judgments.write_text(json.dumps({"query": "cart", "asOf": 1_800_000_000_000, "relevant": ["x"]}) + "\n")
    web = ["--project", "web"]
    return {
        "list": ["list", *web],
        "list-json": ["list", *web, "--json"],
        "show": ["show", "9b6b", *web],
        "issues": ["issues", *web],
        "issues-events": ["issues", "--all", *web],
        "chain": ["chain", "9b6b", *web],
        "projects": ["projects"],
        "rebuild": ["rebuild", *web],
        "write": ["write", str(run), "--cwd", "/home/dev/web"],
        "supersede": ["supersede", "9b6b", str(run), "--run-id", "broken-fix", *web],
        "mark": ["mark", "flaky-cart-drawer-e2e", "wontfix", *web],
        "search": ["search", "cart drawer", *web],
        "search-json": ["search", "cart drawer", *web, "--json"],
        "inject": ["inject", "Fix the cart drawer", *web],
        "tune": ["tune", *web, "--steps", "3", "--half-lives", "30"],
        "tune-judgments": ["tune", *web, "--steps", "3", "--half-lives", "30", "-j", str(judgments)],
        "doctor": ["doctor", *web],
        "doctor-all": ["doctor", "--all"],
        "export": ["export", "ndjson", *web],
        "report": ["report", "--out", str(tmp / "report"), *web],
    }


def _check(res, verb: str) -> None:
    out = res.stdout + res.stderr
    assert "Traceback" not in out, out
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code in (0, 1), (res.exit_code, out)
    if verb.endswith("-json") and res.exit_code == 1:
        assert json.loads(res.stderr)["exitCode"] == 1  # under --json the error is a JSON object
        return
    for line in res.stderr.splitlines():
        progress = verb == "report" and line.startswith("[")  # "[1/4] 01-history.ipynb: executing..."
        assert progress or line.startswith(("Error: ", "warning: ", "cybmem: ")) or line.startswith(" "), (verb, line)
    if res.exit_code == 1 and not verb.startswith("doctor"):
        last = res.stderr.splitlines()[-1] if verb == "report" else res.stderr  # report: progress lines first
        assert last.startswith("Error: "), (verb, res.stderr)


@pytest.fixture
def broken(tmp_path, request) -> Path:
    root = tmp_path / "memory"
    shutil.copytree(FIXTURES, root, ignore=LEFTOVERS)
    return BROKEN[request.param](root)


@pytest.mark.parametrize("broken", list(BROKEN), indirect=True)
@pytest.mark.parametrize("verb", list(_verbs(Path("/tmp"))))
def test_no_verb_ends_in_a_traceback(broken, verb, tmp_path):
    if verb == "report" and os.environ.get("CYBMEM_FAST_BROKEN") == "1":
        pytest.skip("report executes notebooks")
    args = _verbs(tmp_path)[verb]
    res = runner.invoke(app, [*args, "--memory-dir", str(broken)])
    _check(res, verb)
    if verb == "inject":
        assert res.exit_code == 0 and res.stdout.endswith("Fix the cart drawer")


@pytest.mark.parametrize("broken", list(BROKEN), indirect=True)
def test_inject_strict_fails_where_plain_inject_warns(broken):
    res = runner.invoke(app, ["inject", "Fix the cart drawer", "--project", "web", "--memory-dir", str(broken)])
    warned = any(line.startswith("warning: ") for line in res.stderr.splitlines())
    strict = runner.invoke(app, ["inject", "Fix the cart drawer", "--project", "web", "--strict", "--memory-dir", str(broken)])
    if warned and "memory not injected" in res.stderr:
        assert strict.exit_code == 1 and strict.stderr.startswith("Error: ") and strict.stdout == ""
    _check(strict, "inject")


@pytest.mark.parametrize("broken", ["root-is-a-file", "index-json-is-a-directory"], indirect=True)
def test_real_process_says_error_in_one_line(broken):
    exe = shutil.which("cybmem") or sys.executable
    args = [exe] if exe != sys.executable else [exe, "-c", "from cybmem.cli.app import main; main()"]
    p = subprocess.run([*args, "rebuild", "--project", "web", "--memory-dir", str(broken)], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in p.stderr and p.returncode == 1
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("Error: "), p.stderr
    p = subprocess.run([*args, "rebuild", "--project", "web", "--json", "--memory-dir", str(broken)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and json.loads(p.stderr)["exitCode"] == 1


def _cached_copy(tmp_path: Path) -> tuple[Path, list[str]]:
    """A copy of the fixtures with a cache (the fixtures carry .nocache), and the args naming its web project."""
    root = tmp_path / "memory"
    shutil.copytree(FIXTURES, root, ignore=LEFTOVERS)
    (root / ".nocache").unlink(missing_ok=True)
    web = ["--project", "web", "--memory-dir", str(root)]
    assert runner.invoke(app, ["search", "cart", *web]).exit_code == 0  # writes the cache
    return root, web


def _damage_index(path: Path) -> str:
    """Point the first posting of a cached keyword index at document 65000 (the file still reads as
    Arrow and matches the manifest); returns the term that posting belongs to."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    table = ipc.open_file(pa.BufferReader(path.read_bytes())).read_all()
    term = table.column("vocab")[0].values[0].as_py()  # its first posting is the file's first
    lo = table.column("doc_lo")[0].values.to_pylist()
    lo[0] = 65000
    table = table.set_column(table.schema.get_field_index("doc_lo"), "doc_lo",
                             pa.array([lo], type=pa.large_list(pa.uint16())))
    tmp = path.with_suffix(".tmp")
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    os.replace(tmp, path)
    return term


def test_a_damaged_keyword_index_in_the_cache_is_named_and_repaired(tmp_path):
    """A cache file that still reads as Arrow but whose postings name a document the project does not
    have (a flipped bit, another tool's file): search said IndexError with a traceback, doctor saw
    nothing. Now a query says what is damaged and how to repair it in one line, inject still gives
    the task back, doctor finds it (every posting checked) and --repair makes search work again."""
    root, web = _cached_copy(tmp_path)
    term = _damage_index(next((root / "web" / ".cache").glob("kw-*.arrow")))

    res = runner.invoke(app, ["search", term, *web])
    assert res.exit_code == 1 and "Traceback" not in res.stderr + res.stdout
    assert res.stderr.startswith("Error: the keyword index in the project's .cache is damaged") and "doctor --repair" in res.stderr
    res = runner.invoke(app, ["inject", f"Fix {term}", *web])
    assert res.exit_code == 0 and res.stdout.endswith(f"Fix {term}") and "damaged" in res.stderr
    res = runner.invoke(app, ["doctor", *web])
    assert "a posting names document 65000" in res.output and "repairable" in res.output
    assert runner.invoke(app, ["doctor", "--repair", *web]).exit_code == 0
    res = runner.invoke(app, ["search", term, *web])
    assert res.exit_code == 0 and "damaged" not in res.stderr


def test_a_damaged_issue_index_in_the_cache_is_found_by_doctor(tmp_path):
    """The issues' keyword index (kwi.arrow) damaged the same way: inject says so and gives the task
    back; the doctor --repair the warning names finds it and rebuilds it."""
    root, web = _cached_copy(tmp_path)
    term = _damage_index(root / "web" / ".cache" / "kwi.arrow")
    res = runner.invoke(app, ["inject", f"Fix {term}", *web])
    assert res.exit_code == 0 and res.stdout.endswith(f"Fix {term}")
    assert "damaged" in res.stderr and "doctor --repair" in res.stderr and "Traceback" not in res.stderr
    res = runner.invoke(app, ["doctor", *web])
    assert "a posting names document 65000" in res.output and "repairable" in res.output
    assert runner.invoke(app, ["doctor", "--repair", *web]).exit_code == 0
    res = runner.invoke(app, ["inject", f"Fix {term}", *web])
    assert res.exit_code == 0 and "damaged" not in res.stderr and "MEMORY" in res.stdout
