"""Cross-language conformance: cybmem and the TypeScript orchestrator on one store.

``tests/node/conformance.mjs`` writes a store the way the orchestrator's TS MemoryStore writes one
(seeds 000/001) and reads a store back the way its reader does; its header states each reading
rule. Three stores, each read by both sides through their command lines:

- ``ts-written``: Node writes (a previousRunId chain, a parent with children, two chat sessions,
  TS corrections, a dangling supersededBy, a lone surrogate, an unknown ledger event), cybmem reads.
- ``cybmem-written``: ``cybmem write`` / ``supersede`` / ``mark`` write, Node reads.
- ``mixed``: Node writes, cybmem reads and writes a run into the same store, Node corrects that
  run the TS way, both read.

On each, list, show, the open-issue fold, the chain of every run and the set of search
candidates must agree. Every verb goes through the console script in a subprocess at least once
per store; the per-record loops of show and chain run the rest of their records in this process
(the same parser, command and reader, without an interpreter start for each). Text is compared after mapping lone UTF-16 surrogates to U+FFFD on both
sides (the contract: a record with a lone surrogate escape is read, never dropped, and where it
is displayed the surrogate may become U+FFFD).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

NODE_SCRIPT = Path(__file__).resolve().parent / "node" / "conformance.mjs"

MIN = 60_000
HOUR = 60 * MIN
T0_TS = 1_790_812_800_000  # 2026-10-01T00:00:00Z: the T0 of conformance.mjs
T0_PY = 1_792_540_800_000  # 2026-10-21T00:00:00Z: the cybmem-written store
BIG_K = "100000"  # every candidate gets a recency score, so search returns them all
QUERIES = ("login test cart", "修复 布局")

_SURROGATE = re.compile("[\ud800-\udfff]")


def _fffd(value):
    """``value`` with every lone surrogate in its strings (keys too) mapped to U+FFFD."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_fffd(v) for v in value]
    if isinstance(value, dict):
        return {_fffd(k): _fffd(v) for k, v in value.items()}
    return value


def _env() -> dict:
    # No CYBERINE_* from the outer environment: lineage variables would leak into `cybmem write`.
    return {k: v for k, v in os.environ.items() if not k.startswith("CYBERINE_")}


def _node_exe() -> str:
    exe = shutil.which("node")
    if exe is None:
        pytest.fail(
            "node is not on PATH. This test runs tests/node/conformance.mjs under Node (18+, no packages): "
            "install it (`apt-get install nodejs`; .ci/run installs it when it is missing).",
            pytrace=False,
        )
    return exe


def _cybmem_cmd() -> list[str]:
    exe = shutil.which("cybmem")
    return [exe] if exe else [sys.executable, "-m", "cybmem.cli"]


def node(*args) -> str:
    p = subprocess.run([_node_exe(), str(NODE_SCRIPT), *map(str, args)], capture_output=True, text=True,
                       encoding="utf-8", env=_env(), timeout=120)
    assert p.returncode == 0, f"node conformance.mjs {' '.join(map(str, args))} exited {p.returncode}:\n{p.stderr}"
    return p.stdout


def node_read(root: Path, project: str) -> dict:
    return _fffd(json.loads(node("read", root, "--project", project)))


@dataclass
class Cli:
    """One finished ``cybmem`` subprocess."""

    args: tuple
    returncode: int
    stdout: str
    stderr: str

    def json(self):
        return _fffd(json.loads(self.stdout))

    def why(self) -> str:
        return f"`cybmem {' '.join(self.args)}` exited {self.returncode}: {self.stderr.strip()}"


def cybmem(*args) -> Cli:
    args = tuple(map(str, args))
    p = subprocess.run([*_cybmem_cmd(), *args], capture_output=True, env=_env(), timeout=120)
    try:
        out = p.stdout.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        out = p.stdout.decode("utf-8", "replace")
    return Cli(args, p.returncode, out, p.stderr.decode("utf-8", "replace"))


def cybmem_here(*args) -> Cli:
    """``cybmem`` run in this process (Typer's CliRunner): the same parser, command and reader as
    the console script, without starting an interpreter."""
    from typer.testing import CliRunner

    from cybmem.cli.app import app

    args = tuple(map(str, args))
    res = CliRunner().invoke(app, list(args), env={k: None for k in os.environ if k.startswith("CYBERINE_")})
    return Cli(args, res.exit_code, res.stdout, res.stderr)


