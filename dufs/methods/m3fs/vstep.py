"""M3FS's v-step (docs/methods.md, "M3FS"): the Laplacian-regularised smoothed-hinge problem in v (and b) with
sigma and the labels fixed, its objectives, the class-balance projection, and where the v-step runs (its vectors
over the features here or on the workers); the accelerated projected gradient that solves it is
:mod:`dufs.methods.m3fs.fista`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dufs._logging import get_logger
from dufs.engine import Matrix, current_client, is_lost, kept_vectors
from dufs.kernels.vstep import (
    axpy,
    hinge_bias_slope,
    hinge_loss,
    hinge_manifold,
    scaled_start,
    sqrt_weights,
    start_dots,
    weighted_norm2,
)
from dufs.methods.m3fs.fista import _State, fista
from dufs.methods.m3fs.piece_scores import kept_side
from dufs.methods.m3fs.resident import ResidentU, resident_partitions

log = get_logger(__name__)

_NONE = np.zeros(0)  # an empty array: "none" to the kernels (no balance vector, no gradient wanted)


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
               mu: float, lo: float, hi: float, b: float, allsum: Any = None, n: int | None = None) -> float:
    """The bias b in [lo, hi] minimising c sum_i hinge_mu(y_i (Fu_i + b)) + lam (Fu + b 1)^T L (Fu + b 1), given
    ``LG`` = L Fu and ``L1`` = L 1 (None when lam = 0): a convex piecewise-quadratic function of one variable,
    minimised by safeguarded Newton from ``b`` on its derivative (exact on each piece: a few sweeps over the n
    scores, no pass over the data). ``allsum``: where the scores are a piece of the rows (of ``n``), the sums over
    the samples all-reduced with the other pieces' (:mod:`dufs.methods.m3fs.piece_scores`), so that every piece
    takes the same steps to the same bias."""
    q1 = q2 = 0.0
    if lam != 0.0:
        u1, l1 = float(L1 @ Fu), float(L1.sum())
        if allsum is not None:
            u1, l1 = allsum(np.array([u1, l1]))
        q1 = 2.0 * lam * u1  # 2 lam 1^T L Fu (L symmetric)
        # 2 lam 1^T L 1, at least 0 (L is positive semidefinite): an anchor graph's L 1 is 0 but for rounding, and
        # a negative q2 of -1e-16 made the function concave
        q2 = max(2.0 * lam * l1, 0.0)
    # a derivative within rounding of its terms is 0: with balanced labels and scores near 0 (a first v-step) the
    # function is flat in b, and the rounding of 1^T L Fu alone (1e-21) walked b to the balance bound, which put
    # every score, and so every label, on one side (a 100,000-row store: one cluster at lambda_ = 1e-12, the
    # planted two at 0)
    noise = 1e-12 * (c * (Fu.shape[0] if n is None else n) + abs(q1))
    a_, b_ = float(lo), float(hi)
    b = min(max(float(b), a_), b_)
    for _ in range(200):
        ya, inside = hinge_bias_slope(Fu, y, b, mu)
        if allsum is not None:
            ya, inside = allsum(np.array([ya, inside], dtype=np.float64))
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


@dataclass(frozen=True)
class _VArgs:
    """:func:`v_step`'s keywords: the problem's weights, the start (and what the caller has made already for it)
    and the stopping rule."""

    C: float
    lambda_: float
    l: float
    smoothing: float
    n_clusters: int
    V0: np.ndarray | None
    b0: float
    colsum: np.ndarray | None
    tol: float
    max_iter: int
    lipschitz: float
    LZ: np.ndarray | None
    L1: np.ndarray | None
    max_passes: int | None
    F0: np.ndarray | None
    value_rtol: float
    LF0: np.ndarray | None
    stop: Callable[[], bool] | None = None


class _VProblem:
    """The v-step's problem in u = S^-1/2 v, sigma and the labels fixed: the data, the weights, the balance, and
    the scores, the bias's elimination (two clusters) and the majoriser's value and gradient at a point."""

    def __init__(self, M: Matrix, sigma: np.ndarray, y: np.ndarray, L: Any, a: _VArgs):
        n, d = M.shape
        self.M, self.L, self.n, self.d = M, L, n, d
        y = np.asarray(y)
        self.binary = binary = int(a.n_clusters) == 2
        self.p = 1 if binary else int(a.n_clusters)
        self.yy = y.astype(np.float64) if binary else y.astype(np.int64)
        # sigma^1/2 and the balance's vector a = S^1/2 colsum in one sweep
        self.s_half = np.empty(d)
        a_bal = None if a.colsum is None else np.empty(d)
        sqrt_weights(np.ascontiguousarray(sigma, dtype=np.float64), _NONE if a.colsum is None else
                     np.ascontiguousarray(a.colsum, dtype=np.float64), self.s_half, _NONE if a_bal is None else a_bal)
        self.bal = _Balance(a_bal, n, a.l, binary)
        self.c, self.lambda_, self.smoothing = a.C / n, a.lambda_, a.smoothing
        self.LZs = None if a.LZ is None or a.lambda_ == 0 else a.LZ * self.s_half[None, :]
        self.L1v = None
        if binary and a.lambda_ != 0.0:
            self.L1v = np.asarray(a.L1 if a.L1 is not None else L @ np.ones((n, 1)), dtype=np.float64).ravel()
        self.a_vec = np.zeros(0) if self.bal.a is None else np.ascontiguousarray(self.bal.a, dtype=np.float64)
        self.allsum: Any = None  # the all-reduce of sums over the samples, where the scores are a piece of the rows

    @classmethod
    def samples(cls, yy: np.ndarray, L1v: np.ndarray | None, L: Any, *, c: float, lambda_: float, smoothing: float,
                l: float, n: int | None = None) -> _VProblem:
        """The two-cluster problem's side over the samples alone (no data, no vectors over the features): what
        :meth:`settle` and :meth:`value` need given a^T u, ||u||^2 and the scores, on the worker that keeps them
        (:mod:`dufs.methods.m3fs.kept_scores`), or on each of the workers that keep a piece of their rows (``n``
        the samples of all pieces; :attr:`allsum` then set for each call: :mod:`dufs.methods.m3fs.piece_scores`)."""
        self = cls.__new__(cls)
        n = yy.shape[0] if n is None else int(n)
        self.allsum = None
        self.M, self.L, self.n, self.d, self.binary, self.p, self.yy = None, L, n, 0, True, 1, yy
        self.s_half, self.bal, self.a_vec, self.LZs, self.L1v = None, _Balance(None, n, l, True), _NONE, None, L1v
        self.c, self.lambda_, self.smoothing = c, lambda_, smoothing
        return self

    def scores(self, U: np.ndarray, b: float) -> np.ndarray:
        """F = Z S^1/2 U (+ b, two clusters): a pass over the data."""
        Fv = self.M.matvec(self.s_half[:, None] * U).reshape(self.n, self.p)
        return Fv + b if self.binary else Fv

    def settle(self, U: np.ndarray | None, Fu: np.ndarray, b: float, aU: float | None = None,
               LFu: np.ndarray | None = None) -> tuple[float, np.ndarray, np.ndarray | None]:
        """Two clusters: the bias is eliminated, min over b of J(u, b) (the balance constraint is an interval
        of b for every u), from ``Fu`` = Z S^1/2 u without it, starting at ``b``: (b, F = Fu + b, L F). FISTA
        then runs on phi(u) = min_b J(u, b), convex and as smooth (a partial minimisation), with the gradient
        of :mod:`dufs.methods.m3fs.fista`. With b a coordinate of the gradient step instead, a hinge linear in b
        (few scores within mu of the margin) made b walk to the balance bound by a fixed step an iteration: 8 of a
        v-step's 14 iterations on a 200K-row store. ``aU``: a^T u, when the caller has it; ``LFu``: L Fu, when the
        caller has it (its own array: it becomes L F)."""
        lambda_, bal, n = self.lambda_, self.bal, self.n
        LG = None
        if lambda_ != 0.0:
            if LFu is not None:
                LG = LFu
            else:
                LG = (self.LZs @ U)[:, 0] if self.LZs is not None else np.asarray(self.L @ Fu[:, None]).ravel()
        if aU is None:
            aU = 0.0 if bal.a is None else float(bal.a @ U[:, 0])
        b = _best_bias(Fu, self.yy, LG, self.L1v, lambda_, self.c, self.smoothing, (-bal.l - aU) / n,
                       (bal.l - aU) / n, b, self.allsum, n)
        if not Fu.flags.writeable:  # a result as it came back from the cluster
            Fu = Fu.copy()
        Fu += b  # Fu is the caller's own array: it becomes F
        if LG is not None:
            axpy(b, self.L1v, LG)
        return b, Fu[:, None], None if LG is None else LG[:, None]

    def value(self, U: np.ndarray | None, b: float, F: np.ndarray, LF: np.ndarray | None = None,
              uu: float | None = None, grad: bool = True) -> tuple[float, np.ndarray | None]:
        """The majoriser's value at (U, b) with scores F and its gradient in F (None unless ``grad``); ``LF`` = L F
        when the caller has it (two clusters: kept, as the next momentum point's L F is made from it; more: used
        up); ``uu`` = ||U||^2 when the caller has it."""
        lambda_ = self.lambda_
        if self.binary and LF is not None and lambda_ != 0.0:  # two clusters: one sweep (dufs.kernels.vstep)
            G = np.empty((F.shape[0], 1)) if grad else None
            lv, fl = hinge_manifold(F[:, 0], self.yy, float(self.smoothing), float(self.c), LF.reshape(-1),
                                    float(lambda_), _NONE if G is None else G[:, 0])
            if self.allsum is not None:
                lv, fl = self.allsum(np.array([lv, fl]))
            return 0.5 * (float(np.vdot(U, U)) if uu is None else uu) + lv + lambda_ * fl, G
        lv, G = _loss(F, self.yy, self.smoothing, self.c)
        if LF is None and self.LZs is not None:  # M clusters (two clusters always come with L F: settle makes it)
            LF = self.LZs @ U
        mv, G2 = _manifold(self.L, F, lambda_, LF)
        if self.allsum is not None:
            lv, mv = self.allsum(np.array([lv, mv]))
        G += G2  # _loss returns a fresh array; in place keeps one n x p array alive, not three
        return 0.5 * (float(np.vdot(U, U)) if uu is None else uu) + lv + mv, G


def v_step(M: Matrix, sigma: np.ndarray, y: np.ndarray, L: Any, *, C: float, lambda_: float, l: float,
           smoothing: float, n_clusters: int = 2, V0: np.ndarray | None = None, b0: float = 0.0,
           colsum: np.ndarray | None = None, tol: float = 1e-6, max_iter: int = 1000,
           lipschitz: float = 1.0, LZ: np.ndarray | None = None, L1: np.ndarray | None = None,
           max_passes: int | None = None, F0: np.ndarray | None = None, value_rtol: float = 0.0,
           resident: bool = True, keep: dict | None = None, LF0: np.ndarray | None = None,
           graph: Any = None, stop: Callable[[], bool] | None = None) -> dict:
    """The v-step: min over (v, b) of 1/2 sum_k ||v_k||^2 / sigma_k + C/n sum_i hinge_mu(y; f) +
    lambda sum_p f_p^T L f_p under the class balance, sigma and labels ``y`` fixed ({-1, +1} for
    ``n_clusters`` = 2, 0..M-1 otherwise), from ``V0`` ((d,) or (d, M)) and ``b0``.

    FISTA in u = S^-1/2 v with backtracking (the Lipschitz estimate may also fall by 10% a step), function-value
    restart and the balance projection (two clusters: the bias is minimised over exactly at every point, so FISTA
    runs on u alone); stops when the gradient mapping's norm G is at most ``tol`` times its first value, or when
    G^2 / 2, which bounds how far the value is above the optimum (the problem is 1-strongly convex in u), is at most
    ``value_rtol`` times the value (or the step changes nothing, or ten steps in a row have not lowered the best
    value), after ``max_iter`` iterations at most, or once it has made ``max_passes`` passes over the data or
    ``stop()`` (asked after each iteration: the caller's budget) says so (the iteration under way finishes; its
    best point is returned). Returns a dict with V (d, p), b, F = Z v + b, the majoriser's value ``value``,
    ``iterations``, ``passes``, the final ``lipschitz``, ``resident`` (whether the vectors over the features
    stayed on the workers) and ``LF`` = L F (two clusters with a manifold term; else None).

    ``LZ`` = L Z (n, d) and ``L1`` = L 1, when given, replace the products L F of the manifold term by
    L F = LZ S^1/2 U + b L1 (for a dense L of small n: see ``_LZ_MAX``). ``F0``: the scores Z V0 + b0, when the
    caller has them (the last v-step's: the sigma-step leaves V as it is), saving the pass that computes them;
    ``LF0`` = L F0 with them (the last v-step's ``LF``), saving a product with L.

    ``resident``: with two clusters, no ``LZ`` and the blocks persisted on a distributed cluster, the vectors over
    the features stay on the workers beside their blocks and one call an iteration makes both of its products
    (:mod:`dufs.methods.m3fs.resident`); a worker lost meanwhile runs the v-step again from its start, the vectors
    on the driver. ``keep`` (a dict, the caller's): that state is left on the workers under ``keep["rd"]`` and the
    next v-step given the same dict and, as ``V0``, this one's V starts from it (the caller releases what is left
    there when done: ``keep["rd"].release()``). Where the workers are on several machines (:func:`dufs.engine.
    kept_vectors`) the vectors over the samples stay on one worker as well (:mod:`dufs.methods.m3fs.kept_scores`),
    its graph's Laplacian made there from ``graph`` (the :class:`AnchorGraph` or kNN affinity ``L`` is of; None:
    ``L`` itself is sent)."""
    a = _VArgs(C=C, lambda_=lambda_, l=l, smoothing=smoothing, n_clusters=n_clusters, V0=V0, b0=b0, colsum=colsum,
               tol=tol, max_iter=max_iter, lipschitz=lipschitz, LZ=LZ, L1=L1, max_passes=max_passes, F0=F0,
               value_rtol=value_rtol, LF0=LF0, stop=stop)
    parts = resident_partitions(M) if resident and int(n_clusters) == 2 and (LZ is None or lambda_ == 0) \
        else None
    if parts is not None:
        try:
            return _v_step(M, sigma, y, L, a, parts=parts, keep=keep, graph=graph)
        except Exception as e:
            if not is_lost(e):
                raise
            log.warning("v_step: %s; the v-step again from its start, its vectors on the driver", e)
    return _v_step(M, sigma, y, L, a, parts=None, keep=None)




def _v_step(M: Matrix, sigma: np.ndarray, y: np.ndarray, L: Any, a: _VArgs, *, parts: list | None,
            keep: dict | None, graph: Any = None) -> dict:
    """:func:`v_step`, its vectors over the features on the workers of ``parts`` (:class:`ResidentU`) or here, and
    with them its vectors over the samples on one worker where :func:`~dufs.engine.kept_vectors` says so."""
    prob = _VProblem(M, sigma, y, L, a)
    # the state the last v-step left on the workers starts this one when it was left for the V0 given
    renew = parts is not None and keep is not None and keep.get("rd") is not None and \
        keep["rd"].fits(M, parts, a.V0, a.colsum)
    passes0 = M.passes
    U, b, F, LF, value, aU0 = _first_point(prob, a, parts, renew)
    rd = _place(prob, U, a.colsum, parts, keep, renew)
    side = kept_side(prob, F, LF, graph, rd.homes()) if rd is not None and kept_vectors(current_client()) else None
    st = _State(U, b, F, LF, value, a.lipschitz, rd, aU0, prob.binary, side)
    del F, LF
    try:
        it = fista(prob, st, tol=a.tol, max_iter=a.max_iter, value_rtol=a.value_rtol, max_passes=a.max_passes,
                   passes0=passes0, stop=a.stop)
    except BaseException:  # what the workers keep goes with the v-step that failed
        if rd is not None:
            with contextlib.suppress(Exception):
                rd.release()
        raise
    Fbest, U, b, F = st.best
    LF = st.xLF if prob.binary else None
    if side is not None:  # x is the best point: its scores and L F brought back once
        F, LF = side.final()
    # v = S^1/2 u: made by the workers from their u (only v comes back), or here
    V = rd.result()[:, None] if rd is not None else prob.s_half[:, None] * U
    if rd is not None:
        if keep is not None:  # left on the workers for the next v-step from this V
            rd.V = V
            keep["rd"] = rd
        else:
            rd.release()
    # x is the best point: xLF = L F at the F returned
    return {"V": V, "b": b, "F": F, "value": Fbest, "iterations": it, "passes": M.passes - passes0,
            "lipschitz": st.Lip, "resident": rd is not None, "LF": LF, "samples_side": _side_name(side)}


def _side_name(side: Any) -> str:
    """Where a v-step's scores were kept: "driver", "one worker" or "N pieces" (the diagnostics' ``samples_side``)."""
    if side is None:
        return "driver"
    pieces = getattr(side, "pieces", None)
    return "one worker" if pieces is None else f"{len(pieces)} pieces"


def _first_point(prob: _VProblem, a: _VArgs, parts: list | None, renew: bool) -> tuple:
    """The start u0 = S^-1/2 V0 (0 without V0; M clusters: projected on the balance) and b0, its scores (the
    caller's F0, and LF0, when they are u0's), the best bias there (two clusters) and the majoriser's value:
    (u0, b, F, L F, value, a^T u0). With u on the workers (``parts``) the driver needs only a^T u0 and ||u0||^2
    (made by start_dots, the same way whether the workers make u0 from the state the last v-step left, ``renew``,
    or get it shipped), and u0 itself (else None) only to ship it or to compute its scores."""
    d, p, binary, s_half = prob.d, prob.p, prob.binary, prob.s_half
    off = False  # V0 has weight where sigma is 0
    aU0 = uu0 = None
    V0 = a.V0
    if V0 is not None:
        V0 = np.asarray(V0, dtype=np.float64).reshape(d, p)
        if parts is not None:
            off, aU0, uu0 = start_dots(V0[:, 0], s_half, _NONE if prob.bal.a is None else prob.bal.a)
        U = None
        if not renew or off:
            U = np.empty((d, p))
            off = scaled_start(V0, s_half, U)  # V0 / s_half, 0 where sigma is
    else:
        U = np.zeros((d, p))
        if parts is not None:
            aU0 = uu0 = 0.0
    b = float(a.b0) if binary else 0.0
    projected_same = True
    if not binary:
        U2, b = prob.bal.project(U, b)
        projected_same = U2 is U
        U = U2
    # the caller's scores are those of U when V0 has no weight where sigma is 0 (U is zero there)
    warm = a.F0 is not None and V0 is not None and not off and projected_same
    if not binary:
        F = np.array(a.F0, dtype=np.float64).reshape(prob.n, p) if warm else prob.scores(U, b)
        return U, b, F, None, prob.value(U, b, F)[0], aU0
    if not warm and U is None:
        U = np.empty((d, p))
        scaled_start(V0, s_half, U)
    F0 = a.F0
    Fu = np.array(F0[:, 0] if F0.ndim == 2 else F0, dtype=np.float64) - float(a.b0) if warm \
        else prob.scores(U, 0.0)[:, 0]
    LFu = None
    if warm and a.LF0 is not None and prob.L1v is not None:  # L Fu = L F0 - b0 L 1, no product with L
        LFu = np.array(np.reshape(a.LF0, -1), dtype=np.float64)
        axpy(-float(a.b0), prob.L1v, LFu)
    b, F, LF = prob.settle(U, Fu, b, aU0, LFu)
    return U, b, F, LF, prob.value(U, b, F, LF, uu0, grad=False)[0], aU0


def _place(prob: _VProblem, U: np.ndarray | None, colsum: np.ndarray | None, parts: list | None,
           keep: dict | None, renew: bool) -> ResidentU | None:
    """With ``parts``, u on the workers: the state the last v-step left there (``renew``: u0 made there from its
    u) or a new one, shipped u0 ``U``; else None (u here)."""
    if parts is None:
        return None
    rd = keep.pop("rd", None) if keep is not None else None
    if renew:
        rd.renew(prob.s_half)  # the last v-step's state: u0 made there from its u
    else:
        if rd is not None:
            rd.release()
        rd = ResidentU(prob.M, U[:, 0], prob.s_half, colsum, parts)
    return rd
