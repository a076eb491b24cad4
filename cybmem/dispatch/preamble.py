"""Build, strip and lift the MEMORY block that is put ahead of each new task.

The block (store-format.md, "The MEMORY block") looks like this::

    MEMORY (prior runs in this project, most relevant first):
    - run 3f2a9c1e (the run this task follows up; 2026-11-29 14:02 UTC, done): <task, <= 160 chars>
    - run 0b7d2e44 (2026-11-29 14:02 UTC, done): <task, collapsed, <= 160 chars>
      summary: <<= 300 chars>
      raised: <the issues the run raised that are still open, "<id> (open)", ", "-joined, <= 200 chars>
      next: <NEXT items, "; "-joined, <= 200 chars>
    - run 9a8b7c6d (2026-10-02): <the task's first line, <= 48 chars>; raised: <as above>
    - (one-line runs are weaker matches: `cybmem show <id>` gives the whole run)
    Open issues in this project:
    - flaky-login-test: Flaky login test (opened 2026-11-20, run 3f2a9c1e)
    END MEMORY

A run is shown in full or, when its evidence is weaker (cybmem.retrieval.evidence), as a one-line
pointer an agent can fetch. UUID run ids show their first 8 characters, other ids whole; times
are UTC from epoch milliseconds. The summary line appears only when it says more than the task
line (not when it repeats the title), raised and next only when non-empty; "Open issues in this
project:" only with at least one issue. Every field is neutralized (see `neutralize`) and
collapsed to one line, so the only lines of a rendered block at column 0 are HEADER, "Open issues
in this project:" and FOOTER. Long fields are cut on a word boundary and end in "…". The whole
block stays within a token budget (estimate_tokens); runs are added whole and open issues line by
line, never half a line. The block ends with a newline.

`inject` puts the block and one blank line ahead of the task; `strip` removes every block
wherever it sits and lifts the human task out of a workflow's ``TASK:`` wrapper, so
``strip(inject(t, block)) == t`` for every clean task t and memory never re-ingests itself.
"""

from __future__ import annotations

import itertools
import math
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from ..store.display import CONTROL, bidi_closed, shorten, subject_line

__all__ = [
    "FOOTER",
    "HEADER",
    "OpenIssue",
    "POINTER_HINT",
    "PreambleEntry",
    "estimate_tokens",
    "inject",
    "layout",
    "Layout",
    "lift_task",
    "neutralize",
    "render_block",
    "strip",
    "strip_memory",
]

HEADER = "MEMORY (prior runs in this project, most relevant first):"
FOOTER = "END MEMORY"
_ISSUES_HEADING = "Open issues in this project:"

_TASK_PREFIX = "TASK:"
# A wrapper section header such as "INSTRUCTIONS:" or "OUTPUT FORMAT:" ends the lifted task.
_WRAPPER_SECTION = re.compile(r"[A-Z][A-Z0-9 _/-]{2,40}:\s*")
_NESTED_TASK = re.compile(r"\A(?:\s*TASK:)*")
_NESTED_TASK_AT = re.compile(r"(?:\s*TASK:)*")  # the same, matched at an offset (match(text, pos))

# Characters a forged marker could hide behind: zero-width, bidi controls, BOM, soft hyphen,
# word joiner and invisible operators. They are ignored when comparing a line with a marker.
_INVISIBLE = "\u00ad\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff"
_MARKER_NOISE = re.compile(rf"[\s{_INVISIBLE}]+")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_NEWLINES = re.compile(r"\r\n|[\r\x85\u2028\u2029]")
_QUOTED = "[quoted] "

_TASK_MAX = 160
_TITLE_MAX = 48  # a pointer's title: enough to tell what the run was (bench_block.py: a pointer costs ~70 characters)
_SUMMARY_MAX = 300
_LIST_MAX = 200
_ISSUE_ID_MAX = 80
_ISSUE_TITLE_MAX = 160
_STATE_MAX = 24
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class PreambleEntry:
    """One prior run as shown in the block."""

    run_id: str
    ended_at_ms: int
    state: str
    task: str
    summary: str
    open_issues: list[str]
    next: list[str]
    tier: str = "full"  # "full": every line; "pointer": one line (id, date, title) an agent can fetch
    follows: bool = False  # the run the task being dispatched follows up (its pinned parent)
    terms: tuple[str, ...] = ()  # the task's index terms that make this run's evidence: a pointer's title is cut around them


