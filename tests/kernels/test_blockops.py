"""The CSC block kernels against SciPy / NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from dufs.kernels.blockops import (
    col_sums,
    csc_class_stats,
    csc_column_stats,
    csc_label_sums,
    csc_matvec,
    csc_rmatvec,
)
from dufs.testing.strategies import sparse_matrices

TOL = {"rtol": 1e-10, "atol": 1e-10}


def _tame(X):
    """CSC float copy with bounded, few-digit values (so float64 references agree to 1e-10)."""
    A = sp.csc_array(X, copy=True)
    A.data = np.round(np.clip(A.data, -10, 10), 1).astype(A.dtype)
    A.eliminate_zeros()
    A.sort_indices()
    return A


def _buffers(A):
    return A.indptr.astype(np.int64), A.indices.astype(np.int32), A.data


@settings(max_examples=60, deadline=None)
@given(X=sparse_matrices(max_rows=25, max_cols=20))
def test_column_stats_match_numpy(X):
    A = _tame(X)
    n = A.shape[0]
    D = A.toarray().astype(np.float64)
    s, ss, m2, nnz, mn, mx = csc_column_stats(*_buffers(A), n)
    np.testing.assert_allclose(s, D.sum(0), **TOL)
    np.testing.assert_allclose(ss, (D * D).sum(0), **TOL)
    np.testing.assert_allclose(m2, ((D - D.mean(0)) ** 2).sum(0), **TOL)
    np.testing.assert_array_equal(nnz, (D != 0).sum(0))
    np.testing.assert_array_equal(mn, D.min(0))
    np.testing.assert_array_equal(mx, D.max(0))
    assert s.dtype == np.float64 and nnz.dtype == np.int64


def test_column_stats_constant_column_has_zero_m2_and_implicit_zeros():
    A = sp.csc_array(np.array([[0.1, 2.0, 0.0], [0.1, 0.0, 0.0], [0.1, 3.0, 0.0]]))
    s, ss, m2, nnz, mn, mx = csc_column_stats(*_buffers(A), 3)
    assert m2[0] == 0.0 and m2[2] == 0.0
    np.testing.assert_array_equal(mn, [0.1, 0.0, 0.0])
    np.testing.assert_array_equal(mx, [0.1, 3.0, 0.0])
    np.testing.assert_array_equal(nnz, [3, 2, 0])


def test_column_stats_no_rows():
    s, ss, m2, nnz, mn, mx = csc_column_stats(np.zeros(3, np.int64), np.zeros(0, np.int32), np.zeros(0), 0)
    assert s.shape == (2,) and np.isnan(mn).all() and np.isnan(mx).all()


@settings(max_examples=40, deadline=None)
@given(X=sparse_matrices(max_rows=25, max_cols=20), seed=st.integers(0, 2**32 - 1))
def test_class_stats_match_numpy(X, seed):
    A = _tame(X)
    n = A.shape[0]
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 4))
    codes = rng.integers(0, k, n).astype(np.int64)
    D = A.toarray().astype(np.float64)
    s, ss = csc_class_stats(*_buffers(A), codes, k)
    for c in range(k):
        np.testing.assert_allclose(s[c], D[codes == c].sum(0), **TOL)
        np.testing.assert_allclose(ss[c], (D[codes == c] ** 2).sum(0), **TOL)


@settings(max_examples=60, deadline=None)
@given(X=sparse_matrices(max_rows=25, max_cols=20), p=st.integers(1, 4), seed=st.integers(0, 2**32 - 1))
def test_rmatvec_and_matvec_match_scipy(X, p, seed):
    A = _tame(X)
    n, d = A.shape
    rng = np.random.default_rng(seed)
    V = rng.standard_normal((n, p))
    U = rng.standard_normal((d, p))
    A64 = A.astype(np.float64)
    out = np.full((d, p), np.nan)
    csc_rmatvec(*_buffers(A), V, out)
    np.testing.assert_allclose(out, A64.T @ V, **TOL)
    acc = rng.standard_normal((n, p))
    expect = acc + A64 @ U
    start = acc.copy()
    csc_matvec(*_buffers(A), U, acc)  # accumulates
    np.testing.assert_allclose(acc, expect, **TOL)
    # each row of U scaled as it is read: X diag(s) U, the same numbers as the product with the scaled copy
    sc = rng.uniform(0.5, 2.0, d)
    fused, copied = start.copy(), start.copy()
    csc_matvec(*_buffers(A), U, fused, sc)
    csc_matvec(*_buffers(A), sc[:, None] * U, copied)
    np.testing.assert_allclose(fused, start + A64 @ (sc[:, None] * U), **TOL)
    assert np.array_equal(fused, copied)


@settings(max_examples=60, deadline=None)
@given(X=sparse_matrices(max_rows=25, max_cols=20), c=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_label_sums_are_the_product_with_the_labels_indicator(X, c, seed):
    """X^T U for U the labels' indicator, against NumPy's per-label column sums; and bit for bit the general
    kernel's product with U itself (the same sums in the same order), for int32 and int64 labels."""
    A = _tame(X)
    n, d = A.shape
    labels = np.random.default_rng(seed).integers(0, c, n)
    D = A.toarray().astype(np.float64)
    ref = np.column_stack([D[labels == q].sum(axis=0) for q in range(c)]) if d else np.zeros((0, c))
    U = np.zeros((n, c))
    U[np.arange(n), labels] = 1.0
    general = np.empty((d, c))
    csc_rmatvec(*_buffers(A), U, general)
    for lab in (labels.astype(np.int32), labels.astype(np.int64)):
        out = np.full((d, c), np.nan)
        csc_label_sums(*_buffers(A), lab, out)
        np.testing.assert_allclose(out, ref, **TOL)
        assert np.array_equal(out, general)


