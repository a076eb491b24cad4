"""The repair of ``cybmem doctor --repair``: rebuild index.json and the Arrow cache from records/
and the ledger, remove the temp files no live writer owns (:func:`cybmem._io.temp_owned`) once
a check found them old enough, finish a killed redaction from its journal
(cybmem.operations.redaction) and keep one vector per run and model in embeddings.jsonl
(:func:`cybmem.store.embeddings.superseded`). It never otherwise touches records/ or issues.jsonl.
Each step is tried on its own; one that fails is noted and the next goes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import _io
from ..errors import CybmemError
from ..store import cache as _cache
from ..store.embeddings import drop_lines, read_rows, superseded
from ..store.memory_store import MemoryStore
from .doctor_report import Finding

__all__ = ["Repairs", "repair_store"]


def _drop_superseded_vectors(store: MemoryStore) -> int:
    """Under the project lock: embeddings.jsonl without the vectors a later one replaced (their count)."""
    with store.lock():
        rows, _problems = read_rows(store.embeddings_path)
        return drop_lines(store.embeddings_path, superseded(rows))


def _refresh_cache(store: MemoryStore) -> None:
    """Throw the cache away and build it again from the files; raises when it cannot be written."""
    from ..store import refresh

    _cache.discard(_cache.cache_dir(store.dir))
    refresh.read(store, strict=True)


@dataclass
class Repairs:
    """What a repair did, and what it tried and could not do (each step is tried on its own)."""

    done: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def attempt(self, what: str, step) -> None:
        """Run ``step`` (which returns the line saying what it did, or None: nothing to do); a
        failure is noted as one line naming ``what`` and why, and the next step goes on."""
        try:
            line = step()
        except (CybmemError, OSError) as exc:
            why = str(exc) if isinstance(exc, CybmemError) else (
                f"{exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else ""))
            self.failed.append(f"{what}: {' '.join(why.split())}")
            return
        if line:
            self.done.append(line)


def repair_store(root: Path, findings: list[Finding], stores: dict[str, MemoryStore]) -> Repairs:
    out = Repairs()
    for f in findings:
        if f.check == "temp" and f.severity == "repairable":
            # not when a live writer owns it (_io.temp_owned): it took it meanwhile
            out.attempt(f"removing {f.path}", lambda path=Path(f.path): f"removed {path}" if _io.remove_temp(path) else None)
    for slug, store in sorted(stores.items()):
        if store.symlinked_dirs():
            continue  # nothing is written through a link (an error finding says so)
        if any(f.check == "paths" and f.path == str(store.dir) and f.project == slug for f in findings):
            continue  # a project that could not be read at all (its finding says why): nothing to rebuild from
        if any(f.check == "redact" and f.severity == "repairable" and f.project == slug for f in findings):
            out.attempt(f"finishing the interrupted redaction in {slug}", lambda store=store: _finish_redaction(store))
        if any(f.check == "embeddings" and f.severity == "repairable" and f.project == slug for f in findings):
            out.attempt(f"dropping replaced vectors from {store.embeddings_path}", lambda store=store:
                        f"dropped {_drop_superseded_vectors(store)} replaced vector(s) from {store.embeddings_path}")
        out.attempt(f"rebuilding {store.index_path}", lambda store=store:
                    f"rebuilt {store.index_path} from {store.rebuild_index()} records")
        if not _cache.disabled(store.root):
            out.attempt(f"rebuilding {store.dir / '.cache'}", lambda store=store:
                        _refresh_cache(store) or f"rebuilt {store.dir / '.cache'}")
    return out


def _finish_redaction(store: MemoryStore) -> str | None:
    from .redaction import complete_pending

    finished = complete_pending(store)  # its own rebuild of the derived files included
    if finished is None:
        return None
    left = finished.remaining + finished.unreachable
    return (f"finished the interrupted redaction of {len(finished.targets)} run(s) in {store.slug} "
            f"({store.dir / 'redact-pending.json'})" + (f"; left to do: {'; '.join(left)}" if left else ""))