#: Shown after the pointers, once: how an agent gets the rest of a pointer's run.
POINTER_HINT = "- (one-line runs are weaker matches: `cybmem show <id>` gives the whole run)"


@dataclass(frozen=True)
class OpenIssue:
    """One open issue of the project as shown in the block (``also``: other ids with the same title)."""

    issue_id: str
    title: str
    opened_at_ms: int
    by_run_id: str
    also: tuple[str, ...] = ()
    tier: str = "full"  # "pointer": no evidence about the task of its own: the short line


@dataclass(frozen=True)
class Layout:
    """A rendered block and what went into it: what the budget let in and what it cut."""

    text: str
    runs: int  # entries shown
    issues: int  # issue lines shown
    runs_cut: int  # entries that did not fit
    issues_cut: int  # issue lines that did not fit their share
    run_chars: int
    issue_chars: int


def _chunks(text: str) -> list[str]:
    """Split into lines that keep their "\\n"; the last chunk has none (and may be "")."""
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + [lines[-1]]


def _is_line(chunk: str, marker: str) -> bool:
    """True if the line is exactly marker, trailing whitespace (e.g. a \\r) allowed."""
    return chunk.rstrip() == marker


def strip_memory(text: str) -> str:
    """Remove every injected MEMORY block, wherever it sits.

    A block runs from a line that is exactly HEADER to the next line that is exactly FOOTER
    (trailing whitespace or \\r allowed on both); the one blank line `inject` puts after it
    goes too. A HEADER with no FOOTER after it is not a block, and markers mentioned inside a
    sentence are never touched. Lines are split on "\\n" only. Idempotent.

    Args:
        text: a task prompt, possibly carrying one or more blocks.

    Returns:
        The text without its blocks; unchanged when there are none.
    """
    if not text or HEADER not in text:
        return text
    chunks = _chunks(text)
    kept: list[str] = []
    i, n = 0, len(chunks)
    while i < n:
        if not _is_line(chunks[i], HEADER):
            kept.append(chunks[i])
            i += 1
            continue
        end = next((j for j in range(i + 1, n) if _is_line(chunks[j], FOOTER)), None)
        if end is None:
            # No FOOTER below, so no later HEADER can close either: the rest stays as it is.
            kept.extend(chunks[i:])
            break
        i = end + 1
        if i < n and chunks[i] in ("\n", "\r\n"):
            i += 1  # the blank separator line inject() adds
    return "".join(kept)


def lift_task(text: str) -> str:
    """Lift the human task out of a workflow wrapper.

    The rule: find the first line that starts with ``TASK:`` at column 0 (case-sensitive). The
    task is the rest of that line plus the following lines, up to (not including) the next line
    that looks like a wrapper section header, i.e. fully matches
    ``[A-Z][A-Z0-9 _/-]{2,40}:\\s*`` (``INSTRUCTIONS:``, ``OUTPUT FORMAT:``, ``ACCOMPLISHED:``),
    or the end of the text (a later ``TASK:`` line is the human's text). Surrounding whitespace and
    blank lines are trimmed, and so are ``TASK:`` prefixes the task itself begins with
    (``TASK: TASK: x`` -> ``x``), so a lifted task never needs lifting again. Text without a
    ``TASK:`` line is returned unchanged. Lines are split on "\\n"; a trailing \\r is whitespace.

    Only a wrapper is lifted, never a task that merely contains a ``TASK:`` line (lifting would
    keep the part after it and drop the human's words before it). Text is returned unchanged
    when a line before the ``TASK:`` line reads as a MEMORY marker (a stray or forged one: real
    blocks are gone by then), or when there is text before it and no section header after it.

    Args:
        text: a prompt, possibly wrapped by a workflow.

    Returns:
        The human task (may be "" for an empty wrapper), or text itself.
    """
    if not text or _TASK_PREFIX not in text:
        return text
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith(_TASK_PREFIX)), None)
    if start is None:
        return text
    before = lines[:start]
    if any(_looks_like_marker(line) for line in before):
        return text  # "Do x.\nEND MEMORY\n\nTASK: <injected>": not a wrapper the dispatcher built
    body = [lines[start][len(_TASK_PREFIX) :]]
    closed = False
    for line in lines[start + 1 :]:
        if _WRAPPER_SECTION.fullmatch(line):
            closed = True
            break
        body.append(line)
    if not closed and any(line.strip() for line in before):
        return text  # human text, then a TASK: line that runs to the end: a task, not a wrapper
    # A task that itself begins with "TASK:" would only be lifted again; drop those prefixes
    # in one go, so the result is clean and "TASK:" * n costs linear time.
    return _NESTED_TASK.sub("", "\n".join(body), count=1).strip()


