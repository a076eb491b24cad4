"""Shared corpus helpers for the benchmarks: unpack, load, replicate, write a store.

The real corpus is ``pytest-memory.tar.gz`` (7,761 run records converted from pytest's
first-parent history, see shared/corpora/README.md). It is unpacked once into
``benchmarks/.data/`` (a self-ignoring cache dir: it carries its own ``.gitignore``), so a
fresh CI machine needs nothing but the archive. The archive directory is
``<repo>/../shared/corpora`` unless ``CYBMEM_CORPORA`` points elsewhere.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tarfile
import uuid
from pathlib import Path
from typing import Any, Iterable

import orjson

REPO = Path(__file__).resolve().parent.parent
DATA_DIR = Path(__file__).resolve().parent / ".data"
# Fixed namespace so replicated run ids are the same on every machine.
_REPLICA_NS = uuid.UUID("6f1c2a52-0c7e-4d4e-9d59-0b6c6d1f3a11")
_REPLICA_NS_BYTES = _REPLICA_NS.bytes
_LINEAGE_KEYS = ("parentRunId", "previousRunId", "rootRunId")


def cybmem_exe() -> str:
    """The ``cybmem`` command of the Python running the benchmark (its venv's ``bin/``, where pip
    put it), else the one on PATH. A benchmark run as ``venv/bin/python benchmarks/x.py`` without the
    venv activated would otherwise start another install's command, or fail in a traceback."""
    beside = Path(sys.executable).parent / "cybmem"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("cybmem")
    if found is None:
        raise SystemExit(f"the cybmem command is not installed for {sys.executable} (nor on PATH): "
                         "run `pip install -e .` in this checkout with that Python")
    return found


def corpora_dir() -> Path:
    """Directory holding the corpus archives (env CYBMEM_CORPORA overrides).

    Default: ``<repo>/../shared/corpora``, or ``<repo>/../../shared/corpora`` for a git
    worktree one level deeper (``/work/wt/<name>`` next to ``/work/shared``).
    """
    env = os.environ.get("CYBMEM_CORPORA")
    if env:
        return Path(env).expanduser().resolve()
    near = (REPO.parent / "shared" / "corpora").resolve()
    far = (REPO.parent.parent / "shared" / "corpora").resolve()
    return far if not near.is_dir() and far.is_dir() else near


def ensure_corpus(name: str = "pytest-memory") -> Path:
    """Unpack ``<name>.tar.gz`` into benchmarks/.data/ once; return the memory root.

    ``name`` may also be the path of a memory root already on disk (a folder holding
    projects.json and, for the quality benchmarks, qrels.jsonl): any history converted the
    same way.
    """
    given = Path(name).expanduser()
    if (given / "projects.json").is_file():
        return given.resolve()
    dest = DATA_DIR / name
    marker = DATA_DIR / f".{name}.unpacked"
    if marker.exists() and dest.is_dir():
        return dest
    archive = corpora_dir() / f"{name}.tar.gz"
    if not archive.is_file():
        raise FileNotFoundError(
            f"corpus archive {archive} not found; set CYBMEM_CORPORA to the directory "
            "holding pytest-memory.tar.gz")
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    gi = DATA_DIR / ".gitignore"
    if not gi.exists():
        gi.write_text("# benchmark cache, never committed\n*\n")
    if dest.exists():
        shutil.rmtree(dest)
    tmp = DATA_DIR / f".{name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    with tarfile.open(archive, "r:gz") as tf:
        if hasattr(tarfile, "data_filter"):
            tf.extractall(tmp, filter="data")
        else:  # pragma: no cover - Python < 3.11.4
            tf.extractall(tmp)
    inner = tmp / name
    (inner if inner.is_dir() else tmp).rename(dest)
    if tmp.exists():
        shutil.rmtree(tmp)
    marker.write_text("ok\n")
    return dest


def commit_messages(name: str) -> list[str]:
    """Every record's task (the commit message) of a corpus archive, or [] when it is absent."""
    archive = corpora_dir() / f"{name}.tar.gz"
    if not archive.is_file():
        return []
    with tarfile.open(archive) as tar:
        return [orjson.loads(tar.extractfile(m).read())["task"] for m in tar
                if m.isfile() and "/records/" in m.name and m.name.endswith(".json")]


