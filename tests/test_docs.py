"""docs/architecture.md names the package as it is: every module it lists exists, and every module
of the package is listed exactly once (so the doc fails as soon as code moves without it)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "cybmem"
DOC = REPO / "docs" / "architecture.md"
# A module line of the doc: "- `path/under/cybmem.py`: its job."
MODULE_LINE = re.compile(r"^- `([\w/]+\.py)`: \S", re.M)


def _named() -> list[str]:
    return MODULE_LINE.findall(DOC.read_text(encoding="utf-8"))


def _modules() -> set[str]:
    """Every .py file of the package, as a path under cybmem/ (the notebooks link holds none)."""
    return {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
            if "__pycache__" not in p.parts and not p.relative_to(PACKAGE).parts[0] == "notebooks"}


def test_the_doc_lists_modules():
    assert len(_named()) >= 20, "docs/architecture.md lists its modules as lines \"- `name.py`: job\""


def test_every_named_module_exists():
    missing = sorted(set(_named()) - _modules())
    assert not missing, f"docs/architecture.md names modules that do not exist under cybmem/: {missing}"


def test_every_module_is_named_once():
    named = _named()
    twice = sorted({m for m in named if named.count(m) > 1})
    unnamed = sorted(_modules() - set(named))
    assert not twice, f"docs/architecture.md names these modules more than once: {twice}"
    assert not unnamed, f"docs/architecture.md does not name these modules of cybmem/ (add a line each): {unnamed}"
