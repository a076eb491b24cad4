"""What both front ends (the command line, :mod:`cybmem.cli`, and the MCP server, :mod:`cybmem.mcp`)
say around a library call: a failure as the one message a person or an agent reads
(:func:`error_message`), and the warnings of an answer each once (:func:`warnings_of`). Each front
puts them in its own form (``Error: ...`` and an exit code; an MCP error); the answers themselves
are the library's (each result's ``to_dict``), the same call of :class:`cybmem.memory.Memory` from
either front. Stored text and times are shown through the display helpers named here (printable
text and JSON, a task's subject line, a title cut to fit, times in UTC), and an answer's shape through
the record's field table and :class:`~cybmem.store.ledger.IssueState`: what a front renders with,
imported from the one place each is defined.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .errors import CybmemError
from .store.display import json_controls_escaped, printable, printable_json, shorten, subject_line
from .store.outcome import issue_slug
from .store.records import MAX_MOMENT, RECORD_FIELDS, ms_to_iso, ms_to_utc

__all__ = ["error_message", "warnings_of", "IssueState", "issue_slug", "json_controls_escaped",
           "printable", "printable_json", "shorten", "subject_line", "MAX_MOMENT", "RECORD_FIELDS", "ms_to_iso",
           "ms_to_utc"]


def __getattr__(name: str) -> Any:
    # IssueState on first use (the MCP answers' schema): the command line's start-up does not load the ledger's module
    if name == "IssueState":
        from .store.ledger import IssueState

        return IssueState
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def error_message(exc: BaseException) -> str | None:
    """The message a front gives a library failure: a :class:`~cybmem.errors.CybmemError`'s own
    text, an OSError the library did not name as ``path: what went wrong`` (a store broken in a way
    no check foresaw); None for anything else (not a library failure: the front lets it go)."""
    if isinstance(exc, CybmemError):
        return str(exc)
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        return f"{where}{exc.strerror or exc}"
    return None


def warnings_of(*sources: Iterable[Any]) -> list[str]:
    """The messages of read problems (anything with a ``message``) and warning strings, each once,
    in order."""
    out: dict[str, None] = {}
    for source in sources:
        for item in source:
            out[getattr(item, "message", item)] = None
    return list(out)
