"""docs/store-format.md says what cybmem does: its pinned examples are computed here by cybmem's code.

The contract is read by people who implement the other side (the TypeScript orchestrator), so
each example in it must be what cybmem produces: the project-slug table (``resolve_slug``, in
the table's order, into one root), the issue-id table (``split_issue`` + ``issue_slug``), the
index.json and archive-summary.md examples (a real store written by ``MemoryStore``), the
defaults table (cybmem's constants) and the environment variables (those cybmem reads).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cybmem import settings
from cybmem.clients import distillation
from cybmem.retrieval import weights
from cybmem.store.outcome import issue_slug, split_issue
from cybmem.store.projects import resolve_slug
from cybmem.store.records import MemoryRecord
from cybmem.store.memory_store import MemoryStore

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "store-format.md"
TEXT = DOC.read_text(encoding="utf-8")


def _section(title: str) -> str:
    """The text of the section whose heading is ``title`` (up to the next heading of any level)."""
    m = re.search(rf"^#+ {re.escape(title)}\n(.*?)(?=^#+ |\Z)", TEXT, re.S | re.M)
    assert m, f"docs/store-format.md has no section {title!r}"
    return m.group(1)


def _table(section: str, header: str) -> list[list[str]]:
    """Rows of the markdown table whose header row starts with ``header``; cells unquoted."""
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().removeprefix("`").removesuffix("`") for cell in line.strip().strip("|").split("|")])
    assert rows, f"no rows under {header!r}"
    return rows


def test_project_slug_examples_are_what_cybmem_registers(tmp_path):
    rows = _table(_section("Project folders: the slug rule"), "| cwd | slug |")
    root = tmp_path / "memory"
    got = [[cwd, resolve_slug(root, cwd)] for cwd, _ in rows]
    assert got == rows
    registered = json.loads((root / "projects.json").read_text(encoding="utf-8"))
    # Entries are never changed: a cwd that normalises to a registered one adds nothing.
    assert registered["web"] == {"cwd": "/home/dev/web"} and registered["web-7663e1"] == {"cwd": "/srv/clients/acme/web"}
    assert len(registered) == len({slug for _, slug in rows})


def test_issue_id_examples_are_what_the_write_path_derives():
    rows = _table(_section("The issue id, exactly"), "| ISSUES item | title |")
    assert len(rows) >= 10
    for item, title, detail, issue_id in rows:
        want_title = item if title == "(the whole item)" else title
        assert split_issue(item) == (want_title, detail), item
        assert issue_slug(want_title) == issue_id, item


def _normalised(text: str) -> str:
    """index.json text with the machine's inode numbers and the JSON parser's words taken out."""
    text = re.sub(r'"inode":\d+', '"inode":N', text)
    text = re.sub(r'(\["[^"]+",\d+,)\d+', r"\1N", text)
    return re.sub(r"not valid JSON \(.*?\)\)?\"", 'not valid JSON (...)"', text)


def _example_store(root: Path) -> MemoryStore:
    """The store of the index.json example: three records, the cap at 2, one file that is not JSON."""
    t0 = 1_792_540_800_000
    store = MemoryStore(root, "web", index_cap=2)

    def put(run_id, hour, task, summary, state="done", issues=(), **lineage):
        store.write_record(MemoryRecord.from_dict({
            "runId": run_id, "cwd": "/home/dev/web", "workflowName": "implement-task", "task": task, "state": state,
            "startedAt": t0 + hour * 3_600_000, "endedAt": t0 + hour * 3_600_000 + 600_000, "lineage": lineage,
            "outcome": {"summary": summary, "accomplished": [], "issues": list(issues), "next": []},
            "workers": [{"agentId": "impl-1", "state": "done"}],
        }))

    put("run-a", 0, "Add the cart drawer\n\nIt slides in from the right.", "Added the cart drawer. Ended done.", rootRunId="run-a")
    put("run-b", 1, "Fix the flaky login test", "Retried the login test. Ended done.", issues=["flaky-login-test"],
        previousRunId="run-a", rootRunId="run-b")
    put("run-c", 2, "Make the login test deterministic", "Seeded the clock. Ended error.", state="error",
        previousRunId="run-b", parentRunId="run-b", chatSessionId="chat-7", rootRunId="run-b")
    (store.records_dir / "run-x.json").write_text("{not json")
    store.rebuild_index()
    return store


def test_index_json_example_is_what_cybmem_writes(tmp_path):
    section = _section("index.json (derived)")
    example = re.search(r"```json\n(.*?)```", section, re.S).group(1)
    store = _example_store(tmp_path / "memory")
    written = store.index_path.read_text(encoding="utf-8")
    assert _normalised(written) == _normalised(example)
    # and the inode numbers the example shows are where the doc says they are
    doc = json.loads(example)
    assert all(isinstance(e["inode"], int) for e in doc["entries"]) and all(len(row) == 3 for row in doc["archived"])
    line = re.search(r"^    (- \d{4}-.*)$", section, re.M).group(1)
    assert line in store.archive_path.read_text(encoding="utf-8").splitlines()
    assert store.archive_path.read_text(encoding="utf-8").startswith("# Archived index entries of project web\n")


def _cybmem_column() -> dict[str, str]:
    """variable -> cybmem's default; a row naming several variables gives each its own value."""
    out = {}
    for variable, _original, cybmem, _why in _table(_section("Defaults that differ from the original design, and why"), "| variable |"):
        names = re.findall(r"CYBERINE_\w+", variable)
        values = cybmem.split(", ") if len(names) > 1 else [cybmem]
        assert len(values) == len(names), variable
        out.update(zip(names, values))
    return out


