"""MMFS: max-margin feature selection by dual coordinate descent (paper 002; docs/methods.md, "MMFS").

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
(a fixed tree on the workers), takes the exact step on the plane of the summed direction and the last step's change
(the dual is quadratic there; the box bounds the step), and checks the gap.
With one partition the epoch also moves the bias: plain serial DCD (Hsieh et al. 2008).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dufs import config
from dufs._logging import get_logger
from dufs.engine import Matrix, fetch, flush
from dufs.errors import ParameterError
from dufs.methods.mmfs.checkpoint import Checkpoint
from dufs.methods.mmfs.problem import MMFS_PARAMS, margin_spec, margins
from dufs.methods.mmfs.solver import init_state, margin_summary, primal, solve
from dufs.methods.params import (
    check_params,
)
from dufs.methods.solver import checkpoint_dir, finish_checkpoint, release
from dufs.scheduling import current_client, one_blas_thread

log = get_logger(__name__)
_SMALL_NNZ = 2_000_000  # auto_partitions: fewer nonzeros run as one partition
_DENSE = 0.05  # auto_partitions: denser data runs as one partition


@dataclass
class MMFSResult:
    """What :func:`mmfs` found: ``alpha`` (per feature), ``w`` (over samples), ``b``, the ``gamma`` used, the
    relevance ``r`` and margins ``rho``, the gradient ``g`` (f_i^T w + b) at the solution, and ``diagnostics``."""

    alpha: np.ndarray
    w: np.ndarray
    b: float
    gamma: float
    r: np.ndarray | None
    rho: np.ndarray | None
    g: np.ndarray | None
    diagnostics: dict = field(default_factory=dict)
    top: np.ndarray | None = None

    @property
    def support(self) -> np.ndarray:
        """Features with alpha > 0, ranked by alpha (ties by the lower index)."""
        s = np.flatnonzero(self.alpha > 0)
        return s[np.lexsort((s, -self.alpha[s]))]

    def ranking(self) -> np.ndarray:
        """Every feature: the support by alpha, then the rest by their dual gradient g_i - rho_i, smallest first
        (closest to entering the support). For many features (``r``, ``rho`` and ``g`` then stay on the workers)
        the best ``n_features`` only, ranked the same way where the blocks live (``top``)."""
        if self.g is None:
            return self.top
        sup = self.support
        rest = np.flatnonzero(self.alpha <= 0)
        G = self.g[rest] - self.rho[rest]
        return np.concatenate([sup, rest[np.lexsort((rest, G))]])


def _problem(M: Matrix, rho_summary: np.ndarray, C: float, theta: float, gamma: Any, relevance_kind: Any) -> dict:
    rel = relevance_kind if isinstance(relevance_kind, str) else \
        f"callable:{getattr(relevance_kind, '__qualname__', type(relevance_kind).__name__)}"
    return {"shape": [int(M.shape[0]), int(M.shape[1])], "nnz": int(M.nnz), "standardize": M.standardize,
            "C": float(C), "theta": float(theta), "gamma": gamma if isinstance(gamma, str) else float(gamma),
            "relevance": rel, "rho": [float(v) for v in rho_summary]}


def default_checkpoint(M: Matrix, problem: dict) -> str | None:
    """``<store path>.dufs-side/mmfs-<hash of the problem>`` for a Matrix read from a local store (or under
    ``dufs.checkpoint.dir``, the per-user cache where the store's folder cannot be written), else None
    (:func:`dufs.methods.solver.checkpoint_dir`).

    The hash covers the shape, nnz, standardization, C, theta, gamma and relevance (not ``tol`` or
    ``max_epochs``: they only decide when to stop, so a resume may change them; not rho, which they imply)."""
    return checkpoint_dir(M, "auto", "mmfs", problem, unhashed=("rho",))


# ---------------------------------------------------------------------------------------------------- the solver
def auto_partitions(M: Matrix) -> int:
    """The number of partitions for ``n_partitions="auto"``: one per worker holding blocks (one per worker of the
    client when the blocks are not persisted), and one (serial DCD) in this process or for small or dense data.

    Small: under ``_SMALL_NNZ`` nonzeros a serial epoch takes a few tens of milliseconds, less than a round's
    fixed cost on a cluster. Dense: above ``_DENSE`` density the features are strongly coupled and the held-bias
    rule needs 3-4x the rounds of serial DCD (86-138 rounds against 34 epochs on ALLAML, docs/methods.md "MMFS")."""
    client = current_client()
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

    Defaults, chosen on data (``examples/mmfs_defaults.py``: C, theta, gamma, standardize, the relevance and its
    multi-class rule, on ALLAML, BASEHOCK, PCMAC, RELATHE, COIL20, ORL and Isolet, LinearSVC(C=1) on the top K with
    the selection made inside each of 5 folds): ``C=1``, ``theta=0.5``, ``gamma="auto"``, ``standardize="zscore"``
    (``fit``'s default) and ``relevance_kind="correlation"`` (|corr| on two classes, the correlation ratio on more).
    They beat the |correlation| ranking in 11 of the 14 (set, K in {5, 10}) cells, with a mean accuracy of 68.3%
    against 55.0%; taking the class ids as numbers (the rule before) reached 62.2% and depended on how the classes
    were numbered. No single change of C (0.01 .. 10), theta (0.3 .. 0.9) or a fixed gamma (1 .. 0.001) won more
    cells, and none had a mean more than 0.02 points higher (C=0.3). Recommended settings by kind of data:

    - dense measurements (microarrays, images, audio features): the defaults; ``standardize="zscore"`` matters
      (``"scale"`` lost 10-50 points on COIL20 and ORL, where the pixels' means differ);
    - sparse counts or tf-idf (text, kddb-like): the defaults (centring stays implicit, nothing is densified);
      ``"scale"`` gave the same accuracies on the three text sets and is the paper's kddb setting; at K >= 20 the
      |correlation| filter was as good or better on two of the three text sets, MMFS's gain is at small K;
    - many classes: the default correlation ratio; ``relevance_kind="fisher"`` ranks the same features first
      (eta^2 = F / (1 + F)) but its scale weighs relevance against redundancy differently and lost on ORL.

    ``gamma="auto"`` follows a decreasing path gamma = 1, 1/2, 1/4, ... with warm starts until the support holds
    ``n_features`` features (or gamma reaches 2^-30); a fixed gamma solves once.

    ``n_partitions`` (an int, or ``"auto"``: :func:`auto_partitions`) partitions the feature blocks into partitions
    (:meth:`Matrix.partition`: by the worker holding them); each round runs one task a partition.

    The solver state never lives only on the workers: every ``checkpoint_every`` rounds alpha is gathered to the
    driver (under a distributed client) and written to ``checkpoint`` (a directory; ``"auto"``: beside a local
    store, ``<store>.dufs-side/mmfs-<hash of the problem>``, or under ``dufs.checkpoint.dir`` or the per-user cache
    where the store's folder cannot be written, none for in-memory input; None: no file). A round that
    fails because workers were lost rebuilds the block state from that copy and goes on (``diagnostics
    ["recoveries"]``). ``resume=True`` continues from the checkpoint (``diagnostics["resumed_from_round"]``); a
    checkpoint of another problem raises a ParameterError naming the file. An ``"auto"`` checkpoint is removed
    when the solve ends well, unless ``dufs.checkpoint.keep`` (``diagnostics["checkpoint_kept"]``).
    """
    t0 = time.perf_counter()
    check_params(MMFS_PARAMS, {"C": C, "relevance": relevance_kind, "tol": tol, "max_epochs": max_epochs,
                               "random_state": random_state, "n_partitions": n_partitions,
                               "checkpoint_every": checkpoint_every, "resume": resume}, "mmfs")  # theta, gamma: margins
    if not (checkpoint is None or checkpoint == "auto" or isinstance(checkpoint, str | os.PathLike)):
        raise ParameterError(f"The 'checkpoint' parameter of mmfs must be a directory path, 'auto' or None; "
                             f"got {checkpoint!r}.")
    # above dufs.engine.driver-features the per-feature vectors (geometry, margins, the gradient) stay where the
    # blocks live and the driver holds alpha only (MMFSResult.r, rho and g are then None)
    on_blocks = M.shape[1] > int(config.get("engine.driver-features"))
    partitions = M.partition(auto_partitions(M) if n_partitions == "auto" else int(n_partitions))
    auto, geo, r, rho, state, rho_summary = _margins(M, y, theta, gamma, relevance_kind, on_blocks=on_blocks,
                                                     resume=resume, partitions=partitions, random_state=random_state)
    problem = _problem(M, rho_summary, C, theta, gamma, relevance_kind)
    directory = default_checkpoint(M, problem) if checkpoint == "auto" else checkpoint
    ck = None if directory is None else Checkpoint(directory, problem)
    if resume and ck is None:
        raise ParameterError("mmfs(resume=True) needs a checkpoint directory: give checkpoint=<directory> (the "
                             "default is beside a local store only)")
    gammas = [float(gamma)] if not auto else [2.0 ** -k for k in range(31)]
    want = n_features if n_features is not None else 1
    fresh = state is not None  # a state at alpha = 0 made above: the first solve is a cold start
    alpha0, first, trace, resumed_from, w = _resumed(ck, M, gammas) if resume else (None, 0, [], None, None)
    recovery: dict = {}
    kw = {"C": float(C), "tol": float(tol), "max_epochs": int(max_epochs), "random_state": int(random_state),
          "partitions": partitions, "checkpoint": ck, "checkpoint_every": int(checkpoint_every),
          "recovery": recovery, "gather_g": not on_blocks, "top": want if on_blocks else 0}
    out, gk = _gamma_path(M, rho, geo, gammas, first, want, state=state, w=w, alpha0=alpha0, trace=trace,
                          fresh=fresh, **kw)
    release(out["state"])
    diagnostics = _diagnostics(out, gk, auto, trace, recovery, ck, resumed_from, t0, n_features,
                               len(partitions), M.n_blocks, float(tol))
    # w = ws + t 1: ws itself where t is 0 (every step folds it in; a copy of 8 bytes a sample saved); kept on a
    # worker while the path went on (dufs.engine.kept), brought here once
    client = current_client()
    ws, wt = fetch(client, out["ws"]), out["wt"]
    if client is not None:
        flush(client)
    diagnostics["checkpoint_kept"] = ck is not None and finish_checkpoint(directory, checkpoint)
    return MMFSResult(alpha=out["alpha"], w=ws if wt[0] == 0.0 else ws + wt[0], b=float(out["b"]), gamma=gk, r=r,
                      rho=None if on_blocks else rho, g=out["g"], diagnostics=diagnostics, top=out["top"])


def _margins(M: Matrix, y: Any, theta: float, gamma: Any, relevance_kind: Any, *, on_blocks: bool, resume: bool,
             partitions: list, random_state: int) -> tuple:
    """The problem's geometry and margins: (auto, geometry, r, rho, the blocks' state, rho's summary). With
    ``on_blocks`` they stay where the blocks live (geometry and r None, rho their spec) and, unless resuming (the
    state then comes from the checkpoint's alpha), the blocks' state at alpha = 0 is made in the same pass."""
    state = None
    if on_blocks:  # the geometry and the margins where the blocks live: no vector over the features here
        auto, spec = margin_spec(M, y, theta, gamma, relevance_kind)
        geo, r, rho = None, None, spec
        if resume:  # the summary first (the checkpoint's problem), the state from the checkpoint's alpha after
            rho_summary = margin_summary(M, spec)
        else:  # the blocks' state at alpha = 0 and the margins' summary in the same pass
            state, rho_summary = init_state(M, partitions, spec, int(random_state))
    else:
        auto, geo, r, rho = margins(M, y, theta, gamma, relevance_kind)
        rho_summary = np.array([float(rho.sum()), float(np.sqrt(rho @ rho)), float(rho.max(initial=0.0))])
    return auto, geo, r, rho, state, rho_summary


def _resumed(ck: Checkpoint, M: Matrix, gammas: list[float]) -> tuple:
    """Where ``mmfs(resume=True)`` starts: (alpha, the gamma's index, the trace, the round, w) from the checkpoint,
    or alpha = 0 when it has none."""
    got = ck.load()
    if got is None:
        log.info("mmfs(resume=True): no checkpoint at %s; starting from alpha = 0", ck.path)
        return None, 0, [], None, None
    alpha0, meta = got
    first = int(meta.get("gamma_index", 0))
    trace = list(meta.get("trace", []))
    resumed_from = int(meta["round"])
    w = primal(M, alpha0, gammas[first])
    log.info("mmfs: resuming from %s at round %d (gamma %.3g)", ck.path, resumed_from, gammas[first])
    return alpha0, first, trace, resumed_from, w


def _gamma_path(M: Matrix, rho: Any, geo: Any, gammas: list[float], first: int, want: int, *, state: Any, w: Any,
                alpha0: np.ndarray | None, trace: list, fresh: bool, **kw: Any) -> tuple[dict, float]:
    """:func:`~dufs.methods.mmfs.solver.solve` at each gamma from ``gammas[first]`` on, warm-started from the last
    (``kw``: its fixed keywords), until the support holds ``want`` features; (the last solve's output, its
    gamma)."""
    for k in range(first, len(gammas)):
        gk = gammas[k]
        if w is not None and alpha0 is not None:  # warm start: w depends on alpha only; b = gamma sum(alpha)
            w = (w[0], w[1], gk * float(alpha0.sum()))
        with one_blas_thread():
            out = solve(M, rho, geo, gamma=gk, state=state, w=w, trace=trace, alpha0=alpha0,
                        checkpoint_meta={"gamma_index": k}, cold=fresh, ws_kept=True, **kw)
        fresh = False
        state = out["state"]
        alpha0 = out["alpha"]
        w = (out["ws"], out["wt"], out["b"])
        support = out["support"]  # alpha's nonzeros (alpha >= 0)
        log.info("gamma %.3g: %d features in the support, gap %.3g after %d rounds", gk, support, out["gap"],
                 len(trace))
        if support >= want:
            break
    return out, gk


def _diagnostics(out: dict, gk: float, auto: bool, trace: list, recovery: dict, ck: Checkpoint | None,
                 resumed_from: int | None, t0: float, n_features: int | None, n_partitions: int,
                 n_blocks: int, tol: float) -> dict:
    """:class:`MMFSResult`'s diagnostics from the last solve's output ``out`` (at gamma ``gk``): what stopped it
    (``stopped``: "converged", the relative duality gap within ``tol``, or "max_epochs") and how close it was
    (``convergence``: that gap against ``tol``)."""
    support = out["support"]
    rel = out["gap"] / max(abs(out["objective"]), 1e-300)
    diagnostics = {
        "objective": out["objective"], "duality_gap": out["gap"],
        "relative_gap": rel, "converged": out["converged"],
        "stopped": "converged" if out["converged"] else "max_epochs",
        "convergence": {"measure": "relative duality gap", "value": rel, "tol": tol},
        "rounds": len(trace), "gamma": gk, "gamma_path": auto, "support": support, "n_partitions": n_partitions,
        "n_blocks": n_blocks, "cocoa_rounds": sum(t.get("rule") == "cocoa+" for t in trace),
        "trace": trace, "solve_time": time.perf_counter() - t0,
        "recoveries": int(recovery.get("recoveries", 0)), "rounds_replayed": int(recovery.get("rounds_replayed", 0)),
        "checkpoint": None if ck is None else ck.path, "checkpoint_writes": 0 if ck is None else ck.writes,
        "resumed_from_round": resumed_from, "workers_lost": int(recovery.get("workers_lost", 0)),
    }
    if not out["converged"]:
        log.warning("mmfs: stopped by max_epochs at gamma %.3g before converging (relative duality gap %.3g against "
                    "tol %g)", gk, rel, tol)
    if recovery.get("errors"):
        diagnostics["recovery_errors"] = recovery["errors"]
    if n_features is not None and support < n_features:
        diagnostics["filled_by_gradient"] = int(n_features - support)
        log.info("the support holds %d features; the other %d are the closest to entering it (dual gradient)",
                 support, n_features - support)
    return diagnostics
