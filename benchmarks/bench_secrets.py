"""Secret detection on shapes cybmem was not written from: recall on other projects' examples,
false alarms on real commit messages, cost per record, and secret-scanning libraries alongside.

    python benchmarks/bench_secrets.py                       # everything; libraries if importable
    python benchmarks/bench_secrets.py --compare detect-secrets=/tmp/ds --compare kingfisher=/tmp/kf
    python benchmarks/bench_secrets.py --json out.json
    python benchmarks/bench_secrets.py --quick --against REF   # recall, false alarms, speed only
    python benchmarks/bench_secrets.py --quick --families-at REF   # and the families' recall at REF beside

1. Recall on data-fixtures/secret-examples.jsonl: the true-positive examples of gitleaks' rules
   (MIT) and detect-secrets' plugin tests (Apache-2.0), as those projects wrote or generate
   them (python data-fixtures/secret_examples.py, provenance per line). An example counts when
   cybmem.store.secrets finds a secret in it and, where the example knows its secret, that secret is
   gone from the redacted text. By source, by form (written out / drawn from the rule's regex),
   and with cybmem.store.secret_shapes' vendor table switched off (what the generic layers alone catch).
   The rules' false-positive examples are counted as look-alike alarms.
   Then recall on the secret families issue 29 named (tests/data/secret-families.jsonl, built by
   benchmarks/secret_families.py from Kingfisher's, gitleaks' and detect-secrets' examples), for
   its dev part (looked at while writing rules) and its held-out part (only scored); with
   --families-at REF, the pass at REF on the same examples beside.
2. False alarms: every commit message (the record ``task``) of the four real histories in
   ../shared/corpora (pytest, mypy, sphinx, celery; and the pytest-memory-1k slice, not counted
   in the total); every finding is a false alarm. Targets: recall >= 0.9, false alarms <= 1 per
   1,000 messages. Then redact()'s time per message now and at --against REF (default: the
   commit before the families), alternated in one run.
3. Cost: the median time of redact() per commit message and per synthetic record of 1, 10 and
   100 KB (worker output of benchmarks/bench_redact.py), and the time to import cybmem.store.secrets
   in a fresh interpreter (the write path pays it; inject never imports it).
4. Libraries (each in its own interpreter, from its own install): detect-secrets, its fork
   bc-detect-secrets, and Kingfisher (kingfisher-secret-scanner) on the same examples and
   messages, with their import / rule-compile time; and what each would add to cybmem's pass.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from _corpus import commit_messages, corpora_dir  # noqa: E402

EXAMPLES = REPO / "data-fixtures" / "secret-examples.jsonl"
FAMILIES = REPO / "tests" / "data" / "secret-families.jsonl"
HISTORIES = ("pytest-memory", "mypy-memory", "sphinx-memory", "celery-memory")
SLICE = "pytest-memory-1k"
BEFORE_FAMILIES = "8000388"  # the last commit before the issue 29 families (speed is compared with it)


def load_examples() -> list[dict]:
    return [json.loads(line) for line in EXAMPLES.read_text(encoding="utf-8").splitlines()]


def caught(row: dict, redact=None) -> bool:
    if redact is None:
        from cybmem.store.secrets import redact

    out, kinds = redact(row["text"])
    return bool(kinds) and not (row["value"] and row["value"] in out)


def _rate(hits: list[bool]) -> str:
    return f"{sum(hits) / len(hits):.3f} ({sum(hits)}/{len(hits)})" if hits else "-"


def print_recall(rows: list[dict]) -> dict:
    from cybmem.store import secret_shapes as shapes

    print(f"\n== Recall on other projects' examples: {EXAMPLES.relative_to(REPO)} ==")
    secret = [r for r in rows if r["secret"]]
    hit = [caught(r) for r in secret]
    lookalike = [r for r in rows if not r["secret"]]
    from cybmem.store.secrets import scan

    alarms = [r for r in lookalike if scan(r["text"])]
    groups: dict[str, list[bool]] = defaultdict(list)
    per_rule: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for r, h in zip(secret, hit):
        groups[f"source {r['source']}"].append(h)
        groups[f"form {r['form']}"].append(h)
        per_rule[(r["source"], r["rule"])].append(h)
    vendor, shapes._V = shapes._V, []  # the generic layers alone (assignments, URLs, entropy, …)
    try:
        generic = [caught(r) for r in secret]
    finally:
        shapes._V = vendor
    print(f"{len(secret)} secret examples from {len(per_rule)} rules, {len(lookalike)} look-alikes "
          f"(the rules' own false-positive examples)\n")
    print(f"{'recall, all examples':<42} {_rate(hit)}")
    for name in sorted(groups):
        print(f"{'  ' + name:<42} {_rate(groups[name])}")
    full = sum(all(v) for v in per_rule.values())
    half = sum(sum(v) / len(v) >= 0.5 for v in per_rule.values())
    print(f"{'rules with every example caught':<42} {full}/{len(per_rule)} (half or more: {half})")
    print(f"{'recall without the vendor table':<42} {_rate(generic)}")
    print(f"{'look-alike alarms':<42} {len(alarms)}/{len(lookalike)}")
    missed = Counter(k for k, v in per_rule.items() for h in v if not h)
    print("most missed rules: " + ", ".join(f"{s}:{r} {n}" for (s, r), n in missed.most_common(6)))
    return {"examples": len(secret), "recall": sum(hit) / len(hit), "by": {k: sum(v) / len(v) for k, v in groups.items()},
            "recall_without_vendor_table": sum(generic) / len(generic), "rules": len(per_rule),
            "rules_fully_caught": full, "lookalikes": len(lookalike), "lookalike_alarms": len(alarms)}


def print_families(refs: list[str] = ()) -> dict:
    """Recall on the families issue 29 named (tests/data/secret-families.jsonl), by split; and
    the pass at each of refs on the same examples (what a change of the rules gained)."""
    import tempfile

    rows = [json.loads(line) for line in FAMILIES.read_text(encoding="utf-8").splitlines()]
    print(f"\n== Recall on the secret families: {FAMILIES.relative_to(REPO)} (public rule examples) ==")
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        before = {ref: _baseline(ref, Path(tmp), f"secrets_at_{i}").redact for i, ref in enumerate(refs)}
        for split in ("dev", "held-out", "all"):
            part = [r for r in rows if r["split"] == split or split == "all"]
            hits = [caught(r) for r in part]
            label = {"dev": "dev (looked at)", "held-out": "held-out (only scored)"}.get(split, split)
            print(f"{label:<42} {_rate(hits)}"
                  + "".join(f"   at {ref}: {_rate([caught(r, f) for r in part])}" for ref, f in before.items()))
            if split != "all":
                by: dict[str, list[bool]] = defaultdict(list)
                for r, h in zip(part, hits):
                    by[r["family"]].append(h)
                print("    " + ", ".join(f"{k} {sum(v)}/{len(v)}" for k, v in sorted(by.items())))
            out[split] = {"cases": len(part), "recall": sum(hits) / len(hits)}
            out[split].update({f"recall_at_{ref}": sum(caught(r, f) for r in part) / len(part) for ref, f in before.items()})
    return out


def print_false_alarms(messages: dict[str, list[str]]) -> dict:
    from cybmem.store.secrets import scan

    print("\n== False alarms on real commit messages (../shared/corpora, the record task) ==")
    out: dict = {}
    if not any(messages.values()):
        print(f"corpus archives not found under {corpora_dir()} (set CYBMEM_CORPORA); skipped")
        return out
    total = found = 0
    for name, texts in messages.items():
        if not texts:
            print(f"{name:<20} archive missing")
            continue
        hits = [(f, t) for t in texts for f in scan(t)[:1]]
        rate = len(hits) / len(texts) * 1e3
        print(f"{name:<20} {len(texts):>6} messages  {len(hits):>3} with a finding  ({rate:.2f} per 1,000)")
        for f, t in hits[:5]:
            print(f"    {f.kind}: {t[max(0, f.start - 40):f.end + 10]!r}")
        out[name] = {"messages": len(texts), "false_alarms": len(hits)}
        if name != SLICE:  # the slice's messages are pytest's again
            total += len(texts)
            found += len(hits)
    print(f"{'four histories':<20} {total:>6} messages  {found:>3} with a finding  ({found / total * 1e3:.2f} per 1,000)")
    out["histories"] = {"messages": total, "false_alarms": found, "per_1k": found / total * 1e3}
    return out


def _median_ms(work, items, repeat: int = 3) -> float:
    best = []
    for _ in range(repeat):
        start = time.perf_counter()
        for item in items:
            work(item)
        best.append((time.perf_counter() - start) * 1000 / len(items))
    return statistics.median(best)


def _import_ms(statement: str, path: str | None = None, runs: int = 5) -> float:
    """Median wall time of a fresh interpreter running statement, less a bare interpreter's."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (path, str(REPO)) if p)}

    def once(code: str) -> float:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
        return time.perf_counter() - start

    bare = statistics.median(once("pass") for _ in range(runs))
    return (statistics.median(once(statement) for _ in range(runs)) - bare) * 1000


