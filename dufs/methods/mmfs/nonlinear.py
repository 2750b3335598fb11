"""MMFS with a nonlinear kernel over the features (paper 002 section 2.3; docs/methods.md, "Kernel MMFS").

The dual is the linear solver's with K_ij = k(f_i, f_j) on the MMFS columns f (the engine's standardized columns z
divided by sqrt(m) for ``"zscore"``/``"scale"``, raw z for None):

    min_{0 <= alpha <= C} D(alpha) = 1/2 alpha^T (K + gamma 1 1^T) alpha - rho^T alpha.

Kernels (c = 1/sqrt(m) for "zscore"/"scale", c = 1 for None, so f = c z):

- ``"linear"``: f_i^T f_j = c^2 z_i^T z_j;
- ``"poly2"``: (f_i^T f_j)^2 = c^4 (z_i^T z_j)^2, the squared correlation under "zscore" (the paper's choice);
- ``"rbf"``: exp(-rbf_gamma ||f_i - f_j||^2) = exp(-(rbf_gamma c^2) ||z_i - z_j||^2), so the engine's
  :meth:`Matrix.similarity_column` is asked for gamma = rbf_gamma c^2. ``rbf_gamma`` defaults to 1 / mean ||f_i||^2
  over the non-constant features (1 under "zscore": ||f_i - f_j||^2 = 2 - 2 corr_ij).

The solver is a working-set dual coordinate descent that keeps the exact gradient G = (K + gamma 1 1^T) alpha - rho
of every coordinate (as K alpha and sum alpha). Each round picks the coordinates whose projected gradient promises
the largest single-coordinate decrease (PG_i^2 / (K_ii + gamma)), fetches their kernel columns in one batched engine
pass (columns already in the bounded-bytes LRU cache cost nothing), runs DCD sweeps on that batch against its
B x B block, and folds the batch's change into K alpha with one dense product. The certificate is the linear
solver's duality gap with g_i = (K alpha)_i + gamma sum alpha:
gap = sum_i [C max(0, rho_i - g_i) + alpha_i (g_i - rho_i)] >= D(alpha) - D*. Before stopping, K alpha is
recomputed from scratch (from the support's columns) so the reported gap does not depend on accumulated rounding.

Kernel methods need K's columns, each a pass over the data and n_features floats: ``max_features`` (default
:data:`MAX_KERNEL_FEATURES`) bounds the problem size.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import numpy as np

from dufs._logging import get_logger
from dufs.engine import Matrix
from dufs.errors import ParameterError
from dufs.kernels.batch import box_sweeps
from dufs.methods.params import check_params

log = get_logger(__name__)

MAX_KERNEL_FEATURES = 100_000
"""Default limit on n_features for the kernel solvers (``max_features``)."""

KERNEL_CACHE_BYTES = 256 * 2**20
"""Default byte budget of the kernel-column LRU cache (``cache_bytes``)."""

MAX_BATCH = 256
"""Default largest number of kernel columns fetched in one round (``batch_size``)."""

KINDS = ("linear", "poly2", "rbf")

# ---------------------------------------------------------------------------------------------------- columns
def check_size(M: Matrix, max_features: int | None, who: str = "mmfs") -> None:
    """Raise a ParameterError when M has more features than ``max_features`` allows for a kernel solver."""
    limit = MAX_KERNEL_FEATURES if max_features is None else int(max_features)
    d = M.shape[1]
    if d > limit:
        raise ParameterError(
            f"{who} with a nonlinear kernel needs kernel columns over all {d} features, above the limit "
            f"max_features={limit}: use kernel=\"linear\" (no kernel columns, scales to any size), prefilter the "
            f"features by relevance (e.g. keep the top {limit} by correlation or Fisher score), or raise "
            f"'max_features' if the memory and passes allow.")


class KernelColumns:
    """Columns of K (the kernel of the MMFS columns f) fetched through the engine, batched, with an LRU cache of
    at most ``cache_bytes`` bytes. ``diag`` holds K_ii for every feature, computed once from column statistics."""

    def __init__(self, M: Matrix, kind: str, *, rbf_gamma: float | None = None,
                 cache_bytes: int = KERNEL_CACHE_BYTES):
        if kind not in KINDS:
            raise ParameterError(f"The 'kernel' parameter must be 'linear', 'poly2' or 'rbf'; got {kind!r}.")
        self.M = M
        self.kind = kind
        m, d = M.shape
        self.c2 = 1.0 / m if M.standardize is not None else 1.0  # f = c z
        qii = M.column_sq_norms() * self.c2  # ||f_i||^2
        self.qii = qii
        if kind == "rbf":
            if rbf_gamma is None:
                pos = qii[qii > 0]
                rbf_gamma = 1.0 / float(pos.mean()) if pos.size else 1.0
            elif not (isinstance(rbf_gamma, int | float | np.floating) and rbf_gamma > 0):
                raise ParameterError(f"The 'rbf_gamma' parameter must be a float > 0; got {rbf_gamma!r}.")
        self.rbf_gamma = None if kind != "rbf" else float(rbf_gamma)
        self.diag = {"linear": qii, "poly2": qii * qii, "rbf": np.ones(d)}[kind]
        self.cache_bytes = int(cache_bytes)
        self.capacity = max(1, self.cache_bytes // max(8 * d, 1))  # columns the cache holds
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self.fetched = 0
        self.hits = 0

    def _engine(self, ids: list[int]) -> np.ndarray:
        M = self.M
        if self.kind == "rbf":
            return M.similarity_column(ids, "rbf", gamma=self.rbf_gamma * self.c2)
        G = M.similarity_column(ids, self.kind)
        return G * (self.c2 if self.kind == "linear" else self.c2 * self.c2)

    def get(self, ids: Any) -> np.ndarray:
        """K[:, ids] as a dense (n_features, len(ids)) array; the missing columns in one engine call."""
        ids = [int(i) for i in np.atleast_1d(ids)]
        missing = [i for i in dict.fromkeys(ids) if i not in self._cache]
        self.hits += len(ids) - len(missing)
        new = {}
        if missing:
            G = self._engine(missing)
            self.fetched += len(missing)
            new = {i: np.ascontiguousarray(G[:, k]) for k, i in enumerate(missing)}
        out = np.empty((self.M.shape[1], len(ids)))
        for k, i in enumerate(ids):
            col = new.get(i)
            if col is None:
                col = self._cache[i]
                self._cache.move_to_end(i)
            out[:, k] = col
        for i, col in new.items():
            self._cache[i] = col
        while len(self._cache) > self.capacity:
            self._cache.popitem(last=False)
        return out

    def times(self, x: np.ndarray, batch: int) -> np.ndarray:
        """K x from scratch: for the linear kernel c^2 Z^T (Z x) (two passes); otherwise from the columns of the
        support of x, ``batch`` at a time."""
        if self.kind == "linear":
            return self.c2 * self.M.rmatvec(self.M.matvec(x))
        out = np.zeros(self.M.shape[1])
        sup = np.flatnonzero(x)
        cached = [i for i in sup if int(i) in self._cache]
        rest = [i for i in sup if int(i) not in self._cache]
        order = cached + rest  # columns in the cache first, before fetching evicts them
        for s in range(0, len(order), batch):
            ids = order[s:s + batch]
            out += self.get(ids) @ x[ids]
        return out


# ---------------------------------------------------------------------------------------------------- inner DCD
def _projected(G: np.ndarray, alpha: np.ndarray, C: float) -> np.ndarray:
    return np.where(alpha <= 0.0, np.minimum(G, 0.0), np.where(alpha >= C, np.maximum(G, 0.0), G))


def _box_gap(G: np.ndarray, alpha: np.ndarray, C: float) -> float:
    return float(np.sum(C * np.maximum(-G, 0.0) + alpha * G))


def _top(score: np.ndarray, k: int) -> np.ndarray:
    pos = np.flatnonzero(score > 0)
    if pos.size <= k:
        return pos[np.argsort(-score[pos], kind="stable")]
    sel = pos[np.argpartition(-score[pos], k - 1)[:k]]
    return sel[np.argsort(-score[sel], kind="stable")]


# ---------------------------------------------------------------------------------------------------- the solver
def solve_kernel(M: Matrix, rho: np.ndarray, *, kernel: str, C: float, gamma: float, tol: float, max_epochs: int,
                 random_state: int = 0, rbf_gamma: float | None = None, max_features: int | None = None,
                 alpha0: np.ndarray | None = None, cache_bytes: int = KERNEL_CACHE_BYTES,
                 batch_size: int = MAX_BATCH, columns: KernelColumns | None = None,
                 trace: list | None = None) -> dict:
    """Minimise D(alpha) = 1/2 alpha^T (K + gamma 1 1^T) alpha - rho^T alpha over 0 <= alpha <= C with K the
    ``kernel`` ("linear", "poly2", "rbf") of the MMFS columns of ``M`` (see the module docstring).

    Stops when gap / |D| <= tol (gap recomputed from a fresh K alpha) or after ``max_epochs`` epochs' worth of
    rounds (a round updates one batch of at most ``batch_size`` coordinates; an epoch is n_features / batch
    rounds). ``random_state`` breaks ties only (the visit order is deterministic: largest promised decrease
    first). ``alpha0`` warm-starts; ``columns`` reuses a :class:`KernelColumns` (and its cache) across calls.

    Returns a dict: ``alpha``, ``G`` (the gradient (K + gamma 1 1^T) alpha - rho), ``Ka`` (K alpha), ``objective``,
    ``gap``, ``relative_gap``, ``converged``, ``rounds``, ``epochs``, ``trace``, ``columns`` (the KernelColumns),
    ``kernel``, ``rbf_gamma``, ``passes`` (engine passes made).
    """
    t0 = time.perf_counter()
    C, gamma, tol, rho = _checked(M, rho, C=C, gamma=gamma, tol=tol, max_epochs=max_epochs, max_features=max_features)
    d = M.shape[1]
    passes0 = M.passes
    cols = columns if columns is not None else KernelColumns(M, kernel, rbf_gamma=rbf_gamma,
                                                             cache_bytes=cache_bytes)
    B = int(max(1, min(d, batch_size, max(1, cols.capacity // 2))))
    rng = np.random.default_rng(random_state)
    tie = rng.random(d) * 1e-9  # tie-breaking only (relative)
    alpha = np.zeros(d) if alpha0 is None else np.clip(np.asarray(alpha0, dtype=np.float64).ravel(), 0.0, C)
    Ka = np.zeros(d) if not alpha.any() else cols.times(alpha, B)
    S = float(alpha.sum())
    trace = [] if trace is None else trace
    max_rounds = int(max_epochs) * int(np.ceil(d / B))
    updates_total = 0
    converged = False
    fresh = True  # Ka was computed from scratch, not accumulated
    G = Ka + gamma * S - rho
    obj = gap = rel = np.inf
    rounds = 0
    while True:
        G = Ka + gamma * S - rho
        obj = float(0.5 * (alpha @ Ka + gamma * S * S) - rho @ alpha)
        gap = _box_gap(G, alpha, C)
        rel = gap / max(abs(obj), 1e-300)
        if rel <= tol or gap <= 0.0 or rounds >= max_rounds:
            if fresh:
                converged = rel <= tol or gap <= 0.0
                break
            Ka = cols.times(alpha, B)  # refresh: the certificate from an exact K alpha
            fresh = True
            continue
        batch = _round(cols, alpha, G, Ka, rho, C=C, gamma=gamma, tie=tie, B=B)
        if batch is None:
            converged = True
            break
        active, sweeps, upd = batch
        S = float(alpha.sum())
        fresh = False
        rounds += 1
        updates_total += upd
        trace.append({"round": len(trace), "objective": obj, "duality_gap": gap, "relative_gap": rel,
                      "updates": upd, "active": active, "sweeps": sweeps, "gamma": gamma})
        log.debug("kernel round %d: D = %.10g, gap = %.3g (relative %.3g), batch %d, %d sweeps", rounds, obj, gap,
                  rel, active, sweeps)
    trace.append({"round": len(trace), "objective": obj, "duality_gap": gap, "relative_gap": rel, "updates": 0,
                  "active": 0, "sweeps": 0, "gamma": gamma})
    return {"alpha": alpha, "G": G, "Ka": Ka, "objective": obj, "gap": gap, "relative_gap": rel,
            "converged": converged, "rounds": rounds, "epochs": updates_total / max(d, 1), "trace": trace,
            "columns": cols, "kernel": cols.kind, "rbf_gamma": cols.rbf_gamma, "passes": M.passes - passes0,
            "columns_fetched": cols.fetched, "solve_time": time.perf_counter() - t0}


def _checked(M: Matrix, rho: Any, *, C: Any, gamma: Any, tol: Any, max_epochs: Any,
             max_features: int | None) -> tuple[float, float, float, np.ndarray]:
    """:func:`solve_kernel`'s parameters checked: (C, gamma, tol, rho as a float vector over the features)."""
    check_size(M, max_features)
    from dufs.methods.mmfs.problem import MMFS_PARAMS

    check_params(MMFS_PARAMS, {"C": C, "tol": tol, "max_epochs": max_epochs}, "mmfs")
    if not (isinstance(gamma, int | float) and gamma > 0):  # a value of the path: no "auto" here
        raise ParameterError(f"The 'gamma' parameter must be a float > 0; got {gamma!r}.")
    C, gamma, tol = float(C), float(gamma), float(tol)
    d = M.shape[1]
    rho = np.asarray(rho, dtype=np.float64).ravel()
    if rho.shape != (d,):
        raise ParameterError(f"rho has shape {rho.shape}; expected ({d},)")
    return C, gamma, tol, rho


