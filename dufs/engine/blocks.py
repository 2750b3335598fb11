"""Feature blocks and the per-block work of a pass.

A block is features ``start:stop`` of X as CSC buffers (:class:`FeatureBlock`), or a reference to a store's block
(:class:`StoreBlock`, read where the task runs, cached per process), or a future of a persisted block. The
functions here are what one task of a pass runs on one block (or a partition's blocks); they know nothing of Dask.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dask.sizeof import sizeof

from dufs import config
from dufs.engine.buffers import buffer
from dufs.engine.dispatch import tree_sum_into
from dufs.engine.shm import local_array, resolved, writable_array
from dufs.errors import ParameterError
from dufs.kernels.affine import standardize_rows
from dufs.kernels.blockops import column_groups, csc_label_sums, csc_matvec, csc_rmatvec
from dufs.scheduling import each_in_threads, task_threads

__all__ = ["ROWS", "VALUES", "BlockInfo", "BlockSlice", "FeatureBlock", "PerBlock", "StoreBlock",
           "ValuedStoreBlock", "assemble_columns", "block_columns", "block_matvec", "block_rmatvec",
           "block_scores_and_top", "block_topk", "column_slice", "gather_block", "local_topk", "map_group",
           "map_one", "map_state", "materialize", "nnz_of",
           "partition_rmatvec", "resolve", "row_sq_sums", "valued_block", "valued_data", "valued_dtype"]


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
        """Read the block from the store (no caching); a store replaced since the matrix was built is refused."""
        from dufs.data import read_block

        b = read_block(self.path, "csc", self.index, created=self.created)
        return FeatureBlock(b.start, b.stop, np.asarray(b.indptr, dtype=np.int64), b.indices, b.data)

    def load(self) -> FeatureBlock:
        """The block, read once per process and kept in the least-recently-used cache ``_LOADED``."""
        key = self.cache_key()
        got = _LOADED.get(key)
        if got is None:
            got = self.read()
            _LOADED.put(key, got)
        return got

    def cache_key(self) -> tuple:
        return (self.path, self.created, self.index)


#: what a :class:`~dufs.engine.matrix.Matrix` reads of each stored value (``Matrix(values=...)``)
VALUES = ("raw", "presence", "log1p", "sqrt")


def valued_dtype(dtype: Any) -> np.dtype:
    """The type of a block's values read as anything but ``"raw"``: float32 stays float32, anything else is
    float64."""
    return np.dtype(np.float32) if np.dtype(dtype) == np.float32 else np.dtype(np.float64)


def valued_data(data: np.ndarray, values: str) -> np.ndarray:
    """The stored values ``data`` as ``values`` reads them: ``"raw"`` as they are (the same array), ``"presence"``
    1 for every stored value, ``"log1p"`` log(1 + x), ``"sqrt"`` the square root (these two for non-negative
    data); a new array of :func:`valued_dtype` otherwise."""
    if values == "raw":
        return data
    dt = valued_dtype(data.dtype)
    if values == "presence":
        return np.ones(data.shape, dtype=dt)
    v = np.asarray(data, dtype=dt)
    if values in ("log1p", "sqrt") and v.size and float(v.min()) < 0:
        raise ParameterError(f"values={values!r} reads non-negative data; a stored value is {float(v.min()):g}")
    if values == "log1p":
        return np.log1p(v)
    if values == "sqrt":
        return np.sqrt(v)
    raise ParameterError(f"values must be one of {', '.join(VALUES)}; got {values!r}")


#: how a :class:`~dufs.engine.matrix.Matrix` reads its rows (``Matrix(rows=...)``): as stored, or each scaled to
#: unit L2 norm (of its values as ``values`` reads them; an all-zero row stays zero)
ROWS = ("raw", "unit")


def valued_block(src: Any, values: str, row_scale: Any = None) -> FeatureBlock:
    """A block (any source :func:`resolve` takes) with its values read as ``values`` says (:func:`valued_data`),
    each then multiplied by ``row_scale`` at its row where given (an n-vector: the inverse row norms of
    ``Matrix(rows="unit")``): the same ``indptr`` and ``indices`` arrays, new ``data``."""
    b = resolve(src)
    data = valued_data(b.data, values)
    if row_scale is not None:
        scale = np.asarray(row_scale)
        dt = valued_dtype(b.data.dtype)
        data = (np.asarray(data, dtype=np.float64) * scale[b.indices]).astype(dt, copy=False)
    return FeatureBlock(b.start, b.stop, b.indptr, b.indices, data)


def row_sq_sums(src: Any, n: int, values: str) -> np.ndarray:
    """sum_j v_ij^2 over the block's columns for each of the ``n`` rows, v the stored values as ``values`` reads
    them (float64): a block's part of the squared row norms, summed over the blocks by
    :meth:`~dufs.engine.matrix.Matrix.map_blocks`."""
    b = resolve(src)
    v = np.asarray(valued_data(b.data, values), dtype=np.float64)
    return np.bincount(np.asarray(b.indices, dtype=np.int64), weights=v * v, minlength=int(n))


@dataclass(frozen=True)
class ValuedStoreBlock(StoreBlock):
    """A :class:`StoreBlock` read with its values transformed (:func:`valued_block`) where it is loaded, and cached
    so (beside the raw block, under its own key)."""

    values: str = "raw"
    #: the inverse row norms where the rows are read at unit norm (``Matrix(rows="unit")``), with ``rows_key``
    #: naming them in the cache key
    row_scale: Any = field(default=None, compare=False, repr=False)
    rows_key: str | None = None

    def read(self) -> FeatureBlock:
        return valued_block(super().read(), self.values, self.row_scale)

    def cache_key(self) -> tuple:
        return (self.path, self.created, self.index, self.values, self.rows_key)


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


def materialize(b: Any) -> FeatureBlock:
    """A block's buffers for persisting: a store block is read afresh (not through the cache, so it is held once),
    a :class:`BlockSlice` cut from its source's."""
    if isinstance(b, BlockSlice):
        return column_slice(materialize(b.src), b.start, b.stop)
    return b.read() if isinstance(b, StoreBlock) else b


