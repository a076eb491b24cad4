"""A LightGBM model's trees, evaluated in numpy (no LightGBM at dispatch).

:func:`pack` turns ``booster.dump_model()`` into flat arrays (what the shipped model file holds:
cybmem/retrieval/ranker_model.json); :class:`Forest` evaluates every tree on every row at once, one
level of all trees per step, so a pool of a few hundred candidates and a few hundred trees costs a
few milliseconds. :meth:`Forest.shap` gives each feature's tree SHAP value for a row: path-dependent
TreeSHAP (Lundberg, Erion and Lee 2018, "Consistent individualized feature attribution for tree
ensembles", Algorithm 2), what LightGBM's ``predict(pred_contrib=True)`` computes, from each node's
cover (the training rows that reached it: ``internal_count`` and ``leaf_count``); the values and
the base add up to the score exactly.

Encoding (per tree, internal nodes numbered as LightGBM's ``split_index``): a child ``c >= 0`` is
an internal node, ``c < 0`` is leaf ``-c - 1``. A row goes left when its value is ``<=`` the
threshold (LightGBM's numerical split; the features here are never missing). Format 2 of the
model file adds the covers (``count`` per internal node, ``leaf_count`` per leaf); a format 1 file
predicts but cannot explain.
"""

from __future__ import annotations

