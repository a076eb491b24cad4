"""embeddings.jsonl: one vector per record and model, append-only (store-format.md).

Each line is ``{"runId", "model", "vector": [floats]}``, exactly as store-format.md has it (a
``dims`` field another tool adds is checked against the vector's length). :func:`read_rows` reads the file with the one reader and reports each
unusable line once; :func:`row_problem` is the rule for a usable row. Vectors are keyed by model
and dimension (cybmem.retrieval.vector_cache): a model that changes its dimension under the same name starts a
new key, and ``cybmem embed`` then gives every record a vector of it. cybmem writes at most one
line per (runId, model) and key (:meth:`cybmem.store.memory_store.MemoryStore.append_embeddings` checks under
the project lock); should a run still have several, readers take the last of a key, and
:func:`superseded` is the rule by which ``cybmem doctor --repair`` keeps one per run and model.

The file is derived and optional (every vector can be made again by ``cybmem embed``), so unlike
records and the ledger it may be rewritten: :func:`drop_lines` does it atomically, under the
project lock, for the repair only.

What is embedded is what the keyword index sees (:func:`record_text`: task, summary, title and
detail of the issues the run raised, the files it edited and the commands it ran), cut to :data:`EMBED_TEXT_CHARS` (:func:`embedding_text`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from .. import _io

__all__ = ["MAX_EMBEDDINGS_BYTES", "EMBED_TEXT_CHARS", "row_problem", "read_rows", "record_text", "issue_text", "embedding_text",
           "row_bytes", "keys_in", "newest_dims", "superseded", "drop_lines"]

MAX_EMBEDDINGS_BYTES = 8 * 1024 * 1024 * 1024
# Embedding models read a few hundred tokens at most (all-MiniLM-L6-v2: 256 word pieces, about
# 1,000 characters; nomic-embed-text more, at a cost that grows with the length): the head of
# the text carries the task, which is what a later query resembles.
EMBED_TEXT_CHARS = 2000


def record_text(task: str, summary: str | None, issues: Sequence[str] | None, issue_text: Mapping[str, str],
                files: Sequence[str] = (), commands: Sequence[str] = ()) -> str:
    """The text a record is indexed by: task, summary, the text (title, detail) of the issues it
    raised, then the files it edited and the commands it ran (an agent's turn), one a line.

    The keyword index (cybmem.store.arrow_records) and the embeddings use this one function.
    """
    text = task + "\n" + (summary or "")
    if issues:
        text += "\n" + "\n".join(issue_text.get(i, i) for i in issues)
    for items in (files, commands):
        if items:
            text += "\n" + "\n".join(items)
    return text


def issue_text(title: str, detail: str | None) -> str:
    """An issue's text in a record's (:func:`record_text`) and in the issue index: its title, then its detail if any."""
    return title if not detail else f"{title}\n{detail}"


def issue_texts_of(titles: Iterable[str], details: Iterable[str | None]) -> list[str]:
    """:func:`issue_text` of each (title, detail) pair: a fold's column at once."""
    return [title if not detail else f"{title}\n{detail}" for title, detail in zip(titles, details)]


def embedding_text(text: str) -> str | None:
    """``text`` cut to :data:`EMBED_TEXT_CHARS` for an embedding model; None when nothing is left to embed."""
    text = text.strip()[:EMBED_TEXT_CHARS]
    return text if text.strip() else None


def row_bytes(run_id: str, model: str, vector: np.ndarray) -> bytes:
    """One embeddings.jsonl line (without newline); float32 values in their shortest form."""
    vec = np.ascontiguousarray(vector, dtype=np.float32).ravel()
    return orjson.dumps({"runId": run_id, "model": model, "vector": vec}, option=orjson.OPT_SERIALIZE_NUMPY)


def row_problem(row: Any) -> str | None:
    """Why an embeddings.jsonl row is unusable, or None."""
    if not isinstance(row, dict):
        return "a line that is not a JSON object"
    if not isinstance(row.get("runId"), str) or not row["runId"]:
        return "a row without a runId"
    if not isinstance(row.get("model"), str) or not row["model"]:
        return "a row without a model"
    vec = row.get("vector")
    if not isinstance(vec, list) or not vec or not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in vec
    ):
        return "a row whose vector is not a non-empty list of numbers"
    dims = row.get("dims")
    if dims is not None and dims != len(vec):
        return f"a row whose dims ({dims}) is not its vector's length ({len(vec)})"
    return None