@dataclass(frozen=True)
class BlockSlice:
    """Features ``start:stop`` of the block ``src`` (a :class:`FeatureBlock` or a store block): a block cut from a
    larger one where it is persisted, so that every worker thread holds a block
    (:func:`~dufs.engine.placement.split_blocks`)."""

    src: Any
    start: int
    stop: int


def column_slice(b: FeatureBlock, start: int, stop: int) -> FeatureBlock:
    """Features ``start:stop`` of ``b`` as a block of its own: copies, so that the whole block is not kept alive
    by the slice."""
    j0, j1 = start - b.start, stop - b.start
    if not 0 <= j0 <= j1 <= b.width:
        raise ParameterError(f"features {start}:{stop} are not in the block {b.start}:{b.stop}")
    lo, hi = int(b.indptr[j0]), int(b.indptr[j1])
    return FeatureBlock(start, stop, np.asarray(b.indptr[j0:j1 + 1] - lo, dtype=np.int64),
                        b.indices[lo:hi].copy(), b.data[lo:hi].copy())


@dataclass(frozen=True)
class PerBlock:
    """An argument of :meth:`Matrix.map_blocks` given block by block: an array over features is sliced to each
    block's ``start:stop`` (along axis 0); a list or tuple with one item per block gives each block its item."""

    value: Any


def block_rmatvec(src, V, vsum, tf, dtype=None, classes=0):
    """Z_b^T V of one block (float64 (width, p), or ``dtype``), written into a pooled buffer
    (:func:`dufs.engine.buffers.buffer`). ``classes`` > 0: ``V`` is an integer label vector and V stands for its
    n_rows x ``classes`` indicator (:func:`_product`)."""
    b = resolve(src)
    V = local_array(V)
    direct = _direct(dtype, [tf])
    out = buffer((b.indptr.shape[0] - 1, classes or V.shape[1]), dtype if direct else np.float64)
    _product(b, _grouped(V, classes), out, classes)
    return out if direct else _cast(standardize_rows(out, tf[0], vsum, tf[1]), dtype)


