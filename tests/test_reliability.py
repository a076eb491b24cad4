"""Many real processes writing at once, and writers killed with SIGKILL in the middle of writes.

Two tests:

* the stress test: 8 writer processes (6 `multiprocessing` workers calling the library and 2
  loops of the real `cybmem write` console script) plus 1 reader process running search and
  inject (which refresh the Arrow cache concurrently), writing records and issue events to
  shared projects and registering new projects, including same-basename collisions, until
  they have written STRESS_ENTRIES records and events together (about 10 s on two idle cores;
  a busy machine takes longer, up to STRESS_SECONDS);
* the kill test: writer processes (library loops and `cybmem write`) killed with SIGKILL at
  random moments, at least 50 times; then `cybmem doctor` finds only crash debris, `--repair`
  rebuilds the derived files and a second `doctor` reports clean.

Set CYBMEM_STRESS_ENTRIES (and CYBMEM_STRESS_SECONDS) to run the stress test longer.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson

from conftest import MIN, T0

STRESS_ENTRIES = int(os.environ.get("CYBMEM_STRESS_ENTRIES", "1000"))
STRESS_SECONDS = float(os.environ.get("CYBMEM_STRESS_SECONDS", "90"))  # a guard: the work ends it
LIB_WRITERS = 6
CLI_WRITERS = 2
KILLS = 50

MAIN_CWD = "/stress/home/web"
SHARED_CWDS = [MAIN_CWD, MAIN_CWD, MAIN_CWD, "/stress/home/api", "/stress/clients/web"]  # /clients/web collides


def _cli() -> list[str]:
    exe = shutil.which("cybmem")
    return [exe] if exe else [sys.executable, "-m", "cybmem.cli"]


def _env(root: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CYBERINE_")}
    env["CYBERINE_MEMORY_DIR"] = str(root)
    return env


def _run_obj(rid: str, n: int, cwd: str, rng: random.Random) -> dict:
    """A run whose trailer opens a contended shared issue, often a unique one, and sometimes resolves one."""
    shared = rng.randrange(12)
    issues = [f"- Shared flaky {shared}: fails now and then"]
    if rng.random() < 0.6:
        issues.append(f"- Unique problem {rid}: seen once")
    accomplished = [f"- built step {n}"]
    if rng.random() < 0.3:
        accomplished.append(f"- resolved shared-flaky-{rng.randrange(12)}")
    output = "Done.\n\nACCOMPLISHED:\n" + "\n".join(accomplished) + "\nISSUES:\n" + "\n".join(issues) + "\nNEXT:\n- keep going\n"
    start = T0 + n * MIN + rng.randrange(MIN)
    return {
        "id": rid, "cwd": cwd, "workflowName": "implement-task", "status": "done",
        "task": f"Fix the login flow, step {n} of writer {rid.split('-')[0]}",
        "startedAt": start, "endedAt": start + 30_000,
        "workers": [{"agentId": "impl-1", "provider": "anthropic", "state": "done", "output": output}],
    }


# --- processes of the stress test (module level: spawned children import them) -----------------


def _lib_writer(root: str, wid: int, deadline: float, out: str, written) -> None:
    os.environ["CYBERINE_MEMORY_DIR"] = root
    from cybmem.operations.write import write_run
    from cybmem.settings import Settings

    settings = Settings.from_env()
    rng = random.Random(wid)
    results = []
    n = 0
    while time.time() < deadline and written.value < STRESS_ENTRIES:
        rid = f"w{wid}-{n:05d}"
        if n % 25 == 7:
            # A new project: some with a basename every writer uses (slug collisions), some unique.
            cwd = f"/stress/new/{wid}/{n}/shared" if n % 50 == 7 else f"/stress/new/p{wid}x{n}"
        else:
            cwd = rng.choice(SHARED_CWDS)
        res = write_run(_run_obj(rid, n, cwd, rng), settings)
        results.append({"runId": rid, "cwd": cwd, "project": res.store.slug,
                        "events": [e.to_dict() for e in res.events]})
        with written.get_lock():
            written.value += 1 + len(res.events)
        n += 1
    Path(out).write_bytes(orjson.dumps(results))


def _reader(root: str, deadline: float, out: str, written) -> None:
    os.environ["CYBERINE_MEMORY_DIR"] = root
    from cybmem.dispatch.preamble import inject, strip
    from cybmem.store.projects import resolve_slug
    from cybmem.dispatch.inject import memory_block
    from cybmem.retrieval.search import search
    from cybmem.settings import Settings
    from cybmem.store.memory_store import MemoryStore

    settings = Settings.from_env()
    stats = {"searches": 0, "blocks": 0, "nonEmptyBlocks": 0, "indexReads": 0, "errors": []}
    # Reads while the writers write, and once more after, so that it has read a full store.
    while time.time() < deadline and (written.value < STRESS_ENTRIES or not stats["nonEmptyBlocks"]):
        for cwd in (MAIN_CWD, "/stress/home/api"):
            try:
                slug = resolve_slug(Path(root), cwd, create=False)
            except Exception:  # noqa: BLE001 - not registered yet
                continue
            try:
                store = MemoryStore(Path(root), slug)
                search(store, "flaky login flow", k=5, settings=settings)
                stats["searches"] += 1
                task = "Fix the flaky login test"
                block = memory_block(store, task, settings)
                stats["blocks"] += 1
                stats["nonEmptyBlocks"] += bool(block)
                if strip(inject(task, block)) != task:
                    stats["errors"].append("strip(inject(task)) != task")
                store.index_entries()
                stats["indexReads"] += 1
            except Exception as exc:  # noqa: BLE001 - every failure is a finding
                stats["errors"].append(f"{type(exc).__name__}: {exc}")
    Path(out).write_bytes(orjson.dumps(stats))


def _cli_writer(root: Path, wid: int, deadline: float, results: list, errors: list, written) -> None:
    rng = random.Random(1000 + wid)
    n = 0
    while time.time() < deadline and written.value < STRESS_ENTRIES:
        rid = f"c{wid}-{n:05d}"
        cwd = rng.choice(SHARED_CWDS)
        path = root.parent / f"run-{rid}.json"
        path.write_bytes(orjson.dumps(_run_obj(rid, 10_000 + n, cwd, rng)))
        proc = subprocess.run(_cli() + ["write", str(path), "--json"], env=_env(root), capture_output=True, text=True)
        if proc.returncode != 0:
            errors.append(proc.stderr)
        else:
            data = json.loads(proc.stdout)
            results.append({"runId": rid, "cwd": cwd, "project": data["project"], "events": data["events"]})
            with written.get_lock():
                written.value += 1 + len(data["events"])
        n += 1


# --- checks shared by both tests -----------------------------------------------------------------


def _ledger_ok(store, *, torn_ok: bool = False) -> list[dict]:
    """Every ledger line whole and valid, and no "opened" for an id that is already open.

    ``torn_ok``: lines cut short by a SIGKILL (not JSON) are allowed and skipped, as readers do.
    """
    from cybmem.store.records import IssueEvent

    raw = store.issues_path.read_bytes() if store.issues_path.exists() else b""
    assert torn_ok or not raw or raw.endswith(b"\n"), f"{store.issues_path}: torn last line"
    events, state = [], {}
    for lineno, line in enumerate(raw.split(b"\n"), 1):
        if not line:
            continue
        try:
            d = orjson.loads(line)
        except orjson.JSONDecodeError:
            assert torn_ok, f"{store.issues_path}:{lineno} is torn"
            continue
        ev = IssueEvent.from_dict(d)
        assert not (ev.event == "opened" and state.get(ev.issueId) in ("opened", "reopened")), (
            f"{store.issues_path}:{lineno}: {ev.issueId} opened while already open"
        )
        state[ev.issueId] = ev.event
        events.append(d)
    return events


def _index_ok(store, run_ids: set[str]) -> None:
    """index.json equals a rebuild: its entries, plus the runs compaction archived past the cap."""
    data = orjson.loads(store.index_path.read_bytes())
    archived = {row[0]: row for row in data.get("archived", [])}
    entries = [e["runId"] for e in data["entries"]]
    assert set(entries) | set(archived) == run_ids and not set(entries) & set(archived)
    assert data["count"] == len(entries) and not data.get("skipped")
    assert len(entries) == min(len(run_ids), store.index_cap or len(run_ids)), "compacted to the cap"
    fresh, skipped = store.index.fresh_index()
    by_id = {e["runId"]: e for e in fresh}
    assert data["entries"] == [by_id[r] for r in entries] and not skipped, "index.json differs from a fresh rebuild"
    assert entries == [e["runId"] for e in fresh if e["runId"] not in archived], "newest first"
    assert all((row[1], row[2]) == (by_id[rid]["endedAt"], by_id[rid]["inode"]) for rid, row in archived.items())
    if archived:
        listed = [line.split("  ")[2] for line in store.archive_path.read_text().splitlines() if line.startswith("- ")]
        assert len(listed) == len(set(listed)) and set(listed) >= set(archived), "one archive line per archived run"


def _cache_ok(store, run_ids: set[str], n_events: int, *, torn_ok: bool = False) -> None:
    from cybmem.store.snapshot import load_snapshot

    snap = load_snapshot(store)
    assert set(snap.records.column("runId").to_pylist()) == run_ids
    assert snap.n == len(run_ids), "duplicate rows in the Arrow cache"
    assert snap.events.num_rows == n_events
    assert not [p for p in snap.problems if not torn_ok or ".jsonl:" not in p.path], snap.problems
    cold = load_snapshot(store, use_cache=False)
    assert sorted(cold.records.column("runId").to_pylist()) == sorted(snap.records.column("runId").to_pylist())


def _modes_ok(root: Path) -> int:
    """Every directory 0700 and every file 0600 under the root; returns the number of files checked."""
    files = 0
    for dirpath, dirnames, filenames in os.walk(root):
        assert stat.S_IMODE(os.stat(dirpath).st_mode) == 0o700, dirpath
        for name in filenames:
            path = os.path.join(dirpath, name)
            assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600, path
            files += 1
    return files


# --- the stress test -------------------------------------------------------------------------


def test_many_writers_and_a_reader_lose_nothing(tmp_path, capsys):
    from cybmem.store.projects import hash6, load_projects
    from cybmem.store.memory_store import MemoryStore

    root = tmp_path / "memory"
    outs = tmp_path / "out"
    outs.mkdir()
    ctx = mp.get_context("spawn")
    started = time.time()
    # Everybody stops once STRESS_ENTRIES are written (the reader after one more read), or at the
    # deadline, a guard that only a stuck writer meets (then the count below fails).
    deadline = started + STRESS_SECONDS
    written = ctx.Value("q", 0)  # records and ledger events written so far, by every writer
    procs = [ctx.Process(target=_lib_writer, args=(str(root), w, deadline, str(outs / f"w{w}.json"), written))
             for w in range(LIB_WRITERS)]
    procs.append(ctx.Process(target=_reader, args=(str(root), deadline + 1, str(outs / "reader.json"), written)))
    for p in procs:
        p.start()
    cli_results: list = []
    cli_errors: list = []
    threads = [threading.Thread(target=_cli_writer, args=(root, w, deadline, cli_results, cli_errors, written))
               for w in range(CLI_WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0, f"{p.name} exited with {p.exitcode}"
    elapsed = time.time() - started
    assert not cli_errors, cli_errors[:3]

    results = list(cli_results)
    for w in range(LIB_WRITERS):
        results += orjson.loads((outs / f"w{w}.json").read_bytes())
    reader = orjson.loads((outs / "reader.json").read_bytes())
    assert not reader["errors"], reader["errors"][:5]
    assert reader["searches"] > 0 and reader["nonEmptyBlocks"] > 0

    # projects.json: every cwd registered exactly once, never clobbered, collisions resolved.
    projects = load_projects(root)
    cwds = {r["cwd"] for r in results}
    owners = {v["cwd"]: slug for slug, v in projects.items()}
    assert set(owners) == cwds and len(owners) == len(projects), "a project was lost or registered twice"
    for r in results:
        assert owners[r["cwd"]] == r["project"], r
    # Two cwds named "web" register concurrently: whichever came first keeps "web" (which one
    # is a race), the other gets "web-<hash6 of its own cwd>".
    pair = ["/stress/home/web", "/stress/clients/web"]
    first = next(c for c in pair if owners[c] == "web")
    (other,) = [c for c in pair if c != first]
    assert owners[other] == f"web-{hash6(other)}"
    shared = [c for c in cwds if c.endswith("/shared")]
    assert len({owners[c] for c in shared}) == len(shared) and sum(owners[c] == "shared" for c in shared) == 1

    by_project: dict[str, set[str]] = {}
    events_written: dict[str, list[tuple]] = {}
    for r in results:
        by_project.setdefault(r["project"], set()).add(r["runId"])
        events_written.setdefault(r["project"], []).extend((e["issueId"], e["event"], e["byRunId"]) for e in r["events"])
    total_records = total_events = 0
    for slug, expected in by_project.items():
        store = MemoryStore(root, slug)
        # Every record present and valid, nothing else.
        assert set(store.run_ids()) == expected
        records = store.records()
        assert not store.problems, store.problems[:3]
        assert {r.runId for r in records} == expected
        assert all(r.cwd == projects[slug]["cwd"] for r in records)
        # Every ledger line whole, no duplicate "opened", every event a writer reported is there.
        events = _ledger_ok(store)
        assert sorted((e["issueId"], e["event"], e["byRunId"]) for e in events) == sorted(events_written.get(slug, []))
        _index_ok(store, expected)
        _cache_ok(store, expected, len(events))
        total_records += len(expected)
        total_events += len(events)
    files = _modes_ok(root)
    main = MemoryStore(root, "web")
    with capsys.disabled():
        print(f"\nstress: {LIB_WRITERS + CLI_WRITERS} writers ({CLI_WRITERS} via `cybmem write`) + 1 reader, "
              f"{elapsed:.1f}s: {total_records} records ({len(main.run_ids())} in the main project, "
              f"{len(cli_results)} via the CLI), {total_events} ledger events, {len(projects)} projects, "
              f"reader: {reader['searches']} searches, {reader['blocks']} blocks; {files} files 0600")
    assert total_records + total_events >= 1000, "the stress test should move thousands of entries"


# --- the kill test -----------------------------------------------------------------------------

_KILL_WRITERS = r"""
import os, random, signal, sys
from cybmem.operations.write import write_run
from cybmem.settings import Settings
from cybmem.store.memory_store import MemoryStore
from cybmem.store.records import IssueEvent


