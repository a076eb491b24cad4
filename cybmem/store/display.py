"""How stored text is shown: made safe for a terminal or a prompt, cut to one line, as JSON.

Every front and every view of a record reads stored text through these helpers: `printable` and
`printable_json` (no control character, no unclosed bidi override reaches a terminal),
`bidi_closed` for one line, `shorten`, `head_line` and `subject_line` for the one-line views
tables and blocks show, and `MAX_TEXT_CHARS`, how much of a text anything but the record reads.
Everything here is pure and never raises on any str.
"""

from __future__ import annotations

import json
import re
from typing import Callable

#: The characters of a text that anything but the record itself reads (64 Ki): a query's and a task's
#: tokens (:mod:`cybmem.store.tokens`), a task's one-line views (:func:`subject_line`, :func:`head_line`,
#: :func:`shorten`). Some 10,000 words, ten times the longest task of the corpora; what lies past it is
#: kept in the record but not read. A 50 MB task otherwise cost every read tens of seconds and a gigabyte.
MAX_TEXT_CHARS = 65_536

__all__ = [
    "CONTROL",
    "MAX_TEXT_CHARS",
    "bidi_closed",
    "collapse_whitespace",
    "head_line",
    "json_controls_escaped",
    "printable",
    "printable_json",
    "shorten",
    "split_lines",
    "merged_title",
    "subject_line",
]

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def split_lines(text: str) -> list[str]:
    """Split on \\r\\n, lone \\r and \\n alike."""
    return _LINE_BREAK.split(text)


def collapse_whitespace(text: str) -> str:
    """Collapse every run of whitespace (newlines included) to one space and trim."""
    return " ".join(text.split())


#: Control characters no stored text may bring to a terminal or a prompt: C0 but tab and
#: newline, DEL, and C1 (U+0080-U+009F: a terminal takes U+009B for ESC [).
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CR = re.compile(r"\r\n?")
#: Explicit bidi formatting (Unicode UAX #9): the embeddings and overrides LRE, RLE, LRO, RLO end
#: at PDF (U+202C), the isolates LRI, RLI, FSI at PDI (U+2069), which also ends the embeddings
#: opened inside the isolate; a line break ends them all.
_BIDI = re.compile("[\u202a-\u202e\u2066-\u2069]")
_PDF, _PDI = "\u202c", "\u2069"


def bidi_closed(text: str) -> str:
    """``text`` (one line) with every bidi control removed that it does not close itself: an
    embedding, override or isolate left open (an unterminated U+202E would turn the rest of the
    line it is copied into around), and a PDF or PDI with nothing to close (it would close one
    of the text that comes before). Pairs that open and close within it stay. Linear."""
    if _BIDI.search(text) is None:
        return text
    opened: list[tuple[int, bool]] = []  # (position, is an isolate), innermost last
    isolates = 0  # how many of them are isolates
    drop: list[int] = []
    for m in _BIDI.finditer(text):
        c, at = m.group(), m.start()
        if c == _PDF:
            if opened and not opened[-1][1]:
                opened.pop()
            else:
                drop.append(at)  # no embedding open inside the innermost isolate: it closes nothing of its own
        elif c == _PDI:
            if isolates:
                while not opened.pop()[1]:
                    pass  # the embeddings opened inside the isolate end with it
                isolates -= 1
            else:
                drop.append(at)
        else:
            isolate = c in "\u2066\u2067\u2068"
            opened.append((at, isolate))
            isolates += isolate
    drop += [at for at, _ in opened]
    if not drop:
        return text
    out, start = [], 0
    for at in sorted(drop):
        out.append(text[start:at])
        start = at + 1
    out.append(text[start:])
    return "".join(out)


def printable(text: str | None) -> str:
    """Stored text made safe to print to a terminal: line endings become "\\n", every other
    control character (an escape sequence's ESC, a bell, a C1 CSI) becomes U+FFFD, so a record
    cannot clear the screen, set the window title or rewrite a line, and shows it tried; and each
    line is bidi-closed (:func:`bidi_closed`), so an unterminated override cannot turn around
    what a table or ``show`` prints after it on that line."""
    if not text:
        return text or ""
    text = _CR.sub("\n", text)
    if _BIDI.search(text) is not None:
        text = "\n".join(bidi_closed(line) for line in text.split("\n"))
    return CONTROL.sub("\ufffd", text) if CONTROL.search(text) else text


