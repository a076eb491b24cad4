"""What an agent's session is told when it starts (the SessionStart hook): the project's latest runs
and its open issues, each as the MEMORY block's one-line pointer, at most
:data:`ORIENTATION_CHARS` characters in all.

A session start has no task to rank by, so nothing is judged here: the latest runs (newest first,
corrections in place of what they corrected) and the open issues (newest opened first) are
pointers an agent can fetch (``cybmem show ID``), the runs first and the issues in at most
:data:`ISSUES_SHARE` of the room. The text is a MEMORY block (the block's header, lines, footer,
:func:`cybmem.dispatch.preamble.layout`), so that the write path strips it wherever an agent
echoes it, as it strips every block. The prompt's own block (UserPromptSubmit) brings the runs
that relate to the task.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..store.display import merged_title
from .preamble import OpenIssue, PreambleEntry, layout

__all__ = ["ORIENTATION_CHARS", "ISSUES_SHARE", "LATEST_HINT", "LATEST_RUNS", "OPEN_ISSUES", "orientation"]

#: The most an orientation may be, in characters (about 300 tokens): a few latest runs and the open
#: issues, one line each, not the ~10 KB a session start costs when memory pours itself in whole.
ORIENTATION_CHARS = 1200
#: The largest share of the orientation the open issues may take; the runs get what they leave.
ISSUES_SHARE = 0.4
#: How many of the latest runs and open issues an orientation is offered (its budget cuts it).
LATEST_RUNS = 12
OPEN_ISSUES = 12
#: The line after the runs' pointers.
LATEST_HINT = "- (the latest runs, newest first: `cybmem show <id>` gives a whole run)"


def orientation(runs: Sequence[Mapping[str, Any]], issues: Sequence[Any], *, open_issues: int | None = None,
                max_chars: int = ORIENTATION_CHARS, task_of: Callable[[str | None], str | None] | None = None) -> str:
    """The orientation of a session start ("" when the project has neither a run nor an open issue).

    Args:
        runs: the project's latest runs, newest first, as ``cybmem list --json`` gives them
            (``runId``, ``endedAt``, ``state``, ``task``; a superseded one is left out).
        issues: its open issues, newest opened first (folded states: ``issueId``, ``title``,
            ``openedAt``, ``openedBy``).
        open_issues: how many are open in all (the last line counts those not shown).
        max_chars: the most the text may be.
        task_of: a run's task by its id (:meth:`cybmem.store.snapshot.Snapshot.task_of`): an issue
            whose title is only a merge commit's line is shown with the pull request's title its
            opening run holds (:func:`cybmem.store.display.merged_title`).
    """
    entries = [PreambleEntry(run_id=r["runId"], ended_at_ms=r["endedAt"], state=r.get("state") or "", task=r.get("task") or "",
                             summary="", open_issues=[], next=[], tier="pointer")
               for r in runs if not r.get("superseded")]
    shown = [OpenIssue(issue_id=i.issueId, title=merged_title(i.title, lambda i=i: task_of(i.openedBy)) if task_of else i.title,
                       opened_at_ms=i.openedAt, by_run_id=i.openedBy or "", tier="pointer") for i in issues]
    more = max((open_issues if open_issues is not None else len(shown)) - len(shown), 0)
    if not entries and not shown:
        return ""
    return layout(entries, shown, max_tokens=max_chars // 4, issue_share=ISSUES_SHARE, more_issues=more,
                  hint=LATEST_HINT).text