def test_defaults_table_is_cybmems_defaults():
    table = _cybmem_column()
    s = settings.Settings.from_env({}, memory_dir="/nonexistent")
    w = weights.Weights()
    assert table["CYBERINE_MEMORY_TOPK"] == str(s.topk) == "8"
    assert table["CYBERINE_MEMORY_ISSUES"] == str(s.issues)
    assert table["CYBERINE_MEMORY_MAX_TOKENS"] == str(s.max_tokens)
    assert table["CYBERINE_MEMORY_INDEX_CAP"] == str(s.index_cap)
    assert table["CYBERINE_MEMORY_ISSUE_WINDOW_DAYS"] == str(s.issue_window_days)
    assert table["CYBERINE_MEMORY_REDACT"] == "on" and s.redact_secrets
    assert float(table["CYBERINE_MEMORY_HALF_LIFE_DAYS"]) == w.half_life_days
    assert [float(table[f"CYBERINE_MEMORY_W_{k}"]) for k in ("KW", "REC", "LIN")] == [w.w_kw, w.w_rec, w.w_lin]
    assert float(table["CYBERINE_MEMORY_FLOOR_VEC"]) == w.floor_vec
    assert table["CYBERINE_MEMORY_POINTERS"] == str(s.pointers)
    assert table["CYBERINE_MEMORY_RETUNE"] == str(s.retune)
    assert table["CYBERINE_MEMORY_W_VEC"] == f"{w.w_vec:g} without vectors; {weights.DEFAULT_W_VEC:g} when the project has vectors of the configured model"
    assert table["CYBERINE_MEMORY_EMBED_MODEL"] == settings.DEFAULT_EMBED_MODEL
    assert table["CYBERINE_MEMORY_MODEL"] == "none" and distillation.distill_config(s.distill) is None


def _read_by_cybmem() -> set[str]:
    names = set()
    for path in (REPO / "cybmem").rglob("*.py"):
        if path.relative_to(REPO / "cybmem").parts[0] == "notebooks":  # a link to notebooks/, not the package's code
            continue
        names.update(re.findall(r"\bCYBERINE_[A-Z_]*[A-Z]\b", path.read_text(encoding="utf-8")))
    names.update(settings.WEIGHT_VARIABLES.values())
    return names


@pytest.mark.parametrize("direction", ["documented", "exists"])
def test_the_doc_names_every_variable_cybmem_reads(direction):
    in_doc = set(re.findall(r"\bCYBERINE_[A-Z_]*[A-Z]\b", TEXT))
    read = _read_by_cybmem()
    if direction == "documented":
        assert read - in_doc == set(), "variables cybmem reads that docs/store-format.md does not name"
    else:
        assert in_doc - read == set(), "variables docs/store-format.md names that cybmem does not read"


def test_the_node_reference_of_the_slug_rules_agrees_with_the_doc():
    """tests/node/conformance.mjs implements both slug rules from this doc's words, in JavaScript
    (what the orchestrator runs): it derives every example of both tables."""
    from test_conformance import node

    issues = _table(_section("The issue id, exactly"), "| ISSUES item | title |")
    projects = _table(_section("Project folders: the slug rule"), "| cwd | slug |")
    got = json.loads(node("slugs", json.dumps({"issues": [row[0] for row in issues], "cwds": [row[0] for row in projects]})))
    assert got["issues"] == [[item if title == "(the whole item)" else title, detail, issue_id]
                             for item, title, detail, issue_id in issues]
    assert got["projects"] == [slug for _, slug in projects]


@pytest.mark.parametrize("name", ["README.md", "USAGE.md"])
def test_readme_and_usage_link_only_inside_the_repository(name):
    """A clone is the whole product: every link leads to a file of the repository (or the web)."""
    text = (REPO / name).read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    assert "docs/store-format.md" in local
    for target in local:
        path = (REPO / target).resolve()
        assert path.is_relative_to(REPO) and path.exists(), f"{name} links to {target}, which a clone does not have"
    assert "../shared/spec" not in text, f"{name} names ../shared/spec; the contract is docs/store-format.md"
