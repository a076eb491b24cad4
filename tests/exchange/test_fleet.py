"""The fleet on Dask: LocalCluster results equal the single-process ones on the same data.

The dataset: data-fixtures/memory copied as three machines (each copy's run ids prefixed with
the machine's name and its times shifted an hour, so runs are unique across the fleet), each
exported with ``cybmem.exchange.export.export_parquet`` as its own machine. The single-process reference
is what users run: :func:`cybmem.retrieval.search.search` over one store holding every machine's records,
and :func:`cybmem.explore.frames.issue_fold` of each machine's project.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from cybmem.settings import Settings
from cybmem.store.keyword_index import KeywordIndex, QueryStats
from cybmem.cli.app import app
from cybmem.errors import NotFoundError, ValidationError
from cybmem.exchange.export import PARTITION_SCHEMA, all_stores, export_parquet, read_dataset
from cybmem.exchange.fleet import Fleet, FleetError, scan_dataset
from cybmem.exchange.fleet_search import Shard
from cybmem.explore.frames import issue_fold, lineage_edges, records_frame
from cybmem.explore.frames import IssueAgeData
from cybmem.retrieval.scoring import keyword_max, normalize_keyword
from cybmem.retrieval.search import search
from cybmem.store.memory_store import MemoryStore
from cybmem.store.tokens import tokenize
from cybmem.retrieval.weights import Weights

from conftest import FIXTURES, LEFTOVERS


#: These tests check the linear formula's order, or outputs written with it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("linear_ranker")

MACHINES = ("laptop", "ci-1", "ci-2")
SLUGS = ("api", "web", "web-7663e1")
NOW = 1_796_000_000_000  # 2026-11-30, after every record
runner = CliRunner()


def machine_copy(src: Path, dst: Path, tag: str, shift_ms: int) -> Path:
    """A memory root like ``src`` whose run ids (and every link to them) carry ``tag``, times shifted."""
    dst.mkdir(parents=True)
    shutil.copy(src / "projects.json", dst / "projects.json")

    def rid(x):
        return f"{tag}-{x}" if x else x

    for pdir in sorted(p for p in src.iterdir() if p.is_dir()):
        (dst / pdir.name / "records").mkdir(parents=True)
        for f in (pdir / "records").glob("*.json"):
            r = json.loads(f.read_text())
            r["runId"] = rid(r["runId"])
            r["startedAt"] += shift_ms
            r["endedAt"] += shift_ms
            for key in ("parentRunId", "previousRunId", "rootRunId", "chatSessionId"):
                if r["lineage"].get(key):
                    r["lineage"][key] = rid(r["lineage"][key])
            for key in ("supersedes", "supersededBy"):
                if r.get(key):
                    r[key] = rid(r[key])
            (dst / pdir.name / "records" / f"{r['runId']}.json").write_text(json.dumps(r))
        lines = []
        for line in (pdir / "issues.jsonl").read_text().splitlines():
            e = json.loads(line)
            e["byRunId"] = rid(e.get("byRunId"))
            e["at"] += shift_ms
            lines.append(json.dumps(e))
        (dst / pdir.name / "issues.jsonl").write_text("\n".join(lines) + "\n")
    return dst


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Three machines' roots, their exports side by side in one dataset, and one store holding everything."""
    base = tmp_path_factory.mktemp("fleet")
    roots = {m: machine_copy(FIXTURES, base / "roots" / m, m, i * 3_600_000) for i, m in enumerate(MACHINES)}
    dataset = base / "dataset"
    for m, root in roots.items():
        export_parquet(all_stores(root), dataset, machine=m)
    merged = base / "merged"
    (merged / "all" / "records").mkdir(parents=True)
    (merged / "projects.json").write_text(json.dumps({"all": {"cwd": "/home/dev/all"}}))
    ledger = []
    for root in roots.values():
        for slug in SLUGS:
            for f in (root / slug / "records").glob("*.json"):
                shutil.copy(f, merged / "all" / "records" / f.name)
            ledger += (root / slug / "issues.jsonl").read_text().splitlines()
    (merged / "all" / "issues.jsonl").write_text("\n".join(ledger) + "\n")
    return {"roots": roots, "dataset": dataset, "merged": MemoryStore(merged, "all")}


@pytest.fixture(scope="module")
def fleet(data):
    """A LocalCluster of two workers (threads: quick to start); partitions small enough to pack groups unevenly."""
    with Fleet(data["dataset"], scheduler="local", processes=False, workers=2, partition_bytes=40_000) as f:
        yield f


@pytest.fixture(scope="module")
def inline(data):
    with Fleet(data["dataset"], scheduler="inline") as f:
        yield f


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def ranking(hits):
    return [(h.run_id, np.float32(h.score), {k: np.float32(v) for k, v in h.contributions.items()}) for h in hits]


