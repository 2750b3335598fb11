"""QPFS: quadratic programming feature selection (Rodriguez-Lujan et al., JMLR 2010), the hard-margin special case
of MMFS (paper 002 eqs. (4)-(5); docs/methods.md, "QPFS").

    min_x f(x) = 1/2 (1 - a) x^T Q x - a F^T x   subject to x >= 0, 1^T x = 1,

with Q the similarity of the MMFS columns f (the :mod:`dufs.methods.mmfs.nonlinear` similarities: ``"linear"`` is the
Pearson correlation matrix under ``standardize="zscore"``, ``"poly2"`` its square, ``"rbf"`` Gaussian) and F the
relevance (:func:`dufs.methods.mmfs.relevance`: |Pearson correlation with the labels| by default). Dividing by
(1 - a), this is the MMFS dual with C = infinity, margins rho = a / (1 - a) F (theta = a) and the bias term
replaced by the constraint 1^T alpha = 1 (on the simplex gamma (1^T alpha)^2 is a constant).

Solver: the MMFS kernel machinery on the simplex. The exact gradient g = (1 - a) Q x - a F of every coordinate is
kept (as Q x). Each round takes the coordinates with the smallest gradient (candidates to gain weight) and the
support coordinates with the largest (candidates to lose it), fetches their Q columns in one batched engine pass
(LRU-cached), and runs pairwise (SMO / pairwise Frank-Wolfe) steps with the exact line search on that batch, which
keeps 1^T x = 1 and x >= 0 exactly. The certificate is the Frank-Wolfe duality gap g^T x - min_i g_i >= f(x) - f*;
the solve stops when gap / |f| <= tol, after recomputing Q x from scratch (for the linear kernel by
Q x = c^2 Z^T (Z x): one ``matvec`` and one ``rmatvec``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import numpy as np

from dufs._logging import get_logger
from dufs.engine import Matrix
from dufs.errors import ParameterError
from dufs.kernels.batch import simplex_steps
from dufs.methods.mmfs.nonlinear import KERNEL_CACHE_BYTES, MAX_BATCH, KernelColumns, check_size
from dufs.methods.params import Interval, Param, StrOptions, check_params, integer, positive, table

#: QPFS's parameters (``dufs.fit(method="qpfs")``; ``relevance`` is the function's ``relevance_kind``)
QPFS_PARAMS = table(
    Param("alpha_mix", 0.5, (Interval(Real, 0, 1, closed="left"),), "relevance against redundancy"),
    Param("kernel", "linear", (StrOptions({"linear", "poly2", "rbf"}),), "similarity between features"),
    Param("relevance", "correlation", (StrOptions({"correlation", "fisher"}), callable), "the relevance F"),
    Param("tol", 1e-6, (positive(),), "tolerance of the solver"),
    Param("max_epochs", 500, (integer(1),), "epochs of the solver"),
    Param("rbf_gamma", None, (None, positive()), "width of the Gaussian kernel"),
    Param("max_features", None, (None, integer(1)), "size limit of the nonlinear kernels"),
)

log = get_logger(__name__)


@dataclass
class QPFSResult:
    """What :func:`qpfs` found: the weights ``x`` (on the simplex), the relevance ``r`` (F), the gradient ``g``
    ((1 - a) Q x - a F), the mixing parameter ``alpha_mix`` and ``diagnostics`` (objective, FW gap, rounds...)."""

    x: np.ndarray
    r: np.ndarray
    g: np.ndarray
    alpha_mix: float
    diagnostics: dict = field(default_factory=dict)

    @property
    def support(self) -> np.ndarray:
        """Features with x > 0, ranked by x (ties by the lower index)."""
        s = np.flatnonzero(self.x > 0)
        return s[np.lexsort((s, -self.x[s]))]

    def ranking(self) -> np.ndarray:
        """Every feature: the support by x, then the rest by their gradient g, smallest first (the Frank-Wolfe
        vertex first: closest to entering the support)."""
        sup = self.support
        rest = np.flatnonzero(self.x <= 0)
        return np.concatenate([sup, rest[np.lexsort((rest, self.g[rest]))]])


def solve_simplex(M: Matrix, F: np.ndarray, *, alpha_mix: float, kernel: str = "linear", tol: float = 1e-6,
                  max_epochs: int = 500, rbf_gamma: float | None = None, max_features: int | None = None,
                  cache_bytes: int = KERNEL_CACHE_BYTES, batch_size: int = MAX_BATCH,
                  columns: KernelColumns | None = None) -> dict:
    """min 1/2 (1 - a) x^T Q x - a F^T x over the simplex (see the module docstring). ``max_epochs`` bounds the
    rounds at max_epochs * n_features / batch. Returns a dict: ``x``, ``g``, ``Qx``, ``objective``, ``gap`` (the
    Frank-Wolfe gap), ``relative_gap``, ``converged``, ``rounds``, ``trace``, ``columns``, ``passes``."""
    t0 = time.perf_counter()
    if kernel != "linear":
        check_size(M, max_features, "qpfs")
    a = float(alpha_mix)
    d = M.shape[1]
    F = np.asarray(F, dtype=np.float64).ravel()
    if F.shape != (d,):
        raise ParameterError(f"the relevance has shape {F.shape}; expected ({d},)")
    passes0 = M.passes
    cols = columns if columns is not None else KernelColumns(M, kernel, rbf_gamma=rbf_gamma,
                                                             cache_bytes=cache_bytes)
    B = int(max(2, min(d, batch_size, max(2, cols.capacity // 2))))
    half = max(1, B // 2)
    # start at the most relevant feature's vertex: Q x is one kernel column
    i0 = int(np.argmax(F - 1e-12 * np.arange(d)))
    x = np.zeros(d)
    x[i0] = 1.0
    Qx = cols.get([i0])[:, 0].copy() if d else np.zeros(0)
    fresh = kernel != "linear" or d == 0
    trace: list = []
    max_rounds = int(max_epochs) * int(np.ceil(d / B))
    rounds = 0
    converged = False
    obj = gap = rel = np.inf
    g = (1.0 - a) * Qx - a * F
    while d:
        g = (1.0 - a) * Qx - a * F
        obj = float(0.5 * (1.0 - a) * (x @ Qx) - a * (F @ x))
        gmin = float(g.min())
        gap = max(float(g @ x) - gmin, 0.0)
        rel = gap / max(abs(obj), 1e-300)
        if rel <= tol or gap <= 0.0 or rounds >= max_rounds:
            if fresh:
                converged = rel <= tol or gap <= 0.0
                break
            Qx = cols.times(x, B)
            fresh = True
            continue
        sup = np.flatnonzero(x > 0)
        up = sup[np.argsort(-g[sup], kind="stable")[:half]]  # weight leaves these
        lo = np.argsort(g, kind="stable")[:B]  # weight goes to these
        sel = list(dict.fromkeys(up.tolist()))
        for k in lo.tolist():
            if len(sel) >= B:
                break
            if k not in sel:
                sel.append(k)
        sel = np.asarray(sel, dtype=np.int64)
        mask = np.ones(d, bool)
        mask[sel] = False
        out_sup = np.flatnonzero(mask & (x > 0))
        viol = (float(g[out_sup].max()) if out_sup.size else -np.inf) - float(g[mask].min()) if mask.any() else 0.0
        eps = max(0.1 * viol, 1e-15 * max(1.0, float(np.abs(g).max())))
        Kc = cols.get(sel)
        Hbb = (1.0 - a) * np.ascontiguousarray(Kc[sel, :])
        xB = x[sel].copy()
        gB = g[sel].copy()
        dx, steps = simplex_steps(Hbb, gB, xB, 200 * len(sel), eps)
        x[sel] = np.maximum(xB, 0.0)
        Qx += Kc @ dx
        fresh = False
        rounds += 1
        trace.append({"round": len(trace), "objective": obj, "duality_gap": gap, "relative_gap": rel,
                      "updates": int(steps), "active": int(sel.size)})
        if steps == 0 and viol <= 0:  # nothing moves and nothing outside the batch violates: optimal
            Qx = cols.times(x, B) if not fresh else Qx
            fresh = True
    trace.append({"round": len(trace), "objective": obj, "duality_gap": gap, "relative_gap": rel, "updates": 0,
                  "active": 0})
    return {"x": x, "g": g, "Qx": Qx, "objective": obj, "gap": gap, "relative_gap": rel, "converged": converged,
            "rounds": rounds, "trace": trace, "columns": cols, "passes": M.passes - passes0,
            "columns_fetched": cols.fetched, "solve_time": time.perf_counter() - t0}


def qpfs(M: Matrix, y: Any, *, alpha_mix: float = 0.5, kernel: str = "linear", relevance_kind: Any = "correlation",
         tol: float = 1e-6, max_epochs: int = 500, rbf_gamma: float | None = None, max_features: int | None = None,
         cache_bytes: int = KERNEL_CACHE_BYTES) -> QPFSResult:
    """QPFS on ``M`` (its ``standardize`` gives the geometry, as for MMFS) with labels ``y``.

    ``alpha_mix`` (a in [0, 1)) weighs relevance against redundancy; the paper's rule sets it from the mean
    similarity and relevance, which the caller can compute and pass. The relevance F is MMFS's (``relevance_kind``:
    "correlation", "fisher" or a callable). Features are ranked by their weight x. ``y`` must be classes (numbers,
    strings, booleans): the relevance encodes them (the correlation ratio on more than two), so renumbering them
    changes nothing; a continuous target is an error."""
    from dufs.methods.mmfs import class_targets, geometry, relevance

    check_params(QPFS_PARAMS, {"alpha_mix": alpha_mix, "tol": tol, "max_epochs": max_epochs, "kernel": kernel,
                               "relevance": relevance_kind, "rbf_gamma": rbf_gamma, "max_features": max_features},
                 "qpfs")
    if kernel != "linear":
        check_size(M, max_features, "qpfs")
    y = class_targets(M, y, "qpfs")
    geo = geometry(M)
    r = relevance(M, y, geo, relevance_kind)
    out = solve_simplex(M, r, alpha_mix=float(alpha_mix), kernel=kernel, tol=float(tol), max_epochs=int(max_epochs),
                        rbf_gamma=rbf_gamma, max_features=max_features, cache_bytes=cache_bytes)
    x = out["x"]
    diagnostics = {"objective": out["objective"], "duality_gap": out["gap"], "relative_gap": out["relative_gap"],
                   "converged": out["converged"], "rounds": out["rounds"], "support": int((x > 0).sum()),
                   "kernel": kernel, "rbf_gamma": out["columns"].rbf_gamma, "columns_fetched": out["columns_fetched"],
                   "passes": out["passes"], "trace": out["trace"], "solve_time": out["solve_time"],
                   "n_partitions": M.n_blocks,
                   "stopped": "converged" if out["converged"] else "max_epochs",
                   "convergence": {"measure": "relative Frank-Wolfe gap", "value": out["relative_gap"],
                                   "tol": float(tol)}}
    if not out["converged"]:
        log.warning("qpfs: stopped by max_epochs before converging (relative Frank-Wolfe gap %.3g against tol %g)",
                    out["relative_gap"], tol)
    log.info("qpfs: %d features with weight > 0, FW gap %.3g after %d rounds", diagnostics["support"], out["gap"],
             out["rounds"])
    return QPFSResult(x=x, r=r, g=out["g"], alpha_mix=float(alpha_mix), diagnostics=diagnostics)
