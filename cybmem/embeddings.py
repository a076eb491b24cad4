"""embeddings.jsonl: one vector per record and model, append-only (store-format.md).

Each line is ``{"runId", "model", "dims", "vector": [floats]}`` (``dims`` is optional for lines
written by other tools). :func:`read_rows` reads the file with the one reader and reports each
unusable line once; :func:`row_problem` is the rule for a usable row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import _io

__all__ = ["MAX_EMBEDDINGS_BYTES", "row_problem", "read_rows"]

MAX_EMBEDDINGS_BYTES = 8 * 1024 * 1024 * 1024


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
