"""The ``cybmem`` command line: each command parses, calls one library function, renders.

The options every project command shares (--memory-dir, --cwd, --project, --json) are defined
once (:func:`command`). Errors are translated in one place (:func:`_run` for library errors,
:func:`main` for Click's usage errors): ``Error: ...`` on stderr and exit 1 (usage mistakes:
exit 2); under ``--json`` the error is a JSON object on stderr with the same exit code. The write
hook and ``inject`` never fail the orchestrator: they warn on stderr in one line and exit 0.
Heavy modules are imported inside the commands that need them, so the write and inject paths
never pay for pandas or matplotlib.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import re
import select
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

from .. import __version__
from . import _startup, signals
from ..errors import WARNING_PREFIX, CybmemError
from ..store.outcome import printable, printable_json, shorten, subject_line
from ..store.records import check_moment, ms_to_utc, parse_time
from ..settings import Settings

# Typer re-exports Click's exceptions (and from 0.20 on ships its own copy of Click), so their
# classes are taken from what it exports: BadParameter -> UsageError -> ClickException.
UsageError, ClickException = typer.BadParameter.__mro__[1:3]

app = typer.Typer(
    name="cybmem",
    help="Long-term memory for a coding-agent orchestrator: episodic run records, an issue ledger, "
    "lineage, retrieval and the MEMORY preamble.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
    # the root's own flags (--version, --help) are parsed plainly: every command goes through them
    cls=_startup.quick_class(typer.core.TyperGroup, {"version": _startup.plain_flag}),
)


def _version(value: bool) -> None:
    if value:
        _echo(f"cybmem {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.", callback=_version, is_eager=True)] = False,
) -> None:
    """Long-term memory for a coding-agent orchestrator."""


# --- the shared options, defined once ----------------------------------------------

MemoryDirOpt = Annotated[
    Optional[Path],
    typer.Option("--memory-dir", help="Memory root (default: $CYBERINE_MEMORY_DIR, else $CYBERINE_HOME/memory, else ~/.cyberine/memory).", show_default=False),
]
CwdOpt = Annotated[Optional[Path], typer.Option("--cwd", help="Project directory whose memory to use (default: the current directory).", show_default=False)]
ProjectOpt = Annotated[Optional[str], typer.Option("--project", "-p", help="Project slug to use instead of resolving --cwd (see `cybmem projects`).", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON (errors too, on stderr).")]
_KW = inspect.Parameter.KEYWORD_ONLY
_SHARED = {
    "memory_dir": inspect.Parameter("memory_dir", _KW, default=None, annotation=MemoryDirOpt),
    "cwd": inspect.Parameter("cwd", _KW, default=None, annotation=CwdOpt),
    "project": inspect.Parameter("project", _KW, default=None, annotation=ProjectOpt),
    "as_json": inspect.Parameter("as_json", _KW, default=False, annotation=JsonOpt),
}


@dataclass
class Ctx:
    """What the shared options chose: the memory root, the project, the output form."""

    memory_dir: Optional[Path] = None
    cwd: Optional[Path] = None
    project: Optional[str] = None
    json: bool = False

    @functools.cached_property
    def settings(self) -> Settings:
        return Settings.from_env(memory_dir=self.memory_dir)

    def store(self, *, create: bool = False):
        from ..store.memory_store import MemoryStore

        return MemoryStore.open(self.settings, cwd=self.cwd, project=self.project, create=create)


def _error(message: str, code: int, as_json: bool) -> None:
    if signals.interrupted():
        return  # what failed because of Ctrl-C: main says "interrupted" instead
    if as_json:
        _echo(json.dumps({"error": message, "exitCode": code}, ensure_ascii=False), err=True)
    else:
        _echo(f"Error: {message}", err=True)


def _run(fn: Callable, ctx: Ctx, kwargs: dict) -> Any:
    """Call a command body; library errors become ``Error: ...`` and exit 1 (the one translator)."""
    try:
        return fn(ctx, **kwargs)
    except CybmemError as exc:
        _error(str(exc), 1, ctx.json)
        raise typer.Exit(1) from None
    except UsageError as exc:
        if ctx.json:
            _error(exc.format_message(), 2, True)
            raise typer.Exit(2) from None
        raise
    except BrokenPipeError:
        raise typer.Exit(0) from None
    except OSError as exc:  # a store broken in a way the library did not name
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        _error(f"{where}{exc.strerror or exc}", 1, ctx.json)
        raise typer.Exit(1) from None


def _option_form(arg: str, takes_value: dict[str, bool]) -> bool:
    """Whether Click would read ``arg`` as one of the command's own options (``takes_value``:
    name -> whether it takes a value): a name (``--json``, ``-p``), ``--name=value``, or a
    cluster of short options (``-pweb``). Text with whitespace is never a short cluster."""
    name = arg.split("=", 1)[0]
    if name in takes_value:
        return name == arg or takes_value[name]  # a flag takes no "=value"
    if arg.startswith("--") or any(c.isspace() for c in arg):
        return False
    for i, ch in enumerate(arg[1:], 1):
        if f"-{ch}" not in takes_value:
            return False
        if takes_value[f"-{ch}"]:
            return True  # the rest of the cluster is its value
    return True


def free_text_args(command_, ctx, args: list[str]) -> tuple[list[str], Optional[str]]:
    """``args`` with a free-text argument that starts with a dash moved behind ``--``, and the
    text when it was a single word (a mistyped option, maybe: worth a warning).

    The command's last positional argument is free text (a task, a query): the dispatcher passes
    the human's text as it is, and "--no-build-isolation is ignored" or "- fix A" is text, not an
    option. Walking the arguments as Click does, the first one that starts with a dash, sits in
    that argument's place and is not one of the command's options (:func:`_option_form`) is
    taken as the text. ``--`` keeps working and is the way to pass a text that is exactly an
    option (``cybmem inject -- --help``).
    """
    params = command_.get_params(ctx)
    takes_value = {name: not (p.is_flag or p.count) for p in params if p.param_type_name == "option"
                   for name in (*p.opts, *p.secondary_opts)}
    slot = sum(p.param_type_name == "argument" for p in params) - 1  # positionals before the free text
    seen, i = 0, 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            break
        if arg.startswith("-") and len(arg) > 1:
            if _option_form(arg, takes_value):
                i += 2 if takes_value.get(arg) else 1  # a value of its own follows: skip it
                continue
            if seen == slot:
                rest = args[:i] + args[i + 1:]
                end = rest.index("--") + 1 if "--" in rest else len(rest)
                lone = None if any(c.isspace() for c in arg) else arg
                return rest[:end] + ([] if "--" in rest else ["--"]) + [arg] + rest[end:], lone
            break  # an unknown option elsewhere: Click says so
        seen += 1
        i += 1
    return args, None


class _FreeTextCommand(typer.core.TyperCommand):
    """A command whose last positional argument is free text (:func:`free_text_args`)."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        args, lone = free_text_args(self, ctx, list(args))
        if lone is not None:
            _warn([f"took {lone!r} as the text: {self.name} has no such option "
                   "(put -- before a text that starts with a dash)"])
        return super().parse_args(ctx, args)


def _short_help(doc: str | None) -> str:
    """The first paragraph of a command's help, whole, for `cybmem --help`'s list of commands
    (Click would cut it to the terminal's width minus the names, ending it in "...")."""
    return " ".join(inspect.cleandoc(doc or "").split("\n\n", 1)[0].split())


def command(name: str, *, project: bool = True, memory: bool = True, as_json: bool = True, filters: bool = False,
            free_text: bool = False, quick: bool = False, group: Optional[typer.Typer] = None):
    """Register a command whose body takes a :class:`Ctx` first; adds the shared options to it.

    ``quick``: the command is on the dispatch path and never needs pandas; in the console script it
    gets the start-up tricks of :mod:`cybmem.cli._startup` (plain option parsing, no pandas, a quick
    pyarrow.compute when it reads a store, no interpreter teardown). ``filters``: the record
    filter options (--state, --since, --until, --grep, --agent, --issue) are added, and the
    body gets them as one :class:`cybmem.retrieval.filters.RecordFilter` argument ``f``. ``free_text``:
    the last positional argument is free text, taken as it is even when it starts with a dash
    (:func:`free_text_args`). ``group``: the sub-app it belongs to (``cybmem export csv``).
    """

    def deco(fn: Callable) -> Callable:
        sig = inspect.signature(fn, eval_str=True)
        own = [p for n, p in sig.parameters.items() if n not in ("ctx", "f")]
        names = (["memory_dir"] if memory else []) + (["cwd", "project"] if project else []) + (["as_json"] if as_json else [])
        params = own + (list(_FILTERS.values()) if filters else []) + [_SHARED[n] for n in names]

        def body(ctx: Ctx, **kwargs):
            if filters:
                kwargs["f"] = _record_filter(*(kwargs.pop(n) for n in ("since", "until", "state", "grep", "agent", "issue")))
            return fn(ctx, **kwargs)

        @functools.wraps(fn)
        def wrapper(**kwargs):
            shared = {n: kwargs.pop(n) for n in names}  # a command's own --project (fleet's) stays its own
            ctx = Ctx(memory_dir=shared.get("memory_dir"), cwd=shared.get("cwd"), project=shared.get("project"),
                      json=shared.get("as_json", False))
            _startup.quick_ran = quick
            with _startup.quick_imports(compute=memory) if quick else contextlib.nullcontext():
                return _run(body, ctx, kwargs)

        del wrapper.__wrapped__
        wrapper.__signature__ = sig.replace(parameters=params)
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        cls = _FreeTextCommand if free_text else typer.core.TyperCommand
        if quick:
            cls = _startup.quick_class(cls, {p.name: c for p in params if (c := _startup.plain_coercion(p.annotation))})
        (group or app).command(name, cls=cls, short_help=_short_help(fn.__doc__))(wrapper)
        return fn

    return deco


# --- rendering ------------------------------------------------------------------------


def _count(count: int, what: str) -> str:
    """``3 records``, ``1 record``: a count and its noun."""
    return f"{count} {what if count == 1 else what + 's'}"


def _when(ms: int | None) -> str:
    return "-" if ms is None else ms_to_utc(ms)


def _echo(message: str = "", *, err: bool = False, nl: bool = True) -> None:
    """Every human-readable line goes out here: stored text is made printable first
    (:func:`cybmem.store.outcome.printable`), so a record cannot drive the terminal."""
    typer.echo(printable(message), err=err, nl=nl)


def _print_json(data) -> None:
    """JSON on stdout (:func:`cybmem.store.outcome.printable_json`: no raw control reaches a terminal)."""
    typer.echo(printable_json(data))


def _width() -> int:
    """Columns of the terminal (COLUMNS, else the terminal, else 120 when output is not a terminal)."""
    return max(shutil.get_terminal_size((120, 24)).columns, 60)