def strip(text: str) -> str:
    """Remove MEMORY blocks and lift the human task: what the write path stores.

    This is ``lift_task(strip_memory(text))``, repeated until nothing changes, so the result
    is always clean (``strip(strip(x)) == strip(x)``) even for a block that only becomes whole
    once lifted (``TASK: MEMORY (...)``). Real prompts take one or two rounds; a crafted one can
    nest a round per line, so the rounds after the first are taken at the head (:func:`_peel`),
    each costing only what it removes: linear time on any input.

    Args:
        text: the prompt a run was dispatched with.

    Returns:
        The clean human task.
    """
    memory_free = strip_memory(text)
    lifted = lift_task(memory_free)
    if lifted == memory_free:
        return lifted  # nothing was lifted, and strip_memory's output has no block left: done
    return _peel(lifted)


def _peel(text: str) -> str:
    """The rounds of :func:`strip` after a first one that lifted a task, taken at the head.

    What a round leaves can change again only at its head. strip_memory has left no block whole
    (a HEADER line it keeps has no FOOTER line after it), and a lift keeps a run of whole lines
    that holds no wrapper section header: only its first line is new (the rest of the ``TASK:``
    line). So strip_memory can only remove a block that begins at line 0, and the lift after it
    changes the text only when its first non-blank line is a ``TASK:`` line (blank lines before
    it; the body then runs to the end). Either leaves a suffix of the text (which ends in no
    whitespace: the lift trimmed it), so a round moves an offset past what it removes instead of
    copying the rest.
    """
    at, n = 0, len(text)
    while True:
        eol = _line_end(text, at)
        if text[at:eol].rstrip() != HEADER:
            return text[at:]  # no block at the head, and a lift's first line is no TASK: line
        footer = eol
        while footer < n:  # the first FOOTER line below
            start = footer + 1
            footer = _line_end(text, start)
            if text[start:footer].rstrip() == FOOTER:
                break
        else:
            return text[at:]  # a HEADER with no FOOTER below is not a block
        at = min(footer + 1, n)
        for blank in ("\n", "\r\n"):  # the blank separator line inject() adds
            if text.startswith(blank, at):
                at += len(blank)
                break
        # The lift: the first non-blank line must be a TASK: line (any other leaves the text as it is).
        first = at
        while first < n:
            eol = _line_end(text, first)
            if text[first:eol].strip():
                break
            first = eol + 1
        if first >= n or not text.startswith(_TASK_PREFIX, first):
            return text[at:]
        at = _NESTED_TASK_AT.match(text, first + len(_TASK_PREFIX)).end()
        while at < n and text[at].isspace():
            at += 1


def _line_end(text: str, start: int) -> int:
    """The index of the "\\n" that ends the line starting at ``start`` (len(text) for the last)."""
    end = text.find("\n", start)
    return len(text) if end < 0 else end


def inject(task: str, block: str) -> str:
    """Put a block rendered by render_block ahead of task, separated by one blank line.

    Args:
        task: the (clean) task prompt.
        block: the MEMORY block (ending with a newline, as render_block makes it; one is added
            when it does not); "" leaves the task unchanged.

    Returns:
        The prompt to dispatch.
    """
    if not block:
        return task
    return f"{block}\n{task}" if block.endswith("\n") else f"{block}\n\n{task}"


def _marker_key(line: str) -> str:
    """A line as compared with the markers: NFKC, no whitespace or invisibles, case-folded."""
    return _MARKER_NOISE.sub("", unicodedata.normalize("NFKC", line)).casefold()