def cybmem_ok(*args) -> Cli:
    res = cybmem(*args)
    assert res.returncode == 0, res.why()
    return res


@dataclass
class Store:
    """A memory root, the project the test reads, and what the Node reader made of it."""

    root: Path
    project: str
    node: dict
    extra: dict = field(default_factory=dict)

    def cli(self, *args, here: bool = False) -> Cli:
        """``cybmem`` on this store: a subprocess of the console script, or with ``here`` in this process."""
        return (cybmem_here if here else cybmem)(*args, "--memory-dir", self.root, "--project", self.project)


# --- the three stores -------------------------------------------------------------------------


def _build_ts_written(tmp: Path) -> Store:
    root = tmp / "memory"
    node("write", root)
    return Store(root, "web", node_read(root, "web"))


def _trailer(accomplished=(), issues=(), next_=()) -> str:
    def bullets(items):
        return "\n".join(f"- {i}" for i in items) or "- none"

    return (f"Done; notes above.\n\nACCOMPLISHED:\n{bullets(accomplished)}\nISSUES:\n{bullets(issues)}\n"
            f"NEXT:\n{bullets(next_)}")


def _run_json(run_id, task, start_h, end_h, *, t0=T0_PY, cwd="/home/dev/api", status="done", provider="anthropic",
              accomplished=(), issues=(), next_=(), **extra) -> dict:
    worker = {"agentId": "impl-1", "state": status, "output": _trailer(accomplished, issues, next_)}
    if provider:
        worker["provider"] = provider
    return {"id": run_id, "cwd": cwd, "workflowName": "implement-task", "task": task, "status": status,
            "startedAt": t0 + int(start_h * HOUR), "endedAt": t0 + int(end_h * HOUR), "workers": [worker], **extra}


def _put(tmp: Path, run: dict) -> Path:
    path = tmp / "runs" / f"{run['id']}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(run, ensure_ascii=False), encoding="utf-8")
    return path


def _build_cybmem_written(tmp: Path) -> Store:
    root = tmp / "memory"

    def write(run, *flags):
        cybmem_ok("write", _put(tmp, run), "--memory-dir", root, *flags)

    write(_run_json("c01", "Set up the FastAPI skeleton with a health endpoint", 0, 1,
                    issues=["Flaky login test: fails one run in ten"], next_=["add auth"],
                    verdict={"winner": "impl-1", "summary": "impl-1 wins: tests pass"},
                    files=["app/main.py", "app/health.py"], commands=["pytest -q tests/test_health.py"]))
    write(_run_json("c02", "Add the product listing endpoint", 2, 3,
                    issues=["N+1 queries when listing products with tags"]))
    # c03 dispatched c04 and c05 (they end first, with equal endedAt); c03 came from a chat session.
    write(_run_json("c04", "Payments: the Stripe webhook handler", 4, 5, status="error",
                    issues=["Stripe signature verification fails: the raw body is consumed"],
                    lineage={"parentRunId": "c03"}))
    write(_run_json("c05", "Payments: the checkout session endpoint", 4, 5, provider=None), "--parent", "c03")
    write(_run_json("c03", "Plan the payments feature: split it into webhook and checkout", 3.5, 6,
                    next_=["wire the webhook"]), "--chat", "chat-pay")
    write(_run_json("c06", "Fix the Stripe webhook signature verification by reading the raw body", 7, 8,
                    accomplished=["resolved stripe-signature-verification-fails"]), "--chat", "chat-pay")
    write(_run_json("c07", "Rate limit the public API", 9, 10, status="error", provider=None,
                    issues=["Rate limiter counts health checks from the load balancer"]))
    write(_run_json("c08", "为结账页面添加中文翻译 🧾", 11, 12, status="cancelled", provider="ollama"))
    old = root / "api" / "records" / "c02.json"
    before, ino = old.read_bytes(), old.stat().st_ino
    fix = _put(tmp, _run_json("c02-fix", "Add the product listing endpoint with eager-loaded tags", 12.5, 13,
                              accomplished=["listing endpoint with selectinload"],
                              issues=["N+1 queries when listing products with tags"]))
    cybmem_ok("supersede", "c02", fix, "--run-id", "c02-fix", "--memory-dir", root, "--project", "api")
    cybmem_ok("mark", "rate-limiter-counts-health-checks-from-the-load-balancer", "wontfix", "--by", "c08",
              "--detail", "the load balancer moves to a separate port", "--memory-dir", root, "--project", "api")
    return Store(root, "api", node_read(root, "api"), {"c02_before": before, "c02_ino": ino})


