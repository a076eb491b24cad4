"""The ``cybmem`` command line: each command parses, calls one library function, renders.

Errors from the library (CybmemError) print ``Error: ...`` on stderr and exit 1;
usage mistakes exit 2 (Click). Heavy modules are imported inside the commands
that need them, so the write and inject paths never pay for pandas or matplotlib.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from .errors import CybmemError
from .outcome import head_line
from .schema import ms_to_utc
from .settings import Settings

app = typer.Typer(
    name="cybmem",
    help="Long-term memory for a coding-agent orchestrator: episodic run records, an issue ledger, "
    "lineage, retrieval and the MEMORY preamble.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

MemoryDirOpt = Annotated[
    Optional[Path],
    typer.Option("--memory-dir", help="Memory root (default: $CYBERINE_MEMORY_DIR, else $CYBERINE_HOME/memory, else ~/.cyberine/memory).", show_default=False),
]
CwdOpt = Annotated[Optional[Path], typer.Option("--cwd", help="Project directory whose memory to use (default: the current directory).", show_default=False)]
ProjectOpt = Annotated[Optional[str], typer.Option("--project", "-p", help="Project slug to use instead of resolving --cwd (see `cybmem projects`).", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def _handle(fn):
    """Translate library errors into ``Error: ...`` on stderr and exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except CybmemError as exc:
            typer.echo(f"Error: {exc}", err=True)
            raise typer.Exit(1) from None
        except BrokenPipeError:
            raise typer.Exit(0) from None

    return wrapper


def _settings(memory_dir: Optional[Path]) -> Settings:
    return Settings.from_env(memory_dir=memory_dir)


def _store(memory_dir, cwd, project, *, create: bool = False):
    from .store import MemoryStore

    return MemoryStore.open(_settings(memory_dir), cwd=cwd, project=project, create=create)


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return ms_to_utc(ms)


def _print_json(data) -> None:
    typer.echo(json.dumps(data, indent=2, ensure_ascii=False))


def _table(headers: list[str], rows: list[list[str]], *, last_wide: bool = True) -> None:
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row[:-1] if last_wide else row):
            widths[i] = max(widths[i], len(cell))
    fmt = lambda cells: "  ".join(c.ljust(widths[i]) if i < len(cells) - 1 else c for i, c in enumerate(cells)).rstrip()  # noqa: E731
    typer.echo(fmt(headers))
    for row in rows:
        typer.echo(fmt(row))


def _head(text: str, limit: int = 72) -> str:
    return head_line(text, limit)


def _warn_problems(store) -> None:
    store.report_problems(sys.stderr)


# --- read verbs -------------------------------------------------------------------


@app.command("list")
@_handle
def list_cmd(
    limit: Annotated[int, typer.Option("--limit", "-n", help="Show at most N records (0: all).", min=0)] = 0,
    state: Annotated[Optional[str], typer.Option("--state", help="Only records in this state: done, error or cancelled.")] = None,
    memory_dir: MemoryDirOpt = None,
    cwd: CwdOpt = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
):
    """List a project's records, newest first.

    Example: cybmem list --limit 5
    """
    if state is not None and state not in ("done", "error", "cancelled"):
        raise typer.BadParameter(f"{state!r} is not one of done, error, cancelled", param_hint="--state")
    store = _store(memory_dir, cwd, project)
    entries = store.index_entries()
    if state:
        entries = [e for e in entries if e["state"] == state]
    if limit:
        entries = entries[:limit]
    _warn_problems(store)
    if as_json:
        _print_json(entries)
        return
    if not entries:
        typer.echo(f"No records in project {store.slug}.")
        return
    rows = [
        [_when(e["endedAt"]), e["state"] + ("*" if e.get("supersededBy") else ""), e["runId"][:8], e.get("workflowName", ""), _head(e.get("task", ""))]
        for e in entries
    ]
    _table(["ENDED (UTC)", "STATE", "RUN", "WORKFLOW", "TASK"], rows)
    if any(e.get("supersededBy") for e in entries):
        typer.echo("* superseded by a later correction; `cybmem show` renders the newest truth")


