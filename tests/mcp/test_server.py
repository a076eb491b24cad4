"""`cybmem mcp`: a scripted agent (an MCP client of the same SDK) drives the real server.

The server runs as a subprocess of the `cybmem` console script, once per module and transport:
over stdio (writes off) and streamable HTTP on 127.0.0.1 (writes on, `--http 0`: a free port).
Answers are compared with what the CLI prints under --json for the same store, and every tool's
bad arguments with the CLI's message. Stores are copies of data-fixtures/memory without its
`.nocache`, so the Arrow cache and the server's held snapshots are in play as on a real root.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import typing
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path

import pytest
from anyio.from_thread import start_blocking_portal
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from typer.testing import CliRunner

from cybmem.cli.app import app
from cybmem.mcp.tools import DEFAULT_CONTEXT, DEFAULT_K, DEFAULT_LIMIT

from conftest import FIXTURES, LEFTOVERS, make_run, write_json


#: These tests check the linear formula's order, or outputs written with it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("linear_ranker")

CYBMEM = shutil.which("cybmem")
READS = {"projects", "search", "show", "chain", "issues", "memory_block"}
WRITES = {"mark_issue", "supersede"}
CART = "9b6b1e00-90b4-579e-9d84-2170f292abf9"  # web: "Stabilise the flaky cart drawer e2e test"
CORRECTED, CORRECTION = "069d3a68-428c-5ee1-a8d3-21a001b0f78b", "4525ac6e-bae3-59c0-86ed-d539832d5a75"  # web


def _memory(where: Path) -> Path:
    root = where / "memory"
    shutil.copytree(FIXTURES, root, ignore=LEFTOVERS)
    (root / ".nocache").unlink()
    return root


def _env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CYBERINE_")}
    env.update(HOME=str(home), COLUMNS="120", CYBERINE_MEMORY_RANKER="linear")  # the formula's order (see _linear_ranker)
    return env


def cli(root: Path, *args: str):
    """The `cybmem` command on the same store, in-process (what the answers are compared with)."""
    return CliRunner().invoke(app, [*args, "--memory-dir", str(root)])


def cli_json(root: Path, *args: str):
    result = cli(root, *args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


TIMES = {"startedAt", "endedAt", "openedAt", "lastAt", "resolvedAt", "at", "asOf", "now"}
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def as_agents_get(value, key=None):
    """What the CLI prints under --json, as an agent gets it: times in ISO 8601 UTC, no inode."""
    if isinstance(value, dict):
        return {k: as_agents_get(v, k) for k, v in value.items() if k != "inode"}
    if isinstance(value, list):
        return [as_agents_get(v, key) for v in value]
    if key in TIMES and isinstance(value, int):
        return datetime.fromtimestamp(value / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")[:-6] + "Z"
    return value


def times_in(value, key=None):
    """Every (key, value) of a time field anywhere in an answer."""
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in times_in(v, k)]
    if isinstance(value, list):
        return [t for v in value for t in times_in(v, key)]
    return [(key, value)] if key in TIMES and value is not None else []


def cli_agents(root: Path, *args: str):
    return as_agents_get(cli_json(root, *args))


def write_elsewhere(root: Path, run: Path) -> None:
    """`cybmem write` in another process."""
    p = subprocess.run([CYBMEM, "write", str(run), "--memory-dir", str(root)], capture_output=True, text=True,
                       env=_env(root.parent), timeout=60)
    assert p.returncode == 0, p.stderr


class Agent:
    """A scripted agent: one session of the SDK's Client, driven synchronously through a portal."""

    def __init__(self, server, root: Path, log: Path):
        self.root, self.log = root, log
        self._stack = ExitStack()
        self.portal = self._stack.enter_context(start_blocking_portal())
        self.client = self._stack.enter_context(self.portal.wrap_async_context_manager(Client(server)))

    def call(self, tool: str, **arguments):
        return self.portal.call(self.client.call_tool, tool, arguments)

    def answer(self, tool: str, **arguments) -> dict:
        result = self.call(tool, **arguments)
        assert not result.is_error, result.content[0].text
        assert tool == "memory_block" or json.loads(result.content[0].text) == result.structured_content
        return result.structured_content

    def error(self, tool: str, **arguments) -> str:
        result = self.call(tool, **arguments)
        assert result.is_error and result.structured_content is None, result
        return result.content[0].text

    def tools(self) -> dict:
        return {t.name: t for t in self.portal.call(self.client.list_tools).tools}

    def read(self, uri: str) -> str:
        return self.portal.call(self.client.read_resource, uri).contents[0].text

    def close(self) -> None:
        self._stack.close()


@pytest.fixture(scope="module")
def stdio_agent(tmp_path_factory):
    where = tmp_path_factory.mktemp("stdio")
    root, log = _memory(where), where / "server.log"
    params = StdioServerParameters(command=CYBMEM, args=["mcp", "--memory-dir", str(root), "--project", "web"],
                                   env=_env(where))
    with log.open("w") as errlog:
        agent = Agent(stdio_client(params, errlog=errlog), root, log)
        yield agent
        agent.close()


