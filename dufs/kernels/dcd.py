"""Dual coordinate descent kernels for MMFS (docs/methods.md, "MMFS"), on the raw CSC buffers of one feature block.

Feature j of the block is the implicitly transformed column f_j = coef_j (x_j - shift_j 1) (never formed). The
primal vector w (over samples) is held as ``ws + t 1`` with ``S = 1^T ws`` so that the rank-one part of a centred
update costs O(1): w += delta f_j is ``ws[rows] += delta coef_j x_j[rows]``, ``S += delta coef_j colsum_j``,
``t -= delta coef_j shift_j``. Then

    f_j^T w = coef_j (x_j^T ws + t colsum_j - shift_j (S + m t)).

``wt`` is the float64 array ``[t, S]``. All sums are float64. Shrinking follows LIBLINEAR's
``solve_l2r_l1l2_svc`` (Hsieh et al. 2008, section 3.2): a coordinate at a bound whose gradient points out of the
box by more than last epoch's extreme projected gradient is left out until the next reset.
"""

from __future__ import annotations

import numba
import numpy as np

from dufs.kernels._prefetch import DISTANCE, prefetch_row
from dufs.kernels.topk import in_order, offer


@numba.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _dot(indptr, indices, data, j, ws):
    acc = 0.0
    for k in range(np.uint64(indptr[j]), np.uint64(indptr[j + 1])):
        acc += np.float64(data[k]) * ws[np.uint64(indices[k])]
    return acc


@numba.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _dot_ahead(indptr, indices, data, j, ws):
    """:func:`_dot` for a sweep over the block's columns in storage order: ws's row of a nonzero ahead (in the next
    columns, which the sweep reads next) asked for as it goes (the same sum). The epoch, which visits columns out
    of that order, reads with :func:`_dot`."""
    acc = 0.0
    nnz = np.uint64(indices.shape[0])
    for k in range(np.uint64(indptr[j]), np.uint64(indptr[j + 1])):
        if k + np.uint64(DISTANCE) < nnz:  # written out, as in every kernel (dufs.kernels._prefetch)
            prefetch_row(ws, indices[k + np.uint64(DISTANCE)])
        acc += np.float64(data[k]) * ws[np.uint64(indices[k])]
    return acc


@numba.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _grad(indptr, indices, data, coef, shift, colsum, ws, t, S, m, b, j):
    """f_j^T w + b, with w = ws + t 1 and S = 1^T ws, in a sweep over the columns in storage order
    (:func:`_dot_ahead`)."""
    return coef[j] * (_dot_ahead(indptr, indices, data, j, ws) + t * colsum[j] - shift[j] * (S + m * t)) + b


@numba.njit(nogil=True, cache=True, inline="always")
def _shrunk(a, G, C, pgmax_old, pgmin_old):
    """Whether a coordinate at alpha ``a`` with exact gradient ``G`` is left out of an epoch (:func:`active_set`)."""
    return (a <= 0.0 and G > pgmax_old) or (a >= C and G < pgmin_old)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def dcd_gradient(indptr, indices, data, coef, shift, colsum, ws, wt, m, b, out):
    """``out[j] = f_j^T w + b`` for every feature of the block (one pass over its nonzeros)."""
    t, S = wt[0], wt[1]
    for j in range(indptr.shape[0] - 1):
        out[j] = _grad(indptr, indices, data, coef, shift, colsum, ws, t, S, m, b, j)
    return out


