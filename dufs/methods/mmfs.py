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

import contextlib
import hashlib
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dufs._logging import get_logger
from dufs.engine.matrix import Matrix, PerBlock, StoreBlock
from dufs.errors import ParameterError
from dufs.kernels.dcd import dcd_epoch, dcd_gradient, gap_terms

log = get_logger(__name__)

# block-random visit order (runs of this many consecutive features, the runs and each run shuffled): measured by
# `dufs bench mmfs` on the 2M x 5M store, 1 worker: 1.61 s a round against 2.38 s in uniformly random order (the
# per-feature arrays and column buffers of a run stay in cache), to the same gap in about as many rounds
_VISIT_ORDER = 1024
_SMALL_NNZ = 2_000_000  # auto_partitions: fewer nonzeros run as one partition
_DENSE = 0.05  # auto_partitions: denser data runs as one partition
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


def margins(M: Matrix, y: Any, theta: Any, gamma: Any, relevance_kind: Any) -> tuple[bool, dict, np.ndarray,
                                                                                     np.ndarray]:
    """Check ``theta``, ``gamma`` and the labels; return (gamma is "auto", the geometry, the relevance r, the
    margins rho = theta / (1 - theta) r)."""
    if not (isinstance(theta, int | float) and 0 < theta < 1):
        raise ParameterError(f"The 'theta' parameter of mmfs must be a float in (0, 1); got {theta!r}.")
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
    return auto, geo, r, theta / (1.0 - theta) * r


# ---------------------------------------------------------------------------------------------------- blocks
def _init_state(block, coef, shift, colsum, qii, rho, alpha0, seed):
    w = block.width
    alpha = np.zeros(w) if alpha0 is None else np.array(alpha0, dtype=np.float64)
    return {"coef": np.ascontiguousarray(coef), "shift": np.ascontiguousarray(shift),
            "colsum": np.ascontiguousarray(colsum), "qii": np.ascontiguousarray(qii),
            "rho": np.ascontiguousarray(rho), "alpha": alpha, "dalpha": np.zeros(w), "g": np.zeros(w),
            "index": np.arange(w, dtype=np.int64), "n_active": w, "pg": np.array([np.inf, -np.inf]),
            "pg_eps": 0.1, "rng": np.array([np.uint64(seed) * np.uint64(2) + np.uint64(1)], dtype=np.uint64)}


def _init(blocks, state, coef, shift, colsum, qii, rho, alpha0, seed):
    return [_init_state(blk, coef[q], shift[q], colsum[q], qii[q], rho[q], None if alpha0 is None else alpha0[q],
                        seed[q]) for q, blk in enumerate(blocks)], None


def _start(blk, st, ws, wt, b, step, m, C):
    """A block's part of a round's start: apply last round's step, the exact gradient and the gap terms at (w, b).
    Returns (state, [gap, sum alpha, rho^T alpha])."""
    st = dict(st)
    alpha = st["alpha"]
    if step != 0.0:
        alpha = np.clip(alpha + step * st["dalpha"], 0.0, C)
    st["alpha"] = alpha
    g = np.empty(blk.width)
    dcd_gradient(blk.indptr, blk.indices, blk.data, st["coef"], st["shift"], st["colsum"], ws, wt, m, b, g)
    st["g"] = g
    return st, gap_terms(g, st["rho"], alpha, C)


def _unshrink(blk, st, C) -> None:
    """Un-shrink when a left-out coordinate now violates the optimality conditions at least as much as the worst
    active one (the gradient of every coordinate is exact here, at the round's start)."""
    n_act = st["n_active"]
    if n_act >= blk.width:
        return
    alpha, G = st["alpha"], st["g"] - st["rho"]
    pg = np.where(alpha <= 0.0, np.minimum(G, 0.0), np.where(alpha >= C, np.maximum(G, 0.0), G))
    idx = st["index"]
    worst_out = np.abs(pg[idx[n_act:]]).max()
    worst_in = np.abs(pg[idx[:n_act]]).max() if n_act else 0.0
    if worst_out > 0.0 and worst_out >= worst_in:
        st["n_active"] = blk.width
        st["pg"] = np.array([np.inf, -np.inf])


