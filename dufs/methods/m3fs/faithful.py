"""M3FS, the faithful solver: unsupervised maximum margin feature selection with manifold regularisation
(Zhao, Kwok, Wang, Zhang, CVPR 2009; docs/methods.md, "M3FS"), two-class and multi-class.

Two-class (paper eqs. (7)-(12)). With f = X v + b 1 (X is n_samples x n_features here, the paper's X^T), the
problem is

    min 1/2 sum_k v_k^2 / sigma_k + C xi + lambda f^T L f
    s.t. for all c in {0,1}^n: 1/n sum_i c_i |f_i| >= 1/n sum_i c_i - xi,  xi >= 0,
         0 <= sigma_k <= 1, sum_k sigma_k = m,  -l <= sum_i f_i <= l.

Algorithm 1 (cutting plane) keeps a working set Omega of vectors c, adding the most violated one (Proposition 3:
c_i = 1 iff |f_i| < 1) until it is violated by at most epsilon (eq. (12); Proposition 4 then says
(v, b, sigma, xi + epsilon) is feasible for (7)). Algorithm 2 (CCCP) solves (7) over Omega: each step replaces
|f_i| by z_i f_i with z = sgn(f) at the previous point (problem (9)) and solves it as the SOCP (10) (cones
||[2 v_k; t_k - sigma_k]|| <= t_k + sigma_k and ||[2 R u; s - 1]|| <= s + 1 with R^T R = [X 1]^T L [X 1],
u = [v; b]) with CVXPY and Clarabel; it stops when the objective changes by less than alpha = 0.01 % (the
paper's value) or when the signs z repeat (then the next SOCP would be the same one: a CCCP fixed point).

Multi-class (eqs. (14)-(17)), M clusters, V = [v_1; ...; v_M] (M x n_features), F = X V^T, labels argmax_p F_ip:
the loss of sample i is max(0, 1 - (F_iy - max_{r != y} F_ir)) (Crammer-Singer), a constraint of (16) is a
choice c_i in {0, e_1, ..., e_M} per sample, the CCCP step (17) linearises max_p F_ip at the previous labels,
and the most violated constraint is Proposition 8's (c_i = e_r*, r* the runner-up, when the margin is < 1).

Saliencies ``sigma`` are the sigma step's closed form at the final v (:func:`sigma_step`; the SOCP's own sigma
agrees to solver accuracy but is not exactly sparse); the selected features are the ``n_features`` = m largest.

Departures from and readings of the paper (docs/methods.md, "M3FS"):

- The manifold identity in section 3.1 drops a factor 2 (sum_ij W_ij (f_i/sqrt(D_ii) - f_j/sqrt(D_jj))^2 =
  2 f^T L f); we use f^T L f as in (2), (6), (7), (9), i.e. the paper's lambda is half the lambda of the sum form.
- With the normalised L = I - D^-1/2 W D^-1/2, L 1 != 0, so the bias b enters the regulariser
  (X v + b 1)^T L (X v + b 1) and is shrunk by it; we keep that term exactly as written in (7) (two-class).
  The multi-class (14)-(17) has no bias at all; we keep that too.
- (16)-(17) reuse i (summed and quantified), use k for both features and the last unit vector (e_k should be
  e_M), and write c_i^T e_{z_ip} where (c_i^T e) z_ip is meant. We implement the constraint the derivation
  gives: 1/n sum_i [(c_i^T e) max_p F_ip - c_i^T F_i. + c_i^T z_i] >= 1/n sum_i c_i^T e - xi, whose convex
  part max_p F_ip the CCCP replaces by sum_p z_ip^(t) F_ip (the indicator term c_i^T z_i is held at z^(t)).
- Initialisation (Algorithm 2's (v^(0), b^(0))) is not specified. Ours is deterministic: spectral clustering
  on the same graph (two-class: the sign of D^-1/2 times the second eigenvector of L, split at its median;
  multi-class: k-means with ``random_state`` on the row-normalised M smallest eigenvectors), then a ridge
  least-squares fit of the +-1 (one-hot, centred) labels gives (v^(0), b^(0)). Algorithm 1's first master
  problem over an empty Omega has the trivial solution v = 0 (where sgn is 0), so we start the cutting plane
  from this point instead; every later master problem warm-starts CCCP from the previous solution.
- The class-balance bound l is not given; ``l=None`` means l = 0.1 n (with centred data the two-class bound
  reads |b| <= l / n, and the multi-class one is void). The Gaussian width rho is not given: ``sigma_width=None``
  takes the median pairwise distance; W has a zero diagonal.

References
----------
Zhao, Kwok, Wang, Zhang (2009), eqs. (7)-(17), Algorithms 1-2, Propositions 3, 4 and 8.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.linalg as sla

from dufs._logging import get_logger
from dufs.errors import DufsError, ParameterError
from dufs.methods.m3fs.problem import m3fs_laplacian, sigma_step

log = get_logger(__name__)
_ALPHA = 1e-4  # CCCP: stop when the objective changes by less than alpha = 0.01 % (the paper's value)


@dataclass
class M3FSResult:
    """Saliencies ``sigma`` (n_features,), the ``selected`` features (the m largest saliencies, largest first),
    cluster ``labels`` (0 .. n_clusters-1), ``v`` (n_features,) two-class or (n_clusters, n_features), the bias
    ``b`` (0.0 multi-class), ``xi``, the final ``objective`` of (7)/(16), and ``diagnostics``."""

    sigma: np.ndarray
    selected: np.ndarray
    labels: np.ndarray
    v: np.ndarray
    b: float
    xi: float
    objective: float
    diagnostics: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------ graph
def _cvxpy():
    try:
        import cvxpy as cp
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise DufsError("M3FS needs cvxpy (with the Clarabel solver) for its SOCP steps: "
                        "pip install 'dufs[m3fs]'") from e
    return cp


def _psd_factor(Q: np.ndarray) -> np.ndarray:
    """R with R^T R = Q (Q symmetric PSD up to rounding; negative eigenvalues clipped)."""
    w, U = np.linalg.eigh((Q + Q.T) / 2.0)
    w = np.maximum(w, 0.0)
    keep = w > w.max(initial=0.0) * 1e-14
    return (np.sqrt(w[keep])[:, None] * U[:, keep].T) if keep.any() else np.zeros((1, Q.shape[0]))


# ------------------------------------------------------------------------------------------------ the SOCP (10)
class _Master:
    """Problem (10) (two-class) or the SOCP form of (17) (multi-class) over a fixed working set; the CCCP signs
    enter only through the constraint matrix, a CVXPY parameter, so every CCCP step re-solves the compiled
    problem."""

    def __init__(self, n_omega: int, d: int, M: int, R: np.ndarray, s_bal: np.ndarray, n: int, C: float,
                 lam: float, m: float, l_: float):
        cp = _cvxpy()
        self.cp, self.M, self.d = cp, M, d
        two = M == 2
        self.two = two
        nv = d + 1 if two else M * d  # u = [v; b] or vec(V) (row-major: V[p, k] at p * d + k)
        self.u = cp.Variable(nv)
        self.sigma = cp.Variable(d)
        self.t = cp.Variable(d)
        self.s = cp.Variable()
        self.xi = cp.Variable()
        self.A = cp.Parameter((n_omega, nv))
        self.h = cp.Parameter(n_omega)
        if two:
            Vk = cp.reshape(self.u[:d], (1, d), order="C")
            Ru = R @ self.u
            total = s_bal @ self.u[:d] + n * self.u[d]
            bal = [total <= l_, total >= -l_]
        else:
            Vm = cp.reshape(self.u, (M, d), order="C")
            Vk = Vm
            Ru = cp.vec(R @ Vm.T, order="F")
            tot = Vm @ s_bal
            bal = [tot[p] - tot[q] <= l_ for p in range(M) for q in range(M) if p != q]
        cons = [
            self.A @ self.u >= self.h - self.xi,
            self.xi >= 0, self.sigma >= 0, self.sigma <= 1, cp.sum(self.sigma) == m,
            # ||[2 v_.k; t_k - sigma_k]|| <= t_k + sigma_k  (t_k >= ||v_.k||^2 / sigma_k)
            cp.SOC(self.t + self.sigma, cp.vstack([2 * Vk, cp.reshape(self.t - self.sigma, (1, d), order="C")]),
                   axis=0),
            # ||[2 R u; s - 1]|| <= s + 1  (s >= u^T Q u)
            cp.SOC(self.s + 1, cp.hstack([2 * Ru, cp.reshape(self.s - 1, (1,), order="C")])),
            *bal,
        ]
        self.inaccurate = 0
        self.prob = cp.Problem(cp.Minimize(0.5 * cp.sum(self.t) + C * self.xi + lam * self.s), cons)

    def solve(self, A: np.ndarray, h: np.ndarray) -> float:
        self.A.value = A
        self.h.value = h
        with warnings.catch_warnings():  # cvxpy warns on "optimal_inaccurate"; we count those instead
            warnings.simplefilter("ignore", UserWarning)
            try:
                self.prob.solve(solver="CLARABEL")
            except self.cp.error.SolverError:
                self.prob.solve(solver="SCS", eps=1e-9)
        self.inaccurate += self.prob.status == "optimal_inaccurate"
        if self.prob.status not in ("optimal", "optimal_inaccurate"):
            raise DufsError(f"M3FS: the SOCP step ended with status {self.prob.status!r}.")
        return float(self.prob.value)


# ------------------------------------------------------------------------------------------------ pieces
def _scores(X: np.ndarray, v: np.ndarray, b: float, M: int) -> np.ndarray:
    return X @ v + b if M == 2 else X @ v.T


def _labels_of(F: np.ndarray, M: int) -> np.ndarray:
    return (F > 0).astype(np.int64) if M == 2 else np.argmax(F, axis=1).astype(np.int64)


def _z(F: np.ndarray, M: int) -> np.ndarray:
    """CCCP signs: z = sgn(f) (0 taken as +1) two-class, the argmax labels multi-class."""
    return np.where(F >= 0, 1.0, -1.0) if M == 2 else np.argmax(F, axis=1)


def _runner_up(F: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(p*, r*): argmax and the argmax over the others, per row."""
    p = np.argmax(F, axis=1)
    G = F.copy()
    G[np.arange(F.shape[0]), p] = -np.inf
    return p, np.argmax(G, axis=1)


