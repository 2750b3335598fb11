"""M3FS's problem (paper 000; docs/methods.md, "M3FS"): the parameters, the normalised graph Laplacian it
regularises with, and the closed-form sigma step shared by both solvers."""

from __future__ import annotations

from typing import Any

import numpy as np

from dufs.errors import ParameterError
from dufs.kernels.vstep import top_positive
from dufs.methods.params import SEED, Param, StrOptions, integer, nonnegative, positive, table

_NONE_IS_THE_SOLVERS = "None: the solver's default"


#: M3FS's parameters as ``dufs.fit(method="m3fs")`` and ``dufs.M3FS`` take them: ``solver`` picks
#: :func:`m3fs_faithful` or :func:`dufs.methods.m3fs.alternating.m3fs_alternating`, and a parameter left at None takes
#: that solver's own default (a parameter of the other solver is an error)
M3FS_PARAMS = table(
    Param("n_clusters", "auto", (integer(2), StrOptions({"auto"})),
          "M, the number of clusters; 'auto': estimated (methods.graph.estimate_clusters)"),
    Param("solver", "auto", (StrOptions({"auto", "faithful", "alternating"}),), "faithful up to 5000 x 1000"),
    Param("C", 1.0, (positive(),), "weight of the (averaged) hinge loss"),
    Param("lambda_", None, (None, nonnegative()), f"manifold weight ({_NONE_IS_THE_SOLVERS})"),
    Param("l", None, (None, positive()), "class-balance bound (None: 0.1 n_samples)"),
    Param("epsilon", None, (None, positive()), f"cutting-plane tolerance, faithful ({_NONE_IS_THE_SOLVERS})"),
    Param("graph", None, (None, StrOptions({"gaussian", "knn", "anchor"})), f"sample graph ({_NONE_IS_THE_SOLVERS})"),
    Param("n_neighbors", None, (None, integer(1)), f"k of the graph ({_NONE_IS_THE_SOLVERS})"),
    Param("max_iter", None, (None, integer(1)), f"outer iterations, alternating ({_NONE_IS_THE_SOLVERS})"),
    Param("polish", None, (None, StrOptions({"auto"}), integer(0)), "label flips tried, alternating"),
    Param("max_passes", "auto", (None, integer(1), StrOptions({"auto"})),
          "budget of passes over the data, alternating ('auto': time_budget seconds of passes at the measured "
          "speed, at least 50; None: none)", estimator=False),
    Param("time_budget", None, (None, positive()), f"seconds of passes max_passes='auto' allows, alternating "
          f"({_NONE_IS_THE_SOLVERS}: 1200)", estimator=False),
    SEED,
    Param("sigma_width", None, (None, positive()), "Gaussian graph width, faithful", estimator=False),
    Param("L", None, ("no_validation",), "a precomputed Laplacian", estimator=False),
    Param("W", None, ("no_validation",), "a precomputed graph, alternating", estimator=False),
    Param("max_cutting_planes", None, (None, integer(1)), "faithful", estimator=False),
    Param("max_cccp", None, (None, integer(1)), "faithful", estimator=False),
    Param("weights", None, (None, StrOptions({"binary", "heat"})), "kNN weights, alternating", estimator=False),
    Param("n_anchors", None, (None, integer(1)), "anchor graph, alternating", estimator=False),
    Param("anchor_neighbors", None, (None, integer(1)), "anchor graph, alternating", estimator=False),
    Param("embed_dim", None, (None, integer(1)), "anchor graph, alternating", estimator=False),
    Param("tol", None, (None, nonnegative()), "relative decrease to stop, alternating", estimator=False),
    Param("alternations", None, (None, integer(1)), "(v, sigma) pairs an iteration, alternating", estimator=False),
    Param("init", None, (None, StrOptions({"spectral", "random"}), "array-like"), "first labels, alternating",
          estimator=False),
    Param("dense_below", None, (None, integer(0)), "dense eigensolver below, alternating", estimator=False),
)


