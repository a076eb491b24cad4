"""Tests for cybmem.store.tokens: the tokenizer."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


# tokenize_arrow: the whole-batch tokenizer the keyword index is built from, token for token tokenize's.
_PIECES = ["_", "__", "a_b", "_x_", "x__", "__init__", "HTTPServer", "py38", "Straße", "e\u0301", "\uff21\uff22\uff23", "\x1e",
           "\n", " ", "the", "naïveCafé", "\u0663", "\u216b", "src/_pytest/main.py", "", "\x00", "\ufb01", "\u00b2", "9_"]
_text = st.lists(st.one_of(st.sampled_from(_PIECES), st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)),
                 max_size=8).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_text, max_size=12))
def test_tokenize_arrow_is_tokenize_many(texts):
    assert T.tokenize_arrow(texts).to_pylist() == tokenize_many(texts)


@pytest.mark.parametrize("texts", [
    [], [""], ["", "", "x1"], ["ab", "cd"], ["a_", "_b"], ["ab_", "_cd", "ef"], ["__", "__"], ["café", "ab", "cd"],
    ["ab", "café", "cd", ""], ["Fix parseOutcomeSections in src/_pytest/main.py (#12038)"] * 3,
])
def test_tokenize_arrow_keeps_texts_apart(texts):
    """A word that ends one text and one that starts the next stay two words, wherever the
    ASCII and the other texts fall."""
    got = T.tokenize_arrow(texts)
    assert got.type == pa.large_list(pa.string())
    assert got.to_pylist() == tokenize_many(texts)


def test_tokenize_arrow_takes_arrow_arrays():
    texts = ["fix the login", None, "HTTPServer straße", "", "py38_x"]
    want = [tokenize(t or "") for t in texts]
    assert T.tokenize_arrow(pa.array(texts, pa.large_string())).to_pylist() == want
    assert T.tokenize_arrow(pa.chunked_array([texts[:2], texts[2:]], pa.string())).to_pylist() == want
    assert T.tokenize_arrow(pa.array(["zzz"] + texts, pa.string()).slice(1)).to_pylist() == want
