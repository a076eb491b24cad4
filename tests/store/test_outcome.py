import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cybmem.store.outcome import Trailer, extractive_summary, issue_slug, parse_trailer, split_issue

SLUG_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,127}")
EMPTY = Trailer([], [], [], False)

BASIC = """I fixed the thing.

ACCOMPLISHED:
- shipped X
ISSUES:
- Flaky login test: fails one run in ten
NEXT:
- none
"""


# --- parse_trailer ---------------------------------------------------------------------------


def test_parse_basic():
    assert parse_trailer(BASIC) == Trailer(
        accomplished=["shipped X"],
        issues=["Flaky login test: fails one run in ten"],
        next=[],
        found=True,
    )


@pytest.mark.parametrize("text", ["", None])
def test_parse_empty(text):
    assert parse_trailer(text) == EMPTY


def test_parse_no_trailer():
    assert parse_trailer("Just prose.\nNo trailer here.") == EMPTY


@pytest.mark.parametrize(
    "header",
    [
        "ISSUES:",
        "issues:",
        "Issues:",
        "   ISSUES:",
        "\tISSUES:  ",
        "**ISSUES:**",
        "**ISSUES**:",
        "## Issues:",
        "### **Issues:**",
        "__ISSUES:__",
        "ISSUES :",
    ],
)
def test_header_decorations(header):
    assert parse_trailer(f"{header}\n- a problem\n").issues == ["a problem"]


@pytest.mark.parametrize(
    "header",
    ["ISSUES", "## Issues", "**ISSUES**", "Issues: none of this matters", "The ISSUES: list", "ISSUESS:"],
)
def test_header_requires_colon_on_own_line(header):
    trailer = parse_trailer(f"{header}\n- a problem\n")
    assert trailer.issues == []


def test_sections_any_order_and_missing():
    t = parse_trailer("NEXT:\n- do b\nACCOMPLISHED:\n- did a\n")
    assert t.accomplished == ["did a"]
    assert t.next == ["do b"]
    assert t.issues == []
    assert t.found


def test_header_only_counts_as_found():
    assert parse_trailer("ISSUES:\n") == Trailer([], [], [], True)


def test_last_occurrence_wins():
    text = (
        "End your answer with:\nACCOMPLISHED:\n- <what you did>\nISSUES:\n- <title: detail>\n"
        "NEXT:\n- <next step>\n\nDone, here it is.\n\n"
        "ACCOMPLISHED:\n- real work\nISSUES:\n- real issue: details\nNEXT:\n- real next\n"
    )
    assert parse_trailer(text) == Trailer(["real work"], ["real issue: details"], ["real next"], True)


@pytest.mark.parametrize(
    "bullet",
    ["- item", "* item", "• item", "1. item", "1) item", "12. item", "  - item", "-   item", "- [ ] item", "- [x] item"],
)
def test_bullet_styles(bullet):
    assert parse_trailer(f"ACCOMPLISHED:\n{bullet}\n").accomplished == ["item"]


@pytest.mark.parametrize(
    "none", ["- none", "- None", "- NONE.", "none", "None.", "n/a", "- N/A", "- n/a.", "-", "- (none)", "- *none*"]
)
def test_none_means_empty(none):
    assert parse_trailer(f"NEXT:\n{none}\nISSUES:\n- real\n") == Trailer([], ["real"], [], True)


def test_none_mixed_with_items_is_dropped():
    assert parse_trailer("NEXT:\n- none\n- do x\n").next == ["do x"]


def test_continuation_lines_join():
    text = "ISSUES:\n- Flaky login test: fails\n  one run\n\tin ten\n- second\n"
    assert parse_trailer(text).issues == ["Flaky login test: fails one run in ten", "second"]


def test_blank_lines_between_bullets():
    assert parse_trailer("NEXT:\n\n- a\n\n\n- b\n\n").next == ["a", "b"]


def test_prose_after_trailer_ends_section():
    text = "NEXT:\n- a\n- b\nLet me know if you need anything else.\n- not an item\n"
    assert parse_trailer(text).next == ["a", "b"]


def test_other_header_ends_section():
    assert parse_trailer("NEXT:\n- a\nNOTES:\n- not next\n").next == ["a"]