# --- the dataset: many machines side by side, one table ---------------------------------------


# dask 2026.8's read_parquet calls reset_index(inplace=True), which pandas 3.1 deprecates (a warning, harmless)
@pytest.mark.filterwarnings("ignore:The inplace keyword in DataFrame.reset_index is deprecated")
def test_many_machines_read_as_one_table_with_pyarrow_duckdb_and_dask(data):
    import dask.dataframe as dd
    import duckdb
    import pyarrow.dataset as ds

    want = {(m, s): len(list((data["roots"][m] / s / "records").glob("*.json"))) for m in MACHINES for s in SLUGS}
    t = read_dataset(data["dataset"]).to_table()
    g = t.group_by(["machine", "project"]).aggregate([("runId", "count")])
    assert {(m, p): n for m, p, n in zip(*(g.column(c).to_pylist() for c in ("machine", "project", "runId_count")))} == want
    glob = (data["dataset"] / "records" / "**" / "*.parquet").as_posix()
    rows = duckdb.connect().execute(f"SELECT machine, project, count(*) FROM read_parquet('{glob}', hive_partitioning=true) "
                                    "GROUP BY ALL").fetchall()
    assert {(m, p): n for m, p, n in rows} == want
    ddf = dd.read_parquet(data["dataset"] / "records",
                          dataset={"partitioning": ds.partitioning(PARTITION_SCHEMA, flavor="hive")})
    assert str(ddf["project"].dtype).startswith(("str", "string"))
    counts = ddf.groupby(["machine", "project"])["runId"].count().compute(scheduler="sync")
    assert {k: int(v) for k, v in counts.items()} == want
    assert ddf["runId"].nunique().compute(scheduler="sync") == sum(want.values())  # ids unique across the fleet


def test_scan_lists_each_machine_and_project_with_its_files(data):
    groups = scan_dataset(data["dataset"])
    assert [g.key for g in groups] == sorted((m, s) for m in MACHINES for s in SLUGS)
    assert all(g.records and g.issues and g.size > 0 for g in groups)


def test_partitions_never_split_a_machine_and_project(data, fleet):
    assert 1 < len(fleet.partitions) < len(fleet.groups)  # packed, unevenly
    ddf = fleet.records(["runId", "endedAt"])
    assert ddf.npartitions == len(fleet.partitions)
    parts = [p.compute(scheduler="sync") for p in ddf.partitions]
    for part, groups in zip(parts, fleet.partitions):
        assert list(dict.fromkeys(zip(part["machine"], part["project"]))) == [g.key for g in groups]
    df = pd.concat(parts, ignore_index=True)
    for (m, p), rows in df.groupby(["machine", "project"], sort=False):
        assert rows["endedAt"].is_monotonic_increasing
    states = fleet.compute(fleet.records(["runId", "state"]).groupby("machine")["state"].count())
    assert states.to_dict() == {m: 68 for m in MACHINES}  # columns without the sort keys read too
    with Fleet(data["dataset"], scheduler="inline", partition_bytes=1) as each:
        assert [len(p) for p in each.partitions] == [1] * len(each.groups)


# --- search ------------------------------------------------------------------------------------

QUERIES = ["flaky cart drawer test", "postgres integration tests time out", "stripe webhook signature",
           "product images load slowly lazy", "zeppelin", ""]
CONTEXTS = [
    {},
    {"parent_run_id": "ci-1-4e96fd74-41ec-5c08-835b-f66e58d3db51"},
    {"chat_session_id": "laptop-chat-search"},
    {"as_of": 1_791_000_000_000},
    {"weights": Weights(w_kw=1.0, w_rec=0.0, w_lin=0.0)},  # ties everywhere: newer first, across machines
]


@pytest.mark.parametrize("context", CONTEXTS, ids=["plain", "parent", "chat", "as-of", "keyword-only"])
def test_search_on_a_local_cluster_equals_search_over_one_store(data, fleet, inline, context):
    for query in QUERIES:
        want = search(data["merged"], query, k=12, now_ms=NOW, **{"weights": Weights(), **context}, settings=Settings.from_env())
        got = fleet.search(query, k=12, now_ms=NOW, **context)
        assert ranking(got.hits) == ranking(want.hits), query
        assert got.candidates == want.candidates and got.records == want.snapshot.n
        assert ranking(inline.search(query, k=12, now_ms=NOW, **context).hits) == ranking(want.hits)
        assert all(h.run_id.startswith(h.machine + "-") and h.project in SLUGS for h in got.hits)


