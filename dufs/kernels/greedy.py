"""Per-block kernels of the greedy selectors (docs/methods.md), on the raw CSC buffers of one block.

Feature j of the block is the implicitly transformed column z_j = coef_j (x_j - shift_j 1) (never formed), so
z_j^T v = coef_j (x_j^T v - shift_j 1^T v). Every candidate carries O(1) numbers: its Schur complement ``s`` and a
second number ``v`` (LapAOFS: ||H^-1 G_Sg||^2; JCFS: ||E_g||^2; LapDOFS: unused). A step is one pass: two
products z_j^T V[:, 0], z_j^T V[:, 1] per feature, the update of (s, v), and the block's best candidate.
"""

from __future__ import annotations

import numba
import numpy as np

from dufs.kernels._prefetch import DISTANCE, prefetch_row

A_OPTIMAL, D_OPTIMAL, JCFS = 0, 1, 2


@numba.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _dot2(indptr, indices, data, j, V):
    a = 0.0
    b = 0.0
    nnz = np.uint64(indices.shape[0])
    for k in range(np.uint64(indptr[j]), np.uint64(indptr[j + 1])):
        if k + np.uint64(DISTANCE) < nnz:  # V's row of a nonzero ahead (a hint: the sums are unchanged)
            prefetch_row(V, indices[k + np.uint64(DISTANCE)])
        x = np.float64(data[k])
        i = np.uint64(indices[k])
        a += x * V[i, 0]
        b += x * V[i, 1]
    return a, b


@numba.njit(nogil=True, cache=True)
def score(mode, s, v, tiny):
    """The criterion a candidate is ranked by (larger is better): -(1 + v) / s (A-optimal), s (D-optimal),
    v / s (JCFS); -inf when the Schur complement ``s`` is not above ``tiny`` (the candidate is, to rounding, in
    the span of the selected ones)."""
    if not s > tiny:
        return -np.inf
    if mode == A_OPTIMAL:
        return -(1.0 + v) / s
    if mode == D_OPTIMAL:
        return s
    return v / s


@numba.njit(nogil=True, cache=True)
def best(mode, s, v, selected, tiny):
    """(local index, score) of the block's best unselected candidate; ties go to the lower index; (-1, -inf)
    when there is none."""
    arg = -1
    top = -np.inf
    for j in range(s.shape[0]):
        if selected[j]:
            continue
        sc = score(mode, s[j], v[j], tiny[j])
        if arg < 0 or sc > top:
            arg = j
            top = sc
    return arg, top


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _update2(indptr, indices, data, coef, shift, ident, V, vsum, sp, c2, s, v, s_out, v_out, selected, mode, tiny):
    rs = 1.0 / np.sqrt(sp)
    arg = -1
    top = -np.inf
    for j in range(s.shape[0]):
        sj = s[j]
        vj = v[j]
        if not selected[j]:
            a, b = _dot2(indptr, indices, data, j, V)
            if not ident:
                a = coef[j] * (a - shift[j] * vsum[0])
                b = coef[j] * (b - shift[j] * vsum[1])
            lj = a * rs
            e = lj * rs
            sj -= lj * lj
            if mode != D_OPTIMAL:
                vj += -2.0 * e * b + e * e * c2
            sc = score(mode, sj, vj, tiny[j])
            if arg < 0 or sc > top:
                arg = j
                top = sc
        s_out[j] = sj
        v_out[j] = vj
    return arg, top


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _update1(indptr, indices, data, coef, shift, ident, V, vsum, sp, s, v, s_out, v_out, copy_v, selected, mode,
             tiny):
    rs = 1.0 / np.sqrt(sp)
    arg = -1
    top = -np.inf
    nnz = np.uint64(indices.shape[0])
    for j in range(s.shape[0]):
        sj = s[j]
        if not selected[j]:
            a = 0.0
            for k in range(np.uint64(indptr[j]), np.uint64(indptr[j + 1])):
                if k + np.uint64(DISTANCE) < nnz:
                    prefetch_row(V, indices[k + np.uint64(DISTANCE)])
                a += np.float64(data[k]) * V[np.uint64(indices[k]), 0]
            if not ident:
                a = coef[j] * (a - shift[j] * vsum[0])
            lj = a * rs
            sj -= lj * lj
            sc = score(mode, sj, v[j], tiny[j])
            if arg < 0 or sc > top:
                arg = j
                top = sc
        s_out[j] = sj
        if copy_v:
            v_out[j] = v[j]
    return arg, top


_NONE = np.zeros(0)


