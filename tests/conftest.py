"""Shared fixtures: every test gets its own memory root; no test touches a real home."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "data-fixtures" / "memory"

T0 = 1_761_955_200_000  # 2025-11-01T00:00:00Z
MIN = 60_000


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path, monkeypatch):
    for key in list(os.environ):
        if key.startswith("CYBERINE_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("COLUMNS", "120")  # tables fit the terminal: give every test the same one
    root = tmp_path / "memory"
    monkeypatch.setenv("CYBERINE_MEMORY_DIR", str(root))
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return root


@pytest.fixture
def memory_root(tmp_path) -> Path:
    return tmp_path / "memory"


@pytest.fixture
def settings(memory_root):
    from cybmem.settings import Settings

    return Settings.from_env()


@pytest.fixture
def linear_ranker(monkeypatch):
    """Rank with CYBERINE_MEMORY_RANKER=linear, for a module whose tests check the linear formula's
    order or outputs written with it (``pytestmark = pytest.mark.usefixtures("linear_ranker")``; the
    learned ranker, the default since issue 39, is tested in tests/retrieval/test_ranker.py and USAGE.md)."""
    monkeypatch.setenv("CYBERINE_MEMORY_RANKER", "linear")


#: What a copy of the fixtures leaves out: the files cybmem or a user's earlier commands may have
#: left in the checkout's data-fixtures (README's first command keeps what it showed in
#: web/shown.jsonl), so every test starts from what the repository holds.
LEFTOVERS = shutil.ignore_patterns(".cache", "*.lock", "shown.jsonl", "used.jsonl", ".retune.json",
                                   "redact-pending.json", "exports.json", "__pycache__")


@pytest.fixture
def fixture_copy(tmp_path) -> Path:
    """A private copy of data-fixtures/memory (tests may write to it)."""
    dst = tmp_path / "fixtures-memory"
    shutil.copytree(FIXTURES, dst, ignore=LEFTOVERS)
    return dst


def make_run(run_id: str, task: str = "Fix the login form", *, state: str = "done", start: int = T0, minutes: int = 10,
             output: str | None = None, cwd: str = "/home/dev/web", **extra) -> dict:
    """A run.json as the orchestrator writes it."""
    run = {
        "id": run_id,
        "cwd": cwd,
        "workflowName": "implement-task",
        "task": task,
        "status": state,
        "startedAt": start,
        "endedAt": start + minutes * MIN,
        "workers": [{"agentId": "impl-1", "provider": "anthropic", "state": "done", "output": output or "Did it.\n\nACCOMPLISHED:\n- did it\nISSUES:\n- none\nNEXT:\n- none"}],
    }
    run.update(extra)
    return run


def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


# --- a large synthetic history, for figures at scale ------------------------------------------


def synthetic_history(n: int = 100_000, *, seed: int = 7):
    """A records frame (the columns of cybmem.explore.frames.records_frame) and an issue fold of ``n`` runs.

    Shaped like a long real history: a run about every hour for years, almost all done, 3% of
    runs dispatched by an earlier one (some runs dispatch dozens: large trees), chat sessions,
    a few corrections; about 0.6 issues per run, most resolved at the moment they were opened,
    a few reopened. Built vectorised, once per session (about a second).
    """
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    ids = np.array([f"{a:016x}{b:016x}" for a, b in rng.integers(0, 2**63, size=(n, 2))], dtype=object)
    ids = np.array([f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}" for x in ids], dtype=object)
    t0 = pd.Timestamp("2014-01-01", tz="UTC").value // 1_000_000
    ended = t0 + np.cumsum(rng.exponential(3_600_000, n)).astype(np.int64)
    started = ended - rng.exponential(600_000, n).astype(np.int64)
    state = rng.choice(np.array(["done", "error", "cancelled"], dtype=object), n, p=[0.975, 0.02, 0.005])
    parent_idx = np.full(n, -1)
    dispatched = np.flatnonzero(rng.random(n) < 0.03)
    dispatched = dispatched[dispatched > 200]
    parent_idx[dispatched] = dispatched - rng.integers(1, 200, len(dispatched))
    for hub in rng.choice(np.arange(1000, n - 1000), 25, replace=False):  # runs that dispatch dozens
        kids = hub + np.sort(rng.choice(np.arange(1, 400), rng.integers(10, 40), replace=False))
        parent_idx[kids[kids < n]] = hub
    root_idx = np.arange(n)
    for i in np.flatnonzero(parent_idx >= 0):  # parents come first, so one pass finds every root
        root_idx[i] = root_idx[parent_idx[i]]
    chat = np.full(n, None, dtype=object)
    in_chat = np.flatnonzero(rng.random(n) < 0.01)
    chat[in_chat] = [f"chat-{k}" for k in (in_chat // 500)]
    words = np.array(["cache", "parser", "fixture", "login form", "report", "plugin", "CLI", "docs"], dtype=object)
    task = np.array([f"Fix the {w} ({i})" for i, w in enumerate(rng.choice(words, n))], dtype=object)
    merge = rng.random(n) < 0.3
    task[merge] = [f"Merge pull request #{i} from dev/branch-{i}\n\nImprove the {w}"
                   for i, w in zip(np.flatnonzero(merge), rng.choice(words, int(merge.sum())))]
    supersedes = np.full(n, None, dtype=object)
    fixes = rng.choice(np.arange(10, n), 40, replace=False)
    supersedes[fixes] = ids[fixes - 1]
    superseded = np.zeros(n, dtype=bool)
    superseded[fixes - 1] = True
    superseded_by = np.full(n, None, dtype=object)
    superseded_by[fixes - 1] = ids[fixes]
    ts = lambda ms: pd.to_datetime(ms, unit="ms", utc=True).astype("datetime64[ms, UTC]")  # noqa: E731
    strings = lambda a: pd.array(a, dtype="string")  # noqa: E731
    records = pd.DataFrame({
        "runId": strings(ids), "cwd": strings(np.full(n, "/home/dev/big", dtype=object)),
        "workflowName": strings(np.full(n, "implement-task", dtype=object)), "task": strings(task),
        "state": strings(state), "startedAt": ts(started), "endedAt": ts(ended),
        "parentRunId": strings(np.where(parent_idx >= 0, ids[np.maximum(parent_idx, 0)], None)),
        "chatSessionId": strings(chat),
        "previousRunId": strings(np.concatenate([[None], ids[:-1]])),
        "rootRunId": strings(ids[root_idx]), "summary": strings(task),
        "supersededBy": strings(superseded_by), "supersedes": strings(supersedes),
        "superseded": superseded,
    })
    records["durationS"] = (records["endedAt"] - records["startedAt"]).dt.total_seconds()

    m = int(n * 0.6)
    opened_run = np.sort(rng.integers(0, n, m))
    opened_at = ended[opened_run]
    issue_state = rng.choice(np.array(["opened", "resolved", "reopened", "wontfix"], dtype=object), m,
                             p=[0.55, 0.40, 0.01, 0.04])
    closed = np.isin(issue_state, ["resolved", "wontfix"])
    to_close = np.where(rng.random(m) < 0.6, 0, rng.lognormal(np.log(3 * 86_400_000), 2.0, m)).astype(np.int64)
    now = int(ended.max())
    resolved_at = np.where(closed, np.minimum(opened_at + to_close, now), -1)
    reopens = np.where(issue_state == "reopened", rng.integers(1, 4, m), (rng.random(m) < 0.002).astype(np.int64))
    fold = pd.DataFrame({
        "issueId": strings(np.array([f"issue-{i}" for i in range(m)], dtype=object)),
        "title": strings(np.array([f"Issue {i}" for i in range(m)], dtype=object)),
        "state": strings(issue_state), "openedAt": ts(opened_at),
        "resolvedAt": ts(np.where(closed, resolved_at, np.iinfo(np.int64).min)),
        "lastAt": ts(np.where(closed, resolved_at, opened_at)),
        "openAge": pd.to_timedelta(np.where(closed, np.iinfo(np.int64).min, now - opened_at), unit="ms"),
        "timeToResolve": pd.to_timedelta(np.where(closed, resolved_at - opened_at, np.iinfo(np.int64).min), unit="ms"),
        "reopenCount": reopens, "events": 1 + closed.astype(np.int64) + reopens,
    })
    return records, fold


def synthetic_snapshot(n=3000, seed=7):
    """An in-memory snapshot with many keyword matches and big lineage groups per query (the ranking
    tests of tests/retrieval/test_search.py and test_candidates.py)."""
    import random

    import pyarrow as pa

    from cybmem.store.snapshot import Snapshot
    from cybmem.store.keyword_index import KeywordIndex
    from cybmem.store.tokens import tokenize

    rng = random.Random(seed)
    words = "cart drawer test flaky login checkout fix add page api search fixture order teardown".split()
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(n)]
    ids = [f"r{i:05d}" for i in range(n)]
    ended = [T0 + i * 3_600_000 for i in range(n)]
    roots = [f"r{(i // 50) * 50:05d}" for i in range(n)]
    parents = [ids[i - 1] if i % 7 == 0 and i else None for i in range(n)]
    chats = [f"chat-{i % 13}" if i % 5 == 0 else None for i in range(n)]
    nulls = pa.nulls(n, pa.string())
    table = pa.table({
        "runId": ids, "parentRunId": pa.array(parents, pa.string()), "previousRunId": pa.array([None] + ids[:-1], pa.string()),
        "rootRunId": roots, "chatSessionId": pa.array(chats, pa.string()),
        "endedAt": pa.array(ended, pa.int64()).cast(pa.timestamp("ms", tz="UTC")), "supersedes": nulls, "supersededBy": nulls,
    })
    return Snapshot(None, table, None, KeywordIndex.build([tokenize(t) for t in texts]))


@pytest.fixture(scope="session")
def history_100k():
    """The 100,000-run synthetic history, built once per session."""
    return synthetic_history(100_000)


@pytest.fixture(scope="session")
def figures_dir() -> Path:
    """Where figure tests leave their PNGs for a person to look at: benchmarks/out/figures/tests/
    (git-ignored; CYBMEM_FIGURES_DIR elsewhere)."""
    out = Path(os.environ.get("CYBMEM_FIGURES_DIR") or REPO / "benchmarks" / "out" / "figures" / "tests")
    out.mkdir(parents=True, exist_ok=True)
    return out


# --- no test leaves a cache in the repository's fixtures -------------------------------------------


def pytest_sessionfinish(session, exitstatus):
    """Fail the run when data-fixtures/ holds a .cache/ (or an exports.json: an export noted in the
    store it read) afterwards: tests and notebooks read copies."""
    left = sorted(str(p.relative_to(REPO)) for name in (".cache", "exports.json")
                  for p in (REPO / "data-fixtures").rglob(name))
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = (f"data-fixtures holds {', '.join(left)} after the tests: a test or notebook read the fixtures "
                   "in place; read a copy (the fixture_copy fixture, notebooks/conftest.py)")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(f"ERROR: {message}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