@numba.njit(nogil=True, cache=True, boundscheck=False)
def dcd_start(indptr, indices, data, coef, shift, colsum, ws, wt, m, b, rho, alpha, C, g, index, at_zero=False):
    """A round's start on a block in one sweep over its per-feature arrays: ``g[j] = f_j^T w + b``
    (:func:`dcd_gradient`), the gap terms (:func:`gap_terms`) and the working set (:func:`active_set` with
    thresholds 0: written to ``index``). Returns ``(gap, sum alpha, rho^T alpha, n_active)``. Three sweeps over g,
    rho and alpha made one: those arrays are 8 bytes a feature each, read from memory every round.

    ``at_zero``: the caller knows ws = 0 and wt = 0 (a cold start's first round), so f_j^T w = 0 and g[j] = b for
    every j, the same number the sweep makes (finite data): the nonzeros are not read (a pass saved)."""
    t, S = wt[0], wt[1]
    gap = 0.0
    sa = 0.0
    ra = 0.0
    k = 0
    for j in range(indptr.shape[0] - 1):
        gj = 0.0 + b if at_zero else _grad(indptr, indices, data, coef, shift, colsum, ws, t, S, m, b, j)
        g[j] = gj
        rj = rho[j]
        a = alpha[j]
        v = rj - gj
        if v > 0.0:
            gap += C * v
        gap -= a * v
        sa += a
        ra += rj * a
        if _shrunk(a, -v, C, 0.0, -0.0):
            continue
        index[k] = j
        k += 1
    return gap, sa, ra, k


@numba.njit(nogil=True, cache=True)
def _next(state):
    # xorshift64*: a small deterministic generator for the in-kernel shuffles
    x = state[0]
    x ^= x >> np.uint64(12)
    x ^= x << np.uint64(25)
    x ^= x >> np.uint64(27)
    state[0] = x
    return x * np.uint64(2685821657736338717)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _block_order(index, n_active, width, order, rng):
    """Rewrite ``index[:n_active]`` (the same set) in storage order (``order < 0``) or block-random order (runs of
    ``order`` consecutive active coordinates, runs in random order, each run shuffled). O(width)."""
    mark = np.zeros(width, dtype=np.bool_)
    for s in range(n_active):
        mark[index[s]] = True
    k = 0
    for j in range(width):
        if mark[j]:
            index[k] = j
            k += 1
    if order < 0 or n_active <= 1:
        return
    B = order
    n_runs = (n_active + B - 1) // B
    runs = np.arange(n_runs)
    for s in range(n_runs - 1, 0, -1):
        r = np.int64(_next(rng) % np.uint64(s + 1))
        tmp = runs[s]
        runs[s] = runs[r]
        runs[r] = tmp
    src = index[:n_active].copy()
    k = 0
    for q in range(n_runs):
        lo = runs[q] * B
        hi = min(lo + B, n_active)
        base = k
        for s in range(lo, hi):
            index[k] = src[s]
            k += 1
        for s in range(hi - lo - 1, 0, -1):
            r = np.int64(_next(rng) % np.uint64(s + 1))
            tmp = index[base + s]
            index[base + s] = index[base + r]
            index[base + r] = tmp