def greedy_update(indptr, indices, data, coef, shift, V, vsum, sp, c2, s, v, selected, mode, tiny, s_out=None,
                  v_out=None):
    """One greedy step over a block, after the driver picked feature p with Schur complement ``sp``.

    ``V`` (n x 2, float64): [B r, B X_S d] (LapAOFS) or [r, q] (JCFS), ``vsum`` their column sums; LapDOFS, which
    updates ``s`` only, passes [B r] (n x 1). With a_j = z_j^T V[:, 0] and b_j = z_j^T V[:, 1], for every
    unselected j: l = a_j / sqrt(sp), e = l / sqrt(sp); s_j -= l^2; and v_j += -2 e b_j + e^2 c2 (A: c2 = ||c||^2
    + 1; JCFS: v_j = ||E_j||^2, c2 = ||E_p||^2). Returns the block's best candidate after the update (local index,
    score; ties to the lower index). ``coef`` and ``shift`` None: the identity transform (z_j = x_j), which reads
    neither (16 bytes a feature less in a sweep whose every byte counts).

    ``s_out``, ``v_out``: where the updated (s, v) go (default: ``s`` and ``v`` themselves, in place); given, ``s``
    and ``v`` are only read. One sweep over the block: the update, the copy and the choice of the best together. A
    one-vector step (LapDOFS) leaves ``v`` as it is: ``v_out`` is ``v`` or is not written."""
    s_out = s if s_out is None else s_out
    v_out = v if v_out is None else v_out
    ident = coef is None
    if ident:
        coef = shift = _NONE
    if V.shape[1] == 1:
        return _update1(indptr, indices, data, coef, shift, ident, V, vsum, sp, s, v, s_out, v_out,
                        mode != D_OPTIMAL and v_out is not v, selected, mode, tiny)
    return _update2(indptr, indices, data, coef, shift, ident, V, vsum, sp, c2, s, v, s_out, v_out, selected,
                    mode, tiny)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def xwx_graph(indptr, indices, data, w_indptr, w_indices, w_data, scratch):
    """x_j^T W x_j for every column of a CSC block, W a sparse n x n graph in CSR; O(nnz x neighbours).
    ``scratch`` is a zeroed float64 n-vector (left zeroed)."""
    d = indptr.shape[0] - 1
    out = np.zeros(d)
    for j in range(d):
        a, b = np.int64(indptr[j]), np.int64(indptr[j + 1])
        for k in range(a, b):
            scratch[indices[k]] = np.float64(data[k])
        acc = 0.0
        for k in range(a, b):
            i = np.int64(indices[k])
            row = 0.0
            for t in range(np.int64(w_indptr[i]), np.int64(w_indptr[i + 1])):
                row += w_data[t] * scratch[w_indices[t]]
            acc += np.float64(data[k]) * row
        for k in range(a, b):
            scratch[indices[k]] = 0.0
        out[j] = acc
    return out


@numba.njit(nogil=True, cache=True, boundscheck=False)
def xwx_anchor(indptr, indices, data, z_indptr, z_indices, z_data, lam_inv):
    """x_j^T W x_j = sum_a lam_inv_a (Zh^T x_j)_a^2 for every column of a CSC block, W = Zh Lambda^-1 Zh^T an
    anchor graph with Zh in CSR (n x anchors); O(nnz x anchors per sample)."""
    d = indptr.shape[0] - 1
    m = lam_inv.shape[0]
    acc = np.zeros(m)
    touched = np.empty(m, dtype=np.int64)
    out = np.zeros(d)
    for j in range(d):
        nt = 0
        for k in range(np.int64(indptr[j]), np.int64(indptr[j + 1])):
            i = np.int64(indices[k])
            x = np.float64(data[k])
            for t in range(np.int64(z_indptr[i]), np.int64(z_indptr[i + 1])):
                a = z_indices[t]
                if acc[a] == 0.0:
                    touched[nt] = a
                    nt += 1
                acc[a] += x * z_data[t]
        s = 0.0
        for q in range(nt):
            a = touched[q]
            s += lam_inv[a] * acc[a] * acc[a]
            acc[a] = 0.0
        out[j] = s
    return out