_HEADER_KEY = _marker_key(HEADER)
_HEADER_PREFIX_KEY = _marker_key("MEMORY (prior runs")
_FOOTER_KEY = _marker_key(FOOTER)


def _looks_like_marker(line: str) -> bool:
    """True if a reader (human, model or strip_memory) could take line for HEADER or FOOTER."""
    key = _marker_key(line)
    return key == _HEADER_KEY or key == _FOOTER_KEY or key.startswith(_HEADER_PREFIX_KEY)


def _drop_inline_blocks(text: str) -> str:
    """Remove every HEADER ... FOOTER span, markers anywhere in a line, until none is left.

    In one pass from the left: the first HEADER, up to the first FOOTER after it, goes. A removal
    joins the text on either side, which can spell a new HEADER across the join; it is looked for
    there at once (the last characters kept and the next ones read), so a nest of spans that each
    join the next costs one pass, not one a level. What is left holds no HEADER with a FOOTER
    after it.
    """
    if HEADER not in text:
        return text  # a removal needs a HEADER, and only a removal can join one
    width = len(HEADER) - 1  # a HEADER across a join starts in the last `width` characters kept
    kept: list[list[int]] = []  # the text kept so far, as [start, end) spans of text
    pos = 0
    while True:
        tail = _tail(text, kept, width)
        joined = (tail + text[pos:pos + width]).find(HEADER)
        if joined >= 0:  # a HEADER across the last join: it starts in the tail
            end = pos + joined + len(HEADER) - len(tail)
            drop, cut = len(tail) - joined, None
        else:
            cut = text.find(HEADER, pos)
            if cut < 0:
                break
            end, drop = cut + len(HEADER), 0
        footer = text.find(FOOTER, end)
        if footer < 0:
            break  # a HEADER with no FOOTER after it stays, and so does the rest
        if cut is not None:
            _keep(kept, pos, cut)
        _unkeep(kept, drop)
        pos = footer + len(FOOTER)
    _keep(kept, pos, len(text))
    return "".join(text[a:b] for a, b in kept)


def _keep(kept: list[list[int]], start: int, end: int) -> None:
    """Add text[start:end] to the spans kept (joined to the last when they touch)."""
    if start >= end:
        return
    if kept and kept[-1][1] == start:
        kept[-1][1] = end
    else:
        kept.append([start, end])


def _unkeep(kept: list[list[int]], n: int) -> None:
    """Take the last n characters off the spans kept."""
    while n > 0 and kept:
        span = kept[-1]
        take = min(n, span[1] - span[0])
        span[1] -= take
        n -= take
        if span[0] == span[1]:
            kept.pop()


def _tail(text: str, kept: list[list[int]], width: int) -> str:
    """The last ``width`` (or fewer) characters of the spans kept."""
    parts: list[str] = []
    need = width
    for a, b in reversed(kept):
        if need <= 0:
            break
        parts.append(text[max(a, b - need):b])
        need -= b - a
    return "".join(reversed(parts))


def neutralize(text: str) -> str:
    """Defuse stored text before it is copied into a block, so it can never end or forge one.

    Lone surrogates become U+FFFD, line endings become "\\n", C0 controls other than \\t and
    \\n, DEL and C1 controls (display.CONTROL) are dropped, so is every bidi control a line does
    not close itself (display.bidi_closed: an unterminated U+202E would turn the rest of the
    block's line around; cuts keep it so, :func:`~cybmem.store.display.shorten`), a whole block inside the text
    (HEADER ... FOOTER, as an echoed prompt leaves it in a collapsed summary) is removed, and any
    line that, ignoring whitespace, zero-width / bidi characters and case, reads as HEADER or
    FOOTER is prefixed with "[quoted] ".

    Args:
        text: text taken from a stored record or issue.

    Returns:
        The defused text.
    """
    text = _SURROGATE.sub("\ufffd", text or "")
    text = CONTROL.sub("", _NEWLINES.sub("\n", text))
    text = _drop_inline_blocks(text)
    return "\n".join(
        _QUOTED + line if _looks_like_marker(line) else line for line in map(bidi_closed, text.split("\n"))
    )


