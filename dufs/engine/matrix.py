"""The feature-blocked matrix: column statistics and implicitly standardized products (DESIGN.md section 4).

A :class:`Matrix` holds X (n_samples x n_features) as CSC feature blocks, each a run of whole columns as raw
``indptr, indices, data`` buffers. Its products apply the chosen standardization implicitly, never densifying:

- ``"zscore"``: Z = (X - 1 mu^T) S^-1, so Z^T v = S^-1 (X^T v - mu (1^T v)) and Z u = X (S^-1 u) - 1 (mu^T S^-1 u);
- ``"scale"``:  Z = X S^-1 (no centring);
- ``None``:     Z = X;

with S = diag(std) (population standard deviation) and a zero std taken as 1, so constant columns stay zero (or
constant) instead of dividing by zero.

For now the blocks are held by the driver; every pass is one ``dask.compute`` over one delayed task per block (any
scheduler, including an active distributed client) and per-block partial results are combined in block order, in
float64, so results do not depend on the scheduler.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dufs import config
from dufs.errors import ParameterError
from dufs.kernels.blockops import csc_class_stats, csc_column_stats, csc_matvec, csc_rmatvec

__all__ = ["STANDARDIZE", "ColumnStats", "FeatureBlock", "Matrix"]

#: the accepted values of ``Matrix(standardize=...)``
STANDARDIZE = ("zscore", "scale", None)


# ---------------------------------------------------------------------------------------------------- statistics
@dataclass
class ColumnStats:
    """Per-feature statistics over ``n_rows`` samples (implicit zeros included), all float64 but ``nnz``.

    ``m2`` is the centred sum of squares (exact zero for a constant column); it is what :meth:`var` uses, the
    raw ``sumsq`` being kept for callers that want it. The per-class fields are set when labels were given:
    ``classes`` (sorted label values), ``class_count`` (n_classes), ``class_sum`` and ``class_sumsq``
    (n_classes x n_features).

    :meth:`merge` combines the statistics of the same features over two disjoint sets of rows (Chan et al.'s
    update for ``m2``); :meth:`concat` joins statistics of consecutive feature blocks over the same rows.
    """

    n_rows: int
    sum: np.ndarray
    sumsq: np.ndarray
    nnz: np.ndarray
    min: np.ndarray
    max: np.ndarray
    m2: np.ndarray | None = None
    classes: np.ndarray | None = None
    class_count: np.ndarray | None = None
    class_sum: np.ndarray | None = None
    class_sumsq: np.ndarray | None = None

    @property
    def n_features(self) -> int:
        return int(self.sum.shape[0])

    @property
    def has_classes(self) -> bool:
        return self.classes is not None

    def mean(self) -> np.ndarray:
        """Per-feature mean (NaN when there are no rows)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.sum / self.n_rows if self.n_rows else np.full(self.n_features, np.nan)

    def var(self) -> np.ndarray:
        """Per-feature population variance (ddof 0); exactly 0 for a constant feature, NaN when there are no rows."""
        if not self.n_rows:
            return np.full(self.n_features, np.nan)
        if self.m2 is not None:
            v = self.m2 / self.n_rows
        else:
            mu = self.mean()
            v = self.sumsq / self.n_rows - mu * mu
        v = np.maximum(v, 0.0)
        v[self.min == self.max] = 0.0
        return v

    def std(self) -> np.ndarray:
        """Per-feature population standard deviation."""
        return np.sqrt(self.var())

    def class_mean(self) -> np.ndarray:
        """Per-class, per-feature means (n_classes x n_features)."""
        if self.class_sum is None or self.class_count is None:
            raise ParameterError("these column statistics carry no per-class sums: pass y to column_stats")
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.class_sum / self.class_count[:, None]

    # ------------------------------------------------------------------ combining
    def merge(self, other: ColumnStats) -> ColumnStats:
        """Statistics of the same features over the rows of ``self`` and ``other`` together (disjoint rows)."""
        if other.n_features != self.n_features:
            raise ParameterError(f"cannot merge column statistics of {self.n_features} and {other.n_features} "
                                 f"features")
        na, nb = self.n_rows, other.n_rows
        n = na + nb
        if na == 0:
            return replace(other)
        if nb == 0:
            return replace(self)
        m2 = None
        if self.m2 is not None and other.m2 is not None:
            delta = other.sum / nb - self.sum / na
            m2 = self.m2 + other.m2 + delta * delta * (na * nb / n)
        out = ColumnStats(n, self.sum + other.sum, self.sumsq + other.sumsq, self.nnz + other.nnz,
                          np.minimum(self.min, other.min), np.maximum(self.max, other.max), m2)
        if self.has_classes and other.has_classes:
            classes = np.union1d(self.classes, other.classes)
            k, d = classes.shape[0], self.n_features
            cnt = np.zeros(k, dtype=np.int64)
            s = np.zeros((k, d))
            ss = np.zeros((k, d))
            for part in (self, other):
                pos = np.searchsorted(classes, part.classes)
                cnt[pos] += part.class_count
                s[pos] += part.class_sum
                ss[pos] += part.class_sumsq
            out.classes, out.class_count, out.class_sum, out.class_sumsq = classes, cnt, s, ss
        return out

    @classmethod
    def concat(cls, parts: list[ColumnStats]) -> ColumnStats:
        """Statistics of consecutive feature blocks (same rows, same classes) joined along features."""
        if not parts:
            raise ParameterError("ColumnStats.concat needs at least one part")
        n = parts[0].n_rows
        if any(p.n_rows != n for p in parts):
            raise ParameterError("ColumnStats.concat: the parts cover different numbers of rows")

        def cat(name: str, axis: int = 0) -> np.ndarray | None:
            vals = [getattr(p, name) for p in parts]
            return None if any(v is None for v in vals) else np.concatenate(vals, axis=axis)

        out = cls(n, cat("sum"), cat("sumsq"), cat("nnz"), cat("min"), cat("max"), cat("m2"))
        out.classes, out.class_count = parts[0].classes, parts[0].class_count
        out.class_sum, out.class_sumsq = cat("class_sum", 1), cat("class_sumsq", 1)
        return out


