"""What pyproject.toml ships and declares: every third-party package cybmem imports is a declared
dependency (of the core, or of the extra whose part imports it), and the package ships py.typed."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "cybmem"
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
#: Parts of cybmem that only an extra installs what they import: module -> the extra.
OPTIONAL = {"exchange/fleet.py": "fleet", "exchange/fleet_search.py": "fleet", "exchange/prov.py": "export",
            "store/secret_shapes.py": "secrets"}


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _imports() -> dict[str, set[str]]:
    """Top-level third-party module -> the modules of cybmem (paths under cybmem/) that import it."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("notebooks/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top and top != "cybmem" and top not in sys.stdlib_module_names:
                    found.setdefault(top, set()).add(rel)
    return found


def test_every_imported_package_is_declared():
    core = {_name(r) for r in PROJECT["project"]["dependencies"]}
    extras = {k: {_name(r) for r in v} for k, v in PROJECT["project"]["optional-dependencies"].items()}
    dists = importlib.metadata.packages_distributions()
    missing = []
    for module, where in sorted(_imports().items()):
        names = {d.lower().replace("_", "-") for d in dists.get(module, [module])}
        if names & core:
            continue
        optional = {OPTIONAL.get(w) for w in where}
        if None not in optional and all(names & extras[e] for e in optional):
            continue
        missing.append(f"{module} ({', '.join(sorted(names))}) imported by {', '.join(sorted(where))}")
    assert missing == [], "declare these in pyproject.toml (the core, or the extra of the part that imports them)"


def test_the_package_ships_its_types():
    assert (PACKAGE / "py.typed").is_file()
    assert "py.typed" in PROJECT["tool"]["setuptools"]["package-data"]["cybmem"]


def test_pyproject_names_modules_that_exist():
    """A comment of pyproject.toml that names a file of the package names one that is there."""
    named = re.findall(r"\bcybmem/[\w/]+\.py\b", (REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert named and all((REPO / n).is_file() for n in named), named
    for package in PROJECT["tool"]["setuptools"]["packages"]:
        assert (REPO / package.replace(".", "/") / "__init__.py").is_file(), package


def test_benchmarks_start_the_cybmem_of_their_own_python():
    """A benchmark run as ``venv/bin/python benchmarks/bench_mcp.py`` with the venv not activated
    (its bin/ not on PATH) starts that venv's ``cybmem``: before, bench_mcp, bench_store and
    bench_compaction looked only on PATH and ended in a FileNotFoundError traceback."""
    beside = Path(sys.executable).parent / "cybmem"
    if not beside.is_file():
        pytest.skip("cybmem is not installed beside this interpreter")
    code = "import sys; sys.path.insert(0, 'benchmarks'); import _corpus; print(_corpus.cybmem_exe())"
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(beside)
