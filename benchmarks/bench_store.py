"""Load, refresh and warm-CLI benchmarks on the real corpus and replicated stores.

    python benchmarks/bench_store.py                       # 7,761 (real) and 100,000 records
    python benchmarks/bench_store.py --sizes 7761,100000,1000000 --json out.json

For each size it prints medians and ratios measured in the same run:

- cold load: ``load_snapshot`` with no cache (parse every record file, build the Arrow tables
  and the keyword index, write the cache) against reading + orjson-parsing the same files alone;
  "frame only" is the same without the keyword index (the part the read+parse baseline does);
- warm load: ``load_snapshot`` with a fresh cache (memory-mapped Arrow, nothing parsed);
- refresh after one new record file, against the cold load;
- warm ``cybmem search`` and ``cybmem inject`` wall time (real subprocesses) against a bare
  ``python -c "import ..."`` of exactly the third-party packages the command imports (found
  with ``-X importtime``), and against ``python -c pass``.

Stores are written once under benchmarks/.data/ (replicated with benchmarks/_corpus.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _corpus  # noqa: E402

from cybmem.store.snapshot import load_snapshot  # noqa: E402
from cybmem.store.memory_store import MemoryStore  # noqa: E402

QUERY = "fixture teardown order with parametrize and xdist"
SLUG = "pytest"


#: What a warm inject cannot do without (the dispatch issue's baseline: at most 1.5x of it at 100k).
DISPATCH_FLOOR = ("numpy", "pyarrow", "pyarrow.ipc", "typer", "orjson")


def store_for(n: int) -> Path:
    """A memory root with n records (the real corpus when n is its size), written once."""
    real = _corpus.ensure_corpus()
    records = _corpus.load_records(real)
    if n == len(records):
        root = _corpus.DATA_DIR / f"store-{n}"
        if not (root / SLUG / "records").is_dir():
            shutil.copytree(real, root, ignore=shutil.ignore_patterns("qrels.jsonl"))
        return root
    root = _corpus.DATA_DIR / f"store-{n}"
    marker = root / ".complete"
    if not marker.exists():
        if root.exists():
            shutil.rmtree(root)
        t = time.perf_counter()
        reps = _corpus.replicate(records, n)
        issues = _corpus.replicate_issues(_corpus.load_issues(real), records, n)
        _corpus.write_store(reps, root, issues=issues)
        marker.write_text("ok")
        print(f"  wrote {n:,} records to {root} in {time.perf_counter() - t:.1f}s", file=sys.stderr)
    return root


def drop_cache(root: Path) -> None:
    shutil.rmtree(root / SLUG / ".cache", ignore_errors=True)


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def read_parse(root: Path) -> int:
    recdir = root / SLUG / "records"
    n = 0
    for name in os.listdir(recdir):
        if name.endswith(".json"):
            with open(recdir / name, "rb") as fh:
                orjson.loads(fh.read())
            n += 1
    return n


def frame_only(root: Path) -> None:
    """Parse + Arrow table, no keyword index: the frame the read+parse baseline compares with."""
    from cybmem.store import arrow_records as columns

    store = MemoryStore(root, SLUG)
    columns.load_records(store, sorted(store.listing().items()), {})


def imported_packages(cmd: list[str], env: dict) -> list[str]:
    """Top-level third-party packages a command has loaded when it exits (sys.modules: an import
    that was tried and refused, as pandas is on the dispatch path, does not count)."""
    code = ("import atexit, sys\n"
            "def _report():\n"
            "    print('LOADED ' + ' '.join(sorted({m.split('.')[0] for m in sys.modules if sys.modules[m] is not None})),"
            " file=sys.stderr)\n"
            "atexit.register(_report)\n"
            "sys.argv = ['cybmem'] + sys.argv[1:]\n"
            "from cybmem.cli.app import main\n"
            "main()\n")
    p = subprocess.run([sys.executable, "-c", code, *cmd], env=env, capture_output=True, text=True)
    line = next((x for x in p.stderr.splitlines() if x.startswith("LOADED ")), "LOADED ")
    stdlib = set(sys.stdlib_module_names)
    names = [top for top in line[len("LOADED "):].split()
             if top not in stdlib and not top.startswith("_") and top not in ("cybmem", "encodings", "sitecustomize",
                                                                                "usercustomize")]
    import importlib.util

    def real(name: str) -> bool:  # a package on disk (not an extension's runtime module)
        try:
            return importlib.util.find_spec(name) is not None
        except ValueError:
            return False

    return sorted(n for n in set(names) if real(n))


def wall(argv: list[str], env: dict, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench_size(n: int, repeat: int, cli_repeat: int) -> dict:
    root = store_for(n)
    store = MemoryStore(root, SLUG)
    print(f"\n== {n:,} records ({root})", flush=True)
    read_parse(root)  # warm the page cache so both sides read from memory
    base = median_time(lambda: read_parse(root), repeat)
    frame = median_time(lambda: frame_only(root), repeat)

    def cold():
        drop_cache(root)
        load_snapshot(store)

    cold_t = median_time(cold, repeat)
    warm_t = median_time(lambda: load_snapshot(store), max(repeat, 5))
    snap = load_snapshot(store)
    assert snap.from_cache and snap.parsed == 0

    # Refresh after one new record: a file appears in records/, then a load refreshes.
    template = orjson.loads(next((root / SLUG / "records").iterdir()).read_bytes())
    refresh_times = []
    for i in range(max(repeat, 3)):
        rec = dict(template, runId=f"bench-new-{n}-{i}-{time.time_ns()}", endedAt=template["endedAt"] + 1, task="a brand new task")
        (root / SLUG / "records" / f"{rec['runId']}.json").write_bytes(orjson.dumps(rec))
        t = time.perf_counter()
        snap = load_snapshot(store)
        refresh_times.append(time.perf_counter() - t)
        assert snap.parsed == 1, snap.parsed
    refresh_t = statistics.median(refresh_times)
    for path in (root / SLUG / "records").glob("bench-new-*.json"):
        path.unlink()
    load_snapshot(store)  # leave a fresh cache for the CLI runs

    env = {**os.environ, "CYBERINE_MEMORY_DIR": str(root)}
    # Warm means what an installed package has: bytecode cached (pip writes it on install; an
    # environment with PYTHONDONTWRITEBYTECODE would otherwise recompile cybmem on every run).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    exe = _corpus.cybmem_exe()
    cmds = {
        "search": [exe, "search", QUERY, "--project", SLUG],
        "inject": [exe, "inject", QUERY, "--project", SLUG],
    }
    out: dict = {
        "records": n, "read_parse_s": base, "frame_only_s": frame, "cold_load_s": cold_t, "warm_load_s": warm_t,
        "refresh_one_s": refresh_t, "cold_vs_read_parse": cold_t / base, "frame_vs_read_parse": frame / base,
        "refresh_vs_cold": refresh_t / cold_t,
    }
    bare = wall([sys.executable, "-c", "pass"], env, cli_repeat)
    out["python_bare_s"] = bare
    # The dispatch issue's baseline: the imports a warm inject cannot do without.
    floor = wall([sys.executable, "-c", "import " + ", ".join(DISPATCH_FLOOR)], env, cli_repeat)
    out["dispatch_floor_s"] = floor
    for name, argv in cmds.items():
        wall(argv, env, 1)  # warm-up (and the cache is fresh)
        pkgs = imported_packages(argv[1:], env)
        imp = wall([sys.executable, "-c", "import " + ", ".join(pkgs)], env, cli_repeat)
        t = wall(argv, env, cli_repeat)
        out[f"cli_{name}_s"] = t
        out[f"cli_{name}_imports"] = pkgs
        out[f"cli_{name}_import_floor_s"] = imp
        out[f"cli_{name}_vs_imports"] = t / imp
        out[f"cli_{name}_vs_dispatch_floor"] = t / floor
    out.update(bench_feedback(root, store, env, exe, repeat, cli_repeat))
    # The same inject through main() with the interpreter's ordinary exit (the console script
    # skips the teardown after a lean command): what that skip is worth.
    ordinary = [sys.executable, "-c", "import sys\nsys.argv = ['cybmem'] + sys.argv[1:]\nfrom cybmem.cli.app import main\nmain()",
                *cmds["inject"][1:]]
    out["cli_inject_ordinary_exit_s"] = wall(ordinary, env, cli_repeat)
    print(f"  read+parse (baseline)      {base * 1e3:9.1f} ms")
    print(f"  frame only (parse+Arrow)   {frame * 1e3:9.1f} ms   x{frame / base:.2f} of read+parse")
    print(f"  cold load (+index, cache)  {cold_t * 1e3:9.1f} ms   x{cold_t / base:.2f} of read+parse")
    print(f"  warm load (mmap cache)     {warm_t * 1e3:9.1f} ms")
    print(f"  refresh after 1 new record {refresh_t * 1e3:9.1f} ms   {100 * refresh_t / cold_t:.1f}% of cold load")
    print(f"  python -c pass             {bare * 1e3:9.1f} ms")
    print(f"  import {', '.join(DISPATCH_FLOOR)} {floor * 1e3:9.1f} ms   (the dispatch baseline)")
    for name in cmds:
        print(f"  cybmem {name:<7} (warm)      {out[f'cli_{name}_s'] * 1e3:9.1f} ms   x{out[f'cli_{name}_vs_dispatch_floor']:.2f} of "
              f"the dispatch baseline; x{out[f'cli_{name}_vs_imports']:.2f} of its own imports "
              f"`import {', '.join(out[f'cli_{name}_imports'])}` ({out[f'cli_{name}_import_floor_s'] * 1e3:.1f} ms)")
    print(f"  keeping what inject showed {out['keep_shown_s'] * 1e6:9.1f} us   (one locked append to shown.jsonl, in process; "
          f"{out['keep_shown_lines']} lines there)")
    print(f"  cybmem inject, log on / off {out['cli_inject_log_on_s'] * 1e3:.1f} / {out['cli_inject_log_off_s'] * 1e3:.1f} ms "
          f"(interleaved medians: {(out['cli_inject_log_on_s'] - out['cli_inject_log_off_s']) * 1e3:+.1f} ms)")
    print(f"  matching a written run     {out['note_used_s'] * 1e3:9.2f} ms   (the write path: shown.jsonl of "
          f"{out['note_used_lines']} lines read, the run's lines parsed, used.jsonl appended)")
    o = out["cli_inject_ordinary_exit_s"]
    print(f"  the same inject, ordinary interpreter exit {o * 1e3:.1f} ms   x{o / floor:.2f} of the dispatch baseline "
          f"(the console script skips the teardown: {(o - out['cli_inject_s']) * 1e3:.0f} ms)")
    return out


def bench_feedback(root: Path, store: MemoryStore, env: dict, exe: str, repeat: int, cli_repeat: int) -> dict:
    """What keeping what was shown costs (cybmem.dispatch.feedback, cybmem.store.feedback_log): the
    append inject makes, in process; a warm inject with the log on and off (interleaved, so drift
    hits both); the write path's matching against a shown.jsonl at its cap."""
    from cybmem.dispatch import feedback
    from cybmem.dispatch.inject import inject_task
    from cybmem.settings import DEFAULT_SHOWN_CAP, Settings
    from cybmem.store import feedback_log
    from cybmem.store.feedback_match import note_used

    settings = Settings.from_env({"CYBERINE_RUN_ID": "bench-feedback"}, memory_dir=root)
    inj = inject_task(QUERY, settings, project=SLUG, keep=False)
    shown = store.dir / feedback_log.SHOWN_FILE
    keep_t = median_time(lambda: feedback.keep_block(store, inj, settings), max(repeat, 301))
    lines = len(feedback_log.read_lines(shown))
    on, off = [], []
    off_env = {**env, "CYBERINE_MEMORY_FEEDBACK": "0"}
    argv = [exe, "inject", QUERY, "--project", SLUG]
    for _ in range(cli_repeat):
        on.append(wall(argv, env, 1))
        off.append(wall(argv, off_env, 1))
    # The write path at the cap: a shown.jsonl of DEFAULT_SHOWN_CAP lines, the run's among them.
    saved = shown.read_bytes()
    entry = feedback.block_entry(inj, settings)
    shown.write_bytes(b"")
    feedback_log.keep_shown(store.dir, [dict(entry, runId=f"other-{i}") for i in range(DEFAULT_SHOWN_CAP - 1)]
                            + [entry], cap=DEFAULT_SHOWN_CAP)
    at_cap = len(feedback_log.read_lines(shown))
    used = store.dir / feedback_log.USED_FILE

    def note() -> None:
        note_used(store, settings, run_id="bench-feedback", task_hashed=None, started_at=0, ended_at=2**62,
                  text="as run 0000abcd did")

    note_t = median_time(note, max(repeat, 21))
    shown.write_bytes(saved)
    used.unlink(missing_ok=True)
    return {"keep_shown_s": keep_t, "keep_shown_lines": lines, "cli_inject_log_on_s": statistics.median(on),
            "cli_inject_log_off_s": statistics.median(off), "note_used_s": note_t, "note_used_lines": at_cap}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="7761,100000", help="comma-separated record counts (7761 = the real corpus)")
    ap.add_argument("--repeat", type=int, default=3, help="repeats of each in-process measurement (median)")
    ap.add_argument("--cli-repeat", type=int, default=11, help="repeats of each subprocess measurement (median)")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = ap.parse_args()
    results = [bench_size(int(s), args.repeat, args.cli_repeat) for s in args.sizes.split(",")]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"machine": _machine(), "results": results}, indent=2))


def _machine() -> dict:
    import platform

    return {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}


if __name__ == "__main__":
    main()
