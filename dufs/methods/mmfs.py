"""MMFS: max-margin feature selection by dual coordinate descent (paper 002; the formulation of DESIGN.md 7.1).

Features are the points. With f_i the MMFS-scaled feature columns (the engine's standardization divided by
sqrt(m) for ``"zscore"`` and ``"scale"``, raw for None), relevance r_i and margins rho = theta / (1 - theta) r:

    primal  min_{w,b} 1/2 ||w||^2 + b^2 / (2 gamma) + C sum_i max(0, rho_i - f_i^T w - b)
    dual    min_{0 <= alpha <= C} D(alpha) = 1/2 alpha^T (K + gamma 1 1^T) alpha - rho^T alpha,

w = sum_j alpha_j f_j, b = gamma sum_j alpha_j. The certificate is the duality gap
gap = sum_i [C max(0, rho_i - g_i) + alpha_i (g_i - rho_i)] with g_i = f_i^T w + b, a sum of per-feature terms;
the solver stops when gap / |D| <= tol. Selected: alpha_i > 0, ranked by alpha_i.

The solve runs in rounds over the Matrix's feature blocks (the partitions), each where its block lives
(``Matrix.map_blocks`` with per-block state): a block first applies the previous round's step to its alphas and
computes its gap terms at the current (w, b), then runs one DCD epoch (random order, shrinking) against a local
copy of w with the bias held at its round-start value, and returns its delta of w. The driver sums the deltas
(a fixed tree on the workers), takes the exact line-search step along the summed direction, and checks the gap.
With one partition the epoch also moves the bias: plain serial DCD (Hsieh et al. 2008).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dufs._logging import get_logger
from dufs.engine.matrix import Matrix, PerBlock
from dufs.errors import ParameterError
from dufs.kernels.dcd import dcd_epoch, dcd_gradient, gap_terms

log = get_logger(__name__)

_TAIL = 10  # scalars appended to a block's delta of w in a round's result


@dataclass
class MMFSResult:
    """What :func:`mmfs` found: ``alpha`` (per feature), ``w`` (over samples), ``b``, the ``gamma`` used, the
    relevance ``r`` and margins ``rho``, the gradient ``g`` (f_i^T w + b) at the solution, and ``diagnostics``."""

    alpha: np.ndarray
    w: np.ndarray
    b: float
    gamma: float
    r: np.ndarray
    rho: np.ndarray
    g: np.ndarray
    diagnostics: dict = field(default_factory=dict)

    @property
    def support(self) -> np.ndarray:
        """Features with alpha > 0, ranked by alpha (ties by the lower index)."""
        s = np.flatnonzero(self.alpha > 0)
        return s[np.lexsort((s, -self.alpha[s]))]

    def ranking(self) -> np.ndarray:
        """Every feature: the support by alpha, then the rest by their dual gradient g_i - rho_i, smallest first
        (closest to entering the support)."""
        sup = self.support
        rest = np.flatnonzero(self.alpha <= 0)
        G = self.g[rest] - self.rho[rest]
        return np.concatenate([sup, rest[np.lexsort((rest, G))]])


# ---------------------------------------------------------------------------------------------------- geometry
def geometry(M: Matrix) -> dict[str, np.ndarray]:
    """Per-feature ``coef``, ``shift``, ``colsum`` and ``qii`` = ||f_i||^2 of the MMFS columns
    f_i = coef_i (x_i - shift_i 1): the engine's standardization divided by sqrt(m) (None: raw columns)."""
    st = M.column_stats() if M._stats is None else M._stats
    m = M.shape[0]
    mu, inv = M._transform()
    d = M.shape[1]
    shift = np.zeros(d) if mu is None else np.asarray(mu, dtype=np.float64)
    coef = np.ones(d) if inv is None else np.asarray(inv, dtype=np.float64) / np.sqrt(m)
    colsum = np.asarray(st.sum, dtype=np.float64)
    if mu is not None:
        base = np.where(st.min == st.max, 0.0, np.maximum(st.m2, 0.0))
    else:
        base = np.asarray(st.sumsq, dtype=np.float64)
    return {"coef": coef, "shift": shift, "colsum": colsum, "qii": coef * coef * base}