def _baseline(ref: str, tmp: Path, name: str = "secrets_at_ref"):
    """cybmem.store.secrets as it was at git ref, importable beside today's (its modules, secrets.py
    and the secret_*.py beside it, import nothing else of cybmem's at import time) as the package name."""
    import importlib

    pkg = tmp / name
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    listed = subprocess.run(["git", "-C", str(REPO), "ls-tree", "--name-only", f"{ref}:cybmem/store/"], check=True,
                            capture_output=True, text=True).stdout.split()
    for module in [m for m in listed if m.startswith("secret") and m.endswith(".py")]:
        source = subprocess.run(["git", "-C", str(REPO), "show", f"{ref}:cybmem/store/{module}"], check=True,
                                capture_output=True, text=True).stdout
        (pkg / module).write_text(source)
    sys.path.insert(0, str(tmp))
    return importlib.import_module(f"{name}.secrets")


def print_speed_against(ref: str, messages: list[str]) -> dict:
    """redact() per commit message, today's pass and the one at ref, alternated in one run."""
    import tempfile

    from cybmem.store.secrets import redact

    print(f"\n== Speed against {ref} (one run, alternated passes) ==")
    sample = messages[::4] or messages
    with tempfile.TemporaryDirectory() as tmp:
        before = _baseline(ref, Path(tmp)).redact
        old, new = [], []
        for _ in range(3):
            old.append(_median_ms(before, sample, repeat=1))
            new.append(_median_ms(redact, sample, repeat=1))
    old_ms, new_ms = statistics.median(old), statistics.median(new)
    print(f"{'redact(), a commit message, at ' + ref:<40} {old_ms:.3f} ms (median of 3 passes over {len(sample)})")
    print(f"{'redact(), a commit message, now':<40} {new_ms:.3f} ms ({new_ms / old_ms:.2f}x)")
    return {"ref": ref, "before_ms": old_ms, "after_ms": new_ms, "ratio": new_ms / old_ms}


