"""An independent dense reference of the papers' own sample-space greedy algorithms (plain NumPy/SciPy).

Nothing here imports ``dufs``: these functions are the yardstick ``dufs.methods.greedy`` is measured against.

Orientation: ``X`` is n_samples x n_features (the papers' X transposed); a feature ``g`` is the column ``X[:, g]``
(an n-vector); ``W`` is an n x n symmetric affinity (dense or SciPy sparse).

- LapAOFS / LapDOFS: He, Zhou, Zhao, Cai, Bu, Chen, "A Variance Minimization Criterion to Feature Selection Using
  Laplacian Regularization", TPAMI 2011, eqs. (14)-(20) and (24)-(29). ``L = D - W`` (unnormalised).
- JCFS: "Jointly Clustering and Feature Selection", eqs. (8)-(14) and Algorithm 1, with ``M_0 = I / gamma``
  (Algorithm 1 prints ``1/2 I``: a slip, see DESIGN.md 7.3). ``L = I - D^-1/2 W D^-1/2`` (normalised).

Ties between candidates go to the lowest feature index (``np.argmax`` of the first maximum).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.sparse as sp


class GreedyResult(NamedTuple):
    """``order``: the k picks; ``criterion``: the chosen feature's score at each step; ``objective``: the objective
    after each step."""

    order: np.ndarray
    criterion: np.ndarray
    objective: np.ndarray


class JCFSResult(NamedTuple):
    """Algorithm 1's outcome: the final selection ``order``, the number of (Y-step, greedy pass) ``iterations``,
    every pass's selection in ``selections``, and the last pass's ``criterion`` / ``objective``, ``Y``,
    ``eigenvalues``."""

    order: np.ndarray
    iterations: int
    selections: list
    criterion: np.ndarray
    objective: np.ndarray
    Y: np.ndarray
    eigenvalues: np.ndarray


def _dense(A) -> np.ndarray:
    return np.asarray(A.toarray() if sp.issparse(A) else A, dtype=np.float64)


def _check(X, W=None, k=None):
    X = _dense(X)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D; got shape {X.shape}")
    n, d = X.shape
    if k is not None and not 1 <= k <= d:
        raise ValueError(f"k must be in [1, {d}]; got {k}")
    if W is None:
        return X, None
    W = _dense(W)
    if W.shape != (n, n) or not np.allclose(W, W.T, rtol=0, atol=1e-12 * max(1.0, np.abs(W).max())):
        raise ValueError(f"W must be a symmetric {n} x {n} matrix")
    return X, W


def laplacian_dense(W, normed: bool = False) -> np.ndarray:
    """``D - W``, or ``I - D^-1/2 W D^-1/2`` (an isolated vertex gets a zero row of ``D^-1/2``)."""
    W = _dense(W)
    deg = W.sum(axis=1)
    if not normed:
        return np.diag(deg) - W
    s = np.zeros_like(deg)
    s[deg > 0] = 1.0 / np.sqrt(deg[deg > 0])
    return np.eye(W.shape[0]) - s[:, None] * W * s[None, :]


def _argmax_free(score: np.ndarray, taken: np.ndarray) -> int:
    s = np.where(taken, -np.inf, score)
    return int(np.argmax(s))  # first maximum: the lowest index among ties


def _lap_greedy(X, W, k, lambda1, lambda2, kind):
    X, W = _check(X, W, k)
    if not lambda1 >= 0 or not lambda2 > 0:
        raise ValueError("lambda1 must be >= 0 and lambda2 > 0")
    n, d = X.shape
    B = np.eye(n) + lambda1 * laplacian_dense(W)  # I + lambda1 L
    M = lambda2 * np.linalg.inv(B)                # the paper's M = lambda2 (I + lambda1 L)^-1
    M = (M + M.T) / 2
    Ainv = B / lambda2                            # A_0^-1 = M^-1, exactly
    taken = np.zeros(d, dtype=bool)
    order = np.empty(k, dtype=np.int64)
    crit = np.empty(k)
    obj = np.empty(k)
    logdet_ratio = 0.0                            # log det A_t - log det M, by eq. (28)
    for t in range(k):
        U = Ainv @ X                              # A_t^-1 g for every candidate
        q = np.einsum("ij,ij->j", X, U)           # g^T A_t^-1 g
        if kind == "A":
            score = np.einsum("ij,ij->j", U, M @ U) / (1.0 + q)  # eq. (20)
        else:
            score = q                                            # eq. (29)
        p = _argmax_free(score, taken)
        taken[p] = True
        order[t], crit[t] = p, score[p]
        u = U[:, p]
        Ainv = Ainv - np.outer(u, u) / (1.0 + q[p])              # eq. (19)
        Ainv = (Ainv + Ainv.T) / 2
        if kind == "A":
            # eq. (14): Tr(H^-1) = ((t + 1) - n + Tr(A_{t+1}^-1 M)) / lambda2
            obj[t] = ((t + 1) - n + np.sum(Ainv * M)) / lambda2
        else:
            # log det H = (t + 1) log lambda2 + log det A_{t+1} - log det M, with eq. (28)
            logdet_ratio += np.log1p(q[p])
            obj[t] = (t + 1) * np.log(lambda2) + logdet_ratio
    return GreedyResult(order, crit, obj)


def lapaofs_paper(X, W, k, lambda1=0.01, lambda2=0.01) -> GreedyResult:
    """LapAOFS by the paper's sequential scheme: ``A_0 = M``, pick eq. (20), update ``A^-1`` by eq. (19).

    ``objective[t]`` is ``Tr(H^-1)`` after ``t + 1`` picks (eq. (14)), ``H = X_S^T (I + lambda1 L) X_S + lambda2 I``.

    References
    ----------
    He et al., TPAMI 2011, eqs. (14), (19), (20).
    """
    return _lap_greedy(X, W, k, lambda1, lambda2, "A")


def lapdofs_paper(X, W, k, lambda1=0.01, lambda2=0.01) -> GreedyResult:
    """LapDOFS by the paper's sequential scheme: pick eq. (29), update ``A^-1`` by eq. (19).

    ``objective[t]`` is ``log det H`` after ``t + 1`` picks, ``(t+1) log lambda2 + log det A_{t+1} - log det M``
    with ``det A`` carried by eq. (28).

    References
    ----------
    He et al., TPAMI 2011, eqs. (19), (24)-(29).
    """
    return _lap_greedy(X, W, k, lambda1, lambda2, "D")


def jcfs_greedy_paper(X, Y, k, gamma=1e-4) -> GreedyResult:
    """JCFS's feature step for a fixed embedding ``Y`` (n x c): ``M_0 = I / gamma``, pick eq. (14)
    ``(g^T M Y Y^T M g) / (1 + g^T M g)``, update ``M`` by eq. (13).

    ``objective[t]`` is ``tr(Y^T M_{t+1} Y)``, ``M_{t+1} = (X_S X_S^T + gamma I)^-1`` (eq. (10)).

    References
    ----------
    JCFS, eqs. (10), (12)-(14); Algorithm 1 with ``M_0 = I / gamma``.
    """
    X, _ = _check(X, None, k)
    Y = _dense(Y)
    if Y.ndim == 1:
        Y = Y[:, None]
    n, d = X.shape
    if Y.shape[0] != n:
        raise ValueError(f"Y must have {n} rows; got {Y.shape}")
    if not gamma > 0:
        raise ValueError("gamma must be > 0")
    Mt = np.eye(n) / gamma
    taken = np.zeros(d, dtype=bool)
    order = np.empty(k, dtype=np.int64)
    crit = np.empty(k)
    obj = np.empty(k)
    for t in range(k):
        U = Mt @ X                                    # M_t g
        q = np.einsum("ij,ij->j", X, U)               # g^T M_t g
        P = Y.T @ U                                   # Y^T M_t g, (c x d)
        score = np.einsum("ij,ij->j", P, P) / (1.0 + q)  # eq. (14)
        p = _argmax_free(score, taken)
        taken[p] = True
        order[t], crit[t] = p, score[p]
        u = U[:, p]
        Mt = Mt - np.outer(u, u) / (1.0 + q[p])       # eq. (13)
        Mt = (Mt + Mt.T) / 2
        obj[t] = np.sum(Y * (Mt @ Y))
    return GreedyResult(order, crit, obj)


def inverse_scatter(X, S, gamma) -> np.ndarray:
    """``(X_S X_S^T + gamma I)^-1`` (n x n) from the thin SVD of ``X_S``: ``U diag(1/(s^2 + gamma)) U^T`` plus
    ``(I - U U^T) / gamma`` (accurate for small ``gamma``, unlike a plain inverse)."""
    X = _dense(X)
    n = X.shape[0]
    S = np.asarray(S, dtype=np.int64).ravel()
    if S.size == 0:
        return np.eye(n) / gamma
    U, s, _ = np.linalg.svd(X[:, S], full_matrices=False)
    return (U * (1.0 / (s * s + gamma) - 1.0 / gamma)) @ U.T + np.eye(n) / gamma


def jcfs_embedding_dense(X, S, W, n_clusters, lambda_, gamma):
    """Eq. (9): the ``n_clusters`` eigenvectors of ``L_norm + lambda_ (X_S X_S^T + gamma I)^-1`` with the smallest
    eigenvalues (dense ``numpy.linalg.eigh``). Returns ``(Y, eigenvalues)``, ascending.

    References
    ----------
    JCFS, eqs. (7), (9).
    """
    X, W = _check(X, W)
    n = X.shape[0]
    if not 1 <= n_clusters <= n:
        raise ValueError(f"n_clusters must be in [1, {n}]")
    K = laplacian_dense(W, normed=True) + lambda_ * inverse_scatter(X, S, gamma)
    K = (K + K.T) / 2
    vals, vecs = np.linalg.eigh(K)
    return vecs[:, :n_clusters], vals[:n_clusters]


def jcfs_paper(X, W, n_features, n_clusters, lambda_, gamma=1e-4, max_iter=10, m0=None) -> JCFSResult:
    """Algorithm 1: a Y-step from the empty selection (``M = I / gamma``), then the greedy feature step, alternated
    until the selected set is the one of the previous pass, or ``max_iter`` passes. The greedy step starts from
    ``M_0 = I / gamma``, or ``M_0 = m0 I`` when given (Algorithm 1 as printed: ``m0 = 1/2``).

    ``iterations`` counts (Y-step, greedy pass) pairs: a selection that repeats at once gives 2.

    References
    ----------
    JCFS, Algorithm 1, eqs. (9), (13), (14).
    """
    X, W = _check(X, W, n_features)
    if max_iter < 1:
        raise ValueError("max_iter must be >= 1")
    S = np.zeros(0, dtype=np.int64)
    selections = []
    prev = None
    for _ in range(max_iter):
        Y, vals = jcfs_embedding_dense(X, S, W, n_clusters, lambda_, gamma)
        res = jcfs_greedy_paper(X, Y, n_features, gamma if m0 is None else 1.0 / m0)
        selections.append(res.order)
        S = res.order
        if prev is not None and set(prev.tolist()) == set(S.tolist()):
            break
        prev = S
    return JCFSResult(S, len(selections), selections, res.criterion, res.objective, Y, vals)


def knn_affinity(X, n_neighbors, weights="binary", t=None) -> np.ndarray:
    """The papers' symmetric kNN graph, dense, brute force: ``i ~ j`` if either is among the other's
    ``n_neighbors`` nearest (Euclidean, itself excluded, ties to the lower index).

    ``weights="heat"``: ``exp(-d^2 / t)`` on the edges, ``t`` by default the mean squared distance over the
    n x n_neighbors (sample, neighbour) pairs of the kNN lists.

    References
    ----------
    He et al., TPAMI 2011, eq. (2); JCFS, eq. (7).
    """
    X, _ = _check(X)
    n = X.shape[0]
    if not 1 <= n_neighbors < n:
        raise ValueError(f"n_neighbors must be in [1, {n - 1}]")
    if weights not in ("binary", "heat"):
        raise ValueError("weights must be 'binary' or 'heat'")
    D2 = np.empty((n, n))
    for i in range(n):  # exact differences, bitwise symmetric
        diff = X - X[i]
        D2[i] = np.einsum("ij,ij->i", diff, diff)
    np.fill_diagonal(D2, np.inf)
    nbr = np.argsort(D2, axis=1, kind="stable")[:, :n_neighbors]
    rows = np.repeat(np.arange(n), n_neighbors)
    cols = nbr.ravel()
    A = np.zeros((n, n), dtype=bool)
    A[rows, cols] = True
    A |= A.T
    if weights == "binary":
        return A.astype(np.float64)
    width = float(np.mean(D2[rows, cols])) if t is None else float(t)
    if not width > 0:
        width = 1.0
    return np.where(A, np.exp(-np.where(A, D2, 0.0) / width), 0.0)


def lap_objective_direct(X, W, order, lambda1=0.01, lambda2=0.01, kind="A") -> np.ndarray:
    """``Tr(H^-1)`` (``kind="A"``) or ``log det H`` (``"D"``) for every prefix of ``order``, from the explicit
    k x k ``H = X_S^T (I + lambda1 L) X_S + lambda2 I``: accurate where eq. (14)'s ``((t+1) - n + Tr(A^-1 M))``
    cancels (its absolute error is about ``n eps / lambda2``, large against a small ``Tr(H^-1)``)."""
    X, W = _check(X, W)
    B = np.eye(X.shape[0]) + lambda1 * laplacian_dense(W)
    out = np.empty(len(order))
    for t in range(len(order)):
        XS = X[:, np.asarray(order[:t + 1])]
        H = XS.T @ B @ XS + lambda2 * np.eye(t + 1)
        out[t] = np.trace(np.linalg.inv(H)) if kind == "A" else np.linalg.slogdet(H)[1]
    return out
