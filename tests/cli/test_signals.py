"""Ctrl-C on a bad day: every verb ends with exit 130 and one line on stderr, no traceback, and
no output file left half-written. Real subprocesses of the console script get a real SIGINT
(to their process group, as a terminal sends it) while they work on a store large enough to be
caught in the middle."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cybmem._io import TMP_PREFIX

from conftest import MIN, T0

INTERRUPTED = "cybmem: interrupted"
WORDS = ("fixture scope cache plugin marker assertion rewrite collection parametrize tmp path capture "
         "warnings junit xdist teardown setup session module class function skip xfail deprecation").split()


def _store(root: Path, n: int) -> Path:
    """A project of ``n`` runs (records and a ledger), written as the store format lays them out."""
    rng = random.Random(18)
    records = root / "big" / "records"
    records.mkdir(parents=True)
    events = []
    for i in range(n):
        rid = f"{i:08x}-0000-4000-8000-{rng.getrandbits(48):012x}"
        task = " ".join(rng.choice(WORDS) for _ in range(12))
        issue = f"issue-{i % 400}"
        rec = {"runId": rid, "cwd": "/home/dev/big", "workflowName": "implement-task", "task": task, "state": "done",
               "startedAt": T0 + i * MIN, "endedAt": T0 + i * MIN + 30_000, "lineage": {},
               "outcome": {"summary": task, "accomplished": [], "issues": [issue], "next": []}, "workers": []}
        (records / f"{rid}.json").write_text(json.dumps(rec))
        if i < 400:
            events.append({"issueId": issue, "at": T0 + i * MIN + 30_000, "event": "opened", "byRunId": rid,
                           "title": f"Issue {i}"})
        elif i % 7 == 0:
            events.append({"issueId": issue, "at": T0 + i * MIN + 30_000, "event": "resolved" if i % 2 else "reopened",
                           "byRunId": rid})
    (root / "big" / "issues.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (root / "projects.json").write_text(json.dumps({"big": {"cwd": "/home/dev/big"}}))
    return root


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    """6000 runs, shared by the tests: with no cache (.nocache) every verb parses every record,
    long enough to be caught at work, and none writes into the store."""
    from cybmem.store.memory_store import MemoryStore

    root = _store(tmp_path_factory.mktemp("interrupt") / "memory", 6000)
    MemoryStore(root, "big").rebuild_index()
    (root / ".nocache").touch()
    return root


def _children(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (a notebook kernel runs in a session of its own)."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def _alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if Path(f"/proc/{pid}").exists()}


def _reading(store: Path):
    """At work: the process has a record file of ``store`` open (it is parsing the records)."""
    def ready(pid: int) -> bool:
        fds = Path(f"/proc/{pid}/fd")
        try:
            names = os.listdir(fds)
        except OSError:
            return False
        for name in names:
            try:
                if os.readlink(fds / name).startswith(str(store)):
                    return True
            except OSError:
                continue
        return False
    return ready


def _writing(out: Path):
    """At work: something (a temp file, the database) has appeared in ``out``."""
    return lambda pid: out.exists() and any(out.rglob("*"))


def _says(path: Path, marker: str):
    """At work: ``marker`` is on the process' stderr (``path``)."""
    return lambda pid: marker.encode() in path.read_bytes()


def _interrupt(args: list[str], *, env: dict, ready, cwd: Path, after: float = 0.0) -> subprocess.CompletedProcess:
    """Run ``cybmem ARGS``; once ``ready(pid)`` says it is at work, wait ``after`` seconds and send
    SIGINT to its process group (a terminal's Ctrl-C). The test fails when it finished first. The
    processes it had started by then and that outlive it are killed and listed in ``orphans``."""
    exe = shutil.which("cybmem")
    cmd = [exe, *args] if exe else [sys.executable, "-c", "from cybmem.cli.app import console; console()", *args]
    err_path = cwd / "stderr.txt"
    with open(err_path, "w+b") as err:
        # A shell in the background starts children with SIGINT ignored; a terminal's do not.
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env, cwd=cwd, start_new_session=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            deadline = time.monotonic() + 120
            while not ready(p.pid):
                assert p.poll() is None, f"finished before it was seen at work: {err_path.read_text()}"
                assert time.monotonic() < deadline, "no sign of work after 120 s"
                time.sleep(0.005)
            time.sleep(after)
            assert p.poll() is None, "finished before the interrupt: give it more to do"
            children = _children(p.pid)
            os.killpg(p.pid, signal.SIGINT)
            out, _ = p.communicate(timeout=90)
        finally:
            if p.poll() is None:
                p.kill()
            p.communicate()
    result = subprocess.CompletedProcess(cmd, p.returncode, out.decode(), err_path.read_text())
    for _ in range(50):
        if not _alive(children):
            break
        time.sleep(0.1)
    result.orphans = _alive(children)
    for pid in result.orphans:
        os.kill(pid, signal.SIGKILL)  # started by this test's process: none may outlive it
    return result


