"""The exports a project knows of: its ``exports.json``, so that ``cybmem redact`` reaches them.

Every export to a path is noted before it is written (:func:`note_export`), so an export killed
halfway is known too; :func:`known_exports` lists them, :func:`redo_command` writes one again.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Iterable

import orjson

from .. import _io
from ..errors import StoreError
from ..store.memory_store import MemoryStore

__all__ = ["EXPORTS_FILE", "known_exports", "note_export", "redo_command"]

#: In each project directory: the exports written from it, for `cybmem redact` to reach.
EXPORTS_FILE = "exports.json"
_MAX_EXPORTS_BYTES = 16 * 1024 * 1024
_FORMATS = ("ndjson", "csv", "parquet", "sqlite", "prov")


def known_exports(store: MemoryStore) -> list[dict]:
    """The exports written from a project to a path (its ``exports.json``), oldest first.

    Each is ``{"format", "out" (absolute), "at" (epoch ms of the latest)}`` with ``machine`` and
    ``tables`` (parquet, sqlite), ``table`` (ndjson, csv), ``all`` (written with ``--all``),
    ``chain`` and ``provn`` (prov). Exports to stdout or a stream are not noted.

    Raises:
        StoreError: the file is damaged (fix or delete it; exports it named are then out of reach).
    """
    path = store.dir / EXPORTS_FILE
    try:
        doc = _io.loads(_io.read_file(path, limit=_MAX_EXPORTS_BYTES))
    except FileNotFoundError:
        return []
    except ValueError:
        doc = None
    entries = doc.get("exports") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise StoreError(f"{path} is damaged (not the list of exports cybmem writes); fix or delete it: "
                         "`cybmem redact` cannot reach the exports it named")
    return [e for e in entries if isinstance(e, dict) and e.get("format") in _FORMATS and isinstance(e.get("out"), str)]


def note_export(stores: Iterable[MemoryStore], entry: dict, warnings: list[str]) -> None:
    """Note an export in each project's ``exports.json`` (one entry per format, path and machine,
    its time the latest), before it is written: an export killed halfway is known too. Entries
    whose path is gone are dropped. A project that cannot be written (a read-only root) gets a
    warning instead; the export goes on."""
    entry = {**entry, "out": os.path.abspath(entry["out"]), "at": int(time.time() * 1000)}
    key = (entry["format"], entry["out"], entry.get("machine"))
    for store in stores:
        path = store.dir / EXPORTS_FILE
        try:
            with store.lock():  # only where cybmem may write (MemoryStore.check_writable)
                kept = [e for e in known_exports(store)
                        if (e["format"], e["out"], e.get("machine")) != key and os.path.lexists(e["out"])]
                _io.atomic_write(path, orjson.dumps({"version": 1, "exports": kept + [entry]},
                                                    option=orjson.OPT_INDENT_2) + b"\n")
        except OSError as exc:
            warnings.append(f"{store.slug}: could not note this export in {path} ({exc.strerror or exc}); "
                            "`cybmem redact` will not reach it")


def redo_command(store: MemoryStore, entry: dict) -> str:
    """The command that writes a noted export again (replacing the file)."""
    args = ["cybmem", "export", entry["format"], "--memory-dir", os.path.abspath(store.root)]
    args += ["--all"] if entry.get("all") else ["--project", store.slug]
    if entry.get("table"):
        args += ["--table", str(entry["table"])]
    if entry.get("chain"):
        args += ["--chain", str(entry["chain"])]
    if entry.get("provn"):
        args.append("--provn")
    args += ["--out", entry["out"], "--force"]
    return " ".join(shlex.quote(a) for a in args)
