"""M3FS, the scalable alternating variant (paper 000, Zhao, Kwok, Wang, Zhang, CVPR 2010; docs/methods.md, "M3FS").

The objective is the paper's, problem (6) (two clusters) and (14) (M > 2 clusters), with its sigma relaxation
0 <= sigma <= 1, sum sigma = m, written for the engine's transformed data Z (n_samples x n_features; the paper's
X^T is our Z) and with the slacks eliminated:

    J(sigma, v, b) = 1/2 sum_k ||v_k||^2 / sigma_k + C/n sum_i xi_i + lambda sum_p f_p^T L f_p,

- two clusters: f = Z v + b 1 and xi_i = max(0, 1 - |f_i|) (labels z_i = sgn f_i);
- M clusters (no bias, as in (14)): f_p = Z v_p and xi_i = max(0, 1 - (f_i(1) - f_i(2))), the gap between the
  largest and second largest score (labels y_i = argmax_p f_ip, the labels that minimise (14) over y);

L the normalised Laplacian I - D^-1/2 W D^-1/2 of a kNN or anchor graph (the paper writes the manifold term as
lambda f^T L f; its sum over edges is twice that: we keep lambda f^T L f). ||v_k|| is |v_k| for two
clusters and the norm of row k of V (d x M) for M.

**Class balance** (the paper's l): constraint (5), -l <= sum_i f_i <= l, and (14)'s -l <= 1^T Z (v_p - v_q) <= l,
are linear in (v, b): with s = Z^T 1 (column sums of Z, from the column statistics; zero under "zscore") they
read |s^T v + n b| <= l and max_p s^T v_p - min_p s^T v_p <= l. They are kept exactly, as a Euclidean projection
(onto a slab, or by clipping the M numbers s^T v_p into a window of width l) inside every step of the v-solver.
Under "zscore" (centred data) the two-cluster constraint is |b| <= l / n and the multi-cluster one is vacuous.

**Alternating scheme** (block-coordinate descent on J; the label step is the paper's CCCP linearisation):

1. labels: z = sgn(Z v + b) (argmax over clusters), from ``init`` at the first iteration;
2. v-step, sigma and labels fixed: the Laplacian-regularised hinge problem
   min_{v,b} 1/2 sum_k ||v_k||^2 / sigma_k + C/n sum_i hinge_i(z; f) + lambda sum_p f_p^T L f_p (balance kept),
   whose hinge max(0, 1 - z_i f_i) (multi: max(0, max_{r != y_i} 1 - f_iy + f_ir)) majorises xi_i and equals
   it at the current point, so a v-step that lowers this problem lowers J;
3. sigma-step, v fixed: the closed form sigma_k = min(1, ||v_k|| / theta), sum sigma = m
   (:func:`dufs.methods.m3fs.problem.sigma_step`).

The v-step is accelerated projected gradient (FISTA with backtracking and function-value restart) in
u = S^-1/2 v (S = diag(sigma), so the quadratic is 1/2 ||u||^2 with condition independent of sigma; with two
clusters the bias is minimised over exactly at every point, :func:`_best_bias`, and FISTA runs on u alone), on the
hinge smoothed by Nesterov's quadratic prox with parameter ``smoothing`` = mu:
hinge_mu(a) = max_{alpha >= 0, 1^T alpha <= 1} alpha^T a - mu/2 ||alpha||^2 (the Huber hinge for two
clusters); 0 <= hinge - hinge_mu <= mu / 2, so the smoothed J_mu is within C mu / 2 of J. The alternation
decreases J_mu monotonically (the three steps each lower it; the v-solver keeps its best iterate) and the result
reports both J_mu (``objective``) and the paper's J (``objective_exact``). Each v-solver iteration makes two
products with the data (Z^T r for the gradient, Z u for the new scores, run on the cluster when one is active): two
passes, or with two clusters over blocks persisted on a cluster one sweep that makes both, the vectors over the
features kept on the workers (:mod:`dufs.methods.m3fs.resident`); the Laplacian is applied on the driver to
n_samples-vectors (the anchor graph's never forms n x n).

References
----------
Zhao, Kwok, Wang, Zhang, "Unsupervised Maximum Margin Feature Selection with Manifold Regularization", CVPR 2009,
problems (6), (9), (14), (17). Beck, Teboulle, "A Fast Iterative Shrinkage-Thresholding Algorithm", SIAM J.
Imaging Sci. 2009; O'Donoghue, Candes, "Adaptive restart for accelerated gradient schemes", FoCM 2015;
Nesterov, "Smooth minimization of non-smooth functions", Math. Program. 2005.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp

from dufs._logging import get_logger
from dufs.engine import AnchorGraph, Matrix, current_client, flush, graph_rows, laplacian_operator, ranked_head
from dufs.errors import ParameterError
from dufs.methods.m3fs.budget import TIME_BUDGET, PassBudget
from dufs.methods.m3fs.problem import sigma_step
from dufs.methods.m3fs.vstep import _objectives, v_step
from dufs.scheduling import one_blas_thread

log = get_logger(__name__)




# m3fs_alternating stops each v-step once it is provably within _VALUE_RTOL * tol of its optimum, relative (tol: the
# alternation's own): closer than that cannot change when the alternation stops. With the gradient mapping's
# relative rule alone (inner_tol) the v-steps of a 200K-row store ran 11-16 iterations, the last 4-6 of them
# lowering the value by less than 1e-8 of it
_VALUE_RTOL = 1e-3


_POLISH, _POLISH_MAX_N = 8, 5000  # polish="auto": label flips tried, up to this many samples


# a dense L (n x n) with n * n_features at most this: L Z is formed once (one pass), so that the manifold term's
# L f = (L Z) S^1/2 u + b L 1 costs n * n_features * p instead of n^2 * p per evaluation
_LZ_MAX = 1 << 22


# lambda_=None: the manifold weight is min(_LAMBDA, _LAMBDA_N / n_samples). f^T L f is a sum over the samples
# while the hinge is an average, so a fixed weight lets the manifold term outgrow the loss as n grows: with the
# anchor graph of a 200,000-row store 1e-2 (lambda n = 2000) put every sample in one cluster, and at kddb size it
# would give the v-step a condition number of about 1e8. min(1e-2, 20 / n) (the rule until then) put all but 8
# of rcv1_small's 1,000 documents in one cluster and all but 60 of reuters' 7,770; 2 / n splits them 265/735 and
# 3,562/4,208 (on the z-scored rows' kNN graph of the time), and was as good as the earlier rule or better on every
# set of the study (docs/methods.md, "M3FS") but one score of the collapsed reuters run: 52 of 80 planted cluster
# features at 100,000 rows (48 before), k-means accuracy on digits pairs and breast cancer equal or higher.
_LAMBDA, _LAMBDA_N = 1e-2, 2.0


@dataclass
class M3FSAlternatingResult:
    """What :func:`m3fs_alternating` found: ``sigma`` (n_features), ``labels`` (n_samples, in 0..M-1), the
    ``selected`` features (largest sigma first, ties to the lower index), ``v`` ((n_features,) for two clusters,
    (n_features, M) otherwise), ``b`` (0 for M > 2), the scores ``f`` = Z v + b, ``objective`` (J_mu after each
    iteration: the function the alternation decreases), ``objective_exact`` (the paper's J, mu = 0) and
    ``diagnostics``."""

    sigma: np.ndarray
    labels: np.ndarray
    selected: np.ndarray
    v: np.ndarray
    b: float
    f: np.ndarray
    objective: np.ndarray
    objective_exact: np.ndarray
    diagnostics: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------- init
def _init_labels(M: Matrix, L: Any, init: Any, k: int, random_state: int, dense_below: int,
                 graph: Any = None) -> np.ndarray:
    """Labels in 0..k-1: given (an array), ``"random"`` (balanced, shuffled) or ``"spectral"`` (the faithful
    solver's: the k eigenvectors of smallest eigenvalue of L; two clusters split the second at its median, more
    run k-means on the row-normalised eigenvectors; on an anchor ``graph`` exactly through its n_anchors-square
    factor (:func:`dufs.methods.jcfs.anchor_spectral_embedding`), else dense below ``dense_below`` samples, else
    Lanczos on 2 I - L, which never forms n x n)."""
    n = M.shape[0]
    if isinstance(init, str):
        if init == "random":
            return np.random.default_rng(random_state).permutation(np.arange(n) % k)
        if init != "spectral":
            raise ParameterError(f"The 'init' parameter of m3fs_alternating must be 'spectral', 'random' or an "
                                 f"array of labels; got {init!r}.")
        from dufs.methods.m3fs.faithful import _spectral_init

        if isinstance(graph, AnchorGraph):
            from dufs.methods.jcfs import anchor_spectral_embedding

            U, _ = anchor_spectral_embedding(graph, k)
            return _split(U, k, random_state)
        if n <= dense_below:
            Ld = np.asarray(L @ np.eye(n)) if not isinstance(L, np.ndarray) else L
            return _spectral_init(Ld, k, random_state)
        return _split(_lanczos_embedding(L, graph, k, random_state), k, random_state)
    y = np.asarray(init).ravel()
    if y.shape != (n,):
        raise ParameterError(f"The 'init' parameter of m3fs_alternating must have n_samples = {n} labels; "
                             f"got shape {y.shape}.")
    vals = np.unique(y)
    if vals.shape[0] > k:
        raise ParameterError(f"The 'init' labels have {vals.shape[0]} values for n_clusters = {k}.")
    return np.searchsorted(vals, y).astype(np.int64)


#: Lanczos vectors of the spectral initialisation (ARPACK's default, 2k + 1, was slow or did not converge on a
#: kNN graph's clustered spectrum: docs/measurements.md, "M3FS's alternation")
_INIT_NCV = 20


def _lanczos_embedding(L: Any, graph: Any, k: int, random_state: int) -> np.ndarray:
    """The k eigenvectors of smallest eigenvalue (ascending) of the normalised Laplacian, by Lanczos on 2 I - L
    (never n x n). Of a sparse ``graph`` W (kNN), of its regularised form W + (tau / n) 1 1^T with tau its mean
    degree (Qin and Rohe, NIPS 2013): a kNN graph of data with repeated rows falls apart into components (220 for
    48,842 one-hot rows, k = 5), which make 0 an eigenvalue of L as many times, and Lanczos on that took long to
    return an arbitrary mix of component indicators; tau joins them (the matrix-free rank-one term), and the second
    eigenvalue separates (docs/measurements.md, "M3FS's alternation"). The objective keeps the graph's own L."""
    from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigsh

    n = L.shape[0]
    if graph is not None and sp.issparse(graph):
        W = sp.csr_array(graph)
        d = np.asarray(W.sum(axis=1), dtype=np.float64).ravel()
        tau = float(d.mean()) if n else 0.0
        s = 1.0 / np.sqrt(np.maximum(d + tau, 1e-300))

        def mm(X: np.ndarray) -> np.ndarray:  # (2 I - L_tau) X = X + D_tau^-1/2 W_tau D_tau^-1/2 X
            X2 = np.asarray(X, dtype=np.float64).reshape(n, -1)
            Y = s[:, None] * X2
            WY = W @ Y
            WY += (tau / n) * Y.sum(axis=0, keepdims=True)
            return (X2 + s[:, None] * WY).reshape(np.shape(X))
    else:
        def mm(X: np.ndarray) -> np.ndarray:
            return 2.0 * X - L @ X

    op = LinearOperator((n, n), matvec=mm, matmat=mm, dtype=np.float64)
    v0 = np.random.default_rng(random_state).standard_normal(n)
    ncv = min(n - 1, max(2 * k + 1, _INIT_NCV))
    try:
        vals, U = eigsh(op, k=k, which="LA", v0=v0, ncv=ncv, maxiter=max(1000, 20 * k))
    except ArpackNoConvergence as exc:  # the Ritz vectors so far: an initial point, the alternation refines it
        if exc.eigenvectors.shape[1] < k:
            raise
        log.warning("m3fs: the spectral initialisation's Lanczos did not converge; its Ritz vectors are used")
        vals, U = exc.eigenvalues, exc.eigenvectors
    return U[:, np.argsort(-vals)]


def _split(U: np.ndarray, k: int, random_state: int) -> np.ndarray:
    """Labels from the k eigenvectors of smallest eigenvalue ``U`` (ascending): two clusters split the second at
    its median, more run k-means on the row-normalised eigenvectors."""
    if k == 2:
        e = U[:, 1]
        return (e > np.median(e)).astype(np.int64)
    from sklearn.cluster import KMeans

    E = U / np.maximum(np.linalg.norm(U, axis=1, keepdims=True), 1e-12)
    return KMeans(n_clusters=k, n_init=10, random_state=random_state).fit_predict(E).astype(np.int64)


def _check(name: str, value: Any, low: float = 0.0, *, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer) \
            or not np.isfinite(value) or not (value > low if strict else value >= low):
        raise ParameterError(f"The '{name}' parameter of m3fs_alternating must be a float {'>' if strict else '>='} "
                             f"{low:g}; got {value!r}.")
    return float(value)


def _colsum(M: Matrix) -> np.ndarray | None:
    """s = Z^T 1 from the column statistics: None (zero) under "zscore", sum_i x_ik / std_k under "scale", raw
    sums."""
    if M.standardize == "zscore":
        return None
    st = M.stats
    s = np.asarray(st.sum, dtype=np.float64)
    _, inv = M.transform
    return s if inv is None else s * inv


def _checked(n: int, d: int, *, n_features: Any, n_clusters: Any, max_iter: Any, inner_max_iter: Any, polish: Any,
             C: Any, lambda_: Any, tol: Any, smoothing: Any, inner_tol: Any, max_passes: Any, time_budget: Any,
             l: Any) -> tuple[float, float, float, float, float, float]:
    """:func:`m3fs_alternating`'s parameters checked; (C, lambda_, tol, smoothing, inner_tol, l) as floats, lambda_
    None made min(_LAMBDA, _LAMBDA_N / n) and l None 0.1 n."""
    if not isinstance(n_features, int | np.integer) or isinstance(n_features, bool) or not 1 <= n_features <= d:
        raise ParameterError(f"The 'n_features' parameter of m3fs_alternating must be an int in [1, {d}]; "
                             f"got {n_features!r}.")
    if not isinstance(n_clusters, int | np.integer) or isinstance(n_clusters, bool) or not 2 <= n_clusters < n:
        raise ParameterError(f"The 'n_clusters' parameter of m3fs_alternating must be an int in [2, {n - 1}]; "
                             f"got {n_clusters!r}.")
    for name, val in (("max_iter", max_iter), ("inner_max_iter", inner_max_iter)):
        if not isinstance(val, int | np.integer) or isinstance(val, bool) or val < 1:
            raise ParameterError(f"The '{name}' parameter of m3fs_alternating must be an int >= 1; got {val!r}.")
    if not (polish == "auto" or (isinstance(polish, int | np.integer) and not isinstance(polish, bool)
                                 and polish >= 0)):
        raise ParameterError(f"The 'polish' parameter of m3fs_alternating must be an int >= 0 or 'auto'; "
                             f"got {polish!r}.")
    C = _check("C", C, strict=True)
    lam = 0.0 if lambda_ is None else _check("lambda_", lambda_)
    tol = _check("tol", tol)
    mu = _check("smoothing", smoothing)
    inner_tol = _check("inner_tol", inner_tol)
    if max_passes is not None and max_passes != "auto" and (
            not isinstance(max_passes, int | np.integer) or isinstance(max_passes, bool) or max_passes < 1):
        raise ParameterError(f"The 'max_passes' parameter of m3fs_alternating must be an int >= 1, 'auto' or None; "
                             f"got {max_passes!r}.")
    _check("time_budget", time_budget, strict=True)
    lam = min(_LAMBDA, _LAMBDA_N / n) if lambda_ is None else lam
    ll = 0.1 * n if l is None else _check("l", l)
    return C, lam, tol, mu, inner_tol, ll


def _graph(M: Matrix, L: Any, W: Any, **kw: Any) -> tuple[Any, Any]:
    """(the sample graph, its normalised Laplacian): (None, ``L``) when given (checked), else the graph of
    :func:`dufs.methods.graph.sample_graph` (``W``, or built with the keywords ``kw``) and its Laplacian."""
    from dufs.methods.graph import sample_graph

    n = M.shape[0]
    if L is not None:
        if L.shape != (n, n):
            raise ParameterError(f"The 'L' parameter of m3fs_alternating must be {n} x {n}; got {L.shape}.")
        return None, L
    # the kNN graph of sparse data too on its unstandardized rows (graph_rows says why)
    Wg = sample_graph(graph_rows(M), W, **kw)
    return Wg, laplacian_operator(Wg, normed=True)


def _products(M: Matrix, L: Any, lam: float, k: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(L Z, L 1) for the manifold term, made once: L Z (one pass) for a dense L of n * n_features at most
    ``_LZ_MAX``, else L 1 alone for two clusters (every two-cluster v-step needs it), else neither."""
    n, d = M.shape
    LZ = L1 = None
    if isinstance(L, np.ndarray) and n * d <= _LZ_MAX and lam != 0:
        LZ = np.ascontiguousarray(M.rmatvec(np.ascontiguousarray(L.T)).T)  # (Z^T L^T)^T = L Z, one pass
        L1 = L @ np.ones(n)
    elif k == 2 and lam != 0:  # L 1, which every two-cluster v-step needs: made once
        L1 = np.asarray(L @ np.ones((n, 1)), dtype=np.float64).ravel()
    return LZ, L1


# ---------------------------------------------------------------------------------------------------- the method
def m3fs_alternating(M: Matrix, *, n_features: int, C: float = 1.0, lambda_: float | None = None, n_clusters: int = 2,
                     l: float | None = None, graph: str = "auto", W: Any = None, L: Any = None, n_neighbors: int = 5,
                     weights: str = "heat", n_anchors: int = 256, anchor_neighbors: int = 3, embed_dim: int = 64,
                     max_iter: int = 50, tol: float = 1e-4, smoothing: float = 1e-2, inner_tol: float = 1e-3,
                     inner_max_iter: int = 500, random_state: int = 0, init: Any = "spectral",
                     alternations: int = 10, dense_below: int = 3000, callback: Any = None,
                     polish: Any = "auto", max_passes: int | str | None = "auto",
                     time_budget: float = TIME_BUDGET) -> M3FSAlternatingResult:
    """M3FS by alternation (see the module docstring): labels, the v-step, the closed-form sigma-step, until the
    relative decrease of J_mu is below ``tol`` with the labels unchanged, ``max_iter`` iterations, or
    ``max_passes`` passes over the data (by default a budget from the data and the machine).

    Parameters
    ----------
    M : Matrix
        The data; its ``standardize`` is the paper's X (``"zscore"`` as in the faithful path).
    n_features : int
        m, the sum of sigma; ``selected`` holds the m features of largest sigma.
    C, lambda_ : float
        The hinge weight (C/n per sample) and the manifold weight of (6)/(14). ``lambda_`` = None (the default)
        is min(1e-2, 2 / n_samples): f^T L f is a sum over the samples while the hinge is averaged, so a fixed
        weight lets the manifold term take over as n grows (on a 200,000-row store with 4 planted clusters 1e-2
        put every sample in one cluster; at kddb size it would give the v-step a condition number of about 1e8),
        and on term counts the earlier min(1e-2, 20 / n) singled out a few documents (rcv1_small: 8 of 1,000
        in a cluster of their own; 2 / n: 265). On digits 1v7, 2v7, 3v8 and breast cancer, k-means accuracy on
        the selected features 1.00, 1.00, 0.95, 0.90 (1e-2: 1.00, 1.00, 0.95, 0.88; 1.0: 0.99, 1.00, 0.85,
        0.85); the faithful solver's 1e-4 suits its dense Gaussian graph.
    n_clusters : int
        M; 2 is problem (6) with its bias, more is (14).
    l : float, optional
        Class balance (see the module docstring); default 0.1 n (two clusters: |b| <= 0.1 under "zscore").
    graph, W, L, n_neighbors, weights, n_anchors, anchor_neighbors, embed_dim
        The sample graph: ``L`` (a normalised Laplacian: an n x n array, sparse matrix or LinearOperator, e.g. the
        faithful solver's :func:`dufs.methods.m3fs.problem.m3fs_laplacian`), ``W`` (a sparse n x n affinity or an
        :class:`AnchorGraph`) or built by :func:`dufs.methods.graph.sample_graph` (``"knn"``: exact kNN with
        heat weights; ``"anchor"``: the anchor graph, for large n_samples; ``"auto"``, the default: kNN up to
        50,000 samples, the anchor graph above), either of them on the unstandardized rows when M is sparse
        (:func:`dufs.engine.graphs.graph_rows`). Its normalised Laplacian is used.
    smoothing : float
        mu of the smoothed hinge; J_mu is within C mu / 2 of J.
    inner_tol, inner_max_iter : the v-solver's stopping rule (:func:`v_step`).
    alternations : int
        At most this many (v-step, sigma-step) pairs per iteration at fixed labels (until J_mu falls by less
        than ``tol``): the paper's CCCP subproblem (9)/(17), jointly convex in (v, b, sigma), by block descent.
    init : "spectral", "random" or labels (n_samples,)
        The first labels; ``"spectral"`` is the faithful solver's initialisation (dense below ``dense_below``
        samples, Lanczos above).
    callback : callable, optional
        ``callback(iteration, result_so_far_dict)`` after each iteration.
    max_passes : int, "auto" or None
        A budget of passes over the data (each v-solver iteration makes one to three): once it is spent the
        v-step under way returns its best point, the sigma-step runs, and the solver stops with
        ``diagnostics["converged"]`` False and ``diagnostics["stopped"]`` = "max_passes" (the selection is the
        current sigma's). ``"auto"`` (the default): ``time_budget`` seconds of passes at the speed measured over
        the solver's first passes, at least 50 (:mod:`dufs.methods.m3fs.budget`; ``diagnostics["budget"]``
        records the number chosen and why). None: no budget. A pass's time at kddb size: docs/measurements.md,
        "M3FS's alternation".
    time_budget : float
        Seconds of passes ``max_passes="auto"`` allows (the graph and the spectral start are outside it).
    polish : int or "auto"
        After the alternation, up to this many label flips are tried, each on the untried sample of smallest
        margin (|f_i|; multi-class: the gap between its two best scores, flipped to the runner-up), the alternation
        re-run warm from there and kept when J_mu goes down (``diagnostics["polish"]`` lists them). ``"auto"``: 8
        up to 5000 samples, else 0 (each trial costs a whole alternation's passes).

    References
    ----------
    Zhao et al., CVPR 2009, problems (6) and (14), CCCP step (9)/(17); docs/methods.md, "M3FS".
    """
    n, d = M.shape
    C, lam, tol, mu, inner_tol, ll = _checked(
        n, d, n_features=n_features, n_clusters=n_clusters, max_iter=max_iter, inner_max_iter=inner_max_iter,
        polish=polish, C=C, lambda_=lambda_, tol=tol, smoothing=smoothing, inner_tol=inner_tol, max_passes=max_passes,
        time_budget=time_budget, l=l)
    k = int(n_clusters)
    passes0, t0 = M.passes, time.perf_counter()
    Wg, Lop = _graph(M, L, W, graph=graph, n_neighbors=n_neighbors, weights=weights, n_anchors=n_anchors,
                     anchor_neighbors=anchor_neighbors, embed_dim=embed_dim, random_state=random_state)
    timings = {"graph": time.perf_counter() - t0}
    t0 = time.perf_counter()
    run = _Alternation(M, Lop, n_features, k, C, lam, ll, mu, tol, inner_tol, inner_max_iter, alternations, max_iter,
                       PassBudget(M, max_passes, time_budget), callback, _colsum(M), *_products(M, Lop, lam, k),
                       graph=Wg)
    lab = _init_labels(M, Lop, init, k, random_state, int(dense_below), Wg)
    timings["init"] = time.perf_counter() - t0
    return run.result(*run.solve(lab, polish), timings, passes0, Wg)


# ---------------------------------------------------------------------------------------------------- the alternation
class _Point(NamedTuple):
    """Where an alternation stopped: labels, sigma, V, b, the scores F, the Lipschitz estimate, J_mu, J and whether
    it converged."""

    lab: np.ndarray
    sigma: np.ndarray
    V: np.ndarray
    b: float
    F: np.ndarray
    Lip: float
    J: float
    Je: float
    converged: bool


@dataclass
class _Alternation:
    """:func:`m3fs_alternating`'s problem (the Laplacian ``L``, checked weights, ``colsum`` and the products L Z,
    L 1 made once) and rule, the v-step's state on the workers from one v-step to the next (``keep``) and the run's
    histories (J_mu, J, the iterations' records, inner iterations, seconds and passes per iteration)."""

    M: Matrix
    L: Any
    n_features: int
    k: int
    C: float
    lam: float
    l: float
    mu: float
    tol: float
    inner_tol: float
    inner_max_iter: int
    alternations: int
    max_iter: int
    budget: PassBudget
    callback: Any
    colsum: np.ndarray | None
    LZ: np.ndarray | None
    L1: np.ndarray | None
    graph: Any = None
    keep: dict = field(default_factory=dict)
    hist: list = field(default_factory=list)
    exact: list = field(default_factory=list)
    iters: list = field(default_factory=list)
    inner: list = field(default_factory=list)
    it_s: list = field(default_factory=list)
    it_passes: list = field(default_factory=list)
    # the main alternation's last iteration: the relative decrease of J_mu ("value") and the labels it changed
    last: dict = field(default_factory=dict)
    # where the last v-step kept its scores: "driver", "one worker" or "N pieces" (dufs.methods.m3fs.piece_scores)
    samples_side: str = "driver"

    @property
    def binary(self) -> bool:
        return self.k == 2

    def spent(self) -> bool:
        return self.budget.spent()

    def solve(self, lab: np.ndarray, polish: Any) -> tuple[_Point, list[dict]]:
        """The alternation from labels ``lab``, sigma = m / d and v = 0, then the label polishing; the v-step's
        state left on the workers is released at the end."""
        n, d = self.M.shape
        p = 1 if self.binary else self.k
        with one_blas_thread():
            try:
                self.budget.start()
                point, _ = self.alternate(lab, np.full(d, min(1.0, self.n_features / d)), np.zeros((d, p)), 0.0,
                                          np.zeros((n, p)), 1.0, 0)
                n_polish = (_POLISH if n <= _POLISH_MAX_N else 0) if polish == "auto" else int(polish)
                return self.polish(point, n_polish)
            finally:
                if self.keep.get("rd") is not None:
                    self.keep["rd"].release()
                client = current_client()
                if client is not None:  # what the v-steps kept on a worker (kept_scores) dropped there
                    flush(client)

    def alternate(self, lab: np.ndarray, sigma: np.ndarray, V: np.ndarray, b: float, F: np.ndarray, Lip: float,
                  it0: int) -> tuple[_Point, tuple]:
        """The alternation from labels ``lab`` and a warm (sigma, V, b) with its scores F = Z V + b; appends to
        the histories given ``it0`` >= 0, else keeps its own. Returns (the point reached, its history)."""
        own: tuple = ([], [], [], [], [], [])
        H = (self.hist, self.exact, self.iters, self.inner, self.it_s, self.it_passes) if it0 >= 0 else own
        converged = False
        J = Je = np.inf
        LF = None  # L F, once a v-step has returned it (two clusters): the next one and the objective need no product
        for it in range(int(self.max_iter)):
            if self.spent():
                break
            t1 = time.perf_counter()
            p1 = self.M.passes
            y = (2.0 * lab - 1.0) if self.binary else lab
            sigma, V, b, F, Lip, LF, J, Je, n_inner = self.cccp(y, sigma, V, b, F, Lip, LF, J, Je)
            new = (F[:, 0] >= 0).astype(np.int64) if self.binary else np.argmax(F, axis=1).astype(np.int64)
            changed = int((new != lab).sum())
            lab = new
            self._record(H, max(it0, 0) + it, J, Je, changed, n_inner, t1, p1)
            decrease = None if it == 0 else (H[0][-2] - J) / max(abs(J), 1e-300)
            if it0 >= 0:
                self.last = {"value": decrease, "labels_changed": changed}
            if changed == 0 and (it == 0 or H[0][-2] - J <= self.tol * max(abs(J), 1e-300)):
                converged = True
                break
        return _Point(lab, sigma, V, b, F, Lip, J, Je, converged), H

    def cccp(self, y: np.ndarray, sigma: np.ndarray, V: np.ndarray, b: float, F: np.ndarray, Lip: float,
             LF: np.ndarray | None, J: float, Je: float) -> tuple:
        """The CCCP step (9)/(17) at the labels ``y``: (v, b) and sigma alternate, at most ``alternations`` pairs,
        until J_mu falls by less than ``tol``. Returns (sigma, V, b, F, Lip, L F, J_mu, J, inner iterations)."""
        M, binary = self.M, self.binary
        n_inner = 0
        Jprev = np.inf
        for _ in range(int(self.alternations)):
            if n_inner and self.spent():
                break
            vs = v_step(M, sigma, y, self.L, C=self.C, lambda_=self.lam, l=self.l, smoothing=self.mu,
                        n_clusters=self.k, V0=V, b0=b, colsum=self.colsum, tol=self.inner_tol,
                        max_iter=int(self.inner_max_iter), lipschitz=Lip, LZ=self.LZ, L1=self.L1, stop=self.spent,
                        F0=F, value_rtol=_VALUE_RTOL * self.tol, keep=self.keep, LF0=LF, graph=self.graph)
            V, b, F, Lip, LF = vs["V"], vs["b"], vs["F"], vs["lipschitz"], vs["LF"]
            self.samples_side = vs["samples_side"]
            n_inner += vs["iterations"]
            sigma = np.asarray(sigma_step(V[:, 0] if binary else V.T, self.n_features), dtype=np.float64)
            J, Je = _objectives(F, V, sigma, self.L, C=self.C, lambda_=self.lam, smoothings=(self.mu, 0.0), LF=LF)
            done = Jprev - J <= self.tol * max(abs(J), 1e-300)
            Jprev = J
            if done:
                break
        return sigma, V, b, F, Lip, LF, J, Je, n_inner

    def _record(self, H: tuple, it: int, J: float, Je: float, changed: int, n_inner: int, t1: float,
                p1: int) -> None:
        """Iteration ``it``'s entries in the histories ``H``, its log line and the callback."""
        H[0].append(J)
        H[1].append(Je)
        H[3].append(n_inner)
        H[4].append(time.perf_counter() - t1)
        H[5].append(self.M.passes - p1)
        H[2].append({"iteration": it, "objective": J, "objective_exact": Je, "labels_changed": changed,
                     "inner_iterations": n_inner, "seconds": H[4][-1], "passes": H[5][-1]})
        log.info("m3fs_alternating: iteration %d, J_mu = %.6g (J = %.6g), %d labels changed, %d inner "
                 "iterations", it, J, Je, changed, n_inner)
        if self.callback is not None:
            self.callback(it, H[2][-1])

    def polish(self, point: _Point, n_polish: int) -> tuple[_Point, list[dict]]:
        """Label polishing: the alternation stops at a local minimum over the labels; a sample of smallest margin
        may belong to the other side (two local minima a label apart). Flip it, re-run the alternation warm, keep
        the result when J_mu goes down (so J_mu stays monotone over the whole run); up to ``n_polish`` flips."""
        polished: list[dict] = []
        tried: set[int] = set()
        for _ in range(n_polish):
            if self.spent():
                break
            F = point.F
            if self.binary:
                margin = np.abs(F[:, 0])
            else:
                top2 = np.sort(F, axis=1)[:, -2:]
                margin = top2[:, 1] - top2[:, 0]
            j = next((int(i) for i in np.argsort(margin, kind="stable") if int(i) not in tried), None)
            if j is None:
                break
            tried.add(j)
            lab2 = point.lab.copy()
            lab2[j] = 1 - lab2[j] if self.binary else int(np.argsort(F[j])[-2])
            trial, _ = self.alternate(lab2, point.sigma, point.V, point.b, F, point.Lip, -1)
            ok = trial.J < point.J - 1e-12 * max(abs(point.J), 1.0)
            polished.append({"sample": j, "margin": float(margin[j]), "objective": float(trial.J),
                             "objective_exact": float(trial.Je), "accepted": bool(ok)})
            if ok:
                point = trial
                self.hist.append(trial.J)
                self.exact.append(trial.Je)
                log.info("m3fs_alternating: flipping sample %d lowers J_mu to %.6g (J = %.6g)", j, trial.J, trial.Je)
        return point, polished

    def result(self, point: _Point, polished: list[dict], timings: dict, passes0: int,
               Wg: Any) -> M3FSAlternatingResult:
        """The result: the selection by sigma and the diagnostics."""
        sigma, converged, binary = point.sigma, point.converged, self.binary
        sel = ranked_head(sigma, self.n_features)  # by sigma, ties to the lower index (no d-sized sort on the driver)
        diag = {"iterations": len(self.iters), "converged": converged, "passes": self.M.passes - passes0,
                "passes_per_iteration": self.it_passes, "iteration_seconds": self.it_s,
                "inner_iterations": self.inner, "history": self.iters, "timings": timings, "lipschitz": point.Lip,
                "smoothing": self.mu, "l": self.l,
                "graph": "given L" if Wg is None else "anchor" if isinstance(Wg, AnchorGraph) else "knn",
                "n_clusters": self.k, "polish": polished, "lambda_": self.lam,
                "samples_side": self.samples_side,
                "stopped": "converged" if converged else "max_passes" if self.spent() else "max_iter",
                "budget": self.budget.record(),
                "convergence": {"measure": "relative decrease of J_mu", "value": None, "tol": self.tol,
                                "labels_changed": None, **self.last}}
        c = diag["convergence"]
        if converged:
            log.info("m3fs_alternating: converged after %d iterations and %d passes (relative decrease of J_mu %s "
                     "against tol %g; pass budget %s)", len(self.iters), diag["passes"],
                     "n/a" if c["value"] is None else f"{c['value']:.3g}", self.tol,
                     self.budget.limit if self.budget.limit is not None else "none")
        else:
            log.warning("m3fs_alternating: stopped by %s before converging (relative decrease of J_mu %s against tol "
                        "%g, %s labels changed in the last iteration; %s); the selection is the current "
                        "saliencies'", diag["stopped"], "n/a" if c["value"] is None else f"{c['value']:.3g}",
                        self.tol, c["labels_changed"],
                        f"{self.budget.limit} passes" if self.budget.limit is not None else "no pass budget")
        return M3FSAlternatingResult(sigma=sigma, labels=point.lab, selected=sel,
                                     v=point.V[:, 0] if binary else point.V, b=float(point.b), f=point.F,
                                     objective=np.array(self.hist), objective_exact=np.array(self.exact),
                                     diagnostics=diag)
