"""Sparse reshuffling kernels for the out-of-core transpose (raw buffers in, raw buffers out)."""

from __future__ import annotations

import numba
import numpy as np

#: the widest granule a spill entry's 16-bit column offset can address
MAX_GRANULE = 1 << 16


def entry_dtype(value_dtype) -> np.dtype:
    """A spill entry: its column's offset in its granule (uint16: the granule is its bucket's), its row within the
    row block (int32) and its value, packed in one record (little-endian, 10 bytes for float32 values): the
    bucketing writes one stream a granule instead of three (docs/measurements.md, "Transposing"), a slice of a
    spill is one read, and the spill, the largest thing a conversion writes, is 10 bytes an entry instead of 12."""
    return np.dtype([("off", "<u2"), ("row", "<i4"), ("val", np.dtype(value_dtype).newbyteorder("<"))])


def spill_entries(cols: np.ndarray, rows: np.ndarray, vals: np.ndarray, granule: int) -> tuple[np.ndarray,
                                                                                                np.ndarray]:
    """The entries (:func:`entry_dtype`) of the given columns, rows and values, which must come in granule order
    (``cols // granule`` never decreasing), and ``goff`` as :func:`csr_to_spill` returns it."""
    cols, vals = np.asarray(cols, dtype=np.int64), np.asarray(vals)
    _check_granule(granule)
    gran = cols // granule
    if cols.size and (cols.min() < 0 or np.any(np.diff(gran) < 0)):
        raise ValueError("spill_entries: the columns must be >= 0 and in granule order")
    out = np.empty(cols.shape[0], entry_dtype(vals.dtype))
    out["off"], out["row"], out["val"] = cols - gran * granule, rows, vals
    n_gran = int(gran[-1]) + 1 if cols.size else 0
    return out, np.searchsorted(gran, np.arange(n_gran + 1), side="left").astype(np.int64)


def _check_granule(granule: int) -> None:
    if not 1 <= int(granule) <= MAX_GRANULE:
        raise ValueError(f"the feature granule must be in [1, {MAX_GRANULE}] (a spill entry holds its column's offset "
                         f"in its granule in 16 bits); got {granule}")


