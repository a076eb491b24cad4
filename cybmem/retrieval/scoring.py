"""Vectorised multi-axis scorer: pure kernels over numpy arrays plus one entry point.

    score = w_kw * keyword + w_rec * exp(-ageDays / halfLife) + w_lin * lineage [+ w_vec * cosine]

computed over all records at once. The frame/cache layer pulls its columns once and calls
:func:`score`, :func:`rank` and :func:`explain`; the kernels (:func:`normalize_keyword`,
:func:`recency`, :func:`lineage_affinity`, :func:`cosine`, :func:`top_k`) are usable alone.
Recency and the ranking order (:func:`ranking_order`) are defined here once: dispatch's issue
ranking and tuning's grid call them too.

The keyword axis comes from :class:`cybmem.store.keyword_index.KeywordIndex`, the weights from
:mod:`cybmem.retrieval.weights`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..arrow_numpy import numpy_of, scalar  # not pa.scalar / to_numpy: they import pandas
from ..store.run_ids import IdColumn, RunLookup
from .weights import Weights

__all__ = [
    "LINEAGE_ANCESTOR",
    "LINEAGE_CHAT",
    "LINEAGE_PREVIOUS",
    "LINEAGE_ROOT",
    "LINEAGE_MAX_DEPTH",
    "MS_PER_DAY",
    "keyword_max",
    "normalize_keyword",
    "recency",
    "recency_of_age",
    "LineageContext",
    "lineage_affinity",
    "cosine",
    "top_k",
    "top_k_candidates",
    "ScoreBlocks",
    "ranking_order",
    "Scored",
    "score",
    "totals",
    "rank",
    "explain",
    "explain_rows",
]

MS_PER_DAY = 86_400_000


def keyword_max(raw: np.ndarray, mask: np.ndarray | None = None) -> float:
    """The max of raw keyword scores over the candidates (what :func:`normalize_keyword` divides by).

    A collection scored in parts (the shards of a fleet) takes the max of its parts' maxima and
    passes it to :func:`score` as ``keyword_max``.
    """
    raw = np.asarray(raw, dtype=np.float32)
    return float(np.max(raw, where=mask, initial=0.0)) if mask is not None else float(raw.max(initial=0.0))


def normalize_keyword(raw: np.ndarray, mask: np.ndarray | None = None, *, scale: float = 1.0,
                      max_value: float | None = None) -> np.ndarray:
    """Scale non-negative raw keyword scores to [0, 1] by their max over the candidates.

    Args:
        raw: raw scores (e.g. :meth:`KeywordIndex.scores`).
        mask: optional bool array; the max is taken over True entries only.
        scale: multiply the result by this (lets :func:`score` fold in w_kw for free).
        max_value: divide by this instead (:func:`keyword_max` over a larger collection
            these scores are a part of).

    Returns:
        float32 array; all-zero (or empty) input stays zero.
    """
    raw = np.asarray(raw, dtype=np.float32)
    m = keyword_max(raw, mask) if max_value is None else float(max_value)
    if not m > 0.0 or not math.isfinite(m):
        return np.zeros(len(raw), dtype=np.float32)
    return raw * np.float32(scale / m)


# exp() of float32 arguments below about -87.3 lands in subnormals (< FLT_MIN = 1.18e-38),
# which x86 handles far slower; with most records many e-folds old that dominated the
# whole query. Arguments are floored here, so recency >= exp(-87) = 1.6e-38: a deviation
# below float32's normal range, order preserved (non-increasing in age).
_EXP_FLOOR = np.float32(-87.0)


def _per_ms(half_life_days: float) -> float:
    """The decay rate c = 1 / (ms per day * half_life_days): recency = exp(-age_ms * c)."""
    if not half_life_days > 0 or not math.isfinite(half_life_days):
        raise ValueError(f"half_life_days must be a positive finite number, got {half_life_days!r}")
    return 1.0 / (MS_PER_DAY * half_life_days)


def _decay(x: np.ndarray, upper: float) -> np.ndarray:
    """exp(x) in place for float32 exponents x = -age_ms * c (+ ln w), clipped first: below at
    :data:`_EXP_FLOOR`, above at ``upper`` (ln w: an age below 0, a run ending after now, is 0)."""
    np.maximum(x, _EXP_FLOOR, out=x)  # np.clip's floats, without its argument handling (~20 us a call)
    np.minimum(x, np.float32(upper), out=x)
    np.exp(x, out=x)
    return x


def recency(ended_at_ms: np.ndarray, now_ms: int, half_life_days: float, *, weight: float = 1.0) -> np.ndarray:
    """weight * exp(-ageDays / half_life_days), float32 in (0, weight].

    As written the formula makes ``half_life_days`` an e-folding time (a record that old
    scores 1/e = 0.37, not 0.5); a true half-life h corresponds to h / ln 2 here. Ages of
    records ending after ``now_ms`` are clipped to 0 (score ``weight``). The exponent is
    floored at -87 (exp(-87) ~ 1.6e-38) to keep float32 exp out of slow subnormals.

    ``ended_at_ms`` may be int64 or float64 epoch ms; float64 (exact for epoch ms) is
    faster because numpy converts int64 to float without SIMD, so a caller scoring many
    queries should convert once and keep it.

    Computed in four passes as exp(clip((ended - now') * c, floor, ln w)) with c = 1 / (ms per
    day * h) and now' = now - ln(w) / c, which folds the weight into the exponent (exp(y) * w =
    exp(y + ln w)) and the future clip (age >= 0) into the clip's upper bound.
    """
    c = _per_ms(half_life_days)
    ended = np.asarray(ended_at_ms)
    if ended.dtype.kind not in "iuf":
        ended = ended.astype(np.int64)
    lnw = math.log(weight)
    shifted_now = now_ms - lnw / c
    if ended.dtype.kind == "f":
        # float64 epoch ms (exact below 2**53) skips numpy's non-SIMD int64 -> float cast
        diff = np.subtract(ended, np.float64(shifted_now), dtype=np.float64)
    else:
        diff = np.subtract(ended, np.int64(round(shifted_now)), dtype=np.int64)
    x = np.empty(len(ended), dtype=np.float32)
    np.multiply(diff, np.float32(c), out=x, casting="unsafe")
    return _decay(x, lnw)


def recency_of_age(age_ms: np.ndarray, half_life_days: float) -> np.ndarray:
    """:func:`recency` (weight 1) of ages already taken, float32 ms ``now - endedAt``: a new
    float32 array. For a caller that scores one set of records at many half-lives
    (cybmem.retrieval.tuning keeps each query's ages once)."""
    x = np.multiply(age_ms, np.float32(-_per_ms(half_life_days)), dtype=np.float32)
    return _decay(x, 0.0)


#: Lineage affinity table (max over the rules that apply; otherwise 0).
LINEAGE_ANCESTOR = 1.0  # record is the new run's parent, grandparent, ... (parentRunId walk)
LINEAGE_CHAT = 0.8  # record was dispatched from the same chat session
LINEAGE_PREVIOUS = 0.6  # record is context.previous_run_id
LINEAGE_ROOT = 0.6  # record shares the new run's dispatch-chain root (or is that root)
LINEAGE_MAX_DEPTH = 64  # ancestor walk cap


@dataclass(frozen=True)
class LineageContext:
    """Lineage of the NEW run being dispatched (ids of prior runs; None when unknown)."""

    parent_run_id: str | None = None
    chat_session_id: str | None = None
    previous_run_id: str | None = None
    root_run_id: str | None = None


def _to_id_array(a: Any) -> Any:
    """Normalise an id column: numpy and pyarrow arrays stay (a one-chunk ChunkedArray is
    unwrapped; several chunks are kept, never copied); other sequences become object arrays."""
    if isinstance(a, pa.ChunkedArray):
        return a.chunk(0) if a.num_chunks == 1 else a
    if isinstance(a, (pa.Array, np.ndarray, IdColumn)):
        return a
    return np.asarray(a, dtype=object)


def _eq_mask(ids: Any, value: str) -> np.ndarray:
    """Bool array ``ids == value`` (missing ids never match).

    Fastest input is a pyarrow DictionaryArray (one lookup in the dictionary, then an
    integer compare over the codes); pyarrow string arrays use compute.equal; numpy arrays
    (object, str, StringDType) use ==.
    """
    if isinstance(ids, pa.ChunkedArray):
        if ids.num_chunks == 0:
            return np.zeros(0, dtype=bool)
        return np.concatenate([_eq_mask(c, value) for c in ids.chunks])
    if isinstance(ids, pa.DictionaryArray):
        d = ids.dictionary
        if len(d) <= 64:  # the usual case (few roots/chats): no compute-kernel overhead
            codes = np.array([i for i, v in enumerate(d.to_pylist()) if v == value], dtype=np.int64)
        else:
            codes = np.flatnonzero(_pa_equal(d, value))
        if len(codes) == 0:
            return np.zeros(len(ids), dtype=bool)
        idx = ids.indices
        if idx.null_count:
            import pyarrow.compute as pc

            idx = pc.fill_null(idx, scalar(-1, idx.type))
        icodes = numpy_of(idx)
        if len(codes) == 1:
            return icodes == int(codes[0])  # a Python int keeps the compare in the codes' width (int64 would widen them first)
        return np.isin(icodes, codes.astype(icodes.dtype))
    if isinstance(ids, pa.Array):
        return _pa_equal(ids, value)
    return np.asarray(ids == value, dtype=bool)


def _pa_equal(arr: pa.Array, value: str) -> np.ndarray:
    import pyarrow.compute as pc

    # An Arrow scalar built from buffers: a str, or pa.scalar, makes pyarrow import pandas.
    eq = pc.equal(arr, scalar(value, arr.type.value_type if pa.types.is_dictionary(arr.type) else arr.type))
    if eq.null_count:
        eq = pc.fill_null(eq, scalar(False, pa.bool_()))
    return numpy_of(eq)


def _id_at(ids: Any, i: int) -> str | None:
    if isinstance(ids, IdColumn):
        return ids.at(i)
    v = ids[i]
    if isinstance(v, pa.Scalar):
        v = v.as_py()
    if v is None or v == "" or (isinstance(v, float) and math.isnan(v)):
        return None
    return str(v)


def _find_scan(ids: Any, run_id: str) -> int:
    hit = np.flatnonzero(_eq_mask(ids, run_id))
    return int(hit[0]) if len(hit) else -1


def lineage_affinity(run_ids: Any, parent_ids: Any, previous_ids: Any, root_ids: Any,
                     chat_ids: Any, context: LineageContext, *,
                     lookup: RunLookup | None = None) -> np.ndarray:
    """How closely each record is related to the new run, float32 in [0, 1].

    Rules (max over those that apply, module constants):

    ========================================================  =====
    record is an ancestor of the new run (parentRunId walk     1.0
    from context.parent_run_id upward, depth <= 64, cycles
    stop the walk)
    record.chatSessionId == context.chat_session_id            0.8
    record.runId == context.previous_run_id                    0.6
    record.rootRunId == context root, or record IS that root   0.6
    otherwise                                                  0.0
    ========================================================  =====

    Context root = context.root_run_id, else the parent record's rootRunId, else the
    topmost ancestor reached by the walk (a chain's first run has no rootRunId).

    Args:
        run_ids, parent_ids, previous_ids, root_ids, chat_ids: equal-length id columns,
            numpy object/str arrays (None or "" = missing) or pyarrow string / dictionary
            arrays. ``previous_ids`` is accepted for symmetry with the record schema; no rule
            uses a record's own previousRunId.
        context: lineage of the new run.
        lookup: a :class:`RunLookup` over ``run_ids`` (walk is O(depth log N)); without it
            each step is one vectorised O(N) scan.

    Returns:
        float32 array of affinities.
    """
    del previous_ids  # no rule needs it (see docstring)
    run_ids = _to_id_array(run_ids)
    n = len(run_ids)
    if n == 0:
        return np.zeros(0, dtype=np.float32)
    parent_ids = _to_id_array(parent_ids)
    root_ids = _to_id_array(root_ids)
    chat_ids = _to_id_array(chat_ids)

    def find(rid: str) -> int:
        return lookup.find(rid) if lookup is not None else _find_scan(run_ids, rid)

    # Ancestors: walk parentRunId upward from the new run's parent.
    ancestors: list[int] = []
    seen: set[str] = set()
    cur = context.parent_run_id or None
    while cur and cur not in seen and len(ancestors) < LINEAGE_MAX_DEPTH:
        seen.add(cur)
        i = find(cur)
        if i < 0:
            break
        ancestors.append(i)
        cur = _id_at(parent_ids, i)

    root = context.root_run_id or None
    if root is None and ancestors:
        root = _id_at(root_ids, ancestors[0])
        if root is None:
            top = ancestors[-1]
            root = _id_at(root_ids, top) or _id_at(run_ids, top)
    # The rules are applied in ascending level (root and previous 0.6, chat 0.8, ancestors 1.0),
    # so each one setting its rows gives the max of those that apply.
    aff = np.zeros(n, dtype=np.float32)
    if root:
        _set_where(aff, root_ids, root, LINEAGE_ROOT)
        i = find(root)
        if i >= 0:
            aff[i] = LINEAGE_ROOT
    if context.previous_run_id:
        i = find(context.previous_run_id)
        if i >= 0:
            aff[i] = LINEAGE_PREVIOUS
    if context.chat_session_id:
        _set_where(aff, chat_ids, context.chat_session_id, LINEAGE_CHAT)
    if ancestors:
        aff[np.asarray(ancestors, dtype=np.int64)] = LINEAGE_ANCESTOR
    return aff


assert LINEAGE_ROOT <= LINEAGE_CHAT and LINEAGE_PREVIOUS <= LINEAGE_CHAT <= LINEAGE_ANCESTOR  # lineage_affinity's order


def _set_where(aff: np.ndarray, ids: Any, value: str, level: float) -> None:
    """``aff`` set to ``level`` on the rows whose id is ``value`` (missing ids never match): the
    rows an :class:`IdColumn` holds for it (a prepared snapshot: no pass over every record), else
    :func:`_eq_mask`'s."""
    if isinstance(ids, IdColumn):
        aff[ids.rows_of(value)] = level
    else:
        np.copyto(aff, np.float32(level), where=_eq_mask(ids, value))


def cosine(matrix: np.ndarray | None, qvec: np.ndarray | None, *, n: int | None = None,
           row_norms: np.ndarray | None = None) -> np.ndarray:
    """Cosine similarity of each row with ``qvec``, clipped to [0, 1], float32.

    Rows of zeros (records without an embedding) score 0. With ``matrix`` or ``qvec`` None
    the result is ``n`` zeros (the vector axis is off). ``row_norms`` may be passed when
    precomputed (it is the only O(N*d) work besides the mat-vec).
    """
    if matrix is None or qvec is None:
        if n is None:
            raise ValueError("cosine(None, ...) needs n= (the number of records)")
        return np.zeros(n, dtype=np.float32)
    m = np.asarray(matrix, dtype=np.float32)
    q = np.asarray(qvec, dtype=np.float32).ravel()
    if m.ndim != 2 or m.shape[1] != q.shape[0]:
        raise ValueError(f"matrix is {m.shape}, query vector has {q.shape[0]} dims; they must match")
    qn = float(np.linalg.norm(q))
    if qn == 0.0:
        return np.zeros(m.shape[0], dtype=np.float32)
    norms = np.linalg.norm(m, axis=1) if row_norms is None else np.asarray(row_norms, np.float32)
    dots = m @ (q / np.float32(qn))
    out = np.zeros(m.shape[0], dtype=np.float32)
    np.divide(dots, norms, out=out, where=norms > 0)
    np.clip(out, 0.0, 1.0, out=out)
    return out


def _select_top(s32: np.ndarray, cand: np.ndarray, k: int) -> np.ndarray:
    """Top k of ``s32[cand]`` by (score desc, index desc), best first.

    Each candidate gets a unique uint64 key: the float32 score's bits made order-preserving
    as unsigned (Herf, "Radix Tricks", 2001: flip all bits of negatives, the sign bit of
    positives) in the high word, the index in the low word. Unique keys keep argpartition
    away from its slow path on heavily tied inputs (most scores 0 is the common case), and
    the index in the key breaks ties newer-first for free.
    """
    v = s32[cand] + np.float32(0.0)  # copy; turns -0.0 into +0.0
    v[np.isnan(v)] = -np.inf
    bits = v.view(np.uint32)
    bits = np.where(bits >> np.uint32(31), ~bits, bits | np.uint32(0x80000000))
    keys = (bits.astype(np.uint64) << np.uint64(32)) | cand.astype(np.uint64)
    m = len(keys)
    if k < m:
        keys = keys[np.argpartition(keys, m - k)[m - k :]]
    keys.sort()
    return (keys[::-1] & np.uint64(0xFFFFFFFF)).astype(np.int64)


def top_k(scores: np.ndarray, k: int, mask: np.ndarray | None = None) -> np.ndarray:
    """Indices of the k highest scores, best first.

    Ties are broken by index descending: with documents ordered oldest -> newest, equal
    scores list the newer record first. ``mask`` False entries are never returned. Scores
    are compared as float32 (NaN counts as -inf). Cost: :func:`top_k_candidates`, then an
    argpartition over those candidates and a sort of the k winners only.

    Returns:
        int64 array of length min(k, number of eligible entries).
    """
    s = np.ascontiguousarray(scores, dtype=np.float32)
    if len(s) < 2048 and k > 0:  # a few scores (a ranking pool): one sort, fewer steps than the selection below
        if mask is not None and len(mask) != len(s):
            raise ValueError(f"mask has {len(mask)} entries for {len(s)} scores")
        cand = np.flatnonzero(mask) if mask is not None else np.arange(len(s), dtype=np.int64)
        return _order(s, cand)[:k]
    cand = top_k_candidates(s, k, mask)
    if len(cand) == 0:
        return np.zeros(0, dtype=np.int64)
    if len(cand) <= _FEW_CANDIDATES:  # a few: the sort above, in fewer steps than _select_top's keys
        return _order(s, cand)[:k]
    return _select_top(s, cand, min(k, len(cand)))


#: Up to this many candidates :func:`top_k` sorts them as they are (the usual case: the blocks
#: leave some tens); more are selected by :func:`_select_top`'s keys.
_FEW_CANDIDATES = 256


def _order(s: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """``cand`` by (score desc, index desc), NaN counting as -inf and -0.0 as 0.0: :func:`top_k`'s order."""
    v = s[cand] + np.float32(0.0)  # turns -0.0 into +0.0
    v[np.isnan(v)] = -np.inf
    return cand[np.lexsort((-cand, -v))]


class ScoreBlocks:
    """The maxima of a score array's blocks: which entries reach a value, found by looking only in
    the blocks whose maximum does (one pass over the scores, then few)."""

    __slots__ = ("scores", "block", "body", "maxima")

    def __init__(self, scores: np.ndarray, k: int):
        """Blocks sized for :func:`top_k_candidates` of ``k``: about 8k blocks, 16 to 1,024 entries each.
        Fewer than 2,048 scores (or blocks under 16) are one block: ``maxima`` is None."""
        self.scores = s = np.ascontiguousarray(scores, dtype=np.float32)
        n = len(s)
        self.block = min(1024, n // (8 * k)) if k > 0 else 0
        self.body = self.maxima = None
        if n >= 2048 and self.block >= 16:
            nb = n // self.block
            self.body = s[: nb * self.block].reshape(nb, self.block)
            self.maxima = self.body.max(axis=1)

    def at_least(self, t: float, blocks: np.ndarray | None = None) -> np.ndarray:
        """Ascending indices of the entries >= ``t`` (``blocks``: those of ``maxima >= t``, if known)."""
        s = self.scores
        if self.maxima is None:
            return np.flatnonzero(s >= t)
        b = self.block
        if blocks is None:
            blocks = np.flatnonzero(self.maxima >= t)
        if 2 * len(blocks) > len(self.maxima):  # most blocks: one pass over the scores is cheaper than copying them
            return np.flatnonzero(s >= t)
        hit = np.flatnonzero(self.body[blocks] >= t)
        rows = blocks[hit // b] * b + hit % b
        end = len(self.maxima) * b
        tail = np.flatnonzero(s[end:] >= t) + end
        return np.concatenate((rows, tail)) if len(tail) else rows

    def at_least_each(self, t: np.ndarray) -> np.ndarray:
        """Ascending indices of the entries >= their block's value of ``t`` (float32, one per block
        and one for the shorter last block when there is one: ceil(n / block) values)."""
        s = self.scores
        if self.maxima is None:
            return np.flatnonzero(s >= t[0])
        b, nb = self.block, len(self.maxima)
        end = nb * b
        blocks = np.flatnonzero(self.maxima >= t[:nb])
        if 2 * len(blocks) > nb:  # most blocks: compare them all in place rather than copy them
            rows = np.flatnonzero(self.body >= t[:nb, None])
        else:
            hit = np.flatnonzero(self.body[blocks] >= t[blocks, None])
            rows = blocks[hit // b] * b + hit % b
        if end == len(s):
            return rows
        tail = np.flatnonzero(s[end:] >= t[nb]) + end
        return np.concatenate((rows, tail)) if len(tail) else rows


def top_k_candidates(scores: np.ndarray, k: int, mask: np.ndarray | None = None, *,
                     blocks: ScoreBlocks | None = None) -> np.ndarray:
    """Indices of a few entries (in no particular order) among which :func:`top_k` finds its answer.

    One blocked max pass picks the blocks that can hold a winner (the k-th largest block maximum
    t is a lower bound of the k-th largest score, so only entries >= t in blocks whose max >= t
    can win); with heavy ties at t (most scores 0, typically) everything above t and the
    highest-index entries equal to t. Otherwise every eligible index. ``blocks``: the scores'
    :class:`ScoreBlocks` for this k, when the caller has them.
    """
    s = np.ascontiguousarray(scores, dtype=np.float32)
    n = len(s)
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        if len(mask) != n:
            raise ValueError(f"mask has {len(mask)} entries for {n} scores")
    if k <= 0 or n == 0:
        return np.zeros(0, dtype=np.int64)
    if n >= (1 << 32):
        raise ValueError("top_k supports fewer than 2**32 scores")
    blocks = blocks if blocks is not None else ScoreBlocks(s, k)
    if blocks.maxima is not None:
        bm = blocks.maxima
        nb = len(bm)
        t = np.partition(bm, nb - k)[nb - k]
        above_t = np.flatnonzero(bm >= t)
        if len(above_t) * 4 <= nb:
            c = blocks.at_least(t, above_t)
            if mask is not None:
                c = c[mask[c]]
            if len(c) >= k:
                return c
        else:
            # Heavy ties at t (typically most scores 0): everything above t, then the
            # highest-index entries equal to t, the exact answer set by the tie rule.
            above = np.flatnonzero(s > t)
            if mask is not None:
                above = above[mask[above]]
            if len(above) >= k:
                return above
            eq = np.flatnonzero(s == t)
            if mask is not None:
                eq = eq[mask[eq]]
            need = k - len(above)
            if len(eq) >= need:
                return np.concatenate((above, eq[len(eq) - need :]))
    return np.flatnonzero(mask) if mask is not None else np.arange(n, dtype=np.int64)


def ranking_order(scores: np.ndarray, newer: np.ndarray) -> np.ndarray:
    """Every position of ``scores``, best first: the higher score, then the higher ``newer`` (the
    record's row, an issue's last activity). The tie rule of :func:`top_k` (which takes
    ``newer`` = the position) for the whole order; equal pairs keep their given order."""
    return np.lexsort((-np.asarray(newer), -np.asarray(scores)))


_AXES = ("keyword", "recency", "lineage", "vector")


@dataclass(frozen=True, eq=False)
class Scored:
    """Per-axis contributions (weight * axis value, float32; None = axis off) and total."""

    total: np.ndarray
    keyword: np.ndarray | None
    recency: np.ndarray | None
    lineage: np.ndarray | None
    vector: np.ndarray | None
    weights: Weights
    mask: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.total)


def score(*, keyword_raw: np.ndarray | None, ended_at_ms: np.ndarray, now_ms: int,
          lineage: np.ndarray | None, vector_cos: np.ndarray | None, weights: Weights,
          mask: np.ndarray | None = None, keyword_max: float | None = None) -> Scored:
    """Combine the axes over all records.

    Args:
        keyword_raw: raw BM25 (normalised here by its max over ``mask``), or None.
        ended_at_ms: int64 endedAt per record (for recency).
        now_ms: the dispatch time, epoch ms.
        lineage: :func:`lineage_affinity` output, or None.
        vector_cos: :func:`cosine` output, or None.
        weights: axis weights; an axis with weight 0 is skipped (contribution None).
        mask: bool array, False = not a candidate (kept for :func:`rank`).
        keyword_max: normalise the keyword axis by this max instead of the one over
            ``mask`` (these records are one part of a larger collection; see :func:`keyword_max`).

    Returns:
        :class:`Scored`.
    """
    ended = np.asarray(ended_at_ms)
    n = len(ended)
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        if len(mask) != n:
            raise ValueError(f"mask has {len(mask)} entries for {n} records")

    def check(name: str, a: np.ndarray | None) -> np.ndarray | None:
        if a is None:
            return None
        a = np.asarray(a, dtype=np.float32)
        if len(a) != n:
            raise ValueError(f"{name} has {len(a)} entries for {n} records")
        return a

    kw, rec, lin, vec = _contributions(check("keyword_raw", keyword_raw), ended, now_ms, check("lineage", lineage),
                                       check("vector_cos", vector_cos), weights, keyword_max, mask)
    return Scored(total=_total(n, kw, rec, lin, vec), keyword=kw, recency=rec, lineage=lin, vector=vec,
                  weights=weights, mask=mask)


def totals(*, keyword_raw: np.ndarray | None, ended_at_ms: np.ndarray, now_ms: int, lineage: np.ndarray | None,
           vector_cos: np.ndarray | None, weights: Weights, keyword_max: float | None) -> np.ndarray:
    """:func:`score`'s ``total`` (the same floats) for float32 axes of equal length and the keyword
    axis' normalising max given: no checks, no per-axis arrays kept (a ranking's few seed rows)."""
    n = len(ended_at_ms)
    return _total(n, *_contributions(keyword_raw, ended_at_ms, now_ms, lineage, vector_cos, weights, keyword_max))


def _contributions(raw: np.ndarray | None, ended: np.ndarray, now_ms: int, lineage: np.ndarray | None,
                   vector_cos: np.ndarray | None, weights: Weights, keyword_max: float | None,
                   mask: np.ndarray | None = None) -> tuple:
    """Each axis' contribution (weight x value, float32; None = off): the ONE place the mix is
    written. The keyword axis is normalised by ``keyword_max``, else by its max over ``mask``."""
    kw = rec = lin = vec = None
    if raw is not None and weights.w_kw > 0:
        kw = normalize_keyword(raw, mask, scale=weights.w_kw, max_value=keyword_max)
    if weights.w_rec > 0:
        rec = recency(ended, now_ms, weights.half_life_days, weight=weights.w_rec)
    if lineage is not None and weights.w_lin > 0:
        lin = lineage * np.float32(weights.w_lin)
    if vector_cos is not None and weights.w_vec > 0:
        vec = vector_cos * np.float32(weights.w_vec)
    return kw, rec, lin, vec


def _total(n: int, *parts: np.ndarray | None) -> np.ndarray:
    """The sum of the axes that are on, in axis order (float32)."""
    on = [c for c in parts if c is not None]
    if not on:
        return np.zeros(n, dtype=np.float32)
    if len(on) == 1:
        return on[0].copy()
    total = on[0] + on[1]
    for c in on[2:]:
        total += c
    return total


def rank(scored: Scored, k: int) -> list[int]:
    """Top-k record indices by total score (ties: newer/higher index first), mask applied."""
    return top_k(scored.total, k, scored.mask).tolist()


def explain(scored: Scored, idx: int) -> dict[str, Any]:
    """Per-axis breakdown of one record's score (:func:`explain_rows` of it alone).

    Returns:
        {"index", "total", "contributions": {axis: w*value}, "values": {axis: value},
        "weights": {...}} with plain floats (0.0 for an axis that is off).
    """
    return explain_rows(scored, [idx])[0]


def explain_rows(scored: Scored, rows: list[int]) -> list[dict[str, Any]]:
    """:func:`explain`'s breakdown of each of ``rows``, each axis read at all of them at once: a
    search's hits, without a pass of numpy scalar reads per hit and axis."""
    if not rows:
        return []
    w = scored.weights
    wmap = {"keyword": w.w_kw, "recency": w.w_rec, "lineage": w.w_lin, "vector": w.w_vec}
    at = np.asarray(rows, dtype=np.int64)
    # tolist() turns float32 into the Python floats float() gives, exactly
    cols = {axis: (arr[at].tolist() if (arr := getattr(scored, axis)) is not None else [0.0] * len(rows)) for axis in _AXES}
    totals = scored.total[at].tolist()
    weights = w.to_dict()
    out = []
    for j, idx in enumerate(rows):
        contrib = {axis: cols[axis][j] for axis in _AXES}
        values = {axis: (c / wmap[axis] if wmap[axis] > 0 else 0.0) for axis, c in contrib.items()}
        out.append({"index": int(idx), "total": totals[j], "contributions": contrib, "values": values,
                    "weights": dict(weights)})
    return out