# ---------------------------------------------------------------------------------------------------- the driver's
# products with the selected columns Z_S (a list of sparse columns, each its rows and values). A LapAOFS selection
# takes the heavy columns first (docs/measurements.md, "Greedy steps"), and the column-at-a-time product
# swept the whole n x p result once a column: by row tiles, every column's rows in a tile go into that tile's rows
# while they are in cache. ``cuts[t]`` holds column t's offsets at the tile edges 0, TILE_ROWS, 2 TILE_ROWS, ..., n
# (:func:`tile_cuts`); the tiles [b0, b1) are one thread's share. A column whose values are all one number (binary
# data: kddb's hub columns) comes with that value alone (``dats[t]`` of length 1): the sweeps read
# its rows only, half the bytes, and multiply by the same number, so the same sums.
TILE_ROWS = 1 << 17


def tile_cuts(rows: np.ndarray, n: int) -> np.ndarray:
    """Offsets into a column's sorted ``rows`` at the row-tile edges of an n-row array (int64, one more than the
    tiles)."""
    edges = np.append(np.arange(0, n, TILE_ROWS, dtype=np.int64), n)
    return np.searchsorted(rows, edges).astype(np.int64)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def cols_apply(inds, dats, cuts, w, skip, out, b0, b1):
    """out[r] = sum_t w[t, :] x_t[r] for the rows r of tiles [b0, b1) (written, not accumulated), x_t the sparse
    columns ``(inds[t], dats[t])`` but those with ``skip[t]`` (the bit columns, :func:`bits_apply`); ``w`` (k, p)
    float64, ``out`` (n, p) float64."""
    n = out.shape[0]
    p = out.shape[1]
    for b in range(b0, b1):
        for i in range(b * TILE_ROWS, min(n, (b + 1) * TILE_ROWS)):
            for j in range(p):
                out[i, j] = 0.0
        for t in range(len(inds)):
            if skip[t]:
                continue
            ix = inds[t]
            dx = dats[t]
            c = cuts[t]
            if dx.shape[0] == 1:  # one value for every row: the same products
                x = np.float64(dx[0])
                if p == 2:
                    w0 = x * w[t, 0]
                    w1 = x * w[t, 1]
                    for q in range(c[b], c[b + 1]):
                        i = ix[q]
                        out[i, 0] += w0
                        out[i, 1] += w1
                else:
                    for q in range(c[b], c[b + 1]):
                        i = ix[q]
                        for j in range(p):
                            out[i, j] += x * w[t, j]
            elif p == 2:
                w0 = w[t, 0]
                w1 = w[t, 1]
                for q in range(c[b], c[b + 1]):
                    i = ix[q]
                    x = np.float64(dx[q])
                    out[i, 0] += x * w0
                    out[i, 1] += x * w1
            else:
                for q in range(c[b], c[b + 1]):
                    i = ix[q]
                    x = np.float64(dx[q])
                    for j in range(p):
                        out[i, j] += x * w[t, j]


@numba.njit(nogil=True, cache=True, boundscheck=False)
def cols_tapply(inds, dats, cuts, V, skip, out, t0, t1):
    """out[t, :] = x_t^T V for the columns t in [t0, t1) but those with ``skip[t]`` (left as they are: the bit
    columns, :func:`bits_row_sums`); ``V`` (n, p), ``out`` (k, p) float64. By row tiles, as
    :func:`cols_apply`: each tile of V is read once for all the columns (a heavy column's rows touch most of V's
    cache lines, so column by column V came from memory once a column); each column's terms are added in the order
    of its rows all the same, so the sums are those of the column-at-a-time product."""
    p = V.shape[1]
    for t in range(t0, t1):
        if not skip[t]:
            for j in range(p):
                out[t, j] = 0.0
    if t1 <= t0:
        return
    for b in range(cuts[t0].shape[0] - 1):
        for t in range(t0, t1):
            if skip[t]:
                continue
            ix = inds[t]
            dx = dats[t]
            c = cuts[t]
            if dx.shape[0] == 1:  # one value for every row
                x = np.float64(dx[0])
                if p == 1:
                    a = out[t, 0]
                    for q in range(c[b], c[b + 1]):
                        a += x * V[ix[q], 0]
                    out[t, 0] = a
                    continue
                for q in range(c[b], c[b + 1]):
                    i = ix[q]
                    for j in range(p):
                        out[t, j] += x * V[i, j]
                continue
            if p == 1:
                a = out[t, 0]
                for q in range(c[b], c[b + 1]):
                    a += np.float64(dx[q]) * V[ix[q], 0]
                out[t, 0] = a
                continue
            for q in range(c[b], c[b + 1]):
                i = ix[q]
                x = np.float64(dx[q])
                for j in range(p):
                    out[t, j] += x * V[i, j]


