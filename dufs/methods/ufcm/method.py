"""UFCM as ``dufs.fit`` runs it: the parameters, the alternation of Algorithm 1 and its objective."""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import numpy as np

from dufs._logging import get_logger
from dufs.engine import VALUES, Matrix, current_client, is_lost, kept_vectors, piece_workers, sparse_counts
from dufs.errors import ParameterError
from dufs.methods.params import SEED, Interval, Param, StrOptions, check_params, integer, nonnegative, table
from dufs.methods.ufcm.clusters import _centroids, _choose, _km_term, _kmeans
from dufs.methods.ufcm.features import FeatureSide, NoPieces, feature_pieces
from dufs.methods.ufcm.kept import KeptY
from dufs.methods.ufcm.pieces import PieceY
from dufs.methods.ufcm.scatter import (
    _PCA_MAXITER,
    _PCA_REFINE,
    _PCA_TOL,
    _Centred,
    _top_scatter,
    _w_step,
    random_start,
    sample_start,
)
from dufs.scheduling import one_blas_thread

#: UFCM's parameters (``n_components`` None: the number of clusters, at most n_features - 1)
UFCM_PARAMS = table(
    Param("n_clusters", "auto", (integer(1), StrOptions({"auto"})),
          "k-means clusters of the pseudo-labels; 'auto': estimated (methods.graph.estimate_clusters)"),
    Param("n_components", None, (None, integer(1)), "d', the columns of W"),
    Param("alpha", 1.0, (nonnegative(),), "weight of the within-cluster scatter"),
    Param("beta", 1.0, (nonnegative(),), "weight of the l2,p row-sparsity term"),
    Param("p", 1.0, (Interval(Real, 0, 2, closed="right"),), "the p of ||W||_{2,p}^p"),
    Param("max_iter", 30, (integer(1),), "outer iterations"),
    Param("n_init", 10, (integer(0),), "k-means restarts of each U step"),
    Param("tol", 1e-6, (nonnegative(),), "relative objective decrease to stop", estimator=False),
    SEED,
    Param("dense_below", 2000, (integer(0),), "features below which the W step is dense", estimator=False),
    Param("values", "auto", (StrOptions({"auto", *VALUES}),),
          "what UFCM reads of each stored value (raw, presence, log1p, sqrt); 'auto': presence for sparse "
          "non-negative data taken unstandardized (counts), raw otherwise"),
)

#: what ``values="auto"`` reads of sparse non-negative unstandardized data (docs/methods.md, "What UFCM reads")
SPARSE_VALUES = "presence"


log = get_logger(__name__)
_PCA_SAMPLE_ABOVE = 1 << 20  # samples above which the PCA start is estimated on a sample of rows, then refined
_EPS = 1e-10  # a row of W (norms are <= 1 since W^T W = I) below this is held at zero


@dataclass
class UFCMResult:
    """``W`` (n_features x n_components; None where ``keep_w`` left it out), the cluster ``labels`` (n_samples,
    int32), the centroids ``G``
    (n_components x n_clusters), ``scores`` = the row norms of W (larger is better), the ``objective`` (eq. (6))
    at the start and after every iteration, and ``diagnostics`` (iterations, timings, converged, ...)."""

    W: np.ndarray | None
    labels: np.ndarray
    G: np.ndarray
    scores: np.ndarray
    objective: np.ndarray
    diagnostics: dict = field(default_factory=dict)


def _penalty(W: np.ndarray, p: float) -> float:
    r = np.sqrt(np.einsum("ij,ij->i", W, W))
    return float(np.sum(r[r > 0] ** p))


def ufcm_objective(Y: np.ndarray, W: np.ndarray, labels: np.ndarray, G: np.ndarray, alpha: float, beta: float,
                   p: float) -> float:
    """Eq. (6) from Y = Zc W: ||Y||_F^2 - alpha ||Y - U G^T||_F^2 - beta ||W||_{2,p}^p (Tr(W^T S_t W) = ||Zc W||^2)."""
    return _objective(np.einsum("ij,ij->", Y, Y), _km_term(Y, labels, G.T), W, alpha, beta, p)