def partition_rmatvec(srcs, V, vsum, tfs, dtype=None, into=None, starts=None, classes=0):
    """Z_b^T V of a partition's blocks, stacked in the order given into one pooled float64 (sum of widths, p)
    buffer (or ``dtype``): one task and one result a partition.

    ``into`` (a :class:`~dufs.engine.shm.SharedArray` of the whole (n_features, p) result, :func:`receive`) with
    ``starts`` (each block's first feature): each block's rows written there in place, nothing sent back but the
    number of rows written. ``classes`` > 0: ``V`` is an integer label vector standing for its indicator
    (:func:`_product`)."""
    blocks = [resolve(s) for s in srcs]
    V = local_array(V)
    direct = _direct(dtype, tfs)
    p = classes or V.shape[1]
    V = _grouped(V, classes)  # a wide V's column groups, copied once for all the partition's blocks
    # each block writes its own rows: on a worker of several threads the blocks run side by side, the same numbers
    threads = task_threads()
    if into is not None:
        target = writable_array(into)

        def one_into(i):
            b, (mu, inv), a = blocks[i], tfs[i], starts[i]
            w = b.indptr.shape[0] - 1
            if direct or target.dtype == np.float64:  # the kernel writes the result's rows itself
                part = target[a:a + w]
                _product(b, V, part, classes)
                if not direct:
                    standardize_rows(part, mu, vsum, inv)
            else:  # a float32 result with a transform: made in float64, rounded once
                part = buffer((w, p), np.float64)
                _product(b, V, part, classes)
                np.copyto(target[a:a + w], standardize_rows(part, mu, vsum, inv), casting="same_kind")

        each_in_threads(one_into, len(blocks), threads)
        return sum(b.indptr.shape[0] - 1 for b in blocks)
    out = buffer((sum(b.indptr.shape[0] - 1 for b in blocks), p), dtype if direct else np.float64)
    firsts = np.concatenate([[0], np.cumsum([b.indptr.shape[0] - 1 for b in blocks])]).astype(np.int64)

    def one(i):
        b, (mu, inv) = blocks[i], tfs[i]
        part = out[firsts[i]:firsts[i + 1]]
        _product(b, V, part, classes)
        if not direct:
            standardize_rows(part, mu, vsum, inv)

    each_in_threads(one, len(blocks), threads)
    return out if direct else _cast(out, dtype)


def _grouped(V, classes):
    """A label vector (``classes`` > 0) as it is; else V's columns as [(first column, contiguous columns), ...] in
    the groups :func:`~dufs.kernels.blockops.column_groups` sweeps at once (V itself when one group)."""
    if classes:
        return V
    groups = column_groups(V.shape[0], V.shape[1], V.dtype.itemsize)
    if len(groups) == 1:
        return [(0, V)]
    return [(q0, np.ascontiguousarray(V[:, q0:q0 + w])) for q0, w in groups]


def _product(b, V, out, classes):
    """``out[:] = X_b^T V``, V as :func:`_grouped` gives it (each group's columns of ``out`` in one sweep); with
    ``classes`` > 0, ``V`` is an integer label vector and the product is with its n_rows x ``classes`` indicator
    (:func:`~dufs.kernels.blockops.csc_label_sums`: the same sums, from the labels instead of the indicator's
    n_rows x classes numbers)."""
    if classes:
        csc_label_sums(b.indptr, b.indices, b.data, V, out)
        return
    for q0, Vg in V:
        csc_rmatvec(b.indptr, b.indices, b.data, Vg, out if len(V) == 1 else out[:, q0:q0 + Vg.shape[1]])


def _matvec(b, W, out, scale=None):
    """``out += X_b W`` (diag(``scale``) W when given), a wide W's columns in the groups
    :func:`~dufs.kernels.blockops.column_groups` sweeps at once, each accumulated in a contiguous n_rows x width
    array of its own (the randomly written rows) and added into ``out``'s columns after."""
    W = np.ascontiguousarray(W)
    groups = column_groups(out.shape[0], W.shape[1])
    if len(groups) == 1:
        csc_matvec(b.indptr, b.indices, b.data, W, out, scale)
        return
    acc = np.empty((out.shape[0], groups[0][1]))
    for q0, w in groups:
        t = acc if w == acc.shape[1] else np.empty((out.shape[0], w))  # the last group may be narrower
        t.fill(0.0)
        csc_matvec(b.indptr, b.indices, b.data, np.ascontiguousarray(W[:, q0:q0 + w]), t, scale)
        out[:, q0:q0 + w] += t


