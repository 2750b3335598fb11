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
   (:func:`dufs.methods.m3fs.sigma_step`).

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
features kept on the workers (:mod:`dufs.methods.m3fs_resident`); the Laplacian is applied on the driver to
n_samples-vectors (the anchor graph's never forms n x n).

References
----------
Zhao, Kwok, Wang, Zhang, "Unsupervised Maximum Margin Feature Selection with Manifold Regularization", CVPR 2009,
problems (6), (9), (14), (17). Beck, Teboulle, "A Fast Iterative Shrinkage-Thresholding Algorithm", SIAM J.
Imaging Sci. 2009; O'Donoghue, Candes, "Adaptive restart for accelerated gradient schemes", FoCM 2015;
Nesterov, "Smooth minimization of non-smooth functions", Math. Program. 2005.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from dufs._logging import get_logger
from dufs.engine import Matrix
from dufs.engine.blocks import ranked_head
from dufs.engine.cluster import is_lost
from dufs.engine.graphs import AnchorGraph, graph_rows, laplacian_operator
from dufs.errors import ParameterError
from dufs.kernels.vstep import (
    axpy,
    fista_extrapolate,
    fista_gradient,
    fista_momentum,
    fista_trial,
    hinge_bias_slope,
    hinge_loss,
    hinge_manifold,
    scaled_start,
    sqrt_weights,
    start_dots,
    weighted_norm2,
)
from dufs.methods.m3fs import sigma_step
from dufs.methods.m3fs_resident import ResidentU, resident_partitions
from dufs.scheduling import one_blas_thread

log = get_logger(__name__)

__all__ = ["M3FSAlternatingResult", "m3fs_alternating", "objective", "v_step"]


# the v-step stops once _STALL iterations in a row have not lowered its best value by _STALL_REL of it: a warm start
# already at the optimum (a label-polishing trial, a last iteration whose labels did not change) has a first
# gradient-mapping norm so small that ``tol`` times it is below what floating point resolves, and ran all its
# ``max_iter`` iterations (500 of them, 1,072 passes, in each such v-step on 3000 samples)
_STALL, _STALL_REL = 10, 1e-13
# m3fs_alternating stops each v-step once it is provably within _VALUE_RTOL * tol of its optimum, relative (tol: the
# alternation's own): closer than that cannot change when the alternation stops. With the gradient mapping's
# relative rule alone (inner_tol) the v-steps of a 200K-row store ran 11-16 iterations, the last 4-6 of them
# lowering the value by less than 1e-8 of it
_VALUE_RTOL = 1e-3
_POLISH, _POLISH_MAX_N = 8, 5000  # polish="auto": label flips tried, up to this many samples
# a dense L (n x n) with n * n_features at most this: L Z is formed once (one pass), so that the manifold term's
# L f = (L Z) S^1/2 u + b L 1 costs n * n_features * p instead of n^2 * p per evaluation
_LZ_MAX = 1 << 22
_NONE = np.zeros(0)  # an empty array: "none" to the kernels (no balance vector, no gradient wanted)
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


# ---------------------------------------------------------------------------------------------------- losses
def _capped_simplex(A: np.ndarray) -> np.ndarray:
    """Row-wise Euclidean projection onto {alpha >= 0, 1^T alpha <= 1}."""
    P = np.maximum(A, 0.0)
    over = P.sum(axis=1) > 1.0
    if over.any():
        B = A[over]
        S = -np.sort(-B, axis=1)
        cs = np.cumsum(S, axis=1) - 1.0
        k = np.arange(1, B.shape[1] + 1)
        cond = S - cs / k > 0
        rho = B.shape[1] - 1 - np.argmax(cond[:, ::-1], axis=1)
        tau = cs[np.arange(B.shape[0]), rho] / (rho + 1)
        P[over] = np.maximum(B - tau[:, None], 0.0)
    return P


def _loss(F: np.ndarray, y: np.ndarray | None, mu: float, c: float) -> tuple[float, np.ndarray]:
    """c * sum_i hinge_mu (labels ``y``; None: the labels that minimise it, |f| / argmax) and its gradient in F.

    Two clusters: F (n, 1), y in {-1, +1}; M clusters: F (n, M), y in 0..M-1."""
    n, p = F.shape
    if p == 1:  # one sweep, the gradient its one n-vector (y None: an empty y, the labels sign(f))
        G = np.empty((n, 1))
        yv = np.zeros(0) if y is None else np.asarray(y, dtype=np.float64)
        return hinge_loss(F[:, 0], yv, float(mu), float(c), G[:, 0]), G
    lab = np.argmax(F, axis=1) if y is None else y
    rows = np.arange(n)
    A = 1.0 - F[rows, lab][:, None] + F
    A[rows, lab] = 0.0
    if mu > 0:
        B = A / mu
        B[rows, lab] = -1e18  # the own class never enters (it sorts last)
        al = _capped_simplex(B)
        al[rows, lab] = 0.0
        Af = A
        val = float((al * Af).sum() - 0.5 * mu * (al * al).sum())
    else:
        A[rows, lab] = -np.inf
        r = np.argmax(A, axis=1)
        top = A[rows, r]
        al = np.zeros_like(F)
        al[rows, r] = (top > 0).astype(np.float64)
        val = float(np.maximum(top, 0.0).sum())
    G = al.copy()
    G[rows, lab] = -al.sum(axis=1)
    return c * val, c * G


def _manifold(L: Any, F: np.ndarray, lam: float, LF: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    """lambda sum_p F_p^T L F_p and its gradient in F; ``LF`` = L F when the caller has it."""
    if lam == 0:
        return 0.0, np.zeros_like(F)
    if LF is None:
        LF = np.asarray(L @ F).reshape(F.shape)
    val = float(lam * np.vdot(F, LF))
    if not LF.flags.writeable or np.shares_memory(LF, F):
        LF = LF.copy()
    LF *= 2.0 * lam  # L F is this call's own array: scaled in place
    return val, LF


def objective(F: np.ndarray, V: np.ndarray, sigma: np.ndarray, L: Any, *, C: float, lambda_: float,
              smoothing: float = 0.0, y: np.ndarray | None = None) -> float:
    """J (``smoothing`` = 0, the paper's (6)/(14)) or J_mu at scores ``F`` (n, p) and weights ``V`` (d, p):
    1/2 sum ||V_k||^2 / sigma_k + C/n sum_i xi_i + lambda sum_p F_p^T L F_p (0/0 = 0; v_k != 0 at sigma_k = 0 is
    inf). With ``y`` the loss at those labels (the v-step's majoriser) instead of the best ones."""
    return _objectives(F, V, sigma, L, C=C, lambda_=lambda_, smoothings=(smoothing,), y=y)[0]


def _objectives(F: np.ndarray, V: np.ndarray, sigma: np.ndarray, L: Any, *, C: float, lambda_: float,
                smoothings: tuple[float, ...], y: np.ndarray | None = None, LF: np.ndarray | None = None
                ) -> list[float]:
    """:func:`objective` at each of ``smoothings``: the regulariser and the manifold term (a product with L)
    once."""
    total, bad = weighted_norm2(np.asarray(V, dtype=np.float64).reshape(V.shape[0], -1),
                                np.asarray(sigma, dtype=np.float64))
    if bad:
        return [float("inf")] * len(smoothings)
    reg = 0.5 * total
    if F.shape[1] == 1 and lambda_ != 0:  # two clusters: each loss and f^T L f in one sweep, no gradient
        LF = np.asarray(L @ F if LF is None else LF, dtype=np.float64).reshape(-1)
        yv = _NONE if y is None else np.asarray(y, dtype=np.float64)
        out = []
        for mu in smoothings:
            lv, fl = hinge_manifold(F[:, 0], yv, float(mu), C / F.shape[0], LF, float(lambda_), _NONE)
            out.append(reg + lv + float(lambda_ * fl))
        return out
    mv, _ = _manifold(L, F, lambda_)
    return [reg + _loss(F, y, mu, C / F.shape[0])[0] + mv for mu in smoothings]


# ---------------------------------------------------------------------------------------------------- v-step
class _Balance:
    """The class-balance constraint on (U, b) in u-space, a = S^1/2 s: two clusters |a^T u + n b| <= l (a slab),
    M clusters max_p a^T u_p - min_p a^T u_p <= l; Euclidean projection."""

    def __init__(self, a: np.ndarray | None, n: int, l: float, binary: bool):
        # a None is a = 0 (centred data): no vector over the features is kept (240 MB at kddb size)
        self.a, self.n, self.l, self.binary = a, float(n), float(l), binary
        self._aa: float | None = None

    @property
    def aa(self) -> float:
        """a^T a (made when first needed: the two-cluster v-step seldom projects)."""
        if self._aa is None:
            self._aa = 0.0 if self.a is None else float(self.a @ self.a)
        return self._aa

    def project(self, U: np.ndarray, b: float) -> tuple[np.ndarray, float]:
        if self.binary:
            c = (0.0 if self.a is None else float(self.a @ U[:, 0])) + self.n * b
            if abs(c) <= self.l:
                return U, b
            s = (c - np.clip(c, -self.l, self.l)) / (self.aa + self.n * self.n)
            return (U, b - s * self.n) if self.a is None else (U - s * self.a[:, None], b - s * self.n)
        if self.aa == 0:
            return U, b
        c = self.a @ U
        if c.max() - c.min() <= self.l:
            return U, b
        lo, hi = c.min() - self.l, c.max()
        for _ in range(100):  # phi'(t) = sum (t - c)_+ - (c - t - l)_+ is nondecreasing: bisection
            t = 0.5 * (lo + hi)
            g = np.maximum(t - c, 0.0).sum() - np.maximum(c - t - self.l, 0.0).sum()
            lo, hi = (t, hi) if g < 0 else (lo, t)
        t = 0.5 * (lo + hi)
        cn = np.clip(c, t, t + self.l)
        return U + np.outer(self.a, cn - c) / self.aa, b


def _best_bias(Fu: np.ndarray, y: np.ndarray, LG: np.ndarray | None, L1: np.ndarray | None, lam: float, c: float,
               mu: float, lo: float, hi: float, b: float) -> float:
    """The bias b in [lo, hi] minimising c sum_i hinge_mu(y_i (Fu_i + b)) + lam (Fu + b 1)^T L (Fu + b 1), given
    ``LG`` = L Fu and ``L1`` = L 1 (None when lam = 0): a convex piecewise-quadratic function of one variable,
    minimised by safeguarded Newton from ``b`` on its derivative (exact on each piece: a few sweeps over the n
    scores, no pass over the data)."""
    q1 = 2.0 * lam * float(L1 @ Fu) if lam != 0.0 else 0.0  # 2 lam 1^T L Fu (L symmetric)
    # 2 lam 1^T L 1, at least 0 (L is positive semidefinite): an anchor graph's L 1 is 0 but for rounding, and a
    # negative q2 of -1e-16 made the function concave
    q2 = max(2.0 * lam * float(L1.sum()), 0.0) if lam != 0.0 else 0.0
    # a derivative within rounding of its terms is 0: with balanced labels and scores near 0 (a first v-step) the
    # function is flat in b, and the rounding of 1^T L Fu alone (1e-21) walked b to the balance bound, which put
    # every score, and so every label, on one side (a 100,000-row store: one cluster at lambda_ = 1e-12, the
    # planted two at 0)
    noise = 1e-12 * (c * Fu.shape[0] + abs(q1))
    a_, b_ = float(lo), float(hi)
    b = min(max(float(b), a_), b_)
    for _ in range(200):
        ya, inside = hinge_bias_slope(Fu, y, b, mu)
        g = -c * ya + q1 + q2 * b
        if abs(g) <= noise + 1e-12 * abs(q2 * b):
            g = 0.0
        if (g >= 0.0 and b <= a_) or (g <= 0.0 and b >= b_) or g == 0.0:
            break  # at a bound the derivative points out of the interval, or a stationary point
        if g > 0.0:
            hi = b
        else:
            lo = b
        curv = (c * inside / mu if mu > 0.0 else 0.0) + q2
        # Newton's step; with no curvature (every score beyond the smoothed zone, no manifold term) the descent
        # direction alone
        nxt = b - g / curv if curv > 0.0 else (np.inf if g < 0.0 else -np.inf)
        if not lo < nxt < hi:
            # beyond the bracket: its end when that is a bound of the interval not tried yet (a best bias on the
            # balance bound, the usual case, is then found in two sweeps, not by bisecting the whole interval)
            nxt = hi if nxt >= hi == b_ != b else lo if nxt <= lo == a_ != b else None
        if nxt is None or not lo <= nxt <= hi or nxt == b:
            nxt = 0.5 * (lo + hi)
        if abs(nxt - b) <= 1e-15 * max(1.0, abs(b)):
            break
        b = nxt
    return b


def v_step(M: Matrix, sigma: np.ndarray, y: np.ndarray, L: Any, *, C: float, lambda_: float, l: float,
           smoothing: float, n_clusters: int = 2, V0: np.ndarray | None = None, b0: float = 0.0,
           colsum: np.ndarray | None = None, tol: float = 1e-6, max_iter: int = 1000,
           lipschitz: float = 1.0, LZ: np.ndarray | None = None, L1: np.ndarray | None = None,
           max_passes: int | None = None, F0: np.ndarray | None = None, value_rtol: float = 0.0,
           resident: bool = True, keep: dict | None = None, LF0: np.ndarray | None = None) -> dict:
    """The v-step: min over (v, b) of 1/2 sum_k ||v_k||^2 / sigma_k + C/n sum_i hinge_mu(y; f) +
    lambda sum_p f_p^T L f_p under the class balance, sigma and labels ``y`` fixed ({-1, +1} for
    ``n_clusters`` = 2, 0..M-1 otherwise), from ``V0`` ((d,) or (d, M)) and ``b0``.

    FISTA in u = S^-1/2 v with backtracking (the Lipschitz estimate may also fall by 10% a step), function-value
    restart and the balance projection (two clusters: the bias is minimised over exactly at every point, so FISTA
    runs on u alone); stops when the gradient mapping's norm G is at most ``tol`` times its first value, or when
    G^2 / 2, which bounds how far the value is above the optimum (the problem is 1-strongly convex in u), is at most
    ``value_rtol`` times the value (or the step changes nothing, or ten steps in a row have not lowered the best
    value), after ``max_iter``
    iterations at most, or once it has made ``max_passes`` passes over the data (the iteration under way finishes;
    its best point is returned). Returns a dict with V (d, p), b, F = Z v + b, the majoriser's value ``value``,
    ``iterations``, ``passes``, the final ``lipschitz``, ``resident`` (whether the vectors over the features
    stayed on the workers) and ``LF`` = L F (two clusters with a manifold term; else None).

    ``LZ`` = L Z (n, d) and ``L1`` = L 1, when given, replace the products L F of the manifold term by
    L F = LZ S^1/2 U + b L1 (for a dense L of small n: see ``_LZ_MAX``). ``F0``: the scores Z V0 + b0, when the
    caller has them (the last v-step's: the sigma-step leaves V as it is), saving the pass that computes them;
    ``LF0`` = L F0 with them (the last v-step's ``LF``), saving a product with L.

    ``resident``: with two clusters, no ``LZ`` and the blocks persisted on a distributed cluster, the vectors over
    the features stay on the workers beside their blocks and one call an iteration makes both of its products
    (:mod:`dufs.methods.m3fs_resident`); a worker lost meanwhile runs the v-step again from its start, the vectors
    on the driver. ``keep`` (a dict, the caller's): that state is left on the workers under ``keep["rd"]`` and the
    next v-step given the same dict and, as ``V0``, this one's V starts from it (the caller releases what is left
    there when done: ``keep["rd"].release()``)."""
    kw = dict(C=C, lambda_=lambda_, l=l, smoothing=smoothing, n_clusters=n_clusters, V0=V0, b0=b0, colsum=colsum,
              tol=tol, max_iter=max_iter, lipschitz=lipschitz, LZ=LZ, L1=L1, max_passes=max_passes, F0=F0,
              value_rtol=value_rtol, LF0=LF0)
    parts = resident_partitions(M) if resident and int(n_clusters) == 2 and (LZ is None or lambda_ == 0) \
        else None
    if parts is not None:
        try:
            return _v_step(M, sigma, y, L, parts=parts, keep=keep, **kw)
        except Exception as e:
            if not is_lost(e):
                raise
            log.warning("v_step: %s; the v-step again from its start, its vectors on the driver", e)
    return _v_step(M, sigma, y, L, parts=None, keep=None, **kw)


def _v_step(M: Matrix, sigma: np.ndarray, y: np.ndarray, L: Any, *, C: float, lambda_: float, l: float,
            smoothing: float, n_clusters: int, V0: np.ndarray | None, b0: float, colsum: np.ndarray | None,
            tol: float, max_iter: int, lipschitz: float, LZ: np.ndarray | None, L1: np.ndarray | None,
            max_passes: int | None, F0: np.ndarray | None, value_rtol: float, parts: list | None,
            keep: dict | None, LF0: np.ndarray | None) -> dict:
    """:func:`v_step`, its vectors over the features on the workers of ``parts`` (:class:`ResidentU`) or here."""
    n, d = M.shape
    V0_given = V0  # the caller's array (a state kept from the v-step that returned it starts from it)
    y = np.asarray(y)
    binary = int(n_clusters) == 2
    p = 1 if binary else int(n_clusters)
    yy = y.astype(np.float64) if binary else y.astype(np.int64)
    # sigma^1/2 and the balance's vector a = S^1/2 colsum in one sweep
    s_half = np.empty(d)
    a_bal = None if colsum is None else np.empty(d)
    sqrt_weights(np.ascontiguousarray(sigma, dtype=np.float64), _NONE if colsum is None else
                 np.ascontiguousarray(colsum, dtype=np.float64), s_half, _NONE if a_bal is None else a_bal)
    bal = _Balance(a_bal, n, l, binary)
    c = C / n
    off = False  # V0 has weight where sigma is 0
    # u on the workers: the driver needs only a^T u0 and ||u0||^2 of the start (made by start_dots, the same way
    # whether the workers make u0 from the state the last v-step left or get it shipped), and u0 itself only to
    # ship it or to compute its scores
    renew = parts is not None and keep is not None and keep.get("rd") is not None and \
        keep["rd"].fits(M, parts, V0_given, colsum)
    aU0 = uu0 = None
    if V0 is not None:
        V0 = np.asarray(V0, dtype=np.float64).reshape(d, p)
        if parts is not None:
            off, aU0, uu0 = start_dots(V0[:, 0], s_half, _NONE if bal.a is None else bal.a)
        U = None
        if not renew or off:
            U = np.empty((d, p))
            off = scaled_start(V0, s_half, U)  # V0 / s_half, 0 where sigma is
    else:
        U = np.zeros((d, p))
        if parts is not None:
            aU0 = uu0 = 0.0
    b = float(b0) if binary else 0.0
    projected_same = True
    if not binary:
        U2, b = bal.project(U, b)
        projected_same = U2 is U
        U = U2
    passes0 = M.passes

    def scores(U: np.ndarray, b: float) -> np.ndarray:
        Fv = M.matvec(s_half[:, None] * U).reshape(n, p)
        return Fv + b if binary else Fv

    LZs = None if LZ is None or lambda_ == 0 else LZ * s_half[None, :]

    L1v = None
    if binary and lambda_ != 0.0:
        L1v = np.asarray(L1 if L1 is not None else L @ np.ones((n, 1)), dtype=np.float64).ravel()

    a_vec = np.zeros(0) if bal.a is None else np.ascontiguousarray(bal.a, dtype=np.float64)

    def settle(U: np.ndarray, Fu: np.ndarray, b: float, aU: float | None = None, LFu: np.ndarray | None = None
               ) -> tuple[float, np.ndarray, np.ndarray | None]:
        """Two clusters: the bias is eliminated, min over b of J(u, b) (the balance constraint is an interval
        of b for every u), from ``Fu`` = Z S^1/2 u without it, starting at ``b``: (b, F = Fu + b, L F). FISTA
        then runs on phi(u) = min_b J(u, b), convex and as smooth (a partial minimisation), with the gradient
        below. With b a coordinate of the gradient step instead, a hinge linear in b (few scores within mu of the
        margin) made b walk to the balance bound by a fixed step an iteration: 8 of a v-step's 14 iterations on a
        200K-row store. ``aU``: a^T u, when the caller has it; ``LFu``: L Fu, when the caller has it (its own
        array: it becomes L F)."""
        LG = None
        if lambda_ != 0.0:
            if LFu is not None:
                LG = LFu
            else:
                LG = (LZs @ U)[:, 0] if LZs is not None else np.asarray(L @ Fu[:, None]).ravel()
        if aU is None:
            aU = 0.0 if bal.a is None else float(bal.a @ U[:, 0])
        b = _best_bias(Fu, yy, LG, L1v, lambda_, c, smoothing, (-bal.l - aU) / n, (bal.l - aU) / n, b)
        if not Fu.flags.writeable:  # a result as it came back from the cluster
            Fu = Fu.copy()
        Fu += b  # Fu is the caller's own array: it becomes F
        if LG is not None:
            axpy(b, L1v, LG)
        return b, Fu[:, None], None if LG is None else LG[:, None]

    def value(U: np.ndarray, b: float, F: np.ndarray, LF: np.ndarray | None = None, uu: float | None = None,
              grad: bool = True) -> tuple[float, np.ndarray | None]:
        """The majoriser's value at (U, b) with scores F and its gradient in F (None unless ``grad``); ``LF`` = L F
        when the caller has it (two clusters: kept, as the next momentum point's L F is made from it; more: used
        up)."""
        if binary and LF is not None and lambda_ != 0.0:  # two clusters: one sweep (dufs.kernels.vstep)
            G = np.empty((n, 1)) if grad else None
            lv, fl = hinge_manifold(F[:, 0], yy, float(smoothing), float(c), LF.reshape(-1), float(lambda_),
                                    _NONE if G is None else G[:, 0])
            return 0.5 * (float(np.vdot(U, U)) if uu is None else uu) + lv + lambda_ * fl, G
        lv, G = _loss(F, yy, smoothing, c)
        if LF is None and LZs is not None:  # M clusters (two clusters always come with L F: settle makes it)
            LF = LZs @ U
        mv, G2 = _manifold(L, F, lambda_, LF)
        G += G2  # _loss returns a fresh array; in place keeps one n x p array alive, not three
        return 0.5 * (float(np.vdot(U, U)) if uu is None else uu) + lv + mv, G

    # the caller's scores are those of U when V0 has no weight where sigma is 0 (U is zero there)
    warm = F0 is not None and V0 is not None and not off and projected_same
    if binary:
        if not warm and U is None:
            U = np.empty((d, p))
            scaled_start(V0, s_half, U)
        Fu = np.array(F0[:, 0] if F0.ndim == 2 else F0, dtype=np.float64) - float(b0) if warm \
            else scores(U, 0.0)[:, 0]
        LFu = None
        if warm and LF0 is not None and L1v is not None:  # L Fu = L F0 - b0 L 1, no product with L
            LFu = np.array(np.reshape(LF0, -1), dtype=np.float64)
            axpy(-float(b0), L1v, LFu)
        b, F, LF = settle(U, Fu, b, aU0, LFu)
        Fx = value(U, b, F, LF, uu0, grad=False)[0]
    else:
        F = np.array(F0, dtype=np.float64).reshape(n, p) if warm else scores(U, b)
        Fx = value(U, b, F)[0]
    x, xb, xF = U, b, F
    xp, xpb, xpF = U, b, F
    rd = None
    if parts is not None:  # u on the workers: the driver keeps a^T x and a^T x_prev (ax, axp) for a^T y
        ax = axp = aU0
        rd = keep.pop("rd", None) if keep is not None else None
        if renew:
            rd.renew(s_half)  # the last v-step's state: u0 made there from its u
        else:
            if rd is not None:
                rd.release()
            rd = ResidentU(M, U[:, 0], s_half, colsum, parts)
        x = xp = U = None
    # two clusters with a manifold term: L F at x and at xp (x is always the best point), so that L F at the
    # extrapolated point is extrapolated too (L is linear) instead of a product with L an iteration
    xLF = xpLF = LF if binary else None
    t = 1.0
    Lip = float(lipschitz)
    g0 = None
    it = 0
    best = (Fx, x, xb, xF)
    stalled = 0
    try:
        for it in range(1, int(max_iter) + 1):  # noqa: B007 (the count is returned)
            t_next = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * t * t))
            beta = (t - 1.0) / t_next  # Beck and Teboulle's momentum
            t = t_next
            # at kddb size a d-vector is 240 MB and an n-vector 154 MB: the updates below work in place so that the
            # loop holds x, xp, y, the gradient, the trial point and its step (and their scores), not their temporaries
            yb = xb + beta * (xb - xpb)
            LF = None
            if binary:  # fused sweeps (dufs.kernels.vstep); the best bias at the extrapolated point
                yF = np.empty((n, 1))
                yFu = yF[:, 0]
                fista_extrapolate(xF[:, 0], xpF[:, 0], beta, yb, _NONE, yFu)  # its scores less the extrapolated bias
                LFu = None
                if xLF is not None:  # L yFu = L xF + beta (L xF - L xpF) - yb L 1
                    LFu = np.empty(n)
                    fista_extrapolate(xLF[:, 0], xpLF[:, 0], beta, yb, L1v, LFu)
                if rd is None:
                    yU = np.empty((d, 1))
                    aY, uuY = fista_momentum(x[:, 0], xp[:, 0], beta, a_vec, yU[:, 0])
                else:  # y on the workers: a^T y from a^T x and a^T x_prev, ||y||^2 comes back with the step
                    yU, aY, uuY = None, (1.0 + beta) * ax - beta * axp, 0.0
                yb, yF, LF = settle(yU, yFu, yb, aY, LFu)
                Fy, R = value(yU, yb, yF, LF, uuY)
            else:
                yF = xF - xpF
                yF *= beta
                yF += xF
                yU = x - xp
                yU *= beta
                yU += x
                Fy, R = value(yU, yb, yF, LF)
            gb = float(R.sum()) if binary else 0.0  # dJ/db
            Lip *= 0.9
            if rd is not None:  # the gradient, the trial point and its scores: one call, one sweep of the data
                Fu, dots = rd.step(R, beta, gb, 1.0 / Lip)
                del R
                Fy += 0.5 * dots["uuY"]
                LFt = LyFu = None  # a retrial's L Fu, and the momentum point's L (yF - yb)
                while True:
                    nb, nF, nLF = settle(None, Fu, yb, dots["aN"], LFt)
                    Fn = value(None, nb, nF, nLF, dots["uuN"], grad=False)[0]
                    dd, gd = dots["dd"], dots["gd"]
                    if Fn <= Fy + gd + 0.5 * Lip * dd + 1e-12 * max(1.0, abs(Fy)):
                        break
                    Lip = _longer(Lip, Fn, Fy)
                    Fu = nF[:, 0]
                    Fu -= nb  # the trial's scores without the bias again
                    if nLF is not None:  # L Fu is affine in the step as Fu is (ResidentU.retrial): no product
                        if LyFu is None:
                            LyFu = np.array(LF[:, 0])
                            axpy(-yb, L1v, LyFu)
                        LFt = nLF[:, 0]
                        axpy(-nb, L1v, LFt)
                        LFt -= LyFu
                        LFt *= (1.0 / Lip) / rd.tried
                        LFt += LyFu
                    Fu, dots = rd.retrial(1.0 / Lip, Fu, yF[:, 0] - yb)
                    del nF, nLF
                nU = None
                del yF
            else:
                gU = M.rmatvec(R).reshape(d, p)
                del R
                if binary:
                    # phi's gradient (Danskin's theorem in beta = n b + a^T u, whose interval [-l, l] does not move
                    # with u): J's in u less dJ/db a / n, nonzero when the best bias sits on the balance bound
                    fista_gradient(gU[:, 0], s_half, yU[:, 0], a_vec, gb / n)
                else:
                    gU *= s_half[:, None]
                    gU += yU
                while True:
                    if binary:
                        nU, sv = np.empty((d, 1)), np.empty(d)
                        aN, uuN, dd, gd = fista_trial(gU[:, 0], yU[:, 0], s_half, a_vec, 1.0 / Lip, nU[:, 0], sv)
                        nb, nF, nLF = settle(nU, M.matvec(sv), yb, aN)
                        del sv
                        Fn = value(nU, nb, nF, nLF, uuN, grad=False)[0]
                    else:
                        nU = gU * (-1.0 / Lip)
                        nU += yU
                        nU, nb = bal.project(nU, 0.0)
                        nF, nLF = scores(nU, nb), None
                        Fn = value(nU, nb, nF)[0]
                        dU = nU - yU
                        dd = float(np.vdot(dU, dU))
                        gd = float(np.vdot(gU, dU))
                        del dU
                    quad = gd + 0.5 * Lip * dd
                    if Fn <= Fy + quad + 1e-12 * max(1.0, abs(Fy)):
                        break
                    del nU, nF, nLF
                    Lip = _longer(Lip, Fn, Fy)
                del yU, yF, gU
            gm = Lip * np.sqrt(dd)
            g0 = gm if g0 is None else g0
            stalled = stalled + 1 if Fn >= best[0] - _STALL_REL * max(1.0, abs(best[0])) else 0
            if Fn > best[0]:  # restart the momentum from the best point
                t = 1.0
                xp, xpb, xpF = best[1], best[2], best[3]
                x, xb, xF = best[1], best[2], best[3]
                xpLF = xLF
                if rd is not None:
                    rd.restart()
                    axp = ax
            else:
                xp, xpb, xpF = x, xb, xF
                x, xb, xF = nU, nb, nF
                best = (Fn, nU, nb, nF)
                if binary and xLF is not None:
                    xpLF, xLF = xLF, nLF
                if rd is not None:
                    rd.accept()
                    axp, ax = ax, dots["aN"]
            if gm <= tol * max(g0, 1e-300) or gm == 0.0 or stalled >= _STALL or \
                    0.5 * gm * gm <= value_rtol * abs(best[0]):
                break
            if max_passes is not None and M.passes - passes0 >= max_passes:
                break
    except BaseException:  # what the workers keep goes with the v-step that failed
        if rd is not None:
            with contextlib.suppress(Exception):
                rd.release()
        raise
    Fbest, U, b, F = best
    # v = S^1/2 u: made by the workers from their u (only v comes back), or here
    V = rd.result()[:, None] if rd is not None else s_half[:, None] * U
    if rd is not None:
        if keep is not None:  # left on the workers for the next v-step from this V
            rd.V = V
            keep["rd"] = rd
        else:
            rd.release()
    # x is the best point: xLF = L F at the F returned
    return {"V": V, "b": b, "F": F, "value": Fbest, "iterations": it, "passes": M.passes - passes0,
            "lipschitz": Lip, "resident": rd is not None, "LF": xLF if binary else None}


