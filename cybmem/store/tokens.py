"""The tokenizer: text -> index terms, the same for records and queries.

1. Text that is not pure ASCII is NFKC-normalised first (composed and decomposed accents
   compare equal), then everything is Unicode case-folded (``str.casefold``: "Straße" ->
   "strasse").
2. Words are runs of letters and digits, optionally joined by underscores; everything else
   splits (spaces, dots, dashes, slashes, ``#``, quotes...). "src/_pytest/main.py" ->
   src, pytest, main, py. Leading/trailing underscores are dropped ("__init__" -> init).
3. Identifiers are split into parts at underscores, lower->Upper changes, acronym ends
   ("HTTPServer" -> http, server) and letter<->digit changes ("py38" -> py, 38). When a word
   has more than one part, the whole word is kept too, case-folded with its underscores
   removed, so snake and camel spellings of one identifier meet:
   "parseOutcomeSections" -> parseoutcomesections, parse, outcome, sections;
   "test_login.py" -> testlogin, test, login, py; "testLogin" -> testlogin, test, login.
4. Tokens of one character and a small English stopword list (Lucene's EnglishAnalyzer stop
   set plus a few pronouns/auxiliaries, :data:`STOPWORDS`) are dropped.
5. Numbers are kept as tokens ("fixes #12038" -> fixes, 12038).
6. Every alphabetic ASCII token is stemmed with the Snowball English stemmer (Porter2, through
   PyStemmer, the Snowball project's own C binding): "marks" and "mark", "fixtures" and
   "fixture", "deprecated" and "deprecate" meet ("Deprecate marks on fixtures" finds the
   earlier "mark ... fixture" work; its effect on the qrels: benchmarks/RESULTS.md, "Figures
   the module docstrings quoted"). Stemming each distinct word once (the word cache below)
   keeps it off the hot path.

:data:`VERSION` names this rule; the Arrow cache is rebuilt when it changes.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Iterable

import Stemmer

__all__ = ["VERSION", "STOPWORDS", "tokenize", "tokenize_many"]

#: Changes whenever the tokens of some text change (the cache keeps the version it was built with).
VERSION = "3-snowball-english"  # 3: issue details join the keyword text
_STEM = Stemmer.Stemmer("english").stemWord

#: Lucene EnglishAnalyzer.ENGLISH_STOP_WORDS_SET (33 words) plus a few pronouns and
#: auxiliaries that carry no topic in commit/task text.
STOPWORDS: frozenset[str] = frozenset(
    """a an and are as at be but by for if in into is it no not of on or such that the their
    then there these they this to was will with
    we you our your its been has have had were which from so do does can would should""".split()
)

# A word: alphanumeric runs joined by single or repeated underscores ([^\W_] is "\w minus _",
# i.e. Unicode letters and digits).
_WORD_RE = re.compile(r"[^\W_]+(?:_+[^\W_]+)*")
# Parts of an ASCII identifier: acronym not followed by a lowercase letter (HTTP in
# HTTPServer), a capitalised or lowercase run, a digit run.
_ASCII_PART_RE = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def _unicode_parts(word: str) -> list[str]:
    """Split a non-ASCII word like :data:`_ASCII_PART_RE` does, using str predicates."""
    parts: list[str] = []
    for chunk in word.split("_"):
        if not chunk:
            continue
        start = 0
        n = len(chunk)
        for i in range(1, n):
            a, c = chunk[i - 1], chunk[i]
            boundary = (
                (a.isdigit() != c.isdigit())
                or (a.islower() and c.isupper())
                or (a.isupper() and c.isupper() and i + 1 < n and chunk[i + 1].islower())
            )
            if boundary:
                parts.append(chunk[start:i])
                start = i
        parts.append(chunk[start:])
    return parts


def tokenize(text: str) -> list[str]:
    """Split text into index terms (rules in the module docstring).

    Args:
        text: any text; None-like empty input gives [].

    Returns:
        Tokens in text order, duplicates kept (term frequency matters to BM25).

    Example:
        >>> tokenize("Fix parseOutcomeSections in src/_pytest/main.py (#12038)")
        ['fix', 'parseoutcomesections', 'parse', 'outcome', 'sections', 'src', 'pytest', 'main', 'py', '12038']
    """
    if not text:
        return []
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text)
    out: list[str] = []
    cache = _WORD_CACHE
    for word in _WORD_RE.findall(text):
        toks = cache.get(word)
        if toks is None:
            toks = _word_tokens(word)
            if len(cache) < _WORD_CACHE_MAX:
                cache[word] = toks
        out += toks
    return out


# Words repeat heavily across records (identifiers, paths, English), so each distinct word
# is split once: a dict lookup per word instead of regex work. Bounded, never evicted.
_WORD_CACHE: dict[str, tuple[str, ...]] = {}
_WORD_CACHE_MAX = 1_000_000


def _word_tokens(word: str) -> tuple[str, ...]:
    """The tokens of one word (see :func:`tokenize`)."""
    stop = STOPWORDS
    # Fast path: a plain lowercase word or a plain number (the vast majority).
    if word.isascii() and word.isdigit():
        return (word,) if len(word) > 1 else ()
    if word.isascii() and word.islower() and word.isalpha():
        return (_STEM(word),) if len(word) > 1 and word not in stop else ()
    out: list[str] = []
    parts = _ASCII_PART_RE.findall(word) if word.isascii() else _unicode_parts(word)
    if len(parts) > 1:
        whole = word.replace("_", "").casefold()
        if len(whole) > 1 and whole not in stop:
            out.append(_stem(whole))
    for part in parts:
        part = part.casefold()
        if len(part) > 1 and part not in stop:
            out.append(_stem(part))
    return tuple(out)


def _stem(token: str) -> str:
    """Stem an alphabetic ASCII token (identifiers with digits and non-English words stay)."""
    return _STEM(token) if token.isascii() and token.isalpha() else token


def tokenize_many(texts: Iterable[str]) -> list[list[str]]:
    """:func:`tokenize` over many texts."""
    return [tokenize(t) for t in texts]
