"""The vector index's cache: embeddings.jsonl as row-aligned Arrow blocks under ``<project>/.cache/``.

:func:`load_index` gives a model's vectors aligned with a snapshot's rows. Vectors are keyed by
model and dimension (by default the model's newest: the dimension of its last line); within a key
the last line of a run wins. The cache (``vec-<key>.json`` plus Arrow IPC blocks) refreshes
incrementally as the records cache does: only lines appended since are parsed, a vector for an
older row rewrites its block, more than :data:`MAX_BLOCKS` blocks are merged, a line for a run
with no record yet waits; a rebuilt snapshot, a replaced file or a new dimension starts it over.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from .. import _io
from ..store import cache as _cache
from .._io import atomic_write, ensure_dir, locked
from ..store.embeddings import MAX_EMBEDDINGS_BYTES, row_problem
from ..errors import StoreError
from ..store.snapshot import Snapshot
from .vectors import WORD_BITS, VectorBlock, VectorIndex, sign_codes

__all__ = ["MAX_BLOCKS", "load_index"]


MAX_BLOCKS = 8
_VERSION = 2  # 2: keyed by (model, newest dimension), the last line of a run wins


# --- parsing embeddings.jsonl ----------------------------------------------------------------


@dataclass
class _Parsed:
    ids: list[str]
    vectors: list[list[float]]
    consumed: int  # bytes of whole lines read
    lines: int
    newest: int | None  # the dimension of the model's last usable line (None: no line of it)
    problems: list[str]

    def of(self, dims: int) -> tuple[list[str], list[list[float]]]:
        """The (runId, vector) lines of one dimension, in file order."""
        keep = [i for i, v in enumerate(self.vectors) if len(v) == dims]
        return [self.ids[i] for i in keep], [self.vectors[i] for i in keep]


def _parse(raw: bytes, model: str, first_line: int, name: str) -> _Parsed:
    """Whole lines of ``raw`` -> this model's (runId, vector) in file order, every dimension; the torn tail is left."""
    end = raw.rfind(b"\n") + 1
    ids: list[str] = []
    vectors: list[list[float]] = []
    problems: list[str] = []
    needle = orjson.dumps(model)
    lines = raw[:end].split(b"\n")[:-1] if end else []
    for i, line in enumerate(lines):
        if needle not in line:
            continue  # another model's line (or a blank one): never parsed
        try:
            row = _io.loads(line)
        except ValueError:
            problems.append(f"{name}:{first_line + i}: not valid JSON; skipped")
            continue
        why = row_problem(row)
        if why is not None:
            problems.append(f"{name}:{first_line + i}: {why}; skipped")
            continue
        if row["model"] != model:
            continue
        ids.append(row["runId"])
        vectors.append(row["vector"])
    return _Parsed(ids, vectors, end, len(lines), len(vectors[-1]) if vectors else None, problems)


# --- the cache ---------------------------------------------------------------------------------