# A selected column of one value (binary data) with at least n / 32 rows is also kept as one bit of a row-major mask
# (:class:`dufs.methods.greedy.SelectedColumns`): words n x W uint64, the column in slot s is bit s % 64 of word
# s // 64, which as bytes (n x 8W, little-endian) is bit s % 8 of byte s // 8. Its n bits take no more memory than
# its int32 rows, and a sweep over all rows reads each row's bits in one load where the index path read every column's
# row numbers and scattered into the output. Z_S c by rows is then a lookup a byte: T[g, v] is the sum of the weights
# of the slots set in the value v of byte g (256 entries a byte, in cache), a row's value the sum over its bytes;
# Z_S^T y for a sparse y adds y's values into H[g, v] by the same bytes, and a slot's sum is read off H.
_BITS_MIN_FILL = 32  # a column's rows at least n / this: its bits then cost no more than its rows (int32)


def bits_eligible(rows: np.ndarray, vals: np.ndarray, n: int) -> bool:
    """Whether a selected column goes to the bit mask: one value in every row, and enough rows."""
    return rows.shape[0] > 0 and rows.shape[0] * _BITS_MIN_FILL >= n and bool((vals == vals[0]).all())


@numba.njit(nogil=True, cache=True, boundscheck=False)
def bits_set(words, rows, word, bit):
    """words[rows, word] |= 1 << bit (one selected column's rows into its slot)."""
    m = np.uint64(1) << np.uint64(bit)
    for q in range(rows.shape[0]):
        words[rows[q], word] |= m


@numba.njit(nogil=True, cache=True, boundscheck=False)
def bits_tables(ws):
    """T[g, v, j] = the sum of ws[8 g + b, j] over the bits b set in v, for the bytes g < ceil(slots / 8) (``ws``: a
    weight a slot, slots x p float64; the slots past the last are weight 0)."""
    slots, p = ws.shape
    G = (slots + 7) // 8
    T = np.zeros((G, 256, p))
    for g in range(G):
        for v in range(1, 256):
            b = 0
            while not (v >> b) & 1:
                b += 1
            s = 8 * g + b
            for j in range(p):
                T[g, v, j] = T[g, v & (v - 1), j] + (ws[s, j] if s < slots else 0.0)
    return T


@numba.njit(nogil=True, cache=True, boundscheck=False)
def bits_apply(w8, T, out, acc, r0, r1):
    """out[i, j] = (out[i, j] if ``acc`` else 0) + sum_g T[g, w8[i, g], j] for the rows [r0, r1) (``w8``: the bit
    mask as bytes, n x 8W; the bytes past T's are not read)."""
    G, _, p = T.shape
    for i in range(r0, r1):
        for j in range(p):
            a = out[i, j] if acc else 0.0
            for g in range(G):
                a += T[g, w8[i, g], j]
            out[i, j] = a


@numba.njit(nogil=True, cache=True, boundscheck=False)
def bits_row_sums(w8, rows, y, H, q0, q1):
    """H[g, w8[rows[q], g]] += y[q] for q in [q0, q1), every byte g < H's (H: bytes x 256 float64, added to)."""
    G = H.shape[0]
    for q in range(q0, q1):
        r = rows[q]
        yq = np.float64(y[q])
        for g in range(G):
            H[g, w8[r, g]] += yq


@numba.njit(nogil=True, cache=True, boundscheck=False)
def bits_slot_sums(H, slots, out):
    """out[s] = the sum of H[s // 8, v] over the values v with bit s % 8 set, for the slots s < ``slots``."""
    for s in range(slots):
        g = s >> 3
        b = s & 7
        a = 0.0
        for v in range(256):
            if (v >> b) & 1:
                a += H[g, v]
        out[s] = a


