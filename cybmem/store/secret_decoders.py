"""The decoders that let every secret shape see text as a program would read it: JSON and
backslash escapes and URL-encoding undone, invisible characters removed, base64 of text decoded,
wrapped tokens joined. A finding in a decoded copy is mapped back to the characters of the
original that hold it (:class:`Decoded`), so the redaction replaces exactly the encoded secret
(:func:`cybmem.store.secrets.scan`).
"""

from __future__ import annotations

import binascii
import re
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

__all__ = ["Decoded", "decoded_variants"]


@dataclass
class Decoded:
    """A decoded copy of a text, and the way back: ``edits`` are (decoded position, decoded
    length, original position, original length), sorted, for every place the two differ."""

    text: str
    edits: list[tuple[int, int, int, int]]
    #: only findings that cover a decoded position of an edit count (line joins: a finding that
    #: crosses no join is found in the original already)
    crossing_only: bool = False
    #: only findings that take in an edit count, any kind (text decoded from base64: beside it
    #: the copy is the original, and the decoded text is no part of the sentence around it)
    touching_only: bool = False

    def __post_init__(self) -> None:
        self._keys = [e[0] for e in self.edits]

    def _shift(self, i: int) -> tuple[int, tuple[int, int, int, int] | None]:
        k = bisect_right(self._keys, i) - 1  # the last edit at or before i
        if k < 0:
            return i, None
        d, dl, o, ol = self.edits[k]
        if d <= i < d + dl:
            return o, self.edits[k]
        return i - (d + dl) + (o + ol), None

    def original_span(self, start: int, end: int) -> tuple[int, int]:
        """The original [start, end) of the decoded [start, end)."""
        o_start, _ = self._shift(start)
        o_last, edit = self._shift(end - 1)
        return o_start, (edit[2] + edit[3]) if edit else o_last + 1

    def windows(self, margin: int) -> list[tuple[int, int]]:
        """The decoded regions worth scanning: each edit with margin characters either side,
        overlapping ones merged (elsewhere the decoded text is the original)."""
        out: list[tuple[int, int]] = []
        size = len(self.text)
        for d, dl, _, _ in self.edits:
            lo, hi = max(0, d - margin), min(size, d + dl + margin)
            if out and lo <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], hi))
            else:
                out.append((lo, hi))
        return out

    def crosses_edit(self, start: int, end: int) -> bool:
        k = bisect_right(self._keys, start)
        return k < len(self._keys) and self._keys[k] < end

    def touches_edit(self, start: int, end: int) -> bool:
        """Whether decoded [start, end) holds a decoded position of an edit or, for a removal
        (decoded length 0), the place of one strictly inside it."""
        k = bisect_right(self._keys, start) - 1
        if k >= 0 and start < self.edits[k][0] + self.edits[k][1]:
            return True
        return self.crosses_edit(start, end)


