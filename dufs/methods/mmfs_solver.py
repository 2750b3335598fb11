"""The distributed solver of MMFS's dual (docs/methods.md, "MMFS"): rounds of block dual coordinate descent over
the Matrix's feature partitions, each where its blocks live (``Matrix.map_blocks`` with per-partition state), an
exact search on the plane of the summed step and the last step's change, the duality gap as the certificate,
CoCoA+ as the fallback, and the resilience of :mod:`dufs.methods.solver` (rebuilding lost state from alpha, atomic
checkpoints)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import OrderedDict
from dataclasses import astuple, dataclass
from typing import Any

import numpy as np

from dufs._logging import get_logger
from dufs.engine import Matrix, PerBlock
from dufs.engine.buffers import buffer
from dufs.engine.dispatch import shipped
from dufs.engine.shm import local_array
from dufs.errors import ParameterError
from dufs.kernels.dcd import (
    active_set,
    add_columns,
    apply_step,
    column_gram,
    dcd_epoch,
    dcd_start,
    dense_dcd,
    mmfs_block_init,
    smallest_outside,
    step_dots,
)
from dufs.methods.solver import atomic_write, recoverable, release
from dufs.scheduling import current_client, driver_threads, in_threads

__all__ = ["Checkpoint", "RoundTotals", "primal", "solve"]

log = get_logger(__name__)

# block-random visit order (runs of this many consecutive features, the runs and each run shuffled): measured by
# `dufs bench mmfs` on the 2M x 5M store, 1 worker: 1.61 s a round against 2.38 s in uniformly random order (the
# per-feature arrays and column buffers of a run stay in cache), to the same gap in about as many rounds
_VISIT_ORDER = 1024
# working sets of at most this many nonzeros in all (a round's partitions) go to the driver for one serial DCD
# epoch over their union, the bias moving, instead of an epoch per partition with the bias held (128 MB of float32
# columns at most, kept between rounds by the driver's column cache of the same size). Measured against 4M: the 2M x
# 5M bench store on 2 workers 7 -> 4 rounds (its 61-feature working set of rounds 1-3 went to the driver, not through
# three held-bias rounds), 2.5 -> 2.1 s; a planted 2M x 3M store (200 cluster features) 57 -> 21 rounds, 18 -> 12 s.
# A kddb-size working set (200 heavy features, 96M nonzeros) stays on its partitions either way
_SERIAL_NNZ = 16_000_000
# serial epochs (the bias moving) repeat over the working set while their nonzeros, all epochs together, stay within
# this share of the round's gradient pass over the same data, up to _INNER_MAX epochs: the working-set subproblem
# solved closer for a fraction of a pass (the 2M x 5M bench store, support 5: 13 -> 7 rounds on 2 workers)
_INNER_SHARE = 0.25
_INNER_MAX = 10
# a serial working set of at most _GRAM_MAX columns is solved through its k x k matrix (_gram_epochs) when its
# nonzeros share at most _GRAM_PAIRS pairs of nonzeros in a row per nonzero (_gram_pays), its DCD epochs at most
# _GRAM_FLOPS flops in all
_GRAM_MAX = 1024
_GRAM_PAIRS = 4
_GRAM_FLOPS = 50_000_000
# a cold start's first round (alpha = 0, w = 0, b = 0: every feature's gradient is -rho) works on the _SCREEN features
# of the largest margins (split over the partitions), not on every feature, as working-set solvers start (skglm: 10
# features, by their violation); the rounds after take every violator of the exact gradient. The 2M x 5M bench store
# (support 5): its first round's epoch over the 5M features took 0.6 s on 1 worker (0.36 s on 2), the screened
# round 0.14 s (0.09 s), and the solve needs 2 rounds (3 before, with the working sets solved through their Gram
# matrix, below)
_SCREEN = 10


def inner_epochs(ws_nnz: int, pass_nnz: int) -> int:
    """Epochs a serial DCD round runs over a working set of ``ws_nnz`` nonzeros, its gradient pass reading
    ``pass_nnz``: 1 plus as many as _INNER_SHARE of the pass pays for, at most _INNER_MAX."""
    return int(min(_INNER_MAX, 1 + (_INNER_SHARE * pass_nnz) // max(int(ws_nnz), 1)))


# ---------------------------------------------------------------------------------------------------- blocks
def _init_state(block, coef, shift, colsum, qii, rho, alpha0, seed):
    w = block.width
    alpha = np.zeros(w) if alpha0 is None else np.array(alpha0, dtype=np.float64)
    return {"coef": np.ascontiguousarray(coef), "shift": np.ascontiguousarray(shift),
            "colsum": np.ascontiguousarray(colsum), "qii": np.ascontiguousarray(qii),
            "rho": np.ascontiguousarray(rho), "alpha": alpha, "dalpha": _NO_STEP, "g": np.zeros(w),
            "rng": np.array([np.uint64(seed) * np.uint64(2) + np.uint64(1)], dtype=np.uint64)}


def _init(blocks, state, coef, shift, colsum, qii, rho, alpha0, seed):
    return [_init_state(blk, coef[q], shift[q], colsum[q], qii[q], rho[q], None if alpha0 is None else alpha0[q],
                        seed[q]) for q, blk in enumerate(blocks)], None


def _init_from_spec(blocks, state, spec, r_given, alpha0, seed):
    """The blocks' states with their geometry and margins computed here, from the blocks (``spec``: a
    :class:`dufs.methods.mmfs.MarginSpec`), and the margins' (sum, sum of squares, largest) over the partition."""
    out, summary = [], np.array([0.0, 0.0, 0.0])
    for q, blk in enumerate(blocks):
        st, part = _block_state(blk, spec, None if r_given is None else r_given[q],
                                None if alpha0 is None else alpha0[q], seed[q])
        out.append(st)
        summary[:2] += part[:2]
        summary[2] = max(summary[2], part[2])
    return out, summary


