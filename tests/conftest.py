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
def fixture_copy(tmp_path) -> Path:
    """A private copy of data-fixtures/memory (tests may write to it)."""
    dst = tmp_path / "fixtures-memory"
    shutil.copytree(FIXTURES, dst, ignore=shutil.ignore_patterns(".cache", ".lock", ".projects.lock"))
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


CORPORA = Path(os.environ.get("CYBMEM_CORPORA") or REPO.parent / "shared" / "corpora")


@pytest.fixture(scope="session")
def corpus_1k(tmp_path_factory) -> Path:
    """The 1,000-run pytest corpus (../shared/corpora), unpacked once per session: a memory root."""
    import tarfile

    archive = CORPORA / "pytest-memory-1k.tar.gz"
    if not archive.is_file():
        raise FileNotFoundError(f"{archive} is missing; set CYBMEM_CORPORA to the directory holding the corpora")
    dest = tmp_path_factory.mktemp("corpus")
    with tarfile.open(archive, "r:gz") as tf:
        tf.extractall(dest, filter="data")
    return dest / "pytest-memory-1k"
