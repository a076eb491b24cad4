"""Notebook-backed reports: execute the bundled notebooks headless and write self-contained HTML.

Each notebook starts with one cell tagged ``parameters`` (``MEMORY_DIR``, ``PROJECT``); the
report replaces that cell's source with the chosen store's values, executes the notebook on a
fresh kernel (nbclient), drops live-widget views (their static ``text/html`` rendering stays)
and exports HTML whose figures are inline ``data:image/png;base64`` images, with no script
or stylesheet fetched from the network. An ``index.html`` links the pages.

Where the notebooks come from (:func:`notebooks_dir`): ``<repo>/notebooks/`` when running from
a checkout, else ``cybmem/notebooks/`` shipped as package data (in a checkout that folder is a
link to ``notebooks/``, so there is one copy; a wheel carries the files).

Which store a notebook reads (:func:`open_notebook_store`) is decided here too, the same way
under ``cybmem report``, papermill, ``jupyter nbconvert --execute`` and an open Jupyter: its
``MEMORY_DIR`` / ``PROJECT`` parameters when set, else ``CYBERINE_MEMORY_DIR`` (or
``CYBERINE_HOME``) and ``CYBERINE_MEMORY_PROJECT``, else the checkout's fixtures; the
notebook's first output says which.
"""

from __future__ import annotations

import ast
import contextlib
import html
import inspect
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Sequence

from .._extras import require
from .._io import atomic_file
from ..errors import CybmemError, NotFoundError, ValidationError
from ..store.projects import project_dirs
from ..settings import Settings
from ..store.loading import load_snapshot
from ..store.memory_store import MemoryStore
from ..progress import Progress

__all__ = ["require_notebook_stack", "NOTEBOOKS", "PROJECT_ENV", "FIXTURES", "NotebookStore", "NotebookFleet", "ReportResult", "notebooks_dir",
           "notebook_memory_dir", "open_notebook_store", "open_notebook_fleet", "notebook_parameters", "parse_parameters",
           "inject_parameters", "execute_notebook", "notebook_html", "build_report"]

#: the notebooks a report runs, in order (the fleet's only when it is given a dataset: see _NEEDS)
NOTEBOOKS = ("01-history.ipynb", "02-lineage.ipynb", "03-issue-ages.ipynb", "04-weight-tuning.ipynb",
             "05-fleet.ipynb", "06-feedback.ipynb")
#: a report page that needs a parameter the store cannot give, and why
_NEEDS = {"05-fleet.ipynb": ("DATASET", "it reads the Parquet dataset every machine exports (`cybmem export "
                                        "parquet --out DIR --machine NAME`), not one store; pass -P dataset=DIR")}
#: the project a notebook reads when its PROJECT parameter is not set
PROJECT_ENV = "CYBERINE_MEMORY_PROJECT"
_PACKAGE = Path(__file__).resolve().parent.parent  # cybmem/ (this module is cybmem/operations/report.py)
#: a checkout's fixture store, what the notebooks read when nothing names a store (absent from a wheel)
FIXTURES = _PACKAGE.parent / "data-fixtures" / "memory"
_FIXTURES_PROJECT = "web"
_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

