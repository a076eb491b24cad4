"""The lookups a long-lived snapshot prepares for the lineage kernel: run id to row and back
(:class:`RunLookup`, the keyword vocabulary's sorted-string search applied to run ids), and the
lineage id columns as codes with the rows of each (:class:`IdColumn`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from ..arrow_numpy import numpy_of, scalar
from .keyword_index import in_run, prefix_keys, query_key, string_buffers

__all__ = ["IdColumn", "RunLookup"]


class RunLookup:
    """run id -> row position in O(log N), without a dict (for the lineage kernel).

    Holds the run ids sorted byte-wise as one Arrow string array, their uint64 8-byte
    prefix keys and their row positions (the same binary search as the keyword vocabulary).
    Build it once per frame (one Arrow sort, O(N log N)) and pass it to
    :func:`lineage_affinity`; the ancestor walk then costs O(depth * log N).
    """

    __slots__ = ("sorted_ids", "keys", "positions", "_off", "_mv", "_slot_of")

    def __init__(self, sorted_ids: pa.Array, keys: np.ndarray, positions: np.ndarray):
        self.sorted_ids = sorted_ids
        self.keys = keys
        self.positions = positions
        self._off, self._mv, _ = string_buffers(sorted_ids)
        self._slot_of: np.ndarray | None = None

    @classmethod
    def build(cls, run_ids: Any) -> RunLookup:
        """From a numpy (object/str) or pyarrow (string/dictionary) id column; missing
        (None/null) ids are left out."""
        import pyarrow.compute as pc

        ids = run_ids.combine_chunks() if isinstance(run_ids, pa.ChunkedArray) else run_ids
        if not isinstance(ids, pa.Array):
            ids = pa.array(np.asarray(ids, dtype=object).tolist(), type=pa.string(), from_pandas=True)
        if ids.type != pa.string():  # dictionary / large_string columns
            ids = ids.cast(pa.string())
        order = pc.sort_indices(ids)  # nulls sort last by default
        order = order.slice(0, len(ids) - ids.null_count)
        sorted_ids = ids.take(order)
        off, _, data = string_buffers(sorted_ids)
        return cls(sorted_ids, prefix_keys(off, data), numpy_of(order).astype(np.int64))

    def find(self, run_id: str) -> int:
        """Row of ``run_id``, or -1 (one id: scalar searches, no arrays built)."""
        b = run_id.encode()
        key = np.uint64(query_key(b))
        j = in_run(self._off, self._mv, b, int(self.keys.searchsorted(key, "left")), int(self.keys.searchsorted(key, "right")))
        return int(self.positions[j]) if j >= 0 else -1

    def id_at(self, row: int) -> str | None:
        """The run id at ``row`` (None when that row has none): from the sorted ids' bytes, no Arrow call."""
        if self._slot_of is None:
            self._slot_of = np.full(int(self.positions.max(initial=-1)) + 1, -1, dtype=np.int64)
            self._slot_of[self.positions] = np.arange(len(self.positions))
        j = int(self._slot_of[row]) if row < len(self._slot_of) else -1
        return bytes(self._mv[self._off[j] : self._off[j + 1]]).decode() if j >= 0 else None


class IdColumn:
    """An id column (rootRunId, chatSessionId, parentRunId) as int32 codes into its distinct ids,
    for the lineage kernel on a long-lived snapshot: the id at a row and the rows holding an id
    without an Arrow call or a pass over every row (the rows of each id come from one stable sort,
    built when first asked for). Missing ids (null or "") have code -1."""

    __slots__ = ("codes", "values", "_code_of", "_order", "_starts")

    def __init__(self, column: Any):
        import pyarrow.compute as pc

        col = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        enc = pc.dictionary_encode(col)
        values = enc.dictionary.to_pylist()
        codes = numpy_of(pc.fill_null(enc.indices, scalar(-1, enc.indices.type))).astype(np.int32)
        if "" in values:  # an empty id is a missing one
            codes[codes == values.index("")] = -1
        self.codes, self.values = codes, values
        self._code_of = {v: i for i, v in enumerate(values) if v != ""}
        self._order: np.ndarray | None = None
        self._starts: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.codes)

    def at(self, i: int) -> str | None:
        """The id at row ``i`` (None when missing)."""
        c = int(self.codes[i])
        return self.values[c] if c >= 0 else None

    def rows_of(self, value: str) -> np.ndarray:
        """The rows holding ``value``, ascending."""
        c = self._code_of.get(value)
        if c is None:
            return np.zeros(0, dtype=np.int64)
        if self._order is None:
            self._order = np.argsort(self.codes, kind="stable")
            self._starts = np.searchsorted(self.codes[self._order], np.arange(len(self.values) + 1))
        return self._order[self._starts[c]:self._starts[c + 1]]
