"""The CLI through Typer's CliRunner and through real subprocesses of the console script."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from cybmem.cli.app import app
from cybmem.dispatch.preamble import FOOTER, HEADER

from conftest import MIN, T0, make_run, write_json


#: These tests check the linear formula's order, or outputs written with it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("linear_ranker")

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


@pytest.mark.parametrize("columns", ["80", "200"])
def test_help_lists_each_command_with_its_whole_description(monkeypatch, columns):
    """Click cuts a command's description to the room left, ending it in "..."; cybmem gives it whole."""
    import inspect

    import typer.main

    monkeypatch.setenv("COLUMNS", columns)
    res = run("--help")
    assert res.exit_code == 0
    listing = "".join(res.output.split("Commands:", 1)[1].split())  # Click wraps at spaces and after hyphens
    assert "..." not in listing
    for name, cmd in typer.main.get_command(app).commands.items():
        first = "".join(inspect.cleandoc(cmd.help).split("\n\n", 1)[0].split())
        assert name + first in listing, name


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
    assert run("write", populated.parent / "no-such-run.json").exit_code == 2  # a file that is not there


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
    events = json.loads(run("issues", "--events", "--json", "--cwd", "/home/dev/web").output)
    assert [e["event"] for e in events] == ["opened", "resolved"]
    assert json.loads(run("issues", "--all", "--json", "--cwd", "/home/dev/web").output)[0]["state"] == "resolved"


def test_issues_window_resolved_ones_drop_out_after_n_days(populated, monkeypatch):
    resolved_at = T0 + 200 * MIN
    assert run("mark", "flaky-login-test", "resolved", "--by", "bbbb3333", "--cwd", "/home/dev/web").exit_code == 0
    # The ledger as it was: open, then resolved; --as-of moves "now" to see the window pass.
    events = json.loads(run("issues", "--events", "--json", "--cwd", "/home/dev/web").output)
    resolved_at = events[-1]["at"]
    soon = run("issues", "--cwd", "/home/dev/web", "--as-of", str(resolved_at + 5 * 86_400_000)).output.splitlines()
    assert soon[0].split() == ["ISSUE", "OPENED", "(UTC)", "BY", "STATE", "CLOSED", "TITLE"]
    assert soon[1].split()[:4] == ["flaky-login-test", "2025-11-01", "aaaa2222", "resolved"]
    later = run("issues", "--cwd", "/home/dev/web", "--as-of", str(resolved_at + 91 * 86_400_000)).output
    assert later == ("No open issues in project web, none closed in the last 90 days.\n"
                     "1 closed more than 90 days ago not shown (--all shows them).\n")
    assert "flaky-login-test" in run("issues", "--all", "--cwd", "/home/dev/web", "--as-of", str(resolved_at + 91 * 86_400_000)).output
    monkeypatch.setenv("CYBERINE_MEMORY_ISSUE_WINDOW_DAYS", "0")
    assert run("issues", "--cwd", "/home/dev/web").output.startswith("No open issues in project web.\n")
    before = run("issues", "--cwd", "/home/dev/web", "--as-of", str(resolved_at - 1)).output
    assert before.splitlines()[1].split()[3] == "opened", "--as-of folds only the events up to then"