# The lab template minus everything it would fetch from a CDN (require.js, MathJax, mermaid,
# the widget manager): the report must open offline.
_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block data_png scoped -%}
<div class="jp-RenderedImage jp-OutputArea-output {{ extra_class }}">
<img src="data:image/png;base64,{{ output.data['image/png'] | escape_html }}" alt="{{ output.data.get('text/plain', 'figure') | escape_html }}">
</div>
{%- endblock data_png -%}
"""


def notebooks_dir() -> Path:
    """The directory holding the report notebooks: the checkout's notebooks/, else the package's.

    Raises:
        NotFoundError: neither has them.
    """
    here = _PACKAGE
    for d in (here.parent / "notebooks", here / "notebooks"):
        if all((d / name).is_file() for name in NOTEBOOKS):
            return d
    raise NotFoundError(f"the report notebooks ({', '.join(NOTEBOOKS)}) are neither in {here.parent / 'notebooks'} "
                        f"nor in {here / 'notebooks'}; reinstall cybmem or run from a checkout")


_SET_BY_REPORT = ("MEMORY_DIR", "PROJECT")  # the store's; --memory-dir and --project choose them


def notebook_memory_dir(memory_dir: str | os.PathLike | None, settings: Settings) -> tuple[Path, str]:
    """The memory root a notebook reads, and why that one.

    ``memory_dir`` (the MEMORY_DIR parameter) when given; else ``CYBERINE_MEMORY_DIR`` or
    ``CYBERINE_HOME`` as ``settings`` read them; else the checkout's :data:`FIXTURES`; else (an
    installed package, no fixtures) the default ``~/.cyberine/memory``. A relative MEMORY_DIR is
    relative to the current directory (the notebook's own, in Jupyter and nbconvert); a relative
    variable to the directory Jupyter was started from, where the person who typed it stood (the
    settings of :meth:`cybmem.memory.Memory.for_notebook` are read so).
    """
    if memory_dir is not None and str(memory_dir).strip():
        return Path(memory_dir).expanduser().absolute(), "from the MEMORY_DIR parameter"
    if settings.memory_from != "default":
        return settings.memory_dir, f"from {settings.memory_from}"
    if FIXTURES.is_dir():
        return FIXTURES, "the checkout's fixtures, as neither MEMORY_DIR nor CYBERINE_MEMORY_DIR is set"
    return settings.memory_dir, "the default, as neither MEMORY_DIR nor CYBERINE_MEMORY_DIR is set"


@dataclass(frozen=True)
class NotebookStore:
    """What a notebook reads: the project's store, the settings it was opened with, and why these.

    ``str()`` is the line a notebook prints first.
    """

    store: MemoryStore
    settings: Settings
    memory_from: str
    project_from: str

    def __str__(self) -> str:
        return (f"Reading project {self.store.slug} in {self.store.root}\n"
                f"  memory dir: {self.memory_from}\n  project: {self.project_from}")


def open_notebook_store(memory_dir: str | os.PathLike | None, project: str | None, settings: Settings) -> NotebookStore:
    """The store a notebook reads, from its MEMORY_DIR and PROJECT parameters or the ``settings``
    the environment gave (:meth:`cybmem.memory.Memory.for_notebook` reads them).

    The memory root is :func:`notebook_memory_dir`'s. The project: ``project`` (the PROJECT
    parameter) when given, else :data:`PROJECT_ENV`, else ``web`` in the fixtures, else the
    root's only project. ``cybmem report`` and papermill set both parameters in a cell after the
    notebook's parameter cell; ``jupyter nbconvert --execute`` and Jupyter leave them None, so
    the environment decides.

    Raises:
        NotFoundError: no such project, or several and none chosen (the message names them and
            the variable that chose, or would choose, one).
    """
    root, memory_from = notebook_memory_dir(memory_dir, settings)
    settings = replace(settings, memory_dir=root, memory_from="argument")
    if project is not None and str(project).strip():
        slug, project_from = str(project).strip(), "from the PROJECT parameter"
    elif settings.project:
        slug, project_from = settings.project, f"from {PROJECT_ENV}"
    elif root.resolve() == FIXTURES.resolve():
        slug, project_from = _FIXTURES_PROJECT, f"the fixtures' main project, as neither PROJECT nor {PROJECT_ENV} is set"
    else:
        slugs = project_dirs(root)
        if len(slugs) != 1:
            raise NotFoundError(f"{root} (memory dir {memory_from}) holds "
                                + (f"projects {', '.join(slugs)}" if slugs else "no project")
                                + f"; name one in the PROJECT parameter or {PROJECT_ENV}")
        slug, project_from = slugs[0], f"the only project there, as neither PROJECT nor {PROJECT_ENV} is set"
    try:
        store = MemoryStore.open(settings, project=slug)
    except CybmemError as exc:
        raise type(exc)(f"{exc} (project {project_from}; memory dir {memory_from})") from None
    return NotebookStore(store, settings, memory_from, project_from)


#: the machines the fleet notebook exports the fixtures as (the example of USAGE.md, "The fleet")
_FIXTURE_FLEET = {"laptop": ("web", "web-7663e1"), "ci-1": ("api",)}


@dataclass(frozen=True)
class NotebookFleet:
    """The fleet dataset a notebook reads, and where it comes from; ``str()`` says both."""

    dataset: Path
    described: str
    built: bool  # True: a temporary dataset (in a directory of its own) the notebook removes when done

    def __str__(self) -> str:
        return f"Reading the fleet dataset {self.dataset}\n  {self.described}"


def open_notebook_fleet(dataset: str | os.PathLike | None, memory_dir: str | os.PathLike | None,
                        project: str | None, settings: Settings) -> NotebookFleet:
    """The fleet notebook's dataset: ``dataset`` when given, else one exported from a store
    (``settings``: as :meth:`cybmem.memory.Memory.fleet_for_notebook` reads them).

    The store is :func:`notebook_memory_dir`'s. The checkout's fixtures are exported as the two
    machines of USAGE.md (a laptop with web and web-7663e1, ci-1 with api); any other store as
    one machine (:func:`cybmem.exchange.export.default_machine`) holding the project ``project`` or
    :data:`PROJECT_ENV` names, else every project. The export goes to a new temporary directory.

    Raises:
        NotFoundError: a named project does not exist; the store holds no project.
    """
    import tempfile

    from ..exchange.export import default_machine, export_parquet

    if dataset is not None and str(dataset).strip():
        return NotebookFleet(Path(dataset).expanduser().absolute(), "from the DATASET parameter", False)
    root, memory_from = notebook_memory_dir(memory_dir, settings)
    if project is not None and str(project).strip() or settings.project:
        chosen = open_notebook_store(memory_dir, project, settings).store.slug
        machines = {default_machine(): (chosen,)}
    elif root.resolve() == FIXTURES.resolve():
        machines = _FIXTURE_FLEET
    else:
        slugs = project_dirs(root)
        if not slugs:
            raise NotFoundError(f"{root} (memory dir {memory_from}) holds no project to build a fleet dataset from; "
                                "pass DATASET (a `cybmem export parquet` directory) or another memory dir")
        machines = {default_machine(): tuple(slugs)}
    out = Path(tempfile.mkdtemp(prefix="cybmem-fleet-")) / "fleet"
    for machine, slugs in machines.items():
        export_parquet([MemoryStore(root, slug) for slug in slugs], out, machine=machine, note=False)  # temporary
    built = "; ".join(f"{machine}: {', '.join(slugs)}" for machine, slugs in machines.items())
    return NotebookFleet(out, f"exported from {root} as {built}\n  memory dir: {memory_from}", True)


#: what running the notebooks headless imports (ipykernel: the kernel nbclient starts), all of
#: them the ``report`` extra's (which ``notebook`` includes)
_NOTEBOOK_STACK = ("nbformat", "nbclient", "nbconvert", "jinja2", "ipykernel", "matplotlib", "ipywidgets")


def require_notebook_stack(what: str = "cybmem report") -> None:
    """Raise a CybmemError that names ``pip install 'cybmem[report]'`` when a package of the
    notebook stack is missing (the base install leaves it out: dispatch and hooks do not need it)."""
    for module in _NOTEBOOK_STACK:
        require(module, extra="report", what=what)


def notebook_parameters(path: str | Path) -> dict[str, Any]:
    """The parameters a notebook declares: name -> default, from its cell tagged ``parameters``.

    A default that is not a literal (an expression) reads as None. A notebook without such a
    cell declares none.
    """
    require_notebook_stack()
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            out: dict[str, Any] = {}
            for node in ast.parse(cell.source).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    try:
                        out[node.targets[0].id] = ast.literal_eval(node.value)
                    except ValueError:
                        out[node.targets[0].id] = None
            return out
    return {}


def _value(text: str) -> Any:
    """A -P value: a Python literal (5, 0.5, None, True, "x", [..]) or else the text itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):  # TypeError: {[]: 1}, an unhashable key
        return text


