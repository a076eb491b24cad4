"""A memory root where time relates runs, as in sphinx's history: what follows up a run lands
hours after it, in other words, while older runs share its words.

    python data-fixtures/time_related.py /tmp/tide [--pairs 70]

Writes project ``tide`` (cwd /home/dev/tide): per pair, a run that opens an issue, a run three
hours later that raises it again in other words, and three days earlier a decoy that shares the
follow-up's words. The judgments the store derives about itself (a run that raises an issue should
see the runs that carried it) reward recency; the default weights reward the words. Self-tuning
(``cybmem tune --save``) has something real to learn here; the tests and USAGE.md use it.
Deterministic: the same root every time.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

#: The first pair's moment: the 70 weekly pairs end in May 2026, before any day this runs on, so that
#: no run of the store lies in the future of the clock (a block or a tuning asked "now" would read
#: such runs as brand new, and what it printed would move with the date it ran on).
T0 = 1_735_689_600_000  # 2025-01-01T00:00:00Z
HOUR = 3_600_000
DAY = 24 * HOUR


def write(root: Path | str, pairs: int = 70, *, t0: int = T0) -> Path:
    """Write the memory root at ``root`` (a new or empty folder); returns it. ``t0``: when the first
    pair's issue is opened (epoch ms; pair i is ``i`` weeks later)."""
    root = Path(root)
    rng = random.Random(3)
    word = lambda: "".join(rng.choice("bcdfghjklmnpqrstvwxz") + rng.choice("aeiou") for _ in range(3))  # noqa: E731
    proj = root / "tide"
    (proj / "records").mkdir(parents=True)
    (root / "projects.json").write_text(json.dumps({"tide": {"cwd": "/home/dev/tide"}}))
    events: list[dict] = []
    previous = None

    def record(rid: str, task: str, start: int, issues=()) -> None:
        nonlocal previous
        rec = {"runId": rid, "cwd": "/home/dev/tide", "workflowName": "implement-task", "task": task, "state": "done",
               "startedAt": start, "endedAt": start + HOUR, "lineage": {"previousRunId": previous} if previous else {},
               "outcome": {"summary": task, "accomplished": [task], "issues": list(issues), "next": []},
               "workers": [{"agentId": "impl-1", "state": "done"}]}
        (proj / "records" / f"{rid}.json").write_text(json.dumps(rec))
        previous = rid

    for i in range(pairs):
        t = t0 + i * 7 * DAY
        topic, a_word = word(), word()
        record(f"decoy-{i:03d}", f"Clean up the {topic} output", t - 3 * DAY)
        record(f"opens-{i:03d}", f"Rework the {a_word} loader", t, [f"issue-{i}"])
        events.append({"issueId": f"issue-{i}", "at": t + HOUR, "event": "opened", "byRunId": f"opens-{i:03d}",
                       "title": f"Issue {i}"})
        record(f"follows-{i:03d}", f"Handle the {topic} output", t + 3 * HOUR, [f"issue-{i}"])
    (proj / "issues.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return root


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, help="a new or empty folder")
    ap.add_argument("--pairs", type=int, default=70)
    args = ap.parse_args()
    print(f"Wrote {3 * args.pairs} runs of project tide to {write(args.root, args.pairs)}.")