def estimate_tokens(text: str) -> int:
    """Estimate tokens as ceil(len / 4).

    About 4 characters per token is the usual rule of thumb for English and code under BPE
    tokenizers (OpenAI's tokenizer guidance); it errs high for plain prose, which is the safe
    side for a budget.

    Args:
        text: any text.

    Returns:
        The estimated token count.
    """
    return math.ceil(len(text) / 4)


# How much of a field is read to fill max_chars: neutralizing and collapsing whitespace rarely
# shrink text 16-fold, and a 50 MB task is then never scanned whole to show 160 characters of it.
_FIELD_READ = 16


def _field(text: str | None, max_chars: int) -> str:
    """Neutralize, collapse to one line and cut on a word boundary (reading a bounded head of the
    text; a field longer than that head always ends in the ellipsis of a cut)."""
    return shorten(_head(text, max_chars * _FIELD_READ + 64), max_chars)


def _head(text: str | None, window: int) -> str:
    """The first ``window`` characters of ``text`` neutralized, " …" after them when there is more."""
    text = text or ""
    if len(text) <= window:
        return neutralize(text)
    return neutralize(text[:window]) + " …"


def _fields(items: Iterable[str] | None, item_chars: int, room: int, *, sep: str, suffix: str = "") -> str:
    """Items as fields (empty ones left out), each followed by ``suffix``, joined by ``sep``: only
    as many as it takes to pass ``room`` characters, since a cut to ``room`` reads no further (a
    run with 300,000 NEXT items costs no more than one with 30)."""
    parts: list[str] = []
    size = -len(sep)
    for item in items or ():
        text = _field(item, item_chars)
        if text:
            parts.append(text + suffix)
            size += len(sep) + len(parts[-1])
            if size > room:
                break
    return sep.join(parts)


_WORD_SPAN_RE = re.compile(r"\S+")


def _title_around(text: str | None, terms: Sequence[str], max_chars: int) -> str:
    """A pointer's title: the first ``max_chars`` of the line, or, when the words that make the run's
    evidence (``terms``, index terms) fall beyond them, the window of whole words that holds most of
    them, an ellipsis marking each cut side ("Merge pull request #3072 from…" tells an agent
    nothing; "…multiline signatures better in html." does)."""
    head = _field(text, max_chars)
    if not terms or not head.endswith("\u2026"):
        return head
    from ..store.tokens import tokenize  # the index's own words (stemmed), for a pointer line only

    line = " ".join(neutralize((text or "")[: max_chars * _FIELD_READ + 64]).split())
    want = set(terms)
    words = [(m.start(), m.end(), bool(want.intersection(tokenize(m.group())))) for m in _WORD_SPAN_RE.finditer(line)]
    room = max_chars - 2  # an ellipsis on either side
    best = (0, 0)  # (matched words, index of the window's first word)
    for i, (start, _, _) in enumerate(words):
        got = 0
        for _s, end, hit in words[i:]:
            if end - start > room:
                break
            got += hit
        if got > best[0]:
            best = (got, i)
    if best[1] == 0:  # the head holds as many of them as any window does
        return head
    start = words[best[1]][0]
    end = max((e for _s, e, _h in words[best[1]:] if e - start <= room), default=start)
    if end <= start:
        return head
    return "\u2026" + bidi_closed(line[start:end]) + ("\u2026" if end < len(line) else "")


def _utc(ms: int, fmt: str) -> str | None:
    """Format epoch milliseconds in UTC; None when the value is not a usable time."""
    try:
        return (_EPOCH + timedelta(milliseconds=int(ms))).strftime(fmt)
    except (OverflowError, ValueError, TypeError):
        return None


_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_RUN_ID_MAX = 80


def _run_label(run_id: str) -> str:
    """How a run id is shown: a UUID's first 8 characters (unique enough to fetch it by prefix),
    any other id whole (its own prefix may name nothing), safe for one line."""
    label = "".join(neutralize(run_id or "").split())
    return (label[:8] if _UUID.fullmatch(label) else label[:_RUN_ID_MAX]) or "?"


