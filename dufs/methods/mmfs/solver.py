"""The distributed solver of MMFS's dual (docs/methods.md, "MMFS"): rounds of block dual coordinate descent over
the Matrix's feature partitions, each where its blocks live (``Matrix.map_blocks`` with per-partition state), an
exact search on the plane of the summed step and the last step's change, the duality gap as the certificate,
CoCoA+ as the fallback, and the resilience of :mod:`dufs.methods.solver` (rebuilding lost state from alpha, atomic
checkpoints)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import numpy as np

from dufs._logging import get_logger
from dufs.engine import Matrix, PerBlock, buffer, in_shared_memory, shipped
from dufs.errors import ParameterError
from dufs.kernels.dcd import (
    apply_step,
    step_dots,
)
from dufs.methods.mmfs.gram import _ColumnCache, _driver_epoch, _GramCache
from dufs.methods.mmfs.partition import _init, _init_from_spec, _margin_summary, _round, _take_alpha, inner_epochs
from dufs.methods.solver import recoverable, release
from dufs.scheduling import current_client, driver_threads, in_threads

log = get_logger(__name__)


# working sets of at most this many nonzeros in all (a round's partitions) go to the driver for one serial DCD
# epoch over their union, the bias moving, instead of an epoch per partition with the bias held (128 MB of float32
# columns at most, kept between rounds by the driver's column cache of the same size). Measured against 4M: the 2M x
# 5M bench store on 2 workers 7 -> 4 rounds (its 61-feature working set of rounds 1-3 went to the driver, not through
# three held-bias rounds), 2.5 -> 2.1 s; a planted 2M x 3M store (200 cluster features) 57 -> 21 rounds, 18 -> 12 s.
# A kddb-size working set (200 heavy features, 96M nonzeros) stays on its partitions either way
_SERIAL_NNZ = 16_000_000


# a cold start's first round (alpha = 0, w = 0, b = 0: every feature's gradient is -rho) works on the _SCREEN features
# of the largest margins (split over the partitions), not on every feature, as working-set solvers start (skglm: 10
# features, by their violation); the rounds after take every violator of the exact gradient. The 2M x 5M bench store
# (support 5): its first round's epoch over the 5M features took 0.6 s on 1 worker (0.36 s on 2), the screened
# round 0.14 s (0.09 s), and the solve needs 2 rounds (3 before, with the working sets solved through their Gram
# matrix, below)
_SCREEN = 10


def _init_blocks(M: Matrix, partitions: list, geo: dict | None, rho: Any, alpha0: np.ndarray | None,
                 seed: int) -> Any:
    """The partitions' states: from the driver's arrays (``geo``, ``rho``), or, when ``rho`` is a
    :class:`~dufs.methods.mmfs.MarginSpec`, computed by each block where it lives."""
    if geo is None:
        return _init_on_blocks(M, partitions, rho, alpha0, seed)[0]
    a0 = None if alpha0 is None else PerBlock(alpha0)
    _, state = M.map_blocks(_init, PerBlock(geo["coef"]), PerBlock(geo["shift"]), PerBlock(geo["colsum"]),
                            PerBlock(geo["qii"]), PerBlock(rho), a0, _seeds(M, seed), state=[None] * len(partitions),
                            partitions=partitions)
    return state


def _seeds(M: Matrix, seed: int) -> PerBlock:
    return PerBlock([seed * 1000003 + i for i in range(M.n_blocks)])


def _init_on_blocks(M: Matrix, partitions: list, spec: Any, alpha0: np.ndarray | None, seed: int
                    ) -> tuple[Any, np.ndarray]:
    """The partitions' states with each block's geometry and margins computed where it lives (``spec``: a
    :class:`~dufs.methods.mmfs.MarginSpec`), and the margins' [sum, norm, largest] from the same pass."""
    r_given = None if spec.r is None else PerBlock(spec.r)
    a0 = None if alpha0 is None else PerBlock(alpha0)
    with spec_shared(spec) as sp:
        parts, state = M.map_blocks(_init_from_spec, sp, r_given, a0, _seeds(M, seed), state=[None] * len(partitions),
                                    partitions=partitions)
    return state, _summary(parts)