def writer(tag):
    settings = Settings.from_env()
    rng = random.Random(tag)
    n = 0
    while True:
        rid = f"{tag}-{n:05d}"
        big = "x" * rng.choice([0, 0, 100_000])  # some records span many pages
        out = ("ok\nACCOMPLISHED:\n- resolved kill-flaky-%d\nISSUES:\n- Kill flaky %d: %s\n- Unique %s: d\nNEXT:\n- none"
               % (rng.randrange(5), rng.randrange(5), big[:5000], rid))
        run = {"id": rid, "cwd": rng.choice(["/kill/web", "/kill/web", "/kill/api"]), "task": "Fix it " + big,
               "status": "done", "startedAt": 1761955200000 + n, "endedAt": 1761955200000 + n + 10,
               "workers": [{"agentId": "a", "state": "done", "output": out}]}
        res = write_run(run, settings)
        res.store.append_issue_events([IssueEvent(issueId="kill-flaky-%d" % rng.randrange(5), at=1761955200000 + n,
                                                  event=rng.choice(["resolved", "reopened", "wontfix"]), byRunId=rid)])
        n += 1


# A fork server: each line on stdin names a new writer; it is forked (cybmem already imported, so it
# starts writing at once) and its pid printed. Children are reaped by the kernel (SIGCHLD ignored).
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        try:
            writer(line.strip())
        finally:
            os._exit(1)
    print(pid, flush=True)
