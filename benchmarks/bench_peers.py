"""cybmem against the engines a user would pick instead: Tantivy, SQLite FTS5 and bm25s (issue 31).

Usage:
    python benchmarks/bench_peers.py                          # the 7.7k store, 10k and 100k
    python benchmarks/bench_peers.py --sizes 7761,100k,1M --json out.json   # with 1M: about 20 minutes
    python benchmarks/bench_peers.py --root data-fixtures/memory --sizes real,40 --cache-dir /tmp/x

What each engine indexes. At every size the records are a memory store on disk, and cybmem loads
it (its snapshot, held as ``cybmem mcp`` holds it: :func:`cybmem.store.snapshot.holding_snapshots`).
Every engine then indexes the same token lists: each record's keyword text exactly as cybmem
indexes it (task, summary and the titles of the issues it raised:
:func:`cybmem.store.arrow_records.keyword_text_array`), tokenized by cybmem
(:func:`cybmem.store.tokens.tokenize_arrow`: lowercased words, Snowball stems). Tantivy takes them
space-joined with its ``whitespace`` tokenizer, FTS5 with its ``ascii`` tokenizer (the tokens are
letters and digits), bm25s as lists. The queries are bench_query.py's (:func:`bench_query.query_set`:
3-8 consecutive distinct tokens of drawn records of the real corpus), the first ``--queries``.

Engines:
  cybmem-kw      KeywordIndex.scores + top_k(10) on the held snapshot's index (BM25 only)
  cybmem-full    cybmem.retrieval.search.rank_query on the held snapshot: BM25 + recency + lineage,
                 the weights production reads for the store (bench_query.py's cybmem-full)
  cybmem-search  cybmem.retrieval.search.search(store, text) under holding_snapshots(): what the MCP
                 server's search tool calls (the held snapshot, its freshness check, the weights,
                 the hits' rows) with the same now and parent as cybmem-full
  tantivy        a boolean query of SHOULD term queries, searcher.search(limit=10, count=False)
                 (Tantivy's BM25, k1 1.2, b 0.75); the index on disk, default writer
  bm25s          bm25s.BM25(method="lucene").retrieve(k=10) (numpy backend)
  fts5           a contentless FTS5 table, ``MATCH 't1' OR 't2' ... ORDER BY rank LIMIT 10``
                 (rank = bm25(), its own idf: near 0 for a term in half the records), optimized

How it measures. The engines take turns on each query (:func:`_corpus.time_round_robin`: each
call timed alone, the garbage collector off), so load on the shared machine hits them alike;
``--runs`` runs (3), each engine's median per run, the median of those. An engine whose calls
would take more than ``--slow-budget`` seconds a run (bm25s and FTS5 at 1M) takes its turns on
the first queries only (at least 30), and its ratio to Tantivy is taken over the same queries.
Top-10 agreement: the share of an engine's top 10 that exact BM25 (cybmem's kernel, every
record's score) places in its top 10, a record tied with the 10th score counting as in (relative
tolerance 1e-4), over the queries the engine is timed on; cybmem-search is compared with
cybmem-full (the same ranking by design).
Index build: in this process, from the token lists; on disk: cybmem's kw-*.arrow cache files,
Tantivy's directory, the FTS5 file, bm25s.save(). Load from files: each engine in a process of
its own reading the store's record files cold for it (page cache warm): cybmem's cold
``load_snapshot`` (its cache dropped; it writes it again); the others read and orjson-parse
the records and index task + summary with their own analysers (Tantivy ``en_stem``, FTS5
``porter unicode61``, bm25s's English stemmer and stopwords); time of the load (imports apart),
the process's peak RSS and what the load added to it. Growth: the load time, the load's memory
and the query median from the 10k store up, as ratios beside the records' ratio.

Rankings. Each size's rankings (the full ranking's top 10 with its totals and BM25's with its scores, for
every query, every float as its repr, hashed per query) are compared with the ones saved in ``--rankings``
(benchmarks/data/rankings/<corpus>-<records>.json; ``--save-rankings`` writes them): a change made for speed
must leave every one as it was. The last line of the output says, per size, whether they are equal.

Copies (the real size; ``--no-copies`` leaves it out). ``search()`` on a copy of the store made with
``cp -r`` (its ``.cache`` included) whose record files are all within the racy window of the
cache's read (touched as the copy is loaded: what a restore loaded at once, or the records a hook
writes just before an inject, give), beside a second ``cp -r`` copy after
``touch -d '2 hours ago'`` on every file: both held, taking turns on each query, once the racy
window has passed. Run 1 checks each hit file of the fresh copy against its row once (and settles
it: :meth:`cybmem.store.snapshot.Snapshot.stale_rows`); runs 2 and 3 are the held snapshots'
steady state; "a new snapshot" loads both again from their caches, as the next process does. Each
row: medians, the fresh copy's ratio to the old one, and the record files each read in that run.

Stores. The real size (the corpus itself, "real" or its count in ``--sizes``) is copied once;
other sizes are synthesised from the real records (:func:`_corpus.synthesise`: new ids, times
and lineage per copy, copies > 0 with text of their own made of the corpus's lines, numbers
renumbered per copy; the issue ledger replicated to match) and written once. Both go to
``--cache-dir`` (benchmarks/.data: git-ignored, like every benchmark cache) as
``peers-<corpus>-<slug>-<n>/`` with a ``.complete`` marker, and are reused by later runs; delete
the folder to write it again. Writing took 22 s at 100k and 2.4 minutes (4.1 GB) at 1M on a busy
2-core machine; the whole run with 1M, 18.5 minutes (benchmarks/RESULTS.md).
Progress goes to stderr, the tables to stdout (markdown).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _corpus as C  # noqa: E402
from bench_query import K, corpus_tokens, query_set  # noqa: E402

ENGINES = ("cybmem-kw", "cybmem-full", "cybmem-search", "tantivy", "bm25s", "fts5")
LABELS = {
    "cybmem-kw": "cybmem BM25 only (kernel)",
    "cybmem-full": "cybmem full ranking, kernel (BM25 + recency + lineage)",
    "cybmem-search": "cybmem `search()` on a held snapshot",
    "tantivy": "Tantivy (BM25)",
    "bm25s": "bm25s",
    "fts5": "SQLite FTS5, bm25()",
}
#: the engines whose index is built and loaded on their own (cybmem's three share one index)
INDEXES = ("cybmem", "tantivy", "bm25s", "fts5")
TIE_RTOL = 1e-4
GROWTH_BASE = 10_000
_T0 = time.perf_counter()


def say(msg: str) -> None:
    print(f"[bench_peers {time.perf_counter() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def label(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1e6:g}M"
    if n >= 1000:
        return f"{int(n / 100) / 10:g}k"
    return str(n)


def parse_sizes(spec: str, real: int) -> list[int]:
    out = []
    for part in (p.strip().lower() for p in spec.split(",")):
        if not part:
            continue
        if part == "real":
            out.append(real)
        elif part.endswith("m"):
            out.append(int(float(part[:-1]) * 1_000_000))
        elif part.endswith("k"):
            out.append(int(float(part[:-1]) * 1000))
        else:
            out.append(int(part))
    return list(dict.fromkeys(out))


def available(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# ---- stores ----------------------------------------------------------------------------------

_LEFTOVERS = shutil.ignore_patterns(".cache", "*.lock", "shown.jsonl", "used.jsonl", ".retune.json", "exports.json")


def store_for(n: int, root: Path, slug: str, recs: list[dict], cache: Path) -> Path:
    """The memory root of the n-record store (the real one copied, or synthesised), written once."""
    dest = cache / f"peers-{root.name}-{slug}-{n}"
    marker = dest / ".complete"
    if marker.exists():
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    t = time.perf_counter()
    projects = orjson.loads((root / "projects.json").read_bytes())
    if n == len(recs):
        shutil.copytree(root / slug, dest / slug, ignore=_LEFTOVERS)
        (dest / "projects.json").write_bytes(orjson.dumps({slug: projects[slug]}, option=orjson.OPT_INDENT_2))
    else:
        say(f"{label(n)}: synthesising {n:,} records from {len(recs):,} (once; kept in {dest})")
        reps = C.synthesise(recs, n)
        issues = C.replicate_issues(C.load_issues(root), recs, n)
        C.write_store(reps, dest, issues=issues, slug=slug, cwd=projects[slug].get("cwd", f"/home/dev/{slug}"))
        del reps, issues
    marker.write_text("ok\n")
    say(f"{label(n)}: store written in {time.perf_counter() - t:.1f}s")
    # A record file written within cybmem.store.cache.RACY_NS of the cache's build is read again by the
    # first search() that shows it past that window (Snapshot.stale_rows: then settled): not the steady
    # state this measures (copies() measures it).
    time.sleep(2.5)
    return dest


def warm_page_cache(root: Path, slug: str) -> None:
    for path in (root / slug / "records").iterdir():
        path.read_bytes()
    issues = root / slug / "issues.jsonl"
    if issues.exists():
        issues.read_bytes()


def du(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ---- load from the record files, one process per engine --------------------------------------

def _rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mib() -> float:
    """The process's peak RSS (VmHWM: ru_maxrss would carry over the parent's from before exec)."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) / 1024