_JSON_UNSAFE = re.compile("[\x7f-\x9f]")


def printable_json(data) -> str:
    """``data`` as indented JSON text (what ``--json`` prints), with DEL and C1 characters
    escaped like C0 ones (``\\u009b``), so no raw control reaches a terminal; decoded, it is
    ``data`` unchanged."""
    return json_controls_escaped(json.dumps(data, indent=2, ensure_ascii=False))


def json_controls_escaped(text: str) -> str:
    """JSON text with its DEL and C1 characters escaped as ``\\u00XX``, as JSON encoders escape
    the C0 ones (:func:`printable_json`); decoded, it holds the same values."""
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)  # the text itself when none is there


def shorten(text: str | None, max_chars: int) -> str:
    """Collapse whitespace and cut to at most max_chars on a word boundary, ending a cut with "…".

    Args:
        text: any text; None counts as "".
        max_chars: the length limit, ellipsis included.

    Returns:
        The collapsed text, or its cut; "" when max_chars <= 0.
    """
    whole = text or ""
    text = collapse_whitespace(whole[:MAX_TEXT_CHARS])  # what a one-line view reads of a huge text
    if len(text) <= max_chars and len(whole) <= MAX_TEXT_CHARS:
        return text
    if max_chars <= 0:
        return ""
    if len(text) < max_chars:  # what was read fits, and the text goes on past it
        return bidi_closed(text).rstrip(" ,;:-–—") + "…"
    room = max_chars - 1  # keep one character for the ellipsis
    head = text[:room]
    if text[room] != " ":
        # Back up to the last space unless that throws away more than half the room.
        space = head.rfind(" ")
        if space >= room // 2:
            head = head[:space]
    return bidi_closed(head).rstrip(" ,;:-–—") + "…"  # a cut never leaves a bidi override open


def head_line(text: str | None, max_chars: int) -> str:
    """First non-empty line, whitespace-collapsed and cut on a word boundary with "…".

    Args:
        text: any text; None counts as "".
        max_chars: the length limit, ellipsis included.

    Returns:
        The shortened first line, or "" when there is none.
    """
    for line in split_lines((text or "")[:MAX_TEXT_CHARS]):
        if line.strip():
            return shorten(line, max_chars)
    return ""


# GitHub's merge commit: "Merge pull request #123 from owner/branch", a blank line, the PR title.
_MERGE_PR = re.compile(r"Merge pull request #(\d+) from \S+")


def merged_title(title: str | None, opener_task: "Callable[[], str | None]") -> str:
    """An issue's title as the MEMORY block shows it. An issue made from a GitHub merge commit may
    hold only "Merge pull request #N from owner/branch", which says nothing; then the title is what
    :func:`subject_line` reads in the task of the run that opened it (the pull request's title with
    ``(#N)`` after it), when that task has one. Any other title is kept as it is, and
    ``opener_task`` (which finds that task) is only called for a bare merge line."""
    title = title or ""
    if _MERGE_PR.fullmatch(title.strip()):
        better = subject_line(opener_task(), MAX_TEXT_CHARS)
        if better and not _MERGE_PR.fullmatch(better.strip()):
            return better
    return title


def subject_line(text: str | None, max_chars: int) -> str:
    """The line of a task that says the most, cut like :func:`head_line`: what tables show.

    That is the first non-empty line, except for a GitHub merge commit ("Merge pull request #N
    from owner/branch" followed by the pull request's title), which reads as the title with
    ``(#N)`` after it, as a squash merge is written ("Fix the cache (#123)"). When the title must
    be cut, ``(#N)`` is kept.

    Args:
        text: a task; None counts as "".
        max_chars: the length limit, ellipsis included.
    """
    lines = [line for line in split_lines((text or "")[:MAX_TEXT_CHARS]) if line.strip()]
    if not lines:
        return ""
    merge = _MERGE_PR.fullmatch(lines[0].strip())
    if merge is None or len(lines) < 2:
        return shorten(lines[0], max_chars)
    suffix = f" (#{merge.group(1)})"
    if max_chars < 2 * len(suffix):
        return shorten(lines[1], max_chars)
    return shorten(lines[1], max_chars - len(suffix)) + suffix