def most_violated(F: np.ndarray, M: int) -> tuple[np.ndarray, float]:
    """Proposition 3 (two-class: c_i = 1 iff |f_i| < 1, returned as 0/1) or Proposition 8 (multi-class: r*_i if
    F_ip* - F_ir* < 1 else -1), and the constraint's loss 1/n sum_i c_i (1 - margin_i) = the largest xi needed."""
    n = F.shape[0]
    if M == 2:
        c = (np.abs(F) < 1).astype(np.int64)
        return c, float(np.sum(c * (1 - np.abs(F)))) / n
    p, r = _runner_up(F)
    marg = F[np.arange(n), p] - F[np.arange(n), r]
    c = np.where(marg < 1, r, -1)
    return c, float(np.sum(np.maximum(0.0, 1 - marg))) / n


def _rows(X: np.ndarray, omega: list[np.ndarray], z: np.ndarray, M: int) -> tuple[np.ndarray, np.ndarray]:
    """The linearised constraints A u >= h - xi of (9)/(17) for the working set at the CCCP point z."""
    n, d = X.shape
    if M == 2:
        A = np.empty((len(omega), d + 1))
        h = np.empty(len(omega))
        for j, c in enumerate(omega):
            cz = c * z / n
            A[j, :d] = X.T @ cz
            A[j, d] = cz.sum()
            h[j] = c.sum() / n
        return A, h
    A = np.zeros((len(omega), M * d))
    h = np.empty(len(omega))
    for j, c in enumerate(omega):
        act = c >= 0
        coef = np.zeros((n, M))  # coefficient of F_ip: +1 at z_i, -1 at r_i, over the active samples
        idx = np.flatnonzero(act)
        coef[idx, z[idx]] += 1.0
        coef[idx, c[idx]] -= 1.0
        A[j] = (coef.T @ X).ravel() / n  # sum_i coef_ip x_i -> row p of the coefficient of V
        # constant term 1/n sum_i c_i^T z_i (1 where r_i == z_i), moved to the right-hand side
        h[j] = (act.sum() - np.sum(c[idx] == z[idx])) / n
    return A, h


