"""Sparse reshuffling kernels for the out-of-core transpose (raw buffers in, raw buffers out)."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(nogil=True, cache=True)
def _csr_to_spill(indptr, indices, data, granule):
    nnz = indptr[-1]
    n_rows = indptr.shape[0] - 1
    maxcol = -1
    for k in range(nnz):
        if indices[k] > maxcol:
            maxcol = indices[k]
    n_gran = maxcol // granule + 1 if nnz > 0 else 0
    goff = np.zeros(n_gran + 1, dtype=np.int64)
    for k in range(nnz):
        goff[indices[k] // granule + 1] += 1
    for g in range(n_gran):
        goff[g + 1] += goff[g]
    # pass 1: bucket by granule, rows ascending (CSR order is row order)
    pos = goff[:-1].copy()
    tcols = np.empty(nnz, dtype=np.int32)
    trows = np.empty(nnz, dtype=np.int32)
    tvals = np.empty(nnz, dtype=data.dtype)
    for r in range(n_rows):
        for k in range(indptr[r], indptr[r + 1]):
            c = indices[k]
            p = pos[c // granule]
            tcols[p] = c
            trows[p] = r
            tvals[p] = data[k]
            pos[c // granule] = p + 1
    # pass 2: stable counting sort by column inside each granule
    cols = np.empty(nnz, dtype=np.int32)
    rows = np.empty(nnz, dtype=np.int32)
    vals = np.empty(nnz, dtype=data.dtype)
    cnt = np.zeros(granule + 1, dtype=np.int64)
    for g in range(n_gran):
        a = goff[g]
        b = goff[g + 1]
        if b == a:
            continue
        base = g * granule
        cnt[:] = 0
        for p in range(a, b):
            cnt[tcols[p] - base + 1] += 1
        for t in range(granule):
            cnt[t + 1] += cnt[t]
        for p in range(a, b):
            q = a + cnt[tcols[p] - base]
            cnt[tcols[p] - base] += 1
            cols[q] = tcols[p]
            rows[q] = trows[p]
            vals[q] = tvals[p]
    return cols, rows, vals, goff


def csr_to_spill(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, granule: int):
    """Entries of a CSR block sorted by (column, row), with offsets at every ``granule`` columns.

    Returns ``cols`` (int32), ``rows`` (int32, local), ``vals`` and ``goff`` (int64, length n_granules + 1):
    the entries of columns ``[g*granule, (g+1)*granule)`` are ``goff[g]:goff[g+1]``.
    """
    return _csr_to_spill(np.ascontiguousarray(indptr, dtype=np.int64), np.ascontiguousarray(indices),
                         np.ascontiguousarray(data), np.int64(granule))


@numba.njit(nogil=True, cache=True)
def _merge_spills(cols, rows, vals, width):
    nnz = cols.shape[0]
    indptr = np.zeros(width + 1, dtype=np.int64)
    for k in range(nnz):
        indptr[cols[k] + 1] += 1
    for c in range(width):
        indptr[c + 1] += indptr[c]
    pos = indptr[:-1].copy()
    indices = np.empty(nnz, dtype=np.int64)
    data = np.empty(nnz, dtype=vals.dtype)
    for k in range(nnz):
        c = cols[k]
        p = pos[c]
        indices[p] = rows[k]
        data[p] = vals[k]
        pos[c] = p + 1
    return indptr, indices, data


def merge_spills(cols: np.ndarray, rows: np.ndarray, vals: np.ndarray, width: int):
    """CSC buffers of ``width`` columns from entries given in row-block order (stable by column).

    ``cols`` are local column numbers in ``[0, width)``; ``rows`` global row numbers. Entries of one column
    must arrive with increasing rows (true for spills visited in row-block order).
    """
    cols = np.ascontiguousarray(cols, dtype=np.int64)
    if cols.size and (cols.min() < 0 or cols.max() >= width):
        raise ValueError("merge_spills: column outside the block")
    return _merge_spills(cols, np.ascontiguousarray(rows, dtype=np.int64), np.ascontiguousarray(vals),
                         np.int64(width))
