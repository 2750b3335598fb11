"""Sparse reshuffling kernels for the out-of-core transpose (raw buffers in, raw buffers out)."""

from __future__ import annotations

import numba
import numpy as np


def entry_dtype(value_dtype) -> np.dtype:
    """A spill entry: its raw column (int32), its row within the row block (int32) and its value, packed in one
    record (little-endian): the bucketing writes one stream a granule instead of three (a block of 957K entries in
    354 granules: 3.5-4.5 ms against 8-12), and a slice of a spill is one read."""
    return np.dtype([("col", "<i4"), ("row", "<i4"), ("val", np.dtype(value_dtype).newbyteorder("<"))])


def spill_entries(cols: np.ndarray, rows: np.ndarray, vals: np.ndarray) -> np.ndarray:
    """The entries (:func:`entry_dtype`) of the given columns, rows and values."""
    vals = np.asarray(vals)
    out = np.empty(np.shape(cols)[0], entry_dtype(vals.dtype))
    out["col"], out["row"], out["val"] = cols, rows, vals
    return out


@numba.njit(nogil=True, cache=True)
def _csr_to_spill(indptr, indices, data, granule, out):
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
    # bucket by granule, in storage order (CSR order is row order): the merge's counting sort by column is stable,
    # so a column's rows come out ascending without sorting inside a bucket here
    pos = goff[:-1].copy()
    for r in range(n_rows):
        for k in range(indptr[r], indptr[r + 1]):
            c = indices[k]
            g = c // granule
            p = pos[g]
            out[p].col = c
            out[p].row = r
            out[p].val = data[k]
            pos[g] = p + 1
    return goff


def csr_to_spill(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, granule: int, *,
                 out: np.ndarray | None = None):
    """Entries of a CSR block bucketed by granules of ``granule`` columns, in storage order (so rows ascending) in each
    bucket, with the offsets of the buckets: what :func:`merge_spills` sorts by column.

    Returns ``entries`` (:func:`entry_dtype` of the data's dtype: ``col``, ``row`` local to the block, ``val``) and
    ``goff`` (int64, length n_granules + 1): the entries of columns ``[g*granule, (g+1)*granule)`` are
    ``entries[goff[g]:goff[g+1]]``. ``out``: where to put the entries (as many as the block has, of that dtype).
    """
    data = np.ascontiguousarray(data)
    indptr = np.ascontiguousarray(indptr, dtype=np.int64)
    if out is None:
        out = np.empty(int(indptr[-1]), entry_dtype(data.dtype))
    elif out.shape != (int(indptr[-1]),) or out.dtype != entry_dtype(data.dtype):
        raise ValueError(f"csr_to_spill: out must hold {int(indptr[-1])} entries of {entry_dtype(data.dtype)}")
    goff = _csr_to_spill(indptr, np.ascontiguousarray(indices), data, np.int64(granule), out)
    return out, goff


@numba.njit(nogil=True, cache=True)
def _merge_spills(entries, width, col0, seg_ends, seg_rows, granule, indices, data):
    nnz = entries.shape[0]
    indptr = np.zeros(width + 1, dtype=np.int64)
    for k in range(nnz):
        c = np.int64(entries[k].col) - col0
        if c < 0 or c >= width:
            return indptr, 1
        indptr[c + 1] += 1
    for c in range(width):
        indptr[c + 1] += indptr[c]
    pos = indptr[:-1].copy()
    nseg = seg_ends.shape[0]
    ptr = np.empty(nseg, dtype=np.int64)
    for s in range(nseg):
        ptr[s] = 0 if s == 0 else seg_ends[s - 1]
    # granule by granule, each segment's entries of that granule in turn: the writes of one granule stay within its
    # stretch of the output (cached) instead of scattering over the whole block (47 -> 31 ms for 3.7M entries over
    # 181K columns in 8 segments); a column's entries still come segment after segment, so rows ascend
    for g in range(col0 // granule, (col0 + max(width, 1) - 1) // granule + 1):
        lower = g * granule
        limit = lower + granule
        for s in range(nseg):
            base = seg_rows[s]
            k = ptr[s]
            end = seg_ends[s]
            while k < end and entries[k].col < limit:
                e = entries[k]
                if e.col < lower:  # a granule before this one, after a later one: not in granule order
                    return indptr, 2
                c = np.int64(e.col) - col0
                p = pos[c]
                indices[p] = e.row + base
                data[p] = e.val
                pos[c] = p + 1
                k += 1
            ptr[s] = k
    return indptr, 0


def merge_spills(entries: np.ndarray, width: int, *, col0: int = 0, seg_counts: np.ndarray | None = None,
                 seg_rows: np.ndarray | None = None, granule: int = 0,
                 out: tuple[np.ndarray, np.ndarray] | None = None):
    """CSC buffers of ``width`` columns from spill entries (:func:`entry_dtype`) given in row-block order (stable by
    column).

    Their ``col - col0`` are the local column numbers, in ``[0, width)``. The entries come in segments (one slice of a
    row block's spill each) of ``seg_counts`` entries, whose ``rows`` are numbered from ``seg_rows`` (default: one
    segment, rows as given). Entries of one column must arrive with increasing rows (true for spills visited in
    row-block order). ``granule``: each segment's entries are bucketed by granules of that many columns (as
    :func:`csr_to_spill` writes them; ``col // granule`` never decreases within a segment), which lets the merge
    fill the output a granule at a time; 0: any order. Returns ``indptr`` (int64), ``indices`` (int32: rows of a
    store are below 2**31) and ``data``; ``out``: the memory for the last two (as many items as entries).
    """
    entries = np.ascontiguousarray(entries)
    if entries.dtype.names != ("col", "row", "val") or entries.dtype != entry_dtype(entries.dtype["val"]):
        raise ValueError(f"merge_spills: entries must be spill entries (entry_dtype), not {entries.dtype}")
    if seg_counts is None:
        seg_ends, seg_rows = np.array([entries.shape[0]], np.int64), np.zeros(1, np.int64)
    else:
        seg_ends = np.cumsum(np.asarray(seg_counts, dtype=np.int64))
        seg_rows = np.ascontiguousarray(seg_rows, dtype=np.int64)
        if seg_ends.shape != seg_rows.shape or (seg_ends.size and seg_ends[-1] != entries.shape[0]):
            raise ValueError("merge_spills: the segments do not cover the entries")
    if granule < 0:
        raise ValueError(f"merge_spills: granule must be >= 0, got {granule}")
    whole = max(int(col0) + int(width), 1) if not granule else int(granule)  # 0: one granule holding every column
    n, vdt = entries.shape[0], entries.dtype["val"].newbyteorder("=")
    if out is None:
        indices, data = np.empty(n, np.int32), np.empty(n, vdt)
    else:
        indices, data = out
        if indices.shape != (n,) or indices.dtype != np.int32 or data.shape != (n,) or data.dtype != vdt:
            raise ValueError(f"merge_spills: out must be {n} int32 rows and {n} values of {vdt}")
    indptr, bad = _merge_spills(entries, np.int64(width), np.int64(col0), seg_ends, seg_rows, np.int64(whole),
                                indices, data)
    if bad == 1:
        raise ValueError("merge_spills: column outside the block")
    if bad == 2:
        raise ValueError(f"merge_spills: a segment's entries are not in granule order (granule {granule})")
    return indptr, indices, data
