"""The feature-blocked matrix: column statistics and implicitly standardized products (docs/architecture.md,
"The engine").

A :class:`Matrix` holds X (n_samples x n_features) as CSC feature blocks, each a run of whole columns as raw
``indptr, indices, data`` buffers. Its products apply the chosen standardization implicitly, never densifying:

- ``"zscore"``: Z = (X - 1 mu^T) S^-1, so Z^T v = S^-1 (X^T v - mu (1^T v)) and Z u = X (S^-1 u) - 1 (mu^T S^-1 u);
- ``"scale"``:  Z = X S^-1 (no centring);
- ``None``:     Z = X;

with S = diag(std) (population standard deviation) and a zero std taken as 1, so constant columns stay zero (or
constant) instead of dividing by zero.

Blocks live on the workers: persisted in their memory when the cluster holds them (:meth:`Matrix.persist`,
placed by nnz), else re-read from the store each pass (a per-process cache keeps recently used blocks). Every pass
is one ``dask.compute`` over one task per block on whatever scheduler is current (a distributed client, threads,
or synchronous); per-block partial results are combined in float64 in a fixed order (concatenation in block order,
or a fixed pairwise tree for sums), so results do not depend on the number of workers.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import os
import uuid
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from dask.sizeof import sizeof

from dufs import config
from dufs._logging import get_logger
from dufs.engine.progress import run_pass
from dufs.errors import ParameterError
from dufs.kernels.blockops import col_sums, csc_class_stats, csc_column_stats, csc_matvec, csc_rmatvec

__all__ = ["STANDARDIZE", "BlockState", "ColumnStats", "FeatureBlock", "Matrix", "PerBlock", "as_matrix",
           "check_finite", "check_labels", "input_identity"]

log = get_logger(__name__)

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

    @property
    def nbytes(self) -> int:
        return int(self.indptr.nbytes + self.indices.nbytes + self.data.nbytes)

    def to_scipy(self, n_rows: int) -> Any:
        """The block as a SciPy ``csc_array`` (n_rows x width), sharing the buffers."""
        import scipy.sparse as sp

        return sp.csc_array((self.data, self.indices, self.indptr), shape=(n_rows, self.width))


@sizeof.register(FeatureBlock)
def _sizeof_block(b: FeatureBlock) -> int:
    return b.nbytes + 64


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

    def read(self) -> FeatureBlock:
        """Read the block from the store (no caching)."""
        from dufs.data import open_store

        b = open_store(self.path).block(self.index, "csc")
        return FeatureBlock(b.start, b.stop, np.asarray(b.indptr, dtype=np.int64), b.indices, b.data)

    def load(self) -> FeatureBlock:
        """The block, read once per process and kept in the least-recently-used cache ``_LOADED``."""
        key = (self.path, self.created, self.index)
        got = _LOADED.get(key)
        if got is None:
            got = self.read()
            _LOADED.put(key, got)
        return got


@dataclass(frozen=True)
class BlockInfo:
    """Where a block sits in X: features ``start:stop``, ``nnz`` nonzeros (-1 until known)."""

    start: int
    stop: int
    nnz: int = -1

    @property
    def width(self) -> int:
        return self.stop - self.start


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
        self._d[key] = b
        self._bytes += b.nbytes
        while self._bytes > limit and len(self._d) > 1:
            _, old = self._d.popitem(last=False)
            self._bytes -= old.nbytes


_LOADED = _BlockCache()


def resolve(b: Any) -> FeatureBlock:
    """The buffers of a block (loading a store block where this runs)."""
    return b.load() if isinstance(b, StoreBlock) else b


def _materialize(b: Any) -> FeatureBlock:
    """A block's buffers for persisting: a store block is read afresh (not through the cache, so it is held once)."""
    return b.read() if isinstance(b, StoreBlock) else b


@dataclass(frozen=True)
class PerBlock:
    """An argument of :meth:`Matrix.map_blocks` given block by block: an array over features is sliced to each
    block's ``start:stop`` (along axis 0); a list or tuple with one item per block gives each block its item."""

    value: Any


class BlockState:
    """Per-block state of :meth:`Matrix.map_blocks`, one item per block, kept where the blocks are (futures on
    the workers under a distributed client, plain values otherwise). ``gather()`` brings it to the driver."""

    def __init__(self, items: list, client: Any = None):
        self.items = list(items)
        self._client = client

    def __len__(self) -> int:
        return len(self.items)

    def gather(self) -> list:
        if self._client is not None:
            return list(self._client.gather(self.items))
        return list(self.items)

    def release(self) -> None:
        """Drop the state (frees the workers' memory)."""
        if self._client is not None:
            for f in self.items:
                f.release()
        self.items = []


# ---------------------------------------------------------------------------------------------------- per-block work
def _block_stats(src, n_rows, codes, n_classes):
    b = resolve(src)
    indptr, indices, data = b.indptr, b.indices, b.data
    s, ss, m2, nnz, mn, mx = csc_column_stats(indptr, indices, data, n_rows)
    out = ColumnStats(n_rows, s, ss, nnz, mn, mx, m2)
    if codes is not None:
        out.class_sum, out.class_sumsq = csc_class_stats(indptr, indices, data, codes, n_classes)
    return out


def _block_rmatvec(src, V, vsum, tf):
    mu, inv = tf
    b = resolve(src)
    out = np.empty((b.indptr.shape[0] - 1, V.shape[1]), dtype=np.float64)
    csc_rmatvec(b.indptr, b.indices, b.data, V, out)
    if mu is not None:
        out -= mu[:, None] * vsum[None, :]
    if inv is not None:
        out *= inv[:, None]
    return out


def _block_matvec(src, W, n_rows):
    b = resolve(src)
    out = np.zeros((n_rows, W.shape[1]), dtype=np.float64)
    csc_matvec(b.indptr, b.indices, b.data, np.ascontiguousarray(W), out)
    return out


def _block_columns(src, local):
    """Columns ``local`` (block-local positions) of a block as (indptr, indices, data)."""
    b = resolve(src)
    lo, hi = b.indptr[local], b.indptr[local + 1]
    counts = hi - lo
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    runs = [np.arange(a, c) for a, c in zip(lo, hi, strict=True)]
    take = np.concatenate(runs) if runs else np.zeros(0, np.int64)
    return indptr, b.indices[take], b.data[take]


def _block_topk(src, fn, k, largest, args, kwargs, start):
    s = np.asarray(fn(resolve(src), *args, **kwargs), dtype=np.float64).ravel()
    return _local_topk(s, k, largest, start)


