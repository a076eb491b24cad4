"""The public API is small, explicit and pinned: a change to it is a decision, not an accident."""

from __future__ import annotations

import importlib
import subprocess
import sys

import cybmem

PUBLIC = {
    # the handle
    "Memory",
    # errors
    "CybmemError", "ValidationError", "NotFoundError", "AmbiguousError", "ConflictError", "StoreError",
    # the store and its records
    "Settings", "MemoryStore", "MemoryRecord", "Lineage", "Outcome", "Worker", "IssueEvent", "IssueState",
    "list_projects",
    # writing
    "write_run",
    # reading and lineage
    "chain", "show_record", "load_snapshot", "Snapshot", "records_frame", "issue_events_frame", "issue_fold", "lineage_edges",
    # retrieval and dispatch
    "Weights", "weights_for", "search", "inject_task", "memory_block", "strip",
    # tuning and checks
    "Judgment", "load_judgments", "tune", "doctor",
    "__version__",
}


def test_public_api_is_pinned():
    assert set(cybmem.__all__) == PUBLIC


def test_every_public_name_resolves_and_is_documented():
    for name in cybmem.__all__:
        obj = getattr(cybmem, name)
        if name != "__version__":
            assert (obj.__doc__ or "").strip(), f"{name} has no docstring"


def test_every_module_declares_its_public_names():
    import pkgutil

    for info in pkgutil.walk_packages(cybmem.__path__, "cybmem."):
        if (info.ispkg or info.name.startswith("cybmem.notebooks.")
                or info.name in ("cybmem.cli.app", "cybmem.explore.widgets", "cybmem.explore.plots")
                or info.name.rpartition(".")[2].startswith("_")):
            continue
        module = importlib.import_module(info.name)
        assert hasattr(module, "__all__"), info.name
        for name in module.__all__:
            assert hasattr(module, name), f"{info.name}.{name}"


def test_import_cybmem_is_cheap():
    """`import cybmem` loads nothing heavy; names are imported on first use (PEP 562)."""
    code = "import sys, cybmem; print(sorted(m for m in ('pandas', 'pyarrow', 'numpy', 'typer', 'httpx') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_mark_issue_is_a_library_call(memory_root):
    from cybmem import IssueEvent, MemoryStore

    store = MemoryStore(memory_root, "web")
    store.append_issue_events([IssueEvent("flaky-x", 1, "opened", "r1", "Flaky X")])
    (ev,) = store.mark_issue("flaky-x", "resolved", by="r2", detail="fixed the wait")
    assert (ev.event, ev.byRunId, ev.detail) == ("resolved", "r2", "fixed the wait")
    assert store.mark_issue("flaky-x", "resolved") == []
    assert store.issue_states()["flaky-x"].state == "resolved"


def test_the_type_checking_imports_name_the_lazy_ones():
    """Editors see the public API through the TYPE_CHECKING imports of cybmem/__init__.py: the same
    names from the same modules as the lazy table that serves them at run time."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(cybmem.__file__).read_text())
    guarded = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    seen = {a.name: node.module for node in guarded.body if isinstance(node, ast.ImportFrom) for a in node.names}
    assert seen == cybmem._LAZY


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_imports_another_modules_private_name():
    """``from .x import _y`` and ``x._y`` (x a module of the package) are refused: a name another
    module needs is public in its owner. Private modules (``from . import _io``) are fine."""
    import ast
    from pathlib import Path

    pkg = Path(cybmem.__file__).parent
    found = []
    for path in sorted(pkg.rglob("*.py")):
        here = path.parent
        tree = ast.parse(path.read_text(), str(path))
        modules = set()  # local names bound to a module of the package
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and node.level >= 1):
                continue
            base = here.joinpath(*[".."] * (node.level - 1), *(node.module or "").split(".")).resolve()
            for alias in node.names:
                if (base / f"{alias.name}.py").exists() or (base / alias.name / "__init__.py").exists():
                    modules.add(alias.asname or alias.name)  # a module (private ones too: _io)
                elif _private(alias.name):
                    found.append(f"{path.relative_to(pkg)}:{node.lineno} from {'.' * node.level}{node.module or ''} import {alias.name}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                    and _private(node.attr)):
                found.append(f"{path.relative_to(pkg)}:{node.lineno} {node.value.id}.{node.attr}")
    assert found == [], "\n".join(found)
