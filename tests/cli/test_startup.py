"""The console script's start-up tricks (cybmem/cli/_startup.py): each one in a real subprocess, each
one only for the commands that opt in, and none of them reaching into another library's private names."""

import ast
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cybmem.cli import _startup, app as cli
from cybmem.settings import Settings

from conftest import T0, make_run, write_json

PACKAGE = Path(cli.__file__).resolve().parent

#: The commands on the dispatch path and the light reads (they never build a DataFrame).
QUICK = {"list", "show", "issues", "chain", "projects", "rebuild", "write", "supersede", "mark", "search", "inject",
         "strip", "embed", "tune", "eval"}

#: One command in a fresh interpreter through cybmem.cli.app.main (as the console script runs it), then
#: what the process imported; `console` instead ends as the console script does.
MAIN = ("import sys\nfrom cybmem.cli.app import main\nsys.argv = ['cybmem'] + sys.argv[1:]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    print('EXIT', e.code, file=sys.stderr)\n"
        "import pyarrow.compute as pc\n"
        "print('MODULES', 'pydantic' in sys.modules, 'pandas' in sys.modules,"
        " 'value_set' in (pc.is_in.__doc__ or ''), file=sys.stderr)\n")
CONSOLE = ("import atexit, sys\natexit.register(lambda: print('TEARDOWN', file=sys.stderr, flush=True))\n"
           "from cybmem.cli.app import console\nsys.argv = ['cybmem'] + sys.argv[1:]\nconsole()\n")


def _py(code: str, *args, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], input=stdin, capture_output=True, text=True,
                          timeout=120, env={**os.environ})


def _modules(p: subprocess.CompletedProcess) -> dict:
    """What MAIN printed: pydantic imported, pandas imported, pyarrow.compute with its parsed docstrings."""
    words = next(line for line in p.stderr.splitlines() if line.startswith("MODULES")).split()[1:]
    return dict(zip(["pydantic", "pandas", "compute_docs"], [w == "True" for w in words]))


@pytest.fixture
def store(memory_root, tmp_path):
    """Two runs of /home/dev/web written through the console path."""
    for i, rid in enumerate(["aaaa1111", "aaaa2222"]):
        path = write_json(tmp_path / f"{rid}.json", make_run(rid, f"Fix the login form, step {i}", start=T0 + i * 60_000))
        assert _py(MAIN, "write", path).stderr.startswith("EXIT 0")
    return memory_root


def test_the_tricks_are_opt_in_per_command():
    """A new command gets none of them unless it says quick=True; the ones on the dispatch path do."""
    assert inspect.signature(cli.command).parameters["quick"].default is False
    assert {c.name for c in cli.app.registered_commands if _startup.is_quick(c)} == QUICK
    # `hook` is quick outside the app: the console script hands `cybmem hook` to cybmem.hooks.entry (below)
    assert {c.name for c in cli.app.registered_commands} - QUICK == {"redact", "report", "doctor", "mcp", "hook"}
    assert not any(_startup.is_quick(c) for sub in (cli.export_app, cli.fleet_app) for c in sub.registered_commands)


