"""UFCM: unsupervised feature analysis with class margin optimisation (paper 003, Wang et al.), docs/methods.md "UFCM".

With Zc the implicitly transformed data centred by its column means (n_samples x n_features, never formed), the
objective (eq. (6), with the l2,p term as ||W||_{2,p}^p, docs/methods.md "UFCM") is

    f(W, U, G) = Tr(W^T S_t W) - alpha ||Zc W - U G^T||_F^2 - beta sum_i ||w^i||^p,   W^T W = I,

S_t = Zc^T Zc, U the n x c cluster indicator, G the d' x c centroids. Algorithm 1 alternates, from W by PCA and U
by k-means on Zc W:

- D_ii = p / (2 ||w^i||^(2-p)) (eq. (7)), the weights of the tangent majoriser of ||W||_{2,p}^p at the current W
  (eq. (8) is a majorisation, not the equivalence the paper says);
- U (eq. (14)): candidates are the current U, Lloyd's k-means started from the current centroids G and ``n_init``
  k-means runs from random (k-means++) starts, all on Y = Zc W; each is judged by the k-means term with its own
  centroids (G from eq. (10)), the smallest kept. The paper judges random candidates against the *old* G, which
  makes a random candidate lose to plain reassignment (eq. (9)) almost surely; judged with their own centroids the
  restarts can win, and keeping the current U among the candidates makes the step never increase the term (above
  ``_KMEANS_SAMPLE_ABOVE`` samples a restart is fitted on a sample and judged after one assignment of all rows,
  the winner then refined by Lloyd on all rows: :func:`_choose`);
- W: the algebraically largest d' eigenvectors of A = S_t - alpha S_w - beta D (eq. (13) with centred data:
  X X^T - X U (U^T U)^-1 U^T X^T = S_w), which can be indefinite. S_w = S_t - S_b and S_b = Q diag(1/n_k) Q^T with
  Q = Zc^T U (d x c, one pass), so A v = (1 - alpha) Zc^T (Zc v) + alpha Q diag(1/n_k) Q^T v - beta D v;
- G = W^T Zc^T U (U^T U)^-1 = W^T Q diag(1/n_k) (eq. (10)).

Every step does not decrease f (Proposition 1, for 0 < p <= 2): the U step by construction, the W step because
Tr(W^T A W) - beta (1 - p/2) ||W_old||_{2,p}^p is a minorant of f( . , U, G*( . )) touching it at W_old. A row of W
whose norm is below ``_EPS`` (a constant feature, say) has an infinite D_ii in the limit: it is kept at zero, out of
the eigenproblem, which keeps the guarantee exact (a finite guard D_ii = p / (2 eps^(2-p)) would break it by up to
beta eps^p per such row).

Below ``dense_below`` features the d x d matrix S_t is built once (2 passes per chunk of columns: Z E then Z^T)
and each W step is a dense ``numpy.linalg.eigh``. Above, the PCA start is block subspace iteration (two passes an
iteration: Zc V, then Zc^T of it); with alpha = 1 (the default) A = Q diag(1/n_k) Q^T - beta D is a diagonal plus
a rank-c matrix and the W step solves its secular equation with c x c eigenproblems and no pass over the data;
otherwise it is LOBPCG warm-started from the previous W on a ``LinearOperator`` whose product with a d x k block
costs two passes. k-means runs on the n x d' projection in this process (scikit-learn, restarts in threads);
n x max(d', c) float64 must fit ``dufs.engine.max-task-bytes`` (at kddb size, 19.3M samples and the default
1 GiB: up to 6).

References
----------
Wang, Nie, Chang, Yao, Li, Sheng, "Unsupervised Feature Analysis with Class Margin Optimization", ECML PKDD 2015,
eqs. (6)-(14), Algorithm 1, Proposition 1.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import numpy as np
import scipy.sparse as sp

from dufs._logging import get_logger
from dufs.engine import Matrix
from dufs.errors import ParameterError
from dufs.kernels.affine import standardize_rows
from dufs.kernels.blockops import col_sums
from dufs.kernels.clusters import bin_moments, cluster_means, kmeans_term, nearest
from dufs.methods.params import SEED, Interval, Param, check_params, integer, nonnegative, table
from dufs.scheduling import local_cores, one_blas_thread, thread_limits

__all__ = ["UFCMResult", "ufcm", "ufcm_objective"]

#: UFCM's parameters (``n_components`` None: the number of clusters, at most n_features - 1)
UFCM_PARAMS = table(
    Param("n_clusters", 2, (integer(1),), "k-means clusters of the pseudo-labels"),
    Param("n_components", None, (None, integer(1)), "d', the columns of W"),
    Param("alpha", 1.0, (nonnegative(),), "weight of the within-cluster scatter"),
    Param("beta", 1.0, (nonnegative(),), "weight of the l2,p row-sparsity term"),
    Param("p", 1.0, (Interval(Real, 0, 2, closed="right"),), "the p of ||W||_{2,p}^p"),
    Param("max_iter", 30, (integer(1),), "outer iterations"),
    Param("n_init", 10, (integer(0),), "k-means restarts of each U step"),
    Param("tol", 1e-6, (nonnegative(),), "relative objective decrease to stop", estimator=False),
    SEED,
    Param("dense_below", 2000, (integer(0),), "features below which the W step is dense", estimator=False),
)

log = get_logger(__name__)

_LOBPCG_MAXITER = 40  # block iterations of a matrix-free W step
_PCA_MAXITER = 60  # block iterations of the matrix-free PCA start
_PCA_TOL = 1e-3  # its residuals, relative to the largest eigenvalue
_PCA_SAMPLE_ABOVE = 1 << 20  # samples above which the PCA start is estimated on a sample of rows, then refined
_PCA_SAMPLE = 1 << 17  # rows of that sample
_PCA_REFINE = 2  # block iterations on all rows after it
_KMEANS_SAMPLE_ABOVE = 1 << 17  # samples above which a random k-means start is first fitted on a sample
# rows of that sample: on the 200K x 1M bench (c = d' = 10) a start took 35 ms with 2^15 rows, 20 ms with 2^14, its
# candidates as good (k-means terms of 20 starts: best 293.5K / 294.3K, median 301.4K / 300.4K), the objective after
# 5 iterations 158,711.75 / 158,702.04, a U step 0.31 -> 0.23 s
_KMEANS_SAMPLE = 1 << 14
_EPS = 1e-10  # a row of W (norms are <= 1 since W^T W = I) below this is held at zero
_GRAM_BYTES = 256 << 20  # the n x k slab of columns of Z per chunk when S_t is built densely


@dataclass
class UFCMResult:
    """``W`` (n_features x n_components), the cluster ``labels`` (n_samples), the centroids ``G``
    (n_components x n_clusters), ``scores`` = the row norms of W (larger is better), the ``objective`` (eq. (6))
    at the start and after every iteration, and ``diagnostics`` (iterations, timings, converged, ...)."""

    W: np.ndarray
    labels: np.ndarray
    G: np.ndarray
    scores: np.ndarray
    objective: np.ndarray
    diagnostics: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------- centred data
class _Centred:
    """Products with Zc = Z - 1 m^T, m the column means of Z (the matrix's own transform, then centred)."""

    def __init__(self, M: Matrix):
        self.M = M
        self.n, self.d = M.shape
        self.m: np.ndarray | None = None  # None: Z is centred by construction (zscore), exactly, not to rounding
        if M.standardize != "zscore":
            m = np.nan_to_num(M.stats.mean(), nan=0.0)
            mu, inv = M.transform
            if mu is not None:
                m -= mu
            if inv is not None:
                m *= inv
            self.m = m

    def matvec(self, V: np.ndarray) -> np.ndarray:
        """Zc V (n x k): one pass."""
        out = self.M.matvec(V)
        if self.m is not None:
            out -= (self.m @ V)[None, :]
        return out

    def rmatvec(self, T: np.ndarray) -> np.ndarray:
        """Zc^T T (d x k): one pass. The centring is subtracted in place, in slabs of rows (at kddb size a d x k
        temporary is 240 MB a column)."""
        out = self.M.rmatvec(T)
        if self.m is not None:
            self._centre(out, col_sums(T))
        return out

    def _centre(self, out: np.ndarray, s: np.ndarray) -> None:
        """out -= m s^T (s: the column sums of the vectors Z^T was applied to), in place: row by row in one sweep,
        no temporary (:func:`~dufs.kernels.affine.standardize_rows`; the same numbers as NumPy's
        ``out -= m[:, None] * s``, which took 15 ms a call at 1M x 10 in slabs against 4 ms)."""
        if out.ndim == 1:
            out -= s * self.m
        else:
            standardize_rows(out, self.m, np.ascontiguousarray(s, dtype=np.float64), None)

    def label_rmatvec(self, labels: np.ndarray, c: int, counts: np.ndarray) -> np.ndarray:
        """Zc^T U for U the n x c indicator of ``labels`` (d x c), ``counts`` its column sums (the clusters'
        sizes): one pass that ships the labels, not U (:meth:`Matrix.label_rmatvec`); the same numbers as
        :meth:`rmatvec` of U."""
        out = self.M.label_rmatvec(labels, c)
        if self.m is not None:
            self._centre(out, counts)
        return out

    def scatter(self) -> np.ndarray:
        """S_t = Zc^T Zc as a dense d x d matrix: two passes per chunk of columns."""
        d, n = self.d, self.n
        from dufs.engine.rows import max_task_bytes

        # Z E is n x k dense: at most _GRAM_BYTES, and half of dufs.engine.max-task-bytes (the pass that takes it
        # also takes its data block)
        k = max(1, min(d, min(_GRAM_BYTES, max_task_bytes() // 2) // max(8 * n, 1)))
        S = np.empty((d, d))
        for a in range(0, d, k):
            E = np.zeros((d, min(k, d - a)))
            E[np.arange(a, a + E.shape[1]), np.arange(E.shape[1])] = 1.0
            S[:, a:a + E.shape[1]] = self.rmatvec(self.matvec(E))
        return 0.5 * (S + S.T)


# ---------------------------------------------------------------------------------------------------- pieces
def _centroids(Y: np.ndarray, labels: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray]:
    """Centroids (c x d') of the clusters of Y and their sizes (eq. (10) for one U): one sweep over Y."""
    return cluster_means(np.ascontiguousarray(Y, dtype=np.float64), np.asarray(labels, dtype=np.int64), int(c))


def _km_term(Y: np.ndarray, labels: np.ndarray, C: np.ndarray) -> float:
    """||Y - U G^T||_F^2 with G^T = C: one sweep over Y, no n x d' temporary."""
    return float(kmeans_term(np.ascontiguousarray(Y, dtype=np.float64), np.asarray(labels, dtype=np.int64),
                             np.ascontiguousarray(C, dtype=np.float64)))


def _kmeans(Y: np.ndarray, c: int, init: Any, seed: int, *, refine: bool = True) -> np.ndarray:
    """Labels of one k-means run on Y (Lloyd, in this process: Y is n x d' with n x max(d', c) x 8 bytes within
    ``dufs.engine.max-task-bytes``), from ``init`` (centroids, c x d') or "k-means++". One OpenMP thread (the
    runs of a U step go side by side in threads instead: :func:`_in_threads`); BLAS is held to one thread by the
    caller. A random start on more than ``_KMEANS_SAMPLE_ABOVE`` rows runs k-means++ and Lloyd on a uniform sample
    of ``_KMEANS_SAMPLE`` rows first; ``refine`` False then stops at one assignment of all rows to the sample's
    centres (:func:`_choose` refines the candidate that wins)."""
    from sklearn.cluster import KMeans

    # one thread: on an n x d' problem this small OpenMP's spin-waits cost more than they give (40x slower on a
    # loaded 2-core machine). OpenMP's thread count is per calling thread, so this holds in a pool's thread too
    with thread_limits(1, "openmp"):
        if isinstance(init, str) and Y.shape[0] > _KMEANS_SAMPLE_ABOVE:
            pick = np.random.default_rng(seed).choice(Y.shape[0], size=_KMEANS_SAMPLE, replace=False)
            init = KMeans(n_clusters=c, init=init, n_init=1, random_state=seed, algorithm="lloyd").fit(
                Y[np.sort(pick)]).cluster_centers_
            if not refine:
                return nearest(np.ascontiguousarray(Y, dtype=np.float64), np.ascontiguousarray(init, dtype=np.float64))
        km = KMeans(n_clusters=c, init=init, n_init=1, random_state=seed, algorithm="lloyd")
        km.fit(Y)
    return km.labels_.astype(np.int64)


def _choose(Y: np.ndarray, c: int, fixed: list[Any], starts: list[int], seed: int) -> tuple[np.ndarray, float, int]:
    """The U step's choice (eq. (14)): the best by the k-means term (each candidate with its own centroids) of the
    ``fixed`` candidates (label vectors, or functions of no argument that make one) and of k-means runs from
    k-means++ starts seeded by ``starts``; returns (labels, term, index of the candidate chosen).

    On more than ``_KMEANS_SAMPLE_ABOVE`` rows a random start is fitted on a sample of rows and judged after one
    assignment of all rows to its centres; the one chosen, if a random start wins, then runs Lloyd on all rows
    from its own centroids (kept when it lowers the term, which it does not raise in theory). The term only falls
    from the judged one, so the step never increases it, and one Lloyd run on all rows is made instead of one a
    start (on 200K x 10, c = 10, n_init = 10: a U step of 0.32 s, 0.75 s with every start refined)."""
    sampled = Y.shape[0] > _KMEANS_SAMPLE_ABOVE
    calls = [f if callable(f) else (lambda f=f: f) for f in fixed] + [
        functools.partial(_kmeans, Y, c, "k-means++", s, refine=not sampled) for s in starts]
    labels, km, j = _best_partition(Y, c, _in_threads([functools.partial(_judged, Y, c, f) for f in calls]))
    if sampled and j >= len(fixed):
        lab = _kmeans(Y, c, _centroids(Y, labels, c)[0], seed)
        v = _own_term(Y, lab, c)
        if v is not None and v <= km:
            labels, km = lab, v
    return labels, km, j


def _in_threads(calls: list[Any]) -> Any:
    """The results of ``calls`` (functions of no argument), in order, computed in up to one thread per core of
    this process (k-means runs release the GIL), with at most that many results made ahead of the one the
    consumer is at: the U step's candidates are n-vectors (150 MB each at kddb size), held a few at a time."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    width = max(1, min(len(calls), local_cores()))
    with thread_limits(1, "blas"):  # BLAS's thread count is global: set once, here
        if width == 1:
            for call in calls:
                yield call()
            return
        with ThreadPoolExecutor(width, thread_name_prefix="dufs-kmeans") as ex:
            pending: deque = deque()
            for call in calls:
                pending.append(ex.submit(call))
                if len(pending) > width:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()


def _own_term(Y: np.ndarray, labels: np.ndarray, c: int) -> float | None:
    """The k-means term of a partition with its own centroids; None when a cluster is empty (an empty cluster
    makes (U^T U)^-1 undefined)."""
    C, counts = _centroids(Y, labels, c)
    return None if counts.min() == 0 else _km_term(Y, labels, C)


def _judged(Y: np.ndarray, c: int, call: Any) -> tuple[np.ndarray, float | None]:
    """A candidate made by ``call`` and its k-means term (:func:`_own_term`), in the thread that made it."""
    lab = call()
    return lab, _own_term(Y, lab, c)


def _best_partition(Y: np.ndarray, c: int, candidates: Any) -> tuple[np.ndarray, float, int]:
    """The candidate of smallest k-means term (each with its own centroids); ties keep the earlier one.
    ``candidates``: (labels, term or None) pairs (:func:`_judged`), perhaps a generator: only the best so far and
    the one at hand are held (n-vectors each)."""
    best, best_v, best_j = None, np.inf, -1
    for j, (lab, v) in enumerate(candidates):
        if v is not None and v < best_v:
            best, best_v, best_j = lab, v, j
    if best is None:
        raise ParameterError(f"k-means left a cluster empty in every candidate: n_clusters = {c} is too many for "
                             f"these data")
    return best, best_v, best_j


def _penalty(W: np.ndarray, p: float) -> float:
    r = np.sqrt(np.einsum("ij,ij->i", W, W))
    return float(np.sum(r[r > 0] ** p))


def ufcm_objective(Y: np.ndarray, W: np.ndarray, labels: np.ndarray, G: np.ndarray, alpha: float, beta: float,
                   p: float) -> float:
    """Eq. (6) from Y = Zc W: ||Y||_F^2 - alpha ||Y - U G^T||_F^2 - beta ||W||_{2,p}^p (Tr(W^T S_t W) = ||Zc W||^2)."""
    return float(np.einsum("ij,ij->", Y, Y) - alpha * _km_term(Y, labels, G.T) - beta * _penalty(W, p))


def _top_dense(A: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    vals, vecs = np.linalg.eigh(A)
    return vals[::-1][:k], vecs[:, ::-1][:, :k]


# rows of Q per slab while M(lambda) is summed: temporaries of 8 c x 16K bytes stay in cache (a sweep over 1M x 10
# took 37 ms in slabs of 1M rows, 25 ms in slabs of 16K)
_SECULAR_CHUNK = 1 << 14
_MODEL_ROWS = 32  # rows beyond the k + 1 smallest diagonal values whose terms the root model keeps exact


def _slabs(Q: np.ndarray) -> Any:
    return (Q[a:a + _SECULAR_CHUNK] for a in range(0, Q.shape[0], _SECULAR_CHUNK))


# row ranges of the W step's sweeps over Q (d x c), computed side by side in this process's threads while the
# workers wait: a fixed number, so the order of every sum (and the result) does not depend on the cores
_PIECES = 4


def _over_pieces(fn: Any, m: int) -> list:
    """``[fn(a, b), ...]`` over up to ``_PIECES`` contiguous row ranges [a, b) of m rows (cut at multiples of
    ``_SECULAR_CHUNK``, so each range's slabs are the serial sweep's), computed in threads (:func:`_in_threads`)."""
    slabs = -(-m // _SECULAR_CHUNK)
    k = max(1, min(_PIECES, slabs))
    cuts = [min(m, (slabs * i // k) * _SECULAR_CHUNK) for i in range(k + 1)]
    return list(_in_threads([functools.partial(fn, cuts[i], cuts[i + 1]) for i in range(k)]))


def _gram(Q: np.ndarray) -> np.ndarray:
    """Q^T Q of a tall Q, in slabs over the row pieces (:func:`_over_pieces`)."""
    def part(a: int, b: int) -> np.ndarray:
        return sum((q.T @ q for q in _slabs(Q[a:b])), np.zeros((Q.shape[1], Q.shape[1])))
    return sum(_over_pieces(part, Q.shape[0]), np.zeros((Q.shape[1], Q.shape[1])))


def _secular_m_and_slope(Qa: np.ndarray, Da: np.ndarray, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """M(lambda) and P(lambda) = Qa^T diag(1 / (lambda + Da)^2) Qa = -dM/dlambda, from one sweep over Qa."""
    c = Qa.shape[1]
    M, P = np.zeros((c, c)), np.zeros((c, c))
    for a in range(0, Qa.shape[0], _SECULAR_CHUNK):
        q = Qa[a:a + _SECULAR_CHUNK]
        r = q / (lam + Da[a:a + _SECULAR_CHUNK])[:, None]
        M += r.T @ q
        P += r.T @ r
    return 0.5 * (M + M.T), 0.5 * (P + P.T)


# M(t) from moments: rows of Q binned geometrically by their distance D_i - D_(k) to the k-th smallest diagonal
# value (bins of this ratio), each bin's terms a Taylor series in D_i - D_b of this many terms around its centre:
# for every t the roots are searched at (t >= -D_(k)) the series' ratio is at most sqrt(1.02) - 1 < 0.01, so the
# terms left out are below 0.01^9 (1e-18) of the row's own: rounding rules. Finer bins, fewer terms: on the bench's
# W steps (488K rows, c = 10) ratio 1.1 with 13 terms took 0.27 s to build by GEMMs a bin, this 0.07 s (one sweep)
_BIN_RATIO = 1.02
_BIN_TERMS = 9


class _SecularMoments:
    """M(t) = B^T Q^T (t I + D)^-1 Q B and P(t) = -dM/dt for any t >= -D_(k), without a sweep over Q: the rows
    with D_i within ``floor`` of D_(k) exact (a handful), every other row through its bin's moments
    sum_i q_i q_i^T (D_i - D_b)^j, j < _BIN_TERMS, made in one sweep over Q (:func:`bin_moments`): then
    1 / (t + D_i) = sum_j (-(D_i - D_b))^j / (t + D_b)^(j+1), a series whose ratio |D_i - D_b| / (t + D_b) is at most
    sqrt(_BIN_RATIO) - 1 for every such t. An evaluation costs (bins x terms) c x c additions: the secular solve's
    30-odd sweeps over a 1M x 10 Q (15-25 ms each) became one of about 50 ms."""

    def __init__(self, Q: np.ndarray, D: np.ndarray, B: np.ndarray, d_k: float, floor: float):
        ex = np.flatnonzero(D - d_k <= floor)  # a few rows (no temporary over all of them beyond this test)
        self.XE, self.DE = Q[ex] @ B, D[ex]
        lr = np.log(_BIN_RATIO)
        top = float(D.max()) - d_k if D.size else 0.0
        n_bins = int(np.floor(np.log(top / floor) / lr)) + 1 if top > floor else 0
        centre = floor * np.exp(lr * (np.arange(n_bins) + 0.5))  # D_b - D_(k): the bins' geometric centres
        Qc, Dc = np.ascontiguousarray(Q), np.ascontiguousarray(D, dtype=np.float64)
        parts = _over_pieces(lambda a, b: bin_moments(Qc[a:b], Dc[a:b], d_k, floor, lr, d_k + centre, _BIN_TERMS),
                             Q.shape[0])
        packed, count = parts[0]
        for more, n_more in parts[1:]:
            packed += more
            count += n_more
        keep = np.flatnonzero(count)
        c = Q.shape[1]
        iu = np.triu_indices(c)
        full = np.zeros((keep.shape[0], _BIN_TERMS, c, c))
        full[:, :, iu[0], iu[1]] = packed[keep]
        full[:, :, iu[1], iu[0]] = packed[keep]
        r = B.shape[1]
        # in the basis B, each bin's terms one (terms x r^2) row block: an M(t) is then one matrix-vector product
        self.mom = (B.T @ full @ B).reshape(keep.shape[0] * _BIN_TERMS, r * r)
        self.r = r
        self.half = centre[keep] * (np.sqrt(_BIN_RATIO) - 1.0)  # |D_i - D_b| at most
        self.Db = d_k + centre[keep]
        self.sign = (-1.0) ** np.arange(_BIN_TERMS)

    def at(self, t: float) -> tuple[np.ndarray, np.ndarray] | None:
        """(M(t), P(t)) in the basis B; None where t is below the range the series hold in."""
        s = t + self.Db
        if s.size and not np.all(self.half <= 0.05 * s):
            return None
        inv = 1.0 / s
        pw = inv[:, None] ** np.arange(1, _BIN_TERMS + 1)[None, :]  # 1 / (t + D_b)^(j+1)
        cm = self.sign[None, :] * pw
        cp = cm * inv[:, None] * np.arange(1, _BIN_TERMS + 1)[None, :]
        re = self.XE / (t + self.DE)[:, None]
        M = self.XE.T @ re + (cm.ravel() @ self.mom).reshape(self.r, self.r)
        P = re.T @ re + (cp.ravel() @ self.mom).reshape(self.r, self.r)
        return 0.5 * (M + M.T), 0.5 * (P + P.T)


def _model_root(mod: Any, i: int, lo: float, hi: float, tol: float) -> float | None:
    """The s in (lo, hi) where the (i+1)-th largest eigenvalue of ``mod(s)`` crosses 1 (it decreases in s there),
    by Illinois' false position on c x c eigenproblems; None when the model does not change sign in the bracket."""

    def g(s: float) -> float:
        return float(np.linalg.eigvalsh(mod(s))[::-1][i]) - 1.0

    a, b = lo, hi  # points evaluated or chosen off the diagonal's values, never on a pole
    ga, gb = g(a), g(b)
    if not ga > 0.0 > gb:
        return None
    side = 0
    for _ in range(100):
        x = a + (b - a) * ga / (ga - gb)
        if not a < x < b:
            x = 0.5 * (a + b)
        gx = g(x)
        if gx > 0.0:
            a, ga = x, gx
            if side == 1:
                gb *= 0.5
            side = 1
        else:
            b, gb = x, gx
            if side == -1:
                ga *= 0.5
            side = -1
        if b - a <= tol or gx == 0.0:
            break
    x = 0.5 * (a + b)
    return x if lo < x < hi else None


def _secular_root(m_at: Any, i: int, lo: float, hi: float, eps: float, pole: float | None = None,
                  above: float | None = None, model: Any = None) -> float:
    """The t in [lo, hi] where the (i+1)-th largest eigenvalue mu_i(t) of M(t) crosses 1, with no diagonal value
    -Dl inside the bracket (mu_i(lo) >= 1 > mu_i(hi)): safeguarded Newton, a bisection step whenever Newton's
    leaves the bracket. Each step is one sweep over Ql. The step solves a one-pole model mu(s) = b + a / (s - p)
    through the point's value and slope (p the nearer of ``pole`` and ``above``: exact for one pole's term plus a
    constant, and close to lambda / t far above every pole), else Newton's step on 1/mu_i(t) - 1 where mu_i > 0 or
    on mu_i(t) - 1: one to three steps a root, where Newton on mu_i alone took four or five and Brent's method ten
    or more. The slope comes from the same sweep: mu_i'(t) = -y^T P(t) y
    for its unit eigenvector y (Hellmann-Feynman). ``m_at(t)``: (M(t), P(t)) (:func:`_secular_m_and_slope`,
    cached by the caller). Newton starts at ``hi`` (the previous, larger root, whose M is cached, or the bound
    above them all). ``pole``: the nearest diagonal value -Dl below the bracket (None: none): where Newton's step
    leaves the bracket, the bracket is split at the geometric mean of its ends' distances to it, which takes a
    bracket spanning orders of magnitude (a root close to a pole, the bound far above) down in a few steps where
    halving it takes tens; ``above``: the nearest one above (None: none). The t returned is the last t evaluated,
    within ``eps`` of the root and within 1e-12 of its distance to the nearest pole (down to t's own rounding): the
    eigenvector (t I + D)^-1 Q y of a root close to a pole moves with t.

    ``model(t)`` (a root between two diagonal values, ``pole`` and ``above`` both given): a function of s that
    models M(s) from the sweep at t, the terms of the few rows with the smallest diagonal values exact and the
    rest's to first order (their poles are far from the bracket). The next t is then the model's own root in the
    bracket (bisection on c x c eigenproblems, no sweep): a root among the poles is bent by several of them at
    once, where the one-pole step converged linearly (8 sweeps for a root 2e-7 below a pole on a bench W step)."""
    t = hi
    glo = ghi = None  # mu - 1 at the bracket's ends, once evaluated there (Illinois' false position)
    side = 0
    for _ in range(200):
        M, P = m_at(t)
        w, Y = np.linalg.eigh(M)
        mu = float(w[-1 - i])
        g = mu - 1.0
        if g >= 0.0:
            lo, glo = t, g
            if side == 1 and ghi is not None:
                ghi *= 0.5  # the same end kept twice: halve the other's weight (Illinois)
            side = 1
        else:
            hi, ghi = t, g
            if side == -1 and glo is not None:
                glo *= 0.5
            side = -1
        # the tolerance on t: ``eps``, and within 1e-12 of the distance to the nearest pole (the eigenvector
        # (t I + D)^-1 Q y moves with t in proportion to 1 / that distance), down to t's own rounding
        gap = min(t - pole if pole is not None else np.inf, above - t if above is not None else np.inf)
        tol_t = max(min(eps, 1e-12 * gap), 4.0 * np.finfo(float).eps * abs(t))
        # and mu_i - 1 at the rounding level of M(t)'s eigenvalues (about eps ||M(t)||): no step can do better
        noise = 16.0 * np.finfo(float).eps * max(abs(float(w[0])), abs(float(w[-1])), 1.0)
        if abs(g) <= noise or hi - lo <= tol_t:
            break
        y = Y[:, -1 - i]
        slope = -float(y @ P @ y)
        nxt = None
        if model is not None and pole is not None and above is not None:
            nxt = _model_root(model(t), i, lo, hi, tol_t)
        if slope < 0.0 and nxt is None:
            # the model mu(s) = b + a / (s - p) through (t, mu, slope), p the nearer pole: exact for one pole's term
            # plus a constant, and for lambda / t far above them all
            for p in sorted((q for q in (pole, above) if q is not None), key=lambda q: abs(t - q)):
                a = -slope * (t - p) ** 2
                b = mu - a / (t - p)
                if b != 1.0 and lo < p + a / (1.0 - b) < hi:
                    nxt = p + a / (1.0 - b)
                    break
            if nxt is None:  # Newton on mu - 1, or on 1/mu - 1 (the same step scaled by mu) where mu > 0
                nxt = t - g / slope * (mu if mu > 0.0 else 1.0)
        if nxt is None or not lo < nxt < hi:
            if glo is not None and ghi is not None and glo > 0.0 > ghi:
                # false position between the ends (Illinois): superlinear where mu_i has a kink (two eigenvalues of
                # M(t) crossing near the root), where Newton's steps leave the bracket and halving took 30 sweeps
                nxt = lo + (hi - lo) * glo / (glo - ghi)
            else:
                geometric = pole is not None and lo > pole
                nxt = pole + float(np.sqrt((lo - pole) * (hi - pole))) if geometric else 0.5 * (lo + hi)
            if not lo < nxt < hi:
                nxt = 0.5 * (lo + hi)
        if abs(nxt - t) <= tol_t:
            break  # keep the t evaluated (its M gives the eigenvector)
        t = nxt
    return t


_DEFLATE_MAX = 4096  # rows of one group of equal diagonal values that the secular solve deflates (more: none)


def _deflate(Qa: np.ndarray, Da: np.ndarray, head: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Groups of rows with equal diagonal values among the ``head`` smallest, deflated in place: a group's rows G
    (g x c, rank r) become U^T G = [Sigma W^T; 0] (G = U Sigma W^T), r rows that carry its part of M(t) and g - r
    rows exactly zero, whose eigenvectors (e_i, eigenvalue -D of the group) need no root. Without this a pole of
    multiplicity g > r (duplicated features have equal rows of Q and of D: six at the smallest D of a kddb-size W
    step) is an eigenvalue the secular equation does not have: its search converged onto the pole and the residual
    check failed, and the fallback, LOBPCG over all features, ran out of memory. Returns [(rows, U, the rows as they
    were)]: :func:`_top_lowrank` restores Qa and rotates its eigenvectors back (v[rows] = U v[rows])."""
    if Da.size <= head:
        cand = np.arange(Da.size)
    else:
        cand = np.flatnonzero(Da <= np.partition(Da, head - 1)[head - 1])
    vals, inv, counts = np.unique(Da[cand], return_inverse=True, return_counts=True)
    out = []
    for g in np.flatnonzero((counts > 1) & (counts <= _DEFLATE_MAX)):
        rows = cand[inv == g]
        G = Qa[rows]  # a copy (fancy indexing): the rows as they were
        U, sv, Wt = np.linalg.svd(G, full_matrices=True)
        r = int(np.sum(sv > 1e-13 * max(float(sv[0]) if sv.size else 0.0, np.finfo(float).tiny)))
        if r >= rows.shape[0]:
            continue
        Qa[rows] = 0.0
        Qa[rows[:r]] = sv[:r, None] * Wt[:r]
        out.append((rows, U, G))
    return out


def _top_lowrank(Qa: np.ndarray, Da: np.ndarray, k: int, use_moments: bool = True
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_top_lowrank_deflated` with the groups of equal diagonal values deflated first (:func:`_deflate`);
    ``Qa`` is as it was on return."""
    groups = _deflate(Qa, Da, k + Qa.shape[1] + 1) if Qa.shape[0] > k else []
    try:
        got = _top_lowrank_deflated(Qa, Da, k, use_moments)
    finally:
        for rows, _, G in groups:
            Qa[rows] = G
    if got is not None:
        for rows, U, _ in groups:
            got[1][rows] = U @ got[1][rows]
    return got


def _top_lowrank_deflated(Qa: np.ndarray, Da: np.ndarray, k: int, use_moments: bool = True
                          ) -> tuple[np.ndarray, np.ndarray] | None:
    """The largest ``k`` eigenpairs of A = Qa Qa^T - diag(Da) (Qa m x c, Da >= 0) without an eigensolver over m.

    A diagonal plus a rank-c matrix: with M(t) = Qa^T (t I + diag(Da))^-1 Qa (c x c), Sylvester's law of inertia
    on the block matrix [[-diag(Da) - t I, Qa], [Qa^T, -I]] gives the number of eigenvalues of A above t as
    #{i: -Da_i > t} + #{eigenvalues of M(t) above 1}, for any t off the diagonal's values. The j-th eigenvalue is
    where that count drops below j, searched between the j-th largest -Da_i (A >= -diag(Da)) and the (j-1)-th
    eigenvalue (or -min(Da) + ||Qa||_2^2 for the first), each step a c x c eigenproblem and one sweep over Qa:
    first a point just above every -Da_i (M(t) positive definite there: when the root is above it, no diagonal
    value is inside the bracket), else bisection over the diagonal values inside (halving their number, not the
    interval), then :func:`_secular_root` on that mu once none is left inside. Its eigenvector is
    (t I + diag(Da))^-1 Qa y, y the eigenvector of M(t) for the eigenvalue 1 (the secular equation). Rows of Qa that
    are exactly zero are eigenvectors e_i (eigenvalue -Da_i) and are set apart first. Returns None when a residual
    ||A v - t v|| is not at rounding level (the caller uses an iterative solver then)."""
    m, c = Qa.shape
    if m <= k:
        return None
    zero = ~np.any(Qa != 0.0, axis=1)
    live = np.flatnonzero(~zero)
    Ql, Dl = (Qa, Da) if live.size == m else (Qa[live], Da[live])  # no copy when every row takes part
    # Q^T Q's eigenvectors B of non-negligible eigenvalues span the rows of Q (its rank is c - 1 when the data are
    # centred: Q 1 = Zc^T 1 = 0). M(t) is B (B^T M(t) B) B^T: the secular functions below are the r x r matrices
    # B^T M(t) B, without the zero eigenvalue M(t) keeps at every t (among the poles it sits between the
    # eigenvalues that cross 1, and Newton's method on the i-th would follow it)
    g_ev, B = np.linalg.eigh(_gram(Ql)) if live.size else (np.zeros(c), np.eye(c))
    top = float(g_ev[-1]) if live.size else 0.0  # ||Qa||_2^2
    B = B[:, g_ev > 1e-13 * c * top] if top > 0.0 else B
    c = B.shape[1]
    scale = max(top, float(Da.max()), np.finfo(float).tiny)
    cand_vals: list[float] = []
    cand_ys: list[Any] = []  # each root's y (its eigenvector is (t I + D)^-1 Q y), or the row i of an e_i
    if live.size and top > 0.0:
        asc = np.sort(Dl)  # D ascending: -D_i > t iff D_i < -t
        kk = min(k, live.size)

        def poles(t: float) -> int:
            return int(np.searchsorted(asc, -t, side="left"))  # #{-D_i > t}

        def on_pole(t: float) -> bool:
            i = int(np.searchsorted(asc, -t, side="left"))
            return i < asc.size and asc[i] == -t

        # each M(t) is a sweep over Ql (d x c: 80 MB at a million features), the eigenproblems c x c: every t
        # evaluated is kept (c x c each), since the roots' brackets and searches meet the same points again
        cache: dict[float, tuple[np.ndarray, np.ndarray]] = {}
        moments = _SecularMoments(Ql, Dl, B, float(asc[kk - 1]), 1e-9 * scale) if use_moments else None

        def m_at(t: float) -> tuple[np.ndarray, np.ndarray]:
            got = cache.get(t)
            if got is None:
                got = moments.at(t) if moments is not None else None
                if got is None:
                    Mt, Pt = _secular_m_and_slope(Ql, Dl, t)
                    got = (B.T @ Mt @ B, B.T @ Pt @ B)
                cache[t] = got
            return got

        def mus(t: float) -> np.ndarray:
            return np.linalg.eigvalsh(m_at(t)[0])[::-1]

        def count(t: float) -> int:
            return poles(t) + int(np.sum(mus(t) > 1.0))

        # the rows of the smallest diagonal values (the poles nearest the roots among them), ascending, in the
        # basis B: their terms of M(t) exact in the model of _secular_root, the rest's to first order
        nn = min(Dl.size, kk + 1 + _MODEL_ROWS)
        near = np.argpartition(Dl, nn - 1)[:nn] if nn < Dl.size else np.arange(Dl.size)
        QnB, Dn = Ql[near] @ B, Dl[near]

        def near_terms(t: float) -> tuple[np.ndarray, np.ndarray]:
            r = QnB / (t + Dn)[:, None]
            return r.T @ QnB, r.T @ r

        def model(t0: float) -> Any:
            M0, P0 = m_at(t0)
            Mn, Pn = near_terms(t0)
            Mf, Pf = M0 - Mn, P0 - Pn

            def at(s: float) -> np.ndarray:
                return Mf - (s - t0) * Pf + near_terms(s)[0]
            return at

        hi0 = -float(asc[0]) + top * (1.0 + 1e-9) + scale * 1e-12
        eps = 4.0 * np.finfo(float).eps * scale
        above = -float(asc[0]) + scale * 1e-12  # just above every pole: where M(t) is positive definite
        for j in range(1, kk + 1):
            lo, hi = -float(asc[j - 1]) - scale * 1e-12, hi0  # count(lo) >= j > count(hi)
            prev = cand_vals[-1] if cand_vals else None
            if prev is not None and prev < hi:
                hi = prev  # the j-th eigenvalue is at most the (j-1)-th (M(prev) is cached)
            if lo < above < hi and count(above) >= j:
                lo = above  # no pole inside: one sweep (the same t for every root), no bisection over the poles
            t = None
            while hi - lo > eps:
                P = poles(hi)
                inside = poles(lo) - P - (1 if on_pole(lo) else 0)  # diagonal values strictly inside (lo, hi)
                if inside <= 0 and 1 <= j - P <= c:
                    # no diagonal value inside: the root is where the (j - P)-th mu crosses 1, a continuous
                    # decreasing function here, so Newton's method (safeguarded) finishes it in a few steps
                    i = j - P - 1
                    glo, ghi = float(mus(lo)[i]) - 1.0, float(mus(hi)[i]) - 1.0
                    if hi == prev and ghi >= 0.0:
                        t = prev  # count(prev) >= j: a repeated eigenvalue (to rounding)
                        break
                    if glo >= 0.0 > ghi:
                        pole = -float(asc[P]) if P < asc.size else None  # the nearest diagonal values below
                        up = -float(asc[P - 1]) if P >= 1 else None  # and above
                        t = _secular_root(m_at, i, lo, hi, eps, pole, up, model) if glo > 0.0 else lo
                        break
                if inside >= 2:
                    # split the diagonal values inside in half: mid between the middle one and the next below it
                    a_ = P + (inside - 1) // 2
                    mid = 0.5 * (-float(asc[a_]) - float(asc[a_ + 1]))
                    if not lo < mid < hi or on_pole(mid):
                        mid = 0.5 * (lo + hi)
                elif inside == 1:
                    # one value -D inside: which side of it is the root? a point close above it first (the root
                    # above it: a bracket without poles), then one close below; a root closer to the pole than that
                    # brings both in by the same factor
                    q = -float(asc[P])
                    mid = q + 1e-3 * (hi - q)
                    if not lo < mid < hi or on_pole(mid):
                        mid = 0.5 * (lo + hi)
                    elif count(mid) < j:
                        hi = mid
                        mid = q - 1e-3 * (q - lo)
                        if not lo < mid < hi or on_pole(mid):
                            mid = 0.5 * (lo + hi)
                else:
                    mid = 0.5 * (lo + hi)
                if mid in (lo, hi):
                    break
                if on_pole(mid) or count(mid) >= j:
                    lo = mid
                else:
                    hi = mid
            if t is None:
                t = lo if lo in cache else hi if hi in cache else 0.5 * (lo + hi)
            w, Y = np.linalg.eigh(m_at(t)[0])
            # a repeated eigenvalue: the next eigenvector of M(t) near 1 not taken yet
            same = sum(1 for v in cand_vals if abs(v - t) <= 1e3 * eps)
            order = np.argsort(np.abs(w - 1.0))
            cand_vals.append(t)
            cand_ys.append(B @ Y[:, order[min(same, c - 1)]])
    for i in np.flatnonzero(zero)[np.argsort(Da[zero])][:k]:
        cand_vals.append(-float(Da[i]))
        cand_ys.append(int(i))
    if len(cand_vals) < k:
        return None
    order = np.argsort(-np.asarray(cand_vals), kind="stable")[:k]
    vals = np.asarray(cand_vals)[order]
    cols = [j for j, i in enumerate(order) if not isinstance(cand_ys[i], int)]
    whole = len(cols) == k and live.size == m
    V = np.empty((m, k)) if whole else np.zeros((m, k))  # every row written below when whole
    if cols:  # every root's eigenvector in one sweep over Ql (one product with its c x k y's), not one a root
        Yk = np.column_stack([cand_ys[order[j]] for j in cols])
        tk = vals[cols]

        def vectors(lo: int, hi: int) -> None:
            for a in range(lo, hi, _SECULAR_CHUNK):
                sl = slice(a, min(a + _SECULAR_CHUNK, hi))
                blk = (Ql[sl] @ Yk) / (tk[None, :] + Dl[sl, None])
                if whole:
                    V[sl] = blk
                else:
                    V[live[sl][:, None], cols] = blk
        _over_pieces(vectors, live.size)
    for j, i in enumerate(order):
        if isinstance(cand_ys[i], int):
            V[cand_ys[i], j] = 1.0
    V = _orth(V, inplace=True)  # orthonormal (already so, up to rounding, for distinct eigenvalues)
    QtV = Qa.T @ V

    res = _column_norms(m, k, lambda sl: Qa[sl] @ QtV - (Da[sl, None] + vals[None, :]) * V[sl])  # ||A v - t v||
    if not np.all(np.isfinite(res)) or np.any(res > 1e-8 * scale):
        return None
    return vals, V


def _orth(S: np.ndarray, *, inplace: bool = False) -> np.ndarray:
    """An orthonormal basis of the columns of a tall S (d x b), by Cholesky QR twice: one b x b Gram and one d x b
    array at a time (LAPACK's QR of a 30M x 6 array holds four copies of it); ``inplace``: S itself is overwritten,
    slab by slab, and no d x b array is made (unless the Gram is not numerically positive definite: then
    ``numpy.linalg.qr``, as without ``inplace``)."""
    Q = S
    for _ in range(2):
        G = _gram(Q) if inplace else Q.T @ Q
        try:
            Lc = np.linalg.cholesky(0.5 * (G + G.T))
        except np.linalg.LinAlgError:
            return np.linalg.qr(S)[0]
        T = np.linalg.inv(Lc).T
        if inplace:
            def apply(lo: int, hi: int, Q: np.ndarray = Q, T: np.ndarray = T) -> None:
                for a in range(lo, hi, _SECULAR_CHUNK):
                    Q[a:min(a + _SECULAR_CHUNK, hi)] = Q[a:min(a + _SECULAR_CHUNK, hi)] @ T
            _over_pieces(apply, Q.shape[0])
        else:
            Q = Q @ T
    return Q


def _column_norms(m: int, k: int, rows: Any) -> np.ndarray:
    """The norms of the k columns of an m x k matrix given by ``rows(slice)`` (its rows in that slice), made and
    summed in row slabs side by side in threads (:func:`_over_pieces`): no m x k temporary, every row read once."""
    def part(lo: int, hi: int) -> np.ndarray:
        r2 = np.zeros(k)
        for a in range(lo, hi, _SECULAR_CHUNK):
            R = rows(slice(a, min(a + _SECULAR_CHUNK, hi)))
            r2 += np.einsum("ij,ij->j", R, R)
        return r2
    return np.sqrt(sum(_over_pieces(part, m), np.zeros(k)))


def _residual_norms(S: np.ndarray, V: np.ndarray, theta: np.ndarray, k: int) -> np.ndarray:
    """||S[:, j] - theta_j V[:, j]|| for the first k columns of the d x b arrays S and V (:func:`_column_norms`;
    column by column, each norm read a column of a C-order array, a cache line for 8 bytes: on 1M x 20, 0.16 s an
    iteration of the PCA start against its two passes' 0.45 s)."""
    return _column_norms(S.shape[0], k, lambda sl: S[sl, :k] - theta[None, :k] * V[sl, :k])


def _top_scatter(Zc: _Centred, k: int, rng: np.random.Generator, *, tol: float = _PCA_TOL,
                 max_iter: int = _PCA_MAXITER, V0: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray, int, bool]:
    """The largest ``k`` eigenpairs of S_t = Zc^T Zc by block subspace iteration with Rayleigh-Ritz: a block of
    k + max(4, k) columns (or ``V0``'s, a start), two passes an iteration (Zc V, then Zc^T of it), which holds two
    d x block arrays and one n x block array (Lanczos over d would hold 20 d-vectors and make two passes per
    vector). Stops when every one of the k residuals ||S v - theta v|| is below ``tol`` times the largest Ritz
    value. Returns (values, vectors, products, converged)."""
    d = Zc.d
    b = min(d, k + max(4, k)) if V0 is None else V0.shape[1]
    # in place where the array is ours (a fresh d x b array for each Cholesky QR pass faulted its pages in: 0.23 s
    # a call on 1M x 20, against 0.10 s)
    V = _orth(rng.standard_normal((d, b)), inplace=True) if V0 is None else _orth(V0)
    products, converged = 0, False
    theta = np.zeros(b)
    for _ in range(max_iter):
        T = Zc.matvec(V)  # n x b
        G = T.T @ T
        theta, R = np.linalg.eigh(0.5 * (G + G.T))
        theta, R = theta[::-1], R[:, ::-1]
        V = V @ R  # Ritz vectors
        S = Zc.rmatvec(T @ R)  # S_t V, d x b
        del T
        products += b
        res = _residual_norms(S, V, theta, k)
        log.info("ufcm: PCA start, block iteration %d: top eigenvalues %s, largest relative residual %.3g",
                 products // b, np.array2string(theta[:k], precision=6),
                 float(res.max()) / max(abs(theta[0]), np.finfo(float).tiny))
        if np.all(res <= tol * max(abs(theta[0]), np.finfo(float).tiny)):
            converged = True
            break
        del V
        V = _orth(S, inplace=True)
        del S
    return theta[:k], V[:, :k], products, converged


def _w_step(Zc: _Centred, St: np.ndarray | None, Q: np.ndarray, counts: np.ndarray, Dd: np.ndarray,
            active: np.ndarray, k: int, alpha: float, beta: float, *, tol: float = 0.0, v0: Any = None,
            X0: Any = None, q_scaled: bool = False, out: np.ndarray | None = None
            ) -> tuple[np.ndarray, np.ndarray, int]:
    """The largest ``k`` eigenpairs of A = (1 - alpha) S_t + alpha Q diag(1/n_k) Q^T - beta D on the ``active``
    features (the others held at zero): dense when ``St`` is given, else matrix-free with two passes per product:
    LOBPCG on blocks warm-started from ``X0`` (the previous W on the active features; its Rayleigh-Ritz step keeps
    trace(W^T A W) at least the start's, so the objective stays monotone), or Lanczos (``eigsh``) without ``X0``.
    ``X0`` may also be the previous W over all features: it is then sliced only if LOBPCG runs (at kddb size the
    slice is a d x k copy the secular solve does not need). ``q_scaled``: ``Q`` is already Q diag(1/sqrt(n_k)) (the
    caller scaled it in place: no second d x c array).
    Returns (eigenvalues descending, W (d x k), products made)."""
    d = Zc.d
    Qs = Q if q_scaled else Q / np.sqrt(counts)[None, :]
    idx = np.flatnonzero(active)
    if St is not None:
        A = (1.0 - alpha) * St[np.ix_(idx, idx)] + alpha * (Qs[idx] @ Qs[idx].T)
        A[np.diag_indices_from(A)] -= beta * Dd[idx]
        vals, V = _top_dense(A, k)
        return vals, _on_features(d, idx, V, out), 0
    from scipy.sparse.linalg import LinearOperator, eigsh

    nprod = [0]
    Qa, Da = (Qs, Dd) if idx.size == d else (Qs[idx], Dd[idx])  # no copy when every feature is active
    if alpha == 1.0:  # A = Q diag(1/n_k) Q^T - beta D: a diagonal plus rank c, solved without passes
        got = _top_lowrank(Qa, beta * Da, k)
        if got is not None:
            return got[0], _on_features(d, idx, got[1], out), 0
    if X0 is not None and X0.shape[0] != idx.size:  # the previous W over all features
        X0 = X0[idx]

    def apply(X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        one = X.ndim == 1
        X2 = X[:, None] if one else X
        nprod[0] += X2.shape[1]
        out = Qa @ (Qa.T @ X2)
        if alpha != 1.0:  # the scatter's part, two passes over the data from all features' rows
            full = np.zeros((d, X2.shape[1]))
            full[idx] = X2
            out *= alpha
            out += (1.0 - alpha) * Zc.rmatvec(Zc.matvec(full))[idx]
            del full
        # alpha = 1 (the default) needs no d x p array of all features: at kddb size that one (960 MB, made for
        # every product and not used) was part of the driver's 17.7 GB when the secular solve fell back to LOBPCG
        out -= beta * Da[:, None] * X2
        return out[:, 0] if one else out

    op = LinearOperator((idx.size, idx.size), matvec=apply, matmat=apply, dtype=np.float64)
    if X0 is not None:
        import warnings

        from scipy.sparse.linalg import lobpcg

        # a block of k + a few columns: each LOBPCG iteration is one block product (two passes), against one
        # pass pair per vector for Lanczos (measured on a 20k x 50k store: 197 passes an iteration with eigsh)
        rng = np.random.default_rng(0)
        extra = min(max(2, k // 2), max(0, idx.size - k))
        X = np.hstack([X0, rng.standard_normal((idx.size, extra))]) if extra else np.array(X0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "not reaching the requested tolerance": the best block is kept
            vals, V = lobpcg(op, X, largest=True, tol=tol or 1e-6, maxiter=_LOBPCG_MAXITER)
        order = np.argsort(-vals)[:k]
        return vals[order], _on_features(d, idx, V[:, order], out), nprod[0]
    vals, V = eigsh(op, k=k, which="LA", tol=tol, v0=v0)
    order = np.argsort(-vals)
    return vals[order], _on_features(d, idx, V[:, order], out), nprod[0]


def _on_features(d: int, idx: np.ndarray, V: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """W (d x k): ``V``'s rows on the features ``idx``, zero elsewhere (``V`` itself, contiguous, when ``idx`` is
    every feature: no second d x k array at kddb size), written into ``out`` (an array the caller is done with, of
    that shape) when given: a fresh d x k array's pages faulted in took 40-180 ms of a 0.7 s iteration at 1M x 10,
    rewriting one 12 ms."""
    if idx.size == d:
        return np.ascontiguousarray(V)
    if out is not None and out.shape == (d, V.shape[1]) and out.dtype == np.float64 and out.flags.c_contiguous \
            and out.flags.writeable and not np.shares_memory(out, V):
        out.fill(0.0)
        out[idx] = V
        return out
    W = np.zeros((d, V.shape[1]))
    W[idx] = V
    return W


def _rows_take(X: Any, start: int, rate: float, seed: int) -> Any:
    """A uniform sample of a row block's rows (each kept with probability ``rate``, seeded by the block)."""
    keep = np.random.default_rng([seed, start]).random(X.shape[0]) < rate
    return X[np.flatnonzero(keep)]


def _sample_pca_start(M: Matrix, Zc: _Centred, k: int, seed: int, rng: np.random.Generator
                      ) -> tuple[np.ndarray, np.ndarray, int, bool]:
    """The PCA start above ``_PCA_SAMPLE_ABOVE`` samples: the top k principal directions of a uniform sample of
    ``_PCA_SAMPLE`` rows (taken by the row blocks, centred by its own means, in this process: every product is
    in memory and only the features the sample holds take part), then ``_PCA_REFINE`` block iterations on all rows
    from there (two passes each, k columns), which give every feature with data its row of W. A full-data
    subspace iteration from random would take tens of iterations of two passes at kddb size (the top eigenvalues
    of clustered sparse data are close together)."""
    from scipy.sparse.linalg import LinearOperator, eigsh

    from dufs.engine.rows import Rows

    n, d = Zc.n, Zc.d
    rows = Rows.of(M)
    rate = min(1.0, _PCA_SAMPLE / n)
    Xs = sp.csr_array(rows.map(_rows_take, args=(rate, seed), n_rows=int(rate * n)).gather("the PCA sample"))
    cols = np.unique(Xs.indices)
    _, inv = M.transform
    w = np.ones(cols.size) if inv is None else np.asarray(inv, dtype=np.float64)[cols]
    Xc = sp.csc_array(Xs[:, cols] @ sp.diags_array(w)).astype(np.float64)
    ns = Xc.shape[0]
    mean = np.asarray(Xc.sum(axis=0)).ravel() / max(ns, 1)

    def st(v: np.ndarray) -> np.ndarray:  # the sample's centred scatter, never formed
        t = Xc @ v - mean @ v
        return Xc.T @ t - mean * t.sum(axis=0)

    kk = min(k, cols.size - 1)
    V0 = rng.standard_normal((d, k))
    if kk >= 1 and ns > 1:
        op = LinearOperator((cols.size, cols.size), matvec=st, matmat=st, dtype=np.float64)
        _, E = eigsh(op, k=kk, which="LA", v0=rng.standard_normal(cols.size))
        V0[:] = 0.0
        V0[cols, :kk] = E
        if kk < k:
            V0[:, kk:] = rng.standard_normal((d, k - kk))
    log.info("ufcm: PCA start from a sample of %d rows (%d features), refined on all rows", ns, cols.size)
    del Xs
    return _top_scatter(Zc, k, rng, max_iter=_PCA_REFINE, V0=V0)


# ---------------------------------------------------------------------------------------------------- validation
def _int_param(name: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low or (
            high is not None and value > high):
        rng = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ParameterError(f"The '{name}' parameter of ufcm must be an int {rng}; got {value!r}.")
    return int(value)


# ---------------------------------------------------------------------------------------------------- UFCM
def ufcm(M: Matrix, *, n_clusters: int, n_components: int, alpha: float = 1.0, beta: float = 1.0, p: float = 1.0,
         max_iter: int = 30, n_init: int = 10, tol: float = 1e-6, random_state: int = 0,
         dense_below: int = 2000) -> UFCMResult:
    """UFCM (Algorithm 1 of paper 003) on the matrix's transformed data, centred implicitly.

    Parameters
    ----------
    M : Matrix
        The data (its ``standardize`` transform is applied, then the columns are centred inside every product).
    n_clusters : int
        c, the number of k-means clusters (pseudo classes), in [2, n_samples - 1].
    n_components : int
        d', the columns of W, in [1, n_features - 1].
    alpha, beta : float >= 0
        Weights of the k-means term and of the l2,p penalty in eq. (6).
    p : float in (0, 2]
        The l2,p exponent (Proposition 1 needs p <= 2).
    max_iter : int >= 1
        Outer iterations (steps 6-9 of Algorithm 1).
    n_init : int >= 0
        Random k-means restarts among the U step's candidates (eq. (14); the paper's r = 10).
    tol : float >= 0
        Stop when the objective rises by less than ``tol * max(1, |f|)`` in an iteration.
    random_state : int
        Seeds k-means and the Lanczos start vectors.
    dense_below : int
        Below this many features the W step is a dense ``eigh`` of the d x d matrix; above, matrix-free Lanczos.

    Returns
    -------
    UFCMResult

    References
    ----------
    Wang et al., ECML PKDD 2015, eq. (6), (7), (10), (13), (14), Algorithm 1.
    """
    if not isinstance(M, Matrix):
        raise ParameterError(f"ufcm needs a dufs.engine.Matrix; got {type(M).__name__} (use dufs.engine.as_matrix)")
    n, d = M.shape
    c = _int_param("n_clusters", n_clusters, 1, max(1, n - 1))
    k = _int_param("n_components", n_components, 1, max(1, d - 1))
    check_params(UFCM_PARAMS, {"alpha": alpha, "beta": beta, "p": p, "max_iter": max_iter, "n_init": n_init,
                               "tol": tol, "random_state": random_state, "dense_below": dense_below}, "ufcm")
    alpha, beta, p, tol = float(alpha), float(beta), float(p), float(tol)
    max_iter, n_init, dense_below = int(max_iter), int(n_init), int(dense_below)
    seed = _int_param("random_state", random_state, 0, 2**32 - 1)
    if c > n - 1 or k > d - 1:
        raise ParameterError(f"ufcm needs n_clusters < n_samples and n_components < n_features; the data are {n} x {d}")
    from dufs.engine.rows import max_task_bytes

    if n * max(k, c) * 8 > max_task_bytes():
        raise ParameterError(f"ufcm: Zc W and the cluster indicators are {n:,} x {max(k, c)} (n_components, "
                             f"n_clusters) in float64, over dufs.engine.max-task-bytes "
                             f"({max_task_bytes() / 2**30:.2f} GiB); use fewer clusters or components, or raise "
                             f"the bound")
    rng = np.random.default_rng(seed)

    def seeds(m: int) -> list[int]:
        return [int(s) for s in rng.integers(0, 2**31 - 1, size=m)]

    timings: dict[str, float] = {"setup": 0.0, "u_step": 0.0, "w_step": 0.0, "g_step": 0.0}
    passes0 = M.passes
    t0 = time.perf_counter()
    Zc = _Centred(M)
    dense = d < dense_below
    St = Zc.scatter() if dense else None
    everyone = np.ones(d, dtype=bool)
    # step 3: W by PCA (the top d' eigenvectors of S_t)
    pca_converged = True
    if dense:
        _, W, nprod = _w_step(Zc, St, np.zeros((d, c)), np.ones(c), np.zeros(d), everyone, k, 0.0, 0.0)
    else:
        start = _sample_pca_start if n > _PCA_SAMPLE_ABOVE else None
        _, W, nprod, pca_converged = start(M, Zc, k, seed, rng) if start else _top_scatter(Zc, k, rng)
        if not pca_converged and start is None:
            log.warning("ufcm: the PCA start did not converge in %d block iterations; the iterations start from "
                        "the subspace reached", _PCA_MAXITER)
    W = np.ascontiguousarray(W, dtype=np.float64)  # C order: the first W step writes its W here (_on_features)
    Y = Zc.matvec(W)
    # step 4: U by k-means on W^T x_i (the best of 1 + n_init runs by the k-means term)
    labels, _, _ = _choose(Y, c, [], seeds(max(1, n_init)), seed)
    C, counts = _centroids(Y, labels, c)
    f = ufcm_objective(Y, W, labels, C.T, alpha, beta, p)
    timings["setup"] = time.perf_counter() - t0
    objective = [f]
    history: list[dict] = []
    converged = False
    products = nprod
    # matrix-free, the workers make the passes (one_blas_thread); the dense path's d x d eigh keeps its threads
    with one_blas_thread() if not dense else contextlib.nullcontext():
        for it in range(max_iter):
            t_it = time.perf_counter()
            # step 6: D (eq. (7)); rows at zero stay there
            r = np.sqrt(np.einsum("ij,ij->i", W, W))
            active = r > _EPS
            if active.sum() <= k:
                active = everyone
            Dd = np.zeros(d)
            Dd[active] = p / (2.0 * np.maximum(r[active], _EPS) ** (2.0 - p))
            # step 7: U (eq. (14)): current U, Lloyd from the current centroids, n_init random starts
            t1 = time.perf_counter()
            s1, ss = seeds(1)[0], seeds(n_init)
            labels, km, chosen = _choose(Y, c, [labels, functools.partial(_kmeans, Y, c, C, s1)], ss, s1)
            timings["u_step"] += time.perf_counter() - t1
            # step 8: W, the largest eigenvectors of S_t - alpha S_w - beta D (eq. (13))
            t1 = time.perf_counter()
            counts = np.bincount(labels, minlength=c).astype(np.float64)
            Q = Zc.label_rmatvec(labels, c, counts)  # Zc^T U, U the labels' indicator
            Q /= np.sqrt(counts)[None, :]  # Q diag(1/sqrt(n_k)), in place: the W step's form, and G's below
            # the previous W is the LOBPCG start (read before the new W is written) and, done with, the new W's memory
            vals, W, nprod = _w_step(Zc, St, Q, counts, Dd, active, k, alpha, beta, X0=None if dense else W,
                                     q_scaled=True, out=W)
            products += nprod
            timings["w_step"] += time.perf_counter() - t1
            # step 9: G (eq. (10)), and Y = Zc W for the next U step and the objective
            t1 = time.perf_counter()
            G = (W.T @ Q) / np.sqrt(counts)[None, :]
            Y = Zc.matvec(W)
            C = G.T
            timings["g_step"] += time.perf_counter() - t1
            f_new = ufcm_objective(Y, W, labels, G, alpha, beta, p)
            objective.append(f_new)
            history.append({"iteration": it + 1, "objective": f_new, "kmeans_term": km, "u_candidate": chosen,
                            "eigenvalues": vals.tolist(), "active_features": int(active.sum()),
                            "seconds": time.perf_counter() - t_it})
            log.info("ufcm iteration %d: objective %.10g (U candidate %d, %.1f s)", it + 1, f_new, chosen,
                     history[-1]["seconds"])
            rise = f_new - f
            f = f_new
            if abs(rise) <= tol * max(1.0, abs(f)):
                converged = True
                break
    G = C.T
    scores = np.sqrt(np.einsum("ij,ij->i", W, W))
    diagnostics = {"iterations": len(history), "converged": converged, "timings": timings,
                   "seconds": time.perf_counter() - t0, "passes": M.passes - passes0, "dense": dense,
                   "pca_converged": pca_converged,
                   "operator_products": products, "history": history}
    return UFCMResult(W=W, labels=labels, G=G, scores=scores, objective=np.asarray(objective), diagnostics=diagnostics)
