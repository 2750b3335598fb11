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
import functools
import os
import time
import uuid
from typing import Any, NamedTuple

import dask
import numpy as np

from dufs import config
from dufs._logging import get_logger
from dufs.engine.blocks import (
    BlockInfo,
    PerBlock,
    block_columns,
    block_matvec,
    block_rmatvec,
    block_scores_and_top,
    block_topk,
    gather_block,
    group_matvec,
    local_topk,
    map_group,
    map_one,
    map_state,
    nnz_of,
    partition_matvec_into,
    partition_rmatvec,
)
from dufs.engine.buffers import buffer
from dufs.engine.buffers import clear as clear_buffers
from dufs.engine.direct import (
    DirectFailed,
    HeldLost,
    Resident,
    direct_eligible,
    flush_drops,
    map_resident,
    release_resident,
)
from dufs.engine.dispatch import (
    compute,
    current_client,
    delayed,
    forget,
    inline_pass,
    is_inline,
    scatter_to,
    share,
    shareable,
    shipped,
    track,
    tree_sum,
    tree_sum_into,
    tree_sum_values,
)
from dufs.engine.inputs import (
    as_2d,
    as_ids,
    blocks_from_array,
    blocks_from_dask,
    blocks_from_store,
    check_labels,
    check_standardize,
    dask_identity,
    est_bytes,
    is_dask_array,
    memory_identity,
    store_identity,
)
from dufs.engine.placement import partition, persist_blocks
from dufs.engine.progress import report, run_pass, run_pass_streaming
from dufs.engine.state import BlockState
from dufs.engine.stats import ColumnStats, block_stats
from dufs.errors import ParameterError
from dufs.kernels.blockops import col_sums

__all__ = ["STANDARDIZE", "Matrix", "Transform", "as_matrix", "transform_of"]

log = get_logger(__name__)

#: the accepted values of ``Matrix(standardize=...)``
STANDARDIZE = ("zscore", "scale", None)

#: seconds a gathered pass reuses the blocks' placement before it asks the scheduler again
_PLACEMENT_TTL = 30.0


class Transform(NamedTuple):
    """The implicit standardisation of a :class:`Matrix`: Z = (X - 1 centre^T) diag(inv_scale), per feature;
    ``centre`` None means no centring, ``inv_scale`` None no scaling."""

    centre: np.ndarray | None
    inv_scale: np.ndarray | None


def transform_of(stats: ColumnStats, standardize: str | None) -> Transform:
    """The standardisation ``standardize`` of columns with these statistics (of a whole matrix or of one block:
    every number is per feature)."""
    if standardize is None:
        return Transform(None, None)
    sd = stats.std()
    sd = np.where((sd > 0) & np.isfinite(sd), sd, 1.0)
    inv = 1.0 / sd
    if standardize == "scale":
        return Transform(None, inv)
    return Transform(np.nan_to_num(stats.mean(), nan=0.0), inv)