def _build_mixed(tmp: Path) -> Store:
    root = tmp / "memory"
    node("write", root)
    web = ("--memory-dir", root, "--project", "web")
    # The orchestrator searches before every dispatch: index and cache exist before the writes below.
    cybmem_ok("search", "cart drawer", "-k", "3", *web, "--json")
    run = _run_json("py-01", "Fix the checkout button overlapping the footer", 23, 24, t0=T0_TS, cwd="/home/dev/web",
                    accomplished=["resolved flaky-login-test"],
                    issues=["Untitled flake: still fails on Safari", "Checkout button overlaps the footer on small screens"])
    # No --project: the slug comes from the projects.json that Node wrote.
    written = cybmem_ok("write", _put(tmp, run), "--memory-dir", root, "--chat", "chat-beta", "--json").json()
    cybmem_ok("search", "checkout footer", "-k", "3", *web, "--json")
    cybmem_ok("list", *web, "--json")
    # The orchestrator corrects cybmem's record its own way: a new record, then supersededBy on the old one.
    node("correct", root, "py-01", "py-01-fix", "--project", "web")
    return Store(root, "web", node_read(root, "web"), {"written": written})


BUILDERS = {"ts-written": _build_ts_written, "cybmem-written": _build_cybmem_written, "mixed": _build_mixed}


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Builds each store once, on first use, inside the test that needs it (a missing node fails it)."""
    built: dict[str, Store] = {}

    def get(name: str) -> Store:
        if name not in built:
            _node_exe()
            built[name] = BUILDERS[name](tmp_path_factory.mktemp(name))
        return built[name]

    return get


# --- comparing the views ----------------------------------------------------------------------




def _diff(where: str, got: dict, want: dict) -> list[str]:
    keys = sorted(set(got) | set(want))
    return [f"{where}: {k}: cybmem {got.get(k, '<missing>')!r} != node {want.get(k, '<missing>')!r}"
            for k in keys if got.get(k, "<missing>") != want.get(k, "<missing>")]


def _no_mismatches(mismatches: list[str]) -> None:
    assert not mismatches, f"{len(mismatches)} disagreement(s):\n" + "\n".join(mismatches)


SCENARIOS = list(BUILDERS)


@pytest.mark.parametrize("name", SCENARIOS)
def test_list_agrees(stores, name):
    """`cybmem list --json` has every record the TS reader reads, in its order, flagged superseded alike."""
    st = stores(name)
    entries = st.cli("list", "--limit", "0", "--json").json()
    got = [{
        "runId": e["runId"], "startedAt": e["startedAt"], "endedAt": e["endedAt"], "state": e["state"],
        "workflowName": e.get("workflowName"), "task": e.get("task"), "superseded": bool(e.get("supersededBy")),
        "previousRunId": e.get("previousRunId"), "parentRunId": e.get("parentRunId"),
        "chatSessionId": e.get("chatSessionId"), "rootRunId": e.get("rootRunId"),
    } for e in entries]
    want = st.node["list"]  # list --json carries the whole task, as the TS reader does
    mismatches = []
    if [e["runId"] for e in got] != [e["runId"] for e in want]:
        mismatches.append(f"order: cybmem {[e['runId'] for e in got]} != node {[e['runId'] for e in want]}")
    by_id = {e["runId"]: e for e in got}
    for e in want:
        if e["runId"] in by_id:
            mismatches += _diff(f"list {e['runId']}", by_id[e["runId"]], e)
    _no_mismatches(mismatches)


@pytest.mark.parametrize("name", SCENARIOS)
def test_show_agrees(stores, name):
    """`cybmem show` reaches the newest truth the TS reader reaches and prints that record as stored."""
    st = stores(name)
    records, show = st.node["records"], st.node["show"]
    mismatches = []
    for i, run_id in enumerate(sorted(records)):
        here = i > 0  # the first record through the console script, the others in this process
        res = st.cli("show", run_id, "--json", here=here)
        if res.returncode != 0:
            mismatches.append(f"show {run_id}: {res.why()}")
        else:
            data = res.json()
            data.pop("_supersededChain", None)
            if data.get("runId") != show[run_id]:
                mismatches.append(f"show {run_id}: cybmem renders {data.get('runId')!r}, node follows supersededBy to {show[run_id]!r}")
            else:
                mismatches += _diff(f"show {run_id} -> {show[run_id]}", data, records[show[run_id]])
        res = st.cli("show", run_id, "--original", "--json", here=here)
        if res.returncode != 0:
            mismatches.append(f"show --original {run_id}: {res.why()}")
        else:
            mismatches += _diff(f"show --original {run_id}", res.json(), records[run_id])
    _no_mismatches(mismatches)


@pytest.mark.parametrize("name", SCENARIOS)
def test_open_issues_agree(stores, name):
    """`cybmem issues --json` is the TS fold: same open ids, state, title, openedAt, openedBy."""
    st = stores(name)
    got = {i["issueId"]: {k: i[k] for k in ("title", "state", "openedAt", "openedBy")}
           for i in st.cli("issues", "--state", "open", "--limit", "0", "--json").json()}
    want = {i["issueId"]: {k: i[k] for k in ("title", "state", "openedAt", "openedBy")} for i in st.node["openIssues"]}
    mismatches = []
    for issue_id in sorted(set(got) | set(want)):
        if issue_id not in got:
            mismatches.append(f"issue {issue_id}: open for node, not for cybmem")
        elif issue_id not in want:
            mismatches.append(f"issue {issue_id}: open for cybmem, not for node")
        else:
            mismatches += _diff(f"issue {issue_id}", got[issue_id], want[issue_id])
    _no_mismatches(mismatches)


@pytest.mark.parametrize("name", SCENARIOS)
def test_chains_agree(stores, name):
    """`cybmem chain --json` walks previous and next, and finds parent, children and chat runs, as the TS reader."""
    st = stores(name)
    keys = ("previous", "next", "parentRunId", "rootRunId", "chatSessionId", "children", "chatRuns")
    mismatches = []
    for i, (run_id, want) in enumerate(sorted(st.node["chains"].items())):
        # the first run through the console script, the others in this process
        res = st.cli("chain", run_id, "--context", "all", "--json", here=i > 0)
        if res.returncode != 0:
            mismatches.append(f"chain {run_id}: {res.why()}")
            continue
        data = res.json()
        mismatches += _diff(f"chain {run_id}", {k: data.get(k) for k in keys}, {k: want[k] for k in keys})
    _no_mismatches(mismatches)


@pytest.mark.parametrize("name", SCENARIOS)
def test_search_candidates_agree(stores, name):
    """`cybmem search -k <all>` returns exactly the records that are not superseded."""
    st = stores(name)
    want = sorted(st.node["candidates"])
    mismatches = []
    for query in QUERIES:
        data = st.cli("search", query, "-k", BIG_K, "--json").json()
        hits = [h["runId"] for h in data["hits"]]
        if len(hits) != len(set(hits)):
            mismatches.append(f"search {query!r}: a run is returned twice: {hits}")
        if sorted(set(hits)) != want:
            mismatches.append(f"search {query!r}: only cybmem {sorted(set(hits) - set(want))}, "
                              f"only node {sorted(set(want) - set(hits))}")
        if data["candidates"] != len(want):
            mismatches.append(f"search {query!r}: {data['candidates']} candidates, node has {len(want)}")
    _no_mismatches(mismatches)


# --- what each store must contain (so that the comparisons above cover the cases) -------------


def test_node_reader_sees_the_ts_edge_cases(stores):
    """The TS-written store has every edge case, as the reference reader reads it."""
    nd = stores("ts-written").node
    assert nd["skipped"] == [] and len(nd["records"]) == 16
    assert nd["projects"] == {"web": {"cwd": "/home/dev/web"}}
    assert nd["records"]["run-09"]["task"] == "Ship the \ufffd"  # a lone "\ud83c" on disk
    assert nd["records"]["run-03"]["dispatchedRuns"] == ["run-04a", "run-04b"]
    assert nd["show"]["run-05"] == "run-05-fix" and nd["show"]["run-08"] == nd["show"]["run-08-fix"] == "run-08-fix2"
    assert nd["show"]["run-11"] == "run-11" and nd["records"]["run-11"]["supersededBy"] == "run-99-ghost"
    assert sorted(set(nd["records"]) - set(nd["candidates"])) == ["run-05", "run-08", "run-08-fix"]
    assert nd["chains"]["run-02"]["next"] == ["run-04a"]  # equal endedAt: ties by runId
    assert nd["chains"]["run-03"]["children"] == ["run-04a", "run-04b"]
    assert nd["chains"]["run-10"]["chatRuns"] == ["run-09", "run-10"]
    issues = {i["issueId"]: i for i in nd["openIssues"]}
    assert sorted(issues) == ["cart-total-rounding", "dark-mode-colours", "flaky-login-test", "issue-5f1c2a9b3e",
                              "ssr-hydration", "untitled-flake"]  # "snoozed" is skipped; i18n-dates is wontfix
    assert issues["cart-total-rounding"]["title"] == "Cart total rounds half-cents down"  # opened without a title
    assert issues["flaky-login-test"]["title"] == "Flaky login test"
    assert issues["ssr-hydration"]["title"] == "ssr-hydration"  # its first non-empty title
    assert issues["untitled-flake"]["title"] == "untitled-flake"
    assert issues["issue-5f1c2a9b3e"]["title"] == "登录按钮在移动端不可点击 📱"


def test_node_reads_what_cybmem_wrote(stores):
    """Node reads every record cybmem wrote, its projects.json, its lineage and its ledger."""
    nd = stores("cybmem-written").node
    assert nd["skipped"] == []
    assert sorted(nd["records"]) == ["c01", "c02", "c02-fix", "c03", "c04", "c05", "c06", "c07", "c08"]
    assert nd["projects"] == {"api": {"cwd": "/home/dev/api"}}
    assert nd["chains"]["c03"]["children"] == ["c04", "c05"]
    assert nd["chains"]["c06"]["chatRuns"] == ["c03", "c06"]
    assert nd["chains"]["c08"]["previous"] == ["c01", "c02", "c03", "c06", "c07"]
    assert {i["issueId"] for i in nd["openIssues"]} == {"flaky-login-test", "n-1-queries-when-listing-products-with-tags"}
    assert nd["records"]["c02-fix"]["supersedes"] == "c02"
    # an agent's turn's optional fields (the files it edited, the commands it ran): read, kept as they are
    assert nd["records"]["c01"]["files"] == ["app/main.py", "app/health.py"]
    assert nd["records"]["c01"]["commands"] == ["pytest -q tests/test_health.py"]


def test_cybmem_supersede_adds_superseded_by_to_the_old_record(stores):
    """Contract 1: `cybmem supersede` adds "supersededBy" to the old record by atomic replace, nothing else."""
    st = stores("cybmem-written")
    path = st.root / "api" / "records" / "c02.json"
    before = json.loads(st.extra["c02_before"])
    assert json.loads(path.read_bytes()) == {**before, "supersededBy": "c02-fix"}
    assert path.stat().st_ino != st.extra["c02_ino"], "the old record must be replaced by rename, not rewritten in place"
    assert st.node["show"]["c02"] == "c02-fix"
    assert [p.name for p in (st.root / "api" / "records").iterdir() if not p.name.endswith(".json")] == []


def test_round_trip_links_and_folds_across_writers(stores):
    """cybmem's run in the TS store: previousRunId auto-linked to the newest TS run, issues folded across both."""
    st = stores("mixed")
    nd = st.node
    assert st.extra["written"]["project"] == "web"
    rec = nd["records"]["py-01"]
    assert rec["lineage"]["previousRunId"] == "run-12"
    assert rec["lineage"]["chatSessionId"] == "chat-beta"
    assert rec["supersededBy"] == "py-01-fix" and nd["show"]["py-01"] == "py-01-fix"
    assert nd["chains"]["run-12"]["next"] == ["py-01"]
    assert nd["chains"]["run-10"]["chatRuns"] == ["run-09", "run-10", "py-01", "py-01-fix"]
    issues = {i["issueId"]: i for i in nd["openIssues"]}
    assert "flaky-login-test" not in issues  # resolved by cybmem's run
    assert issues["untitled-flake"]["openedBy"] == "run-12"  # already open: not opened again
    assert issues["checkout-button-overlaps-the-footer-on-small-screens"]["openedBy"] == "py-01"
