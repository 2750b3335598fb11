"""Filter methods: variance, correlation with the labels (|Pearson|, or the correlation ratio on classes),
Fisher score, Laplacian score.

Each is one or two passes over the feature blocks and returns one score per feature (a plain array); choosing the
top k is left to the caller (scikit-learn's habit: score apart from select).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from dufs.engine import (
    AnchorGraph,
    Matrix,
    anchor_graph,
    block_stats,
    graph_metric,
    graph_rows,
    graph_values,
    knn_graph,
    resolve_graph,
)
from dufs.errors import ParameterError
from dufs.kernels.blockops import csc_rmatvec
from dufs.methods.labels import class_labels, labels_of, target_type
from dufs.methods.params import GRAPH_PARAMS, Param, integer, table

#: the parameters of the filters (``dufs.fit`` and the estimators derive theirs from these tables)
VARIANCE_PARAMS: dict[str, Param] = {}
CORRELATION_PARAMS: dict[str, Param] = {}
FISHER_PARAMS: dict[str, Param] = {}
LAPLACIAN_PARAMS = table(GRAPH_PARAMS.values(), Param("n_neighbors", 5, (integer(1),), "k of the kNN graph"))


#: a filter's result: every feature's score and, when asked for, the best ``k`` features best first
Ranked = tuple[np.ndarray, np.ndarray | None]


def variance_scores(M: Matrix) -> np.ndarray:
    """Population variance of every raw feature (the transform is ignored: z-scored features all have variance 1).

    Larger is better.
    """
    return variance_ranked(M)[0]


def variance_ranked(M: Matrix, k: int | None = None) -> Ranked:
    """:func:`variance_scores` and the ``k`` best features, in one pass: each block scores its own features where
    it lives, so the driver holds the scores and one block's result at a time."""
    return M.with_standardize(None).block_scores(_variance_block, M.shape[0], k=k)


def _variance_block(b: Any, n: int) -> np.ndarray:
    return block_stats(b, n, None, 0).var()


def correlation_scores(M: Matrix, y: Any = None) -> np.ndarray:
    """Relevance of every feature to the labels, larger is better, 0 for a constant feature:

    - a binary or continuous target (``dufs.methods.labels.target_type``): |Pearson correlation|, from one
      product cov_j = (X^T (y - ybar))_j / n, centred implicitly, and the column statistics;
    - classes (more than two, whole numbers or strings): the correlation ratio
      eta_j = sqrt(sum_c n_c (mu_cj - mu_j)^2 / sum_s (x_sj - mu_j)^2) from one pass of per-class sums, which does
      not depend on how the classes are numbered (it equals |Pearson| on two classes).
    """
    return correlation_ranked(M, y)[0]


def correlation_ranked(M: Matrix, y: Any = None, k: int | None = None) -> Ranked:
    """:func:`correlation_scores` and the ``k`` best features, in one pass over the blocks."""
    y = labels_of(M, y, "correlation")
    raw = M.with_standardize(None)
    n = M.shape[0]
    if target_type(y) == "multiclass":
        codes, counts = _codes_and_counts(y, "correlation")
        return raw.block_scores(_ratio_block, n, codes, counts, k=k)
    yc = y - y.mean()
    sy = float(np.sqrt((yc @ yc) / n))
    return raw.block_scores(_correlation_block, n, yc, sy, k=k)


def _correlation_block(b: Any, n: int, yc: np.ndarray, sy: float) -> np.ndarray:
    cov = np.empty((b.width, 1))
    csc_rmatvec(b.indptr, b.indices, b.data, yc[:, None], cov)
    cov = cov[:, 0] / n
    sx = block_stats(b, n, None, 0).std()
    out = np.zeros(b.width)
    ok = (sx > 0) & (sy > 0)
    out[ok] = np.abs(cov[ok]) / (sx[ok] * sy)
    return out


