"""The ACCOMPLISHED / ISSUES / NEXT outcome trailer, issue slugs and the extractive summary.

A worker's final answer may end with a trailer (store-format.md, "The outcome trailer")::

    ACCOMPLISHED:
    - shipped X
    ISSUES:
    - Flaky login test: fails one run in ten
    NEXT:
    - none

`parse_trailer` turns it into three lists, `split_issue` and `issue_slug` turn an issue item into
a ledger title and a stable id, and `extractive_summary` writes the record's zero-cost summary.
Everything here is pure, deterministic and never raises on any str.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass

#: The characters of a text that anything but the record itself reads (64 Ki): a query's and a task's
#: tokens (:mod:`cybmem.store.tokens`), a task's one-line views (:func:`subject_line`, :func:`head_line`,
#: :func:`shorten`). Some 10,000 words, ten times the longest task of the corpora; what lies past it is
#: kept in the record but not read. A 50 MB task otherwise cost every read tens of seconds and a gigabyte.
MAX_TEXT_CHARS = 65_536

__all__ = [
    "CONTROL",
    "bidi_closed",
    "Trailer",
    "extractive_summary",
    "head_line",
    "issue_slug",
    "json_controls_escaped",
    "parse_trailer",
    "printable",
    "printable_json",
    "shorten",
    "split_issue",
    "subject_line",
]

_LINE_BREAK = re.compile(r"\r\n|\r|\n")

# A header on its own line: optional markdown heading / emphasis around the word, colon required,
# so "Issues" in a sentence or a bare "NEXT" never opens a section.
# Matched against the stripped line, and only short lines are tried: the adjacent \s* runs
# would otherwise backtrack quadratically on a long run of spaces.
_HEADER = re.compile(
    r"(?:#{1,6}\s*)?[*_]{0,3}\s*(accomplished|issues|next)\s*[*_]{0,3}\s*:\s*[*_]{0,3}",
    re.IGNORECASE,
)
_HEADER_MAX = 40
# "- x", "* x", "• x", "1. x", "1) x"; a lone marker ("-") is an empty bullet.
_BULLET = re.compile(r"\s*(?:[-*•]|\d{1,3}[.)])(?:\s+(.*)|\s*)", re.DOTALL)
_CHECKBOX = re.compile(r"\[[ xX]\]\s+")
_NONE = re.compile(r"\(?(?:none|n/a)\)?\.?|-", re.IGNORECASE)

# Issue title / detail separators: "title: detail" (also "**title:** detail") or a spaced dash.
# Single \s around the dash keeps the search linear; the halves are trimmed afterwards.
_ISSUE_SEP = re.compile(r"(?:\*\*)?:(?:\*\*)?\s|\s[—–-]\s")
_SLUG_MAX = 64

_FENCE = re.compile(r"\s*(?:```|~~~)")
_MD_HEADING = re.compile(r"\s*#{1,6}(?:\s|$)")
_RULE = re.compile(r"\s*[-*_=]{3,}\s*")
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")
_TASK_HEAD_MAX = 160
_VERDICT_MAX = 200


@dataclass(frozen=True)
class Trailer:
    """The parsed outcome trailer; found is True when at least one header was seen."""

    accomplished: list[str]
    issues: list[str]
    next: list[str]
    found: bool


def _lines(text: str) -> list[str]:
    """Split on \\r\\n, lone \\r and \\n alike."""
    return _LINE_BREAK.split(text)


def _header(line: str) -> str | None:
    """The section name ("accomplished", "issues", "next") if line is a trailer header."""
    stripped = line.strip()
    if len(stripped) > _HEADER_MAX:
        return None
    match = _HEADER.fullmatch(stripped)
    return match.group(1).lower() if match else None


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


def _collapse(text: str) -> str:
    """Collapse every run of whitespace (newlines included) to one space and trim."""
    return " ".join(text.split())


def _is_none(item: str) -> bool:
    """True for the placeholders that mean "nothing here": none, n/a, -, (none), none."""
    return _NONE.fullmatch(item.strip().strip("*_`").strip()) is not None


def _section(lines: list[str], start: int) -> list[str]:
    """Raw bullet items of the section whose header is at lines[start - 1]."""
    items: list[list[str]] = []  # each item's lines, joined at the end (a bullet wrapped over 100,000 lines is one join)
    for line in lines[start:]:
        if not line.strip():
            continue  # blank lines between bullets are allowed
        if _header(line):
            break
        bullet = _BULLET.fullmatch(line)
        if bullet:
            items.append([bullet.group(1) or ""])
        elif line[0].isspace():
            # An indented line continues the previous bullet (wrapped text).
            if items:
                items[-1].append(line.strip())
            else:
                items.append([line.strip()])
        elif _is_none(line):
            continue  # an unbulleted "none" under a header
        else:
            break  # extra prose after the trailer
    return [" ".join(parts) for parts in items]


def _clean_items(raw: list[str]) -> list[str]:
    """Collapse, drop placeholders and duplicates, keep first-seen order."""
    seen: dict[str, None] = {}
    for item in raw:
        text = _collapse(item)
        text = _CHECKBOX.sub("", text, count=1) if _CHECKBOX.match(text) else text
        if text and not _is_none(text):
            seen.setdefault(text, None)
    return list(seen)


def parse_trailer(text: str | None) -> Trailer:
    """Parse the ACCOMPLISHED / ISSUES / NEXT trailer out of a worker's final answer.

    Headers must sit on their own line (case-insensitive, markdown decoration such as
    ``**ISSUES:**`` or ``## Issues:`` allowed, colon required). When a header appears several
    times the last one wins, because workers often quote the format earlier in their answer.
    A section runs until the next header or the first unindented, non-bullet prose line;
    indented lines continue the previous bullet. ``none`` / ``n/a`` / ``-`` mean empty.
    Items are whitespace-collapsed and deduplicated in first-seen order.

    Args:
        text: the answer text; None or "" give an empty, not-found trailer.

    Returns:
        The Trailer; never raises.
    """
    if not text:
        return Trailer([], [], [], False)
    lines = _lines(text)
    last: dict[str, int] = {}
    for i, line in enumerate(lines):
        name = _header(line)
        if name:
            last[name] = i
    sections = {name: _clean_items(_section(lines, i + 1)) for name, i in last.items()}
    return Trailer(
        accomplished=sections.get("accomplished", []),
        issues=sections.get("issues", []),
        next=sections.get("next", []),
        found=bool(last),
    )


def split_issue(item: str) -> tuple[str, str]:
    """Split an ISSUES item into (title, detail).

    The split is at the earliest ": " (or ":** " after a bold title), " — ", " – " or " - ".

    Args:
        item: one item from Trailer.issues, e.g. "Flaky login test: fails one run in ten".

    Returns:
        (title, detail), both trimmed; (item, "") when there is no separator or no title.
    """
    item = item.strip()
    sep = _ISSUE_SEP.search(item)
    if sep is None:
        return item, ""
    title, detail = item[: sep.start()].strip(), item[sep.end() :].strip()
    if title.startswith("**"):  # "**title**: detail" or "**title:** detail"
        title = title.removeprefix("**").removesuffix("**").strip()
    if not title:
        return item, ""
    return title, detail


def issue_slug(title: str) -> str:
    """Derive the stable issue id for a title.

    ASCII-fold (NFKD), lowercase, turn runs of anything but [a-z0-9] into "-", trim "-", and cut
    to at most 64 characters at a "-" where possible. A title with nothing foldable (CJK, emoji,
    "") becomes "issue-" + the first 10 hex digits of its sha256, so it still gets a stable id.

    Args:
        title: the issue title (see split_issue).

    Returns:
        A slug matching [a-z0-9][a-z0-9-]{0,127}; the same title always gives the same slug.
    """
    folded = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode("ascii")
    slug = re.sub(r"[^a-z0-9]+", "-", folded.lower()).strip("-")
    if len(slug) > _SLUG_MAX:
        cut = slug[:_SLUG_MAX]
        if slug[_SLUG_MAX] != "-" and "-" in cut:
            cut = cut[: cut.rindex("-")]
        slug = cut.strip("-")
    if slug:
        return slug
    # surrogatepass: a lone surrogate must hash, not raise.
    digest = hashlib.sha256(title.encode("utf-8", "surrogatepass")).hexdigest()
    return "issue-" + digest[:10]


def shorten(text: str | None, max_chars: int) -> str:
    """Collapse whitespace and cut to at most max_chars on a word boundary, ending a cut with "…".

    Args:
        text: any text; None counts as "".
        max_chars: the length limit, ellipsis included.

    Returns:
        The collapsed text, or its cut; "" when max_chars <= 0.
    """
    whole = text or ""
    text = _collapse(whole[:MAX_TEXT_CHARS])  # what a one-line view reads of a huge text
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
    for line in _lines((text or "")[:MAX_TEXT_CHARS]):
        if line.strip():
            return shorten(line, max_chars)
    return ""


# GitHub's merge commit: "Merge pull request #123 from owner/branch", a blank line, the PR title.
_MERGE_PR = re.compile(r"Merge pull request #(\d+) from \S+")


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
    lines = [line for line in _lines((text or "")[:MAX_TEXT_CHARS]) if line.strip()]
    if not lines:
        return ""
    merge = _MERGE_PR.fullmatch(lines[0].strip())
    if merge is None or len(lines) < 2:
        return shorten(lines[0], max_chars)
    suffix = f" (#{merge.group(1)})"
    if max_chars < 2 * len(suffix):
        return shorten(lines[1], max_chars)
    return shorten(lines[1], max_chars - len(suffix)) + suffix


def _first_sentence(task: str) -> str:
    """The task's first non-empty line, cut after its first sentence end."""
    line = head_line(task, len(task) + 1)
    end = _SENTENCE_END.search(line)
    return line[: end.end()] if end else line


def _as_sentence(text: str) -> str:
    """Terminate text with a period unless it already ends a sentence (or was cut)."""
    return text if text.endswith((".", "!", "?", "…")) else text + "."


def _output_head(output: str) -> str:
    """The prose at the top of an answer: before any trailer header, without code or headings."""
    parts: list[str] = []
    size = 0  # of parts, kept as it grows: summed again each line, 20,000 empty bullets took 27 s
    in_fence = False
    for line in _lines(output):
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence or not line.strip():
            continue
        if _header(line):
            break
        if _MD_HEADING.match(line) or _RULE.fullmatch(line) or line.lstrip().startswith("|"):
            continue
        bullet = _BULLET.fullmatch(line)
        parts.append((bullet.group(1) or "") if bullet else line)
        size += len(parts[-1])
        if size > 2000:
            break  # plenty for any summary budget; don't walk a huge answer
    return _collapse(" ".join(parts))


def extractive_summary(
    task: str | None,
    state: str | None,
    verdict: str | None,
    winner_output: str | None,
    *,
    max_chars: int = 600,
) -> str:
    """Write the record's 2-4 sentence summary without calling any model.

    The sentences are: the task's first sentence (cut at ~160 characters), "Ended {state}.",
    "Verdict: {verdict}." when there is one, and the head of the winning answer (prose before
    any trailer header, skipping code fences and markdown headings) cut to fill max_chars.

    Args:
        task: the human task text (already stripped of the MEMORY block).
        state: the run's terminal state (done / error / cancelled).
        verdict: the judge's one-line verdict, if any.
        winner_output: the winning worker's final answer, if any.
        max_chars: the summary budget; "Ended {state}." is always kept even if it is longer.

    Returns:
        The summary, whitespace-collapsed; never empty.
    """
    ended = f"Ended {_collapse(state or '') or 'unknown'}."
    budget = max_chars - len(ended)
    parts: dict[str, str] = {}

    def take(key: str, text: str, cap: int, *, prefix: str = "") -> None:
        nonlocal budget
        # Reserve one character for the joining space and one for a closing period.
        room = min(cap, budget - 2 - len(prefix))
        cut = shorten(text, room)
        if cut and cut != "…":
            parts[key] = _as_sentence(prefix + cut)
            budget -= len(parts[key]) + 1

    take("task", _first_sentence(task or ""), _TASK_HEAD_MAX)
    if verdict and verdict.strip():
        take("verdict", verdict, _VERDICT_MAX, prefix="Verdict: ")
    if winner_output:
        take("output", _output_head(winner_output), max_chars)
    ordered = [parts.get("task"), ended, parts.get("verdict"), parts.get("output")]
    return " ".join(p for p in ordered if p)