@numba.njit(nogil=True, cache=True, boundscheck=False)
def dcd_epoch(indptr, indices, data, coef, shift, colsum, qii, rho, alpha, C, gamma, ws, wt, m, bias,
              update_bias, index, n_active, pg_old, rng, order=0, sigma=1.0):
    """One DCD epoch over the active coordinates ``index[:n_active]`` in a fresh random order.

    ``order`` picks the visit order: 0 (the default) a uniformly random permutation; ``B > 0`` block-random
    (cache-aware): the active coordinates in storage order cut into runs of ``B`` consecutive ones, the runs
    visited in a random order and each run shuffled (the per-feature arrays and the column buffers of a run stay
    in cache); ``-1`` storage order (no shuffle; for measurements).

    Updates ``alpha``, ``ws``, ``wt`` in place and, when ``update_bias``, ``bias[0]`` (else the bias is held at its
    value, as in a distributed round). ``pg_old`` = ``[PGmax_old, PGmin_old]`` drives shrinking; ``rng`` is a
    one-element uint64 array (the generator's state). Returns ``(n_active, PGmax_new, PGmin_new, n_updates)``.

    ``sigma`` > 1 solves CoCoA+'s local subproblem instead (Ma et al. 2015, sigma' = the number of partitions):
    the quadratic part is scaled by ``sigma``, so a coordinate's curvature is sigma (||f_j||^2 + gamma) and
    (``ws``, ``wt``, ``bias``) move by sigma times the change of w and b; alpha moves by the plain step.
    """
    t_inf = np.inf
    if order == 0:
        # Fisher-Yates shuffle of the active set
        for s in range(n_active - 1, 0, -1):
            r = np.int64(_next(rng) % np.uint64(s + 1))
            tmp = index[s]
            index[s] = index[r]
            index[r] = tmp
    else:
        _block_order(index, n_active, indptr.shape[0] - 1, order, rng)
    pgmax_old, pgmin_old = pg_old[0], pg_old[1]
    pgmax_new, pgmin_new = -t_inf, t_inf
    n_upd = 0
    s = 0
    while s < n_active:
        j = index[s]
        t, S = wt[0], wt[1]
        g = coef[j] * (_dot(indptr, indices, data, j, ws) + t * colsum[j] - shift[j] * (S + m * t)) + bias[0]
        G = g - rho[j]
        a = alpha[j]
        pg = 0.0
        if a == 0.0:
            if G > pgmax_old:
                n_active -= 1
                index[s] = index[n_active]
                index[n_active] = j
                continue
            elif G < 0.0:
                pg = G
        elif a == C:
            if G < pgmin_old:
                n_active -= 1
                index[s] = index[n_active]
                index[n_active] = j
                continue
            elif G > 0.0:
                pg = G
        else:
            pg = G
        if pg > pgmax_new:
            pgmax_new = pg
        if pg < pgmin_new:
            pgmin_new = pg
        if abs(pg) > 1e-12:
            new = min(max(a - G / (sigma * (qii[j] + gamma)), 0.0), C)
            d = new - a
            if d != 0.0:
                alpha[j] = new
                dc = sigma * d * coef[j]
                for k in range(np.uint64(indptr[j]), np.uint64(indptr[j + 1])):
                    ws[np.uint64(indices[k])] += dc * np.float64(data[k])
                wt[1] = S + dc * colsum[j]
                wt[0] = t - dc * shift[j]
                if update_bias:
                    bias[0] += sigma * gamma * d
                n_upd += 1
        s += 1
    return n_active, pgmax_new, pgmin_new, n_upd


_TILE = 1 << 16  # rows a tile of column_gram and add_columns: its counts (int32) and its part of w stay in cache


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _row_cursors(indptr, indices, r0):
    """Per column, the position of its first nonzero at a row >= ``r0`` (its rows ascending)."""
    k = indptr.shape[0] - 1
    cur = np.empty(k, dtype=np.int64)
    for j in range(k):
        cur[j] = indptr[j] + np.searchsorted(indices[indptr[j]:indptr[j + 1]], r0)
    return cur


@numba.njit(nogil=True, cache=True, boundscheck=False)
def column_gram(indptr, indices, data, r0, r1, limit, G):
    """Add to ``G`` (k x k, float64) the part of X^T X that rows [r0, r1) make, for the k columns of a CSC set
    (``indptr``, ``indices``, ``data``; each column's rows ascending). Returns False, G then incomplete, once the
    pairs of nonzeros sharing a row (the work) pass ``limit``.

    By tiles of _TILE rows: a tile's nonzeros bucketed by row (a count a row, in cache), then every pair of a row's
    nonzeros once. O(nnz + pairs) and the tiles' rows; the columns' pairwise merges would cost k times the
    nonzeros, and buckets over all rows at once (a count a sample) cost random accesses to memory
    (docs/measurements.md, "MMFS's kernels")."""
    k = indptr.shape[0] - 1
    cur = _row_cursors(indptr, indices, r0)
    pos = np.zeros(_TILE + 1, dtype=np.int32)
    col = np.empty(0, dtype=np.int32)
    val = np.empty(0, dtype=np.float64)
    work = 0
    for t0 in range(r0, r1, _TILE):
        t1 = min(t0 + _TILE, r1)
        T = t1 - t0
        pos[:T + 1] = 0
        for j in range(k):
            p = cur[j]
            end = indptr[j + 1]
            while p < end and indices[p] < t1:
                pos[indices[p] - t0 + 1] += 1
                p += 1
        for r in range(1, T + 1):
            c = np.int64(pos[r])
            work += c * (c - 1) // 2
            pos[r] += pos[r - 1]
        if work > limit:
            return False
        total = pos[T]
        if total > col.shape[0]:
            col = np.empty(2 * total, dtype=np.int32)
            val = np.empty(2 * total, dtype=np.float64)
        for j in range(k):
            p = cur[j]
            end = indptr[j + 1]
            acc = 0.0
            while p < end and indices[p] < t1:
                r = indices[p] - t0
                q = pos[r]
                v = np.float64(data[p])
                col[q] = j
                val[q] = v
                pos[r] = q + 1
                acc += v * v
                p += 1
            cur[j] = p
            G[j, j] += acc
        lo = 0
        for r in range(T):  # pos[r] is now the end of row r; a row's columns are in increasing order
            hi = pos[r]
            for a in range(lo, hi - 1):
                ja = col[a]
                va = val[a]
                for b in range(a + 1, hi):
                    G[ja, col[b]] += va * val[b]
            lo = hi
    return True