@pytest.fixture(scope="module")
def http_agent(tmp_path_factory):
    where = tmp_path_factory.mktemp("http")
    root, log = _memory(where), where / "server.log"
    with log.open("w") as errlog:
        proc = subprocess.Popen([CYBMEM, "mcp", "--http", "0", "--allow-writes", "--memory-dir", str(root),
                                 "--project", "web"], stdin=subprocess.DEVNULL, stdout=errlog, stderr=errlog,
                                env=_env(where))
        try:
            url = None
            deadline = time.monotonic() + 60
            while url is None and proc.poll() is None and time.monotonic() < deadline:
                found = re.search(r"serving streamable HTTP at (\S+)", log.read_text())
                url = found.group(1) if found else time.sleep(0.05)
            assert url, log.read_text()
            agent = Agent(url, root, log)
            agent.url = url
            yield agent
            agent.close()
        finally:
            proc.terminate()
            proc.wait(timeout=20)


@pytest.fixture(params=["stdio", "http"])
def agent(request) -> Agent:
    return request.getfixturevalue(f"{request.param}_agent")


# --- what the server offers ----------------------------------------------------------


def test_the_http_socket_takes_connections_before_the_app_serves():
    """The URL line is printed once the socket listens: a client that connects at once (before
    uvicorn has started) is queued, not refused (found as a rare ConnectError of the http agent)."""
    from cybmem.mcp.http import listen

    sock = listen(0)
    try:
        with socket.create_connection(sock.getsockname(), timeout=5):
            pass
    finally:
        sock.close()


def test_tools_are_listed_with_input_and_output_schemas(agent):
    tools = agent.tools()
    assert set(tools) == (READS | WRITES if hasattr(agent, "url") else READS)
    for name, tool in tools.items():
        assert tool.description and tool.title, name
        assert tool.input_schema["type"] == "object" and (tool.input_schema["properties"] or name == "projects"), name
        assert tool.output_schema["type"] == "object" and tool.output_schema["properties"], name
        assert tool.annotations.read_only_hint == (name in READS), name
        assert tool.annotations.open_world_hint is False
    search = tools["search"].input_schema
    assert search["required"] == ["query"]
    assert search["properties"]["k"] == {"default": 10, "description": "How many results.", "minimum": 1,
                                         "title": "K", "type": "integer"}
    assert {"hits", "weights", "warnings"} <= set(tools["search"].output_schema["properties"])
    assert tools["issues"].input_schema["properties"]["status"]["enum"] == ["open", "all"]
    templates = agent.portal.call(agent.client.list_resource_templates).resource_templates
    assert sorted(t.uri_template for t in templates) == ["cybmem://projects/{project}/issues",
                                                         "cybmem://projects/{project}/runs/{run_id}"]


def test_the_server_says_what_it_serves(agent):
    assert f"cybmem mcp: memory root {agent.root}, default project web" in agent.log.read_text()
    if hasattr(agent, "url"):
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/mcp", agent.url)
    assert "Search it before starting work" in agent.client.instructions


# --- the read tools: the library's answers, as the CLI prints them --------------------


def test_search(agent):
    answer = agent.answer("search", query="flaky cart drawer test", k=3, explain=True)
    cli_answer = cli_json(agent.root, "search", "flaky cart drawer test", "-k", "3", "--project", "web", "--explain")
    assert answer["project"] == "web" and answer["warnings"] == []
    assert [h["runId"] for h in answer["hits"]] == [h["runId"] for h in cli_answer["hits"]]
    assert answer["hits"][0]["runId"] == CART and set(answer["hits"][0]["contributions"]) >= {"keyword", "recency"}
    assert answer["weights"] == cli_answer["weights"]
    plain = agent.answer("search", query="flaky cart drawer test", k=1)
    assert "contributions" not in plain["hits"][0] and plain["hits"][0]["runId"] == CART
    past = agent.answer("search", query="flaky cart drawer test", as_of="2026-10-01")
    assert past["asOf"] == "2026-10-01T00:00:00.000Z" and CART not in [h["runId"] for h in past["hits"]]


def test_show_a_prefix(agent):
    answer = agent.answer("show", run_id=CART[:6])
    assert answer["record"] == cli_agents(agent.root, "show", CART[:6], "--project", "web")
    assert answer["record"]["runId"] == CART and answer["supersededChain"] == []


def test_show_follows_supersession(agent):
    answer = agent.answer("show", run_id=CORRECTED[:8])
    assert answer["record"]["runId"] == CORRECTION and answer["supersededChain"] == [CORRECTED]
    shown = cli_agents(agent.root, "show", CORRECTED[:8], "--project", "web")
    assert shown.pop("_supersededChain") == [CORRECTED] and answer["record"] == shown
    assert agent.answer("show", run_id=CORRECTED, original=True)["record"]["runId"] == CORRECTED