def test_issues_filters_and_paging(populated, tmp_path):
    for i in range(3):
        out = f"Done.\n\nACCOMPLISHED:\n- x\nISSUES:\n- Slow build number {i}: takes ages\nNEXT:\n- none\n"
        path = write_json(tmp_path / f"i{i}.json", make_run(f"cccc000{i}", f"Task {i}", start=T0 + (100 + i) * MIN, output=out))
        assert run("write", path).exit_code == 0
    ids = lambda *args: [line.split()[0] for line in run("issues", "--cwd", "/home/dev/web", *args).output.splitlines()[1:]
                         if not line.startswith("Showing")]  # noqa: E731
    # newest opened first (a page starts with what is new), --oldest-first for the other order
    assert ids() == ["slow-build-number-2", "slow-build-number-1", "slow-build-number-0", "flaky-login-test"]
    assert ids("--oldest-first") == ["flaky-login-test", "slow-build-number-0", "slow-build-number-1", "slow-build-number-2"]
    assert [i["issueId"] for i in json.loads(run("issues", "--cwd", "/home/dev/web", "--json").output)] == ids()
    assert ids("--grep", "SLOW BUILD") == ["slow-build-number-2", "slow-build-number-1", "slow-build-number-0"]
    assert ids("--grep", "ages") == ids("--grep", "slow"), "the detail counts"
    assert ids("--since", str(T0 + 111 * MIN)) == ["slow-build-number-2", "slow-build-number-1"], "an event since then"
    assert ids("--until", str(T0 + 110 * MIN)) == ["slow-build-number-0", "flaky-login-test"], "opened by then"
    res = run("issues", "--cwd", "/home/dev/web", "--limit", "2", "--offset", "1", "--oldest-first")
    assert [line.split()[0] for line in res.output.splitlines()[1:3]] == ["slow-build-number-0", "slow-build-number-1"]
    assert res.output.splitlines()[-1] == "Showing 2-3 of 4 issues; --offset 3 for the next page, --limit 0 for all."
    assert ids("--state", "closed") == []
    assert run("issues", "--cwd", "/home/dev/web", "--state", "closed").output == "No issues in project web match.\n"
    assert run("issues", "--cwd", "/home/dev/web", "--state", "gone").exit_code == 2
    ev = run("issues", "--events", "--cwd", "/home/dev/web", "--grep", "number 2").output.splitlines()
    assert len(ev) == 2 and ev[1].split()[3] == "slow-build-number-2"
    assert run("issues", "--events", "--all", "--cwd", "/home/dev/web").exit_code == 2
    assert run("issues", "--events", "--oldest-first", "--cwd", "/home/dev/web").exit_code == 2


def test_issues_ranked_against_a_query(populated, tmp_path):
    for i, title in enumerate(["Login form rejects valid passwords", "Slow build on CI", "Login page flickers"]):
        out = f"Done.\n\nACCOMPLISHED:\n- x\nISSUES:\n- {title}: seen twice\nNEXT:\n- none\n"
        path = write_json(tmp_path / f"q{i}.json", make_run(f"dddd000{i}", f"Task {i}", start=T0 + (100 + i) * MIN, output=out))
        assert run("write", path).exit_code == 0
    ranked = json.loads(run("issues", "--query", "login password rejected", "--json", "--limit", "0", "--cwd", "/home/dev/web").output)
    assert ranked[0]["issueId"] == "login-form-rejects-valid-passwords", "the issue whose words match comes first"
    assert [r["score"] for r in ranked] == sorted((r["score"] for r in ranked), reverse=True)
    assert {r["issueId"] for r in ranked} == {i["issueId"] for i in json.loads(run("issues", "--state", "open", "--json", "--cwd", "/home/dev/web").output)}
    assert set(ranked[0]["contributions"]) == {"keyword", "lineage", "recency"} and ranked[0]["state"] == "opened"
    text = run("issues", "--query", "login password rejected", "--limit", "2", "--offset", "1", "--cwd", "/home/dev/web").output.splitlines()
    assert text[0].split() == ["#", "SCORE", "ISSUE", "OPENED", "(UTC)", "BY", "TITLE"]
    assert [line.split()[2] for line in text[1:3]] == [r["issueId"] for r in ranked[1:3]], "a page of the same order"
    assert text[3] == f"Showing 2-3 of {len(ranked)} open issues; --offset 3 for the next page, --limit 0 for all."
    refused = run("issues", "--query", "login", "--state", "closed", "--cwd", "/home/dev/web")
    assert refused.exit_code == 2 and "--query ranks the open issues; --state is for the issue view" in refused.output
    assert run("issues", "--query", "  ", "--cwd", "/home/dev/web").exit_code == 2


def test_chain_both_directions(populated):
    res = run("chain", "aaaa2222", "--cwd", "/home/dev/web")
    lines = res.output.splitlines()
    assert [line[3:].split()[3] for line in lines[:3]] == ["aaaa1111", "aaaa2222", "bbbb3333"]
    assert lines[1].startswith("->")
    assert "parent: aaaa1111" in res.output and "chat session: chat-1" in res.output
    data = json.loads(run("chain", "aaaa2222", "--json", "--cwd", "/home/dev/web").output)
    assert data["previous"] == ["aaaa1111"] and data["next"] == ["bbbb3333"] and data["openIssues"] == ["flaky-login-test"]
    assert data["chainLength"] == 3 and data["omitted"] == {"before": 0, "after": 0, "unmatched": 0}