def _table(headers: list[str], rows: list[list[str]], *, fit: Callable[[str, int], str] = subject_line) -> None:
    """Columns padded to their widest cell; the last one (task or title text) gets the rest of the
    terminal's width and is cut there by ``fit`` (default: the task's subject line)."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row[:-1]):
            widths[i] = max(widths[i], len(cell))
    room = max(_width() - sum(widths[:-1]) - 2 * (len(headers) - 1), 24)
    fmt = lambda cells: "  ".join(c.ljust(widths[i]) if i < len(cells) - 1 else c for i, c in enumerate(cells)).rstrip()  # noqa: E731
    _echo(fmt(headers))
    for row in rows:
        _echo(fmt(row[:-1] + [fit(row[-1], room)]))


def _whole(text: str, room: int) -> str:
    """A last column that is never cut (numbers, paths)."""
    return text


def _warn(messages) -> None:
    """Each message as one warning line on stderr: the one place the prefix is put."""
    for message in messages:
        _echo(f"{WARNING_PREFIX}{message}", err=True)


def _write_exact(text: str) -> None:
    """Exact bytes to a pipe (strip(inject(task)) == task); a final newline on a terminal."""
    sys.stdout.write(text)
    if text and not text.endswith("\n") and sys.stdout.isatty():
        sys.stdout.write("\n")
    sys.stdout.flush()


# --- read verbs -------------------------------------------------------------------


# --- filters and paging, shared by list, search and chain (issues has its own) -----------

SinceOpt = Annotated[Optional[str], typer.Option("--since", help="Only runs that ended at or after this moment: an ISO date or time (UTC unless it says otherwise) or epoch ms.", show_default=False)]
UntilOpt = Annotated[Optional[str], typer.Option("--until", help="Only runs that ended at or before this moment (a bare date counts whole: 2024-05-31 is up to 23:59:59.999 UTC).", show_default=False)]
StateOpt = Annotated[Optional[str], typer.Option("--state", help="Only runs in this state: done, error or cancelled (comma-separated for several).", show_default=False)]
GrepOpt = Annotated[Optional[str], typer.Option("--grep", help="Only runs whose task or summary contains this text (case-insensitive).", show_default=False)]
AgentOpt = Annotated[Optional[str], typer.Option("--agent", help="Only runs with a worker of this agent id.", show_default=False)]
IssueOpt = Annotated[Optional[str], typer.Option("--issue", help="Only runs that raised this issue id or wrote one of its ledger events (resolved, reopened...).", show_default=False)]
_FILTERS = {n: inspect.Parameter(n, _KW, default=None, annotation=a) for n, a in (
    ("state", StateOpt), ("since", SinceOpt), ("until", UntilOpt), ("grep", GrepOpt), ("agent", AgentOpt), ("issue", IssueOpt))}
OffsetOpt = Annotated[int, typer.Option("--offset", help="Skip this many first (the next page starts at the last one shown).", min=0)]
_PERIOD = re.compile(r"(\d{4})(?:-(\d{2}))?(?:-(\d{2}))?")


def _moment(value: Optional[str], param: str, *, end_of_day: bool = False) -> Optional[int]:
    """--since / --until / --as-of: epoch ms or ISO; a bare year, month or date (2024, 2024-05,
    2024-05-31) means its start, or with ``end_of_day`` (--until) its last millisecond. Every one is
    checked against the range a record's times may hold; a bad one is a usage error naming ``param``."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    period = _PERIOD.fullmatch(text)
    try:
        if not period:
            return parse_time(text, param)
        from datetime import datetime, timezone

        y, m, d = int(period[1]), int(period[2] or 1), int(period[3] or 1)
        try:
            start = datetime(y, m, d, tzinfo=timezone.utc)
        except ValueError as exc:
            raise typer.BadParameter(f"{text!r}: {exc}", param_hint=param) from None
        start_ms = check_moment(int(start.timestamp() * 1000), param, text)  # the range of every moment
        if not end_of_day:
            return start_ms
        nxt = (start.replace(year=y + 1) if not period[2] else
               start.replace(year=y + (m == 12), month=m % 12 + 1) if not period[3] else None)
        end_ms = int(nxt.timestamp() * 1000) if nxt else start_ms + 86_400_000
        return check_moment(end_ms - 1, param, text)
    except CybmemError as exc:
        raise typer.BadParameter(str(exc).removeprefix(f"{param} "), param_hint=param) from None


def _record_filter(since, until, state, grep, agent, issue):
    from ..retrieval.filters import RecordFilter

    try:
        return RecordFilter.make(since=_moment(since, "--since"), until=_moment(until, "--until", end_of_day=True),
                                 state=state, grep=grep, agent=agent, issue=issue)
    except CybmemError as exc:
        raise typer.BadParameter(str(exc), param_hint="--state") from None


def _no_match(what: str, slug: str, f) -> str:
    return f"No {what} in project {slug}" + (f" ({f.describe()})." if f is not None and f.active else ".")


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
    from ..retrieval.filters import list_records
    from ..store.loading import load_snapshot

    snap = load_snapshot(ctx.store())
    page = list_records(snap, f, offset=offset, limit=limit)
    snap = page.snapshot  # a fresh load when a shown record changed in place
    _warn(p.message for p in snap.problems)
    if ctx.json:
        _print_json(page.items)
        return
    if not page.items:
        _echo(_no_match("records", snap.store.slug, f) if not page.total else page.footer("records"))
        return
    rows = [[_when(e["endedAt"]), e["state"] + ("*" if e["superseded"] else ""), e["runId"][:8], e["workflowName"], e["task"]]
            for e in page.items]
    _table(["ENDED (UTC)", "STATE", "RUN", "WORKFLOW", "TASK"], rows)
    if any(e["superseded"] for e in page.items):
        _echo("* superseded by a later correction; `cybmem show` renders the newest truth")
    footer = page.footer("records" + (" that match" if f.active else ""))
    if footer:
        _echo(footer)


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
    _echo("\n".join(lines))


@command("show", quick=True)
def show_cmd(
    ctx: Ctx,
    run_id: Annotated[str, typer.Argument(help="Run id or a unique prefix of it.")],
    original: Annotated[bool, typer.Option("--original", help="Show the asked record even if a later one supersedes it.")] = False,
):
    """Show one record in full, following supersession to the newest truth.

    Example: cybmem show 3f2a
    """
    from ..explore.lineage import show_record

    store = ctx.store()
    shown = show_record(store, run_id, original=original)
    _warn(p.message for p in store.problems)
    if ctx.json:
        _print_json(shown.to_dict())
        return
    _render_record(shown.record, asked=shown.asked, chain=shown.chain)


def _day(ms: Optional[int]) -> str:
    return "-" if ms is None else ms_to_utc(ms)[:10]


def _title(issue_id: str, title: Optional[str]) -> str:
    """An issue's title for a table; blank when the id already spells it (an id is the slug of
    its title unless the writer chose another), which leaves the room to titles that say more."""
    from ..store.outcome import issue_slug

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
):
    """List a project's issues (the fold of the issue ledger): open ones, and those closed recently.

    Open issues come first, newest opened first (--oldest-first: oldest first), then the closed
    ones, most recently closed first. A resolved (or wontfix) issue stays in the view for
    CYBERINE_MEMORY_ISSUE_WINDOW_DAYS days (default 90) after it closed; --all shows every issue,
    --events the ledger itself (in file order).

    Example: cybmem issues --state open --grep flaky
    """
    from ..retrieval.filters import IssueFilter, list_issue_events, list_issues

    if events and (all_issues or oldest_first):
        flag = "--all" if all_issues else "--oldest-first"
        raise typer.BadParameter(f"--events lists every ledger event, in file order; {flag} is for the issue view", param_hint=flag)
    lo, hi = _moment(since, "--since"), _moment(until, "--until", end_of_day=True)
    at = _moment(as_of, "--as-of")
    window = None if all_issues or events else ctx.settings.issue_window_days
    try:
        f = IssueFilter.make(state=state, since=lo, until=hi, grep=grep, window_days=window)
    except CybmemError as exc:
        raise typer.BadParameter(str(exc), param_hint="--state") from None
    store = ctx.store()
    if events:
        got = list_issue_events(store, since=lo, until=hi, events_named=f.states, grep=grep, as_of=at,
                                offset=offset, limit=limit)
    else:
        got = list_issues(store, f, as_of=at, offset=offset, limit=limit, newest_first=not oldest_first)
    _warn(got.warnings)
    page = got.page
    if ctx.json:
        _print_json([item.to_dict() for item in page.items])
        return
    noun = "events" if events else "issues"
    hint = f"{got.hidden} closed more than {window} days ago not shown (--all shows them)." if got.hidden else None
    if not page.items:
        if page.total:
            _echo(page.footer(noun))
        elif events:
            _echo(f"No ledger events in project {store.slug} match." if lo is not None or hi is not None or f.states or grep
                  else f"The issue ledger of project {store.slug} is empty.")
        elif not (state or lo or hi or grep):
            _echo(f"No open issues in project {store.slug}" + (f", none closed in the last {window} days." if window else "."))
        else:
            _echo(f"No issues in project {store.slug} match.")
        if hint:
            _echo(hint)
        return
    if events:
        rows = [[_when(e.at), e.event, e.issueId, (e.byRunId or "-")[:8], _title(e.issueId, e.title or got.titles.get(e.issueId))]
                for e in page.items]
        _table(["AT (UTC)", "EVENT", "ISSUE", "BY", "TITLE"], rows, fit=shorten)
    else:
        rows = [[s.issueId, _day(s.openedAt), (s.openedBy or "-")[:8], s.state, _day(s.resolvedAt), _title(s.issueId, s.title)]
                for s in page.items]
        _table(["ISSUE", "OPENED (UTC)", "BY", "STATE", "CLOSED", "TITLE"], rows, fit=shorten)
    for line in (page.footer(noun), hint):
        if line:
            _echo(line)


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


def _tasks(store, ids: list[str], snap=None) -> dict[str, str]:
    """The whole task of each run (index entries hold only its first line): a table shows the
    subject line, which for a merge commit is on a later line. A few records are read; for
    many, the snapshot."""
    if snap is None and len(ids) <= 200:
        out = {}
        for rid in ids:
            try:
                out[rid] = store.read_record(rid).task
            except CybmemError:
                continue
        return out
    if snap is None:
        from ..store.loading import load_snapshot

        snap = load_snapshot(store)
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = snap.records.filter(pc.is_in(snap.records.column("runId"), value_set=pa.array(ids, pa.string())))
    return dict(zip(rows.column("runId").to_pylist(), rows.column("task").to_pylist()))


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
    from ..explore.lineage import chain
    from ..store.loading import load_snapshot

    n_context = _context(context)
    store = ctx.store()
    rid = store.resolve_run_id(run_id)
    snap = load_snapshot(store)
    full = chain(store, rid, snap)
    keep = None
    if f.active:
        from ..retrieval.filters import record_mask

        ids = snap.records.column("runId").to_numpy(zero_copy_only=False)
        keep = set(ids[record_mask(snap, f)].tolist())
    result = full.window(keep=keep, context=n_context, offset=offset, limit=limit).verified(store)
    _warn(p.message for p in store.problems)
    if ctx.json:
        _print_json(result.to_dict())
        return
    tasks = _tasks(store, [e["runId"] for e in result.runs], snap if f.active else None)  # a few: read from their files
    room = max(_width() - 42, 24)
    if result.omitted_before:
        _echo(f"   ... {_count(result.omitted_before, 'earlier run')}")
    for entry in result.runs:
        mark = "->" if entry["runId"] == result.run_id else "  "
        _echo(f"{mark} {_when(entry['endedAt'])}  {entry['state']:<9}  {entry['runId'][:8]}  {subject_line(tasks.get(entry['runId'], entry['task']), room)}")
    if result.omitted_after:
        _echo(f"   ... {_count(result.omitted_after, 'later run')}")
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
        _echo(line)


