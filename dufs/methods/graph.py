"""The sample graph a method asks for: the one given, the exact kNN graph or the anchor graph (by size), and a
key that names it in a checkpoint's problem."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from dufs.engine import AnchorGraph, Matrix, anchor_graph, graph_metric, graph_rows, knn_graph, resolve_graph
from dufs.errors import ParameterError


# ---------------------------------------------------------------------------------------------------- graphs
def sample_graph(M: Matrix, W: Any = None, *, graph: str = "auto", n_neighbors: int = 4, weights: str = "binary",
                 t: float | None = None, n_anchors: int = 256, anchor_neighbors: int = 3, embed_dim: int = 64,
                 random_state: int = 0) -> Any:
    """``W`` as given (a sparse n x n affinity or an AnchorGraph), else the exact kNN graph of the rows of M
    (``graph="knn"``) or its anchor graph (``graph="anchor"``: a low-rank-plus-diagonal Laplacian for large
    n_samples; of the unstandardized rows when M is sparse, :func:`~dufs.engine.graphs.graph_rows`); ``"auto"``:
    kNN up to :data:`~dufs.engine.graphs.KNN_MAX_SAMPLES` samples, the anchor graph above. Either by the metric
    of :func:`~dufs.engine.graphs.graph_metric` (cosine for sparse unstandardized rows)."""
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
                            keep_embedding=False, metric=graph_metric(rows))  # E unused: n x embed_dim floats
    return knn_graph(M, n_neighbors, weights=weights, t=t, metric=graph_metric(M))


def graph_key(W: Any) -> list:
    if isinstance(W, AnchorGraph):  # Zh's rows each sum to 1: its size, anchors and their weights name it
        return ["anchor", int(W.shape[0]), int(W.n_anchors), float(np.sum(W.lam)), float(np.sum(W.anchors))]
    return ["sparse", int(W.nnz), float(W.data.sum())]