def _round(cols: KernelColumns, alpha: np.ndarray, G: np.ndarray, Ka: np.ndarray, rho: np.ndarray, *, C: float,
           gamma: float, tie: np.ndarray, B: int) -> tuple[int, int, int] | None:
    """One round: the batch of at most ``B`` coordinates of largest promised decrease, its kernel columns, and
    box sweeps over it; ``alpha`` and ``Ka`` = K alpha updated in place. (batch size, sweeps, updates), or None when
    no coordinate can move."""
    pg = _projected(G, alpha, C)
    score = pg * pg / (cols.diag + gamma)
    score = score * (1.0 + tie)
    sel = _top(score, B)
    if sel.size == 0:
        return None
    Kc = cols.get(sel)
    Kbb = np.ascontiguousarray(Kc[sel, :])
    rest = np.abs(pg).copy()
    rest[sel] = 0.0
    eps = max(0.1 * float(rest.max()), 1e-15 * max(1.0, float(np.abs(rho).max(initial=0.0))))
    aB = alpha[sel].copy()
    gB = G[sel].copy()
    dB, sweeps, upd = box_sweeps(Kbb, gB, aB, C, gamma, 1000, eps)
    alpha[sel] = aB
    Ka += Kc @ dB
    return int(sel.size), int(sweeps), int(upd)


