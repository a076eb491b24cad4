"""The docs beside USAGE.md stay true: docs/architecture.md names the package as it is (every module
it lists exists, every module of the package is listed exactly once, so the doc fails as soon as
code moves without it); docs/design.md, architecture.md and benchmarks/RESULTS.md link only to
files a clone has, and USAGE.md's links to its own sections lead to headings; a benchmark run
keeps the figures RESULTS.md holds by hand; the defaults docs/design.md gives reasons for are cybmem's."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

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


def test_a_benchmark_run_keeps_the_figures_kept_by_hand(tmp_path):
    """benchmarks/run_all.py rewrites RESULTS.md from what the benchmarks print; the figures the docs
    moved there (with their history) sit after a marker line, and a new run keeps them."""
    spec = importlib.util.spec_from_file_location("run_all", REPO / "benchmarks" / "run_all.py")
    run_all = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_all)
    assert run_all.KEPT in (REPO / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    out = tmp_path / "RESULTS.md"
    assert run_all.kept_by_hand(out) == ""
    out.write_text("# Benchmark results\n\n## Old run\n\nfigures\n")
    assert run_all.kept_by_hand(out) == ""
    out.write_text(f"# Benchmark results\n\n## Old run\n\nfigures\n{run_all.KEPT}\n## Kept\n\nhistory\n")
    assert run_all.kept_by_hand(out) == f"\n{run_all.KEPT}\n## Kept\n\nhistory\n"


def test_the_docs_link_only_to_files_of_the_repository():
    """design.md, architecture.md and RESULTS.md point to each other and to USAGE.md: every relative
    link leads to a file a clone has (relative to the linking file, as a browser reads it)."""
    for doc in (REPO / "docs" / "design.md", DOC, REPO / "benchmarks" / "RESULTS.md"):
        text = doc.read_text(encoding="utf-8")
        local = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text)
                 if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
        for target in local:
            path = (doc.parent / target).resolve()
            if not (path.is_relative_to(REPO) and path.exists()):
                pytest.fail(f"{doc.relative_to(REPO)} links to {target}, which a clone does not have")


def _anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lowercase, punctuation dropped, spaces made hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_usage_links_within_itself_lead_to_its_headings():
    """USAGE.md's table of what to read for each task links to its sections by anchor."""
    text = (REPO / "USAGE.md").read_text(encoding="utf-8")
    anchors = {_anchor(h) for h in re.findall(r"^#{1,6} (.*)$", text, re.M)}
    links = re.findall(r"\]\(#([^)\s]+)\)", text)
    assert len(links) >= 10, "USAGE.md opens with links to its sections"
    missing = sorted(set(links) - anchors)
    assert not missing, f"USAGE.md links to sections it does not have: {missing}"


def test_the_defaults_design_md_explains_are_cybmems():
    """docs/design.md gives the reasons for cybmem's defaults and names them: the numbers it names
    are the ones cybmem uses (as store-format.md's defaults table is checked against them)."""
    from cybmem import settings
    from cybmem.retrieval import evidence, weights

    text = " ".join((REPO / "docs" / "design.md").read_text(encoding="utf-8").split())
    s = settings.Settings.from_env({}, memory_dir="/nonexistent")
    w = weights.Weights()
    fifth = {0.2: "a fifth", 0.3: "three tenths"}[evidence.COMMON_SHARE]
    for phrase in (f"shows the {s.issues} that matter most", f"shows up to {s.topk} runs",
                   f"the token budget ({s.max_tokens:,})",
                   f"(`w_kw` {w.w_kw:g}, `w_rec` {w.w_rec:g}, `w_lin` {w.w_lin:g}, {w.half_life_days:g} days)",
                   f"word at least {fifth} of the store's runs hold is *common* there (of {evidence.COMMON_MIN_RUNS} runs",
                   f"beyond chance by {evidence.FULL_NATS:g} nats", f"up to {s.pointers} pointers",
                   f"a cosine of {w.floor_vec:g} makes a run a pointer",
                   f"`w_vec` is {weights.DEFAULT_W_VEC:g}"):
        assert phrase in text, f"docs/design.md should say {phrase!r} (cybmem's default)"


#: The layers in the doc's order; a module may import from its own layer and the ones before it.
LAYERS = ("foundations", "store", "clients", "retrieval", "dispatch", "explore", "exchange", "operations", "handle",
          "front")
FOUNDATIONS = {"errors.py", "_io.py", "_extras.py", "settings.py", "progress.py", "arrow_numpy.py"}
#: The imports against the flow the doc's last paragraph names (none since issue 30 moved the
#: "used" judgments out of dispatch/feedback.py).
AGAINST_THE_FLOW: set[tuple[str, str]] = set()


def _layer(module: str) -> str:
    parts = module.split("/")
    if len(parts) == 1:
        return "foundations" if module in FOUNDATIONS else "handle" if module == "memory.py" else "front"
    return "front" if parts[0] in ("cli", "mcp", "hooks") else parts[0]


def _imported(module: str, node) -> list[str]:
    """The modules of the package (paths under cybmem/) that an ``import`` / ``from`` names."""
    import ast

    if isinstance(node, ast.ImportFrom) and node.level:
        here = module.split("/")[:-1]
        base = (here[:len(here) - node.level + 1]) + (node.module.split(".") if node.module else [])
    else:
        name = node.module if isinstance(node, ast.ImportFrom) else None
        names = [name] if name else [a.name for a in node.names]
        base = next((n.split(".")[1:] for n in names if n and n.split(".")[0] == "cybmem"), None)
        if base is None:
            return []
    found = []
    for leaf in ([a.name for a in node.names] if isinstance(node, ast.ImportFrom) else [None]):
        parts = base + ([leaf] if leaf else [])
        for candidate in ("/".join(parts) + ".py", "/".join(parts + ["__init__.py"]), "/".join(base) + ".py",
                          "/".join(base + ["__init__.py"])):
            if (PACKAGE / candidate).is_file():
                found.append(candidate)
                break
    return found


def test_no_module_imports_a_later_layer():
    """The flow the doc draws (files -> store -> retrieval -> dispatch / CLI), held against every
    import of the package, the lazy ones inside functions included."""
    import ast

    against = set()
    for module in sorted(_modules()):
        for node in ast.walk(ast.parse((PACKAGE / module).read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _imported(module, node):
                    if LAYERS.index(_layer(target)) > LAYERS.index(_layer(module)):
                        against.add((module, target))
    assert against == AGAINST_THE_FLOW, "an import against the flow: move the code to the layer it belongs to"
    text = DOC.read_text(encoding="utf-8")
    assert all(f"`{a}` -> `{b}`" in text for a, b in AGAINST_THE_FLOW), "the doc names each exception"