@contextlib.contextmanager
def spec_shared(spec: Any) -> Any:
    """``spec`` (a :class:`~dufs.methods.mmfs.MarginSpec`) with its n-vectors (the scaled labels, the class codes)
    in /dev/shm for the ``with`` block where the workers share this machine's (:func:`dufs.engine.in_shared_memory`),
    else as it is (scattered once by the pass)."""
    from dataclasses import replace

    with contextlib.ExitStack() as stack:
        refs = {k: stack.enter_context(in_shared_memory(a)) for k in ("yn", "codes")
                if isinstance(a := getattr(spec, k), np.ndarray)}
        shared = {k: r for k, r in refs.items() if r is not getattr(spec, k)}
        yield replace(spec, **shared) if shared else spec


def init_state(M: Matrix, partitions: list, spec: Any, seed: int) -> tuple[Any, np.ndarray]:
    """The partitions' states at alpha = 0, each block computing its geometry and margins where it lives (a
    :class:`~dufs.methods.mmfs.MarginSpec`), and the margins' [sum, norm, largest] from the same pass (what
    :func:`margin_summary` gives, without a pass of its own)."""
    return _init_on_blocks(M, partitions, spec, None, seed)


def _summary(parts: list) -> np.ndarray:
    """[sum, norm, largest] of the margins from the blocks' or partitions' (sum, sum of squares, largest)."""
    s = np.array([0.0, 0.0, 0.0])
    for p in parts:
        s[:2] += p[:2]
        s[2] = max(s[2], p[2])
    return np.array([s[0], np.sqrt(s[1]), s[2]])


def margin_summary(M: Matrix, spec: Any) -> np.ndarray:
    """[sum, norm, largest] of the margins a :class:`~dufs.methods.mmfs.MarginSpec` gives, by one pass (each
    block computes its own and returns three numbers)."""
    with spec_shared(spec) as sp:
        return _summary(M.map_blocks(_margin_summary, sp, None if spec.r is None else PerBlock(spec.r)))


def _gather_alpha(M: Matrix, partitions: list, state: Any, with_g: bool = True, top: int = 0
                  ) -> tuple[np.ndarray, Any, Any, dict]:
    """(alpha, g) of every feature on the driver (g None unless ``with_g``), the state to go on with, and a dict:
    ``support``, alpha's nonzeros (indices, values), and with ``top`` > 0 the ``top`` best features (``top``:
    :func:`_merge_tops`, from the same pass)."""
    parts, new = M.map_blocks(_take_alpha, with_g, int(top), state=state, partitions=partitions)
    release(state)
    d = M.shape[1]
    alpha = np.zeros(d)
    g = np.zeros(d) if with_g else None
    index, value = [np.zeros(0, np.int64)], [np.zeros(0)]
    for part, _ in parts:
        for start, nz, a, gg in part:
            alpha[start + nz] = a
            index.append(start + nz)
            value.append(a)
            if with_g:
                g[start:start + gg.shape[0]] = gg
    info = {"support": (np.concatenate(index), np.concatenate(value)),
            "top": _merge_tops([t for _, t in parts], top) if top else None}
    return alpha, g, new, info


def primal(M: Matrix, alpha: np.ndarray, gamma: float) -> tuple[np.ndarray, np.ndarray, float]:
    """(ws, wt, b) from alpha in one pass: w = F alpha (Z alpha / sqrt(m) under a standardization, X alpha raw)."""
    m = M.shape[0]
    ws = np.asarray(M.matvec(alpha), dtype=np.float64)
    if M.standardize is not None:
        ws = ws / np.sqrt(m)
    return ws, np.array([0.0, float(ws.sum())]), float(gamma * alpha.sum())


_NO_ROWS = np.zeros(0)
_THREADED_ROWS = 1 << 18  # the driver's sweeps over at least this many samples run on its threads


def _range_sums(fn: Any, m: int) -> tuple:
    """``fn(r0, r1)``'s tuple of sums over the sample ranges [r0, r1) on the driver's threads (the workers wait
    meanwhile; from _THREADED_ROWS samples), the ranges' sums added in range order."""
    parts: dict = {}
    in_threads(lambda r0, r1: parts.__setitem__(r0, fn(r0, r1)), m, driver_threads() if m >= _THREADED_ROWS else 1)
    return tuple(sum(v) for v in zip(*(parts[k] for k in sorted(parts)), strict=True))