def objective(X: np.ndarray, L: np.ndarray, v: np.ndarray, b: float, sigma: np.ndarray, xi: float, *, C: float,
              lambda_: float) -> float:
    """The objective of (7) (two-class, v 1-D) or (16) (multi-class, v of shape (M, d), b ignored):
    1/2 sum_k a_k / sigma_k + C xi + lambda (manifold term), with 0/0 = 0."""
    a = v * v if v.ndim == 1 else np.einsum("pk,pk->k", v, v)
    with np.errstate(divide="ignore", invalid="ignore"):
        reg = np.where(a > 0, a / sigma, 0.0).sum()
    if v.ndim == 1:
        f = X @ v + b
        man = float(f @ L @ f)
    else:
        F = X @ v.T
        man = float(np.einsum("ip,ip->", F, L @ F))
    return 0.5 * reg + C * xi + lambda_ * man


def _spectral_init(L: np.ndarray, M: int, random_state: int) -> np.ndarray:
    n = L.shape[0]
    w, U = sla.eigh((L + L.T) / 2.0, subset_by_index=[0, min(M, n) - 1])
    if M == 2:
        # D^-1/2 u2 is the relaxed normalised cut (Shi-Malik); the median split keeps the classes balanced
        # (the eigenvector of a normalised L already carries the D^1/2 weighting; the sign is all we use)
        e = U[:, 1]
        return (e > np.median(e)).astype(np.int64)
    from scipy.cluster.vq import kmeans2

    E = U / np.maximum(np.linalg.norm(U, axis=1, keepdims=True), 1e-12)
    rng = np.random.default_rng(random_state)
    best, best_in = None, np.inf
    for _ in range(10):
        cen, lab = kmeans2(E, M, minit="++", seed=rng)
        inertia = float(np.sum((E - cen[lab]) ** 2))
        if inertia < best_in and np.unique(lab).size == M:
            best, best_in = lab, inertia
    return best if best is not None else lab