def _codes_and_counts(y: np.ndarray, method: str) -> tuple[np.ndarray, np.ndarray]:
    """Each sample's class index (int64, contiguous) and every class's size (float64), for per-block statistics."""
    classes, codes = class_labels(y, method)
    counts = np.bincount(codes, minlength=classes.shape[0]).astype(np.float64)
    return np.ascontiguousarray(codes, dtype=np.int64), counts


def _class_block_stats(b: Any, n: int, codes: np.ndarray, counts: np.ndarray) -> Any:
    """A block's column statistics with its per-class sums (``codes``: each sample's class, ``counts``: every
    class's size)."""
    st = block_stats(b, n, codes, counts.shape[0])
    st.class_count = counts
    return st


def _ratio_block(b: Any, n: int, codes: np.ndarray, counts: np.ndarray) -> np.ndarray:
    st = _class_block_stats(b, n, codes, counts)
    cnt = counts[:, None]
    dev = st.class_sum / cnt - st.mean()[None, :]
    between = np.sort(cnt * dev * dev, axis=0).sum(axis=0)
    total = np.maximum(np.asarray(st.m2, dtype=np.float64), 0.0)
    out = np.zeros(b.width)
    ok = (total > 0) & (st.min != st.max)
    out[ok] = np.sqrt(np.minimum(np.maximum(between[ok], 0.0) / total[ok], 1.0))
    return out


def fisher_scores(M: Matrix, y: Any = None) -> np.ndarray:
    """Fisher score S_b / S_w per feature, S_b = sum_c n_c (mu_c - mu)^2, S_w = sum_c n_c sigma_c^2.

    Larger is better; 0 for a constant feature, +inf for a feature constant within every class but not overall.
    Equals scikit-feature's ``fisher_score`` (docs/methods.md, "Fisher score"). ``y`` must be classes (numbers,
    strings, booleans; a continuous target is an error); the per-class terms are summed in sorted order, so
    renumbering the classes gives bit-for-bit the same scores.
    """
    return fisher_ranked(M, y)[0]


def fisher_ranked(M: Matrix, y: Any = None, k: int | None = None) -> Ranked:
    """:func:`fisher_scores` and the ``k`` best features, in one pass over the blocks."""
    y = labels_of(M, y, "fisher")
    codes, counts = _codes_and_counts(y, "fisher")
    return M.with_standardize(None).block_scores(_fisher_block, M.shape[0], codes, counts, k=k)


def _fisher_block(b: Any, n: int, codes: np.ndarray, counts: np.ndarray) -> np.ndarray:
    return fisher_from_stats(_class_block_stats(b, n, codes, counts), counts, b.width)


def fisher_from_stats(st: Any, counts: np.ndarray, width: int) -> np.ndarray:
    """Fisher scores from column statistics with per-class sums (of one block, or of a whole matrix)."""
    cnt = counts[:, None]
    mu_c = st.class_sum / cnt
    var_c = np.maximum(st.class_sumsq / cnt - mu_c ** 2, 0.0)
    mu = st.mean()
    sb = np.sort(cnt * (mu_c - mu[None, :]) ** 2, axis=0).sum(axis=0)
    sw = np.sort(cnt * var_c, axis=0).sum(axis=0)
    out = np.zeros(width)
    pos = sw > 1e-12 * np.maximum(sb, 1.0)
    out[pos] = sb[pos] / sw[pos]
    out[~pos & (sb > 0)] = np.inf
    return out


def laplacian_scores(M: Matrix, W: Any = None, **graph: Any) -> np.ndarray:
    """Laplacian scores of every feature (smaller is better); see :func:`laplacian_ranked`."""
    return laplacian_ranked(M, W, **graph)[0]