@numba.njit(nogil=True, cache=True, boundscheck=False)
def anchor_step_bits(zh_indptr, zh_indices, zh_data, P, z, Y, w8, T, offset, wd, lam1, out, r0, r1):
    """A greedy step's vectors B [z - y_0, y_1] on an anchor graph with W y made row by row in the same sweep, and
    y = Z_S C's rows too, for the rows [r0, r1): out[i, j] = wd[i] * y'_ij - lam1 * (Zh[i, :] @ P[:, j]) with
    y'_i0 = z[i] - y_i0, y'_ij = y_ij (B = diag(wd) - lam1 W, W = Zh Lambda^-1 Zh^T, P = Lambda^-1 Zh^T [...]:
    m x p, in cache; Zh in CSR, a few nonzeros a row) and y_ij = Y[i, j] (the selected columns outside the bit
    mask; Y of no rows: none) + sum_g T[g, w8[i, g], j] (the mask's, :func:`bits_apply`) - offset[j] (the
    transform's shift). No n x p W y or Z_S C made first and read again; ``out`` float64 or float32, each number
    rounded once."""
    G = T.shape[0]
    p = T.shape[2]
    has_y = Y.shape[0] > 0
    if p == 2:  # LapAOFS: two columns with scalar sums (the loop below is slower: docs/measurements.md, "Greedy steps")
        o0 = offset[0]
        o1 = offset[1]
        for i in range(r0, r1):
            y0 = Y[i, 0] if has_y else 0.0
            y1 = Y[i, 1] if has_y else 0.0
            for g in range(G):
                v = w8[i, g]
                y0 += T[g, v, 0]
                y1 += T[g, v, 1]
            s0 = 0.0
            s1 = 0.0
            for k in range(np.uint64(zh_indptr[i]), np.uint64(zh_indptr[i + 1])):
                zk = np.float64(zh_data[k])
                a = np.uint64(zh_indices[k])
                s0 += zk * P[a, 0]
                s1 += zk * P[a, 1]
            out[i, 0] = wd[i] * (z[i] - (y0 - o0)) - lam1 * s0
            out[i, 1] = wd[i] * (y1 - o1) - lam1 * s1
        return
    for i in range(r0, r1):
        a = np.uint64(zh_indptr[i])
        b = np.uint64(zh_indptr[i + 1])
        for j in range(p):
            y = Y[i, j] if has_y else 0.0
            for g in range(G):
                y += T[g, w8[i, g], j]
            y -= offset[j]
            w = 0.0
            for k in range(a, b):
                w += np.float64(zh_data[k]) * P[np.uint64(zh_indices[k]), j]
            if j == 0:
                y = z[i] - y
            out[i, j] = wd[i] * y - lam1 * w


@numba.njit(nogil=True, cache=True, boundscheck=False)
def anchor_b(z, Y, wd, WY, lam1, out, r0, r1):
    """A greedy step's vectors B [z - Y[:, 0], Y[:, 1:]] on an anchor graph, for the rows [r0, r1):
    out[:, j] = wd * y_j - lam1 * WY[:, j] with y_0 = z - Y[:, 0] (B = diag(wd) - lam1 W, WY = W y given); ``out``
    float64 or float32 (the products are rounded once, at the end)."""
    p = Y.shape[1]
    for i in range(r0, r1):
        out[i, 0] = wd[i] * (z[i] - Y[i, 0]) - lam1 * WY[i, 0]
        for j in range(1, p):
            out[i, j] = wd[i] * Y[i, j] - lam1 * WY[i, j]


@numba.njit(nogil=True, cache=True, boundscheck=False)
def sparse_z(rows, vals, coef, wd, last, z, wz):
    """z_p = coef x_p (x_p the sparse column ``(rows, vals)``) into the n-vector ``z``, zero elsewhere (``last``, the
    rows it held before, zeroed first), and B's diagonal part of it at those rows into ``wz`` (wz[q] = wd[r] z[r]
    for r = rows[q]); returns z_p^T diag(wd) z_p. The same numbers as z = coef * x made dense and wd * z."""
    for q in range(last.shape[0]):
        z[last[q]] = 0.0
    acc = 0.0
    for q in range(rows.shape[0]):
        r = rows[q]
        zi = np.float64(vals[q])
        if coef != 1.0:
            zi *= coef
        z[r] = zi
        w = wd[r] * zi
        wz[q] = w
        acc += zi * w
    return acc


@numba.njit(nogil=True, cache=True, boundscheck=False)
def anchor_zt_column(zh_indptr, zh_indices, zh_data, rows, vals, coef, out):
    """out[:] = Zh^T z for z = coef * x, x the sparse column ``(rows, vals)`` (sorted rows) and Zh in CSR (n x m):
    only x's rows of Zh are read. The same products added in the same order as the product over the dense z (whose
    other rows add zeros), so the same numbers; ``out`` float64 (m,), overwritten."""
    for a in range(out.shape[0]):
        out[a] = 0.0
    for q in range(rows.shape[0]):
        r = np.uint64(rows[q])
        zi = np.float64(vals[q])
        if coef != 1.0:
            zi *= coef
        for k in range(np.uint64(zh_indptr[r]), np.uint64(zh_indptr[r + np.uint64(1)])):
            out[np.uint64(zh_indices[k])] += np.float64(zh_data[k]) * zi
