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
    """The spill's columns, rows, values and granule offsets, as arrays of their own."""
    entries, goff = csr_to_spill(X.indptr, X.indices.astype(np.int32), X.data, granule)
    assert entries.dtype == entry_dtype(X.dtype) and entries.dtype.itemsize == 8 + X.dtype.itemsize
    return entries["col"], entries["row"], entries["val"], goff


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
        indptr, indices, data = merge_spills(spill_entries(cols, rows, vals), X.shape[1])
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
    spills = [_spill(sp.csr_array(X[a:b]), granule) for a, b in zip(row_bounds[:-1], row_bounds[1:], strict=True)]
    col_bounds = list(range(0, d, granule * data.draw(st.integers(1, 3), label="granules a block"))) + [d]
    ref = sp.csc_array(X)
    ref.sort_indices()
    for lo, hi in zip(col_bounds[:-1], col_bounds[1:], strict=True):
        pc, pr, pv, counts = [], [], [], []
        for cols, rows, vals, goff in spills:
            g = np.minimum([lo // granule, -(-hi // granule)], goff.shape[0] - 1)
            a, b = goff[g]
            pc.append(cols[a:b])
            pr.append(rows[a:b])
            pv.append(vals[a:b])
            counts.append(b - a)
        # as the builder gives them: raw spill columns and rows local to their row block, segment by segment
        # (granule by granule, as the builder merges them, and in one sweep)
        want = ref[:, lo:hi]
        entries = spill_entries(np.concatenate(pc), np.concatenate(pr), np.concatenate(pv))
        for g in (granule, 0):
            indptr, indices, vals = merge_spills(entries, hi - lo, col0=lo, seg_counts=counts,
                                                 seg_rows=row_bounds[:-1], granule=g)
            np.testing.assert_array_equal(indptr, want.indptr)
            np.testing.assert_array_equal(indices, want.indices)
            np.testing.assert_array_equal(vals, want.data)
            assert indptr.dtype == np.int64 and indices.dtype == np.int32 and vals.dtype == X.dtype
        # one segment of rows already global: the same
        glob = [r.astype(np.int64) + r0 for r, r0 in zip(pr, row_bounds[:-1], strict=True)]
        again = merge_spills(spill_entries(np.concatenate(pc).astype(np.int64) - lo, np.concatenate(glob),
                                           np.concatenate(pv)), hi - lo)
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
    entries, _ = csr_to_spill(X.indptr, X.indices.astype(np.int32), X.data, 8)
    out = (np.zeros(X.nnz, np.int32), np.zeros(X.nnz, np.float32))
    indptr, indices, data = merge_spills(entries, 50, granule=8, out=out)
    assert indices is out[0] and data is out[1]
    ref = sp.csc_array(X)
    ref.sort_indices()
    for got, want in zip((indptr, indices, data), (ref.indptr, ref.indices, ref.data), strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="out must be"):
        merge_spills(entries, 50, out=(np.zeros(X.nnz, np.int32), np.zeros(X.nnz, np.float64)))


def _e(cols, rows, vals):
    return spill_entries(np.asarray(cols), np.asarray(rows), np.asarray(vals, dtype=np.float64))


def test_merge_spills_refuses_a_column_outside_the_block():
    with pytest.raises(ValueError, match="column outside the block"):
        merge_spills(_e([0, 3], [0, 1], [1.0, 2.0]), 3)
    with pytest.raises(ValueError, match="column outside the block"):
        merge_spills(_e([-1], [0], [1.0]), 3)
    with pytest.raises(ValueError, match="column outside the block"):  # inside once col0 is taken off: not 8
        merge_spills(_e([5, 8], [0, 1], [1.0, 2.0]), 3, col0=5)
    with pytest.raises(ValueError, match="not in granule order"):  # column 5 (granule 1) before column 1 (granule 0)
        merge_spills(_e([5, 1], [0, 1], [1.0, 2.0]), 6, granule=4)
    with pytest.raises(ValueError, match="granule must be"):
        merge_spills(_e([0], [0], [1.0]), 2, granule=-1)
    with pytest.raises(ValueError, match="segments do not cover"):
        merge_spills(_e([0, 1], [0, 1], [1.0, 2.0]), 3, seg_counts=[1], seg_rows=[0])
    with pytest.raises(ValueError, match="spill entries"):
        merge_spills(np.zeros(3, np.int32), 3)
    indptr, indices, data = merge_spills(_e([], [], []), 2)
    assert indptr.tolist() == [0, 0, 0] and indices.size == 0 and data.size == 0