def _file_texts(root: Path, slug: str) -> list[str]:
    """task + summary of every record file (what a user of another engine would index)."""
    recdir = root / slug / "records"
    out = []
    for name in os.listdir(recdir):
        if name.endswith(".json"):
            with open(recdir / name, "rb") as fh:
                r = orjson.loads(fh.read())
            out.append(f"{r.get('task') or ''}\n{(r.get('outcome') or {}).get('summary') or ''}")
    return out


def child(engine: str, root: Path, slug: str, work: Path) -> dict:
    """Load ``engine``'s index from the store's files in this (fresh) process."""
    t = time.perf_counter()
    if engine == "cybmem":
        from cybmem.store.memory_store import MemoryStore
        from cybmem.store.snapshot import load_snapshot

        store = MemoryStore(root, slug)
    elif engine == "tantivy":
        import tantivy
    elif engine == "bm25s":
        import bm25s
        import Stemmer
    elif engine == "fts5":
        import sqlite3
    imports = time.perf_counter() - t
    before = _rss_mib()
    if engine == "cybmem":
        shutil.rmtree(store.dir / ".cache", ignore_errors=True)
    t = time.perf_counter()
    if engine == "cybmem":
        n = load_snapshot(store).n
    elif engine == "tantivy":
        texts = _file_texts(root, slug)
        path = work / "tantivy-load"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        sb = tantivy.SchemaBuilder()
        sb.add_text_field("text", tokenizer_name="en_stem")
        index = tantivy.Index(sb.build(), path=str(path))
        writer = index.writer()
        for s in texts:
            writer.add_document(tantivy.Document(text=s))
        writer.commit()
        writer.wait_merging_threads()
        n = len(texts)
    elif engine == "bm25s":
        texts = _file_texts(root, slug)
        toks = bm25s.tokenize(texts, stopwords="en", stemmer=Stemmer.Stemmer("english"), show_progress=False)
        bm25s.BM25(method="lucene").index(toks, show_progress=False)
        n = len(texts)
    elif engine == "fts5":
        texts = _file_texts(root, slug)
        path = work / "fts5-load.sqlite"
        path.unlink(missing_ok=True)
        con = sqlite3.connect(path)
        con.execute("CREATE VIRTUAL TABLE t USING fts5(text, content='', tokenize='porter unicode61')")
        con.executemany("INSERT INTO t(rowid, text) VALUES (?, ?)", enumerate(texts))
        con.execute("INSERT INTO t(t) VALUES ('optimize')")
        con.commit()
        con.close()
        n = len(texts)
    else:
        raise SystemExit(f"unknown engine {engine}")
    load = time.perf_counter() - t
    peak = _peak_mib()
    shutil.rmtree(work / "tantivy-load", ignore_errors=True)
    (work / "fts5-load.sqlite").unlink(missing_ok=True)
    return {"engine": engine, "records": n, "import_s": imports, "load_s": load, "peak_rss_mib": peak,
            "load_mib": peak - before, "pandas_imported": "pandas" in sys.modules}


