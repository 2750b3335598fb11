"""The greedy selectors' kernels (``dufs.kernels.greedy``) on their own, against dense NumPy references.

The per-candidate update is driven here by a dense driver written in NumPy (the driver's side of
``dufs.methods.greedy``): after every step the kernel's numbers must equal, for every unselected candidate g, the
dense formulas of docs/methods.md on G = Z^T B Z + lambda2 I and H = G_SS: the Schur complement
s_g = G_gg - G_gS H^-1 G_Sg, and v_g = ||H^-1 G_Sg||^2 (LapAOFS) or ||E_g||^2 with E = Z^T Y - G_.S H^-1 Z_S^T Y
(JCFS).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dufs.kernels.greedy import A_OPTIMAL, D_OPTIMAL, JCFS, best, greedy_update, score, xwx_anchor, xwx_graph

TOL = {"rtol": 1e-9, "atol": 1e-9}


def _block(seed, n=40, d=25, density=0.3):
    rng = np.random.default_rng(seed)
    A = sp.random_array((n, d), density=density, format="csc", dtype=np.float32, rng=rng)
    A.sort_indices()
    coef = rng.uniform(0.5, 2.0, d)
    shift = rng.uniform(-0.3, 0.3, d)
    Z = (A.toarray().astype(np.float64) - shift) * coef
    return (A.indptr.astype(np.int64), A.indices.astype(np.int32), A.data), coef, shift, Z, rng


def _graph(rng, n, density=0.2):
    """A symmetric non-negative n x n affinity with an empty diagonal (SciPy CSR) and its dense Laplacian."""
    D = np.triu(rng.random((n, n)) * (rng.random((n, n)) < density), 1)
    D = D + D.T
    return sp.csr_array(D), np.diag(D.sum(axis=1)) - D


def _dense_numbers(G, Z, Y, S, mode):
    """(s, v) of every feature for the selected list S, from the dense G."""
    d = G.shape[0]
    if not S:
        s = np.diag(G).copy()
        v = (Z.T @ Y) ** 2 @ np.ones(Y.shape[1]) if mode == JCFS else np.zeros(d)
        return s, v
    H = G[np.ix_(S, S)]
    HinvGS = np.linalg.solve(H, G[S, :])
    s = np.diag(G) - np.einsum("ij,ij->j", G[S, :], HinvGS)
    if mode == A_OPTIMAL:
        v = (HinvGS**2).sum(axis=0)
    elif mode == JCFS:
        E = Z.T @ Y - HinvGS.T @ (Z[:, S].T @ Y)
        v = (E**2).sum(axis=1)
    else:
        v = np.zeros(d)
    return s, v


def _dense_best(mode, s, v, selected, tiny):
    with np.errstate(divide="ignore", invalid="ignore"):  # the selected ones: s = 0
        sc = {A_OPTIMAL: -(1.0 + v) / s, D_OPTIMAL: s, JCFS: v / s}[mode]
    sc = np.where(s > tiny, sc, -np.inf)
    sc[selected] = np.nan
    free = np.flatnonzero(~selected)
    j = free[np.argmax(sc[free])]  # the first maximum: ties to the lower index
    return j, sc[j]


@pytest.mark.parametrize("mode", [A_OPTIMAL, D_OPTIMAL, JCFS])
def test_greedy_update_keeps_the_dense_schur_complements(mode):
    buf, coef, shift, Z, rng = _block(mode)
    n, d = Z.shape
    if mode == JCFS:  # B = I, lambda2 = gamma
        Bm, lam2, Y = np.eye(n), 0.5, rng.standard_normal((n, 3))
    else:  # B = I + lambda1 L
        _, L = _graph(rng, n)
        Bm, lam2, Y = np.eye(n) + 0.3 * L, 0.1, np.zeros((n, 1))
    G = Z.T @ Bm @ Z + lam2 * np.eye(d)
    s, v = _dense_numbers(G, Z, Y, [], mode)
    selected = np.zeros(d, dtype=np.bool_)
    tiny = 1e-12 * s
    p, _ = _dense_best(mode, s, v, selected, tiny)
    S: list[int] = []
    for _ in range(8):
        # the driver's part, dense: c = H^-1 G_Sp, s_p, r = z_p - Z_S c and the update vectors
        c = np.linalg.solve(G[np.ix_(S, S)], G[S, p]) if S else np.zeros(0)
        s_p = G[p, p] - G[S, p] @ c
        r = Z[:, p] - Z[:, S] @ c
        if mode == A_OPTIMAL:
            d_ = np.linalg.solve(G[np.ix_(S, S)], c) if S else np.zeros(0)
            V, c2 = np.column_stack([Bm @ r, Bm @ (Z[:, S] @ d_)]), float(c @ c) + 1.0
        elif mode == D_OPTIMAL:
            V, c2 = (Bm @ r)[:, None], 0.0
        else:
            RS = Z[:, S].T @ Y
            Ep = Z[:, p] @ Y - c @ RS
            q = Y @ Ep - Z[:, S] @ (np.linalg.solve(G[np.ix_(S, S)], RS @ Ep) if S else np.zeros(0))
            V, c2 = np.column_stack([r, q]), float(Ep @ Ep)
        V = np.ascontiguousarray(V)
        selected[p] = True
        S.append(p)
        v_before = v.copy()
        j, sc = greedy_update(*buf, coef, shift, V, V.sum(axis=0), s_p, c2, s, v, selected, mode, tiny)
        s_ref, v_ref = _dense_numbers(G, Z, Y, S, mode)
        np.testing.assert_allclose(s[~selected], s_ref[~selected], **TOL)
        if mode == D_OPTIMAL:
            assert np.array_equal(v, v_before)  # LapDOFS keeps s only
        else:
            np.testing.assert_allclose(v[~selected], v_ref[~selected], **TOL)
        jr, scr = _dense_best(mode, s_ref, v_ref, selected, tiny)
        assert j == jr and sc == pytest.approx(scr, rel=1e-9)
        p = j


def test_greedy_update_two_vectors_is_the_documented_formula():
    """With a_j = z_j^T V[:, 0], b_j = z_j^T V[:, 1], l = a_j / sqrt(sp), e = l / sqrt(sp): s_j -= l^2 and
    v_j += -2 e b_j + e^2 c2 for every unselected j; the selected ones are left alone."""
    buf, coef, shift, Z, rng = _block(7)
    n, d = Z.shape
    V = rng.standard_normal((n, 2))
    s0, v0 = rng.uniform(1.0, 2.0, d), rng.uniform(0.0, 1.0, d)
    selected = rng.random(d) < 0.3
    sp_, c2 = 1.7, 0.6
    for mode in (A_OPTIMAL, JCFS, D_OPTIMAL):
        s, v = s0.copy(), v0.copy()
        greedy_update(*buf, coef, shift, V, V.sum(axis=0), sp_, c2, s, v, selected, mode, np.zeros(d))
        a, b = Z.T @ V[:, 0], Z.T @ V[:, 1]
        e = a / sp_
        np.testing.assert_allclose(s, np.where(selected, s0, s0 - a * a / sp_), **TOL)
        want_v = v0 if mode == D_OPTIMAL else np.where(selected, v0, v0 - 2 * e * b + e * e * c2)
        np.testing.assert_allclose(v, want_v, **TOL)


def test_score_and_best():
    inf = np.inf
    assert score(A_OPTIMAL, 2.0, 3.0, 0.0) == -2.0
    assert score(D_OPTIMAL, 2.0, 3.0, 0.0) == 2.0
    assert score(JCFS, 2.0, 3.0, 0.0) == 1.5
    for mode in (A_OPTIMAL, D_OPTIMAL, JCFS):
        assert score(mode, 1e-20, 3.0, 1e-12) == -inf  # in the span of the selected ones, to rounding
        assert score(mode, 1e-12, 3.0, 1e-12) == -inf
        assert score(mode, np.nan, 3.0, 1e-12) == -inf
    s = np.array([1.0, 3.0, 3.0, 3.0, 2.0])
    v, tiny = np.zeros(5), np.zeros(5)
    assert best(D_OPTIMAL, s, v, np.zeros(5, np.bool_), tiny) == (1, 3.0)  # ties to the lower index
    assert best(D_OPTIMAL, s, v, np.array([0, 1, 0, 0, 0], np.bool_), tiny) == (2, 3.0)
    assert best(D_OPTIMAL, s, v, np.ones(5, np.bool_), tiny) == (-1, -inf)
    # every free candidate at -inf: the first free one, with -inf
    assert best(D_OPTIMAL, s, v, np.array([1, 0, 0, 0, 0], np.bool_), np.full(5, 10.0)) == (1, -inf)


def test_xwx_graph_and_anchor_match_the_dense_quadratic_forms():
    buf, _, _, _, rng = _block(8, n=50, d=30)
    n = 50
    X = sp.csc_array((buf[2], buf[1], buf[0]), shape=(n, 30)).toarray().astype(np.float64)
    W, _ = _graph(rng, n)
    scratch = np.zeros(n)
    got = xwx_graph(*buf, W.indptr, W.indices, W.data.astype(np.float64), scratch)
    np.testing.assert_allclose(got, np.einsum("ij,ij->j", X, W.toarray() @ X), **TOL)
    assert not scratch.any()  # left zeroed
    Zh = sp.random_array((n, 12), density=0.25, format="csr", rng=rng)
    lam_inv = rng.uniform(0.1, 2.0, 12)
    got = xwx_anchor(*buf, Zh.indptr, Zh.indices, Zh.data.astype(np.float64), lam_inv)
    Wa = Zh.toarray() @ np.diag(lam_inv) @ Zh.toarray().T
    np.testing.assert_allclose(got, np.einsum("ij,ij->j", X, Wa @ X), **TOL)


@pytest.mark.parametrize("cols", [1, 2])
def test_greedy_update_into_other_arrays_leaves_its_inputs(cols):
    """Given s_out and v_out, the step reads s and v and writes the documented update there (the selected
    candidates copied through), leaving s and v as they were (a task that runs again sees the same state), and picks
    the best candidate of the updated numbers (the dense choice)."""
    buf, coef, shift, Z, rng = _block(11)
    n, d = Z.shape
    V = np.ascontiguousarray(rng.standard_normal((n, cols)))
    s0, v0 = rng.uniform(1.0, 2.0, d), rng.uniform(0.0, 1.0, d)
    selected = rng.random(d) < 0.3
    sp_, c2 = 1.7, 0.6
    for mode in ((D_OPTIMAL,) if cols == 1 else (A_OPTIMAL, JCFS, D_OPTIMAL)):
        s, v = s0.copy(), v0.copy()
        s_out, v_out = np.full(d, np.nan), np.full(d, np.nan)
        j, sc = greedy_update(*buf, coef, shift, V, V.sum(axis=0), sp_, c2, s, v, selected, mode, np.zeros(d),
                              s_out, v_out)
        assert np.array_equal(s, s0) and np.array_equal(v, v0)
        a = Z.T @ V[:, 0]
        np.testing.assert_allclose(s_out, np.where(selected, s0, s0 - a * a / sp_), **TOL)
        if mode == D_OPTIMAL and cols == 1:  # LapDOFS's one-vector step keeps v: v_out is not written
            assert np.all(np.isnan(v_out))
            v_out = v
        elif mode == D_OPTIMAL:
            assert np.array_equal(v_out, v0)
        else:
            b, e = Z.T @ V[:, 1], a / sp_
            np.testing.assert_allclose(v_out, np.where(selected, v0, v0 - 2 * e * b + e * e * c2), **TOL)
        jr, scr = _dense_best(mode, s_out, v_out, selected, np.zeros(d))
        assert j == jr and sc == pytest.approx(scr, rel=1e-12)


@pytest.mark.parametrize("cols", [1, 2])
def test_greedy_update_without_a_transform_is_the_raw_columns(cols):
    """coef and shift None (standardize=None): the update along the raw columns z_j = x_j, against dense NumPy."""
    buf, _, _, _, rng = _block(13)
    X = sp.csc_array((buf[2], buf[1], buf[0])).toarray().astype(np.float64)
    n, d = X.shape
    V = np.ascontiguousarray(rng.standard_normal((n, cols)))
    s0, v0 = rng.uniform(5.0, 6.0, d), rng.uniform(0.0, 1.0, d)
    selected = rng.random(d) < 0.3
    sp_, c2 = 1.7, 0.6
    for mode in ((D_OPTIMAL,) if cols == 1 else (A_OPTIMAL, JCFS)):
        s, v = s0.copy(), v0.copy()
        j, sc = greedy_update(*buf, None, None, V, V.sum(axis=0), sp_, c2, s, v, selected, mode, np.zeros(d))
        a = X.T @ V[:, 0]
        np.testing.assert_allclose(s, np.where(selected, s0, s0 - a * a / sp_), **TOL)
        if cols == 2:
            b, e = X.T @ V[:, 1], a / sp_
            np.testing.assert_allclose(v, np.where(selected, v0, v0 - 2 * e * b + e * e * c2), **TOL)
        else:
            assert np.array_equal(v, v0)
        jr, scr = _dense_best(mode, s, v, selected, np.zeros(d))
        assert j == jr and sc == pytest.approx(scr, rel=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_selected_columns_products_by_row_tiles_in_threads(monkeypatch, dtype):
    """The driver's products with the selected columns (``SelectedColumns.apply`` / ``tapply``: row tiles, thread
    ranges) against SciPy's on an array of several tiles, the transform included, on 1 and 3 threads, with columns
    of one value among them."""
    from dufs.kernels.greedy import TILE_ROWS
    from dufs.methods.greedy import columns as G

    rng = np.random.default_rng(5)
    n, k = 2 * TILE_ROWS + 777, 7
    sizes = [1, 5, 3000, 40_000, TILE_ROWS, 2 * TILE_ROWS, 90]  # one column runs through every tile
    rows = [np.sort(rng.choice(n, size=s, replace=False)).astype(np.int32) for s in sizes]
    vals = [rng.standard_normal(s).astype(dtype) for s in sizes]
    vals[3][:] = 1.0  # binary columns (and one of another single value) go to the kernels as their value alone
    vals[5][:] = 2.5
    coef, shift = rng.uniform(0.5, 2.0, k), rng.uniform(-0.3, 0.3, k)
    X = sp.csc_array((np.concatenate(vals), np.concatenate(rows), np.r_[0, np.cumsum(sizes)]), shape=(n, k))
    for threads in (1, 3):
        monkeypatch.setattr(G, "_DRIVER_THREADS", threads)
        S = G.SelectedColumns(n, 0.1, dtype)
        for t in range(k):
            S.append(t, (rows[t], vals[t]), coef[t], shift[t])
        assert [d.shape[0] for d in S._numba_lists()[1]] == [1, 5, 3000, 1, TILE_ROWS, 1, 90]
        for p in (1, 2, 3):
            c = rng.standard_normal((k, p))
            want = X @ (coef[:, None] * c) - (shift * coef) @ c
            out = np.full((n, p), np.nan)
            np.testing.assert_allclose(S.apply(c, out=out), want, rtol=1e-12, atol=1e-12)
            V = rng.standard_normal((n, p))
            want_t = coef[:, None] * (X.T @ V - shift[:, None] * V.sum(axis=0)[None, :])
            np.testing.assert_allclose(S.tapply(V), want_t, rtol=1e-10, atol=1e-10)
        c1 = rng.standard_normal(k)  # a vector gives a vector
        np.testing.assert_allclose(S.apply(c1), X @ (coef * c1) - (shift * coef) @ c1, rtol=1e-12, atol=1e-12)


def test_anchor_b_is_the_documented_formula():
    from dufs.kernels.greedy import anchor_b

    rng = np.random.default_rng(2)
    n = 50
    z, wd = rng.standard_normal(n), rng.uniform(1, 2, n)
    Y, WY = rng.standard_normal((n, 2)), rng.standard_normal((n, 2))
    want = wd[:, None] * np.column_stack([z - Y[:, 0], Y[:, 1]]) - 0.3 * WY
    for dtype, tol in ((np.float64, 1e-15), (np.float32, 1e-6)):
        out = np.empty((n, 2), dtype=dtype)
        anchor_b(z, Y, wd, WY, 0.3, out, 0, 20)
        anchor_b(z, Y, wd, WY, 0.3, out, 20, n)
        np.testing.assert_allclose(out, want, rtol=tol, atol=tol)


def _anchor_Zh(n, m, seed):
    """A CSR anchor weight matrix like the graph's: 3 anchors a row (some rows none), rows summing to 1."""
    rng = np.random.default_rng(seed)
    rows, cols, vals = [], [], []
    for i in range(n):
        if i % 7 == 3:
            continue
        a = rng.choice(m, size=3, replace=False)
        w = rng.uniform(0.1, 1.0, 3)
        rows += [i] * 3
        cols += a.tolist()
        vals += (w / w.sum()).tolist()
    return sp.csr_array((vals, (rows, cols)), shape=(n, m))


