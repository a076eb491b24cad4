"""Redaction quality and speed: precision / recall per kind, false positives on real text, MB/s.

    python benchmarks/bench_redact.py                  # corpus table, real-text check, 3 MB x 5 runs
    python benchmarks/bench_redact.py --mb 8 --runs 7 --json out.json
    python benchmarks/bench_redact.py --scan-dir /usr/lib/python3.11   # also: findings on a tree

Three measurements, all printed:

1. The labelled corpus (data-fixtures/redaction-corpus.jsonl): per kind, a secret line is a true
   positive when its kind is reported, a false negative otherwise; any kind reported on a line
   not labelled with it is a false positive. "exact" counts secret lines whose redacted text is
   exactly the expected one. tests/store/test_secrets.py holds the corpus to 100%, so this table is a
   regression record, not an independent estimate; the next two are.
2. Real prose without secrets: every commit message of pytest (the benchmark corpus archive,
   ../shared/corpora/pytest-memory.tar.gz or $CYBMEM_CORPORA); every finding is a false alarm.
3. Synthetic worker output (pytest and pip logs, diffs, JSON tool results, env dumps, docker
   builds, commit prose) of about --mb megabytes, split into documents of 4-200 KB as cybmem
   stores them, with one secret from each corpus kind planted per megabyte. Reports planted
   secrets found with their exact span, false positives elsewhere, and the median MB/s of
   redact() over --runs runs (MB = 10^6 bytes of UTF-8).

With --scan-dir, it also scans every text file under a directory (source, docs, config) and
prints the findings per kind with a sample: on code that holds no live secrets, each is either
an example credential in docs or tests, or a false alarm to look at.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cybmem.store.secrets import redact, scan  # noqa: E402

CORPUS = REPO / "data-fixtures" / "redaction-corpus.jsonl"


def load_corpus() -> list[dict]:
    return [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines()]


def _prf(tp: int, fp: int, fn: int) -> tuple[float, float, float]:
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def evaluate_corpus(rows: list[dict]) -> dict:
    """Per-kind TP / FP / FN over the labelled lines, plus exact-output and line-level counts."""
    counts: dict[str, Counter] = defaultdict(Counter)
    lines = Counter()
    for row in rows:
        out, kinds = redact(row["text"])
        label = row["kind"]
        if label is not None:
            counts[label]["lines"] += 1
            counts[label]["tp" if label in kinds else "fn"] += 1
            counts[label]["exact"] += out == row.get("redacted")
            lines["secret_redacted" if kinds else "secret_missed"] += 1
        else:
            lines["lookalike_untouched" if not kinds else "lookalike_hit"] += 1
        for kind in kinds:
            if kind != label:
                counts[kind]["fp"] += 1
    return {"kinds": counts, "lines": lines}


def print_corpus(result: dict) -> dict:
    counts, lines = result["kinds"], result["lines"]
    print(f"\n== Corpus: {CORPUS.relative_to(REPO)} ==")
    secrets = lines["secret_redacted"] + lines["secret_missed"]
    lookalikes = lines["lookalike_untouched"] + lines["lookalike_hit"]
    print(f"{secrets} secret lines, {lookalikes} look-alike lines\n")
    header = f"{'kind':<22} {'lines':>5} {'TP':>4} {'FP':>4} {'FN':>4} {'exact':>5} {'prec':>6} {'recall':>6} {'F1':>6}"
    print(header)
    print("-" * len(header))
    total = Counter()
    table = {}
    for kind in sorted(counts):
        c = counts[kind]
        p, r, f = _prf(c["tp"], c["fp"], c["fn"])
        table[kind] = {**c, "precision": p, "recall": r, "f1": f}
        total.update(c)
        print(f"{kind:<22} {c['lines']:>5} {c['tp']:>4} {c['fp']:>4} {c['fn']:>4} {c['exact']:>5} "
              f"{p:>6.3f} {r:>6.3f} {f:>6.3f}")
    p, r, f = _prf(total["tp"], total["fp"], total["fn"])
    print("-" * len(header))
    print(f"{'total (micro)':<22} {total['lines']:>5} {total['tp']:>4} {total['fp']:>4} {total['fn']:>4} "
          f"{total['exact']:>5} {p:>6.3f} {r:>6.3f} {f:>6.3f}")
    lp, lr, lf = _prf(lines["secret_redacted"], lines["lookalike_hit"], lines["secret_missed"])
    print(f"{'lines (any kind)':<22} {secrets + lookalikes:>5} {lines['secret_redacted']:>4} "
          f"{lines['lookalike_hit']:>4} {lines['secret_missed']:>4} {'':>5} {lp:>6.3f} {lr:>6.3f} {lf:>6.3f}")
    return {"per_kind": table, "total": {**total, "precision": p, "recall": r, "f1": f},
            "lines": dict(lines)}


@functools.cache
def commit_messages() -> list[str]:
    """Every task (commit message) of the pytest corpus archive, or [] when it is absent."""
    from _corpus import commit_messages as messages

    return messages("pytest-memory")


def print_real_text(texts: list[str]) -> dict:
    print("\n== Real prose without secrets: pytest commit messages ==")
    if not texts:
        print("pytest-memory.tar.gz not found (set CYBMEM_CORPORA); skipped")
        return {}
    found = [(f, text) for text in texts for f in scan(text)]
    size = sum(len(t.encode()) for t in texts) / 1e6
    print(f"{len(texts)} messages, {size:.2f} MB: {len(found)} findings (each one a false alarm)")
    for f, text in found[:10]:
        print(f"  {f.kind}: {text[max(0, f.start - 40) : f.end + 10]!r}")
    return {"messages": len(texts), "mb": size, "false_alarms": len(found),
            "by_kind": dict(Counter(f.kind for f, _ in found))}


# -- synthetic worker output -----------------------------------------------------------------

_WORDS = ("fixture teardown order parametrize xdist collection plugin config warning cache "
          "assertion rewrite import module session scope marker node report terminal capture "
          "output deprecation traceback error failure skip timeout retry lock index token "
          "password secret key auth credentials").split()


def _hexs(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def _b64(rng: random.Random, n: int) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    return "".join(rng.choice(alphabet) for _ in range(n))


def _block(rng: random.Random, prose: list[str]) -> str:
    """One chunk of plausible worker output without secrets."""
    kind = rng.randrange(9)
    if kind == 0:
        name = "_".join(rng.sample(_WORDS, 3))
        lines = [f"tests/test_{rng.choice(_WORDS)}.py::test_{name}[{rng.randint(0, 9)}] "
                 f"{rng.choice(['PASSED', 'PASSED', 'PASSED', 'FAILED', 'SKIPPED'])}"
                 for _ in range(rng.randint(5, 40))]
        if rng.random() < 0.3:
            lines += ["Traceback (most recent call last):",
                      f'  File "/home/dev/app/src/{rng.choice(_WORDS)}.py", line {rng.randint(1, 900)}, in run',
                      "    token = self._session.get_token()",
                      f"AssertionError: assert {rng.randint(0, 99)} == {rng.randint(0, 99)}"]
        return "\n".join(lines)
    if kind == 1:
        sha = _hexs(rng, 40)
        return "\n".join([
            f"commit {sha}", "Author: Dev <dev@example.com>", "",
            f"    {rng.choice(prose).splitlines()[0] if prose else 'Fix the flaky test'}", "",
            f"diff --git a/src/{rng.choice(_WORDS)}.py b/src/{rng.choice(_WORDS)}.py",
            f"index {_hexs(rng, 7)}..{_hexs(rng, 7)} 100644",
            "@@ -10,7 +10,8 @@ def connect(settings):",
            "-    password = settings.DB_PASSWORD",
            "+    password = os.environ[\"DB_PASSWORD\"]",
            "+    token = get_token(user=user, password=password)",
            f"     return Client(api_key=api_key, timeout={rng.randint(1, 60)})",
        ])
    if kind == 2:
        pkg = rng.choice(["requests", "urllib3", "numpy", "boto3", "pydantic", "httpx"])
        return "\n".join([
            f"Collecting {pkg}>=2.0",
            f"  Downloading https://files.pythonhosted.org/packages/{_hexs(rng, 2)}/{_hexs(rng, 2)}/"
            f"{_hexs(rng, 60)}/{pkg}-2.{rng.randint(0, 30)}.0-py3-none-any.whl#sha256={_hexs(rng, 64)}",
            f"Successfully installed {pkg}-2.{rng.randint(0, 30)}.0",
            f"aws s3 sync dist/ s3://acme-artifacts/{pkg}/{rng.randint(2020, 2026)}/ --region us-east-1",
        ])
    if kind == 3:
        record = {"runId": f"{_hexs(rng, 8)}-{_hexs(rng, 4)}-4{_hexs(rng, 3)}-a{_hexs(rng, 3)}-{_hexs(rng, 12)}",
                  "tool": "read_file", "path": f"src/{rng.choice(_WORDS)}.py",
                  "blob": _b64(rng, rng.choice([24, 60, 88, 200])) + "==",
                  "integrity": "sha512-" + _b64(rng, 86) + "==", "ok": True, "ms": rng.randint(1, 900)}
        return json.dumps(record, indent=2)
    if kind == 4:
        return "\n".join([
            "PWD=/home/dev/app", "OLDPWD=/home/dev", "HOME=/home/dev", "LANG=C.UTF-8",
            "npm_config_cache=/home/dev/.npm", "HF_HOME=/data/hf", "TOKEN_TTL=3600",
            "PASSWORD_MIN_LENGTH=12", "SORT_KEY=name", "AWS_REGION=us-east-1",
            "GOOGLE_APPLICATION_CREDENTIALS=/home/dev/.config/gcloud/sa.json",
            f"PATH=/usr/local/bin:/usr/bin:/bin:/home/dev/.local/bin:{rng.choice(_WORDS)}",
        ])
    if kind == 5:
        return "\n".join(
            [f"#{i} [{rng.randint(1, 5)}/5] RUN pip install -r requirements.txt" for i in range(3)]
            + [f"#{i} sha256:{_hexs(rng, 64)} {rng.randint(1, 900)}kB / {rng.randint(900, 2000)}kB done"
               for i in range(rng.randint(3, 12))]
            + [f"writing image sha256:{_hexs(rng, 64)} done"]
        )
    if kind == 6:
        return "\n".join([
            "--- PASS: TestLogin (0.00s)", f"--- PASS: TestPasswordReset (0.{rng.randint(0, 99):02d}s)",
            "--- FAIL: TestTokenRefresh (0.10s)", "    auth_test.go:42: token expired, refreshing",
            f"ok  \tgithub.com/acme/app/auth\t0.{rng.randint(100, 999)}s",
        ])
    if kind == 7 or not prose:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(20, 120))) + "."
    return rng.choice(prose)


def worker_output(rows: list[dict], mb: float, seed: int = 7) -> tuple[list[str], list[list[tuple[int, int, str]]]]:
    """Documents of synthetic worker output, and per document the planted secrets' spans."""
    rng = random.Random(seed)
    prose = commit_messages()
    by_kind: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        if row["secret"]:
            by_kind[row["kind"]].append(row)
    target = int(mb * 1e6)
    plants = [rng.choice(by_kind[kind]) for _ in range(max(1, round(mb))) for kind in sorted(by_kind)]
    rng.shuffle(plants)
    docs, spans, size = [], [], 0
    plant_every = max(1, target // (len(plants) + 1))
    next_plant = plant_every
    while size < target:
        limit = rng.choice([4_000, 16_000, 64_000, 200_000])
        parts, doc_spans, length = [], [], 0
        while length < limit:
            if plants and size + length >= next_plant:
                row = plants.pop()
                offset = 2 + length + row["text"].index(row["value"])  # doc starts with "\n\n"
                doc_spans.append((offset, offset + len(row["value"]), row["kind"]))
                text = row["text"]
                next_plant += plant_every
            else:
                text = _block(rng, prose)
            parts.append(text)
            length += len(text) + 2
        doc = "\n\n" + "\n\n".join(parts)
        docs.append(doc)
        spans.append(doc_spans)
        size += len(doc.encode())
    return docs, spans


def _median_mb_s(work, mb: float, runs: int) -> float:
    """MB/s of the median of runs timed calls of work()."""
    timings = []
    for _ in range(runs):
        start = time.perf_counter()
        work()
        timings.append(time.perf_counter() - start)
    return mb / statistics.median(timings)


def print_worker_output(rows: list[dict], mb: float, runs: int) -> dict:
    docs, spans = worker_output(rows, mb)
    total_mb = sum(len(d.encode()) for d in docs) / 1e6
    planted = sum(len(s) for s in spans)
    print(f"\n== Synthetic worker output: {len(docs)} documents, {total_mb:.2f} MB, {planted} planted secrets ==")
    found_exact, fps = 0, []
    for doc, doc_spans in zip(docs, spans):
        findings = {(f.start, f.end, f.kind) for f in scan(doc)}
        for span in doc_spans:
            found_exact += span in findings
        planted_ranges = [(s, e) for s, e, _ in doc_spans]
        for start, end, kind in findings:
            if not any(s < end and start < e for s, e in planted_ranges):
                fps.append((kind, doc[max(0, start - 40) : end + 10]))
    print(f"planted secrets found with exact span and kind: {found_exact}/{planted}")
    print(f"findings outside planted secrets (false positives): {len(fps)}")
    for kind, context in fps[:10]:
        print(f"  {kind}: {context!r}")
    scan_rate = _median_mb_s(lambda: [scan(doc) for doc in docs], total_mb, runs)
    redact_rate = _median_mb_s(lambda: [redact(doc) for doc in docs], total_mb, runs)
    joined = "\n".join(docs)
    one = _median_mb_s(lambda: redact(joined), total_mb, runs)
    print(f"throughput, scan() per document:   {scan_rate:.1f} MB/s (median of {runs})")
    print(f"throughput, redact() per document: {redact_rate:.1f} MB/s (median of {runs}; a document "
          "holding a secret is scanned again after the replacement)")
    print(f"throughput, redact() on one {total_mb:.1f} MB string: {one:.1f} MB/s (median of {runs})")
    return {"documents": len(docs), "mb": total_mb, "planted": planted, "found_exact": found_exact,
            "false_positives": len(fps), "scan_mb_per_s_per_document": scan_rate,
            "redact_mb_per_s_per_document": redact_rate, "redact_mb_per_s_one_string": one,
            "runs": runs}


_TEXT_SUFFIXES = {".py", ".md", ".rst", ".txt", ".cfg", ".toml", ".yml", ".yaml", ".json", ".ini"}


def print_scan_dir(root: Path, sample: int = 20) -> dict:
    print(f"\n== Findings under {root} ==")
    size, found = 0, []
    start = time.perf_counter()
    for path in sorted(root.rglob("*")):
        if path.suffix not in _TEXT_SUFFIXES or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        size += len(text.encode())
        found += [(f.kind, path, text[max(0, f.start - 50) : f.end + 10]) for f in scan(text)]
    elapsed = time.perf_counter() - start
    by_kind = Counter(kind for kind, _, _ in found)
    print(f"{size / 1e6:.1f} MB, {len(found)} findings, scan() at {size / 1e6 / elapsed:.1f} MB/s "
          f"(reading included)")
    for kind, count in by_kind.most_common():
        print(f"  {kind:<22} {count:>6}")
    for kind, path, context in random.Random(1).sample(found, min(sample, len(found))):
        print(f"  {kind}: {path.relative_to(root)}: {context!r}")
    return {"mb": size / 1e6, "findings": len(found), "by_kind": dict(by_kind)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=3.0, help="synthetic worker output size (MB)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs (the median is printed)")
    parser.add_argument("--scan-dir", type=Path, help="also count findings in the text files here")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    rows = load_corpus()
    results = {"corpus": print_corpus(evaluate_corpus(rows))}
    results["real_text"] = print_real_text(commit_messages())
    results["worker_output"] = print_worker_output(rows, args.mb, args.runs)
    if args.scan_dir:
        results["scan_dir"] = print_scan_dir(args.scan_dir)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=dict))


if __name__ == "__main__":
    main()