def _key(model: str) -> str:
    """The cache's file prefix for a model (its manifest holds the model's newest dimension)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model)[:40]
    return f"{safe}-{hashlib.sha256(model.encode()).hexdigest()[:8]}"


def _block_table(ids: pa.Array, matrix: np.ndarray) -> pa.Table:
    m = np.ascontiguousarray(matrix, dtype=np.float32)
    d = m.shape[1]
    codes = sign_codes(m)
    return pa.table({
        "runId": ids,
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(m.reshape(-1)), d),
        "norm": pa.array(np.linalg.norm(m, axis=1).astype(np.float32)),
        "codes": pa.FixedSizeBinaryArray.from_buffers(pa.binary(codes.shape[1] * 8), len(m),
                                                       [None, pa.py_buffer(codes.tobytes())]),
    })


def _block_of(table: pa.Table, start: int, dims: int) -> tuple[VectorBlock, pa.ChunkedArray]:
    t = table.combine_chunks() if any(c.num_chunks > 1 for c in table.columns) else table
    rows = t.num_rows
    vec = t.column("vector").chunk(0) if rows else None
    matrix = vec.flatten().to_numpy(zero_copy_only=True).reshape(rows, dims) if rows else np.zeros((0, dims), np.float32)
    norms = t.column("norm").chunk(0).to_numpy(zero_copy_only=True) if rows else np.zeros(0, np.float32)
    words = -(-dims // WORD_BITS)
    if rows:
        codes_arr = t.column("codes").chunk(0)
        buf = codes_arr.buffers()[1]
        codes = np.frombuffer(buf, dtype=np.uint64, count=rows * words, offset=codes_arr.offset * words * 8).reshape(rows, words)
    else:
        codes = np.zeros((0, words), np.uint64)
    return VectorBlock(start, start + rows, matrix, norms, codes), t.column("runId")


@dataclass
class _Manifest:
    model: str
    dims: int | None = None
    ino: int = 0
    mtime_ns: int | None = None  # of the file when everything in it was consumed
    tail: str = ""  # hex of the last bytes consumed: an appended-to file still has them there
    consumed: int = 0
    lines: int = 0
    rows: int = 0
    blocks: list[dict] = field(default_factory=list)  # {"file", "start", "stop"}
    pending: str | None = None  # file with (runId, vector) of runs that have no record row yet
    problems: list[str] = field(default_factory=list)
    next_id: int = 1

    @classmethod
    def read(cls, path: Path, model: str) -> "_Manifest | None":
        try:
            d = _io.loads(_io.read_file(path, limit=64 * 1024 * 1024))
            if d.pop("version", None) != _VERSION or d.get("model") != model:
                return None
            return cls(**d)
        except (OSError, ValueError, TypeError, AttributeError):
            return None

    def write(self, path: Path) -> None:
        atomic_write(path, orjson.dumps({"version": _VERSION, **dataclasses.asdict(self)}), durable=False)

    def new_file(self, key: str) -> str:
        name = f"vec-{key}-{self.next_id}.arrow"
        self.next_id += 1
        return name


_TAIL = 64


def _file_state(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _fresh(man: _Manifest, state: tuple[int, int, int] | None) -> bool:
    """embeddings.jsonl is exactly what the manifest consumed (inode, size and mtime)."""
    return state is not None and man.mtime_ns is not None and state == (man.ino, man.consumed, man.mtime_ns)


def _consumed(man: _Manifest, state: tuple[int, int, int] | None, raw_tail: bytes) -> None:
    """Record the file state after consuming: ``raw_tail`` ends at the new consumed offset."""
    man.tail = raw_tail[-_TAIL:].hex()
    man.mtime_ns = state[2] if state is not None and state[1] == man.consumed else None


def _open_blocks(cache: Path, man: _Manifest) -> tuple[list[VectorBlock], pa.ChunkedArray]:
    blocks, ids = [], []
    for b in man.blocks:
        block, rid = _block_of(_cache.read_table(cache / b["file"]), b["start"], man.dims or 0)
        if block.stop != b["stop"]:
            raise ValueError("a vector block does not hold the rows its manifest says")
        blocks.append(block)
        ids.extend(rid.chunks)
    return blocks, pa.chunked_array(ids, pa.string())


def _aligned(ids: pa.ChunkedArray, records: pa.Table, rows: int) -> bool:
    """The blocks' run ids are the snapshot's first ``rows`` run ids, in order."""
    if rows > records.num_rows or len(ids) != rows:
        return False
    if not rows:
        return True
    eq = pc.equal(ids, records.column("runId").slice(0, rows))
    return bool(pc.all(pc.fill_null(eq, False)).as_py())


def _pending(cache: Path, man: _Manifest) -> dict[str, np.ndarray]:
    if not man.pending:
        return {}
    t = _cache.read_table(cache / man.pending)
    if not t.num_rows:
        return {}
    mat = t.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False).reshape(t.num_rows, man.dims)
    return dict(zip(t.column("runId").to_pylist(), mat))


def _remove_unlisted(cache: Path, key: str, man: _Manifest) -> None:
    keep = {b["file"] for b in man.blocks} | ({man.pending} if man.pending else set())
    prefix = f"vec-{key}-"
    with contextlib.suppress(OSError), os.scandir(cache) as it:
        for entry in it:
            if entry.name.startswith(prefix) and entry.name.endswith(".arrow") and entry.name not in keep:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def _place(records: pa.Table, updates: dict[str, np.ndarray]) -> tuple[np.ndarray, list[np.ndarray], dict[str, np.ndarray]]:
    """Rows of the records that updates name; updates with no record row stay pending."""
    ids = list(updates)
    pos = pc.index_in(pa.array(ids, pa.string()), value_set=records.column("runId")).to_pylist()
    rows, vecs, pending = [], [], {}
    for rid, p in zip(ids, pos):
        if p is None:
            pending[rid] = updates[rid]
        else:
            rows.append(p)
            vecs.append(updates[rid])
    return np.asarray(rows, dtype=np.int64), vecs, pending


class _Builder:
    """Refreshes one model's vector cache under the cache lock (the key: the model's newest
    dimension), or builds the index of one given dimension in memory (``dims``; no cache)."""

    def __init__(self, snap: Snapshot, model: str, cache: Path | None, dims: int | None = None):
        self.snap, self.model, self.cache, self.dims = snap, model, cache, dims
        self.key = _key(model)
        self.path = snap.store.embeddings_path
        self.problems: list[str] = []

    def _read(self, offset: int) -> bytes:
        try:
            return _io.read_file(self.path, limit=MAX_EMBEDDINGS_BYTES, offset=offset)
        except FileNotFoundError:
            return b""

    def full(self) -> tuple[_Manifest, list[VectorBlock], dict[str, np.ndarray]]:
        """Everything from the start: one block over every record row."""
        man = _Manifest(self.model)
        state = _file_state(self.path)
        raw = self._read(0)
        parsed = _parse(raw, self.model, 1, self.path.name)
        man.ino = state[0] if state else 0
        man.consumed, man.lines, man.problems = parsed.consumed, parsed.lines, parsed.problems
        man.dims = self.dims or parsed.newest
        _consumed(man, state, raw[:parsed.consumed])
        n = self.snap.n
        ids, vectors = parsed.of(man.dims) if man.dims else ([], [])
        if not ids:
            man.rows = n
            return man, [], {}
        updates = dict(zip(ids, vectors))  # the last line of a run wins
        matrix = np.zeros((n, man.dims), dtype=np.float32)
        rows, vecs, pending = _place(self.snap.records, updates)
        if len(rows):
            matrix[rows] = np.asarray(vecs, dtype=np.float32)
        blocks = []
        if n:
            blocks.append(self._write_block(man, 0, matrix))
        man.rows = n
        self._write_pending(man, pending)
        return man, blocks, pending

    def _write_block(self, man: _Manifest, start: int, matrix: np.ndarray) -> VectorBlock:
        rows = len(matrix)
        ids = self.snap.records.column("runId").slice(start, rows).combine_chunks()
        table = _block_table(ids, matrix)
        if self.cache is not None:
            name = man.new_file(self.key)
            _cache.write_table(self.cache / name, table)
            man.blocks = [b for b in man.blocks if b["start"] != start] + [{"file": name, "start": start, "stop": start + rows}]
            man.blocks.sort(key=lambda b: b["start"])
        return _block_of(table, start, matrix.shape[1])[0]

    def _write_pending(self, man: _Manifest, pending: dict[str, np.ndarray]) -> None:
        if self.cache is None:
            return
        if not pending:
            man.pending = None
            return
        mat = np.asarray(list(pending.values()), dtype=np.float32)
        name = man.new_file(self.key)
        _cache.write_table(self.cache / name, pa.table({
            "runId": pa.array(list(pending), pa.string()),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(mat.reshape(-1)), mat.shape[1]),
        }))
        man.pending = name

    def incremental(self, man: _Manifest, blocks: list[VectorBlock]) -> tuple[_Manifest, list[VectorBlock]] | None:
        """Bring a cached index up to date (None: start over)."""
        state = _file_state(self.path)
        if state is None:
            return None if man.consumed else self._extend(man, blocks, {})
        ino, size, _ = state
        if ino != man.ino or size < man.consumed:
            return None  # embeddings.jsonl was replaced or cut: it is not the file we read
        start = max(man.consumed - _TAIL, 0)
        raw = self._read(start)
        if raw[: man.consumed - start].hex() != man.tail:
            return None  # replaced by another file (an inode can be reused)
        raw = raw[man.consumed - start:]
        parsed = _parse(raw, self.model, man.lines + 1, self.path.name)
        updates = _pending(self.cache, man) if self.cache is not None else {}
        if parsed.newest is not None and parsed.newest != man.dims:
            return None  # the first vectors of this model, or its newest dimension changed: a new key
        for rid, vec in zip(*parsed.of(man.dims)) if man.dims else ():
            updates[rid] = np.asarray(vec, dtype=np.float32)  # the last line of a run wins
        man.consumed += parsed.consumed
        man.lines += parsed.lines
        if parsed.consumed:
            prev = bytes.fromhex(man.tail)
            _consumed(man, state, prev + raw[:parsed.consumed])
        else:
            _consumed(man, state, bytes.fromhex(man.tail))
        man.problems += [p for p in parsed.problems if p not in man.problems]
        return self._extend(man, blocks, updates)

    def _extend(self, man: _Manifest, blocks: list[VectorBlock], updates: dict[str, np.ndarray]) -> tuple[_Manifest, list[VectorBlock]]:
        n = self.snap.n
        rows, vecs, pending = _place(self.snap.records, updates) if updates else (np.zeros(0, np.int64), [], {})
        d = man.dims
        if d is None:
            man.rows = n
            self._write_pending(man, pending)
            return man, blocks
        # A vector for a row already covered (its first, or a later line of its run): rewrite the block that holds it.
        by_block: dict[int, list[int]] = {}
        for j, r in enumerate(rows):
            if r < man.rows:
                i = next(i for i, b in enumerate(blocks) if b.start <= r < b.stop)
                by_block.setdefault(i, []).append(j)
        for i, js in by_block.items():
            b = blocks[i]
            matrix = np.array(b.matrix, copy=True)
            for j in js:
                matrix[rows[j] - b.start] = vecs[j]
            blocks[i] = self._write_block(man, b.start, matrix)
        if n > man.rows:
            matrix = np.zeros((n - man.rows, d), dtype=np.float32)
            for j, r in enumerate(rows):
                if r >= man.rows:
                    matrix[r - man.rows] = vecs[j]
            blocks.append(self._write_block(man, man.rows, matrix))
            man.rows = n
        if len(blocks) > MAX_BLOCKS:
            whole = np.concatenate([b.matrix for b in blocks])
            man.blocks = []
            blocks = [self._write_block(man, 0, whole)]
        self._write_pending(man, pending)
        return man, blocks


def _index(man: _Manifest, blocks: list[VectorBlock], n: int) -> VectorIndex | None:
    if man.dims is None or not blocks:
        return None
    index = VectorIndex(man.model, man.dims, n, blocks, consumed=man.consumed, problems=list(man.problems))
    return index if index.count else None


#: The vector indexes loaded for each live snapshot: (model, dims) -> index or None (none stored).
#: Kept as long as the snapshot is (a snapshot held by holding_snapshots keeps its vectors warm).
_LOADED: "weakref.WeakKeyDictionary[Snapshot, dict[tuple[str, int | None], VectorIndex | None]]" = weakref.WeakKeyDictionary()
_LOADED_LOCK = threading.Lock()


def _loaded(snap: Snapshot) -> dict[tuple[str, int | None], VectorIndex | None]:
    """The snapshot's loaded vector indexes (created empty on first use)."""
    with _LOADED_LOCK:
        return _LOADED.setdefault(snap, {})


