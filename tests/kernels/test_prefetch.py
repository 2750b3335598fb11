"""The kernels' software prefetch: emitted where the random reads are, harmless at any address, and the products
with it equal SciPy's on blocks long enough that it runs (more nonzeros than its distance ahead)."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import scipy.sparse as sp

from dufs.kernels._prefetch import DISTANCE, prefetch_row
from dufs.kernels.blockops import _MATVEC, _RMATVEC, csc_matvec, csc_rmatvec
from dufs.kernels.dcd import dcd_gradient, dcd_start
from dufs.kernels.greedy import A_OPTIMAL, D_OPTIMAL, _update1, _update2, greedy_update


@numba.njit
def _hint_everywhere(V, rows):
    s = 0.0
    for r in rows:
        prefetch_row(V, r)
        s += 1.0
    return s


def test_a_hint_at_any_row_never_faults():
    V = np.ones((4, 2), dtype=np.float32)
    rows = np.array([0, 3, 4, -1, 2**31 - 1, -(2**31)], dtype=np.int32)  # past the end, negative, extreme
    assert _hint_everywhere(V, rows) == rows.shape[0]
    assert _hint_everywhere(np.ones(3), np.array([2**40, -(2**40)], dtype=np.int64)) == 2.0


def _block(n_rows, n_cols, nnz_per_col, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    cols = [np.sort(rng.choice(n_rows, size=int(rng.integers(0, 2 * nnz_per_col)), replace=False))
            for _ in range(n_cols)]
    indptr = np.zeros(n_cols + 1, dtype=np.int64)
    indptr[1:] = np.cumsum([c.shape[0] for c in cols])
    indices = np.concatenate(cols).astype(np.int32)
    data = rng.standard_normal(indices.shape[0]).astype(dtype)
    assert indices.shape[0] > 4 * DISTANCE
    return indptr, indices, data, sp.csc_array((data, indices, indptr), shape=(n_rows, n_cols))


@pytest.mark.parametrize("p", [1, 2, 5, 16, 19])
def test_products_with_the_hint_equal_scipy(p):
    indptr, indices, data, A = _block(3000, 200, 40, seed=p)
    rng = np.random.default_rng(100 + p)
    A64 = A.astype(np.float64)
    V = rng.standard_normal((3000, p))
    out = np.empty((200, p))
    csc_rmatvec(indptr, indices, data, V, out)
    np.testing.assert_allclose(out, A64.T @ V, rtol=1e-12, atol=1e-12)
    U = rng.standard_normal((200, p))
    acc = np.zeros((3000, p))
    csc_matvec(indptr, indices, data, U, acc)
    np.testing.assert_allclose(acc, A64 @ U, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", [A_OPTIMAL, D_OPTIMAL])
def test_greedy_update_with_the_hint_equals_dense_numpy(mode):
    indptr, indices, data, A = _block(2000, 150, 30, seed=7)
    rng = np.random.default_rng(8)
    width = 1 if mode == D_OPTIMAL else 2
    V = rng.standard_normal((2000, width)).astype(np.float32)
    D = A.toarray().astype(np.float64)
    s = rng.uniform(5, 10, 150)
    v = rng.uniform(0, 1, 150)
    sel = np.zeros(150, dtype=np.bool_)
    sel[[3, 77]] = True
    tiny = np.full(150, 1e-12)
    sp_, c2 = 4.0, 1.5
    s_out, v_out = np.empty(150), np.empty(150)
    greedy_update(indptr, indices, data, None, None, V, V.sum(axis=0, dtype=np.float64), sp_, c2, s, v, sel, mode,
                  tiny, s_out, v_out)
    P = D.T @ V.astype(np.float64)
    lj = P[:, 0] / np.sqrt(sp_)
    e = lj / np.sqrt(sp_)
    want_s = np.where(sel, s, s - lj * lj)
    np.testing.assert_allclose(s_out, want_s, rtol=1e-12, atol=1e-12)
    if mode == A_OPTIMAL:
        want_v = np.where(sel, v, v - 2.0 * e * P[:, 1] + e * e * c2)
        np.testing.assert_allclose(v_out, want_v, rtol=1e-12, atol=1e-12)


def test_dcd_sweeps_with_the_hint_equal_dense_numpy():
    """MMFS's gradient sweeps (dcd_gradient, dcd_start): f_j^T w + b with f_j = coef_j (x_j - shift_j 1), w = ws +
    t 1, against the dense columns."""
    indptr, indices, data, A = _block(2500, 180, 30, seed=11)
    rng = np.random.default_rng(12)
    n, d = A.shape
    coef, shift = rng.uniform(0.5, 2, d), rng.uniform(-0.2, 0.2, d)
    colsum = np.asarray(A.astype(np.float64).sum(axis=0)).ravel()
    ws = rng.standard_normal(n)
    t, b = 0.3, -0.7
    wt = np.array([t, ws.sum()])
    F = coef[None, :] * (A.toarray().astype(np.float64) - shift[None, :])
    want = F.T @ (ws + t) + b
    g = np.empty(d)
    dcd_gradient(indptr, indices, data, coef, shift, colsum, ws, wt, n, b, g)
    np.testing.assert_allclose(g, want, rtol=1e-11, atol=1e-11)
    rho, alpha = rng.uniform(0, 1, d), np.zeros(d)
    g2, index = np.empty(d), np.empty(d, dtype=np.int64)
    dcd_start(indptr, indices, data, coef, shift, colsum, ws, wt, n, b, rho, alpha, 1.0, g2, index)
    np.testing.assert_array_equal(g2, g)


def _ir(dispatcher) -> str:
    """The LLVM IR of ``dispatcher``'s source compiled afresh for the types it was called with (code loaded from
    numba's cache cannot be inspected)."""
    fresh = numba.njit(boundscheck=False)(dispatcher.py_func)
    for sig in dispatcher.signatures:
        fresh.compile(sig)
    return "\n".join(fresh.inspect_llvm().values())


def test_the_hint_is_emitted_where_the_random_reads_are():
    """The kernels compiled above carry the prefetch (a kernel rewritten without it, or a numba that dropped the
    intrinsic, fails here, not only in the benchmarks)."""
    indptr, indices, data, _ = _block(500, 40, 20, seed=1)
    csc_rmatvec(indptr, indices, data, np.ones((500, 1)), np.empty((40, 1)))
    csc_matvec(indptr, indices, data, np.ones((40, 1)), np.zeros((500, 1)))
    for mode, width in ((A_OPTIMAL, 2), (D_OPTIMAL, 1)):
        V = np.ones((500, width), dtype=np.float32)
        greedy_update(indptr, indices, data, None, None, V, np.ones(width), 2.0, 1.0, np.full(40, 3.0),
                      np.zeros(40), np.zeros(40, np.bool_), mode, np.full(40, 1e-12), np.empty(40), np.empty(40))
    ws = np.ones(500)
    dcd_gradient(indptr, indices, data, np.ones(40), np.zeros(40), np.ones(40), ws, np.zeros(2), 500, 0.0,
                 np.empty(40))
    dcd_start(indptr, indices, data, np.ones(40), np.zeros(40), np.ones(40), ws, np.zeros(2), 500, 0.0, np.ones(40),
              np.zeros(40), 1.0, np.empty(40), np.empty(40, dtype=np.int64))
    for fn in (_RMATVEC[1], _MATVEC[1], _update1, _update2, dcd_gradient, dcd_start):
        assert "llvm.prefetch" in _ir(fn), fn