def _summary_beyond_title(entry: PreambleEntry) -> str:
    """The summary line's text: what the summary says beyond the task's title. An extractive
    summary starts with the title (the task line already shows it): that part is dropped, and a
    summary that is only the title, or a cut of the task, is not printed at all."""
    # Read as a field is, and as far again as the title it may start with (read to _SUMMARY_MAX * 4).
    summary = " ".join(_head(entry.summary, (_SUMMARY_MAX * _FIELD_READ + 64) + _SUMMARY_MAX * 4).split())
    task = " ".join(neutralize((entry.task or "")[: _SUMMARY_MAX * 4]).split())
    title = " ".join(neutralize((entry.task or "").strip().split("\n", 1)[0][: _SUMMARY_MAX * 4]).split())
    if not summary or task.startswith(summary.rstrip("\u2026 ")):
        return ""
    if title and summary.startswith(title):
        summary = summary[len(title):].lstrip(" .:;,-\u2014")
    return shorten(summary, _SUMMARY_MAX) if summary else ""


def _entry_lines(entry: PreambleEntry) -> list[str]:
    """The lines of one prior run: all of them, or its one pointer line."""
    if entry.tier == "pointer" and not entry.follows:
        when = _utc(entry.ended_at_ms, "%Y-%m-%d") or "unknown date"
        # A merge commit's pointer says what was merged: the pull request's title, "(#N)" after it
        # (subject_line), not "Merge pull request #N from owner/branch".
        title = _title_around(subject_line(entry.task, _TITLE_MAX * 16), entry.terms, _TITLE_MAX) or "(no task text)"
        raised = shorten(_fields(entry.open_issues, _ISSUE_ID_MAX, _LIST_MAX, sep=", ", suffix=" (open)"), _LIST_MAX)
        line = f"- run {_run_label(entry.run_id)} ({when}): {title}" + (f"; raised: {raised}" if raised else "")
        return [_drop_inline_blocks(line)]
    when = _utc(entry.ended_at_ms, "%Y-%m-%d %H:%M UTC") or "unknown time"
    state = _field(entry.state, _STATE_MAX) or "unknown"
    task = _field(entry.task, _TASK_MAX) or "(no task text)"
    label = "the run this task follows up; " if entry.follows else ""
    lines = [f"- run {_run_label(entry.run_id)} ({label}{when}, {state}): {task}"]
    summary = _summary_beyond_title(entry)
    if summary:
        lines.append(f"  summary: {summary}")
    raised_text = shorten(_fields(entry.open_issues, _ISSUE_ID_MAX, _LIST_MAX, sep=", ", suffix=" (open)"), _LIST_MAX)
    if raised_text:
        lines.append(f"  raised: {raised_text}")
    next_text = shorten(_fields(entry.next, _LIST_MAX, _LIST_MAX, sep="; "), _LIST_MAX)
    if next_text:
        lines.append(f"  next: {next_text}")
    return [_drop_inline_blocks(line) for line in lines]  # fields side by side can spell a block too


def _issue_line(issue: OpenIssue, room: int) -> str:
    """The line of one open issue (several ids when one title stands for them): in full, or as a
    pointer (its title cut as a run pointer's, without the run that opened it) when it has no
    evidence about the task. Ids are formatted only until they pass ``room`` characters (the
    block's budget): a line that long is never shown."""
    issue_id = _fields(itertools.chain((issue.issue_id,), issue.also), _ISSUE_ID_MAX, room, sep=", ") or "?"
    pointer = issue.tier == "pointer"
    title = _field(issue.title, _TITLE_MAX if pointer else _ISSUE_TITLE_MAX)
    when = _utc(issue.opened_at_ms, "%Y-%m-%d") or "unknown date"
    by = f", run {_run_label(issue.by_run_id)}" if (issue.by_run_id or "").strip() and not pointer else ""
    label = f"{issue_id}: {title}" if title else issue_id
    return _drop_inline_blocks(f"- {label} (opened {when}{by})")


def render_block(
    entries: Sequence[PreambleEntry],
    open_issues: Sequence[OpenIssue],
    *,
    max_tokens: int = 1500,
    top_k: int | None = None,
    issue_share: float | None = None,
    more_issues: int = 0,
    nothing: str | None = None,
) -> str:
    """Render the MEMORY block for the given prior runs and open issues (see :func:`layout`)."""
    return layout(entries, open_issues, max_tokens=max_tokens, top_k=top_k, issue_share=issue_share,
                  more_issues=more_issues, nothing=nothing).text