def parse_parameters(pairs: Sequence[str], notebooks: Sequence[str | Path]) -> dict[str, Any]:
    """``NAME=VALUE`` pairs (``cybmem report -P``) checked against the notebooks' parameter cells.

    Names match case-insensitively (``-P metric=ndcg`` sets ``METRIC``). Values are Python
    literals or else text; where the default is a number or a bool the value must be one too.
    A text value that names an existing file or directory (relative to the current directory)
    is made absolute, since the notebooks run in their own directory.

    Raises:
        ValidationError: a malformed pair, an unknown name (the message lists the known ones),
            a value of the wrong type, or MEMORY_DIR / PROJECT (chosen with --memory-dir / --project).
    """
    declared: dict[str, Any] = {}
    for nb in notebooks:
        for name, default in notebook_parameters(nb).items():
            declared.setdefault(name, default)
    by_lower = {name.lower(): name for name in declared}
    known = ", ".join(n for n in declared if n not in _SET_BY_REPORT) or "none"
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValidationError(f"{pair!r}: write NAME=VALUE, e.g. -P metric=ndcg")
        name = by_lower.get(key.lower())
        if name is None:
            raise ValidationError(f"{key!r}: no notebook of this report has a parameter of that name; they take: {known}")
        if name in _SET_BY_REPORT:
            raise ValidationError(f"{key!r}: the report sets {name} itself; use --memory-dir / --project")
        value = _value(raw.strip())
        default = declared[name]
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ValidationError(f"{pair!r}: {name} is True or False")
        if isinstance(default, (int, float)) and not isinstance(default, bool) and (
                isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValidationError(f"{pair!r}: {name} is a number (default {default!r})")
        if isinstance(default, int) and not isinstance(default, bool) and isinstance(value, float) and not value.is_integer():
            raise ValidationError(f"{pair!r}: {name} is a whole number (default {default!r})")
        if isinstance(default, int) and isinstance(value, float):
            value = int(value)
        if isinstance(value, str) and value and os.path.exists(value):
            value = os.path.abspath(value)
        out[name] = value
    return out


def inject_parameters(nb: Any, params: dict[str, Any]) -> Any:
    """Put ``params`` (one assignment each) in a cell right after the cell tagged ``parameters``.

    The notebook's own defaults stay (as papermill does), so parameters the report does not
    set keep their values. Without a tagged cell the injected cell goes first. Returns ``nb``
    (changed in place).
    """
    import nbformat

    src = "# parameters injected by `cybmem report`\n" + "".join(f"{k} = {v!r}\n" for k, v in params.items())
    cell = nbformat.v4.new_code_cell(src.rstrip("\n"), metadata={"tags": ["injected-parameters"]})
    if nb.get("nbformat_minor", 5) < 5:
        cell.pop("id", None)  # cell ids exist from nbformat 4.5 on
    at = 0
    for i, c in enumerate(nb.cells):
        if c.cell_type == "code" and "parameters" in c.get("metadata", {}).get("tags", []):
            at = i + 1
            break
    nb.cells.insert(at, cell)
    return nb


def execute_notebook(path: Path, params: dict[str, Any], *, timeout: int = 600,
                     on_cell: Any = None) -> Any:
    """Execute a notebook on a fresh kernel with injected parameters.

    Args:
        path: the notebook file (its directory is the kernel's working directory).
        params: name -> value, assigned after the ``parameters`` cell.
        timeout: seconds per cell.
        on_cell: called with keyword arguments (cell, cell_index, execute_reply) after each cell.

    Returns:
        The executed notebook (nbformat node).

    Raises:
        CybmemError: a cell failed (the message names the notebook and the error).
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    inject_parameters(nb, params)
    run = _Run()

    def executed(**kw: Any) -> None:
        run.busy = False
        if on_cell is not None:
            on_cell(**kw)
        run.check()

    client = NotebookClient(nb, timeout=timeout, resources={"metadata": {"path": str(path.parent)}},
                            on_cell_start=run.start_cell, on_cell_executed=executed)
    try:
        # The kernel's own stderr is only start-up chatter (e.g. ipykernel's TCP notice); errors in
        # cells come back through the protocol and are raised below.
        _execute(client, run, stderr=subprocess.DEVNULL)
    except CellExecutionError as exc:
        lines = [_ANSI.sub("", line) for line in str(exc).splitlines() if line.strip()]
        raise CybmemError(f"notebook {path.name} failed: {lines[-1] if lines else exc}; open it in Jupyter with "
                          + ", ".join(f"{k}={v!r}" for k, v in params.items()) + " to see the whole traceback") from None
    return nb


class _Stopped(Exception):
    """Raised by a cell hook once Ctrl-C asked the notebook run to stop (see :func:`_execute`)."""


class _Run:
    """What the main thread and the notebook's event loop share about one run (:func:`_execute`)."""

    def __init__(self) -> None:
        self.stop = threading.Event()  # Ctrl-C: stop before the next cell
        self.busy = False  # a cell is executing (read and written on the loop's thread only)

    def check(self) -> None:
        if self.stop.is_set():
            raise _Stopped()

    def start_cell(self, **_: Any) -> None:
        self.check()
        self.busy = True


def _execute(client: Any, run: _Run, **kwargs: Any) -> Any:
    """``client.async_execute(**kwargs)`` on an event loop in a thread of its own, so that Ctrl-C
    reaches this process as a KeyboardInterrupt (on a main-thread loop nbclient takes SIGINT for
    itself and ends in a traceback, or leaves its exit handler to hang on the kernel's sockets).

    The main thread waits. On Ctrl-C it sets ``run.stop`` (the cell hooks then raise
    :class:`_Stopped` before the next cell) and interrupts the kernel when a cell is executing
    (that cell fails): either way the run ends through nbclient's own error path, which shuts the
    kernel down. A kernel still starting is left to start: its first cell stops it. Then
    KeyboardInterrupt is raised on; a second Ctrl-C stops the waiting.
    """
    import asyncio

    loop = asyncio.new_event_loop()
    task = loop.create_task(client.async_execute(**kwargs))
    outcome: dict[str, Any] = {}
    done = threading.Event()  # not Thread.join: a join that Ctrl-C interrupts can leave the thread marked stopped

    def work() -> None:
        asyncio.set_event_loop(loop)
        try:
            outcome["nb"] = loop.run_until_complete(task)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = exc
        finally:
            loop.close()
            done.set()

    async def interrupt() -> None:
        km = client.km
        with contextlib.suppress(Exception):  # the kernel just finished or died: the cell hooks stop the run
            if run.busy and km is not None:
                result = km.interrupt_kernel()
                if inspect.isawaitable(result):
                    await result

    threading.Thread(target=work, name="cybmem-notebook", daemon=True).start()
    try:
        while not done.wait(0.1):
            pass
    except KeyboardInterrupt:
        run.stop.set()
        with contextlib.suppress(RuntimeError):  # the loop already closed: nothing left to stop
            asyncio.run_coroutine_threadsafe(interrupt(), loop)
        done.wait(60)
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["nb"]


def _strip_widget_views(nb: Any) -> Any:
    """Drop live-widget outputs (a static page cannot run them); their text/html stays."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data")
            if data and _WIDGET_VIEW in data:
                data.pop(_WIDGET_VIEW)
                if "text/html" not in data and "text/plain" in data and len(data) == 1:
                    data["text/plain"] = "(interactive widget: open the notebook in Jupyter to use it)"
    return nb


def notebook_html(nb: Any, *, title: str, with_code: bool = False) -> str:
    """An executed notebook as one self-contained HTML page (figures as data: URIs, no CDN)."""
    import jinja2
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab", extra_loaders=[jinja2.DictLoader({"cybmem_report.html.j2": _TEMPLATE})],
                            template_file="cybmem_report.html.j2", exclude_input=not with_code,
                            exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(_strip_widget_views(nb), resources={"metadata": {"name": title}})
    return body


@dataclass
class ReportResult:
    """What a report wrote."""

    out_dir: Path
    index: Path
    pages: list[Path] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # notebook -> execution seconds
    left_out: dict[str, str] = field(default_factory=dict)  # notebook -> why it did not run

    def to_dict(self) -> dict[str, Any]:
        return {"outDir": str(self.out_dir), "index": str(self.index), "pages": [str(p) for p in self.pages],
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()}, "leftOut": dict(self.left_out)}


def _index_html(store: MemoryStore, pages: list[tuple[str, Path, float]], generated: str,
                left_out: dict[str, str]) -> str:
    items = "".join(f'<li><a href="{html.escape(p.name)}">{html.escape(title)}</a> <small>({secs:.1f}s)</small></li>'
                    for title, p, secs in pages)
    items += "".join(f"<li>{html.escape(_title(Path(name)))}: left out, {html.escape(why)}</li>"
                     for name, why in left_out.items())
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>cybmem report: {html.escape(store.slug)}</title>"
            "<style>body{font-family:system-ui,sans-serif;max-width:50em;margin:2em auto}</style></head><body>"
            f"<h1>cybmem report: project {html.escape(store.slug)}</h1>"
            f"<p>Memory dir <code>{html.escape(str(store.root))}</code>, generated {html.escape(generated)} UTC.</p>"
            f"<ul>{items}</ul></body></html>\n")


def _add_footer(nb: Any, path: Path, store: MemoryStore, secs: float, extra: dict[str, Any]) -> None:
    """A last line on the page: which notebook, how long it took, when, with which parameters."""
    import nbformat

    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")
    given = "; parameters " + ", ".join(f"`{k} = {v!r}`" for k, v in extra.items()) if extra else ""
    nb.cells.append(nbformat.v4.new_markdown_cell(
        f"---\n*{path.name} ran in {secs:.1f} s on {when} UTC, project `{store.slug}`{given}. "
        "Generated by `cybmem report`.*"))
    if nb.get("nbformat_minor", 5) < 5:
        nb.cells[-1].pop("id", None)


def _write_page(path: Path, text: str) -> None:
    """A page whole or not at all (Ctrl-C, a full disk): a temp file renamed into place."""
    with atomic_file(path, private=False) as fh:
        fh.write(text.encode("utf-8"))


def _title(path: Path) -> str:
    stem = path.stem.split("-", 1)[-1] if path.stem[:2].isdigit() else path.stem
    return stem.replace("-", " ").capitalize()


def build_report(store: MemoryStore, out_dir: str | Path, *, notebooks: Sequence[str | Path] | None = None,
                 parameters: dict[str, Any] | None = None, with_code: bool = False, timeout: int = 600,
                 progress: bool | None = None, stream: IO[str] | None = None) -> ReportResult:
    """Execute the report notebooks against ``store`` and write one HTML page each plus index.html.

    Args:
        store: the project to report on (its memory dir and slug become the notebooks' parameters).
        out_dir: where to write (created).
        notebooks: notebook paths or names (default: :data:`NOTEBOOKS` from :func:`notebooks_dir`;
            the fleet's runs when ``parameters`` give it a DATASET, else it is listed as left out
            with the reason, in the index and on ``stream``).
        parameters: more parameters (name -> value, e.g. from :func:`parse_parameters`); each
            notebook gets those its parameter cell declares.
        with_code: keep the code cells in the pages.
        timeout: seconds per cell.
        progress: a cell-level progress bar on stderr (None: when stderr is a TTY); a line per
            notebook is printed on ``stream`` either way.
        stream: where progress goes (default stderr).

    Returns:
        :class:`ReportResult`.
    """
    require_notebook_stack()
    import nbformat

    if not store.dir.is_dir():
        raise NotFoundError(f"project {store.slug} has no memory under {store.root}")
    load_snapshot(store)  # a store that cannot be read fails here, with the reason, not inside a kernel
    stream = stream if stream is not None else sys.stderr
    base = notebooks_dir() if notebooks is None or any(not Path(n).is_file() for n in notebooks) else None
    paths = [Path(n) if Path(n).is_file() else base / n for n in (notebooks or NOTEBOOKS)]
    for p in paths:
        if not p.is_file():
            raise NotFoundError(f"no notebook {p}; choose from {', '.join(NOTEBOOKS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    params = {"MEMORY_DIR": str(store.root.resolve()), "PROJECT": store.slug}
    extra = dict(parameters or {})
    if extra:
        declared: set[str] = set()
        for p in paths:
            declared |= set(notebook_parameters(p))
        unknown = sorted(set(extra) - declared)
        if unknown:
            raise ValidationError(f"no notebook of this report has a parameter {', '.join(unknown)}; "
                                  f"they take: {', '.join(sorted(declared - set(_SET_BY_REPORT)))}")
    result = ReportResult(out_dir=out, index=out / "index.html")
    if notebooks is None:
        for name, (needed, why) in _NEEDS.items():
            if extra.get(needed) is None:
                result.left_out[name] = why
                stream.write(f"[left out] {name}: {why}\n")
        paths = [p for p in paths if p.name not in result.left_out]
    pages: list[tuple[str, Path, float]] = []
    for i, path in enumerate(paths, 1):
        title = _title(path)
        cells = 1 + sum(1 for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")  # + injected
        stream.write(f"[{i}/{len(paths)}] {path.name}: executing {cells} cells...\n")
        stream.flush()
        bar = Progress(cells, f"  {path.stem}", enabled=progress, stream=stream)
        t0 = time.perf_counter()
        own = notebook_parameters(path)
        nb_params = {**params, **{k: v for k, v in extra.items() if k in own}}
        try:
            nb = execute_notebook(path, nb_params, timeout=timeout, on_cell=lambda **_: bar.update())
        finally:
            bar.close()
        secs = time.perf_counter() - t0
        _add_footer(nb, path, store, secs, {k: v for k, v in extra.items() if k in own})
        page = out / f"{path.stem}.html"
        _write_page(page, notebook_html(nb, title=f"{title}: {store.slug}", with_code=with_code))
        result.pages.append(page)
        result.seconds[path.name] = secs
        pages.append((title, page, secs))
        stream.write(f"[{i}/{len(paths)}] {path.name}: done in {secs:.1f}s -> {page}\n")
        stream.flush()
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")
    _write_page(result.index, _index_html(store, pages, generated, result.left_out))
    return result
