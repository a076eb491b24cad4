"""nbval runs the notebooks on a private copy of the fixture store, as `cybmem report` would.

The notebooks' parameter cell names ``../data-fixtures/memory``; reading it writes the Arrow
cache (``.cache/``) next to the records, and no test may leave that in the repository's
fixtures (tests/conftest.py checks at the end of the session). So before the cells run, the
parameter cell of each collected notebook is pointed at a copy in a temporary directory.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "data-fixtures" / "memory"
_DEFAULT = '"../data-fixtures/memory"'
_copies: list[str] = []


def pytest_collection_modifyitems(session, config, items):
    cells = [item for item in items if "parameters" in getattr(getattr(item, "cell", None), "metadata", {}).get("tags", [])]
    if not cells:
        return
    tmp = tempfile.mkdtemp(prefix="cybmem-nbval-")
    _copies.append(tmp)
    copy = Path(tmp) / "memory"
    shutil.copytree(FIXTURES, copy, ignore=shutil.ignore_patterns(".cache", ".lock", ".index.lock", ".projects.lock"))
    for item in cells:
        assert _DEFAULT in item.cell.source, f"{item.name}: the parameter cell names {_DEFAULT}"
        item.cell.source = item.cell.source.replace(_DEFAULT, repr(str(copy)))


def pytest_sessionfinish(session, exitstatus):
    for tmp in _copies:
        shutil.rmtree(tmp, ignore_errors=True)