# ---------------------------------------------------------------------------------------------------- blocks
@dataclass(frozen=True)
class FeatureBlock:
    """Features ``start:stop`` of X as CSC buffers: ``indptr`` (int64, local), ``indices`` (row numbers), ``data``."""

    start: int
    stop: int
    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray

    @property
    def width(self) -> int:
        return self.stop - self.start

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1])


@dataclass(frozen=True)
class StoreBlock:
    """Feature block ``index`` of the store at ``path``: a reference, loaded where the task runs (on a worker),
    once per process and store, so the driver never holds the data."""

    start: int
    stop: int
    nnz: int
    path: str
    index: int
    created: str | None = None

    @property
    def width(self) -> int:
        return self.stop - self.start

    def load(self) -> FeatureBlock:
        key = (self.path, self.created, self.index)
        got = _LOADED.get(key)
        if got is None:
            from dufs.data import open_store

            b = open_store(self.path).block(self.index, "csc")
            got = FeatureBlock(b.start, b.stop, np.asarray(b.indptr, dtype=np.int64), b.indices, b.data)
            _LOADED.put(key, got)
        return got


class _BlockCache:
    """Blocks loaded in this process, least recently used dropped beyond ``dufs.engine.cache-bytes``."""

    def __init__(self) -> None:
        from collections import OrderedDict

        self._d: OrderedDict = OrderedDict()
        self._bytes = 0

    def get(self, key: tuple) -> FeatureBlock | None:
        b = self._d.get(key)
        if b is not None:
            self._d.move_to_end(key)
        return b

    def put(self, key: tuple, b: FeatureBlock) -> None:
        limit = config.parse_bytes(config.get("engine.cache-bytes"))
        size = b.indptr.nbytes + b.indices.nbytes + b.data.nbytes
        self._d[key] = b
        self._bytes += size
        while self._bytes > limit and len(self._d) > 1:
            _, old = self._d.popitem(last=False)
            self._bytes -= old.indptr.nbytes + old.indices.nbytes + old.data.nbytes