def mmfs_kernel(M: Matrix, y: Any, *, kernel: str = "poly2", n_features: int | None = None, C: float = 1.0,
                theta: float = 0.5, gamma: Any = "auto", relevance_kind: Any = "correlation", tol: float = 1e-3,
                max_epochs: int = 500, random_state: int = 0, rbf_gamma: float | None = None,
                max_features: int | None = None, cache_bytes: int = KERNEL_CACHE_BYTES) -> Any:
    """MMFS with a kernel over the features: :func:`dufs.methods.mmfs.mmfs`'s parameters plus ``kernel``,
    ``rbf_gamma``, ``max_features`` and ``cache_bytes``; ``gamma="auto"`` follows the same path 1, 1/2, 1/4, ...
    (warm-started, the kernel-column cache kept) until the support holds ``n_features`` features.

    Returns an :class:`~dufs.methods.mmfs.MMFSResult` whose ``w`` is empty (w lives in the kernel's feature space);
    ``b`` = gamma sum alpha and ``g`` = (K alpha)_i + b as for the linear kernel."""
    from dufs.methods.mmfs.method import MMFSResult
    from dufs.methods.mmfs.problem import margins

    t0 = time.perf_counter()
    check_size(M, max_features)
    auto, _, r, rho = margins(M, y, theta, gamma, relevance_kind)
    gammas = [float(gamma)] if not auto else [2.0 ** -k for k in range(31)]
    want = n_features if n_features is not None else 1
    trace: list = []
    cols = None
    alpha = None
    for gk in gammas:
        out = solve_kernel(M, rho, kernel=kernel, C=C, gamma=gk, tol=tol, max_epochs=max_epochs,
                           random_state=random_state, rbf_gamma=rbf_gamma, max_features=max_features,
                           alpha0=alpha, cache_bytes=cache_bytes, columns=cols, trace=trace)
        cols, alpha = out["columns"], out["alpha"]
        support = int((alpha > 0).sum())
        log.info("kernel %s, gamma %.3g: %d features in the support, gap %.3g", kernel, gk, support, out["gap"])
        if support >= want:
            break
    b = gk * float(alpha.sum())
    diagnostics = {
        "objective": out["objective"], "duality_gap": out["gap"], "relative_gap": out["relative_gap"],
        "converged": out["converged"], "rounds": len(trace), "gamma": gk, "gamma_path": auto, "support": support,
        "kernel": kernel, "rbf_gamma": out["rbf_gamma"], "columns_fetched": cols.fetched, "trace": trace,
        "n_partitions": M.n_blocks, "solve_time": time.perf_counter() - t0,
        "stopped": "converged" if out["converged"] else "max_epochs",
        "convergence": {"measure": "relative duality gap", "value": out["relative_gap"], "tol": float(tol)},
    }
    if not out["converged"]:
        log.warning("mmfs (kernel %s): stopped by max_epochs before converging (relative duality gap %.3g against "
                    "tol %g)", kernel, out["relative_gap"], tol)
    if n_features is not None and support < n_features:
        diagnostics["filled_by_gradient"] = int(n_features - support)
    return MMFSResult(alpha=alpha, w=np.zeros(0), b=b, gamma=gk, r=r, rho=rho, g=out["Ka"] + b,
                      diagnostics=diagnostics)