def load_in_child(engine: str, root: Path, slug: str, work: Path) -> dict:
    p = subprocess.run([sys.executable, __file__, "--child", engine, str(root), slug, str(work)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"loading {engine} from files failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---- the engines in this process -------------------------------------------------------------

class Engines:
    """Every engine's index over one store's token lists, and a query function each."""

    def __init__(self, root: Path, slug: str, work: Path, with_engines: set[str]):
        from cybmem.retrieval import scoring as S
        from cybmem.retrieval.search import rank_query, search
        from cybmem.retrieval.weights import weights_for
        from cybmem.settings import Settings
        from cybmem.store.arrow_records import keyword_text_array
        from cybmem.store.keyword_index import KeywordIndex
        from cybmem.store.memory_store import MemoryStore
        from cybmem.store.snapshot import issue_texts, load_snapshot
        from cybmem.store.tokens import tokenize_arrow
        import pyarrow.compute as pc

        self.work = work
        self.store = MemoryStore(root, slug)
        # search() against the kernel it wraps: the formula's ranking (the learned ranker's pool and
        # trees, issue 39, are measured by bench_rank.py)
        self.settings = Settings.from_env({"CYBERINE_MEMORY_RANKER": "linear"}, memory_dir=root)
        self.snap = snap = load_snapshot(self.store)  # held (the caller is within holding_snapshots)
        self.n = snap.n
        texts = keyword_text_array(snap.records, issue_texts(snap.events))
        tokens = tokenize_arrow(texts)
        self.build_s: dict[str, float] = {}
        self.disk_bytes: dict[str, int] = {}
        self.notes: dict[str, str] = {}
        t = time.perf_counter()
        rebuilt = KeywordIndex.build(tokens)
        self.build_s["cybmem"] = time.perf_counter() - t
        probe = tokens[0].as_py() or ["test"]
        assert np.allclose(rebuilt.scores(probe), snap.index.scores(probe), rtol=1e-5, atol=1e-6), \
            "the snapshot's index is not the index of these token lists"
        del rebuilt
        cache = self.store.dir / ".cache"
        self.disk_bytes["cybmem"] = sum(p.stat().st_size for p in cache.glob("kw-*.arrow"))
        ended = snap.ended_ms()
        self.now = int(ended.max()) + 3_600_000
        newest = np.argsort(ended, kind="stable")
        self.parent = snap.records.column("runId")[int(newest[-2])].as_py() if self.n > 1 else None
        self.weights = weights_for(self.settings, self.store).weights
        index, weights, now, parent, store, settings = snap.index, self.weights, self.now, self.parent, self.store, self.settings
        self.texts: dict[int, str] = {}

        def text(q):
            return self.texts.get(id(q)) or " ".join(q)

        self.ranked = lambda q: rank_query(snap, text(q), k=K, weights=weights, now_ms=now, parent_run_id=parent)
        self.fns = {
            "cybmem-kw": lambda q: S.top_k(index.scores(q), K),
            "cybmem-full": lambda q: rank_query(snap, text(q), k=K, weights=weights, now_ms=now, parent_run_id=parent).top,
            "cybmem-search": lambda q: search(store, text(q), k=K, settings=settings, now_ms=now, parent_run_id=parent),
        }
        def kw_rows(q):  # the scored ones (top_k fills a short list with unscored rows)
            sc = index.scores(q)
            return [int(i) for i in S.top_k(sc, K) if sc[i] > 0]

        self.rows = {
            "cybmem-kw": kw_rows,
            "cybmem-full": lambda q: list(self.fns["cybmem-full"](q)),
            "cybmem-search": lambda q: list(self.fns["cybmem-search"](q).ranked.top),
        }
        docs = tokens_lists = None
        if {"tantivy", "fts5"} & with_engines:
            docs = pc.binary_join(tokens, " ").to_pylist()
        if "tantivy" in with_engines:
            self._tantivy(docs)
        if "fts5" in with_engines:
            self._fts5(docs)
        del docs
        if "bm25s" in with_engines:
            tokens_lists = tokens.to_pylist()
            self._bm25s(tokens_lists)
        del tokens_lists

    def _tantivy(self, docs: list[str]) -> None:
        import tantivy

        path = self.work / "tantivy"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        t = time.perf_counter()
        sb = tantivy.SchemaBuilder()
        sb.add_text_field("text", tokenizer_name="whitespace")
        sb.add_unsigned_field("row", stored=True)
        schema = sb.build()
        index = tantivy.Index(schema, path=str(path))
        writer = index.writer()
        for i, s in enumerate(docs):
            writer.add_document(tantivy.Document(text=s, row=i))
        writer.commit()
        writer.wait_merging_threads()
        index.reload()
        searcher = index.searcher()
        self.build_s["tantivy"] = time.perf_counter() - t
        self.disk_bytes["tantivy"] = du(path)
        self.notes["tantivy"] = f"{searcher.num_segments} segment(s)"
        Q, should = tantivy.Query, tantivy.Occur.Should

        def run(q):
            query = Q.boolean_query([(should, Q.term_query(schema, "text", t)) for t in q])
            return searcher.search(query, limit=K, count=False).hits

        self.fns["tantivy"] = run
        self.rows["tantivy"] = lambda q: [searcher.doc(a)["row"][0] for _, a in run(q)]

    def _fts5(self, docs: list[str]) -> None:
        import sqlite3

        path = self.work / "fts5.sqlite"
        path.unlink(missing_ok=True)
        t = time.perf_counter()
        con = sqlite3.connect(path, check_same_thread=False)
        con.execute("CREATE VIRTUAL TABLE t USING fts5(text, content='', tokenize='ascii')")
        con.executemany("INSERT INTO t(rowid, text) VALUES (?, ?)", enumerate(docs))
        con.execute("INSERT INTO t(t) VALUES ('optimize')")
        con.commit()
        self.build_s["fts5"] = time.perf_counter() - t
        self.disk_bytes["fts5"] = du(path)
        sql = f"SELECT rowid FROM t WHERE t MATCH ? ORDER BY rank LIMIT {K}"

        def run(q):
            return con.execute(sql, (" OR ".join(f'"{t}"' for t in q),)).fetchall()

        self.fns["fts5"] = run
        self.rows["fts5"] = lambda q: [r[0] for r in run(q)]

    def _bm25s(self, tokens_lists: list[list[str]]) -> None:
        import bm25s

        t = time.perf_counter()
        retr = bm25s.BM25(method="lucene", k1=1.2, b=0.75)
        retr.index(tokens_lists, show_progress=False)
        self.build_s["bm25s"] = time.perf_counter() - t
        path = self.work / "bm25s"
        shutil.rmtree(path, ignore_errors=True)
        retr.save(str(path), show_progress=False)
        self.disk_bytes["bm25s"] = du(path)

        def run(q):
            return retr.retrieve([q], k=min(K, self.n), show_progress=False, n_threads=0)

        def rows(q):
            res = run(q)
            return [int(d) for d, s in zip(res.documents[0], res.scores[0]) if s > 0]

        self.fns["bm25s"] = run
        self.rows["bm25s"] = rows

    def agreement(self, queries: list[list[str]], caps: dict[str, int]) -> dict[str, dict]:
        """Each BM25 engine's top 10 against exact BM25 with ties counted; search() against the
        full ranking (the same ranking, so exactly). Each engine over the queries it is timed on."""
        out: dict[str, dict] = {}
        shares: dict[str, list[float]] = {e: [] for e in self.rows if e not in ("cybmem-full", "cybmem-search")}
        same = 0
        for i, q in enumerate(queries):
            ref = self.snap.index.scores(q)
            pos = int((ref > 0).sum())
            want = min(K, pos)
            thr = np.partition(ref, len(ref) - want)[len(ref) - want] if want else np.inf
            tied = ref >= thr - TIE_RTOL * abs(thr)
            for e in shares:
                if i >= caps[e]:
                    continue
                rows = self.rows[e](q)
                shares[e].append(1.0 if not want and not rows else
                                 sum(bool(tied[r]) and ref[r] > 0 for r in rows[:K]) / max(want, len(rows[:K]), 1))
            if "cybmem-search" in self.rows:
                same += self.rows["cybmem-search"](q) == self.rows["cybmem-full"](q)
        for e, v in shares.items():
            a = np.asarray(v)
            out[e] = {"vs": "exact BM25, ties counted", "mean": float(a.mean()), "all_10": float((a >= 1 - 1e-9).mean()),
                      "queries": len(a)}
        out["cybmem-search"] = {"vs": "cybmem-full, exactly", "mean": same / len(queries), "all_10": same / len(queries)}
        return out

    def rankings(self, queries: list[list[str]]) -> dict[str, str]:
        """Each query's cybmem rankings as :func:`check_rankings` compares them: the full ranking's top
        10 (run ids and totals) and BM25's (run ids and scores, the scored ones), every float as its
        repr, hashed (sha256, 16 hex digits) by the query's text."""
        import hashlib

        from cybmem.retrieval import scoring as S

        ids = self.snap.records.column("runId").to_pylist()
        out: dict[str, str] = {}
        for q in queries:
            r = self.ranked(q)
            full = [[ids[row], repr(float(r.scored.total[local]))] for row, local in zip(r.top, r.local)] if r.scored else []
            sc = self.snap.index.scores(q)
            kw = [[ids[int(i)], repr(float(sc[i]))] for i in S.top_k(sc, K) if sc[i] > 0]
            blob = json.dumps({"full": full, "kw": kw}, separators=(",", ":")).encode()
            out[" ".join(q)] = hashlib.sha256(blob).hexdigest()[:16]
        return out

    def close(self) -> None:
        self.fns.clear()
        self.rows.clear()
        gc.collect()
        for name in ("tantivy", "bm25s", "fts5.sqlite"):
            p = self.work / name
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


# ---- timing -----------------------------------------------------------------------------------

CHUNK = 50


def timed_run(fns: dict, caps: dict[str, int], queries: list, tag: str) -> dict[str, list[int]]:
    """One run: the engines take turns on each query (an engine past its cap sits out)."""
    cuts = sorted({0, len(queries), *(c for c in caps.values() if c < len(queries)), *range(0, len(queries), CHUNK)})
    out: dict[str, list[int]] = {e: [] for e in fns}
    for a, b in zip(cuts, cuts[1:]):
        active = {e: f for e, f in fns.items() if caps[e] >= b}
        for e, ns in C.time_round_robin(active, queries[a:b], warmup=5 if a == 0 else 0).items():
            out[e].extend(ns)
        if b % CHUNK == 0 or b == len(queries):
            say(f"{tag}: {b}/{len(queries)} queries")
    return out


def calibrate(fns: dict, queries: list, budget: float, n_min: int = 30) -> dict[str, int]:
    """How many queries each engine takes its turn on: all, unless that would take more than
    ``budget`` seconds a run."""
    caps = {}
    for e, fn in fns.items():
        ts = []
        for q in queries[:5]:
            t = time.perf_counter()
            fn(q)
            ts.append(time.perf_counter() - t)
        est = float(np.median(ts[1:] or ts))
        caps[e] = len(queries) if est * len(queries) <= budget else max(min(n_min, len(queries)), int(budget / est))
    return caps


#: record files opened while :func:`copies` counts (a list), else None; one audit hook for the process
_OPENED: list[str] | None = None


def _count_opens(event: str, args: tuple) -> None:
    if _OPENED is not None and event == "open" and isinstance(args[0], str) and args[0].endswith(".json"):
        _OPENED.append(args[0])


def copies(store_root: Path, slug: str, queries: list, args) -> dict:
    """search() on a freshly copied store beside an old copy of it (the module docstring, "Copies"):
    per run, each copy's median (us) and the record files it read."""
    global _OPENED
    from cybmem.retrieval.search import search
    from cybmem.settings import Settings
    from cybmem.store.cache import RACY_NS
    from cybmem.store.memory_store import MemoryStore
    from cybmem.store.snapshot import holding_snapshots, load_snapshot

    base = args.cache_dir / f"peers-copies-{os.getpid()}"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    names = ("fresh copy", "old copy")
    roots = {name: base / name.split()[0] for name in names}
    try:
        subprocess.run(["cp", "-r", str(store_root), str(roots["old copy"])], check=True)
        subprocess.run(["find", str(roots["old copy"]), "-exec", "touch", "-h", "-d", "2 hours ago", "{}", "+"], check=True)
        subprocess.run(["cp", "-r", str(store_root), str(roots["fresh copy"])], check=True)
        subprocess.run(["find", str(roots["fresh copy"] / slug / "records"), "-exec", "touch", "-h", "{}", "+"], check=True)
        stores = {name: MemoryStore(roots[name], slug) for name in names}
        records = {name: str(stores[name].records_dir) + os.sep for name in names}
        settings = {name: Settings.from_env({}, memory_dir=roots[name]) for name in names}
        sys.addaudithook(_count_opens)
        texts = {id(q): " ".join(q) for q in queries}

        def searcher(name):
            store, s = stores[name], settings[name]
            return lambda q: search(store, texts[id(q)], k=K, settings=s)

        fns = {name: searcher(name) for name in names}
        for name in names:  # the copy's first load (it reads every record again: new inodes)
            load_snapshot(stores[name])
        time.sleep(RACY_NS / 1e9 + 0.5)  # past the racy window: records/ is trusted, a check may settle a file
        out: dict = {"runs": []}

        def timed(tag: str) -> None:
            global _OPENED
            held = {name: load_snapshot(stores[name]) for name in names}
            _OPENED = []
            ns = C.time_round_robin(fns, queries, warmup=0)
            opened, _OPENED = _OPENED, None
            out["runs"].append({"run": tag, "ratio": float(np.median(ns[names[0]]) / np.median(ns[names[1]])),
                                "held": all(load_snapshot(stores[name]) is held[name] for name in names),
                                **{name: {"median_us": float(np.median(ns[name])) / 1e3,
                                          "files_read": sum(p.startswith(records[name]) for p in opened)} for name in names}})
            say(f"copies: {tag}: " + ", ".join(f"{name} {out['runs'][-1][name]['median_us']:.0f} us, "
                                              f"{out['runs'][-1][name]['files_read']} files read" for name in names))

        with holding_snapshots():  # one held snapshot of each copy across the runs
            for r in range(args.runs):
                timed(f"run {r + 1}")
        with holding_snapshots():  # loaded again from the caches, as the next process loads them
            timed("a new snapshot")
        return out
    finally:
        _OPENED = None
        shutil.rmtree(base, ignore_errors=True)


def copies_table(res: dict, n: int) -> str:
    head = [f"{label(n)} records, `search()` on a held snapshot", "fresh `cp -r` copy", "old copy (`touch -d '2 hours ago'`)",
            "fresh / old"]
    rows = [[r["run"] + ("" if r["held"] else " (not held: reloaded on each call)")] + [f"{_us(r[name]['median_us'])} ({r[name]['files_read']} files read)"
                          for name in ("fresh copy", "old copy")] + [f"{r['ratio']:.2f}x"] for r in res["runs"]]
    return _table(head, rows)


def bench_size(n: int, args, root: Path, slug: str, recs: list[dict], queries: list) -> dict:
    from cybmem.store.snapshot import holding_snapshots, load_snapshot

    tag = label(n)
    store_root = store_for(n, root, slug, recs, args.cache_dir)
    work = args.cache_dir / f"peers-idx-{os.getpid()}-{n}"
    work.mkdir(parents=True, exist_ok=True)
    res: dict = {"records": n, "store": str(store_root), "n_queries": len(queries)}
    engines = set(ENGINES) - set(args.skip)
    for e in ("tantivy", "bm25s"):
        if e in engines and not available(e):
            say(f"{tag}: {e} is not installed: left out (pip install -e '.[bench]')")
            engines.discard(e)
    loads = {}
    try:
        warm_page_cache(store_root, slug)
        for e in INDEXES:
            if e != "cybmem" and e not in engines:
                continue
            say(f"{tag}: {e}: load from the record files (its own process)")
            got = [load_in_child(e, store_root, slug, work) for _ in range(args.load_runs)]
            loads[e] = {k: (float(np.median([g[k] for g in got])) if k.endswith(("_s", "_mib")) else got[0][k])
                        for k in got[0]}
        res["load"] = loads
        with holding_snapshots():
            say(f"{tag}: building the engines' indexes in this process")
            eng = Engines(store_root, slug, work, engines)
            try:
                res["build_s"], res["disk_bytes"], res["notes"] = eng.build_s, eng.disk_bytes, eng.notes
                say(f"{tag}: built: " + ", ".join(f"{e} {s:.2f}s" for e, s in eng.build_s.items()))
                fns = {e: eng.fns[e] for e in ENGINES if e in eng.fns}
                eng.texts.update({id(q): " ".join(q) for q in queries})
                # the held snapshot: what every search() call gets back while the files are unchanged
                res["held"] = bool(eng.snap.current()) and load_snapshot(eng.store) is eng.snap
                if not res["held"]:
                    say(f"{tag}: warning: the snapshot is not held (search() reloads it on each call)")
                caps = calibrate(fns, queries, args.slow_budget)
                res["queries"] = caps
                say(f"{tag}: top-10 agreement")
                res["agreement"] = eng.agreement(queries, caps)
                res["rankings"] = check_rankings(eng.rankings(queries), args, slug, n)
                say(f"{tag}: rankings: {res['rankings']['verdict']}")
                runs: list[dict[str, list[int]]] = []
                for r in range(args.runs):
                    runs.append(timed_run(fns, caps, queries, f"{tag}: run {r + 1}/{args.runs}"))
            finally:
                eng.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res["query"] = summarise(runs)
    if n == len(recs) and not args.no_copies:
        say(f"{tag}: a fresh copy of the store beside an old one")
        res["copies"] = copies(store_root, slug, queries, args)
    return res


def check_rankings(got: dict[str, str], args, slug: str, n: int) -> dict:
    """Compare this run's rankings (:meth:`Engines.rankings`) with the ones saved for this corpus and
    size in ``--rankings`` (``<slug>-<n>.json``), and with ``--save-rankings`` write them there.
    A speed change must leave every ranking as it was: every float, every tie's order."""
    path = args.rankings / f"{slug}-{n}.json"
    res: dict = {"file": str(path), "queries": len(got)}
    saved = None
    if path.is_file():
        try:
            saved = json.loads(path.read_text())["rankings"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            res["verdict"] = f"{path} is not a saved rankings file ({exc}); write it again with --save-rankings"
    if saved is not None:
        common = [t for t in got if t in saved]
        differ = [t for t in common if got[t] != saved[t]]
        res.update(compared=len(common), differ=len(differ), first_differing=differ[:3],
                   not_saved=len(got) - len(common))
        if not common:
            res["verdict"] = f"none of these queries is saved in {path}"
        elif differ:
            res["verdict"] = (f"{len(differ)} of {len(common)} distinct queries rank otherwise than saved in {path} "
                              f"(first: {differ[0]!r})")
        else:
            res["verdict"] = f"equal to the saved ones on all {len(common)} distinct queries ({path})"
            if res["not_saved"]:
                res["verdict"] += f"; {res['not_saved']} queries not saved"
    elif "verdict" not in res:
        res["verdict"] = f"none saved for this size ({path}: --save-rankings writes it)"
    if args.save_rankings:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"corpus": slug, "records": n, "k": K, "rankings": got}, indent=0, sort_keys=True) + "\n")
        res["saved"] = True
        res["verdict"] += "; this run's saved there now"
        say(f"{label(n)}: rankings saved to {path}")
    return res