def _inline_when_small(method):
    """Run ``method``'s passes inline (in this process, block after block, no graph) when ``self._inline()``."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with inline_pass(self._inline()):
            return method(self, *args, **kwargs)

    return wrapper


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
        check_standardize(standardize)
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
            self._src = blocks_from_store(X)
            labels = X.y if y is None else y
            self.dtype = X.dtype
            self.residency = {"mode": "store", "bytes": est_bytes(self._src, X.dtype),
                              "reason": "not persisted: blocks are read on the workers, cached per process"}
            self.feature_ids = X.feature_ids
            self.identity = store_identity(X, self.feature_ids)
        elif is_dask_array(X):
            self._src, infos, self.shape, self.dtype = blocks_from_dask(X, block_width)
            labels = y
            self.residency = {"mode": "source", "bytes": None,
                              "reason": "not persisted: blocks are recomputed from the Dask graph each pass"}
            self.identity = dask_identity(X)
        else:
            kind = type(X).__name__
            if type(X).__module__.startswith("sparse"):
                X = X.to_scipy_sparse()
            self._src, self.shape, self.dtype, fingerprint = blocks_from_array(X, block_width)
            labels = y
            self.residency = {"mode": "driver", "bytes": sum(b.nbytes for b in self._src),
                              "reason": "in memory in this process"}
            self.identity = memory_identity(kind, self.shape, sum(b.nnz for b in self._src), self.dtype,
                                             fingerprint)
        if not is_dask_array(X):
            infos = [BlockInfo(b.start, b.stop, b.nnz) for b in self._src]
        self.blocks = infos
        self.y, self.classes = (None, None) if labels is None else check_labels(labels, self.shape[0])
        self._stats: ColumnStats | None = None
        self._passes = [0]  # shared with the with_standardize() views of the same blocks
        self._units: dict = {}  # client id -> (when, the partitions of a gathered pass) (_pass_partitions)
        self._kept: list = []  # state items direct calls kept on the workers (shared with the views; release())

    # ------------------------------------------------------------------ description
    def __repr__(self) -> str:
        n, d = self.shape
        return (f"<dufs.engine.Matrix {n} x {d}, nnz={self.nnz}, {self.n_blocks} feature blocks, "
                f"standardize={self.standardize!r}, {self.residency['mode']}>")

    @property
    def passes(self) -> int:
        """Passes over the data made so far (by this matrix and its ``with_standardize`` views)."""
        return self._passes[0]

    def count_passes(self, k: int) -> None:
        """Count ``k`` more passes over the data: for a :meth:`map_blocks` function that sweeps its blocks' nonzeros
        more than once in one call (:meth:`map_blocks` counts one)."""
        self._passes[0] += int(k)

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
        f = delayed(nnz_of)
        got = compute([f(s) for s in self._src])
        self.blocks = [BlockInfo(b.start, b.stop, int(c)) for b, (c, _) in zip(self.blocks, got, strict=True)]
        if self.residency.get("bytes") is None:
            self.residency["bytes"] = int(sum(nb for _, nb in got))

    def rows_in_memory(self) -> Any:
        """The raw rows as one SciPy ``csr_array`` in this process, from in-memory blocks (for a store, read its CSR
        row blocks instead: :class:`dufs.engine.rows.Rows`)."""
        if self.residency["mode"] != "driver":
            raise ParameterError(f"the rows of a {self.residency['mode']} matrix are not in this process; give a "
                                 f"store or an in-memory matrix")
        import scipy.sparse as sp

        n = self.shape[0]
        parts = [sp.csc_array((b.data, b.indices, b.indptr), shape=(n, b.width)) for b in self._src]
        if not parts:
            return sp.csr_array((n, 0))
        return sp.hstack(parts, format="csr")

    def with_standardize(self, standardize: str | None) -> Matrix:
        """The same blocks (shared, not copied) and statistics under another standardization."""
        check_standardize(standardize)
        # the scattered transforms' cache shared with the origin, whose release drops the view's too (a view's own
        # cache was left to the garbage collector, after dufs.fit had closed its cluster)
        self.__dict__.setdefault("_tf_cache", {})
        out = object.__new__(Matrix)
        out.__dict__.update(self.__dict__)
        out.standardize = standardize
        out._view = True
        return out

    # ------------------------------------------------------------------ residency
    def persist(self, client: Any = None, *, fraction: float | None = None) -> Matrix:
        """Load the blocks into the workers' memory, balanced by nnz, when they fit in ``fraction`` (default
        ``dufs.engine.persist-fraction``) of the cluster's memory; otherwise leave them to be re-read each pass.

        Without a distributed client (``client`` or the active one) nothing changes. Blocks of a Dask array are
        always persisted (the alternative is recomputing the source every pass). Returns ``self``.
        """
        client = client or current_client()
        if client is None or self.residency["mode"] == "persisted":
            return self
        frac = float(config.get("engine.persist-fraction") if fraction is None else fraction)
        src, self.residency = persist_blocks(client, self._src, self.blocks, self.residency, frac)
        if src is None:  # they do not fit: re-read each pass
            log.info("%s", self.residency["reason"])
            return self
        self._src = src
        self._units = {}
        if self.residency["bytes"] is None or any(b.nnz < 0 for b in self.blocks):
            self._count()
        log.info("persisted %d feature blocks (%s MiB) on %d workers", self.n_blocks,
                 f"{self.residency['bytes'] / 2**20:,.1f}", self.residency["n_workers"])
        return self

    def __enter__(self) -> Matrix:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def release(self) -> None:
        """Drop persisted blocks (and the scattered transform) from the workers, this process's pooled files in
        /dev/shm (results and vectors, :func:`~dufs.engine.shm.release_files`; a later pass makes new ones) and the
        pooled pass outputs here and on the workers (:mod:`dufs.engine.buffers`). ``with as_matrix(X) as M:``
        releases at the end of the block, whatever happens in it.

        Also every block state that direct calls of this matrix (or its views) keep on the workers
        (:mod:`dufs.engine.direct`). A :meth:`with_standardize` view owns none of these (they are its origin's,
        which a later call may still use: ``dufs.fit`` is given a persisted Matrix and fits a view of it), so
        releasing a view drops nothing."""
        if self.__dict__.get("_view"):
            return
        from dufs.engine.shm import release_files

        release_files()
        clear_buffers()
        # every state item this matrix's direct calls kept on the workers (released ones are dropped already; a
        # solver's last state may not be): dropped now, not left on a cluster that outlives this process
        release_resident(self._kept)
        self._kept.clear()
        flush_drops(current_client())
        for s in self._src:
            if hasattr(s, "release"):
                s.release()
        cache = self.__dict__.get("_tf_cache", {})  # its views' entries too (the dict is shared), emptied in place
        forget(current_client(), [f for futs in cache.values() for f in futs])
        cache.clear()
        client = current_client()
        if client is not None:
            with contextlib.suppress(Exception):  # a cluster closing or gone keeps no pools
                client.run(clear_buffers)

    def to_scipy(self) -> Any:
        """X (untransformed) as a SciPy ``csc_array``: for small matrices and tests (it gathers every block)."""
        import scipy.sparse as sp

        n, d = self.shape
        if not self.blocks:
            return sp.csc_array((n, d), dtype=self.dtype)
        blocks = self.map_blocks(gather_block)
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
        f = delayed(block_stats)
        c = share(codes) if codes is not None else None
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
        return run_pass(name, tasks, inline=is_inline())

    def _pass_streaming(self, tasks: list, name: str, consume: Any) -> None:
        """A pass whose results go to ``consume(i, result)`` as they arrive (:func:`run_pass_streaming`)."""
        self._passes[0] += 1
        run_pass_streaming(name, tasks, consume, inline=is_inline())

    def _inline(self) -> bool:
        """Whether a pass runs inline: no distributed client, the blocks in this process or in a local store, and
        at most ``dufs.engine.inline-nnz`` nonzeros (a pass over them takes about what Dask spends building and
        running its graph, a few milliseconds)."""
        if self.residency.get("mode") not in ("driver", "store") or any(b.nnz < 0 for b in self.blocks):
            return False
        return sum(b.nnz for b in self.blocks) <= int(config.get("engine.inline-nnz")) and current_client() is None

    @property
    def stats(self) -> ColumnStats:
        """Column statistics of X (untransformed): one pass when first asked, then kept (shared with the
        ``with_standardize`` views made after it)."""
        if self._stats is None:
            self._stats = self.column_stats()
        return self._stats

    @property
    def transform(self) -> Transform:
        """The implicit standardisation Z = (X - 1 centre^T) diag(inv_scale) (see the module docstring): the
        per-feature ``centre`` (None unless ``"zscore"``) and ``inv_scale`` (None for no transform; a zero or
        undefined standard deviation is taken as 1)."""
        if self.standardize is None:
            return Transform(None, None)
        # kept with the statistics it came from: every product reads it, and at kddb size making it anew is half a
        # dozen temporary vectors over the features (240 MB each) a pass
        st = self.stats
        cached = self.__dict__.get("_transform")
        if cached is None or cached[0] is not st or cached[1] != self.standardize:
            cached = (st, self.standardize, transform_of(st, self.standardize))
            self.__dict__["_transform"] = cached
        return cached[2]

    def _block_transform(self) -> list[Any]:
        """Per block ``(mu_b, inv_b)`` of the transform (None where it leaves that part out). Under a distributed
        client they are scattered once and kept (keys, not literals, in every pass's graph: see ``_shipped``)."""
        mu, inv = self.transform
        args = [(None if mu is None else mu[b.start:b.stop], None if inv is None else inv[b.start:b.stop])
                for b in self.blocks]
        client = current_client()
        if client is None or (mu is None and inv is None):
            return args
        key = (self.standardize, id(self._stats), client.id)
        cache = self.__dict__.setdefault("_tf_cache", {})
        if key not in cache:
            # persisted: each block's part to the worker that holds the block (a pass run as direct calls reads it
            # there; scattered anywhere, a task fetched it from the other worker first)
            where = self._placed(client)[2] if self.residency.get("mode") == "persisted" else None
            cache[key] = scatter_to(client, args, where) if where and None not in where else \
                track(client.scatter(args, hash=False))
        return cache[key]

    @property
    def center(self) -> np.ndarray:
        """:attr:`transform`'s centre as an array (zeros unless ``"zscore"``)."""
        mu = self.transform.centre
        return np.zeros(self.shape[1]) if mu is None else mu

    @property
    def scale(self) -> np.ndarray:
        """The per-feature divisor of the standardisation, 1 / :attr:`transform`'s inverse scale (ones for None)."""
        inv = self.transform.inv_scale
        return np.ones(self.shape[1]) if inv is None else 1.0 / inv

    def column_sq_norms(self) -> np.ndarray:
        """||z_j||^2 of every transformed column (from the cached column statistics)."""
        st = self.stats
        mu, inv = self.transform
        base = st.m2 if mu is not None else st.sumsq
        base = np.maximum(np.asarray(base, dtype=np.float64), 0.0)
        if mu is not None:
            base = np.where(st.min == st.max, 0.0, base)
        return base * inv * inv if inv is not None else base

    # ------------------------------------------------------------------ products
    @_inline_when_small
    def rmatvec(self, V: Any, *, gather: bool = True, dtype: Any = np.float64) -> Any:
        """Z^T V for a dense ``V`` of shape (n_samples,) or (n_samples, p); float64 (n_features,) or (n_features, p).

        One pass; ``V`` travels to the workers once (one graph key), each block computes its rows of the result.
        With ``gather=False`` the per-block results (float64 (width, p) arrays) stay where they were computed: a
        :class:`BlockState` for a following :meth:`map_blocks` (``state=``), gathered only when asked.
        ``dtype`` float32: every sum is still made in float64 (and the transform applied in float64), then rounded
        once to float32 where it is made: half the bytes come back (SciPy's ``X.T @ v`` of float32 data and v is
        float32 too, summed in float32).
        """
        _rmatvec_dtype(dtype, "rmatvec")
        n = self.shape[0]
        # a float32 V over float32 data stays float32: exact (the kernel multiplies and sums in float64), and the
        # randomly read vector takes half the cache and half the bytes shipped (docs/architecture.md, "Measured facts")
        V2, one = as_2d(V, n, "V", "n_samples", keep_float32=np.dtype(self.dtype) == np.float32)
        vsum = col_sums(V2) if self.transform[0] is not None else None
        out = self._rmatvec(V2, 0, vsum, gather, dtype)
        return out if not gather else out[:, 0] if one else out

    @_inline_when_small
    def label_rmatvec(self, labels: Any, n_labels: int, *, dtype: Any = np.float64) -> np.ndarray:
        """Z^T U for U the n_samples x ``n_labels`` indicator of ``labels`` (U[i, labels[i]] = 1): each label's
        column sums of the transformed data, float64 (n_features, n_labels) (or ``dtype``).

        The same numbers as ``rmatvec(U)`` (each sum made in the same order; U's zeros add nothing), in one pass
        that ships the labels (4 bytes a sample) instead of U (8 n_labels bytes a sample: 1.5 GB at 19M samples and
        10 labels) and reads them at random instead of U's rows (a 10-column sweep over a 16 MB U took 4-5 times a
        one-vector pass; the labels' sweep about 1.5 times).
        """
        _rmatvec_dtype(dtype, "label_rmatvec")
        n = self.shape[0]
        if isinstance(n_labels, bool) or not isinstance(n_labels, int | np.integer) or n_labels < 1:
            raise ParameterError(f"The 'n_labels' parameter of label_rmatvec must be an int >= 1; got {n_labels!r}.")
        c = int(n_labels)
        lab = np.asarray(labels)
        if lab.shape != (n,) or (lab.size and lab.dtype.kind not in "iu"):
            raise ParameterError(f"The 'labels' parameter of label_rmatvec must be integers of shape (n_samples,) "
                                 f"= ({n},); got {lab.dtype} of shape {lab.shape}.")
        counts = np.bincount(lab, minlength=c) if lab.size and lab.min() >= 0 else None
        if lab.size and (counts is None or counts.shape[0] > c):
            raise ParameterError(f"The 'labels' parameter of label_rmatvec must lie in [0, n_labels) = [0, {c}); "
                                 f"got values in [{lab.min()}, {lab.max()}].")
        vsum = None
        if self.transform[0] is not None:
            vsum = counts.astype(np.float64) if counts is not None else np.zeros(c)
        return self._rmatvec(np.ascontiguousarray(lab, dtype=np.int32), c, vsum, True, dtype)

    def _rmatvec(self, V2: np.ndarray, classes: int, vsum: Any, gather: bool, dtype: Any) -> Any:
        """Z^T V for a 2-D ``V2``, or with ``classes`` > 0 for the indicator of the integer labels ``V2``
        (:meth:`label_rmatvec`); ``vsum``: V's column sums where the transform centres."""
        dt = None if np.dtype(dtype) == np.float64 else np.dtype(dtype)
        d = self.shape[1]
        shape = (d, classes or V2.shape[1])
        tf = self._block_transform()
        units = self._pass_partitions() if gather else None
        with shipped(V2, broadcast=units is not None and len(units) > 1, shared=True) as Vs:
            if units is None:
                f = delayed(block_rmatvec)
                tasks = [f(s, Vs, vsum, tf[i], dt, classes) for i, s in enumerate(self._src)]
                if not gather:
                    return self._resident(tasks)
                units = [[i] for i in range(self.n_blocks)]
            else:
                got = self._rmatvec_shared(units, Vs, vsum, tf, dt, shape, np.dtype(dtype), classes)
                if got is not None:
                    return got
                f = delayed(partition_rmatvec)
                tasks = [f([self._src[i] for i in u], Vs, vsum, [tf[i] for i in u], dt, None, None, classes)
                         for u in units]
            bounds = self.bounds
            # one partition holding every block in order (one worker) is the result as it is: taken, not copied (a
            # copy of a 30M-feature result is 240 MB moved and, into a fresh array, its pages faulted in)
            whole = len(units) == 1 and units[0] == list(range(self.n_blocks))
            res: list[np.ndarray] = []

            def place(u: int, got: np.ndarray) -> None:
                if whole and got.shape == shape and got.dtype == np.dtype(dtype) and got.flags.c_contiguous \
                        and got.flags.writeable:
                    res.append(got)
                    return
                if not res:
                    res.append(np.empty(shape, dtype))
                o = 0
                for i in units[u]:
                    a, b = bounds[i], bounds[i + 1]
                    res[0][a:b] = got[o:o + b - a]
                    o += b - a

            self._pass_streaming(tasks, "Z^T V", place)
            return res[0] if res else np.empty(shape, dtype)

    def _rmatvec_shared(self, units: list[list[int]], Vs: Any, vsum: Any, tf: list, dt: Any, shape: tuple,
                        dtype: np.dtype, classes: int = 0) -> np.ndarray | None:
        """The partitions' results written by the tasks into one file in /dev/shm (:func:`~dufs.engine.shm.receive`),
        whose array is the result (:func:`~dufs.engine.shm.lend`; copied out where /dev/shm is short of room), where
        every worker is on this machine: none of it sent back through the network (on the test machine 38 MiB of
        results took 21 ms of a 79 ms 2-worker pass that way). None where that is not
        possible (workers elsewhere, shared memory off, /dev/shm full): the caller gathers them."""
        from dufs.engine.shm import lend, receive_eligible, receive_or_none

        if not receive_eligible(current_client(), int(np.prod(shape)) * dtype.itemsize):
            return None
        bounds = self.bounds

        def args(into: Any) -> list[tuple]:
            return [([self._src[i] for i in u], Vs, vsum, [tf[i] for i in u], dt, into, [int(bounds[i]) for i in u],
                     classes) for u in units]

        for direct in (True, False):
            jobs = self._direct_jobs(units) if direct else None
            if direct and jobs is None:
                continue
            try:
                with contextlib.ExitStack() as stack:
                    got = receive_or_none(stack, shape, dtype)
                    if got is None:
                        return None
                    if jobs is not None:
                        self._direct_pass("Z^T V", partition_rmatvec, jobs, args(got[0]))
                    else:
                        f = delayed(partition_rmatvec)
                        self._pass_streaming([f(*a) for a in args(got[0])], "Z^T V", lambda u, r: None)
                    # the file's array is the result, where /dev/shm has room (it goes back to the pool once the
                    # caller lets go of it); else copied out into an array of this process's pool
                    # (dufs.engine.buffers: a fresh one's pages fault in again, 4 to 40 ms for 40 MB here)
                    if lend(got[0]):
                        return got[1]
                    out = buffer(shape, dtype)
                    np.copyto(out, got[1])
                    return out
            except DirectFailed:  # the file dropped (a call may still write into it); the pass again as tasks
                self._units = {}
        return None

    def _direct_jobs(self, units: list[list[int]]) -> dict[str, list[int]] | None:
        """``{worker address: [partition number, ...]}`` for a pass run as direct calls on the workers that hold
        each partition's blocks (:mod:`dufs.engine.direct`), or None where it cannot be (no client, direct passes
        off, a partition's blocks on more than one worker or on none)."""
        client = current_client()
        if not self._direct_ok(client):
            return None
        where = self._placed(client)[2]
        jobs: dict[str, list[int]] = {}
        for u, blocks in enumerate(units):
            owners = {where[i] for i in blocks}
            if len(owners) != 1 or None in owners:
                return None
            jobs.setdefault(owners.pop(), []).append(u)
        return jobs

    def _direct_ok(self, client: Any) -> bool:
        """Whether direct calls may run over this matrix's blocks at all (direct passes on, blocks persisted)."""
        return direct_eligible(client) and self.residency.get("mode") == "persisted"

    def _direct_pass(self, name: str, fn: Any, jobs: dict[str, list[int]], args: list[tuple], fetch: bool = False
                     ) -> dict[str, list]:
        """A pass whose partitions' ``fn(*args[u])`` run as direct calls on the workers in ``jobs``
        (:func:`~dufs.engine.direct.run_on_holders`), counted and reported as a pass; raises
        :class:`~dufs.engine.direct.DirectFailed`."""
        from dufs.engine.direct import run_on_holders

        total = len(args)
        report(name, 0, total)
        got = run_on_holders(current_client(), fn, {a: [args[u] for u in us] for a, us in jobs.items()}, fetch)
        self._passes[0] += 1
        report(name, total, total)
        return got

    def _pass_partitions(self) -> list[list[int]] | None:
        """The blocks grouped one partition a worker (a worker's persisted blocks together) for a pass whose
        per-block results are gathered: one task and one result a worker instead of one a block (each task costs
        the scheduler about a millisecond and each result a message). None when the blocks are not persisted on a
        distributed cluster (blocks re-read each pass, or in this process: one task a block)."""
        if self.residency.get("mode") != "persisted" or self.n_blocks < 2:
            return None
        client = current_client()
        if client is None:
            return None
        # where the blocks live costs the scheduler a round trip: asked again only after _PLACEMENT_TTL seconds (a
        # block moved since, by a lost worker or a rebalance, runs where its partition runs: correct, only slower)
        return self._placed(client)[1]

    def _placed(self, client: Any) -> tuple[float, list[list[int]] | None, list[str | None]]:
        """(when asked, the partitions one a worker or None, the worker of each block) for persisted blocks,
        asked of the scheduler again only after _PLACEMENT_TTL seconds."""
        now = time.monotonic()
        got = self._units.get(client.id)
        if got is None or now - got[0] > _PLACEMENT_TTL:
            where = self.placement()
            owners = {a for a in where if a is not None}
            got = (now, None if not owners or None in where else self.partition(len(owners), where), where)
            self._units = {client.id: got}
        return got

    def _resident(self, tasks: list) -> BlockState:
        """Run a pass whose per-block results stay on the workers (a BlockState of futures), or in this process."""
        client = current_client()
        self._passes[0] += 1
        if client is None:
            return BlockState(compute(tasks))
        from distributed import wait

        futures = track(client.compute(tasks))
        wait(futures)
        return BlockState(futures, client)

    @_inline_when_small
    def matvec(self, U: Any) -> np.ndarray:
        """Z U for a dense ``U`` of shape (n_features,) or (n_features, p); float64 (n_samples,) or (n_samples, p).

        One pass; the per-block partial products are summed on the workers by a tree in block order (fixed, so
        the result does not depend on the number of workers), and only the sum comes back.
        """
        n, d = self.shape
        U2, one = as_2d(U, d, "U", "n_features")
        mu, inv = self.transform
        if not self.blocks:
            out = np.zeros((n, U2.shape[1]))
        else:
            groups = self._matvec_groups(n * U2.shape[1] * 8)
            client = current_client()
            # direct calls read U as it is (one shared copy) and scale their blocks' rows by the blocks' part of the
            # transform, kept on their workers: the driver makes no scaled copy of U (a d x p pass of its own, 2-3 ms
            # a product for M3FS's 1M-feature vectors, 20-40 ms for UFCM's 1M x 10)
            tf = self._block_transform() if inv is not None else None
            out = self._matvec_shared(U2, None, n, U2.shape[1], tf) if groups is None else None
            # each block's rows of U diag(inv) sent to the worker that holds the block (scattered wherever, half of
            # them moved again between two workers before their tasks could start)
            where = self._placed(client)[2] if client is not None and self.residency.get("mode") == "persisted" \
                and self.n_blocks > 1 else None
            Wb = None
            if out is None:
                Us = U2 * inv[:, None] if inv is not None else U2  # one scaled copy; the blocks' rows are views
                Wb = [Us[b.start:b.stop] for b in self.blocks]
            with contextlib.nullcontext(None) if out is not None else shipped(Wb, where=where) as Ws:
                if out is None and groups is None:
                    out = self._matvec_shared(None, Ws, n, U2.shape[1])
                if out is None:
                    if groups is None:
                        f = delayed(block_matvec)
                        parts = [f(s, Ws[i], n) for i, s in enumerate(self._src)]
                    else:
                        f = delayed(group_matvec)
                        parts = [f([self._src[i] for i in g], [Ws[i] for i in g], n) for g in groups]
                    out = self._pass([tree_sum(parts)], "Z U")[0]
        if mu is not None:
            out = out - (self._centre_scaled() @ U2)[None, :]
        return out[:, 0] if one else out

    def _centre_scaled(self) -> np.ndarray:
        """centre diag(inv) (the centring's part of Z U is 1 (centre diag(inv) U)), kept for this transform."""
        mu, inv = self.transform
        key = (self.standardize, id(self._stats))
        got = self.__dict__.get("_centre_scaled_cache")
        if got is None or got[0] != key:
            got = (key, mu * inv if inv is not None else np.asarray(mu, dtype=np.float64))
            self.__dict__["_centre_scaled_cache"] = got
        return got[1]

    def _matvec_shared(self, Us: np.ndarray | None, Ws: list | None, n: int, p: int, tf: list | None = None
                       ) -> np.ndarray | None:
        """Z U's per-block partial products written by each worker into their slots of one results file in
        /dev/shm (:func:`~dufs.engine.shm.receive`) and summed here by the same fixed tree as on the workers (the
        same numbers, whatever the number of workers), where the blocks are persisted on workers of this machine
        and all the partials together take at most ``dufs.engine.wide-product-bytes`` (the sum here costs a pass
        over them). None otherwise (the workers sum them). On 2 workers, 2 blocks of 200k x 10 partials: the tree
        moved one partial between the workers and the sum to the driver, 131 ms a product against 103 on 1 worker.

        With ``Us`` (U whole, and ``tf`` the blocks' transforms when their rows are to be scaled by inv there): one
        direct call a worker (:mod:`dufs.engine.direct`) over its blocks' rows of ``Us``, shared through /dev/shm;
        None where that cannot run. With ``Ws`` (each block's rows of U diag(inv), shipped): one task a worker."""
        from dufs.engine.shm import publish, receive_eligible, receive_or_none

        units = self._pass_partitions()
        nb = self.n_blocks
        nbytes = nb * n * p * 8
        if units is None or nbytes > config.parse_bytes(config.get("engine.wide-product-bytes")) or \
                not receive_eligible(current_client(), nbytes):
            return None
        jobs = self._direct_jobs(units) if Us is not None else None
        if Us is not None and jobs is None:
            return None
        bounds = self.bounds
        try:
            with contextlib.ExitStack() as stack:
                got = receive_or_none(stack, (nb, n, p), np.float64)
                if got is None:
                    return None
                if jobs is not None:
                    try:
                        ref = stack.enter_context(publish(Us))
                    except OSError:  # /dev/shm cannot hold U: the blocks' rows shipped to tasks instead
                        return None
                    args = [([self._src[i] for i in u], [(int(bounds[i]), int(bounds[i + 1])) for i in u], got[0],
                             u, ref, None if tf is None else [tf[i] for i in u]) for u in units]
                    self._direct_pass("Z U", partition_matvec_into, jobs, args)
                else:
                    f = delayed(partition_matvec_into)
                    tasks = [f([self._src[i] for i in u], [Ws[i] for i in u], got[0], u) for u in units]
                    self._pass_streaming(tasks, "Z U", lambda u, r: None)
                # summed in the file's slots, the last level into an array of this process's pool
                # (dufs.engine.buffers: each level's fresh array faulted its pages in, 10 ms a product of 200K x 10)
                return tree_sum_into([got[1][i] for i in range(nb)], buffer((n, p), np.float64))
        except DirectFailed:  # the files dropped (a call may still write into them); the product as tasks
            self._units = {}
            return None

    def _matvec_groups(self, out_bytes: int) -> list[list[int]] | None:
        """For a product Z U whose n_samples x p result is large (``out_bytes`` at least
        ``dufs.engine.wide-product-bytes``) under a distributed client: the blocks in one group per worker (its
        persisted blocks together), each group one task that accumulates its blocks into a single n x p buffer, so a
        worker holds one such buffer at a time instead of a partial per block waiting for the tree. The sum then
        depends on the number of workers (rounding only); below the bound, one partial per block in a fixed tree."""
        client = current_client()
        if client is None or out_bytes < config.parse_bytes(config.get("engine.wide-product-bytes")):
            return None
        n_workers = max(1, len(client.scheduler_info(n_workers=-1)["workers"]))
        return self.partition(n_workers)

    @_inline_when_small
    def columns(self, ids: Any) -> Any:
        """Columns ``ids`` of X (untransformed) as a SciPy ``csc_array`` (n_samples x len(ids)), in the order given.

        One pass over the blocks that hold them. The transformed column j is ``(X[:, j] - center[j]) / scale[j]``;
        :meth:`dense_columns` gives it.
        """
        import scipy.sparse as sp

        n, d = self.shape
        ids = as_ids(ids, d)
        bounds = self.bounds
        owner = np.searchsorted(bounds, ids, side="right") - 1
        f = delayed(block_columns)
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
        ids = as_ids(ids, self.shape[1])
        C = self.columns(ids).toarray().astype(np.float64)
        mu, inv = self.transform
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
        ids = as_ids(np.atleast_1d(i), d)
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
                   partitions: list | None = None, **kwargs: Any) -> Any:
        """Run ``fn(block, *args, **kwargs)`` on every feature block where it is loaded: one task a block, one pass.

        ``block`` is a :class:`FeatureBlock`. Arguments wrapped in :class:`PerBlock` are given block by block;
        large arrays travel once per pass. Results (small) come back in block order, or, with ``reduce="sum"``,
        summed on the workers by a fixed tree and returned as one value.

        With ``partitions`` (lists of block indices, e.g. :meth:`partition`) there is one task a partition
        instead: ``fn(blocks, ...)`` gets the partition's blocks as a list, and each :class:`PerBlock` argument as a
        list with one item per block of the partition; results (and state) are one per partition, in partition
        order.

        With ``state`` (a :class:`BlockState` or a list, one item per block or partition) the call is
        ``fn(block, state_i, *args, **kwargs)`` and must return ``(new_state_i, result_i)``; the new state stays
        beside its block (on the worker) and ``(results, BlockState)`` is returned.
        """
        if reduce not in (None, "sum"):
            raise ParameterError(f"The 'reduce' parameter of map_blocks must be None or 'sum'; got {reduce!r}.")
        units = None if partitions is None else self._check_partitions(partitions)

        def pick(a: Any, u: int) -> Any:
            if units is None:
                return self._block_item(a, u)
            return [self._block_item(a, i) for i in units[u]] if isinstance(a, PerBlock) else a

        def task_args(u: int) -> tuple:
            return tuple(pick(a, u) for a in shared), {k: pick(v, u) for k, v in kw.items()}

        srcs = list(self._src) if units is None else [[self._src[i] for i in q] for q in units]
        n = len(srcs)
        if state is not None:
            items = state.items if isinstance(state, BlockState) else list(state)
            if len(items) != n:
                raise ParameterError(f"map_blocks: state has {len(items)} items for {n} "
                                     f"{'blocks' if units is None else 'partitions'}")
            got = self._map_direct(fn, srcs, items, args, kwargs, units, reduce, pick)
            if not isinstance(got, str):
                return got
            resident = [i for i in items if isinstance(i, Resident)]
            if resident:  # dropped now (its memory back before the solver rebuilds it), then said lost
                release_resident(resident)
                flush_drops(current_client())
                raise HeldLost(f"the block state kept on the workers by direct calls was lost: {got}")
        shared = [self._scatter_per_block(share(a)) for a in args]
        kw = {k: self._scatter_per_block(share(v)) for k, v in kwargs.items()}
        if state is None:
            f = delayed(map_one if units is None else map_group)
            tasks = [f(fn, s, *task_args(u)) for u, s in enumerate(srcs)]
            if reduce == "sum":
                return self._pass([tree_sum(tasks)], _name(fn))[0] if tasks else None
            return self._pass(tasks, _name(fn))
        from operator import getitem

        f = delayed(map_state)
        g = delayed(getitem, pure=True)
        client = current_client()
        home = self._homes(client, units) if client is not None else [None] * n
        pairs, new, res = [], [], []
        for u, s in enumerate(srcs):
            # a unit's task and the two picks of its output on the worker of its blocks: left free, a pick could
            # run on the other worker and pull the whole (state, result) pair across (a partition's MMFS state is
            # 7 arrays of 8 bytes a feature: 140 MB on the 2M x 5M bench store, a copy on each worker every round)
            with dask.annotate(**({"workers": [home[u]], "allow_other_workers": True} if home[u] else {})):
                p = f(fn, s, items[u], *task_args(u))
                pairs.append(p)
                new.append(g(p, 0))
                res.append(g(p, 1))
        self._passes[0] += 1
        if client is None:
            got = compute(new + res)
            return (tree_sum_values(got[n:]) if reduce == "sum" else got[n:], BlockState(got[:n]))
        futs = track(client.compute(new + ([tree_sum(res)] if reduce == "sum" else res)))
        out = client.gather(futs[n:])
        return (out[0] if reduce == "sum" else out), BlockState(futs[:n], client)

    @_inline_when_small
    def map_sums(self, fn: Any, keys: list, *args: Any, then: Any = None, then_args: tuple = ()) -> list:
        """One pass of ``len(keys)`` sums: for each key, the sum over blocks of ``fn(block, key, *args)`` (the fixed
        tree of :meth:`map_blocks`), then ``then(sum, key, *then_args)`` where that sum was made (on a worker),
        whose result comes back; results in key order. The keys are small (row ranges, say); ``args`` as in
        :meth:`map_blocks` (:class:`PerBlock` allowed), each shipped once for all keys, like ``then_args``. With no
        blocks every sum is None.

        For reductions whose sums are large and whose use of them is small (the exact kNN graph: an n x rows Gram
        block, of which a row keeps k neighbours): the sums stay on the workers, and the keys' sums are made side by
        side on all of them, where one :meth:`map_blocks` a key brought each sum back and ran one block's task at a
        time. Memory on the workers: up to a sum (and its parts) a key in flight; give a few keys a pass.
        """
        keys = list(keys)
        if not keys:
            return []
        if not self._src:  # no blocks: every sum is None (map_blocks' sum of nothing), finished here
            return [None if then is None else then(None, key, *then_args) for key in keys]
        shared = [self._scatter_per_block(share(a)) for a in args]
        fin = [share(a) for a in then_args]
        f = delayed(map_one)
        g = delayed(then) if then is not None else None
        out = []
        for key in keys:
            parts = [f(fn, s, (key, *(self._block_item(a, i) for a in shared)), {}) for i, s in enumerate(self._src)]
            out.append(tree_sum(parts) if g is None else g(tree_sum(parts), key, *fin))
        return self._pass(out, _name(fn))

    def _block_item(self, a: Any, i: int) -> Any:
        """Block ``i``'s item of a :class:`PerBlock` argument (its list item, or its slice over the block's
        features); any other argument as it is."""
        if not isinstance(a, PerBlock):
            return a
        v, b = a.value, self.blocks[i]
        if isinstance(v, list | tuple):
            if len(v) != self.n_blocks:
                raise ParameterError(f"a PerBlock list must have one item per block ({self.n_blocks}); got {len(v)}")
            return v[i]
        return v[b.start:b.stop]

    def _map_direct(self, fn: Any, srcs: list, items: list, args: tuple, kwargs: dict, units: list | None,
                    reduce: str | None, pick: Any) -> tuple | str:
        """:meth:`map_blocks` with state as direct calls (:mod:`dufs.engine.direct`): each unit's
        ``fn(blocks, state, ...)`` called on the worker that holds its blocks, the new state kept in that worker's
        memory (a :class:`~dufs.engine.direct.Resident` item a unit), the results brought back and (``reduce``)
        summed here by the workers' fixed tree. Why it cannot run, where it cannot (the caller runs tasks, or,
        over state kept by direct calls, says it was lost); a call that fails over state kept that way raises the
        worker's error (a lost worker or block says "was lost": the solvers rebuild their state, as after lost
        workers)."""
        from dufs.engine.shm import results_local, take_result

        client = current_client()
        resident = any(isinstance(i, Resident) for i in items)
        # on workers of this machine only: a call's result goes through the scheduler unless it comes back through
        # /dev/shm (an MMFS round's change of w is 152 MB at kddb size), where tasks send theirs straight back.
        # State kept by direct calls says they ran here before (the check asks the scheduler, which a loaded
        # machine may not answer in time)
        if not resident and not results_local(client):
            return "the workers are not all on this machine"
        unit_blocks = units if units is not None else [[i] for i in range(self.n_blocks)]
        if resident and all(isinstance(it, Resident) for it in items) and self._direct_ok(client):
            # each unit where its state is kept: a block that moved meanwhile (a task ran on another worker, which
            # fetched it, and Dask's active memory manager then dropped the other copy) is fetched back by the
            # call (dufs.engine.direct); the state goes only with its worker
            jobs, home, follow = {}, {}, True
            for u, it in enumerate(items):
                jobs.setdefault(it.address, []).append(u)
                home[u] = it.address
            unit_of = {i: u for u, bs in enumerate(unit_blocks) for i in bs}
            where = [home[unit_of[i]] for i in range(self.n_blocks)]
        else:
            jobs, follow = self._direct_jobs(unit_blocks), False
            if jobs is None:
                return "its blocks are not on one worker a unit, or direct passes are switched off"
            home = {u: a for a, us in jobs.items() for u in us}
            if resident and not all(not isinstance(it, Resident) or it.address == home[u]
                                    for u, it in enumerate(items)):
                return "part of its state is kept on the workers and part is not"
            where = self._placed(client)[2]

        def place(a: Any) -> Any:  # each block's slice to its block's worker, other large arguments to every worker
            if isinstance(a, PerBlock):
                return self._scatter_per_block(a, where)
            return track(client.scatter(a, hash=False, broadcast=True)) if shareable(a) else a

        dargs = [place(a) for a in args]
        dkw = {k: place(v) for k, v in kwargs.items()}
        # futures the caller gave (a vector it scattered to one worker) must be on every worker called: else tasks
        # fetch them, or (the state is kept by direct calls) their values go with the calls
        given = _futures((args, kwargs))
        if given:
            who = client.who_has(given)
            missing = [f for f in given if not set(jobs) <= set(who.get(f.key, ()))]
            if missing and not resident:
                return "an argument is not on every worker called"
            if missing:
                values = dict(zip([f.key for f in missing], client.gather(missing), strict=True))
                dargs = [_by_value(a, values) for a in dargs]
                dkw = {k: _by_value(v, values) for k, v in dkw.items()}
        tokens = [uuid.uuid4().hex for _ in srcs]
        # results of 256 KiB or more (a greedy step's attached columns) through /dev/shm: a direct call's result
        # otherwise comes back through the scheduler, about 3 ms a MiB here
        calls = [(fn, s, items[u], tuple(pick(a, u) for a in dargs), {k: pick(v, u) for k, v in dkw.items()},
                  tokens[u], _SPILL_BYTES) for u, s in enumerate(srcs)]
        try:
            got = self._direct_pass(_name(fn), map_resident, jobs, calls, fetch=follow)
        except DirectFailed as exc:
            self._units = {}
            if resident:  # the state is on the workers only: the worker's own error (lost, or a real one)
                raise exc.__cause__ from None
            return f"a call failed ({exc})"
        res: list = [None] * len(srcs)
        for a, us in jobs.items():
            for u, r in zip(us, got[a], strict=True):
                res[u] = take_result(r)
        out = tree_sum_values(res) if reduce == "sum" else res
        kept = [Resident(tokens[u], home[u]) for u in range(len(srcs))]
        self._kept.extend(kept)
        return out, BlockState(kept, client)

    def _scatter_per_block(self, a: Any, where: list | None = None) -> Any:
        """A large :class:`PerBlock` array under a distributed client, as one scattered key per block (its slice):
        literal slices would make a large graph, which the scheduler keeps after the pass (see ``_shipped``).
        ``where``: the worker of each block, where its slice goes (else anywhere)."""
        if not isinstance(a, PerBlock) or not isinstance(a.value, np.ndarray) or a.value.nbytes < 1 << 20:
            return a
        client = current_client()
        if client is None:
            return a
        v = a.value
        slices = [np.ascontiguousarray(v[b.start:b.stop]) for b in self.blocks]
        return PerBlock(scatter_to(client, slices, where) if where and None not in where else
                        track(client.scatter(slices, hash=False)))

    def _homes(self, client: Any, units: list[list[int]] | None) -> list[str | None]:
        """The worker of each block (``units`` None) or partition: the one holding most of its blocks' nonzeros
        (persisted blocks; None for each otherwise). Where the blocks live is :meth:`_placed`'s, asked of the
        scheduler once in a while, not every round."""
        where = self._placed(client)[2]
        if units is None:
            return where
        out: list[str | None] = []
        for q in units:
            nnz: dict[str, int] = {}
            for i in q:
                if where[i] is not None:
                    nnz[where[i]] = nnz.get(where[i], 0) + int(self.blocks[i].nnz)
            out.append(max(sorted(nnz), key=nnz.__getitem__) if nnz else None)
        return out

    def _check_partitions(self, partitions: Any) -> list[list[int]]:
        try:
            units = [[int(i) for i in g] for g in partitions]
        except TypeError:
            raise ParameterError("The 'partitions' parameter of map_blocks must be a list of lists of block "
                                 "indices.") from None
        flat = [i for g in units for i in g]
        if any(not g for g in units) or sorted(flat) != list(range(self.n_blocks)):
            raise ParameterError(f"The 'partitions' parameter of map_blocks must split the {self.n_blocks} blocks "
                                 f"into non-empty partitions, each block in exactly one; got {partitions!r}.")
        return units

    def placement(self) -> list[str | None]:
        """The worker address holding each block (persisted blocks); None for every block otherwise."""
        client = current_client()
        if client is None or self.residency.get("mode") != "persisted":
            return [None] * self.n_blocks
        who = client.who_has(self._src)
        return [min(who.get(s.key) or [None], key=lambda a: a or "") for s in self._src]

    def partition(self, n: int, where: list[str | None] | None = None) -> list[list[int]]:
        """The blocks cut into ``n`` partitions, balanced by nonzeros, a worker's persisted blocks together
        (:func:`dufs.engine.placement.partition`; ``where``: :meth:`placement`, asked when not given)."""
        return partition([b.nnz for b in self.blocks], self.placement() if where is None else where, n)

    @_inline_when_small
    def topk(self, fn: Any, k: int, *args: Any, largest: bool = True, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best features by ``fn(block, *args, **kwargs)`` (a score per feature of the block): each block
        proposes its own best, the driver merges. Returns ``(indices, scores)`` best first; NaN counts as worst,
        ties go to the lower index."""
        if not isinstance(k, int | np.integer) or k < 1:
            raise ParameterError(f"The 'k' parameter of topk must be an int >= 1; got {k!r}.")
        shared = tuple(share(a) for a in args)
        f = delayed(block_topk)
        parts = self._pass([f(s, fn, int(k), largest, shared, kwargs, b.start)
                            for s, b in self._pairs()], "top-k")
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0)
        ids = np.concatenate([p[0] for p in parts])
        sc = np.concatenate([p[1] for p in parts])
        sel, _ = local_topk(sc, int(k), largest, 0)
        return ids[sel], sc[sel]

    @_inline_when_small
    def block_scores(self, fn: Any, *args: Any, k: int | None = None, largest: bool = True,
                     dtype: Any = None, **kwargs: Any) -> tuple[np.ndarray, np.ndarray | None]:
        """Every feature's score by ``fn(block, *args, **kwargs)`` (a score per feature of the block, computed where
        the block lives), and, with ``k``, the ``k`` best features (NaN worst, ties to the lower index), in one
        pass. The driver holds the scores (``dtype``) and one block's result at a time: each block's scores are
        written into place as they arrive and its ``k`` best merged with the others' (``Matrix.topk``'s rule).
        ``dtype`` (None: float64, float32 above ``dufs.engine.driver-features`` features) is the scores' type on
        the driver; blocks compute and rank in float64 either way."""
        d = self.shape[1]
        if dtype is None:
            dtype = np.float32 if d > int(config.get("engine.driver-features")) else np.float64
        scores = np.empty(d, dtype=dtype)
        shared = tuple(share(a) for a in args)
        kw = {key: share(v) for key, v in kwargs.items()}
        kk = None if k is None else int(k)
        cands: dict[int, tuple] = {}  # block -> its (ids, scores), merged in block order: ties to the lower index

        def consume(i: int, got: Any) -> None:
            s, top = got
            b = self.blocks[i]
            scores[b.start:b.stop] = s
            if kk is not None:
                cands[i] = top

        f = delayed(block_scores_and_top)
        tasks = [f(s, fn, kk, largest, shared, kw, b.start, dtype) for s, b in self._pairs()]
        self._pass_streaming(tasks, _name(fn), consume)
        if kk is None:
            return scores, None
        if not cands:
            return scores, np.zeros(0, np.int64)
        ids = np.concatenate([cands[i][0] for i in sorted(cands)])
        sel, _ = local_topk(np.concatenate([cands[i][1] for i in sorted(cands)]), kk, largest, 0)
        return scores, ids[sel]

    def argmax(self, fn: Any, *args: Any, **kwargs: Any) -> tuple[int, float]:
        """The feature with the largest ``fn`` score (see :meth:`topk`) and its score."""
        i, s = self.topk(fn, 1, *args, **kwargs)
        return int(i[0]), float(s[0])


_SPILL_BYTES = 256 << 10  # a direct call's result this large comes back through /dev/shm (Matrix._map_direct)


def _rmatvec_dtype(dtype: Any, name: str) -> None:
    if np.dtype(dtype) not in (np.float32, np.float64):
        raise ParameterError(f"The 'dtype' parameter of {name} must be float32 or float64; got {dtype!r}.")


def _futures(x: Any) -> list:
    """The ``distributed.Future`` objects within ``x`` (lists, tuples, dicts, :class:`PerBlock`)."""
    from distributed import Future

    if isinstance(x, Future):
        return [x]
    if isinstance(x, PerBlock):
        return _futures(x.value) if isinstance(x.value, list | tuple) else []
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, list | tuple):
        return [f for v in x for f in _futures(v)]
    return []


def _by_value(x: Any, values: dict) -> Any:
    """``x`` with the futures whose keys are in ``values`` replaced by those values (within lists, tuples and
    :class:`PerBlock`)."""
    from distributed import Future

    if isinstance(x, Future):
        return values.get(x.key, x)
    if isinstance(x, PerBlock):
        return PerBlock(_by_value(x.value, values)) if isinstance(x.value, list | tuple) else x
    if isinstance(x, list | tuple):
        return type(x)(_by_value(v, values) for v in x)
    return x


def _name(fn: Any) -> str:
    return str(getattr(fn, "__name__", "map_blocks")).lstrip("_").replace("_", " ")


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