@pytest.fixture
def long_chain(memory_root, tmp_path):
    """30 runs of one project, one after another; every 5th ends in error."""
    for i in range(30):
        state = "error" if i % 5 == 0 else "done"
        path = write_json(tmp_path / f"r{i}.json", make_run(f"run-{i:02d}", f"Step {i} of the long job", state=state,
                                                           start=T0 + i * 60 * MIN))
        assert run("write", path).exit_code == 0
    return memory_root


def test_chain_context_says_what_it_left_out(long_chain):
    out = run("chain", "run-15", "--cwd", "/home/dev/web").output.splitlines()
    assert out[0] == "   ... 10 earlier runs"
    shown = [line[3:].split()[3] for line in out[1:12]]
    assert shown == [f"run-{i:02d}" for i in range(10, 21)] and out[6].startswith("-> ")
    assert out[12] == "   ... 9 later runs"
    assert out[13] == "11 of the chain's 30 runs shown; --context all shows the rest."
    for everything in ("all", "0"):
        lines = run("chain", "run-15", "--context", everything, "--cwd", "/home/dev/web").output.splitlines()
        assert len(lines) == 31 and lines[-1] == "root: run-15", "every run, nothing left out to mention"
    two = run("chain", "run-01", "-C", "2", "--cwd", "/home/dev/web").output.splitlines()
    assert [line[3:].split()[3] for line in two[:4]] == ["run-00", "run-01", "run-02", "run-03"]
    assert two[4] == "   ... 26 later runs"
    assert run("chain", "run-15", "--context", "lots", "--cwd", "/home/dev/web").exit_code == 2
    data = json.loads(run("chain", "run-15", "--context", "2", "--json", "--cwd", "/home/dev/web").output)
    assert data["previous"] == ["run-13", "run-14"] and data["next"] == ["run-16", "run-17"]
    assert data["omitted"] == {"before": 13, "after": 12, "unmatched": 0} and len(data["runs"]) == 5


def test_chain_filters_and_paging(long_chain):
    out = run("chain", "run-12", "--state", "error", "--cwd", "/home/dev/web", "-C", "all").output.splitlines()
    ids = [line[3:].split()[3] for line in out if line[:3] in ("-> ", "   ") and not line.startswith("   ...")]
    assert ids == ["run-00", "run-05", "run-10", "run-12", "run-15", "run-20", "run-25"], "the run itself stays"
    assert out[-2:] == ["7 of the chain's 30 runs shown; 23 do not match (state error).", "root: run-12"]
    page = json.loads(run("chain", "run-12", "--offset", "4", "--limit", "3", "--json", "--cwd", "/home/dev/web").output)
    assert [r["runId"] for r in page["runs"]] == ["run-04", "run-05", "run-06"]
    assert page["omitted"] == {"before": 4, "after": 23, "unmatched": 0}


def test_list_filters_and_paging(long_chain):
    out = run("list", "--cwd", "/home/dev/web", "-n", "4").output.splitlines()
    assert [line.split()[3] for line in out[1:5]] == ["run-29", "run-28", "run-27", "run-26"]
    assert out[5] == "Showing 1-4 of 30 records; --offset 4 for the next page, --limit 0 for all."
    out = run("list", "--cwd", "/home/dev/web", "-n", "4", "--offset", "4").output.splitlines()
    assert [line.split()[3] for line in out[1:5]] == ["run-25", "run-24", "run-23", "run-22"]
    errors = json.loads(run("list", "--cwd", "/home/dev/web", "--state", "error", "--json").output)
    assert [e["runId"] for e in errors] == ["run-25", "run-20", "run-15", "run-10", "run-05", "run-00"]
    assert len(json.loads(run("list", "--cwd", "/home/dev/web", "--json").output)) == 30
    since = json.loads(run("list", "--cwd", "/home/dev/web", "--json", "--since", "2025-11-02T02:10").output)
    assert since[-1]["runId"] == "run-26" and len(since) == 4, "ISO time: runs that ended at or after it"
    day = json.loads(run("list", "--cwd", "/home/dev/web", "--json", "--until", "2025-11-01").output)
    assert len(day) == 24, "a bare date counts whole"
    assert json.loads(run("list", "--cwd", "/home/dev/web", "--json", "--until", "2025-10").output) == []
    assert [e["runId"] for e in json.loads(run("list", "--cwd", "/home/dev/web", "--json", "--grep", "STEP 1 ").output)] == ["run-01"]
    assert len(json.loads(run("list", "--cwd", "/home/dev/web", "--json", "--agent", "impl-1").output)) == 30
    assert run("list", "--cwd", "/home/dev/web", "--agent", "impl-9").output == "No records in project web (by agent impl-9).\n"
    assert run("list", "--cwd", "/home/dev/web", "--since", "last week").exit_code == 2