def summarise(runs: list[dict[str, list[int]]]) -> dict[str, dict]:
    """Per engine: each run's median (us), their median, and the ratio to Tantivy over the same
    queries (an engine with a cap against Tantivy's first calls)."""
    out: dict[str, dict] = {}
    for e in runs[0]:
        meds = [float(np.median(r[e])) / 1e3 for r in runs]
        d = {"run_medians_us": meds, "median_us": float(np.median(meds)), "n": len(runs[0][e])}
        if "tantivy" in runs[0]:
            d["x_tantivy"] = float(np.median([np.median(r[e]) / np.median(r["tantivy"][: len(r[e])]) for r in runs]))
        out[e] = d
    return out


# ---- printing ---------------------------------------------------------------------------------

def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _us(x: float) -> str:
    return f"{x:,.0f} us" if x >= 10 else f"{x:.1f} us"


def _size(b: int) -> str:
    return f"{b / 2**20:.1f} MiB" if b >= 2**20 else f"{b / 1024:.0f} KiB"


def report(results: list[dict], args) -> str:
    sizes = [r["records"] for r in results]
    head = [""] + [f"{label(n)} records" for n in sizes]
    out = []
    out.append(f"Query latency, top {K}: median of {args.runs} runs (each run the median over its queries; "
               "engines taking turns on each query); x Tantivy over the same queries\n")
    rows = []
    for e in ENGINES:
        cells = []
        for r in results:
            q = r["query"].get(e)
            if q is None:
                cells.append("-")
                continue
            x = f" ({q['x_tantivy']:.2f}x)" if "x_tantivy" in q else ""
            n = "" if q["n"] == r["n_queries"] else f", {q['n']} queries"
            cells.append(f"{_us(q['median_us'])}{x}{n}")
        if any(c != "-" for c in cells):
            rows.append([LABELS[e]] + cells)
    out.append(_table(head, rows))
    out.append(f"\nTop-{K} agreement (mean share of the top {K}; in brackets the share of queries agreeing on all {K})\n")
    rows = []
    for e in ("cybmem-kw", "tantivy", "bm25s", "fts5", "cybmem-search"):
        cells = [(f"{r['agreement'][e]['mean'] * 100:.1f}% ({r['agreement'][e]['all_10'] * 100:.0f}%)"
                  if e in r["agreement"] else "-") for r in results]
        if any(c != "-" for c in cells):
            vs = results[0]["agreement"].get(e, {}).get("vs", "")
            rows.append([f"{LABELS[e]} vs {vs}"] + cells)
    out.append(_table(head, rows))
    out.append("\nIndex build in process from the same token lists; index on disk\n")
    rows = []
    for e in INDEXES:
        if not any(e in r["build_s"] for r in results):
            continue
        name = "cybmem (KeywordIndex)" if e == "cybmem" else LABELS.get(e, e)
        rows.append([name] + [f"{r['build_s'][e]:.2f} s, {_size(r['disk_bytes'][e])}" if e in r["build_s"] else "-"
                              for r in results])
    out.append(_table(head, rows))
    out.append("\nLoad from the record files, each engine in a process of its own: load time (imports apart), "
               "peak RSS of the process (what the load added)\n")
    rows = []
    for e in INDEXES:
        if not any(e in r["load"] for r in results):
            continue
        name = "cybmem cold `load_snapshot`" if e == "cybmem" else LABELS.get(e, e)
        rows.append([name] + [(f"{r['load'][e]['load_s']:.2f} s, {r['load'][e]['peak_rss_mib']:.0f} MiB "
                               f"(+{r['load'][e]['load_mib']:.0f})" + ("; imports pandas" if r["load"][e]["pandas_imported"]
                                                                       else "")) if e in r["load"] else "-"
                              for r in results])
    out.append(_table(head, rows))
    growth = growth_table(results)
    if growth:
        out.append(growth)
    for r in results:
        if "copies" in r:
            out.append("\nA store copied just now beside an old copy of it: medians of each run (engines apart), "
                       "the fresh copy's ratio to the old one, record files read in the run\n")
            out.append(copies_table(r["copies"], r["records"]))
    return "\n".join(out) + "\n"


