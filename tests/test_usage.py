"""USAGE.md stays true: every example in it is run, and its output compared with the document.

Each ``## `` section is one test. Its ``console`` blocks run in order, as a reader would type
them, in one shell state (``export`` and ``cd`` carry over from one command to the next) in a
fresh temporary directory holding a clean copy of ``data-fixtures/`` (no caches); its
``python`` blocks with ``>>>`` run as doctests in the directory the shell ended in. Paths under
``/tmp/`` in the commands are moved into the test's directory, and moved back in the output.
What changes from run to run (elapsed seconds, the moment a command ran, a temp file's age) is
normalised on both sides before comparing.

A block right after ``<!-- not run: why -->`` is skipped (installers, the 15-minute benchmarks,
the real corpus, a browser). Run with CYBMEM_UPDATE_USAGE=1 to write the real outputs back into
USAGE.md after an intended change (console blocks whole, doctest examples that fail), then read the diff.
"""

from __future__ import annotations

import doctest
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from conftest import LEFTOVERS

REPO = Path(__file__).resolve().parent.parent
USAGE = REPO / "USAGE.md"
BLOCK = re.compile(r"(<!-- not run: [^>]*-->\n)?```(console|python)\n(.*?)```\n", re.S)
HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")
UPDATE = os.environ.get("CYBMEM_UPDATE_USAGE") == "1"


class _Recorder(doctest.DocTestRunner):
    """A doctest runner that keeps what each failing example printed, so that CYBMEM_UPDATE_USAGE=1
    can write it into the block as it does for console blocks."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.got: list[tuple[doctest.Example, str]] = []

    def report_failure(self, out, test, example, got):
        self.got.append((example, got))
        super().report_failure(out, test, example, got)

    def rewrite(self, body: str, back) -> str:
        """``body`` with each failing example's expected output replaced by what it printed."""
        lines = body.split("\n")
        for ex, got in sorted(self.got, key=lambda t: -t[0].lineno):
            start = ex.lineno + ex.source.count("\n")
            new = [" " * ex.indent + line if line else "<BLANKLINE>" for line in back(got).rstrip("\n").split("\n")]
            lines[start:start + ex.want.count("\n")] = new if got else []
        return "\n".join(lines)


def _sections(text: str) -> list[tuple[str, int, int]]:
    """(title, start, end) of every ``## `` section."""
    starts = [m.start() for m in re.finditer(r"^## ", text, re.M)]
    return [(text[s + 3:text.index("\n", s)], s, e) for s, e in zip(starts, starts[1:] + [len(text)])]


def _steps(body: str) -> list[tuple[str, str]]:
    """(command, expected output) pairs of a console block; a heredoc's lines belong to its command."""
    steps: list[list] = []
    lines = body.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            cmd = [line[2:]]
            while cmd[-1].endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd.append(lines[i])
            tag = HEREDOC.search(cmd[0])
            if tag:
                while i + 1 < len(lines):
                    i += 1
                    cmd.append(lines[i])
                    if lines[i] == tag.group(1):
                        break
            steps.append(["\n".join(cmd), []])
        elif steps:
            steps[-1][1].append(line)
        i += 1
    return [(cmd, "\n".join(out).rstrip("\n")) for cmd, out in steps]


def _examples() -> list[tuple[str, list]]:
    text = USAGE.read_text()
    out = []
    for title, start, end in _sections(text):
        blocks = [m for m in BLOCK.finditer(text, start, end) if not m.group(1)]
        if any(m.group(2) == "console" or ">>>" in m.group(3) for m in blocks):
            out.append((title, blocks))
    return out


EXAMPLES = _examples()


#: The line a first read prints when indexing a project takes over a second (a loaded machine).
_SLOW_NOTICE = re.compile(r"^cybmem: indexing \d+ records of project \S+ \([^)\n]*\)\n?", re.M)