def _block_state(blk, spec, r_block, alpha0, seed) -> tuple[dict, tuple]:
    """One block's state (:func:`_init_state`) and its margins' (sum, sum of squares, largest), computed from the
    block by ``spec``: the two-class correlation and a relevance given by one sweep into one array of the state's
    rows (:func:`~dufs.kernels.dcd.mmfs_block_init`, the same numbers as :func:`~dufs.methods.mmfs.block_margins`),
    the other relevances by ``block_margins``."""
    if spec.kind not in ("correlation", "given"):
        from dufs.methods.mmfs import block_margins

        g = block_margins(blk, spec, r_block)
        rho = g["rho"]
        return (_init_state(blk, g["coef"], g["shift"], g["colsum"], g["qii"], rho, alpha0, seed),
                (float(rho.sum()), float(rho @ rho), float(rho.max(initial=0.0))))
    from dufs.methods.mmfs import _GEOMETRY_MODE

    rows = np.zeros((7, blk.width))  # coef, shift, colsum, qii, rho, alpha, g: one allocation
    factor = spec.theta / (1.0 - spec.theta)
    y = local_array(spec.yn) if spec.kind == "correlation" else _NO_LABELS
    part = mmfs_block_init(blk.indptr, blk.indices, blk.data, spec.m, spec.m, _GEOMETRY_MODE[spec.standardize], y,
                           factor, rows)
    if spec.kind == "given":
        rows[4] = factor * np.asarray(r_block, dtype=np.float64)
        rho = rows[4]
        part = (float(rho.sum()), float(rho @ rho), float(rho.max(initial=0.0)))
    if alpha0 is not None:
        rows[5] = alpha0
    return {"coef": rows[0], "shift": rows[1], "colsum": rows[2], "qii": rows[3], "rho": rows[4], "alpha": rows[5],
            "dalpha": _NO_STEP, "g": rows[6],
            "rng": np.array([np.uint64(seed) * np.uint64(2) + np.uint64(1)], dtype=np.uint64)}, part


_NO_LABELS = np.zeros(0)


def _start(blk, st, ws, wt, b, step, m, C, dal=None, at_zero=False):
    """A block's part of a round's start: apply last round's step (along ``dal`` when the driver ran the block's
    epoch), the exact gradient, the gap terms at (w, b) and the working set, in one sweep (:func:`dcd_start`).
    Returns (state, [gap, sum alpha, rho^T alpha], working set: local indices, a view valid for this round).

    ``step`` is (s, t) (or s alone): alpha moves by s times last round's direction and t times the change the
    round before made (``st["pdir"]``, the momentum direction); the change made now becomes the next ``pdir``.

    No per-feature array is allocated: the new alpha is written into the spare the state keeps (the state before
    last's; it differs from alpha only at the coordinates the last step changed, so bringing it up to date costs
    those), so the state given keeps its alpha (a task may run again); g, which a round computes whole and never
    reads from its state, is written over in place."""
    st = dict(st)
    s_, t_ = (float(step[0]), float(step[1])) if np.ndim(step) else (float(step), 0.0)
    idx, d = st["dalpha"] if dal is None else dal
    pidx, pv = st.get("pdir", _NO_STEP)
    moved = (s_ != 0.0 and idx.size) or (t_ != 0.0 and pidx.size)
    if moved:
        if t_ != 0.0 and pidx.size:
            at = np.union1d(idx, pidx) if idx.size else pidx
            delta = np.zeros(at.shape[0])
            if idx.size and s_ != 0.0:
                delta[np.searchsorted(at, idx)] += s_ * d
            delta[np.searchsorted(at, pidx)] += t_ * pv
        else:  # idx ascending (a working set's coordinates, in order), as pdir must be for _momentum_bounds
            at, delta = idx, s_ * d
        alpha = st["alpha"]
        spare = st.get("alpha_spare")
        if spare is None:
            spare = alpha.copy()
        else:
            last = st["alpha_changed"]
            spare[last] = alpha[last]
        spare[at] = np.clip(alpha[at] + delta, 0.0, C)
        st.update(alpha=spare, alpha_spare=alpha, alpha_changed=at, pdir=(at, spare[at] - alpha[at]))
    else:
        st["pdir"] = _NO_STEP
    g = st["g"]
    index = st.get("index")
    if index is None:
        index = st["index"] = np.empty(blk.width, dtype=np.int64)
    gap, sa, ra, n_active = dcd_start(blk.indptr, blk.indices, blk.data, st["coef"], st["shift"], st["colsum"], ws,
                                      wt, m, b, st["rho"], st["alpha"], C, g, index, bool(at_zero))
    st["dalpha"] = _NO_STEP
    return st, (gap, sa, ra), index[:n_active]


