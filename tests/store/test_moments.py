"""A moment given as an argument (--as-of, --since, --until; the MCP tools' as_of) is checked by one
validator, cybmem.store.records.parse_time / check_moment: a number or date beyond what an ISO
date can write is a usage error naming the argument and the accepted range, never a traceback
(issue 29, item 8: a huge --as-of gave an OverflowError in `search`)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from cybmem.cli.app import app
from cybmem.errors import ValidationError
from cybmem.store.records import MAX_MOMENT, parse_time

RANGE = "is out of range: give a moment from 1970-01-01 to 9999-12-31 (epoch milliseconds 0 to 253402300799999)"
NOT_A_MOMENT = "is neither epoch milliseconds nor an ISO date"
OUT = ["99999999999999999999", "-1", str(MAX_MOMENT), "9999-12-31T23:59:59-01:00", "1969-12-31T23:59:59Z"]
COMMANDS = [
    ("search", "cart drawer", "--project", "web"),
    ("issues", "--project", "web"),
    ("issues", "--project", "web", "--events"),
    ("tune", "--project", "web"),
]
INJECT = [("inject", "Fix the cart drawer", "--project", "web"), ("inject", "--system", "Fix the cart drawer", "--project", "web")]


def run(root, *args):
    return CliRunner().invoke(app, [*args, "--memory-dir", str(root)])


@pytest.mark.parametrize("value", OUT)
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_an_as_of_out_of_range_is_a_usage_error(fixture_copy, command, value):
    result = run(fixture_copy, *command, f"--as-of={value}")
    assert result.exit_code == 2 and result.exception.__class__ is SystemExit, result.output
    assert f"Invalid value for --as-of: {value!r} {RANGE}" in result.stderr
    assert "Traceback" not in result.output + result.stderr


@pytest.mark.parametrize("value", [*OUT, "abc", "2026-13-45", "1e400", "nan"])
@pytest.mark.parametrize("command", INJECT, ids=lambda c: " ".join(c[:2]))
def test_inject_with_a_moment_that_is_none_gives_the_task_back_bare(fixture_copy, command, value):
    """The dispatch path never fails the dispatcher: a bad --as-of is one warning line and the task
    alone (no block: a replay must not get today's memory), exit 0; --strict keeps the usage error."""
    result = run(fixture_copy, *command, f"--as-of={value}")
    assert result.exit_code == 0, result.output
    assert result.stdout == ("" if "--system" in command else "Fix the cart drawer")
    warning = result.stderr.strip()
    assert warning.startswith(f"warning: memory not injected: Invalid value for --as-of: {value!r}") and "\n" not in warning
    as_json = run(fixture_copy, *command, f"--as-of={value}", "--json")
    assert as_json.exit_code == 0 and '"block": ""' in as_json.stdout and "memory not injected" in as_json.stdout
    strict = run(fixture_copy, *command, f"--as-of={value}", "--strict")
    assert strict.exit_code == 2 and f"Invalid value for --as-of: {value!r}" in strict.stderr


@pytest.mark.parametrize("value", ["9" * 5000, "1e400", "10000-01-01", "soon"])
def test_an_as_of_that_is_no_moment_is_a_usage_error(fixture_copy, value):
    result = run(fixture_copy, "search", "cart", "--project", "web", f"--as-of={value}")
    assert result.exit_code == 2 and f"Invalid value for --as-of: {value!r} {NOT_A_MOMENT}" in result.stderr


@pytest.mark.parametrize("option", ["--since", "--until"])
def test_since_and_until_are_held_to_the_same_range(fixture_copy, option):
    result = run(fixture_copy, "issues", "--project", "web", "--events", f"{option}=99999999999999999999")
    assert result.exit_code == 2 and f"Invalid value for {option}: '99999999999999999999' {RANGE}" in result.stderr
    year = run(fixture_copy, "issues", "--project", "web", "--events", f"{option}=1969")
    assert year.exit_code == 2 and f"Invalid value for {option}: '1969' {RANGE}" in year.stderr


def test_the_ends_of_the_range_are_moments(fixture_copy):
    assert parse_time(0, "--as-of") == 0 and parse_time("1970-01-01", "--as-of") == 0
    assert parse_time("9999-12-31T23:59:59.999Z", "as_of") == parse_time(str(MAX_MOMENT - 1)) == MAX_MOMENT - 1
    for value in ("9999-12-31", "9999", str(MAX_MOMENT - 1)):
        result = run(fixture_copy, "search", "cart", "--project", "web", "-k", "1", f"--as-of={value}")
        assert result.exit_code == 0 and result.stdout.startswith("#  SCORE"), result.output
    with pytest.raises(ValidationError, match=r"^as_of 100000000000000000000 is out of range: give a moment"):
        parse_time(10**20, "as_of")


@pytest.mark.parametrize("value, shown", [(True, "true"), (False, "false"), (1.5, "1.5"), (float("inf"), "Infinity"),
                                          ([1], "[1]"), ({"a": 1}, '{"a": 1}')])
def test_what_json_can_send_beyond_a_number_or_a_text_is_no_moment(value, shown):
    """An MCP client's as_of comes as JSON: true was taken for 1 ms (pydantic's lax int), 1.5 got
    pydantic's own text; both get the CLI's message now, the value written as JSON writes it."""
    with pytest.raises(ValidationError, match=rf"^as_of {re.escape(shown)} {NOT_A_MOMENT} \(e\.g\. 2026-11-01"):
        parse_time(value, "as_of")


def test_a_whole_float_is_epoch_milliseconds():
    """JSON Schema's integer: 1.79e12 as a client's JSON may write it."""
    assert parse_time(1.79e12, "as_of") == 1_790_000_000_000 and parse_time(0.0, "as_of") == 0
    with pytest.raises(ValidationError, match=rf"^as_of 1e\+30 {RANGE[:20]}"):
        parse_time(1e30, "as_of")


def test_a_bare_year_month_or_date_is_read_alike_by_the_cli_and_the_mcp_tools():
    """One reading of a moment: the MCP tools' as_of "2024" was 2024 epoch milliseconds (two seconds
    after 1970) where the CLI's --as-of 2024 is the year's start; a number stays epoch milliseconds."""
    from cybmem.cli.framework import moment
    from cybmem.store.records import parse_moment

    year, may, day = 1704067200000, 1714521600000, 1717113600000
    for text, start in (("2024", year), ("2024-05", may), (" 2024-05-31 ", day)):
        assert parse_moment(text, "as_of") == moment(text, "--as-of") == start
    assert moment("2024-05", "--until", end_of_day=True) == parse_moment("2024-05", "--until", end_of_day=True) == day + 86_400_000 - 1
    assert parse_moment(2024, "as_of") == 2024 and parse_moment("1717113600000", "as_of") == 1717113600000
    with pytest.raises(ValidationError, match=r"^as_of '2024-13': month must be in 1\.\.12$"):
        parse_moment("2024-13", "as_of")
    with pytest.raises(ValidationError, match=r"^as_of '1969' is out of range"):
        parse_moment("1969", "as_of")


def test_fleet_now_is_held_to_the_same_reading(tmp_path):
    result = CliRunner().invoke(app, ["fleet", "issues", "--dataset", str(tmp_path), "--now", "soon"])
    assert result.exit_code == 2 and f"Invalid value for --now: 'soon' {NOT_A_MOMENT}" in result.stderr


def test_digits_of_other_scripts_are_no_epoch_milliseconds():
    """int() reads full-width or Arabic-Indic digits as digits: "１２３" was epoch 123 ms."""
    for text in ("１２３", "١٢٣", "１７００００００００００００"):
        with pytest.raises(ValidationError, match=f"^as_of {text!r} is neither epoch milliseconds nor an ISO date"):
            parse_time(text, "as_of")
    assert parse_time(" +1700000000000 ", "as_of") == 1700000000000