_LIP_MAX = 1e150  # a backtracking Lipschitz estimate past this: no step of FISTA's can lower the value


def _longer(Lip: float, Fn: float, Fy: float) -> float:
    """The backtracking's next Lipschitz estimate, twice ``Lip``; a FloatingPointError where no step can pass the
    test: the trial value ``Fn`` or the momentum point's ``Fy`` is NaN, or the estimate is past :data:`_LIP_MAX`
    (the step is then too small to move anything), where doubling it went on for ever."""
    if np.isnan(Fn) or np.isnan(Fy) or not Lip <= _LIP_MAX:
        raise FloatingPointError(f"m3fs v-step: backtracking found no step that lowers the objective (trial value "
                                 f"{Fn!r}, value at the momentum point {Fy!r}, Lipschitz estimate {Lip:.3g}): the "
                                 f"scores overflow or hold NaN; scale the data (standardize='scale') or check it "
                                 f"for NaN and very large values")
    return 2.0 * Lip


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
        from dufs.methods.m3fs import _spectral_init

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


#: Lanczos vectors of the spectral initialisation (ARPACK's default, 2k + 1, took minutes or did not converge on a
#: kNN graph's clustered spectrum: 48,842 one-hot rows)
_INIT_NCV = 20


def _lanczos_embedding(L: Any, graph: Any, k: int, random_state: int) -> np.ndarray:
    """The k eigenvectors of smallest eigenvalue (ascending) of the normalised Laplacian, by Lanczos on 2 I - L
    (never n x n). Of a sparse ``graph`` W (kNN), of its regularised form W + (tau / n) 1 1^T with tau its mean
    degree (Qin and Rohe, NIPS 2013): a kNN graph of data with repeated rows falls apart into components (220 for
    48,842 one-hot rows, k = 5), which make 0 an eigenvalue of L as many times, and Lanczos on that took over ten
    minutes to return an arbitrary mix of component indicators; tau joins them (the matrix-free rank-one term),
    and the second eigenvalue separates (0.39 there; 4 s). The objective keeps the graph's own L."""
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