def _momentum_bounds(st: dict, C: float) -> tuple[float, float]:
    """The range [lo, hi] of t for which alpha + s d + t p stays in [0, C] for every s in [0, 1] (d: this round's
    direction, p: the momentum direction ``pdir``); unbounded without one."""
    pidx, pv = st.get("pdir", _NO_STEP)
    if not pidx.size:
        return -np.inf, np.inf
    a = st["alpha"][pidx]
    lo_a, hi_a = a.copy(), a.copy()
    idx, d = st["dalpha"]
    if idx.size:
        pos = np.searchsorted(pidx, idx)
        pos = np.minimum(pos, pidx.size - 1)
        on = pidx[pos] == idx
        dd = np.zeros(pidx.size)
        dd[pos[on]] = d[on]
        lo_a += np.minimum(dd, 0.0)
        hi_a += np.maximum(dd, 0.0)
    up, dn = pv > 0.0, pv < 0.0
    his = np.concatenate([(C - hi_a[up]) / pv[up], lo_a[dn] / -pv[dn]])
    los = np.concatenate([-lo_a[up] / pv[up], (C - hi_a[dn]) / pv[dn]])
    return (float(min(0.0, los.max())) if los.size else -np.inf), (float(max(0.0, his.min())) if his.size else np.inf)


def _working_set(blk, st, C) -> np.ndarray:
    index = np.empty(blk.width, dtype=np.int64)
    n_active = active_set(st["g"], st["rho"], st["alpha"], C, 0.0, -0.0, index)
    return index[:n_active]


def _payload(blk, st, index, have=None) -> dict:
    """A block's working set for an epoch run by the driver: its columns and per-coordinate numbers. The columns
    in ``have`` (local indices the driver keeps, :class:`_ColumnCache`) are left out (``sent`` marks the others)."""
    lo, hi = blk.indptr[index], blk.indptr[index + 1]
    sent = np.ones(index.shape[0], dtype=np.bool_) if have is None or not len(have) else ~np.isin(index, have)
    take = np.concatenate([np.arange(a, c) for a, c in zip(lo[sent], hi[sent], strict=True)]) if sent.any() else \
        np.zeros(0, np.int64)
    return {"start": blk.start, "index": index, "counts": hi - lo, "sent": sent, "indices": blk.indices[take],
            "data": blk.data[take], **{k: st[k][index] for k in ("coef", "shift", "colsum", "qii", "rho", "alpha",
                                                                  "g")}}


_CACHE_MIN_NNZ = 4096  # working-set columns the driver keeps between rounds have at least this many nonzeros


class _ColumnCache:
    """The heavier working-set columns the driver received, kept between rounds (least recently used dropped
    beyond ``limit`` nonzeros): a partition leaves them out of its payload. The support of a kddb-like problem is
    a few heavy columns, sent every round: 1.2M nonzeros (about 10 MB) a round on the 2M x 5M bench store."""

    def __init__(self, limit: int):
        self.limit = int(limit)
        self.cols: OrderedDict = OrderedDict()  # (block start, local index) -> (indices, data)
        self.nnz = 0
        self.reused = 0  # nonzeros not sent because they were here

    def known(self, bounds: np.ndarray) -> list:
        """Per block (by ``bounds``), the sorted local indices of the columns held here."""
        by: dict = {}
        for start, j in self.cols:
            by.setdefault(start, []).append(j)
        return [np.sort(np.asarray(by.get(int(a), []), dtype=np.int64)) for a in bounds[:-1]]

    def complete(self, c: dict) -> dict:
        """The payload ``c`` with every column of its working set (the held ones put back, the heavy new ones
        kept)."""
        sent, counts, start, index = c["sent"], c["counts"], int(c["start"]), c["index"]
        ends = np.cumsum(counts)
        if sent.all():
            full_i, full_d = c["indices"], c["data"]
        else:
            full_i = np.empty(int(ends[-1]), dtype=c["indices"].dtype)
            full_d = np.empty(int(ends[-1]), dtype=c["data"].dtype)
            mask = np.repeat(sent, counts)
            full_i[mask] = c["indices"]
            full_d[mask] = c["data"]
            for j in np.flatnonzero(~sent):
                got = self.cols[(start, int(index[j]))]
                self.cols.move_to_end((start, int(index[j])))
                full_i[ends[j] - counts[j]:ends[j]] = got[0]
                full_d[ends[j] - counts[j]:ends[j]] = got[1]
                self.reused += int(counts[j])
            c = {**c, "indices": full_i, "data": full_d}
        heavy = np.flatnonzero(sent & (counts >= _CACHE_MIN_NNZ))
        if heavy.size:
            for j in heavy:
                a, b = int(ends[j] - counts[j]), int(ends[j])
                self.cols[(start, int(index[j]))] = (full_i[a:b].copy(), full_d[a:b].copy())
                self.nnz += b - a
            while self.nnz > self.limit and self.cols:
                _, (i, _) = self.cols.popitem(last=False)
                self.nnz -= i.shape[0]
        return c


def _epoch_begin(blk, st, C, index=None) -> dict:
    """A block's DCD epochs of one round (:func:`_epoch_run`, then :func:`_epoch_end`), against the partition's
    local (wsl, wtl, bias): the working set, alpha's working copy, the visit list and the generator.

    Working set: the coordinates whose projected gradient at the round's start is not zero (:func:`active_set`
    with thresholds 0: free, or at a bound with the gradient pointing into the box). Measured on the 2M x 5M
    kddb-like store (serial, C = gamma = 1): 15 rounds to a 1e-3 gap in 7.0 s, against 18 rounds in 14.4 s with
    LIBLINEAR's shrinking thresholds (last epoch's extreme projected gradients), whose epochs kept visiting 3-4M
    of the 5M coordinates; the exact gradient of every round catches a coordinate that starts to violate."""
    if index is None:
        index = _working_set(blk, st, C)
    return {"index": index, "a": st["alpha"].copy() if index.size else None, "visit": index.copy(),
            "left": int(index.shape[0]), "rng": st["rng"].copy()}


