"""Tests for cybmem.text: the tokenizer."""

from __future__ import annotations


import pytest

from cybmem import text as T
from cybmem.text import tokenize, tokenize_many


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("parseOutcomeSections", ["parseoutcomesections", "parse", "outcome", "sections"]),
        ("HTTPServer", ["httpserver", "http", "server"]),
        ("getHTTPResponse", ["gethttpresponse", "get", "http", "response"]),
        ("snake_case_name", ["snakecasename", "snake", "case", "name"]),
        ("test_login.py", ["testlogin", "test", "login", "py"]),
        ("testLogin", ["testlogin", "test", "login"]),
        ("src/_pytest/main.py", ["src", "pytest", "main", "py"]),
        ("__init__", ["init"]),
        ("fix-10745-capture", ["fix", "10745", "capture"]),
        ("Fixes #12038.", ["fixes", "12038"]),
        ("py38 and arg2index", ["py38", "py", "38", "arg2index", "arg", "index"]),
        ("The test is in a file", ["test", "file"]),
        ("a b c x1", ["x1"]),
        ("", []),
    ],
)
def test_tokenize_cases(text, expected):
    assert tokenize(text) == expected


def test_tokenize_unicode_casefold_and_nfkc():
    assert tokenize("Straße") == ["strasse"]
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
