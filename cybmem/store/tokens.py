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

:data:`MAX_TEXT_CHARS` (:mod:`cybmem.store.display`'s) bounds what is read: a query's text is
tokenized up to it, and a record's task is indexed up to it
(:func:`cybmem.store.arrow_records.keyword_text_array`); the record keeps its task whole. A 50 MB
task would otherwise cost every read of a store without a cache tens of seconds and a gigabyte.

:data:`VERSION` names this rule; the Arrow cache is rebuilt when it changes.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Iterable

import numpy as np
import pyarrow as pa
import Stemmer

from .display import MAX_TEXT_CHARS

__all__ = ["VERSION", "STOPWORDS", "MAX_TEXT_CHARS", "tokenize", "tokenize_many", "tokenize_arrow"]

#: Changes whenever the tokens of some text change (the cache keeps the version it was built with).
VERSION = "4-snowball-english"  # 4: MAX_TEXT_CHARS; 3: issue details join the keyword text

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
    text = text[:MAX_TEXT_CHARS]
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text)
    out: list[str] = []
    cache = _WORD_CACHE
    for word in _WORD_RE.findall(text):
        toks = cache.get(word)
        out += toks if toks is not None else _tokens_of(word)
    return out


# Words repeat heavily across records (identifiers, paths, English), so each distinct word
# is split once: a dict lookup per word instead of regex work. Bounded, never evicted.
_WORD_CACHE: dict[str, tuple[str, ...]] = {}
_WORD_CACHE_MAX = 1_000_000


def _tokens_of(word: str) -> tuple[str, ...]:
    """:func:`_word_tokens` through the word cache."""
    toks = _WORD_CACHE.get(word)
    if toks is None:
        toks = _word_tokens(word)
        if len(_WORD_CACHE) < _WORD_CACHE_MAX:
            _WORD_CACHE[word] = toks
    return toks


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


def tokenize_arrow(texts: Iterable[str] | pa.Array | pa.ChunkedArray) -> pa.LargeListArray:
    """:func:`tokenize_many` as one Arrow ``large_list<string>`` array (what
    :meth:`cybmem.store.keyword_index.KeywordIndex.build` takes): the same tokens, without a Python string per word.

    The words of the ASCII texts are found over their bytes with numpy (:func:`_ascii_words`), the
    others' by :func:`tokenize`'s regex after NFKC; each distinct word is then split into tokens
    once (:func:`_word_tokens`) and every word's tokens are gathered by its id. Null texts have no
    tokens.
    """
    import pyarrow.compute as pc  # lazy: a slow import, only paid when building an index

    # Arrays built and read through their buffers: pa.array, pa.scalar and to_numpy import pandas.
    from ..arrow_numpy import array_of, numpy_of, scalar, strings

    arr = texts if isinstance(texts, (pa.Array, pa.ChunkedArray)) else strings(list(texts))
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if arr.null_count:
        arr = pc.fill_null(arr, scalar("", arr.type))
    n = len(arr)
    is_ascii = pc.string_is_ascii(arr)
    wide = np.flatnonzero(~numpy_of(is_ascii))
    words, counts = _ascii_words(arr if not len(wide) else pc.if_else(is_ascii, arr, scalar("", arr.type)))
    if len(wide):
        found = [_WORD_RE.findall(unicodedata.normalize("NFKC", t)) for t in arr.take(array_of(wide, pa.int64())).to_pylist()]
        # The wide texts' words go after the others; `order` puts every text's words back in place.
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        counts[wide] = [len(f) for f in found]
        starts[wide] = len(words) + np.concatenate(([0], np.cumsum(counts[wide])[:-1]))
        order = _ranges(starts, counts)
        words = pa.concat_arrays([words, strings([w for f in found for w in f], pa.large_string())])
    else:
        order = None
    enc = pc.dictionary_encode(words)
    # The tokens of each distinct word: `lens` of them from `first` on in `flat` (ids into `vocab`).
    per_distinct = [_tokens_of(word) for word in enc.dictionary.to_pylist()]
    lens = np.fromiter(map(len, per_distinct), np.int64, len(per_distinct))
    tokens_enc = pc.dictionary_encode(strings([t for toks in per_distinct for t in toks]))
    flat, vocab = numpy_of(tokens_enc.indices), tokens_enc.dictionary
    ids = numpy_of(enc.indices)
    if order is not None:
        ids = ids[order]
    first = np.concatenate(([0], np.cumsum(lens)[:-1])) if len(lens) else lens
    per_word = lens[ids]
    tokens = flat[_ranges(first[ids], per_word)]
    token_ends = np.concatenate(([0], np.cumsum(per_word)))  # tokens before each word
    token_offsets = token_ends[np.concatenate(([0], np.cumsum(counts)))]
    values = vocab.take(array_of(tokens, pa.from_numpy_dtype(tokens.dtype)))
    return pa.LargeListArray.from_arrays(array_of(token_offsets, pa.int64()), values)


