"""A partition's side of MMFS's rounds, where its blocks live: the blocks' state (alpha, margins, geometry), the
start of a round (the last step applied, the gap terms), its DCD epoch with the bias held, and its part of the
ranking."""

from __future__ import annotations

import time

import numpy as np

from dufs.engine import buffer
from dufs.kernels.dcd import (
    active_set,
    dcd_epoch,
    dcd_start,
    mmfs_block_init,
    smallest_outside,
)
from dufs.methods.mmfs import gram
from dufs.methods.mmfs.gram import _VISIT_ORDER, _gram_epochs, _gram_pays, _GramCache, _moved, _stack
from dufs.methods.mmfs.records import _NO_STEP, PartitionResult, RoundTotals

# serial epochs (the bias moving) repeat over the working set while their nonzeros, all epochs together, stay within
# this share of the round's gradient pass over the same data, up to _INNER_MAX epochs: the working-set subproblem
# solved closer for a fraction of a pass, in fewer rounds (docs/measurements.md, "MMFS's solver")
_INNER_SHARE = 0.25
_INNER_MAX = 10


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
        from dufs.methods.mmfs.problem import block_margins

        g = block_margins(blk, spec, r_block)
        rho = g["rho"]
        return (_init_state(blk, g["coef"], g["shift"], g["colsum"], g["qii"], rho, alpha0, seed),
                (float(rho.sum()), float(rho @ rho), float(rho.max(initial=0.0))))
    from dufs.methods.mmfs.problem import GEOMETRY_MODE

    rows = np.zeros((7, blk.width))  # coef, shift, colsum, qii, rho, alpha, g: one allocation
    factor = spec.theta / (1.0 - spec.theta)
    y = spec.yn if spec.kind == "correlation" else _NO_LABELS
    part = mmfs_block_init(blk.indptr, blk.indices, blk.data, spec.m, spec.m, GEOMETRY_MODE[spec.standardize], y,
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


def _epoch_begin(blk, st, C, index=None) -> dict:
    """A block's DCD epochs of one round (:func:`_epoch_run`, then :func:`_epoch_end`), against the partition's
    local (wsl, wtl, bias): the working set, alpha's working copy, the visit list and the generator.

    Working set: the coordinates whose projected gradient at the round's start is not zero (:func:`active_set`
    with thresholds 0: free, or at a bound with the gradient pointing into the box): fewer rounds in less time than
    with LIBLINEAR's shrinking thresholds (last epoch's extreme projected gradients), whose epochs kept visiting
    most of the coordinates (docs/measurements.md, "MMFS's solver"); the exact gradient of every round catches a
    coordinate that starts to violate."""
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
    part = part[0] if isinstance(part, list) else part
    tail = RoundTotals(partitions=1.0)
    new, sets = _start_blocks(blocks, states, ws, wt, b, step, m, C, dal, at_zero, tail)
    tail.start_s = time.perf_counter() - t0
    tail.tlo = tail.thi = 0.0  # no momentum step unless this partition's epoch runs here (below)
    if screen and epoch:
        sets = _screened(new, sets, int(screen))
    if tol is not None and epoch and _within_tol(ws, b, gamma, tol, tail):  # the driver's test of the same numbers
        epoch = False
        tail.at_tol = 1.0
    if not epoch:
        tail.task_s = time.perf_counter() - t0
        return new, PartitionResult(ws.shape[0], np.zeros(0, dtype=np.int64), np.zeros(0), tail)
    nnz = sum(int((blk.indptr[ix + 1] - blk.indptr[ix]).sum()) for blk, ix in zip(blocks, sets, strict=True))
    if nnz <= budget:
        cols = _hand_over(blocks, new, sets, part, have, tail)
        tail.task_s = time.perf_counter() - t0
        return new, PartitionResult(ws.shape[0], np.zeros(0, dtype=np.int64), np.zeros(0), tail, cols)
    tail.epochs_run = 1.0
    tail.tlo, tail.thi = -np.inf, np.inf
    serial = update_bias and sigma == 1.0
    reps = 1
    if serial:  # serial DCD: the whole working set again while a fraction of a pass pays
        reps = inner_epochs(nnz, sum(int(b_.indptr[-1]) for b_ in blocks))
    dws = _gram_round(blocks, new, sets, m, C, gamma, tail) if serial else None
    if dws is None:
        dws = _dcd_round(blocks, new, sets, ws, wt, b, m, C, gamma, update_bias, sigma, reps, tail)
    tail.task_s = time.perf_counter() - t0
    return new, PartitionResult.of(dws, tail)


def _start_blocks(blocks, states, ws, wt, b, step, m, C, dal, at_zero, tail) -> tuple[list, list]:
    """Every block's start of the round (:func:`_start`), its gap terms and the slope along the momentum direction
    added to ``tail``: the new states and the working sets."""
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
    return new, sets


def _within_tol(ws, b, gamma, tol, tail) -> bool:
    """Whether the relative gap at the round's start (the only partition's gap terms) is within ``tol``: the test
    :func:`~dufs.methods.mmfs.solver.solve` makes of the same numbers."""
    obj = 0.5 * float(ws @ ws) + b * b / (2.0 * gamma) - tail.rho_alpha
    return tail.gap / max(abs(obj), 1e-300) <= tol or tail.gap <= 0.0


def _hand_over(blocks, new, sets, part, have, tail) -> list:
    """The blocks' working sets for the driver's epoch (:func:`_payload`, tagged with ``part``), no direction of
    their own this round."""
    cols = []
    for q, (blk, st, ix) in enumerate(zip(blocks, new, sets, strict=True)):
        st["dalpha"] = _NO_STEP
        if ix.size:
            cols.append({"part": part, **_payload(blk, st, ix, None if have is None else have[q])})
    tail.visited = float(sum(ix.size for ix in sets))
    return cols


def _gram_round(blocks, new, sets, m, C, gamma, tail) -> np.ndarray | None:
    """Serial DCD on a small working set by its k x k matrix (kept in the partition's state between rounds), where
    that pays: the change of ws, the blocks' directions set and ``tail`` filled; None where it does not pay."""
    if not (0 < sum(ix.size for ix in sets) <= gram.GRAM_MAX and _gram_pays(
            np.concatenate([blk.indptr[ix + 1] - blk.indptr[ix] for blk, ix in zip(blocks, sets, strict=True)]),
            m)):
        return None
    t1 = time.perf_counter()
    cols = [_payload(blk, st, ix) for blk, st, ix in zip(blocks, new, sets, strict=True) if ix.size]
    indptr, indices, data, per = _stack(cols)
    a = per["alpha"].copy()
    rng = new[0]["rng"].copy()
    held = new[0].setdefault("gram", _GramCache())  # kept in the partition's state between rounds
    got = _gram_epochs(indptr, indices, data, per, a, m, C, gamma, rng, held=held)
    if got is None:
        return None
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
    return dws


def _dcd_round(blocks, new, sets, ws, wt, b, m, C, gamma, update_bias, sigma, reps, tail) -> np.ndarray:
    """``reps`` DCD epochs over the blocks' working sets (in a random order) against one local copy of (w, b): the
    change of ws (scaled by 1 / ``sigma``), the blocks' directions set and ``tail`` filled."""
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
    return dws


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


# ---------------------------------------------------------------------------------------------------- resilience
def _take_alpha(blocks, states, with_g=True, top=0):
    out = []
    for blk, st in zip(blocks, states, strict=True):
        nz = np.flatnonzero(st["alpha"])  # alpha is sparse (the support): send its nonzeros
        # g copied: in this process the state's g is a buffer a later round writes into
        out.append((blk.start, nz, st["alpha"][nz], st["g"].copy() if with_g else None))
    return states, (out, _top_of_state(blocks, states, top)[1] if top else None)


def _margin_summary(blk, spec, r_given):
    return np.array(_block_state(blk, spec, r_given, None, 0)[1])


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
    the block: a sort of every block's features (np.lexsort of three keys) was a share of a solve
    (docs/measurements.md, "MMFS's solver")."""
    sup = np.flatnonzero(alpha > 0)
    top = _best_k(sup, -alpha[sup], k)
    rest, rkey = np.zeros(0, dtype=np.int64), np.zeros(0)
    if top.shape[0] < k:
        rest, rkey = smallest_outside(alpha, g, rho, k - top.shape[0])
    i = np.concatenate([top, rest])
    grp = np.concatenate([np.zeros(top.shape[0]), np.ones(rest.shape[0])])
    kk = np.concatenate([-alpha[top], rkey])
    return i, grp, kk