@command("projects", project=False, quick=True)
def projects_cmd(ctx: Ctx):
    """List the projects of a memory root with their slugs and record counts.

    Example: cybmem projects
    """
    from ..store.projects import list_projects

    projects = list_projects(ctx.settings.memory_dir)
    if ctx.json:
        _print_json(projects)
        return
    if not projects:
        _echo("No projects yet.")
        return
    _table(["SLUG", "RECORDS", "CWD"], [[p["slug"], str(p["records"]), p["cwd"] or "?"] for p in projects], fit=_whole)


# --- write verbs ------------------------------------------------------------------


@command("rebuild", quick=True)
def rebuild_cmd(
    ctx: Ctx,
    full: Annotated[bool, typer.Option("--full", help="Every record as an entry (no CYBERINE_MEMORY_INDEX_CAP compaction; the next write compacts again).")] = False,
):
    """Regenerate index.json from records/ alone (deleting index.json loses nothing).

    Entries past CYBERINE_MEMORY_INDEX_CAP (default 500) are archived: listed compactly in
    index.json and one line each in archive-summary.md; --full keeps every entry. With
    CYBERINE_MEMORY_RETUNE=N and a history grown N% since its last tuning, the weights are
    re-tuned too (`cybmem tune --auto`).

    Example: cybmem rebuild --project web
    """
    store = ctx.store()
    count = store.rebuild_index(full=full)
    _warn(p.message for p in store.problems)
    archived = len(store.index.archived_ids())
    retuned = None
    if ctx.settings.retune > 0:
        from ..operations.retune import auto_tune, retune_due

        if retune_due(store, ctx.settings, count):
            retuned = auto_tune(store, ctx.settings)
    if ctx.json:
        _print_json({"project": store.slug, "records": count, "entries": count - archived, "archived": archived,
                     "index": str(store.index_path), **({"retuned": retuned} if retuned else {})})
        return
    if archived:
        typer.echo(f"Rebuilt {store.index_path} from {count} records: {count - archived} entries, {archived} archived "
                   f"(older than the newest {store.index_cap}; listed in {store.archive_path.name}).")
    else:
        _echo(f"Rebuilt {store.index_path} from {count} records.")
    if retuned:
        _echo(retuned[0].upper() + retuned[1:] + ".")


def _read_input(source: str, hint: str = "RUN_JSON") -> bytes:
    from ..operations.write import read_run_file

    if source == "-":
        return sys.stdin.buffer.read()
    try:
        return read_run_file(source)
    except CybmemError as exc:
        raise typer.BadParameter(str(exc), param_hint=hint) from None


def _write_run(ctx: Ctx, source: str, **kwargs):
    from ..operations.write import load_run_payload, write_run

    payload = load_run_payload(_read_input(source))
    # A hook's timeout (SIGTERM) while the model thinks costs the distilled outcome, not the run.
    return write_run(payload, ctx.settings, cwd=str(ctx.cwd) if ctx.cwd else None, project=ctx.project,
                     while_distilling=signals.sigterm_abandons, **kwargs)


@command("write", quick=True)
def write_cmd(
    ctx: Ctx,
    run_json: Annotated[Optional[str], typer.Argument(help="Path to the run.json to record, or - for stdin.", show_default=False)] = None,
    hook: Annotated[bool, typer.Option("--hook", help="Hook mode: read the JSON payload on stdin; never fail the run (warn on stderr, exit 0).")] = False,
    run_id: Annotated[Optional[str], typer.Option("--run-id", help="Run id (default: the run's own, else $CYBERINE_RUN_ID).")] = None,
    parent: Annotated[Optional[str], typer.Option("--parent", help="Parent run id (default: the run's lineage, else $CYBERINE_PARENT_RUN_ID).")] = None,
    chat: Annotated[Optional[str], typer.Option("--chat", help="Chat session id (default: the run's lineage, else $CYBERINE_CHAT_SESSION_ID).")] = None,
):
    """Record a finished run: strip the MEMORY block, extract the outcome, link lineage, append issues.

    Example: cybmem write .local/runs/3f2a/run.json
    """
    if run_json is None and not hook:
        raise typer.BadParameter("give a run.json path, - for stdin, or --hook", param_hint="RUN_JSON")
    try:
        result = _write_run(ctx, run_json or "-", run_id=run_id, parent_run_id=parent, chat_session_id=chat)
    except Exception as exc:  # noqa: BLE001 - hook mode: a memory failure must never take the run down
        if not hook:
            raise
        message = str(exc) if isinstance(exc, (CybmemError, OSError, ClickException)) else f"unexpected {type(exc).__name__}: {exc}"
        _warn([f"memory record not written: {' '.join(message.split())}"])
        raise typer.Exit(0) from None
    if result.redacted:
        _echo(f"cybmem: redacted secrets before writing: {', '.join(result.redacted)}", err=True)
    _warn(result.warnings)
    if ctx.json:
        _print_json(result.to_dict())
        return
    opened = [e.issueId for e in result.events if e.event in ("opened", "reopened")]
    resolved = [e.issueId for e in result.events if e.event in ("resolved", "wontfix")]
    msg = f"Wrote {result.record.runId} ({result.record.state}) to project {result.store.slug}"
    if opened:
        msg += f"; opened {', '.join(opened)}"
    if resolved:
        msg += f"; resolved {', '.join(resolved)}"
    _echo(msg + ".")


@command("supersede", quick=True)
def supersede_cmd(
    ctx: Ctx,
    old_run_id: Annotated[str, typer.Argument(help="Run id (or unique prefix) of the record to correct.")],
    run_json: Annotated[str, typer.Argument(help="The corrected run as run.json (path, or - for stdin); it needs its own new run id.")],
    run_id: Annotated[Optional[str], typer.Option("--run-id", help="Run id of the correcting record (default: the run's own).")] = None,
):
    """Correct a record: write a new record that supersedes it (the old one gains supersededBy).

    Example: cybmem supersede 3f2a fixed-run.json --run-id 3f2a-fix
    """
    store = ctx.store()
    old = store.resolve_run_id(old_run_id)
    ctx.project = store.slug
    result = _write_run(ctx, run_json, run_id=run_id, supersedes=old)
    if ctx.json:
        _print_json({**result.to_dict(), "supersedes": old})
    else:
        _echo(f"Wrote {result.record.runId}, superseding {old}; `cybmem show {old}` now renders the correction.")


@command("mark", quick=True)
def mark_cmd(
    ctx: Ctx,
    issue_id: Annotated[str, typer.Argument(help="Issue id (see `cybmem issues`).")],
    event: Annotated[str, typer.Argument(help="resolved, wontfix or reopened.")],
    by: Annotated[Optional[str], typer.Option("--by", help="Run id that caused the change (default: $CYBERINE_RUN_ID).")] = None,
    detail: Annotated[Optional[str], typer.Option("--detail", help="Why, in a sentence.")] = None,
):
    """Append a state change for an issue to the ledger (the ledger is never rewritten).

    Example: cybmem mark flaky-login-test resolved --by 3f2a9c1e
    """
    if event not in ("resolved", "wontfix", "reopened"):
        raise typer.BadParameter(f"{event!r} is not one of resolved, wontfix, reopened", param_hint="EVENT")
    store = ctx.store()
    before = store.issue_states_for([issue_id]).get(issue_id)
    written = store.mark_issue(issue_id, event, by=by or ctx.settings.run_id, detail=detail,
                               redact_secrets=ctx.settings.redact_secrets)
    if ctx.json:
        _print_json([e.to_dict() for e in written])
    elif written:
        _echo(f"{issue_id}: {before.state} -> {event}")
    else:
        _echo(f"{issue_id} is already {before.state}; nothing appended.")


@command("redact")
def redact_cmd(
    ctx: Ctx,
    run_id: Annotated[Optional[str], typer.Argument(help="Run id or a unique prefix of it (or --everywhere).", show_default=False)] = None,
    secret: Annotated[Optional[list[str]], typer.Option("--secret", metavar="TEXT", help="A text to remove (repeatable; it lands in your shell history: prefer --secrets-from).", show_default=False)] = None,
    secrets_from: Annotated[Optional[Path], typer.Option("--secrets-from", help="A file with one text to remove a line, or - for stdin.", show_default=False)] = None,
    everywhere: Annotated[bool, typer.Option("--everywhere", help="Every run whose record holds a given text, instead of one run.")] = False,
    no_patterns: Annotated[bool, typer.Option("--no-patterns", help="Remove only the given texts, not the secret shapes the write path knows.")] = False,
):
    """Remove a secret from a run's memory everywhere it was copied, in one safe step.

    Rewrites the run's record and its ledger lines with every known secret shape and each given
    text replaced, atomically and under the project lock; renames an issue id spelled from such a
    text; drops the run's vectors; rebuilds index.json and empties the cache; rewrites the rows of
    the Parquet and SQLite exports the project knows of; then names any file of the project, and
    any file export, that still holds a given text (exit 1). --everywhere does it for every run
    that holds a given text. A redaction killed halfway is finished first by the next one (or by
    `cybmem doctor --repair`).

    Example: printf '%s\\n' 'purple-otter-42' | cybmem redact 3f2a --secrets-from -
    """
    from ..operations.redaction import scrub_runs

    texts = list(secret or [])
    if secrets_from is not None:
        try:
            data = sys.stdin.read() if str(secrets_from) == "-" else secrets_from.read_text(encoding="utf-8")
        except OSError as exc:
            raise typer.BadParameter(f"cannot read {secrets_from}: {exc.strerror or exc}", param_hint="--secrets-from") from None
        texts += [line for line in data.splitlines() if line.strip()]
    if (run_id is None) == (not everywhere):
        raise typer.BadParameter("give one run id, or --everywhere (with the texts to remove)", param_hint="RUN_ID")
    if (no_patterns or everywhere) and not texts:
        raise typer.BadParameter("give the texts to remove (--secret or --secrets-from)",
                                 param_hint="--everywhere" if everywhere else "--no-patterns")
    store = ctx.store()
    result = scrub_runs(store, None if everywhere else [store.resolve_run_id(run_id)], secrets=texts,
                        patterns=not no_patterns)
    if ctx.json:
        _print_json(result.to_dict())
        _redact_exit(result)
        return
    if result.completed is not None:
        done = result.completed
        _echo(f"Finished an interrupted redaction of {_count(len(done.targets), 'run')} in project {done.project} "
              f"(begun {_when(done.started_at)}).")
    if not result.changed:
        _echo(f"Nothing to redact in {'run ' + result.run_id + ' of ' if result.run_id else ''}project {result.project}.")
    else:
        what = []
        if result.run_id and result.fields:
            what.append(f"record ({', '.join(result.fields)})")
        elif result.runs:
            what.append(f"{_count(len(result.runs), 'record')}")
        if result.ledger_lines:
            what.append(f"{_count(result.ledger_lines, 'ledger line')}")
        if result.renamed:
            what.append("issue " + ", ".join(f"{old} -> {new}" for old, new in result.renamed.items()))
        if result.records_relinked:
            what.append(f"the issue list of {_count(len(result.records_relinked), 'other record')}")
        if result.archive_lines:
            what.append(f"{_count(result.archive_lines, 'archive-summary.md line')}")
        found = ([f"{_count(result.replaced, 'occurrence')} of the given text"
                  + ("s" if len(texts) > 1 else "")] if result.replaced else []) + result.kinds
        who = (f"run {result.run_id} in project " if result.run_id else f"{len(result.runs)} runs in project "
               if result.runs else "project ")
        _echo(f"Redacted {who}{result.project}: {'; '.join(what)}" + (f" ({', '.join(found)})" if found else "") + ".")
        if result.embeddings_dropped:
            _echo(f"Dropped {_count(result.embeddings_dropped, 'vector')} made from the "
                  "old text (`cybmem embed` makes new ones).")
    for path in result.rebuilt:
        _echo(f"Rebuilt {path}.")
    for path in result.emptied:
        _echo(f"Emptied {path} (the next read rebuilds it).")
    for line in result.exports:
        _echo(f"Export: {line}.")
    if result.remaining:
        shown = result.remaining[:8]
        _warn(f"a given text is still in {path}" for path in shown)
        if len(result.remaining) > len(shown):
            _warn([f"... and in {len(result.remaining) - len(shown)} more files (--json lists them all; "
                   "--everywhere redacts every run that holds it)"])
    _warn(result.unreachable)
    _redact_exit(result)
    if texts:
        _echo(f"No file of project {result.project} holds a given text any more.")