@numba.njit(nogil=True, cache=True, boundscheck=False)
def dense_dcd(Q, G, alpha, C, rng, max_epochs, tol):
    """DCD, each epoch a fresh random order, on the box QP ``min 1/2 a^T Q a + (G - Q alpha)^T a`` over
    ``0 <= a <= C``, from ``alpha`` (updated in place) with its gradient ``G`` (updated in place): the working-set
    subproblem held in a k x k matrix ``Q``. Stops after the first epoch whose projected gradients span at most
    ``tol`` (the max minus the min, LIBLINEAR's measure), or after ``max_epochs``. Returns ``(epochs, updates,
    span)``."""
    k = alpha.shape[0]
    order = np.arange(k)
    n_upd = 0
    span = np.inf
    ep = 0
    while ep < max_epochs:
        ep += 1
        for s in range(k - 1, 0, -1):
            r = np.int64(_next(rng) % np.uint64(s + 1))
            tmp = order[s]
            order[s] = order[r]
            order[r] = tmp
        pmax, pmin = -np.inf, np.inf
        for s in range(k):
            j = order[s]
            g = G[j]
            a = alpha[j]
            pg = g
            if a <= 0.0:
                pg = min(g, 0.0)
            elif a >= C:
                pg = max(g, 0.0)
            pmax = max(pmax, pg)
            pmin = min(pmin, pg)
            if pg != 0.0:
                new = min(max(a - g / Q[j, j], 0.0), C)
                d = new - a
                if d != 0.0:
                    alpha[j] = new
                    for i in range(k):
                        G[i] += d * Q[i, j]
                    n_upd += 1
        span = pmax - pmin
        if span <= tol:
            break
    return ep, n_upd, span


@numba.njit(nogil=True, cache=True, boundscheck=False)
def add_columns(indptr, indices, data, scale, r0, r1, out):
    """``out[r - r0] += sum_j scale_j x_j[r]`` for the rows r in [r0, r1) (each column's rows ascending), by tiles
    of _TILE rows: out's tile stays in cache (docs/measurements.md, "MMFS's kernels")."""
    k = indptr.shape[0] - 1
    cur = _row_cursors(indptr, indices, r0)
    for t0 in range(r0, r1, _TILE):
        t1 = min(t0 + _TILE, r1)
        for j in range(k):
            c = scale[j]
            if c == 0.0:  # never read: its cursor may stay behind
                continue
            p = cur[j]
            end = indptr[j + 1]
            while p < end and indices[p] < t1:
                out[indices[p] - r0] += c * np.float64(data[p])
                p += 1
            cur[j] = p


@numba.njit(nogil=True, cache=True, boundscheck=False)
def active_set(g, rho, alpha, C, pgmax_old, pgmin_old, index):
    """Write to ``index`` the coordinates an epoch visits and return their number: all but those at a bound whose
    exact gradient ``G = g - rho`` points out of the box by more than last epoch's extreme projected gradient
    (LIBLINEAR's shrinking test, here on the exact gradient: a coordinate that violates the optimality conditions
    is never left out)."""
    k = 0
    for j in range(g.shape[0]):
        if _shrunk(alpha[j], g[j] - rho[j], C, pgmax_old, pgmin_old):
            continue
        index[k] = j
        k += 1
    return k


