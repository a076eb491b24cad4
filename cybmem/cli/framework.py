"""The command framework of ``cybmem``: the Typer app, the options every project command shares,
the command decorator that adds them (:func:`command`), free-text arguments that start with a
dash, the record filter options, moments (--since, --until, --as-of) and the one translation of
errors (:func:`run_command` for library errors, :func:`error_line` for the console script's usage
errors): ``Error: ...`` on stderr and exit 1 (usage mistakes: exit 2); under ``--json`` the error
is a JSON object on stderr with the same exit code. The command modules register on :data:`app`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

from .. import __version__
from . import _startup, signals
from ..answers import error_message
from ..errors import CybmemError
from ..memory import Memory
from ..settings import Settings
from .render import echo, warn

__all__ = ["UsageError", "ClickException", "app", "Ctx", "command", "run_command", "error_line", "free_text_args",
           "short_help", "moment", "WordGroup", "MemoryDirOpt", "CwdOpt", "ProjectOpt", "JsonOpt", "OffsetOpt",
           "AsOfOpt", "ProgressOpt"]

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
        echo(f"cybmem {__version__}")
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
    """What the shared options chose: the memory root, the project, the output form; the library
    handle on them (:attr:`memory`, the environment read once)."""

    memory_dir: Optional[Path] = None
    cwd: Optional[Path] = None
    project: Optional[str] = None
    json: bool = False

    @functools.cached_property
    def memory(self) -> Memory:
        return Memory.from_env(memory_dir=self.memory_dir, cwd=self.cwd, project=self.project)

    @property
    def settings(self) -> Settings:
        return self.memory.settings


def error_line(message: str, code: int, as_json: bool) -> None:
    """An error on stderr: ``Error: ...``, or under ``--json`` a JSON object with the exit code."""
    if signals.interrupted():
        return  # what failed because of Ctrl-C: main says "interrupted" instead
    if as_json:
        echo(json.dumps({"error": message, "exitCode": code}, ensure_ascii=False), err=True)
    else:
        echo(f"Error: {message}", err=True)


def run_command(fn: Callable, ctx: Ctx, kwargs: dict) -> Any:
    """Call a command body; library errors become ``Error: ...`` and exit 1 (the one translator)."""
    try:
        return fn(ctx, **kwargs)
    except UsageError as exc:
        if ctx.json:
            error_line(exc.format_message(), 2, True)
            raise typer.Exit(2) from None
        raise
    except BrokenPipeError:
        raise typer.Exit(0) from None
    except (CybmemError, OSError) as exc:  # OSError: a store broken in a way the library did not name
        error_line(error_message(exc), 1, ctx.json)
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
            warn([f"took {lone!r} as the text: {self.name} has no such option "
                   "(put -- before a text that starts with a dash)"])
        return super().parse_args(ctx, args)


def short_help(doc: str | None) -> str:
    """The first paragraph of a command's help, whole, for `cybmem --help`'s list of commands
    (Click would cut it to the terminal's width minus the names, ending it in "...")."""
    return " ".join(inspect.cleandoc(doc or "").split("\n\n", 1)[0].split())


def command(name: str, *, project: bool = True, memory: bool = True, as_json: bool = True, filters: bool = False,
            free_text: bool = False, quick: bool = False, teardown: bool = True, group: Optional[typer.Typer] = None):
    """Register a command whose body takes a :class:`Ctx` first; adds the shared options to it.

    ``quick``: the command is on the dispatch path and never needs pandas; in the console script it
    gets the start-up tricks of :mod:`cybmem.cli._startup` (plain option parsing, no pandas, a quick
    pyarrow.compute when it reads a store, no interpreter teardown). ``teardown=False``: only the
    last of those, for a command that needs pandas but reads Parquet (Arrow's thread pools, torn down
    with the interpreter, abort a process now and then: :func:`cybmem.cli._startup.end`). ``filters``: the record
    filter options (--state, --since, --until, --grep, --agent, --issue) are added, and the
    body gets them as one record filter argument ``f`` (:meth:`cybmem.memory.Memory.record_filter`). ``free_text``:
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
            _startup.quick_ran = quick or not teardown
            with _startup.quick_imports(compute=memory) if quick else contextlib.nullcontext():
                return run_command(body, ctx, kwargs)

        del wrapper.__wrapped__
        wrapper.__signature__ = sig.replace(parameters=params)
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        cls = _FreeTextCommand if free_text else typer.core.TyperCommand
        if quick:
            cls = _startup.quick_class(cls, {p.name: c for p in params if (c := _startup.plain_coercion(p.annotation))})
        (group or app).command(name, cls=cls, short_help=short_help(fn.__doc__))(wrapper)
        return fn

    return deco



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
def moment(value: Optional[str], param: str, *, end_of_day: bool = False) -> Optional[int]:
    """--since / --until / --as-of (:meth:`cybmem.memory.Memory.moment`: epoch ms or ISO; a bare
    year, month or date means its start, or with ``end_of_day`` (--until) its last millisecond), held
    to the range a record's times may hold; a bad one is a usage error naming ``param``."""
    if value is None or not value.strip():
        return None
    try:
        return Memory.moment(value, param, end_of_day=end_of_day)
    except CybmemError as exc:
        raise typer.BadParameter(str(exc).removeprefix(f"{param} "), param_hint=param) from None


def _record_filter(since, until, state, grep, agent, issue):
    try:
        return Memory.record_filter(since=moment(since, "--since"), until=moment(until, "--until", end_of_day=True),
                                    state=state, grep=grep, agent=agent, issue=issue)
    except CybmemError as exc:
        raise typer.BadParameter(str(exc), param_hint="--state") from None



AsOfOpt = Annotated[
    Optional[str],
    typer.Option("--as-of", help="Replay memory as of a moment: epoch milliseconds or an ISO date; later records are ignored and recency is measured from then.", show_default=False),
]
ProgressOpt = Annotated[Optional[bool], typer.Option("--progress/--no-progress", help="Progress bar on stderr (default: when stderr is a terminal).", show_default=False)]


class WordGroup(typer.core.TyperGroup):
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