def test_search_hits_say_where_they_come_from(fleet):
    res = fleet.search("flaky cart drawer test", k=3, now_ms=NOW)
    assert [(h.machine, h.project) for h in res.hits] == [("ci-2", "web"), ("ci-1", "web"), ("laptop", "web")]
    d = res.to_dict(explain=True)
    assert list(d["hits"][0])[:3] == ["rank", "machine", "project"] and "contributions" in d["hits"][0]
    assert d["records"] == 204 and d["partitions"] == len(fleet.partitions)


def test_search_of_one_machine_and_project_equals_search_of_its_store(data):
    store = MemoryStore(data["roots"]["ci-1"], "web")
    with Fleet(data["dataset"], machines=["ci-1"], projects=["web"], scheduler="inline") as one:
        for query in QUERIES:
            assert ranking(one.search(query, k=8, now_ms=NOW).hits) == ranking(search(store, query, k=8, now_ms=NOW,
                                                                                       weights=Weights(), settings=Settings.from_env()).hits)


def test_a_shard_survives_pickling_between_workers(data):
    shard = Shard.build(str(data["dataset"]), tuple(scan_dataset(data["dataset"])[:2]))
    back = pickle.loads(pickle.dumps(shard))
    tokens = tokenize("cart drawer postgres")
    for (_, _, a), (_, _, b) in zip(shard.snapshots(), back.snapshots()):
        st = a.index.query_stats(tokens)
        assert np.array_equal(a.index.scores(tokens, stats=st), b.index.scores(tokens, stats=st))


# --- the kernels the fleet adds --------------------------------------------------------------


def test_keyword_index_shards_score_like_one_index_under_summed_stats():
    docs = [["cart", "drawer", "test"], ["flaky", "test", "test"], ["cart", "total"], ["login", "form"], ["cart"]]
    whole = KeywordIndex.build(docs)
    parts = [KeywordIndex.build(docs[:2]), KeywordIndex.build(docs[2:])]
    q = ["cart", "test", "cart", "nothing"]
    stats = sum(p.query_stats(q) for p in parts)
    assert stats == QueryStats(("cart", "test", "nothing"), 5, 11, (3, 2, 0))
    got = np.concatenate([p.scores(q, stats=stats) for p in parts])
    assert got.tobytes() == whole.scores(q).tobytes()
    with pytest.raises(ValueError, match="another query"):
        parts[0].scores(["cart"], stats=stats)


def test_keyword_max_of_parts_normalises_like_the_whole():
    raw = np.array([0.0, 2.5, 1.0, 4.0, 3.0], dtype=np.float32)
    mask = np.array([True, True, True, False, True])
    m = max(keyword_max(raw[:2], mask[:2]), keyword_max(raw[2:], mask[2:]))
    assert m == keyword_max(raw, mask) == 3.0
    parts = np.concatenate([normalize_keyword(raw[:2], mask[:2], max_value=m), normalize_keyword(raw[2:], mask[2:], max_value=m)])
    assert parts.tobytes() == normalize_keyword(raw, mask).tobytes()


# --- issues ------------------------------------------------------------------------------------


def single_process_folds(data, now):
    frames = []
    for m in sorted(MACHINES):
        for slug in SLUGS:
            f = issue_fold(MemoryStore(data["roots"][m], slug), now=now)
            f.insert(0, "project", slug)
            f.insert(0, "machine", m)
            frames.append(f)
    return pd.concat(frames, ignore_index=True)


def test_issue_fold_on_a_local_cluster_equals_each_projects_fold(data, fleet, inline):
    now = pd.Timestamp(NOW, unit="ms", tz="UTC")
    want = single_process_folds(data, now)
    for got in (fleet.issues(now=NOW), inline.issues(now=now)):
        assert len(got) == 54
        pd.testing.assert_frame_equal(got.astype({"machine": object, "project": object}),
                                      want.astype({"machine": object, "project": object}))


def test_issue_age_histogram_data_equals_the_single_process_one(data, fleet, inline):
    now = pd.Timestamp(NOW, unit="ms", tz="UTC")
    fold = single_process_folds(data, now)
    # a reopened issue and a wontfix one make every panel non-trivial
    want = IssueAgeData.of(fold)
    for got in (fleet.issue_age_data(now=NOW), inline.issue_age_data(now=NOW)):
        assert got.issues == want.issues == 54
        assert got.reopens == want.reopens
        for panel in ("open", "resolved"):
            a, b = getattr(got, panel), getattr(want, panel)
            assert (a.n, a.median, a.short) == (b.n, b.median, b.short) and a.n > 0, panel
            assert a.edges.tobytes() == b.edges.tobytes() and a.counts.tolist() == b.counts.tolist(), panel


