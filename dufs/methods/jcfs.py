"""JCFS (Du, Shen, "Joint Clustering and Feature Selection", paper 001): alternate the spectral embedding Y
(eq. (9), :func:`jcfs_embedding`) and the greedy Fisher step (eq. (14), :func:`jcfs_select`, the feature-space form of
:mod:`dufs.methods.greedy`) until the selected set stops changing (docs/methods.md, "JCFS")."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from dufs.engine import ROWS, VALUES, AnchorGraph, Matrix, graph_rows, laplacian_operator, sparse_counts
from dufs.errors import ParameterError
from dufs.kernels.greedy import JCFS
from dufs.methods.graph import sample_graph
from dufs.methods.greedy import GreedyResult, GreedyRun, SelectedColumns, check_k, run_greedy
from dufs.methods.params import (
    GRAPH_PARAMS,
    Param,
    StrOptions,
    check_params,
    integer,
    nonnegative,
    positive,
    table,
)
from dufs.methods.solver import checkpoint_dir, finish_checkpoint

#: JCFS's parameters (the paper's gamma = 1e-4 and 5-NN binary graph; lambda_ and standardize chosen on data)
JCFS_PARAMS = table(
    Param("n_clusters", "auto", (integer(1), StrOptions({"auto"})),
          "c, the number of clusters (columns of Y); 'auto': estimated (methods.graph.estimate_clusters)"),
    Param("lambda_", 1e-6, (nonnegative(),), "weight of the selection term in the Y-step"),
    Param("gamma", 1e-4, (positive(),), "ridge of the covariance"),
    GRAPH_PARAMS.values(),
    Param("n_neighbors", 5, (integer(1),), "k of the kNN graph"),
    Param("max_iter", 10, (integer(1),), "alternations"),
    Param("dense_below", 3000, (integer(0),), "samples below which the Y-step is dense", estimator=False),
    Param("select_gamma", None, (None, positive()), "ridge of the greedy step (None: gamma)", estimator=False),
    Param("values", "auto", (StrOptions({"auto", *VALUES}),),
          "what JCFS reads of each stored value (raw, presence, log1p, sqrt); 'auto': presence for sparse "
          "non-negative stored data (counts), raw otherwise"),
    Param("rows", "auto", (StrOptions({"auto", *ROWS}),),
          "'unit': every row scaled to unit norm before the standardization; 'auto': unit for sparse non-negative "
          "stored data (counts), raw otherwise"),
)

#: what ``values="auto"`` and ``rows="auto"`` read of sparse non-negative stored data (docs/methods.md, "What JCFS
#: reads")
SPARSE_READING = ("presence", "unit")


def jcfs_select(M: Matrix, Y: np.ndarray, n_features: int, gamma: float = 1e-4, *, checkpoint: Any = None,
                checkpoint_every: int = 1, resume: bool = False) -> GreedyResult:
    """JCFS's greedy step for a fixed embedding ``Y`` (n_samples x c): ``n_features`` features by eq. (14) with
    M_0 = I / gamma (docs/methods.md, "JCFS": Algorithm 1's M_0 = 1/2 I is a slip), in feature space."""
    check_params(JCFS_PARAMS, {"gamma": gamma}, "jcfs")
    gamma = float(gamma)
    k = check_k(M, n_features)
    Y = np.asarray(Y)
    if Y.dtype not in (np.float32, np.float64):
        Y = Y.astype(np.float64)
    if Y.ndim != 2 or Y.shape[0] != M.shape[0]:
        raise ParameterError(f"Y must be n_samples x c = ({M.shape[0]}, c); got {Y.shape}")
    problem = {"method": "jcfs", "shape": list(M.shape), "gamma": gamma,
               "Y": [float(Y.sum(dtype=np.float64)), float(np.einsum("ij,ij->", Y, Y, dtype=np.float64))],
               "n_features": k}
    directory = checkpoint_dir(M, checkpoint, "jcfs", problem)
    run = GreedyRun(M, k, JCFS, 0.0, gamma, None, None, Y, directory, int(checkpoint_every), problem)
    res = run_greedy(run, resume, "jcfs")
    res.diagnostics["checkpoint_kept"] = directory is not None and finish_checkpoint(directory, checkpoint)
    return res


def jcfs_embedding(M: Matrix, S: Any, W: Any, n_clusters: int, lambda_: float, gamma: float, *,
                   dense_below: int = 3000, tol: float = 1e-10, random_state: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """JCFS's Y-step (eq. (9)): the ``n_clusters`` eigenvectors of smallest eigenvalue of
    L + lambda_ (Z_S Z_S^T + gamma I)^-1, L the normalised Laplacian of ``W``, and their eigenvalues (ascending).

    The inverse is applied by Woodbury through the k x k system Z_S^T Z_S + gamma I. Below ``dense_below``
    samples the operator is formed and solved densely; above, matrix-free Lanczos (``eigsh``) on
    sigma I - A with sigma = 2 + lambda_ / gamma >= the largest eigenvalue (nothing n x n is formed). On an
    :class:`~dufs.engine.graphs.AnchorGraph` (any n) the problem is low rank plus identity and is solved exactly
    through an (n_anchors + k)-square eigenproblem (:func:`_anchor_embedding`), by row pieces at kddb size."""
    from scipy.sparse.linalg import LinearOperator, eigsh

    n = M.shape[0]
    if isinstance(n_clusters, bool) or not isinstance(n_clusters, int | np.integer) or not 1 <= n_clusters < n:
        raise ParameterError(f"The 'n_clusters' parameter of jcfs must be an int in [1, {n - 1}]; got "
                             f"{n_clusters!r}.")
    c = int(n_clusters)
    check_params(JCFS_PARAMS, {"lambda_": lambda_, "gamma": gamma}, "jcfs")
    lam, gamma = float(lambda_), float(gamma)
    S = [int(i) for i in (S if S is not None else [])]
    if isinstance(W, AnchorGraph):
        mu, inv = M.transform
        ids = np.asarray(S, dtype=np.int64)
        coef = np.ones(len(S)) if inv is None else np.asarray(inv, dtype=np.float64)[ids]
        shift = np.zeros(len(S)) if mu is None else np.asarray(mu, dtype=np.float64)[ids]
        # a graph in row pieces takes the columns from the row blocks; one held whole needs them here
        XS = M.columns(S) if S and not W.in_pieces else None
        return _anchor_embedding(W, S, shift, coef, XS, c, lam, gamma)
    sel = SelectedColumns(n, gamma)
    if S:
        cols = M.columns(S)
        mu, inv = M.transform
        for i, p in enumerate(S):
            a, b = cols.indptr[i], cols.indptr[i + 1]
            sel.append(p, (cols.indices[a:b], cols.data[a:b]), 1.0 if inv is None else float(inv[p]),
                       0.0 if mu is None else float(mu[p]))
        sel.H = sel.gram() + gamma * np.eye(len(S))
    L = laplacian_operator(W, normed=True)

    def A(V: np.ndarray) -> np.ndarray:
        V = np.asarray(V, dtype=np.float64)
        one = V.ndim == 1
        V2 = V[:, None] if one else V
        out = np.asarray(L @ V2)
        if S:
            out = out + lam / gamma * (V2 - sel.apply(sel.solve(sel.tapply(V2))))
        else:
            out = out + lam / gamma * V2
        return out[:, 0] if one else out

    if n < dense_below:
        from scipy.linalg import eigh

        Ad = A(np.eye(n))
        Ad = 0.5 * (Ad + Ad.T)
        # the c smallest pairs only (LAPACK's dsyevr): the tridiagonal form's c eigenpairs, not all n of them with
        # every eigenvector transformed back (the same pairs to rounding, about a third of the time)
        vals, vecs = eigh(Ad, subset_by_index=[0, c - 1], driver="evr")
        return vecs, vals
    sigma = 2.0 + lam / gamma
    op = LinearOperator((n, n), matvec=lambda v: sigma * v - A(v), matmat=lambda V: sigma * V - A(V),
                        dtype=np.float64)
    rng = np.random.default_rng(random_state)
    vals, vecs = eigsh(op, k=c, which="LA", tol=tol, v0=rng.standard_normal(n))
    order = np.argsort(-vals)
    return vecs[:, order], sigma - vals[order]


def _anchor_embedding(G: AnchorGraph, S: list, shift: np.ndarray, coef: np.ndarray, XS: Any, c: int, lam: float,
                      gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """The Y-step on an anchor graph, exactly, without an eigensolver over n_samples.

    With B = D^-1/2 Zh Lambda^-1/2 the normalised Laplacian is I - B B^T, and by Woodbury
    lambda_ (Z_S Z_S^T + gamma I)^-1 = lambda_/gamma (I - Z_S H^-1 Z_S^T), H = Z_S^T Z_S + gamma I. So
    A = (1 + lambda_/gamma) I - F K F^T with F = [B, Z_S] (n x (m + k)) and K = diag(I, lambda_/gamma H^-1): the
    smallest eigenpairs of A are the largest of F K F^T, whose nonzero ones come from the (m + k) x (m + k)
    matrix T = K^1/2 F^T F K^1/2 = U diag(t) U^T: y = F K^1/2 u / sqrt(t), eigenvalue 1 + lambda_/gamma - t.
    F^T F is one reduction over the graph's row pieces, each row block taking the selected columns from its own
    CSR rows (``XS``, the columns themselves, only for a graph held whole); Y (n x c) comes back whole (c plain
    n-vectors: float32 above ``dufs.engine.max-task-bytes``)."""
    from dufs.engine import max_task_bytes

    n, k = G.shape[0], len(S)
    single = n * c * 8 > max_task_bytes()
    if n * c * 4 > max_task_bytes():
        raise ParameterError(f"jcfs: the embedding Y is {n:,} x {c} (n_clusters), over "
                             f"dufs.engine.max-task-bytes even in float32; use fewer clusters or raise the bound")
    r = lam / gamma
    cols = {"S": S, "shift": shift, "coef": coef, "XS": XS} if k and r > 0 else {}
    BtB, BtZ, ZtZ = G.normalized_grams(**cols)
    used = np.flatnonzero(G.lam > 0)
    m = used.size
    if cols:
        H = ZtZ + gamma * np.eye(k)
        hv, hV = np.linalg.eigh(0.5 * (H + H.T))
        Hh = (hV / np.sqrt(hv)[None, :]) @ hV.T  # H^-1/2
        T = np.empty((m + k, m + k))
        T[:m, :m] = BtB[np.ix_(used, used)]
        T[:m, m:] = np.sqrt(r) * (BtZ[used] @ Hh)
        T[m:, :m] = T[:m, m:].T
        T[m:, m:] = r * (Hh @ ZtZ @ Hh)
    else:
        T = BtB[np.ix_(used, used)]
    T = 0.5 * (T + T.T)
    t, U = np.linalg.eigh(T)
    t, U = t[::-1][:c], U[:, ::-1][:, :c]
    if c > t.size or t[-1] <= 1e-12 * max(t[0], 1.0):
        raise ParameterError(f"jcfs: the anchor graph has rank {int(np.sum(t > 1e-12 * max(t[0], 1.0)))} with "
                             f"the selected features; n_clusters = {c} needs more anchors (n_anchors)")
    a = np.zeros((G.n_anchors, c))
    a[used] = U[:m] / np.sqrt(t)[None, :]
    C = np.sqrt(r) * (Hh @ U[m:]) / np.sqrt(t)[None, :] if cols else None
    Y = G.normalized_apply(a, np.float32 if single else np.float64, C=C, **cols)
    Y = np.asarray(Y.gather("the embedding Y") if hasattr(Y, "gather") else Y)
    return Y, 1.0 + r - t


def anchor_spectral_embedding(G: AnchorGraph, c: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``c`` eigenvectors of smallest eigenvalue of the anchor graph's normalised Laplacian (n x c) and those
    eigenvalues, ascending: exactly, from its n_anchors-square factor (:func:`_anchor_embedding` with no selected
    features)."""
    return _anchor_embedding(G, [], np.zeros(0), np.zeros(0), None, int(c), 0.0, 1.0)


def jcfs_reading(M: Matrix, values: str = "auto", rows: str = "auto") -> tuple[str, str]:
    """What :func:`jcfs` reads of M for its ``values`` and ``rows`` parameters: each ``"auto"`` is M's own reading
    where M reads anything but raw values and rows, else :data:`SPARSE_READING` (presence, rows at unit norm) where
    M's stored values are sparse and non-negative (:func:`dufs.engine.sparse_counts` of M unstandardized: counts;
    the standardization, JCFS's z-score by default, applies after), else raw."""
    if "auto" not in (values, rows):
        return values, rows
    if (M.values, M.rows) != ("raw", "raw"):
        auto = (M.values, M.rows)
    else:
        if M.standardize is not None:
            M.stats  # noqa: B018 -- made once on M (the view below shares them; the run reads them after)
        counts = sparse_counts(M if M.standardize is None else M.with_standardize(None))
        auto = SPARSE_READING if counts else ("raw", "raw")
    return (auto[0] if values == "auto" else values, auto[1] if rows == "auto" else rows)


def jcfs(M: Matrix, *, n_features: int, n_clusters: int, lambda_: float = 1e-6, gamma: float = 1e-4, W: Any = None,
         graph: str = "auto", n_neighbors: int = 5, weights: str = "binary", t: float | None = None,
         n_anchors: int = 256, anchor_neighbors: int = 3, embed_dim: int = 64, max_iter: int = 10,
         random_state: int = 0, dense_below: int = 3000, select_gamma: float | None = None, values: str = "auto",
         rows: str = "auto") -> GreedyResult:
    """JCFS (Du, Shen): alternate the spectral step (:func:`jcfs_embedding`, normalised Laplacian of the kNN
    graph with binary weights, k = 5, as the paper; of the unstandardized rows when M is sparse,
    :func:`~dufs.engine.graphs.graph_rows`) and the greedy Fisher step (:func:`jcfs_select`), starting
    from the empty selection, until the selected set stops changing or ``max_iter`` alternations.

    Corrections to the paper (docs/methods.md, "JCFS"): M_0 = I / gamma (Algorithm 1 says 1/2 I); eq. (14) misses a
    transpose; Y in the loop is the continuous spectral embedding (the greedy step works for any Y).

    ``select_gamma``: the ridge of the greedy step, M_0 = I / select_gamma (default ``gamma``, the correction
    above); ``select_gamma=2.0`` runs Algorithm 1 as printed (M_0 = I/2 while the spectral step keeps ``gamma``).

    Defaults, chosen on data (``examples/greedy_defaults.py``: digits 1 vs 7, digits, iris with noise columns,
    COIL20, ORL, Isolet; k-means ACC and NMI on the selected features): what matters is lambda_ / gamma, the
    weight of the term that pulls Y into the span of the selected features. At 1 (lambda_ = gamma = 1e-4, the
    default before) the first selection locks Y in (digits 1 vs 7, 10 features: k-means 0.73); at 0.01
    (lambda_ = 1e-6, the paper's smallest) Y stays spectral (0.97) and the mean rank over the six sets was the
    best of the (standardize, lambda_, gamma) grid.

    ``values`` and ``rows``: what JCFS reads of M (:func:`jcfs_reading`; :meth:`Matrix.with_values`, in blocks of
    its own released at the end). ``"auto"`` reads sparse non-negative stored data (counts) as presence with every
    row at unit norm, then standardizes; anything else as it is. A departure from the paper, which reads the values:
    on sparse counts the documents' lengths and a few large counts decide the graph, the embedding and the Fisher
    step, and JCFS found fewer planted features than ranking by variance (docs/methods.md, "What JCFS reads").
    ``diagnostics["values"]`` and ``diagnostics["rows"]`` record the reading."""
    check_params(JCFS_PARAMS, {"n_clusters": n_clusters, "lambda_": lambda_, "gamma": gamma, "graph": graph,
                                "n_neighbors": n_neighbors, "weights": weights, "t": t, "n_anchors": n_anchors,
                                "anchor_neighbors": anchor_neighbors, "embed_dim": embed_dim, "max_iter": max_iter,
                                "random_state": random_state, "dense_below": dense_below,
                                "select_gamma": select_gamma, "values": values, "rows": rows}, "jcfs")
    k = check_k(M, n_features)
    read = jcfs_reading(M, values, rows)
    V = M.with_values(*read)
    try:
        res = _jcfs(V, k, n_clusters, lambda_, gamma, W, graph, n_neighbors, weights, t, n_anchors,
                    anchor_neighbors, embed_dim, max_iter, random_state, dense_below, select_gamma)
    finally:
        if V is not M:  # blocks of its own: dropped; its passes were over M's data
            M.count_passes(V.passes)
            V.release()
    res.diagnostics.update(values=read[0], rows=read[1])
    return res


def _jcfs(M: Matrix, k: int, n_clusters: int, lambda_: float, gamma: float, W: Any, graph: str, n_neighbors: int,
          weights: str, t: float | None, n_anchors: int, anchor_neighbors: int, embed_dim: int, max_iter: int,
          random_state: int, dense_below: int, select_gamma: float | None) -> GreedyResult:
    """The alternation of :func:`jcfs` on M as it reads its values, the parameters checked."""
    t0 = time.perf_counter()
    # the kNN graph of sparse data too on its unstandardized rows (graph_rows says why)
    Wg = sample_graph(graph_rows(M), W, graph=graph, n_neighbors=n_neighbors, weights=weights, t=t,
                      n_anchors=n_anchors, anchor_neighbors=anchor_neighbors, embed_dim=embed_dim,
                      random_state=random_state)
    graph_s = time.perf_counter() - t0
    S: list[int] = []
    history = []
    res = None
    for it in range(int(max_iter)):
        Y, vals = jcfs_embedding(M, S, Wg, n_clusters, lambda_, gamma, dense_below=dense_below,
                                 random_state=random_state)
        res = jcfs_select(M, Y, k, gamma if select_gamma is None else select_gamma)
        new = res.indices.tolist()
        history.append({"iteration": it, "objective": float(res.objective[-1]), "eigenvalues": vals.tolist(),
                        "spectral_objective": float(vals.sum())})
        changed = set(new) != set(S)
        S = new
        if not changed:
            break
    res.diagnostics.update(iterations=len(history), history=history, graph_time=graph_s,
                           converged=len(history) < max_iter or not changed)
    return res