def _epoch_run(blk, st, run, wsl, wtl, bias, m, C, gamma, update_bias, sigma) -> int:
    """One more epoch over what is left of the block's working set (thresholds 0 in the epoch too: a coordinate
    whose gradient turned to point out of the box is left out); returns its updates."""
    if run["left"] == 0:
        return 0
    run["left"], _, _, n_upd = dcd_epoch(blk.indptr, blk.indices, blk.data, st["coef"], st["shift"], st["colsum"],
                                         st["qii"], st["rho"], run["a"], C, gamma, wsl, wtl, m, bias, update_bias,
                                         run["visit"], run["left"], np.zeros(2), run["rng"], _VISIT_ORDER, sigma)
    return int(n_upd)


def _epoch_end(st, run) -> None:
    """The block's direction (its coordinates' change over the round's epochs) to ``st["dalpha"]``."""
    index = run["index"]
    if not index.size:
        st["dalpha"] = _NO_STEP
        return
    d = run["a"][index] - st["alpha"][index]
    keep = d != 0.0
    st.update(rng=run["rng"], dalpha=(index[keep], d[keep]))


_NO_STEP = (np.zeros(0, dtype=np.int64), np.zeros(0))


@dataclass
class RoundTotals:
    """The numbers a round's partitions send besides the change of w, summed over them by ``+`` (in the fixed
    order of the tree reduce): the change of the two scalars of w (``dt``: of the constant part, ``dS``: of its
    sum) and of sum(alpha) (``ds``) that the alphas' change makes, the slope dalpha^T (g - rho) along it, the gap
    terms at the round's start (``gap``, ``sum_alpha``, ``rho_alpha`` = rho^T alpha), the coordinate updates and
    the coordinates visited, the partitions, and seconds spent starting (step, gradient, gap terms), in DCD epochs
    and in the whole task, and the partitions that ran their own epoch."""

    dt: float = 0.0
    dS: float = 0.0
    ds: float = 0.0
    slope: float = 0.0
    gap: float = 0.0
    sum_alpha: float = 0.0
    rho_alpha: float = 0.0
    updates: float = 0.0
    visited: float = 0.0
    partitions: float = 0.0
    start_s: float = 0.0
    epoch_s: float = 0.0
    task_s: float = 0.0
    epochs_run: float = 0.0
    pslope: float = 0.0  # the slope p^T (g - rho) along the momentum direction p
    tlo: float = -np.inf  # the range of the momentum step t that keeps alpha in the box (max / min over partitions)
    thi: float = np.inf
    at_tol: float = 0.0  # the one partition found the gap within tol at the round's start and ran no epoch

    def __add__(self, other: RoundTotals) -> RoundTotals:
        out = RoundTotals(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))
        out.tlo, out.thi = max(self.tlo, other.tlo), min(self.thi, other.thi)
        return out


class PartitionResult:
    """A partition's result of a round, summed over the partitions by ``+`` (the reduce): the change of ws (sparse
    (rows, values) while few rows change, else dense) and the scalars ``tail``."""

    __slots__ = ("m", "rows", "vals", "tail", "cols")

    def __init__(self, m: int, rows: np.ndarray | None, vals: np.ndarray, tail: np.ndarray,
                 cols: list | None = None):
        self.m, self.rows, self.vals, self.tail = m, rows, vals, tail
        self.cols = [] if cols is None else cols  # working sets (:func:`_payload`) for the driver's epochs

    def dense(self) -> np.ndarray:
        return self.vals if self.rows is None else self.dense_into(np.empty(self.m))

    def dense_into(self, out: np.ndarray) -> np.ndarray:
        """:meth:`dense` written into ``out`` (float64, ``m``)."""
        if self.rows is None:
            np.copyto(out, self.vals)
        else:
            out.fill(0.0)
            np.add.at(out, self.rows, self.vals)
        return out

    def __add__(self, other: PartitionResult) -> PartitionResult:
        tail = self.tail + other.tail
        cols = self.cols + other.cols
        if self.rows is not None and other.rows is not None and self.rows.size + other.rows.size < self.m // 4:
            return PartitionResult(self.m, np.concatenate([self.rows, other.rows]),
                                   np.concatenate([self.vals, other.vals]), tail, cols)
        return PartitionResult(self.m, None, self.dense() + other.dense(), tail, cols)

    @classmethod
    def of(cls, dws: np.ndarray, tail: np.ndarray, cols: list | None = None) -> PartitionResult:
        if np.count_nonzero(dws) < dws.shape[0] // 4:  # counted first: the rows of a dense change are 8 bytes each
            rows = np.flatnonzero(dws)
            return cls(dws.shape[0], rows, dws[rows], tail, cols)
        return cls(dws.shape[0], None, dws, tail, cols)


