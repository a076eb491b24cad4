"""The fronts (the command line, the MCP server, the agent hooks) are argument translation,
one call on the library handle (cybmem.memory.Memory) and rendering: a front module imports the
handle and what every front shares, its own folder, and third-party packages of its framework,
never another module of the library. Every import counts, the lazy ones inside functions too."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "cybmem"

#: What every front may import of cybmem: the handle, its settings and errors, what both fronts say
#: around a call and how they show stored text (answers), the progress line, and the version.
SHARED = {"cybmem", "cybmem.memory", "cybmem.settings", "cybmem.errors", "cybmem.answers", "cybmem.progress"}

#: Each front folder: the cybmem modules it may import besides SHARED (its own folder always), and
#: the third-party packages of its framework.
FRONTS = {
    "cli": ({"cybmem.mcp.server",  # `cybmem mcp` starts the MCP front
             "cybmem.hooks.entry"},  # `cybmem hook` hands the payload to the hooks front
            {"typer", "click", "pyarrow"}),  # pyarrow: a start-up trick (cli/_startup.py)
    "mcp": (set(), {"mcp", "pydantic", "uvicorn", "anyio", "orjson", "starlette", "h11"}),
    # the hooks run as the console script's quickest command: its start-up tricks and signal handling,
    # and the one JSON decoder (a payload is JSON a JavaScript client wrote: lone surrogates as it reads them)
    "hooks": ({"cybmem.cli._startup", "cybmem.cli.signals", "cybmem._io"}, set()),
}


def _is_module(dotted: str) -> bool:
    path = PACKAGE.parent / dotted.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, module) of every import in a module of ``package`` (cybmem.cli...), relative ones
    resolved; ``from X import name`` counts as X.name when that is a module (``from .. import store``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = ".".join(parts[:len(parts) - node.level + 1] + [node.module or ""]).strip(".") if node.level \
                else node.module
            out += [(node.lineno, f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base) for a in node.names]
    return out


def _allowed(front: str, module: str) -> bool:
    own, third_party = FRONTS[front]
    top = module.split(".")[0]
    if top != "cybmem":
        return top in sys.stdlib_module_names or top == "__future__" or top in third_party
    return module in SHARED | own or module == f"cybmem.{front}" or module.startswith(f"cybmem.{front}.")


@pytest.mark.parametrize("front", sorted(FRONTS))
def test_a_front_imports_the_handle_and_its_own_rendering_only(front):
    bad = []
    modules = sorted((PACKAGE / front).rglob("*.py"))
    assert modules, front
    for path in modules:
        for line, module in _imports(path, f"cybmem.{front}"):
            if not _allowed(front, module):
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}")
    assert bad == [], "a front calls the handle (cybmem.memory.Memory); add the operation there"


def test_every_front_folder_is_checked():
    """A new front folder (the agent hooks) gets its own line in FRONTS."""
    folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    library = {"store", "clients", "retrieval", "dispatch", "explore", "exchange", "operations", "notebooks"}
    assert folders - library == set(FRONTS), "list the new front's allowed imports in FRONTS"


def test_the_check_sees_a_library_import(tmp_path, monkeypatch):
    """The check is not vacuous: a front module reaching into the store is caught, lazy or not."""
    fake = tmp_path / "cybmem" / "cli"
    fake.mkdir(parents=True)
    (fake / "x.py").write_text("def f():\n    from ..store.loading import load_snapshot\n"
                               "from ..memory import Memory\nimport cybmem.retrieval.search\n")
    found = {m for _, m in _imports(fake / "x.py", "cybmem.cli") if not _allowed("cli", m)}
    assert found == {"cybmem.store.loading", "cybmem.retrieval.search"}
