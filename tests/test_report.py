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
from cybmem.report import NOTEBOOKS, build_report, inject_parameters, notebook_parameters, notebooks_dir, parse_parameters
from cybmem.store import MemoryStore

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
    assert str(fixture_copy) not in text, "code cells (with the injected path) are left out by default"
    assert "Tuning view" in text and "<table" in text, "the widget's static rendering replaces the live view"
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
    cmd = [exe] if exe else [sys.executable, "-c", "from cybmem.cli import main; main()"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CYBERINE_")}
    out = tmp_path / "site"
    p = subprocess.run(cmd + ["report", "--out", str(out), "--memory-dir", str(fixture_copy), "--project", "web",
                              "--json", "--with-code"], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert [os.path.basename(x) for x in data["pages"]] == [n.replace(".ipynb", ".html") for n in NOTEBOOKS]
    assert p.stderr.count(": done in ") == len(NOTEBOOKS)
    for page in data["pages"]:
        text = Path(page).read_text(encoding="utf-8")
        assert len(IMG.findall(text)) >= 1, page
        assert "# parameters injected by `cybmem report`" in text and "'web'" in text, "--with-code keeps the cells"
    assert "47 records" in (out / "01-history.html").read_text(), "ran against the chosen store"
    p = subprocess.run(cmd + ["report", "--out", str(out), "--memory-dir", str(fixture_copy), "--project", "nope"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stderr.startswith("Error: no project 'nope'")


def test_notebook_parameters_are_read_from_the_tagged_cell():
    params = notebook_parameters(notebooks_dir() / "04-weight-tuning.ipynb")
    assert params == {"MEMORY_DIR": "../data-fixtures/memory", "PROJECT": "web", "JUDGMENTS": None, "METRIC": "mrr",
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
        ("metrics=ndcg", "'metrics': no notebook of this report has a parameter of that name; they take: JUDGMENTS, METRIC, K, QUERY"),
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

    from cybmem.cli import app

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
    here = Path(__file__).resolve().parent.parent
    for name in NOTEBOOKS:
        assert (here / "cybmem" / "notebooks" / name).read_bytes() == (here / "notebooks" / name).read_bytes(), name