def relevance(M: Matrix, y: np.ndarray, geo: dict, kind: Any = "correlation") -> np.ndarray:
    """r_i = |f_i^T y~| with y~ the labels centred and scaled to unit norm (|Pearson correlation| under "zscore"),
    ``"fisher"`` (Fisher scores divided by their largest finite value), or a callable ``kind(M, y) -> r``."""
    if callable(kind):
        r = np.asarray(kind(M, y), dtype=np.float64).ravel()
        if r.shape != (M.shape[1],):
            raise ParameterError(f"the relevance callable returned shape {r.shape}; expected ({M.shape[1]},)")
        return r
    if kind == "correlation":
        yc = y - y.mean()
        nrm = np.linalg.norm(yc)
        if nrm == 0:
            raise ParameterError("MMFS: the labels are constant, so every feature's relevance is 0")
        raw = M.with_standardize(None).rmatvec(yc / nrm)
        return np.abs(geo["coef"] * raw)  # 1^T y~ = 0, so the shift drops out
    if kind == "fisher":
        from dufs.methods.filters import fisher_scores

        f = fisher_scores(M, y)
        fin = f[np.isfinite(f)]
        top = fin.max() if fin.size and fin.max() > 0 else 1.0
        return np.where(np.isfinite(f), f / top, 1.0)
    raise ParameterError(f"The 'relevance' parameter of mmfs must be 'correlation', 'fisher' or a callable; "
                         f"got {kind!r}.")


# ---------------------------------------------------------------------------------------------------- blocks
def _init_state(block, coef, shift, colsum, qii, rho, alpha0, seed):
    w = block.width
    alpha = np.zeros(w) if alpha0 is None else np.array(alpha0, dtype=np.float64)
    return {"coef": np.ascontiguousarray(coef), "shift": np.ascontiguousarray(shift),
            "colsum": np.ascontiguousarray(colsum), "qii": np.ascontiguousarray(qii),
            "rho": np.ascontiguousarray(rho), "alpha": alpha, "dalpha": np.zeros(w), "g": np.zeros(w),
            "index": np.arange(w, dtype=np.int64), "n_active": w, "pg": np.array([np.inf, -np.inf]),
            "pg_eps": 0.1, "rng": np.array([np.uint64(seed) * np.uint64(2) + np.uint64(1)], dtype=np.uint64)}


def _init(block, state, coef, shift, colsum, qii, rho, alpha0, seed):
    return _init_state(block, coef, shift, colsum, qii, rho, alpha0, seed), None


def _round(block, state, ws, wt, b, step, m, C, gamma, update_bias, epoch):
    """Apply last round's step, compute the gap terms at (w, b), then (if ``epoch``) one local DCD epoch.

    Returns the new state and a vector [dws (m), dt, dS, ds, dalpha^T (g - rho), gap, sum alpha, rho^T alpha,
    updates, active, 1]."""
    st = dict(state)
    alpha = st["alpha"]
    if step != 0.0:
        alpha = np.clip(alpha + step * st["dalpha"], 0.0, C)
    st["alpha"] = alpha
    g = np.empty(block.width)
    dcd_gradient(block.indptr, block.indices, block.data, st["coef"], st["shift"], st["colsum"], ws, wt, m, b, g)
    st["g"] = g
    gap, sa, ra = gap_terms(g, st["rho"], alpha, C)
    out = np.zeros(ws.shape[0] + _TAIL)
    tail = out[ws.shape[0]:]
    tail[4:8] = gap, sa, ra, 0.0
    tail[9] = 1.0
    if not epoch:
        st["dalpha"] = np.zeros(block.width)
        return st, out
    # un-shrink when a left-out coordinate now violates the optimality conditions at least as much as the worst
    # active one (the gradient of every coordinate is exact here, at the round's start)
    n_act = st["n_active"]
    if n_act < block.width:
        G = g - st["rho"]
        pg = np.where(alpha <= 0.0, np.minimum(G, 0.0), np.where(alpha >= C, np.maximum(G, 0.0), G))
        idx = st["index"]
        worst_out = np.abs(pg[idx[n_act:]]).max()
        worst_in = np.abs(pg[idx[:n_act]]).max() if n_act else 0.0
        if worst_out > 0.0 and worst_out >= worst_in:
            st["n_active"] = block.width
            st["pg"] = np.array([np.inf, -np.inf])
    a = alpha.copy()
    wsl = ws.copy()
    wtl = wt.copy()
    bias = np.array([b])
    index = st["index"].copy()
    rng = st["rng"].copy()
    n_active, pgmax, pgmin, n_upd = dcd_epoch(block.indptr, block.indices, block.data, st["coef"], st["shift"],
                                              st["colsum"], st["qii"], st["rho"], a, C, gamma, wsl, wtl, m, bias,
                                              update_bias, index, st["n_active"], st["pg"], rng)
    # LIBLINEAR's shrinking bookkeeping, per block; the stopping decision is the driver's (the duality gap)
    pg_eps = st["pg_eps"]
    if pgmax - pgmin <= pg_eps:
        if n_active < block.width:
            n_active = block.width
        else:
            pg_eps *= 0.1
        pg = np.array([np.inf, -np.inf])
    else:
        pg = np.array([pgmax if pgmax > 0 else np.inf, pgmin if pgmin < 0 else -np.inf])
    st.update(index=index, rng=rng, n_active=int(n_active), pg=pg, pg_eps=pg_eps, dalpha=a - alpha)
    out[:ws.shape[0]] = wsl - ws
    tail[0] = wtl[0] - wt[0]
    tail[1] = wtl[1] - wt[1]
    tail[2] = float((a - alpha).sum())
    tail[3] = float((g - st["rho"]) @ (a - alpha))  # the directional derivative, from the exact gradient
    tail[7] = float(n_upd)
    tail[8] = float(n_active)
    return st, out


