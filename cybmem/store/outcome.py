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
import re
import unicodedata
from dataclasses import dataclass

from .display import collapse_whitespace, head_line, shorten, split_lines

__all__ = ["Trailer", "extractive_summary", "issue_slug", "parse_trailer", "split_issue"]

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


def _header(line: str) -> str | None:
    """The section name ("accomplished", "issues", "next") if line is a trailer header."""
    stripped = line.strip()
    if len(stripped) > _HEADER_MAX:
        return None
    match = _HEADER.fullmatch(stripped)
    return match.group(1).lower() if match else None


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
        text = collapse_whitespace(item)
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
    lines = split_lines(text)
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
    for line in split_lines(output):
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
    return collapse_whitespace(" ".join(parts))


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
    ended = f"Ended {collapse_whitespace(state or '') or 'unknown'}."
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