def slug_of(root: Path) -> str:
    """The project of a corpus memory root (the first one projects.json names)."""
    projects = orjson.loads((root / "projects.json").read_bytes())
    return next(iter(projects))


def _project_dir(root: Path) -> Path:
    return root / slug_of(root)


def load_records(root: Path | None = None) -> list[dict[str, Any]]:
    """All records, oldest first (following the previousRunId chain from the root; records
    off the chain, if any, are placed by (endedAt, runId))."""
    root = root or ensure_corpus()
    recdir = _project_dir(root) / "records"
    recs = [orjson.loads(p.read_bytes()) for p in sorted(recdir.glob("*.json"))]
    by_prev: dict[str, dict] = {}
    heads = []
    for r in recs:
        prev = (r.get("lineage") or {}).get("previousRunId")
        if prev:
            by_prev[prev] = r
        else:
            heads.append(r)
    ordered: list[dict] = []
    seen: set[str] = set()
    for h in sorted(heads, key=lambda r: (r["endedAt"], r["runId"])):
        cur: dict | None = h
        while cur is not None and cur["runId"] not in seen:
            seen.add(cur["runId"])
            ordered.append(cur)
            cur = by_prev.get(cur["runId"])
    rest = sorted((r for r in recs if r["runId"] not in seen), key=lambda r: (r["endedAt"], r["runId"]))
    return ordered + rest


def load_issues(root: Path | None = None) -> list[dict[str, Any]]:
    root = root or ensure_corpus()
    path = _project_dir(root) / "issues.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def load_qrels(root: Path | None = None) -> list[dict[str, Any]]:
    """qrels lines merged per queryRunId (relevant = union, in first-seen order)."""
    root = root or ensure_corpus()
    merged: dict[str, dict] = {}
    for line in (root / "qrels.jsonl").read_bytes().splitlines():
        if not line.strip():
            continue
        q = orjson.loads(line)
        m = merged.get(q["queryRunId"])
        if m is None:
            merged[q["queryRunId"]] = dict(q, relevant=list(q["relevant"]))
        else:
            m["relevant"].extend(r for r in q["relevant"] if r not in m["relevant"])
    return list(merged.values())


def record_text(rec: dict[str, Any]) -> str:
    """The text a record is indexed by in the benchmarks: task + outcome summary/lists."""
    out = rec.get("outcome") or {}
    parts = [rec.get("task") or "", out.get("summary") or ""]
    parts += list(out.get("accomplished") or []) + list(out.get("next") or [])
    return "\n".join(parts)


def replica_id(run_id: str, copy: int) -> str:
    """Copy 0 keeps the original id; copy c > 0 gets uuid5(namespace, f"{run_id}/{c}").

    Inlined RFC 4122 name-based (SHA-1) UUID: equal to str(uuid.uuid5(...)), 4x faster,
    which matters when making a million of them.
    """
    if copy == 0:
        return run_id
    h = bytearray(hashlib.sha1(_REPLICA_NS_BYTES + f"{run_id}/{copy}".encode()).digest()[:16])
    h[6] = (h[6] & 0x0F) | 0x50  # version 5
    h[8] = (h[8] & 0x3F) | 0x80  # RFC 4122 variant
    x = h.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