@pytest.mark.parametrize("coef", [1.0, 0.37])
def test_anchor_zt_column_is_scipy_over_the_dense_column(coef):
    from dufs.kernels.greedy import anchor_zt_column

    n, m = 400, 16
    Zh = _anchor_Zh(n, m, 3)
    rng = np.random.default_rng(4)
    rows = np.sort(rng.choice(n, size=60, replace=False)).astype(np.int32)
    vals = rng.standard_normal(60).astype(np.float32)
    z = np.zeros(n)
    z[rows] = vals
    z *= coef
    out = np.full(m, np.nan)
    anchor_zt_column(Zh.indptr, Zh.indices, Zh.data, rows, vals, coef, out)
    np.testing.assert_allclose(out, Zh.T @ z, rtol=1e-13, atol=1e-15)
    anchor_zt_column(Zh.indptr, Zh.indices, Zh.data, rows[:0], vals[:0], coef, out)  # an empty column
    np.testing.assert_array_equal(out, np.zeros(m))


@pytest.mark.parametrize("coef", [1.0, 0.37])
def test_sparse_z_is_the_dense_column_and_its_diagonal_product(coef):
    """z = coef x at x's rows of a kept n-vector (the last column's rows zeroed first), wd z at those rows and
    z^T diag(wd) z: the dense NumPy numbers."""
    from dufs.kernels.greedy import sparse_z

    rng = np.random.default_rng(9)
    n = 500
    wd = rng.uniform(1, 2, n)
    z = np.zeros(n)
    last = np.zeros(0, dtype=np.int32)
    for size in (120, 40, 0, 300):
        rows = np.sort(rng.choice(n, size=size, replace=False)).astype(np.int32)
        vals = rng.standard_normal(size).astype(np.float32)
        dense = np.zeros(n)
        dense[rows] = vals
        dense *= coef
        wz = np.full(size, np.nan)
        got = sparse_z(rows, vals, coef, wd, last, z, wz)
        np.testing.assert_array_equal(z, dense)
        np.testing.assert_array_equal(wz, (wd * dense)[rows])
        assert got == pytest.approx(float(dense @ (wd * dense)), rel=1e-12, abs=1e-300)
        last = rows