def _epoch(blk, st, wsl, wtl, bias, m, C, gamma, update_bias, sigma) -> tuple[int, int]:
    """One DCD epoch over a block against the partition's local (wsl, wtl, bias); LIBLINEAR's shrinking
    bookkeeping per block (the stopping decision is the driver's: the duality gap). Returns (updates, active)."""
    alpha = st["alpha"]
    a = alpha.copy()
    index = st["index"].copy()
    rng = st["rng"].copy()
    n_active, pgmax, pgmin, n_upd = dcd_epoch(blk.indptr, blk.indices, blk.data, st["coef"], st["shift"],
                                              st["colsum"], st["qii"], st["rho"], a, C, gamma, wsl, wtl, m, bias,
                                              update_bias, index, st["n_active"], st["pg"], rng, _VISIT_ORDER,
                                              sigma)
    pg_eps = st["pg_eps"]
    if pgmax - pgmin <= pg_eps:
        if n_active < blk.width:
            n_active = blk.width
        else:
            pg_eps *= 0.1
        pg = np.array([np.inf, -np.inf])
    else:
        pg = np.array([pgmax if pgmax > 0 else np.inf, pgmin if pgmin < 0 else -np.inf])
    st.update(index=index, rng=rng, n_active=int(n_active), pg=pg, pg_eps=pg_eps, dalpha=a - alpha)
    return int(n_upd), int(n_active)


def _round(blocks, states, ws, wt, b, step, m, C, gamma, update_bias, epoch, sigma):
    """One round of a partition (its blocks, in a random order): apply last round's step and compute the gap terms
    at (w, b) on every block, then (if ``epoch``) one DCD epoch over all of them against one local copy of w, with
    the bias held at ``b`` unless ``update_bias`` (one partition: serial DCD; or CoCoA+ with ``sigma`` > 1).

    Returns the new states and a vector [dws (m), dt, dS, ds, dalpha^T (g - rho), gap, sum alpha, rho^T alpha,
    updates, active, 1] (dws, dt, dS: the change of w that the alphas' change makes, whatever ``sigma``)."""
    out = np.zeros(ws.shape[0] + _TAIL)
    tail = out[ws.shape[0]:]
    new = []
    for blk, st in zip(blocks, states, strict=True):
        st, (gap, sa, ra) = _start(blk, st, ws, wt, b, step, m, C)
        tail[4:7] += gap, sa, ra
        new.append(st)
    tail[9] = 1.0
    if not epoch:
        for st in new:
            st["dalpha"] = np.zeros(st["alpha"].shape[0])
        return new, out
    wsl = ws.copy()
    wtl = wt.copy()
    bias = np.array([b])
    # the blocks' order: from the first block's generator state (deterministic, new every round)
    for q in np.random.default_rng(int(new[0]["rng"][0])).permutation(len(blocks)):
        blk, st = blocks[q], new[q]
        _unshrink(blk, st, C)
        n_upd, n_act = _epoch(blk, st, wsl, wtl, bias, m, C, gamma, update_bias, sigma)
        da = st["dalpha"]
        tail[2] += float(da.sum())
        tail[3] += float((st["g"] - st["rho"]) @ da)  # the directional derivative, from the exact gradient
        tail[7] += n_upd
        tail[8] += n_act
    out[:ws.shape[0]] = wsl - ws
    tail[0] = wtl[0] - wt[0]
    tail[1] = wtl[1] - wt[1]
    if sigma != 1.0:
        out[:ws.shape[0] + 2] /= sigma
    return new, out


# ---------------------------------------------------------------------------------------------------- resilience
_MAX_RECOVERIES = 5  # rebuilds of the block state after lost workers, per mmfs call
_LOST_NAMES = {"FutureCancelledError", "CancelledError", "KilledWorker", "CommClosedError", "FutureLostError",
               "StreamClosedError"}


def _is_lost(e: BaseException) -> bool:
    """Whether ``e`` (or what caused it) says that per-block state futures or their workers were lost."""
    seen = 0
    while e is not None and seen < 8:
        if type(e).__name__ in _LOST_NAMES or any(c.__name__ in _LOST_NAMES for c in type(e).__mro__):
            return True
        msg = str(e)
        if "lost dependencies" in msg or "Worker holding" in msg or "was lost" in msg:
            return True
        e = e.__cause__ or e.__context__
        seen += 1
    return False