def load_index(snap: Snapshot, model: str, *, dims: int | None = None, use_cache: bool = True) -> VectorIndex | None:
    """The vectors of ``model`` (and ``dims``) aligned with the snapshot's rows, or None when it has none.

    Args:
        snap: the snapshot whose rows the vectors align with.
        model: the embedding model.
        dims: the dimension (the key is (model, dims)); None: the model's newest, the dimension
            of its last line in embeddings.jsonl. Only the newest is cached; another dimension
            is read in memory (``cybmem embed`` asks for it when the server's answer changed).
        use_cache: False reads embeddings.jsonl without the Arrow cache.

    Loaded once per snapshot and key; the Arrow cache is refreshed incrementally (module
    docstring). Unusable lines are reported once each in ``snap.problems``.

    Raises:
        StoreError: embeddings.jsonl cannot be read at all (a symlink, not a regular file).
    """
    key = (model, dims)
    loaded = _loaded(snap)
    if key in loaded:
        return loaded[key]
    store = snap.store
    if store is None or not (store.embeddings_path.exists() or store.embeddings_path.is_symlink()):
        loaded[key] = None
        return None
    if dims is not None:
        newest = load_index(snap, model, use_cache=use_cache)
        if newest is not None and newest.dims == dims:
            loaded[key] = newest
            return newest
    cache = _cache.cache_dir(store.dir)
    if dims is not None or not (use_cache and cache.is_dir()) or snap.uncached or store.symlinked_dirs():
        cache = None  # another dimension, or a snapshot loaded without the cache: vectors in memory too
    index = _load(snap, model, cache, dims)
    if index is not None:
        from ..store.memory_store import ReadProblem

        for message in index.problems:
            problem = ReadProblem(str(store.embeddings_path), message)
            if problem not in snap.problems:
                snap.problems.append(problem)
    loaded[key] = index
    return index


