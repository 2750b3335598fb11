"""The sample graph a method asks for: the one given, the exact kNN graph or the anchor graph (by size), and a
key that names it in a checkpoint's problem."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from dufs.engine import (
    AnchorGraph,
    Matrix,
    anchor_graph,
    graph_built,
    graph_metric,
    graph_rows,
    graph_values,
    knn_graph,
    resolve_graph,
)
from dufs.errors import ParameterError


# ---------------------------------------------------------------------------------------------------- graphs
def sample_graph(M: Matrix, W: Any = None, *, graph: str = "auto", n_neighbors: int = 4, weights: str = "binary",
                 t: float | None = None, n_anchors: int = 256, anchor_neighbors: int = 3, embed_dim: int = 64,
                 random_state: int = 0) -> Any:
    """``W`` as given (a sparse n x n affinity or an AnchorGraph), else the exact kNN graph of the rows of M
    (``graph="knn"``) or its anchor graph (``graph="anchor"``: a low-rank-plus-diagonal Laplacian for large
    n_samples; of the unstandardized rows when M is sparse, :func:`~dufs.engine.graphs.graph_rows`); ``"auto"``:
    kNN up to :data:`~dufs.engine.graphs.KNN_MAX_SAMPLES` samples, the anchor graph above. Either by the metric
    of :func:`~dufs.engine.graphs.graph_metric` (cosine for sparse unstandardized rows) and the values of
    :func:`~dufs.engine.graphs.graph_values`."""
    n = M.shape[0]
    if W is not None:
        if not isinstance(W, AnchorGraph):
            W = sp.csr_array(W, dtype=np.float64)
        if W.shape != (n, n):
            raise ParameterError(f"W must be {n} x {n}; got {W.shape}")
        return W
    if resolve_graph(graph, n) == "anchor":  # sparse data: on the unstandardized rows (see graph_rows)
        rows = graph_rows(M)
        return anchor_graph(rows, n_anchors, anchor_neighbors, embed_dim=embed_dim, random_state=random_state,
                            keep_embedding=False, metric=graph_metric(rows), values=graph_values(rows))  # E unused
    return knn_graph(M, n_neighbors, weights=weights, t=t, metric=graph_metric(M), values=graph_values(M))


def graph_key(W: Any) -> list:
    if isinstance(W, AnchorGraph):  # Zh's rows each sum to 1: its size, anchors and their weights name it
        return ["anchor", int(W.shape[0]), int(W.n_anchors), float(np.sum(W.lam)), float(np.sum(W.anchors))]
    return ["sparse", int(W.nnz), float(W.data.sum())]


# ---------------------------------------------------------------------------------------------------- cluster count
#: n_clusters="auto": the largest count considered, the rows sampled for the estimate and the sample graph's size
AUTO_MAX_CLUSTERS, AUTO_SAMPLE, AUTO_NEIGHBORS = 20, 5000, 5


def _take(X: Any, start: int, rate: float, seed: int) -> Any:
    keep = np.random.default_rng([seed, start]).random(X.shape[0]) < rate
    return X[np.flatnonzero(keep)]


def _sample_rows(M: Matrix, sample: int, seed: int) -> Any:
    """The rows of ``M`` here (its scaling applied, no centring: distances do not see one), all of them up to
    ``sample`` rows, else a uniform sample of about that many, taken by its row blocks; where its rows cannot be read
    by blocks (a persisted Dask array's feature blocks), ``M`` itself up to ``sample`` rows, else None."""
    from dufs.engine import Rows

    n = M.shape[0]
    try:
        rows = Rows.of(M)
    except ParameterError:
        return M if n <= sample else None
    rate = min(1.0, sample / n)
    X = sp.csr_array(rows.map(_take, args=(rate, seed), n_rows=int(rate * n)).gather("the cluster-count sample"))
    _, inv = M.transform
    return X if inv is None else sp.csr_array(X @ sp.diags_array(np.asarray(inv, dtype=np.float64)))


def estimate_clusters(M: Matrix, *, max_clusters: int = AUTO_MAX_CLUSTERS, sample: int = AUTO_SAMPLE,
                      n_neighbors: int = AUTO_NEIGHBORS, random_state: int = 0) -> tuple[int, dict]:
    """The number of clusters of the rows of ``M`` by the eigengap of the normalised Laplacian of their binary kNN
    graph (``n_neighbors``, the metric of :func:`~dufs.engine.graphs.graph_metric`): the c in [2, ``max_clusters``]
    (and at most n_samples / 10) after which the ascending eigenvalues jump most. The graph is made here, of all
    the rows up to ``sample`` of them, else of a uniform sample of about that many (an anchor graph's spectrum
    showed no such gap on data whose exact kNN graph had it at the planted count: docs/methods.md, "The number of
    clusters"). Returns (c, what it rests on)."""
    from scipy.sparse.linalg import eigsh

    rows = graph_rows(M)
    X = _sample_rows(rows, int(sample), int(random_state))
    if X is None:
        raise ParameterError("n_clusters='auto' needs rows it can sample (a store or an in-memory matrix); give "
                             "n_clusters")
    ns = X.shape[0]
    if ns < 4:
        return 2, {"method": "too few samples", "samples": int(ns)}
    k = max(1, min(int(n_neighbors), ns - 1))
    values = graph_values(rows)
    built = graph_built()
    token = built.set(built.get())  # the sample's graph is not the method's: what it records is restored after
    try:
        W = knn_graph(X, k, metric=graph_metric(rows), values=values, block_rows=512)  # ns x 512 blocks (20 MB)
    finally:
        built.reset(token)
    deg = np.asarray(W.sum(axis=1), dtype=np.float64).ravel()
    s = 1.0 / np.sqrt(np.maximum(deg, 1e-300))
    A = sp.diags_array(s) @ W @ sp.diags_array(s)  # I - L: its largest eigenvalues are L's smallest
    top = max(2, min(int(max_clusters), ns // 10))  # clusters of 10 samples on average at least
    m = min(top + 1, ns - 1)
    if ns <= 2000:
        vals = np.linalg.eigvalsh(A.toarray())[::-1][:m]
    else:
        v0 = np.random.default_rng(random_state).standard_normal(ns)
        vals = np.sort(eigsh(A, k=m, which="LA", v0=v0, return_eigenvectors=False))[::-1]
    lam = np.sort(1.0 - vals)
    gaps = np.diff(lam)  # gaps[i] = lam[i + 1] - lam[i]: c clusters leave the gap after lam[c - 1]
    c = int(np.argmax(gaps[1:]) + 2) if gaps.size > 1 else 2
    return c, {"method": "eigengap", "samples": int(ns), "n_neighbors": k, "metric": graph_metric(rows),
               "values": values, "eigenvalues": [float(v) for v in lam],
               "gap": float(gaps[c - 1]) if gaps.size >= c else None}


def resolve_clusters(M: Matrix, n_clusters: Any, random_state: int = 0) -> tuple[Any, dict | None]:
    """``n_clusters`` as given, or for ``"auto"`` :func:`estimate_clusters`' count and its record."""
    if isinstance(n_clusters, str) and n_clusters == "auto":
        return estimate_clusters(M, random_state=random_state)
    return n_clusters, None
