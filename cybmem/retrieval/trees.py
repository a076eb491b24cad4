"""A LightGBM model's trees, evaluated in numpy (no LightGBM at dispatch).

:func:`pack` turns ``booster.dump_model()`` into flat arrays (what the shipped model file holds:
cybmem/retrieval/ranker_model.json); :class:`Forest` evaluates every tree on every row at once, one
level of all trees per step, so a pool of a few hundred candidates and a few hundred trees costs a
few milliseconds. The same walk gives each feature's contribution to a row's score by Saabas'
method (the change of the expected value along the row's path, credited to the split's feature:
Saabas 2014, "Interpreting random forests"): the contributions and the base add up to the score
exactly, like tree SHAP's, but they are not the Shapley values LightGBM's ``pred_contrib=True``
computes (tests/retrieval/test_ranker.py compares the two: the same sign and order of magnitude for the
features that matter).

Encoding (per tree, internal nodes numbered as LightGBM's ``split_index``): a child ``c >= 0`` is
an internal node, ``c < 0`` is leaf ``-c - 1``. A row goes left when its value is ``<=`` the
threshold (LightGBM's numerical split; the features here are never missing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ZERO_THRESHOLD", "Forest", "pack"]


def pack(dump: dict[str, Any]) -> dict[str, Any]:
    """The arrays of ``booster.dump_model()``'s trees, as JSON-able lists (see the module docstring)."""
    trees = dump["tree_info"]
    n_int = max(1, max(t["num_leaves"] - 1 for t in trees))
    n_leaf = max(t["num_leaves"] for t in trees)
    T = len(trees)
    feat = np.zeros((T, n_int), np.int32)
    thr = np.zeros((T, n_int), np.float64)
    left = np.full((T, n_int), -1, np.int32)
    right = np.full((T, n_int), -1, np.int32)
    value = np.zeros((T, n_int), np.float64)  # internal nodes' expected value (Saabas)
    leaf = np.zeros((T, n_leaf), np.float64)
    for t, tree in enumerate(trees):
        root = tree["tree_structure"]
        if "split_index" not in root:  # a single leaf: its root goes to leaf 0 on either side
            feat[t, 0], thr[t, 0], left[t, 0], right[t, 0], value[t, 0] = 0, 0.0, -1, -1, root["leaf_value"]
            leaf[t, 0] = root["leaf_value"]
            continue
        stack = [root]
        while stack:
            node = stack.pop()
            i = node["split_index"]
            if node.get("decision_type", "<=") != "<=":
                raise ValueError(f"tree {t}: only numerical '<=' splits are supported, not {node['decision_type']}")
            feat[t, i], thr[t, i], value[t, i] = node["split_feature"], node["threshold"], node["internal_value"]
            for side, out in (("left_child", left), ("right_child", right)):
                child = node[side]
                if "split_index" in child:
                    out[t, i] = child["split_index"]
                    stack.append(child)
                else:
                    out[t, i] = -child["leaf_index"] - 1
                    leaf[t, child["leaf_index"]] = child["leaf_value"]
    return {"features": list(dump.get("feature_names") or []), "feature": feat.tolist(), "threshold": thr.tolist(),
            "left": left.tolist(), "right": right.tolist(), "value": value.tolist(), "leaf": leaf.tolist()}


#: LightGBM reads a value within this of zero as zero (its kZeroThreshold, the float 1e-35f),
#: when it trains and when it predicts.
ZERO_THRESHOLD = float(np.float32(1e-35))


def _inputs(X: np.ndarray) -> np.ndarray:
    """``X`` as LightGBM's predictor sees it: float32 kept (see :meth:`Forest.predict`), anything else
    as float64, values within :data:`ZERO_THRESHOLD` of zero as zero (a float32 ``exp(-age / 1 h)``
    of a run days old is such a denormal, and a split at zero has its threshold at -1e-35)."""
    X = np.asarray(X)
    if X.dtype != np.float32:
        X = X.astype(np.float64)
    tiny = np.abs(X) <= ZERO_THRESHOLD
    return np.where(tiny, X.dtype.type(0), X) if tiny.any() else X