def test_chain(agent):
    answer = agent.answer("chain", run_id=CART[:8], context=1)
    expected = cli_agents(agent.root, "chain", CART[:8], "--context", "1", "--project", "web")
    assert {k: v for k, v in answer.items() if k not in ("project", "warnings")} == expected
    assert answer["runId"] == CART and len(answer["previous"]) == 1 and len(answer["runs"]) == 3
    whole = agent.answer("chain", run_id=CART, context=0)
    assert len(whole["runs"]) == whole["chainLength"] and whole["omitted"]["before"] == 0


def test_issues(agent):
    answer = agent.answer("issues")
    expected = cli_agents(agent.root, "issues", "--state", "open", "--project", "web")
    assert answer["issues"] == expected and answer["total"] == len(expected) == 1
    every = agent.answer("issues", status="all", limit=0)
    assert every["issues"] == cli_agents(agent.root, "issues", "--all", "--project", "web")
    assert every["total"] == len(every["issues"]) > 3
    assert len(agent.answer("issues", status="all", limit=3)["issues"]) == 3
    ranked = agent.answer("issues", query="consent banner analytics", limit=2)
    first = ranked["issues"][0]
    assert first["issueId"] == "analytics-fires-before-the-consent-banner-is-answered-on-first"
    assert first["score"] > 0 and set(first["contributions"]) == {"keyword", "lineage", "recency"}
    assert [i["state"] for i in ranked["issues"]] == ["opened"] and ranked["total"] == 1, "the open ones, ranked"
    # The CLI's `issues --query` is the same library call: the same ranked open issues, the same scores.
    open_ranked = agent.answer("issues", query="consent banner analytics", limit=0)["issues"]
    assert open_ranked == cli_agents(agent.root, "issues", "--query", "consent banner analytics", "--limit", "0", "--project", "web")
    # A query ranks the open issues: with status='all' the tool says so (it merged closed ones in, unranked, once).
    said = agent.error("issues", status="all", query="consent banner")
    assert "a query ranks the open issues: leave status out (or 'open') with a query" in said


def test_memory_block_is_what_inject_system_prints(agent):
    task = "Fix the flaky cart drawer test"
    result = agent.call("memory_block", task=task)
    answer = result.structured_content
    printed = cli(agent.root, "inject", "--system", task, "--project", "web")
    assert printed.exit_code == 0 and printed.stdout == answer["block"] and answer["block"].endswith("END MEMORY\n")
    assert result.content[0].text == answer["block"] and answer["block"].startswith("MEMORY")
    assert answer["runs"][0]["runId"] == CART and answer["project"] == "web" and answer["warnings"] == []
    follow_up = agent.answer("memory_block", task="Make the drawer faster", parent_run_id=CORRECTION)
    assert follow_up["runs"][0]["runId"] == CORRECTION and follow_up["runs"][0]["pinned"] == "parent"
    empty = agent.call("memory_block", task="anything", as_of="2020-01-01")
    assert empty.structured_content["block"] == "" and empty.content[0].text.startswith("No MEMORY block")


def test_resources(agent):
    issues = json.loads(agent.read("cybmem://projects/web/issues"))
    assert issues == cli_agents(agent.root, "issues", "--state", "open", "--project", "web")
    record = json.loads(agent.read(f"cybmem://projects/web/runs/{CORRECTED[:8]}"))
    assert record == cli_agents(agent.root, "show", CORRECTED[:8], "--project", "web")
    with pytest.raises(MCPError, match="no project 'nope' under .*; known projects: api, web, web-7663e1"):
        agent.read("cybmem://projects/nope/issues")
    with pytest.raises(MCPError, match="prefix '0' matches 4 records"):
        agent.read("cybmem://projects/web/runs/0")


# --- bad arguments: an error result with the CLI's message, never a crash --------------