def laplacian_ranked(M: Matrix, W: Any = None, *, n_neighbors: int = 5, weights: str = "binary",
                     t: float | None = None, X_rows: Any = None, graph: str = "auto", n_anchors: int = 256,
                     anchor_neighbors: int = 3, embed_dim: int = 64, random_state: int = 0,
                     k: int | None = None) -> Ranked:
    """Laplacian score L_r = f~^T L f~ / f~^T D f~ of every feature, f~ = f - (f^T D 1 / 1^T D 1) 1.

    Smaller is better; a constant feature scores +inf. ``W`` is the sample graph: a sparse n x n matrix or an
    :class:`~dufs.engine.graphs.AnchorGraph`. With ``graph="knn"`` it is the exact kNN graph with
    ``n_neighbors`` (``weights``, ``t``; He et al. eq. (2), no self-loops) of the rows of ``X_rows`` or, without it,
    of the matrix's own (transformed) rows, computed on the workers (:func:`~dufs.engine.graphs.knn_graph`).
    ``graph="anchor"`` uses the anchor graph W = Zh Lambda^-1 Zh^T of :func:`~dufs.engine.graphs.anchor_graph`
    (``n_anchors``, s = ``anchor_neighbors``, ``embed_dim``, ``random_state``) for large n_samples (the default,
    ``"auto"``, takes kNN up to 50,000 samples and the anchor graph above): f^T W f is
    then ||Lambda^-1/2 Zh^T f||^2. Since L 1 = 0, the numerator is f^T L f = f^T D f - f^T W f, and the
    denominator f^T D f - (f^T d)^2 / 1^T d: one pass over the blocks (after the graph's passes).

    References
    ----------
    He, Cai, Niyogi, "Laplacian Score for Feature Selection", NIPS 2005; He et al., TPAMI 2011, eq. (3);
    Liu, He, Chang, ICML 2010 (anchor graphs).
    """
    n = M.shape[0]
    graph = resolve_graph(graph, n, "laplacian_scores")
    built = W is None
    if W is None:
        if graph == "anchor":
            rows = graph_rows(M)
            W = anchor_graph(rows, n_anchors, anchor_neighbors, embed_dim=embed_dim, random_state=random_state,
                             keep_embedding=False, metric=graph_metric(rows), values=graph_values(rows))
        else:
            rows = X_rows if X_rows is not None else M
            W = knn_graph(rows, n_neighbors, weights=weights, t=t, metric=graph_metric(rows),
                          values=graph_values(rows))
    if isinstance(W, AnchorGraph):
        if W.shape != (n, n):
            raise ParameterError(f"W must be {n} x {n}; got {W.shape}")
        d = W.degrees
        try:
            return M.block_scores(_laplacian_block, W.zh_shared(), d, n, W.lam_inv, k=k, largest=False)
        finally:
            if built:
                W.release()  # the graph's row pieces on the workers
    W = sp.csr_array(W)
    if W.shape != (n, n):
        raise ParameterError(f"W must be {n} x {n}; got {W.shape}")
    d = np.asarray(W.sum(axis=1), dtype=np.float64).ravel()
    return M.block_scores(_laplacian_block, W, d, n, k=k, largest=False)


def _laplacian_block(b: Any, W: Any, d: np.ndarray, n: int, lam_inv: np.ndarray | None = None) -> np.ndarray:
    """Laplacian scores of one feature block (runs where the block lives). With ``lam_inv``, ``W`` is an anchor
    graph's Zh (n x m) and f^T W f = sum_k lam_inv_k (Zh^T f)_k^2."""
    B = sp.csc_array((b.data.astype(np.float64), b.indices, b.indptr), shape=(n, b.width))
    fd = B.T @ d
    fdf = (B.multiply(B)).T @ d
    if lam_inv is None:
        fwf = np.asarray((B.multiply(W @ B)).sum(axis=0), dtype=np.float64).ravel()
    else:
        P = sp.csr_array(W.T @ B)  # m x width
        fwf = np.asarray((P.multiply(P)).T @ lam_inv, dtype=np.float64).ravel()
    num = fdf - fwf
    den = fdf - fd ** 2 / d.sum()
    s = np.full(b.width, np.inf)
    ok = den > 1e-12 * np.maximum(fdf, 1e-300)
    s[ok] = num[ok] / den[ok]
    return s