def _leftovers(where: Path) -> list[str]:
    return sorted(str(p) for p in where.rglob("*") if p.name.startswith(TMP_PREFIX))


def _check(p: subprocess.CompletedProcess) -> None:
    assert p.returncode == 130, (p.returncode, p.stderr[-3000:])
    lines = [line for line in p.stderr.replace("\r", "\n").splitlines() if line.strip()]
    assert lines[-1] == INTERRUPTED and lines.count(INTERRUPTED) == 1, p.stderr[-3000:]
    assert "Traceback" not in p.stderr and "Error" not in p.stderr, p.stderr[-3000:]


def _env(root: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CYBERINE_")}
    return {**env, "CYBERINE_MEMORY_DIR": str(root)}


@pytest.mark.parametrize("verb", ["search", "tune", "export-parquet", "export-csv", "export-sqlite"])
def test_ctrl_c_ends_a_verb_with_130_one_line_and_no_partial_file(big, tmp_path, verb):
    out = tmp_path / "out"
    out.mkdir()
    records = big / "big" / "records"
    args, ready = {
        "search": (["search", "fixture scope cache", "-p", "big"], _reading(records)),
        # Its records are parsed in a blink now (the Arrow tokenizer): caught in its grid, the long part.
        "tune": (["tune", "-p", "big", "--progress", "--steps", "21"], _says(tmp_path / "stderr.txt", "grid mrr@10")),
        "export-parquet": (["export", "parquet", "--all", "--out", str(out / "fleet"), "--progress"], _writing(out)),
        "export-csv": (["export", "csv", "-p", "big", "--out", str(out / "runs.csv"), "--progress"], _reading(records)),
        "export-sqlite": (["export", "sqlite", "--all", "--out", str(out / "memory.sqlite"), "--progress"], _writing(out)),
    }[verb]
    p = _interrupt(args, env=_env(big), ready=ready, cwd=tmp_path)
    _check(p)
    if p.stdout and verb == "search":
        # Its records are read in a few milliseconds: a Ctrl-C may come once the answer is out (the
        # last open of records/ the test saw was after it), and then the answer is whole.
        whole = subprocess.run([shutil.which("cybmem") or "cybmem", *args], env=_env(big), cwd=tmp_path,
                               capture_output=True, text=True, timeout=120)
        assert whole.returncode == 0 and p.stdout == whole.stdout, "a partial answer"
    elif p.stdout and verb == "export-parquet":
        # A quick machine writes the 6,000 records before the Ctrl-C lands (seen on a clone's run): then
        # the dataset is whole, every part file below readable, and the command said so.
        assert p.stdout.startswith("Wrote 6000 new records"), p.stdout
    else:
        assert p.stdout == ""
    assert not any(out.rglob("*.csv")) and not any(out.rglob("*.sqlite*")), sorted(map(str, out.rglob("*")))
    for part in out.rglob("*.parquet"):  # a partition written before the interrupt is whole
        import pyarrow.parquet as pq

        pq.read_metadata(part)
    assert _leftovers(tmp_path) == [] and _leftovers(big) == []


def test_ctrl_c_in_report_stops_the_kernel_and_leaves_whole_pages(big, tmp_path):
    out = tmp_path / "site"
    p = _interrupt(["report", "-p", "big", "--out", str(out), "--no-progress"], env=_env(big), after=1.5,
                   ready=_says(tmp_path / "stderr.txt", "] 01-history.ipynb: executing"), cwd=tmp_path)
    _check(p)
    for page in out.glob("*.html"):
        assert page.read_text().rstrip().endswith("</html>"), page
    assert not (out / "index.html").exists()
    assert _leftovers(tmp_path) == [] and _leftovers(big) == []
    assert p.orphans == set(), "the notebook kernel outlived the report"