@numba.njit(nogil=True, cache=True)
def smallest_outside(alpha, g, rho, k):
    """(indices, keys) of the k coordinates out of the support (not alpha > 0) with the smallest g - rho, by key
    ascending then index ascending: one sweep keeping the best k in a bounded heap (:mod:`dufs.kernels.topk`,
    O(n log k) whatever the keys' order), then those k sorted. MMFS's ranking fills its head with these when a
    block's support holds fewer than k (an index array of the block's other coordinates, two gathers, a partition
    and a sort took a large part of a partition's last task: docs/measurements.md, "MMFS's kernels")."""
    val = np.empty(k)
    idx = np.empty(k, np.int64)
    cnt = 0
    for j in range(alpha.shape[0]):
        if not alpha[j] > 0.0:
            cnt = offer(val, idx, cnt, g[j] - rho[j], j)
    return in_order(val, idx, cnt)


@numba.njit(nogil=True, cache=True)
def gap_terms(g, rho, alpha, C):
    """``(sum_j C max(0, rho_j - g_j) + alpha_j (g_j - rho_j), sum alpha, rho^T alpha)`` for one block."""
    gap = 0.0
    sa = 0.0
    ra = 0.0
    for j in range(g.shape[0]):
        v = rho[j] - g[j]
        if v > 0.0:
            gap += C * v
        gap -= alpha[j] * v
        sa += alpha[j]
        ra += rho[j] * alpha[j]
    return gap, sa, ra


@numba.njit(nogil=True, cache=True, inline="always")
def _geometry_at(s, ss, m2, mn, mx, n_rows, rm, mode):
    """One feature's (coef, shift, qii) from its statistics (:func:`mmfs_geometry`; ``rm`` = sqrt(m))."""
    if mode == 0:
        return 1.0, 0.0, 1.0 * 1.0 * ss
    const = mn == mx
    if n_rows == 0:
        v = np.nan
    else:
        v = m2 / n_rows
        if v < 0.0:
            v = 0.0
        if const:
            v = 0.0
    sd = np.sqrt(v)
    if not (sd > 0.0 and np.isfinite(sd)):
        sd = 1.0
    c = (1.0 / sd) / rm
    if mode == 2:
        mu = s / n_rows if n_rows else np.nan
        if np.isnan(mu):
            mu = 0.0
        elif mu == np.inf:
            mu = np.finfo(np.float64).max
        elif mu == -np.inf:
            mu = -np.finfo(np.float64).max
        base = 0.0
        if not const:
            base = m2 if m2 >= 0.0 or np.isnan(m2) else 0.0  # np.maximum(m2, 0.0)
        return c, mu, c * c * base
    return c, 0.0, c * c * ss


