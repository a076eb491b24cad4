"""Tests for cybmem.store.tokens: the tokenizer."""

from __future__ import annotations


import pytest

from cybmem.store import tokens as T
from cybmem.store.tokens import tokenize, tokenize_many


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Alphabetic tokens are stemmed (Snowball English), so word forms meet.
        ("parseOutcomeSections", ["parseoutcomesect", "pars", "outcom", "section"]),
        ("HTTPServer", ["httpserver", "http", "server"]),
        ("getHTTPResponse", ["gethttprespons", "get", "http", "respons"]),
        ("snake_case_name", ["snakecasenam", "snake", "case", "name"]),
        ("test_login.py", ["testlogin", "test", "login", "py"]),
        ("testLogin", ["testlogin", "test", "login"]),
        ("src/_pytest/main.py", ["src", "pytest", "main", "py"]),
        ("__init__", ["init"]),
        ("fix-10745-capture", ["fix", "10745", "captur"]),
        ("Fixes #12038.", ["fix", "12038"]),
        ("Deprecate marks on fixtures", ["deprec", "mark", "fixtur"]),
        ("deprecated mark fixture", ["deprec", "mark", "fixtur"]),
        ("py38 and arg2index", ["py38", "py", "38", "arg2index", "arg", "index"]),
        ("The test is in a file", ["test", "file"]),
        ("a b c x1", ["x1"]),
        ("", []),
    ],
)
def test_tokenize_cases(text, expected):
    assert tokenize(text) == expected


def test_tokenize_unicode_casefold_and_nfkc():
    assert tokenize("Straße") == ["strass"]  # case-folded to ASCII, then stemmed
    assert tokenize("ÉCOLE école") == ["école", "école"]
    # decomposed e + combining acute compares equal to the composed form
    assert tokenize("e\u0301cole") == tokenize("\u00e9cole")
    assert tokenize("naïveCafé") == ["naïvecafé", "naïve", "café"]
    assert tokenize("ＡＢＣ") == ["abc"]  # fullwidth folded by NFKC


def test_tokenize_keeps_duplicates_and_many():
    assert tokenize("fix fix Fix") == ["fix", "fix", "fix"]
    assert tokenize_many(["fix it", "the Login"]) == [["fix"], ["login"]]


def test_stopwords_are_lowercase_and_dropped():
    assert all(w == w.lower() for w in T.STOPWORDS)
    assert tokenize("THE AND WITH") == []


def test_words_with_digits_and_non_english_words_are_not_stemmed():
    assert tokenize("py38 caf\u00e9s tests") == ["py38", "py", "38", "caf\u00e9s", "test"]