def _redact_exit(result) -> None:
    """Exit 1 while a copy is left: a file that still holds a given text, an export cybmem cannot edit."""
    if result.remaining or result.unreachable:
        raise typer.Exit(1)


# --- retrieval ----------------------------------------------------------------------

AsOfOpt = Annotated[
    Optional[str],
    typer.Option("--as-of", help="Replay memory as of a moment: epoch milliseconds or an ISO date; later records are ignored and recency is measured from then.", show_default=False),
]
ParentOpt = Annotated[Optional[str], typer.Option("--parent", help="Parent run id of the run being dispatched, or a unique prefix of it (default: $CYBERINE_PARENT_RUN_ID).")]
ChatOpt = Annotated[Optional[str], typer.Option("--chat", help="Chat session id (default: $CYBERINE_CHAT_SESSION_ID).")]


def _task_text(task: Optional[str], file: Optional[Path]) -> str:
    if task is not None and file is not None:
        raise typer.BadParameter("give the task as an argument or with --file, not both", param_hint="TASK")
    if file is not None:
        try:
            return file.read_text(encoding="utf-8", errors="surrogateescape")
        except OSError as exc:
            raise typer.BadParameter(f"cannot read {file}: {exc.strerror or exc}", param_hint="--file") from None
    if task is None or task == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise typer.BadParameter("give the task as an argument, with --file, or on stdin", param_hint="TASK")
        return sys.stdin.read()
    return task


def _stdin_holds_input() -> bool:
    """Whether stdin holds text for an optional input (``inject --system``): a file, or a pipe
    with data or its end already there. A terminal does not, nor a pipe nobody has written to
    (a dispatcher that leaves its child's stdin open): reading it would wait for ever."""
    if sys.stdin is None or sys.stdin.isatty():
        return False
    try:
        return bool(select.select([sys.stdin], [], [], 0)[0])
    except (OSError, ValueError):  # no file descriptor (a test runner's stdin): it was given
        return True


def _fmt_axes(contrib: dict) -> str:
    short = {"keyword": "kw", "recency": "rec", "lineage": "lin", "vector": "vec"}
    return " ".join(f"{short.get(k, k)}={v:.3f}" for k, v in contrib.items() if v or k != "vector")


@command("search", filters=True, free_text=True, quick=True)
def search_cmd(
    ctx: Ctx,
    query: Annotated[str, typer.Argument(help="What to look for (free text, e.g. the new task).")],
    k: Annotated[int, typer.Option("-k", "--top", "--limit", help="How many results.", min=1)] = 10,
    offset: OffsetOpt = 0,
    explain_: Annotated[bool, typer.Option("--explain", help="Show each result's per-axis contributions and the weights.")] = False,
    as_of: AsOfOpt = None,
    parent: ParentOpt = None,
    chat: ChatOpt = None,
    f: Any = None,
):
    """Multi-axis scored search over a project's records (BM25 + recency + lineage).

    Filters (--state, --since, --until, --grep, --agent, --issue) narrow the candidates before
    ranking; --offset skips the first results (the next page).

    Example: cybmem search "flaky cart drawer test" -k 5 --explain --since 2026-10-01
    """
    from ..retrieval.search import search

    from ..errors import NotFoundError
    from ..store.loading import load_snapshot

    store = ctx.store()
    snap = load_snapshot(store)
    try:  # a prefix as the MEMORY block prints it, as inject takes it
        parent = snap.resolve_link(parent or ctx.settings.parent_run_id)
    except NotFoundError as exc:
        _warn([f"no parent run for the lineage axis (--parent / CYBERINE_PARENT_RUN_ID): {exc}"])
        parent = None
    result = search(snap, query, k=k + offset, settings=ctx.settings, as_of=_moment(as_of, "--as-of"),
                    parent_run_id=parent, chat_session_id=chat, filter=f)
    result.hits = result.hits[offset:]
    _warn(p.message for p in result.snapshot.problems)
    _warn(result.warnings)
    if ctx.json:
        _print_json(result.to_dict(explain=explain_))
        return
    if not result.hits:
        _echo(_no_match("matching records", store.slug, f) if not offset else f"No results after the first {offset}.")
        return
    rows = [[str(h.rank), f"{h.score:.3f}", h.run_id[:8], _when(h.ended_at_ms), h.state, h.task] for h in result.hits]
    _table(["#", "SCORE", "RUN", "ENDED (UTC)", "STATE", "TASK"], rows)
    if explain_:
        w = result.weights
        _echo("")
        _echo(f"weights: w_kw={w.w_kw:g} w_rec={w.w_rec:g} w_lin={w.w_lin:g} w_vec={w.w_vec:g} half_life_days={w.half_life_days:g}"
                   + (f"  as of {_when(result.as_of)} UTC" if result.as_of is not None else "")
                   + (f"  among {result.candidates} records ({f.describe()})" if f.active else ""))
        for h in result.hits:
            _echo(f"{h.rank:>2}. {h.run_id[:8]}  {_fmt_axes(h.contributions)}  = {h.score:.3f}")


def _explain_lines(result) -> list[str]:
    """The human form of ``inject --explain``: what was retrieved, why, and what the budget cut."""
    d = result.to_dict()
    lines = [f"project: {d['project'] or '-'}; block {d['tokens']['block']} of {d['tokens']['budget']} tokens "
             f"(runs {d['tokens']['runs']}, issues {d['tokens']['issues']}); top-k {d['settings']['topk']}, "
             f"issue cap {d['settings']['issues']}"]
    if "weights" in d:
        by_source: dict[str, list[str]] = {}  # each source (a weights file, the environment) named once
        for k, v in d["weights"].items():
            if k != "floor":  # retired: the block judges each run's evidence (cybmem.retrieval.evidence)
                by_source.setdefault(d["weightSources"].get(k, "argument"), []).append(f"{k}={v:g}")
        lines.append("weights: " + "; ".join(f"{', '.join(ws)} ({src})" for src, ws in by_source.items()))
        if d.get("tuned"):
            lines.append(f"weights source: {d['tuned']}")
        if d["issues"] and "issueWeights" in d:
            lines.append("issues ranked with: " + ", ".join(f"{k}={v:.3g}" for k, v in d["issueWeights"].items())
                         + " (recency weighs more for an open issue)")
    ev = d.get("evidence")
    if ev:
        common = [t for t, n in zip(ev["terms"], ev["documentFrequency"]) if n >= ev["commonAt"]]
        unknown = [t for t, n in zip(ev["terms"], ev["documentFrequency"]) if n == 0]
        lines.append(f"evidence: {len(ev['terms'])} task term(s); common here (held by >= {ev['commonAt']} of "
                     f"{ev['runs']} runs, carry nothing alone): {' '.join(common) or '-'}; held by no run: "
                     f"{' '.join(unknown) or '-'}; full entry at >= {ev['fullNats']:g} nats")
        if ev.get("reason"):
            lines.append(f"evidence: {ev['reason']}")
    for h in d["runs"]:
        pin = "  (the run this task follows up: shown first)" if h.get("pinned") == "parent" else ""
        e = h.get("evidence")
        tier = ""
        if e:
            nats = "-" if e["nats"] is None else f"{e['nats']:.1f}"
            tier = f"{e['tier']:<7} {nats:>6} nats [{' '.join(e['terms'][:6])}{' ...' if len(e['terms']) > 6 else ''}]  "
        lines.append(f"run {h['rank']:>2}. {h['runId'][:8]}  {tier}{_fmt_axes(h['contributions'])}  = {h['score']:.3f}  "
                     f"{subject_line(h['task'], 50)}{pin}")
    for issue in d["issues"]:
        c = issue["contributions"]
        mark = {"issues": "listed", "raised": "raised", "no": "next  "}[issue["listed"]]
        via = f" via run {issue['via'][:8]}" if issue["via"] else ""
        lines.append(f"issue {mark} {', '.join(issue['ids'])}  kw={c['keyword']:.3f} lin={c['lineage']:.3f} "
                     f"rec={c['recency']:.3f}  = {issue['score']:.3f}{via}")
    cut = d["cut"]
    lines.append(f"cut for the budget: {len(cut['runs'])} run(s) {' '.join(r[:8] for r in cut['runs'])}".rstrip()
                 + f"; {cut['issuesOverBudget']} issue line(s); {d['openIssues']} open issue(s) in all")
    return lines