# ---------------------------------------------------------------------------------------------------- the method
def m3fs_alternating(M: Matrix, *, n_features: int, C: float = 1.0, lambda_: float | None = None, n_clusters: int = 2,
                     l: float | None = None, graph: str = "auto", W: Any = None, L: Any = None, n_neighbors: int = 5,
                     weights: str = "heat", n_anchors: int = 256, anchor_neighbors: int = 3, embed_dim: int = 64,
                     max_iter: int = 50, tol: float = 1e-4, smoothing: float = 1e-2, inner_tol: float = 1e-3,
                     inner_max_iter: int = 500, random_state: int = 0, init: Any = "spectral",
                     alternations: int = 10, dense_below: int = 3000, callback: Any = None,
                     polish: Any = "auto", max_passes: int | None = None) -> M3FSAlternatingResult:
    """M3FS by alternation (see the module docstring): labels, the v-step, the closed-form sigma-step, until the
    relative decrease of J_mu is below ``tol`` with the labels unchanged, ``max_iter`` iterations, or
    ``max_passes`` passes over the data.

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
        faithful solver's :func:`dufs.methods.m3fs.m3fs_laplacian`), ``W`` (a sparse n x n affinity or an
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
    max_passes : int, optional
        A budget of passes over the data (each v-solver iteration makes two or three): once it is spent the
        v-step under way returns its best point, the sigma-step runs, and the solver stops with
        ``diagnostics["converged"]`` False and ``diagnostics["stopped"]`` = "max_passes" (the selection is the
        current sigma's). None: no budget. At kddb size a pass takes about 9 s.
    polish : int or "auto"
        After the alternation, up to this many label flips are tried, each on the untried sample of smallest
        margin (|f_i|; multi-class: the gap between its two best scores, flipped to the runner-up), the alternation
        re-run warm from there and kept when J_mu goes down (``diagnostics["polish"]`` lists them). ``"auto"``: 8
        up to 5000 samples, else 0 (each trial costs a whole alternation's passes).

    References
    ----------
    Zhao et al., CVPR 2009, problems (6) and (14), CCCP step (9)/(17); docs/methods.md, "M3FS".
    """
    from dufs.methods.graph import sample_graph

    n, d = M.shape
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
    if max_passes is not None and (not isinstance(max_passes, int | np.integer) or isinstance(max_passes, bool)
                                   or max_passes < 1):
        raise ParameterError(f"The 'max_passes' parameter of m3fs_alternating must be an int >= 1 or None; "
                             f"got {max_passes!r}.")
    lam = min(_LAMBDA, _LAMBDA_N / n) if lambda_ is None else lam
    ll = 0.1 * n if l is None else _check("l", l)
    k = int(n_clusters)
    binary = k == 2
    timings: dict[str, float] = {}
    passes0 = M.passes
    t0 = time.perf_counter()
    if L is not None:
        Wg = None
        Lop = L
        if Lop.shape != (n, n):
            raise ParameterError(f"The 'L' parameter of m3fs_alternating must be {n} x {n}; got {Lop.shape}.")
    else:
        # the kNN graph of sparse data too on its unstandardized rows: graph_rows says why, with the figures
        Wg = sample_graph(graph_rows(M), W, graph=graph, n_neighbors=n_neighbors, weights=weights,
                          n_anchors=n_anchors, anchor_neighbors=anchor_neighbors, embed_dim=embed_dim,
                          random_state=random_state)
        Lop = laplacian_operator(Wg, normed=True)
    timings["graph"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    colsum = _colsum(M)
    LZ = L1 = None
    if isinstance(Lop, np.ndarray) and n * d <= _LZ_MAX and lam != 0:
        LZ = np.ascontiguousarray(M.rmatvec(np.ascontiguousarray(Lop.T)).T)  # (Z^T L^T)^T = L Z, one pass
        L1 = Lop @ np.ones(n)
    elif k == 2 and lam != 0:  # L 1, which every two-cluster v-step needs: made once
        L1 = np.asarray(Lop @ np.ones((n, 1)), dtype=np.float64).ravel()
    lab = _init_labels(M, Lop, init, k, random_state, int(dense_below), Wg)
    timings["init"] = time.perf_counter() - t0
    p = 1 if binary else k
    hist, exact, iters, inner, it_s, it_passes = [], [], [], [], [], []

    def alternate(lab, sigma, V, b, F, Lip, it0):
        """The alternation from labels ``lab`` and a warm (sigma, V, b) with its scores F = Z V + b; appends to
        the histories given ``it0`` >= 0, else keeps its own. Returns (lab, sigma, V, b, F, Lip, J, Je,
        converged, its history)."""
        own = ([], [], [], [], [], [])
        H = (hist, exact, iters, inner, it_s, it_passes) if it0 >= 0 else own
        converged = False
        J = Je = np.inf
        LF = None  # L F, once a v-step has returned it (two clusters): the next one and the objective need no product
        for it in range(int(max_iter)):
            if spent():
                break
            t1 = time.perf_counter()
            p1 = M.passes
            y = (2.0 * lab - 1.0) if binary else lab
            n_inner = 0
            Jprev = np.inf
            for _ in range(int(alternations)):  # the CCCP step (9)/(17): (v, b) and sigma alternate, labels fixed
                if n_inner and spent():
                    break
                left = None if max_passes is None else max(1, int(max_passes) - (M.passes - solve0))
                vs = v_step(M, sigma, y, Lop, C=C, lambda_=lam, l=ll, smoothing=mu, n_clusters=k, V0=V, b0=b,
                            colsum=colsum, tol=inner_tol, max_iter=int(inner_max_iter), lipschitz=Lip, LZ=LZ,
                            L1=L1, max_passes=left, F0=F, value_rtol=_VALUE_RTOL * tol, keep=keep, LF0=LF)
                V, b, F, Lip, LF = vs["V"], vs["b"], vs["F"], vs["lipschitz"], vs["LF"]
                n_inner += vs["iterations"]
                sigma = np.asarray(sigma_step(V[:, 0] if binary else V.T, n_features), dtype=np.float64)
                J, Je = _objectives(F, V, sigma, Lop, C=C, lambda_=lam, smoothings=(mu, 0.0), LF=LF)
                done = Jprev - J <= tol * max(abs(J), 1e-300)
                Jprev = J
                if done:
                    break
            new = (F[:, 0] >= 0).astype(np.int64) if binary else np.argmax(F, axis=1).astype(np.int64)
            changed = int((new != lab).sum())
            lab = new
            H[0].append(J)
            H[1].append(Je)
            H[3].append(n_inner)
            H[4].append(time.perf_counter() - t1)
            H[5].append(M.passes - p1)
            H[2].append({"iteration": max(it0, 0) + it, "objective": J, "objective_exact": Je,
                         "labels_changed": changed, "inner_iterations": n_inner, "seconds": H[4][-1],
                         "passes": H[5][-1]})
            log.info("m3fs_alternating: iteration %d, J_mu = %.6g (J = %.6g), %d labels changed, %d inner "
                     "iterations", max(it0, 0) + it, J, Je, changed, n_inner)
            if callback is not None:
                callback(max(it0, 0) + it, H[2][-1])
            if changed == 0 and (it == 0 or H[0][-2] - J <= tol * max(abs(J), 1e-300)):
                converged = True
                break
        return lab, sigma, V, b, F, Lip, J, Je, converged, H

    def spent() -> bool:
        return max_passes is not None and M.passes - solve0 >= int(max_passes)

    keep: dict = {}  # the two-cluster v-step's state on the workers, from one v-step to the next
    with one_blas_thread():
        try:
            solve0 = M.passes
            lab, sigma, V, b, F, Lip, J, Je, converged, _ = alternate(lab, np.full(d, min(1.0, n_features / d)),
                                                                       np.zeros((d, p)), 0.0, np.zeros((n, p)), 1.0, 0)
            # label polishing: the alternation stops at a local minimum over the labels; a sample of smallest margin may
            # belong to the other side (two local minima a label apart). Flip it, re-run the alternation warm, keep the
            # result when J_mu goes down (so J_mu stays monotone over the whole run).
            n_polish = (_POLISH if n <= _POLISH_MAX_N else 0) if polish == "auto" else int(polish)
            polished: list[dict] = []
            tried: set[int] = set()
            for _ in range(n_polish):
                if spent():
                    break
                if binary:
                    margin = np.abs(F[:, 0])
                else:
                    top2 = np.sort(F, axis=1)[:, -2:]
                    margin = top2[:, 1] - top2[:, 0]
                j = next((int(i) for i in np.argsort(margin, kind="stable") if int(i) not in tried), None)
                if j is None:
                    break
                tried.add(j)
                lab2 = lab.copy()
                lab2[j] = 1 - lab2[j] if binary else int(np.argsort(F[j])[-2])
                trial = alternate(lab2, sigma, V, b, F, Lip, -1)
                ok = trial[6] < J - 1e-12 * max(abs(J), 1.0)
                polished.append({"sample": j, "margin": float(margin[j]), "objective": float(trial[6]),
                                 "objective_exact": float(trial[7]), "accepted": bool(ok)})
                if ok:
                    lab, sigma, V, b, F, Lip, J, Je, converged, _ = trial
                    hist.append(J)
                    exact.append(Je)
                    log.info("m3fs_alternating: flipping sample %d lowers J_mu to %.6g (J = %.6g)", j, J, Je)
        finally:
            if keep.get("rd") is not None:
                keep["rd"].release()
    sel = ranked_head(sigma, n_features)  # by sigma, ties to the lower index (no d-sized sort on the driver)
    diag = {"iterations": len(iters), "converged": converged, "passes": M.passes - passes0,
            "passes_per_iteration": it_passes, "iteration_seconds": it_s, "inner_iterations": inner,
            "history": iters, "timings": timings, "lipschitz": Lip, "smoothing": mu, "l": ll,
            "graph": "given L" if Wg is None else "anchor" if isinstance(Wg, AnchorGraph) else "knn",
            "n_clusters": k, "polish": polished, "lambda_": lam,
            "stopped": "converged" if converged else "max_passes" if spent() else "max_iter"}
    if not converged and spent():
        log.warning("m3fs_alternating: stopped after its budget of max_passes = %d passes before converging; the "
                    "selection is the current saliencies'", int(max_passes))
    return M3FSAlternatingResult(sigma=sigma, labels=lab, selected=sel, v=V[:, 0] if binary else V, b=float(b), f=F,
                                 objective=np.array(hist), objective_exact=np.array(exact), diagnostics=diag)