def _take(block, state):
    return state, (state["alpha"], state["g"])


# ---------------------------------------------------------------------------------------------------- the solver
def solve(M: Matrix, rho: np.ndarray, geo: dict, *, C: float, gamma: float, tol: float, max_epochs: int,
          random_state: int = 0, state: Any = None, w: tuple | None = None, trace: list | None = None) -> dict:
    """Rounds of block DCD + line search until gap / |D| <= tol or ``max_epochs`` rounds. Returns a dict with the
    final ``state`` (per block), ``ws``, ``wt``, ``b``, ``gap``, ``objective``, ``rounds``, ``converged``."""
    m = M.shape[0]
    if state is None:
        state = [None] * M.n_blocks
        _, state = M.map_blocks(_init, PerBlock(geo["coef"]), PerBlock(geo["shift"]), PerBlock(geo["colsum"]),
                                PerBlock(geo["qii"]), PerBlock(rho), None,
                                PerBlock([random_state * 1000003 + i for i in range(M.n_blocks)]), state=state)
    if w is None:
        ws, wt, b = np.zeros(m), np.zeros(2), 0.0
    else:
        ws, wt, b = w
    update_bias = M.n_blocks == 1
    trace = [] if trace is None else trace
    step = 0.0
    converged = False
    gap = obj = np.inf
    for r in range(max_epochs + 1):
        last = r == max_epochs
        res, new_state = M.map_blocks(_round, ws, wt, b, step, float(m), C, gamma, update_bias, not last,
                                      state=state, reduce="sum")
        if hasattr(state, "release"):
            state.release()
        state = new_state
        dws, tl = res[:m], res[m:]
        dt, dS, ds, slope, gap, sa, ra = (float(v) for v in tl[:7])
        wnorm2 = float(ws @ ws)  # ws is w itself: the driver folds the constant part in every round
        obj = 0.5 * wnorm2 + b * b / (2.0 * gamma) - ra
        rel = gap / max(abs(obj), 1e-300)
        trace.append({"round": len(trace), "objective": obj, "duality_gap": gap, "relative_gap": rel,
                      "updates": int(tl[7]), "active": int(tl[8]), "gamma": gamma})
        log.debug("round %d: D = %.10g, gap = %.3g (relative %.3g), %d updates, %d active", len(trace) - 1, obj,
                  gap, rel, int(tl[7]), int(tl[8]))
        if rel <= tol or gap <= 0.0:
            converged = True
            break
        if last:
            break
        # exact line search along the summed direction d: the dual is quadratic along it, with slope
        # d^T grad D = sum_j d_j (g_j - rho_j) (summed by the blocks from the exact gradient) and curvature
        # ||dw||^2 + gamma ds^2 (dw = dws + dt 1 formed explicitly: no cancellation between its two parts)
        dw = dws + dt
        den = float(dw @ dw) + gamma * ds * ds
        step = float(np.clip(-slope / den, 0.0, 1.0)) if den > 0 and slope < 0 else 0.0
        ws = ws + step * dw
        wt = np.array([0.0, float(ws.sum())])
        b = b + gamma * step * ds
    return {"state": state, "ws": ws, "wt": wt, "b": b, "gap": gap, "objective": obj, "converged": converged,
            "trace": trace}