"""


def test_sigkill_mid_write_leaves_nothing_doctor_cannot_clean(tmp_path, capsys):
    from cybmem.store.memory_store import MemoryStore

    root = tmp_path / "memory"
    env = _env(root)
    rng = random.Random(5)
    started = time.time()
    kills = {"library": 0, "cli": 0}
    cli_runs: list[Path] = []
    live: list[tuple[float, subprocess.Popen | int, str]] = []
    tag = 0

    # Library writers are forked by one server process that imported cybmem once (a fresh
    # interpreter each would spend most of the test importing).
    server = subprocess.Popen([sys.executable, "-c", _KILL_WRITERS], env={**env, "OPENBLAS_NUM_THREADS": "1"},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def spawn() -> None:
        # Each process gets its own random moment to die: library writers somewhere in their
        # write loop, `cybmem write` anywhere in its life (start-up, reading, writing, exiting).
        nonlocal tag
        tag += 1
        if tag % 2:
            server.stdin.write(f"k{tag}\n")
            server.stdin.flush()
            pid = int(server.stdout.readline())
            live.append((time.time() + rng.uniform(0.02, 0.5), pid, "library"))
        else:
            path = tmp_path / f"cli-{tag}.json"
            path.write_bytes(orjson.dumps(_run_obj(f"cli{tag}", tag, "/kill/web", rng)))
            cli_runs.append(path)
            proc = subprocess.Popen(_cli() + ["write", str(path)], env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            live.append((time.time() + rng.uniform(0.2, 1.2), proc, "cli"))

    def kill(proc: subprocess.Popen | int) -> bool:
        """SIGKILL a writer; False when it had already ended (a `cybmem write` that completed)."""
        if isinstance(proc, int):  # a forked library writer: it writes until it is killed
            os.kill(proc, signal.SIGKILL)
            return True
        alive = proc.poll() is None
        if alive:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        return alive

    for _ in range(3):
        spawn()
    completed = 0
    while sum(kills.values()) < KILLS:
        live.sort(key=lambda item: item[0])
        when, proc, kind = live.pop(0)
        time.sleep(max(0.0, when - time.time()))
        if kill(proc):
            kills[kind] += 1
        else:
            completed += 1  # finished before its moment came
        spawn()
    for _, proc, _ in live:
        kill(proc)
    server.stdin.close()
    server.wait()
    server.stdout.close()
    kill_seconds = time.time() - started

    # No partial record, no torn JSON that breaks a reader: every record file parses and validates.
    slugs = [d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")]
    records = 0
    for slug in slugs:
        store = MemoryStore(root, slug)
        recs = store.records()
        assert not [p for p in store.problems if "records" in p.path], store.problems
        records += len(recs)
    assert records > 0
    for verb in (["list", "--cwd", "/kill/web"], ["issues", "--all", "--cwd", "/kill/web"], ["search", "fix", "--cwd", "/kill/web"],
                 ["projects"]):
        proc = subprocess.run(_cli() + verb, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, (verb, proc.stderr)

    # doctor: only crash debris (temp files, a torn ledger tail, stale index / cache), nothing by hand.
    first = subprocess.run(_cli() + ["doctor", "--all", "--temp-age", "0", "--json"], env=env, capture_output=True, text=True)
    report = json.loads(first.stdout)
    assert report["counts"]["error"] == 0, [f for f in report["findings"] if f["severity"] == "error"]
    assert {f["check"] for f in report["findings"]} <= {"temp", "ledger", "index", "cache", "projects"}
    assert all(f["severity"] == "warning" for f in report["findings"] if f["check"] in ("ledger", "projects"))
    found = {f["check"] for f in report["findings"] if f["severity"] == "repairable"}
    assert first.returncode == (1 if found else 0)

    # A record file's bytes are never touched by repair.
    before = {p: p.read_bytes() for p in root.glob("*/records/*.json")}
    ledgers = {p: p.read_bytes() for p in root.glob("*/issues.jsonl")}
    repair = subprocess.run(_cli() + ["doctor", "--all", "--repair", "--temp-age", "0"], env=env, capture_output=True, text=True)
    assert repair.returncode == 0, repair.stdout + repair.stderr
    assert {p: p.read_bytes() for p in root.glob("*/records/*.json")} == before
    assert {p: p.read_bytes() for p in root.glob("*/issues.jsonl")} == ledgers
    second = subprocess.run(_cli() + ["doctor", "--all"], env=env, capture_output=True, text=True)
    assert second.returncode == 0 and "clean:" in second.stdout, second.stdout
    assert not list(root.rglob(".tmp-*"))

    # Retrying the killed CLI writes links their records and opens nothing twice.
    from cybmem.operations.write import write_run
    from cybmem.settings import Settings

    retried = 0
    for path in cli_runs:
        rid = orjson.loads(path.read_bytes())["id"]
        if not (root / "web" / "records" / f"{rid}.json").exists():
            write_run(orjson.loads(path.read_bytes()), Settings.from_env(memory_dir=root))
            retried += 1
    torn = 0
    for slug in slugs:
        store = MemoryStore(root, slug)
        events = _ledger_ok(store, torn_ok=True)
        torn += sum(1 for line in store.issues_path.read_bytes().split(b"\n") if line) - len(events)
        ids = set(store.run_ids())
        _index_ok(store, ids)
        _cache_ok(store, ids, len(events), torn_ok=True)
    _modes_ok(root)
    with capsys.disabled():
        print(f"\nkill: {sum(kills.values())} SIGKILLs ({kills['library']} library writers, {kills['cli']} `cybmem write`) "
              f"in {kill_seconds:.1f}s; {records} records survived intact; first doctor: "
              f"{sorted(found) or 'clean'}; repaired: {len(json.loads(first.stdout)['findings'])} finding(s); "
              f"{retried} killed CLI writes retried ({completed} completed before their kill); {torn} torn ledger line(s) skipped")


# --- small deterministic crash and concurrency cases -------------------------------------------


def _small_rec(run_id: str, ended: int):
    from cybmem.store.records import MemoryRecord

    return MemoryRecord.from_dict({"runId": run_id, "cwd": MAIN_CWD, "workflowName": "w", "task": f"task {run_id}",
                                   "state": "done", "startedAt": ended - 1000, "endedAt": ended, "lineage": {}, "outcome": {}})


def test_the_next_write_merges_records_a_killed_writer_left_out_of_the_index(memory_root):
    from cybmem.store.memory_store import MemoryStore

    store = MemoryStore(memory_root, "web")
    store.write_record(_small_rec("r1", T0))
    store.write_record(_small_rec("r2", T0 + MIN))
    data = orjson.loads(store.index_path.read_bytes())
    data["entries"] = [e for e in data["entries"] if e["runId"] != "r2"]  # killed before its index update
    data["count"] = 1
    store.index_path.write_bytes(orjson.dumps(data))
    assert [e["runId"] for e in MemoryStore(memory_root, "web").index_entries()] == ["r2", "r1"], "readers complete it"
    store.write_record(_small_rec("r3", T0 + 2 * MIN))
    _index_ok(store, {"r1", "r2", "r3"})


def test_a_retried_write_after_a_kill_between_events_and_record_appends_nothing_twice(memory_root):
    from cybmem.store.records import IssueEvent
    from cybmem.store.memory_store import MemoryStore

    store = MemoryStore(memory_root, "web")
    ev = IssueEvent(issueId="flaky", at=T0, event="opened", byRunId="r1", title="Flaky")
    with store.lock():
        store._append_events_locked([ev])  # the writer died right here, before linking its record
    store.write_record(_small_rec("r1", T0), [ev])  # the retry
    assert [e.event for e in store.issue_events()] == ["opened"]
    assert store.run_ids() == ["r1"]


def test_a_ledger_replaced_behind_a_readers_back_is_read_again(memory_root):
    from cybmem.store.records import IssueEvent
    from cybmem.store.memory_store import MemoryStore

    store = MemoryStore(memory_root, "web")
    store.append_issue_events([IssueEvent(issueId="a", at=T0, event="opened", title="A")])
    assert [e.issueId for e in store.issue_events()] == ["a"]
    # Rewritten in place by hand (same inode, same size or longer): the per-process cache notices.
    raw = store.issues_path.read_bytes().replace(b'"a"', b'"b"')
    with open(store.issues_path, "r+b") as fh:
        fh.write(raw)
    assert [e.issueId for e in store.issue_events()] == ["b"]


def test_threads_reading_the_ledger_at_once_see_each_event_once(memory_root):
    from cybmem.store.records import IssueEvent
    from cybmem.store.memory_store import MemoryStore

    store = MemoryStore(memory_root, "web")
    store.append_issue_events([IssueEvent(issueId=f"i{n}", at=T0 + n, event="opened") for n in range(2000)])
    seen: list[int] = []

    def read() -> None:
        seen.append(len(MemoryStore(memory_root, "web").issue_events()))

    from cybmem.store import memory_store as store_module

    store_module._LEDGERS.clear()
    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [2000] * 8


# --- a write that waits for the lock is never lost (issue 41) ----------------------------------


_HOLD_LOCK = """
import sys
from cybmem.store.memory_store import MemoryStore
with MemoryStore(sys.argv[1], sys.argv[2]).lock():
    print("held", flush=True)
    sys.stdin.read()  # until the test closes our stdin
