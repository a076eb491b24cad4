"""tests/ mirrors the package: a test of a module of cybmem/<layer>/ lives in tests/<layer>/, and
the tests of the package's top-level modules and of what crosses every layer (the docs, the public
API, attacks, reliability, USAGE.md) at the top. CI runs ``python -m pytest -q`` from the repository
root, which collects every folder; the folders have no ``__init__.py``, so no two test files may
share a basename."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "cybmem"
#: Folders of tests/ that hold no tests of a package folder: data, helpers and the session plugin.
HELPERS = {"audit", "data", "node", "session", "__pycache__"}


def test_every_test_folder_is_a_package_folder():
    layers = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    folders = {p.name for p in TESTS.iterdir() if p.is_dir()} - HELPERS
    assert folders <= layers, f"tests/ folders that are not folders of cybmem/: {sorted(folders - layers)}"


def test_no_two_test_files_share_a_basename():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == [], "rename one: pytest's default import mode needs unique basenames"
