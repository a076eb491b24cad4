"""Find and redact secret shapes before text is stored or shown: :func:`scan` runs the core table
(:mod:`cybmem.store.secret_core`), the shapes beyond it (:mod:`cybmem.store.secret_shapes`) and the
opt-in scanner (:mod:`cybmem.store.secret_scanner`) over the text as written and as decoded
(:mod:`cybmem.store.secret_decoders`), and resolves their overlaps in one pass.

Each secret is replaced with ``[REDACTED:<kind>]``; only shapes with a distinctive prefix or an
explicit key are matched, and where the shape has a label only the secret part is replaced. The
kinds and the rules that trade recall for precision are listed in docs/secrets.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from dataclasses import dataclass

from .secret_core import SHAPES
from .secret_decoders import Decoded, decoded_variants
from .secret_scanner import scanner_candidates
from .secret_shapes import find

__all__ = ["Finding", "redact", "redact_value", "scan"]

_MARK = "[REDACTED:"
_MAX_PASSES = 8


@dataclass(frozen=True)
class Finding:
    """One secret: its kind and its [start, end) span in the scanned text."""

    kind: str
    start: int
    end: int


def _span(match: re.Match[str], group: int | str | tuple[str, ...]) -> tuple[int, int]:
    """The span of the secret group (for a tuple: the first group that took part)."""
    if isinstance(group, tuple):
        group = next((g for g in group if match.start(g) >= 0), group[0])
    return match.span(group)


def _candidates(text: str) -> list[tuple[int, int, int, str]]:
    """(start, -end, order, kind) of every shape found in text, overlaps included: the core
    table's (order: its place in SHAPES) and cybmem.store.secret_shapes' (after them)."""
    out: list[tuple[int, int, int, str]] = []
    for order, shape in enumerate(SHAPES):
        if shape.needles and not any(n in text for n in shape.needles):
            continue
        for match in shape.regex.finditer(text):
            start, end = _span(match, shape.group)
            secret = text[start:end]
            if not secret or (shape.check and not shape.check(secret, match)):
                continue
            out.append((start, -end, order, shape.kind))
    out.extend((start, -end, len(SHAPES), kind) for start, end, kind in find(text))
    out.extend((start, -end, len(SHAPES) + 1, kind) for start, end, kind in scanner_candidates(text))
    return out


# A PEM body spans lines by itself; a random run is not joined to the next line's.
_NOT_JOINED = frozenset({"private_key", "high_entropy_string"})
_WINDOW = 320  # characters of a decoded copy scanned either side of what was decoded


def _window_candidates(decoded: Decoded) -> Iterator[tuple[int, int, int, str]]:
    """(start, end, order, kind) in a decoded copy, searched only near what was decoded
    (elsewhere it is the original); a finding cut by a window's edge is left to the next."""
    size = len(decoded.text)
    for lo, hi in decoded.windows(_WINDOW):
        for start, neg_end, order, kind in _candidates(decoded.text[lo:hi]):
            if (start == 0 and lo > 0) or (-neg_end == hi - lo and hi < size):
                continue
            yield lo + start, lo - neg_end, order, kind


def _holds_token(joined: Decoded) -> bool:
    """A token's parts joined, with the text around them, hold a finding that takes in the first
    and the last join (not a random run or a PEM body: _NOT_JOINED)."""
    first, last = joined.edits[0][0], joined.edits[-1][0]
    return any(start < first and last < -neg_end and kind not in _NOT_JOINED
               for start, neg_end, _, kind in _candidates(joined.text))


def scan(text: str) -> list[Finding]:
    """Find the secrets in text, one finding per secret, without overlaps.

    The text is searched as written and as decoded (cybmem.store.secret_decoders.decoded_variants: JSON
    escapes and percent-encoding undone, wrapped tokens joined, invisible characters removed,
    base64 of text decoded); a finding in a decoded copy is mapped back to the characters that
    hold it (a token's invisible characters included; a base64 run whole). When spans overlap, the one that starts
    first wins, then the longer, then the more specific shape (the order of SHAPES).

    Args:
        text: any text.

    Returns:
        The findings, sorted by start.
    """
    if not text:
        return []
    candidates = _candidates(text)
    seen = [(start, -neg_end) for start, neg_end, _, _ in candidates]
    for decoded in decoded_variants(text, _holds_token):
        for start, end, order, kind in _window_candidates(decoded):
            if decoded.crossing_only and (kind in _NOT_JOINED or not decoded.crosses_edit(start, end)):
                continue  # a joined line is for a token cut in two, not for new random runs
            if decoded.touching_only and not decoded.touches_edit(start, end):
                continue  # beside a decoded base64 run the copy is the text as written
            o_start, o_end = decoded.original_span(start, end)
            if o_end <= o_start or _MARK in text[o_start:o_end]:
                continue
            if decoded.crossing_only and any(s < o_end and o_start < e and e >= o_end for s, e in seen):
                continue  # the text as written already shows all of this secret
            candidates.append((o_start, -o_end, order, kind))
    findings: list[Finding] = []
    last_end = 0
    for start, neg_end, _, kind in sorted(candidates):
        if start >= last_end:
            findings.append(Finding(kind, start, -neg_end))
            last_end = -neg_end
    return findings


def _redact_once(text: str) -> tuple[str, list[Finding]]:
    """Replace the findings of one scan."""
    findings = scan(text)
    parts: list[str] = []
    pos = 0
    for f in findings:
        parts.append(text[pos : f.start])
        parts.append(f"{_MARK}{f.kind}]")
        pos = f.end
    parts.append(text[pos:])
    return "".join(parts), findings


def redact(text: str) -> tuple[str, list[str]]:
    """Replace every secret in text with [REDACTED:<kind>].

    Scans again after each replacement round (at most a few rounds) in case removing one
    secret exposed another, so that redacting twice changes nothing.

    Args:
        text: any text.

    Returns:
        (redacted text, sorted unique kinds found).
    """
    kinds: set[str] = set()
    for _ in range(_MAX_PASSES):
        text, findings = _redact_once(text)
        if not findings:
            break
        kinds.update(f.kind for f in findings)
    return text, sorted(kinds)


def redact_value(value: Any, kinds: set[str] | None = None) -> tuple[Any, set[str]]:
    """The one redaction pass over stored input: every string inside ``value`` (a str, or lists
    and dicts of them, keys left alone) redacted whole, before anything strips, extracts,
    collapses or cuts it (a cut could drop the END line a PEM key is found by).

    Returns:
        (the value with every string redacted, the kinds found, added to ``kinds`` when given).
    """
    found = kinds if kinds is not None else set()
    if isinstance(value, str):
        out, ks = redact(value)
        found.update(ks)
        return out, found
    if isinstance(value, list):
        return [redact_value(v, found)[0] for v in value], found
    if isinstance(value, dict):
        return {k: redact_value(v, found)[0] for k, v in value.items()}, found
    return value, found
