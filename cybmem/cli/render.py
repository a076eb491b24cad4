"""How ``cybmem`` prints for people: every line through :func:`echo` (stored text made printable
first, so a record cannot drive the terminal), JSON through :func:`print_json`, warnings through
:func:`warn`, tables fitted to the terminal's width, exact bytes for a pipe (:func:`write_exact`)."""

from __future__ import annotations

import shutil
import sys
from typing import Callable

import typer

from ..answers import ms_to_utc, printable, printable_json, subject_line
from ..errors import WARNING_PREFIX

__all__ = ["count", "when", "echo", "print_json", "width", "table", "whole", "warn", "write_exact", "no_match",
           "fmt_axes"]

def count(count: int, what: str) -> str:
    """``3 records``, ``1 record``: a count and its noun."""
    return f"{count} {what if count == 1 else what + 's'}"


def when(ms: int | None) -> str:
    return "-" if ms is None else ms_to_utc(ms)


def echo(message: str = "", *, err: bool = False, nl: bool = True) -> None:
    """Every human-readable line goes out here: stored text is made printable first
    (:func:`cybmem.answers.printable`), so a record cannot drive the terminal."""
    typer.echo(printable(message), err=err, nl=nl)


def print_json(data) -> None:
    """JSON on stdout (:func:`cybmem.answers.printable_json`: no raw control reaches a terminal)."""
    typer.echo(printable_json(data))


def width() -> int:
    """Columns of the terminal (COLUMNS, else the terminal, else 120 when output is not a terminal)."""
    return max(shutil.get_terminal_size((120, 24)).columns, 60)


def table(headers: list[str], rows: list[list[str]], *, fit: Callable[[str, int], str] = subject_line) -> None:
    """Columns padded to their widest cell; the last one (task or title text) gets the rest of the
    terminal's width and is cut there by ``fit`` (default: the task's subject line)."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row[:-1]):
            widths[i] = max(widths[i], len(cell))
    room = max(width() - sum(widths[:-1]) - 2 * (len(headers) - 1), 24)
    fmt = lambda cells: "  ".join(c.ljust(widths[i]) if i < len(cells) - 1 else c for i, c in enumerate(cells)).rstrip()  # noqa: E731
    echo(fmt(headers))
    for row in rows:
        echo(fmt(row[:-1] + [fit(row[-1], room)]))


def whole(text: str, room: int) -> str:
    """A last column that is never cut (numbers, paths)."""
    return text


def warn(messages) -> None:
    """Each message as one warning line on stderr: the one place the prefix is put."""
    for message in messages:
        echo(f"{WARNING_PREFIX}{message}", err=True)


def write_exact(text: str) -> None:
    """Exact bytes to a pipe (strip(inject(task)) == task); a final newline on a terminal."""
    sys.stdout.write(text)
    if text and not text.endswith("\n") and sys.stdout.isatty():
        sys.stdout.write("\n")
    sys.stdout.flush()



def no_match(what: str, slug: str, f) -> str:
    return f"No {what} in project {slug}" + (f" ({f.describe()})." if f is not None and f.active else ".")



def fmt_axes(contrib: dict) -> str:
    short = {"keyword": "kw", "recency": "rec", "lineage": "lin", "vector": "vec"}
    return " ".join(f"{short.get(k, k)}={v:.3f}" for k, v in contrib.items() if v or k != "vector")

