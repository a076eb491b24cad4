"""Compaction of index.json (CYBERINE_MEMORY_INDEX_CAP): the oldest entries collapse into
archive-summary.md, the records stay, and show, chain, search, list and doctor reach every one."""

from __future__ import annotations

import dataclasses

import json
import re

import orjson
import pytest
from typer.testing import CliRunner

from cybmem.cli.app import app
from cybmem.operations.doctor import doctor
from cybmem.explore.lineage import chain
from cybmem.operations.write import write_run
from cybmem.retrieval.search import search
from cybmem.settings import Settings
from cybmem.store.memory_store import MemoryStore

from conftest import T0, make_run


#: These tests check the linear formula's order, or outputs written with it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("linear_ranker")

DAY = 86_400_000
LINE = re.compile(r"^- \d{4}-\d\d-\d\d \d\d:\d\d UTC  (done|error|cancelled)  (\S+)  (.+)$")
TASKS = ["Set up the storefront skeleton", "Add client-side routing", "Add the product detail page",
         "Plan the shopping cart", "Cart state store", "Cart drawer UI", "Checkout handoff", "Stabilise the cart e2e test"]


@pytest.fixture
def capped(memory_root):
    """Eight runs written with a cap of 3: five archived."""
    settings = Settings.from_env({"CYBERINE_MEMORY_INDEX_CAP": "3"}, memory_dir=memory_root)
    for i, task in enumerate(TASKS):
        write_run(make_run(f"run{i}", task, start=T0 + i * DAY), settings)
    return settings


def index_doc(store):
    return orjson.loads(store.index_path.read_bytes())


def summary_ids(store):
    return [LINE.match(line).group(2) for line in store.archive_path.read_text().splitlines() if line.startswith("- ")]


def test_the_oldest_entries_collapse_into_archive_summary(capped):
    store = MemoryStore(capped.memory_dir, "web", index_cap=3)
    doc = index_doc(store)
    assert doc["count"] == 3 and [e["runId"] for e in doc["entries"]] == ["run7", "run6", "run5"]
    assert [row[0] for row in doc["archived"]] == ["run4", "run3", "run2", "run1", "run0"]
    text = store.archive_path.read_text()
    assert text.startswith("# Archived index entries of project web\n\n")
    lines = [line for line in text.splitlines() if line.startswith("- ")]
    assert lines[0] == "- 2025-11-01 00:10 UTC  done  run0  Set up the storefront skeleton"
    assert summary_ids(store) == ["run0", "run1", "run2", "run3", "run4"], "oldest first, one line each"
    assert len(list(store.records_dir.glob("*.json"))) == 8, "the records stay"


def test_show_chain_search_and_list_reach_archived_records(capped):
    store = MemoryStore.open(capped, project="web")
    runner = CliRunner()
    env = {"CYBERINE_MEMORY_DIR": str(capped.memory_dir), "CYBERINE_MEMORY_INDEX_CAP": "3"}
    res = runner.invoke(app, ["show", "run1", "-p", "web", "--json"], env=env)
    assert res.exit_code == 0 and json.loads(res.output)["task"] == "Add client-side routing"
    result = chain(store, "run7")
    assert result.previous == [f"run{i}" for i in range(7)]
    assert chain(store, "run0").next == [f"run{i}" for i in range(1, 8)]
    res = runner.invoke(app, ["chain", "run2", "-p", "web"], env=env)
    assert res.exit_code == 0 and len(res.output.splitlines()) == 8 + 1  # eight runs and the root line
    hits = search(store, "storefront skeleton", settings=dataclasses.replace(capped, ranker="linear"), now_ms=T0 + 30 * DAY).hits
    assert hits[0].run_id == "run0"
    assert [e["runId"] for e in store.all_entries()] == [f"run{i}" for i in range(7, -1, -1)]
    assert store.all_entries()[3]["task"] == "Cart state store", "an archived entry, read from its record"
    res = runner.invoke(app, ["list", "-p", "web", "--json"], env=env)
    assert [e["runId"] for e in json.loads(res.output)] == [f"run{i}" for i in range(7, -1, -1)]


def test_the_index_check_never_reads_archived_records(capped, monkeypatch):
    store = MemoryStore(capped.memory_dir, "web", index_cap=3)
    reads = []
    real = MemoryStore.read_record_st
    monkeypatch.setattr(MemoryStore, "read_record_st", lambda self, rid: reads.append(rid) or real(self, rid))
    assert [e["runId"] for e in store.index_entries()] == ["run7", "run6", "run5"]
    assert store.latest_run_id(before_ms=T0 + DAY) == "run0"
    assert store.superseded_map() == {} and reads == [], "one directory listing; no record file was read"