def _round(blocks, states, ws, wt, b, step, m, C, gamma, update_bias, epoch, sigma, dal=None, budget=0, part=0,
           have=None, at_zero=False, screen=0, tol=None):
    """One round of a partition (its blocks, in a random order): apply last round's step and compute the gap terms
    at (w, b) on every block, then (if ``epoch``) one DCD epoch over all of them against one local copy of w, with
    the bias held at ``b`` unless ``update_bias`` (one partition: serial DCD; or CoCoA+ with ``sigma`` > 1).

    ``dal`` (one item a block, or None): the blocks' directions when the driver ran their epoch last round.
    When the partition's working sets hold at most ``budget`` nonzeros, it runs no epoch and returns them
    (:func:`_payload`, tagged with ``part``; ``have``, one item a block: the columns the driver already holds) for
    the driver's epoch instead. ``at_zero``: ws and wt are zero (a cold start's first round): the gradient is the
    bias alone and the start reads no nonzeros (:func:`dcd_start`). ``screen``: the working sets cut to that many
    coordinates of the largest margins (:func:`_screened`). ``tol`` (the only partition: its gap terms are the
    whole gap, and ws is w): no epoch when the relative gap at the start is within it, the solve's last round
    (``at_tol`` tells the driver; the driver skips its own epochs so).

    Returns the new states and a :class:`PartitionResult`: the change of ws and the round's :class:`RoundTotals`
    (dws, dt, dS: the change of w that the alphas' change makes, whatever ``sigma``)."""
    t0 = time.perf_counter()
    ws = local_array(ws)
    part = part[0] if isinstance(part, list) else part
    tail = RoundTotals(partitions=1.0)
    new, sets = [], []
    for q, (blk, st) in enumerate(zip(blocks, states, strict=True)):
        st, (gap, sa, ra), ix = _start(blk, st, ws, wt, b, step, m, C, None if dal is None else dal[q], at_zero)
        pidx, pv = st["pdir"]
        if pidx.size:  # the slope along the momentum direction, at the round's start (g is exact there)
            tail.pslope += float((st["g"][pidx] - st["rho"][pidx]) @ pv)
        tail.gap += gap
        tail.sum_alpha += sa
        tail.rho_alpha += ra
        new.append(st)
        sets.append(ix)
    tail.start_s = time.perf_counter() - t0
    tail.tlo = tail.thi = 0.0  # no momentum step unless this partition's epoch runs here (below)
    if screen and epoch:
        sets = _screened(new, sets, int(screen))
    if tol is not None and epoch:  # the driver's test of the same numbers (solve)
        obj = 0.5 * float(ws @ ws) + b * b / (2.0 * gamma) - tail.rho_alpha
        if tail.gap / max(abs(obj), 1e-300) <= tol or tail.gap <= 0.0:
            epoch = False
            tail.at_tol = 1.0
    if not epoch:
        tail.task_s = time.perf_counter() - t0
        return new, PartitionResult(ws.shape[0], np.zeros(0, dtype=np.int64), np.zeros(0), tail)
    nnz = sum(int((blk.indptr[ix + 1] - blk.indptr[ix]).sum()) for blk, ix in zip(blocks, sets, strict=True))
    if nnz <= budget:
        cols = []
        for q, (blk, st, ix) in enumerate(zip(blocks, new, sets, strict=True)):
            st["dalpha"] = _NO_STEP
            if ix.size:
                cols.append({"part": part, **_payload(blk, st, ix, None if have is None else have[q])})
        tail.visited = float(sum(ix.size for ix in sets))
        tail.task_s = time.perf_counter() - t0
        return new, PartitionResult(ws.shape[0], np.zeros(0, dtype=np.int64), np.zeros(0), tail, cols)
    tail.epochs_run = 1.0
    tail.tlo, tail.thi = -np.inf, np.inf
    serial = update_bias and sigma == 1.0
    reps = 1
    if serial:  # serial DCD: the whole working set again while a fraction of a pass pays
        reps = inner_epochs(nnz, sum(int(b_.indptr[-1]) for b_ in blocks))
    if serial and 0 < sum(ix.size for ix in sets) <= _GRAM_MAX and _gram_pays(
            np.concatenate([blk.indptr[ix + 1] - blk.indptr[ix] for blk, ix in zip(blocks, sets, strict=True)]),
            m):  # a small working set: by its k x k matrix
        t1 = time.perf_counter()
        cols = [_payload(blk, st, ix) for blk, st, ix in zip(blocks, new, sets, strict=True) if ix.size]
        indptr, indices, data, per = _stack(cols)
        a = per["alpha"].copy()
        rng = new[0]["rng"].copy()
        held = new[0].setdefault("gram", _GramCache())  # kept in the partition's state between rounds
        got = _gram_epochs(indptr, indices, data, per, a, m, C, gamma, rng, held=held)
        if got is not None:
            dws, sc = got
            new[0]["rng"] = rng
            moved = iter(_moved(cols, a - per["alpha"]))
            for st, ix in zip(new, sets, strict=True):
                if ix.size:
                    _, idx, d = next(moved)
                    st["dalpha"] = (idx, d)
                lo, hi = _momentum_bounds(st, C)
                tail.tlo, tail.thi = max(tail.tlo, lo), min(tail.thi, hi)
                tail.visited += int(ix.shape[0])
            tail.epoch_s += time.perf_counter() - t1
            tail.updates, tail.ds, tail.slope, tail.dt, tail.dS = sc.updates, sc.ds, sc.slope, sc.dt, sc.dS
            tail.task_s = time.perf_counter() - t0
            return new, PartitionResult.of(dws, tail)
    wsl = buffer(ws.shape[0])  # pooled (dufs.engine.buffers): a fresh vector's pages fault in at every round
    np.copyto(wsl, ws)
    wtl = wt.copy()
    bias = np.array([b])
    # the blocks' order: from the first block's generator state (deterministic, new every round)
    order = np.random.default_rng(int(new[0]["rng"][0])).permutation(len(blocks))
    runs = [_epoch_begin(blk, st, C, ix) for blk, st, ix in zip(blocks, new, sets, strict=True)]
    t1 = time.perf_counter()
    for _ in range(reps):
        moved = 0
        for q in order:
            moved += _epoch_run(blocks[q], new[q], runs[q], wsl, wtl, bias, m, C, gamma, update_bias, sigma)
        tail.updates += moved
        if moved == 0:
            break
    tail.epoch_s += time.perf_counter() - t1
    for st, run in zip(new, runs, strict=True):
        _epoch_end(st, run)
        idx, d = st["dalpha"]
        tail.ds += float(d.sum())
        lo, hi = _momentum_bounds(st, C)
        tail.tlo, tail.thi = max(tail.tlo, lo), min(tail.thi, hi)
        tail.slope += float((st["g"][idx] - st["rho"][idx]) @ d)  # the directional derivative, exact gradient
        tail.visited += int(run["index"].shape[0])
    dws = wsl  # the change of w, in place: one n_samples vector less at the task's peak
    dws -= ws
    tail.dt = float(wtl[0] - wt[0])
    tail.dS = float(wtl[1] - wt[1])
    if sigma != 1.0:
        dws /= sigma
        tail.dt /= sigma
        tail.dS /= sigma
    tail.task_s = time.perf_counter() - t0
    return new, PartitionResult.of(dws, tail)


