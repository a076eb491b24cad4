"""What a record of an agent's turn carries beyond an orchestrator's run, on every write path: the
files it edited and the commands it ran (optional record fields that `show` prints and search
reads), and no ``<private>`` span of what it was given or said."""

from __future__ import annotations

import json
import subprocess

import pytest

from cybmem.store.private import strip_private
from conftest import make_run


SECRET = "ghp_" + "R4nd0mT0k3nAbCdEfGhIjKlMnOpQrStUvWxYz1234"


def cybmem(*args: str, stdin: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["cybmem", *args], input=stdin, capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("text, kept", [
    ("no span here", "no span here"),
    ("Deploy <private>the password is hunter2</private> now", "Deploy  now"),
    ("a<private>b</private>c", "a c"),
    ("line one\n<PRIVATE >token</Private>\nline two", "line one\n\nline two"),
    ("outer <private>x <private>nested</private> still private</private> after", "outer  after"),
    ("keep this <private>but never this, the tag left open", "keep this "),
    ("a stray </private> closing tag", "a stray  closing tag"),
    ("<private>all of it</private>", ""),
    ("<privateer> is not the tag", "<privateer> is not the tag"),
])
def test_the_private_span_rule(text, kept):
    assert strip_private(text) == kept


def test_no_private_span_reaches_a_record_whatever_the_switches(tmp_path, memory_root):
    """Redaction off, and the span in the task, the answer's trailer, the verdict and a worker's
    output: the record, the ledger and the index hold none of it."""
    run = make_run("p1", "Deploy the site <private>the staging password is hunter2</private> to staging",
                   output="Deployed.\n\nACCOMPLISHED:\n- deployed <private>with hunter2</private>\nISSUES:\n"
                          "- Slow upload <private>hunter2 again</private>: 40 s\nNEXT:\n- none",
                   verdict={"winner": "impl-1", "summary": "impl-1 wins <private>hunter2</private>"})
    run["workers"].append({"agentId": "impl-2", "state": "error", "output": "<private>hunter2</private>"})
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    done = cybmem("write", str(path), env={**__import__("os").environ, "CYBERINE_MEMORY_REDACT": "0"})
    assert done.returncode == 0, done.stderr
    rec = json.loads((memory_root / "web" / "records" / "p1.json").read_text())
    assert rec["task"] == "Deploy the site  to staging"
    assert rec["outcome"]["accomplished"] == ["deployed"] and rec["outcome"]["issues"] == ["slow-upload"]
    stored = b"".join(p.read_bytes() for p in memory_root.rglob("*") if p.is_file())
    assert b"hunter2" not in stored


def test_files_and_commands_are_kept_shown_and_searched(tmp_path, memory_root):
    run = make_run("f1", "Style the cart drawer", files=["src/cart/drawer.css", "src/cart/Drawer.tsx", "src/cart/drawer.css"],
                   commands=["npm test -- drawer", "export GITHUB_TOKEN=" + SECRET])
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    assert cybmem("write", str(path)).returncode == 0
    rec = json.loads((memory_root / "web" / "records" / "f1.json").read_text())
    assert rec["files"] == ["src/cart/drawer.css", "src/cart/Drawer.tsx"]  # each once
    assert rec["commands"][0] == "npm test -- drawer" and "[REDACTED:" in rec["commands"][1]
    assert SECRET not in json.dumps(rec)
    shown = cybmem("show", "f1", "-p", "web").stdout
    assert shown.endswith("Files edited:\n  - src/cart/drawer.css\n  - src/cart/Drawer.tsx\nCommands run:\n"
                          "  - npm test -- drawer\n  - " + rec["commands"][1] + "\n")
    other = make_run("g1", "Fix the login form", start=run["startedAt"] + 3_600_000)
    path.write_text(json.dumps(other))
    assert cybmem("write", str(path)).returncode == 0
    for query in ("drawer.css", "npm"):  # a file it edited, a command it ran: only f1 holds the word
        hits = json.loads(cybmem("search", query, "-p", "web", "--json", "--explain").stdout)["hits"]
        assert [h["runId"] for h in hits if h["contributions"]["keyword"] > 0] == ["f1"]
    # a record without them writes neither field
    assert "files" not in json.loads((memory_root / "web" / "records" / "g1.json").read_text())


@pytest.mark.parametrize("field, value", [("files", "src/a.py"), ("commands", [1, 2]), ("files", {"a": 1})])
def test_files_and_commands_must_be_lists_of_strings(tmp_path, memory_root, field, value):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(make_run("x1", **{field: value})))
    done = cybmem("write", str(path))
    assert done.returncode == 1 and f"Error: {field}: expected a list of strings" in done.stderr
    assert not (memory_root / "web").exists()