def read_rows(path: Path) -> tuple[list[tuple[int, dict]], list[tuple[int, str, bool]]]:
    """Usable rows of an embeddings file with their line numbers, and the unusable lines.

    Returns:
        ``(rows, problems)``: (line, row) pairs in file order; (line, reason, torn) for each line
        skipped (``torn``: the last line, with no newline: a writer was interrupted). A missing
        file has neither.
    """
    try:
        raw = _io.read_file(path, limit=MAX_EMBEDDINGS_BYTES)
    except FileNotFoundError:
        return [], []
    rows: list[tuple[int, dict]] = []
    problems: list[tuple[int, str, bool]] = []
    lines = raw.split(b"\n")
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        torn = lineno == len(lines)
        try:
            row = _io.loads(line)
            reason = row_problem(row)
        except ValueError as exc:
            reason = f"not valid JSON ({exc})"
        if reason is None:
            rows.append((lineno, row))
        else:
            problems.append((lineno, "a torn last line (no newline; a writer was interrupted)" if torn else reason, torn))
    return rows, problems


def keys_in(path: Path, wanted: Iterable[tuple[str, str]], *, offset: int = 0) -> set[tuple[str, str]]:
    """Which of the ``wanted`` (runId, model) pairs have a usable line in the file after ``offset``.

    Only lines that contain one of the wanted run ids as a JSON string are parsed (run ids need
    no escapes, so their quoted form is what any JSON writer puts in the line), so checking a
    few keys costs one read of the bytes after ``offset`` and a substring search.
    """
    wanted = set(wanted)
    if not wanted:
        return set()
    try:
        raw = _io.read_file(path, limit=MAX_EMBEDDINGS_BYTES, offset=offset)
    except FileNotFoundError:
        return set()
    found: set[tuple[str, str]] = set()
    for run_id in {rid for rid, _ in wanted}:
        needle = b'"' + run_id.encode() + b'"'
        for m in re.finditer(re.escape(needle), raw):
            start = raw.rfind(b"\n", 0, m.start()) + 1
            end = raw.find(b"\n", m.end())
            if end < 0:
                continue  # a torn last line is not a line yet
            try:
                row = _io.loads(raw[start:end])
            except ValueError:
                continue
            if row_problem(row) is None and (row["runId"], row["model"]) in wanted:
                found.add((row["runId"], row["model"]))
    return found


def newest_dims(rows: Sequence[tuple[int, dict]]) -> dict[str, int]:
    """Each model's newest dimension: the length of its last usable vector (the key readers use)."""
    return {row["model"]: len(row["vector"]) for _, row in rows}


def superseded(rows: Sequence[tuple[int, dict]]) -> list[int]:
    """Line numbers of the usable rows that another row of the same run and model replaces.

    One row per (runId, model) is kept: its last of the model's newest dimension (what search
    compares with a query now), or, when the run has none of that dimension, its last one.
    ``rows`` are :func:`read_rows`' (line, row) pairs in file order.
    """
    newest = newest_dims(rows)
    keep: dict[tuple[str, str], tuple[bool, int]] = {}
    for lineno, row in rows:
        key = (row["runId"], row["model"])
        current = len(row["vector"]) == newest[row["model"]]
        best = keep.get(key)
        if best is None or current or not best[0]:
            keep[key] = (current, lineno)
    kept = {lineno for _, lineno in keep.values()}
    return [lineno for lineno, _ in rows if lineno not in kept]


def drop_lines(path: Path, lines: Iterable[int]) -> int:
    """Rewrite an embeddings file without the given line numbers (1-based), atomically; every other
    byte stays as it was (a torn last line too). The caller holds the project lock. Returns how
    many lines went."""
    drop = set(lines)
    if not drop:
        return 0
    parts = _io.read_file(path, limit=MAX_EMBEDDINGS_BYTES).split(b"\n")
    kept = [part for lineno, part in enumerate(parts, 1) if lineno not in drop]
    _io.atomic_write(path, b"\n".join(kept))
    return len(parts) - len(kept)