def test_code_fence_ends_section():
    assert parse_trailer("```\nNEXT:\n- a\n```\n").next == ["a"]


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_line_endings(newline):
    text = newline.join(["ACCOMPLISHED:", "- a", "  more", "ISSUES:", "- b", "NEXT:", "- none", ""])
    assert parse_trailer(text) == Trailer(["a more"], ["b"], [], True)


def test_items_trimmed_collapsed_and_deduplicated():
    text = "ACCOMPLISHED:\n-   a   b  \n- c\n- a b\n- c\n"
    assert parse_trailer(text).accomplished == ["a b", "c"]


def test_indented_line_without_bullet_is_an_item():
    assert parse_trailer("ISSUES:\n    unbulleted problem\n").issues == ["unbulleted problem"]


def test_long_whitespace_line_is_fast():
    text = "ISSUES:\n" + " " * 200_000 + "x\n- a\n"
    assert parse_trailer(text).issues == ["x", "a"]


@pytest.mark.parametrize("wrap", ["  races the assertion on slow machines\n", "\tx\r\n", " y\r"])
def test_a_bullet_wrapped_over_many_lines_is_joined_in_linear_time(wrap):
    # Each continuation line was appended to the item's string in the list: 3 MB of them took 30 s;
    # these (400,000 lines) would take minutes.
    text = "Done.\n\nISSUES:\n- the drawer\n" + wrap * 400_000 + "- second\nNEXT:\n- a\n" + "  b\n" * 400_000
    start = time.perf_counter()
    trailer = parse_trailer(text)
    assert time.perf_counter() - start < 30
    assert trailer.issues == ["the drawer " + " ".join([wrap.strip()] * 400_000), "second"]
    assert trailer.next == ["a " + " ".join(["b"] * 400_000)]


# Every code point, lone surrogates and controls included.
RAW = st.text(
    alphabet=st.one_of(
        st.characters(exclude_categories=()), st.characters(categories=["Cs", "Cc"]), st.sampled_from("\r\n -*:")
    )
)


@settings(deadline=None, max_examples=200)
@given(RAW)
def test_parse_never_raises(text):
    trailer = parse_trailer(text)
    for item in trailer.accomplished + trailer.issues + trailer.next:
        assert item and item == item.strip()


LINES = st.sampled_from(
    ["ACCOMPLISHED:", "ISSUES:", "NEXT:", "**Issues:**", "- a", "- none", "  cont", "", "prose", "1) b", "-"]
)


@settings(deadline=None, max_examples=200)
@given(st.lists(st.one_of(LINES, st.text(max_size=20)), max_size=30), st.sampled_from(["\n", "\r\n", "\r"]))
def test_parse_trailer_like_text(lines, newline):
    trailer = parse_trailer(newline.join(lines))
    for items in (trailer.accomplished, trailer.issues, trailer.next):
        assert len(items) == len(set(items))


# --- split_issue -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "item, expected",
    [
        ("Flaky login test: fails one run in ten", ("Flaky login test", "fails one run in ten")),
        ("Flaky login test — fails", ("Flaky login test", "fails")),
        ("Flaky login test – fails", ("Flaky login test", "fails")),
        ("Flaky login test - fails", ("Flaky login test", "fails")),
        ("Build on node-18 - error: x", ("Build on node-18", "error: x")),
        ("Error: build - fails", ("Error", "build - fails")),
        ("**Flaky test**: fails", ("Flaky test", "fails")),
        ("**Flaky test:** fails", ("Flaky test", "fails")),
        ("See http://host:8080/x", ("See http://host:8080/x", "")),
        ("no separator here", ("no separator here", "")),
        ("  padded  ", ("padded", "")),
        (": only detail", (": only detail", "")),
        ("", ("", "")),
    ],
)
def test_split_issue(item, expected):
    assert split_issue(item) == expected


