"""How often one search crosses into each store module: the load path's back-and-forth, counted.

    python benchmarks/load_visits.py              # cold cache and warm cache, a fresh process each
    python benchmarks/load_visits.py --json       # the counts as JSON

A copy of the bundled fixtures (data-fixtures/memory, without its ``.nocache``, so the Arrow cache
is built and read as in production) is searched once in a fresh Python process under a
``sys.setprofile`` hook that counts every call of a Python function of ``cybmem/store/`` made from
another module (a call within a module is that module's own work, not a visit). "cold": the first
search, which builds the cache; "warm": a second process, which reads it; then the same for the
load alone (``load_snapshot``). Issue 30 asked that a search's load visit each store module at
most a few times (this count gave 17 cold / 14 warm for snapshot.py and 19 / 7 for cache.py
before snapshot.py was split by job); tests/store/test_loading.py holds the load to a few.

    python benchmarks/load_visits.py --repo ../other-tree   # the same count of another tree
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "data-fixtures" / "memory"
PROJECT = "web"
QUERY = "fix the flaky cart drawer e2e test"

_CHILD = r"""
import collections, json, os, sys
sys.path.insert(0, sys.argv[1])
from cybmem.settings import Settings
from cybmem.store.memory_store import MemoryStore
from cybmem.retrieval.search import search

store_dir = os.path.join(sys.argv[1], "cybmem", "store") + os.sep
counts = collections.Counter()

def hook(frame, event, arg):
    if event != "call":
        return
    callee = frame.f_code.co_filename
    if callee.startswith(store_dir):
        caller = frame.f_back.f_code.co_filename if frame.f_back is not None else ""
        if caller != callee:
            counts[os.path.relpath(callee, store_dir)] += 1

store = MemoryStore(sys.argv[2], sys.argv[3])
settings = Settings.from_env({}, memory_dir=sys.argv[2])
if sys.argv[5] == "load":  # the load alone
    from cybmem.store.snapshot import load_snapshot
    sys.setprofile(hook)
    snap = load_snapshot(store)
    sys.setprofile(None)
    print(json.dumps({"counts": dict(counts), "rows": snap.n}))
else:
    sys.setprofile(hook)
    result = search(store, sys.argv[4], k=5, settings=settings)
    sys.setprofile(None)
    print(json.dumps({"counts": dict(counts), "hits": [h.run_id for h in result.hits]}))
"""


def count(root: Path, repo: Path = REPO, what: str = "search") -> dict:
    """Visits per store module (file name -> calls from other modules) of one search of ``root``'s
    project (``what="load"``: of its ``load_snapshot`` alone), in a fresh process; and what it found."""
    p = subprocess.run([sys.executable, "-c", _CHILD, str(repo), str(root), PROJECT, QUERY, what],
                       capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin", "HOME": str(root)})
    return json.loads(p.stdout)


def fixture_copy(dest: Path) -> Path:
    """The bundled fixtures copied to ``dest`` without ``.nocache`` (the cache is used)."""
    shutil.copytree(FIXTURES, dest)
    (dest / ".nocache").unlink()
    return dest


def measure(repo: Path = REPO) -> dict:
    """The visits of a first search (cold: it builds the cache), a second one (warm: it reads it),
    and of the load alone, cold and warm (``load cold``, ``load warm``)."""
    out = {}
    for what, prefix in (("search", ""), ("load", "load ")):
        with tempfile.TemporaryDirectory() as tmp:
            root = fixture_copy(Path(tmp) / "memory")
            out[prefix + "cold"] = count(root, repo, what)
            out[prefix + "warm"] = count(root, repo, what)
    assert out["cold"]["hits"] == out["warm"]["hits"], (out["cold"]["hits"], out["warm"]["hits"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the counts as JSON")
    ap.add_argument("--repo", type=Path, default=REPO, help="the tree whose cybmem is measured (default: this one)")
    args = ap.parse_args()
    got = measure(args.repo)
    if args.json:
        print(json.dumps(got, indent=2, sort_keys=True))
        return
    modules = sorted({m for v in got.values() for m in v["counts"]})
    print("calls into each store module from other modules, in a fresh process:")
    print(f"{'':<20} {'search':>15} {'its load alone':>16}")
    print(f"{'store module':<20} {'cold':>7} {'warm':>7} {'cold':>8} {'warm':>7}")
    for m in modules:
        print(f"{m:<20} " + " ".join(f"{got[k]['counts'].get(m, 0):>7}" for k in ("cold", "warm"))
              + f" {got['load cold']['counts'].get(m, 0):>8} {got['load warm']['counts'].get(m, 0):>7}")


if __name__ == "__main__":
    main()