def _take_alpha(blocks, states):
    return states, [(blk.start, st["alpha"], st["g"]) for blk, st in zip(blocks, states, strict=True)]


def _init_blocks(M: Matrix, groups: list, geo: dict, rho: np.ndarray, alpha0: np.ndarray | None,
                 seed: int) -> Any:
    state = [None] * len(groups)
    _, state = M.map_blocks(_init, PerBlock(geo["coef"]), PerBlock(geo["shift"]), PerBlock(geo["colsum"]),
                            PerBlock(geo["qii"]), PerBlock(rho), None if alpha0 is None else PerBlock(alpha0),
                            PerBlock([seed * 1000003 + i for i in range(M.n_blocks)]), state=state, groups=groups)
    return state


def _gather_alpha(M: Matrix, groups: list, state: Any) -> tuple[np.ndarray, np.ndarray, Any]:
    """(alpha, g) of every feature on the driver, and the state to go on with."""
    parts, new = M.map_blocks(_take_alpha, state=state, groups=groups)
    if hasattr(state, "release"):
        state.release()
    d = M.shape[1]
    alpha, g = np.zeros(d), np.zeros(d)
    for part in parts:
        for start, a, gg in part:
            alpha[start:start + a.shape[0]] = a
            g[start:start + a.shape[0]] = gg
    return alpha, g, new


def _primal(M: Matrix, alpha: np.ndarray, gamma: float) -> tuple[np.ndarray, np.ndarray, float]:
    """(ws, wt, b) from alpha in one pass: w = F alpha (Z alpha / sqrt(m) under a standardization, X alpha raw)."""
    m = M.shape[0]
    ws = np.asarray(M.matvec(alpha), dtype=np.float64)
    if M.standardize is not None:
        ws = ws / np.sqrt(m)
    return ws, np.array([0.0, float(ws.sum())]), float(gamma * alpha.sum())