def _ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """The positions ``starts[i] .. starts[i] + lens[i] - 1`` for every i, concatenated."""
    ends = np.cumsum(lens)
    return np.repeat(starts - (ends - lens), lens) + np.arange(int(ends[-1]) if len(ends) else 0)


#: Bytes an ASCII word is made of: letters, digits and the underscores that join them.
_WORD_BYTE = np.zeros(256, dtype=bool)
_WORD_BYTE[list(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")] = True
_UNDERSCORE = ord("_")


def _ascii_words(arr: pa.StringArray | pa.LargeStringArray) -> tuple[pa.Array, np.ndarray]:
    """The words :data:`_WORD_RE` finds in ASCII texts, in text order, and how many each text has.

    In ASCII, a word is a run of letters, digits and underscores with the underscores at its ends
    dropped (one word per run, none when the run is all underscores): runs start and end where
    :data:`_WORD_BYTE` changes (they alternate), and a text's first byte starts a new one.
    """
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64 if pa.types.is_large_string(arr.type) else np.int32)
    offsets = offsets[arr.offset : arr.offset + len(arr) + 1].astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    data = data[offsets[0] : offsets[-1]]
    offsets -= offsets[0]
    word = np.zeros(len(data) + 2, dtype=bool)  # a non-word byte on either side
    word[1:-1] = _WORD_BYTE[data]
    edges = np.flatnonzero(word[1:] != word[:-1])  # in data's positions
    starts, ends = edges[0::2], edges[1::2]
    word = word[1:-1]
    # A run that goes on from one text into the next is two runs.
    inner = offsets[1:-1]
    inner = inner[(inner > 0) & (inner < len(data))]
    split = inner[word[inner - 1] & word[inner]] if len(inner) else inner
    if len(split):
        split = split[np.concatenate(([True], split[1:] != split[:-1]))]  # empty texts share an offset
        starts = np.insert(starts, np.searchsorted(starts, split), split)
        ends = np.insert(ends, np.searchsorted(ends, split), split)
    # Underscores at either end of a run are not part of its word (few runs have any).
    rows = np.flatnonzero(data[starts] == _UNDERSCORE)
    while len(rows):
        word[starts[rows]] = False
        starts[rows] += 1
        rows = rows[starts[rows] < ends[rows]]
        rows = rows[data[starts[rows]] == _UNDERSCORE]
    rows = np.flatnonzero((starts < ends) & (data[ends - 1] == _UNDERSCORE))
    while len(rows):
        word[ends[rows] - 1] = False
        ends[rows] -= 1
        rows = rows[starts[rows] < ends[rows]]
        rows = rows[data[ends[rows] - 1] == _UNDERSCORE]
    kept = starts < ends
    counts = np.diff(np.concatenate(([0], np.cumsum(kept)))[np.searchsorted(starts, offsets)])
    starts, ends = starts[kept], ends[kept]
    word_offsets = np.zeros(len(starts) + 1, np.int64)
    np.cumsum(ends - starts, out=word_offsets[1:])
    words = pa.LargeStringArray.from_buffers(len(starts), pa.py_buffer(word_offsets), pa.py_buffer(data[word]))
    return words, counts
