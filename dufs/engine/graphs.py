"""Sample graphs: exact k-nearest-neighbour graphs by blocked distance computations.

He, Cai, Niyogi 2005 (Laplacian score) and He et al. 2011, eq. (2): nodes i and j are joined when either is among
the other's k nearest neighbours; weights are 1 ("binary") or the heat kernel exp(-||x_i - x_j||^2 / t). No
self-loops. The graph is a SciPy sparse matrix with at most 2 k n entries: never an n x n dense matrix.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import scipy.sparse as sp

from dufs.errors import ParameterError


def _row_sq_norms(X: Any) -> np.ndarray:
    if sp.issparse(X):
        return np.asarray(X.multiply(X).sum(axis=1), dtype=np.float64).ravel()
    return np.einsum("ij,ij->i", X, X, dtype=np.float64)


def knn_graph(X: Any, n_neighbors: int = 5, *, weights: Literal["binary", "heat"] = "binary",
              t: float | None = None, block_rows: int = 2048) -> sp.csr_array:
    """Symmetric kNN graph of the rows of ``X`` (dense or SciPy sparse), exact, computed in row blocks.

    Parameters
    ----------
    X : (n_samples, n_features) array or sparse matrix
    n_neighbors : int
        k: neighbours of each sample, itself excluded.
    weights : "binary" or "heat"
        1 on every edge, or exp(-d^2 / t).
    t : float, optional
        Heat-kernel width; default the mean squared distance over the kNN edges.
    block_rows : int
        Rows per distance block (memory O(block_rows * n_samples)).

    Returns
    -------
    W : scipy.sparse.csr_array, symmetric, zero diagonal.

    References
    ----------
    He, Cai, Niyogi, "Laplacian Score for Feature Selection", NIPS 2005; He et al., TPAMI 2011, eq. (2).
    """
    n = X.shape[0]
    if not isinstance(n_neighbors, (int, np.integer)) or not 1 <= n_neighbors < max(n, 2):
        raise ParameterError(f"The 'n_neighbors' parameter of knn_graph must be an int in [1, {n - 1}]; "
                             f"got {n_neighbors!r}.")
    if weights not in ("binary", "heat"):
        raise ParameterError(f"The 'weights' parameter of knn_graph must be 'binary' or 'heat'; got {weights!r}.")
    if t is not None and not t > 0:
        raise ParameterError(f"The 't' parameter of knn_graph must be a float > 0; got {t!r}.")
    Xf = sp.csr_array(X, dtype=np.float64) if sp.issparse(X) else np.asarray(X, dtype=np.float64)
    sq = _row_sq_norms(Xf)
    k = int(n_neighbors)
    rows = np.empty(n * k, dtype=np.int64)
    cols = np.empty(n * k, dtype=np.int64)
    dist = np.empty(n * k, dtype=np.float64)
    XT = Xf.T
    for a in range(0, n, block_rows):
        b = min(n, a + block_rows)
        G = Xf[a:b] @ XT
        G = G.toarray() if sp.issparse(G) else np.asarray(G)
        D = sq[a:b, None] + sq[None, :] - 2.0 * G
        np.maximum(D, 0.0, out=D)
        D[np.arange(b - a), np.arange(a, b)] = np.inf  # no self-loops
        # k smallest per row; ties broken by the lower sample index (stable sort on (distance, index))
        part = np.argpartition(D, k - 1, axis=1)[:, :k] if k < n - 1 else np.argsort(D, axis=1)[:, :k]
        pd = np.take_along_axis(D, part, axis=1)
        order = np.lexsort((part, pd), axis=1)
        part = np.take_along_axis(part, order, axis=1)
        pd = np.take_along_axis(pd, order, axis=1)
        rows[a * k:b * k] = np.repeat(np.arange(a, b), k)
        cols[a * k:b * k] = part.ravel()
        dist[a * k:b * k] = pd.ravel()
    if weights == "heat":
        width = float(t) if t is not None else float(dist.mean()) if dist.size and dist.mean() > 0 else 1.0
        w = np.exp(-dist / width)
    else:
        w = np.ones_like(dist)
    A = sp.coo_array((w, (rows, cols)), shape=(n, n)).tocsr()
    W = A.maximum(A.T).tocsr()  # i ~ j if either is among the other's neighbours
    W.setdiag(0)
    W.eliminate_zeros()
    W.sort_indices()
    return sp.csr_array(W)


def laplacian(W: sp.sparray, *, normed: bool = False) -> tuple[sp.csr_array, np.ndarray]:
    """``L = D - W`` (or the normalised ``I - D^-1/2 W D^-1/2``) and the degree vector ``d``."""
    d = np.asarray(W.sum(axis=1), dtype=np.float64).ravel()
    if not normed:
        return sp.csr_array(sp.diags_array(d) - W), d
    inv = np.zeros_like(d)
    nz = d > 0
    inv[nz] = 1.0 / np.sqrt(d[nz])
    Dm = sp.diags_array(inv)
    return sp.csr_array(sp.eye_array(W.shape[0]) - Dm @ W @ Dm), d