@pytest.mark.parametrize("n", [1, 2, 7, 10, 31])
def test_age_histograms_by_parts_equal_the_whole_for_any_count(tmp_path, n):
    """Even and odd counts, one value, medians inside wide bins: the three-pass median is exact."""
    rng = np.random.default_rng(n)
    root = tmp_path / "m"
    store = MemoryStore(root, "p")
    store.dir.mkdir(parents=True)
    lines = []
    for i in range(n):
        at = 1_790_000_000_000 + int(rng.integers(0, 10**9))
        lines.append({"issueId": f"i{i}", "at": at, "event": "opened", "title": f"Issue {i}"})
        if i % 3:
            took = int(rng.integers(0, 30_000 if i % 2 else 10**9))  # some under a minute (counted at one)
            lines.append({"issueId": f"i{i}", "at": at + took, "event": "resolved"})
    rng.shuffle(lines)
    store.issues_path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    out = tmp_path / "ds"
    for m in ("a", "b", "c"):
        export_parquet(store, out, machine=m, tables=["issues"])
    now = pd.Timestamp(1_800_000_000_000, unit="ms", tz="UTC")
    with Fleet(out, scheduler="inline", partition_bytes=1) as f:
        got = f.issue_age_data(now=now)
    fold = pd.concat([issue_fold(store, now=now)] * 3, ignore_index=True)
    want = IssueAgeData.of(fold)
    for panel in ("open", "resolved"):
        a, b = getattr(got, panel), getattr(want, panel)
        assert (a.n, a.median, a.short, a.counts.tolist(), a.edges.tolist()) == \
            (b.n, b.median, b.short, b.counts.tolist(), b.edges.tolist())


def test_fleet_partitions_never_import_matplotlib(data):
    """What a worker runs (the folds, the three histogram passes, the summaries, a search) takes the
    histogram math from cybmem.explore.frames: a worker process does not load matplotlib."""
    code = (
        "import sys\n"
        "from cybmem.exchange.fleet import Fleet\n"
        f"with Fleet({str(data['dataset'])!r}, scheduler='inline', partition_bytes=40_000) as f:\n"
        f"    ages = f.issue_age_data(now={NOW})\n"
        f"    f.issue_summary(now={NOW}); f.lineage_summary(); f.search('cart drawer postgres')\n"
        "assert ages.issues == 54 and ages.open.n > 0, ages\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_issue_summary_counts_each_projects_fold(data, fleet):
    summary = fleet.issue_summary(now=NOW)
    assert len(summary) == 9
    row = summary[(summary["machine"] == "laptop") & (summary["project"] == "web")].iloc[0]
    fold = issue_fold(MemoryStore(data["roots"]["laptop"], "web"), now=pd.Timestamp(NOW, unit="ms", tz="UTC"))
    assert row["issues"] == len(fold) and row["resolved"] == int((fold["state"] == "resolved").sum())


def test_lineage_summary_counts_each_projects_lineage_edges(data, fleet, inline):
    got = fleet.lineage_summary()
    pd.testing.assert_frame_equal(got, inline.lineage_summary())
    for m in MACHINES:
        for slug in SLUGS:
            df = records_frame(MemoryStore(data["roots"][m], slug))
            kinds = lineage_edges(df)["kind"].astype(str).value_counts()
            row = got[(got["machine"] == m) & (got["project"] == slug)].iloc[0]
            assert row["runs"] == len(df) and row["done"] == int((df["state"] == "done").sum())
            assert [row[k] for k in ("previous", "parent", "chat", "superseded")] == \
                [int(kinds.get(k, 0)) for k in ("previous", "parent", "chat", "superseded")]


def test_progress_bar_on_stderr_when_asked(fleet, capsys):
    fleet.progress = True
    try:
        fleet.issue_summary(now=NOW)
    finally:
        fleet.progress = False
    err = capsys.readouterr().err
    assert "fleet issues [" in err and f"{len(fleet.partitions)}/{len(fleet.partitions)}" in err


# --- report ------------------------------------------------------------------------------------


def test_report_writes_the_figures_and_a_page(fleet, tmp_path):
    res = fleet.report(tmp_path / "rep", now=NOW)
    names = sorted(Path(f).name for f in res.files)
    assert names == ["index.html", "issue-ages.png", "issue-summary.csv", "lineage-summary.csv", "lineage-summary.png"]
    for png in ("issue-ages.png", "lineage-summary.png"):
        assert (tmp_path / "rep" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "rep" / "index.html").read_text()
    assert 'src="issue-ages.png"' in page and 'src="lineage-summary.png"' in page
    assert (res.machines, res.projects, res.runs, res.issues, res.claimed) == (3, 3, 204, 54, 0)  # three projects, on each machine
    assert len(pd.read_csv(tmp_path / "rep" / "lineage-summary.csv")) == 9


# --- a fleet that holds bad files, copies and claims ---------------------------------------------
#
# Built from the fixtures: the laptop exports web, ci-1 exports api; then the damage is added by
# hand as another tool (or another machine) would. Each case gave a traceback, a run listed twice
# or a forged run ranked first before.


def _small_fleet(root: Path) -> Path:
    """The dataset, exported from a copy of the fixtures (an export notes itself in its memory root)."""
    memory = root / "memory"
    shutil.copytree(FIXTURES, memory, ignore=LEFTOVERS)
    dataset = root / "fleet"
    export_parquet(MemoryStore(memory, "web"), dataset, machine="laptop")
    export_parquet(MemoryStore(memory, "api"), dataset, machine="ci-1")
    return dataset


def _part(dataset: Path, table: str, machine: str, project: str) -> Path:
    (path,) = sorted((dataset / table / f"machine={machine}" / f"project={project}").glob("month=*/*.parquet"))
    return path


def _put(dataset: Path, table: str, machine: str, project: str, name: str, t) -> Path:
    import pyarrow.parquet as pq

    d = dataset / table / f"machine={machine}" / f"project={project}" / "month=2026-10"
    d.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, d / name)
    return d / name


