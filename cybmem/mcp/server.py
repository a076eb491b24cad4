"""``cybmem mcp``: one memory root served to agents over the Model Context Protocol.

The MEMORY block reaches an agent once, at dispatch; through MCP an agent can look memory up
when it needs to, mid-run. Built on the official MCP Python SDK (``mcp`` 2.x, its
:class:`~mcp.server.mcpserver.MCPServer`), over stdio, or streamable HTTP on 127.0.0.1
(:mod:`cybmem.mcp.http`). Each tool is a method of :class:`cybmem.mcp.tools.MemoryTools` that answers
with what the CLI prints under ``--json``, as structured content and as JSON text (:func:`_json`:
the layout of :func:`cybmem.answers.printable_json`, written by orjson); the write tools are
offered only with ``--allow-writes``. The server holds its handle's snapshots while it runs
(:class:`cybmem.memory.Memory` with ``hold``: snapshots stay warm between calls while the cache is fresh). Calls are answered on the event loop
(a worker thread's switches cost more than a call: benchmarks/bench_mcp.py), and :func:`serve`
keeps each answer in shown.jsonl (:meth:`cybmem.memory.Memory.fetch_observer`). Tools and
resources: USAGE.md, "Memory for agents mid-run".
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated

import orjson

from .. import __version__
from ..answers import json_controls_escaped, printable_json
from ..errors import CybmemError
from ..memory import Memory
from .http import listen, serve_http
from .schema import Answer
from .tools import MemoryTools

# after .tools, which says what to install when the MCP SDK is missing
from mcp.server.mcpserver import MCPServer  # noqa: E402
from mcp.types import CallToolResult, TextContent, ToolAnnotations  # noqa: E402

__all__ = ["MemoryTools", "build_server", "serve"]


_READS = ("projects", "search", "show", "chain", "issues", "memory_block")
_WRITES = ("mark_issue", "supersede")
_TITLES = {"projects": "List projects", "search": "Search past runs", "show": "Show a run's record", "chain": "A run's chain",
           "issues": "Issues", "memory_block": "MEMORY block for a task", "mark_issue": "Mark an issue",
           "supersede": "Correct a record"}


def _json(answer: Answer) -> str:
    """An answer as the indented JSON --json prints (:func:`printable_json`), written by orjson: the
    standard library's encoder indents in Python, a tenth of a millisecond for a search's answer,
    which this cuts to a hundredth (benchmarks/RESULTS.md, "The MCP server"). The same fields, values
    and layout; a float in exponent form reads ``1e-6`` where --json prints ``1e-06``. What orjson
    does not write (an integer past 64 bits, a lone surrogate) goes through the standard library."""
    try:
        text = orjson.dumps(answer, option=orjson.OPT_INDENT_2).decode()
    except TypeError:  # orjson.JSONEncodeError
        return printable_json(answer)
    return json_controls_escaped(text)


def _text(name: str, answer: Answer) -> str:
    """The text of an answer: the block itself for memory_block, else the JSON that --json prints."""
    if name != "memory_block":
        return _json(answer)
    if answer["block"]:
        return answer["block"]
    return "\n".join([f"No MEMORY block for this task in project {answer['project']}."] + answer["warnings"])


def _unless_stopping(stopping: threading.Event | None, fn: Callable[[], Answer]) -> Callable[[], Answer]:
    """``fn``, refused once the server is stopping: the calls queued behind the one being answered
    then take no time (each is answered on the event loop, in turn: sixty slow calls queued kept a
    SIGTERM waiting for all of them)."""

    def unless() -> Answer:
        if stopping is not None and stopping.is_set():
            raise CybmemError("the server is stopping (SIGTERM); call again once it is started again")
        return fn()

    return unless


def _add_tool(server: MCPServer, memory: MemoryTools, name: str, stopping: threading.Event | None) -> None:
    method = getattr(memory, name)
    sig = inspect.signature(method, eval_str=True)

    @functools.wraps(method)
    async def tool(**arguments) -> CallToolResult:  # async: answered on the event loop (module docstring)
        answer = memory.call(name, arguments, _unless_stopping(stopping, lambda: method(**arguments)))
        return CallToolResult(content=[TextContent(type="text", text=_text(name, answer))], structured_content=answer)

    del tool.__wrapped__  # the SDK reads the signature below: the method's, answering CallToolResult checked
    tool.__signature__ = sig.replace(return_annotation=Annotated[CallToolResult, sig.return_annotation])
    write = name in _WRITES
    server.add_tool(tool, name=name, title=_TITLES[name], description=inspect.getdoc(method),
                    annotations=ToolAnnotations(title=_TITLES[name], read_only_hint=not write, destructive_hint=False,
                                                idempotent_hint=name != "supersede", open_world_hint=False))


def build_server(memory: MemoryTools, stopping: threading.Event | None = None) -> MCPServer:
    """The MCP server of ``memory``: its tools (the write tools only when ``memory.allow_writes``)
    and resources; while it runs, its handle is entered (a handle with ``hold`` keeps snapshots
    warm: module docstring). Once ``stopping`` is set (by :func:`cybmem.mcp.http.serve_http` on
    SIGTERM), every call is refused."""

    @contextlib.asynccontextmanager
    async def lifespan(_server: MCPServer) -> AsyncIterator[dict]:
        with memory.memory:
            yield {}

    writes = ("on: mark_issue and supersede append to the store" if memory.allow_writes
              else "off (the server was started without --allow-writes)")
    server = MCPServer(
        "cybmem", version=__version__, lifespan=lifespan, log_level="WARNING",
        instructions=(f"Long-term memory of past coding-agent runs under {memory.settings.memory_dir}: what each run "
                      "was asked, what it did, the issues it left open, and how runs follow one another. Search it "
                      "before starting work and whenever a past run may have met the same problem; pass the runIds "
                      "it returns to show (the whole record) or chain (the runs around it); issues lists the known "
                      "problems; memory_block gives the preamble dispatch would give a task. Every tool takes "
                      "`project`; projects lists them and says which one is used when it is left out. Times are "
                      f"ISO 8601 in UTC. Writes are {writes}."),
    )
    for name in _READS + (_WRITES if memory.allow_writes else ()):
        _add_tool(server, memory, name, stopping)

    @server.resource("cybmem://projects/{project}/issues", name="open-issues", title="A project's open issues",
                     description=inspect.getdoc(memory.open_issues), mime_type="application/json")
    async def open_issues(project: str) -> str:
        arguments = {"project": project}
        fn = _unless_stopping(stopping, lambda: memory.open_issues(project))
        return printable_json(memory.call("open-issues", arguments, fn, resource=True))

    @server.resource("cybmem://projects/{project}/runs/{run_id}", name="run-record", title="A run's record",
                     description=inspect.getdoc(memory.record), mime_type="application/json")
    async def run_record(project: str, run_id: str) -> str:
        arguments = {"project": project, "run_id": run_id}
        fn = _unless_stopping(stopping, lambda: memory.record(project, run_id))
        return printable_json(memory.call("run-record", arguments, fn, resource=True))

    return server


def serve(memory: Memory, *, http: int | None = None, allow_writes: bool = False) -> None:
    """Run ``cybmem mcp`` on the handle ``memory`` (its root, its default project; ``hold`` keeps
    snapshots between calls): over stdio, or streamable HTTP at http://127.0.0.1:PORT/mcp
    (``http``; 0 takes a free port). One line on stderr says what is served and where; returns
    when the client closes stdin, or on Ctrl-C / SIGTERM."""
    import anyio

    # Plain lines on stderr, before the SDK would set up its rich handler: printing through that one
    # imports modules as it goes, which fails (and took the server down) once descriptors run out.
    logging.basicConfig(level=logging.WARNING, format="cybmem mcp: %(levelname)s: %(name)s: %(message)s")
    tools = MemoryTools(memory, allow_writes=allow_writes)
    tools.observers.append(memory.fetch_observer(tools.store))  # what agents fetch, kept in shown.jsonl
    stopping = threading.Event()
    server = build_server(tools, stopping)
    project = memory.project
    where, slug = Path(memory.cwd or os.getcwd()).absolute(), project or tools.default_project()
    default = (f"default project {project}" if project else f"default project {slug} (of {where})" if slug else
               f"no default project ({where} is no project's directory: each call names one)")
    what = f"cybmem mcp: memory root {memory.root}, {default}, writes {'on' if allow_writes else 'off'}"
    try:
        if http is None:
            print(f"{what}; serving over stdio", file=sys.stderr, flush=True)
            server.run()
        else:
            sock = listen(http)
            for problem in memory.settings.mcp.problems:
                print(f"cybmem mcp: warning: {problem}", file=sys.stderr, flush=True)
            print(f"{what}; serving streamable HTTP at http://127.0.0.1:{sock.getsockname()[1]}/mcp",
                  file=sys.stderr, flush=True)
            anyio.run(serve_http, server, sock, memory.settings.mcp, stopping)
    except KeyboardInterrupt:
        pass