def test_a_new_run_links_to_an_archived_predecessor(capped):
    res = write_run(make_run("late", "Backfill a run that started long ago", start=T0 + DAY + 3_600_000), capped)
    assert res.record.lineage.previousRunId == "run1"
    store = MemoryStore(capped.memory_dir, "web", index_cap=3)
    assert "late" in [row[0] for row in index_doc(store)["archived"]], "older than the cap: archived at once"
    assert summary_ids(store).count("late") == 1


def test_rebuild_full_restores_every_entry_and_lines_are_never_repeated(capped):
    runner = CliRunner()
    env = {"CYBERINE_MEMORY_DIR": str(capped.memory_dir), "CYBERINE_MEMORY_INDEX_CAP": "3"}
    store = MemoryStore(capped.memory_dir, "web", index_cap=3)
    summary = store.archive_path.read_bytes()
    res = runner.invoke(app, ["rebuild", "-p", "web", "--full"], env=env)
    assert res.exit_code == 0 and res.output == f"Rebuilt {store.index_path} from 8 records.\n"
    doc = index_doc(store)
    assert doc["count"] == 8 and "archived" not in doc
    assert store.archive_path.read_bytes() == summary, "archive-summary.md is never rewritten"
    assert doctor(capped, project="web").clean, "a full index is as good as a compacted one"
    write_run(make_run("run8", "Lazy-load product images", start=T0 + 9 * DAY), capped)
    assert index_doc(store)["count"] == 3 and summary_ids(store) == [f"run{i}" for i in range(6)], "no second line"
    res = runner.invoke(app, ["rebuild", "-p", "web"], env=env)
    assert res.output == f"Rebuilt {store.index_path} from 9 records: 3 entries, 6 archived (older than the newest 3; listed in archive-summary.md).\n"
    assert summary_ids(store) == [f"run{i}" for i in range(6)]
    res = runner.invoke(app, ["rebuild", "-p", "web", "--json"], env=env)
    assert json.loads(res.output)["archived"] == 6


def test_doctor_understands_and_repair_keeps_a_compacted_index(capped):
    store = MemoryStore(capped.memory_dir, "web", index_cap=3)
    report = doctor(capped, project="web")
    assert report.clean, report.lines()
    store.index_path.unlink()
    report = doctor(capped, project="web", repair=True)
    assert report.clean and any("rebuilt" in r for r in report.repaired)
    doc = index_doc(store)
    assert doc["count"] == 3 and len(doc["archived"]) == 5, "repair keeps the compaction"
    doc["archived"] = doc["archived"][1:]  # an archived run lost from the index
    store.index_path.write_bytes(orjson.dumps(doc))
    finding, = [f for f in doctor(capped, project="web").findings if f.check == "index"]
    assert finding.message == "index.json is stale: 1 record(s) missing from it"


def test_a_correction_of_an_archived_record_is_followed(capped):
    write_run(make_run("run1-fix", "Add client-side routing, corrected", start=T0 + 20 * DAY), capped, supersedes="run1")
    store = MemoryStore(capped.memory_dir, "web", index_cap=3)
    assert store.newest_truth("run1") == "run1-fix"
    row = next(r for r in index_doc(store)["archived"] if r[0] == "run1")
    assert row[4] == "run1-fix", "the archived row follows the record's new supersededBy"
    assert doctor(capped, project="web").clean
    assert "run1" not in [h.run_id for h in search(store, "client-side routing", settings=capped).hits]


def test_a_cap_of_zero_keeps_every_entry(memory_root):
    settings = Settings.from_env({"CYBERINE_MEMORY_INDEX_CAP": "0"}, memory_dir=memory_root)
    for i in range(6):
        write_run(make_run(f"r{i}", start=T0 + i * DAY), settings)
    store = MemoryStore(memory_root, "web")
    assert index_doc(store)["count"] == 6 and not store.archive_path.exists()
    with pytest.raises(Exception, match="CYBERINE_MEMORY_INDEX_CAP=-1 must be at least 0"):
        Settings.from_env({"CYBERINE_MEMORY_INDEX_CAP": "-1"}, memory_dir=memory_root)