def _objective(yy: Any, km: float, W: np.ndarray, alpha: float, beta: float, p: float) -> float:
    """Eq. (6) from ||Y||_F^2 and the k-means term (made where Y is: :mod:`dufs.methods.ufcm.kept`)."""
    return float(yy - alpha * km - beta * _penalty(W, p))


# ---------------------------------------------------------------------------------------------------- validation
def _transform_row(M: Matrix, W: np.ndarray) -> np.ndarray | None:
    """The transform's centring row times W (as :meth:`Matrix.matvec` with ``hold`` returns it), or None."""
    mu, inv = M.transform
    if mu is None:
        return None
    return ((mu * inv) if inv is not None else np.asarray(mu, dtype=np.float64)) @ W


def _int_param(name: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low or (
            high is not None and value > high):
        rng = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ParameterError(f"The '{name}' parameter of ufcm must be an int {rng}; got {value!r}.")
    return int(value)


# ---------------------------------------------------------------------------------------------------- UFCM
def ufcm(M: Matrix, *, n_clusters: int, n_components: int, alpha: float = 1.0, beta: float = 1.0, p: float = 1.0,
         max_iter: int = 30, n_init: int = 10, tol: float = 1e-6, random_state: int = 0,
         dense_below: int = 2000, values: str = "auto", keep_w: bool = True) -> UFCMResult:
    """UFCM (Algorithm 1 of paper 003) on the matrix's transformed data, centred implicitly.

    Parameters
    ----------
    M : Matrix
        The data (its values read as ``values`` says, its ``standardize`` transform applied, then the columns
        centred inside every product).
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
    values : {"auto", "raw", "presence", "log1p", "sqrt"}
        What the method reads of each stored value (:meth:`Matrix.with_values`, in blocks of its own released at
        the end): ``"auto"`` reads as M does where M reads anything but raw values, else ``"presence"`` (1 for
        every stored value) where M is sparse, non-negative and unstandardized (:func:`dufs.engine.sparse_counts`:
        counts), else raw values. A departure from the paper, which reads the values: on sparse counts a few large
        counts decide the principal directions and the clusters (docs/methods.md, "What UFCM reads").
        ``diagnostics["values"]`` records the reading.
    keep_w : bool
        False: ``W`` is left out of the result (None) where its rows are kept in pieces beside the blocks (workers
        on several machines): at kddb size it is n_components d-vectors, where the scores are one.

    Returns
    -------
    UFCMResult

    References
    ----------
    Wang et al., ECML PKDD 2015, eq. (6), (7), (10), (13), (14), Algorithm 1.
    """
    c, k, alpha, beta, p, tol, max_iter, n_init, dense_below, seed = _checked(
        M, n_clusters=n_clusters, n_components=n_components, alpha=alpha, beta=beta, p=p, max_iter=max_iter,
        n_init=n_init, tol=tol, random_state=random_state, dense_below=dense_below)
    check_params(UFCM_PARAMS, {"values": values}, "ufcm")
    read = ufcm_values(M, values)
    V = M.with_values(read)
    try:
        res = _ufcm(V, c, k, alpha, beta, p, tol, max_iter, n_init, dense_below, seed, keep_w=keep_w)
    finally:
        if V is not M:  # blocks of its own: dropped; its passes were over M's data
            M.count_passes(V.passes)
            V.release()
    res.diagnostics["values"] = read
    return res


def ufcm_values(M: Matrix, values: str = "auto") -> str:
    """What :func:`ufcm` reads of each of M's stored values for its ``values`` parameter: ``"auto"`` is M's own
    reading where it is not raw, :data:`SPARSE_VALUES` for sparse non-negative unstandardized data, raw
    otherwise."""
    if values != "auto":
        return values
    if M.values != "raw":
        return M.values
    return SPARSE_VALUES if sparse_counts(M) else "raw"


def _ufcm(M: Matrix, c: int, k: int, alpha: float, beta: float, p: float, tol: float, max_iter: int, n_init: int,
          dense_below: int, seed: int, *, keep_w: bool = True) -> UFCMResult:
    """Algorithm 1 on M as it reads its values, the parameters checked (:func:`ufcm`)."""
    passes0 = M.passes
    t0 = time.perf_counter()
    run = _Run(M, c, k, alpha, beta, p, n_init, seed, dense_below)
    restarts = 0
    while True:
        try:
            W, Y, labels, C, f, products, pca_converged = run.start()
            run.timings["setup"] = time.perf_counter() - t0
            objective = [f]
            history: list[dict] = []
            converged = False
            change = None  # the last iteration's |rise| / max(1, |f|), against tol
            # matrix-free, the workers make the passes (one_blas_thread); the dense path's d x d eigh keeps its
            # threads
            with one_blas_thread() if not run.dense else contextlib.nullcontext():
                for it in range(max_iter):
                    W, Y, labels, C, f_new, entry, nprod = run.iteration(W, Y, labels, C, it)
                    products += nprod
                    objective.append(f_new)
                    history.append(entry)
                    log.info("ufcm iteration %d: objective %.10g (U candidate %d, %.1f s)", it + 1, f_new,
                             entry["u_candidate"], entry["seconds"])
                    rise = f_new - f
                    f = f_new
                    change = abs(rise) / max(1.0, abs(f))
                    if abs(rise) <= tol * max(1.0, abs(f)):
                        converged = True
                        break
            scores = None
            if run.fside is not None:  # W, kept in pieces beside the blocks: its row norms, W where asked for
                scores = run.fside.scores()
                W = run.fside.result() if keep_w else None
                run.fside.release()
            break
        except Exception as e:
            if run.fside is None or not is_lost(e) or restarts:
                raise
            # W's rows on a worker that left are gone with it: the alternation again from its start, W on the
            # driver (docs/scaling.md, "UFCM's W step beside the blocks")
            log.warning("ufcm: %s; W's pieces were lost: the iterations start again, W on the driver", e)
            restarts += 1
            with contextlib.suppress(Exception):
                run.fside.release()
            run.fside, run.pieces, run.want_pieces, run.w_side = None, None, False, "driver"
            run.rng = np.random.default_rng(seed)  # the same seeds as a run that kept W on the driver
    G = C.T
    if run.side is not None:  # the labels, kept on a worker, brought here once
        labels = run.side.result()
    labels = np.asarray(labels).astype(np.int32, copy=False)  # (as scikit-learn's KMeans gives them)
    if scores is None:
        scores = np.sqrt(np.einsum("ij,ij->i", W, W))
    if not converged:
        log.warning("ufcm: stopped at max_iter = %d before converging (relative change of the objective %.3g "
                    "against tol %g)", max_iter, change, tol)
    diagnostics = {"iterations": len(history), "converged": converged,
                   "stopped": "converged" if converged else "max_iter",
                   "convergence": {"measure": "relative change of the objective", "value": change, "tol": tol},
                   "timings": run.timings,
                   "seconds": time.perf_counter() - t0, "passes": M.passes - passes0, "dense": run.dense,
                   "pca_converged": pca_converged, "w_side": run.w_side, "y_side": run.y_side,
                   "restarts": restarts,
                   "operator_products": products, "history": history}
    return UFCMResult(W=W, labels=labels, G=G, scores=scores, objective=np.asarray(objective), diagnostics=diagnostics)


def _checked(M: Any, *, n_clusters: Any, n_components: Any, alpha: Any, beta: Any, p: Any, max_iter: Any,
             n_init: Any, tol: Any, random_state: Any, dense_below: Any) -> tuple:
    """:func:`ufcm`'s parameters checked: (c, d', alpha, beta, p, tol, max_iter, n_init, dense_below, seed)."""
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
    from dufs.engine import max_task_bytes

    if n * max(k, c) * 8 > max_task_bytes():
        raise ParameterError(f"ufcm: Zc W and the cluster indicators are {n:,} x {max(k, c)} (n_components, "
                             f"n_clusters) in float64, over dufs.engine.max-task-bytes "
                             f"({max_task_bytes() / 2**30:.2f} GiB); use fewer clusters or components, or raise "
                             f"the bound")
    return c, k, alpha, beta, p, tol, max_iter, n_init, dense_below, seed


class _Run:
    """One run of Algorithm 1: the centred data (its scatter S_t too below ``dense_below`` features), the weights,
    the random stream that seeds k-means and Lanczos, and the steps' timings."""

    def __init__(self, M: Matrix, c: int, k: int, alpha: float, beta: float, p: float, n_init: int, seed: int,
                 dense_below: int):
        self.M, self.c, self.k, self.alpha, self.beta, self.p, self.n_init, self.seed = \
            M, c, k, alpha, beta, p, n_init, seed
        self.rng = np.random.default_rng(seed)
        self.timings: dict[str, float] = {"setup": 0.0, "u_step": 0.0, "w_step": 0.0, "g_step": 0.0}
        self.Zc = _Centred(M)
        self.d = M.shape[1]
        self.dense = self.d < dense_below
        self.St = self.Zc.scatter() if self.dense else None
        self.everyone = np.ones(self.d, dtype=bool)
        # Y and the labels kept on a worker where the workers are on several machines (dufs.engine.kept), and
        # there W's rows in pieces beside the blocks where the W step makes no pass (alpha = 1: features.py)
        self.side = KeptY() if kept_vectors(current_client()) else None
        self.pca_side = self.side  # the PCA start's n x block array on that worker
        self.y_side = "driver" if self.side is None else "one worker"
        self.want_pieces = self.side is not None and alpha == 1.0 and not self.dense
        self.pieces = None  # (blocks, workers) of W's pieces: read at the start, where the blocks are then
        self.fside: FeatureSide | None = None
        self.w_side = "driver"
        self.centring: tuple = (None, None)  # (m^T W, the transform's row times W) of the kept W

    def seeds(self, m: int) -> list[int]:
        return [int(s) for s in self.rng.integers(0, 2**31 - 1, size=m)]

    def start(self) -> tuple:
        """Steps 3 and 4: W by PCA (the top d' eigenvectors of S_t), U by k-means on W^T x_i (the best of
        1 + n_init runs by the k-means term); (W, Y = Zc W, labels, centroids, the objective, operator products,
        whether the PCA start converged)."""
        M, Zc, c, k, d = self.M, self.Zc, self.c, self.k, self.d
        pca_converged = True
        f_pen = None
        if self.dense:
            _, W, nprod = _w_step(Zc, self.St, np.zeros((d, c)), np.ones(c), np.zeros(d), self.everyone, k, 0.0, 0.0)
        else:
            if M.shape[0] > _PCA_SAMPLE_ABOVE:  # on a sample of rows, then refined on all
                start, max_iter = sample_start(M, Zc, k, self.seed, self.rng), _PCA_REFINE
            else:
                start, max_iter = random_start(self.rng, d, min(d, k + max(4, k))), _PCA_MAXITER
            W = None
            self.pieces = feature_pieces(M) if self.want_pieces else None
            if self.pieces is not None:  # W's rows (and the PCA start's block) in pieces; none of it kept here
                try:
                    self.fside = FeatureSide(M, Zc.pieces_m(), start, *self.pieces)
                    got = self.fside.pca(self.pca_side, k, self.p, max_iter, _PCA_TOL)
                    nprod, pca_converged, f_pen = got["products"], got["converged"], got["penalty"]
                    self.centring = (got["mW"], got["shift"])
                    self.w_side = f"{len(self.pieces[0])} pieces"
                except NoPieces as e:
                    log.info("%s", e)
                    if self.fside is not None:
                        self.fside.release()
                    self.fside, self.pieces = None, None
            if self.fside is None:
                _, W, nprod, pca_converged = _top_scatter(Zc, k, self.rng, max_iter=max_iter, V0=start,
                                                          side=self.pca_side)
            if not pca_converged and M.shape[0] <= _PCA_SAMPLE_ABOVE:
                log.warning("ufcm: the PCA start did not converge in %d block iterations; the iterations start from "
                            "the subspace reached", _PCA_MAXITER)
        if W is not None:
            W = np.ascontiguousarray(W, dtype=np.float64)  # C order: the first W step writes its W here
        if self.side is not None:  # on the worker that keeps Y: nothing over the samples here
            starts = self.seeds(max(1, self.n_init))
            # Y and the labels in a piece of rows a machine where the workers are on several (pieces.py)
            workers = piece_workers(current_client(), M.shape[0])
            self.side = PieceY(workers, M.shape[0], k) if len(workers) > 1 else self.pca_side
            self.y_side = f"{len(workers)} pieces" if len(workers) > 1 else "one worker"
            if f_pen is None:
                f_pen = _penalty(W, self.p)

            def first() -> tuple:  # (Zc W from the pieces: summed where the pieces of Y are made, pieces.py)
                yy, _ = self.side.new_y(*(Zc.matvec_held(W) if W is not None else self._y_held()))
                return (yy, *self.side.start(c, starts, self.seed))

            yy, C, counts, km = self.side.again(first)
            f = float(yy - self.alpha * km - self.beta * f_pen)
            return W, None, None, C, f, nprod, pca_converged
        Y = Zc.matvec(W)
        labels, _, _ = _choose(Y, c, [], self.seeds(max(1, self.n_init)), self.seed)
        C, counts = _centroids(Y, labels, c)
        f = ufcm_objective(Y, W, labels, C.T, self.alpha, self.beta, self.p)
        return W, Y, labels, C, f, nprod, pca_converged

    def iteration(self, W: np.ndarray, Y: np.ndarray, labels: np.ndarray, C: np.ndarray, it: int) -> tuple:
        """Steps 6-9 of iteration ``it``: D, U, W (written into ``W``'s memory), G; (W, Y, labels, centroids, the
        objective, the iteration's record, operator products)."""
        if self.fside is not None:
            return self.iteration_pieces(C, it)
        t_it = time.perf_counter()
        Zc, c, k, p, timings = self.Zc, self.c, self.k, self.p, self.timings
        # step 6: D (eq. (7)); rows at zero stay there
        r = np.sqrt(np.einsum("ij,ij->i", W, W))
        active = r > _EPS
        if active.sum() <= k:
            active = self.everyone
        Dd = np.zeros(self.d)
        Dd[active] = p / (2.0 * np.maximum(r[active], _EPS) ** (2.0 - p))
        # step 7: U (eq. (14)): current U, Lloyd from the current centroids, n_init random starts
        t1 = time.perf_counter()
        s1, ss = self.seeds(1)[0], self.seeds(self.n_init)
        if self.side is not None:  # where Y and the labels are kept; Zc^T U, U the labels' indicator, from there

            def u_step() -> tuple:
                km, chosen, counts = self.side.u_step(c, C, s1, ss)
                return km, chosen, counts, Zc.label_rmatvec(self.side.codes(), c, counts)

            km, chosen, counts, Q = self.side.again(u_step, lambda: self.side.rebuild(*Zc.matvec_held(W), C))
            timings["u_step"] += time.perf_counter() - t1
        else:
            labels, km, chosen = _choose(Y, c, [labels, functools.partial(_kmeans, Y, c, C, s1)], ss, s1)
            counts = np.bincount(labels, minlength=c).astype(np.float64)
            timings["u_step"] += time.perf_counter() - t1
            Q = Zc.label_rmatvec(labels, c, counts)  # Zc^T U, U the labels' indicator
        # step 8: W, the largest eigenvectors of S_t - alpha S_w - beta D (eq. (13))
        t1 = time.perf_counter()
        Q /= np.sqrt(counts)[None, :]  # Q diag(1/sqrt(n_k)), in place: the W step's form, and G's below
        # the previous W is the LOBPCG start (read before the new W is written) and, done with, the new W's memory
        vals, W, nprod = _w_step(Zc, self.St, Q, counts, Dd, active, k, self.alpha, self.beta,
                                 X0=None if self.dense else W, q_scaled=True, out=W)
        timings["w_step"] += time.perf_counter() - t1
        # step 9: G (eq. (10)), and Y = Zc W for the next U step and the objective
        t1 = time.perf_counter()
        G = (W.T @ Q) / np.sqrt(counts)[None, :]
        if self.side is not None:  # (lost: the labels made again from G, which do not raise the objective)
            yy, km_g = self.side.again(lambda: self.side.new_y(*Zc.matvec_held(W), G),
                                   lambda: self.side.rebuild(*Zc.matvec_held(W), G.T), rerun=False)
        else:
            Y = Zc.matvec(W)
        C = G.T
        timings["g_step"] += time.perf_counter() - t1
        f_new = _objective(yy, km_g, W, self.alpha, self.beta, p) if self.side is not None else \
            ufcm_objective(Y, W, labels, G, self.alpha, self.beta, p)
        entry = {"iteration": it + 1, "objective": f_new, "kmeans_term": km, "u_candidate": chosen,
                 "eigenvalues": vals.tolist(), "active_features": int(active.sum()),
                 "seconds": time.perf_counter() - t_it}
        return W, Y, labels, C, f_new, entry, nprod

    def _y_held(self) -> tuple:
        """Zc W of the kept W, as :meth:`_Centred.matvec_held` gives it."""
        return (self.fside.y_held(), self.centring[1]), self.centring[0]

    def iteration_pieces(self, C: np.ndarray, it: int) -> tuple:
        """:meth:`iteration` with Y and the labels kept on a worker and W's rows in pieces beside the blocks
        (:mod:`dufs.methods.ufcm.features`): the driver holds the centroids and the iteration's sums."""
        t_it = time.perf_counter()
        c, timings, side = self.c, self.timings, self.side
        s1, ss = self.seeds(1)[0], self.seeds(self.n_init)

        def step() -> tuple:  # step 7 where Y is kept, then steps 6 and 8 with step 7's product on the pieces
            t1 = time.perf_counter()
            km, chosen, counts = side.u_step(c, C, s1, ss)
            t2 = time.perf_counter()
            timings["u_step"] += t2 - t1
            got = self.fside.iterate(side.codes(pieced=True), counts, c, self.beta, self.p, _EPS)
            timings["w_step"] += time.perf_counter() - t2
            return km, chosen, counts, got

        km, chosen, counts, got = side.again(step, lambda: side.rebuild(*self._y_held(), C))
        t1 = time.perf_counter()
        G = got["WtQ"] / np.sqrt(counts)[None, :]
        self.centring = (got["mW"], got["shift"])
        yy, km_g = side.again(lambda: side.new_y(*self._y_held(), G),
                              lambda: side.rebuild(*self._y_held(), G.T), rerun=False)
        timings["g_step"] += time.perf_counter() - t1
        f_new = float(yy - self.alpha * km_g - self.beta * got["penalty"])
        entry = {"iteration": it + 1, "objective": f_new, "kmeans_term": km, "u_candidate": chosen,
                 "eigenvalues": np.asarray(got["vals"]).tolist(), "active_features": got["active"],
                 "seconds": time.perf_counter() - t_it}
        return None, None, None, G.T, f_new, entry, 0
