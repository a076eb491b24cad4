"""Ledger events out of time order (two writers whose clocks disagree): doctor names the issue and
the lines, and issue ages never go negative (a resolution stamped before its opening counts as
resolved at once)."""

from __future__ import annotations

import json

import pandas as pd

from cybmem.operations.doctor import doctor
from cybmem.explore.frames import issue_fold
from cybmem.operations.write import write_run
from cybmem.store.memory_store import MemoryStore

from conftest import MIN, T0, make_run

HOUR = 60 * MIN


def _ledger(memory_root, settings, events):
    write_run(make_run("r1"), settings)
    path = memory_root / "web" / "issues.jsonl"
    path.write_text("".join(json.dumps({"byRunId": "r1", "title": e["issueId"], **e}) + "\n" for e in events))
    return MemoryStore(memory_root, "web")


def test_doctor_names_the_issue_and_the_lines_stamped_out_of_order(memory_root, settings):
    _ledger(memory_root, settings, [
        {"issueId": "flaky-login", "at": T0 + 24 * HOUR, "event": "opened"},
        {"issueId": "slow-build", "at": T0, "event": "opened"},  # another issue: its own order
        {"issueId": "flaky-login", "at": T0 + 7 * HOUR, "event": "resolved"},  # 17 h before it was opened
        {"issueId": "flaky-login", "at": T0 + 30 * HOUR, "event": "reopened"},
        {"issueId": "slow-build", "at": T0 + 1 * HOUR, "event": "resolved"},
    ])
    report = doctor(settings, project="web")
    found = [f for f in report.findings if f.check == "ledger"]
    assert len(found) == 1 and found[0].severity == "warning" and report.clean
    assert found[0].path.endswith("issues.jsonl:3")
    assert found[0].message.startswith(
        "issue flaky-login: line 3 (resolved at 2025-11-01 07:00 UTC) is stamped before line 1 "
        "(opened at 2025-11-02 00:00 UTC), which comes first")


def test_issue_ages_are_never_negative(memory_root, settings):
    store = _ledger(memory_root, settings, [
        {"issueId": "flaky-login", "at": T0 + 24 * HOUR, "event": "opened"},
        {"issueId": "flaky-login", "at": T0 + 7 * HOUR, "event": "resolved"},
        {"issueId": "future", "at": T0 + 48 * HOUR, "event": "opened"},  # a clock ahead of the reader's
        {"issueId": "fine", "at": T0, "event": "opened"},
        {"issueId": "fine", "at": T0 + 2 * HOUR, "event": "resolved"},
    ])
    fold = issue_fold(store, now=pd.Timestamp(T0 + 30 * HOUR, unit="ms", tz="UTC")).set_index("issueId")
    assert fold.loc["flaky-login", "timeToResolve"] == pd.Timedelta(0)
    assert fold.loc["future", "openAge"] == pd.Timedelta(0)
    assert fold.loc["fine", "timeToResolve"] == pd.Timedelta(hours=2)
    durations = pd.concat([fold["openAge"], fold["timeToResolve"]]).dropna()
    assert len(durations) == 3 and (durations >= pd.Timedelta(0)).all()