def _render_record(rec, *, asked: str, chain: list[str]) -> None:
    lines = []
    if chain:
        lines.append(f"(record {asked} was superseded; showing the newest truth {rec.runId})")
    lines += [
        f"Run:        {rec.runId}",
        f"State:      {rec.state}",
        f"Workflow:   {rec.workflowName}",
        f"Project:    {rec.cwd}",
        f"Started:    {_when(rec.startedAt)} UTC",
        f"Ended:      {_when(rec.endedAt)} UTC ({(rec.endedAt - rec.startedAt) / 1000:.0f}s)",
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
    typer.echo("\n".join(lines))


@app.command("show")
@_handle
def show_cmd(
    run_id: Annotated[str, typer.Argument(help="Run id or a unique prefix of it.")],
    original: Annotated[bool, typer.Option("--original", help="Show the asked record even if a later one supersedes it.")] = False,
    memory_dir: MemoryDirOpt = None,
    cwd: CwdOpt = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
):
    """Show one record in full, following supersession to the newest truth.

    Example: cybmem show 3f2a
    """
    from .lineage import supersession_chain

    store = _store(memory_dir, cwd, project)
    asked = store.resolve_run_id(run_id)
    chain = [] if original else supersession_chain(store, asked)
    rec = store.read_record(chain[-1] if chain else asked)
    _warn_problems(store)
    if as_json:
        data = rec.to_dict()
        if chain:
            data = {**data, "_supersededChain": [asked] + chain[:-1]}
        _print_json(data)
        return
    _render_record(rec, asked=asked, chain=chain)


@app.command("issues")
@_handle
def issues_cmd(
    all_events: Annotated[bool, typer.Option("--all", help="Print the whole ledger, every event in file order.")] = False,
    memory_dir: MemoryDirOpt = None,
    cwd: CwdOpt = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
):
    """List a project's open issues (the fold of the issue ledger).

    Example: cybmem issues --all
    """
    store = _store(memory_dir, cwd, project)
    if all_events:
        events = store.issue_events()
        _warn_problems(store)
        if as_json:
            _print_json([e.to_dict() for e in events])
            return
        titles = {k: v.title for k, v in store.issue_states().items()}
        rows = [[_when(e.at), e.event, e.issueId, (e.byRunId or "-")[:8], _head(e.title or titles.get(e.issueId, ""), 60)] for e in events]
        if not rows:
            typer.echo(f"The issue ledger of project {store.slug} is empty.")
            return
        _table(["AT (UTC)", "EVENT", "ISSUE", "BY", "TITLE"], rows)
        return
    issues = store.open_issues()
    _warn_problems(store)
    if as_json:
        _print_json([s.to_dict() for s in issues])
        return
    if not issues:
        typer.echo(f"No open issues in project {store.slug}.")
        return
    rows = [[s.issueId, _when(s.openedAt), (s.openedBy or "-")[:8], s.state, _head(s.title, 60)] for s in issues]
    _table(["ISSUE", "OPENED (UTC)", "BY", "STATE", "TITLE"], rows)


@app.command("chain")
@_handle
def chain_cmd(
    run_id: Annotated[str, typer.Argument(help="Run id or a unique prefix of it.")],
    memory_dir: MemoryDirOpt = None,
    cwd: CwdOpt = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
):
    """Walk the previousRunId chain both ways from a run, with its parent and chat links.

    Example: cybmem chain 3f2a
    """
    from .lineage import chain

    store = _store(memory_dir, cwd, project)
    result = chain(store, store.resolve_run_id(run_id))
    _warn_problems(store)
    if as_json:
        _print_json(result.to_dict())
        return
    for entry in result.runs:
        mark = "->" if entry["runId"] == result.run_id else "  "
        typer.echo(f"{mark} {_when(entry['endedAt'])}  {entry['state']:<9}  {entry['runId'][:8]}  {_head(entry['task'], 60)}")
    extra = []
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
        typer.echo(line)


@app.command("projects")
@_handle
def projects_cmd(memory_dir: MemoryDirOpt = None, as_json: JsonOpt = False):
    """List the projects of a memory root with their slugs and record counts.

    Example: cybmem projects
    """
    from .projects import list_projects

    projects = list_projects(_settings(memory_dir).memory_dir)
    if as_json:
        _print_json(projects)
        return
    if not projects:
        typer.echo("No projects yet.")
        return
    _table(["SLUG", "RECORDS", "CWD"], [[p["slug"], str(p["records"]), p["cwd"] or "?"] for p in projects])


# --- write verbs ------------------------------------------------------------------


@app.command("rebuild")
@_handle
def rebuild_cmd(memory_dir: MemoryDirOpt = None, cwd: CwdOpt = None, project: ProjectOpt = None, as_json: JsonOpt = False):
    """Regenerate index.json from records/ alone (deleting index.json loses nothing).

    Example: cybmem rebuild --project web
    """
    store = _store(memory_dir, cwd, project)
    count = store.rebuild_index()
    _warn_problems(store)
    if as_json:
        _print_json({"project": store.slug, "records": count, "index": str(store.index_path)})
    else:
        typer.echo(f"Rebuilt {store.index_path} from {count} records.")


def _read_input(source: str) -> bytes:
    if source == "-":
        return sys.stdin.buffer.read()
    path = Path(source)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise typer.BadParameter(f"no such file: {source}", param_hint="RUN_JSON") from None
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {source}: {exc}", param_hint="RUN_JSON") from None


@app.command("write")
def write_cmd(
    run_json: Annotated[Optional[str], typer.Argument(help="Path to the run.json to record, or - for stdin.", show_default=False)] = None,
    hook: Annotated[bool, typer.Option("--hook", help="Hook mode: read the JSON payload on stdin; never fail the run (warn on stderr, exit 0).")] = False,
    run_id: Annotated[Optional[str], typer.Option("--run-id", help="Run id (default: the run's own, else $CYBERINE_RUN_ID).")] = None,
    parent: Annotated[Optional[str], typer.Option("--parent", help="Parent run id (default: the run's lineage, else $CYBERINE_PARENT_RUN_ID).")] = None,
    chat: Annotated[Optional[str], typer.Option("--chat", help="Chat session id (default: the run's lineage, else $CYBERINE_CHAT_SESSION_ID).")] = None,
    memory_dir: MemoryDirOpt = None,
    cwd: CwdOpt = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
):
    """Record a finished run: strip the MEMORY block, extract the outcome, link lineage, append issues.

    Example: cybmem write .local/runs/3f2a/run.json
    """
    from .runs import load_run_payload, write_run

    if run_json is None and not hook:
        raise typer.BadParameter("give a run.json path, - for stdin, or --hook", param_hint="RUN_JSON")
    try:
        data = _read_input(run_json or "-")
        payload = load_run_payload(data)
        result = write_run(
            payload, _settings(memory_dir), cwd=str(cwd) if cwd else None, project=project,
            run_id=run_id, parent_run_id=parent, chat_session_id=chat,
        )
    except (CybmemError, typer.BadParameter, OSError) as exc:
        if hook:
            typer.echo(f"cybmem: warning: memory record not written: {exc}", err=True)
            raise typer.Exit(0) from None
        if isinstance(exc, typer.BadParameter):
            raise
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(1) from None
    except Exception as exc:  # a memory failure must never take the run down
        if hook:
            typer.echo(f"cybmem: warning: memory record not written (unexpected {type(exc).__name__}: {exc})", err=True)
            raise typer.Exit(0) from None
        raise
    if result.redacted:
        typer.echo(f"cybmem: redacted secrets before writing: {', '.join(result.redacted)}", err=True)
    if as_json:
        _print_json(result.to_dict())
        return
    opened = [e.issueId for e in result.events if e.event in ("opened", "reopened")]
    resolved = [e.issueId for e in result.events if e.event in ("resolved", "wontfix")]
    msg = f"Wrote {result.record.runId} ({result.record.state}) to project {result.store.slug}"
    if opened:
        msg += f"; opened {', '.join(opened)}"
    if resolved:
        msg += f"; resolved {', '.join(resolved)}"
    typer.echo(msg + ".")


@app.command("supersede")
@_handle
def supersede_cmd(
    old_run_id: Annotated[str, typer.Argument(help="Run id (or unique prefix) of the record to correct.")],
    run_json: Annotated[str, typer.Argument(help="The corrected run as run.json (path, or - for stdin); it needs its own new run id.")],
    run_id: Annotated[Optional[str], typer.Option("--run-id", help="Run id of the correcting record (default: the run's own).")] = None,
    memory_dir: MemoryDirOpt = None,
    cwd: CwdOpt = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
):
    """Correct a record without rewriting it: write a new record that supersedes it.

    Example: cybmem supersede 3f2a fixed-run.json --run-id 3f2a-fix
    """
    from .runs import load_run_payload, write_run

    store = _store(memory_dir, cwd, project)
    old = store.resolve_run_id(old_run_id)
    payload = load_run_payload(_read_input(run_json))
    result = write_run(payload, _settings(memory_dir), cwd=str(cwd) if cwd else None, project=store.slug, run_id=run_id, supersedes=old)
    if as_json:
        _print_json({**result.to_dict(), "supersedes": old})
    else:
        typer.echo(f"Wrote {result.record.runId}, superseding {old}; `cybmem show {old}` now renders the correction.")


@app.command("mark")
@_handle
def mark_cmd(
    issue_id: Annotated[str, typer.Argument(help="Issue id (see `cybmem issues`).")],
    event: Annotated[str, typer.Argument(help="resolved, wontfix or reopened.")],
    by: Annotated[Optional[str], typer.Option("--by", help="Run id that caused the change (default: $CYBERINE_RUN_ID).")] = None,
    detail: Annotated[Optional[str], typer.Option("--detail", help="Why, in a sentence.")] = None,
    memory_dir: MemoryDirOpt = None,
    cwd: CwdOpt = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
):
    """Append a state change for an issue to the ledger (the ledger is never rewritten).

    Example: cybmem mark flaky-login-test resolved --by 3f2a9c1e
    """
    import time

    from .schema import IssueEvent

    if event not in ("resolved", "wontfix", "reopened"):
        raise typer.BadParameter(f"{event!r} is not one of resolved, wontfix, reopened", param_hint="EVENT")
    settings = _settings(memory_dir)
    store = _store(memory_dir, cwd, project)
    states = store.issue_states()
    if issue_id not in states:
        from .errors import NotFoundError

        raise NotFoundError(f"no issue {issue_id!r} in project {store.slug}; see `cybmem issues --all`")
    ev = IssueEvent(issueId=issue_id, at=int(time.time() * 1000), event=event, byRunId=by or settings.run_id,
                    title=states[issue_id].title, detail=detail)
    written = store.append_issue_events([ev])
    if as_json:
        _print_json([e.to_dict() for e in written])
    elif written:
        typer.echo(f"{issue_id}: {states[issue_id].state} -> {event}")
    else:
        typer.echo(f"{issue_id} is already {states[issue_id].state}; nothing appended.")


# --- retrieval ----------------------------------------------------------------------

AsOfOpt = Annotated[
    Optional[str],
    typer.Option("--as-of", help="Replay memory as of a moment: epoch milliseconds or an ISO date; later records are ignored and recency is measured from then.", show_default=False),
]


def _task_text(task: Optional[str], file: Optional[Path]) -> str:
    if task is not None and file is not None:
        raise typer.BadParameter("give the task as an argument or with --file, not both", param_hint="TASK")
    if file is not None:
        try:
            return file.read_text(encoding="utf-8", errors="surrogateescape")
        except OSError as exc:
            raise typer.BadParameter(f"cannot read {file}: {exc}", param_hint="--file") from None
    if task is None or task == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise typer.BadParameter("give the task as an argument, with --file, or on stdin", param_hint="TASK")
        return sys.stdin.read()
    return task


def _fmt_axes(contrib: dict) -> str:
    short = {"keyword": "kw", "recency": "rec", "lineage": "lin", "vector": "vec"}
    return " ".join(f"{short.get(k, k)}={v:.3f}" for k, v in contrib.items() if v or k != "vector")


@app.command("search")
@_handle
def search_cmd(
    query: Annotated[str, typer.Argument(help="What to look for (free text, e.g. the new task).")],
    k: Annotated[int, typer.Option("-k", "--top", help="How many results.", min=1)] = 10,
    explain_: Annotated[bool, typer.Option("--explain", help="Show each result's per-axis contributions and the weights.")] = False,
    as_of: AsOfOpt = None,
    parent: Annotated[Optional[str], typer.Option("--parent", help="Parent run id of the run being dispatched (default: $CYBERINE_PARENT_RUN_ID).")] = None,
    chat: Annotated[Optional[str], typer.Option("--chat", help="Chat session id (default: $CYBERINE_CHAT_SESSION_ID).")] = None,
    memory_dir: MemoryDirOpt = None,
    cwd: CwdOpt = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
):
    """Multi-axis scored search over a project's records (BM25 + recency + lineage).

    Example: cybmem search "flaky cart drawer test" -k 5 --explain
    """
    from .search import parse_as_of, search

    settings = _settings(memory_dir)
    store = _store(memory_dir, cwd, project)
    result = search(store, query, k=k, settings=settings, as_of=parse_as_of(as_of),
                    parent_run_id=parent or settings.parent_run_id, chat_session_id=chat or settings.chat_session_id)
    for p in result.snapshot.problems:
        typer.echo(f"warning: {p.message}", err=True)
    if as_json:
        _print_json(result.to_dict(explain=explain_))
        return
    if not result.hits:
        typer.echo(f"No matching records in project {store.slug}.")
        return
    rows = []
    for h in result.hits:
        row = [str(h.rank), f"{h.score:.3f}", h.run_id[:8], _when(h.ended_at_ms), h.state, _head(h.task, 60)]
        rows.append(row)
    _table(["#", "SCORE", "RUN", "ENDED (UTC)", "STATE", "TASK"], rows)
    if explain_:
        w = result.weights
        typer.echo("")
        typer.echo(f"weights: w_kw={w.w_kw:g} w_rec={w.w_rec:g} w_lin={w.w_lin:g} w_vec={w.w_vec:g} half_life_days={w.half_life_days:g}"
                   + (f"  as of {_when(result.as_of)} UTC" if result.as_of is not None else ""))
        for h in result.hits:
            typer.echo(f"{h.rank:>2}. {h.run_id[:8]}  {_fmt_axes(h.contributions)}  = {h.score:.3f}")


@app.command("inject")
@_handle
def inject_cmd(
    task: Annotated[Optional[str], typer.Argument(help="The task prompt (or - for stdin; stdin is also read when omitted).", show_default=False)] = None,
    file: Annotated[Optional[Path], typer.Option("--file", "-f", help="Read the task from this file.")] = None,
    system: Annotated[bool, typer.Option("--system", help="Print only the MEMORY block (for a chat session's system message).")] = False,
    as_of: AsOfOpt = None,
    parent: Annotated[Optional[str], typer.Option("--parent", help="Parent run id of the run being dispatched (default: $CYBERINE_PARENT_RUN_ID).")] = None,
    chat: Annotated[Optional[str], typer.Option("--chat", help="Chat session id (default: $CYBERINE_CHAT_SESSION_ID).")] = None,
    memory_dir: MemoryDirOpt = None,
    cwd: CwdOpt = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
):
    """Print the task with the MEMORY preamble ahead of it (what dispatch sends to the agent).

    Bounded by CYBERINE_MEMORY_TOPK and CYBERINE_MEMORY_MAX_TOKENS; CYBERINE_MEMORY=0 turns it off.

    Example: cybmem inject "Fix the checkout error banner" --cwd ~/web
    """
    from .errors import NotFoundError
    from .preamble import inject as put_ahead
    from .search import memory_block, parse_as_of

    text = "" if system and task is None and file is None else _task_text(task, file)
    settings = _settings(memory_dir)
    block = ""
    if settings.enabled:
        try:
            store = _store(memory_dir, cwd, project)
        except NotFoundError:
            store = None  # a project with no memory gets no block
        if store is not None:
            block = memory_block(store, text, settings, as_of=parse_as_of(as_of), parent_run_id=parent, chat_session_id=chat)
            _warn_problems(store)
    if as_json:
        _print_json({"block": block, "task": text, "prompt": put_ahead(text, block)})
        return
    if system:
        if block:
            typer.echo(block)
        return
    sys.stdout.write(put_ahead(text, block))  # exact bytes: strip(inject(task)) == task
    sys.stdout.flush()


@app.command("strip")
@_handle
def strip_cmd(
    task: Annotated[Optional[str], typer.Argument(help="Text to clean (or - for stdin; stdin is also read when omitted).", show_default=False)] = None,
    file: Annotated[Optional[Path], typer.Option("--file", "-f", help="Read the text from this file.")] = None,
    as_json: JsonOpt = False,
):
    """Remove the MEMORY block wherever it sits and lift the human task out of a TASK: wrapper.

    The inverse of inject: strip(inject(task)) == task. The write path uses the same function.

    Example: cybmem inject "Fix the login form" | cybmem strip
    """
    from .preamble import strip

    text = _task_text(task, file)
    out = strip(text)
    if as_json:
        _print_json({"task": out})
        return
    sys.stdout.write(out)
    sys.stdout.flush()


# --- tuning and reports (notebooks issue) -------------------------------------------


def _floats(text: Optional[str], param: str) -> Optional[list[float]]:
    if text is None:
        return None
    try:
        values = [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a comma-separated list of numbers (e.g. 7,30,90)", param_hint=param) from None
    if not values:
        raise typer.BadParameter("give at least one value", param_hint=param)
    return values


@app.command("tune")
@_handle
def tune_cmd(
    judgments: Annotated[Optional[Path], typer.Option("--judgments", "-j", help="Judgments JSONL: one {\"query\", \"asOf\", \"relevant\": [runIds]} a line (qrels.jsonl works). Default: derived from the store (issue resolutions, parent runs).", show_default=False)] = None,
    metric: Annotated[str, typer.Option("--metric", help="mrr, ndcg or recall (each cut at -k).")] = "mrr",
    k: Annotated[int, typer.Option("-k", help="Metric cut-off: MRR@k, nDCG@k, recall@k.", min=1)] = 10,
    steps: Annotated[int, typer.Option("--steps", help="Values per weight: STEPS points from 0 to 1.", min=2)] = 11,
    half_lives: Annotated[Optional[str], typer.Option("--half-lives", help="Comma-separated half-lives in days (default: 1,3,7,14,30,60,120,365 and the current one).", show_default=False)] = None,
    derive: Annotated[str, typer.Option("--derive", help="Without --judgments: which judgments to derive, comma-separated: issue (a resolving run should see the runs that carried the issue), parent (a dispatched run should see its parent).")] = "issue,parent",
    save: Annotated[bool, typer.Option("--save", help="Write the best weights to the project's weights.json, which search and inject read.")] = False,
    progress: Annotated[Optional[bool], typer.Option("--progress/--no-progress", help="Progress bar on stderr (default: when stderr is a terminal).", show_default=False)] = None,
    memory_dir: MemoryDirOpt = None,
    cwd: CwdOpt = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
):
    """Grid-search the retrieval weights against relevance judgments; print the best against the current ones.

    Every query is replayed as dispatch would have answered it at its moment (only runs that had
    ended count). With --save the best weights go to <memory dir>/<project>/weights.json.

    Example: cybmem tune --project web --metric ndcg -k 3 --save
    """
    from .tuning import JUDGMENT_KINDS, METRICS, save_project_weights, tune

    if metric not in METRICS:
        raise typer.BadParameter(f"{metric!r} is not one of {', '.join(METRICS)}", param_hint="--metric")
    kinds = [x for x in derive.replace(" ", "").split(",") if x]
    if not kinds or set(kinds) - set(JUDGMENT_KINDS):
        raise typer.BadParameter(f"{derive!r}: choose from {', '.join(JUDGMENT_KINDS)}", param_hint="--derive")
    hl = _floats(half_lives, "--half-lives")
    settings = _settings(memory_dir)
    store = _store(memory_dir, cwd, project)
    result = tune(store, judgments=judgments, metric=metric, k=k, steps=steps, half_lives=hl, settings=settings,
                  kinds=kinds, progress=progress)
    saved, overridden = None, []
    if save and result.best_in_grid:
        saved, overridden = save_project_weights(store, result.best, settings)
    if as_json:
        _print_json({**result.to_dict(), "saved": str(saved) if saved else None, "overriddenBy": overridden})
        return
    shape = " x ".join(str(len(result.axes[a])) for a in ("w_kw", "w_rec", "w_lin"))
    if len(result.axes["w_vec"]) > 1:
        shape += f" x {len(result.axes['w_vec'])}"
    typer.echo(f"Judgments: {result.judgments} {result.source}" + (f"; {result.skipped} skipped (no relevant run existed yet)" if result.skipped else "") + ".")
    typer.echo(f"Grid: {shape} weights x {len(result.axes['half_life_days'])} half-lives = {result.points} points "
               f"({result.evaluated} distinct rankings) in {result.seconds:.2f}s.")
    typer.echo("")
    rows = []
    for name, w, v in (("current", result.current, result.current_metric), ("best", result.best, result.best_metric)):
        rows.append([name] + [f"{getattr(w, a):g}" for a in ("w_kw", "w_rec", "w_lin", "w_vec", "half_life_days")] + [f"{v:.4f}"])
    rows[1][-1] += f"  ({result.improvement:+.4f})"
    _table(["", "W_KW", "W_REC", "W_LIN", "W_VEC", "HALF_LIFE_DAYS", result.label.upper()], rows)
    typer.echo("")
    target = store.dir / "weights.json"
    if not result.best_in_grid:
        typer.echo("No grid point beats the current weights" + ("; weights.json left as it is." if save else "."))
    elif saved:
        typer.echo(f"Saved to {saved}; `cybmem search` and `cybmem inject` use these weights from now on.")
        if overridden:
            typer.echo(f"Note: still overridden by {', '.join(overridden)}.", err=True)
    else:
        typer.echo(f"Not saved; add --save to write {target}.")


@app.command("report")
@_handle
def report_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the HTML pages (created).", show_default=False)],
    with_code: Annotated[bool, typer.Option("--with-code", help="Keep the notebooks' code cells in the pages.")] = False,
    timeout: Annotated[int, typer.Option("--timeout", help="Seconds allowed per notebook cell.", min=1)] = 600,
    progress: Annotated[Optional[bool], typer.Option("--progress/--no-progress", help="Cell progress bar on stderr (default: when stderr is a terminal).", show_default=False)] = None,
    memory_dir: MemoryDirOpt = None,
    cwd: CwdOpt = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
):
    """Execute the notebooks (history, lineage, issue ages, weight tuning) headless and write self-contained HTML.

    One page per notebook plus index.html; figures are embedded images, nothing is fetched
    from the network. Progress goes to stderr.

    Example: cybmem report --out reports/web --project web
    """
    from .report import build_report

    store = _store(memory_dir, cwd, project)
    result = build_report(store, out, with_code=with_code, timeout=timeout, progress=progress)
    if as_json:
        _print_json(result.to_dict())
        return
    typer.echo(f"Wrote {len(result.pages)} pages to {result.out_dir}; open {result.index}")


# --- doctor (reliability issue) -------------------------------------------------------


@app.command("doctor")
@_handle
def doctor_cmd(
    repair: Annotated[bool, typer.Option("--repair", help="Rebuild derived files (index.json, .cache/) and remove old temp files; records and the ledger are never touched.")] = False,
    secrets: Annotated[bool, typer.Option("--secrets", help="Also scan records and issue titles/details for secrets (reports file, field and kind, never the secret; rewrites nothing).")] = False,
    all_projects: Annotated[bool, typer.Option("--all", help="Check every project of the memory root.")] = False,
    temp_age: Annotated[float, typer.Option("--temp-age", help="Temp files younger than this many seconds may belong to a running writer and are left alone.", min=0)] = 60,
    memory_dir: MemoryDirOpt = None,
    cwd: CwdOpt = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
):
    """Check a memory store: records, ledger, index, projects.json, embeddings, cache, temp files.

    Exit 0 when clean, 1 when errors or repairable problems remain (warnings do not count).

    Example: cybmem doctor --all --repair
    """
    from .doctor import doctor

    report = doctor(_settings(memory_dir), project=project, cwd=cwd, all_projects=all_projects,
                    repair=repair, secrets=secrets, temp_age=temp_age)
    if as_json:
        _print_json(report.to_dict())
    else:
        typer.echo("\n".join(report.lines()))
    if not report.clean:
        raise typer.Exit(1)


# --- export (exports issue) -------------------------------------------------------------

_EXPORT_FORMATS = ("ndjson", "csv", "parquet", "sqlite", "prov")


@app.command("export")
@_handle
def export_cmd(
    format: Annotated[str, typer.Argument(help="ndjson, csv, parquet, sqlite or prov.", show_default=False)],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Where to write: a file (ndjson, csv, sqlite, prov) or the dataset directory (parquet). ndjson and csv go to stdout without it.", show_default=False)] = None,
    table: Annotated[Optional[str], typer.Option("--table", help="records or issues (default: records for ndjson/csv, both for parquet/sqlite).", show_default=False)] = None,
    all_projects: Annotated[bool, typer.Option("--all", help="Export every project of the memory root.")] = False,
    machine: Annotated[Optional[str], typer.Option("--machine", help="parquet: the machine partition (default: this host's name).", show_default=False)] = None,
    chain: Annotated[Optional[str], typer.Option("--chain", help="prov: only the previousRunId chain of this run (id or unique prefix), walked both ways.", show_default=False)] = None,
    provn: Annotated[bool, typer.Option("--provn", help="prov: also write PROV-N next to the PROV-JSON file (same name, .provn).")] = False,
    progress: Annotated[Optional[bool], typer.Option("--progress/--no-progress", help="Progress bar on stderr (default: when stderr is a terminal).", show_default=False)] = None,
    memory_dir: MemoryDirOpt = None,
    cwd: CwdOpt = None,
    project: ProjectOpt = None,
    as_json: JsonOpt = False,
):
    """Export a project's memory (or, with --all, every project's) for other tools.

    ndjson: the records as stored, one a line; csv: flat columns, lists as JSON text; parquet: a
    Hive-partitioned dataset (DIR/records|issues/machine=/project=/month=/) that each export
    appends to; sqlite: records (full-text search), issue_events and issues, for Datasette;
    prov: W3C PROV-JSON (and PROV-N) of the history. Every row carries its project.

    Example: cybmem export parquet --out ~/fleet --all
    """
    from .export import TABLES, all_stores, export_csv, export_ndjson, export_parquet, export_sqlite, validate_machine
    from .errors import ValidationError

    if format not in _EXPORT_FORMATS:
        raise typer.BadParameter(f"{format!r} is not one of {', '.join(_EXPORT_FORMATS)}", param_hint="FORMAT")
    if table is not None and table not in TABLES:
        raise typer.BadParameter(f"{table!r} is not one of {', '.join(TABLES)}", param_hint="--table")
    if format in ("parquet", "sqlite", "prov") and out is None:
        raise typer.BadParameter(f"{format} needs --out ({'a directory' if format == 'parquet' else 'a file'})", param_hint="--out")
    if as_json and out is None:
        raise typer.BadParameter(f"--json prints a summary, but without --out the {format} data goes to stdout; add --out FILE", param_hint="--json")
    if machine is not None and format != "parquet":
        raise typer.BadParameter("only parquet exports have a machine partition", param_hint="--machine")
    if (chain is not None or provn) and format != "prov":
        raise typer.BadParameter("--chain and --provn are for prov exports", param_hint="--chain" if chain is not None else "--provn")
    if format == "prov" and table is not None:
        raise typer.BadParameter("a prov export holds the whole history; --table does not apply", param_hint="--table")
    if chain is not None and all_projects:
        raise typer.BadParameter("a chain lies inside one project: drop --all", param_hint="--chain")
    if all_projects and project is not None:
        raise typer.BadParameter("give --project or --all, not both", param_hint="--all")
    if machine is not None:
        try:
            validate_machine(machine)
        except ValidationError as exc:
            raise typer.BadParameter(str(exc), param_hint="--machine") from None

    if all_projects:
        root = _settings(memory_dir).memory_dir
        stores = all_stores(root)
        if not stores:
            from .errors import NotFoundError

            raise NotFoundError(f"no projects under {root}; nothing to export")
    else:
        stores = [_store(memory_dir, cwd, project)]

    if format == "prov":
        from .prov import export_prov

        result = export_prov(stores, out, chain=chain, provn=provn)
        for w in result.warnings:
            typer.echo(f"warning: {w}", err=True)
        if as_json:
            _print_json(result.to_dict())
            return
        c = result.counts
        files = " and ".join(f"{p} ({'PROV-N' if k == 'provn' else 'PROV-JSON'})" for k, p in result.files.items())
        typer.echo(f"Wrote {files}: {c['activities']} activities, {c['entities']} entities, {c['agents']} agents, "
                   f"{c['relations']} relations ({', '.join(f'{k} {v}' for k, v in c.items() if k not in ('activities', 'entities', 'agents', 'relations'))}).")
        return

    if format in ("ndjson", "csv"):
        fn = export_ndjson if format == "ndjson" else export_csv
        result = fn(stores, out, table=table or "records", progress=progress)
    elif format == "parquet":
        result = export_parquet(stores, out, machine=machine, tables=[table] if table else TABLES, progress=progress)
    else:
        result = export_sqlite(stores, out, tables=[table] if table else TABLES, progress=progress)
    for w in result.warnings:
        typer.echo(f"warning: {w}", err=True)
    if as_json:
        _print_json(result.to_dict())
        return
    if out is None:
        return  # the data went to stdout
    def n(count: int, what: str) -> str:
        return f"{count} {what if count == 1 else what + 's'}"

    if format == "parquet":
        what = {"records": "record", "issues": "issue event"}
        parts = [f"{n(t.new, 'new ' + what[t.table])} ({n(len(t.files), 'file')}; {t.rows - t.new} already there)"
                 for t in result.tables]
        typer.echo(f"Wrote {' and '.join(parts)} to {out} as machine {result.machine}.")
    elif format == "sqlite":
        parts = [f"{t.table} {t.rows} ({t.new} new" + (f", {t.updated} updated)" if t.table != "issues" else ")") for t in result.tables]
        typer.echo(f"Wrote {out}: {', '.join(parts)}"
                   + ("; full-text search on task and summary (records_fts)." if any(t.table == "records" for t in result.tables) else "."))
    else:
        t = result.tables[0]
        typer.echo(f"Wrote {n(t.rows, 'record' if t.table == 'records' else 'issue event')} of {n(len(result.projects), 'project')} to {out}.")


def main() -> None:
    """Console-script entry point."""
    app(prog_name="cybmem")


if __name__ == "__main__":
    main()