def _ridge_fit(X: np.ndarray, labels: np.ndarray, M: int, ridge: float = 1e-3) -> tuple[np.ndarray, float]:
    n, d = X.shape
    mu = X.mean(axis=0)
    Xc = X - mu
    Y = np.where(labels == 1, 1.0, -1.0)[:, None] if M == 2 else np.eye(M)[labels] - 1.0 / M
    G = Xc.T @ Xc + ridge * n * np.eye(d)
    B = np.linalg.solve(G, Xc.T @ (Y - Y.mean(axis=0)))
    if M == 2:
        v = B[:, 0]
        return v, float(Y.mean() - mu @ v)
    return B.T.copy(), 0.0


def _check(name: str, value: Any, low: float, *, strict: bool, integer: bool = False,
           high: float | None = None) -> Any:
    ok = isinstance(value, int | np.integer) if integer else isinstance(value, int | float | np.floating | np.integer)
    ok = ok and not isinstance(value, bool) and np.isfinite(value)
    ok = ok and (value > low if strict else value >= low) and (high is None or value <= high)
    if not ok:
        kind = "an int" if integer else "a float"
        rng = f"{'>' if strict else '>='} {low:g}" + ("" if high is None else f" and <= {high:g}")
        raise ParameterError(f"The '{name}' parameter of m3fs_faithful must be {kind} {rng}; got {value!r}.")
    return int(value) if integer else float(value)


