"""The feature-blocked matrix: column statistics and implicitly standardized products (docs/architecture.md,
"The engine").

A :class:`Matrix` holds X (n_samples x n_features) as CSC feature blocks, each a run of whole columns as raw
``indptr, indices, data`` buffers. Its products apply the chosen standardization implicitly, never densifying:

- ``"zscore"``: Z = (X - 1 mu^T) S^-1, so Z^T v = S^-1 (X^T v - mu (1^T v)) and Z u = X (S^-1 u) - 1 (mu^T S^-1 u);
- ``"scale"``:  Z = X S^-1 (no centring);
- ``None``:     Z = X;

with S = diag(std) (population standard deviation) and a zero std taken as 1, so constant columns stay zero (or
constant) instead of dividing by zero.

The matrix says what a pass computes; its :class:`~dufs.engine.executor.Executor` says how the pass runs (inline,
Dask tasks, direct calls on the workers, results through /dev/shm). Blocks live on the workers: persisted in their
memory when the cluster holds them (:meth:`Matrix.persist`, placed by nnz), else re-read from the store each pass
(a per-process cache keeps recently used blocks). Per-block partial results are combined in float64 in a fixed
order (concatenation in block order, or a fixed pairwise tree for sums), so results do not depend on the number
of workers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dufs import config
from dufs.engine.blocks import (
    ROWS,
    VALUES,
    BlockInfo,
    gather_block,
    row_sq_sums,
    valued_dtype,
)
from dufs.engine.columns import ColumnAccess
from dufs.engine.dispatch import current_client, delayed, ship
from dufs.engine.executor import Executor, inline_when_small
from dufs.engine.inputs import (
    check_labels,
    check_standardize,
    source_of,
)
from dufs.engine.passes import Passes
from dufs.engine.placement import valued_sources
from dufs.engine.stats import ColumnStats, Transform, transform_of
from dufs.errors import ParameterError

__all__ = ["ROWS", "STANDARDIZE", "VALUES", "Matrix", "Transform", "as_matrix", "transform_of"]

#: the accepted values of ``Matrix(standardize=...)``
STANDARDIZE = ("zscore", "scale", None)

# what a with_standardize view shares with its origin (besides the executor): the input's description
_DESCRIPTION = ("shape", "dtype", "store_path", "feature_ids", "identity", "y", "classes", "values", "rows")


# ---------------------------------------------------------------------------------------------------- the matrix
class Matrix(Passes, ColumnAccess):
    """X (n_samples x n_features) as CSC feature blocks, with implicit standardization.

    Build it with :func:`as_matrix` (any input kind, persisted on the cluster) or directly from a store or an
    in-memory matrix.

    Parameters
    ----------
    X : SparseStore, str or path-like (a store), SciPy sparse matrix/array, 2-D NumPy array, or Matrix
        A store is read block by block (its CSC feature blocks); an in-memory matrix is cut into blocks of
        ``block_width`` features. A Matrix gives a view of its blocks under ``standardize``
        (:meth:`with_standardize`).
    standardize : {"zscore", "scale", None}
        The transform applied inside every product (see the module docstring).
    block_width : int, optional
        Features per block for in-memory input; by default about ``dufs.store.feature-block-nnz`` nonzeros
        per block. Ignored for a store (its own blocks are used).
    y : array-like, optional
        Labels (n_samples); for a store, its labels by default.
    values : {"raw", "presence", "log1p", "sqrt"}, optional
        What every pass reads of each stored value (:data:`VALUES`): the value, 1 (whether the entry is stored:
        for sparse counts), log(1 + x) or the square root (these two for non-negative data). Applied where a
        block is loaded or persisted, block by block, before anything else: the column statistics, products,
        ``map_blocks`` functions and :meth:`to_scipy` all see the values so read, and ``standardize`` transforms
        them. Default: as a Matrix ``X`` reads them (a view of it; another reading: :meth:`with_values`), raw
        for any other input.
    rows : {"raw", "unit"}, optional
        ``"unit"``: each row (sample) scaled to unit L2 norm, of its values as ``values`` reads them (cosine
        geometry; an all-zero row stays zero). The squared row norms are one pass over the raw blocks (each
        block's partial sums, summed by a fixed tree: the only thing made on the driver is that n-vector), then
        each block's values are divided by their rows' norms where the block is loaded or persisted, with the
        ``values`` reading, so the statistics, products and ``map_blocks`` see the scaled data. Default: as a
        Matrix ``X`` reads them, raw (as stored) for any other input.

    Attributes
    ----------
    residency : dict
        Where the blocks live between passes: ``{"mode": "driver" | "store" | "persisted" | "source", ...}``
        (in this process; re-read from the store each pass through a per-worker cache; persisted in the
        workers' memory; recomputed from a Dask graph each pass), with the bytes and the reason.
    executor : Executor
        How its passes run (shared with its :meth:`with_standardize` views).
    """

    def __init__(self, X: Any, *, standardize: str | None = None, block_width: int | None = None,
                 y: Any = None, values: str | None = None, rows: str | None = None):
        check_standardize(standardize)
        if values is not None and values not in VALUES:
            raise ParameterError(f"The 'values' parameter must be one of {', '.join(map(repr, VALUES))}; got "
                                 f"{values!r}.")
        if rows is not None and rows not in ROWS:
            raise ParameterError(f"The 'rows' parameter must be one of {', '.join(map(repr, ROWS))}; got {rows!r}.")
        self.standardize = standardize
        self._transform: tuple | None = None  # (statistics, standardize, Transform) last made
        self._centre_scaled: tuple | None = None
        if isinstance(X, Matrix):  # a view: the same blocks, executor and statistics, another transform
            if block_width is not None or y is not None:
                raise ParameterError("a Matrix view takes its blocks and labels from its origin: give neither "
                                     "'block_width' nor 'y'")
            for name in _DESCRIPTION:
                setattr(self, name, getattr(X, name))
            self._raw = X.raw_matrix  # the matrix of the same blocks read raw, where there is one
            want = (X.values if values is None else values, X.rows if rows is None else rows)
            if want == (X.values, X.rows):
                self.executor, self._stats, self._view = X.executor, X.cached_stats, True
            elif want == ("raw", "raw") and self._raw is not None:
                self.executor, self._stats, self._view = self._raw.executor, self._raw.cached_stats, True
                self.values, self.rows, self.dtype = "raw", "raw", self._raw.dtype
            elif self._raw is None:
                raise ParameterError(f"this Matrix was built reading its values as {X.values!r} and its rows as "
                                     f"{X.rows!r}; build another from the input to read them as {want[0]!r} and "
                                     f"{want[1]!r}")
            else:  # the raw blocks' values transformed, in blocks of its own (released with this matrix)
                self._read_from(self._raw, *want)
            self._resolve_auto()
            return
        if rows == "unit":  # the raw matrix first: the row norms are a pass over its blocks
            raw = Matrix(X, block_width=block_width, y=y)
            for name in _DESCRIPTION:
                setattr(self, name, getattr(raw, name))
            self._raw = raw
            self._read_from(raw, "raw" if values is None else values, "unit")
            self._resolve_auto()
            return
        self.rows = "raw"
        s = source_of(X, block_width, y)
        self.values = "raw" if values is None else values
        src, residency = valued_sources(s.src, self.values, s.residency, [], None)
        self.executor = Executor(src, s.blocks, residency)
        self.shape, self.identity = s.shape, s.identity
        self.dtype = s.dtype if self.values == "raw" else valued_dtype(s.dtype)
        self.store_path: str | None = s.store_path  # the store the blocks come from (kept when persisted)
        self.feature_ids: np.ndarray | None = s.feature_ids  # a store's feature ids, when it has them
        self.y, self.classes = (None, None) if s.labels is None else check_labels(s.labels, self.shape[0])
        self._stats: ColumnStats | None = None
        self._view = False
        self._raw: Matrix | None = self if self.values == "raw" else None
        self._resolve_auto()

    def _read_from(self, raw: Matrix, values: str, rows: str) -> None:
        """Blocks of its own: ``raw``'s blocks with their values read as ``values`` says and, for ``rows="unit"``,
        divided by their rows' norms (:meth:`row_norms` of ``raw``, one pass)."""
        scale = None
        if rows == "unit":
            norms = raw.row_norms(values)
            scale = np.zeros_like(norms)
            np.divide(1.0, norms, out=scale, where=norms > 0)
        self.executor = raw.executor.valued(values, scale)
        self.values, self.rows, self.dtype = values, rows, valued_dtype(raw.dtype)
        self._stats, self._view = None, False

    def row_norms(self, values: str = "raw") -> np.ndarray:
        """The L2 norm of every row of X as this matrix reads it, unstandardized (float64, n_samples), each value
        further read as ``values`` says (:data:`VALUES`; ``"raw"``: as the matrix reads it): one pass, each
        block's partial sums of squares summed by a fixed tree."""
        n = self.shape[0]
        sq = self.map_blocks(row_sq_sums, n, values, reduce="sum")
        return np.sqrt(np.zeros(n) if sq is None else np.asarray(sq, dtype=np.float64))

    def _resolve_auto(self) -> None:
        """``standardize="auto"`` made None where the data are sparse (at most
        :data:`~dufs.engine.graphs.SPARSE_GRAPH_DENSITY` of the entries nonzero), ``"zscore"`` otherwise. On sparse
        counts the z-score gives a feature present in r of n rows values of order sqrt(n / r): the rarest features
        then dominate every distance and projection (docs/methods.md, "Standardization of sparse data")."""
        if self.standardize != "auto":
            return
        from dufs.engine.graphs import SPARSE_GRAPH_DENSITY

        n, d = self.shape
        self.standardize = None if self.nnz <= SPARSE_GRAPH_DENSITY * n * d else "zscore"

    # ------------------------------------------------------------------ description
    def __repr__(self) -> str:
        n, d = self.shape
        read = ("" if self.values == "raw" else f", values={self.values!r}") + \
            ("" if self.rows == "raw" else f", rows={self.rows!r}")
        return (f"<dufs.engine.Matrix {n} x {d}, nnz={self.nnz}, {self.n_blocks} feature blocks, "
                f"standardize={self.standardize!r}{read}, {self.residency['mode']}>")

    @property
    def residency(self) -> dict:
        return self.executor.residency

    @property
    def blocks(self) -> list[BlockInfo]:
        return self.executor.blocks

    @property
    def passes(self) -> int:
        """Passes over the data made so far (by this matrix and its ``with_standardize`` views)."""
        return self.executor.passes

    def count_passes(self, k: int) -> None:
        """Count ``k`` more passes over the data: for a :meth:`map_blocks` function that sweeps its blocks' nonzeros
        more than once in one call (:meth:`map_blocks` counts one)."""
        self.executor.passes += int(k)

    @property
    def n_blocks(self) -> int:
        return len(self.blocks)

    @property
    def nnz(self) -> int:
        if any(b.nnz < 0 for b in self.blocks):
            self.executor.count_nnz()
        return sum(b.nnz for b in self.blocks)

    @property
    def bounds(self) -> np.ndarray:
        """Block boundaries: block i covers features ``bounds[i]:bounds[i+1]``."""
        return self.executor.bounds

    def with_standardize(self, standardize: str | None) -> Matrix:
        """The same blocks (shared, not copied), executor and statistics under another standardization."""
        return Matrix(self, standardize=standardize)

    @property
    def raw_matrix(self) -> Matrix | None:
        """The matrix of these blocks read raw (itself where it reads them so), None where it was built reading
        them otherwise (nothing raw to read again)."""
        return self._raw

    def with_values(self, values: str, rows: str | None = None) -> Matrix:
        """The matrix with its stored values read as ``values`` says (:data:`VALUES`), under the same
        standardization: itself where it reads them so already; else, for another reading than ``"raw"``, blocks of
        its own made from the raw ones where they are, block by block (persisted on the workers that hold the raw
        ones when those are persisted; transformed where they are loaded otherwise), with their own statistics
        and passes. Release it when done: that drops its blocks, not the raw ones. ``rows`` (:data:`ROWS`, default
        as this matrix reads them): ``"unit"`` scales each row to unit norm as well (``Matrix(rows=...)``)."""
        if values == self.values and rows in (None, self.rows):
            return self
        return Matrix(self, standardize=self.standardize, values=values, rows=rows)

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
        self.executor.persist(client, frac)
        return self

    def __enter__(self) -> Matrix:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def release(self) -> None:
        """Drop what the matrix's passes left (:meth:`Executor.release`): persisted blocks and scattered
        transforms on the workers, the block states direct calls kept there, the pooled files in /dev/shm and the
        pooled pass outputs here and on the workers. ``with as_matrix(X) as M:`` releases at the end of the block,
        whatever happens in it. A :meth:`with_standardize` view owns none of these (they are its origin's, which a
        later call may still use: ``dufs.fit`` is given a persisted Matrix and fits a view of it), so releasing a
        view drops nothing."""
        if not self._view:
            self.executor.release()

    def to_scipy(self) -> Any:
        """X (unstandardized; its values as :attr:`values` reads them) as a SciPy ``csc_array``: for small matrices
        and tests (it gathers every block)."""
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
    @inline_when_small
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
        from dufs.engine.stats import block_stats

        f = delayed(block_stats)
        c = ship(codes) if codes is not None else None
        parts = self.executor.run([f(s, n, c, k) for s in self.executor.src], "column statistics")
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

    def nonnegative(self) -> bool:
        """Whether no stored value is negative: from the column statistics where they are made (or the dtype),
        else from one pass that brings back each block's smallest value, not the statistics (48 bytes a feature on
        the driver: 14 GB at 10 times kddb's features)."""
        if np.dtype(self.dtype).kind in "ub" or self.shape[1] == 0:
            return True
        if self._stats is not None:
            return float(np.min(self._stats.min)) >= 0
        mins = self.map_blocks(_smallest)
        return all(m >= 0 for m in mins)

    @property
    def cached_stats(self) -> ColumnStats | None:
        """:attr:`stats` where the pass that makes them has run, else None."""
        return self._stats

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
        # kept with the statistics it came from: every product reads it, and made anew it is half a dozen
        # temporary vectors over the features a pass
        st = self.stats
        cached = self._transform
        if cached is None or cached[0] is not st or cached[1] != self.standardize:
            cached = self._transform = (st, self.standardize, transform_of(st, self.standardize))
        return cached[2]

    def _block_transform(self) -> list[Any]:
        """Per block ``(mu_b, inv_b)`` of the transform (None where it leaves that part out), kept on the workers
        under a distributed client (:meth:`Executor.block_transforms`)."""
        mu, inv = self.transform
        args = [(None if mu is None else mu[b.start:b.stop], None if inv is None else inv[b.start:b.stop])
                for b in self.blocks]
        if mu is None and inv is None:
            return args
        return self.executor.block_transforms(args, (self.standardize, id(self._stats)))

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


def _smallest(b: Any) -> float:
    """A block's smallest stored value (+inf where it stores none)."""
    return float(b.data.min()) if b.data.size else float("inf")


def as_matrix(X: Any, *, standardize: str | None = None, y: Any = None, block_width: int | None = None,
              persist: bool | str = "auto", client: Any = None, values: str | None = None,
              rows: str | None = None) -> Matrix:
    """A :class:`Matrix` from any input.

    Parameters
    ----------
    X : array-like, Dask array, SparseStore, str, path-like or Matrix
        NumPy, SciPy sparse, pydata sparse, a Dask array (dense or sparse chunks; its column chunks become the
        feature blocks, rechunked to ``block_width`` when given, never materialised whole), a
        :class:`~dufs.data.SparseStore`, a store path or URL, or a Matrix (a view of it with ``standardize``).
    standardize : {"zscore", "scale", None}
        The transform applied inside every product.
    y : array-like, optional
        Labels (n_samples); for a store, its labels by default.
    block_width : int, optional
        Features per block for in-memory and Dask input.
    persist : {"auto", True, False}
        ``"auto"`` (or True) persists the blocks on the distributed client (given or active) when they fit
        (:meth:`Matrix.persist`); ``False`` never does.
    client : distributed.Client, optional
        The client to persist on (default: the active one).
    values : {"raw", "presence", "log1p", "sqrt"}, optional
        What the passes read of each stored value (:class:`Matrix`); default: raw, or as a Matrix ``X`` reads them.
    rows : {"raw", "unit"}, optional
        ``"unit"``: every row scaled to unit norm (:class:`Matrix`); default: as stored, or as a Matrix ``X`` reads
        them.

    Returns
    -------
    Matrix
        Release it when done (``with as_matrix(X) as M:``), which drops what its passes left on the workers.
    """
    if isinstance(X, Matrix):
        return Matrix(X, standardize=standardize, values=values, rows=rows)
    M = Matrix(X, standardize=standardize, y=y, block_width=block_width, values=values, rows=rows)
    if persist not in ("auto", True, False):
        raise ParameterError(f"The 'persist' parameter must be 'auto', True or False; got {persist!r}.")
    if persist:
        M.persist(client)
    return M