def _local_topk(s: np.ndarray, k: int, largest: bool, start: int) -> tuple[np.ndarray, np.ndarray]:
    key = np.where(np.isnan(s), np.inf, -s if largest else s)
    ids = np.arange(s.shape[0], dtype=np.int64)
    kk = min(k, s.shape[0])
    if kk < s.shape[0]:
        part = np.argpartition(key, kk - 1)[:kk + 0]
        # keep every feature tied with the k-th, so the global tie-break (lower index first) is exact
        kth = key[part].max()
        part = np.flatnonzero(key <= kth)
    else:
        part = ids
    # NaN after every number (an infinite score in the worst direction included), then the key, then the index
    order = np.lexsort((part, key[part], np.isnan(s[part])))[:kk]
    sel = part[order]
    return sel + start, s[sel]


def _block_slab(start, stop, n_rows, chunks):
    """A feature block from the row chunks of one column slab of a Dask array (dense or sparse chunks)."""
    import scipy.sparse as sp

    parts = []
    for c in chunks:
        if hasattr(c, "to_scipy_sparse"):
            c = c.to_scipy_sparse()
        parts.append(sp.csc_array(c) if sp.issparse(c) else sp.csc_array(np.asarray(c)))
    A = sp.csc_array(sp.vstack(parts, format="csc")) if len(parts) > 1 else parts[0]
    if A.shape != (n_rows, stop - start):
        raise ParameterError(f"a column slab of the Dask array has shape {A.shape}, expected {(n_rows, stop - start)}")
    if A.dtype.kind != "f":
        A = A.astype(np.float64)
    A.sum_duplicates()
    A.eliminate_zeros()
    A.sort_indices()
    check_finite(A.data, A.indices, A.indptr, col0=start, where=f"features {start}-{stop - 1} of the Dask array")
    return FeatureBlock(start, stop, A.indptr.astype(np.int64), A.indices.astype(np.int32), A.data)


def _nnz_of(b: FeatureBlock) -> tuple[int, int]:
    return b.nnz, b.nbytes


def _gather_block(b: FeatureBlock) -> FeatureBlock:
    return b


def _map_one(fn, src, args, kwargs):
    return fn(resolve(src), *args, **kwargs)


def _map_group(fn, srcs, args, kwargs):
    return fn([resolve(s) for s in srcs], *args, **kwargs)


def _map_state(fn, src, state, args, kwargs):
    out = fn([resolve(s) for s in src] if isinstance(src, list) else resolve(src), state, *args, **kwargs)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise ParameterError("a map_blocks function given state= must return (new_state, result)")
    return out


def _add(a, b):
    return a + b


def _tree_sum(parts: list) -> Any:
    """Sum delayed values pairwise in a fixed tree (the order depends only on the number of parts)."""
    import dask

    if _INLINE.get():
        return _tree_sum_values(parts)
    add = dask.delayed(_add, pure=True)
    while len(parts) > 1:
        nxt = [add(parts[i], parts[i + 1]) for i in range(0, len(parts) - 1, 2)]
        if len(parts) % 2:
            nxt.append(parts[-1])
        parts = nxt
    return parts[0]


# Set while a small matrix in this process runs a pass (see ``Matrix._inline``): the "tasks" are then the block
# results themselves, computed as the pass is built, with no Dask graph.
_INLINE: contextvars.ContextVar[bool] = contextvars.ContextVar("dufs_inline_pass", default=False)


def _delayed(fn, pure: bool = False):
    if _INLINE.get():
        return fn
    import dask

    return dask.delayed(fn, pure=pure)