# ------------------------------------------------------------------------------------------------ the solver
def m3fs_faithful(X: Any, *, n_features: int, C: float = 1.0, lambda_: float = 1e-4,
                  l: float | None = None, epsilon: float = 1e-2, n_clusters: int = 2, graph: str = "gaussian",
                  n_neighbors: int = 10,
                  sigma_width: float | None = None, L: np.ndarray | None = None, max_cutting_planes: int = 200,
                  max_cccp: int = 50, random_state: int = 0) -> M3FSResult:
    """M3FS by the cutting plane (Algorithm 1) over CCCP (Algorithm 2) with SOCP steps (10)/(17).

    Parameters
    ----------
    X : array-like (n_samples, n_features), dense
        Moderate dimension (each SOCP has n_features (x n_clusters) variables). Standardise it beforehand if
        the features' scales differ; the solver uses it as given.
    n_features : int
        m: the budget sum_k sigma_k = m of eq. (4), and the number of features returned in ``selected``.
    C, lambda_ : float
        Loss weight and manifold weight of (7)/(16) (lambda multiplies f^T L f, see the module docstring). The
        paper gives neither. With z-scored data and the Gaussian graph, f^T L f grows with n while C xi <= C, so a
        large lambda makes the constant labelling (every sample in one cluster) the optimum: lambda_ = 1 and 0.1 did
        that on digits 1v7, 2v7, 3v8 and breast cancer. Our default 1e-4 reached k-means accuracies of 1.00, 1.00,
        0.97 and 0.90 there on the 10 (5) selected features (1e-3: 1.00, 1.00, 0.95, 0.90), and picked the 4 real
        features of standardised iris with 10 N(0, 1) noise columns, 3 clusters (1e-3 took a noise column).
    l : float, optional
        Class-balance bound of (5); default 0.1 n_samples.
    epsilon : float
        Cutting-plane tolerance of Algorithm 1 / eq. (12).
    n_clusters : int
        M; 2 runs the two-class algorithm (eqs. (7)-(12)), more the multi-class one (eqs. (16)-(17)).
    graph : "gaussian" or "knn"
        The fully connected Gaussian graph of the paper's experiments (dense) or a heat-kernel kNN graph with
        ``n_neighbors``; ignored when ``L`` is given.
    sigma_width : float, optional
        rho of the Gaussian graph, w_ij = exp(-||x_i - x_j||^2 / (2 rho^2)); default the median distance.
    L : ndarray (n_samples, n_samples), optional
        A precomputed (normalised) Laplacian.
    max_cutting_planes, max_cccp : int
        Caps on Algorithm 1's and Algorithm 2's iterations (hitting one is logged and recorded).
    random_state : int
        Seeds the k-means of the multi-class spectral initialisation.

    Returns
    -------
    M3FSResult
        ``diagnostics``: ``cutting_planes``, ``cccp_iterations`` (per master problem), ``objectives`` (per master
        problem), ``violations`` (of each newly found constraint), ``prop4_violation`` (the final most violated
        constraint's excess over xi + epsilon, <= 0 when Proposition 4 holds), ``converged``, ``stopped``
        ("converged" or "max_cutting_planes"), ``convergence`` (the last violation against epsilon), ``init_labels``,
        ``working_set`` (Omega: rows c, 0/1 two-class, r_i or -1 multi-class), ``last_z`` (the CCCP signs/labels of
        the last SOCP), ``cccp_capped`` / ``cccp_cycles`` (master problems whose CCCP hit ``max_cccp`` / revisited
        a sign pattern, which the held indicator term of (17) allows), ``inaccurate_socps``, ``socp_sigma``,
        ``l``, ``seconds``.

    References
    ----------
    Zhao, Kwok, Wang, Zhang (2009), Algorithms 1 and 2, eqs. (7)-(17), Propositions 3, 4 and 8.
    """
    t0 = time.perf_counter()
    X, L, m, M, C, lam, eps, l_, max_cp, max_cc = _checked(
        X, n_features=n_features, n_clusters=n_clusters, C=C, lambda_=lambda_, epsilon=epsilon, l=l,
        max_cutting_planes=max_cutting_planes, max_cccp=max_cccp, graph=graph, n_neighbors=n_neighbors,
        sigma_width=sigma_width, L=L)
    _cvxpy()
    run = _Faithful(X, L, M, C=C, lam=lam, m=m, l_=l_, random_state=random_state)
    run.cutting_plane(eps, max_cp, max_cc)
    return run.result(eps, t0)


