"""Tuning a store and saving what passes: ``cybmem tune [--save]`` (:func:`tune_and_save`), and a
store that re-tunes itself (``CYBERINE_MEMORY_RETUNE``): whether its history has grown enough
since the last tuning, the tuning itself run on the store's own judgments and saved only when it
passes every check (:func:`auto_tune`, what ``cybmem tune --auto`` and ``rebuild`` run), and the
detached ``cybmem tune --auto`` a write starts (:func:`spawn_auto_tune`). One automatic tuning of a
store at a time: ``.retune.lock``, held with the project's lock helper (:func:`cybmem._io.locked`).
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import _io
from ..errors import CybmemError
from ..retrieval import tuning
from ..retrieval.weights import project_weights_file, read_evidence, save_project_weights
from ..settings import Settings
from ..store.memory_store import MemoryStore

__all__ = ["Tuning", "tune_and_save", "RETUNE_MIN_RECORDS", "retune_due", "auto_tune", "spawn_auto_tune"]

#: Fewer runs than this and a store is not re-tuned on its own (CYBERINE_MEMORY_RETUNE).
RETUNE_MIN_RECORDS = 50
_RETUNE_LOCK = ".retune.lock"
_RETUNE_STATE = ".retune.json"


@dataclass
class Tuning:
    """A tuning (:func:`cybmem.retrieval.tuning.tune`) and what saving it did."""

    result: tuning.GridResult
    target: Path  # the project's weights file, where --save writes (cybmem.retrieval.weights.project_weights_file)
    saved: Path | None = None  # the weights.json written
    overridden: list[str] = field(default_factory=list)  # what still overrides it for production
    refused: str | None = None  # why --save saved nothing (None: saved, or not asked to)

    def to_dict(self) -> dict[str, Any]:
        """What ``cybmem tune --json`` prints."""
        return {**self.result.to_dict(), "saved": str(self.saved) if self.saved else None,
                "overriddenBy": self.overridden, "notSaved": self.refused}


def tune_and_save(store: MemoryStore, settings: Settings, *, save: bool = False, force: bool = False,
                  **kwargs: Any) -> Tuning:
    """Tune the weights of ``store`` (:func:`cybmem.retrieval.tuning.tune` with ``kwargs``) and, with
    ``save``, write the weights tuned on the earlier judgments and checked on the later ones to its
    weights.json, with the evidence, when they beat the current ones there (``force``: whatever the
    check says, and the best on all judgments when there were too few to check).

    Raises:
        ConflictError: weights.json changed while the tuning ran (nothing is saved).
        StoreError: ``save`` asked in a project cybmem may not write (a symlinked project dir).
    """
    if save:
        store.check_writable()  # before the tuning, not after it: weights.json is never saved through a link
    result = tuning.tune(store, settings=settings, **kwargs)
    done = Tuning(result, project_weights_file(store), refused=result.refusal if save else None)
    to_save = result.saves if result.saves is not None else (result.best if force else None)
    if save and to_save is not None and to_save != result.current and (done.refused is None or force):
        done.saved, done.overridden = save_project_weights(store, to_save, settings, expect=result.state,
                                                           evidence=tuning.evidence_of(result, forced=force))
        done.refused = None
    return done


def retune_due(store: MemoryStore, settings: Settings, records: int | None = None) -> bool:
    """Has the history grown by CYBERINE_MEMORY_RETUNE percent since the last tuning (or never been
    tuned and reached :data:`RETUNE_MIN_RECORDS` runs)? False when the setting is 0."""
    if settings.retune <= 0:
        return False
    n = len(store.listing()) if records is None else records
    last = _last_tuned_at(store)
    if last <= 0:
        return n >= RETUNE_MIN_RECORDS
    return n >= max(RETUNE_MIN_RECORDS, last * (100 + settings.retune) / 100)


def _last_tuned_at(store: MemoryStore) -> int:
    """Runs the history had at the last tuning, saved or not (weights.json's evidence, .retune.json)."""
    ev = read_evidence(project_weights_file(store)) or {}
    seen = [ev.get("records")]
    try:
        seen.append(json.loads((store.dir / _RETUNE_STATE).read_text()).get("records"))
    except (OSError, ValueError, AttributeError):
        pass
    return max([x for x in seen if isinstance(x, int)], default=0)


def auto_tune(store: MemoryStore, settings: Settings, *, progress: bool | None = False) -> str:
    """Tune on the store's own judgments and save only what passes every check (what
    CYBERINE_MEMORY_RETUNE runs): one line saying what happened. Never raises for a tuning that
    cannot be done; a second auto-tuning of the same store while one runs returns at once."""
    lock = store.dir / _RETUNE_LOCK
    try:
        store.check_writable()  # its lock, .retune.json and weights.json: never through a link
    except CybmemError as exc:
        return f"not re-tuned: {' '.join(str(exc).split()).rstrip('.')}"
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(_io.locked(lock, wait=False))
        except BlockingIOError:
            return f"not re-tuned: another tuning of project {store.slug} is running"
        except OSError as exc:
            return f"not re-tuned: {lock} cannot be opened ({exc.strerror})"
        return _tune_and_save(store, settings, progress)


def _tune_and_save(store: MemoryStore, settings: Settings, progress: bool | None) -> str:
    """:func:`auto_tune`'s work, under its lock."""
    try:
        result = tuning.tune(store, settings=settings, progress=progress)
    except Exception as exc:  # noqa: BLE001 - a detached re-tune has no one to raise to: it says why in .retune.json
        why = ' '.join(str(exc).split()) if isinstance(exc, CybmemError) else f"unexpected {type(exc).__name__}: {exc}"
        line = f"not re-tuned: {why}"
        try:
            _io.atomic_write(store.dir / _RETUNE_STATE, json.dumps(
                {"records": _last_tuned_at(store), "at": int(time.time() * 1000), "result": line}).encode())
        except OSError:
            pass
        return line

    # The next check waits for the history to grow again, whatever this one decides.
    _io.atomic_write(store.dir / _RETUNE_STATE, json.dumps({"records": result.records, "at": int(time.time() * 1000)}).encode())
    if result.refusal is not None or result.saves is None or result.saves == result.current:
        why = result.refusal or "the checked weights are the current ones"
        return f"kept the weights of project {store.slug}: {why}"
    try:
        path, _ = save_project_weights(store, result.saves, settings, evidence=tuning.evidence_of(result), expect=result.state)
    except CybmemError as exc:
        return f"not re-tuned: {' '.join(str(exc).split())}"
    v = result.validation
    return (f"re-tuned project {store.slug} on {result.judgments} judgments ({result.records} runs): "
            f"{result.label} on the later {v.later} {v.current_later:.4f} -> {v.tuned_later:.4f}; saved to {path}")


def spawn_auto_tune(store: MemoryStore, settings: Settings) -> bool:
    """Start ``cybmem tune --auto`` for the store in a detached process (the write path's hook for
    CYBERINE_MEMORY_RETUNE: the write returns at once, dispatch only reads what it saves). True
    when one was started; False when one is already running or it could not start."""
    import subprocess
    import sys

    if _io.is_locked(store.dir / _RETUNE_LOCK):  # held: a tuning of this store is running
        return False
    try:
        # sh starts the tuning in the background and ends at once: the tuning is nobody's child to
        # wait for (no zombie in a long-lived caller), in a session of its own.
        subprocess.run(["sh", "-c", 'exec "$@" </dev/null >/dev/null 2>&1 &', "sh", sys.executable, "-m", "cybmem.cli",
                        "tune", "--auto", "--memory-dir", str(settings.memory_dir), "--project", store.slug],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       start_new_session=True, timeout=10, check=False)
        return True
    except (OSError, subprocess.SubprocessError):
        return False