_LOADED = _BlockCache()


def resolve(b: FeatureBlock | StoreBlock) -> FeatureBlock:
    """The buffers of a block (loading a store block where this runs)."""
    return b.load() if isinstance(b, StoreBlock) else b


def _block_stats(src, n_rows, codes, n_classes):
    b = resolve(src)
    indptr, indices, data = b.indptr, b.indices, b.data
    s, ss, m2, nnz, mn, mx = csc_column_stats(indptr, indices, data, n_rows)
    out = ColumnStats(n_rows, s, ss, nnz, mn, mx, m2)
    if codes is not None:
        out.class_sum, out.class_sumsq = csc_class_stats(indptr, indices, data, codes, n_classes)
    return out


def _block_rmatvec(src, V, vsum, mu, inv):
    b = resolve(src)
    indptr, indices, data = b.indptr, b.indices, b.data
    out = np.empty((indptr.shape[0] - 1, V.shape[1]), dtype=np.float64)
    csc_rmatvec(indptr, indices, data, V, out)
    if mu is not None:
        out -= mu[:, None] * vsum[None, :]
    if inv is not None:
        out *= inv[:, None]
    return out


def _block_matvec(src, W, n_rows):
    b = resolve(src)
    indptr, indices, data = b.indptr, b.indices, b.data
    out = np.zeros((n_rows, W.shape[1]), dtype=np.float64)
    csc_matvec(indptr, indices, data, W, out)
    return out


def _compute(tasks: list) -> list:
    import dask

    return list(dask.compute(*tasks)) if tasks else []


def _delayed(fn):
    import dask

    return dask.delayed(fn, pure=False)