def _inline_when_small(method):
    """Run ``method``'s passes inline (in this process, block after block, no graph) when ``self._inline()``."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        token = _INLINE.set(self._inline())
        try:
            return method(self, *args, **kwargs)
        finally:
            _INLINE.reset(token)

    return wrapper


def _share(x: Any) -> Any:
    """A large argument as one key, so a pass ships it once, not once a task: under a distributed client a
    scattered future (released with the pass's last reference to it; a literal in the graph would stay in the
    scheduler after the pass, see ``_shipped``), else a graph key."""
    import dask

    if _INLINE.get():
        return x
    if isinstance(x, np.ndarray) and x.nbytes >= 1 << 16 or _is_scipy(x):
        client = _client()
        if client is not None:
            return client.scatter(x, hash=False)
        return dask.delayed(x, name=f"dufs-arg-{uuid.uuid4().hex}", pure=False)
    return x


@contextlib.contextmanager
def _shipped(x: Any) -> Any:
    """``x`` (an array, or a list sent item by item) scattered to the cluster for one pass and released after; in
    this process, ``x`` itself. A literal array in a graph is kept by the scheduler after the pass (measured with
    distributed 2026.8: the received frames of ``rmatvec``'s arguments, about their size a pass, never freed), so
    the data of a pass travels as scattered keys instead."""
    client = _client()
    if client is None or x is None:
        yield x
        return
    futs = client.scatter(x, hash=False)
    try:
        yield futs
    finally:
        for f in futs if isinstance(futs, list) else [futs]:
            f.release()


def _is_scipy(x: Any) -> bool:
    return type(x).__module__.startswith("scipy.sparse")


def _compute(tasks: list) -> list:
    import dask

    if _INLINE.get():
        return list(tasks)
    return list(dask.compute(*tasks)) if tasks else []


def _client() -> Any:
    from dufs.engine.cluster import active_client

    return active_client()


# ---------------------------------------------------------------------------------------------------- the matrix
class Matrix:
    """X (n_samples x n_features) as CSC feature blocks, with implicit standardization.

    Build it with :func:`as_matrix` (any input kind, persisted on the cluster) or directly from a store or an
    in-memory matrix.

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

    Attributes
    ----------
    residency : dict
        Where the blocks live between passes: ``{"mode": "driver" | "store" | "persisted" | "source", ...}``
        (in this process; re-read from the store each pass through a per-worker cache; persisted in the
        workers' memory; recomputed from a Dask graph each pass), with the bytes and the reason.
    """

    def __init__(self, X: Any, *, standardize: str | None = None, block_width: int | None = None,
                 y: Any = None):
        _check_standardize(standardize)
        self.standardize = standardize
        if isinstance(X, str | os.PathLike):
            from dufs.data import open_store

            X = open_store(X)
        from dufs.data import SparseStore

        self.store_path: str | None = None  # the store the blocks come from (kept when they are persisted)
        self.feature_ids: np.ndarray | None = None  # a store's feature ids, when it has them
        if isinstance(X, SparseStore):
            self.store_path = X.path
            self.shape = X.shape
            self._src = _blocks_from_store(X)
            labels = X.y if y is None else y
            self.dtype = X.dtype
            self.residency = {"mode": "store", "bytes": _est_bytes(self._src, X.dtype),
                              "reason": "not persisted: blocks are read on the workers, cached per process"}
            self.feature_ids = X.feature_ids
            self.identity = _store_identity(X, self.feature_ids)
        elif _is_dask_array(X):
            self._src, infos, self.shape, self.dtype = _blocks_from_dask(X, block_width)
            labels = y
            self.residency = {"mode": "source", "bytes": None,
                              "reason": "not persisted: blocks are recomputed from the Dask graph each pass"}
            self.identity = _dask_identity(X)
        else:
            kind = type(X).__name__
            if type(X).__module__.startswith("sparse"):
                X = X.to_scipy_sparse()
            self._src, self.shape, self.dtype, fingerprint = _blocks_from_array(X, block_width)
            labels = y
            self.residency = {"mode": "driver", "bytes": sum(b.nbytes for b in self._src),
                              "reason": "in memory in this process"}
            self.identity = _memory_identity(kind, self.shape, sum(b.nnz for b in self._src), self.dtype,
                                             fingerprint)
        if not _is_dask_array(X):
            infos = [BlockInfo(b.start, b.stop, b.nnz) for b in self._src]
        self.blocks = infos
        self.y, self.classes = (None, None) if labels is None else check_labels(labels, self.shape[0])
        self._stats: ColumnStats | None = None
        self._passes = [0]  # shared with the with_standardize() views of the same blocks

    # ------------------------------------------------------------------ description
    def __repr__(self) -> str:
        n, d = self.shape
        return (f"<dufs.engine.Matrix {n} x {d}, nnz={self.nnz}, {self.n_blocks} feature blocks, "
                f"standardize={self.standardize!r}, {self.residency['mode']}>")

    @property
    def passes(self) -> int:
        """Passes over the data made so far (by this matrix and its ``with_standardize`` views)."""
        return self._passes[0]

    @property
    def n_blocks(self) -> int:
        return len(self.blocks)

    @property
    def nnz(self) -> int:
        if any(b.nnz < 0 for b in self.blocks):
            self._count()
        return sum(b.nnz for b in self.blocks)

    @property
    def bounds(self) -> np.ndarray:
        """Block boundaries: block i covers features ``bounds[i]:bounds[i+1]``."""
        return np.array([0] + [b.stop for b in self.blocks], dtype=np.int64)

    def _count(self) -> None:
        f = _delayed(_nnz_of)
        got = _compute([f(s) for s in self._src])
        self.blocks = [BlockInfo(b.start, b.stop, int(c)) for b, (c, _) in zip(self.blocks, got, strict=True)]
        if self.residency.get("bytes") is None:
            self.residency["bytes"] = int(sum(nb for _, nb in got))

    def with_standardize(self, standardize: str | None) -> Matrix:
        """The same blocks (shared, not copied) and statistics under another standardization."""
        _check_standardize(standardize)
        out = object.__new__(Matrix)
        out.__dict__.update(self.__dict__)
        out.standardize = standardize
        return out

    # ------------------------------------------------------------------ residency
    def persist(self, client: Any = None, *, fraction: float | None = None) -> Matrix:
        """Load the blocks into the workers' memory, balanced by nnz, when they fit in ``fraction`` (default
        ``dufs.engine.persist-fraction``) of the cluster's memory; otherwise leave them to be re-read each pass.

        Without a distributed client (``client`` or the active one) nothing changes. Blocks of a Dask array are
        always persisted (the alternative is recomputing the source every pass). Returns ``self``.
        """
        client = client or _client()
        if client is None or self.residency["mode"] == "persisted":
            return self
        frac = float(config.get("engine.persist-fraction") if fraction is None else fraction)
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"].items())
        if not workers:
            # a cluster that is starting, scaling up or restarting a worker: wait for one rather than fail
            wait = config.get("engine.wait-for-workers")
            try:
                client.wait_for_workers(1, timeout=wait)
            except TimeoutError:
                raise ParameterError(f"the Dask cluster at {client.scheduler.address} has no workers (waited "
                                     f"{wait}, dufs.engine.wait-for-workers)") from None
            workers = sorted(client.scheduler_info(n_workers=-1)["workers"].items())
        memory = sum(int(w.get("memory_limit") or 0) for _, w in workers)
        need = self.residency.get("bytes")
        mode = self.residency["mode"]
        if mode != "source" and memory and need is not None and need > frac * memory:
            self.residency = {"mode": "store" if mode == "store" else mode, "bytes": need, "cluster_memory": memory,
                              "reason": f"not persisted: {need / 2**20:,.0f} MiB exceeds {frac:.0%} of the "
                                        f"cluster's {memory / 2**20:,.0f} MiB; blocks are re-read each pass"}
            log.info("%s", self.residency["reason"])
            return self
        # greedy by nnz (largest first) onto the least loaded worker: a fixed, balanced placement
        load = {addr: 0 for addr, _ in workers}
        est = [b.nnz if b.nnz >= 0 else b.width for b in self.blocks]
        place = {}
        for i in sorted(range(self.n_blocks), key=lambda i: (-est[i], i)):
            addr = min(load, key=lambda a: (load[a], a))
            place[i] = addr
            load[addr] += max(est[i], 1)
        from dask.delayed import Delayed
        from distributed import wait

        token = uuid.uuid4().hex[:12]
        futures = []
        for i, s in enumerate(self._src):
            key = f"dufs-block-{token}-{i}"
            if isinstance(s, Delayed):
                futures.append(client.compute(s, workers=[place[i]], allow_other_workers=True))
            else:
                futures.append(client.submit(_materialize, s, key=key, workers=[place[i]],
                                             allow_other_workers=True, pure=False))
        wait(futures)
        self._src = futures
        self.residency = {"mode": "persisted", "bytes": need, "cluster_memory": memory, "n_workers": len(workers),
                          "reason": "persisted in the workers' memory, balanced by nonzeros"}
        if need is None or any(b.nnz < 0 for b in self.blocks):
            self._count()
        log.info("persisted %d feature blocks (%s MiB) on %d workers", self.n_blocks,
                 f"{self.residency['bytes'] / 2**20:,.1f}", len(workers))
        return self

    def release(self) -> None:
        """Drop persisted blocks (and the scattered transform) from the workers."""
        for s in self._src:
            if hasattr(s, "release"):
                s.release()
        for futs in self.__dict__.pop("_tf_cache", {}).values():
            for f in futs:
                f.release()

    def to_scipy(self) -> Any:
        """X (untransformed) as a SciPy ``csc_array``: for small matrices and tests (it gathers every block)."""
        import scipy.sparse as sp

        n, d = self.shape
        if not self.blocks:
            return sp.csc_array((n, d), dtype=self.dtype)
        blocks = self.map_blocks(_gather_block)
        indptr = [np.zeros(1, dtype=np.int64)]
        off = 0
        for b in blocks:
            indptr.append(b.indptr[1:] + off)
            off += b.nnz
        return sp.csc_array((np.concatenate([b.data for b in blocks]),
                             np.concatenate([b.indices for b in blocks]), np.concatenate(indptr)),
                            shape=(n, d))

    # ------------------------------------------------------------------ statistics
    @_inline_when_small
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
        c = _share(codes) if codes is not None else None
        parts = self._pass([f(s, n, c, k) for s in self._src], "column statistics")
        if parts:
            st = ColumnStats.concat(parts)
        else:
            e = np.zeros(0)
            st = ColumnStats(n, e, e.copy(), np.zeros(0, np.int64), e.copy(), e.copy(), e.copy())
            if y is not None:
                st.class_sum, st.class_sumsq = np.zeros((k, 0)), np.zeros((k, 0))
        if y is not None:
            st.classes, st.class_count = classes, counts.astype(np.int64)
        if y is None and self._stats is None:
            self._stats = st
        return st

    def _pairs(self) -> list[tuple[Any, BlockInfo]]:
        return list(zip(self._src, self.blocks, strict=True))

    def _pass(self, tasks: list, name: str = "pass") -> list:
        self._passes[0] += 1
        return run_pass(name, tasks, inline=_INLINE.get())

    def _inline(self) -> bool:
        """Whether a pass runs inline: no distributed client, the blocks in this process or in a local store, and
        at most ``dufs.engine.inline-nnz`` nonzeros (a pass over them takes about what Dask spends building and
        running its graph, a few milliseconds)."""
        if self.residency.get("mode") not in ("driver", "store") or any(b.nnz < 0 for b in self.blocks):
            return False
        return sum(b.nnz for b in self.blocks) <= int(config.get("engine.inline-nnz")) and _client() is None

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

    def _block_transform(self) -> list[Any]:
        """Per block ``(mu_b, inv_b)`` of the transform (None where it leaves that part out). Under a distributed
        client they are scattered once and kept (keys, not literals, in every pass's graph: see ``_shipped``)."""
        mu, inv = self._transform()
        args = [(None if mu is None else mu[b.start:b.stop], None if inv is None else inv[b.start:b.stop])
                for b in self.blocks]
        client = _client()
        if client is None or (mu is None and inv is None):
            return args
        key = (self.standardize, id(self._stats), client.id)
        cache = self.__dict__.setdefault("_tf_cache", {})
        if key not in cache:
            cache[key] = client.scatter(args, hash=False)
        return cache[key]

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

    def column_sq_norms(self) -> np.ndarray:
        """||z_j||^2 of every transformed column (from the cached column statistics)."""
        if self._stats is None:
            self._stats = self.column_stats()
        st = self._stats
        mu, inv = self._transform()
        base = st.m2 if mu is not None else st.sumsq
        base = np.maximum(np.asarray(base, dtype=np.float64), 0.0)
        if mu is not None:
            base = np.where(st.min == st.max, 0.0, base)
        return base * inv * inv if inv is not None else base

    # ------------------------------------------------------------------ products
    @_inline_when_small
    def rmatvec(self, V: Any, *, gather: bool = True) -> Any:
        """Z^T V for a dense ``V`` of shape (n_samples,) or (n_samples, p); float64 (n_features,) or (n_features, p).

        One pass; ``V`` travels to the workers once (one graph key), each block computes its rows of the result.
        With ``gather=False`` the per-block results (float64 (width, p) arrays) stay where they were computed: a
        :class:`BlockState` for a following :meth:`map_blocks` (``state=``), gathered only when asked.
        """
        n, d = self.shape
        # a float32 V over float32 data stays float32: exact (the kernel multiplies and sums in float64), and the
        # randomly read vector takes half the cache and half the bytes shipped (docs/architecture.md, "Measured facts")
        V2, one = _as_2d(V, n, "V", "n_samples", keep_float32=np.dtype(self.dtype) == np.float32)
        mu, inv = self._transform()
        vsum = col_sums(V2) if mu is not None else None
        f = _delayed(_block_rmatvec)
        tf = self._block_transform()
        with _shipped(V2) as Vs:
            tasks = [f(s, Vs, vsum, tf[i]) for i, s in enumerate(self._src)]
            if not gather:
                return self._resident(tasks)
            parts = self._pass(tasks, "Z^T V")
        out = np.concatenate(parts, axis=0) if parts else np.zeros((d, V2.shape[1]))
        return out[:, 0] if one else out

    def _resident(self, tasks: list) -> BlockState:
        """Run a pass whose per-block results stay on the workers (a BlockState of futures), or in this process."""
        client = _client()
        self._passes[0] += 1
        if client is None:
            return BlockState(_compute(tasks))
        from distributed import wait

        futures = client.compute(tasks)
        wait(futures)
        return BlockState(futures, client)

    @_inline_when_small
    def matvec(self, U: Any) -> np.ndarray:
        """Z U for a dense ``U`` of shape (n_features,) or (n_features, p); float64 (n_samples,) or (n_samples, p).

        One pass; the per-block partial products are summed on the workers by a tree in block order (fixed, so
        the result does not depend on the number of workers), and only the sum comes back.
        """
        n, d = self.shape
        U2, one = _as_2d(U, d, "U", "n_features")
        mu, inv = self._transform()
        W = U2 * inv[:, None] if inv is not None else U2
        if not self.blocks:
            out = np.zeros((n, U2.shape[1]))
        else:
            f = _delayed(_block_matvec)
            with _shipped([np.ascontiguousarray(W[b.start:b.stop]) for b in self.blocks]) as Ws:
                out = self._pass([_tree_sum([f(s, Ws[i], n) for i, s in enumerate(self._src)])], "Z U")[0]
        if mu is not None:
            out = out - (mu @ W)[None, :]
        return out[:, 0] if one else out

    @_inline_when_small
    def columns(self, ids: Any) -> Any:
        """Columns ``ids`` of X (untransformed) as a SciPy ``csc_array`` (n_samples x len(ids)), in the order given.

        One pass over the blocks that hold them. The transformed column j is ``(X[:, j] - center[j]) / scale[j]``;
        :meth:`dense_columns` gives it.
        """
        import scipy.sparse as sp

        n, d = self.shape
        ids = _as_ids(ids, d)
        bounds = self.bounds
        owner = np.searchsorted(bounds, ids, side="right") - 1
        f = _delayed(_block_columns)
        want = sorted(set(owner.tolist()))
        locs = {i: np.unique(ids[owner == i] - bounds[i]) for i in want}
        got = dict(zip(want, self._pass([f(self._src[i], locs[i]) for i in want], "columns"), strict=True))
        indptr, indices, data = [np.zeros(1, np.int64)], [], []
        off = 0
        for j, i in zip(ids, owner, strict=True):
            ip, ix, dt = got[i]
            p = int(np.searchsorted(locs[i], j - bounds[i]))
            a, b = ip[p], ip[p + 1]
            indices.append(ix[a:b])
            data.append(dt[a:b])
            off += b - a
            indptr.append(np.array([off], np.int64))
        dtype = self.dtype if np.dtype(self.dtype).kind == "f" else np.float64
        return sp.csc_array((np.concatenate(data) if data else np.zeros(0, dtype),
                             np.concatenate(indices) if indices else np.zeros(0, np.int32),
                             np.concatenate(indptr)), shape=(n, ids.shape[0]))

    def dense_columns(self, ids: Any) -> np.ndarray:
        """Columns ``ids`` of Z (transformed) as a dense float64 (n_samples x len(ids)) array."""
        ids = _as_ids(ids, self.shape[1])
        C = self.columns(ids).toarray().astype(np.float64)
        mu, inv = self._transform()
        if mu is not None:
            C -= mu[ids][None, :]
        if inv is not None:
            C *= inv[ids][None, :]
        return C

    def kernel_column(self, i: Any, kind: str = "linear", *, gamma: float | None = None) -> np.ndarray:
        """k(z_i, z_j) for every feature j: ``kind`` is ``"linear"`` (z_i^T z_j), ``"poly2"`` (the degree-2
        homogeneous polynomial (z_i^T z_j)^2; the squared correlation times n^2 under ``"zscore"``) or ``"rbf"``
        (exp(-gamma ||z_i - z_j||^2), ``gamma`` default 1 / n_samples).

        ``i`` an int gives a (n_features,) vector; a sequence gives (n_features, len(i)). Two passes (one to gather
        the columns, one product), plus the statistics pass when not yet cached.
        """
        if kind not in ("linear", "poly2", "rbf"):
            raise ParameterError(f"The 'kind' parameter of kernel_column must be 'linear', 'poly2' or 'rbf'; "
                                 f"got {kind!r}.")
        n, d = self.shape
        one = np.ndim(i) == 0
        ids = _as_ids(np.atleast_1d(i), d)
        if gamma is None:
            gamma = 1.0 / max(n, 1)
        elif not (isinstance(gamma, int | float | np.floating) and gamma > 0):
            raise ParameterError(f"The 'gamma' parameter of kernel_column must be a float > 0; got {gamma!r}.")
        G = self.rmatvec(self.dense_columns(ids))
        if kind == "poly2":
            G = G * G
        elif kind == "rbf":
            sq = self.column_sq_norms()
            D2 = np.maximum(sq[:, None] + sq[ids][None, :] - 2.0 * G, 0.0)
            D2[ids, np.arange(ids.shape[0])] = 0.0
            G = np.exp(-float(gamma) * D2)
        return G[:, 0] if one else G

    # ------------------------------------------------------------------ per-block kernels
    @_inline_when_small
    def map_blocks(self, fn: Any, *args: Any, state: Any = None, reduce: str | None = None,
                   groups: list | None = None, **kwargs: Any) -> Any:
        """Run ``fn(block, *args, **kwargs)`` on every feature block where it is loaded: one task a block, one pass.

        ``block`` is a :class:`FeatureBlock`. Arguments wrapped in :class:`PerBlock` are given block by block;
        large arrays travel once per pass. Results (small) come back in block order, or, with ``reduce="sum"``,
        summed on the workers by a fixed tree and returned as one value.

        With ``groups`` (lists of block indices, e.g. :meth:`partition`) there is one task a group instead:
        ``fn(blocks, ...)`` gets the group's blocks as a list, and each :class:`PerBlock` argument as a list with
        one item per block of the group; results (and state) are one per group, in group order.

        With ``state`` (a :class:`BlockState` or a list, one item per block or group) the call is
        ``fn(block, state_i, *args, **kwargs)`` and must return ``(new_state_i, result_i)``; the new state stays
        beside its block (on the worker) and ``(results, BlockState)`` is returned.
        """
        if reduce not in (None, "sum"):
            raise ParameterError(f"The 'reduce' parameter of map_blocks must be None or 'sum'; got {reduce!r}.")
        units = None if groups is None else self._check_groups(groups)
        shared = [self._scatter_per_block(_share(a)) for a in args]
        kw = {k: self._scatter_per_block(_share(v)) for k, v in kwargs.items()}

        def pick1(a: Any, i: int) -> Any:
            if not isinstance(a, PerBlock):
                return a
            v, b = a.value, self.blocks[i]
            if isinstance(v, list | tuple):
                if len(v) != self.n_blocks:
                    raise ParameterError(f"a PerBlock list must have one item per block ({self.n_blocks}); "
                                         f"got {len(v)}")
                return v[i]
            return v[b.start:b.stop]

        def pick(a: Any, u: int) -> Any:
            if units is None:
                return pick1(a, u)
            return [pick1(a, i) for i in units[u]] if isinstance(a, PerBlock) else a

        def task_args(u: int) -> tuple:
            return tuple(pick(a, u) for a in shared), {k: pick(v, u) for k, v in kw.items()}

        srcs = list(self._src) if units is None else [[self._src[i] for i in g] for g in units]
        n = len(srcs)
        if state is None:
            f = _delayed(_map_one if units is None else _map_group)
            tasks = [f(fn, s, *task_args(u)) for u, s in enumerate(srcs)]
            if reduce == "sum":
                return self._pass([_tree_sum(tasks)], _name(fn))[0] if tasks else None
            return self._pass(tasks, _name(fn))
        items = state.items if isinstance(state, BlockState) else list(state)
        if len(items) != n:
            raise ParameterError(f"map_blocks: state has {len(items)} items for {n} "
                                 f"{'blocks' if units is None else 'groups'}")
        from operator import getitem

        f = _delayed(_map_state)
        g = _delayed(getitem, pure=True)
        pairs = [f(fn, s, items[u], *task_args(u)) for u, s in enumerate(srcs)]
        new = [g(p, 0) for p in pairs]
        res = [g(p, 1) for p in pairs]
        client = _client()
        self._passes[0] += 1
        if client is None:
            got = _compute(new + res)
            return (_tree_sum_values(got[n:]) if reduce == "sum" else got[n:], BlockState(got[:n]))
        futs = client.compute(new + ([_tree_sum(res)] if reduce == "sum" else res))
        out = client.gather(futs[n:])
        return (out[0] if reduce == "sum" else out), BlockState(futs[:n], client)

    def _scatter_per_block(self, a: Any) -> Any:
        """A large :class:`PerBlock` array under a distributed client, as one scattered key per block (its slice):
        literal slices would make a large graph, which the scheduler keeps after the pass (see ``_shipped``)."""
        if not isinstance(a, PerBlock) or not isinstance(a.value, np.ndarray) or a.value.nbytes < 1 << 20:
            return a
        client = _client()
        if client is None:
            return a
        v = a.value
        return PerBlock(client.scatter([np.ascontiguousarray(v[b.start:b.stop]) for b in self.blocks], hash=False))

    def _check_groups(self, groups: Any) -> list[list[int]]:
        try:
            units = [[int(i) for i in g] for g in groups]
        except TypeError:
            raise ParameterError("The 'groups' parameter of map_blocks must be a list of lists of block "
                                 "indices.") from None
        flat = [i for g in units for i in g]
        if any(not g for g in units) or sorted(flat) != list(range(self.n_blocks)):
            raise ParameterError(f"The 'groups' parameter of map_blocks must split the {self.n_blocks} blocks into "
                                 f"non-empty groups, each block in exactly one; got {groups!r}.")
        return units

    def placement(self) -> list[str | None]:
        """The worker address holding each block (persisted blocks); None for every block otherwise."""
        client = _client()
        if client is None or self.residency.get("mode") != "persisted":
            return [None] * self.n_blocks
        who = client.who_has(self._src)
        return [min(who.get(s.key) or [None], key=lambda a: a or "") for s in self._src]

    def partition(self, n: int) -> list[list[int]]:
        """The blocks cut into ``n`` groups (ascending block indices within each), balanced by nonzeros.

        Persisted blocks are grouped by the worker that holds them, so a group's task reads only local blocks:
        each worker's blocks make ``n`` / n_workers groups (at least one, in proportion to its nonzeros when
        ``n`` is not a multiple); with fewer groups than workers, or blocks that are not persisted, the groups
        are contiguous runs of blocks."""
        if not isinstance(n, int | np.integer) or n < 1:
            raise ParameterError(f"The number of partitions must be an int >= 1; got {n!r}.")
        n = min(int(n), self.n_blocks)
        nnz = np.array([max(b.nnz, 1) for b in self.blocks], dtype=np.float64)
        where = self.placement()
        owners = sorted({a for a in where if a is not None})
        if len(owners) > 1 and n >= len(owners) and None not in where:
            per = {a: [i for i in range(self.n_blocks) if where[i] == a] for a in owners}
            load = np.array([nnz[per[a]].sum() for a in owners])
            k = np.ones(len(owners), dtype=np.int64)
            for _ in range(n - len(owners)):  # largest nonzeros per group gets the next group
                cand = [j for j in range(len(owners)) if k[j] < len(per[owners[j]])]
                if not cand:
                    break
                j = max(cand, key=lambda j: (load[j] / k[j], -j))
                k[j] += 1
            out = []
            for j, a in enumerate(owners):
                out += _runs(per[a], nnz, int(k[j]))
            return sorted(out)
        return _runs(list(range(self.n_blocks)), nnz, n)

    @_inline_when_small
    def topk(self, fn: Any, k: int, *args: Any, largest: bool = True, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best features by ``fn(block, *args, **kwargs)`` (a score per feature of the block): each block
        proposes its own best, the driver merges. Returns ``(indices, scores)`` best first; NaN counts as worst,
        ties go to the lower index."""
        if not isinstance(k, int | np.integer) or k < 1:
            raise ParameterError(f"The 'k' parameter of topk must be an int >= 1; got {k!r}.")
        shared = tuple(_share(a) for a in args)
        f = _delayed(_block_topk)
        parts = self._pass([f(s, fn, int(k), largest, shared, kwargs, b.start)
                            for s, b in self._pairs()], "top-k")
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0)
        ids = np.concatenate([p[0] for p in parts])
        sc = np.concatenate([p[1] for p in parts])
        sel, _ = _local_topk(sc, int(k), largest, 0)
        return ids[sel], sc[sel]

    def argmax(self, fn: Any, *args: Any, **kwargs: Any) -> tuple[int, float]:
        """The feature with the largest ``fn`` score (see :meth:`topk`) and its score."""
        i, s = self.topk(fn, 1, *args, **kwargs)
        return int(i[0]), float(s[0])


def _runs(ids: list[int], nnz: np.ndarray, k: int) -> list[list[int]]:
    """``ids`` (in order) cut into ``k`` contiguous non-empty runs, the largest run's nonzeros as small as can be
    (linear partition by dynamic programming; ties to the earlier cut)."""
    n = len(ids)
    k = max(1, min(k, n))
    cum = np.concatenate([[0.0], np.cumsum(nnz[ids])])
    # best[j][i]: the smallest largest run when the first i ids make j runs; cut[j][i]: where the last run starts
    best = np.full((k + 1, n + 1), np.inf)
    cut = np.zeros((k + 1, n + 1), dtype=np.int64)
    best[0][0] = 0.0
    for j in range(1, k + 1):
        for i in range(j, n - (k - j) + 1):
            cand = np.maximum(best[j - 1][j - 1:i], cum[i] - cum[j - 1:i])
            q = int(np.argmin(cand))
            best[j][i], cut[j][i] = cand[q], q + j - 1
    bounds = [n]
    for j in range(k, 0, -1):
        bounds.append(int(cut[j][bounds[-1]]))
    bounds = bounds[::-1]
    return [ids[bounds[q]:bounds[q + 1]] for q in range(k)]


def _name(fn: Any) -> str:
    return str(getattr(fn, "__name__", "map_blocks")).lstrip("_").replace("_", " ")


def _tree_sum_values(vals: list) -> Any:
    while len(vals) > 1:
        nxt = [vals[i] + vals[i + 1] for i in range(0, len(vals) - 1, 2)]
        if len(vals) % 2:
            nxt.append(vals[-1])
        vals = nxt
    return vals[0] if vals else None


def as_matrix(X: Any, *, standardize: str | None = None, y: Any = None, block_width: int | None = None,
              persist: bool | str = "auto", client: Any = None) -> Matrix:
    """A :class:`Matrix` from any input: NumPy, SciPy sparse, pydata sparse, a Dask array (dense or sparse chunks;
    its column chunks become the feature blocks, rechunked to ``block_width`` when given, never materialised
    whole), a :class:`~dufs.data.SparseStore`, a store path or URL, or a Matrix (returned with ``standardize``).

    ``persist="auto"`` persists the blocks on the distributed client (given or active) when they fit
    (:meth:`Matrix.persist`); ``False`` never does.
    """
    if isinstance(X, Matrix):
        return X.with_standardize(standardize)
    M = Matrix(X, standardize=standardize, y=y, block_width=block_width)
    if persist not in ("auto", True, False):
        raise ParameterError(f"The 'persist' parameter must be 'auto', True or False; got {persist!r}.")
    if persist:
        M.persist(client)
    return M


# ---------------------------------------------------------------------------------------------------- input checks
_NO_IMPUTE = "dufs does not impute NaN or inf: remove or fill it"


def check_finite(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, *, col0: int = 0, where: str = "",
                 name: str = "X") -> None:
    """Raise a :class:`ParameterError` naming the first (row, feature) of a non-finite value in the CSC buffers
    ``data, indices, indptr`` (features ``col0``, ``col0 + 1``, ...; ``indices`` are row numbers).

    One cheap pass over ``data`` when every value is finite: its sum is finite exactly when no value is NaN or
    infinite, barring an overflow, which falls back to the exact element-wise test."""
    if data.size == 0:
        return
    with np.errstate(all="ignore"):
        total = np.add.reduce(data, dtype=np.float64)
    if np.isfinite(total):
        return
    bad = np.flatnonzero(~np.isfinite(data))
    if bad.size == 0:  # the sum overflowed; every value is finite
        return
    rows = np.asarray(indices)[bad].astype(np.int64)
    cols = np.searchsorted(np.asarray(indptr), bad, side="right") - 1 + int(col0)
    i = int(np.lexsort((cols, rows))[0])
    if where:  # a block of a larger input: the first in that block (blocks are checked as they are loaded)
        note = f" (the first of {bad.size} in {where})" if bad.size > 1 else f" (in {where})"
    else:
        note = f" ({bad.size} in all)" if bad.size > 1 else ""
    raise ParameterError(f"{name} has a non-finite value ({float(data[bad[i]])}) at row {int(rows[i])}, feature "
                         f"{int(cols[i])}{note}; {_NO_IMPUTE}")


def check_labels(y: Any, n_rows: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Labels ``y`` (one per row) as float64 values, and their classes when they are not numbers.

    Numbers and booleans are kept as values (float64) and must be finite: the first NaN or infinity is an error
    naming its row. Other labels (strings, or any hashable values of one type) are classes: each becomes the index
    of its class among the sorted distinct labels (0., 1., ...), and those labels are returned as ``classes``
    (None for numbers). A column vector is taken as a vector."""
    a = np.asarray(y)
    if a.ndim == 2 and 1 in a.shape:
        a = a.ravel()
    if a.ndim != 1 or a.shape[0] != n_rows:
        raise ParameterError(f"y must hold one label per row of X ({n_rows} rows); got shape {np.shape(y)}")
    if a.dtype.kind == "O":
        try:
            if any(isinstance(v, str | bytes) for v in a):
                raise TypeError("strings")  # classes, even when they read as numbers
            a = a.astype(np.float64)
        except (TypeError, ValueError):
            missing = next((i for i, v in enumerate(a) if v is None or isinstance(v, float) and v != v), None)
            if missing is not None:
                raise ParameterError(f"y has a missing label ({a[missing]!r}) at row {missing}; dufs does not "
                                     f"impute: remove that sample or give it a label") from None
            kinds = [str if isinstance(v, str) else type(v) for v in a]
            odd = next((i for i, k in enumerate(kinds) if k is not kinds[0]), None)
            if odd is not None:
                raise ParameterError(f"y mixes label types: row {odd} has {a[odd]!r} ({kinds[odd].__name__}) where "
                                     f"row 0 has {a[0]!r} ({kinds[0].__name__}); give every sample a label of one "
                                     f"type") from None
    if a.dtype.kind == "c":
        raise ParameterError(f"y must hold real numbers or class labels; got complex values ({a.dtype})")
    if a.dtype.kind in "biuf":
        v = a.astype(np.float64)
        with np.errstate(all="ignore"):
            ok = np.isfinite(np.add.reduce(v)) if v.size else True
        if not ok:
            bad = np.flatnonzero(~np.isfinite(v))
            if bad.size:
                more = f" ({bad.size} in all)" if bad.size > 1 else ""
                raise ParameterError(f"y has a non-finite value ({v[bad[0]]}) at row {int(bad[0])}{more}; dufs does "
                                     f"not impute NaN or inf: remove that sample or give it a label")
        return v, None
    try:
        classes, codes = np.unique(a, return_inverse=True)
    except TypeError as exc:
        raise ParameterError(f"y holds labels that cannot be ordered ({exc}); give class labels as numbers or "
                             f"strings") from None
    return codes.reshape(-1).astype(np.float64), classes


# ---------------------------------------------------------------------------------------------------- identity
def _sha(*parts: Any) -> str:
    """A short SHA-256 hex digest of arrays (their bytes) and plain values (their repr), in order."""
    import hashlib

    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, np.ndarray):
            h.update(np.ascontiguousarray(p).data)
        else:
            h.update(repr(p).encode())
        h.update(b"|")
    return h.hexdigest()[:32]


def _fingerprint_csc(A: Any) -> str:
    """The content fingerprint of an in-memory matrix in its canonical CSC form (:func:`_canonical_csc`): SHA-256
    of its shape, value dtype, indptr, row indices and values, so NumPy, SciPy (any format) and pydata inputs of the
    same matrix and dtype agree."""
    idx = A.indices.astype(np.int32 if A.shape[0] < 2**31 else np.int64, copy=False)
    return "sha256-csc:" + _sha(tuple(int(s) for s in A.shape), str(A.dtype), A.indptr.astype(np.int64, copy=False),
                                idx, A.data)


def _feature_ids_digest(ids: np.ndarray) -> str:
    ids = np.asarray(ids)
    if ids.dtype.kind in "iu":
        return _sha("int", ids.astype(np.int64))
    return _sha("str", "\x00".join(str(v) for v in ids.tolist()))


def _store_identity(store: Any, feature_ids: np.ndarray | None = None) -> dict:
    meta = store.attrs
    keyed = {"shape": meta.get("shape"), "nnz": meta.get("nnz"), "dtype": meta.get("dtype"),
             "csr": meta.get("csr"), "csc": meta.get("csc"), "y_checksum": meta.get("y_checksum")}
    out = {"kind": "store", "path": store.path, "shape": [int(s) for s in store.shape], "nnz": int(store.nnz),
           "dtype": str(store.dtype), "created": meta.get("created"),
           "fingerprint": "store-meta:" + _sha(sorted(keyed.items())),
           "fingerprint_of": "the store's metadata: shape, nnz, dtype, block bounds and nonzeros per block, and the "
                             "crc32c of every feature block and of the labels (stores written since they are "
                             "recorded); the data are not read"}
    if feature_ids is not None:
        out["feature_ids"] = _feature_ids_digest(feature_ids)
    return out


def _dask_identity(X: Any) -> dict:
    return {"kind": "dask", "type": type(X).__name__, "shape": [int(s) for s in X.shape], "nnz": None,
            "dtype": str(X.dtype), "chunks": [[int(c) for c in cs] for cs in X.chunks], "fingerprint": None,
            "fingerprint_of": "nothing: a Dask array is identified by its shape and chunks only (fingerprinting its "
                              "content would compute it)"}


def _memory_identity(kind: str, shape: tuple[int, int], nnz: int, dtype: Any, fingerprint: str) -> dict:
    return {"kind": "memory", "type": kind, "shape": [int(s) for s in shape], "nnz": int(nnz), "dtype": str(dtype),
            "fingerprint": fingerprint,
            "fingerprint_of": "SHA-256 of the matrix in canonical CSC form (shape, dtype, indptr, indices, values)"}


def input_identity(X: Any, *, feature_ids: bool = True) -> dict:
    """What identifies an input, cheaply, without building a :class:`Matrix`: ``kind`` ("store", "memory" or
    "dask"), ``shape``, ``nnz`` (None for a Dask array), ``dtype``, ``fingerprint`` (None for a Dask array) and
    what it was taken of (``fingerprint_of``), plus ``path`` (and ``created``) for a store, ``chunks`` for a Dask
    array and ``feature_ids`` (a digest) for a store that has them (read when ``feature_ids``).

    - a store (a :class:`~dufs.data.SparseStore`, a path or a URL): from its metadata only (shape, nnz, dtype, block
      bounds and nonzeros per block); the data are not read;
    - in-memory input (NumPy, SciPy sparse, pydata sparse): SHA-256 of its canonical CSC form, one pass over it;
    - a Dask array: shape and chunks only (no content fingerprint, nothing is computed);
    - a :class:`Matrix`: the identity recorded when it was built.
    """
    if isinstance(X, Matrix):
        return dict(X.identity)
    if isinstance(X, str | os.PathLike):
        from dufs.data import open_store

        X = open_store(X)
    from dufs.data import SparseStore

    if isinstance(X, SparseStore):
        return _store_identity(X, X.feature_ids if feature_ids else None)
    if _is_dask_array(X):
        if X.ndim != 2:
            raise ParameterError(f"The 'X' parameter must be 2-D; got a {X.ndim}-D Dask array.")
        return _dask_identity(X)
    kind = type(X).__name__
    if type(X).__module__.startswith("sparse"):
        X = X.to_scipy_sparse()
    A = _canonical_csc(_as_csc(X))
    return _memory_identity(kind, A.shape, A.nnz, A.dtype, _fingerprint_csc(A))


def _check_standardize(standardize: Any) -> None:
    if standardize not in STANDARDIZE:
        raise ParameterError(f"The 'standardize' parameter must be one of 'zscore', 'scale' or None; got "
                             f"{standardize!r}.")


def _as_ids(ids: Any, d: int) -> np.ndarray:
    a = np.asarray(ids)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise ParameterError(f"feature ids must be a 1-D sequence of ints; got {ids!r}")
    a = a.astype(np.int64)
    bad = (a < 0) | (a >= d)
    if bad.any():
        raise ParameterError(f"feature id {int(a[bad][0])} is out of range for {d} features")
    return a


def _as_2d(V: Any, n: int, name: str, what: str, keep_float32: bool = False) -> tuple[np.ndarray, bool]:
    V = np.asarray(V)
    V = V.astype(np.float32 if keep_float32 and V.dtype == np.float32 else np.float64, copy=False)
    if V.ndim not in (1, 2) or V.shape[0] != n:
        raise ParameterError(f"The '{name}' parameter must have shape ({what},) or ({what}, p) with {what}={n}; "
                             f"got {V.shape}.")
    one = V.ndim == 1
    return np.ascontiguousarray(V[:, None] if one else V), one


def _est_bytes(blocks: list, dtype: Any) -> int:
    item = np.dtype(dtype).itemsize + 4
    return int(sum(b.nnz * item + 8 * (b.width + 1) for b in blocks))


def _is_dask_array(X: Any) -> bool:
    return type(X).__module__.startswith("dask.array") or type(X).__name__ == "Array" and hasattr(X, "dask")


def _blocks_from_store(store: Any) -> list[StoreBlock]:
    bounds, nnz = store.bounds("csc"), store.block_nnz("csc")
    created = store.attrs.get("created")
    return [StoreBlock(int(bounds[i]), int(bounds[i + 1]), int(nnz[i]), store.path, i, created)
            for i in range(store.n_blocks("csc"))]


def _blocks_from_dask(X: Any, block_width: int | None) -> tuple[list, list, tuple[int, int], np.dtype]:
    import dask

    if X.ndim != 2:
        raise ParameterError(f"The 'X' parameter must be 2-D; got a {X.ndim}-D Dask array.")
    if any(math.isnan(c) for cs in X.chunks for c in cs):
        raise ParameterError("The Dask array has unknown chunk sizes: call X.compute_chunk_sizes() first.")
    if block_width is not None:
        if not isinstance(block_width, int | np.integer) or block_width < 1:
            raise ParameterError(f"The 'block_width' parameter must be an int >= 1; got {block_width!r}.")
        X = X.rechunk({1: int(block_width)})
    n, d = (int(s) for s in X.shape)
    D = X.to_delayed()
    cb = np.concatenate([[0], np.cumsum(X.chunks[1])]).astype(np.int64)
    f = dask.delayed(_block_slab, pure=True)
    src = [f(int(cb[j]), int(cb[j + 1]), n, [D[i, j] for i in range(D.shape[0])]) for j in range(D.shape[1])]
    dtype = X.dtype if np.dtype(X.dtype).kind == "f" else np.dtype(np.float64)
    infos = [BlockInfo(int(cb[j]), int(cb[j + 1])) for j in range(D.shape[1])]
    return src, infos, (n, d), dtype


def _as_csc(X: Any) -> Any:
    """An in-memory matrix (NumPy, SciPy sparse; pydata sparse converted before) as a SciPy ``csc_array`` copy."""
    import scipy.sparse as sp

    if sp.issparse(X):
        return sp.csc_array(X, copy=True)
    if isinstance(X, np.ndarray):
        if X.ndim != 2:
            raise ParameterError(f"The 'X' parameter must be 2-D; got {X.ndim}-D.")
        if X.dtype == np.float16:
            X = X.astype(np.float32)  # exactly; SciPy sparse has no float16
        elif X.dtype.kind not in "biuf":
            try:
                X = X.astype(np.float64)
            except (TypeError, ValueError):
                raise ParameterError(f"X must hold numbers; got a NumPy array of dtype {X.dtype} that does not "
                                     f"convert to float: convert it, or encode its categories first") from None
        return sp.csc_array(X)
    raise ParameterError(f"The 'X' parameter must be a SparseStore, a store path, a SciPy or pydata sparse "
                         f"matrix, a Dask array or a NumPy array; got {type(X).__name__}.")


def _canonical_csc(A: Any) -> Any:
    """``A`` (a SciPy ``csc_array``) with float values, no duplicates or explicit zeros, sorted indices: the form
    the blocks are cut from and the fingerprint is taken of (in place)."""
    if A.dtype.kind != "f":
        A = A.astype(np.float64)
    A.sum_duplicates()
    A.eliminate_zeros()
    A.sort_indices()
    return A


def _blocks_from_array(X: Any, block_width: int | None) -> tuple[list[FeatureBlock], tuple[int, int], np.dtype,
                                                                  str]:
    A = _canonical_csc(_as_csc(X))
    check_finite(A.data, A.indices, A.indptr)
    fingerprint = _fingerprint_csc(A)
    n, d = (int(s) for s in A.shape)
    if block_width is None:
        target = max(1, int(config.get("store.feature-block-nnz")))
        nb = max(1, math.ceil(A.nnz / target))
        block_width = max(1, math.ceil(d / nb))
    if not isinstance(block_width, int | np.integer) or block_width < 1:
        raise ParameterError(f"The 'block_width' parameter must be an int >= 1; got {block_width!r}.")
    block_width = int(block_width)
    indptr = A.indptr.astype(np.int64)
    blocks = []
    for a in range(0, d, block_width):
        b = min(d, a + block_width)
        lo, hi = indptr[a], indptr[b]
        blocks.append(FeatureBlock(a, b, indptr[a:b + 1] - lo, A.indices[lo:hi].astype(np.int32),
                                   A.data[lo:hi].copy()))
    return blocks, (n, d), A.dtype, fingerprint
