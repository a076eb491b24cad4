"""``cybmem mcp``: the command that starts the MCP server, the second front (:mod:`cybmem.mcp.server`)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..memory import Memory
from .framework import Ctx, command

__all__ = ["mcp_cmd"]


@command("mcp", as_json=False)
def mcp_cmd(
    ctx: Ctx,
    http: Annotated[Optional[int], typer.Option("--http", metavar="PORT", help="Serve streamable HTTP at http://127.0.0.1:PORT/mcp instead of stdio (0: a free port, named on stderr).", min=0, max=65535, show_default=False)] = None,
    allow_writes: Annotated[bool, typer.Option("--allow-writes", help="Also offer the write tools: mark_issue and supersede (off: the server never writes a record or a ledger line).")] = False,
):
    """Serve the memory root to agents over the Model Context Protocol (MCP), on stdio or --http PORT.

    Tools: projects, search, show, chain, issues, memory_block (what inject --system prints); with
    --allow-writes also mark_issue and supersede. Resources: a project's open issues and a run's
    record. --project / --cwd choose the default project (none when started outside a project:
    each call names one); each call may name another. Over HTTP only the origin
    http://127.0.0.1:PORT is served, a request must arrive whole within 5 seconds, a session that
    asks nothing ends after 30 seconds and a client that takes none of its answer for 10 seconds
    is cut off (the CYBERINE_MEMORY_MCP_* variables). Add it to an MCP client's configuration as
    the command `cybmem mcp` (USAGE.md, "Memory for agents mid-run").

    Example: cybmem mcp --project web
    """
    from ..mcp.server import serve

    # A default that only looks like a project (web.7663e1 beside web-7663e1) is refused here, as every
    # verb refuses it, not served for every tool call to refuse; a new name is fine (a write may make it).
    ctx.memory.check_project()
    # The server holds each project's snapshot between calls (cybmem.memory.Memory's hold).
    serve(Memory(ctx.settings, cwd=ctx.cwd, project=ctx.project, hold=True), http=http, allow_writes=allow_writes)