def _screened(states: list, sets: list, k: int) -> list:
    """The working sets cut to their ``k`` coordinates of the most negative g - rho over the partition's blocks: at a
    cold start, where g = b = 0, those of the largest margins rho."""
    if sum(ix.size for ix in sets) <= k:
        return sets
    cand = []
    for q, (st, ix) in enumerate(zip(states, sets, strict=True)):
        if ix.size:
            idx, key = smallest_outside(st["alpha"], st["g"], st["rho"], min(k, ix.size))
            cand.append((q, idx, key))
    keys = np.concatenate([c[2] for c in cand])
    cut = np.sort(keys)[k - 1] if keys.size > k else np.inf
    out = [np.zeros(0, dtype=np.int64)] * len(sets)
    left = k
    for q, idx, key in cand:
        take = np.sort(idx[key < cut])
        out[q] = take
        left -= take.size
    for q, idx, key in cand:  # ties at the cut, in block order
        if left <= 0:
            break
        tie = idx[key == cut][:left]
        out[q] = np.sort(np.concatenate([out[q], tie]))
        left -= tie.size
    return out


def _driver_epoch(cols: list, ws: np.ndarray, wt: np.ndarray, b: float, m: int, C: float, gamma: float,
                  update_bias: bool, sigma: float, seed: int, epochs: int = 1, held: _GramCache | None = None,
                  out: np.ndarray | None = None) -> tuple:
    """One DCD epoch in this process over working sets sent by the partitions (:func:`_payload`), from (w, b).
    Returns (dws, its :class:`RoundTotals` (dt, dS, ds, slope, updates), [(block start, coordinates, their
    change), ...]); with ``out``, dws is added into it and is ``out``. A serial working set (``update_bias``,
    ``sigma`` 1) that :func:`_gram_pays` for is solved through its k x k matrix instead (``held``: the Gram matrix
    kept between rounds)."""
    indptr, indices, data, per = _stack(cols)
    a = per["alpha"].copy()
    n = a.shape[0]
    rng = np.array([np.uint64(seed) * np.uint64(2) + np.uint64(1)], dtype=np.uint64)
    if update_bias and sigma == 1.0 and n <= _GRAM_MAX and _gram_pays(np.diff(indptr), m):
        got = _gram_epochs(indptr, indices, data, per, a, m, C, gamma, rng, driver_threads(), held, out)
        if got is not None:
            return (*got, _moved(cols, a - per["alpha"]))
    wsl, wtl, bias = ws.copy(), wt.copy(), np.array([b])
    visit = np.arange(n, dtype=np.int64)
    n_upd, left = 0, n
    for _ in range(max(1, int(epochs))):  # ``epochs``: as in _epoch
        left, _, _, upd = dcd_epoch(indptr, indices, data, per["coef"], per["shift"], per["colsum"], per["qii"],
                                    per["rho"], a, C, gamma, wsl, wtl, float(m), bias, update_bias, visit, left,
                                    np.zeros(2), rng, _VISIT_ORDER, sigma)
        n_upd += upd
        if upd == 0 or left == 0:
            break
    d = a - per["alpha"]
    dws = wsl  # the epoch's w becomes its change, in place: no n_samples temporaries (16 MB each at 2M samples)
    dws -= ws
    dws /= sigma
    sc = RoundTotals(dt=float((wtl[0] - wt[0]) / sigma), dS=float((wtl[1] - wt[1]) / sigma), ds=float(d.sum()),
                     slope=float((per["g"] - per["rho"]) @ d), updates=float(n_upd))
    if out is not None:
        out += dws
        dws = out
    return dws, sc, _moved(cols, d)


def _stack(cols: list) -> tuple:
    """The working sets ``cols`` (:func:`_payload`) as one CSC set (indptr, indices, data) and their per-coordinate
    numbers (float64)."""
    counts = np.concatenate([c["counts"] for c in cols])
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    indices = np.concatenate([c["indices"] for c in cols])
    data = np.concatenate([c["data"] for c in cols])
    per = {k: np.concatenate([c[k] for c in cols]).astype(np.float64) for k in ("coef", "shift", "colsum", "qii",
                                                                                   "rho", "alpha", "g")}
    per["feature"] = np.concatenate([c["start"] + c["index"] for c in cols]).astype(np.int64)
    return indptr, indices, data, per


