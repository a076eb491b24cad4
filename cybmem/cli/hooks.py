"""``cybmem hook`` (what an agent's lifecycle hooks run: :mod:`cybmem.hooks.entry`) and ``cybmem hooks
install|uninstall|status`` (putting those hooks in a client's settings: :meth:`cybmem.memory.Memory.install_hooks`
and its neighbours)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from .framework import Ctx, WordGroup, app, command, short_help
from .render import echo, print_json

__all__ = ["hook_cmd", "hooks_app", "install_cmd", "uninstall_cmd", "status_cmd"]

ClientArg = Annotated[str, typer.Argument(help="The agent whose hook runs this: claude-code or codex.", metavar="CLIENT", show_default=True)]


@command("hook", project=False, memory=False, as_json=False)
def hook_cmd(ctx: Ctx, client: ClientArg = "claude-code"):
    """What an agent's lifecycle hooks run: reads the hook's JSON payload on stdin and acts by its event.

    SessionStart: the project's latest runs and open issues, as one-line pointers (at most 1,200
    characters), for the model. UserPromptSubmit: the MEMORY block for the prompt (nothing when no
    run of the project relates to it). Stop and SubagentStop: the turn written as one record (a
    subagent's with the turn that started it as its parent). SessionEnd: the turns that never
    reached Stop (interrupted, crashed), from the transcript. A turn is written once, whichever
    hook sees it first. It never fails the agent: exit code 0 whatever happens, one line on stderr
    when something went wrong, and it gives up after CYBERINE_HOOK_DEADLINE seconds (default 10).
    `cybmem hooks install CLIENT` puts it in the agent's settings.

    Example: echo '{"hook_event_name": "SessionStart", "session_id": "s1", "cwd": "/home/dev/web"}' | cybmem hook claude-code
    """
    from ..hooks.entry import main

    raise typer.Exit(main([client]))


# --- cybmem hooks install | uninstall | status -------------------------------------------------

_NAMES = {"claude-code": "Claude Code", "codex": "Codex"}


class _ActionGroup(WordGroup):
    """``cybmem hooks ACTION``: install, uninstall or status."""

    words, hint = ("install", "uninstall", "status"), "ACTION"


hooks_app = typer.Typer(
    cls=_ActionGroup, no_args_is_help=True, rich_markup_mode=None, add_completion=False,
    help="""Put cybmem's hooks in an agent's settings, take them out, or see where they are.

    claude-code: ~/.claude/settings.json (--project DIR: DIR/.claude/settings.json). codex:
    $CODEX_HOME/hooks.json (default ~/.codex; --project DIR: DIR/.codex/hooks.json), trusted through
    Codex's own app-server. The hooks run `cybmem hook CLIENT` by the absolute path of the cybmem
    that installed them: memory at each session start and prompt, a record of each turn.

    Example: cybmem hooks install claude-code
    """,
)
app.add_typer(hooks_app, name="hooks", short_help=short_help(hooks_app.info.help))

InstallClientArg = Annotated[str, typer.Argument(help="The agent: claude-code or codex.", metavar="CLIENT", show_default=True)]
ProjectDirOpt = Annotated[Optional[Path], typer.Option("--project", help="A project's settings (DIR/.claude/settings.json, DIR/.codex/hooks.json) instead of the user's.", metavar="DIR", show_default=False)]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the change to the settings file as a diff; write nothing.")]
CodexOpt = Annotated[Optional[Path], typer.Option("--codex", help="The codex executable that trusts the hooks (default: codex on PATH).", metavar="PATH", show_default=False)]


def _client(client: str) -> str:
    if client not in _NAMES:
        raise typer.BadParameter(f"{client!r} is not one of {', '.join(_NAMES)}", param_hint="CLIENT")
    return client


def _project(project: Optional[Path]) -> Optional[Path]:
    if project is not None and not project.is_dir():
        raise typer.BadParameter(f"{project} is not a directory", param_hint="--project")
    return project


def _executable() -> list[str] | str:
    """The cybmem that runs this, as a hook runs it: the console script by its absolute path (a
    hook runs in the agent's environment, from any directory), else this Python with ``-m cybmem.cli``."""
    script = sys.argv[0]
    found = shutil.which(script) if os.path.basename(script) == "cybmem" else None
    if found:
        return os.path.abspath(found)
    return [sys.executable, "-m", "cybmem.cli"]


@command("install", group=hooks_app, project=False, memory=False)
def install_cmd(ctx: Ctx, client: InstallClientArg = "claude-code", project: ProjectDirOpt = None,
                dry_run: DryRunOpt = False, codex: CodexOpt = None):
    """Add cybmem's hooks to an agent's settings file, keeping everything else in it.

    Claude Code gets SessionStart, UserPromptSubmit, Stop, SubagentStop and SessionEnd; Codex the
    same but SubagentStop. Every other key and every hook of your own stays; installing twice
    changes nothing; the file is replaced atomically, and the file as it was is kept beside it
    (settings.json.cybmem-backup) until uninstall restores it. For Codex, the installer then has
    Codex trust the hooks through its app-server (hooks/list, config/batchWrite), or says in one
    line how to give that review yourself.

    Example: cybmem hooks install claude-code --project ~/src/web --dry-run
    """
    change = ctx.memory.install_hooks(_client(client), _executable(), project_dir=_project(project), dry_run=dry_run,
                                      codex=str(codex) if codex else None)
    _render(ctx, change, dry_run, "install")


@command("uninstall", group=hooks_app, project=False, memory=False)
def uninstall_cmd(ctx: Ctx, client: InstallClientArg = "claude-code", project: ProjectDirOpt = None,
                  dry_run: DryRunOpt = False):
    """Take cybmem's hooks out of an agent's settings file, and only them.

    When nothing else in the file changed since they went in, the file comes back byte for byte as
    it was (or goes, when there was none); else it is written without them, in its own indent.

    Example: cybmem hooks uninstall claude-code
    """
    change = ctx.memory.uninstall_hooks(_client(client), project_dir=_project(project), dry_run=dry_run)
    _render(ctx, change, dry_run, "uninstall")


def _render(ctx: Ctx, change, dry_run: bool, action: str) -> None:
    name = _NAMES[change.client]
    if ctx.json:
        print_json({**change.to_dict(), "dryRun": dry_run, **({"diff": change.diff()} if dry_run else {})})
        return
    if dry_run:
        diff = change.diff()
        echo(diff.rstrip("\n") if diff else f"No change to {change.path}.")
        echo("(dry run: nothing written)")
        return
    if not change.changed:
        echo(f"cybmem's hooks for {name} are already in {change.path}; nothing changed." if action == "install"
             else f"No hook of cybmem's in {change.path}; nothing changed.")
    elif action == "install":
        echo(f"Installed cybmem's hooks for {name} in {change.path} ({', '.join(change.events)}): {change.command}")
        if change.backup is not None:
            echo(f"The file as it was: {change.backup}")
    elif change.after is None:
        echo(f"Removed cybmem's hooks for {name}: {change.path} did not exist before them, and is gone again.")
    else:
        restored = change.backup is not None and not change.backup.exists()
        echo(f"Removed cybmem's hooks for {name} from {change.path}"
             + ("; the file is back as it was before them." if restored else "; everything else in it stays."))
    for note in change.notes:
        echo(note)


@command("status", group=hooks_app, project=False, memory=False)
def status_cmd(ctx: Ctx, client: Annotated[Optional[str], typer.Argument(help="claude-code or codex (default: both).", metavar="CLIENT", show_default=False)] = None,
               project: ProjectDirOpt = None, codex: CodexOpt = None):
    """Say which of cybmem's hooks are installed where, and whether they can run.

    For each agent (or the one named): the settings file, the events that run cybmem's hook and its
    command, the events that lack it, a command that cannot run; for Codex, whether Codex trusts them.

    Example: cybmem hooks status --json
    """
    clients = [_client(client)] if client else list(_NAMES)
    found = ctx.memory.hooks_status(clients, project_dir=_project(project), codex=str(codex) if codex else None)
    if ctx.json:
        print_json([st.to_dict() for st in found])
        return
    for st in found:
        name = _NAMES[st.client]
        if st.installed:
            commands = ", ".join(dict.fromkeys(st.events.values()))
            echo(f"{name}: installed in {st.path} ({', '.join(st.events)}): {commands}")
            if st.missing:
                echo(f"  missing on: {', '.join(st.missing)} (`cybmem hooks install {st.client}` adds them)")
            if st.trust:
                untrusted = [e for e, s in st.trust.items() if s != "trusted"]
                echo("  Codex trusts them" if not untrusted else f"  Codex does not run them yet ({', '.join(untrusted)}: "
                     f"{', '.join(sorted(set(st.trust[e] for e in untrusted)))}); `cybmem hooks install codex` trusts them")
        else:
            echo(f"{name}: not installed ({st.path}{'' if st.exists else ': no such file'})")
        for problem in st.problems:
            echo(f"  problem: {problem}")
