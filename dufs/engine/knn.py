"""The exact kNN graph of the samples, by blocked distance computations on the workers: a few blocks of rows of the
Gram matrix a pass, each summed over the feature blocks and its rows' k nearest picked where it was summed (only
n x k neighbours come back); and the random projection of the rows that the anchor graph embeds them with."""

from __future__ import annotations

import contextvars
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp

from dufs.errors import ParameterError
from dufs.kernels.knn import knn_select
from dufs.kernels.projection import projection_table

#: bytes of one n x block_rows float64 Gram block by default
_GRAM_BYTES = 1 << 28


#: a Gram block's rows of one feature block are made dense when they take at most this many bytes
_GRAM_DENSE_ROWS_BYTES = 1 << 26


def _row_sq_norms(X: Any) -> np.ndarray:
    if sp.issparse(X):
        return np.asarray(X.multiply(X).sum(axis=1), dtype=np.float64).ravel()
    return np.einsum("ij,ij->i", X, X, dtype=np.float64)


def _default_block_rows(n: int) -> int:
    return max(1, _GRAM_BYTES // (8 * max(n, 1)))


def _is_matrix(X: Any) -> bool:
    from dufs.engine.matrix import Matrix

    return isinstance(X, Matrix)


#: what a sample graph reads of each nonzero value (:func:`read_values`)
GRAPH_VALUES = ("raw", "presence", "log1p", "sqrt")


def check_values(values: Any, who: str) -> str:
    if values not in GRAPH_VALUES:
        raise ParameterError(f"The 'values' parameter of {who} must be one of {', '.join(GRAPH_VALUES)}; "
                             f"got {values!r}.")
    return str(values)


def read_values(data: Any, values: str = "raw") -> np.ndarray:
    """The nonzero values ``data`` as a sample graph reads them (float64, a new array unless raw float64 already):
    ``"raw"`` as they are, ``"presence"`` 1 for every stored value, ``"log1p"`` log(1 + x), ``"sqrt"`` the square
    root (these two for non-negative data)."""
    if values == "presence":
        return np.ones(np.shape(data), dtype=np.float64)
    v = np.asarray(data, dtype=np.float64)
    return np.log1p(v) if values == "log1p" else np.sqrt(v) if values == "sqrt" else v


def _valued(X: Any, values: str) -> Any:
    """``X`` (a SciPy sparse matrix or dense array, float64) with its values as :func:`read_values` reads them."""
    if values == "raw":
        return X
    if sp.issparse(X):
        X = X.copy()
        X.data = read_values(X.data, values)
        return X
    return (X != 0).astype(np.float64) if values == "presence" else read_values(X, values)


#: the sample graph built last in this context: {"kind", "metric", "values"} (:func:`graph_built`)
_BUILT: contextvars.ContextVar[dict | None] = contextvars.ContextVar("dufs_graph_built", default=None)


def graph_built() -> contextvars.ContextVar:
    """The context variable that :func:`knn_graph` and :func:`~dufs.engine.anchors.anchor_graph` set to what they
    built (``{"kind": "knn" | "anchor", "metric", "values"}``): ``dufs.fit`` sets it to None before a method runs
    and records what it holds after, in the selection's provenance."""
    return _BUILT


# ---------------------------------------------------------------------------------------------------- per-block work
def _block_y(block: Any, n: int, mu: np.ndarray | None, inv: np.ndarray | None,
             values: str = "raw") -> tuple[Any, np.ndarray | None]:
    """Y = X_f S_f^-1 (csc, float64) and m = S_f^-1 mu_f (None without centring) of one feature block, its values
    read as ``values`` says (:func:`read_values`)."""
    Y = sp.csc_array((read_values(block.data, values), block.indices, block.indptr), shape=(n, block.width))
    if inv is not None:
        Y = sp.csc_array(Y @ sp.diags_array(np.asarray(inv, dtype=np.float64)))
    m = None
    if mu is not None:
        m = np.asarray(mu, dtype=np.float64)
        if inv is not None:
            m = m * inv
    return Y, m


def _sqnorm_block(block: Any, n: int, inv: np.ndarray | None, values: str = "raw") -> np.ndarray:
    """This feature block's part of ||y_i||^2 for every sample i (Y = X_f S_f^-1: distances do not see a centre)."""
    return _row_sq_norms(_block_y(block, n, None, inv, values)[0])


def projection_rows(start: int, stop: int, embed_dim: int, random_state: int = 0) -> np.ndarray:
    """Rows ``start:stop`` of the random projection R (n_features x embed_dim), dense float64.

    Achlioptas' sparse sign projection: entries +-s with probability 0.16667 each and 0 otherwise (zero mean,
    variance 1 / embed_dim, so E[||x R||^2] = ||x||^2), each from a counter-based hash of (``random_state``,
    feature, column) (:mod:`dufs.kernels.projection`): any row range, any set of features, gives the same rows,
    whatever the feature or row blocking.
    """
    start, stop = int(start), int(stop)
    return projection_table(np.arange(start, max(stop, start), dtype=np.int64), int(embed_dim), int(random_state))


def _embed_block(block: Any, n: int, embed_dim: int, random_state: int, mu: np.ndarray | None,
                 inv: np.ndarray | None, values: str = "raw") -> np.ndarray:
    """This feature block's n x embed_dim part of E = Z R (R's rows for the block generated here): one sparse-dense
    product (a product per 4096-feature chunk made an n x embed_dim temporary each: minutes on a 2M-row store)."""
    Y, m = _block_y(block, n, mu, inv, values)
    R = projection_rows(block.start, block.stop, embed_dim, random_state)
    E = np.asarray(Y @ R, dtype=np.float64)
    if m is not None:
        E -= (m @ R)[None, :]
    return E


# ---------------------------------------------------------------------------------------------------- kNN
def _gram_span(block: Any, span: tuple[int, int], n: int, inv: np.ndarray | None, values: str = "raw") -> np.ndarray:
    """This feature block's n x rows partial of Y Y[a:b]^T, span = (a, b) (a :meth:`~dufs.engine.Matrix.map_sums`
    key; Y = X_f S_f^-1)."""
    return _gram_of_rows(sp.csr_array(_block_y(block, n, None, inv, values)[0]), span[0], span[1])


def _knn_span(G: np.ndarray, span: tuple[int, int], sq: np.ndarray, k: int,
              inv_norm: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest samples of the rows ``span`` from their summed Gram block G (n x rows; None: no features, all
    zero), where it was summed; with ``inv_norm`` (cosine) the rows' Gram entries scaled to cosines first."""
    sq = np.asarray(sq, dtype=np.float64)
    G = np.zeros((sq.shape[0], span[1] - span[0])) if G is None else np.ascontiguousarray(G, dtype=np.float64)
    if inv_norm is not None:
        _to_cosines(G, inv_norm, span[0])
    return knn_select(G, sq, span[0], k)


def _to_cosines(G: np.ndarray, inv_norm: np.ndarray, a: int) -> None:
    """G[:, j] (rows' inner products with row a + j) scaled in place to cosines."""
    G *= inv_norm[:, None]
    G *= inv_norm[None, a:a + G.shape[1]]


def _cosine_norms(sq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(1 / ||y_i|| (0 for an empty row), the squared norms of the normalised rows: 1, or 0 for an empty row)."""
    nz = sq > 0
    inv = np.zeros_like(sq)
    inv[nz] = 1.0 / np.sqrt(sq[nz])
    return inv, nz.astype(np.float64)


def _gram_of_rows(X: Any, a: int, b: int) -> np.ndarray:
    """X X[a:b]^T (n x (b - a), dense float64, C order) of X, CSR float64 or dense."""
    if not sp.issparse(X):
        return np.ascontiguousarray(X @ X[a:b].T)
    if not X.nnz:
        return np.zeros((X.shape[0], b - a))
    if (b - a) * X.shape[1] * 8 <= _GRAM_DENSE_ROWS_BYTES:
        # the row block dense (bounded by block_rows x the width): a sparse x dense product makes the n x (b - a)
        # block directly, where sparse x sparse built a nearly dense sparse result first (the same numbers); by rows
        # (CSR), each output row made once, where by columns (CSC) every nonzero added into a scattered row
        # (docs/measurements.md, "Exact kNN graphs")
        return np.ascontiguousarray(X @ X[a:b].toarray().T)
    return np.ascontiguousarray((X @ X[a:b].T).toarray())


def _k_smallest(D: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Column indices and values of the k smallest entries per row, ties broken by the lower column index."""
    m = D.shape[1]
    part = np.argpartition(D, k - 1, axis=1)[:, :k] if k < m else np.argsort(D, axis=1, kind="stable")[:, :k]
    pd = np.take_along_axis(D, part, axis=1)
    if k < m:
        # rows whose k-th value is tied with entries left out: redo them with a stable full sort (lowest index wins)
        kth = pd.max(axis=1)
        tied = np.flatnonzero((D <= kth[:, None]).sum(axis=1) > k)
        if tied.size:
            # what a stable full sort's first k are, without sorting: every entry below the k-th value, then the
            # lowest-indexed entries equal to it (one-hot data tie at nearly every row, and a stable sort of every
            # row is slow: docs/measurements.md, "Exact kNN graphs")
            Dt = D[tied]
            kt = kth[tied, None]
            lt, eq = Dt < kt, Dt == kt
            need = k - lt.sum(axis=1)
            take = lt | (eq & (np.cumsum(eq, axis=1, dtype=np.int32) <= need[:, None]))
            cols = np.nonzero(take)[1].reshape(tied.size, k)  # row by row, k a row, in column order
            part[tied] = cols
            pd[tied] = np.take_along_axis(Dt, cols, axis=1)
    order = np.lexsort((part, pd), axis=1)
    return np.take_along_axis(part, order, axis=1), np.take_along_axis(pd, order, axis=1)


def check_metric(metric: Any, who: str) -> str:
    if metric not in ("euclidean", "cosine"):
        raise ParameterError(f"The 'metric' parameter of {who} must be 'euclidean' or 'cosine'; got {metric!r}.")
    return str(metric)


def _check_knn(n: int, n_neighbors: Any, weights: Any, t: Any, block_rows: Any) -> None:
    if not isinstance(n_neighbors, int | np.integer) or not 1 <= n_neighbors < max(n, 2):
        raise ParameterError(f"The 'n_neighbors' parameter of knn_graph must be an int in [1, {n - 1}]; "
                             f"got {n_neighbors!r}.")
    if weights not in ("binary", "heat"):
        raise ParameterError(f"The 'weights' parameter of knn_graph must be 'binary' or 'heat'; got {weights!r}.")
    if t is not None and not t > 0:
        raise ParameterError(f"The 't' parameter of knn_graph must be a float > 0; got {t!r}.")
    if block_rows is not None and (not isinstance(block_rows, int | np.integer) or block_rows < 1):
        raise ParameterError(f"The 'block_rows' parameter of knn_graph must be an int >= 1; got {block_rows!r}.")


def knn_graph(X: Any, n_neighbors: int = 5, *, weights: Literal["binary", "heat"] = "binary",
              t: float | None = None, block_rows: int | None = None,
              metric: Literal["euclidean", "cosine"] = "euclidean",
              values: Literal["raw", "presence", "log1p", "sqrt"] = "raw") -> sp.csr_array:
    """Symmetric kNN graph of the rows of ``X``, exact, computed in row blocks.

    Parameters
    ----------
    X : (n_samples, n_features) array, SciPy sparse matrix or :class:`~dufs.engine.Matrix`
        For a Matrix, the rows of its transformed matrix Z (its ``standardize``), with the Gram blocks computed
        on the workers (two row blocks a worker a pass, plus one pass for the row norms; see the module docstring).
    n_neighbors : int
        k: neighbours of each sample, itself excluded.
    weights : "binary" or "heat"
        1 on every edge, or exp(-d^2 / t).
    t : float, optional
        Heat-kernel width; default the mean squared distance over the kNN edges.
    block_rows : int, optional
        Rows per distance block (memory O(block_rows * n_samples)); default so that one n_samples x block_rows
        float64 block is about 256 MiB.
    metric : "euclidean" or "cosine"
        Distances between the rows, or between the rows scaled to unit norm (d^2 = 2 - 2 cos; an empty row is at
        d^2 = 1 from every other row): the same Gram blocks, each entry divided by the two rows' norms.
    values : "raw", "presence", "log1p" or "sqrt"
        What the distances read of each nonzero value before the scaling (:func:`read_values`): the value, 1,
        log(1 + value) or its square root; an implicit zero stays zero.

    Returns
    -------
    W : scipy.sparse.csr_array, symmetric, zero diagonal. Among equally distant candidates the lower sample
    index is taken.

    References
    ----------
    He, Cai, Niyogi, "Laplacian Score for Feature Selection", NIPS 2005; He et al., TPAMI 2011, eq. (2).
    """
    n = X.shape[0]
    _check_knn(n, n_neighbors, weights, t, block_rows)
    cosine = check_metric(metric, "knn_graph") == "cosine"
    values = check_values(values, "knn_graph")
    k = int(n_neighbors)
    br = int(block_rows) if block_rows is not None else _default_block_rows(n)
    spans = [(a, min(n, a + br)) for a in range(0, n, br)]
    rows = np.empty(n * k, dtype=np.int64)
    cols = np.empty(n * k, dtype=np.int64)
    dist = np.empty(n * k, dtype=np.float64)

    def put(span: tuple[int, int], got: tuple[np.ndarray, np.ndarray]) -> None:
        a, b = span
        rows[a * k:b * k] = np.repeat(np.arange(a, b), k)
        cols[a * k:b * k] = got[0].ravel()
        dist[a * k:b * k] = got[1].ravel()

    if _is_matrix(X):
        from dufs.engine.blocks import PerBlock
        from dufs.engine.dispatch import current_client

        # distances do not change with a centre: rows scaled only (the centring of each Gram block took three
        # sweeps of it, for the same numbers up to rounding: docs/measurements.md, "Exact kNN graphs")
        inv = X.transform.inv_scale
        pi = None if inv is None else PerBlock(inv)
        sq = X.map_blocks(_sqnorm_block, n, pi, values, reduce="sum")
        sq = np.zeros(n) if sq is None else np.asarray(sq, dtype=np.float64)
        inv_norm, sq = _cosine_norms(sq) if cosine else (None, sq)
        # a few row blocks a pass, their Gram blocks summed and their neighbours picked on the workers: only the
        # neighbours come back (a Gram block is 256 MiB), and every worker has a block to work on
        client = current_client()
        wave = 2 * max(1, len(client.scheduler_info(n_workers=-1).get("workers", {})) if client is not None else 1)
        for w0 in range(0, len(spans), wave):
            part = spans[w0:w0 + wave]
            for span, got in zip(part, X.map_sums(_gram_span, part, n, pi, values, then=_knn_span,
                                                  then_args=(sq, k, inv_norm)), strict=True):
                put(span, got)
    else:
        Xf = sp.csr_array(X, dtype=np.float64) if sp.issparse(X) else np.asarray(X, dtype=np.float64)
        Xf = _valued(Xf, values)
        sq = _row_sq_norms(Xf)
        inv_norm, sq = _cosine_norms(sq) if cosine else (None, sq)
        for a, b in spans:
            G = _gram_of_rows(Xf, a, b)
            if cosine:
                _to_cosines(G, inv_norm, a)
            put((a, b), knn_select(G, sq, a, k))
    if weights == "heat":
        width = float(t) if t is not None else float(dist.mean()) if dist.size and dist.mean() > 0 else 1.0
        w = np.exp(-dist / width)
    else:
        w = np.ones_like(dist)
    _BUILT.set({"kind": "knn", "metric": metric, "values": values})
    A = sp.coo_array((w, (rows, cols)), shape=(n, n)).tocsr()
    W = A.maximum(A.T).tocsr()  # i ~ j if either is among the other's neighbours
    W.setdiag(0)
    W.eliminate_zeros()
    W.sort_indices()
    return sp.csr_array(W)