def _checked(X: Any, *, n_features: Any, n_clusters: Any, C: Any, lambda_: Any, epsilon: Any, l: Any,
             max_cutting_planes: Any, max_cccp: Any, graph: str, n_neighbors: Any, sigma_width: Any,
             L: Any) -> tuple:
    """:func:`m3fs_faithful`'s parameters checked: (X as a float array, the Laplacian (given, or of the
    ``graph``), m, M, C, lambda_, epsilon, l (None: 0.1 n), max_cutting_planes, max_cccp)."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] < 2 or X.shape[1] < 1 or not np.all(np.isfinite(X)):
        raise ParameterError(f"The 'X' parameter of m3fs_faithful must be a finite 2-D array with at least 2 rows; "
                             f"got shape {X.shape}.")
    n, d = X.shape
    m = _check("n_features", n_features, 1, strict=False, integer=True, high=d)
    M = _check("n_clusters", n_clusters, 2, strict=False, integer=True, high=n)
    C = _check("C", C, 0.0, strict=True)
    lam = _check("lambda_", lambda_, 0.0, strict=False)
    eps = _check("epsilon", epsilon, 0.0, strict=True)
    l_ = 0.1 * n if l is None else _check("l", l, 0.0, strict=True)
    max_cp = _check("max_cutting_planes", max_cutting_planes, 1, strict=False, integer=True)
    max_cc = _check("max_cccp", max_cccp, 1, strict=False, integer=True)
    if L is None:
        if graph == "knn":
            _check("n_neighbors", n_neighbors, 1, strict=False, integer=True, high=n - 1)
        if sigma_width is not None:
            _check("sigma_width", sigma_width, 0.0, strict=True)
        L = m3fs_laplacian(X, graph=graph, n_neighbors=n_neighbors, sigma_width=sigma_width)
    else:
        L = np.asarray(L.toarray() if hasattr(L, "toarray") else L, dtype=np.float64)
        if L.shape != (n, n):
            raise ParameterError(f"The 'L' parameter of m3fs_faithful must be {n} x {n}; got {L.shape}.")
    return X, L, m, M, C, lam, eps, l_, max_cp, max_cc


class _Faithful:
    """Algorithm 1 over Algorithm 2 on one problem: the data, the factor R of the manifold term (R^T R =
    [X 1]^T L [X 1], or X^T L X multi-class), the balance's column sums, and the run's state: the working set
    Omega, the current (v, b, xi, sigma), the last master problem and the diagnostics."""

    def __init__(self, X: np.ndarray, L: np.ndarray, M: int, *, C: float, lam: float, m: int, l_: float,
                 random_state: int):
        n, d = X.shape
        self.X, self.L, self.M, self.C, self.lam, self.m, self.l_ = X, L, M, C, lam, m, l_
        Aug = np.hstack([X, np.ones((n, 1))]) if M == 2 else X
        self.R = _psd_factor(Aug.T @ (L @ Aug))
        self.s_bal = X.sum(axis=0)
        init = _spectral_init(L, M, random_state)
        self.v, self.b = _ridge_fit(X, init, M)
        self.omega: list[np.ndarray] = []
        self.xi = 0.0
        self.sigma = np.full(d, m / d)
        self.obj = np.nan
        self.diag: dict[str, Any] = {"cutting_planes": 0, "cccp_iterations": [], "objectives": [], "violations": [],
                                     "cccp_capped": 0, "cccp_cycles": 0, "inaccurate_socps": 0, "l": l_,
                                     "init_labels": init}
        self.converged = False
        self.master: _Master | None = None
        self.z_used = None

    def cutting_plane(self, eps: float, max_cp: int, max_cc: int) -> None:
        """Algorithm 1: the most violated constraint added to Omega and the master problem solved by CCCP, until
        none is violated by more than ``eps`` or ``max_cp`` constraints were added."""
        X, M, diag = self.X, self.M, self.diag
        n, d = X.shape
        for it in range(max_cp + 1):
            F = _scores(X, self.v, self.b, M)
            c, loss = most_violated(F, M)
            viol = loss - self.xi
            diag["violations"].append(viol)
            if viol <= eps:
                self.converged = True
                break
            if it == max_cp:
                break
            self.omega.append(c)
            if self.master is not None:
                diag["inaccurate_socps"] += self.master.inaccurate
            self.master = _Master(len(self.omega), d, M, self.R, self.s_bal, n, self.C, self.lam, self.m, self.l_)
            steps = self.cccp(F, max_cc, it)
            diag["cccp_iterations"].append(steps)
            diag["objectives"].append(self.obj)
            log.debug("M3FS cutting plane %d: violation %.4g, objective %.6g, %d CCCP steps", it + 1, viol, self.obj,
                      steps)
        if not self.converged:
            log.warning("M3FS: the cutting plane stopped at max_cutting_planes=%d, violation %.4g > epsilon %.4g",
                        max_cp, diag["violations"][-1], eps)

    def cccp(self, F: np.ndarray, max_cc: int, it: int) -> int:
        """Algorithm 2 on the master problem over Omega: SOCP steps (9)/(17) from the signs (labels) of ``F`` until
        the objective changes by less than alpha or the signs repeat (or cycle), ``max_cc`` steps at most; returns
        the steps made."""
        X, M, master, diag = self.X, self.M, self.master, self.diag
        d = X.shape[1]
        z = _z(F, M)
        prev = np.inf
        seen = {z.tobytes()}
        steps = 0
        for steps in range(1, max_cc + 1):  # noqa: B007 (the count is returned)
            A, h = _rows(X, self.omega, z, M)
            self.z_used = z
            self.obj = obj = master.solve(A, h)
            u = np.asarray(master.u.value)
            self.v, self.b = (u[:d].copy(), float(u[d])) if M == 2 else (u.reshape(M, d).copy(), 0.0)
            self.xi = max(float(master.xi.value), 0.0)
            self.sigma = np.clip(np.asarray(master.sigma.value), 0.0, 1.0)
            z_new = _z(_scores(X, self.v, self.b, M), M)
            if np.array_equal(z_new, z) or abs(prev - obj) <= _ALPHA * abs(obj):
                break
            if z_new.tobytes() in seen:  # multi-class: the held indicator term can make the signs cycle
                diag["cccp_cycles"] += 1
                break
            seen.add(z_new.tobytes())
            z, prev = z_new, obj
        else:
            diag["cccp_capped"] += 1
            log.info("M3FS: CCCP hit max_cccp=%d at cutting plane %d", max_cc, it + 1)
        return steps

    def result(self, eps: float, t0: float) -> M3FSResult:
        """The saliencies (the sigma step's closed form at the final v), the selection and the diagnostics."""
        X, M, diag, omega, v, b, xi = self.X, self.M, self.diag, self.omega, self.v, self.b, self.xi
        n = X.shape[0]
        F = _scores(X, v, b, M)
        _, loss = most_violated(F, M)
        if self.master is not None:
            diag["inaccurate_socps"] += self.master.inaccurate
        diag["cutting_planes"] = len(omega)
        diag["working_set"] = np.array(omega, dtype=np.int64).reshape(len(omega), n)
        diag["last_z"] = self.z_used if omega else None
        diag["prop4_violation"] = loss - (xi + eps)
        diag["converged"] = self.converged
        diag["stopped"] = "converged" if self.converged else "max_cutting_planes"
        diag["convergence"] = {"measure": "most violated constraint's excess over xi",
                               "value": float(diag["violations"][-1]), "tol": float(eps)}
        diag["socp_sigma"] = self.sigma
        diag["seconds"] = time.perf_counter() - t0
        sal = sigma_step(v, self.m)
        selected = np.argsort(-sal, kind="stable")[:self.m]
        log.info("M3FS: %d cutting planes, %d CCCP steps, objective %.6g, %.2f s", len(omega),
                 sum(diag["cccp_iterations"]), self.obj, diag["seconds"])
        return M3FSResult(sigma=sal, selected=selected, labels=_labels_of(F, M), v=v, b=b, xi=xi,
                          objective=objective(X, self.L, v, b, sal, xi, C=self.C, lambda_=self.lam) if omega
                          else float("nan"), diagnostics=diag)