def print_cost(messages: list[str]) -> dict:
    from cybmem.store.secrets import redact

    import bench_redact

    print("\n== Cost per record ==")
    docs, _ = bench_redact.worker_output(bench_redact.load_corpus(), 2.0)
    joined = "\n".join(docs)
    out = {}
    if messages:
        sample = messages[:3000]
        out["commit_message_ms"] = _median_ms(redact, sample)
        print(f"{'redact(), a commit message':<40} {out['commit_message_ms']:.3f} ms "
              f"(median of 3 passes over {len(sample)}, mean {sum(map(len, sample)) / len(sample):.0f} characters)")
    for kb in (1, 10, 100):
        size = kb * 1000
        records = [joined[i:i + size] for i in range(0, min(len(joined), size * 40), size)][:40]
        out[f"record_{kb}kb_ms"] = _median_ms(redact, records)
        print(f"{f'redact(), a {kb} KB record of worker output':<40} {out[f'record_{kb}kb_ms']:.2f} ms")
    out["import_ms"] = _import_ms("import cybmem.store.secrets")
    print(f"{'import cybmem.store.secrets (fresh interpreter)':<40} {out['import_ms']:.0f} ms "
          "(the write path; inject and search never import it)")
    return out


# -- libraries, each in its own interpreter ------------------------------------------------------

_LIBRARY_SCRIPT = r"""
import json, sys, time
kind = sys.argv[1]
rows = [json.loads(l) for l in open(sys.argv[2])]
messages = json.load(open(sys.argv[3]))
t0 = time.perf_counter()
if kind == "kingfisher":
    from kingfisher_sdk import Scanner
    scanner = Scanner()
    def find(text):
        return [f.rule_id for f in scanner.scan(text) if f.visible]
else:
    from detect_secrets.core import scan as ds_scan
    from detect_secrets.settings import default_settings
    import inspect
    four = "is_added" in inspect.getsource(ds_scan._process_line_based_plugins)
    ctx = default_settings(); ctx.__enter__()
    def find(text):
        lines = text.splitlines() or [text]
        numbered = [(i, l, True, False) if four else (i, l) for i, l in enumerate(lines, 1)]
        # the file scan's own per-line path (plugins and filters), not the ad hoc string scan
        return [s.type for s in ds_scan._process_line_based_plugins(numbered, "record.txt")]
ready = time.perf_counter() - t0
found = [find(r["text"]) for r in rows]
t1 = time.perf_counter()
alarms = [bool(find(m)) for m in messages]
per_message = (time.perf_counter() - t1) * 1000 / max(1, len(messages))
print(json.dumps({"ready_s": ready, "found": found, "alarms": alarms, "ms_per_message": per_message}))
"""


