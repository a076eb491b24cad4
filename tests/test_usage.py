"""USAGE.md stays true: every example that only reads the bundled fixture store is re-run.

Examples whose commands all name ``--memory-dir data-fixtures/memory`` and only read
(list, show, issues, chain, projects, search, inject, strip) are executed in a real shell
from the repository root and their output compared with the document. Run with
CYBMEM_UPDATE_USAGE=1 to rewrite those outputs after an intended change.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
USAGE = REPO / "USAGE.md"
READ_VERBS = {"list", "show", "issues", "chain", "projects", "search", "inject", "strip"}
BLOCK = re.compile(r"```console\n(.*?)```\n", re.S)


def _examples():
    text = USAGE.read_text()
    for m in BLOCK.finditer(text):
        body = m.group(1)
        lines = body.split("\n")
        if not lines[0].startswith("$ ") or sum(line.startswith("$ ") for line in lines) != 1:
            continue
        cmd = lines[0][2:]
        if "--memory-dir data-fixtures/memory" not in cmd:
            continue
        verbs = re.findall(r"cybmem (\w+)", cmd)
        if not verbs or not set(verbs) <= READ_VERBS:
            continue
        yield m.start(1), m.end(1), cmd, "\n".join(lines[1:])


EXAMPLES = list(_examples())


def _run(cmd: str, tmp_path: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CYBERINE_")}
    env["HOME"] = str(tmp_path)
    # A private copy of the fixtures, so the examples never write caches into the repo.
    shutil.copytree(REPO / "data-fixtures", tmp_path / "data-fixtures", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns(".cache", ".lock", ".index.lock", ".projects.lock"))
    p = subprocess.run(cmd, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    out = (p.stdout + p.stderr).replace(f"{tmp_path}/", "")  # paths as a reader of USAGE.md sees them
    return out if out.endswith("\n") else out + "\n"


def test_there_are_examples_to_check():
    assert len(EXAMPLES) >= 8


@pytest.mark.parametrize("start, end, cmd, expected", EXAMPLES, ids=[e[2][:60] for e in EXAMPLES])
def test_usage_example_output_is_real(start, end, cmd, expected, tmp_path):
    actual = _run(cmd, tmp_path)
    if os.environ.get("CYBMEM_UPDATE_USAGE") == "1" and actual != expected:
        text = USAGE.read_text()
        text = text.replace(f"$ {cmd}\n{expected}", f"$ {cmd}\n{actual}", 1)
        USAGE.write_text(text)
        return
    assert actual == expected, f"USAGE.md example `{cmd}` prints something else now; rerun with CYBMEM_UPDATE_USAGE=1"
