"""The CLI through Typer's CliRunner and through real subprocesses of the console script."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from cybmem.cli import app
from cybmem.preamble import FOOTER, HEADER

from conftest import MIN, T0, make_run, write_json

runner = CliRunner()

TRAILER = "Done.\n\nACCOMPLISHED:\n- fixed it\nISSUES:\n- Flaky login test: fails one run in ten\nNEXT:\n- none\n"


def run(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


@pytest.fixture
def populated(memory_root, tmp_path):
    """Three runs of /home/dev/web: a, b (dispatched by a, opens an issue), c."""
    for i, (rid, task, extra) in enumerate([
        ("aaaa1111", "Set up the login page", {}),
        ("aaaa2222", "Fix the login form validation", {"lineage": {"parentRunId": "aaaa1111", "chatSessionId": "chat-1"}}),
        ("bbbb3333", "Add a password strength meter", {}),
    ]):
        out = TRAILER if rid == "aaaa2222" else None
        path = write_json(tmp_path / f"{rid}.json", make_run(rid, task, start=T0 + i * 60 * MIN, output=out, **extra))
        res = run("write", path)
        assert res.exit_code == 0, res.output
    return memory_root


def test_every_command_has_help_with_an_example():
    import typer.main

    group = typer.main.get_command(app)
    assert set(group.commands) >= {"list", "show", "issues", "chain", "rebuild", "write", "search", "inject", "strip", "projects", "supersede", "mark"}
    for name, cmd in group.commands.items():
        assert cmd.help and "Example:" in cmd.help, name
        res = run(name, "--help")
        assert res.exit_code == 0 and "Usage:" in res.output


def test_write_prints_what_it_did(memory_root, tmp_path):
    path = write_json(tmp_path / "run.json", make_run("r1", output=TRAILER))
    res = run("write", path)
    assert res.exit_code == 0
    assert res.output == "Wrote r1 (done) to project web; opened flaky-login-test.\n"
    assert (memory_root / "web" / "records" / "r1.json").exists()


def test_write_from_stdin_and_json(memory_root):
    res = run("write", "-", "--json", input=json.dumps(make_run("r1")))
    assert res.exit_code == 0
    data = json.loads(res.output)
    assert data["runId"] == "r1" and data["project"] == "web" and data["events"] == []


def test_write_bad_input_exits_1_and_leaves_nothing(memory_root, tmp_path):
    bad = make_run("r1")
    bad["status"] = "running"
    res = run("write", write_json(tmp_path / "run.json", bad))
    assert res.exit_code == 1
    assert "Error: state: 'running' is not a final state" in res.output
    assert not memory_root.exists() or not any(memory_root.rglob("*.json"))


def test_write_hook_mode_never_fails(memory_root):
    res = run("write", "--hook", input="{not json")
    assert res.exit_code == 0
    assert "warning: memory record not written: input is not valid JSON" in res.output
    res = run("write", "--hook", input=json.dumps({"event": "RunEnd", "run": make_run("r1")}))
    assert res.exit_code == 0 and (memory_root / "web" / "records" / "r1.json").exists()


def test_usage_errors_exit_2(populated):
    assert run("list", "--state", "finished", "--cwd", "/home/dev/web").exit_code == 2
    assert run("write").exit_code == 2
    assert run("show").exit_code == 2
    assert run("write", "/no/such/run.json").exit_code == 2


def test_list_newest_first(populated):
    res = run("list", "--cwd", "/home/dev/web")
    assert res.exit_code == 0
    lines = res.output.splitlines()
    assert lines[0].split() == ["ENDED", "(UTC)", "STATE", "RUN", "WORKFLOW", "TASK"]
    assert [line.split()[3] for line in lines[1:]] == ["bbbb3333", "aaaa2222", "aaaa1111"]
    data = json.loads(run("list", "--cwd", "/home/dev/web", "--json", "-n", "1").output)
    assert [e["runId"] for e in data] == ["bbbb3333"]


def test_show_by_prefix_and_ambiguous_prefix(populated):
    res = run("show", "aaaa2", "--cwd", "/home/dev/web")
    assert res.exit_code == 0
    assert "Run:        aaaa2222" in res.output and "Parent:     aaaa1111" in res.output
    assert "  - flaky-login-test" in res.output
    res = run("show", "aaaa", "--cwd", "/home/dev/web")
    assert res.exit_code == 1
    assert "prefix 'aaaa' matches 2 records: aaaa1111, aaaa2222" in res.output
    res = run("show", "zz", "--cwd", "/home/dev/web")
    assert res.exit_code == 1 and "no record matches 'zz'" in res.output


def test_supersede_then_show_renders_the_newest_truth(populated, tmp_path):
    fixed = write_json(tmp_path / "fix.json", make_run("aaaa1111-fix", "Set up the login page (corrected)", start=T0 + 200 * MIN))
    res = run("supersede", "aaaa1", fixed, "--cwd", "/home/dev/web")
    assert res.exit_code == 0, res.output
    res = run("show", "aaaa1111", "--cwd", "/home/dev/web")
    assert "was superseded; showing the newest truth aaaa1111-fix" in res.output
    assert "Set up the login page (corrected)" in res.output
    assert res.output.split("Task:")[1].split("Summary:")[0].strip() == "Set up the login page (corrected)"
    orig = run("show", "aaaa1111", "--original", "--json", "--cwd", "/home/dev/web")
    assert json.loads(orig.output)["task"] == "Set up the login page"
    listed = run("list", "--cwd", "/home/dev/web").output
    assert "done*" in listed and "superseded" in listed


def test_issues_open_and_all(populated):
    res = run("issues", "--cwd", "/home/dev/web")
    assert res.exit_code == 0
    assert res.output.splitlines()[1].split()[:2] == ["flaky-login-test", "2025-11-01"]
    assert run("mark", "flaky-login-test", "resolved", "--by", "bbbb3333", "--cwd", "/home/dev/web").exit_code == 0
    assert run("issues", "--cwd", "/home/dev/web").output == "No open issues in project web.\n"
    events = json.loads(run("issues", "--all", "--json", "--cwd", "/home/dev/web").output)
    assert [e["event"] for e in events] == ["opened", "resolved"]


def test_chain_both_directions(populated):
    res = run("chain", "aaaa2222", "--cwd", "/home/dev/web")
    lines = res.output.splitlines()
    assert [line[3:].split()[3] for line in lines[:3]] == ["aaaa1111", "aaaa2222", "bbbb3333"]
    assert lines[1].startswith("->")
    assert "parent: aaaa1111" in res.output and "chat session: chat-1" in res.output
    data = json.loads(run("chain", "aaaa2222", "--json", "--cwd", "/home/dev/web").output)
    assert data["previous"] == ["aaaa1111"] and data["next"] == ["bbbb3333"] and data["openIssues"] == ["flaky-login-test"]


def test_rebuild(populated):
    index = populated / "web" / "index.json"
    before = index.read_bytes()
    index.unlink()
    res = run("rebuild", "--cwd", "/home/dev/web")
    assert res.exit_code == 0 and "from 3 records" in res.output
    assert index.read_bytes() == before


def test_unknown_project_is_a_clear_error(populated):
    res = run("list", "--cwd", "/somewhere/else")
    assert res.exit_code == 1
    assert "no memory for project /somewhere/else" in res.output and "known projects: web" in res.output
    res = run("list", "--project", "nope")
    assert res.exit_code == 1 and "no project 'nope'" in res.output


def test_search_and_explain(populated):
    res = run("search", "login form validation", "--cwd", "/home/dev/web", "--explain", "--as-of", str(T0 + 300 * MIN))
    assert res.exit_code == 0
    assert res.output.splitlines()[1].split()[2] == "aaaa2222"
    assert "weights: w_kw=" in res.output and " 1. aaaa2222  kw=" in res.output
    data = json.loads(run("search", "login", "--cwd", "/home/dev/web", "--json", "--explain", "-k", "2").output)
    assert len(data["hits"]) == 2 and set(data["hits"][0]["contributions"]) >= {"keyword", "recency", "lineage"}


def test_inject_strip_round_trip(populated):
    task = "Fix the login form\n\nIt rejects valid emails.\n"
    injected = run("inject", task, "--cwd", "/home/dev/web").output
    assert injected.startswith(HEADER + "\n") and f"\n{FOOTER}\n\n{task}" in injected
    assert run("strip", input=injected).output == task
    block = run("inject", "--system", "--cwd", "/home/dev/web").output
    assert block.startswith(HEADER) and block.rstrip().endswith(FOOTER)


def test_inject_modes_argument_file_stdin(populated, tmp_path):
    f = tmp_path / "task.txt"
    f.write_text("Fix the login form")
    outs = {
        run("inject", "Fix the login form", "--cwd", "/home/dev/web").output,
        run("inject", "--file", f, "--cwd", "/home/dev/web").output,
        run("inject", "--cwd", "/home/dev/web", input="Fix the login form").output,
    }
    assert len(outs) == 1 and outs.pop().endswith("END MEMORY\n\nFix the login form")


def test_inject_without_memory_or_disabled_prints_the_task_alone(populated, monkeypatch):
    res = run("inject", "New task", "--cwd", "/fresh/project")
    assert res.stdout == "New task"
    assert res.stderr.startswith("warning: no memory yet for the project at /fresh/project") and "known projects: web" in res.stderr
    monkeypatch.setenv("CYBERINE_MEMORY", "0")
    res = run("inject", "New task", "--cwd", "/home/dev/web")
    assert (res.stdout, res.stderr) == ("New task", "")


def test_projects_lists_slugs(populated):
    res = run("projects", "--json")
    assert json.loads(res.output) == [{"slug": "web", "cwd": "/home/dev/web", "records": 3}]


def test_console_script_in_a_real_subprocess(memory_root, tmp_path):
    exe = shutil.which("cybmem")
    assert exe, "pip install -e . provides the cybmem console script"
    env = {**os.environ, "CYBERINE_MEMORY_DIR": str(memory_root), "CYBERINE_RUN_ID": "sub-1"}
    run_json = make_run("ignored", output=TRAILER)
    del run_json["id"]
    p = subprocess.run([exe, "write", "-", "--cwd", "/home/dev/web"], input=json.dumps(run_json), env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "Wrote sub-1 (done) to project web; opened flaky-login-test.\n"
    p = subprocess.run([exe, "show", "sub", "--json", "--cwd", "/home/dev/web"], env=env, capture_output=True, text=True, timeout=60)
    assert json.loads(p.stdout)["runId"] == "sub-1"
    p = subprocess.run([exe, "inject", "Fix the flaky login test", "--cwd", "/home/dev/web"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "flaky-login-test" in p.stdout and p.stdout.endswith("\n\nFix the flaky login test")
    p = subprocess.run([exe, "show", "nope", "--cwd", "/home/dev/web"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and p.stderr.startswith("Error: no record matches 'nope'")
    p = subprocess.run([sys.executable, "-m", "cybmem.cli", "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "inject" in p.stdout


def test_fixture_store_reads(fixture_copy):
    res = run("list", "--memory-dir", fixture_copy, "--project", "web", "--json")
    entries = json.loads(res.output)
    assert len(entries) == 47 and {e["state"] for e in entries} == {"done", "error", "cancelled"}
    res = run("projects", "--memory-dir", fixture_copy)
    assert "web-7663e1" in res.output and "/srv/clients/acme/web" in res.output


def test_inject_and_show_report_unreadable_records_once(populated):
    (populated / "web" / "records" / "broken.json").write_text("{not json")
    res = run("inject", "login form", "--cwd", "/home/dev/web")
    assert res.exit_code == 0
    warnings = res.stderr.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("warning: broken.json: not valid JSON")
    assert res.stdout.endswith("END MEMORY\n\nlogin form"), "stdout stays the exact prompt"
    res = run("show", "aaaa1111", "--cwd", "/home/dev/web")
    assert res.exit_code == 0 and res.stderr.count("warning: broken.json") == 1


def test_plain_options_skip_typers_pydantic_but_checked_ones_keep_it(tmp_path):
    """The console entry point coerces plain str/Path/flag options itself; a ranged option still
    gets typer's validation and message."""
    code = ("import sys\nfrom cybmem.cli import main\nsys.argv = ['cybmem'] + sys.argv[1:]\n"
            "try:\n    main()\nexcept SystemExit as e:\n    print('EXIT', e.code, file=sys.stderr)\n"
            "print('PYDANTIC', 'pydantic' in sys.modules, file=sys.stderr)")
    root = str(tmp_path / "memory")
    p = subprocess.run([sys.executable, "-c", code, "inject", "anything", "--memory-dir", root, "-p", "web",
                        "--cwd", str(tmp_path), "--json"], capture_output=True, text=True, timeout=120)
    assert "PYDANTIC False" in p.stderr and json.loads(p.stdout)["prompt"] == "anything", p.stderr
    p = subprocess.run([sys.executable, "-c", code, "search", "anything", "--memory-dir", root, "-k", "0"],
                       capture_output=True, text=True, timeout=120)
    assert "EXIT 2" in p.stderr and "Invalid value for '-k'" in p.stderr, p.stderr
