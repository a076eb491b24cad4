"""Tests for cybmem.store.display: how stored text is shown (one-line cuts, a task's subject line)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from cybmem.store.display import head_line, shorten, subject_line

# Every code point, lone surrogates and controls included.
RAW = st.text(
    alphabet=st.one_of(
        st.characters(exclude_categories=()), st.characters(categories=["Cs", "Cc"]), st.sampled_from("\r\n -*:")
    )
)


# --- shorten / head_line ---------------------------------------------------------------------


def test_shorten_word_boundary():
    assert shorten("alpha beta gamma delta", 12) == "alpha beta…"
    assert shorten("alpha beta", 10) == "alpha beta"
    assert shorten("alpha\n\n beta", 50) == "alpha beta"
    assert shorten("x" * 20, 5) == "xxxx…"
    assert shorten("abc", 0) == ""
    assert shorten(None, 5) == ""


@settings(deadline=None, max_examples=200)
@given(RAW, st.integers(min_value=0, max_value=300))
def test_shorten_respects_limit(text, limit):
    out = shorten(text, limit)
    assert len(out) <= limit
    assert "\n" not in out


def test_head_line():
    assert head_line("\n\n  first   line here \nsecond", 100) == "first line here"
    assert head_line("\r\n\r\nfirst\r\nsecond", 100) == "first"
    assert head_line("one two three four", 10) == "one two…"
    assert head_line("", 10) == ""
    assert head_line(None, 10) == ""
    assert head_line(" \n\t\n", 10) == ""


def test_subject_line_reads_a_merge_commit_as_its_pull_requests_title():
    merge = ("Merge pull request #12038 from bluetech/fixtures-rm-arg2index\n\n"
             "fixtures: avoid mutable arg2index state in favor of looking up the request chain")
    assert subject_line(merge, 200) == "fixtures: avoid mutable arg2index state in favor of looking up the request chain (#12038)"
    assert subject_line(merge, 40) == "fixtures: avoid mutable… (#12038)", "cut on a word, the number kept"
    assert subject_line("Merge pull request #5 from a/b", 80) == "Merge pull request #5 from a/b", "no title: the line itself"
    assert subject_line("Merge branch 'main'\n\nConflicts:\n\tsetup.py", 80) == "Merge branch 'main'", "only pull requests"
    assert subject_line("\n  Fix the login form\nsecond line", 80) == "Fix the login form" == head_line("Fix the login form", 80)
    assert subject_line(None, 10) == "" and subject_line(merge, 8) == "fixture…", "too narrow for the number"