class _Normal:
    """What may differ between two honest runs of an example, replaced by placeholders."""

    def __init__(self, t0: float):
        self.lo_ms, self.t0 = int((t0 - 3600) * 1000), t0

    def __call__(self, text: str) -> str:
        hi_ms = int((time.time() + 3600) * 1000)
        text = re.sub(r"\b1\d{12}\b", lambda m: "<now-ms>" if self.lo_ms <= int(m.group()) <= hi_ms else m.group(), text)
        days = {datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d") for t in (self.t0 - 3600, time.time() + 3600)}
        text = re.sub(r"\b(\d{4}-\d\d-\d\d)((?: |T)\d\d:\d\d(?::\d\d)?)?\b",
                      lambda m: "<today>" if m.group(1) in days else m.group(), text)
        text = re.sub(r"\bin \d+(\.\d+)?s\b", "in <secs>", text)
        text = re.sub(r'"seconds": [0-9.]+', '"seconds": <secs>', text)
        text = re.sub(r"\(\d+s old\)", "(<age>s old)", text)
        return text

    def same(self, expected: str, actual: str) -> bool:
        """``expected`` (USAGE.md) shows what ``actual`` prints. A moment of the run itself (now)
        stands for any moment of the same shape: USAGE.md holds the moment of its last update
        there, however long ago that was."""
        a, e = self(actual), self(expected)
        if a == e:
            return True
        if _SLOW_NOTICE.search(a) and not _SLOW_NOTICE.search(e):  # printed only when indexing takes over a second
            return self.same(expected, _SLOW_NOTICE.sub("", actual))
        pattern = (re.escape(a).replace(re.escape("<now-ms>"), r"1\d{12}")
                   .replace(re.escape("<today>"), r"\d{4}-\d\d-\d\d(?:(?: |T)\d\d:\d\d(?::\d\d)?)?"))
        return re.fullmatch(pattern, e) is not None


def _shell(cmd: str, root: Path, env: dict) -> str:
    """Run one command in the section's shell state (exports and cwd carried in files)."""
    state, where = root / ".usage-env", root / ".usage-cwd"
    script = (f'cd "$(cat {where})" && {{ [ -f {state} ] && . {state}; }}\n'
              f"{cmd}\n"
              f'__rc=$?; pwd > {where}; export -p > {state}; exit $__rc\n')
    p = subprocess.run(["/bin/bash", "-c", script], cwd=root, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=600)
    return p.stdout.rstrip("\n")


def test_there_are_examples_to_check():
    titles = [t for t, _ in EXAMPLES]
    assert len(titles) >= 8 and sum(len(b) for _, b in EXAMPLES) >= 40, titles
    # This file is USAGE.md's one runner: the sections that had runners of their own (tests/test_api.py,
    # tests/exchange/test_fleet.py) are run here, with at least the examples those checked.
    api = dict(EXAMPLES)["Python API"]
    assert len([m for m in api if m.group(2) == "python"]) >= 3, "USAGE.md Python API examples"
    fleet = next(blocks for title, blocks in EXAMPLES if title.startswith("The fleet"))
    commands = [cmd for m in fleet if m.group(2) == "console" for cmd, _ in _steps(m.group(3))
                if "--scheduler tcp:" not in cmd]
    assert len(commands) >= 10 and any(m.group(2) == "python" and ">>>" in m.group(3) for m in fleet), \
        "USAGE.md Fleet examples: commands and Python"


@pytest.mark.parametrize("title, blocks", EXAMPLES, ids=[t.split(":")[0][:40] for t, _ in EXAMPLES])
def test_usage_examples_are_real(title, blocks, tmp_path, monkeypatch):
    root = tmp_path / "usage"
    root.mkdir()
    (root / "tmp").mkdir()
    shutil.copytree(REPO / "data-fixtures", root / "data-fixtures", ignore=LEFTOVERS)
    (root / ".usage-cwd").write_text(str(root))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CYBERINE_") and k not in ("COLUMNS", "LINES")}
    env.update(HOME=str(root / "home"), COLUMNS="120", IPYTHONDIR=str(root / "home" / ".ipython"),
               PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""))
    (root / "home").mkdir()
    normal = _Normal(time.time())
    moved = f"{root}/tmp/"

    def back(text: str) -> str:
        return text.replace(moved, "/tmp/").replace(f"{root}/", "").replace(str(root), ".")

    text = USAGE.read_text()
    new_text = text
    failures = []
    globs: dict = {}  # the python blocks of a section build on each other
    for m in blocks:
        body = m.group(3)
        if m.group(2) == "python":
            cwd = Path((root / ".usage-cwd").read_text().strip())
            monkeypatch.chdir(cwd)
            test = doctest.DocTestParser().get_doctest(body.replace("/tmp/", moved), globs, f"USAGE.md, {title}", str(USAGE), 0)
            runner = _Recorder(optionflags=doctest.NORMALIZE_WHITESPACE)
            runner.run(test, out=lambda s: failures.append(back(s)), clear_globs=False)
            globs.update(test.globs)  # a DocTest works on a copy of the globals it was given
            if UPDATE and runner.got:
                new_text = new_text.replace(m.group(0), m.group(0).replace(body, runner.rewrite(body, back)), 1)
            continue
        rebuilt = []
        for cmd, expected in _steps(body):
            actual = back(_shell(cmd.replace("/tmp/", moved), root, env))
            rebuilt.append(f"$ {cmd}\n{actual}\n" if actual else f"$ {cmd}\n")
            if not normal.same(expected, actual):
                failures.append(f"$ {cmd}\n--- USAGE.md says:\n{expected}\n--- it prints:\n{actual}\n")
        if UPDATE:
            new_text = new_text.replace(m.group(0), m.group(0).replace(body, "".join(rebuilt)), 1)
    if UPDATE and new_text != text:
        USAGE.write_text(new_text)
        return
    assert not failures, f"USAGE.md, section {title!r} (CYBMEM_UPDATE_USAGE=1 rewrites the outputs):\n" + "\n".join(failures)