def _moved(cols: list, d: np.ndarray) -> list:
    """[(block start, its coordinates that moved, their change), ...] for the working sets ``cols``."""
    dal, at = [], 0
    for c in cols:
        k = c["index"].shape[0]
        dc = d[at:at + k]
        keep = dc != 0.0
        dal.append((c["start"], c["index"][keep], dc[keep]))
        at += k
    return dal


def _gram_pays(counts: np.ndarray, m: float) -> bool:
    """Whether columns of ``counts`` nonzeros over ``m`` rows are expected (rows drawn independently) to share at
    most _GRAM_PAIRS pairs of nonzeros in a row per nonzero: checked before their nonzeros are copied together.

    The Gram matrix costs about 6 ns a nonzero and 11 a pair on this machine; an epoch over the nonzeros 4-11 ns a
    nonzero, and the working-set solve it makes exact saves rounds (a gradient pass each): 8 -> 3 rounds on a 2M x
    3M store planted like kddb (200 features of 2.5% of the rows each, about 2 pairs a nonzero)."""
    c = counts.astype(np.float64)
    n = float(c.sum())
    return (n * n - float(c @ c)) / (2.0 * max(float(m), 1.0)) <= _GRAM_PAIRS * n


class _GramCache:
    """The raw Gram matrix X^T X of the last working set solved through it, by feature (global index): a working
    set within that one reads its rows and columns from it (the data does not change between rounds; a support
    stays the working set of round after round)."""

    def __init__(self):
        self.keys = np.zeros(0, dtype=np.int64)
        self.G = np.zeros((0, 0))
        self.hits = 0

    def get(self, keys: np.ndarray) -> np.ndarray | None:
        if not self.keys.size:
            return None
        pos = np.minimum(np.searchsorted(self.keys, keys), self.keys.size - 1)
        if not (self.keys[pos] == keys).all():
            return None
        self.hits += 1
        return self.G[np.ix_(pos, pos)]

    def put(self, keys: np.ndarray, G: np.ndarray) -> None:
        order = np.argsort(keys)
        self.keys, self.G = keys[order], G[np.ix_(order, order)]