def test_a_fifo_or_a_directory_in_the_dataset_is_skipped_never_waited_on(tmp_path):
    """Issue 29, item 4: a FIFO named like a part file hung `cybmem fleet search` forever."""
    from cybmem.errors import StoreError

    dataset = _small_fleet(tmp_path)
    part = _part(dataset, "records", "laptop", "web")
    fifo, folder = part.with_name("part-fifo.parquet"), part.with_name("part-dir.parquet")
    os.mkfifo(fifo)
    folder.mkdir()
    p = subprocess.run([sys.executable, "-m", "cybmem.cli", "fleet", "search", "flaky cart drawer test", "--dataset",
                        str(dataset), "-k", "3", "--scheduler", "inline"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    why = "not a regular file (a FIFO, socket, device or directory)"
    assert sorted(p.stderr.splitlines()) == [f"warning: skipped {folder}: {why}", f"warning: skipped {fifo}: {why}"]
    _, want_hits, *_ = _fleet_answers(dataset, tmp_path / "answers")
    assert [line.split()[4] for line in p.stdout.splitlines()[1:4]] == [h.run_id[:8] for h in want_hits[:3]]
    # A part file swapped for a FIFO after the scan is refused when it is read, not waited on.
    with Fleet(dataset, scheduler="inline") as f:
        part.unlink()
        os.mkfifo(part)
        with pytest.raises(StoreError, match="not a regular file"):
            f.search("flaky cart drawer test", k=3, as_of=NOW)


def _fleet_answers(dataset: Path, tmp_path: Path, query: str = "flaky cart drawer test"):
    """Search, issues and the report of the dataset, in this process; the fleet for its notes."""
    with Fleet(dataset, scheduler="inline") as f:
        hits = f.search(query, k=5, as_of=NOW).hits
        summary = f.issue_summary(now=NOW)
        report = f.report(tmp_path / "report", now=NOW)
        lineage = f.lineage_summary()
    return f, hits, summary, report, lineage


@pytest.mark.filterwarnings("ignore:The inplace keyword in DataFrame.reset_index is deprecated")
def test_a_fleet_with_bad_part_files_skips_each_with_one_line(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    dataset = _small_fleet(tmp_path)
    web_part, events_part = _part(dataset, "records", "laptop", "web"), _part(dataset, "issues", "laptop", "web")
    web = pq.read_table(web_part)
    bad = {
        _put(dataset, "records", "evil", "web", "part-a.parquet", web.drop_columns(["runId"])): "no runId column",
        _put(dataset, "records", "evil", "web", "part-b.parquet",
             web.set_column(0, "runId", pa.array(range(web.num_rows), pa.int64()))): "its runId column holds integer, not text",
        _put(dataset, "records", "laptop", "web", "part-c.parquet",
             web.set_column(web.column_names.index("endedAt"), "endedAt", pa.array(["soon"] * web.num_rows))):
            "its endedAt column holds text, not time",
        _put(dataset, "issues", "laptop", "web", "part-d.parquet", pq.read_table(events_part).drop_columns(["issueId"])):
            "no issueId column",
    }
    garbage = _part(dataset, "records", "ci-1", "api").with_name("part-e.parquet")
    garbage.write_bytes(b"PAR1 not parquet at all")
    truncated = web_part.with_name("part-f.parquet")
    truncated.write_bytes(web_part.read_bytes()[:-100])
    clean = _small_fleet(tmp_path / "clean")
    f, hits, summary, report, lineage = _fleet_answers(dataset, tmp_path)
    _, want_hits, want_summary, want_report, _ = _fleet_answers(clean, tmp_path / "clean")
    assert len(f.skipped) == 6 and all(line.startswith("skipped ") for line in f.skipped)
    for path, why in bad.items():
        assert f"skipped {path}: {why}" in f.skipped
    assert any(line.startswith(f"skipped {garbage}: not a readable Parquet file") for line in f.skipped)
    assert any(line.startswith(f"skipped {truncated}: not a readable Parquet file") for line in f.skipped)
    assert [(h.machine, h.run_id, h.score) for h in hits] == [(h.machine, h.run_id, h.score) for h in want_hits]
    pd.testing.assert_frame_equal(summary, want_summary)
    assert (report.runs, report.issues, report.projects, report.machines) == (want_report.runs, want_report.issues, 2, 2)
    assert "Left out: skipped " in (tmp_path / "report" / "index.html").read_text()
    res = cli("fleet", "search", "flaky cart drawer test", "--dataset", dataset, "-k", "3", "--scheduler", "inline")
    assert res.exit_code == 0 and "Traceback" not in res.output
    assert res.stderr.splitlines() == [f"warning: {line}" for line in f.skipped]
    for args in (["issues"], ["report", "--out", tmp_path / "r2"]):
        res = cli("fleet", *args, "--dataset", dataset, "--scheduler", "inline")
        assert res.exit_code == 0 and res.stderr.count("\n") == 6, res.output


def test_a_run_exported_twice_by_one_machine_is_one_run(tmp_path):
    import pyarrow.parquet as pq

    dataset = _small_fleet(tmp_path)
    web, events = _part(dataset, "records", "laptop", "web"), _part(dataset, "issues", "laptop", "web")
    t = pq.read_table(web)
    newer = t.set_column(t.column_names.index("summary"), "summary", pa_strings([f"re-exported {i}" for i in range(t.num_rows)]))
    _put(dataset, "records", "laptop", "web", web.name.replace("part-", "part-9"), newer)  # a later export of every run
    _put(dataset, "issues", "laptop", "web", events.name.replace("part-", "part-9"), pq.read_table(events))
    f, hits, summary, report, lineage = _fleet_answers(dataset, tmp_path)
    _, want_hits, want_summary, want_report, want_lineage = _fleet_answers(_small_fleet(tmp_path / "clean"), tmp_path / "c")
    assert [h.run_id for h in hits] == [h.run_id for h in want_hits], "each run once"
    assert all(h.summary.startswith("re-exported") for h in hits if h.machine == "laptop"), "the last export wins"
    assert not any(h.claimed_by for h in hits) and f.claims == {}
    pd.testing.assert_frame_equal(summary, want_summary)
    pd.testing.assert_frame_equal(lineage, want_lineage)
    assert (report.runs, report.issues) == (want_report.runs, want_report.issues) == (62, 15)


def pa_strings(values):
    import pyarrow as pa

    return pa.array(values, pa.string())


def test_a_machine_cannot_speak_for_run_ids_another_exported_first(tmp_path):
    import pyarrow.parquet as pq

    dataset = _small_fleet(tmp_path)
    t = pq.read_table(_part(dataset, "records", "laptop", "web"))
    forged = t.set_column(t.column_names.index("task"), "task", pa_strings(["flaky cart drawer test, flaky cart drawer test"] * t.num_rows))
    _put(dataset, "records", "evil", "web", "part-29991231T000000000000Z-forged.parquet", forged)
    own = _put(dataset, "records", "evil", "other", "part-29991231T000000000000Z-own.parquet",
               forged.slice(0, 1).set_column(0, "runId", pa_strings(["evil-own-run"])))
    f, hits, summary, report, lineage = _fleet_answers(dataset, tmp_path)
    _, want_hits, _, want_report, _ = _fleet_answers(_small_fleet(tmp_path / "clean"), tmp_path / "c")
    assert own.exists() and [h.machine for h in hits if h.run_id == "evil-own-run"] == ["evil"], "its own runs count"
    rest = [h for h in hits if h.run_id != "evil-own-run"]
    assert [(h.machine, h.run_id, h.task) for h in rest] == [(h.machine, h.run_id, h.task) for h in want_hits[:len(rest)]], \
        "the forged copies neither outrank nor replace the laptop's runs"
    assert all(h.claimed_by == ["laptop/web", "evil/web"] and h.conflict for h in rest)
    assert len(f.claims) == t.num_rows and all(c.owner == ("laptop", "web") for c in f.claims.values())
    assert report.runs == want_report.runs + 1 and report.claimed == t.num_rows
    assert lineage.set_index(["machine", "project"])["runs"].to_dict() == {
        ("ci-1", "api"): 15, ("evil", "other"): 1, ("laptop", "web"): 47}  # evil/web owns none of its runs
    res = cli("fleet", "search", "flaky cart drawer test", "--dataset", dataset, "-k", "3", "--as-of", NOW, "--scheduler", "inline")
    lines = res.stdout.splitlines()
    assert res.exit_code == 0 and lines[2].split()[2] == "laptop*"
    assert f"* run {rest[0].run_id[:8]} was exported by laptop/web, evil/web with different records; shown as laptop/web, " \
           "the first to export it." in lines
    got = json.loads(cli("fleet", "search", "flaky cart drawer test", "--dataset", dataset, "-k", "2", "--json",
                         "--as-of", NOW, "--scheduler", "inline").stdout)
    assert got["hits"][1]["claimedBy"] == ["laptop/web", "evil/web"] and got["hits"][1]["conflict"] is True


def test_one_project_exported_by_two_machines_is_one_project(tmp_path):
    dataset = _small_fleet(tmp_path)
    export_parquet(MemoryStore(tmp_path / "memory", "web"), dataset, machine="laptop-2")  # a shared disk: the same memory
    f, hits, summary, report, lineage = _fleet_answers(dataset, tmp_path)
    _, want_hits, _, want_report, _ = _fleet_answers(_small_fleet(tmp_path / "clean"), tmp_path / "c")
    assert (report.projects, report.machines, report.runs, report.claimed) == (2, 3, want_report.runs, 47)
    assert report.issues == want_report.issues == 15, "the copy's ledger is the owner's to tell: each issue once"
    assert [(h.machine, h.run_id) for h in hits] == [(h.machine, h.run_id) for h in want_hits]
    assert all(h.claimed_by == ["laptop/web", "laptop-2/web"] and not h.conflict for h in hits if h.machine == "laptop")
    res = cli("fleet", "report", "--dataset", dataset, "--out", tmp_path / "r", "--now", "2026-12-01", "--scheduler", "inline")
    assert res.exit_code == 0 and ": 62 runs and 15 issues of 2 projects on 3 machines. 47 run ids exported by more " \
        "than one machine or project count once." in res.stdout


# --- errors ------------------------------------------------------------------------------------


def test_bad_dataset_dirs_are_named(tmp_path):
    with pytest.raises(NotFoundError, match="no dataset at .*nowhere; write one with `cybmem export parquet"):
        Fleet(tmp_path / "nowhere", scheduler="inline")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValidationError, match="not a cybmem Parquet dataset .no records/ or issues/"):
        Fleet(tmp_path / "plain", scheduler="inline")
    (tmp_path / "empty" / "records").mkdir(parents=True)
    with pytest.raises(ValidationError, match="holds no Parquet files yet"):
        Fleet(tmp_path / "empty", scheduler="inline")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValidationError, match="is a file"):
        Fleet(tmp_path / "file", scheduler="inline")


def test_no_such_machine_lists_the_machines(data):
    with pytest.raises(NotFoundError, match=r"no machine 'ci-9' in the dataset .*; it holds machines ci-1, ci-2, laptop"):
        Fleet(data["dataset"], machines=["ci-9"], scheduler="inline")
    with pytest.raises(NotFoundError, match="no project 'shop'"):
        Fleet(data["dataset"], projects=["shop"], scheduler="inline")


def test_unreachable_scheduler_names_the_address(data):
    with pytest.raises(FleetError, match=r"cannot reach the Dask scheduler at tcp://127.0.0.1:9 within 1 s"):
        Fleet(data["dataset"], scheduler="tcp://127.0.0.1:9", timeout=1)


def test_cli_project_and_machine_options_narrow_the_fleet(data):
    """fleet's own --project/-p (a list, unlike the other commands' one project) reaches the Fleet."""
    res = cli("fleet", "issues", "--dataset", data["dataset"], "-p", "api", "--machine", "ci-1", "--json")
    assert res.exit_code == 0, res.output
    assert {(r["machine"], r["project"]) for r in json.loads(res.stdout)} == {("ci-1", "api")}
    res = cli("fleet", "issues", "--dataset", data["dataset"], "-p", "shop")
    assert res.exit_code == 1 and res.stderr.startswith("Error: no project 'shop'")


def test_cli_errors_are_one_line(data, tmp_path):
    res = cli("fleet", "search", "x", "--dataset", tmp_path / "nowhere")
    assert res.exit_code == 1 and res.stderr.startswith("Error: no dataset at") and res.stderr.count("\n") == 1
    res = cli("fleet", "issues", "--dataset", data["dataset"], "--machine", "ci-9")
    assert res.exit_code == 1 and res.stderr.startswith("Error: no machine 'ci-9'")
    res = cli("fleet", "issues", "--dataset", data["dataset"], "--scheduler", "tcp://127.0.0.1:9", "--timeout", "1", "--json")
    assert res.exit_code == 1 and "tcp://127.0.0.1:9" in json.loads(res.stderr)["error"]


@pytest.mark.parametrize("args,hint", [
    (["fleet", "find", "x"], "ACTION"),
    (["fleet", "search"], "QUERY"),
    (["fleet", "issues", "extra"], "unexpected extra argument(s) (extra)"),
    (["fleet", "report"], "--out"),
    (["fleet", "search", "x", "--open"], "--open"),
    (["fleet", "issues", "--explain"], "--explain"),
])
def test_cli_usage_mistakes_exit_2(data, args, hint):
    res = cli(*args, "--dataset", data["dataset"])
    assert res.exit_code == 2 and hint in res.output


def test_cli_search_in_a_subprocess_on_a_local_cluster_of_processes(data):
    """The console script, a LocalCluster of worker processes (shards pickled), JSON equal to the library's."""
    out = subprocess.run([sys.executable, "-m", "cybmem.cli", "fleet", "search", "cart drawer postgres", "--dataset",
                          str(data["dataset"]), "-k", "5", "--scheduler", "local", "--workers", "2", "--json", "--as-of", str(NOW)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    got = json.loads(out.stdout)
    want = search(data["merged"], "cart drawer postgres", k=5, as_of=NOW, weights=Weights(), settings=Settings.from_env())
    assert [(h["runId"], h["score"]) for h in got["hits"]] == [(h.run_id, round(h.score, 6)) for h in want.hits]
    assert got["hits"][0]["machine"] in MACHINES and got["scheduler"] == "local"


def test_cli_text_outputs(fleet, data, tmp_path, monkeypatch):
    import cybmem.exchange.fleet as F

    real = F.Fleet
    monkeypatch.setattr(F, "Fleet", lambda *a, **kw: real(*a, **{**kw, "processes": False}))
    res = cli("fleet", "issues", "--dataset", data["dataset"], "--now", "2026-12-01", "--workers", "1")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["MACHINE", "PROJECT", "ISSUES", "OPEN", "RESOLVED", "WONTFIX", "REOPENS", "MEDIAN", "OPEN",
                                "AGE", "(D)"]
    assert len(lines) == 11 and lines[1].split()[:3] == ["ci-1", "api", "5"]
    assert re.fullmatch(r"Ran in this process \(under \d+ MB of Parquet, a LocalCluster costs more than it saves\)\.",
                        lines[-1]), lines[-1]
    res = cli("fleet", "issues", "--dataset", data["dataset"], "--open", "-n", "2", "--now", "2026-12-01", "--workers", "1")
    assert res.exit_code == 0 and res.stdout.splitlines()[-2].startswith("... 7 more open issues")
    res = cli("fleet", "search", "flaky cart drawer", "--dataset", data["dataset"], "-k", "2", "--machine", "laptop",
              "--workers", "1")
    assert res.exit_code == 0 and len(res.stdout.splitlines()) == 4 and "laptop" in res.stdout.splitlines()[1]
    assert res.stdout.splitlines()[-1].startswith("Ran in this process (")
    res = cli("fleet", "report", "--dataset", data["dataset"], "--out", tmp_path / "r", "--now", "2026-12-01", "--workers", "1")
    assert res.exit_code == 0 and res.stdout.startswith("Wrote issue-ages.png, lineage-summary.png")


def test_a_running_cluster_by_its_address(data):
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster:
        with Fleet(data["dataset"], scheduler=cluster.scheduler_address) as f:
            assert int(f.issue_summary(now=NOW)["issues"].sum()) == 54
        assert len(cluster.scheduler.clients) <= 1  # the fleet's client is gone; the cluster stays up


def test_the_console_script_ends_fleet_commands_without_arrows_teardown(data):
    """Arrow's thread pools, left behind by a Parquet read, abort a process at the interpreter's
    teardown now and then ("terminate called without an active exception", apache/arrow#34314; a CI
    run lost a USAGE example to it): the fleet commands end once their output is flushed, like the
    lean commands, and print all of it."""
    code = ("import atexit, sys\natexit.register(lambda: print('TEARDOWN', file=sys.stderr))\n"
            "from cybmem.cli.app import console\n"
            f"sys.argv = ['cybmem', 'fleet', 'search', 'cart drawer postgres', '--dataset', {str(data['dataset'])!r}, '-k', '5',"
            f" '--scheduler', 'inline', '--json', '--as-of', '{NOW}']\nconsole()\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "TEARDOWN" not in p.stderr, p.stderr
    assert len(json.loads(p.stdout)["hits"]) == 5
