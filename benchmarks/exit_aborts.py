"""How often a process that read a Parquet part aborts at exit, read by pyarrow's defaults and by cybmem.

    python benchmarks/exit_aborts.py              # 120 processes per way, 3 busy loops beside them
    python benchmarks/exit_aborts.py --runs 40 --busy 0 --json

The CI run of stop 33 failed on one line from an exporter that had finished its work:
"terminate called without an active exception" (SIGABRT at interpreter exit: a native thread
still joinable while the process is torn down; apache/arrow#34314, #50482). Each child here reads
one part file of an exported dataset three times, then exits; the machine is kept busy by
``--busy`` spinning processes, since the race shows under load (as in CI, where xdist runs the
suite on every core). Ways:

- ``handle+threads``: ``pq.read_table(open(f, "rb"))``, how the exporter read parts before;
- ``buffer+threads``: ``pq.read_table(pa.BufferReader(bytes))``, pyarrow's default threads;
- ``handle, no threads``: ``pq.read_table(fh, use_threads=False, pre_buffer=False)``;
- ``read_part``: :func:`cybmem.exchange.parquet_dataset.read_part` (a memory map, no threads),
  with and without the dataset's schema.

Figures: counts of aborted children out of ``--runs``; the ways share the same run and load.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

_CHILD = r"""
import sys
sys.path.insert(0, sys.argv[1])
import pyarrow as pa, pyarrow.parquet as pq
way, path = sys.argv[2], sys.argv[3]
for _ in range(3):
    if way == "handle+threads":
        with open(path, "rb") as fh:
            pq.read_table(fh)
    elif way == "buffer+threads":
        with open(path, "rb") as fh:
            pq.read_table(pa.BufferReader(fh.read()))
    elif way == "handle, no threads":
        with open(path, "rb") as fh:
            pq.read_table(fh, use_threads=False, pre_buffer=False)
    else:
        from cybmem.exchange.parquet_dataset import RECORDS_SCHEMA, read_part
        read_part(path, **({"schema": RECORDS_SCHEMA, "columns": ["runId", "task"]} if way.endswith("schema") else {}))
"""

WAYS = ["handle+threads", "buffer+threads", "handle, no threads", "read_part", "read_part with schema"]


def _part(tmp: Path) -> Path:
    """A part file of the bundled fixtures' export."""
    from cybmem.exchange.export import all_stores, export_parquet

    export_parquet(all_stores(REPO / "data-fixtures" / "memory"), tmp / "fleet", machine="bench", note=False)
    return max((tmp / "fleet" / "records").rglob("*.parquet"), key=lambda p: p.stat().st_size)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=120, help="children per way (default 120)")
    ap.add_argument("--busy", type=int, default=3, help="spinning processes beside them (default 3)")
    ap.add_argument("--json", action="store_true", help="print the counts as JSON")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        part = _part(Path(tmp))
        spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
        counts: dict[str, int] = {}
        try:
            for way in WAYS:
                t0 = time.perf_counter()
                aborted = 0
                for _ in range(args.runs):
                    p = subprocess.run([sys.executable, "-c", _CHILD, str(REPO), way, str(part)],
                                       capture_output=True, timeout=60)
                    aborted += p.returncode != 0
                counts[way] = aborted
                if not args.json:
                    print(f"{way:24} {aborted:4d} of {args.runs} aborted   ({time.perf_counter() - t0:5.1f} s)", flush=True)
        finally:
            for p in spin:
                p.kill()
                p.wait()
    if args.json:
        print(json.dumps({"runs": args.runs, "busy": args.busy, "aborted": counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
