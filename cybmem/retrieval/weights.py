"""Retrieval weights: the defaults, where production reads them from, and saving them (a project's
``weights.json``, guarded against a tuning that saved meanwhile: :func:`save_project_weights`).

Precedence, lowest first: the defaults (:class:`Weights`), ``<memory root>/weights.json`` (all
projects), ``<project>/weights.json`` (what ``cybmem tune --save`` and the tuning widget
write), the file named by ``CYBERINE_MEMORY_WEIGHTS``, then the ``CYBERINE_MEMORY_W_*`` and
``CYBERINE_MEMORY_HALF_LIFE_DAYS`` variables. :func:`load_weights` says which source set each
weight; the dispatch path asks it to skip a broken source (with a warning) rather than fail.

The default w_vec is 0: without embeddings there is no vector axis. When the project has vectors
for the configured embedding model and no file or variable sets w_vec, :data:`DEFAULT_W_VEC`
applies (source ``"default (embeddings)"``), a value measured on the corpus qrels.
"""

from __future__ import annotations

import math
import os
import stat as _stat
import threading
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import orjson

from .. import _io
from ..errors import ConflictError, StoreError, ValidationError
from ..settings import Settings, WeightSettings

if TYPE_CHECKING:  # pragma: no cover
    from ..store.memory_store import MemoryStore

__all__ = ["WEIGHTS_FILE", "DEFAULT_W_VEC", "Weights", "LoadedWeights", "project_weights_file", "weight_files",
           "load_weights", "weights_for",
           "save_weights", "save_project_weights", "weights_state", "read_evidence", "tuned_note", "AXES", "ISSUE_REC_SHARE",
           "RANGES", "check_range"]

WEIGHTS_FILE = "weights.json"
_MAX_BYTES = 1 << 20
# w_vec when the store has vectors for the configured model and nothing sets it: the smallest
# step, which costs little on the corpus qrels (they link runs by ticket number, a lexical signal
# the keyword axis already has) and still lifts a run that a query only paraphrases into the top 3
# (tests/retrieval/test_vectors.py), which is what embeddings are for. Figures (benchmarks/bench_embed.py):
# benchmarks/RESULTS.md, "Figures the module docstrings quoted".
DEFAULT_W_VEC = 0.05


#: The share of an open issue's score that recency (of its last activity) has in the block's issue
#: section; its keyword and lineage parts share the rest as the runs' weights do. Whether an open
#: issue is being worked on shows in its last activity, which a run's age does not say: ranked with
#: the runs' mix, the issue a task went on to carry was named in 56% of the judged blocks of the
#: pytest, mypy and sphinx histories and the 1k slice; with recency at 0.5-0.9 of the score, 63-64%
#: on all four together, each history gaining or within one query (benchmarks/bench_floor.py).
ISSUE_REC_SHARE = 0.6