# ------------------------------------------------------------------------------------------------ sigma step
def sigma_step(V: Any, m: float) -> np.ndarray:
    """The closed-form sigma step: argmin_sigma sum_k a_k / sigma_k s.t. sum_k sigma_k = m, 0 <= sigma_k <= 1,
    with a_k = sum_p v_pk^2.

    KKT gives sigma_k = min(1, sqrt(a_k) / sqrt(mu)): sigma proportional to g_k = sqrt(a_k), the largest capped
    at 1 and the rest water-filled. Features with a_k = 0 get sigma_k = 0 unless fewer than m features have
    a_k > 0; then those get 1 and the remaining mass is spread evenly over the others (any split is optimal).

    Parameters
    ----------
    V : array-like, (n_features,) or (n_classes, n_features)
        v (two-class) or the rows v_p (multi-class).
    m : float
        The budget, 0 < m <= n_features.

    Returns
    -------
    sigma : ndarray (n_features,)

    References
    ----------
    Zhao et al. 2009, eqs. (7) and (16) with v fixed; docs/methods.md, "M3FS".
    """
    V = np.asarray(V, dtype=np.float64)
    if V.ndim == 1:
        V = V[None, :]
    if V.ndim != 2 or V.shape[1] == 0:
        raise ParameterError(f"The 'V' parameter of sigma_step must be 1-D or 2-D with n_features >= 1; "
                             f"got shape {V.shape}.")
    d = V.shape[1]
    if isinstance(m, bool) or not np.isfinite(m) or not 0 < m <= d:
        raise ParameterError(f"The 'm' parameter of sigma_step must be a float in (0, {d}]; got {m!r}.")
    g = np.abs(V[0]) if V.shape[0] == 1 else np.sqrt(np.einsum("pk,pk->k", V, V))
    nnz = int(np.count_nonzero(g))
    if nnz <= m:
        sigma = np.zeros(d)
        sigma[g > 0] = 1.0
        rest = d - nnz
        if rest:
            sigma[g == 0] = (m - nnz) / rest
        return sigma
    # at most floor(m) features are capped: only the floor(m) + 1 largest g are needed, in order (by g descending,
    # then index), and the sum of the others: top_positive sweeps g twice, where a full argsort or an argpartition
    # cost more (docs/measurements.md, "M3FS's v-step")
    k = min(nnz, int(np.floor(m)) + 1)
    top, rest = top_positive(g, k)
    gs = g[top]
    tail = np.cumsum(gs[::-1])[::-1] + rest  # tail[j] = sum of g over every feature but the j largest
    for j in range(min(k, int(np.floor(m)) + 1)):  # j = number of capped features
        scale = (m - j) / tail[j]
        if gs[j] * scale <= 1.0 + 1e-12:
            sigma = np.multiply(g, scale, out=g)  # min(g scale, 1), 0 where g is: in g's memory (its own array)
            np.minimum(sigma, 1.0, out=sigma)
            sigma[top[:j]] = 1.0
            return sigma
    sigma = np.zeros(d)
    sigma[top[:int(m)]] = 1.0  # unreachable for m <= nnz, kept for safety
    return sigma


def m3fs_laplacian(X: np.ndarray, *, graph: str = "gaussian", n_neighbors: int = 10,
                   sigma_width: float | None = None) -> np.ndarray:
    """The normalised Laplacian L = I - D^-1/2 W D^-1/2 (dense, n x n) of the fully connected Gaussian graph
    w_ij = exp(-||x_i - x_j||^2 / (2 rho^2)) (the paper's section 4.1; rho = ``sigma_width``, default the median
    pairwise distance; zero diagonal) or of the heat-kernel kNN graph (:func:`dufs.engine.graphs.knn_graph`)."""
    n = X.shape[0]
    if graph == "gaussian":
        sq = np.einsum("ij,ij->i", X, X)
        D2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (X @ X.T), 0.0)
        if sigma_width is None:
            iu = np.triu_indices(n, 1)
            rho = float(np.median(np.sqrt(D2[iu]))) if n > 1 else 1.0
            rho = rho if rho > 0 else 1.0
        else:
            rho = float(sigma_width)
        W = np.exp(-D2 / (2.0 * rho * rho))
        np.fill_diagonal(W, 0.0)
    elif graph == "knn":
        from dufs.engine import knn_graph

        W = knn_graph(X, n_neighbors, weights="heat").toarray()
    else:
        raise ParameterError(f"The 'graph' parameter of m3fs_faithful must be 'gaussian' or 'knn'; got {graph!r}.")
    deg = W.sum(axis=1)
    inv = np.zeros(n)
    inv[deg > 0] = 1.0 / np.sqrt(deg[deg > 0])
    return np.eye(n) - inv[:, None] * W * inv[None, :]