class _Checkpoint:
    """``<directory>/checkpoint.npz``: alpha and a JSON of the rest (round, gamma, the path position, the trace,
    the problem it belongs to), written to a temporary name and renamed into place (atomic)."""

    NAME = "checkpoint.npz"

    def __init__(self, directory: str, problem: dict):
        self.directory = os.fspath(directory)
        self.path = os.path.join(self.directory, self.NAME)
        self.problem = problem
        self.writes = 0
        self.last_round: int | None = None

    def save(self, alpha: np.ndarray, meta: dict) -> None:
        os.makedirs(self.directory, exist_ok=True)
        meta = {"format": 1, "problem": self.problem, **meta}
        tmp = f"{self.path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "wb") as f:
                np.savez(f, alpha=np.asarray(alpha, dtype=np.float64),
                         meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self.writes += 1
        self.last_round = int(meta.get("round", -1))

    def load(self) -> tuple[np.ndarray, dict] | None:
        """The checkpoint (alpha, meta), None when there is none; a ParameterError naming the file when it is
        unreadable or belongs to another problem."""
        if not os.path.exists(self.path):
            return None
        try:
            with np.load(self.path, allow_pickle=False) as z:
                alpha = np.array(z["alpha"], dtype=np.float64)
                meta = json.loads(bytes(np.asarray(z["meta"], dtype=np.uint8)).decode())
        except Exception as e:  # noqa: BLE001 - any failure to read means the file is not a usable checkpoint
            raise ParameterError(f"the MMFS checkpoint {self.path} is unreadable ({type(e).__name__}: {e}); "
                                 f"delete it or run with resume=False") from None
        theirs = meta.get("problem", {})
        for key, ours in self.problem.items():
            got = theirs.get(key)
            same = (np.allclose(got, ours, rtol=1e-9, atol=0.0) if key == "rho" and got is not None
                    and len(got) == len(ours) else got == ours)
            if not same:
                raise ParameterError(f"the MMFS checkpoint {self.path} belongs to another problem ({key}: "
                                     f"{got!r} in the file, {ours!r} here); delete it, give another checkpoint "
                                     f"directory, or run with resume=False")
        if alpha.shape != (self.problem["shape"][1],):
            raise ParameterError(f"the MMFS checkpoint {self.path} holds {alpha.shape[0]} alphas for "
                                 f"{self.problem['shape'][1]} features")
        return alpha, meta


def _store_path(M: Matrix) -> str | None:
    p = getattr(M, "store_path", None)
    if p is None:
        for s in getattr(M, "_src", []):
            if isinstance(s, StoreBlock):
                p = s.path
                break
    if p is None:
        return None
    p = os.fspath(p)
    if p.startswith("file://"):
        p = p[len("file://"):]
    return None if "://" in p else p.rstrip("/")


def _problem(M: Matrix, rho: np.ndarray, C: float, theta: float, gamma: Any, relevance_kind: Any) -> dict:
    rel = relevance_kind if isinstance(relevance_kind, str) else \
        f"callable:{getattr(relevance_kind, '__qualname__', type(relevance_kind).__name__)}"
    return {"shape": [int(M.shape[0]), int(M.shape[1])], "nnz": int(M.nnz), "standardize": M.standardize,
            "C": float(C), "theta": float(theta), "gamma": gamma if isinstance(gamma, str) else float(gamma),
            "relevance": rel, "rho": [float(rho.sum()), float(np.sqrt(rho @ rho)), float(rho.max(initial=0.0))]}


def default_checkpoint(M: Matrix, problem: dict) -> str | None:
    """``<store path>.dufs-side/mmfs-<hash of the problem>`` for a Matrix read from a local store, else None.

    The hash covers the shape, nnz, standardization, C, theta, gamma and relevance (not ``tol`` or
    ``max_epochs``: they only decide when to stop, so a resume may change them)."""
    p = _store_path(M)
    if p is None:
        return None
    key = {k: v for k, v in problem.items() if k != "rho"}
    h = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return f"{p}.dufs-side/mmfs-{h}"


# ---------------------------------------------------------------------------------------------------- the solver
def solve(M: Matrix, rho: np.ndarray, geo: dict, *, C: float, gamma: float, tol: float, max_epochs: int,
          random_state: int = 0, groups: list | None = None, state: Any = None, w: tuple | None = None,
          trace: list | None = None, alpha0: np.ndarray | None = None, checkpoint: Any = None,
          checkpoint_every: int = 5, checkpoint_meta: dict | None = None, recovery: dict | None = None,
          rule: str = "auto") -> dict:
    """Rounds of block DCD + line search until gap / |D| <= tol or ``max_epochs`` rounds. Returns a dict with the
    final ``state`` (per partition), ``ws``, ``wt``, ``b``, ``gap``, ``objective``, ``rounds``, ``converged``, and
    ``alpha`` and ``g`` gathered to the driver.

    ``groups`` are the partitions (lists of block indices; default: one partition of every block). With one
    partition a round is one serial DCD epoch, the bias moving. With K > 1 each partition runs its epoch with the
    bias held; a round after one whose duality gap did not decrease solves CoCoA+'s safe local subproblems
    (sigma' = K, the bias moving locally) instead (``trace[i]["rule"]``), then the held-bias rule resumes;
    ``rule="cocoa+"`` uses CoCoA+ every round.

    ``alpha0`` is alpha on the driver: the start when ``state`` is None, else what ``state`` holds. Every
    ``checkpoint_every`` rounds (under a distributed client or with a ``checkpoint``) alpha is gathered to the
    driver with the (w, b) it belongs to, and written to ``checkpoint`` (a :class:`_Checkpoint`) with
    ``checkpoint_meta``; when a round fails because workers (and the block state on them) were lost, the state is
    rebuilt from that copy and the rounds go on from there. ``recovery`` (a dict) counts ``recoveries`` and the
    ``rounds_replayed``.
    """
    from dufs.engine.matrix import _client

    m = M.shape[0]
    if groups is None:
        groups = [list(range(M.n_blocks))]
    recovery = {} if recovery is None else recovery
    recovery.setdefault("recoveries", 0)
    recovery.setdefault("rounds_replayed", 0)
    trace = [] if trace is None else trace
    every = max(1, int(checkpoint_every))
    client = _client()
    snap_on = checkpoint is not None or client is not None
    seen = recovery.setdefault("_workers", set())

    def watch() -> None:  # workers that left the cluster during the solve (dask may recompute their work itself)
        if client is not None:
            with contextlib.suppress(Exception):
                now = set(client.scheduler_info(n_workers=-1).get("workers", {}))
                recovery["workers_lost"] = len(seen - now)
                seen.update(now)

    watch()
    seed = int(random_state)
    if w is None:
        ws, wt, b = np.zeros(m), np.zeros(2), 0.0
    else:
        ws, wt, b = w
    if state is None:
        state = _init_blocks(M, groups, geo, rho, alpha0, seed)
        if alpha0 is None and snap_on:
            alpha0 = np.zeros(M.shape[1])
    elif alpha0 is None and snap_on:
        alpha0, _, state = _gather_alpha(M, groups, state)
    # the last copy of alpha on the driver with the (w, b) it belongs to, the rounds and trace entries before it
    snap = (alpha0, ws, wt, b, 0, len(trace))
    K = len(groups)
    step = 0.0
    if rule not in ("auto", "cocoa+"):
        raise ParameterError(f"The 'rule' parameter of solve must be 'auto' or 'cocoa+'; got {rule!r}.")
    # whether this round solves CoCoA+'s local subproblems (the previous round did not decrease the gap)
    cocoa = rule == "cocoa+" and K > 1
    prev_gap = np.inf
    converged = False
    gap = obj = np.inf
    r = 0
    alpha = g = None
    while True:
        last = r >= max_epochs
        try:
            if state is None:
                state = _init_blocks(M, groups, geo, rho, snap[0], seed + 7919 * recovery["recoveries"])
            # under a cluster w travels scattered, not inside the graph: the scheduler keeps the task specs of the
            # whole chain of block states, and an embedded w would stay there once per round (m floats each); a
            # lost chain is rebuilt from the driver's last copy of alpha instead (below)
            w_arg = client.scatter(ws, hash=False) if client is not None else ws
            sigma = float(K) if cocoa else 1.0
            res, new_state = M.map_blocks(_round, w_arg, wt, b, step, float(m), C, gamma, K == 1 or cocoa,
                                          not last, sigma, state=state, reduce="sum", groups=groups)
            if hasattr(state, "release"):
                state.release()
            if client is not None:
                w_arg.release()
            state = new_state
            dws, tl = res[:m], res[m:]
            dt, dS, ds, slope, gap, sa, ra = (float(v) for v in tl[:7])
            wnorm2 = float(ws @ ws)  # ws is w itself: the driver folds the constant part in every round
            obj = 0.5 * wnorm2 + b * b / (2.0 * gamma) - ra
            rel = gap / max(abs(obj), 1e-300)
            r += 1
            done = rel <= tol or gap <= 0.0
            fresh = False
            if done or last or (snap_on and r % every == 0):
                # alpha now is the one the round's gap was computed at: it belongs to (ws, wt, b)
                alpha, g, state = _gather_alpha(M, groups, state)
                snap = (alpha, ws, wt, b, r - 1, len(trace))
                fresh = True
                watch()
        except Exception as e:
            if not snap_on or snap[0] is None or not _is_lost(e) or recovery["recoveries"] >= _MAX_RECOVERIES:
                raise
            recovery["recoveries"] += 1
            recovery["rounds_replayed"] += r - snap[4]
            recovery.setdefault("errors", []).append(f"{type(e).__name__}: {str(e)[:200]}")
            log.warning("MMFS: the block state was lost (%s: %s); rebuilding it from alpha at round %d",
                        type(e).__name__, str(e)[:200], snap[5])
            with contextlib.suppress(Exception):
                if hasattr(state, "release"):
                    state.release()
            state = None
            _, ws, wt, b, r, n = snap
            del trace[n:]
            step = 0.0
            cocoa = rule == "cocoa+" and K > 1
            prev_gap = np.inf
            continue
        trace.append({"round": len(trace), "objective": obj, "duality_gap": gap, "relative_gap": rel,
                      "updates": int(tl[7]), "active": int(tl[8]), "gamma": gamma,
                      "rule": "serial" if K == 1 else "cocoa+" if cocoa else "held-bias"})
        log.debug("round %d: D = %.10g, gap = %.3g (relative %.3g), %d updates, %d active", len(trace) - 1, obj,
                  gap, rel, int(tl[7]), int(tl[8]))
        if checkpoint is not None and fresh:
            checkpoint.save(snap[0], {"round": snap[5], "gamma": gamma, "trace": trace[:snap[5]],
                                      "converged": bool(done), **(checkpoint_meta or {})})
        if done:
            converged = True
            break
        if last:
            break
        alpha = g = None
        # the fallback: after a round whose gap did not decrease, one round of CoCoA+ (provably safe; Ma et al.)
        cocoa = K > 1 and (rule == "cocoa+" or not cocoa and gap >= prev_gap)
        prev_gap = gap
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
            "trace": trace, "alpha": alpha, "g": g}


