"""The commands that write: ``rebuild``, ``write``, ``supersede``, ``mark``, ``redact``; each calls one
library function and renders its answer. The write hook never fails the orchestrator: it warns on
stderr in one line and exits 0."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from . import signals
from ..errors import CybmemError
from ..memory import Memory, NotWritten
from .framework import ClickException, Ctx, command
from .render import count, echo, print_json, warn, when

__all__ = ["rebuild_cmd", "write_cmd", "supersede_cmd", "mark_cmd", "redact_cmd"]


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
    done = ctx.memory.rebuild(full=full)
    warn(done.warnings)
    if ctx.json:
        print_json(done.to_dict())
        return
    store = done.store
    if done.archived:
        typer.echo(f"Rebuilt {store.index_path} from {done.records} records: {done.entries} entries, {done.archived} "
                   f"archived (older than the newest {store.index_cap}; listed in {store.archive_path.name}).")
    else:
        echo(f"Rebuilt {store.index_path} from {done.records} records.")
    if done.retuned:
        echo(done.retuned[0].upper() + done.retuned[1:] + ".")


def _read_input(source: str, hint: str = "RUN_JSON") -> bytes:
    """The bytes of the run a RUN_JSON argument names (a path, or - for stdin)."""
    if source == "-":
        return sys.stdin.buffer.read()
    try:
        return Memory.read_run(source)
    except CybmemError as exc:
        raise typer.BadParameter(str(exc), param_hint=hint) from None


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
    source = run_json or "-"
    # Hook mode reads its input inside the library's call, so that what cannot be read is one warning.
    run = (sys.stdin.buffer if source == "-" else Path(source)) if hook else _read_input(source)
    # A hook's timeout (SIGTERM) while the model thinks costs the distilled outcome, not the run.
    result = ctx.memory.write(run, run_id=run_id, parent_run_id=parent, chat_session_id=chat, hook=hook,
                              named=(ClickException,), while_distilling=signals.sigterm_abandons)
    if isinstance(result, NotWritten):
        warn([result.message])
        raise typer.Exit(0)
    if result.redacted:
        echo(f"cybmem: redacted secrets before writing: {', '.join(result.redacted)}", err=True)
    warn(result.warnings)
    if ctx.json:
        print_json(result.to_dict())
        return
    opened = [e.issueId for e in result.events if e.event in ("opened", "reopened")]
    resolved = [e.issueId for e in result.events if e.event in ("resolved", "wontfix")]
    msg = f"Wrote {result.record.runId} ({result.record.state}) to project {result.store.slug}"
    if opened:
        msg += f"; opened {', '.join(opened)}"
    if resolved:
        msg += f"; resolved {', '.join(resolved)}"
    echo(msg + ".")


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
    store = ctx.memory.store()
    result = ctx.memory.supersede(old_run_id, _read_input(run_json), project=store, run_id=run_id,
                                  while_distilling=signals.sigterm_abandons)
    if ctx.json:
        print_json(result.to_dict())
    else:
        old = result.supersedes
        echo(f"Wrote {result.record.runId}, superseding {old}; `cybmem show {old}` now renders the correction.")


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
    marked = ctx.memory.mark(issue_id, event, by=by, detail=detail)
    if ctx.json:
        print_json([e.to_dict() for e in marked.written])
    elif marked.written:
        echo(f"{issue_id}: {marked.before} -> {marked.after}")
    else:
        echo(f"{issue_id} is already {marked.before}; nothing appended.")


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
    result = ctx.memory.redact(None if everywhere else [run_id], secrets=texts, patterns=not no_patterns)
    if ctx.json:
        print_json(result.to_dict())
        _redact_exit(result)
        return
    if result.completed is not None:
        done = result.completed
        echo(f"Finished an interrupted redaction of {count(len(done.targets), 'run')} in project {done.project} "
              f"(begun {when(done.started_at)}).")
    if not result.changed:
        echo(f"Nothing to redact in {'run ' + result.run_id + ' of ' if result.run_id else ''}project {result.project}.")
    else:
        what = []
        if result.run_id and result.fields:
            what.append(f"record ({', '.join(result.fields)})")
        elif result.runs:
            what.append(f"{count(len(result.runs), 'record')}")
        if result.ledger_lines:
            what.append(f"{count(result.ledger_lines, 'ledger line')}")
        if result.renamed:
            what.append("issue " + ", ".join(f"{old} -> {new}" for old, new in result.renamed.items()))
        if result.records_relinked:
            what.append(f"the issue list of {count(len(result.records_relinked), 'other record')}")
        if result.archive_lines:
            what.append(f"{count(result.archive_lines, 'archive-summary.md line')}")
        found = ([f"{count(result.replaced, 'occurrence')} of the given text"
                  + ("s" if len(texts) > 1 else "")] if result.replaced else []) + result.kinds
        who = (f"run {result.run_id} in project " if result.run_id else f"{len(result.runs)} runs in project "
               if result.runs else "project ")
        echo(f"Redacted {who}{result.project}: {'; '.join(what)}" + (f" ({', '.join(found)})" if found else "") + ".")
        if result.embeddings_dropped:
            echo(f"Dropped {count(result.embeddings_dropped, 'vector')} made from the "
                  "old text (`cybmem embed` makes new ones).")
    for path in result.rebuilt:
        echo(f"Rebuilt {path}.")
    for path in result.emptied:
        echo(f"Emptied {path} (the next read rebuilds it).")
    for line in result.exports:
        echo(f"Export: {line}.")
    if result.remaining:
        shown = result.remaining[:8]
        warn(f"a given text is still in {path}" for path in shown)
        if len(result.remaining) > len(shown):
            warn([f"... and in {len(result.remaining) - len(shown)} more files (--json lists them all; "
                   "--everywhere redacts every run that holds it)"])
    warn(result.unreachable)
    _redact_exit(result)
    if texts:
        echo(f"No file of project {result.project} holds a given text any more.")


def _redact_exit(result) -> None:
    """Exit 1 while a copy is left: a file that still holds a given text, an export cybmem cannot edit."""
    if result.remaining or result.unreachable:
        raise typer.Exit(1)

