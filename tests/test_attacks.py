"""Reliability round two: every attack of the second round, as an attacker or a careless user
would try it, against the real CLI and real files."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cybmem.cli import app
from cybmem.projects import load_projects

from conftest import MIN, T0, make_run, write_json

runner = CliRunner()


def cli(*args: str, input: str | None = None):
    return runner.invoke(app, list(args), input=input)


# --- 5. re-routed projects ----------------------------------------------------------------------


def test_a_run_filed_elsewhere_with_project_never_takes_over_its_cwd(memory_root, tmp_path):
    """`write -p aaa` for a run whose cwd belongs to web: the next plain write still goes to web,
    and inject from that cwd still reads web's memory."""
    web = make_run("r-web-1", "Fix the login form")
    assert cli("write", str(write_json(tmp_path / "1.json", web))).exit_code == 0
    other = make_run("r-aaa-1", "Release notes for the mobile app", start=T0 + 60 * MIN)
    res = cli("write", str(write_json(tmp_path / "2.json", other)), "-p", "aaa")
    assert res.exit_code == 0, res.output
    res = cli("inject", "login form", "--cwd", "/home/dev/web", "--json")  # the read path backfills aaa
    assert res.exit_code == 0
    assert {r["runId"] for r in json.loads(res.stdout)["runs"]} == {"r-web-1"}
    projects = load_projects(memory_root)
    assert projects["aaa"] == {"cwd": "/home/dev/web"} and projects["web"] == {"cwd": "/home/dev/web"}
    later = make_run("r-web-2", "Fix the signup form", start=T0 + 120 * MIN)
    assert cli("write", str(write_json(tmp_path / "3.json", later))).exit_code == 0
    assert (memory_root / "web" / "records" / "r-web-2.json").exists()
    assert not (memory_root / "aaa" / "records" / "r-web-2.json").exists()
    res = cli("inject", "form", "--cwd", "/home/dev/web", "--json")
    assert {r["runId"] for r in json.loads(res.stdout)["runs"]} == {"r-web-1", "r-web-2"}