def replicate(records: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """n records made of copies of ``records`` (oldest first), oldest first.

    Copy c has run ids ``replica_id(id, c)``, times shifted by c * (span + 1 day) so copies
    follow each other, lineage ids remapped within the copy (chains stay consistent; the
    copy's first record links previousRunId to the previous copy's last one), issue ids
    suffixed ``.r<c>`` (a valid issue id). Copy 0 is the input itself (shallow copies), so replicate(recs, len(recs))
    is the real corpus. A trailing partial copy takes the oldest records, whose lineage only
    points further back, so it stays consistent too.
    """
    if not records or n <= 0:
        return []
    span = max(r["endedAt"] for r in records) - min(r["startedAt"] for r in records) + 86_400_000
    out: list[dict[str, Any]] = []
    m = len(records)
    prev_last: str | None = None
    copy = 0
    while len(out) < n:
        take = records[: min(m, n - len(out))]
        shift = copy * span
        for r in take:
            if copy == 0:
                out.append(dict(r))
                continue
            lin = dict(r.get("lineage") or {})
            for key in _LINEAGE_KEYS:
                if lin.get(key):
                    lin[key] = replica_id(lin[key], copy)
            if not lin.get("previousRunId") and prev_last:
                lin["previousRunId"] = prev_last
            if lin.get("chatSessionId"):
                lin["chatSessionId"] = f"{lin['chatSessionId']}.r{copy}"
            oc = dict(r.get("outcome") or {})
            oc["issues"] = [f"{i}.r{copy}" for i in oc.get("issues") or []]
            rr = dict(r, runId=replica_id(r["runId"], copy), startedAt=r["startedAt"] + shift,
                      endedAt=r["endedAt"] + shift, lineage=lin, outcome=oc)
            if r.get("supersededBy"):
                rr["supersededBy"] = replica_id(r["supersededBy"], copy)
            out.append(rr)
        prev_last = out[-1]["runId"]
        copy += 1
    return out


_NUMBER = re.compile(r"\d{4,}")


def synthesise(records: list[dict[str, Any]], n: int, seed: int = 0) -> list[dict[str, Any]]:
    """n records like ``replicate(records, n)`` (the same ids, times, lineage and issue ids), whose
    copies c > 0 carry text of their own, so that a large store is not the real one's text
    13 or 130 times over (every top 10 a tie of identical copies) and its vocabulary grows.

    Copy c of record i keeps the first line of record i's task and a seeded shuffle of its
    other lines, each kept with probability 0.7; its outcome's summary, accomplished and next
    come from record p_c(i) of a seeded permutation p_c; numbers of four digits or more (pull
    requests, revisions, tickets) become ``int(x) + c * 10**len(x)``, so a later copy names
    numbers of its own as a longer history would. Every line is a real line of the corpus.
    Copy 0 is the input itself. About 20 s at 1M records.
    """
    import random

    reps = replicate(records, n)
    m = len(records)
    for c in range(1, (n + m - 1) // m if m else 0):
        rng = random.Random(f"{seed}/{c}")
        perm = list(range(m))
        rng.shuffle(perm)

        def renum(s: str, c: int = c) -> str:
            return _NUMBER.sub(lambda x: str(int(x.group()) + c * 10 ** len(x.group())), s)

        for i, rec in enumerate(reps[c * m : (c + 1) * m]):
            head, *body = (records[i].get("task") or "").split("\n")
            body = [line for line in body if line.strip() and rng.random() < 0.7]
            rng.shuffle(body)
            src = records[perm[i]].get("outcome") or {}
            oc = rec["outcome"]  # replicate's own copy (issues remapped)
            oc["summary"] = renum(src.get("summary") or "")
            oc["accomplished"] = [renum(x) for x in src.get("accomplished") or []]
            oc["next"] = [renum(x) for x in src.get("next") or []]
            rec["task"] = renum("\n".join([head, *body]))
    return reps


def replicate_columns(records: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """The columns of ``replicate(records, n)`` without building n dicts (fast at 1M).

    Returns numpy arrays: runId, parentRunId, previousRunId, rootRunId, chatSessionId
    (object, None = missing), startedAt and endedAt (int64), and "source" (int64: the
    index of the original record each row copies).
    """
    import numpy as np

    m = len(records)
    if not records or n <= 0:
        return {}
    span = max(r["endedAt"] for r in records) - min(r["startedAt"] for r in records) + 86_400_000
    base = [r["runId"] for r in records]
    pos = {rid: i for i, rid in enumerate(base)}
    lin = [r.get("lineage") or {} for r in records]

    def idx(key: str) -> np.ndarray:
        return np.array([pos.get(x.get(key) or "", -1) for x in lin], dtype=np.int64)

    par_i, prev_i, root_i = idx("parentRunId"), idx("previousRunId"), idx("rootRunId")
    chat = [x.get("chatSessionId") for x in lin]
    copies = (n + m - 1) // m
    src = np.arange(n, dtype=np.int64) % m
    copy = np.arange(n, dtype=np.int64) // m
    ids = np.empty(n, dtype=object)
    for c in range(copies):
        lo, hi = c * m, min(n, (c + 1) * m)
        ids[lo:hi] = base[: hi - lo] if c == 0 else [replica_id(x, c) for x in base[: hi - lo]]

    def remap(local: np.ndarray, key: str) -> np.ndarray:
        out = np.full(n, None, dtype=object)
        li = local[src]
        ok = li >= 0
        out[ok] = ids[(copy * m + li)[ok]]
        # ids that point outside the corpus (rare) are kept (copy 0) or remapped (copy c)
        dangling = np.array([bool(x.get(key)) and pos.get(x.get(key), -1) < 0 for x in lin])
        for i in np.flatnonzero(dangling[src]):
            orig = lin[src[i]].get(key)
            out[i] = (orig if copy[i] == 0 else replica_id(orig, int(copy[i]))) if orig else None
        return out

    prev = remap(prev_i, "previousRunId")
    first = np.flatnonzero((copy > 0) & (prev == None))  # noqa: E711 - elementwise
    prev[first] = ids[first - 1]  # a copy's head links to the previous copy's last record
    chats = np.array([None if not chat[s] else (chat[s] if c == 0 else f"{chat[s]}.r{c}")
                      for s, c in zip(src.tolist(), copy.tolist())], dtype=object) if any(chat) \
        else np.full(n, None, dtype=object)
    shift = copy * span
    return {
        "runId": ids,
        "parentRunId": remap(par_i, "parentRunId"),
        "previousRunId": prev,
        "rootRunId": remap(root_i, "rootRunId"),
        "chatSessionId": chats,
        "startedAt": np.array([r["startedAt"] for r in records], dtype=np.int64)[src] + shift,
        "endedAt": np.array([r["endedAt"] for r in records], dtype=np.int64)[src] + shift,
        "source": src,
    }


def replicate_issues(events: list[dict[str, Any]], records: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """Issue events matching ``replicate(records, n)``: events of copy c whose byRunId is in
    that copy, ids suffixed ``.r<c>`` (a valid issue id), times shifted like the records."""
    if not records or n <= 0:
        return []
    span = max(r["endedAt"] for r in records) - min(r["startedAt"] for r in records) + 86_400_000
    pos = {r["runId"]: i for i, r in enumerate(records)}
    m = len(records)
    out: list[dict[str, Any]] = []
    copies = (n + m - 1) // m
    for c in range(copies):
        limit = min(m, n - c * m)
        for e in events:
            i = pos.get(e.get("byRunId"), m)
            if i >= limit:
                continue
            if c == 0:
                out.append(dict(e))
            else:
                out.append(dict(e, issueId=f"{e['issueId']}.r{c}", byRunId=replica_id(e["byRunId"], c),
                                at=e["at"] + c * span))
    return out


def write_store(records: Iterable[dict[str, Any]], dest: Path, *, issues: Iterable[dict[str, Any]] = (),
                slug: str = "pytest", cwd: str = "/home/dev/pytest") -> Path:
    """Write a memory root in the store-format layout: projects.json, <slug>/records/<runId>.json,
    <slug>/issues.jsonl. Returns the memory root (point CYBERINE_MEMORY_DIR at it)."""
    dest = Path(dest)
    recdir = dest / slug / "records"
    recdir.mkdir(parents=True, exist_ok=True)
    (dest / "projects.json").write_bytes(orjson.dumps({slug: {"cwd": cwd}}, option=orjson.OPT_INDENT_2))
    opt = orjson.OPT_INDENT_2
    for r in records:
        (recdir / f"{r['runId']}.json").write_bytes(orjson.dumps(r, option=opt))
    with open(dest / slug / "issues.jsonl", "wb") as fh:
        for e in issues:
            fh.write(orjson.dumps(e) + b"\n")
    return dest


def time_round_robin(fns: dict, queries, warmup: int = 5) -> dict[str, list[int]]:
    """Nanoseconds per call of each function on each query: the functions take turns on query i,
    so load changes on a shared machine hit all of them alike; each call is timed alone, with the
    garbage collector off."""
    import gc
    import time

    for q in queries[:warmup]:
        for fn in fns.values():
            fn(q)
    out: dict[str, list[int]] = {name: [] for name in fns}
    gc.disable()
    try:
        for q in queries:
            for name, fn in fns.items():
                t0 = time.perf_counter_ns()
                fn(q)
                out[name].append(time.perf_counter_ns() - t0)
    finally:
        gc.enable()
    return out