@dataclass(frozen=True)
class Weights:
    """Axis weights, the recency time constant and the block's floors: the ONE place defaults live.

    The axis weights and the time constant were chosen over the pytest, mypy and sphinx histories
    and the 1k slice together (``python benchmarks/bench_fit.py``; figures in benchmarks/RESULTS.md):
    the weighting whose worst ratio to the corpora's BM25 + recency baseline is highest. Chosen that
    way on all histories but one, it still beat the baseline on the one left out, for each of the
    four. The rule's own point has w_lin 0; 0.05 costs little MRR on any history
    and keeps the lineage axis (same chat session, ancestors) as a tie-breaker, which these
    corpora, without chats, cannot measure. A project tunes its own
    (``cybmem tune --save``, :mod:`cybmem.retrieval.tuning`).

    ``floor`` and ``floor_vec`` decide which runs may enter the MEMORY block at all
    (:mod:`cybmem.retrieval.search`, "The floor"): a task whose best keyword match in the project is below
    ``floor`` (and whose best cosine is below ``floor_vec`` when vectors are on) gets no run. 0
    turns a floor off. Both chosen with ``benchmarks/bench_floor.py`` (tasks of the other
    histories dispatched into each store, beside the store's own judged tasks; figures in
    benchmarks/RESULTS.md, "Figures the module docstrings quoted"). ``cybmem tune --save``
    learns ``floor`` from the project's own judgments.
    """

    w_kw: float = 0.5
    w_rec: float = 0.35
    w_lin: float = 0.05
    w_vec: float = 0.0
    half_life_days: float = 30.0
    floor: float = 0.4
    floor_vec: float = 0.6

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValidationError(f"weight {f.name} must be a number, got {v!r}")
            object.__setattr__(self, f.name, check_range(f.name, v))
        if not any(getattr(self, a) > 0 for a in AXES):
            raise ValidationError("the weights are all 0 (w_kw, w_rec, w_lin, w_vec), so every run would score 0; "
                                  "give at least one of them a positive value")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, base: Weights | None = None) -> Weights:
        """Weights from a mapping of some of the fields (others from ``base`` or defaults)."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise ValidationError(f"unknown weight key(s) {', '.join(unknown)}; allowed: {', '.join(names)}")
        merged = (base or cls()).to_dict()
        merged.update(d)
        return cls(**merged)

    def to_dict(self) -> dict[str, float]:
        d = self.__dict__.get("_as_dict")  # kept: explain() asks once per hit
        if d is None:
            d = {name: getattr(self, name) for name in _NAMES}
            object.__setattr__(self, "_as_dict", d)
        return dict(d)

    def for_issues(self) -> Weights:
        """The weights open issues are ranked by: recency :data:`ISSUE_REC_SHARE` of the sum of
        w_kw, w_lin and w_rec, keyword and lineage the rest in their own ratio. Weights that turn
        recency off (w_rec 0) or leave issues no keyword or lineage axis are used as they are."""
        rest = self.w_kw + self.w_lin
        if self.w_rec <= 0 or rest <= 0:
            return self
        total = rest + self.w_rec
        keep = (1.0 - ISSUE_REC_SHARE) * total / rest
        return replace(self, w_kw=self.w_kw * keep, w_lin=self.w_lin * keep, w_rec=ISSUE_REC_SHARE * total)


_NAMES = tuple(f.name for f in fields(Weights))  # to_dict's keys (dataclasses.fields() costs ~3 us a call)

#: The score axes' weights (at least one must be positive).
AXES = ("w_kw", "w_rec", "w_lin", "w_vec")

#: The range each field may take, both ends included (half_life_days: above 0). Past them a score
#: overflows or loses every digit (weights of 1e300 made every score NaN and the block empty), and no
#: tuning ever asks for more: the grid searches 0 to 1 and half-lives of 1 to 365 days.
RANGES: dict[str, tuple[float, float]] = {
    "w_kw": (0.0, 100.0), "w_rec": (0.0, 100.0), "w_lin": (0.0, 100.0), "w_vec": (0.0, 100.0),
    "half_life_days": (0.01, 36500.0), "floor": (0.0, 100.0), "floor_vec": (0.0, 1.0),
}
_WHY = {"half_life_days": " days", "floor_vec": " (a cosine)"}

#: The least positive weight an axis may have: scores are float32, where an axis weighted 1e-300
#: is 0 (every score 0, the ranking left to tie-breaks) and one of 1e-40 keeps no digits. An axis is
#: off (0) or at least this, a millionth of the defaults' scale.
MIN_AXIS_WEIGHT = 1e-6


def check_range(name: str, value: float) -> float:
    """``value`` as a float when it is finite and within :data:`RANGES` for ``name`` (an axis'
    weight: 0, or from :data:`MIN_AXIS_WEIGHT` on).

    Raises:
        ValidationError: naming the field, the value and the range.
    """
    lo, hi = RANGES[name]
    v = float(value)
    shown = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    if not (math.isfinite(v) and lo <= v <= hi):
        raise ValidationError(f"weight {name} must be a finite number from {lo:g} to {hi:g}{_WHY.get(name, '')}, "
                              f"got {shown!r}")
    if name in AXES and 0 < v < MIN_AXIS_WEIGHT:
        raise ValidationError(f"weight {name} must be 0 (the axis off) or from {MIN_AXIS_WEIGHT:g} to {hi:g}, got {shown!r}: "
                              "scores are float32, where a weight that small is 0")
    return v




@dataclass(frozen=True)
class LoadedWeights:
    """Weights as production reads them, where each came from, and the sources that were skipped."""

    weights: Weights
    sources: dict[str, str]  # weight name -> "default", a file path or an environment variable
    problems: list[str] = field(default_factory=list)  # one line per skipped source (lenient loads)
    tuned: dict[str, Any] | None = None  # the evidence of the tuning that wrote a file these come from

    def tuned_note(self) -> str:
        """One line naming the tuning these weights come from ("" when none did)."""
        return tuned_note(self.tuned)


def tuned_note(evidence: Mapping[str, Any] | None) -> str:
    """``tuned 2026-12-01 on 412 judgments (raised 380, resolved 32): MRR@10 0.3120 -> 0.3410 on the later 206``."""
    if not evidence:
        return ""
    from datetime import datetime, timezone

    try:
        day = datetime.fromtimestamp(int(evidence["at"]) / 1000, tz=timezone.utc).strftime("%Y-%m-%d")
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(evidence.get("kinds", {}).items()))
        later = evidence["later"]
        return (f"tuned {day} on {evidence['judgments']} {evidence.get('source', 'derived')} judgments"
                + (f" ({kinds})" if kinds else "")
                + f": {evidence['label']} {later['before']:.4f} -> {later['after']:.4f} on the later {later['judgments']}")
    except (KeyError, TypeError, ValueError):
        return "tuned (evidence unreadable)"


def project_weights_file(store: "MemoryStore") -> Path:
    """A project's own weights file, ``<project>/weights.json``: what ``cybmem tune --save``, an
    automatic re-tune and the tuning widget write (the one place that knows where it lies)."""
    return store.dir / WEIGHTS_FILE


def weight_files(settings: "Settings", store: "MemoryStore | None" = None) -> list[Path]:
    """Where weights are read from, lowest precedence first (see the module docstring)."""
    files = [settings.memory_dir / WEIGHTS_FILE]
    if store is not None:
        files.append(project_weights_file(store))
    if settings.weights.file is not None:
        files.append(settings.weights.file)
    return files


#: Keys a weights file may carry besides the weights: when it was saved, and the tuning's evidence.
_META_KEYS = ("savedAt", "tuned")


def read_evidence(p: Path) -> dict[str, Any] | None:
    """The tuning evidence a weights file carries (None: no file, or no evidence)."""
    try:
        data = _io.loads(_io.read_file(p, limit=_MAX_BYTES))
    except (OSError, ValueError):
        return None
    ev = data.get("tuned") if isinstance(data, dict) else None
    return ev if isinstance(ev, dict) else None


def _file_values(p: Path) -> dict[str, Any] | None:
    """The weights a file sets (None when it does not exist); ValidationError when it is broken."""
    try:
        raw = _io.read_file(p, limit=_MAX_BYTES)
    except FileNotFoundError:
        return None
    except StoreError as exc:
        if p.is_dir():
            raise ValidationError(f"weights file {p} is a directory; remove it to fall back to the defaults") from None
        raise ValidationError(f"weights file {p} cannot be read ({exc}); fix it or delete it") from None
    try:
        data = _io.loads(raw)
    except ValueError as exc:
        raise ValidationError(f"weights file {p} is not valid JSON ({exc}); fix it or delete it "
                              "to fall back to the defaults") from None
    if not isinstance(data, dict):
        raise ValidationError(f"weights file {p} must hold a JSON object like "
                              '{"w_kw": 0.6, "w_rec": 0.25}; fix it or delete it')
    data = {k: v for k, v in data.items() if k not in _META_KEYS}
    try:
        Weights.from_dict(data)
    except ValidationError as exc:
        raise ValidationError(f"weights file {p}: {exc}; fix it or delete it") from None
    return data


def _variable_values(variables: "WeightSettings | None") -> tuple[dict[str, float], dict[str, str], list[str]]:
    """Weights set by the weight variables (:class:`~cybmem.settings.WeightSettings`): values, the
    variable of each, and why a variable was not taken."""
    values: dict[str, float] = {}
    names: dict[str, str] = {}
    bad: list[str] = []
    for key, var, raw, val in variables.variables if variables is not None else ():
        if val is None:
            bad.append(f"{var}={raw!r} is not a usable weight; set it to a finite number >= 0 (e.g. {var}=0.3) or unset it")
            continue
        try:
            Weights.from_dict({key: val})
        except ValidationError as exc:  # out of its range (RANGES): the message names it
            bad.append(f"{var}={raw!r} is not a usable weight: {exc}; set it within that range or unset it")
            continue
        values[key] = val
        names[key] = var
    return values, names, bad


#: :func:`load_weights`' results kept by what they were read from: (files, variables, lenient,
#: vectors) -> (each file's stat, the result). A search reads its weights on every call; a long-lived
#: process (``cybmem mcp``) then stats the files instead of reading and parsing them.
_LOADED: dict[tuple, tuple[tuple, LoadedWeights]] = {}
_LOADED_LOCK = threading.Lock()


def _files_state(files: Sequence[str]) -> tuple | None:
    """Each file's (inode, size, mtime ns, device), or None for one that does not exist; None in
    all when a file is no regular file or was modified too close to now to be trusted (then it is
    read every time)."""
    out = []
    racy = time.time_ns() - _io.RACY_NS  # modified within a clock tick of now: may change unseen, not kept
    for f in files:
        try:
            st = os.lstat(f)
        except FileNotFoundError:
            out.append(None)
            continue
        except OSError:
            return None
        if not _stat.S_ISREG(st.st_mode) or st.st_mtime_ns >= racy:
            return None
        out.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_dev))
    return tuple(out)


def _copy(loaded: LoadedWeights) -> LoadedWeights:
    """A result of :func:`load_weights` a caller may change without changing the kept one."""
    return replace(loaded, sources=dict(loaded.sources), problems=list(loaded.problems),
                   tuned=None if loaded.tuned is None else dict(loaded.tuned))


def load_weights(files: Sequence[Path | str] = (), variables: "WeightSettings | None" = None, *,
                 lenient: bool = False, vectors: bool = False) -> LoadedWeights:
    """Defaults, then each existing JSON file in order, then CYBERINE_MEMORY_W_* variables.

    A result is kept while every file has the inode, size and mtime it had when it was read (and
    was not modified within 2 s of that read): then the files are stat()ed, not read again.

    Files may carry "savedAt" and "tuned" (the evidence of ``cybmem tune --save``) keys (written by
    :func:`save_weights`); they set no weight. Missing files are skipped.

    Args:
        files: weight files, lowest precedence first (:func:`weight_files`).
        variables: the weight variables as the settings read them (``settings.weights``; default: none).
        lenient: skip a broken file or variable and say why in ``problems`` (the dispatch path);
            otherwise raise.
        vectors: the store has vectors for the configured embedding model; then a w_vec that no
            file or variable sets is :data:`DEFAULT_W_VEC` (source ``"default (embeddings)"``).

    Raises:
        ValidationError: a malformed file or variable, named, with the fix (unless ``lenient``).
    """
    key = (tuple(str(f) for f in files), variables.variables if variables is not None else (), lenient, vectors)
    state = _files_state(key[0])
    if state is not None:
        kept = _LOADED.get(key)
        if kept is not None and kept[0] == state:
            return _copy(kept[1])
    loaded = _load_weights(files, variables, lenient=lenient, vectors=vectors)
    # Kept only when the files are as they were before the read (none changed during it).
    if state is not None and _files_state(key[0]) == state:
        with _LOADED_LOCK:
            if len(_LOADED) >= 64:
                _LOADED.clear()
            _LOADED[key] = (state, _copy(loaded))
    return loaded


def _load_weights(files: Sequence[Path | str], variables: "WeightSettings | None", *, lenient: bool,
                  vectors: bool) -> LoadedWeights:
    """:func:`load_weights`, read from the files."""
    merged: dict[str, Any] = Weights().to_dict()
    sources = {name: "default" for name in merged}
    if vectors:
        merged["w_vec"] = DEFAULT_W_VEC
        sources["w_vec"] = "default (embeddings)"
    problems: list[str] = []
    tuned, tuned_at = None, None
    for f in files:
        p = Path(f)
        try:
            data = _file_values(p)
        except ValidationError as exc:
            if not lenient:
                raise
            problems.append(str(exc))
            continue
        if data:
            merged.update(data)
            sources.update({k: str(p) for k in data})
            if any(k in data for k in AXES):
                tuned, tuned_at = read_evidence(p), str(p)
    values, names, bad = _variable_values(variables)
    if bad and not lenient:
        raise ValidationError(bad[0])
    problems += bad
    merged.update(values)
    sources.update(names)
    try:
        weights = Weights(**merged)
    except ValidationError as exc:  # each source was valid alone; together they zero half_life or similar
        if not lenient:
            raise
        problems.append(f"{exc}; using the default weights")
        return LoadedWeights(Weights(), {name: "default" for name in merged}, problems)
    if not any(sources[a] == tuned_at for a in AXES):
        tuned = None  # a later source (a variable) overrode every weight the tuned file set
    return LoadedWeights(weights, sources, problems, tuned)


def weights_for(settings: "Settings", store: "MemoryStore | None" = None, *, lenient: bool = False,
                vectors: bool = False) -> LoadedWeights:
    """The weights production uses for this project (defaults < files < environment).

    ``vectors``: the project has vectors for the configured embedding model (see :func:`load_weights`).
    """
    return load_weights(weight_files(settings, store), settings.weights, lenient=lenient, vectors=vectors)


def save_weights(weights: Weights, path: Path | str, *, evidence: Mapping[str, Any] | None = None) -> Path:
    """Write weights as JSON (sorted keys + "savedAt" epoch ms, and the tuning's ``evidence`` under
    "tuned" when given), atomically; returns the path.

    Raises:
        StoreError: the file cannot be written (a directory in its place, a read-only dir).
    """
    p = Path(path)
    payload: dict[str, Any] = dict(weights.to_dict(), savedAt=int(time.time() * 1000))
    if evidence:
        payload["tuned"] = dict(evidence)
    data = orjson.dumps(payload, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
    if p.is_dir():
        raise StoreError(f"cannot save weights: {p} is a directory; remove it and save again")
    try:
        _io.ensure_dir(p.parent)
        _io.atomic_write(p, data)
    except OSError as exc:
        if isinstance(exc, StoreError):
            raise
        raise StoreError(f"cannot save weights to {p}: {exc.strerror or exc}") from None
    return p


def weights_state(store: "MemoryStore") -> tuple[int, int, int] | None:
    """What ``<project>/weights.json`` is now (inode, size, mtime ns; None: no file), to tell
    whether another tuning saved it since (:func:`save_project_weights`)."""
    try:
        st = project_weights_file(store).stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def save_project_weights(store: "MemoryStore", weights: Weights, settings: Settings, *,
                         evidence: Mapping[str, Any] | None = None,
                         expect: tuple[int, int, int] | None | bool = False) -> tuple[Path, list[str]]:
    """Write ``<project dir>/weights.json`` (what ``cybmem search`` / ``inject`` read for the project).

    Args:
        evidence: the tuning's evidence (:func:`cybmem.retrieval.tuning.evidence_of`), kept under "tuned".
        expect: what weights.json was when the tuning began (:func:`weights_state`; None: no file);
            when it changed since (another ``tune --save`` finished meanwhile) nothing is written
            and :class:`~cybmem.errors.ConflictError` says so. False: write whatever is there.

    Returns:
        The path written, and what still overrides it for production (a
        CYBERINE_MEMORY_WEIGHTS file, CYBERINE_MEMORY_W_* variables), empty when nothing does.
    """
    path = project_weights_file(store)
    store.check_writable()  # never through a symlinked project dir (nor its lock)
    with _io.locked(store.dir / ".weights.lock"):
        if expect is not False and weights_state(store) != expect:
            ev = read_evidence(path)
            when = f" (saved {tuned_note(ev)})" if ev else ""
            raise ConflictError(f"{path} changed while this tuning ran{when}, so these weights were not saved; "
                                "run `cybmem tune --save` again to tune on top of them")
        save_weights(weights, path, evidence=evidence)
    over = [str(p) for p in weight_files(settings, store)[2:] if p.is_file()]
    over += sorted(settings.weights.names)
    return path, over
