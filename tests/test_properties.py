"""Property-based tests (hypothesis): the block boundary, trailer parsing, slugging, record round trips."""

from __future__ import annotations

import string

import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cybmem.store.outcome import issue_slug, parse_trailer, split_issue
from cybmem.dispatch.preamble import FOOTER, HEADER, OpenIssue, PreambleEntry, inject, neutralize, render_block, strip, strip_memory
from cybmem.store.projects import slug_base, validate_slug
from cybmem.store.records import ISSUE_ID_RE, IssueEvent, MemoryRecord, validate_run_id

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# Pieces that make the boundary interesting: the markers themselves, disguised ones (zero-width,
# bidi, case, full-width), the TASK: wrapper, trailer headers, line breaks of every kind.
TRICKS = [
    HEADER, FOOTER, "END MEMORY", "end memory", "\u200bEND MEMORY", "END\u200d MEMORY\u202e", "\uff25\uff2e\uff24 MEMORY",
    "MEMORY (prior runs", HEADER + " ", " " + FOOTER, "TASK:", "TASK: do it", "INSTRUCTIONS:", "ACCOMPLISHED:", "ISSUES:",
    "NEXT:", "- none", "- item", "\n", "\r\n", "\r", "\u2028", "\x85", "\x00", "\t", "\ud800", "\udfff", "\u202e", "\ufeff",
]
fragment = st.one_of(st.sampled_from(TRICKS), st.text(max_size=20))
hostile_text = st.lists(fragment, max_size=12).map("".join)
lines_text = st.lists(st.one_of(st.sampled_from(TRICKS), st.text(max_size=20)), max_size=10).map("\n".join)
any_text = st.one_of(hostile_text, lines_text)


entry = st.builds(
    PreambleEntry,
    run_id=any_text, ended_at_ms=st.integers(min_value=-(10**18), max_value=10**18), state=any_text, task=any_text,
    summary=any_text, open_issues=st.lists(any_text, max_size=3), next=st.lists(any_text, max_size=3),
)
issue = st.builds(OpenIssue, issue_id=any_text, title=any_text, opened_at_ms=st.integers(min_value=-(10**18), max_value=10**18),
                  by_run_id=any_text)


@SETTINGS
@given(task=any_text, entries=st.lists(entry, max_size=4), issues=st.lists(issue, max_size=4),
       max_tokens=st.integers(min_value=0, max_value=3000))
def test_strip_inverts_inject_for_any_clean_task_and_any_hostile_block(task, entries, issues, max_tokens):
    clean = strip(task)
    assert strip(clean) == clean, "strip is idempotent"
    block = render_block(entries, issues, max_tokens=max_tokens)
    prompt = inject(clean, block)
    assert strip(prompt) == clean
    if block:
        # Record content can neither end nor forge the block: exactly one HEADER and one FOOTER
        # line, and no other line a reader could take for a marker.
        assert block.endswith("\n")
        lines = block[:-1].split("\n")
        assert lines[0] == HEADER and lines[-1] == FOOTER
        assert [line for line in lines[1:-1] if line.rstrip() in (HEADER, FOOTER)] == []
        assert all(line.startswith(("- ", "  ")) or line == "Open issues in this project:" for line in lines[1:-1])
        assert all(neutralize(line) == line for line in lines[1:-1]), "the body is already neutral"


@SETTINGS
@given(text=any_text)
def test_neutralized_text_has_no_marker_lines(text):
    from cybmem.dispatch.preamble import _looks_like_marker

    out = neutralize(text)
    assert not any(_looks_like_marker(line) for line in out.split("\n"))
    assert "\x00" not in out and "\r" not in out


@SETTINGS
@given(before=any_text, after=any_text)
def test_strip_never_touches_text_that_only_mentions_the_markers(before, after):
    """Markers inside a sentence (not a whole line) are human text and stay."""
    text = f"{before} see the {HEADER} and the {FOOTER} lines {after}"
    assume(not any(line.rstrip() == HEADER for line in text.split("\n")))
    assert strip_memory(text) == text


@SETTINGS
@given(task=any_text, human=any_text)
def test_strip_removes_exactly_the_block_even_when_the_task_quotes_markers(task, human):
    """A task that mentions the markers on lines of their own after the block keeps them."""
    clean = strip(f"{human}\nquoting:\n{FOOTER}\nand {HEADER} inline")
    block = render_block([PreambleEntry("r1", 0, "done", task, task, [], [])], [])
    assert strip(inject(clean, block)) == clean


@SETTINGS
@given(text=st.one_of(any_text, st.text()))
def test_trailer_parsing_never_raises_and_yields_usable_issue_ids(text):
    trailer = parse_trailer(text)
    for items in (trailer.accomplished, trailer.issues, trailer.next):
        assert all(isinstance(i, str) and "\n" not in i for i in items)
    for item in trailer.issues:
        title, detail = split_issue(item)
        slug = issue_slug(title)
        assert ISSUE_ID_RE.fullmatch(slug) and not slug.startswith(".")
        IssueEvent.from_dict({"issueId": slug, "at": 0, "event": "opened"})


@SETTINGS
@given(title=st.one_of(any_text, st.text()))
def test_issue_slug_is_always_a_valid_id(title):
    slug = issue_slug(title)
    assert ISSUE_ID_RE.fullmatch(slug) and slug == issue_slug(title)