def _gram_epochs(indptr, indices, data, per: dict, a: np.ndarray, m: int, C: float, gamma: float,
                 rng: np.ndarray, threads: int = 1, held: _GramCache | None = None, out: np.ndarray | None = None
                 ) -> tuple[np.ndarray, RoundTotals] | None:
    """The serial working-set subproblem (the bias moving) solved through its k x k matrix: Q = F^T F + gamma
    1 1^T from the columns' Gram matrix (:func:`column_gram`), then DCD on Q (:func:`dense_dcd`) from the round's
    exact gradient ``per["g"]`` to a projected-gradient span of 1e-9 times the start's, and w's change made once
    from the coordinates' change (:func:`add_columns`); both sweeps over the nonzeros on ``threads`` threads, a
    range of rows each; ``held``: the Gram matrix kept from an earlier round. ``a`` (alpha's working copy) is updated
    in place. None (the caller runs its epochs over the nonzeros) when the columns share, in a thread's rows, more
    than twice the pairs of nonzeros in a row that :func:`_gram_pays` allowed.

    An epoch over the nonzeros reads each column twice (its dot with w, then w's update); the Gram matrix costs
    about one such epoch, after which an epoch costs k^2 flops. Measured on the 2M x 5M bench store (2 workers):
    its working sets (60 heavy columns, 2.3M nonzeros; then 5, 1.2M) took 7 and 10 epochs over the nonzeros, 59
    and 62 ms on the driver while the workers waited, and left the subproblem unsolved: 4 rounds to the 1e-3 gap;
    solved through Q, 3 rounds."""
    k = a.shape[0]
    F = None if held is None else held.get(per["feature"])
    if F is None:
        limit = 2 * _GRAM_PAIRS * int(indptr[-1])  # the estimate's pairs, twice over
        parts: dict = {}

        def gram(r0: int, r1: int) -> None:
            G = np.zeros((k, k))
            parts[r0] = (G, column_gram(indptr, indices, data, r0, r1, limit, G))

        in_threads(gram, int(m), threads)
        if not all(ok for _, ok in parts.values()):
            return None
        F = sum(G for G, _ in parts.values())
        F = np.triu(F) + np.triu(F, 1).T  # the pairs went to the upper triangle (a row's columns in increasing order)
        if held is not None:
            held.put(per["feature"], F)  # a copy, in the order of the features
    coef, shift, colsum = per["coef"], per["shift"], per["colsum"]
    if shift.any():  # f_j = coef_j (x_j - shift_j 1)
        F -= np.outer(colsum, shift)
        F -= np.outer(shift, colsum)
        F += float(m) * np.outer(shift, shift)
    F *= np.outer(coef, coef)
    np.fill_diagonal(F, per["qii"])  # the geometry's own sums of squares (centred where standardized)
    F += gamma
    grad = per["g"] - per["rho"]
    a0 = per["alpha"]
    pg = np.where(a0 <= 0.0, np.minimum(grad, 0.0), np.where(a0 >= C, np.maximum(grad, 0.0), grad))
    tol = 1e-9 * float(pg.max(initial=0.0) - pg.min(initial=0.0))
    _, n_upd, _ = dense_dcd(F, grad, a, C, rng, max(10, min(1000, _GRAM_FLOPS // max(k * k, 1))), tol)
    d = a - a0
    dc = d * coef
    dws = buffer(int(m), zero=True) if out is None else out  # the change of ws, or added into ``out``
    in_threads(lambda r0, r1: add_columns(indptr, indices, data, dc, r0, r1, dws[r0:r1]), int(m), threads)
    sc = RoundTotals(dt=-float(dc @ shift), dS=float(dc @ colsum), ds=float(d.sum()),
                     slope=float((per["g"] - per["rho"]) @ d), updates=float(n_upd))
    return dws, sc


# ---------------------------------------------------------------------------------------------------- resilience
def _take_alpha(blocks, states, with_g=True, top=0):
    out = []
    for blk, st in zip(blocks, states, strict=True):
        nz = np.flatnonzero(st["alpha"])  # alpha is sparse (the support): send its nonzeros
        # g copied: in this process the state's g is a buffer a later round writes into
        out.append((blk.start, nz, st["alpha"][nz], st["g"].copy() if with_g else None))
    return states, (out, _top_of_state(blocks, states, top)[1] if top else None)


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
    in /dev/shm for the ``with`` block where the workers share this machine's (:func:`~dufs.engine.shm.publish`),
    else as it is (scattered once by the pass). Scattered, a 2M-sample spec (16 MB) took 64 ms of a 2-worker
    solve's start."""
    from dataclasses import replace

    from dufs.engine.shm import publish, shared_eligible

    client = current_client()
    big = {k: a for k in ("yn", "codes") if isinstance(a := getattr(spec, k), np.ndarray) and
           shared_eligible(client, a)}
    if not big:
        yield spec
        return
    with contextlib.ExitStack() as stack:
        try:
            refs = {k: stack.enter_context(publish(a)) for k, a in big.items()}
        except OSError:  # /dev/shm cannot hold them: scattered
            refs = None
        yield spec if refs is None else replace(spec, **refs)


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


def _margin_summary(blk, spec, r_given):
    return np.array(_block_state(blk, spec, r_given, None, 0)[1])


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


class Checkpoint:
    """``<directory>/checkpoint.npz``: alpha and a JSON of the rest (round, gamma, the path position, the trace,
    the problem it belongs to), written to a temporary name and renamed into place (atomic)."""

    NAME = "checkpoint.npz"

    def __init__(self, directory: str, problem: dict):
        self.directory = os.fspath(directory)
        self.path = os.path.join(self.directory, self.NAME)
        self.problem = problem
        self.writes = 0
        self.last_round: int | None = None

    def save(self, alpha: np.ndarray, meta: dict, support: tuple | None = None) -> None:
        """Write ``alpha`` (its nonzeros: ``support``, (indices, values), where the caller has them) and ``meta``."""
        os.makedirs(self.directory, exist_ok=True)
        meta = {"format": 2, "problem": self.problem, **meta}
        if support is None:
            nz = np.flatnonzero(alpha)  # the support only: alpha is sparse
            support = (nz, alpha[nz])
        nz, val = support
        atomic_write(self.path, lambda f: np.savez(
            f, n=np.int64(alpha.shape[0]), index=nz, value=np.asarray(val, dtype=np.float64),
            meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)))
        self.writes += 1
        self.last_round = int(meta.get("round", -1))

    def load(self) -> tuple[np.ndarray, dict] | None:
        """The checkpoint (alpha, meta), None when there is none; a ParameterError naming the file when it is
        unreadable or belongs to another problem."""
        if not os.path.exists(self.path):
            return None
        try:
            with np.load(self.path, allow_pickle=False) as z:
                alpha = np.zeros(int(z["n"]))
                alpha[np.asarray(z["index"], dtype=np.int64)] = np.asarray(z["value"], dtype=np.float64)
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


def _top_of_state(blocks, states, k):
    ids, grp, key = [], [], []
    for blk, st in zip(blocks, states, strict=True):
        i, g, kk = _block_top(st["alpha"], st["g"], st["rho"], int(k))
        ids.append(blk.start + i)
        grp.append(g)
        key.append(kk)
    return states, (np.concatenate(ids), np.concatenate(grp), np.concatenate(key))


def _best_k(idx: np.ndarray, key: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` (or fewer) of ``idx`` with the smallest ``key``, ties to the lower index, in that order: those up to
    the k-th smallest key (np.partition, linear) sorted, not all of them."""
    if k <= 0 or not idx.size:
        return idx[:0]
    if k < idx.shape[0]:
        keep = key <= np.partition(key, k - 1)[k - 1]
        idx, key = idx[keep], key[keep]
    return idx[np.lexsort((idx, key))[:k]]


def _block_top(alpha: np.ndarray, g: np.ndarray, rho: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray,
                                                                                    np.ndarray]:
    """A block's ``k`` best features by the ranking's rule (the support by alpha, then g - rho, ties to the lower
    index): (local indices, group 0 support / 1 not, key -alpha / g - rho), in rank order. A selection, not a sort of
    the block: a sort of every block's features (np.lexsort of three keys) took 0.2-0.35 s of a 3-4 s solve on the
    2M x 5M bench store."""
    sup = np.flatnonzero(alpha > 0)
    top = _best_k(sup, -alpha[sup], k)
    rest, rkey = np.zeros(0, dtype=np.int64), np.zeros(0)
    if top.shape[0] < k:
        rest, rkey = smallest_outside(alpha, g, rho, k - top.shape[0])
    i = np.concatenate([top, rest])
    grp = np.concatenate([np.zeros(top.shape[0]), np.ones(rest.shape[0])])
    kk = np.concatenate([-alpha[top], rkey])
    return i, grp, kk
