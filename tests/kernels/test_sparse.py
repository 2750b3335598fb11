"""The out-of-core transpose kernels (``dufs.kernels.sparse``) on their own, against SciPy's transpose."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from dufs.kernels.sparse import csr_to_spill, entry_dtype, merge_spills, spill_entries
from dufs.testing.strategies import sparse_matrices


def _spill(X, granule):
    """The spill's columns (each its granule's first column plus its offset), rows, values and granule offsets, as
    arrays of their own."""
    entries, goff = csr_to_spill(X.indptr, X.indices.astype(np.int32), X.data, granule)
    assert entries.dtype == entry_dtype(X.dtype) and entries.dtype.itemsize == 6 + X.dtype.itemsize
    assert (entries["off"] < granule).all()
    gran = np.repeat(np.arange(goff.shape[0] - 1), np.diff(goff))
    cols = (gran * granule + entries["off"]).astype(np.int32)
    return cols, entries["row"], entries["val"], goff


def _bounds(goffs, lo, hi, granule, starts):
    """merge_spills' bounds for the columns [lo, hi) (granule multiples, hi rounded up) of spills with these granule
    offsets, their slices laid one after another from ``starts``."""
    g0, g1 = lo // granule, -(-hi // granule)
    out = []
    for goff, a in zip(goffs, starts, strict=True):
        g = goff[np.minimum(np.arange(g0, g1 + 1), goff.shape[0] - 1)]
        out.append(a + g - g[0])
    return np.array(out, dtype=np.int64).reshape(len(goffs), g1 - g0 + 1)


@settings(max_examples=60, deadline=None)
@given(X=sparse_matrices(max_rows=25, max_cols=40), granule=st.integers(1, 16))
def test_csr_to_spill_buckets_scipys_transpose_by_granule(X, granule):
    """Bucket by bucket, the spill holds SciPy's transpose of those columns (the CSR of X^T): sorted by column
    within a bucket, it is SciPy's columns, row numbers and values in its order, and each bucket's rows come in
    storage order (ascending); ``goff[g]`` counts the entries of the columns below ``g * granule``."""
    n, d = X.shape
    cols, rows, vals, goff = _spill(X, granule)
    T = sp.csr_array(X.T)  # SciPy's transpose, its rows sorted
    T.sort_indices()
    assert cols.dtype == np.int32 and rows.dtype == np.int32 and vals.dtype == X.dtype and goff.dtype == np.int64
    n_gran = int(X.indices.max()) // granule + 1 if X.nnz else 0
    np.testing.assert_array_equal(goff, T.indptr[np.minimum(np.arange(n_gran + 1) * granule, d)])
    for g in range(n_gran):
        a, b = goff[g], goff[g + 1]
        assert (cols[a:b] // granule == g).all()
        assert (np.diff(rows[a:b]) >= 0).all()
        order = np.argsort(cols[a:b], kind="stable")
        lo, hi = g * granule, min((g + 1) * granule, d)
        np.testing.assert_array_equal(cols[a:b][order], np.repeat(np.arange(lo, hi), np.diff(T.indptr[lo:hi + 1])))
        np.testing.assert_array_equal(rows[a:b][order], T.indices[T.indptr[lo]:T.indptr[hi]])
        np.testing.assert_array_equal(vals[a:b][order], T.data[T.indptr[lo]:T.indptr[hi]])


@settings(max_examples=40, deadline=None)
@given(X=sparse_matrices(max_rows=25, max_cols=30, canonical=False), granule=st.integers(1, 8))
def test_csr_to_spill_keeps_duplicates_and_zeros_in_storage_order(X, granule):
    """A non-canonical block (duplicates, explicit zeros, unsorted columns): every stored entry comes out once,
    bucketed by granule in storage order (a stable sort by granule, as NumPy's lexsort), so that merged by column
    the entries of one cell keep their storage order."""
    cols, rows, vals, goff = _spill(X, granule)
    r = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    order = np.lexsort((np.arange(X.nnz), X.indices // granule))
    np.testing.assert_array_equal(cols, X.indices[order])
    np.testing.assert_array_equal(rows, r[order])
    np.testing.assert_array_equal(vals, X.data[order])
    if X.nnz:
        entries, goff = spill_entries(cols, rows, vals, granule)
        indptr, indices, data = merge_spills(entries, X.shape[1], granule=granule,
                                             bounds=_bounds([goff], 0, X.shape[1], granule, [0]))
        by_cell = np.lexsort((np.arange(X.nnz), r, X.indices))
        np.testing.assert_array_equal(indices, r[by_cell])
        np.testing.assert_array_equal(data, X.data[by_cell])


@settings(max_examples=60, deadline=None)
@given(X=sparse_matrices(max_rows=40, max_cols=40), data=st.data())
def test_spills_of_row_blocks_merge_into_scipys_column_blocks(X, data):
    """The out-of-core transpose as the store builder runs it: each row block spilled, each feature block (on
    granule bounds) merged from one slice of every spill in row-block order, is SciPy's CSC of those columns."""
    n, d = X.shape
    granule = data.draw(st.integers(1, 8), label="granule")
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(n - 1, 1)), max_size=3), label="row cuts")))
    row_bounds = [0, *[c for c in cuts if 0 < c < n], n]
    spills = [csr_to_spill(X[a:b].indptr, X[a:b].indices.astype(np.int32), X[a:b].data, granule)
              for a, b in zip(row_bounds[:-1], row_bounds[1:], strict=True)]
    col_bounds = list(range(0, d, granule * data.draw(st.integers(1, 3), label="granules a block"))) + [d]
    ref = sp.csc_array(X)
    ref.sort_indices()
    for lo, hi in zip(col_bounds[:-1], col_bounds[1:], strict=True):
        parts, starts = [], [0]
        for entries, goff in spills:
            g = np.minimum([lo // granule, -(-hi // granule)], goff.shape[0] - 1)
            a, b = goff[g]
            parts.append(entries[a:b])
            starts.append(starts[-1] + b - a)
        # as the builder gives them: one slice of each spill, rows local to their row block, segment by segment
        want = ref[:, lo:hi]
        entries = np.concatenate(parts)
        bounds = _bounds([goff for _, goff in spills], lo, hi, granule, starts[:-1])
        indptr, indices, vals = merge_spills(entries, hi - lo, granule=granule, bounds=bounds,
                                             first_granule=lo // granule, col0=lo, seg_rows=row_bounds[:-1])
        np.testing.assert_array_equal(indptr, want.indptr)
        np.testing.assert_array_equal(indices, want.indices)
        np.testing.assert_array_equal(vals, want.data)
        assert indptr.dtype == np.int64 and indices.dtype == np.int32 and vals.dtype == X.dtype
        # the rows already global (segments from row 0): the same
        glob = entries.copy()
        for s_, r0 in enumerate(row_bounds[:-1]):
            glob["row"][starts[s_]:starts[s_ + 1]] += r0
        again = merge_spills(glob, hi - lo, granule=granule, bounds=bounds, first_granule=lo // granule, col0=lo)
        for got, ref_part in zip(again, (want.indptr, want.indices, want.data), strict=True):
            np.testing.assert_array_equal(got, ref_part)


def test_csr_to_spill_into_given_memory():
    X = sp.random_array((30, 50), density=0.2, rng=3, format="csr", dtype=np.float32)
    want, goff_want = csr_to_spill(X.indptr, X.indices.astype(np.int32), X.data, 8)
    out = np.zeros(X.nnz, entry_dtype(np.float32))
    got, goff = csr_to_spill(X.indptr, X.indices.astype(np.int32), X.data, 8, out=out)
    assert got is out and np.array_equal(goff, goff_want) and got.tobytes() == want.tobytes()
    for bad in (np.zeros(X.nnz + 1, entry_dtype(np.float32)), np.zeros(X.nnz, entry_dtype(np.float64))):
        with pytest.raises(ValueError, match="out must hold"):
            csr_to_spill(X.indptr, X.indices.astype(np.int32), X.data, 8, out=bad)


def test_merge_spills_into_given_memory():
    X = sp.random_array((30, 50), density=0.2, rng=4, format="csr", dtype=np.float32)
    entries, goff = csr_to_spill(X.indptr, X.indices.astype(np.int32), X.data, 8)
    out = (np.zeros(X.nnz, np.int32), np.zeros(X.nnz, np.float32))
    bounds = _bounds([goff], 0, 50, 8, [0])
    indptr, indices, data = merge_spills(entries, 50, granule=8, bounds=bounds, out=out)
    assert indices is out[0] and data is out[1]
    ref = sp.csc_array(X)
    ref.sort_indices()
    for got, want in zip((indptr, indices, data), (ref.indptr, ref.indices, ref.data), strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="out must be"):
        merge_spills(entries, 50, granule=8, bounds=bounds,
                     out=(np.zeros(X.nnz, np.int32), np.zeros(X.nnz, np.float64)))


def _merge(cols, rows, vals, width, granule=4, col0=0):
    """merge_spills of one segment of these entries (in granule order), its granules from col0's."""
    entries, goff = spill_entries(np.asarray(cols), np.asarray(rows), np.asarray(vals, dtype=np.float64), granule)
    return merge_spills(entries, width, granule=granule, first_granule=col0 // granule, col0=col0,
                        bounds=_bounds([goff], col0, col0 + width, granule, [0]))


def test_merge_spills_refuses_what_is_not_a_spill_of_the_block():
    with pytest.raises(ValueError, match="column outside the block"):
        _merge([0, 3], [0, 1], [1.0, 2.0], 3)
    with pytest.raises(ValueError, match="column outside the block"):  # inside once col0 is taken off: not 8
        _merge([5, 8], [0, 1], [1.0, 2.0], 3, col0=5, granule=16)
    with pytest.raises(ValueError, match="granule order"):  # column 5 (granule 1) before column 1 (granule 0)
        spill_entries(np.array([5, 1]), np.array([0, 1]), np.array([1.0, 2.0]), 4)
    with pytest.raises(ValueError, match=">= 0"):
        spill_entries(np.array([-1]), np.array([0]), np.array([1.0]), 4)
    for g in (0, 1 << 17):  # a column's offset in its granule is 16 bits
        with pytest.raises(ValueError, match="granule must be in"):
            csr_to_spill(np.array([0, 1]), np.array([0], np.int32), np.array([1.0]), g)
    entries, goff = spill_entries(np.array([0, 1]), np.array([0, 1]), np.array([1.0, 2.0]), 4)
    for bounds in ([[0, 1]], [[0, 1], [2, 2]], [[1, 2]], [[0, 2, 1, 2]], np.zeros(3, np.int64)):
        with pytest.raises(ValueError, match="bounds do not cover"):
            merge_spills(entries, 4, granule=4, bounds=np.asarray(bounds))
    with pytest.raises(ValueError, match="one seg_rows a segment"):
        merge_spills(entries, 4, granule=4, bounds=[[0, 2]], seg_rows=[0, 5])
    with pytest.raises(ValueError, match="spill entries"):
        merge_spills(np.zeros(3, np.int32), 3, granule=4, bounds=[[0, 3]])
    indptr, indices, data = _merge([], [], [], 2)
    assert indptr.tolist() == [0, 0, 0] and indices.size == 0 and data.size == 0