@command("inject", free_text=True, quick=True)
def inject_cmd(
    ctx: Ctx,
    task: Annotated[Optional[str], typer.Argument(help="The task prompt (or - for stdin; stdin is also read when omitted).", show_default=False)] = None,
    file: Annotated[Optional[Path], typer.Option("--file", "-f", help="Read the task from this file.")] = None,
    system: Annotated[bool, typer.Option("--system", help="Print only the MEMORY block (for a chat session's system message), ranked for the task when one is given (argument, --file or stdin).")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 when memory is broken or the project unknown (default: print the task anyway and warn).")] = False,
    explain_: Annotated[bool, typer.Option("--explain", help="Also say on stderr what was retrieved and why: per-axis scores, weights and where each came from, issues, tokens, what the budget cut.")] = False,
    as_of: AsOfOpt = None,
    parent: ParentOpt = None,
    chat: ChatOpt = None,
):
    """Print the task with the MEMORY preamble ahead of it (what dispatch sends to the agent).

    Never fails the dispatcher: whatever is wrong with memory, the task is printed (with the block
    that could be built, possibly none) and one warning line goes to stderr; --strict exits 1
    instead. The block holds the most relevant prior runs (CYBERINE_MEMORY_TOPK) and open issues
    (CYBERINE_MEMORY_ISSUES), within CYBERINE_MEMORY_MAX_TOKENS; CYBERINE_MEMORY=0 turns it off.

    Example: cybmem inject "Fix the checkout error banner" --cwd ~/web --explain
    """
    from ..dispatch.inject import Injection, inject_task

    # --system ranks for the task too when one is given (an argument, --file or stdin); without
    # one it builds the block for no task in particular.
    bare = task is None and file is None and not _stdin_holds_input()
    text = "" if system and bare else _task_text(task, file)
    if not system and not text.strip():
        raise typer.BadParameter("the task is empty; give the task prompt to put the MEMORY block ahead of", param_hint="TASK")
    try:
        settings = Settings.from_env(memory_dir=ctx.memory_dir, lenient=not strict)
        result = inject_task(text, settings, cwd=ctx.cwd, project=ctx.project, as_of=_moment(as_of, "--as-of"),
                             parent_run_id=parent, chat_session_id=chat, strict=strict)
    except (CybmemError, UsageError):
        raise
    except Exception as exc:  # noqa: BLE001 - the dispatch path never fails the dispatcher
        if strict:
            raise
        result = Injection(text, "", ctx.project, [f"memory not injected (unexpected {type(exc).__name__}: {exc})"])
    _warn(" ".join(message.split()) for message in result.warnings + [result.feedback_warning or ""] if message)
    if explain_:
        for line in _explain_lines(result):
            _echo(line, err=True)
    if ctx.json:
        _print_json(result.to_dict())
        return
    if system:
        _write_exact(result.block)  # the block ends with its own newline
        return
    _write_exact(result.prompt)


@command("strip", project=False, memory=False, free_text=True, quick=True)
def strip_cmd(
    ctx: Ctx,
    task: Annotated[Optional[str], typer.Argument(help="Text to clean (or - for stdin; stdin is also read when omitted).", show_default=False)] = None,
    file: Annotated[Optional[Path], typer.Option("--file", "-f", help="Read the text from this file.")] = None,
):
    """Remove the MEMORY block wherever it sits and lift the human task out of a TASK: wrapper.

    The inverse of inject: strip(inject(task)) == task. The write path uses the same function.

    Example: cybmem inject "Fix the login form" | cybmem strip
    """
    from ..dispatch.preamble import strip

    out = strip(_task_text(task, file))
    if ctx.json:
        _print_json({"task": out})
        return
    _write_exact(out)


@command("embed", quick=True)
def embed_cmd(
    ctx: Ctx,
    progress: Annotated[Optional[bool], typer.Option("--progress/--no-progress", help="Progress bar on stderr (default: when stderr is a terminal).", show_default=False)] = None,
):
    """Embed the records that have no vector yet for the configured model (a backfill).

    Needs CYBERINE_MEMORY_EMBEDDINGS (ollama or an OpenAI-compatible base URL) and
    CYBERINE_MEMORY_EMBED_MODEL (default nomic-embed-text). Vectors are appended to the project's
    embeddings.jsonl, one per record and model; search then uses the vector axis.

    Example: CYBERINE_MEMORY_EMBEDDINGS=ollama cybmem embed --project web
    """
    from ..retrieval.embed_backfill import embed_missing

    result = embed_missing(ctx.store(), ctx.settings, progress=progress)
    _warn(result.warnings)
    if ctx.json:
        _print_json(result.to_dict())
        return
    if not result.embedded:
        typer.echo(f"Nothing to embed: all {result.had} records of project {result.project} already have a vector "
                   f"(model {result.model}" + (f", {result.dims} dimensions)" if result.dims else ")")
                   + (f" ({result.empty} have no text)." if result.empty else "."))
        return
    typer.echo(f"Embedded {result.embedded} records of project {result.project} with {result.model} ({result.dims} dimensions) "
               f"in {result.seconds:.1f}s: {result.rate:.1f} records/s; {result.had + result.embedded} of {result.records} "
               "records have a vector now.")


# --- tuning and reports ---------------------------------------------------------------


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


_W_FIELDS = ("w_kw", "w_rec", "w_lin", "w_vec", "half_life_days")


def _weights_row(name: str, w, *values: str) -> list[str]:
    return [name] + [f"{getattr(w, a):g}" for a in _W_FIELDS] + list(values)


JudgmentsOpt = Annotated[Optional[Path], typer.Option("--judgments", "-j", help="Judgments JSONL: one {\"query\", \"asOf\", \"relevant\": [runIds]} a line (qrels.jsonl works). Default: derived from the store (runs that raised, resolved or reopened an issue earlier runs carried; parent runs; what runs used); a file lying in the memory root is never taken unless named here.", show_default=False)]
MetricOpt = Annotated[str, typer.Option("--metric", help="mrr, ndcg or recall (each cut at -k).")]
DeriveOpt = Annotated[str, typer.Option("--derive", help="Without --judgments: which judgments to derive, comma-separated: raised, resolved, reopened (a run that raised, resolved or reopened an issue should see the earlier runs that carried it; issue = all three), parent (a dispatched run should see its parent), used (a run should see first the runs it used of those memory showed it: used.jsonl).")]


#: The exit code of ``cybmem tune --save`` when it refuses to save (not 0, nor 1: a failure, nor 2: a usage mistake).
REFUSED_EXIT = 3


def _metric_and_kinds(metric: str, derive: str) -> list[str]:
    from ..retrieval.judgments import JUDGMENT_KINDS, METRICS

    if metric not in METRICS:
        raise typer.BadParameter(f"{metric!r} is not one of {', '.join(METRICS)}", param_hint="--metric")
    kinds = [x for x in derive.replace(" ", "").split(",") if x]
    if not kinds or set(kinds) - set(JUDGMENT_KINDS) - {"issue"}:
        raise typer.BadParameter(f"{derive!r}: choose from issue, {', '.join(JUDGMENT_KINDS)}", param_hint="--derive")
    return kinds


@command("tune", quick=True)
def tune_cmd(
    ctx: Ctx,
    judgments: JudgmentsOpt = None,
    metric: MetricOpt = "mrr",
    k: Annotated[int, typer.Option("-k", help="Metric cut-off: MRR@k, nDCG@k, recall@k.", min=1)] = 10,
    steps: Annotated[int, typer.Option("--steps", help="Values per weight: STEPS points from 0 to 1.", min=2)] = 11,
    half_lives: Annotated[Optional[str], typer.Option("--half-lives", help="Comma-separated half-lives in days (default: 1,3,7,14,30,60,120,365 and the current one).", show_default=False)] = None,
    derive: DeriveOpt = "issue,parent,used",
    as_of: Annotated[Optional[str], typer.Option("--as-of", help="Tune as of this moment (ISO date/time or epoch ms): only the runs, ledger events and judgments that existed then, so the result can be checked on what came after.", show_default=False)] = None,
    save: Annotated[bool, typer.Option("--save", help="Write the weights tuned on the earlier half of the judgments, and checked on the later half, to the project's weights.json with the evidence (refused, exit 3, when they do not beat the current ones there: see --force).")] = False,
    force: Annotated[bool, typer.Option("--force", help="With --save: save even weights that do not beat the current ones on the later judgments, switch the keyword axis off, or come from too few judgments.")] = False,
    all_weights: Annotated[bool, typer.Option("--all-weights", help="Search w_kw, w_rec and the half-life even when fewer than 10 judgments test keywords (by default only w_lin is searched then).")] = False,
    auto: Annotated[bool, typer.Option("--auto", help="Tune on the store's own judgments, save only what passes every check, print one line, exit 0 (what CYBERINE_MEMORY_RETUNE runs as the history grows).")] = False,
    progress: Annotated[Optional[bool], typer.Option("--progress/--no-progress", help="Progress bar on stderr (default: when stderr is a terminal).", show_default=False)] = None,
):
    """Grid-search the retrieval weights against relevance judgments; check them on later judgments; save them.

    Without --judgments the judgments come from the project's own history: a run that raised,
    resolved or reopened an issue should have been shown the earlier runs that carried it (asked
    with its task, the issue's references taken out, as text alone), and a dispatched run its
    parent. Every query is replayed as dispatch would have answered it at its moment (only runs
    that had ended count). The weights are searched on the earlier half of the judgments and
    scored on the later half; --save writes those checked weights (never ones fitted to the
    judgments they are checked on), with the evidence, and only when they beat the current weights
    there (90% bootstrap interval above 0) and hold up asked as text alone; with fewer than 30
    judgments that test the weights it keeps the current ones. --force saves anyway.
    "used" judgments (what runs said they used of what memory showed them) count only from runs
    whose clock is plausible, at most 3 used runs each, and never more than half of the judgments;
    weights that lose on the store's other judgments alone are not saved either.

    Exit codes: 0 tuned (and saved, with --save), 1 a failure (no project, an unreadable file),
    2 a usage mistake, 3 --save refused (the reason on stderr; --json: "notSaved").

    Example: cybmem tune --project web --as-of 2026-06-01 --save
    """
    from ..operations.retune import auto_tune
    from ..retrieval.tuning import evidence_of, save_project_weights, tune

    if auto:
        line = auto_tune(ctx.store(), ctx.settings, progress=progress)
        _print_json({"result": line}) if ctx.json else _echo(line[0].upper() + line[1:] + ".")
        return
    kinds = _metric_and_kinds(metric, derive)
    hl = _floats(half_lives, "--half-lives")
    moment = _moment(as_of, "--as-of") if as_of is not None else None
    store = ctx.store()
    result = tune(store, judgments=judgments, as_of=moment, metric=metric, k=k, steps=steps, half_lives=hl,
                  settings=ctx.settings, kinds=kinds, hold_few=not all_weights, progress=progress)
    _warn(result.warnings)
    saved, overridden = None, []
    refused = result.refusal if save else None
    to_save = result.saves if result.saves is not None else (result.best if force else None)
    if save and to_save is not None and to_save != result.current and (refused is None or force):
        saved, overridden = save_project_weights(store, to_save, ctx.settings, evidence=evidence_of(result, forced=force),
                                                 expect=result.state)
        refused = None
    if ctx.json:
        _print_json({**result.to_dict(), "saved": str(saved) if saved else None, "overriddenBy": overridden,
                     "notSaved": refused})
        if refused:
            raise typer.Exit(REFUSED_EXIT)
        return
    shape = " x ".join(str(len(result.axes[a])) for a in ("w_kw", "w_rec", "w_lin"))
    if len(result.axes["w_vec"]) > 1:
        shape += f" x {len(result.axes['w_vec'])}"
    kinds_text = ", ".join(f"{n} {kind}" for kind, n in sorted(result.kinds.items()))
    when = f" as of {_when(result.as_of)}" if result.as_of is not None else ""
    _echo(f"Judgments: {result.judgments} {result.source.split(' (')[0]}{when} ({kinds_text})"
          + (f"; {result.skipped} skipped (no relevant run existed yet)" if result.skipped else "") + ".")
    if result.keyword_held:
        _echo(f"Note: {result.keyword_held}.")
    if result.vector_note:
        _echo(f"Note: {result.vector_note}.")
    if result.met_note:
        _echo(f"Note: {result.met_note}.")
    if result.left_out:
        _echo(f"Note: {_left_out_text(result.left_out)}.")
    _echo(f"Grid: {shape} weights x {len(result.axes['half_life_days'])} half-lives = {result.points} points "
          f"({result.evaluated} distinct rankings) in {result.seconds:.2f}s.")
    _echo("")
    v = result.validation
    heads = ["", "W_KW", "W_REC", "W_LIN", "W_VEC", "HALF_LIFE_DAYS", result.label.upper()]
    rows = [_weights_row("current", result.current, f"{result.current_metric:.4f}"),
            _weights_row("best on all", result.best, f"{result.best_metric:.4f}  ({result.improvement:+.4f})")]
    _table(heads, rows, fit=_whole)
    if v is not None:
        _echo("")
        _echo(f"Checked on time: searched on the earlier {v.earlier} judgments, scored on the later {v.later} "
              f"(90% interval of the gain {v.interval[0]:+.4f} to {v.interval[1]:+.4f}):")
        later = [f"{v.current_later:.4f}", f"{v.tuned_later:.4f}"]
        heads2 = ["", "W_KW", "W_REC", "W_LIN", "W_VEC", "HALF_LIFE_DAYS", "EARLIER", "LATER"]
        text = v.text_tuned_later is not None
        if text:
            heads2.append("LATER AS TEXT")
        _table(heads2, [
            _weights_row("current", result.current, f"{v.current_earlier:.4f}", later[0], *([f"{v.text_current_later:.4f}"] if text else [])),
            _weights_row("tuned on earlier", v.tuned, f"{v.tuned_earlier:.4f}", later[1], *([f"{v.text_tuned_later:.4f}"] if text else [])),
        ], fit=_whole)
    _echo("")
    target = store.dir / "weights.json"
    if saved:
        what = ("the weights tuned on the earlier judgments and checked on the later ones" if result.saves is not None
                else "the best weights on all judgments (not checked on later ones)")
        _echo(f"Saved {what} to {saved}, with the evidence; `cybmem search` and `cybmem inject` use them from now on.")
        if overridden:
            _echo(f"Note: still overridden by {', '.join(overridden)}.", err=True)
    elif refused and not force:
        _echo(f"Not saved: {refused}. Add --force to save them anyway.", err=True)
        raise typer.Exit(REFUSED_EXIT)
    elif save:
        _echo("Nothing to save: no weights beat the current ones; weights.json left as it is.")
    else:
        advice = f"add --save to write the checked weights to {target}" if result.refusal is None else f"--save would keep the current weights: {result.refusal}"
        _echo(f"Not saved; {advice}.")


def _left_out_text(left_out: dict[str, int]) -> str:
    """``"used" judgments left out: 12 whose run's clock is implausible, 40 past half of the judgments``."""
    parts = [f"{left_out['clock']} whose run's clock is implausible" if left_out.get("clock") else "",
             f"{left_out['share']} past half of the judgments" if left_out.get("share") else "",
             f"{left_out['capped']} used run(s) past 3 a run" if left_out.get("capped") else ""]
    return '"used" judgments left out: ' + ", ".join(p for p in parts if p)


@command("eval", quick=True)
def eval_cmd(
    ctx: Ctx,
    judgments: JudgmentsOpt = None,
    weights_file: Annotated[Optional[Path], typer.Option("--weights", help="A weights JSON file to score (as tune --save writes it).", show_default=False)] = None,
    w_kw: Annotated[Optional[float], typer.Option("--w-kw", help="Score these weights: keyword weight (the others default to production's).", show_default=False, min=0)] = None,
    w_rec: Annotated[Optional[float], typer.Option("--w-rec", help="Recency weight.", show_default=False, min=0)] = None,
    w_lin: Annotated[Optional[float], typer.Option("--w-lin", help="Lineage weight.", show_default=False, min=0)] = None,
    w_vec: Annotated[Optional[float], typer.Option("--w-vec", help="Vector weight.", show_default=False, min=0)] = None,
    half_life: Annotated[Optional[float], typer.Option("--half-life-days", help="Recency time constant in days.", show_default=False, min=0)] = None,
    metric: MetricOpt = "mrr",
    k: Annotated[int, typer.Option("-k", help="Metric cut-off.", min=1)] = 10,
    derive: DeriveOpt = "issue,parent,used",
    progress: Annotated[Optional[bool], typer.Option("--progress/--no-progress", help="Progress bar on stderr (default: when stderr is a terminal).", show_default=False)] = None,
):
    """Score fixed weights on relevance judgments, beside the weights production uses now.

    Reports the metric over all judgments, on the earlier and the later half in time, and per kind
    of judgment. Weights come from --weights FILE and/or --w-kw/--w-rec/--w-lin/--w-vec/--half-life-days
    (unset ones: what production reads for the project).

    Example: cybmem eval -j qrels.jsonl --w-kw 0.6 --w-rec 0.3 --project web
    """
    from ..retrieval.tuning import evaluate_weights
    from ..retrieval.weights import Weights, load_weights, weights_for

    kinds = _metric_and_kinds(metric, derive)
    store = ctx.store()
    current = weights_for(ctx.settings, store).weights
    candidates = {"current": current}
    flags = {name: v for name, v in (("w_kw", w_kw), ("w_rec", w_rec), ("w_lin", w_lin), ("w_vec", w_vec),
                                     ("half_life_days", half_life)) if v is not None}
    if weights_file is not None and not weights_file.is_file():
        raise typer.BadParameter(f"no such file: {weights_file}", param_hint="--weights")
    if weights_file is not None or flags:
        base = load_weights([weights_file]).weights if weights_file is not None else current
        candidates["given"] = Weights.from_dict(flags, base=base)
    result = evaluate_weights(store, candidates, judgments=judgments, metric=metric, k=k, kinds=kinds, progress=progress)
    _warn(result.warnings)
    if ctx.json:
        _print_json(result.to_dict())
        return
    _echo(f"Judgments: {result.judgments} {result.source}" + (f"; {result.skipped} skipped" if result.skipped else "") + ".")
    kinds_seen = sorted({kind for r in result.rows.values() for kind in r["kinds"]})
    heads = ["", "W_KW", "W_REC", "W_LIN", "W_VEC", "HALF_LIFE_DAYS", result.label.upper(), "EARLIER", "LATER", *[x.upper() for x in kinds_seen]]
    fmt = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
    _table(heads, [_weights_row(name, r["weights"], fmt(r["all"]), fmt(r["earlier"]), fmt(r["later"]),
                                *[fmt(r["kinds"].get(x)) for x in kinds_seen]) for name, r in result.rows.items()], fit=_whole)


@command("report")
def report_cmd(
    ctx: Ctx,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the HTML pages (created).", show_default=False)],
    parameter: Annotated[Optional[list[str]], typer.Option("--parameter", "-P", help="NAME=VALUE for the notebooks' parameter cells, e.g. -P metric=ndcg -P k=5 -P judgments=judgments.jsonl (repeatable; names as in the notebooks, any case).", show_default=False)] = None,
    with_code: Annotated[bool, typer.Option("--with-code", help="Keep the notebooks' code cells in the pages.")] = False,
    timeout: Annotated[int, typer.Option("--timeout", help="Seconds allowed per notebook cell.", min=1)] = 600,
    progress: Annotated[Optional[bool], typer.Option("--progress/--no-progress", help="Cell progress bar on stderr (default: when stderr is a terminal).", show_default=False)] = None,
):
    """Execute the notebooks (history, lineage, issue ages, weight tuning, feedback; the fleet with -P dataset=DIR) headless and write self-contained HTML.

    One page per notebook plus index.html; figures are embedded images, nothing is fetched
    from the network. Progress goes to stderr, a line per notebook with how long it took.
    Without --project or --cwd, CYBERINE_MEMORY_PROJECT names the project, as for the notebooks.

    Example: cybmem report --out reports/web --project web -P metric=ndcg -P k=5
    """
    from ..operations.report import NOTEBOOKS, build_report, notebooks_dir, parse_parameters

    try:
        params = parse_parameters(parameter or [], [notebooks_dir() / n for n in NOTEBOOKS])
    except CybmemError as exc:
        raise typer.BadParameter(str(exc), param_hint="-P") from None
    if not ctx.project and ctx.cwd is None:  # the notebooks' project variable, before the current directory
        ctx.project = ctx.settings.project
    result = build_report(ctx.store(), out, parameters=params, with_code=with_code, timeout=timeout, progress=progress)
    if ctx.json:
        _print_json(result.to_dict())
        return
    _echo(f"Wrote {len(result.pages)} pages to {result.out_dir}; open {result.index}")


@command("doctor")
def doctor_cmd(
    ctx: Ctx,
    repair: Annotated[bool, typer.Option("--repair", help="Rebuild derived files (index.json, .cache/), remove old temp files and finish a killed `cybmem redact`; records and the ledger are otherwise never touched.")] = False,
    secrets: Annotated[bool, typer.Option("--secrets", help="Also scan records and issue titles/details for secrets (reports file, field and kind, never the secret; rewrites nothing).")] = False,
    all_projects: Annotated[bool, typer.Option("--all", help="Check every project of the memory root.")] = False,
    temp_age: Annotated[float, typer.Option("--temp-age", help="Temp files younger than this many seconds may belong to a running writer and are left alone.", min=0)] = 60,
):
    """Check a memory store: records, ledger, index, projects.json, embeddings, cache, temp files.

    Exit 0 when clean, 1 when errors or repairable problems remain (warnings do not count).

    Example: cybmem doctor --all --repair
    """
    from ..operations.doctor import doctor

    report = doctor(ctx.settings, project=ctx.project, cwd=ctx.cwd, all_projects=all_projects,
                    repair=repair, secrets=secrets, temp_age=temp_age)
    if ctx.json:
        _print_json(report.to_dict())
    else:
        _echo("\n".join(report.lines()))
    if not report.clean:
        raise typer.Exit(1)


# --- export ----------------------------------------------------------------------------

EXPORT_FORMATS = ("ndjson", "csv", "parquet", "sqlite", "prov")


class _WordGroup(typer.core.TyperGroup):
    """A command whose first word names one of its sub-commands (``words``), each with only its own
    options; another word is a bad ``hint`` (``cybmem export xml``)."""

    words: tuple[str, ...] = ()
    hint = ""

    def parse_args(self, ctx, args):
        # The options every command takes (--memory-dir, --cwd, --project) may come before the word,
        # as when export and fleet were one command each: the word moves to the front, so that they
        # reach its sub-command (``cybmem export --memory-dir DIR csv`` keeps working).
        if args and args[0].startswith("-") and args[0] not in ("-h", "--help"):
            takes_value = {o for c in self.commands.values() for p in c.params
                           if p.param_type_name == "option" and not p.is_flag and not p.count for o in p.opts}
            i = 0
            while i < len(args) and args[i].startswith("-"):
                i += 2 if args[i] in takes_value else 1
            if i < len(args):  # a word that is none of them is then named as such
                args = [args[i], *args[:i], *args[i + 1:]]
        return super().parse_args(ctx, args)

    def resolve_command(self, ctx, args):
        if args and not args[0].startswith("-") and args[0] not in self.words:
            raise typer.BadParameter(f"{args[0]!r} is not one of {', '.join(self.words)}", ctx=ctx, param_hint=self.hint)
        return super().resolve_command(ctx, args)


class _FormatGroup(_WordGroup):
    """``cybmem export FORMAT``: one sub-command per format."""

    words, hint = EXPORT_FORMATS, "FORMAT"


export_app = typer.Typer(
    cls=_FormatGroup, no_args_is_help=True, rich_markup_mode=None, add_completion=False,
    help="""Export a project's memory (or, with --all, every project's) for other tools.

    ndjson: the records as stored, one a line; csv: flat columns, lists as JSON text; parquet: a
    Hive-partitioned dataset (DIR/records|issues/machine=/project=/month=/) that each export
    appends to; sqlite: records (full-text search), issue_events and issues, for Datasette;
    prov: W3C PROV-JSON (and PROV-N) of the history. Every row carries its project.

    Example: cybmem export parquet --out ~/fleet --all
    """,
)
app.add_typer(export_app, name="export", short_help=_short_help(export_app.info.help))

AllOpt = Annotated[bool, typer.Option("--all", help="Export every project of the memory root.")]
TableOpt = Annotated[Optional[str], typer.Option("--table", help="records or issues (default: records for ndjson/csv, both for parquet/sqlite).", show_default=False)]
ProgressOpt = Annotated[Optional[bool], typer.Option("--progress/--no-progress", help="Progress bar on stderr (default: when stderr is a terminal).", show_default=False)]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace an existing regular file at --out (never a link, a device or a FIFO, never inside a memory root).")]


def _export_stores(ctx: Ctx, all_projects: bool) -> list:
    """The stores an export reads: the project (--cwd / --project) or, with --all, every one."""
    from ..exchange.export import all_stores

    if all_projects and ctx.project is not None:
        raise typer.BadParameter("give --project or --all, not both", param_hint="--all")
    return all_stores(ctx.settings.memory_dir, required=True) if all_projects else [ctx.store()]


def _export_tables(table: Optional[str]) -> Optional[list[str]]:
    """--table: one of the tables (None: the format's default)."""
    from ..exchange.export import TABLES

    if table is not None and table not in TABLES:
        raise typer.BadParameter(f"{table!r} is not one of {', '.join(TABLES)}", param_hint="--table")
    return None if table is None else [table]


def _export_text(fmt: str, ctx: Ctx, out: Optional[Path], table: Optional[str], all_projects: bool,
                 progress: Optional[bool], force: bool) -> None:
    """ndjson and csv: to --out, or to stdout without it (or with --out -)."""
    from ..exchange.export import export_csv, export_ndjson

    if out is not None and str(out) == "-":
        out = None  # stdout
    tables = _export_tables(table)
    if ctx.json and out is None:
        raise typer.BadParameter(f"--json prints a summary, but without --out the {fmt} data goes to stdout; add --out FILE", param_hint="--json")
    fn = export_ndjson if fmt == "ndjson" else export_csv
    result = fn(_export_stores(ctx, all_projects), out, table=tables[0] if tables else "records", progress=progress, force=force)
    _warn(result.warnings)
    if ctx.json:
        _print_json(result.to_dict())
    elif out is not None:  # else the data went to stdout
        t = result.tables[0]
        _echo(f"Wrote {_count(t.rows, 'record' if t.table == 'records' else 'issue event')} of "
              f"{_count(len(result.projects), 'project')} to {out}.")


TextOutOpt = Annotated[Optional[Path], typer.Option("--out", "-o", help="The file to write (default, or -: stdout).", show_default=False)]


@command("ndjson", group=export_app)
def export_ndjson_cmd(ctx: Ctx, out: TextOutOpt = None, table: TableOpt = None, all_projects: AllOpt = False,
                      progress: ProgressOpt = None, force: ForceOpt = False):
    """The records as stored (unknown fields kept), or with --table issues the ledger events, one JSON object a line.

    Example: cybmem export ndjson --project api | head -n 1
    """
    _export_text("ndjson", ctx, out, table, all_projects, progress, force)


@command("csv", group=export_app)
def export_csv_cmd(ctx: Ctx, out: TextOutOpt = None, table: TableOpt = None, all_projects: AllOpt = False,
                   progress: ProgressOpt = None, force: ForceOpt = False):
    """The records flattened (lineage and outcome as columns, lists as JSON text, times ISO 8601 UTC), or the events.

    Example: cybmem export csv --project api --table issues --out issues.csv
    """
    _export_text("csv", ctx, out, table, all_projects, progress, force)


@command("parquet", group=export_app)
def export_parquet_cmd(
    ctx: Ctx,
    out: Annotated[Path, typer.Option("--out", "-o", help="The dataset directory (created; each export appends to it).", show_default=False)],
    machine: Annotated[Optional[str], typer.Option("--machine", help="The machine partition (default: this host's name).", show_default=False)] = None,
    table: TableOpt = None,
    all_projects: AllOpt = False,
    progress: ProgressOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Accepted as by the other formats; a dataset is appended to, never replaced.")] = False,
):
    """Append to a Hive-partitioned Parquet dataset (DIR/records|issues/machine=/project=/month=/); many machines side by side.

    Example: cybmem export parquet --out ~/fleet --all --machine laptop
    """
    from ..errors import ValidationError
    from ..exchange.export import TABLES, export_parquet, validate_machine

    tables = _export_tables(table)
    if machine is not None:
        try:
            validate_machine(machine)
        except ValidationError as exc:
            raise typer.BadParameter(str(exc), param_hint="--machine") from None
    result = export_parquet(_export_stores(ctx, all_projects), out, machine=machine, tables=tables or TABLES, progress=progress)
    _warn(result.warnings)
    if ctx.json:
        _print_json(result.to_dict())
        return
    what = {"records": "record", "issues": "issue event"}
    parts = [f"{_count(t.new, 'new ' + what[t.table])} ({_count(len(t.files), 'file')}; {t.rows - t.new} already there)"
             for t in result.tables]
    _echo(f"Wrote {' and '.join(parts)} to {out} as machine {result.machine}.")


@command("sqlite", group=export_app)
def export_sqlite_cmd(
    ctx: Ctx,
    out: Annotated[Path, typer.Option("--out", "-o", help="The database file (created, or updated in place).", show_default=False)],
    table: TableOpt = None,
    all_projects: AllOpt = False,
    progress: ProgressOpt = None,
    force: ForceOpt = False,
):
    """records (full-text search), issue_events and issues (the current fold), for Datasette and sqlite-utils.

    Example: cybmem export sqlite --all --out memory.db
    """
    from ..exchange.export import TABLES, export_sqlite

    tables = _export_tables(table)
    result = export_sqlite(_export_stores(ctx, all_projects), out, tables=tables or TABLES, progress=progress, force=force)
    _warn(result.warnings)
    if ctx.json:
        _print_json(result.to_dict())
        return
    parts = [f"{t.table} {t.rows} ({t.new} new" + (f", {t.updated} updated)" if t.table != "issues" else ")") for t in result.tables]
    _echo(f"Wrote {out}: {', '.join(parts)}"
          + ("; full-text search on task and summary (records_fts)." if any(t.table == "records" for t in result.tables) else "."))


@command("prov", group=export_app)
def export_prov_cmd(
    ctx: Ctx,
    out: Annotated[Path, typer.Option("--out", "-o", help="The PROV-JSON file.", show_default=False)],
    chain: Annotated[Optional[str], typer.Option("--chain", help="Only the previousRunId chain of this run (id or unique prefix), walked both ways.", show_default=False)] = None,
    provn: Annotated[bool, typer.Option("--provn", help="Also write PROV-N next to the PROV-JSON file (same name, .provn).")] = False,
    all_projects: AllOpt = False,
    force: ForceOpt = False,
):
    """W3C PROV-JSON of the history (or of one --chain), plus PROV-N with --provn.

    Example: cybmem export prov --project web --chain 9b6b1e00 --out chain.prov.json --provn
    """
    from ..exchange.prov import export_prov

    if chain is not None and all_projects:
        raise typer.BadParameter("a chain lies inside one project: drop --all", param_hint="--chain")
    result = export_prov(_export_stores(ctx, all_projects), out, chain=chain, provn=provn, force=force)
    _warn(result.warnings)
    if ctx.json:
        _print_json(result.to_dict())
        return
    c = result.counts
    files = " and ".join(f"{p} ({'PROV-N' if k == 'provn' else 'PROV-JSON'})" for k, p in result.files.items())
    _echo(f"Wrote {files}: {c['activities']} activities, {c['entities']} entities, {c['agents']} agents, "
          f"{c['relations']} relations ({', '.join(f'{k} {v}' for k, v in c.items() if k not in ('activities', 'entities', 'agents', 'relations'))}).")


# --- the MCP server -------------------------------------------------------------------


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
    http://127.0.0.1:PORT is served and a request must arrive whole within 5 seconds. Add it to an
    MCP client's configuration as the command `cybmem mcp` (USAGE.md, "Memory for agents mid-run").

    Example: cybmem mcp --project web
    """
    from ..mcp_server import serve

    serve(ctx.settings, cwd=ctx.cwd, project=ctx.project, http=http, allow_writes=allow_writes)


# --- fleet ----------------------------------------------------------------------------

FLEET_JOBS = ("search", "issues", "report")


class _JobGroup(_WordGroup):
    """``cybmem fleet ACTION``: one sub-command per job."""

    words, hint = FLEET_JOBS, "ACTION"


fleet_app = typer.Typer(
    cls=_JobGroup, no_args_is_help=True, rich_markup_mode=None, add_completion=False,
    help="""Search, fold issues and report over every machine's exported memory, on Dask.

    search QUERY: the top k records of the whole fleet, ranked as `cybmem search` ranks one store
    holding them all. issues: the issue fold of every machine and project (counts, or --open).
    report: issue-age histograms and the lineage summary per machine and project (PNG, CSV and
    HTML) in --out. A small dataset runs in this process, a larger one on a LocalCluster (the last
    line says which); --scheduler chooses, or names a running cluster. A part file that cannot be
    read is skipped with one line naming it; a run id that several machines exported counts once,
    for the first that exported it, and its hit names them all.

    Example: cybmem fleet search "flaky login test" --dataset ~/fleet -k 5
    """,
)
app.add_typer(fleet_app, name="fleet", short_help=_short_help(fleet_app.info.help))

DatasetOpt = Annotated[Optional[Path], typer.Option("--dataset", "-d", help="The Parquet dataset every machine exports to (`cybmem export parquet --out DIR`).", show_default=False)]
SchedulerOpt = Annotated[str, typer.Option("--scheduler", help="auto: in this process for a small dataset, else a LocalCluster; inline; local (a LocalCluster); or a Dask scheduler's address (tcp://host:8786).")]
WorkersOpt = Annotated[int, typer.Option("--workers", help="LocalCluster worker processes.", min=1)]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds to wait for --scheduler to answer.", min=0.1)]
MachinesOpt = Annotated[Optional[list[str]], typer.Option("--machine", "-m", help="Only this machine (repeat for more).", show_default=False)]
ProjectsOpt = Annotated[Optional[list[str]], typer.Option("--project", "-p", help="Only this project (repeat for more).", show_default=False)]
NowOpt = Annotated[Optional[str], typer.Option("--now", help="Measure ages to this moment (epoch ms or ISO date; default: now).", show_default=False)]


@contextlib.contextmanager
def _fleet(dataset, scheduler, workers, timeout, machine, project, progress):
    """The fleet the shared options describe; the part files it skipped are said once."""
    from ..exchange.fleet import Fleet

    if dataset is None:
        raise typer.BadParameter("give the dataset directory (`cybmem export parquet --out DIR` writes it)", param_hint="--dataset")
    with Fleet(dataset, scheduler=scheduler, machines=machine, projects=project, workers=workers, progress=progress,
               timeout=timeout) as fleet:
        _warn(fleet.skipped)
        yield fleet


@command("search", group=fleet_app, project=False, memory=False, free_text=True)
def fleet_search_cmd(
    ctx: Ctx,
    query: Annotated[Optional[str], typer.Argument(help="What to look for (free text).", show_default=False)] = None,
    dataset: DatasetOpt = None, scheduler: SchedulerOpt = "auto", workers: WorkersOpt = 2, timeout: TimeoutOpt = 10.0,
    machine: MachinesOpt = None, project: ProjectsOpt = None,
    k: Annotated[int, typer.Option("-k", "--top", help="How many results.", min=1)] = 10,
    explain_: Annotated[bool, typer.Option("--explain", help="Each result's per-axis contributions and the weights.")] = False,
    as_of: AsOfOpt = None,
    progress: ProgressOpt = None,
):
    """The top k records of the whole fleet, ranked as `cybmem search` ranks one store holding them all.

    Example: cybmem fleet search "flaky login test" --dataset ~/fleet -k 5
    """
    if not query:
        raise typer.BadParameter("search needs a QUERY", param_hint="QUERY")
    with _fleet(dataset, scheduler, workers, timeout, machine, project, progress) as fleet:
        result = fleet.search(query, k=k, as_of=_moment(as_of, "--as-of"))
        if ctx.json:
            _print_json(result.to_dict(explain=explain_))
            return
        if not result.hits:
            _echo(f"No matching records in {result.records} records of {len(fleet.groups)} projects.")
            _echo(f"Ran {fleet.ran_on}.")
            return
        rows = [[str(h.rank), f"{h.score:.3f}", h.machine + ("*" if h.claimed_by else ""), h.project, h.run_id[:8],
                 _when(h.ended_at_ms), h.state, h.task] for h in result.hits]
        _table(["#", "SCORE", "MACHINE", "PROJECT", "RUN", "ENDED (UTC)", "STATE", "TASK"], rows)
        if explain_:
            w = result.weights
            _echo("")
            _echo(f"weights: w_kw={w.w_kw:g} w_rec={w.w_rec:g} w_lin={w.w_lin:g} w_vec={w.w_vec:g} half_life_days={w.half_life_days:g}"
                  + (f"  as of {_when(result.as_of)} UTC" if result.as_of is not None else ""))
            for h in result.hits:
                _echo(f"{h.rank:>2}. {h.run_id[:8]}  {_fmt_axes(h.contributions)}  = {h.score:.3f}")
        for h in (h for h in result.hits if h.claimed_by):
            _echo(f"* run {h.run_id[:8]} was exported by {', '.join(h.claimed_by)}"
                  + (" with different records" if h.conflict else ", the same record")
                  + f"; shown as {h.claimed_by[0]}, the first to export it.")
        _echo(f"Ran {fleet.ran_on}.")


@command("issues", group=fleet_app, project=False, memory=False)
def fleet_issues_cmd(
    ctx: Ctx,
    dataset: DatasetOpt = None, scheduler: SchedulerOpt = "auto", workers: WorkersOpt = 2, timeout: TimeoutOpt = 10.0,
    machine: MachinesOpt = None, project: ProjectsOpt = None,
    open_: Annotated[bool, typer.Option("--open", help="List the open issues, oldest first, instead of counts per machine and project.")] = False,
    limit: Annotated[int, typer.Option("--limit", "-n", help="--open: show at most N (0: all).", min=0)] = 20,
    now: NowOpt = None,
    progress: ProgressOpt = None,
):
    """The issue fold of every machine and project: counts per machine and project, or --open.

    Example: cybmem fleet issues --dataset ~/fleet --open -n 10
    """
    now_ms = parse_time(now, "--now")
    with _fleet(dataset, scheduler, workers, timeout, machine, project, progress) as fleet:
        ran = f"Ran {fleet.ran_on}."
        if open_:
            opened = fleet.open_issues(now=now_ms)
            shown = opened if not limit else opened.head(limit)
            if ctx.json:
                _print_json(json.loads(shown.drop(columns=["openAge", "timeToResolve"])
                                       .to_json(orient="records", date_format="epoch", date_unit="ms")))
                return
            if not len(opened):
                _echo(f"No open issues in {len(fleet.groups)} projects.")
                _echo(ran)
                return
            rows = [[m, p, i, _when(int(o.value // 1_000_000)), f"{a:.1f}", st, t]
                    for m, p, i, o, a, st, t in zip(shown["machine"], shown["project"], shown["issueId"],
                                                     shown["openedAt"].dt.as_unit("ns"), shown["ageDays"], shown["state"], shown["title"])]
            _table(["MACHINE", "PROJECT", "ISSUE", "OPENED (UTC)", "AGE (D)", "STATE", "TITLE"], rows, fit=shorten)
            if len(shown) < len(opened):
                _echo(f"... {len(opened) - len(shown)} more open issues (-n 0 shows all)")
            _echo(ran)
            return
        summary = fleet.issue_summary(now=now_ms)
        if ctx.json:
            _print_json(json.loads(summary.to_json(orient="records")))
            return
        rows = [[r.machine, r.project, str(r.issues), str(r.opened + r.reopened), str(r.resolved), str(r.wontfix),
                 str(r.reopens), "-" if r.medianOpenDays != r.medianOpenDays else f"{r.medianOpenDays:.1f}"]
                for r in summary.itertuples()]
        _table(["MACHINE", "PROJECT", "ISSUES", "OPEN", "RESOLVED", "WONTFIX", "REOPENS", "MEDIAN OPEN AGE (D)"], rows,
               fit=_whole)
        _echo(ran)


@command("report", group=fleet_app, project=False, memory=False)
def fleet_report_cmd(
    ctx: Ctx,
    out: Annotated[Path, typer.Option("--out", "-o", help="The directory to write the figures and tables into.", show_default=False)],
    dataset: DatasetOpt = None, scheduler: SchedulerOpt = "auto", workers: WorkersOpt = 2, timeout: TimeoutOpt = 10.0,
    machine: MachinesOpt = None, project: ProjectsOpt = None,
    now: NowOpt = None,
    progress: ProgressOpt = None,
):
    """Issue-age histograms and the lineage summary per machine and project (PNG, CSV and HTML) in --out.

    Example: cybmem fleet report --dataset ~/fleet --out fleet-report
    """
    now_ms = parse_time(now, "--now")
    with _fleet(dataset, scheduler, workers, timeout, machine, project, progress) as fleet:
        result = fleet.report(out, now=now_ms)
        if ctx.json:
            _print_json(result.to_dict())
            return
        names = ", ".join(Path(f).name for f in result.files)
        n = _count
        _echo(f"Wrote {names} to {out}: {n(result.runs, 'run')} and {n(result.issues, 'issue')} of "
              f"{n(result.projects, 'project')} on {n(result.machines, 'machine')}."
              + (f" {n(result.claimed, 'run id')} exported by more than one machine or project count once."
                 if result.claimed else ""))
        _echo(f"Ran {fleet.ran_on}.")


def main() -> None:
    """Console-script entry point: runs the app and translates Click's usage errors (JSON under --json).

    Ctrl-C, wherever it lands (a command's body, a notebook kernel's event loop, a Dask client), ends
    the command with exit code 130 and one line on stderr, ``cybmem: interrupted``, with no
    traceback: every file cybmem writes goes to a temp file that is renamed into place only when
    whole, and the unwinding removes the temp file. A second Ctrl-C cuts that unwinding short; one
    more after the line ends the process at once.
    """
    _startup.one_command_process = True
    signals.catch_sigint()
    try:
        code = _main(sys.argv[1:])
    except KeyboardInterrupt:
        code = signals.INTERRUPTED_EXIT
    except BaseException:  # noqa: BLE001 - re-raised unless Ctrl-C caused it
        if not signals.interrupted():
            raise
    # typer turns a KeyboardInterrupt into exit code 130 (no command exits so otherwise); pyarrow's
    # readers take SIGINT for themselves while they run and raise it, past the handler.
    if signals.interrupted() or code == signals.INTERRUPTED_EXIT:
        signals.restore_sigint()
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            from ..progress import end_line

            end_line()  # a progress bar cut short: the message starts a line of its own
        _echo("cybmem: interrupted", err=True)
        sys.exit(signals.INTERRUPTED_EXIT)
    sys.exit(code)


def _main(args: list[str]) -> int:
    as_json = "--json" in args
    command_ = typer.main.get_command(_startup.named_only(app, args))
    try:
        code = command_.main(args=args, prog_name="cybmem", standalone_mode=False)
    except UsageError as exc:
        if as_json:
            _error(exc.format_message(), exc.exit_code, True)
        else:
            exc.show()
        return exc.exit_code
    except typer.Abort:
        _echo("Aborted!", err=True)
        return 1
    except ClickException as exc:
        exc.show()
        return exc.exit_code
    return code if isinstance(code, int) else 0


def console() -> None:
    """The ``cybmem`` console script: :func:`main`, ended without the interpreter's teardown after
    a command that opted in (:func:`cybmem.cli._startup.end`)."""
    _startup.end(main)


if __name__ == "__main__":
    console()