def _load(snap: Snapshot, model: str, cache: Path | None, dims: int | None = None) -> VectorIndex | None:
    builder = _Builder(snap, model, cache, dims)
    if cache is None:
        man, blocks, _ = builder.full()
        return _index(man, blocks, snap.n)
    man_path = cache / f"vec-{builder.key}.json"
    for attempt in range(3):
        try:
            man = _Manifest.read(man_path, model)
            state = _file_state(builder.path)
            if man is not None and man.rows == snap.n and _fresh(man, state):
                if man.dims is None and not man.blocks:
                    return None  # no vector of this model in the file
                blocks, ids = _open_blocks(cache, man)
                if _aligned(ids, snap.records, man.rows):
                    return _index(man, blocks, snap.n)
            ensure_dir(cache)
            with locked(cache / ".lock"):
                man = _Manifest.read(man_path, model)
                result = None
                if man is not None:
                    try:
                        blocks, ids = _open_blocks(cache, man)
                        if _aligned(ids, snap.records, man.rows):
                            result = builder.incremental(man, blocks)
                    except (OSError, ValueError, KeyError, pa.ArrowException):
                        result = None
                if result is None:
                    man, blocks, _ = builder.full()
                else:
                    man, blocks = result
                man.write(man_path)
                _remove_unlisted(cache, builder.key, man)
                return _index(man, blocks, snap.n)
        except StoreError:
            raise
        except FileNotFoundError:
            if attempt == 2:
                raise
        except OSError:
            man, blocks, _ = _Builder(snap, model, None).full()  # a read-only cache: in memory
            return _index(man, blocks, snap.n)
    raise AssertionError("unreachable")
