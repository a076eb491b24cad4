"""A project's two feedback logs: ``shown.jsonl`` (what memory showed a run) and ``used.jsonl``
(what the run then used), append-only, one JSON object a line holding only ids and numbers.

This module keeps their format and their I/O: the shape each line must have (:func:`shown_line_ok`,
:func:`used_line_ok`), appending under the logs' lock, cutting shown.jsonl back to its cap (in lines
and in bytes),
reading (a malformed line is skipped and counted), and renaming issue ids (``cybmem redact``).
What a line says is decided above it: dispatch makes the shown lines
(:mod:`cybmem.dispatch.feedback`), the write path the used ones (:mod:`cybmem.store.feedback_match`),
and retrieval turns used lines into judgments (:func:`cybmem.retrieval.judgments.used_judgments`).
The rules in full: USAGE.md, "What memory showed, and what the runs used".
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from .. import _io
from ..settings import DEFAULT_SHOWN_CAP

__all__ = ["SHOWN_FILE", "USED_FILE", "LINE_BYTES", "LINE_ITEMS", "keep_shown", "cut_shown", "keep_used", "read_lines",
           "parse_lines", "read_used", "valid_used", "shown_line_ok", "used_line_ok", "skipped_warning", "rename_issues"]

SHOWN_FILE = "shown.jsonl"
USED_FILE = "used.jsonl"
_LOCK = ".feedback.lock"
#: The shown log is cut back to its cap once it holds this share more (in lines or in bytes), so a
#: cut, which reads and rewrites the log, comes once per a quarter of the cap appended.
_SLACK = 1.25
#: The bytes a line of the cap may take: the log holds at most ``cap * LINE_BYTES`` bytes once cut
#: (8 MB at the default cap). A line names at most LINE_ITEMS runs, a few kB; a block's line is about one.
LINE_BYTES = 4096
#: What one shown line names at most of each of its lists (``runs``, ``issues``, ``fetched``): the first,
#: best ranked; how many more there were is the count ``runsCut`` (``issuesCut``, ``fetchedCut``). A block
#: shows some 20 runs; a search for 100,000 once wrote a 300 kB line.
LINE_ITEMS = 50


def _dump(entry: Mapping[str, Any]) -> bytes:
    return orjson.dumps(entry)


def keep_shown(directory: Path, entries: Iterable[Mapping[str, Any]], cap: int = DEFAULT_SHOWN_CAP) -> None:
    """Append lines to ``directory``/shown.jsonl (one O_APPEND write, under the logs' lock, no
    fsync: a line lost to a power cut costs one run's feedback), and cut the log back to its cap
    once its size (a stat, not a read) is a quarter over ``cap * LINE_BYTES``: a log that no
    write cuts (inject without records, a read-only MCP server) stays bounded in bytes, and an
    append reads nothing. Raises OSError / StoreError."""
    lines = [_dump(e) for e in entries]
    if not lines:
        return
    path = directory / SHOWN_FILE
    with _io.locked(directory / _LOCK):
        _io.append_lines(path, lines, sync=False)
        if os.stat(path).st_size > cap * LINE_BYTES * _SLACK:
            _trim(path, cap)


def _trim(path: Path, cap: int) -> int:
    """Keep the newest lines of ``path`` that fit ``cap`` lines and ``cap * LINE_BYTES`` bytes (the
    newest line always; the logs' lock held); returns the lines dropped."""
    raw = _io.read_file(path)
    lines = raw.splitlines(keepends=True)
    room, keep = cap * LINE_BYTES, 0
    for line in reversed(lines[-cap:]):
        room -= len(line)
        if room < 0 and keep:
            break
        keep += 1
    if keep == len(lines):
        return 0
    _io.atomic_write(path, b"".join(lines[len(lines) - keep:]), durable=False)
    return len(lines) - keep


def cut_shown(directory: Path, raw: bytes, cap: int) -> None:
    """Cut ``directory``/shown.jsonl (whose bytes are ``raw``) back to its cap (:func:`_trim`) once it
    holds a quarter more lines or bytes (``cybmem write`` does, after each run). Raises OSError / StoreError."""
    if raw.count(b"\n") > cap * _SLACK or len(raw) > cap * LINE_BYTES * _SLACK:
        with _io.locked(directory / _LOCK):
            _trim(directory / SHOWN_FILE, cap)


def keep_used(directory: Path, entries: Iterable[Mapping[str, Any]]) -> None:
    """Append lines to ``directory``/used.jsonl (one O_APPEND write, fsynced: the write path's pace)."""
    _io.append_lines(directory / USED_FILE, [_dump(e) for e in entries])


# --- reading -----------------------------------------------------------------------------


def read_lines(path: Path, *, valid: Callable[[dict], bool] | None = None, bad: list[bytes] | None = None) -> list[dict]:
    """The JSON objects of a log file, in file order (a line that is not one is skipped; no file: []).
    ``valid`` and ``bad``: as :func:`parse_lines`."""
    try:
        return parse_lines(_io.read_file(path), valid=valid, bad=bad)
    except FileNotFoundError:
        return []


def parse_lines(raw: bytes, *, needle: bytes | None = None, valid: Callable[[dict], bool] | None = None,
                bad: list[bytes] | None = None) -> list[dict]:
    """The JSON objects (with an integer ``at``) of a log's bytes, in order; a line that is not
    one, or that ``valid`` rejects (:func:`shown_line_ok`, :func:`used_line_ok`), is skipped and,
    when ``bad`` is given, appended to it (:func:`skipped_warning` says so in one line). With
    ``needle``, only the lines that hold it (found before anything is parsed)."""
    out = []
    if needle is None:
        chunks: Iterable[bytes] = raw.split(b"\n")
    else:
        chunks, at = [], 0
        while (at := raw.find(needle, at)) >= 0:
            start = raw.rfind(b"\n", 0, at) + 1
            end = raw.find(b"\n", at)
            end = len(raw) if end < 0 else end
            chunks.append(raw[start:end])
            at = end
    for chunk in chunks:
        if not chunk.strip():
            continue
        try:
            d = _io.loads(chunk)
        except ValueError:
            d = None
        if isinstance(d, dict) and _is_int(d.get("at")) and (valid is None or valid(d)):
            out.append(d)
        elif bad is not None:
            bad.append(chunk)
    return out


def skipped_warning(path: Path, bad: list[bytes]) -> str | None:
    """One line saying that ``bad`` lines of ``path`` were skipped (None: none were)."""
    if not bad:
        return None
    return (f"skipped {len(bad)} malformed line(s) of {path} (not the JSON object the log holds); the rest was read. "
            "A torn or hand-edited line can be deleted")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _str_or_none(v: Any) -> bool:
    return v is None or isinstance(v, str)


def _list_of(v: Any, ok: Callable[[Any], bool], *, optional: bool = True) -> bool:
    return (optional and v is None) or (isinstance(v, list) and all(ok(x) for x in v))


def _run_entry_ok(r: Any) -> bool:
    return isinstance(r, Mapping) and isinstance(r.get("runId"), str) and (r.get("rank") is None or _is_int(r.get("rank")))


def shown_line_ok(d: Mapping[str, Any]) -> bool:
    """Whether a shown.jsonl object has the shape its writers give it
    (:func:`cybmem.dispatch.feedback.block_entry`, :func:`~cybmem.dispatch.feedback.mcp_entry`): the
    fields :func:`cybmem.store.feedback_match.match_used` reads, each of its type."""
    return (isinstance(d.get("source"), str) and _str_or_none(d.get("runId")) and _str_or_none(d.get("taskHash"))
            and _list_of(d.get("runs"), _run_entry_ok) and _list_of(d.get("issues"), lambda x: isinstance(x, str))
            and _list_of(d.get("fetched"), lambda x: isinstance(x, str))
            and (d.get("weights") is None or isinstance(d.get("weights"), Mapping)))


def used_line_ok(d: Mapping[str, Any]) -> bool:
    """Whether a used.jsonl object has the shape :func:`cybmem.store.feedback_match.note_used` gives
    it (the fields :func:`cybmem.retrieval.judgments.used_judgments` and the feedback page read, each
    of its type)."""
    span = d.get("shownAt")
    return (isinstance(d.get("runId"), str) and (d.get("startedAt") is None or _is_int(d.get("startedAt")))
            and _list_of(d.get("used"), _run_entry_ok) and _list_of(d.get("block"), _run_entry_ok)
            and _list_of(d.get("usedIssues"), lambda x: isinstance(x, Mapping) and isinstance(x.get("issueId"), str))
            and (span is None or (isinstance(span, list) and len(span) == 2 and all(_is_int(x) for x in span))))


def read_used(directory: Path, *, warnings: list[str] | None = None) -> list[dict]:
    """The lines of ``directory``/used.jsonl, in file order (one per written run that was shown
    something); a malformed line is skipped, with one line in ``warnings`` for them all."""
    bad: list[bytes] = []
    out = read_lines(directory / USED_FILE, valid=used_line_ok, bad=bad)
    if warnings is not None and (problem := skipped_warning(directory / USED_FILE, bad)):
        warnings.append(problem)
    return out


def valid_used(lines: Iterable[Any]) -> list[dict]:
    """Of ``lines`` (used.jsonl objects from elsewhere, e.g. a replay), those :func:`read_used` would keep."""
    return [d for d in lines if isinstance(d, Mapping) and _is_int(d.get("at")) and used_line_ok(d)]


def rename_issues(directory: Path, renamed: Mapping[str, str]) -> int:
    """Rename issue ids in both logs (``cybmem redact`` renames an id spelled from a secret; the
    logs hold ids, so they follow). Returns the lines rewritten. Raises OSError / StoreError."""
    if not renamed:
        return 0
    n = 0
    with _io.locked(directory / _LOCK):
        for name in (SHOWN_FILE, USED_FILE):
            path = directory / name
            try:
                raw = _io.read_file(path)
            except FileNotFoundError:
                continue
            if not any(old.encode() in raw for old in renamed):
                continue
            lines = raw.split(b"\n")
            for k, line in enumerate(lines):
                if not any(old.encode() in line for old in renamed):
                    continue
                try:
                    d = _io.loads(line)
                except ValueError:
                    continue
                new = _renamed(d, renamed)
                if new != d:
                    lines[k], n = _dump(new), n + 1
            _io.atomic_write(path, b"\n".join(lines))
    return n


def _renamed(value: Any, renamed: Mapping[str, str]) -> Any:
    """``value`` with every issue id in ``renamed`` replaced (the lists and ``issueId`` fields of a log line)."""
    if isinstance(value, dict):
        return {k: (renamed.get(v, v) if k == "issueId" and isinstance(v, str) else _renamed(v, renamed))
                for k, v in value.items()}
    if isinstance(value, list):
        return [renamed.get(v, v) if isinstance(v, str) else _renamed(v, renamed) for v in value]
    return value