def _support_size(M: Matrix, state: Any) -> int:
    res, _ = M.map_blocks(_count_support, state=state)
    return int(sum(res))


def _count_support(block, state):
    return state, int((state["alpha"] > 0).sum())


def mmfs(M: Matrix, y: Any, *, n_features: int | None = None, C: float = 1.0, theta: float = 0.5,
         gamma: Any = "auto", relevance_kind: Any = "correlation", tol: float = 1e-3, max_epochs: int = 500,
         random_state: int = 0) -> MMFSResult:
    """Solve MMFS on ``M`` (its ``standardize`` gives the geometry) with labels ``y``; see the module docstring.

    ``gamma="auto"`` follows a decreasing path gamma = 1, 1/2, 1/4, ... with warm starts until the support holds
    ``n_features`` features (or gamma reaches 2^-30); a fixed gamma solves once.
    """
    t0 = time.perf_counter()
    if not (isinstance(C, int | float) and C > 0):
        raise ParameterError(f"The 'C' parameter of mmfs must be a float > 0; got {C!r}.")
    if not (isinstance(theta, int | float) and 0 < theta < 1):
        raise ParameterError(f"The 'theta' parameter of mmfs must be a float in (0, 1); got {theta!r}.")
    if not (isinstance(tol, int | float) and tol > 0):
        raise ParameterError(f"The 'tol' parameter of mmfs must be a float > 0; got {tol!r}.")
    if not (isinstance(max_epochs, int | np.integer) and max_epochs >= 1):
        raise ParameterError(f"The 'max_epochs' parameter of mmfs must be an int >= 1; got {max_epochs!r}.")
    auto = isinstance(gamma, str)
    if auto and gamma != "auto":
        raise ParameterError(f"The 'gamma' parameter of mmfs must be 'auto' or a float > 0; got {gamma!r}.")
    if not auto and not (isinstance(gamma, int | float) and gamma > 0):
        raise ParameterError(f"The 'gamma' parameter of mmfs must be 'auto' or a float > 0; got {gamma!r}.")
    y = np.asarray(y, dtype=np.float64).ravel()
    if y.shape != (M.shape[0],):
        raise ParameterError(f"X has {M.shape[0]} rows but y has {y.shape[0]} labels")
    geo = geometry(M)
    r = relevance(M, y, geo, relevance_kind)
    rho = theta / (1.0 - theta) * r
    trace: list = []
    gammas = [float(gamma)] if not auto else [2.0 ** -k for k in range(31)]
    want = n_features if n_features is not None else 1
    state = None
    w = None
    support = 0
    for gk in gammas:
        if w is not None:  # warm start: w depends on alpha only; b = gamma sum(alpha)
            w = (w[0], w[1], gk * w[3] / w[4] if w[4] else 0.0)
        out = solve(M, rho, geo, C=float(C), gamma=gk, tol=float(tol), max_epochs=int(max_epochs),
                    random_state=int(random_state), state=state, w=None if w is None else w[:3], trace=trace)
        state = out["state"]
        w = (out["ws"], out["wt"], out["b"], out["b"], gk)
        support = _support_size(M, state)
        log.info("gamma %.3g: %d features in the support, gap %.3g after %d rounds", gk, support, out["gap"],
                 len(trace))
        if support >= want:
            break
    parts, _ = M.map_blocks(_take, state=state)
    alpha = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0)
    g = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0)
    if hasattr(state, "release"):
        state.release()
    ws, wt, b = out["ws"], out["wt"], out["b"]
    diagnostics = {
        "objective": out["objective"], "duality_gap": out["gap"],
        "relative_gap": out["gap"] / max(abs(out["objective"]), 1e-300), "converged": out["converged"],
        "rounds": len(trace), "gamma": gk, "gamma_path": auto, "support": support, "n_partitions": M.n_blocks,
        "trace": trace, "solve_time": time.perf_counter() - t0,
    }
    if n_features is not None and support < n_features:
        diagnostics["filled_by_gradient"] = int(n_features - support)
        log.info("the support holds %d features; the other %d are the closest to entering it (dual gradient)",
                 support, n_features - support)
    return MMFSResult(alpha=alpha, w=ws + wt[0], b=float(b), gamma=gk, r=r, rho=rho, g=g, diagnostics=diagnostics)
