"""Kernels on one CSC feature block (raw ``indptr, indices, data`` buffers): column statistics and mat-vecs.

A CSC feature block holds whole columns: ``indptr`` (int64, n_cols + 1), ``indices`` (row numbers) and ``data``
(any float dtype). Every accumulation is in float64. No dask or SciPy objects here (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["col_sums", "csc_class_stats", "csc_column_stats", "csc_matvec", "csc_rmatvec"]


@numba.njit(nogil=True, cache=True)
def csc_column_stats(indptr, indices, data, n_rows):
    """Per-column sum, sum of squares, centred sum of squares, nonzero count, min and max of a CSC block.

    Statistics are over all ``n_rows`` entries of each column, implicit zeros included. The centred sum of
    squares ``m2 = sum_i (x_i - mean)^2`` is computed in two passes (exactly 0 for a constant column).
    min and max are NaN for ``n_rows == 0``. Returns ``(sum, sumsq, m2, nnz, min, max)``: float64 arrays and an
    int64 ``nnz`` (stored entries that are nonzero).
    """
    n_cols = indptr.shape[0] - 1
    s = np.zeros(n_cols, dtype=np.float64)
    ss = np.zeros(n_cols, dtype=np.float64)
    m2 = np.zeros(n_cols, dtype=np.float64)
    nnz = np.zeros(n_cols, dtype=np.int64)
    mn = np.full(n_cols, np.nan, dtype=np.float64)
    mx = np.full(n_cols, np.nan, dtype=np.float64)
    for j in range(n_cols):
        a = np.int64(indptr[j])
        b = np.int64(indptr[j + 1])
        acc = 0.0
        acc2 = 0.0
        cnt = np.int64(0)
        lo = np.inf
        hi = -np.inf
        for k in range(a, b):
            v = np.float64(data[k])
            acc += v
            acc2 += v * v
            if v != 0.0:
                cnt += 1
            if v < lo:
                lo = v
            if v > hi:
                hi = v
        if b - a < n_rows:  # some implicit zeros
            if lo > 0.0:
                lo = 0.0
            if hi < 0.0:
                hi = 0.0
        s[j] = acc
        ss[j] = acc2
        nnz[j] = cnt
        if n_rows > 0:
            mn[j] = lo
            mx[j] = hi
            if lo == hi:
                m2[j] = 0.0
            else:
                mean = acc / n_rows
                c = 0.0
                for k in range(a, b):
                    d = np.float64(data[k]) - mean
                    c += d * d
                c += (n_rows - (b - a)) * mean * mean
                m2[j] = c
    return s, ss, m2, nnz, mn, mx


@numba.njit(nogil=True, cache=True)
def csc_class_stats(indptr, indices, data, codes, n_classes):
    """Per-class, per-column sums and sums of squares: ``(sum, sumsq)``, each float64 ``(n_classes, n_cols)``.

    ``codes[i]`` is the class (0 .. n_classes - 1) of row ``i``.
    """
    n_cols = indptr.shape[0] - 1
    s = np.zeros((n_classes, n_cols), dtype=np.float64)
    ss = np.zeros((n_classes, n_cols), dtype=np.float64)
    for j in range(n_cols):
        for k in range(np.int64(indptr[j]), np.int64(indptr[j + 1])):
            c = np.int64(codes[np.int64(indices[k])])
            v = np.float64(data[k])
            s[c, j] += v
            ss[c, j] += v * v
    return s, ss


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _csc_rmatvec_1(indptr, indices, data, V, out):
    """``csc_rmatvec`` for one vector (p == 1), the common case: a scalar accumulator."""
    n_cols = indptr.shape[0] - 1
    for j in range(n_cols):
        acc = 0.0
        # unsigned positions: no negative-index wraparound checks in the inner loop (docs/architecture.md)
        for k in range(np.uint64(indptr[j]), np.uint64(indptr[j + 1])):
            acc += np.float64(data[k]) * np.float64(V[np.uint64(indices[k]), 0])
        out[j, 0] = acc
    return out


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _csc_rmatvec_p(indptr, indices, data, V, out):
    n_cols = indptr.shape[0] - 1
    p = V.shape[1]
    acc = np.zeros(p, dtype=np.float64)
    for j in range(n_cols):
        acc[:] = 0.0
        for k in range(np.uint64(indptr[j]), np.uint64(indptr[j + 1])):
            r = np.uint64(indices[k])
            v = np.float64(data[k])
            for q in range(p):
                acc[q] += v * np.float64(V[r, q])
        for q in range(p):
            out[j, q] = acc[q]
    return out


@numba.njit(nogil=True, cache=True)
def csc_rmatvec(indptr, indices, data, V, out):
    """``out[:] = X_block^T V``: V ``(n_rows, p)`` float64 (or float32, half the memory traffic for the randomly
    read vector; products and sums are float64 either way), out float64 ``(n_cols_block, p)`` (overwritten).

    Row indices must be in ``[0, n_rows)`` (they are not bounds-checked)."""
    if V.shape[1] == 1:
        return _csc_rmatvec_1(indptr, indices, data, V, out)
    return _csc_rmatvec_p(indptr, indices, data, V, out)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _csc_matvec_12(indptr, indices, data, U, out):
    n_cols = indptr.shape[0] - 1
    two = U.shape[1] == 2
    for j in range(n_cols):
        u0 = U[j, 0]
        u1 = U[j, 1] if two else 0.0
        for k in range(np.uint64(indptr[j]), np.uint64(indptr[j + 1])):
            r = np.uint64(indices[k])
            v = np.float64(data[k])
            out[r, 0] += v * u0
            if two:
                out[r, 1] += v * u1
    return out


@numba.njit(nogil=True, cache=True, boundscheck=False)
def csc_matvec(indptr, indices, data, U, out):
    """``out += X_block U``: U float64 ``(n_cols_block, p)``, out float64 ``(n_rows, p)`` (accumulated into).

    Row indices must be in ``[0, n_rows)`` (they are not bounds-checked)."""
    p = U.shape[1]
    if p <= 2:
        return _csc_matvec_12(indptr, indices, data, U, out)
    n_cols = indptr.shape[0] - 1
    for j in range(n_cols):
        for k in range(np.uint64(indptr[j]), np.uint64(indptr[j + 1])):
            r = np.uint64(indices[k])
            v = np.float64(data[k])
            for q in range(p):
                out[r, q] += v * U[j, q]
    return out


def col_sums(V: np.ndarray) -> np.ndarray:
    """Column sums of a tall (n, p) array as float64, one strided pairwise sum per column: NumPy's
    ``V.sum(axis=0)`` on a C-ordered (2M, 2) array takes 36 ms, this 3 ms."""
    V = np.asarray(V)
    if V.ndim == 1:
        return np.asarray(V.sum(dtype=np.float64))
    return np.array([V[:, j].sum(dtype=np.float64) for j in range(V.shape[1])], dtype=np.float64)