def test_kernels_on_float32_and_int64_indices():
    rng = np.random.default_rng(0)
    A = sp.random_array((200, 50), density=0.1, format="csc", dtype=np.float32, rng=rng)
    indptr, indices, data = A.indptr.astype(np.int64), A.indices.astype(np.int64), A.data
    V = rng.standard_normal((200, 3))
    out = np.empty((50, 3))
    csc_rmatvec(indptr, indices, data, V, out)
    np.testing.assert_allclose(out, A.astype(np.float64).T @ V, **TOL)


def test_col_sums_match_numpy():
    rng = np.random.default_rng(3)
    for V in (rng.standard_normal((1001, 3)), rng.standard_normal(777), rng.standard_normal((50, 1)).astype(np.float32),
              np.asfortranarray(rng.standard_normal((40, 2)))):
        got = col_sums(V)
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, V.astype(np.float64).sum(axis=0), rtol=1e-13, atol=1e-12)


def test_rmatvec_kernel_float32_vector_and_one_column_path_are_exact():
    """What the pass benchmark leans on: a float32 V gives bit-for-bit the products of the same values in float64
    (the kernel multiplies and sums in float64), and the one-vector fast path equals the general one."""
    rng = np.random.default_rng(0)
    A = sp.random_array((500, 80), density=0.05, format="csc", dtype=np.float32, rng=rng)
    A.sort_indices()
    ip, ix, dt = A.indptr.astype(np.int64), A.indices.astype(np.int32), A.data
    v32 = rng.standard_normal((500, 1)).astype(np.float32)
    o32, o64 = np.empty((80, 1)), np.empty((80, 1))
    csc_rmatvec(ip, ix, dt, v32, o32)
    csc_rmatvec(ip, ix, dt, v32.astype(np.float64), o64)
    assert np.array_equal(o32, o64)
    two = np.empty((80, 2))
    csc_rmatvec(ip, ix, dt, np.repeat(v32.astype(np.float64), 2, axis=1), two)
    assert np.array_equal(two[:, :1], o64) and np.array_equal(two[:, 1:], o64)
    np.testing.assert_allclose(o64[:, 0], A.astype(np.float64).T @ v32[:, 0].astype(np.float64), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("shape", [(0, 3), (1, 1), (1000, 6), (37, 21)])
def test_tall_gram_is_numpys(shape):
    """T^T T summed row by row (the same numbers in every process) is NumPy's product to rounding, symmetric."""
    from dufs.kernels.blockops import tall_gram

    T = np.random.default_rng(shape[0]).standard_normal(shape)
    G = tall_gram(T)
    np.testing.assert_allclose(G, T.T @ T, rtol=1e-12, atol=1e-12 * max(1, shape[0]))
    np.testing.assert_array_equal(G, G.T)