def layout(
    entries: Sequence[PreambleEntry],
    open_issues: Sequence[OpenIssue],
    *,
    max_tokens: int = 1500,
    top_k: int | None = None,
    issue_share: float | None = None,
    more_issues: int = 0,
    nothing: str | None = None,
    hint: str = POINTER_HINT,
) -> Layout:
    """Lay out the MEMORY block (format: module doc) within a token budget.

    Budget: the whole block, HEADER and FOOTER included, keeps estimate_tokens <= max_tokens.
    The issue section takes at most ``issue_share`` of the budget (None: what is left after the
    runs); its lines go in one by one until the next does not fit, and a last line says how many
    more issues are open (``more_issues`` plus those cut here). The runs get everything the issue
    section does not use: entries go in whole, in the given order, until one does not fit (then
    no more). Lines are never cut by the budget.

    Args:
        entries: prior runs, most relevant first.
        open_issues: open issues to show, most relevant first.
        max_tokens: the token budget of the whole block.
        top_k: show at most this many entries (None: no limit).
        issue_share: the largest fraction of the budget the issue section may take.
        more_issues: open issues that were not offered at all (over the cap), for the last line.
        nothing: when no run is given, the one line that says why (e.g. no earlier run relates to
            the task), so that the block says so instead of staying away.
        hint: the line after the pointers, once, when one is shown (what a pointer is and how to
            get its whole run).

    Returns:
        A :class:`Layout`; its text is "" when nothing but HEADER and FOOTER would fit.
    """
    if top_k is not None:
        entries = entries[: max(top_k, 0)]
    limit = max_tokens * 4  # estimate_tokens(s) <= max_tokens  <=>  len(s) <= 4 * max_tokens
    frame = len(HEADER) + 1 + len(FOOTER) + 1  # "HEADER\nFOOTER\n"
    size = lambda lines: sum(len(line) + 1 for line in lines)  # noqa: E731

    # The issue section first, within its share, so that what it leaves goes to the runs.
    issue_cap = limit - frame if issue_share is None else int((limit - frame) * issue_share)
    lines = [_issue_line(i, limit) for i in open_issues]
    shown: list[str] = []

    def more_line(n: int) -> list[str]:
        return [f"- ... and {n} more open issue{'s' if n != 1 else ''} (`cybmem issues` lists them)"] if n else []

    for i, line in enumerate(lines):
        rest = len(lines) - i - 1 + more_issues
        if size([_ISSUES_HEADING, *shown, line, *more_line(rest)]) > issue_cap:
            break
        shown.append(line)
    cut_issues = len(lines) - len(shown)
    section = [_ISSUES_HEADING, *shown, *more_line(cut_issues + more_issues)] if shown else []
    if issue_share is None:
        section_size = 0  # issues fill what the runs leave (below)
    else:
        section_size = size(section)

    body: list[str] = [_drop_inline_blocks(f"- ({_field(nothing, _SUMMARY_MAX)})")] if nothing and not entries else []
    used = frame + section_size + size(body)
    runs_shown = 0
    hinted = False  # the hint is owed (a pointer is shown)
    for entry in entries:
        block = _entry_lines(entry)
        pointer = entry.tier == "pointer" and not entry.follows
        extra = len(hint) + 1 if pointer and not hinted else 0
        if used + size(block) + extra > limit:
            break
        body.extend(block)
        used += size(block) + extra
        hinted = hinted or pointer
        runs_shown += 1
    if hinted:
        body.append(hint)
    run_chars = size(body)
    if issue_share is None:  # the old rule: issues line by line in what is left
        shown, heading = [], [_ISSUES_HEADING]
        for line in lines:
            if used + size(heading + [line]) > limit:
                break
            shown.append(line)
            used += size(heading + [line])
            heading = []
        cut_issues = len(lines) - len(shown)
        section = [_ISSUES_HEADING, *shown] if shown else []
    body.extend(section)
    if not body:
        return Layout("", 0, 0, len(entries), len(lines), 0, 0)
    return Layout("\n".join([HEADER, *body, FOOTER]) + "\n", runs_shown, len(shown), len(entries) - runs_shown, cut_issues,
                  run_chars, size(section))