def _direct(dtype, tfs) -> bool:
    """A float32 result the kernel writes itself: each column's sum is made in float64 and rounded once, when no
    block has a transform (with one, the centring would be applied in float32: it is applied in float64 first)."""
    return dtype is not None and np.dtype(dtype) != np.float64 and all(t[0] is None and t[1] is None for t in tfs)


def _cast(out, dtype):
    if dtype is None or np.dtype(dtype) == out.dtype:
        return out
    got = buffer(out.shape, dtype)
    np.copyto(got, out, casting="same_kind")
    return got


def block_matvec(src, W, n_rows):
    b = resolve(src)
    out = np.zeros((n_rows, W.shape[1]), dtype=np.float64)
    _matvec(b, W, out)
    return out


def partition_matvec_into(srcs, Ws, into, slots, U=None, tfs=None):
    """X_b W_b of each of a partition's blocks written into its slot of ``into`` (a
    :class:`~dufs.engine.shm.SharedArray` of shape (n_blocks, n_rows, p)): ``slots`` are the blocks' indices.
    With ``U`` (the whole (n_features, p) W, a shared one or an array), ``Ws`` are the blocks' (start, stop) rows
    of it, each scaled here by its block's inv when ``tfs`` (the blocks' (mu, inv)) is given. Returns the number of
    blocks written."""
    scales = [None] * len(srcs)
    if U is not None:
        U = local_array(U)
        Ws = [U[a:b] for a, b in Ws]
        if tfs is not None:  # each row scaled by the kernel as it reads it: no scaled copy of the block's rows
            scales = [None if tf is None or tf[1] is None else np.ascontiguousarray(tf[1], dtype=np.float64)
                      for tf in tfs]
    target = writable_array(into)
    for src, W, i, sc in zip(srcs, Ws, slots, scales, strict=True):
        b = resolve(src)
        out = target[i]
        out.fill(0.0)
        _matvec(b, W, out, sc)
    return len(slots)


def partition_matvec(srcs, Ws, n_rows):
    """Sum over a group of blocks of X_b W_b, accumulated into one (n_rows, p) buffer (see Matrix.matvec). On a
    worker of several threads the blocks are cut into one contiguous run a thread, balanced by nonzeros, each
    accumulated into its own buffer on its thread, and the runs' sums added by the fixed tree."""
    p = Ws[0].shape[1]
    blks = [resolve(src) for src in srcs]
    runs = thread_runs(blks, task_threads())

    def run(r):
        out = np.zeros((n_rows, p), dtype=np.float64)
        for i in runs[r]:
            _matvec(blks[i], Ws[i], out)
        return out

    if len(runs) == 1:
        return run(0)
    sums = each_in_threads(run, len(runs), len(runs))
    return tree_sum_into(sums, np.empty((n_rows, p), dtype=np.float64))


def thread_runs(blks, threads):
    """The blocks' indices cut into at most ``threads`` contiguous runs balanced by nonzeros: what a task over a
    partition's blocks runs on each of its worker's threads."""
    k = max(1, min(int(threads), len(blks)))
    if k == 1:
        return [list(range(len(blks)))]
    from dufs.engine.placement import runs

    return runs(list(range(len(blks))), np.array([max(int(b.nnz), 1) for b in blks], dtype=np.float64), k)


def block_columns(src, local):
    """Columns ``local`` (block-local positions) of a block as (indptr, indices, data)."""
    b = resolve(src)
    lo, hi = b.indptr[local], b.indptr[local + 1]
    counts = hi - lo
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    runs = [np.arange(a, c) for a, c in zip(lo, hi, strict=True)]
    take = np.concatenate(runs) if runs else np.zeros(0, np.int64)
    return indptr, b.indices[take], b.data[take]


def block_column(src, j):
    """Column ``j`` (block-local) of a block as (rows, values), copied."""
    b = resolve(src)
    a, c = b.indptr[j], b.indptr[j + 1]
    return b.indices[a:c].copy(), b.data[a:c].copy()