def test_list_and_search_by_issue(populated):
    assert run("mark", "flaky-login-test", "resolved", "--by", "bbbb3333", "--cwd", "/home/dev/web").exit_code == 0
    ids = [e["runId"] for e in json.loads(run("list", "--cwd", "/home/dev/web", "--issue", "flaky-login-test", "--json").output)]
    assert ids == ["bbbb3333", "aaaa2222"], "the run that raised it and the run that resolved it"
    hits = json.loads(run("search", "password login", "--cwd", "/home/dev/web", "--issue", "flaky-login-test", "--json").output)["hits"]
    assert {h["runId"] for h in hits} == {"bbbb3333", "aaaa2222"}


def test_search_filters_and_offset(long_chain):
    res = json.loads(run("search", "long job step", "--cwd", "/home/dev/web", "--json", "-k", "30").output)
    ranked = [h["runId"] for h in res["hits"]]
    page2 = json.loads(run("search", "long job step", "--cwd", "/home/dev/web", "--json", "--limit", "5", "--offset", "5").output)
    assert [h["runId"] for h in page2["hits"]] == ranked[5:10] and [h["rank"] for h in page2["hits"]] == [6, 7, 8, 9, 10]
    err = json.loads(run("search", "long job step", "--cwd", "/home/dev/web", "--json", "--state", "error").output)
    assert {h["runId"] for h in err["hits"]} == {f"run-{i:02d}" for i in range(0, 30, 5)} and err["candidates"] == 6
    out = run("search", "long job", "--cwd", "/home/dev/web", "--state", "error", "--explain").output
    assert "among 6 records (state error)" in out
    assert run("search", "long job", "--cwd", "/home/dev/web", "--grep", "nothing like it").output == \
        "No matching records in project web (matching 'nothing like it').\n"


def test_tables_show_the_subject_and_fit_the_terminal(memory_root, tmp_path, monkeypatch):
    task = ("Merge pull request #12038 from bluetech/fixtures-rm-arg2index\n\n"
            "fixtures: avoid mutable arg2index state in favor of looking up the request chain")
    assert run("write", write_json(tmp_path / "m.json", make_run("merge-1", task))).exit_code == 0
    monkeypatch.setenv("COLUMNS", "200")
    wide = run("list", "--cwd", "/home/dev/web").output.splitlines()[1]
    assert wide.endswith("fixtures: avoid mutable arg2index state in favor of looking up the request chain (#12038)")
    monkeypatch.setenv("COLUMNS", "80")
    narrow = run("list", "--cwd", "/home/dev/web").output.splitlines()[1]
    assert len(narrow) <= 80 and narrow.endswith("… (#12038)") and "fixtures: avoid" in narrow
    for cmd in (["search", "arg2index"], ["chain", "merge-1"]):
        line = next(x for x in run(*cmd, "--cwd", "/home/dev/web").output.splitlines() if "merge-1"[:8] in x)
        assert len(line) <= 80 and line.endswith("(#12038)"), cmd