def growth_table(results: list[dict]) -> str:
    """Load time, the load's memory and the query median against the 10k store, beside the records'
    ratio; a figure that grows faster than the records is marked."""
    base = next((r for r in results if r["records"] == GROWTH_BASE), None)
    later = [r for r in results if base is not None and r["records"] > GROWTH_BASE]
    if not later:
        return ""
    head = [f"growth from {label(GROWTH_BASE)}"] + [f"{label(r['records'])} (records x{r['records'] / GROWTH_BASE:g})"
                                                    for r in later]
    rows = []

    def ratio(a: float, b: float, records: float) -> str:
        if not b:
            return "-"
        x = a / b
        return f"x{x:.2f}" + (" (faster than the records)" if x > records * 1.05 else "")

    for e in INDEXES:
        if e not in base["load"]:
            continue
        name = "cybmem" if e == "cybmem" else LABELS.get(e, e)
        rows.append([f"{name}: load"] + [ratio(r["load"][e]["load_s"], base["load"][e]["load_s"], r["records"] / GROWTH_BASE)
                                         for r in later])
        rows.append([f"{name}: the load's memory"] + [ratio(r["load"][e]["load_mib"], base["load"][e]["load_mib"],
                                                            r["records"] / GROWTH_BASE) for r in later])
    for e in ENGINES:
        if e in base["query"]:
            rows.append([f"{LABELS[e]}: query"] + [ratio(r["query"][e]["median_us"], base["query"][e]["median_us"],
                                                         r["records"] / GROWTH_BASE) if e in r["query"] else "-"
                                                   for r in later])
    return "\n" + _table(head, rows)