"""


def _waiting_write(root: Path, tmp_path: Path, rid: str):
    """A real `cybmem write` of run ``rid`` (it opens issue "flaky-<rid>") that has staged its
    record and waits for the project lock, which another real process holds; returns both
    processes and the writer's temp file."""
    env = _env(root)
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(root), "web"], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    run = tmp_path / f"{rid}.json"
    run.write_bytes(orjson.dumps({
        "id": rid, "cwd": MAIN_CWD, "workflowName": "implement-task", "task": f"Fix {rid}", "status": "done",
        "startedAt": T0, "endedAt": T0 + MIN,
        "workers": [{"agentId": "a", "state": "done", "output": f"Done.\n\nISSUES:\n- Flaky {rid}: now and then"}]}))
    writer = subprocess.Popen(_cli() + ["write", str(run)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    records = root / "web" / "records"
    deadline = time.monotonic() + 30
    while not (temps := list(records.glob(".tmp-*"))):
        if time.monotonic() > deadline or writer.poll() is not None:
            writer.kill()
            _release(holder)
            raise AssertionError(writer.communicate())
        time.sleep(0.02)
    time.sleep(0.2)  # it stages, then blocks on the lock
    return holder, writer, temps[0]


def _release(holder: subprocess.Popen) -> None:
    holder.communicate(timeout=30)  # closes its stdin: it lets go of the lock and ends
    assert holder.returncode == 0


def _seed(root: Path) -> None:
    from cybmem.store.memory_store import MemoryStore

    MemoryStore(root, "web").write_record(_small_rec("r0", T0))


def test_doctor_never_removes_the_temp_file_of_a_write_waiting_for_the_lock(tmp_path):
    """The attack of issue 41: a writer holds the project lock for minutes (stopped with Ctrl-Z),
    a second write waits with its record staged, and `doctor --repair` runs meanwhile. Doctor
    leaves the waiting write's temp file alone, however old; the write then commits its record
    and its ledger event, once."""
    root = tmp_path / "memory"
    _seed(root)
    holder, writer, temp = _waiting_write(root, tmp_path, "run-b")
    try:
        old = time.time() - 7200
        os.utime(temp, (old, old))  # two hours old by the clock
        doctor = subprocess.run(_cli() + ["doctor", "--project", "web", "--repair"], env=_env(root),
                                capture_output=True, text=True)
        assert temp.exists(), doctor.stdout
        assert f"removed {temp}" not in doctor.stdout
        assert f"warning    {temp}: temp file of a writer at work" in doctor.stdout, doctor.stdout
        again = subprocess.run(_cli() + ["doctor", "--project", "web", "--repair", "--temp-age", "0"], env=_env(root),
                               capture_output=True, text=True)
        assert temp.exists(), again.stdout
    finally:
        _release(holder)
    out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0 and err == "", err
    assert "Wrote run-b" in out
    shown = subprocess.run(_cli() + ["show", "run-b", "--project", "web"], env=_env(root), capture_output=True, text=True)
    assert shown.returncode == 0 and "Fix run-b" in shown.stdout, shown.stderr
    ledger = [orjson.loads(line) for line in (root / "web" / "issues.jsonl").read_bytes().splitlines()]
    assert [(e["issueId"], e["event"]) for e in ledger] == [("flaky-run-b", "opened")]
    assert not list((root / "web" / "records").glob(".tmp-*"))


def test_a_waiting_write_whose_temp_file_is_removed_commits_its_record_with_its_events(tmp_path):
    """Something that knows nothing of the writer's lock (a person's `rm`, a temp cleaner) removes
    the staged record while the write waits: the write stages it again under the lock, so its
    ledger events are never appended without its record."""
    root = tmp_path / "memory"
    _seed(root)
    holder, writer, temp = _waiting_write(root, tmp_path, "run-c")
    try:
        temp.unlink()
    finally:
        _release(holder)
    out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0 and err == "", err
    assert (root / "web" / "records" / "run-c.json").is_file()
    ledger = [orjson.loads(line) for line in (root / "web" / "issues.jsonl").read_bytes().splitlines()]
    assert [(e["issueId"], e["event"]) for e in ledger] == [("flaky-run-c", "opened")]


def test_doctor_removes_the_temp_file_of_a_write_killed_while_it_waited(tmp_path):
    """A writer killed (SIGKILL) while it waited owns nothing any more: its temp file is debris,
    which doctor reports and removes, and the killed write appended nothing."""
    root = tmp_path / "memory"
    _seed(root)
    holder, writer, temp = _waiting_write(root, tmp_path, "run-d")
    try:
        writer.kill()
        writer.communicate(timeout=30)
        doctor = subprocess.run(_cli() + ["doctor", "--project", "web", "--repair", "--temp-age", "0"], env=_env(root),
                                capture_output=True, text=True)
        assert f"repaired: removed {temp}" in doctor.stdout, doctor.stdout
        assert not temp.exists()
    finally:
        _release(holder)
    assert not (root / "web" / "issues.jsonl").exists()


# --- one state check and one append under one lock: no repeated issue events (issue 41) --------------


_MARK_AT_ONCE = """
import os, sys, time
from cybmem.operations.write import mark_issue
from cybmem.settings import Settings
from cybmem.store.memory_store import MemoryStore
root, event, go = sys.argv[1], sys.argv[2], sys.argv[3]
store, settings = MemoryStore(root, "web"), Settings.from_env(memory_dir=root)
store.issue_states_for(["flaky"])  # warm: every process is ready to read the state at once
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.0005)
print(len(mark_issue(store, "flaky", event, settings).written), flush=True)
"""


def _events(root: Path) -> list[tuple[str, str]]:
    return [(e["issueId"], e["event"]) for e in map(orjson.loads, (root / "web" / "issues.jsonl").read_bytes().splitlines())]


def test_marks_at_once_append_one_event(tmp_path):
    """Six processes mark the same issue at the same moment, as agents through `cybmem mark` and
    MCP servers do: exactly one event is appended each round, and the others say it is already so."""
    from cybmem.store.memory_store import MemoryStore
    from cybmem.store.records import IssueEvent

    root = tmp_path / "memory"
    store = MemoryStore(root, "web")
    store.append_issue_events([IssueEvent(issueId="flaky", at=T0, event="opened", title="Flaky")])
    env = _env(root)
    for n, event in enumerate(["resolved", "reopened", "wontfix", "reopened", "resolved", "reopened"]):
        go = tmp_path / f"go-{n}"
        procs = [subprocess.Popen([sys.executable, "-c", _MARK_AT_ONCE, str(root), event, str(go)], env=env,
                                  stdout=subprocess.PIPE, text=True) for _ in range(6)]
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        go.touch()
        written = [int(p.communicate(timeout=60)[0].strip()) for p in procs]
        assert all(p.returncode == 0 for p in procs)
        assert sorted(written) == [0] * 5 + [1], (event, written)
    assert _events(root) == [("flaky", e) for e in ["opened", "resolved", "reopened", "wontfix", "reopened", "resolved",
                                                    "reopened"]]


def test_cybmem_mark_reopened_four_at_once_appends_one_event_a_round(tmp_path):
    """The attack of issue 41 as it was run: four `cybmem mark ISSUE reopened` at once, round after
    round; each round appends one reopened event, and doctor finds no repeated event."""
    from cybmem.store.memory_store import MemoryStore
    from cybmem.store.records import IssueEvent

    root = tmp_path / "memory"
    MemoryStore(root, "web").append_issue_events([IssueEvent(issueId="flaky", at=T0, event="opened", title="Flaky")])
    env = _env(root)
    for _ in range(4):
        subprocess.run(_cli() + ["mark", "flaky", "resolved", "--project", "web"], env=env, check=True, capture_output=True)
        procs = [subprocess.Popen(_cli() + ["mark", "flaky", "reopened", "--project", "web"], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
        outs = [p.communicate(timeout=60) for p in procs]
        assert all(p.returncode == 0 and err == "" for p, (_, err) in zip(procs, outs)), outs
        said = sorted(out.strip() for out, _ in outs)
        assert said == ["flaky is already reopened; nothing appended."] * 3 + ["flaky: resolved -> reopened"], said
    assert _events(root) == [("flaky", "opened")] + [("flaky", "resolved"), ("flaky", "reopened")] * 4
    doctor = subprocess.run(_cli() + ["doctor", "--project", "web"], env=env, capture_output=True, text=True)
    assert "again while" not in doctor.stdout and doctor.returncode == 0, doctor.stdout


_WRITE_AT_ONCE = """
import os, sys, time
from cybmem.operations.write import write_run
from cybmem.settings import Settings
root, rid, go = sys.argv[1], sys.argv[2], sys.argv[3]
settings = Settings.from_env(memory_dir=root)
run = {"id": rid, "cwd": "/stress/home/web", "workflowName": "w", "task": "Fix " + rid, "status": "done",
       "startedAt": 1761955200000, "endedAt": 1761955260000,
       "workers": [{"agentId": "a", "state": "done", "output": "Done.\\n\\nACCOMPLISHED:\\n- resolved shared-flaky\\nISSUES:\\n- Other flaky: seen"}]}
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.0005)
write_run(run, settings)
"""


def test_writes_at_once_resolve_and_open_an_issue_once(tmp_path):
    """The write path's events too: four runs that end at the same moment, each resolving the
    same open issue and opening the same new one, append one resolved and one opened."""
    from cybmem.store.memory_store import MemoryStore
    from cybmem.store.records import IssueEvent

    root = tmp_path / "memory"
    _seed(root)
    MemoryStore(root, "web").append_issue_events([IssueEvent(issueId="shared-flaky", at=T0, event="opened",
                                                              title="Shared flaky")])
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _WRITE_AT_ONCE, str(root), f"w{n}", str(go)], env=_env(root),
                              stdout=subprocess.PIPE, text=True) for n in range(4)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    go.touch()
    for p in procs:
        p.communicate(timeout=60)
        assert p.returncode == 0
    assert sorted(_events(root)) == [("other-flaky", "opened"), ("shared-flaky", "opened"), ("shared-flaky", "resolved")]
    assert len(MemoryStore(root, "web").run_ids()) == 5