def test_plain_options_skip_pydantic_only_in_commands_that_opt_in(store, tmp_path):
    """inject and write parse their options without typer's pydantic coercion, with the same values
    and messages; a command that did not opt in keeps typer's own coercion."""
    p = _py(MAIN, "inject", "login form", "--cwd", "/home/dev/web", "--json", "--parent", "aaaa1111")
    assert p.stderr.splitlines()[0] == "EXIT 0" and json.loads(p.stdout)["task"] == "login form", p.stderr
    assert _modules(p)["pydantic"] is False
    run = write_json(tmp_path / "r.json", make_run("cccc3333", "Another task", start=T0 + 3_600_000))
    p = _py(MAIN, "write", run, "--run-id", "cccc3333", "--json")
    assert json.loads(p.stdout)["runId"] == "cccc3333" and _modules(p)["pydantic"] is False, p.stderr
    p = _py(MAIN, "list", "--limit", "abc", "--cwd", "/home/dev/web")
    assert "Invalid value for '--limit' / '-n': Input should be a valid integer, unable to parse string as an integer" in p.stderr
    assert "EXIT 2" in p.stderr and _modules(p)["pydantic"] is False
    p = _py(MAIN, "list", "-n", " 1 ", "--cwd", "/home/dev/web", "--json")
    assert [r["runId"] for r in json.loads(p.stdout)] == ["cccc3333"] and _modules(p)["pydantic"] is False
    p = _py(MAIN, "doctor", "--cwd", "/home/dev/web")
    assert "EXIT 0" in p.stderr and _modules(p)["pydantic"] is True, p.stderr


def test_quick_commands_refuse_pandas_and_parse_no_compute_docstrings(store):
    """A quick read in a one-command process never imports pandas and imports pyarrow.compute with
    the docstring stand-in; the same command in-process (CliRunner: a program that may build
    DataFrames later) and a command that did not opt in get the ordinary imports."""
    p = _py(MAIN, "search", "login", "--cwd", "/home/dev/web", "--json")
    assert len(json.loads(p.stdout)["hits"]) == 2, p.stderr
    assert _modules(p) == {"pydantic": False, "pandas": False, "compute_docs": False}
    in_process = ("import sys\nfrom typer.testing import CliRunner\nfrom cybmem.cli.app import app\n"
                  "res = CliRunner().invoke(app, ['search', 'login', '--cwd', '/home/dev/web'])\n"
                  "import pandas, pyarrow.compute as pc\nassert res.exit_code == 0, res.output\n"
                  "print('DOCS', 'value_set' in pc.is_in.__doc__)\n")
    p = _py(in_process)
    assert p.returncode == 0 and p.stdout.split() == ["DOCS", "True"], p.stderr
    p = _py(MAIN, "export", "csv", "--cwd", "/home/dev/web")
    assert p.stdout.startswith("project,runId,") and p.stdout.count("aaaa") >= 2, p.stderr
    assert _modules(p)["compute_docs"] is True, p.stderr


def test_only_quick_commands_end_without_teardown(store):
    """After a quick command the process ends once its output is flushed (no atexit, no teardown),
    with the command's exit code; any other command ends the ordinary way."""
    p = _py(CONSOLE, "inject", "login form", "--cwd", "/home/dev/web")
    assert p.returncode == 0 and p.stdout.endswith("login form") and "TEARDOWN" not in p.stderr, p.stderr
    p = _py(CONSOLE, "inject", "", "--cwd", "/home/dev/web")
    assert p.returncode == 2 and "the task is empty" in p.stderr and "TEARDOWN" not in p.stderr
    p = _py(CONSOLE, "show", "nope", "--cwd", "/home/dev/web")
    assert p.returncode == 1 and p.stderr.startswith("Error: no record matches 'nope'") and "TEARDOWN" not in p.stderr
    p = _py(CONSOLE, "doctor", "--cwd", "/home/dev/web")
    assert p.returncode == 0 and p.stderr.rstrip().endswith("TEARDOWN"), p.stderr
    p = _py(CONSOLE, "--version")
    assert p.returncode == 0 and p.stdout.startswith("cybmem ") and "TEARDOWN" in p.stderr


def test_only_the_named_quick_command_is_built_and_reads_the_same():
    """For a quick command Click builds that command alone; its help and usage errors read as
    they do from the whole app. Other commands and the root get the whole app."""
    assert [c.name for c in _startup.named_only(cli.app, ["inject", "x"]).registered_commands] == ["inject"]
    for args in (["doctor"], ["--help"], [], ["nosuch"]):
        assert _startup.named_only(cli.app, args) is cli.app
    whole = _py("import sys, typer\nfrom cybmem.cli.app import app\n"
                "typer.main.get_command(app).main(sys.argv[1:], prog_name='cybmem')\n", "inject", "--help")
    p = _py(CONSOLE, "inject", "--help")
    assert p.returncode == 0 and p.stdout == whole.stdout and "Example: cybmem inject" in p.stdout
    p = _py(CONSOLE, "inject", "x", "--bogus")
    assert p.returncode == 2 and "No such option: --bogus" in p.stderr