def machine() -> dict:
    cpu = "unknown"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "load_average": os.getloadavg()[0]}


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("cybmem", "numpy", "pyarrow", "tantivy", "bm25s"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    import sqlite3

    out["sqlite"] = sqlite3.sqlite_version
    return out


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        engine, root, slug, work = sys.argv[2:6]
        print(json.dumps(child(engine, Path(root), slug, Path(work))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="7761,100000",
                    help="record counts: the corpus's own count or 'real' is the real store; 100k, 1M (opt-in: ~20 min)")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--load-runs", type=int, default=1, help="loads from the files per engine (median)")
    ap.add_argument("--slow-budget", type=float, default=30.0,
                    help="seconds a run may spend on one engine's calls before it takes fewer queries")
    ap.add_argument("--no-growth", action="store_true", help=f"do not add the {label(GROWTH_BASE)} store the growth "
                                                             "ratios start from")
    ap.add_argument("--no-copies", action="store_true", help="leave out the fresh copy of the real store beside an old one")
    ap.add_argument("--skip", default="", help="engines to leave out, comma-separated (tantivy,bm25s,fts5)")
    ap.add_argument("--root", default="pytest-memory",
                    help="the corpus: a name under benchmarks/.data (unpacked from its archive) or a memory root; "
                         "its first project")
    ap.add_argument("--cache-dir", type=Path, default=C.DATA_DIR, help="where the stores are written once and kept")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures as JSON")
    ap.add_argument("--rankings", type=Path, default=Path(__file__).resolve().parent / "data" / "rankings",
                    help="where each size's saved rankings are (<corpus>-<records>.json): this run's are compared "
                         "with them")
    ap.add_argument("--save-rankings", action="store_true", help="write this run's rankings there (after comparing)")
    args = ap.parse_args(argv)
    args.skip = [s.strip() for s in args.skip.split(",") if s.strip()]
    args.cache_dir = args.cache_dir.resolve()
    root = C.ensure_corpus(args.root)
    slug = C.slug_of(root)
    recs = C.load_records(root)
    sizes = parse_sizes(args.sizes, len(recs))
    if not args.no_growth and any(n > GROWTH_BASE for n in sizes) and GROWTH_BASE not in sizes:
        sizes.append(GROWTH_BASE)
    sizes.sort()
    queries = query_set(corpus_tokens(recs), args.queries)
    say(f"corpus {root} ({slug}): {len(recs):,} records; sizes {', '.join(label(n) for n in sizes)}; "
        f"{len(queries)} queries, {args.runs} runs")
    out: dict = {"machine": machine(), "versions": versions(), "args": {k: str(v) for k, v in vars(args).items()},
                 "results": []}
    for n in sizes:
        out["results"].append(bench_size(n, args, root, slug, recs, queries))
        gc.collect()
    text = report(out["results"], args)
    print(f"Machine: {out['machine']['cpu']}, {out['machine']['cores']} cores; "
          + ", ".join(f"{k} {v}" for k, v in out["versions"].items() if v) + "\n")
    print(text)
    print("\nRankings (the full ranking's and BM25's top 10, every float) against the saved ones: "
          + "; ".join(f"{label(r['records'])}: {r['rankings']['verdict']}" for r in out["results"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        say(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