def test_version_and_json_errors_on_stderr(populated):
    exe = shutil.which("cybmem")
    env = {**os.environ}
    p = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    from cybmem import __version__

    assert p.returncode == 0 and p.stdout == f"cybmem {__version__}\n"
    p = subprocess.run([exe, "show", "nope", "--json", "--cwd", "/home/dev/web"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and p.stdout == ""
    err = json.loads(p.stderr)
    assert err["exitCode"] == 1 and err["error"].startswith("no record matches 'nope'")
    p = subprocess.run([exe, "list", "--since", "soon", "--json", "--cwd", "/home/dev/web"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stdout == "" and json.loads(p.stderr)["exitCode"] == 2
    p = subprocess.run([exe, "list", "--bogus", "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "No such option: --bogus" in json.loads(p.stderr)["error"]
    p = subprocess.run([exe, "list", "--bogus"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "No such option: --bogus" in p.stderr
    p = subprocess.run([exe, "tune", "--metric", "best", "--cwd", "/home/dev/web"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "'best' is not one of mrr, ndcg, recall" in p.stderr


def test_inject_and_strip_end_with_a_newline_on_a_terminal_only(populated):
    """Exact bytes to a pipe (strip(inject(t)) == t); a trailing newline when a person reads it."""
    import pty

    exe = shutil.which("cybmem")
    env = {**os.environ}
    piped = subprocess.run([exe, "inject", "New task", "--cwd", "/fresh/project"], env=env, capture_output=True, text=True, timeout=60)
    assert piped.stdout == "New task"
    for args in (["inject", "New task", "--cwd", "/fresh/project"], ["strip", "New task"]):
        primary, secondary = pty.openpty()
        p = subprocess.run([exe, *args], env=env, stdout=secondary, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=60)
        os.close(secondary)
        out = b""
        while True:
            try:
                chunk = os.read(primary, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        os.close(primary)
        assert p.returncode == 0 and out.replace(b"\r\n", b"\n") == b"New task\n", args


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
    code = ("import sys\nfrom cybmem.cli.app import main\nsys.argv = ['cybmem'] + sys.argv[1:]\n"
            "try:\n    main()\nexcept SystemExit as e:\n    print('EXIT', e.code, file=sys.stderr)\n"
            "print('PYDANTIC', 'pydantic' in sys.modules, file=sys.stderr)")
    root = str(tmp_path / "memory")
    p = subprocess.run([sys.executable, "-c", code, "inject", "anything", "--memory-dir", root, "-p", "web",
                        "--cwd", str(tmp_path), "--json"], capture_output=True, text=True, timeout=120)
    assert "PYDANTIC False" in p.stderr and json.loads(p.stdout)["prompt"] == "anything", p.stderr
    p = subprocess.run([sys.executable, "-c", code, "search", "anything", "--memory-dir", root, "-k", "0"],
                       capture_output=True, text=True, timeout=120)
    assert "EXIT 2" in p.stderr and "Invalid value for '-k'" in p.stderr, p.stderr


@pytest.mark.parametrize("cmd", [["list"], ["search", "login"], ["chain", "aaaa1111", "--grep", "login"]])
def test_a_slow_cold_load_says_so_after_a_second(populated, monkeypatch, cmd):
    """A cold load of a large store takes seconds: a timer prints one notice while it parses."""
    import time as _time

    from cybmem.store import refresh

    real = refresh.load_records

    def slow(*args, **kwargs):
        _time.sleep(0.4)
        return real(*args, **kwargs)

    monkeypatch.setattr(refresh, "load_records", slow)
    monkeypatch.setattr(refresh, "_PROGRESS_AFTER_S", 0.1)
    res = run(*cmd, "--cwd", "/home/dev/web")
    assert res.exit_code == 0
    assert res.stderr == "cybmem: indexing 3 records of project web (once; later reads use the cache)\n"
    again = run(*cmd, "--cwd", "/home/dev/web")
    assert again.stderr == "", "a warm load is quiet"


def test_the_console_script_ends_lean_commands_without_teardown_and_loses_nothing(memory_root, tmp_path):
    """`cybmem` (cybmem.cli:console) skips the interpreter's teardown after a lean command: every
    byte it printed still arrives through a pipe (a quarter of a megabyte here), what it wrote is on disk,
    and exit codes are the ordinary ones."""
    exe = shutil.which("cybmem")
    env = {**os.environ, "CYBERINE_MEMORY_DIR": str(memory_root)}
    # Through the console script: the first write (it registers the project), the one whose trailer
    # opens an issue (a ledger line too) and the last; the others only make the store big, in-process.
    console = {0, 7, 59}
    for i in range(60):
        path = write_json(tmp_path / f"r{i}.json", make_run(f"cons-{i:03d}", f"Task {i} " + "long words " * 400,
                                                          start=T0 + i * MIN, output=TRAILER if i == 7 else None))
        if i in console:
            p = subprocess.run([exe, "write", str(path)], env=env, capture_output=True, text=True, timeout=60)
            assert p.returncode == 0 and p.stdout.startswith(f"Wrote cons-{i:03d} (done)"), p.stderr
        else:
            res = run("write", path)
            assert res.exit_code == 0 and res.stdout.startswith(f"Wrote cons-{i:03d} (done)"), res.stderr
    assert [json.loads(line)["byRunId"] for line in (memory_root / "web" / "issues.jsonl").read_text().splitlines()] == ["cons-007"]
    p = subprocess.run([exe, "list", "--json", "--limit", "1000", "--cwd", "/home/dev/web"], env=env,
                       capture_output=True, timeout=60)
    inproc = run("list", "--json", "--limit", "1000", "--cwd", "/home/dev/web")
    assert p.returncode == 0 and len(p.stdout) > 30_000 and p.stdout.decode() == inproc.stdout
    assert len(json.loads(p.stdout)) == 60
    p = subprocess.run([exe, "show", "nope", "--cwd", "/home/dev/web"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and p.stderr.startswith("Error: no record matches 'nope'")
    p = subprocess.run([exe, "inject", "", "--cwd", "/home/dev/web"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "the task is empty" in p.stderr
    res = run("doctor", "--cwd", "/home/dev/web")
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("parser", ["stand-in", "refused"])
def test_pyarrow_compute_is_imported_whole_with_or_without_the_docstring_stand_in(parser):
    """The quick import of pyarrow.compute (a stand-in for its docstring parser) leaves a working
    module and no stand-in behind; a pyarrow that wants more of the parser than the stand-in has
    gets the ordinary import."""
    code = ("import sys\nimport cybmem.cli._startup as c\n"
            + ("c.docstring_stand_in = lambda doc: {}['Parameters']\n" if parser == "refused" else "")
            + "c.quick_compute_import()\nimport pyarrow as pa, pyarrow.compute as pc\n"
            "assert pc.sum(pa.array([1, 2, 3])).as_py() == 6 and pc.is_in(pa.array(['a']), value_set=pa.array(['a'])).to_pylist() == [True]\n"
            "real = sys.modules.get('pyarrow.vendored.docscrape')\n"
            "print('STAND-IN LEFT' if real is not None and real.__name__ == 'pyarrow.vendored.docscrape' and not hasattr(real, '__file__') else 'CLEAN',"
            " 'DOCS' if 'Parameters' in (pc.is_in.__doc__ or '') and 'value_set' in pc.is_in.__doc__ else 'NODOCS')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == (["CLEAN", "NODOCS"] if parser == "stand-in" else ["CLEAN", "DOCS"]), p.stdout


def test_int_options_parse_and_complain_as_typers_pydantic_coercion_does():
    """The console path parses int options itself (no pydantic import, 60 ms a call): every input
    gets pydantic's value or pydantic's message, as typer would have given it."""
    from typing import Annotated

    import typer as _typer
    from pydantic import Field, TypeAdapter, ValidationError

    from cybmem.cli._startup import plain_int

    values = ["0", "1", "abc", "1.5", "3.0", "3.", " 3", "+3", "-1", "-0", "3_000", "3_", "_3", "1__0", "１", "",
              "1e3", "0x10", "007", " 4 \n", "1_000.0", "3.01", "- 3", "99999999999999999999999", 5]
    for lo, hi in [(None, None), (0, None), (1, None), (2, 7)]:
        adapter = TypeAdapter(Annotated[int, Field(ge=lo, le=hi)])
        for v in values:
            try:
                want = adapter.validate_python(v)
            except ValidationError as exc:
                want = exc.errors()[0]["msg"]
            try:
                got = plain_int(v, lo, hi)
            except _typer.BadParameter as exc:
                got = exc.message
            assert got == want, (v, lo, hi, got, want)


def test_readmes_first_command_leaves_nothing_a_test_copy_keeps(tmp_path):
    """README's first command runs inject on the checkout's own fixtures, which keeps what it showed
    (web/shown.jsonl): the tests' copies of the fixtures (conftest.LEFTOVERS) leave out everything it
    and the other verbs leave behind, so the second command passes after the first."""
    import shlex
    import shutil
    from pathlib import Path

    from conftest import FIXTURES, LEFTOVERS

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text().splitlines()
    first = next(line for line in readme if line.startswith("pip install -e . && cybmem "))
    argv = shlex.split(first.split("&&", 1)[1])
    checkout = tmp_path / "checkout"
    shutil.copytree(FIXTURES.parent, checkout / "data-fixtures", ignore=LEFTOVERS)
    tracked = sorted(p.relative_to(checkout).as_posix() for p in checkout.rglob("*"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CYBERINE_")}
    res = subprocess.run([shutil.which("cybmem") or "cybmem", *argv[1:]], cwd=checkout, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.startswith("MEMORY (prior runs"), res.stderr
    left = sorted(p.relative_to(checkout).as_posix() for p in checkout.rglob("*"))
    assert "data-fixtures/memory/web/shown.jsonl" in set(left) - set(tracked), "the first command keeps what it showed"
    again = tmp_path / "again"
    shutil.copytree(checkout / "data-fixtures", again / "data-fixtures", ignore=LEFTOVERS)
    assert sorted(p.relative_to(again).as_posix() for p in again.rglob("*")) == tracked