BAD = [
    ("search", {"query": "x", "project": "nope"}, None, ["search", "x", "--project", "nope"]),
    ("search", {"query": "x", "k": 0}, "k\n  Input should be greater than or equal to 1", None),
    ("search", {"query": "x", "as_of": "last week"}, "as_of 'last week' is neither epoch milliseconds nor an ISO date", None),
    ("show", {"run_id": "0"}, None, ["show", "0", "--project", "web"]),
    ("show", {"run_id": "zzz"}, None, ["show", "zzz", "--project", "web"]),
    ("show", {"run_id": "../etc"}, None, ["show", "../etc", "--project", "web"]),
    ("chain", {"run_id": "zzz"}, None, ["chain", "zzz", "--project", "web"]),
    ("chain", {"run_id": CART, "context": -1}, "context\n  Input should be greater than or equal to 0", None),
    ("issues", {"project": "nope"}, None, ["issues", "--project", "nope"]),
    ("issues", {"status": "closed"}, "status\n  Input should be 'open' or 'all'", None),
    ("memory_block", {"task": "x", "project": "nope"}, "no project 'nope' under", None),
    ("memory_block", {"task": "x", "as_of": "soon"}, "as_of 'soon' is neither epoch milliseconds nor an ISO date", None),
    ("memory_block", {}, "task\n  Field required", None),
    ("search", {"query": "x", "as_of": 10**20}, "as_of 100000000000000000000 is out of range: give a moment from "
                                                "1970-01-01 to 9999-12-31 (epoch milliseconds 0 to 253402300799999)", None),
    ("search", {"query": "x", "as_of": "-1"}, "as_of '-1' is out of range: give a moment from 1970-01-01", None),
    ("memory_block", {"task": "x", "as_of": "99999999999999999999"}, "as_of '99999999999999999999' is out of range", None),
    ("memory_block", {"task": "x", "as_of": "1e400"}, "as_of '1e400' is neither epoch milliseconds nor an ISO date", None),
    ("search", {"query": "x", "as_of": True}, "as_of true is neither epoch milliseconds nor an ISO date (e.g. ", None),
    ("memory_block", {"task": "x", "as_of": True}, "as_of true is neither epoch milliseconds nor an ISO date", None),
    ("search", {"query": "x", "as_of": 1.5}, "as_of 1.5 is neither epoch milliseconds nor an ISO date (e.g. ", None),
    ("memory_block", {"task": "x", "as_of": 1.5}, "as_of 1.5 is neither epoch milliseconds nor an ISO date", None),
    ("search", {"query": "x", "as_of": [1]}, "as_of [1] is neither epoch milliseconds nor an ISO date", None),
    ("search", {"query": "x", "project": "WEB"}, "looks like existing project 'web' (the same after Unicode NFKC, case "
                                                 "folding, look-alike letters and dropping '-', '_' and '.'); use "
                                                 "project='web', or a name", None),
    ("mark_issue", {"issue_id": "nope", "event": "resolved"}, "the issues tool with status='all' lists every issue id",
     None),
]