def block_topk(src, fn, k, largest, args, kwargs, start):
    s = np.asarray(fn(resolve(src), *resolved(args), **resolved(kwargs)), dtype=np.float64).ravel()
    return local_topk(s, k, largest, start)


def block_scores_and_top(src, fn, k, largest, args, kwargs, start, dtype=np.float64):
    """A block's scores by ``fn`` (sent as ``dtype``) and, unless ``k`` is None, its ``k`` best by their float64
    values (:func:`local_topk`)."""
    s = np.asarray(fn(resolve(src), *resolved(args), **resolved(kwargs)), dtype=np.float64).ravel()
    top = local_topk(s, k, largest, start) if k is not None else (None, None)
    return s.astype(dtype, copy=False), top


def local_topk(s: np.ndarray, k: int, largest: bool, start: int) -> tuple[np.ndarray, np.ndarray]:
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


_RANK_CHUNK = 1 << 20  # scores per slice in :func:`ranked_head` (its temporaries are a few of these)


def ranked_head(scores: np.ndarray, k: int, higher_is_better: bool = True) -> np.ndarray:
    """The first ``k`` of ``numpy.argsort(key, kind="stable")`` with ``key`` = -scores (or scores), NaN as +inf:
    the best ``k`` features, ties to the lower index, NaN last. Exactly that order, with memory bounded by slices
    of ``_RANK_CHUNK`` scores and ``k`` candidates a slice (a full argsort of kddb's 30M scores holds about 1 GB
    of keys, indices and merge buffers on the driver)."""
    s = np.asarray(scores).ravel()
    k = max(0, min(int(k), s.shape[0]))
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    cand_i, cand_k = [], []
    for a in range(0, s.shape[0], _RANK_CHUNK):
        key = np.array(s[a:a + _RANK_CHUNK], dtype=np.float64)  # a copy, made the key in place
        if higher_is_better:
            np.negative(key, out=key)
        key[np.isnan(key)] = np.inf
        part = np.arange(key.shape[0])
        if k < key.shape[0]:  # every tie with the k-th stays: the index decides among them
            part = np.flatnonzero(key <= key[np.argpartition(key, k - 1)[k - 1]])
        part = part[np.lexsort((part, key[part]))[:k]]
        cand_i.append(part + a)
        cand_k.append(key[part])
    ids, keys = np.concatenate(cand_i), np.concatenate(cand_k)
    return ids[np.lexsort((ids, keys))[:k]].astype(np.int64, copy=False)


def nnz_of(b: FeatureBlock) -> tuple[int, int]:
    return b.nnz, b.nbytes


def gather_block(b: FeatureBlock) -> FeatureBlock:
    return b


# a method's function, run on its block (or its partition's blocks) with its arguments resolved: a vector shared
# through /dev/shm is given as the array (dufs.engine.shm.resolved), so methods see plain arrays
def map_one(fn, src, args, kwargs):
    return fn(resolve(src), *resolved(args), **resolved(kwargs))


def map_group(fn, srcs, args, kwargs):
    return fn([resolve(s) for s in srcs], *resolved(args), **resolved(kwargs))


def map_state(fn, src, state, args, kwargs):
    out = fn([resolve(s) for s in src] if isinstance(src, list) else resolve(src), state, *resolved(args),
             **resolved(kwargs))
    if not (isinstance(out, tuple) and len(out) == 2):
        raise ParameterError("a map_blocks function given state= must return (new_state, result)")
    return out


def assemble_columns(n: int, ids: np.ndarray, owner: np.ndarray, bounds: np.ndarray, locs: dict, got: dict,
                     dtype: Any) -> Any:
    """Columns ``ids`` as one SciPy ``csc_array`` (n x len(ids)), in the order given, from each owning block's
    :func:`block_columns` result ``got[i]`` over its sorted local columns ``locs[i]``."""
    import scipy.sparse as sp

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
    return sp.csc_array((np.concatenate(data) if data else np.zeros(0, dtype),
                         np.concatenate(indices) if indices else np.zeros(0, np.int32),
                         np.concatenate(indptr)), shape=(n, ids.shape[0]))