@numba.njit(nogil=True, cache=True)
def mmfs_geometry(s, ss, m2, mn, mx, n_rows, m, mode, coef, shift, qii):
    """MMFS's per-feature geometry from column statistics in one sweep (``mode`` 0: no standardization, 1:
    "scale", 2: "zscore"): coef = 1 / (sd sqrt(m)) (sd the population standard deviation, 1 where it is 0 or not
    finite), shift = the mean (zscore; 0 otherwise), qii = coef^2 times the centred sum of squares (zscore; 0 for a
    constant feature) or the sum of squares. The same operations in the same order as the NumPy expressions of
    ``dufs.methods.mmfs.problem._geometry_numpy``, so the same numbers, without their dozen temporary arrays
    (docs/measurements.md, "MMFS's kernels")."""
    rm = np.sqrt(np.float64(m))
    for j in range(s.shape[0]):
        coef[j], shift[j], qii[j] = _geometry_at(s[j], ss[j], m2[j], mn[j], mx[j], n_rows, rm, mode)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def mmfs_block_init(indptr, indices, data, n_rows, m, mode, y, factor, out):
    """A feature block's MMFS geometry and margins in one sweep over its nonzeros, written into the rows of ``out``
    (float64, (7, n_cols), its last two rows, alpha and g, left as they are): coef, shift, colsum, qii (what
    :func:`dufs.kernels.blockops.csc_column_stats` and :func:`mmfs_geometry` give) and, when ``y`` (float64, the
    labels centred and scaled to unit norm) is not empty, rho = factor |coef x^T y| (``csc_rmatvec``'s sum:
    1^T y = 0, so the shift drops out); the same operations in the same order, so the same numbers. Returns the
    margins' (sum, sum of squares, largest) (0 for an empty ``y``).

    A block's state is made in a worker, where every fresh array's pages are faulted in (Dask's workers return
    freed memory to the system at once): the two kernels and the geometry made 13 arrays a feature; this, the 5
    rows the state keeps, and reads the nonzeros once. The statistics' loop is csc_column_stats's written out
    again, not shared through a per-column helper, which made csc_column_stats slower (docs/measurements.md,
    "MMFS's kernels")."""
    rm = np.sqrt(np.float64(m))
    dot = y.shape[0] > 0
    nnz = np.uint64(indices.shape[0])
    s1, s2, top = 0.0, 0.0, 0.0
    for j in range(indptr.shape[0] - 1):
        a = np.int64(indptr[j])
        b = np.int64(indptr[j + 1])
        acc = 0.0
        acc2 = 0.0
        yd = 0.0
        lo = np.inf
        hi = -np.inf
        for k in range(a, b):
            v = np.float64(data[k])
            acc += v
            acc2 += v * v
            if v < lo:
                lo = v
            if v > hi:
                hi = v
            if dot:
                if np.uint64(k) + np.uint64(DISTANCE) < nnz:
                    prefetch_row(y, indices[np.uint64(k) + np.uint64(DISTANCE)])
                yd += v * y[np.uint64(indices[k])]
        if b - a < n_rows:  # some implicit zeros
            if lo > 0.0:
                lo = 0.0
            if hi < 0.0:
                hi = 0.0
        m2 = 0.0
        if n_rows > 0:
            if lo != hi:
                mean = acc / n_rows
                c = 0.0
                for k in range(a, b):
                    d = np.float64(data[k]) - mean
                    c += d * d
                c += (n_rows - (b - a)) * mean * mean
                m2 = c
        else:
            lo = hi = np.nan
        coef, shift, qii = _geometry_at(acc, acc2, m2, lo, hi, n_rows, rm, mode)
        out[0, j] = coef
        out[1, j] = shift
        out[2, j] = acc
        out[3, j] = qii
        if dot:
            rho = factor * np.abs(coef * yd)
            out[4, j] = rho
            s1 += rho
            s2 += rho * rho
            if rho > top:
                top = rho
    return s1, s2, top


@numba.njit(nogil=True, cache=True, boundscheck=False)
def step_dots(dws, dt, pw):
    """The line search's products over the samples: (dw^T dw, p^T p, dw^T p) for dw = dws + dt (not formed) and p =
    ``pw`` (the last step's change; the last two 0 when it is empty), in one sweep."""
    a = 0.0
    b = 0.0
    c = 0.0
    if pw.shape[0] == 0:
        for i in range(dws.shape[0]):
            d = dws[i] + dt
            a += d * d
        return a, b, c
    for i in range(dws.shape[0]):
        d = dws[i] + dt
        p = pw[i]
        a += d * d
        b += p * p
        c += d * p
    return a, b, c


@numba.njit(nogil=True, cache=True, boundscheck=False)
def apply_step(dws, dt, s, t, pw, ws, out):
    """The driver's step in one sweep: p = s (dws + dt) + t p (``pw``, in place; not read when t is 0) and
    ``out`` = ws + p. Returns (1^T out, out^T out), the next round's S and ||w||^2."""
    total = 0.0
    norm2 = 0.0
    for i in range(ws.shape[0]):
        if t != 0.0:
            p = s * (dws[i] + dt) + t * pw[i]
        else:
            p = s * (dws[i] + dt)
        pw[i] = p
        v = ws[i] + p
        out[i] = v
        total += v
        norm2 += v * v
    return total, norm2
