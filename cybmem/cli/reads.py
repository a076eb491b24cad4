"""The read commands: ``list``, ``show``, ``issues``, ``chain``, ``projects``; each calls one library
function and renders its answer."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from ..answers import issue_slug, ms_to_utc, shorten, subject_line
from ..errors import CybmemError
from .framework import Ctx, OffsetOpt, command, moment
from .render import count, echo, no_match, print_json, table, warn, when, whole, width

__all__ = ["list_cmd", "show_cmd", "issues_cmd", "chain_cmd", "projects_cmd"]


@command("list", filters=True, quick=True)
def list_cmd(
    ctx: Ctx,
    limit: Annotated[int, typer.Option("--limit", "-n", help="Show at most N records (0: all).", min=0)] = 50,
    offset: OffsetOpt = 0,
    f: Any = None,
):
    """List a project's records, newest first, a page at a time.

    Example: cybmem list --since 2024-01-01 --grep fixture --limit 20
    """
    page = ctx.memory.runs(filter=f, offset=offset, limit=limit)
    snap = page.snapshot  # a fresh load when a shown record changed in place
    warn(p.message for p in snap.problems)
    if ctx.json:
        print_json(page.items)
        return
    if not page.items:
        echo(no_match("records", snap.store.slug, f) if not page.total else page.footer("records"))
        return
    rows = [[when(e["endedAt"]), e["state"] + ("*" if e["superseded"] else ""), e["runId"][:8], e["workflowName"], e["task"]]
            for e in page.items]
    table(["ENDED (UTC)", "STATE", "RUN", "WORKFLOW", "TASK"], rows)
    if any(e["superseded"] for e in page.items):
        echo("* superseded by a later correction; `cybmem show` renders the newest truth")
    footer = page.footer("records" + (" that match" if f.active else ""))
    if footer:
        echo(footer)


def _render_record(rec, *, asked: str, chain: list[str]) -> None:
    lines = []
    if chain:
        lines.append(f"(record {asked} was superseded; showing the newest truth {rec.runId})")
    lines += [
        f"Run:        {rec.runId}",
        f"State:      {rec.state}",
        f"Workflow:   {rec.workflowName}",
        f"Project:    {rec.cwd}",
        f"Started:    {when(rec.startedAt)} UTC",
        f"Ended:      {when(rec.endedAt)} UTC ({(rec.endedAt - rec.startedAt) / 1000:.0f}s)",
    ]
    lin = rec.lineage
    for label, value in (("Previous", lin.previousRunId), ("Parent", lin.parentRunId), ("Root", lin.rootRunId), ("Chat", lin.chatSessionId)):
        if value:
            lines.append(f"{label + ':':<12}{value}")
    if rec.supersedes:
        lines.append(f"Supersedes: {rec.supersedes}")
    if rec.supersededBy:
        lines.append(f"Superseded by: {rec.supersededBy}")
    if rec.verdictSummary:
        lines.append(f"Verdict:    {rec.verdictSummary}")
    if rec.workers:
        lines.append("Workers:    " + ", ".join(f"{w.agentId} ({w.provider + ', ' if w.provider else ''}{w.state})" for w in rec.workers))
    lines += ["", "Task:"] + ["  " + line for line in rec.task.splitlines()]
    lines += ["", "Summary:", "  " + rec.outcome.summary]
    for title, items in (("Accomplished", rec.outcome.accomplished), ("Issues", rec.outcome.issues), ("Next", rec.outcome.next)):
        lines.append(f"{title}:")
        lines += [f"  - {i}" for i in items] or ["  - none"]
    for title, items in (("Files edited", rec.files), ("Commands run", rec.commands)):  # optional: an agent's turn
        if items:
            lines.append(f"{title}:")
            lines += [f"  - {' '.join(i.split())}" for i in items]
    echo("\n".join(lines))


@command("show", quick=True)
def show_cmd(
    ctx: Ctx,
    run_id: Annotated[str, typer.Argument(help="Run id or a unique prefix of it.")],
    original: Annotated[bool, typer.Option("--original", help="Show the asked record even if a later one supersedes it.")] = False,
):
    """Show one record in full, following supersession to the newest truth.

    Example: cybmem show 3f2a
    """
    store = ctx.memory.store()
    shown = ctx.memory.show(run_id, project=store, original=original)
    warn(p.message for p in store.problems)
    if ctx.json:
        print_json(shown.to_dict())
        return
    _render_record(shown.record, asked=shown.asked, chain=shown.chain)


def _day(ms: Optional[int]) -> str:
    return "-" if ms is None else ms_to_utc(ms)[:10]


def _title(issue_id: str, title: Optional[str]) -> str:
    """An issue's title for a table; blank when the id already spells it (an id is the slug of
    its title unless the writer chose another), which leaves the room to titles that say more."""
    title = title or ""
    return "" if not title or issue_slug(title) == issue_id else title


@command("issues", quick=True)
def issues_cmd(
    ctx: Ctx,
    all_issues: Annotated[bool, typer.Option("--all", help="Every issue, also those closed longer ago than the window.")] = False,
    events: Annotated[bool, typer.Option("--events", help="The raw ledger instead: every event in file order.")] = False,
    state: Annotated[Optional[str], typer.Option("--state", help="Only issues in this state: open, closed, opened, reopened, resolved, wontfix (comma-separated for several); with --events, events of that kind.", show_default=False)] = None,
    since: Annotated[Optional[str], typer.Option("--since", help="Only issues with an event at or after this moment (ISO or epoch ms); with --events, events at or after it.", show_default=False)] = None,
    until: Annotated[Optional[str], typer.Option("--until", help="Only issues opened at or before this moment (a bare date counts whole); with --events, events at or before it.", show_default=False)] = None,
    grep: Annotated[Optional[str], typer.Option("--grep", help="Only issues whose title, detail or id contains this text (case-insensitive).", show_default=False)] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", help="Show at most N (0: all).", min=0)] = 50,
    offset: OffsetOpt = 0,
    as_of: Annotated[Optional[str], typer.Option("--as-of", help="The ledger as it was at this moment (ISO or epoch ms); the window is measured from then.", show_default=False)] = None,
    oldest_first: Annotated[bool, typer.Option("--oldest-first", help="Open issues oldest opened first (default: newest first).")] = False,
    query: Annotated[Optional[str], typer.Option("--query", help="Rank the open issues against this text with the scorer the MEMORY block uses: best first, each with its score.", show_default=False)] = None,
):
    """List a project's issues (the fold of the issue ledger): open ones, and those closed recently.

    Open issues come first, newest opened first (--oldest-first: oldest first), then the closed
    ones, most recently closed first. A resolved (or wontfix) issue stays in the view for
    CYBERINE_MEMORY_ISSUE_WINDOW_DAYS days (default 90) after it closed; --all shows every issue,
    --events the ledger itself (in file order).

    Example: cybmem issues --state open --grep flaky
    """
    if query is not None:
        return _ranked_issues(ctx, query, at=moment(as_of, "--as-of"), offset=offset, limit=limit,
                              refused=[flag for flag, on in (("--events", events), ("--all", all_issues), ("--state", state),
                                       ("--since", since), ("--until", until), ("--grep", grep), ("--oldest-first", oldest_first)) if on])
    if events and (all_issues or oldest_first):
        flag = "--all" if all_issues else "--oldest-first"
        raise typer.BadParameter(f"--events lists every ledger event, in file order; {flag} is for the issue view", param_hint=flag)
    lo, hi = moment(since, "--since"), moment(until, "--until", end_of_day=True)
    at = moment(as_of, "--as-of")
    try:
        f = ctx.memory.issue_filter(state=state, since=lo, until=hi, grep=grep, all=all_issues or events)
    except CybmemError as exc:
        raise typer.BadParameter(str(exc), param_hint="--state") from None
    window = f.window_days
    store = ctx.memory.store()
    got = ctx.memory.issues(f, project=store, events=events, as_of=at, offset=offset, limit=limit,
                            newest_first=not oldest_first)
    warn(got.warnings)
    page = got.page
    if ctx.json:
        print_json([item.to_dict() for item in page.items])
        return
    noun = "events" if events else "issues"
    hint = f"{got.hidden} closed more than {window} days ago not shown (--all shows them)." if got.hidden else None
    if not page.items:
        if page.total:
            echo(page.footer(noun))
        elif events:
            echo(f"No ledger events in project {store.slug} match." if lo is not None or hi is not None or f.states or grep
                  else f"The issue ledger of project {store.slug} is empty.")
        elif not (state or lo or hi or grep):
            echo(f"No open issues in project {store.slug}" + (f", none closed in the last {window} days." if window else "."))
        else:
            echo(f"No issues in project {store.slug} match.")
        if hint:
            echo(hint)
        return
    if events:
        rows = [[when(e.at), e.event, e.issueId, (e.byRunId or "-")[:8], _title(e.issueId, e.title or got.titles.get(e.issueId))]
                for e in page.items]
        table(["AT (UTC)", "EVENT", "ISSUE", "BY", "TITLE"], rows, fit=shorten)
    else:
        rows = [[s.issueId, _day(s.openedAt), (s.openedBy or "-")[:8], s.state, _day(s.resolvedAt), _title(s.issueId, s.title)]
                for s in page.items]
        table(["ISSUE", "OPENED (UTC)", "BY", "STATE", "CLOSED", "TITLE"], rows, fit=shorten)
    for line in (page.footer(noun), hint):
        if line:
            echo(line)


def _ranked_issues(ctx: Ctx, query: str, *, at: Optional[int], offset: int, limit: int, refused: list[str]) -> None:
    """`cybmem issues --query`: the open issues ranked against the text (the MCP issues tool's answer)."""
    if refused:
        raise typer.BadParameter(f"--query ranks the open issues; {refused[0]} is for the issue view (leave one of them out)",
                                 param_hint=refused[0])
    if not query.strip():
        raise typer.BadParameter("give the text to rank the open issues against", param_hint="--query")
    store = ctx.memory.store()
    got = ctx.memory.issues(project=store, query=query, as_of=at, offset=offset, limit=limit)
    warn(got.warnings)
    ranked = got.page.items
    if ctx.json:
        print_json([issue.to_dict() for issue in ranked])
        return
    if not got.page.total:
        echo(f"No open issues in project {store.slug}.")
        return
    rows = [[f"{offset + i + 1}", f"{r.chosen.score:.3f}", r.state.issueId, _day(r.state.openedAt), (r.state.openedBy or "-")[:8],
             _title(r.state.issueId, r.state.title)] for i, r in enumerate(ranked)]
    if rows:
        table(["#", "SCORE", "ISSUE", "OPENED (UTC)", "BY", "TITLE"], rows, fit=shorten)
    footer = got.page.footer("open issues")
    if footer:
        echo(footer)


def _context(value: str) -> Optional[int]:
    if value.strip().lower() == "all":
        return None
    try:
        n = int(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is neither a number of runs nor 'all'", param_hint="--context") from None
    if n < 0:
        raise typer.BadParameter("give 0 or more runs (0 or 'all': the whole chain)", param_hint="--context")
    return n or None


@command("chain", filters=True, quick=True)
def chain_cmd(
    ctx: Ctx,
    run_id: Annotated[str, typer.Argument(help="Run id or a unique prefix of it.")],
    context: Annotated[str, typer.Option("--context", "-C", help="Runs shown each side of the run (0 or all: the whole chain).")] = "5",
    limit: Annotated[int, typer.Option("--limit", "-n", help="Page through the chain oldest first instead: at most N runs (0: to the end).", min=0)] = 0,
    offset: OffsetOpt = 0,
    f: Any = None,
):
    """Walk the previousRunId chain both ways from a run, with its parent and chat links.

    Shows --context runs each side of the run (default 5) and says how many more there are;
    filters keep only the chain's runs that match (the run itself always shows).

    Example: cybmem chain 3f2a --context 10 --grep fixture
    """
    n_context = _context(context)
    store = ctx.memory.store()
    result = ctx.memory.chain(run_id, project=store, filter=f, context=n_context, offset=offset, limit=limit,
                              whole_tasks=not ctx.json)
    warn(p.message for p in store.problems)
    if ctx.json:
        print_json(result.to_dict())
        return
    tasks = result.tasks
    room = max(width() - 42, 24)
    if result.omitted_before:
        echo(f"   ... {count(result.omitted_before, 'earlier run')}")
    for entry in result.runs:
        mark = "->" if entry["runId"] == result.run_id else "  "
        echo(f"{mark} {when(entry['endedAt'])}  {entry['state']:<9}  {entry['runId'][:8]}  {subject_line(tasks.get(entry['runId'], entry['task']), room)}")
    if result.omitted_after:
        echo(f"   ... {count(result.omitted_after, 'later run')}")
    extra = []
    if result.omitted_before or result.omitted_after or result.unmatched:
        parts = [f"{len(result.runs)} of the chain's {result.length} runs shown"]
        if result.unmatched:
            parts.append(f"{result.unmatched} do not match ({f.describe()})")
        more = "--context all" if not (offset or limit) else "--limit 0"
        extra.append("; ".join(parts) + (f"; {more} shows the rest" if result.omitted_before or result.omitted_after else "") + ".")
    if result.parent:
        extra.append(f"parent: {result.parent}" + ("" if result.parent_known else " (not in this project)"))
    if result.root:
        extra.append(f"root: {result.root}")
    if result.children:
        extra.append("dispatched: " + ", ".join(c[:8] for c in result.children))
    if result.chat_session:
        extra.append(f"chat session: {result.chat_session} ({len(result.chat_runs)} runs: " + ", ".join(c[:8] for c in result.chat_runs) + ")")
    if result.open_issues:
        extra.append("open issues raised: " + ", ".join(result.open_issues))
    for line in extra:
        echo(line)


@command("projects", project=False, quick=True)
def projects_cmd(ctx: Ctx):
    """List the projects of a memory root with their slugs and record counts.

    Example: cybmem projects
    """
    projects = ctx.memory.projects()
    if ctx.json:
        print_json(projects)
        return
    if not projects:
        echo("No projects yet.")
        return
    table(["SLUG", "RECORDS", "CWD"], [[p["slug"], str(p["records"]), p["cwd"] or "?"] for p in projects], fit=whole)

