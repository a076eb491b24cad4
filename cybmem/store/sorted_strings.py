"""Byte-wise sorted string arrays searched without a dict: each string's first 8 UTF-8 bytes as a
big-endian uint64 key, a binary search of the keys, then of the few strings sharing a key.

The keyword index's vocabulary (:mod:`cybmem.store.keyword_segments`) and the run-id lookup
(:mod:`cybmem.store.run_ids`) are both such arrays: one search for both.
"""

from __future__ import annotations

import bisect
from typing import Sequence

import numpy as np
import pyarrow as pa

__all__ = ["find_sorted", "in_run", "prefix_keys", "query_key", "query_keys", "string_buffers"]


def prefix_keys(offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
    """First 8 UTF-8 bytes of each string as a big-endian uint64, zero padded.

    For byte-wise sorted strings these keys are non-decreasing, so np.searchsorted finds the
    run of vocabulary entries sharing a query term's 8-byte prefix.
    """
    starts = offsets[:-1].astype(np.int64)
    lens = np.diff(offsets).astype(np.int64)
    keys = np.zeros(len(starts), dtype=np.uint64)
    last = max(len(data) - 1, 0)
    for j in range(8):
        has = lens > j
        byte = np.where(has, data[np.minimum(starts + j, last)] if len(data) else 0, 0)
        keys |= byte.astype(np.uint64) << np.uint64(8 * (7 - j))
    return keys


def query_key(b: bytes) -> int:
    return int.from_bytes(b[:8].ljust(8, b"\0"), "big")


def string_buffers(arr: pa.Array) -> tuple[np.ndarray, memoryview, np.ndarray]:
    """Zero-copy (offsets, data memoryview, data uint8) of a pyarrow string array."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if arr.type == pa.large_string():
        odt = np.int64
    elif arr.type == pa.string():
        odt = np.int32
    else:
        raise TypeError(f"vocabulary must be a string array, got {arr.type}")
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=odt)[arr.offset : arr.offset + len(arr) + 1]
    if bufs[2] is None:
        data = np.zeros(0, dtype=np.uint8)
    else:
        data = np.frombuffer(bufs[2], dtype=np.uint8)
    return offsets, memoryview(data), data


def find_sorted(keys: np.ndarray, off: np.ndarray, mv: memoryview, terms_b: Sequence[bytes],
                 qkeys: np.ndarray) -> list[int]:
    """Positions of byte strings in a byte-wise sorted string array, -1 when absent.

    One vectorised searchsorted over the uint64 prefix keys finds each term's run of
    entries sharing its first 8 bytes; a run longer than one is bisected on the full bytes.
    O(log V) per term, and nothing is built at load time (no dict).
    """
    los = np.searchsorted(keys, qkeys, side="left").tolist()
    his = np.searchsorted(keys, qkeys, side="right").tolist()
    return [in_run(off, mv, b, lo, hi) for b, lo, hi in zip(terms_b, los, his)]


def in_run(off: np.ndarray, mv: memoryview, b: bytes, lo: int, hi: int) -> int:
    """Position of ``b`` among the sorted entries [lo, hi) sharing its 8-byte prefix, or -1."""
    if lo == hi:
        return -1
    j = lo
    if hi - lo > 1:
        j = lo + bisect.bisect_left(range(lo, hi), b, key=lambda i: bytes(mv[off[i] : off[i + 1]]))
    return j if j < hi and mv[off[j] : off[j + 1]] == b else -1


def query_keys(terms_b: Sequence[bytes]) -> np.ndarray:
    return np.fromiter((query_key(x) for x in terms_b), dtype=np.uint64, count=len(terms_b))