def _step_dots(dws: np.ndarray, dt: float, pw: np.ndarray | None) -> tuple[float, float, float]:
    """:func:`~dufs.kernels.dcd.step_dots` by :func:`_range_sums`."""
    return _range_sums(lambda r0, r1: step_dots(dws[r0:r1], dt, _NO_ROWS if pw is None else pw[r0:r1]),
                       dws.shape[0])


def _apply_step(dws: np.ndarray, dt: float, s: float, t: float, pw: np.ndarray, ws: np.ndarray,
                out: np.ndarray) -> tuple[float, float]:
    """:func:`~dufs.kernels.dcd.apply_step` by :func:`_range_sums`."""
    return _range_sums(lambda r0, r1: apply_step(dws[r0:r1], dt, s, t, pw[r0:r1], ws[r0:r1], out[r0:r1]),
                       ws.shape[0])


def solve(M: Matrix, rho: Any, geo: dict | None = None, *, C: float, gamma: float, tol: float, max_epochs: int,
          random_state: int = 0, partitions: list | None = None, state: Any = None, w: tuple | None = None,
          trace: list | None = None, alpha0: np.ndarray | None = None, checkpoint: Any = None,
          checkpoint_every: int = 5, checkpoint_meta: dict | None = None, recovery: dict | None = None,
          rule: str = "auto", gather_g: bool = True, cold: bool = False, top: int = 0) -> dict:
    """Rounds of block DCD + line search until gap / |D| <= tol or ``max_epochs`` rounds. Returns a dict with the
    final ``state`` (per partition), ``ws``, ``wt``, ``b``, ``gap``, ``objective``, ``rounds``, ``converged``, and
    ``alpha`` and ``g`` gathered to the driver (``g`` unless ``gather_g`` is False), and ``top``: with ``top`` > 0,
    the ``top`` best features (:func:`_merge_tops`, from the same pass as alpha).

    The problem is ``rho`` and ``geo`` (the margins and :func:`~dufs.methods.mmfs.geometry`, on the driver), or
    ``rho`` a :class:`~dufs.methods.mmfs.MarginSpec` and ``geo`` None: every block then computes its own where it
    lives (and again after lost workers), and nothing over the features but alpha reaches the driver.

    ``partitions``: lists of block indices ( default: one partition of every block). With one
    partition a round is one serial DCD epoch, the bias moving. With K > 1 each partition runs its epoch with the
    bias held; a round after one whose duality gap did not decrease solves CoCoA+'s safe local subproblems
    (sigma' = K, the bias moving locally) instead (``trace[i]["rule"]``), then the held-bias rule resumes;
    ``rule="cocoa+"`` uses CoCoA+ every round.

    ``alpha0`` is alpha on the driver: the start when ``state`` is None, else what ``state`` holds; ``cold``: the
    ``state`` given was made at alpha = 0 (:func:`init_state`), so the solve starts cold, as from no state. Every
    ``checkpoint_every`` rounds (under a distributed client or with a ``checkpoint``) alpha is gathered to the
    driver with the (w, b) it belongs to, and written to ``checkpoint`` (a :class:`_Checkpoint`) with
    ``checkpoint_meta``; when a round fails because workers (and the block state on them) were lost, the state is
    rebuilt from that copy and the rounds go on from there. ``recovery`` (a dict) counts ``recoveries`` and the
    ``rounds_replayed``.
    """
    m = M.shape[0]
    if partitions is None:
        partitions = [list(range(M.n_blocks))]
    recovery = {} if recovery is None else recovery
    recovery.setdefault("recoveries", 0)
    recovery.setdefault("rounds_replayed", 0)
    trace = [] if trace is None else trace
    every = max(1, int(checkpoint_every))
    client = current_client()
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
    # alpha = 0, b = 0 (``cold``: the state given was made at alpha = 0, by :func:`init_state`)
    cold = cold or (w is None and alpha0 is None and state is None)
    at_zero = w is None  # w = 0, b = 0: the first round's start need not read the data (dcd_start)
    if w is None:
        ws, wt, b = np.zeros(m), np.zeros(2), 0.0
    else:
        ws, wt, b = w
    if state is None:
        state = _init_blocks(M, partitions, geo, rho, alpha0, seed)
        if alpha0 is None and snap_on:
            alpha0 = np.zeros(M.shape[1])
    elif alpha0 is None and snap_on:
        alpha0, _, state = (np.zeros(M.shape[1]), None, state) if cold else _gather_alpha(M, partitions, state)[:3]
    # the last copy of alpha on the driver with the (w, b) it belongs to, the rounds and trace entries before it
    snap = (alpha0, ws, wt, b, 0, len(trace))
    K = len(partitions)
    step = np.zeros(2)  # (s, t): along the last round's direction, and along the change before it (below)
    pw, ps = None, 0.0  # the change of w (and of sum alpha) the last step made: the momentum direction
    dal = None  # the blocks' directions when the driver ran their epochs (else each block keeps its own)
    budget = _SERIAL_NNZ // K if K > 1 and rule == "auto" else 0
    cache = _ColumnCache(_SERIAL_NNZ) if budget else None  # working-set columns kept here between rounds
    held = _GramCache() if budget else None  # and the Gram matrix of the last one solved through it
    partition_of = [0] * M.n_blocks  # each block's partition
    for q, part_blocks in enumerate(partitions):
        for i in part_blocks:
            partition_of[i] = q
    bounds = M.bounds
    if rule not in ("auto", "cocoa+"):
        raise ParameterError(f"The 'rule' parameter of solve must be 'auto' or 'cocoa+'; got {rule!r}.")
    # whether this round solves CoCoA+'s local subproblems (the previous round did not decrease the gap). From a cold
    # start (alpha = 0, b = 0) the first round does too where the partitions run its epochs (its working sets, the
    # features of the largest margins, too large for the driver): held at 0, far from its optimum, the bias made
    # every partition's epoch over all the features take up about half of them (2.35M of 5M on the 2M x 5M bench
    # store, three rounds of 0.45 s before the gap came down), where the bias moving locally took up 52 (the serial
    # epoch: 35)
    cocoa = K > 1 and (rule == "cocoa+" or cold)
    prev_gap = np.inf
    converged = False
    gap = obj = np.inf
    r = 0
    alpha = g = None
    gathered: dict = {}  # the last gather's support and ranking head (_gather_alpha)
    wnorm2 = None  # ||ws||^2 when known (apply_step)
    while True:
        last = r >= max_epochs
        t_round = time.perf_counter()
        reused0 = 0 if cache is None else cache.reused
        try:
            if state is None:
                state = _init_blocks(M, partitions, geo, rho, snap[0], seed + 7919 * recovery["recoveries"])
            # under a cluster w travels beside the graph, not inside it: the scheduler keeps the task specs of the
            # whole chain of block states, and an embedded w would stay there once per round (m floats each); a
            # lost chain is rebuilt from the driver's last copy of alpha instead (below). It goes to every worker
            # at once when more than one partition reads it (scattered to one worker, the others' tasks fetched it
            # from there: a second transfer), or, on this machine's workers, as one shared copy (dufs.engine.shm)
            t_map = time.perf_counter()
            sigma = float(K) if cocoa else 1.0
            with shipped(ws, broadcast=partitions is not None and len(partitions) > 1, shared=True) as w_arg:
                res, new_state = M.map_blocks(_round, w_arg, wt, b, step, float(m), C, gamma, K == 1 or cocoa,
                                              not last, sigma, None if dal is None else PerBlock(dal), budget,
                                              PerBlock(partition_of),
                                              None if cache is None else PerBlock(cache.known(bounds)),
                                              at_zero and r == 0, -(-_SCREEN // K) if at_zero and r == 0 else 0,
                                              float(tol) if K == 1 else None,
                                              state=state, reduce="sum", partitions=partitions)
            release(state)
            state = new_state
            t_map = time.perf_counter() - t_map
            tl = res.tail
            dal = None
            mode = "serial" if K == 1 else "cocoa+" if cocoa else "held-bias"
            # the gap at this round's start (the driver's epochs below add no gap terms)
            gap, ra = tl.gap, tl.rho_alpha
            if wnorm2 is None:  # ws is w itself: the driver folds the constant part in every round
                wnorm2 = float(ws @ ws)
            obj = 0.5 * wnorm2 + b * b / (2.0 * gamma) - ra
            rel = gap / max(abs(obj), 1e-300)
            done = rel <= tol or gap <= 0.0 or tl.at_tol > 0.0
            # the change of ws the partitions made (not read after a round that ends the solve)
            dws = None if done else res.dense_into(buffer(m))
            # a round that ends the solve runs no driver epoch: its step would never be applied (on 2 workers,
            # 60-90 ms of serial DCD on the 2M x 5M bench store)
            serial = tl.epochs_run == 0
            if res.cols:
                mode = "serial working set" if serial else mode
            if res.cols and not done:
                # the partitions whose working sets were small sent them: with no partition running its own epoch,
                # one serial epoch over all of them, the bias moving (exact DCD on the working set); otherwise an
                # epoch per partition, as the partition would have run it
                by: dict = {}
                for c in res.cols:
                    by.setdefault(-1 if serial else c["part"], []).append(c if cache is None else cache.complete(c))
                dal = [None] * M.n_blocks
                for q, cs in sorted(by.items()):
                    reps = inner_epochs(sum(int(c["counts"].sum()) for c in cs), M.nnz) if serial else 1
                    _, sc, dl = _driver_epoch(cs, ws, wt, b, m, C, gamma, serial or cocoa,
                                              1.0 if serial else sigma, seed * 1000003 + 7 * r + q + 2, reps, held,
                                              dws)
                    tl = tl + sc
                    for start, ix, d in dl:
                        dal[int(np.searchsorted(bounds, start, side="right")) - 1] = (ix, d)
                dal = dal if any(v is not None for v in dal) else None  # None: the block keeps its own
            dt, ds, slope = tl.dt, tl.ds, tl.slope
            r += 1
            fresh = False
            if done or last or (snap_on and r % every == 0):
                # alpha now is the one the round's gap was computed at: it belongs to (ws, wt, b)
                alpha, g, state, gathered = _gather_alpha(M, partitions, state,
                                                          with_g=gather_g and (done or last),
                                                          top=top if done or last else 0)
                snap = (alpha, ws, wt, b, r - 1, len(trace))
                fresh = True
                watch()
        except Exception as e:
            if not snap_on or snap[0] is None or not recoverable(e, recovery["recoveries"]):
                raise
            recovery["recoveries"] += 1
            recovery["rounds_replayed"] += r - snap[4]
            recovery.setdefault("errors", []).append(f"{type(e).__name__}: {str(e)[:200]}")
            log.warning("MMFS: the block state was lost (%s: %s); rebuilding it from alpha at round %d",
                        type(e).__name__, str(e)[:200], snap[5])
            with contextlib.suppress(Exception):
                release(state)
            state = None
            _, ws, wt, b, r, n = snap
            del trace[n:]
            step, pw, ps = np.zeros(2), None, 0.0
            wnorm2 = None
            dal = None
            cocoa = rule == "cocoa+" and K > 1
            prev_gap = np.inf
            continue
        trace.append({"round": len(trace), "objective": obj, "duality_gap": gap, "relative_gap": rel,
                      "updates": int(tl.updates), "active": int(tl.visited), "gamma": gamma,
                      "rule": mode,
                      # the working sets' nonzeros the driver had from earlier rounds (not sent again)
                      "reused_nnz": 0 if cache is None else cache.reused - reused0,
                      # seconds: the round on the driver (its checkpoint included), waiting for the partitions'
                      # tasks, and summed over those: starting (step, gradient, gap terms), the DCD epochs, the task
                      "wall_s": time.perf_counter() - t_round, "map_s": t_map, "start_s": tl.start_s,
                      "epoch_s": tl.epoch_s, "task_s": tl.task_s})
        log.debug("round %d: D = %.10g, gap = %.3g (relative %.3g), %d updates, %d active", len(trace) - 1, obj,
                  gap, rel, int(tl.updates), int(tl.visited))
        if checkpoint is not None and fresh:
            checkpoint.save(snap[0], {"round": snap[5], "gamma": gamma, "trace": trace[:snap[5]],
                                      "converged": bool(done), **(checkpoint_meta or {})}, gathered["support"])
        if done:
            converged = True
            break
        if last:
            break
        alpha = g = None
        # the fallback: after a round whose gap did not decrease, one round of CoCoA+ (provably safe; Ma et al.).
        # Measured on the 2M x 5M store, 2 partitions: 19 rounds to a 1e-3 gap, against 23 with the fallback
        # only after a round whose line search found no descent (the gap zig-zags under the held-bias rule)
        cocoa = K > 1 and (rule == "cocoa+" or not cocoa and gap >= prev_gap)
        prev_gap = gap
        # exact line search along the summed direction d: the dual is quadratic along it, with slope
        # d^T grad D = sum_j d_j (g_j - rho_j) (summed by the blocks from the exact gradient) and curvature
        # ||dw||^2 + gamma ds^2 (dw = dws + dt 1 summed element by element, not expanded: no cancellation between
        # its two parts)
        # (the sums over the samples by step_dots and apply_step, one sweep each, into pooled vectors
        # (dufs.engine.buffers): a fresh n_samples vector's pages cost more than the arithmetic, 12-20 ms an
        # operation at 2M samples on the test machine's driver against 2-3 ms)
        dd, pp, dp = _step_dots(dws, dt, pw)
        den = dd + gamma * ds * ds
        st_ = float(np.clip(-slope / den, 0.0, 1.0)) if den > 0 and slope < 0 else 0.0
        tt = 0.0
        if pw is not None and tl.thi > tl.tlo and not res.cols:
            # and along the last step's change p as well: the dual is quadratic on span{d, p}, minimised over
            # s in [0, 1] and the t that keeps alpha in the box. The bias couples every coordinate (gamma 1 1^T,
            # an eigenvalue of gamma times the free coordinates): one direction a round zig-zags across it
            st_, tt = _plane_step(slope, tl.pslope, den, pp + gamma * ps * ps, dp + gamma * ds * ps, tl.tlo,
                                  tl.thi, st_)
        step = np.array([st_, tt])
        trace[-1]["step"], trace[-1]["momentum"] = st_, tt
        ps = st_ * ds + tt * ps if tt != 0.0 else st_ * ds
        if st_ != 0.0 or tt != 0.0:
            pw = buffer(m) if pw is None else pw
            new_ws = buffer(m)  # not the one a snapshot holds: a pooled vector is handed out only once unused
            total, wnorm2 = _apply_step(dws, dt, st_, tt, pw, ws, new_ws)
            ws = new_ws
            wt = np.array([0.0, total])
        else:
            pw = None
        dws = None
        b = b + gamma * ps
    return {"state": state, "ws": ws, "wt": wt, "b": b, "gap": gap, "objective": obj, "converged": converged,
            "trace": trace, "alpha": alpha, "g": g, "top": gathered.get("top"),
            "support": int(gathered["support"][0].shape[0]) if gathered else int(np.count_nonzero(alpha))}


def _plane_step(a: float, c: float, h11: float, h22: float, h12: float, tlo: float, thi: float,
                s1: float) -> tuple[float, float]:
    """(s, t) minimising a s + c t + (h11 s^2 + 2 h12 s t + h22 t^2) / 2 over s in [0, 1], t in [tlo, thi]
    (tlo <= 0 <= thi); ``s1`` is the minimiser on t = 0, never bettered by less."""

    def q(s: float, t: float) -> float:
        return a * s + c * t + 0.5 * (h11 * s * s + 2.0 * h12 * s * t + h22 * t * t)

    cands = [(s1, 0.0)]
    det = h11 * h22 - h12 * h12
    if h11 > 0 and h22 > 0 and det > 1e-12 * h11 * h22:
        s_ = (-a * h22 + c * h12) / det
        t_ = (-c * h11 + a * h12) / det
        if 0.0 <= s_ <= 1.0 and tlo <= t_ <= thi:
            cands.append((s_, t_))
    if h22 > 0:
        for s_ in (0.0, 1.0):
            cands.append((s_, float(np.clip(-(c + h12 * s_) / h22, tlo, thi))))
    if h11 > 0:
        for t_ in (tlo, thi):
            if np.isfinite(t_):
                cands.append((float(np.clip(-(a + h12 * t_) / h11, 0.0, 1.0)), t_))
    cands = [(s_, t_) for s_, t_ in cands if np.isfinite(s_) and np.isfinite(t_)]
    best = min(cands, key=lambda st: q(*st))
    return best if q(*best) < q(s1, 0.0) else (s1, 0.0)


def _merge_tops(parts: list, k: int) -> np.ndarray:
    """The ``k`` best features by :meth:`~dufs.methods.mmfs.MMFSResult.ranking`'s rule (the support by alpha, then
    the dual gradient g - rho, ties to the lower index) from the partitions' proposals (:func:`_top_of_state`)."""
    ids = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
    grp = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0)
    key = np.concatenate([p[2] for p in parts]) if parts else np.zeros(0)
    order = np.lexsort((ids, key, grp))[:k]
    return ids[order]
