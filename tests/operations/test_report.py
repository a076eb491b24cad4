"""Notebook-backed reports: parameters, headless execution, self-contained HTML with embedded figures."""

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from cybmem.errors import CybmemError, NotFoundError
from cybmem.memory import Memory
from cybmem.operations.report import (FIXTURES, NOTEBOOKS, PROJECT_ENV, build_report, inject_parameters, notebook_parameters,
                           notebooks_dir, parse_parameters)
from cybmem.store.records import IssueEvent
from cybmem.store.memory_store import MemoryStore

IMG = re.compile(r'<img[^>]+src="data:image/png;base64,[A-Za-z0-9+/=]{200,}')


@pytest.fixture(autouse=True)
def _home(monkeypatch):
    """Kernels need a HOME that exists (conftest points HOME at a fresh tmp path)."""
    home = os.environ["HOME"]
    os.makedirs(home, exist_ok=True)
    monkeypatch.setenv("IPYTHONDIR", os.path.join(home, ".ipython"))


def test_every_notebook_starts_with_one_parameter_cell():
    d = notebooks_dir()
    assert d.name == "notebooks"
    for name in NOTEBOOKS:
        nb = nbformat.read(d / name, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1 and tagged[0] is code[0], name
        assert "MEMORY_DIR = " in tagged[0].source and "PROJECT = " in tagged[0].source, name
        assert nb.metadata["kernelspec"]["name"] == "python3"


def test_inject_parameters_replaces_the_tagged_cell_or_adds_one():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# t"),
                nbformat.v4.new_code_cell('MEMORY_DIR = "x"', metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("print(MEMORY_DIR)")]
    inject_parameters(nb, {"MEMORY_DIR": "/m", "PROJECT": "web"})
    assert nb.cells[1].source == 'MEMORY_DIR = "x"', "the defaults stay"
    assert nb.cells[2].source.endswith("MEMORY_DIR = '/m'\nPROJECT = 'web'") and len(nb.cells) == 4
    assert nb.cells[2].metadata["tags"] == ["injected-parameters"]
    nbformat.validate(nb)
    bare = nbformat.v4.new_notebook()
    bare.cells = [nbformat.v4.new_code_cell("1")]
    inject_parameters(bare, {"PROJECT": "api"})
    assert "PROJECT = 'api'" in bare.cells[0].source and len(bare.cells) == 2


def test_report_page_is_self_contained(fixture_copy, tmp_path):
    err = io.StringIO()
    out = tmp_path / "report"
    res = build_report(MemoryStore(fixture_copy, "api"), out, notebooks=["04-weight-tuning.ipynb"], stream=err,
                       progress=False)
    assert [p.name for p in res.pages] == ["04-weight-tuning.html"]
    log = err.getvalue()
    assert "[1/1] 04-weight-tuning.ipynb: executing" in log and "[1/1] 04-weight-tuning.ipynb: done in" in log
    text = res.pages[0].read_text()
    assert text.lstrip().lower().startswith("<!doctype html>")
    assert len(IMG.findall(text)) == 2, "the two heatmaps, embedded"
    assert 'alt="&lt;Figure: MRR@10 over w_kw x w_rec' in text, "figures carry their title as alt text"
    assert not re.search(r'<script[^>]+src="https?://', text), "no script is fetched from the network"
    assert "parameters injected by" not in text and "open_notebook_store" not in text, "code cells are left out by default"
    assert "Tuning view" in text and "<table" in text, "the widget's static rendering replaces the live view"
    assert f"Reading project api in {fixture_copy}" in text and "memory dir: from the MEMORY_DIR parameter" in text, \
        "the first output says which store the page reads"
    assert "judgments derived from project api (" in text, "the page says which judgments it used"
    assert "application/vnd.jupyter.widget-view+json" not in text
    index = res.index.read_text()
    assert 'href="04-weight-tuning.html"' in index and "project api" in index
    assert not (fixture_copy / "api" / "weights.json").exists(), "a report never saves weights"


def test_a_failing_notebook_is_named(fixture_copy, tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("MEMORY_DIR = PROJECT = None", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("raise RuntimeError('boom in ' + PROJECT)")]
    path = tmp_path / "broken.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(CybmemError, match=r"notebook broken.ipynb failed: RuntimeError: boom in web"):
        build_report(MemoryStore(fixture_copy, "web"), tmp_path / "out", notebooks=[path], stream=io.StringIO())
    with pytest.raises(NotFoundError, match="no notebook"):
        build_report(MemoryStore(fixture_copy, "web"), tmp_path / "out", notebooks=["nope.ipynb"], stream=io.StringIO())


def test_cybmem_report_cli_writes_every_page(fixture_copy, tmp_path):
    exe = shutil.which("cybmem")
    cmd = [exe] if exe else [sys.executable, "-c", "from cybmem.cli.app import main; main()"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CYBERINE_")}
    out = tmp_path / "site"
    shutil.copy(FIXTURES.parent / "inputs" / "judgments.jsonl", fixture_copy / "qrels.jsonl")
    t = 1_793_000_000_000  # ids whose numbers sort differently as text, opened in neither order
    MemoryStore(fixture_copy, "web").append_issue_events([IssueEvent(i, t + k * 60_000, "opened", None, f"Ticket {i}")
                                                         for k, i in enumerate(["ticket-10001", "ticket-998", "ticket-10"])])
    p = subprocess.run(cmd + ["report", "--out", str(out), "--memory-dir", str(fixture_copy), "--project", "web",
                              "--json", "--with-code"], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    ran = [n for n in NOTEBOOKS if n != "05-fleet.ipynb"]
    assert [os.path.basename(x) for x in data["pages"]] == [n.replace(".ipynb", ".html") for n in ran]
    assert p.stderr.count(": done in ") == len(ran)
    assert "[left out] 05-fleet.ipynb: it reads the Parquet dataset every machine exports" in p.stderr
    assert "pass -P dataset=DIR" in data["leftOut"]["05-fleet.ipynb"]
    assert "Fleet: left out, it reads the Parquet dataset" in (out / "index.html").read_text(), "the index says why"
    for page in data["pages"]:
        text = Path(page).read_text(encoding="utf-8")
        assert len(IMG.findall(text)) >= 1, page
        assert "# parameters injected by `cybmem report`" in text and "'web'" in text, "--with-code keeps the cells"
    assert "47 records" in (out / "01-history.html").read_text(), "ran against the chosen store"
    issues = (out / "03-issue-ages.html").read_text()
    assert issues.index("ticket-10<") < issues.index("ticket-998<") < issues.index("ticket-10001<"), \
        "the issue table sorts ticket-10, ticket-998, ticket-10001; not as text (ticket-10, ticket-10001, ticket-998)"
    tuning = (out / "04-weight-tuning.html").read_text()
    assert re.search(r"\d+ judgments derived from project web \(", tuning) and "judgments from " not in tuning, \
        "the tuning page never takes a qrels.jsonl lying in the memory root (issue 27): the store's own judgments"
    p = subprocess.run(cmd + ["report", "--out", str(out), "--memory-dir", str(fixture_copy), "--project", "nope"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stderr.startswith("Error: no project 'nope'")


def test_notebook_parameters_are_read_from_the_tagged_cell():
    params = notebook_parameters(notebooks_dir() / "04-weight-tuning.ipynb")
    assert params == {"MEMORY_DIR": None, "PROJECT": None, "JUDGMENTS": None, "METRIC": "mrr",
                      "K": 10, "QUERY": "fix a flaky end-to-end test"}
    assert set(notebook_parameters(notebooks_dir() / "01-history.ipynb")) == {"MEMORY_DIR", "PROJECT"}


def test_parse_parameters_checks_names_and_types(tmp_path, monkeypatch):
    nbs = [notebooks_dir() / n for n in NOTEBOOKS]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "judgments.jsonl").write_text("")
    got = parse_parameters(["metric=ndcg", "K=5", "judgments=judgments.jsonl", "query=cart drawer"], nbs)
    assert got == {"METRIC": "ndcg", "K": 5, "JUDGMENTS": str(tmp_path / "judgments.jsonl"), "QUERY": "cart drawer"}, \
        "any case; literals; a file that exists is made absolute (the notebooks run elsewhere)"
    assert parse_parameters(["k=5.0", "judgments=None"], nbs) == {"K": 5, "JUDGMENTS": None}
    assert parse_parameters(["query={[]: 1}", "metric=" + "[" * 200], nbs) == {"QUERY": "{[]: 1}", "METRIC": "[" * 200}, \
        "what looks like a literal but is none is text (a list key was a TypeError traceback)"
    for bad, message in [
        ("metrics=ndcg", "'metrics': no notebook of this report has a parameter of that name; they take: JUDGMENTS, "
                         "METRIC, K, QUERY, DATASET, SCHEDULER, WORKERS, PROCESSES, NOW"),
        ("k=five", "'k=five': K is a number (default 10)"),
        ("k=2.5", "'k=2.5': K is a whole number"),
        ("k", "'k': write NAME=VALUE"),
        ("project=api", "'project': the report sets PROJECT itself; use --memory-dir / --project"),
    ]:
        with pytest.raises(CybmemError, match=re.escape(message)):
            parse_parameters([bad], nbs)


def test_report_passes_parameters_and_says_how_long_each_page_took(fixture_copy, tmp_path):
    err = io.StringIO()
    res = build_report(MemoryStore(fixture_copy, "web"), tmp_path / "r", notebooks=["04-weight-tuning.ipynb"],
                       parameters={"METRIC": "ndcg", "K": 5}, stream=err, progress=False)
    text = res.pages[0].read_text()
    assert 'alt="&lt;Figure: nDCG@5 over w_kw x w_rec' in text, "the notebook ran with METRIC and K from -P"
    assert re.search(r"04-weight-tuning.ipynb ran in \d+\.\d s on \d{4}-\d\d-\d\d \d\d:\d\d UTC, project <code>web</code>; "
                     r"parameters <code>METRIC = 'ndcg'</code>, <code>K = 5</code>", text), "a line says how long it took"
    assert re.search(r"\[1/1\] 04-weight-tuning.ipynb: done in \d+\.\ds", err.getvalue())
    with pytest.raises(CybmemError, match="no notebook of this report has a parameter METRIC"):
        build_report(MemoryStore(fixture_copy, "web"), tmp_path / "r", notebooks=["01-history.ipynb"],
                     parameters={"METRIC": "ndcg"}, stream=io.StringIO())


def test_report_cli_refuses_unknown_parameters(fixture_copy, tmp_path):
    from typer.testing import CliRunner

    from cybmem.cli.app import app

    res = CliRunner().invoke(app, ["report", "--out", str(tmp_path / "r"), "--memory-dir", str(fixture_copy), "-p", "web",
                                   "-P", "colour=red"])
    assert res.exit_code == 2 and "Invalid value for -P: 'colour': no notebook of this report has a parameter" in res.output
    assert not (tmp_path / "r").exists(), "nothing runs before the parameters are checked"


def test_report_tables_keep_long_titles(tmp_path):
    """pandas cuts table cells at 50 characters unless told otherwise; every notebook tells it."""
    for name in NOTEBOOKS:
        nb = nbformat.read(notebooks_dir() / name, as_version=4)
        assert any('pd.set_option("display.max_colwidth", None)' in c.source for c in nb.cells if c.cell_type == "code"), name


def test_the_packaged_notebooks_are_the_checkouts():
    """One copy: cybmem/notebooks (package data, which a wheel carries as files) links to notebooks/."""
    here = Path(__file__).resolve().parents[2]
    assert (here / "cybmem" / "notebooks").is_symlink() and os.readlink(here / "cybmem" / "notebooks") == "../notebooks"
    for name in NOTEBOOKS:
        assert (here / "cybmem" / "notebooks" / name).read_bytes() == (here / "notebooks" / name).read_bytes(), name


# --- which store a notebook reads -------------------------------------------------------------------


def test_a_notebook_reads_its_parameters_else_the_environment_else_the_fixtures(fixture_copy, tmp_path):
    src = Memory.for_notebook(env={})
    assert (src.store.root, src.store.slug) == (FIXTURES, "web")
    assert str(src).splitlines() == [
        f"Reading project web in {FIXTURES}",
        "  memory dir: the checkout's fixtures, as neither MEMORY_DIR nor CYBERINE_MEMORY_DIR is set",
        f"  project: the fixtures' main project, as neither PROJECT nor {PROJECT_ENV} is set"]
    env = {"CYBERINE_MEMORY_DIR": str(fixture_copy), PROJECT_ENV: "api"}
    src = Memory.for_notebook(env=env)
    assert (src.store.root, src.store.slug, src.memory_from, src.project_from) == (
        fixture_copy, "api", "from CYBERINE_MEMORY_DIR", f"from {PROJECT_ENV}")
    assert src.settings.memory_dir == fixture_copy
    relative = {"CYBERINE_MEMORY_DIR": fixture_copy.name, PROJECT_ENV: "api", "PWD": str(fixture_copy.parent)}
    assert Memory.for_notebook(env=relative).store.root == fixture_copy, \
        "a relative variable is relative to where Jupyter started ($PWD), not to the notebook's directory"
    src = Memory.for_notebook(str(fixture_copy), "web-7663e1", env=env)
    assert (src.store.slug, src.memory_from, src.project_from) == (
        "web-7663e1", "from the MEMORY_DIR parameter", "from the PROJECT parameter"), "parameters win"
    home = tmp_path / "cyberine"
    shutil.copytree(fixture_copy, home / "memory")
    src = Memory.for_notebook(env={"CYBERINE_HOME": str(home), PROJECT_ENV: "api"})
    assert (src.store.root, src.memory_from) == (home / "memory", "from CYBERINE_HOME")
    with pytest.raises(NotFoundError, match=r"holds projects api, web, web-7663e1; name one in the PROJECT parameter "
                                            rf"or {PROJECT_ENV}"):
        Memory.for_notebook(env={"CYBERINE_MEMORY_DIR": str(fixture_copy)})
    with pytest.raises(NotFoundError, match=rf"no project 'nope' .*known projects: api, web, web-7663e1 \(project from "
                                            rf"{PROJECT_ENV}; memory dir from CYBERINE_MEMORY_DIR\)"):
        Memory.for_notebook(env={"CYBERINE_MEMORY_DIR": str(fixture_copy), PROJECT_ENV: "nope"})
    one = tmp_path / "one"
    shutil.copytree(fixture_copy / "api", one / "api")
    src = Memory.for_notebook(one, env={})
    assert src.store.slug == "api" and src.project_from.startswith("the only project there")


def _jupyter(*args: str, env: dict, cwd: Path | None = None) -> subprocess.CompletedProcess:
    exe = shutil.which("jupyter")
    cmd = [exe] if exe else [sys.executable, "-m", "jupyter"]
    return subprocess.run(cmd + list(args), env=env, cwd=cwd, capture_output=True, text=True, timeout=600)


def _outputs(path: Path) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    return ["".join(o.get("text", "")) or o.get("data", {}).get("text/plain", "")
            for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


def test_nbconvert_reads_the_store_the_variables_name(fixture_copy, tmp_path):
    """`CYBERINE_MEMORY_DIR=... jupyter nbconvert --execute` reads that store, and says so first."""
    env = {**os.environ, "CYBERINE_MEMORY_DIR": str(fixture_copy), PROJECT_ENV: "api"}
    p = _jupyter("nbconvert", "--to", "notebook", "--execute", str(notebooks_dir() / "01-history.ipynb"),
                 "--output-dir", str(tmp_path), env=env)
    assert p.returncode == 0, p.stderr
    outputs = _outputs(tmp_path / "01-history.ipynb")
    assert outputs[0].splitlines() == [f"Reading project api in {fixture_copy}", "  memory dir: from CYBERINE_MEMORY_DIR",
                                       f"  project: from {PROJECT_ENV}"]
    assert outputs[1].startswith("15 records"), "the api project's records, not the fixtures' web"


def test_every_notebook_says_first_which_store_it_reads(tmp_path):
    """The fleet's too; run as a user of the checkout would, with nothing set: the fixtures."""
    for name in NOTEBOOKS:
        nb = nbformat.read(notebooks_dir() / name, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert "Memory.for_notebook(" in code[1].source or "Memory.fleet_for_notebook(" in code[1].source, name
        assert "print(source)" in code[1].source, name
        first = [o for c in code for o in c.get("outputs", [])][0]
        assert first["text"].startswith("Reading "), f"{name}: the committed outputs start with the store read"


def test_the_fleet_notebook_builds_its_dataset_from_the_store_the_variables_name(fixture_copy):
    from cybmem.exchange.export import default_machine

    src = Memory.fleet_for_notebook(env={"CYBERINE_MEMORY_DIR": str(fixture_copy), PROJECT_ENV: "api"})
    try:
        assert src.built and str(src).splitlines()[1:] == [f"  exported from {fixture_copy} as {default_machine()}: api",
                                                           "  memory dir: from CYBERINE_MEMORY_DIR"]
        assert [p.name for p in (src.dataset / "records").iterdir()] == [f"machine={default_machine()}"]
    finally:
        shutil.rmtree(src.dataset.parent)
    fixtures = Memory.fleet_for_notebook(env={})
    try:
        assert "as laptop: web, web-7663e1; ci-1: api" in str(fixtures), "the fixtures as the two machines of USAGE"
    finally:
        shutil.rmtree(fixtures.dataset.parent)
    given = Memory.fleet_for_notebook(fixture_copy, env={})
    assert (given.dataset, given.built, given.described) == (fixture_copy, False, "from the DATASET parameter")


def test_the_report_runs_the_fleet_page_on_a_dataset(fixture_copy, tmp_path):
    from cybmem.exchange.export import export_parquet

    dataset = tmp_path / "fleet"
    export_parquet(MemoryStore(fixture_copy, "api"), dataset, machine="ci-1")
    res = build_report(MemoryStore(fixture_copy, "web"), tmp_path / "r", parameters={"DATASET": str(dataset),
                       "SCHEDULER": "inline"}, notebooks=["05-fleet.ipynb"], stream=io.StringIO(), progress=False)
    text = res.pages[0].read_text()
    assert f"Reading the fleet dataset {dataset}" in text and "1 machines, 1 projects" in text
    assert not res.left_out


def test_a_qrels_file_lying_in_the_memory_root_is_never_taken(fixture_copy):
    """What the tuning page, the widget and `cybmem tune` use without JUDGMENTS: the judgments the store
    implies; a qrels.jsonl in the root (or the project's folder) is no part of the store (issue 27)."""
    from cybmem.retrieval.judgments import judgment_set
    from cybmem.store.snapshot import load_snapshot

    before = judgment_set(load_snapshot(MemoryStore(fixture_copy, "api")))
    assert before.source.startswith("derived from project api (") and before.judgments
    shutil.copy(FIXTURES.parent / "inputs" / "judgments.jsonl", fixture_copy / "qrels.jsonl")
    shutil.copy(FIXTURES.parent / "inputs" / "judgments.jsonl", fixture_copy / "api" / "qrels.jsonl")
    after = judgment_set(load_snapshot(MemoryStore(fixture_copy, "api")))
    assert after.source == before.source and after.judgments == before.judgments
    named = judgment_set(load_snapshot(MemoryStore(fixture_copy, "api")), fixture_copy / "qrels.jsonl")
    assert named.source == f"from {fixture_copy / 'qrels.jsonl'}"
    assert [j.kind for j in named.judgments] == [None] * len(named.judgments)