def test_settings_are_read_once_per_command(store, tmp_path, monkeypatch):
    """inject and write resolve the environment once (Settings.from_env) and pass the object on."""
    calls = []
    real = Settings.from_env.__func__

    def counted(cls, *args, **kwargs):
        calls.append(kwargs)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(Settings, "from_env", classmethod(counted))
    run = write_json(tmp_path / "r.json", make_run("dddd4444", "Yet another task", start=T0 + 7_200_000))
    for args in (["write", str(run)], ["inject", "login form", "--cwd", "/home/dev/web"],
                 ["search", "login", "--cwd", "/home/dev/web"]):
        calls.clear()
        res = CliRunner().invoke(cli.app, args)
        assert res.exit_code == 0, res.output
        assert len(calls) == 1, (args, calls)


THIRD_PARTY = ("typer", "click", "pyarrow", "pydantic", "pandas", "numpy")


def _private(dotted: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))


def test_no_module_reaches_into_a_third_party_private_name():
    """No ``from typer._x import``, ``typer._click``, ``typer.core._TyperParameter``...: a newer
    release may change private code without notice."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in THIRD_PARTY:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                found += [f"{path.name}:{node.lineno} {n}" for n in names if _private(n)]
            elif isinstance(node, ast.Import):
                found += [f"{path.name}:{node.lineno} {a.name}" for a in node.names
                          if a.name.split(".")[0] in THIRD_PARTY and _private(a.name)]
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = node.value
                while isinstance(base, ast.Attribute):
                    base = base.value
                if isinstance(base, ast.Name) and base.id in THIRD_PARTY + ("typer_core",):
                    found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    assert found == [], found


#: ``cybmem hook`` as the console script runs it, then what the process imported (atexit: it ends without teardown).
HOOK = ("import atexit, sys\natexit.register(lambda: print('TEARDOWN', file=sys.stderr, flush=True))\n"
        "import cybmem.hooks.entry as entry\n"
        "def report(args, main=entry.main):\n"
        "    main(args)\n"
        "    import pyarrow.compute as pc\n"
        "    print('MODULES', 'typer' in sys.modules, 'pandas' in sys.modules, 'value_set' in (pc.is_in.__doc__ or ''),"
        " file=sys.stderr, flush=True)\n"
        "entry.main = report\n"
        "from cybmem.cli import console\nsys.argv = ['cybmem'] + sys.argv[1:]\nconsole()\n")


def test_the_hook_starts_without_the_app_pandas_or_compute_docs_and_ends_without_teardown(store):
    """What an agent runs on every prompt: no Typer app (not even Typer), no pandas, pyarrow.compute
    with the docstring stand-in, and no teardown; exit code 0. ``cybmem hook --help`` is the app's."""
    payload = json.dumps({"hook_event_name": "UserPromptSubmit", "session_id": "s1", "cwd": "/home/dev/web",
                          "prompt_id": "p1", "prompt": "Fix the login form"})
    p = _py(HOOK, "hook", "claude-code", stdin=payload)
    assert p.returncode == 0 and "Fix the login form, step" in json.loads(p.stdout)["hookSpecificOutput"]["additionalContext"]
    assert p.stderr == "MODULES False False False\n", p.stderr
    p = _py(HOOK, "hook", "--help")
    assert p.returncode == 0 and p.stdout.startswith("Usage: cybmem hook [OPTIONS] [CLIENT]") and "MODULES" not in p.stderr