def run_library(kind: str, path: str | None, rows: list[dict], messages: list[str], tmp: Path) -> dict | None:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "messages.json").write_text(json.dumps(messages))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (path, str(REPO)) if p), "PYTHONWARNINGS": "ignore"}
    p = subprocess.run([sys.executable, "-c", _LIBRARY_SCRIPT, "detect" if kind != "kingfisher" else kind,
                        str(tmp / "rows.jsonl"), str(tmp / "messages.json")], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        return None
    return json.loads(p.stdout)


def print_libraries(rows: list[dict], messages: list[str], compare: dict[str, str | None], tmp: Path) -> dict:
    print("\n== Libraries on the same examples and messages (each from its own install) ==")
    ours = [caught(r) for r in rows if r["secret"]]
    out = {}
    header = (f"{'library':<20} {'recall':>7} {'look-alike':>10} {'alarms/10k':>10} {'ms/message':>10} "
              f"{'start, s':>8} {'adds to cybmem':>15} {'adds alarms':>11}")
    print(header)
    print("-" * len(header))
    for name, path in compare.items():
        res = run_library(name, path, rows, messages, tmp / name)
        if res is None:
            print(f"{name:<20} not installed (pip install it, or --compare {name}=DIR)")
            continue
        secret = [bool(f) for r, f in zip(rows, res["found"]) if r["secret"]]
        lookalike = sum(bool(f) for r, f in zip(rows, res["found"]) if not r["secret"])
        adds = sum(s and not o for s, o in zip(secret, ours))
        from cybmem.store.secrets import scan

        adds_alarms = sum(bool(f) and not scan(r["text"]) for r, f in zip(rows, res["found"]) if not r["secret"])
        per10k = sum(res["alarms"]) / max(1, len(messages)) * 1e4
        print(f"{name:<20} {sum(secret) / len(secret):>7.3f} {lookalike:>10} {per10k:>10.1f} {res['ms_per_message']:>10.3f} "
              f"{res['ready_s']:>8.2f} {adds:>15} {adds_alarms:>11}")
        out[name] = {"recall": sum(secret) / len(secret), "lookalike_alarms": lookalike, "alarms_per_10k": per10k,
                     "ms_per_message": res["ms_per_message"], "start_s": res["ready_s"], "adds_examples": adds,
                     "adds_lookalike_alarms": adds_alarms}
    print("(start: import and rule compile in a fresh interpreter, which every `cybmem write` is; "
          "adds: examples it catches that cybmem's pass misses)")
    return out


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", action="append", default=[], metavar="NAME=DIR",
                    help="a library (detect-secrets, bc-detect-secrets, kingfisher) installed in DIR "
                         "(pip install --target DIR ...); repeatable")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--against", metavar="REF", default=BEFORE_FAMILIES,
                    help="a git ref whose redaction pass to time beside today's "
                         f"(default {BEFORE_FAMILIES}: the pass before issue 29's families)")
    ap.add_argument("--families-at", action="append", default=[], metavar="REF",
                    help="also the recall on the secret families of the pass at git ref REF (repeatable)")
    ap.add_argument("--quick", action="store_true", help="recall, false alarms and speed only (no cost, no libraries)")
    args = ap.parse_args()
    rows = load_examples()
    results = {"recall": print_recall(rows), "families": print_families(args.families_at)}
    messages = {name: commit_messages(name) for name in (*HISTORIES, SLICE)}
    results["false_alarms"] = print_false_alarms(messages)
    history = [m for name in HISTORIES for m in messages[name]]
    if history and args.against:
        results["speed"] = print_speed_against(args.against, history)
    if args.quick:
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        return
    results["cost"] = print_cost(history)
    compare: dict[str, str | None] = {}
    for item in args.compare:
        name, _, path = item.partition("=")
        compare[name] = path or None
    if not compare:
        if _importable("detect_secrets"):
            compare["detect-secrets"] = None
        if _importable("kingfisher_sdk"):
            compare["kingfisher"] = None
    if compare:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            results["libraries"] = print_libraries(rows, history, compare, Path(tmp))
    else:
        print("\n== Libraries ==\nnone installed (pip install -e '.[bench]', or --compare NAME=DIR)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