def test_anchor_step_bits_is_b_of_the_documented_vectors():
    """out = diag(wd) [z - y_0, y_1] - lam1 Zh P with y = Y + (the rows' byte-table sums) - offset, P given: dense
    NumPy on the same numbers, the tables from a bit mask of random rows (more than one byte of slots), with Y and
    without it."""
    from dufs.kernels.greedy import anchor_step_bits, bits_tables

    n, m, slots = 300, 12, 11
    Zh = _anchor_Zh(n, m, 5)
    rng = np.random.default_rng(6)
    z, wd = rng.standard_normal(n), rng.uniform(1, 2, n)
    mask = rng.random((n, slots)) < 0.4
    w8 = np.zeros((n, 8), dtype=np.uint8)  # one uint64 word a row, as bytes
    for s_ in range(slots):
        w8[:, s_ // 8] |= (mask[:, s_] << (s_ % 8)).astype(np.uint8)
    for p in (1, 2):
        ws, P, offset = rng.standard_normal((slots, p)), rng.standard_normal((m, p)), rng.standard_normal(p)
        T = bits_tables(ws)
        assert T.shape == (2, 256, p)
        for Y in (rng.standard_normal((n, p)), np.zeros((0, p))):
            y = (Y if Y.shape[0] else 0.0) + mask @ ws - offset
            y[:, 0] = z - y[:, 0]
            want = wd[:, None] * y - 0.3 * (Zh.toarray() @ P)
            for dtype, tol in ((np.float64, 1e-13), (np.float32, 1e-6)):
                out = np.empty((n, p), dtype=dtype)
                anchor_step_bits(Zh.indptr, Zh.indices, Zh.data, P, z, Y, w8, T, offset, wd, 0.3, out, 0, 111)
                anchor_step_bits(Zh.indptr, Zh.indices, Zh.data, P, z, Y, w8, T, offset, wd, 0.3, out, 111, n)
                np.testing.assert_allclose(out, want, rtol=tol, atol=tol)


def test_selected_columns_bit_mask_products_and_heads():
    """Selected columns in the bit mask (binary, at least n / 32 rows: over 64 of them, two words a row) beside
    columns by their rows (valued; binary but sparse): Z_S c, Z_S^T V and Z_S^T y over a sparse y's rows against
    SciPy, the transform included; a head (the first t columns, sharing the mask) gives the head's products, also
    with a column added to it (a different one than the full set's next, by its rows), and leaves the full set's
    mask as it was."""
    from dufs.methods.greedy import columns as G

    rng = np.random.default_rng(11)
    n, k = 3000, 72
    sizes = rng.integers(n // 32, n // 2, k)
    sizes[[3, 17, 40]] = [20, 50, 7]  # too few rows for the mask
    rows = [np.sort(rng.choice(n, size=s, replace=False)).astype(np.int32) for s in sizes]
    vals = [np.full(s, 1.0 if t % 3 else 0.5, dtype=np.float32) for t, s in enumerate(sizes)]
    for t in (5, 33, 66):  # valued
        vals[t] = rng.standard_normal(sizes[t]).astype(np.float32)
    coef, shift = rng.uniform(0.5, 2.0, k), rng.uniform(-0.3, 0.3, k)
    shift[::4] = 0.0
    X = sp.csc_array((np.concatenate(vals).astype(np.float64), np.concatenate(rows), np.r_[0, np.cumsum(sizes)]),
                     shape=(n, k))
    S = G.SelectedColumns(n, 0.1, np.float32)
    for t in range(k):
        S.append(t, (rows[t], vals[t]), coef[t], shift[t])
    assert S.slots == k - 6 > 64 and S._words.shape == (n, 2)

    def check(S, t):
        Xt = X[:, :t]
        for p in (1, 2):
            c = rng.standard_normal((t, p))
            np.testing.assert_allclose(S.apply(c), Xt @ (coef[:t, None] * c) - (shift[:t] * coef[:t]) @ c,
                                       rtol=1e-11, atol=1e-11)
            V = rng.standard_normal((n, p))
            np.testing.assert_allclose(S.tapply(V), coef[:t, None] * (Xt.T @ V - shift[:t, None] * V.sum(axis=0)),
                                       rtol=1e-10, atol=1e-10)
        yr = np.sort(rng.choice(n, size=400, replace=False))
        y = np.zeros(n)
        y[yr] = rng.standard_normal(400)
        np.testing.assert_allclose(S.tapply_rows(yr, y[yr], y), coef[:t] * (Xt.T @ y - shift[:t] * y.sum()),
                                   rtol=1e-10, atol=1e-10)

    check(S, k)
    words = S._words.copy()
    head = S.head(50)
    check(head, 50)
    head.append(99, (rows[60], vals[60]), coef[60], shift[60])  # not the full set's column 50
    assert np.array_equal(S._words, words) and head.slots == 45
    X = sp.hstack([X[:, :50], X[:, [60]]]).tocsc()
    coef, shift = np.r_[coef[:50], coef[60]], np.r_[shift[:50], shift[60]]
    check(head, 51)