@numba.njit(nogil=True, cache=True)
def _csr_to_spill(indptr, indices, data, granule, out):
    nnz = indptr[-1]
    n_rows = indptr.shape[0] - 1
    maxcol = -1
    for k in range(nnz):
        if indices[k] > maxcol:
            maxcol = indices[k]
    n_gran = maxcol // granule + 1 if nnz > 0 else 0
    # a power of two (the default 1024) divides by a shift: two divisions an entry were a tenth of the sweeps
    shift = -1
    if granule & (granule - 1) == 0:
        shift = 0
        while (1 << shift) < granule:
            shift += 1
    goff = np.zeros(n_gran + 1, dtype=np.int64)
    for k in range(nnz):
        goff[(indices[k] >> shift if shift >= 0 else indices[k] // granule) + 1] += 1
    for g in range(n_gran):
        goff[g + 1] += goff[g]
    # bucket by granule, in storage order (CSR order is row order): the merge's counting sort by column is stable,
    # so a column's rows come out ascending without sorting inside a bucket here
    pos = goff[:-1].copy()
    for r in range(n_rows):
        for k in range(indptr[r], indptr[r + 1]):
            c = indices[k]
            g = c >> shift if shift >= 0 else c // granule
            p = pos[g]
            out[p].off = c - g * granule
            out[p].row = r
            out[p].val = data[k]
            pos[g] = p + 1
    return goff


def csr_to_spill(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, granule: int, *,
                 out: np.ndarray | None = None):
    """Entries of a CSR block bucketed by granules of ``granule`` columns, in storage order (so rows ascending) in each
    bucket, with the offsets of the buckets: what :func:`merge_spills` sorts by column.

    Returns ``entries`` (:func:`entry_dtype` of the data's dtype: ``off`` the column's offset in its granule, ``row``
    local to the block, ``val``) and ``goff`` (int64, length n_granules + 1): the entries of columns
    ``[g*granule, (g+1)*granule)`` are ``entries[goff[g]:goff[g+1]]``. ``out``: where to put the entries (as many
    as the block has, of that dtype).
    """
    _check_granule(granule)
    data = np.ascontiguousarray(data)
    indptr = np.ascontiguousarray(indptr, dtype=np.int64)
    if out is None:
        out = np.empty(int(indptr[-1]), entry_dtype(data.dtype))
    elif out.shape != (int(indptr[-1]),) or out.dtype != entry_dtype(data.dtype):
        raise ValueError(f"csr_to_spill: out must hold {int(indptr[-1])} entries of {entry_dtype(data.dtype)}")
    goff = _csr_to_spill(indptr, np.ascontiguousarray(indices), data, np.int64(granule), out)
    return out, goff


@numba.njit(nogil=True, cache=True)
def _merge_spills(entries, width, col0, bounds, first_granule, granule, seg_rows, indices, data):
    nseg = bounds.shape[0]
    n_gran = bounds.shape[1] - 1
    indptr = np.zeros(width + 1, dtype=np.int64)
    for s in range(nseg):
        for q in range(n_gran):
            base = (first_granule + q) * granule - col0
            for k in range(bounds[s, q], bounds[s, q + 1]):
                c = base + np.int64(entries[k].off)
                if c < 0 or c >= width:
                    return indptr, 1
                indptr[c + 1] += 1
    for c in range(width):
        indptr[c + 1] += indptr[c]
    pos = indptr[:-1].copy()
    # granule by granule, each segment's entries of that granule in turn: the writes of one granule stay within its
    # stretch of the output (cached) instead of scattering over the whole block (docs/measurements.md,
    # "Transposing"); a column's entries still come segment after segment, so rows ascend
    for q in range(n_gran):
        base = (first_granule + q) * granule - col0
        for s in range(nseg):
            r0 = seg_rows[s]
            for k in range(bounds[s, q], bounds[s, q + 1]):
                e = entries[k]
                c = base + np.int64(e.off)
                p = pos[c]
                indices[p] = e.row + r0
                data[p] = e.val
                pos[c] = p + 1
    return indptr, 0


def merge_spills(entries: np.ndarray, width: int, *, granule: int, bounds: np.ndarray, first_granule: int = 0,
                 col0: int = 0, seg_rows: np.ndarray | None = None,
                 out: tuple[np.ndarray, np.ndarray] | None = None):
    """CSC buffers of ``width`` columns from spill entries (:func:`entry_dtype`) given in row-block order (stable by
    column).

    The entries come in segments (one slice of a row block's spill each), each bucketed by granules of ``granule``
    columns: ``bounds[s, q]:bounds[s, q + 1]`` are segment ``s``'s entries of granule ``first_granule + q`` (so
    ``bounds`` is (segments, granules + 1), its rows following one another and covering the entries). An entry's
    column is its granule's first column plus its ``off``; ``column - col0`` is its local column, in ``[0, width)``.
    The ``row`` of segment ``s``'s entries are numbered from ``seg_rows[s]`` (default 0). Entries of one column
    must arrive with increasing rows (true for spills visited in row-block order). Returns ``indptr`` (int64),
    ``indices`` (int32: rows of a store are below 2**31) and ``data``; ``out``: the memory for the last two (as many
    items as entries).
    """
    entries = np.ascontiguousarray(entries)
    if entries.dtype.names != ("off", "row", "val") or entries.dtype != entry_dtype(entries.dtype["val"]):
        raise ValueError(f"merge_spills: entries must be spill entries (entry_dtype), not {entries.dtype}")
    _check_granule(granule)
    bounds = np.ascontiguousarray(bounds, dtype=np.int64)
    n = entries.shape[0]
    if (bounds.ndim != 2 or bounds.shape[1] < 1 or (bounds.size and (bounds[0, 0] != 0 or bounds[-1, -1] != n))
            or (not bounds.size and n) or np.any(np.diff(bounds, axis=1) < 0)
            or np.any(bounds[1:, 0] != bounds[:-1, -1])):
        raise ValueError("merge_spills: the bounds do not cover the entries, segment after segment")
    seg_rows = (np.zeros(bounds.shape[0], np.int64) if seg_rows is None
                else np.ascontiguousarray(seg_rows, dtype=np.int64))
    if seg_rows.shape != (bounds.shape[0],):
        raise ValueError("merge_spills: one seg_rows a segment")
    vdt = entries.dtype["val"].newbyteorder("=")
    if out is None:
        indices, data = np.empty(n, np.int32), np.empty(n, vdt)
    else:
        indices, data = out
        if indices.shape != (n,) or indices.dtype != np.int32 or data.shape != (n,) or data.dtype != vdt:
            raise ValueError(f"merge_spills: out must be {n} int32 rows and {n} values of {vdt}")
    indptr, bad = _merge_spills(entries, np.int64(width), np.int64(col0), bounds, np.int64(first_granule),
                                np.int64(granule), seg_rows, indices, data)
    if bad:
        raise ValueError("merge_spills: column outside the block")
    return indptr, indices, data