# --- issue_slug ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "title, slug",
    [
        ("Flaky login test", "flaky-login-test"),
        ("  Flaky   LOGIN -- test!!  ", "flaky-login-test"),
        ("Café résumé naïve", "cafe-resume-naive"),
        ("C++ / Rust FFI", "c-rust-ffi"),
        ("ﬁle ligature", "file-ligature"),
        ("v1.2.3 breaks", "v1-2-3-breaks"),
    ],
)
def test_issue_slug(title, slug):
    assert issue_slug(title) == slug


def test_slug_cut_at_dash_boundary():
    title = " ".join(["word"] * 30)
    assert issue_slug(" ".join(["words"] * 30)) == "-".join(["words"] * 10)
    slug = issue_slug(title)
    assert len(slug) <= 64
    assert slug == "-".join(["word"] * 13)  # 64 chars exactly


def test_slug_long_single_word_is_hard_cut():
    assert issue_slug("a" * 100) == "a" * 64


@pytest.mark.parametrize("title", ["日本語のテスト", "🔥🔥", "", "---", "\ud800"])
def test_slug_fallback_hash(title):
    slug = issue_slug(title)
    assert re.fullmatch(r"issue-[0-9a-f]{10}", slug)
    assert issue_slug(title) == slug


def test_slug_fallback_differs_per_title():
    assert issue_slug("日本") != issue_slug("中国")


@settings(deadline=None, max_examples=200)
@given(RAW)
def test_slug_always_valid_and_stable(title):
    slug = issue_slug(title)
    assert SLUG_RE.fullmatch(slug)
    assert issue_slug(title) == slug


# --- extractive_summary ----------------------------------------------------------------------

WINNER = """```python
print("code")
```
# Summary
I fixed the race in the login handler. Tests pass now.

ACCOMPLISHED:
- fixed race
"""


def test_summary_full():
    s = extractive_summary("Fix the flaky login test. It fails often.\nMore detail.", "done", "approved", WINNER)
    assert s == (
        "Fix the flaky login test. Ended done. Verdict: approved. "
        "I fixed the race in the login handler. Tests pass now."
    )


def test_summary_minimal():
    assert extractive_summary("", "error", None, None) == "Ended error."
    assert extractive_summary(None, None, None, None) == "Ended unknown."


def test_summary_never_empty_even_with_tiny_budget():
    assert extractive_summary("task", "cancelled", "v", "out", max_chars=3) == "Ended cancelled."


def test_summary_task_cut_at_160():
    task = " ".join(["word"] * 100)
    s = extractive_summary(task, "done", None, None)
    first = s.split(" Ended done.")[0]
    assert first.endswith("…")
    assert len(first) <= 160


def test_summary_verdict_punctuation_not_doubled():
    assert extractive_summary("T", "done", "Looks good.", None) == "T. Ended done. Verdict: Looks good."


def test_summary_skips_trailer_and_stops_before_it():
    out = "ACCOMPLISHED:\n- x\n"
    assert extractive_summary("Task", "done", None, out) == "Task. Ended done."


def test_summary_output_cut_to_budget():
    out = "word " * 500
    s = extractive_summary("Task.", "done", None, out, max_chars=200)
    assert len(s) <= 200
    assert s.endswith("…")


@pytest.mark.parametrize("line", ["-", "*", "1.", "- ", "•\t"])
def test_a_summary_of_an_answer_of_empty_bullets_is_linear(line):
    # The head of the answer was summed again at each line: 20,000 empty bullets (40 kB) took 27 s.
    out = f"{line}\n" * 300_000 + "The drawer is fixed.\n"
    start = time.perf_counter()
    summary = extractive_summary("Fix the drawer.", "done", None, out)
    assert time.perf_counter() - start < 30
    assert summary == "Fix the drawer. Ended done. The drawer is fixed."


@settings(deadline=None, max_examples=200)
@given(RAW, st.text(max_size=20), st.none() | RAW, st.none() | RAW, st.integers(0, 800))
def test_summary_properties(task, state, verdict, output, max_chars):
    s = extractive_summary(task, state, verdict, output, max_chars=max_chars)
    ended = f"Ended {' '.join(state.split()) or 'unknown'}."
    assert ended in s
    assert s == " ".join(s.split())
    assert len(s) <= max(max_chars, len(ended))
    assert s == extractive_summary(task, state, verdict, output, max_chars=max_chars)