_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|([\\\"'/nrtbf]))")
_ESCAPED = {"n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f"}
# Default_Ignorable_Code_Point (Unicode's DerivedCoreProperties.txt): what a renderer shows as nothing, so
# a token pasted from a chat or a web page may carry one inside it unseen: U+00AD SOFT HYPHEN, U+200B-U+200D
# (zero width space, non-joiner, joiner), U+200E/F and U+202A-U+202E (direction marks), U+2060 WORD JOINER
# to U+206F, U+FEFF (BOM), variation selectors, Hangul fillers, tags. Removed before matching
# (decoded_variants); the redaction replaces the original span, the invisible characters inside included.
_INVISIBLE = re.compile("[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
                        "\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3"
                        "\U0001d173-\U0001d17a\U000e0000-\U000e0fff]++")


def _unescape(m: re.Match[str]) -> str:
    """What an escape stands for; an escaped invisible character (\\u200b) stands for nothing."""
    if not m[1]:
        return _ESCAPED.get(m[2], m[2])
    char = chr(int(m[1], 16))
    return "" if _INVISIBLE.match(char) else char


# A base64 run (standard or URL-safe) long enough to hold a credential: what it decodes to, when that is
# text, is scanned too (Docker's X-Registry-Auth header is base64url of {"username", "password", …}).
_B64_RUN = re.compile(r"(?<![A-Za-z0-9+/_=-])[A-Za-z0-9+/_-]{16,}+={0,2}+(?![A-Za-z0-9+/_=-])")


def _b64_text(token: str) -> str | None:
    """The text a base64 run decodes to (UTF-8, printable but for line breaks and tabs), or None."""
    body = token.rstrip("=")
    if ("-" in body or "_" in body) and ("+" in body or "/" in body):
        return None  # two alphabets: a path or an identifier, not base64
    body = body.replace("-", "+").replace("_", "/")
    if len(body) % 4 == 1:
        return None
    try:
        data = binascii.a2b_base64(body + "=" * (-len(body) % 4))
        decoded = data.decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    return decoded if decoded.replace("\n", "").replace("\t", "").replace("\r", "").isprintable() else None


_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")
# A newline (and the indentation around it) inside a long token: a line of 60+ characters ends
# with 16+ token characters, and the next begins with a run that reads as the rest of a token
# (a digit, or upper and lower case mixed, in its first 12 characters; not ISSUES: or Next).
_WRAP = re.compile(r"(?<=[^\n]{44}[A-Za-z0-9+/=_-]{16})[ \t]*+\r?\n[ \t]*+(?:#[ \t]?|//[ \t]?)?"
                   r"(?=[A-Za-z0-9+/=_-]{0,11}?(?:[0-9]|[a-z][A-Z]|[A-Z]{2}[a-z]))")


def _substitute(text: str, cuts: Iterable[tuple[int, int, str]], crossing_only: bool = False,
                touching_only: bool = False) -> Decoded | None:
    """text with each cut [start, end) replaced by its new text (cuts in order, not overlapping)."""
    parts: list[str] = []
    edits: list[tuple[int, int, int, int]] = []
    pos = delta = 0
    for start, end, new in cuts:
        parts.append(text[pos:start])
        edits.append((start + delta, len(new), start, end - start))
        parts.append(new)
        delta += len(new) - (end - start)
        pos = end
    if not edits:
        return None
    parts.append(text[pos:])
    return Decoded("".join(parts), edits, crossing_only, touching_only)


def _replaced(text: str, pattern: re.Pattern[str], replace: Callable[[re.Match[str]], str]) -> Iterator[tuple[int, int, str]]:
    """Each match of pattern in text as a cut: its span and what replace makes of it."""
    return ((m.start(), m.end(), replace(m)) for m in pattern.finditer(text))


# A token cut by hand or by a tool where no column limit explains it: a shell line continuation,
# an escaped newline inside a JSON string (\\n or \\r\\n), a string concatenation ("…" +, adjacent
# quoted lines, "…"\\ then "…") or a plain newline whose next line goes on like a token (see _WRAP:
# not ISSUES: nor Next), with the indentation around it.
_T = "A-Za-z0-9+/=_-"  # a token's characters
_CUT = (rf"[ \t]*+(?:\\\r?\n[ \t]*+(?=[{_T}]{{4}})|\r?\n[ \t]*+(?=[{_T}]{{0,11}}?(?:[0-9]|[a-z][A-Z]|[A-Z]{{2}}[a-z])))"
        rf"|(?:\\(?:r\\)?n|[\"'][ \t]*+(?:\+[ \t]*+(?:\\?\r?\n[ \t]*+)?|\\?\r?\n[ \t]*+)[\"'])[ \t]*+(?=[{_T}]{{4}})")
# a token's first part (the end of its line or string, or what follows an escaped newline), and the cut after it
_FIRST_PART = re.compile(rf"(?:(?<![{_T}])|(?<=\\n))[{_T}]{{4,}}+(?P<cut>{_CUT})")
# a part between two cuts, whole (a line, or a quoted string, of its own)
_INNER_PART = re.compile(rf"[{_T}]{{4,}}+(?P<cut>{_CUT})")
# the last part, whole: it ends its line or its string
_LAST_PART = re.compile(rf"(?P<part>[{_T}]{{4,}}+)(?:[ \t]*+(?:\r?\n|$)|[\"'\\])")
# the last part when a check confirms the token: the token-shaped run its line begins with,
# unless it is the next line's key (user2: bob)
_LAST_RUN = re.compile(rf"(?P<part>[{_T}]++)(?![ \t]*+:)")
_MAX_PARTS = 10  # a 40-character token cut every 4 characters (a part has 4 or more)
_AROUND = 320  # characters either side of a cut token that its check sees (as scan's windows)


def _generated(part: str) -> bool:
    """A part that reads as generated: a digit and a letter, or mixed case."""
    has_digit = any(c.isdigit() for c in part)
    mixed = any(c.isupper() for c in part) and any(c.islower() for c in part)
    return (has_digit and any(c.isalpha() for c in part)) or mixed


def _joins(text: str, holds: Callable[[Decoded], bool] | None = None) -> Iterator[tuple[int, int, str]]:
    """The cuts of each token cut into 2 to _MAX_PARTS parts, each cut joined (""). Every part
    but the first is whole, and every part but the last reads as generated; a first part under
    16 characters needs only the token as joined to read as generated (AKIAIOSFODNN / 7EXAMPLE,
    a key cut in three), so that a short word at a line's end is not joined to the start of the
    next line's text.

    With ``holds`` (does this join, with the text around it, hold a token that takes in its first
    and its last cut?) a run of parts stops where a token does: the longest run from a first part
    that holds one is joined, and the parts after it may start the next (two cut tokens one after
    the other, a token-like line after one); the last part may be the run its line begins with
    (``…xY5 and then we deployed``). Without it, or past a budget of checks that keeps the pass
    linear (about 4 characters checked per character of text), the whole run is joined and a
    short first part needs a last part that is a line or a string of its own."""
    budget = 4 * len(text) + 65_536
    done = 0  # the end of the last token joined: its parts are not first parts
    for m in _FIRST_PART.finditer(text):
        start, (cut, pos) = m.start(), m.span("cut")
        short = cut - start < 16
        if start < done or not (short or _generated(text[start:cut])):
            continue
        parts, cuts = [text[start:cut]], [(cut, pos, "")]
        while len(cuts) < _MAX_PARTS - 1:
            part = _INNER_PART.match(text, pos)
            if part is None or not _generated(text[pos:part.start("cut")]):
                break
            parts.append(text[pos:part.start("cut")])
            cut, pos = part.span("cut")
            cuts.append((cut, pos, ""))
        checked = holds is not None and budget > 0
        for k in range(len(cuts), 0, -1) if checked else (len(cuts),):
            if k < len(cuts):  # stop before part k + 1: part k is whole (a cut follows it)
                last, end = parts[k], cuts[k][0]
            else:
                run = (_LAST_RUN if checked else _LAST_PART).match(text, pos)
                if run is not None:
                    last, end = run.group("part"), run.end("part")
                elif short or checked:
                    continue
                else:
                    last, end = "", pos
            if short and not _generated("".join(parts[:k]) + last):
                continue
            if checked:
                lo, hi = max(0, start - _AROUND), min(len(text), end + _AROUND)
                budget -= hi - lo + 512  # a check's own cost, besides its characters
                joined = _substitute(text[lo:hi], [(c - lo, p - lo, "") for c, p, _ in cuts[:k]])
                if not (joined and holds(joined)):
                    continue
            done = end
            yield from cuts[:k]
            break


def decoded_variants(text: str, holds: Callable[[Decoded], bool] | None = None) -> list[Decoded]:
    """The decoded copies of text worth scanning again: escapes undone, percent-encoding undone,
    wrapped tokens joined (each only when the text holds what it decodes; a token cut by hand
    where ``holds`` confirms it, see _joins), invisible characters removed, and base64 runs that
    decode to text replaced by that text (a finding there maps back to the whole run)."""
    out = []
    if "\\" in text:
        d = _substitute(text, _replaced(text, _ESCAPE, _unescape))
        if d:
            out.append(d)
    if "%" in text:
        d = _substitute(text, _replaced(text, _PERCENT, lambda m: chr(int(m[1], 16))))
        if d:
            out.append(d)
    if "\n" in text:
        d = _substitute(text, _replaced(text, _WRAP, lambda m: ""), crossing_only=True)
        if d:
            out.append(d)
    if "\n" in text or "\\n" in text:
        d = _substitute(text, _joins(text, holds), crossing_only=True)
        if d:
            out.append(d)
    if not text.isascii():
        d = _substitute(text, _replaced(text, _INVISIBLE, lambda m: ""))  # the text as a reader sees it
        if d:
            out.append(d)
    cuts = [(m.start(), m.end(), decoded) for m in _B64_RUN.finditer(text) if (decoded := _b64_text(m.group()))]
    d = _substitute(text, cuts, touching_only=True)
    if d:
        out.append(d)
    return out
