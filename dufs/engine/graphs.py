"""Sample graphs: exact k-nearest-neighbour graphs by blocked distance computations, and anchor graphs.

**Exact kNN** (He, Cai, Niyogi 2005, the Laplacian score; He et al. 2011, eq. (2)): nodes i and j are joined when
either is among the other's k nearest neighbours; weights are 1 ("binary") or the heat kernel
exp(-||x_i - x_j||^2 / t). No self-loops. The graph is a SciPy sparse matrix with at most 2 k n entries, never an
n x n dense matrix. :func:`knn_graph` takes an in-memory array or a :class:`~dufs.engine.Matrix`; for a Matrix the
distances are computed on the workers without gathering the data: a few row blocks a:b a pass
(:meth:`~dufs.engine.Matrix.map_sums`, two a worker), each block's partial Gram ``G[:, a:b] = Z Z[a:b]^T`` (each
feature block adds its own n x r dense partial, summed on the workers by the fixed tree), then its rows' k nearest
picked where it was summed (:func:`dufs.kernels.knn.knn_select`, one sweep of the block keeping a sorted k-list a
row): only n x k neighbours come back. Distances do not see a centre, so the Matrix's implicit standardization
enters as its scaling alone (Y = X_f S_f^-1 for a feature block f), and the squared row norms ``||y_i||^2`` come
from one more pass. A worker holds one n x block_rows Gram block a row block in flight (about 256 MiB by default);
the driver, the n x k neighbours.

**Anchor graph** (Liu, He, Chang, "Large Graph Construction for Scalable Semi-Supervised Learning", ICML 2010),
for large n_samples: samples are embedded by a random projection E = Z R (n x embed_dim; one pass, each feature
block generating its own rows of R from ``(random_state, feature index)``, so no process ever holds an
n_features x embed_dim matrix, see :func:`projection_rows`), anchors are k-means centres of E, and each sample is
linked to its s nearest anchors with kernel weights summing to 1, giving the sparse n x m matrix Zh. Then
W = Zh Lambda^-1 Zh^T with Lambda = diag(Zh^T 1): the Laplacian is a low-rank-plus-diagonal operator
(:meth:`AnchorGraph.laplacian`), never an n x n matrix.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator

from dufs.engine.anchors import AnchorGraph, anchor_graph
from dufs.engine.knn import _is_matrix, knn_graph, projection_rows
from dufs.engine.laplacian import _laplacian_op, laplacian
from dufs.errors import ParameterError

__all__ = ["KNN_MAX_SAMPLES", "SPARSE_GRAPH_DENSITY", "SPARSE_GRAPH_VALUES", "AnchorGraph", "anchor_graph",
           "graph_metric", "graph_rows", "graph_values", "knn_graph",
           "laplacian", "laplacian_operator", "projection_rows", "resolve_graph", "sparse_counts"]


#: ``graph="auto"`` builds the exact kNN graph up to this many samples and the anchor graph above (exact kNN costs
#: a pass over the data per n_samples x 256 MiB Gram block: 75 passes at 50,000 samples, 11 million at kddb's
#: 19 million)
KNN_MAX_SAMPLES = 50_000


#: data with at most this fraction of nonzeros count as sparse for :func:`graph_rows`
SPARSE_GRAPH_DENSITY = 0.1


def graph_rows(M: Any) -> Any:
    """The rows an anchor graph is built on: ``M`` itself, or, when M is sparse (at most
    :data:`SPARSE_GRAPH_DENSITY` of its entries nonzero) and standardized, the same blocks unstandardized.

    Standardizing a sparse column divides it by its standard deviation, so a feature present in r of n rows takes
    values of order sqrt(n / r) there. The anchor graph's random projection sums every feature of a row with equal
    weight, so the rarest features decide every embedded distance and the graph loses the samples' structure.
    M3FS and JCFS build their exact kNN graph on these rows too; LapAOFS's and LapDOFS's keep the method's
    standardization (the figures: docs/measurements.md, "Graphs of sparse rows"). Dense data keep the method's
    standardization, as in the papers' experiments. Passes made through the view count on ``M`` (the blocks are
    shared)."""
    if not _is_matrix(M) or M.standardize is None:
        return M
    n, d = M.shape
    if M.nnz > SPARSE_GRAPH_DENSITY * n * d:
        return M
    return M.with_standardize(None)


def graph_metric(M: Any) -> str:
    """The metric of a sample graph of the rows ``M`` by default: ``"cosine"`` for sparse rows taken as they are
    (unstandardized, as :func:`graph_rows` gives them: counts, term frequencies), ``"euclidean"`` otherwise;
    ``dufs.graph.metric`` (``auto``, ``euclidean``, ``cosine``) overrides it. On sparse counts a row's length
    (a document's) and its few frequent features decide Euclidean distances, so the neighbours of a row are the
    rows of similar length; scaled to unit norm, the rows' shared features do (docs/methods.md, "Graphs of sparse
    rows")."""
    from dufs import config

    setting = str(config.get("graph.metric")).lower()
    if setting in ("euclidean", "cosine"):
        return setting
    if setting != "auto":
        raise ParameterError(f"dufs.graph.metric must be 'auto', 'euclidean' or 'cosine'; got {setting!r}")
    if not _is_matrix(M) or M.standardize is not None:
        return "euclidean"
    n, d = M.shape
    return "cosine" if M.nnz <= SPARSE_GRAPH_DENSITY * n * d else "euclidean"


#: what the sample graphs of sparse non-negative rows taken unstandardized read of each value by default
SPARSE_GRAPH_VALUES = "presence"


def graph_values(M: Any) -> str:
    """What a sample graph of the rows ``M`` reads of each nonzero value by default
    (:func:`dufs.engine.knn.read_values`): :data:`SPARSE_GRAPH_VALUES` for the rows :func:`graph_metric` makes
    cosine (sparse, unstandardized) when they are non-negative (counts, frequencies), ``"raw"`` otherwise;
    ``dufs.graph.values`` (``auto``, ``raw``, ``presence``, ``log1p``, ``sqrt``) overrides it for unstandardized
    rows. A few large counts of a row decide its direction even at unit norm, so rows that share many features
    but differ in their largest counts are far apart; read with their tail cut, the shared features decide
    (docs/methods.md, "The graph's values")."""
    from dufs import config

    setting = str(config.get("graph.values")).lower()
    if setting not in ("auto", "raw", "presence", "log1p", "sqrt"):
        raise ParameterError(f"dufs.graph.values must be 'auto', 'raw', 'presence', 'log1p' or 'sqrt'; got "
                             f"{setting!r}")
    if not _is_matrix(M) or M.standardize is not None:
        return "raw"
    if setting != "auto":
        return setting
    n, d = M.shape
    if M.nnz > SPARSE_GRAPH_DENSITY * n * d:
        return "raw"
    return SPARSE_GRAPH_VALUES if M.nonnegative() else "raw"


def sparse_counts(M: Any) -> bool:
    """Whether the Matrix ``M`` is read as sparse non-negative data (counts, frequencies, presences): at most
    :data:`SPARSE_GRAPH_DENSITY` of its entries nonzero, unstandardized, no negative value
    (:meth:`Matrix.nonnegative`: one pass where the statistics are not made yet, none for an unsigned or boolean type
    or for dense data). What the methods' ``values="auto"`` reads differently (UFCM: docs/methods.md, "What UFCM
    reads")."""
    if not _is_matrix(M) or M.standardize is not None:
        return False
    n, d = M.shape
    if M.nnz > SPARSE_GRAPH_DENSITY * n * d:
        return False
    return M.nonnegative()


def resolve_graph(graph: str, n_samples: int, who: str = "graph") -> str:
    """"knn" or "anchor" for a ``graph`` parameter ("auto": kNN up to :data:`KNN_MAX_SAMPLES` samples)."""
    if graph == "auto":
        return "knn" if n_samples <= KNN_MAX_SAMPLES else "anchor"
    if graph not in ("knn", "anchor"):
        raise ParameterError(f"The 'graph' parameter of {who} must be 'auto', 'knn' or 'anchor'; got {graph!r}.")
    return graph


def laplacian_operator(W: Any, *, normed: bool = False) -> LinearOperator:
    """The Laplacian of a sparse graph ``W`` (e.g. :func:`knn_graph`) as a SciPy ``LinearOperator``: ``D - W``, or
    ``I - D^-1/2 W D^-1/2`` when ``normed``; the same interface as :meth:`AnchorGraph.laplacian`."""
    if isinstance(W, AnchorGraph):
        return W.laplacian(normed=normed)
    W = sp.csr_array(W, dtype=np.float64)
    n = W.shape[0]
    if W.shape != (n, n):
        raise ParameterError(f"W must be square; got {W.shape}")
    d = np.asarray(W.sum(axis=1), dtype=np.float64).ravel()
    return _laplacian_op(n, lambda V: np.asarray(W @ V), d, normed)