def auto_partitions(M: Matrix) -> int:
    """The number of partitions for ``n_partitions="auto"``: one per worker holding blocks (one per worker of the
    client when the blocks are not persisted), and one (serial DCD) in this process or for small or dense data.

    Small: under ``_SMALL_NNZ`` nonzeros a serial epoch takes a few tens of milliseconds, less than a round's
    fixed cost on a cluster. Dense: above ``_DENSE`` density the features are strongly coupled and the held-bias
    rule needs 3-4x the rounds of serial DCD (DESIGN.md 7.1: 86-138 rounds against 34 epochs on ALLAML)."""
    from dufs.engine.matrix import _client

    client = _client()
    if client is None or M.n_blocks == 1:
        return 1
    n, d = M.shape
    if M.nnz < _SMALL_NNZ or M.nnz > _DENSE * n * d:
        return 1
    owners = {a for a in M.placement() if a is not None}
    if owners:
        return len(owners)
    with contextlib.suppress(Exception):
        return max(1, len(client.scheduler_info(n_workers=-1)["workers"]))
    return 1


def mmfs(M: Matrix, y: Any, *, n_features: int | None = None, C: float = 1.0, theta: float = 0.5,
         gamma: Any = "auto", relevance_kind: Any = "correlation", tol: float = 1e-3, max_epochs: int = 500,
         random_state: int = 0, n_partitions: Any = "auto", checkpoint: Any = "auto", checkpoint_every: int = 5,
         resume: bool = False) -> MMFSResult:
    """Solve MMFS on ``M`` (its ``standardize`` gives the geometry) with labels ``y``; see the module docstring.

    ``gamma="auto"`` follows a decreasing path gamma = 1, 1/2, 1/4, ... with warm starts until the support holds
    ``n_features`` features (or gamma reaches 2^-30); a fixed gamma solves once.

    ``n_partitions`` (an int, or ``"auto"``: :func:`auto_partitions`) groups the feature blocks into partitions
    (:meth:`Matrix.partition`: by the worker holding them); each round runs one task a partition.

    The solver state never lives only on the workers: every ``checkpoint_every`` rounds alpha is gathered to the
    driver (under a distributed client) and written to ``checkpoint`` (a directory; ``"auto"``: beside a local
    store, ``<store>.dufs-side/mmfs-<hash of the problem>``, none for in-memory input; None: no file). A round that
    fails because workers were lost rebuilds the block state from that copy and goes on (``diagnostics
    ["recoveries"]``). ``resume=True`` continues from the checkpoint (``diagnostics["resumed_from_round"]``); a
    checkpoint of another problem raises a ParameterError naming the file.
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
    if not (isinstance(checkpoint_every, int | np.integer) and checkpoint_every >= 1):
        raise ParameterError(f"The 'checkpoint_every' parameter of mmfs must be an int >= 1; "
                             f"got {checkpoint_every!r}.")
    if not (checkpoint is None or checkpoint == "auto" or isinstance(checkpoint, str | os.PathLike)):
        raise ParameterError(f"The 'checkpoint' parameter of mmfs must be a directory path, 'auto' or None; "
                             f"got {checkpoint!r}.")
    if not (n_partitions == "auto" or isinstance(n_partitions, int | np.integer) and n_partitions >= 1):
        raise ParameterError(f"The 'n_partitions' parameter of mmfs must be 'auto' or an int >= 1; "
                             f"got {n_partitions!r}.")
    auto, geo, r, rho = margins(M, y, theta, gamma, relevance_kind)
    groups = M.partition(auto_partitions(M) if n_partitions == "auto" else int(n_partitions))
    problem = _problem(M, rho, C, theta, gamma, relevance_kind)
    directory = default_checkpoint(M, problem) if checkpoint == "auto" else checkpoint
    ck = None if directory is None else _Checkpoint(directory, problem)
    if resume and ck is None:
        raise ParameterError("mmfs(resume=True) needs a checkpoint directory: give checkpoint=<directory> (the "
                             "default is beside a local store only)")
    trace: list = []
    gammas = [float(gamma)] if not auto else [2.0 ** -k for k in range(31)]
    want = n_features if n_features is not None else 1
    state = None
    w = None
    alpha0 = None
    first = 0
    resumed_from = None
    if resume:
        got = ck.load()
        if got is None:
            log.info("mmfs(resume=True): no checkpoint at %s; starting from alpha = 0", ck.path)
        else:
            alpha0, meta = got
            first = int(meta.get("gamma_index", 0))
            trace = list(meta.get("trace", []))
            resumed_from = int(meta["round"])
            w = _primal(M, alpha0, gammas[first])
            log.info("mmfs: resuming from %s at round %d (gamma %.3g)", ck.path, resumed_from, gammas[first])
    recovery: dict = {}
    support = 0
    for k in range(first, len(gammas)):
        gk = gammas[k]
        if w is not None and alpha0 is not None:  # warm start: w depends on alpha only; b = gamma sum(alpha)
            w = (w[0], w[1], gk * float(alpha0.sum()))
        out = solve(M, rho, geo, C=float(C), gamma=gk, tol=float(tol), max_epochs=int(max_epochs),
                    random_state=int(random_state), groups=groups, state=state, w=w, trace=trace, alpha0=alpha0,
                    checkpoint=ck, checkpoint_every=int(checkpoint_every), checkpoint_meta={"gamma_index": k},
                    recovery=recovery)
        state = out["state"]
        alpha0 = out["alpha"]
        w = (out["ws"], out["wt"], out["b"])
        support = int((alpha0 > 0).sum())
        log.info("gamma %.3g: %d features in the support, gap %.3g after %d rounds", gk, support, out["gap"],
                 len(trace))
        if support >= want:
            break
    alpha, g = out["alpha"], out["g"]
    if hasattr(state, "release"):
        state.release()
    ws, wt, b = out["ws"], out["wt"], out["b"]
    diagnostics = {
        "objective": out["objective"], "duality_gap": out["gap"],
        "relative_gap": out["gap"] / max(abs(out["objective"]), 1e-300), "converged": out["converged"],
        "rounds": len(trace), "gamma": gk, "gamma_path": auto, "support": support, "n_partitions": len(groups),
        "n_blocks": M.n_blocks, "cocoa_rounds": sum(t.get("rule") == "cocoa+" for t in trace),
        "trace": trace, "solve_time": time.perf_counter() - t0,
        "recoveries": int(recovery.get("recoveries", 0)), "rounds_replayed": int(recovery.get("rounds_replayed", 0)),
        "checkpoint": None if ck is None else ck.path, "checkpoint_writes": 0 if ck is None else ck.writes,
        "resumed_from_round": resumed_from, "workers_lost": int(recovery.get("workers_lost", 0)),
    }
    if recovery.get("errors"):
        diagnostics["recovery_errors"] = recovery["errors"]
    if n_features is not None and support < n_features:
        diagnostics["filled_by_gradient"] = int(n_features - support)
        log.info("the support holds %d features; the other %d are the closest to entering it (dual gradient)",
                 support, n_features - support)
    return MMFSResult(alpha=alpha, w=ws + wt[0], b=float(b), gamma=gk, r=r, rho=rho, g=g, diagnostics=diagnostics)
