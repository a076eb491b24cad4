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
            "store/secret_scanner.py": "secrets", "operations/report.py": "report", "explore/plots.py": "report",
            "explore/widgets.py": "report", "retrieval/ranker_training.py": "train"}


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


#: run the console script in a process where the notebook stack cannot be imported, as in a base install
_WITHOUT_NOTEBOOK_STACK = """
import sys
from importlib.abc import MetaPathFinder

class _Absent(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"nbformat", "nbclient", "nbconvert", "jinja2", "ipykernel", "matplotlib", "ipywidgets"}:
            raise ImportError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, _Absent())
sys.argv = ["cybmem", *sys.argv[1:]]
from cybmem.cli import console
console()
"""


@pytest.mark.parametrize("args, what", [
    (["report", "-p", "web", "--out", "{out}"], "cybmem report needs the nbformat package: pip install 'cybmem[report]'"),
    (["fleet", "report", "--dataset", "{data}", "--out", "{out}"],
     "cybmem's figures needs the matplotlib package: pip install 'cybmem[report]'"),
])
def test_a_base_install_names_the_extra_a_command_needs(fixture_copy, tmp_path, args, what):
    """The base install leaves the notebook stack out (issue 40: dispatch and hooks do not need it):
    the commands that need it end in one line naming the extra, not in an ImportError."""
    from cybmem.exchange.export import export_parquet
    from cybmem.store.memory_store import MemoryStore

    data = tmp_path / "dataset"
    export_parquet([MemoryStore(fixture_copy, "web")], data, machine="m1", note=False)
    argv = [a.format(out=tmp_path / "out", data=data) for a in args]
    env = {**os.environ, "CYBERINE_MEMORY_DIR": str(fixture_copy)}
    p = subprocess.run([sys.executable, "-c", _WITHOUT_NOTEBOOK_STACK, *argv], capture_output=True, text=True,
                       env=env, timeout=120)
    assert (p.returncode, p.stderr) == (1, f"Error: {what}\n")
    assert not (tmp_path / "out").exists()