# ---------------------------------------------------------------------------------------------------- the matrix
class Matrix:
    """X (n_samples x n_features) as CSC feature blocks, with implicit standardization.

    Parameters
    ----------
    X : SparseStore, str or path-like (a store), SciPy sparse matrix/array or 2-D NumPy array
        A store is read block by block (its CSC feature blocks); an in-memory matrix is cut into blocks of
        ``block_width`` features.
    standardize : {"zscore", "scale", None}
        The transform applied inside every product (see the module docstring).
    block_width : int, optional
        Features per block for in-memory input; by default about ``dufs.store.feature-block-nnz`` nonzeros
        per block. Ignored for a store (its own blocks are used).
    y : array-like, optional
        Labels (n_samples); for a store, its labels by default.
    """

    def __init__(self, X: Any, *, standardize: str | None = None, block_width: int | None = None,
                 y: Any = None):
        if standardize not in STANDARDIZE:
            raise ParameterError(f"The 'standardize' parameter must be one of 'zscore', 'scale' or None; got "
                                 f"{standardize!r}.")
        self.standardize = standardize
        if isinstance(X, str | os.PathLike):
            from dufs.data import open_store

            X = open_store(X)
        from dufs.data import SparseStore

        if isinstance(X, SparseStore):
            self.shape = X.shape
            self.blocks = _blocks_from_store(X)
            labels = X.y if y is None else y
            self.dtype = X.dtype
        else:
            self.blocks, self.shape, self.dtype = _blocks_from_array(X, block_width)
            labels = y
        self.y = None if labels is None else np.asarray(labels, dtype=np.float64)
        if self.y is not None and self.y.shape != (self.shape[0],):
            raise ParameterError(f"X has {self.shape[0]} rows but y has shape {self.y.shape}")
        self._stats: ColumnStats | None = None

    # ------------------------------------------------------------------ description
    def __repr__(self) -> str:
        n, d = self.shape
        return (f"<dufs.engine.Matrix {n} x {d}, nnz={self.nnz}, {self.n_blocks} feature blocks, "
                f"standardize={self.standardize!r}>")

    @property
    def n_blocks(self) -> int:
        return len(self.blocks)

    @property
    def nnz(self) -> int:
        return sum(b.nnz for b in self.blocks)

    @property
    def bounds(self) -> np.ndarray:
        """Block boundaries: block i covers features ``bounds[i]:bounds[i+1]``."""
        return np.array([0] + [b.stop for b in self.blocks], dtype=np.int64)

    def with_standardize(self, standardize: str | None) -> Matrix:
        """The same blocks (shared, not copied) and statistics under another standardization."""
        if standardize not in STANDARDIZE:
            raise ParameterError(f"The 'standardize' parameter must be one of 'zscore', 'scale' or None; got "
                                 f"{standardize!r}.")
        out = object.__new__(Matrix)
        out.__dict__.update(self.__dict__)
        out.standardize = standardize
        return out

    def to_scipy(self) -> Any:
        """X (untransformed) as a SciPy ``csc_array``: for small matrices and tests."""
        import scipy.sparse as sp

        n, d = self.shape
        if not self.blocks:
            return sp.csc_array((n, d), dtype=self.dtype)
        blocks = [resolve(b) for b in self.blocks]
        indptr = [np.zeros(1, dtype=np.int64)]
        off = 0
        for b in blocks:
            indptr.append(b.indptr[1:] + off)
            off += b.nnz
        return sp.csc_array((np.concatenate([b.data for b in blocks]),
                             np.concatenate([b.indices for b in blocks]), np.concatenate(indptr)),
                            shape=(n, d))

    # ------------------------------------------------------------------ statistics
    def column_stats(self, y: Any = None) -> ColumnStats:
        """Per-feature statistics of X (untransformed) in one pass; per-class sums too when ``y`` is given."""
        n, d = self.shape
        codes = classes = counts = None
        k = 0
        if y is not None:
            y = np.asarray(y, dtype=np.float64)
            if y.shape != (n,):
                raise ParameterError(f"X has {n} rows but y has shape {y.shape}")
            classes, codes, counts = np.unique(y, return_inverse=True, return_counts=True)
            codes = codes.astype(np.int64).reshape(-1)
            k = classes.shape[0]
        f = _delayed(_block_stats)
        parts = _compute([f(b, n, codes, k) for b in self.blocks])
        if parts:
            st = ColumnStats.concat(parts)
        else:
            e = np.zeros(0)
            st = ColumnStats(n, e, e.copy(), np.zeros(0, np.int64), e.copy(), e.copy(), e.copy())
            if y is not None:
                st.class_sum, st.class_sumsq = np.zeros((k, 0)), np.zeros((k, 0))
        if y is not None:
            st.classes, st.class_count = classes, counts.astype(np.int64)
        return st

    def _transform(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """``(mu, 1/std)`` of the standardization (None where the transform leaves that part out)."""
        if self.standardize is None:
            return None, None
        if self._stats is None:
            self._stats = self.column_stats()
        sd = self._stats.std()
        sd = np.where((sd > 0) & np.isfinite(sd), sd, 1.0)
        inv = 1.0 / sd
        if self.standardize == "scale":
            return None, inv
        mu = np.nan_to_num(self._stats.mean(), nan=0.0)
        return mu, inv

    @property
    def center(self) -> np.ndarray:
        """The per-feature shift of the standardization (zeros unless ``"zscore"``)."""
        mu, _ = self._transform()
        return np.zeros(self.shape[1]) if mu is None else mu

    @property
    def scale(self) -> np.ndarray:
        """The per-feature divisor of the standardization (ones for None; a zero std is taken as 1)."""
        _, inv = self._transform()
        return np.ones(self.shape[1]) if inv is None else 1.0 / inv

    # ------------------------------------------------------------------ products
    def rmatvec(self, V: Any) -> np.ndarray:
        """Z^T V for a dense ``V`` of shape (n_samples,) or (n_samples, p); float64 (n_features,) or (n_features, p)."""
        n, d = self.shape
        V2, one = _as_2d(V, n, "V", "n_samples")
        mu, inv = self._transform()
        vsum = V2.sum(axis=0) if mu is not None else None
        f = _delayed(_block_rmatvec)
        parts = _compute([f(b, V2, vsum,
                            None if mu is None else mu[b.start:b.stop],
                            None if inv is None else inv[b.start:b.stop]) for b in self.blocks])
        out = np.concatenate(parts, axis=0) if parts else np.zeros((d, V2.shape[1]))
        return out[:, 0] if one else out

    def map_blocks(self, fn: Any, *args: Any, **kwargs: Any) -> list:
        """``fn(block, *args, **kwargs)`` for every feature block, run where the block is loaded (a task per block,
        one pass); results (small) come back in block order. ``block`` is a :class:`FeatureBlock`."""
        f = _delayed(_map_one)
        return _compute([f(fn, b, args, kwargs) for b in self.blocks])

    def matvec(self, U: Any) -> np.ndarray:
        """Z U for a dense ``U`` of shape (n_features,) or (n_features, p); float64 (n_samples,) or (n_samples, p).

        Per-block partial products are summed in block order.
        """
        n, d = self.shape
        U2, one = _as_2d(U, d, "U", "n_features")
        mu, inv = self._transform()
        W = U2 * inv[:, None] if inv is not None else U2
        f = _delayed(_block_matvec)
        parts = _compute([f(b, np.ascontiguousarray(W[b.start:b.stop]), n)
                          for b in self.blocks])
        out = np.zeros((n, U2.shape[1]))
        for p in parts:
            out += p
        if mu is not None:
            out -= (mu @ W)[None, :]
        return out[:, 0] if one else out


def _map_one(fn, src, args, kwargs):
    return fn(resolve(src), *args, **kwargs)


def _as_2d(V: Any, n: int, name: str, what: str) -> tuple[np.ndarray, bool]:
    V = np.asarray(V, dtype=np.float64)
    if V.ndim not in (1, 2) or V.shape[0] != n:
        raise ParameterError(f"The '{name}' parameter must have shape ({what},) or ({what}, p) with {what}={n}; "
                             f"got {V.shape}.")
    one = V.ndim == 1
    return np.ascontiguousarray(V[:, None] if one else V), one


def _blocks_from_store(store: Any) -> list[StoreBlock]:
    bounds, nnz = store.bounds("csc"), store.block_nnz("csc")
    created = store.attrs.get("created")
    return [StoreBlock(int(bounds[i]), int(bounds[i + 1]), int(nnz[i]), store.path, i, created)
            for i in range(store.n_blocks("csc"))]


def _blocks_from_array(X: Any, block_width: int | None) -> tuple[list[FeatureBlock], tuple[int, int], np.dtype]:
    import scipy.sparse as sp

    if sp.issparse(X):
        A = sp.csc_array(X, copy=True)
    elif isinstance(X, np.ndarray):
        if X.ndim != 2:
            raise ParameterError(f"The 'X' parameter must be 2-D; got {X.ndim}-D.")
        A = sp.csc_array(X)
    else:
        raise ParameterError(f"The 'X' parameter must be a SparseStore, a store path, a SciPy sparse matrix or a "
                             f"NumPy array; got {type(X).__name__}.")
    if A.dtype.kind != "f":
        A = A.astype(np.float64)
    A.sum_duplicates()
    A.eliminate_zeros()
    A.sort_indices()
    n, d = (int(s) for s in A.shape)
    if block_width is None:
        target = max(1, int(config.get("store.feature-block-nnz")))
        nb = max(1, math.ceil(A.nnz / target))
        block_width = max(1, math.ceil(d / nb))
    block_width = int(block_width)
    if block_width < 1:
        raise ParameterError(f"The 'block_width' parameter must be an int >= 1; got {block_width}.")
    indptr = A.indptr.astype(np.int64)
    blocks = []
    for a in range(0, d, block_width):
        b = min(d, a + block_width)
        lo, hi = indptr[a], indptr[b]
        blocks.append(FeatureBlock(a, b, indptr[a:b + 1] - lo, A.indices[lo:hi].astype(np.int32),
                                   A.data[lo:hi].copy()))
    return blocks, (n, d), A.dtype

