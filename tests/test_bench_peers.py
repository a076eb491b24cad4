"""benchmarks/bench_peers.py (issue 31) runs end to end on the bundled fixtures, as a user runs it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest


#: These tests check the linear formula's order, or outputs written with it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("linear_ranker")

REPO = Path(__file__).resolve().parent.parent

pytest.importorskip("tantivy", reason="bench_peers compares with Tantivy: pip install -e '.[test]' installs it")


def test_bench_peers_prints_its_tables_on_the_fixtures(fixture_copy, tmp_path):
    """The real store (the fixtures' first project, 15 records) and one synthesised from it: every
    engine's latency against Tantivy, the top-10 agreement computed, builds, sizes and loads; and
    search() on a fresh copy of the real store beside an old one (issue 41: the fresh copy's hit
    files are read in the first run only)."""
    out = tmp_path / "peers.json"
    p = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_peers.py"), "--root", str(fixture_copy), "--sizes", "real,40",
         "--cache-dir", str(tmp_path / "cache"), "--queries", "12", "--runs", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "40: synthesising 40 records from 15" in p.stderr  # per-stage progress on stderr
    tables = [t for t in re.split(r"\n\s*\n", p.stdout) if t.startswith("|")]
    assert len(tables) == 5, p.stdout  # latency, agreement, build and size, load (no growth below 10k), copies
    *tables, copies = tables
    assert copies.splitlines()[0] == ("| 15 records, `search()` on a held snapshot | fresh `cp -r` copy | "
                                      "old copy (`touch -d '2 hours ago'`) | fresh / old |"), copies
    assert [line.split(" | ")[0] for line in copies.splitlines()[2:]] == ["| run 1", "| a new snapshot"], copies
    for table in tables:
        lines = table.splitlines()
        assert lines[0] == "|  | 15 records | 40 records |"
        assert all(line.count("|") == 4 for line in lines), table
    latency = tables[0]
    for name in ("cybmem BM25 only", "cybmem full ranking", "cybmem `search()`", "Tantivy (BM25)", "SQLite FTS5"):
        assert name in latency
    assert re.search(r"\| Tantivy \(BM25\) \| [\d,.]+ us \(1\.00x\) \| [\d,.]+ us \(1\.00x\) \|", latency), latency

    result = json.loads(out.read_text())
    assert [r["records"] for r in result["results"]] == [15, 40]
    runs = result["results"][0]["copies"]["runs"]
    assert runs[0]["fresh copy"]["files_read"] > 0 and runs[1]["fresh copy"]["files_read"] == 0, runs
    assert all(r["old copy"]["files_read"] == 0 and r["held"] for r in runs), runs
    assert "copies" not in result["results"][1]
    for r in result["results"]:
        agree = r["agreement"]
        for engine in ("cybmem-kw", "tantivy", "fts5"):
            assert 0 <= agree[engine]["mean"] <= 1
        assert agree["cybmem-kw"]["mean"] == 1  # exact BM25 against itself
        assert agree["tantivy"]["mean"] >= 0.9  # the same BM25, ties counted
        assert agree["cybmem-search"]["mean"] == 1  # search() ranks as the kernel does
        assert r["held"]  # search() ran on the held snapshot, not a reload per call
        assert {"cybmem", "tantivy", "fts5"} <= set(r["load"]) and {"cybmem", "tantivy", "fts5"} <= set(r["disk_bytes"])
        assert all(q["median_us"] > 0 for q in r["query"].values())


def test_bench_peers_compares_its_rankings_with_the_saved_ones(fixture_copy, tmp_path):
    """Issue 31: "rankings compare equal to the saved ones". A run saves each size's rankings
    (--save-rankings), the next compares with them and says equal; a saved ranking that differs
    (one query's hash changed, as a change to a float or a tie's order would) is named."""
    rk = tmp_path / "rankings"

    def run(*extra):
        p = subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "bench_peers.py"), "--root", str(fixture_copy), "--sizes", "real",
             "--cache-dir", str(tmp_path / "cache"), "--queries", "12", "--runs", "1", "--skip", "bm25s,fts5",
             "--rankings", str(rk), "--json", str(tmp_path / "out.json"), *extra],
            capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        return p.stdout.strip().splitlines()[-1], json.loads((tmp_path / "out.json").read_text())["results"][0]["rankings"]

    line, res = run("--save-rankings")
    assert "none saved for this size" in line and res["saved"]
    saved = json.loads(next(rk.glob("*-15.json")).read_text())
    assert saved["records"] == 15 and len(saved["rankings"]) == 12
    line, res = run()
    assert "15: equal to the saved ones on all 12 distinct queries" in line and res["differ"] == 0
    query = sorted(saved["rankings"])[0]
    saved["rankings"][query] = "0" * 16
    next(rk.glob("*-15.json")).write_text(json.dumps(saved))
    line, res = run()
    assert "1 of 12 distinct queries rank otherwise than saved" in line and res["first_differing"] == [query], line
