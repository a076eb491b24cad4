"""Dispatch takes any task (issue 18) and names projects without look-alikes (issue 20):
a task that starts with a dash is the task, `inject --system` ranks for the task on stdin, a
parent is named by the prefix the block prints, a subdirectory of a project reads and writes that
project's memory, `-p` never stamps a foreign cwd on a record, and a project name that only looks
like an existing one is refused with the name it resembles."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading

import pytest
from typer.testing import CliRunner

from cybmem.operations.doctor import doctor
from cybmem.cli.app import app
from cybmem.errors import AmbiguousError, NotFoundError, ValidationError
from cybmem.store.projects import hash6, load_projects, resolve_slug, select_project, slug_key
from cybmem.settings import Settings
from cybmem.store.memory_store import MemoryStore

from conftest import make_run, write_json

runner = CliRunner()
TASK = "Fix the flaky cart drawer test"
NOW = "2026-10-27"


def run(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def _cybmem(*args, env, input=None):
    exe = shutil.which("cybmem")
    cmd = [exe, *args] if exe else [sys.executable, "-c", "from cybmem.cli.app import console; console()", *args]
    full = {k: v for k, v in os.environ.items() if not k.startswith("CYBERINE_")}
    return subprocess.run(cmd, capture_output=True, text=True, env={**full, **env}, input=input, timeout=120)


# --- a task that starts with a dash ----------------------------------------------------------------

DASHED = [
    "--no-build-isolation is ignored when building the wheel",
    "- fix the cart drawer\n- then the checkout banner",
    "-k expression matches nothing",
    "-p is taken as the project",
    "-f is read as a file name",
    "--cwd is wrong for subdirectories",
    "-5 degrees breaks the thermostat test",
    "--json=false is still JSON",
]


@pytest.mark.parametrize("task", DASHED)
def test_a_task_that_starts_with_a_dash_is_the_task(fixture_copy, task):
    env = ["--memory-dir", fixture_copy]
    res = run("inject", task, "--project", "web", *env)
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("MEMORY (prior runs") and res.stdout.endswith("\n\n" + task)
    res = run("inject", "--project", "web", *env, task, "--system", "--json")  # options before and after it
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["task"] == task
    res = run("strip", task)
    assert res.exit_code == 0 and res.stdout == task
    res = run("search", task, "--project", "web", "-k", "2", "--json", *env)
    assert res.exit_code == 0 and json.loads(res.stdout)["query"] == task


def test_options_help_and_double_dash_still_work(fixture_copy):
    assert run("inject", "--help").stdout.startswith("Usage: cybmem inject")
    assert run("inject", "-h").exit_code == 0
    assert run("strip", "--", "--help").stdout == "--help"
    assert run("strip", "-", input="piped -x\n").stdout == "piped -x\n"
    res = run("strip", "--frobnicate")  # one word that is no option: the text, with a warning
    assert res.exit_code == 0 and res.stdout == "--frobnicate"
    assert "took '--frobnicate' as the text: strip has no such option" in res.stderr
    res = run("strip", "the task", "--frobnicate")  # the text is given: an unknown option is a mistake
    assert res.exit_code == 2 and "No such option: --frobnicate" in res.stderr
    res = run("search", "--grep=login form", "-k", "1", "--memory-dir", fixture_copy, "-p", "web", "-x marks the spot",
              "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["query"] == "-x marks the spot"


def test_the_dispatcher_can_pass_any_task_to_the_console_script(fixture_copy):
    """The real process, as the dispatcher runs it: the exit code, stdout exactly the prompt."""
    task = DASHED[0]
    p = _cybmem("inject", task, "--project", "web", "--as-of", NOW, env={"CYBERINE_MEMORY_DIR": str(fixture_copy)})
    assert p.returncode == 0 and p.stderr == "" and p.stdout.endswith("\n\n" + task)


# --- inject --system reads the task on stdin ---------------------------------------------------------


def test_system_ranks_for_the_task_on_stdin(fixture_copy):
    args = ("inject", "--system", "--project", "web", "--as-of", NOW, "--memory-dir", fixture_copy, "--json")
    given = json.loads(run(*args[:1], TASK, *args[1:]).stdout)
    piped = json.loads(run(*args, input=TASK + "\n").stdout)
    blank = json.loads(run(*args, input="").stdout)
    assert piped["block"] == given["block"] and piped["task"] == TASK + "\n"
    assert [r["runId"] for r in piped["runs"]] == [r["runId"] for r in given["runs"]]
    assert blank["task"] == "" and [r["runId"] for r in blank["runs"]] != [r["runId"] for r in piped["runs"]]
    p = _cybmem("inject", "--system", "--project", "web", "--as-of", NOW, input=TASK,
                env={"CYBERINE_MEMORY_DIR": str(fixture_copy)})
    assert p.returncode == 0 and p.stdout == given["block"], "the block as it is: it ends with its own newline"


def test_system_does_not_wait_on_a_stdin_nobody_writes_to(fixture_copy):
    """A dispatcher that leaves its child's stdin open (a pipe with nothing in it) gets the block
    for no task at once, as before, instead of a process waiting for ever."""
    exe = shutil.which("cybmem")
    cmd = [exe] if exe else [sys.executable, "-c", "from cybmem.cli.app import console; console()"]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("CYBERINE_")},
           "CYBERINE_MEMORY_DIR": str(fixture_copy)}
    p = subprocess.Popen([*cmd, "inject", "--system", "--project", "web", "--as-of", NOW, "--json"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        # stdout is read while waiting (stdin stays open, unwritten): the --json answer may outgrow a
        # pipe's buffer, and a test that only waited would hold the writer up itself
        chunks: list[bytes] = []
        reader = threading.Thread(target=lambda: chunks.append(p.stdout.read()), daemon=True)
        reader.start()
        assert p.wait(timeout=60) == 0
        reader.join(timeout=10)
        d = json.loads(b"".join(chunks))
    finally:
        p.kill()
        for stream in (p.stdin, p.stdout, p.stderr):
            stream.close()
    blank = json.loads(run("inject", "--system", "--project", "web", "--as-of", NOW, "--memory-dir", fixture_copy,
                           "--json", input="").stdout)
    assert d["task"] == "" and d["block"] == blank["block"]


# --- --parent takes the prefix the block prints ------------------------------------------------------


def _ids(root):
    return sorted(p.stem for p in (root / "web" / "records").glob("*.json"))


def test_a_parent_prefix_is_resolved_as_show_resolves_it(fixture_copy):
    env = {"CYBERINE_MEMORY_DIR": str(fixture_copy)}
    args = ("inject", TASK, "--project", "web", "--as-of", NOW, "--json")
    ids = _ids(fixture_copy)
    parent = ids[len(ids) // 2]
    whole = json.loads(_cybmem(*args, "--parent", parent, env=env).stdout)
    assert whole["runs"][0]["runId"] == parent and whole["runs"][0]["pinned"] == "parent"
    short = _cybmem(*args, "--parent", parent[:8], env=env)
    assert short.returncode == 0 and short.stderr == ""
    assert json.loads(short.stdout)["runs"] == whole["runs"]
    by_env = _cybmem(*args, env={**env, "CYBERINE_PARENT_RUN_ID": parent[:8]})
    assert json.loads(by_env.stdout)["runs"] == whole["runs"]
    search = ("search", TASK, "-p", "web", "--memory-dir", fixture_copy, "-k", "100", "--as-of", NOW, "--explain", "--json")
    hits = {n: json.loads(run(*search, *p).stdout)["hits"] for n, p in (("none", ()), ("whole", ("--parent", parent)),
                                                                        ("short", ("--parent", parent[:8])))}
    assert hits["short"] == hits["whole"] != hits["none"]


def test_an_unknown_or_ambiguous_parent_prefix_warns_and_the_task_still_goes_out(fixture_copy):
    env = {"CYBERINE_MEMORY_DIR": str(fixture_copy)}
    ids = _ids(fixture_copy)
    shared = next(a[:2] for a, b in zip(ids, ids[1:]) if a[:2] == b[:2])
    for given, why in (("6a4aad8z", "no record matches '6a4aad8z' in project web"),
                       (shared, f"prefix '{shared}' matches")):
        for how in (["--parent", given], []):
            extra = {} if how else {"CYBERINE_PARENT_RUN_ID": given}
            p = _cybmem("inject", TASK, "--project", "web", *how, env={**env, **extra})
            assert p.returncode == 0 and p.stdout.endswith(TASK) and p.stdout.startswith("MEMORY")
            assert p.stderr.count("\n") == 1 and p.stderr.startswith("warning: no parent run shown first") and why in p.stderr
            strict = _cybmem("inject", TASK, "--project", "web", "--strict", *how, env={**env, **extra})
            assert strict.returncode == 1 and strict.stdout == "" and why in strict.stderr


def test_resolve_link_rules(fixture_copy):
    from cybmem.store.snapshot import load_snapshot

    snap = load_snapshot(MemoryStore(fixture_copy, "web"))
    ids = _ids(fixture_copy)
    assert snap.resolve_link(ids[0]) == ids[0] and snap.resolve_link(ids[0][:8]) == ids[0]
    assert snap.resolve_link(None) is None and snap.resolve_link("  ") is None
    running = "00000000-0000-4000-8000-000000000000"  # a parent still running: no record yet, no fuss
    assert snap.resolve_link(running) == running
    with pytest.raises(NotFoundError, match="no record matches 'ffffffff' in project web"):
        snap.resolve_link("ffffffff")
    with pytest.raises(AmbiguousError):
        snap.resolve_link(ids[0][:1])


# --- a subdirectory belongs to the nearest registered project ------------------------------------------


def test_a_subdirectory_reads_the_memory_of_its_project(fixture_copy):
    assert select_project(fixture_copy, cwd="/home/dev/web/src/components") == "web"
    assert select_project(fixture_copy, cwd="/srv/clients/acme/web/packages/ui") == "web-7663e1"
    args = ("inject", TASK, "--as-of", NOW, "--memory-dir", fixture_copy, "--json")
    sub = json.loads(run(*args, "--cwd", "/home/dev/web/src/components").stdout)
    top = json.loads(run(*args, "--project", "web").stdout)
    assert sub["project"] == "web" and sub["block"] == top["block"] and sub["block"]
    with pytest.raises(NotFoundError):
        select_project(fixture_copy, cwd="/home/dev/website")  # a sibling with a common prefix is no subdirectory
    assert json.loads(run("list", "--cwd", "/home/dev/api/tests", "--memory-dir", fixture_copy, "--json").stdout)


def test_a_run_in_a_subdirectory_is_filed_in_its_project(memory_root, settings, tmp_path):
    from cybmem.operations.write import write_run

    write_run(make_run("top"), settings)
    result = write_run(make_run("sub", cwd="/home/dev/web/src/app"), settings)
    assert result.store.slug == "web" and result.record.cwd == "/home/dev/web"
    assert load_projects(memory_root) == {"web": {"cwd": "/home/dev/web"}}, "nothing new registered"
    # Not under a registered project: a project of its own, as before.
    other = write_run(make_run("api", cwd="/home/dev/api/src"), settings)
    assert other.store.slug == "src" and load_projects(memory_root)["src"] == {"cwd": "/home/dev/api/src"}


def test_the_home_directory_and_the_root_hold_only_their_own_runs(memory_root, settings, monkeypatch, tmp_path):
    from cybmem.operations.write import write_run

    home = str(tmp_path / "home")
    monkeypatch.setenv("HOME", home)
    write_run(make_run("h", cwd=home), settings)
    write_run(make_run("r", cwd="/"), settings)
    newer = write_run(make_run("n", cwd=f"{home}/newproject"), settings)
    assert newer.store.slug == "newproject" and newer.record.cwd == f"{home}/newproject"
    assert write_run(make_run("s", cwd="/srv/other"), settings).store.slug == "other"
    assert resolve_slug(memory_root, home) == "home"


# --- -p never stamps another directory on a record ----------------------------------------------------


def test_write_and_supersede_with_project_take_the_projects_cwd(memory_root, tmp_path, monkeypatch):
    run_json = write_json(tmp_path / "run.json", {k: v for k, v in make_run("w1").items() if k != "cwd"})
    assert run("write", run_json, "--cwd", "/home/dev/web").exit_code == 0
    monkeypatch.chdir(tmp_path)  # another directory
    for rid in ("w2",):
        path = write_json(tmp_path / f"{rid}.json", {k: v for k, v in make_run(rid).items() if k != "cwd"})
        res = run("write", path, "-p", "web")
        assert res.exit_code == 0 and res.stderr == "", res.output
    fix = write_json(tmp_path / "fix.json", {k: v for k, v in make_run("w2-fix").items() if k != "cwd"})
    assert run("supersede", "w2", fix, "-p", "web").exit_code == 0
    store = MemoryStore(memory_root, "web")
    assert {r.runId: r.cwd for r in store.records()} == {"w1": "/home/dev/web", "w2": "/home/dev/web",
                                                         "w2-fix": "/home/dev/web"}
    # A run.json that names a directory of another project: filed where -p says, and told.
    res = run("write", write_json(tmp_path / "a.json", make_run("w3", cwd="/home/dev/api")), "-p", "web")
    assert res.exit_code == 0 and "the run's cwd /home/dev/api is not in project web" in res.stderr
    assert store.read_record("w3").cwd == "/home/dev/web"
    settings = Settings.from_env({}, memory_dir=memory_root)
    assert doctor(settings, project="web").clean


def test_doctor_names_records_whose_cwd_is_outside_their_project(memory_root, settings):
    from cybmem.operations.write import write_run

    write_run(make_run("ok"), settings)
    records = memory_root / "web" / "records"
    for rid, cwd in (("stray-1", "/tmp"), ("stray-2", "/tmp"), ("sub", "/home/dev/web/src")):
        rec = json.loads((records / "ok.json").read_text())
        (records / f"{rid}.json").write_text(json.dumps({**rec, "runId": rid, "cwd": cwd}))  # as an older cybmem wrote them
    MemoryStore(memory_root, "web").rebuild_index()
    report = doctor(settings, project="web")
    found = [f for f in report.findings if f.check == "records"]
    assert len(found) == 1 and found[0].severity == "warning" and report.clean
    assert "2 records (stray-1, stray-2) carry the cwd /tmp, outside the project's directory /home/dev/web" in found[0].message


# --- look-alike project names -----------------------------------------------------------------------

LOOKALIKES = ["w\u0435b", "\uff57\uff45\uff42", "WEB", "Web", "w\u200beb", "w\u00e9b"]


def test_slug_key_folds_what_looks_the_same():
    assert {slug_key(s) for s in LOOKALIKES + ["web"]} == {"web"}
    assert len({slug_key(s) for s in ("web", "web2", "wbe", "api", "wab")}) == 5
    # ASCII look-alikes: the separators '-', '_', '.' (or none) read the same (issue 29, item 9)
    assert {slug_key(s) for s in ("web-7663e1", "web_7663e1", "web.7663e1", "web7663e1", "Web__7663E1")} == {"web7663e1"}


def test_a_directory_named_like_a_slug_keeps_the_slug_the_contract_gives_it(memory_root):
    """Only a typed --project name is held to the separators: a cwd's slug is the contract's, which
    the orchestrator computes too (a directory web_7663e1 beside project web-7663e1 is web_7663e1)."""
    assert resolve_slug(memory_root, "/srv/web-7663e1", create=True) == "web-7663e1"
    assert resolve_slug(memory_root, "/srv/web_7663e1", create=True) == "web_7663e1"
    assert resolve_slug(memory_root, "/srv/WEB-7663E1", create=True) == f"web-7663e1-{hash6('/srv/WEB-7663E1')}"
    for cwd in ("/srv/web-7663e1", "/srv/web_7663e1"):
        assert run("write", write_json(memory_root.parent / "r.json", make_run(f"r{hash6(cwd)}", cwd=cwd))).exit_code == 0
    res = run("doctor", "--all")
    assert res.exit_code == 0, res.output
    assert "warning    " in res.output and "'web-7663e1', 'web_7663e1' differ only in '-', '_' and '.'" in res.output


@pytest.mark.parametrize("name", ["web_7663e1", "web.7663e1", "web7663e1", "web-7663-e1"])
def test_an_ascii_look_alike_of_an_existing_slug_is_refused(memory_root, tmp_path, name):
    assert run("write", write_json(tmp_path / "r.json", make_run("r1", cwd="/srv/web-7663e1"))).exit_code == 0
    assert sorted(p.name for p in memory_root.iterdir() if p.is_dir()) == ["web-7663e1"]
    for args in (["write", write_json(tmp_path / "r2.json", make_run("r2")), "-p", name], ["list", "-p", name],
                 ["mcp", "-p", name]):  # the server's default project: refused at start, not by every call
        res = run(*args)
        assert res.exit_code == 1, (args, res.output)
        assert "looks like existing project 'web-7663e1'" in res.stderr and "use --project web-7663e1" in res.stderr
    assert sorted(p.name for p in memory_root.iterdir() if p.is_dir()) == ["web-7663e1"], "no new project"
    with pytest.raises(ValidationError, match="looks like existing project 'web-7663e1'"):
        select_project(memory_root, project=name, create=True)


@pytest.mark.parametrize("name", LOOKALIKES)
def test_a_look_alike_of_an_existing_project_is_refused_everywhere(memory_root, tmp_path, name):
    assert run("write", write_json(tmp_path / "r.json", make_run("r1"))).exit_code == 0
    before = sorted(p.name for p in memory_root.iterdir())
    for args in (["write", write_json(tmp_path / "r2.json", make_run("r2")), "-p", name],
                 ["list", "-p", name], ["inject", TASK, "-p", name, "--strict"], ["doctor", "-p", name],
                 ["supersede", "r1", tmp_path / "r2.json", "-p", name]):
        res = run(*args)
        assert res.exit_code == 1, (args, res.output)
        assert f"looks like existing project 'web'" in res.stderr and "use --project web" in res.stderr
    res = run("inject", TASK, "-p", name)  # dispatch: the task goes out, one warning says why
    assert res.exit_code == 0 and res.stdout == TASK and "looks like existing project 'web'" in res.stderr
    assert sorted(p.name for p in memory_root.iterdir()) == before, "nothing made beside web"
    with pytest.raises(ValidationError, match="looks like existing project 'web'"):
        select_project(memory_root, project=name, create=True)


def test_a_new_project_name_keeps_to_the_slug_rule(memory_root, tmp_path):
    path = write_json(tmp_path / "r.json", make_run("r1"))
    res = run("write", path, "-p", "My Project")
    assert res.exit_code == 1 and "not a name the slug rule makes" in res.stderr and "--project my-project" in res.stderr
    assert not memory_root.exists() or not any(memory_root.iterdir())
    assert run("write", path, "-p", "my-project").exit_code == 0


def test_a_basename_that_looks_like_a_taken_slug_gets_a_hash(memory_root):
    memory_root.mkdir()
    (memory_root / "projects.json").write_text(json.dumps({"Web": {"cwd": "/srv/Web"}}))  # an older tool's entry
    assert resolve_slug(memory_root, "/home/dev/web") == f"web-{hash6('/home/dev/web')}"


def test_doctor_reports_look_alike_projects(memory_root, settings):
    from cybmem.operations.write import write_run

    write_run(make_run("r1"), settings)
    for name in ("WEB", "w\u0435b"):  # what an older cybmem let -p make
        (memory_root / name / "records").mkdir(parents=True)
    report = doctor(settings, project="web")
    found = [f for f in report.findings if f.check == "projects" and "look alike" in f.message]
    assert len(found) == 1 and found[0].severity == "error" and not report.clean
    assert "projects 'WEB', 'web', 'w\u0435b' (w\\u0435b) look alike" in found[0].message
    assert run("list", "-p", "WEB").exit_code == 0, "an existing project is still reachable by its exact name"



# --- a huge task (issue 29, item 10) ----------------------------------------------------------------

_PEAK = """
import resource, subprocess, sys
p = subprocess.run(sys.argv[1:], capture_output=True)
sys.stdout.buffer.write(p.stdout)
sys.stderr.buffer.write(p.stderr)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(p.returncode)
"""


def test_a_huge_task_is_stored_whole_and_an_inject_without_cache_stays_bounded(memory_root, tmp_path):
    """The record keeps the task whole; indexing reads its first MAX_TEXT_CHARS and the block a bounded
    head of it, so an inject of a store without a cache stays small. A task of 200 x MAX_TEXT_CHARS
    (13 MB) shows it as well as the 50 MB one issue 29 found (unbounded: ~24 bytes of peak memory per
    character of the task, ~1.2 GB and ~40 s at 50 MB; ~300 MB here) at a quarter of the suite's time."""
    import random

    from cybmem.store.tokens import MAX_TEXT_CHARS

    rng = random.Random(29)
    words = ["w%dx%s" % (i, "".join(rng.choice("abcdefgh") for _ in range(5))) for i in range(200_000)]
    body = " ".join(rng.choices(words, k=1_300_000))
    task = "Refactor the login form " + body
    assert len(task) > 200 * MAX_TEXT_CHARS
    memory_root.mkdir()
    (memory_root / ".nocache").touch()  # a store without a cache: every read indexes the records
    env = {**os.environ, "CYBERINE_MEMORY_DIR": str(memory_root)}
    cybmem = [sys.executable, "-m", "cybmem.cli"]

    def inject(parent: str) -> tuple[str, float]:
        p = subprocess.run([sys.executable, "-c", _PEAK, *cybmem, "inject", "Fix the login form", "--cwd", "/home/dev/web"],
                           env={**env, "CYBERINE_PARENT_RUN_ID": parent}, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0 and p.stdout.endswith("Fix the login form"), p.stderr
        return p.stdout, int(p.stderr.splitlines()[-1]) / 1024

    small = write_json(tmp_path / "small.json", make_run("small-1", "Fix the login form", start=make_run("x")["endedAt"]))
    assert subprocess.run([*cybmem, "write", str(small)], env=env, capture_output=True, timeout=120).returncode == 0
    _, baseline_mb = inject("small-1")  # the same inject before the huge run is in the store

    def search() -> tuple[str, float]:  # a table's task column reads a bounded head too (it split the whole task)
        p = subprocess.run([sys.executable, "-c", _PEAK, *cybmem, "search", "login form", "-k", "3", "--cwd", "/home/dev/web"],
                           env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        return p.stdout, int(p.stderr.splitlines()[-1]) / 1024

    _, search_baseline_mb = search()
    big = write_json(tmp_path / "big.json", {**make_run("big-1"), "task": task})
    p = subprocess.run([*cybmem, "write", str(big)], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    stored = json.loads((memory_root / "web" / "records" / "big-1.json").read_text())
    assert stored["task"] == task, "the record keeps the task whole"
    del stored, body
    # The big run first whatever its score (the parent), so the block reads its task too.
    out, peak_mb = inject("big-1")
    assert "- run big-1 (" in out and "Refactor the login form w" in out and "- run small-1 (" in out
    assert peak_mb < baseline_mb + 120, f"inject peaked at {peak_mb:.0f} MB against {baseline_mb:.0f} MB without the huge run"
    out, peak_mb = search()
    assert "big-1" in out and "Refactor the login form w" in out
    assert peak_mb < search_baseline_mb + 120, f"search peaked at {peak_mb:.0f} MB against {search_baseline_mb:.0f} MB"