@pytest.mark.parametrize("tool, arguments, expected, cli_args", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_argument(agent, tool, arguments, expected, cli_args):
    if tool in WRITES and not hasattr(agent, "url"):
        pytest.skip("the write tools are offered with --allow-writes (the http agent)")
    message = agent.error(tool, **arguments)
    assert message.startswith(f"Error executing tool {tool}: ")
    assert not CLI_WORDS.search(message), message  # tool arguments, never the command line's flags
    if cli_args is None:
        assert expected in message
        assert "as_of" not in arguments or "\n" not in message, message  # one line, not pydantic's report
        return
    printed = cli(agent.root, *cli_args)
    assert printed.exit_code == 1 and printed.stderr.startswith("Error: ")
    said = printed.stderr.strip().removeprefix("Error: ")
    if "; see `cybmem list`" in said:  # the CLI's pointer, as a tool's
        said = said.replace("; see `cybmem list`", "; the search tool finds a project's run ids")
    assert message.removeprefix(f"Error executing tool {tool}: ") == said


# --- for a model: descriptions, the projects, times, errors in tool terms --------------

CLI_WORDS = re.compile(r"cybmem [a-z]|--[a-z]")


def test_tools_are_described_for_a_model(agent):
    """Each tool says what it is for, when to call it and what to pass next, in tool terms."""
    tools = agent.tools()
    for name, tool in tools.items():
        for text in [tool.description] + [p["description"] for p in tool.input_schema["properties"].values()]:
            assert not CLI_WORDS.search(text), (name, text)
        assert "Call it " in tool.description, name
    search, show, chain = (tools[n].description for n in ("search", "show", "chain"))
    assert "Pass a hit's runId to `show`" in search and "or to\n`chain`" in search
    assert "runId" in show and "`search`" in show and "runId" in chain and "`show`" in chain
    assert "issueId (for `mark_issue`)" in tools["issues"].description
    assert "pass a slug as `project`" in tools["projects"].description
    project = tools["search"].input_schema["properties"]["project"]["description"]
    assert "the projects tool lists them" in project
    as_of = tools["search"].input_schema["properties"]["as_of"]["description"]
    assert "ISO 8601" in as_of and "1970-01-01 to 9999-12-31" in as_of
    for tool in ("search", "memory_block"):  # validated by parse_time, still declared as a text or a number
        assert tools[tool].input_schema["properties"]["as_of"]["anyOf"] == [{"type": t} for t in ("string", "integer", "null")]
    hit = tools["search"].output_schema["$defs"]["SearchHit"]["properties"]["endedAt"]
    assert hit["type"] == "string" and "ISO 8601" in hit["description"]
    issue = tools["issues"].output_schema["$defs"]["Issue"]["properties"]
    assert issue["openedAt"]["type"] == "string" and "string" in [t.get("type") for t in issue["resolvedAt"]["anyOf"]]
    assert "pass the runIds it returns to show" in agent.client.instructions


def _descriptions(tools) -> dict[str, str]:
    """What a model reads: each tool's (and resource's) description, and each argument's as
    ``tool.argument``, white space folded."""
    out = {}
    for name in (*READS, *WRITES, "open_issues"):
        method = getattr(tools, name)
        out[name] = " ".join(inspect.getdoc(method).split())
        for arg, hint in typing.get_type_hints(method, include_extras=True).items():
            described = [m.description for m in getattr(hint, "__metadata__", ()) if getattr(m, "description", None)]
            if described:
                out[f"{name}.{arg}"] = " ".join(described[0].split())
    return out


def _descending(values: list) -> bool:
    return values == sorted(values, reverse=True)


def _claims(tools) -> list[tuple[str, str, bool]]:
    """(where, a phrase a model reads there, whether the tool's answers bear it out) for each claim
    of the descriptions that can drift from the code: orders, defaults, statuses, ranking fields."""
    every = tools.issues(status="all", limit=0)["issues"]
    opened = tools.issues(limit=0)["issues"]
    closed = [i for i in every if i["state"] in ("resolved", "wontfix")]
    ranked = tools.issues(query="consent banner analytics cart drawer", limit=0)["issues"]
    hits = tools.search(query="flaky cart drawer test", explain=True)["hits"]
    chain = tools.chain(run_id=CART)
    parent = tools.memory.settings.parent_run_id
    return [
        ("issues", "the open ones, newest opened first",
         len(opened) > 2 and _descending([i["openedAt"] for i in opened])
         and all(i["state"] in ("opened", "reopened") for i in opened)),
        ("issues", "(status='all': then the closed ones, most recently closed first)",
         len(closed) > 2 and every == opened + closed and _descending([i["lastAt"] for i in closed])),
        ("issues", "with a query, the open ones ranked against it, best first, each with its score and its keyword, "
                   "lineage and recency contributions",
         {i["issueId"] for i in ranked} == {i["issueId"] for i in opened} and _descending([i["score"] for i in ranked])
         and all(set(i["contributions"]) == {"keyword", "lineage", "recency"} for i in ranked)),
        ("issues.status", "open, or all (closed ones too)", bool(closed) and not set(map(str, opened)) & set(map(str, closed))),
        ("issues.limit", "At most this many (0: all)",
         len(tools.issues(status="all")["issues"]) == min(DEFAULT_LIMIT, len(every))
         and len(tools.issues(status="all", limit=2)["issues"]) == 2),
        ("open_issues", "newest opened first", tools.open_issues("web") == opened),
        ("search", "best first (scored on keywords, recency and lineage, and on meaning where the project has "
                   "embeddings)",
         _descending([h["score"] for h in hits])
         and all(set(h["contributions"]) == {"keyword", "recency", "lineage", "vector"} for h in hits)),
        ("search.k", "How many results", len(hits) == DEFAULT_K),
        ("chain.context", "Runs shown each side of the run; 0: the whole chain",
         len(chain["previous"]) <= DEFAULT_CONTEXT and len(chain["runs"]) <= 2 * DEFAULT_CONTEXT + 1
         and len(tools.chain(run_id=CART, context=0)["runs"]) == chain["chainLength"]),
        ("memory_block", "the most relevant prior runs and open issues within a token budget",
         CART in [r["runId"] for r in tools.memory_block(task="Fix the flaky cart drawer test")["runs"]]),
        ("memory_block.parent_run_id", "it comes first (default: the server's $CYBERINE_PARENT_RUN_ID)",
         parent is not None and tools.memory_block(task="Make the drawer faster")["runs"][0]["runId"] == parent),
    ]


def test_the_descriptions_say_what_the_tools_do(tmp_path):
    """What every model that connects reads of the tools holds against what they answer, on a
    fixture store with several open issues (two closed ones reopened): the issues tool once said
    "oldest first" while both it and `cybmem issues` listed the newest first (issue 38)."""
    from cybmem import Memory, Settings
    from cybmem.mcp.tools import MemoryTools

    root = _memory(tmp_path)
    settings = Settings.from_env({"CYBERINE_PARENT_RUN_ID": CORRECTION}, memory_dir=root)
    tools = MemoryTools(Memory(settings, project="web"), allow_writes=True)
    for issue in [i for i in tools.issues(status="all", limit=0)["issues"] if i["state"] == "resolved"][:2]:
        tools.mark_issue(issue_id=issue["issueId"], event="reopened")
    said = _descriptions(tools)
    for where, phrase, holds in _claims(tools):
        assert phrase in said[where], f"{where} no longer says {phrase!r}: check the claim of its answers too"
        assert holds, f"{where} says {phrase!r}, which its answers no longer bear out"
    assert "oldest" not in said["issues"] + said["open_issues"]


def test_projects(agent):
    answer = agent.answer("projects")
    listed = cli_json(agent.root, "projects")
    assert [p["slug"] for p in answer["projects"]] == ["api", "web", "web-7663e1"]
    assert answer["projects"] == [{"slug": p["slug"], "cwd": p["cwd"], "runs": p["records"]} for p in listed]
    assert all(p["runs"] > 0 for p in answer["projects"])
    assert answer["defaultProject"] == "web" and answer["memoryRoot"] == str(agent.root)


def test_every_time_is_iso_8601_and_no_internal_field_is_shown(agent):
    answers = {
        "search": agent.answer("search", query="cart drawer", k=3, as_of="2026-10-28", explain=True),
        "show": agent.answer("show", run_id=CORRECTED[:8]),
        "chain": agent.answer("chain", run_id=CART, context=0),
        "issues": agent.answer("issues", status="all", limit=0),
        "ranked": agent.answer("issues", query="consent banner"),
        "memory_block": agent.call("memory_block", task="Fix the cart drawer").structured_content,
        "open-issues": json.loads(agent.read("cybmem://projects/web/issues")),
        "run-record": json.loads(agent.read(f"cybmem://projects/web/runs/{CART[:8]}")),
    }
    for name, answer in answers.items():
        times = times_in(answer)
        assert times and all(isinstance(v, str) and ISO.fullmatch(v) for _, v in times), (name, times)
        assert '"inode"' not in json.dumps(answer), name
    assert answers["search"]["asOf"] == "2026-10-28T00:00:00.000Z" and ISO.fullmatch(answers["search"]["now"])
    assert {k for k, _ in times_in(answers["chain"])} == {"startedAt", "endedAt"}
    assert {"openedAt", "lastAt", "resolvedAt"} <= {k for k, _ in times_in(answers["issues"])}
    shown = cli_json(agent.root, "show", CART, "--project", "web")
    assert answers["run-record"]["endedAt"] == \
        datetime.fromtimestamp(shown["endedAt"] / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


@pytest.fixture(scope="module")
def desktop_agent(tmp_path_factory):
    """README's configuration as written (`cybmem mcp`, nothing else) as a desktop client runs
    it: from /, with the user's HOME, whose default memory root holds the fixtures."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    config = json.loads(re.search(r"```json\n(\{\n  \"mcpServers\".*?)```", readme, re.S).group(1))["mcpServers"]["cybmem"]
    assert config["command"] == "cybmem"
    where = tmp_path_factory.mktemp("desktop")
    shutil.copytree(_memory(where), where / ".cyberine" / "memory")
    root, log = where / ".cyberine" / "memory", where / "server.log"
    params = StdioServerParameters(command=CYBMEM, args=config["args"], env=_env(where), cwd="/")
    with log.open("w") as errlog:
        agent = Agent(stdio_client(params, errlog=errlog), root, log)
        yield agent
        agent.close()


def test_a_server_started_outside_any_project_lists_them_and_searches_one(desktop_agent):
    agent = desktop_agent
    assert f"memory root {agent.root}, no default project (/ is no project's directory" in agent.log.read_text()
    listed = agent.answer("projects")
    assert listed["defaultProject"] is None and listed["memoryRoot"] == str(agent.root)
    assert [(p["slug"], p["runs"] > 0) for p in listed["projects"]] == [("api", True), ("web", True),
                                                                        ("web-7663e1", True)]
    expected = (f"no default project: this server was started in /, which is no project's directory under "
                f"{agent.root}; pass the `project` argument, one of: api, web, web-7663e1 (the projects tool lists "
                "them with their run counts)")
    for tool, arguments in [("search", {"query": "cart drawer"}), ("show", {"run_id": CART}),
                            ("chain", {"run_id": CART}), ("issues", {}), ("memory_block", {"task": "x"})]:
        assert agent.error(tool, **arguments) == f"Error executing tool {tool}: {expected}"
    hits = agent.answer("search", query="flaky cart drawer test", k=3, project="web")["hits"]
    assert hits[0]["runId"] == CART and ISO.fullmatch(hits[0]["endedAt"])
    assert agent.answer("show", run_id=CART[:8], project="web")["record"]["runId"] == CART
    assert (agent.root / "web" / "shown.jsonl").exists()  # what the agent fetched is kept in its project


def test_a_tilde_in_memory_dir_is_the_users_home(tmp_path, monkeypatch):
    """An MCP client starts `cybmem mcp --memory-dir ~/...` without a shell: cybmem expands the ~."""
    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(_memory(tmp_path / "elsewhere"), tmp_path / "mem")
    listed = CliRunner().invoke(app, ["projects", "--json", "--memory-dir", "~/mem"])
    assert listed.exit_code == 0 and [p["slug"] for p in json.loads(listed.stdout)] == ["api", "web", "web-7663e1"]


def test_the_read_only_server_writes_nothing_through_a_symlinked_project_dir(tmp_path):
    """A project dir that is a symbolic link out of the root: the server answers, keeps no line of
    what it showed there (shown.jsonl, its lock, the cache) and says so once on stderr."""
    root, log = _memory(tmp_path), tmp_path / "server.log"
    outside = tmp_path / "outside"
    (root / "web").rename(outside)
    (root / "web").symlink_to(outside, target_is_directory=True)
    before = {str(p.relative_to(outside)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in sorted(outside.rglob("*"))}
    params = StdioServerParameters(command=CYBMEM, args=["mcp", "--memory-dir", str(root), "--project", "web"],
                                   env=_env(tmp_path))
    with log.open("w") as errlog:
        agent = Agent(stdio_client(params, errlog=errlog), root, log)
        try:
            assert agent.answer("search", query="cart drawer", k=3)["hits"]
            assert agent.answer("show", run_id=CART[:8])["record"]["runId"] == CART
            assert agent.answer("memory_block", task="Fix the cart drawer")["runs"]
        finally:
            agent.close()
    after = {str(p.relative_to(outside)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in sorted(outside.rglob("*"))}
    assert after == before
    warned = [line for line in log.read_text().splitlines() if "warning" in line]
    assert warned == [f"cybmem mcp: warning: what agents fetch is not kept in {root / 'web' / 'shown.jsonl'}: "
                      f"{root / 'web'} is a symbolic link; cybmem writes only inside the memory root {root}. "
                      "Replace it with a real directory (see `cybmem doctor`)."], warned


# --- writes: only with --allow-writes ------------------------------------------------


def test_writes_are_refused_without_the_flag(stdio_agent):
    root = stdio_agent.root
    before = {p: p.read_bytes() for p in sorted((root / "web").rglob("*")) if p.is_file() and ".cache" not in p.parts}
    assert not WRITES & set(stdio_agent.tools())
    assert "Writes are off (the server was started without --allow-writes)" in stdio_agent.client.instructions
    assert stdio_agent.error("mark_issue", issue_id="analytics-fires-before-the-consent-banner-is-answered-on-first",
                             event="resolved") == "Unknown tool: mark_issue"
    assert stdio_agent.error("supersede", old_run_id=CART, run=make_run("x")) == "Unknown tool: supersede"
    after = {p: p.read_bytes() for p in sorted((root / "web").rglob("*")) if p.is_file() and ".cache" not in p.parts}
    assert after == before


def test_writes_with_the_flag(http_agent):
    agent, issue = http_agent, "openapi-examples-are-not-validated-in-ci"
    marked = agent.answer("mark_issue", issue_id=issue, event="resolved", by="ba559f4e", project="api",
                          detail="validated with token=s3cr3t-v4lue-123 in CI")
    assert marked["before"] == "opened" and marked["after"] == "resolved" and len(marked["written"]) == 1
    assert "s3cr3t" not in marked["written"][0]["detail"]  # redacted as `cybmem mark --detail` is
    again = agent.answer("mark_issue", issue_id=issue, event="resolved", project="api")
    assert again["written"] == [] and again["after"] == "resolved"
    assert cli_json(agent.root, "issues", "--state", "open", "--project", "api") == []
    assert "Error executing tool mark_issue: no issue 'nope' in project api; the issues tool with status='all' " \
        "lists every issue id" == \
        agent.error("mark_issue", issue_id="nope", event="resolved", project="api")
    assert "event\n  Input should be 'resolved', 'wontfix' or 'reopened'" in \
        agent.error("mark_issue", issue_id=issue, event="done", project="api")

    old = agent.answer("search", query="order history endpoint pagination", k=1, project="api")["hits"][0]["runId"]
    fixed = make_run("c0ffee00-order-history", "Add order history endpoint with cursor pagination", cwd="/home/dev/api",
                     start=int(time.time() * 1000) - 600_000)
    written = agent.answer("supersede", old_run_id=old[:8], run=fixed, project="api")
    assert written["runId"] == "c0ffee00-order-history" and written["supersedes"] == old and written["project"] == "api"
    shown = agent.answer("show", run_id=old[:8], project="api")
    assert shown["record"]["runId"] == "c0ffee00-order-history" and shown["supersededChain"] == [old]
    hits = agent.answer("search", query="order history endpoint pagination", k=3, project="api")["hits"]
    assert hits[0]["runId"] == "c0ffee00-order-history" and old not in [h["runId"] for h in hits]
    assert f"record {old} is already superseded by c0ffee00-order-history" in agent.error(
        "supersede", old_run_id=old, run={**fixed, "id": "c0ffee00-order-history-2"}, project="api")
    assert "Error executing tool supersede: no record matches 'nope'" in agent.error(
        "supersede", old_run_id="nope", run=fixed, project="api")
    assert "Error executing tool supersede: " in agent.error("supersede", old_run_id=old, run={"task": "x"}, project="api")


# --- freshness: a long-lived server sees what other processes write -------------------


def test_a_record_written_by_another_process_is_found(agent, tmp_path):
    task = f"Teach the zebrafish importer to skip byte-order marks ({agent.root.parent.name})"
    assert agent.answer("search", query="zebrafish importer", k=1)["hits"][0]["task"] != task  # the snapshot is warm
    run = write_json(tmp_path / "run.json", make_run("7e1a0000-feed", task, start=int(time.time() * 1000) - 600_000))
    write_elsewhere(agent.root, run)
    hit = agent.answer("search", query="zebrafish importer", k=1)["hits"][0]
    assert hit["runId"] == "7e1a0000-feed" and hit["task"] == task
    assert agent.answer("show", run_id="7e1a")["record"]["task"] == task
    assert agent.answer("chain", run_id="7e1a", context=1)["next"] == []


# --- the parts, in-process ---------------------------------------------------------------


def test_snapshots_are_held_while_current(tmp_path):
    from cybmem import MemoryStore, Settings
    from cybmem.store.snapshot import holding_snapshots, load_snapshot

    root = _memory(tmp_path)
    store = MemoryStore.open(Settings.from_env(memory_dir=root), project="web")
    load_snapshot(store)  # the cache is written; a records/ mtime within 2 s of it is not trusted yet
    os.utime(root / "web" / "records", ns=(time.time_ns() - 10**10,) * 2)
    load_snapshot(store)
    with holding_snapshots():
        first = load_snapshot(store)
        assert load_snapshot(store) is first and first.current()
        run = write_json(tmp_path / "run.json", make_run("7e1a0000-feed", "Fix the zebrafish importer"))
        write_elsewhere(root, run)
        assert not first.current()
        second = load_snapshot(store)
        assert second is not first and "7e1a0000-feed" in second.records.column("runId").to_pylist()
        os.utime(root / "web" / "records", ns=(time.time_ns() - 10**10,) * 2)
        third = load_snapshot(store)
        assert third.current() and load_snapshot(store) is third
        (root / "web" / "embeddings.jsonl").write_text("")
        assert not third.current() and load_snapshot(store) is not third
    assert load_snapshot(store) is not load_snapshot(store)  # outside it, every load is a load
    (root / ".nocache").write_text("")
    with holding_snapshots():
        assert load_snapshot(store) is not load_snapshot(store)  # an uncached snapshot cannot tell it went stale


def test_every_answer_goes_through_one_place(tmp_path):
    """Observers of MemoryTools see each tool call and resource read the SDK serves (what an agent fetched)."""
    import anyio

    from cybmem import Memory, Settings
    from cybmem.mcp.server import MemoryTools, build_server

    memory = MemoryTools(Memory(Settings.from_env(memory_dir=_memory(tmp_path)), project="web"))
    seen = []
    memory.observers.append(lambda name, arguments, answer: seen.append((name, arguments, answer)))
    memory.observers.append(lambda *_: 1 / 0)  # a broken observer is reported, never fails the answer

    async def agent():
        async with Client(build_server(memory)) as client:
            hits = await client.call_tool("search", {"query": "cart drawer", "k": 1})
            failed = await client.call_tool("show", {"run_id": "zzz"})
            await client.read_resource(f"cybmem://projects/web/runs/{CART[:8]}")
            return hits, failed

    hits, failed = anyio.run(agent)
    assert not hits.is_error and failed.is_error
    assert [(name, arguments) for name, arguments, _ in seen] == [
        ("search", {"query": "cart drawer", "k": 1, "project": None, "as_of": None, "explain": False}),
        ("run-record", {"project": "web", "run_id": CART[:8]}),
    ]
    assert seen[0][2] == hits.structured_content and seen[1][2]["runId"] == CART


def test_an_answer_text_is_the_json_the_cli_prints():
    """An answer's text is written by orjson: the JSON --json prints (controls escaped as it escapes
    them), but for a float in exponent form (1e-6 where --json prints 1e-06); what orjson cannot
    write (an integer past 64 bits, a lone surrogate) is written by the standard library."""
    from cybmem.mcp.server import _json
    from cybmem.store.display import printable_json

    answer = {"text": "".join(map(chr, range(0xa5))) + "\u2028\u00e9\U0001F600", "hits": [1, 2.5, None, True, {}, []],
              "runId": CART, "warnings": []}
    assert _json(answer) == printable_json(answer) and "\\u009b" in _json(answer)
    assert _json({"recency": 1e-06}) == '{\n  "recency": 1e-6\n}' and json.loads(_json({"recency": 1e-06})) == {"recency": 1e-06}
    for other in ({"big": 2 ** 70}, {"text": "\ud800"}):
        assert _json(other) == printable_json(other)


# --- the command -----------------------------------------------------------------------


def test_a_port_in_use_is_a_clear_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = cli(_memory(tmp_path), "mcp", "--http", str(port))
    assert p.exit_code == 1
    assert p.stderr.splitlines()[-1].startswith(f"Error: cannot listen on 127.0.0.1:{port}: ")
    assert p.stderr.splitlines()[-1].endswith("(choose another --http PORT, or 0 for a free one)")


def test_without_the_sdk_it_says_what_to_install(tmp_path):
    code = ("import sys; sys.modules['mcp'] = None; sys.argv = ['cybmem', 'mcp']\n"
            "from cybmem.cli.app import main\nmain()")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(tmp_path), timeout=60)
    assert p.returncode == 1
    assert p.stderr.startswith("Error: cybmem mcp needs the MCP Python SDK 2.x: pip install 'mcp>=2.3,<3' ")


def test_other_commands_do_not_import_the_sdk(tmp_path):
    code = ("import sys; sys.argv = ['cybmem', 'search', 'cart', '--project', 'web', '--memory-dir', sys.argv[1]]\n"
            "from cybmem.cli.app import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('mcp' in sys.modules, 'pydantic' in sys.modules, file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", code, str(_memory(tmp_path))], capture_output=True, text=True,
                       env=_env(tmp_path), timeout=60)
    assert p.stdout.startswith("#   SCORE  RUN") and p.stderr.strip() == "False False", p.stderr