@dataclass
class Forest:
    """Packed trees (:func:`pack`) ready to evaluate."""

    feature: np.ndarray  # int32 (trees, internal nodes)
    threshold: np.ndarray  # float64
    left: np.ndarray  # int32: >= 0 internal node, < 0 leaf -c - 1
    right: np.ndarray
    value: np.ndarray  # float64: each internal node's expected value
    leaf: np.ndarray  # float64 (trees, leaves)
    names: list[str]

    @classmethod
    def from_packed(cls, packed: dict[str, Any]) -> "Forest":
        return cls(feature=np.asarray(packed["feature"], np.int32), threshold=np.asarray(packed["threshold"], np.float64),
                   left=np.asarray(packed["left"], np.int32), right=np.asarray(packed["right"], np.int32),
                   value=np.asarray(packed["value"], np.float64), leaf=np.asarray(packed["leaf"], np.float64),
                   names=list(packed.get("features") or []))

    @property
    def n_trees(self) -> int:
        return int(self.feature.shape[0])

    def _flat(self) -> tuple[np.ndarray, ...]:
        """The trees as one flat node list: a node's global id is ``tree * width + node``; children
        are global ids, leaves ``-(tree * leaves + leaf) - 1``; computed once."""
        flat = self.__dict__.get("_flat_arrays")
        if flat is None:
            T, width = self.feature.shape
            leaves = self.leaf.shape[1]
            base = (np.arange(T) * width)[:, None]
            lbase = (np.arange(T) * leaves)[:, None]
            glob = lambda c: np.where(c >= 0, c + base, -(lbase + (-c - 1)) - 1).ravel().astype(np.int64)  # noqa: E731
            left, right = glob(self.left), glob(self.right)
            value = self.value.ravel()
            leaf = self.leaf.ravel()
            after = lambda c: np.where(c >= 0, value[np.maximum(c, 0)], leaf[np.maximum(-c - 1, 0)])  # noqa: E731
            flat = (self.feature.ravel().astype(np.int64), self.threshold.ravel(), left, right, leaf,
                    after(left) - value, after(right) - value, (np.arange(T) * width).astype(np.int64))
            self.__dict__["_flat_arrays"] = flat
        return flat

    def _walk(self, X: np.ndarray, contrib: np.ndarray | None) -> np.ndarray:
        X = _inputs(X).astype(np.float64, copy=False)
        n = X.shape[0]
        T = self.n_trees
        if n == 0 or T == 0:
            return np.zeros(n)
        feat, thr, left, right, leaf, d_left, d_right, roots = self._flat()
        # Every split of every tree judged for every row at once: one gather and one comparison.
        cond = (X[:, feat] <= thr).ravel()  # (n, nodes) row-major
        width = len(feat)
        node = np.tile(roots, n)
        row_base = np.repeat(np.arange(n, dtype=np.int64) * width, T)
        live = np.arange(n * T)
        while len(live):
            at = node[live]
            go_left = cond[row_base[live] + at]
            if contrib is not None:
                delta = np.where(go_left, d_left[at], d_right[at])
                np.add.at(contrib.ravel(), row_base[live] // width * X.shape[1] + feat[at], delta)
            child = np.where(go_left, left[at], right[at])
            node[live] = child
            live = live[child >= 0]
        return leaf[-node - 1].reshape(n, T).sum(axis=1)

    def _leaf_paths(self) -> tuple[np.ndarray, np.ndarray]:
        """Each leaf's path as two bit masks over its tree's internal nodes (trees x leaves): the nodes
        on the path (``mask``) and those where it goes left (``pattern``). A row reaches a leaf when
        its code (bit i set when it goes left at node i) ``& mask == pattern``. Found in one pass over
        the node numbers, all trees at once: LightGBM numbers a split after its parent's, so a node's
        path is known before its children are reached. A padded leaf gets an impossible pair (0, 1)."""
        T, width = self.feature.shape
        L = self.leaf.shape[1]
        trees = np.arange(T)
        node_mask = np.zeros((T, width), np.int64)
        node_pat = np.zeros((T, width), np.int64)
        real = np.zeros((T, width), bool)
        real[:, 0] = True
        mask = np.zeros((T, L), np.int64)
        pattern = np.ones((T, L), np.int64)
        for i in range(width):
            bit = np.int64(1) << i
            for children, left in ((self.left, True), (self.right, False)):
                c = children[:, i]
                m = node_mask[:, i] | bit
                p = node_pat[:, i] | bit if left else node_pat[:, i]
                inner = real[:, i] & (c >= 0)
                node_mask[trees[inner], c[inner]] = m[inner]
                node_pat[trees[inner], c[inner]] = p[inner]
                real[trees[inner], c[inner]] = True
                out = real[:, i] & (c < 0)
                mask[trees[out], -c[out] - 1] = m[out]
                pattern[trees[out], -c[out] - 1] = p[out]
        single = (self.left[:, 0] < 0) & (self.left[:, 0] == self.right[:, 0])  # one leaf: reached whatever
        mask[single, 0] = 0
        pattern[single, 0] = 0
        return mask, pattern

    def _table(self) -> np.ndarray | None:
        """Each tree's score for every outcome of its splits (trees x 2**internal nodes, flat: tree t's
        outcome ``code`` at ``t * 2**width + code``), from the leaves' paths (:meth:`_leaf_paths`);
        None past 10 internal nodes a tree. Built once, in well under a millisecond for the shipped model."""
        if "_value_table" in self.__dict__:
            return self.__dict__["_value_table"]
        T, width = self.feature.shape
        table = None
        if width <= 10:
            mask, pattern = self._leaf_paths()
            codes = np.arange(1 << width, dtype=np.int64)
            reached = (codes[None, None, :] & mask[:, :, None]) == pattern[:, :, None]  # trees x leaves x codes
            table = np.take_along_axis(self.leaf, reached.argmax(axis=1), axis=1).ravel()  # one leaf a code
        self.__dict__["_value_table"] = table
        return table

    def _thresholds32(self) -> np.ndarray:
        """The thresholds as float32 rounded down: for a float32 ``x``, ``x <= t32`` exactly when
        ``float64(x) <= threshold`` (LightGBM's comparison), at half the bytes."""
        t32 = self.__dict__.get("_t32")
        if t32 is None:
            thr = self.threshold.ravel()
            t32 = thr.astype(np.float32)
            t32 = self.__dict__["_t32"] = np.where(t32 > thr, np.nextafter(t32, np.float32(-np.inf)), t32)
        return t32

    def predict(self, X: np.ndarray) -> np.ndarray:
        """The model's raw score of each row of ``X`` (rows x features), as LightGBM's ``predict``:
        every split of every tree judged for every row at once (features by rows, so each split reads
        one contiguous row of values), the outcomes packed into one code a tree, each tree's score
        looked up by its code."""
        table = self._table()
        if table is None:
            return self._walk(X, None)
        X = _inputs(X)
        n = X.shape[0]
        T, width = self.feature.shape
        if n == 0 or T == 0:
            return np.zeros(n)
        thr = self._thresholds32() if X.dtype == np.float32 else self.threshold.ravel()
        cond = (np.ascontiguousarray(X.T)[self.feature.ravel()] <= thr[:, None]).reshape(T, width, n)
        code = cond[:, 0, :].astype(np.int64)
        for i in range(1, width):
            code |= cond[:, i, :].astype(np.int64) << i
        code += (np.arange(T, dtype=np.int64) << width)[:, None]
        return table[code].sum(axis=0)

    def contributions(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each feature's Saabas contribution to each row's score (rows x features) and the base
        (the trees' expected value at their roots); ``base + contributions.sum(1) == predict(X)``."""
        X = np.asarray(X, dtype=np.float64)
        contrib = np.zeros((X.shape[0], X.shape[1]))
        self._walk(X, contrib)  # contrib is C-contiguous: its ravel() is a view
        base = float(self.value[:, 0].sum())  # a single-leaf tree's root value is its leaf
        return contrib, np.full(X.shape[0], base)