import math
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
    count = np.zeros((T, n_int), np.int64)  # training rows that reached each internal node (its cover)
    leaf = np.zeros((T, n_leaf), np.float64)
    leaf_count = np.zeros((T, n_leaf), np.int64)
    for t, tree in enumerate(trees):
        root = tree["tree_structure"]
        if "split_index" not in root:  # a single leaf: its root goes to leaf 0 on either side
            feat[t, 0], thr[t, 0], left[t, 0], right[t, 0] = 0, 0.0, -1, -1
            leaf[t, 0] = root["leaf_value"]
            count[t, 0] = leaf_count[t, 0] = root.get("leaf_count", 1)
            continue
        stack = [root]
        while stack:
            node = stack.pop()
            i = node["split_index"]
            if node.get("decision_type", "<=") != "<=":
                raise ValueError(f"tree {t}: only numerical '<=' splits are supported, not {node['decision_type']}")
            feat[t, i], thr[t, i], count[t, i] = node["split_feature"], node["threshold"], node["internal_count"]
            for side, out in (("left_child", left), ("right_child", right)):
                child = node[side]
                if "split_index" in child:
                    out[t, i] = child["split_index"]
                    stack.append(child)
                else:
                    out[t, i] = -child["leaf_index"] - 1
                    leaf[t, child["leaf_index"]] = child["leaf_value"]
                    leaf_count[t, child["leaf_index"]] = child["leaf_count"]
    return {"features": list(dump.get("feature_names") or []), "feature": feat.tolist(), "threshold": thr.tolist(),
            "left": left.tolist(), "right": right.tolist(), "leaf": leaf.tolist(), "count": count.tolist(),
            "leaf_count": leaf_count.tolist()}


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
    leaf: np.ndarray  # float64 (trees, leaves)
    names: list[str]
    count: np.ndarray | None = None  # int64 (trees, internal nodes): covers (None: a format 1 file)
    leaf_count: np.ndarray | None = None  # int64 (trees, leaves)

    @classmethod
    def from_packed(cls, packed: dict[str, Any]) -> "Forest":
        covers = "count" in packed and "leaf_count" in packed
        return cls(feature=np.asarray(packed["feature"], np.int32), threshold=np.asarray(packed["threshold"], np.float64),
                   left=np.asarray(packed["left"], np.int32), right=np.asarray(packed["right"], np.int32),
                   leaf=np.asarray(packed["leaf"], np.float64), names=list(packed.get("features") or []),
                   count=np.asarray(packed["count"], np.int64) if covers else None,
                   leaf_count=np.asarray(packed["leaf_count"], np.int64) if covers else None)

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
            flat = (self.feature.ravel().astype(np.int64), self.threshold.ravel(), glob(self.left), glob(self.right),
                    self.leaf.ravel(), (np.arange(T) * width).astype(np.int64))
            self.__dict__["_flat_arrays"] = flat
        return flat

    def _walk(self, X: np.ndarray) -> np.ndarray:
        X = _inputs(X).astype(np.float64, copy=False)
        n = X.shape[0]
        T = self.n_trees
        if n == 0 or T == 0:
            return np.zeros(n)
        feat, thr, left, right, leaf, roots = self._flat()
        # Every split of every tree judged for every row at once: one gather and one comparison.
        cond = (X[:, feat] <= thr).ravel()  # (n, nodes) row-major
        width = len(feat)
        node = np.tile(roots, n)
        row_base = np.repeat(np.arange(n, dtype=np.int64) * width, T)
        live = np.arange(n * T)
        while len(live):
            at = node[live]
            child = np.where(cond[row_base[live] + at], left[at], right[at])
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
        None past 10 internal nodes a tree. Built once a process (~3 ms for the shipped model's 500 trees)."""
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
            return self._walk(X)
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

    def _paths(self) -> "_Paths":
        """Every leaf's path (computed once): see :class:`_Paths`."""
        paths = self.__dict__.get("_shap_paths")
        if paths is None:
            if self.count is None or self.leaf_count is None:
                raise ValueError("this model file has no covers (format 1): retrain it (`cybmem ranker train`) "
                                 "to explain its scores")
            paths = self.__dict__["_shap_paths"] = _Paths.of(self)
        return paths

    def shap(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each feature's tree SHAP value for each row of ``X`` (rows x features: path-dependent
        TreeSHAP, as LightGBM's ``pred_contrib=True``) and the base (the trees' expected value over
        their training rows); ``base + values.sum(1) == predict(X)``.

        A tree's score is the sum over its leaves of ``value x prod over the features d on the
        leaf's path of (one_d if d is known else zero_d)``: ``one_d`` is 1 when the row takes the
        leaf's side at every split of the path on d, ``zero_d`` the share of the training rows that
        took those sides (the product of the covers' ratios). That is the expectation TreeSHAP's
        Algorithm 2 assigns to each set of known features, so each feature's Shapley value over a
        leaf's k path features is ``value x (one_i - zero_i) x sum over s of s!(k-s-1)!/k! x
        [t^s] prod over d != i of (zero_d + one_d t)``, summed over leaves and trees. The ``one``s
        are bits, so each leaf's values for all 2**k patterns of them are tabled once
        (:class:`_Paths`); a row then costs one comparison per split and one lookup per leaf."""
        X = _inputs(X).astype(np.float64, copy=False)
        n, F = X.shape
        p = self._paths()
        base = np.full(n, p.base)
        if n == 0 or not p.groups:
            return np.zeros((n, F)), base
        T, width = self.feature.shape
        cond = (X[:, self.feature.ravel()] <= self.threshold.ravel()).reshape(n, T, width)
        code = cond.astype(np.int64) @ (np.int64(1) << np.arange(width, dtype=np.int64))  # (n, trees)
        idx, vals = [], []
        rows = (np.arange(n, dtype=np.int64) * F)[:, None, None]
        for g in p.groups:
            c = code[:, g.tree][:, :, None]  # (n, leaves, 1)
            one = ((c & g.go_left) == g.go_left) & ((~c & g.go_right) == g.go_right)  # (n, leaves, k)
            pattern = one.astype(np.int64) @ (np.int64(1) << np.arange(g.k, dtype=np.int64))  # (n, leaves)
            vals.append(g.table[np.arange(len(g.tree))[None, :], pattern].ravel())  # (n, leaves, k)
            idx.append((rows + g.feature[None, :, :]).ravel())
        out = np.bincount(np.concatenate(idx), weights=np.concatenate(vals), minlength=n * F)
        return out.reshape(n, F), base


@dataclass
class _Group:
    """The leaves (of any tree) whose path splits on ``k`` distinct features: per leaf its tree, and
    per feature slot the feature, the splits on it the path goes left and right at (bit masks over
    the tree's internal nodes); ``table`` (leaves x 2**k x k) each slot's SHAP value for every
    pattern of the slots' ``one`` bits (bit j: slot j)."""

    k: int
    tree: np.ndarray
    feature: np.ndarray
    go_left: np.ndarray
    go_right: np.ndarray
    table: np.ndarray


@dataclass
class _Paths:
    """Every leaf's path, in groups by its number of distinct features, and the forest's expected
    value (``base``: each tree's leaves weighed by their covers)."""

    groups: list[_Group]
    base: float

    @classmethod
    def of(cls, f: Forest) -> "_Paths":
        T, width = f.feature.shape
        if width > 62:
            raise ValueError(f"tree SHAP here handles trees of at most 63 leaves, not {width + 1}")
        # plain lists: a Python walk over numpy scalars is several times slower
        feat, left, right = f.feature.tolist(), f.left.tolist(), f.right.tolist()
        count, leaf_count, leaf = f.count.tolist(), f.leaf_count.tolist(), f.leaf.tolist()
        by_k: dict[int, list[tuple[int, float, list[tuple[int, int, int, float]]]]] = {}
        base = 0.0
        for t in range(T):
            if left[t][0] == -1 and right[t][0] == -1:  # a single leaf: no split
                base += leaf[t][0]
                continue
            root = float(count[t][0])
            # (node, {feature: (left mask, right mask, share of rows)}) along each path
            stack: list[tuple[int, dict[int, tuple[int, int, float]]]] = [(0, {})]
            while stack:
                node, path = stack.pop()
                d, here = feat[t][node], float(count[t][node])
                for child, went_left in ((left[t][node], True), (right[t][node], False)):
                    cover = float(count[t][child] if child >= 0 else leaf_count[t][-child - 1])
                    gl, gr, z = path.get(d, (0, 0, 1.0))
                    bit = 1 << node
                    new = {**path, d: (gl | bit if went_left else gl, gr if went_left else gr | bit,
                                       z * (cover / here if here > 0 else 0.0))}
                    if child >= 0:
                        stack.append((child, new))
                    else:
                        value = leaf[t][-child - 1]
                        base += value * cover / root if root > 0 else 0.0
                        slots = [(dd, a, b, zz) for dd, (a, b, zz) in new.items()]
                        by_k.setdefault(len(slots), []).append((t, value, slots))
        groups = []
        for k, leaves in sorted(by_k.items()):
            tree = np.array([t for t, _, _ in leaves], np.int64)
            value = np.array([v for _, v, _ in leaves])
            slot = np.array([slots for _, _, slots in leaves], dtype=np.float64)  # (m, k, 4)
            feature, go_left, go_right, zero = (slot[..., 0].astype(np.int64), slot[..., 1].astype(np.int64),
                                                slot[..., 2].astype(np.int64), slot[..., 3])
            groups.append(_Group(k, tree, feature, go_left, go_right, _table(value, zero)))
        return cls(groups, base)


def _table(value: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """Each slot's SHAP value for every pattern of ``one`` bits (leaves x 2**k x k) of leaves with
    ``value`` and path shares ``zero`` (leaves x k): ``value x (one_i - zero_i) x sum over s of
    s!(k-s-1)!/k! x [t^s] prod over d != i of (zero_d + one_d t)``."""
    m, k = zero.shape
    one = ((np.arange(1 << k)[:, None] >> np.arange(k)[None, :]) & 1).astype(np.float64)  # (patterns, k)
    z = zero[:, None, :]  # (m, 1, k)
    weight = np.array([math.factorial(s) * math.factorial(k - s - 1) / math.factorial(k) for s in range(k)])
    out = np.empty((m, 1 << k, k))
    for i in range(k):
        poly = np.zeros((m, 1 << k, k))  # coefficients of t^0 .. t^(k-1)
        poly[..., 0] = 1.0
        for d in range(k):
            if d == i:
                continue
            nxt = poly * z[..., d, None]
            nxt[..., 1:] += poly[..., :-1] * one[None, :, d, None]
            poly = nxt
        out[..., i] = value[:, None] * (one[None, :, i] - z[..., i]) * (poly @ weight)
    return out
