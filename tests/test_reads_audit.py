"""The check that no test reads outside the repository (tests/session/cybmem_test_session.py and
tests/audit/sitecustomize.py).

The rule is tested on paths, then the whole check end to end: a pytest session in a subprocess,
with the session plugin of this repository, runs a few tests that open files outside the
repository in different ways, and each is reported at teardown with the path and the process.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _load_audit():
    """tests/audit/sitecustomize.py under another name: as ``sitecustomize`` it would install itself."""
    spec = importlib.util.spec_from_file_location("cybmem_reads_audit_rules", REPO / "tests" / "audit" / "sitecustomize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


audit = _load_audit()


def test_the_rule_allows_what_a_clone_and_its_machine_have(tmp_path):
    rule = audit.Rule(allow=[str(REPO), str(tmp_path)], deny=[str(REPO / "benchmarks" / ".data")], trusted=["/usr"])
    assert not rule.outside(str(REPO / "data-fixtures" / "memory" / "projects.json"))
    assert not rule.outside(str(REPO))
    assert not rule.outside(str(tmp_path / "x" / "y.json"))
    assert not rule.outside("/usr/lib/x.so")
    assert rule.outside(str(REPO / "benchmarks" / ".data" / "pytest-memory" / "projects.json"))
    assert rule.outside(str(REPO.parent / "shared" / "corpora" / "pytest-memory-1k.tar.gz"))
    assert rule.outside(str(REPO) + "-other/file")  # a sibling whose name starts like the repository
    assert rule.outside("/usrx/lib")


def test_a_symlink_is_judged_by_where_it_points(tmp_path):
    outside = tmp_path / "outside"
    inside = tmp_path / "inside"
    outside.mkdir()
    inside.mkdir()
    (inside / "to-outside").symlink_to(outside)
    (outside / "to-inside").symlink_to(inside)
    rule = audit.Rule(allow=[str(inside)], deny=[])
    assert rule.outside(str(inside / "to-outside" / "file"))
    assert not rule.outside(str(outside / "to-inside" / "file"))


def test_the_path_an_event_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert audit.path_of("open", ("data/x.json", "r", 0)) == str(tmp_path / "data" / "x.json")
    assert audit.path_of("open", (b"/etc/../etc/hosts", "r", 0)) == "/etc/hosts"
    assert audit.path_of("open", (Path("/a/b"), None, 0)) == "/a/b"
    assert audit.path_of("open", (3, "r", 0)) is None  # a file descriptor: its path was seen when it was opened
    assert audit.path_of("os.scandir", (None,)) == str(tmp_path)
    assert audit.path_of("sqlite3.connect", (":memory:",)) is None
    assert audit.path_of("sqlite3.connect", ("h.sqlite",)) == str(tmp_path / "h.sqlite")


PROBE = '''
import os, sqlite3, subprocess, sys, tarfile
OUTSIDE = {outside!r}
DENIED = {denied!r}
os.listdir(OUTSIDE)  # while collecting: charged to the first test that runs


def test_a_first():
    pass


def test_b_in_this_process():
    os.open(OUTSIDE, os.O_RDONLY)


def test_c_in_a_child_process():
    subprocess.run([sys.executable, "-c", "import os; os.scandir({outside!r})"], check=True)


def test_d_inside_but_not_in_a_clone():
    try:
        tarfile.open(DENIED)
    except OSError:
        pass  # the attempt is what counts: a clone has no such file


def test_f_the_corpora_through_their_fixture(corpora):
    os.listdir(corpora.dir)


def test_e_in_tmp_and_the_interpreter(tmp_path):
    (tmp_path / "x").write_text("x")
    assert (tmp_path / "x").read_text() == "x"
    sqlite3.connect(str(tmp_path / "db.sqlite")).close()
    os.listdir(os.path.dirname(os.__file__))
'''


def test_every_test_that_opens_outside_the_repository_fails_at_teardown(tmp_path):
    # The inner session gets its own temporary directory, so a directory beside it is outside
    # for it wherever this checkout lives (a clone under /tmp included).
    inner_tmp = tmp_path / "inner-tmp"
    (inner_tmp / "probe").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    outside = str(tmp_path / "outside")  # where ../shared would be
    denied = str(REPO / "benchmarks" / ".data" / "pytest-memory-1k.tar.gz")
    probe = inner_tmp / "probe" / "test_probe.py"
    probe.write_text(PROBE.format(outside=outside, denied=denied))
    # The inner session installs its own check and makes its own HOME; it must not report into
    # this session's log.
    env = {k: v for k, v in os.environ.items() if not k.startswith((audit.ENV, "CYBMEM_TEST_SESSION_HOME"))}
    env["TMPDIR"] = str(inner_tmp)
    env["CYBMEM_CORPORA"] = outside  # the optional corpora: readable only through their fixture
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests" / "session"), str(REPO),
                                         *[p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                           if p and Path(p) != REPO / "tests" / "audit"]])
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "cybmem_test_session", "-p", "no:cacheprovider", str(probe)],
                       cwd=probe.parent, env=env, capture_output=True, text=True, timeout=300)
    out = p.stdout
    assert p.returncode == 1, out + p.stderr
    assert re.search(r"\b6 passed, 4 errors\b", out), out
    errors = dict(re.findall(r"_+ ERROR at teardown of (test_\w+) _+\n(.*?)(?=\n_{3,}|\n=+ )", out, re.S))
    assert sorted(errors) == ["test_a_first", "test_b_in_this_process", "test_c_in_a_child_process",
                              "test_d_inside_but_not_in_a_clone"], out
    assert "while collecting" in errors["test_a_first"] and f"{outside}  (os.listdir, this process)" in errors["test_a_first"]
    assert f"{outside}  (open, this process)" in errors["test_b_in_this_process"]
    assert "takes the `corpora` fixture" in errors["test_b_in_this_process"]  # the corpora, without their fixture
    child = errors["test_c_in_a_child_process"]
    assert f"{outside}  (os.scandir, pid " in child and "-c import os; os.scandir" in child, child
    assert f"{denied}  (open, this process)" in errors["test_d_inside_but_not_in_a_clone"]
    assert "test_e_in_tmp_and_the_interpreter" not in errors and "test_f_the_corpora_through_their_fixture" not in errors