@SETTINGS
@given(parts=st.lists(st.one_of(st.text(max_size=30), st.sampled_from(["..", ".", "", "...", ".git", "\\", "~", " ", "\u202e"])), max_size=6))
def test_slugging_always_yields_a_safe_name(parts):
    cwd = "/" + "/".join(p.replace("\x00", "") for p in parts)
    try:
        cwd.encode("utf-8")
    except UnicodeEncodeError:
        assume(False)
    slug = slug_base(cwd)
    assert validate_slug(slug) == slug
    assert set(slug) <= set(string.ascii_lowercase + string.digits + "._-") and not slug.startswith(".")


@SETTINGS
@given(run_id=st.text(min_size=1, max_size=140))
def test_an_accepted_run_id_always_names_a_file_inside_records(tmp_path, run_id):
    from cybmem.store.memory_store import MemoryStore

    store = MemoryStore(tmp_path, "web")
    try:
        validate_run_id(run_id)
    except ValueError:
        return
    path = store.record_path(run_id)
    assert path.parent == store.records_dir and path.name == run_id + ".json" and not path.name.startswith(".")


# --- record round trips ---------------------------------------------------------------------------

run_id = st.from_regex(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,40}", fullmatch=True)
ms = st.one_of(st.integers(min_value=0, max_value=10**14 - 1), st.integers(min_value=0, max_value=10**13).map(float))
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**53), max_value=2**53),
                        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
json_value = st.recursive(json_scalar, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                              st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                          max_leaves=8)
utf8_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)


def _extras(known: tuple[str, ...]):
    return st.dictionaries(st.text(max_size=10).filter(lambda k: k not in known), json_value, max_size=3)


record_dict = st.fixed_dictionaries(
    {
        "runId": run_id, "cwd": utf8_text.filter(lambda s: s.strip() != ""), "workflowName": utf8_text, "task": utf8_text,
        "state": st.sampled_from(["done", "error", "cancelled"]), "startedAt": ms, "endedAt": ms,
        "lineage": st.fixed_dictionaries({}, optional={
            "parentRunId": run_id, "previousRunId": run_id, "rootRunId": run_id, "chatSessionId": utf8_text,
        }).flatmap(lambda d: _extras(("parentRunId", "previousRunId", "rootRunId", "chatSessionId")).map(lambda e: {**e, **d})),
        "outcome": st.fixed_dictionaries({}, optional={
            "summary": utf8_text, "accomplished": st.lists(utf8_text, max_size=3), "issues": st.lists(utf8_text, max_size=3),
            "next": st.lists(utf8_text, max_size=3),
        }),
        "workers": st.lists(st.fixed_dictionaries({"agentId": utf8_text, "state": utf8_text},
                                                  optional={"provider": utf8_text}), max_size=2),
    },
    optional={"verdictSummary": utf8_text, "supersededBy": run_id, "supersedes": run_id},
).flatmap(lambda d: _extras(MemoryRecord._KNOWN).map(lambda e: {**e, **d}))


@SETTINGS
@given(d=record_dict)
def test_record_round_trips(d):
    rec = MemoryRecord.from_dict(d)
    assert MemoryRecord.from_dict(rec.to_dict()) == rec
    assert MemoryRecord.from_dict(orjson.loads(orjson.dumps(rec.to_dict()))) == rec, "through JSON as on disk"


@SETTINGS
@given(d=record_dict, extra=st.dictionaries(st.sampled_from(list(MemoryRecord._KNOWN)), json_value, max_size=3))
def test_extras_never_shadow_known_fields(d, extra):
    rec = MemoryRecord.from_dict(d)
    rec.extra.update(extra)
    out = rec.to_dict()
    assert out["runId"] == rec.runId and out["task"] == rec.task and out["state"] == rec.state


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(d=record_dict)
def test_record_round_trips_through_the_store(tmp_path_factory, d):
    from cybmem.store.memory_store import MemoryStore

    import time

    from cybmem.errors import ValidationError
    from cybmem.store.records import FUTURE_SLACK_MS

    d = {**d, "supersedes": None} if d.get("supersedes") == d["runId"] else d
    store = MemoryStore(tmp_path_factory.mktemp("rt"), "web")
    now = int(time.time() * 1000)
    if d["endedAt"] > now + FUTURE_SLACK_MS:  # refused: a run cannot end past the writer's clock
        with pytest.raises(ValidationError, match="more than a day after this machine's clock"):
            store.write_record(MemoryRecord.from_dict(d))
        d = {**d, "endedAt": int(d["endedAt"]) % now}
    rec = MemoryRecord.from_dict(d)
    store.write_record(rec)
    assert store.read_record(rec.runId) == rec


events = st.lists(
    st.builds(IssueEvent, issueId=st.sampled_from(["a", "b", "c"]), at=st.integers(min_value=0, max_value=10**13),
              event=st.sampled_from(["opened", "resolved", "reopened", "wontfix"]), byRunId=st.none(), title=st.none()),
    max_size=12,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(events, max_size=5))
def test_the_ledger_never_opens_an_open_issue_twice(tmp_path_factory, batches):
    from cybmem.store.memory_store import MemoryStore

    store = MemoryStore(tmp_path_factory.mktemp("ledger"), "web")
    for batch in batches:
        store.append_issue_events(batch)
    state: dict[str, str] = {}
    for ev in MemoryStore(store.root, "web").issue_events():
        assert not (ev.event == "opened" and state.get(ev.issueId) in ("opened", "reopened"))
        state[ev.issueId] = ev.event
    assert {k: v.state for k, v in store.issue_states().items()} == state


@pytest.mark.parametrize("title", ["", "\ud800", "日本語", "🔥", "." * 200, "../../etc", "a" * 500])
def test_issue_slug_edge_cases(title):
    assert ISSUE_ID_RE.fullmatch(issue_slug(title))
