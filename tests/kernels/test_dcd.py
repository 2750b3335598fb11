"""The DCD kernels of MMFS (``dufs.kernels.dcd``) on their own, against dense NumPy/SciPy references."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import minimize

from dufs.kernels.dcd import _block_order, active_set, dcd_epoch, dcd_gradient, dcd_start, gap_terms


def _problem(seed, m=60, d=30, density=0.2, centred=True):
    """A CSC block, its transform (coef, shift), colsum, qii = ||f_j||^2, the dense F and margins rho."""
    rng = np.random.default_rng(seed)
    A = sp.random_array((m, d), density=density, format="csc", dtype=np.float32, rng=rng)
    A.sort_indices()
    D = A.toarray().astype(np.float64)
    coef = rng.uniform(0.5, 2.0, d)
    shift = rng.uniform(-0.3, 0.3, d) if centred else np.zeros(d)
    F = (D - shift) * coef
    colsum = D.sum(axis=0)
    qii = (F * F).sum(axis=0)
    rho = rng.uniform(0.05, 0.5, d)
    buf = (A.indptr.astype(np.int64), A.indices.astype(np.int32), A.data)
    return buf, coef, shift, colsum, qii, rho, F


class _State:
    """The solver's state at alpha = 0: w = ws + t 1 = 0, bias 0, every coordinate active."""

    def __init__(self, d, m, seed=5):
        self.alpha, self.ws, self.wt, self.bias = np.zeros(d), np.zeros(m), np.zeros(2), np.zeros(1)
        self.index = np.arange(d, dtype=np.int64)
        self.rng = np.array([np.uint64(seed)], dtype=np.uint64)


def _epoch(buf, coef, shift, colsum, qii, rho, s, C, gamma, *, n_active=None, pg=(np.inf, -np.inf), order=0,
           sigma=1.0, update_bias=True):
    m = s.ws.shape[0]
    return dcd_epoch(*buf, coef, shift, colsum, qii, rho, s.alpha, C, gamma, s.ws, s.wt, float(m), s.bias, update_bias,
                     s.index, s.alpha.shape[0] if n_active is None else n_active, np.array(pg), s.rng, order, sigma)


def _dual(F, rho, gamma, alpha):
    """MMFS's dual objective 0.5 ||F alpha||^2 + gamma / 2 (1^T alpha)^2 - rho^T alpha (b = gamma 1^T alpha)."""
    w = F @ alpha
    return 0.5 * w @ w + 0.5 * gamma * alpha.sum() ** 2 - rho @ alpha


def test_dcd_gradient_matches_the_dense_product():
    """out = F^T w + b with w held as ws + t 1 and S = 1^T ws."""
    buf, coef, shift, colsum, _, _, F = _problem(0)
    m, d = F.shape
    rng = np.random.default_rng(1)
    ws, t, b = rng.standard_normal(m), 0.7, -0.3
    out = np.empty(d)
    dcd_gradient(*buf, coef, shift, colsum, ws, np.array([t, ws.sum()]), float(m), b, out)
    np.testing.assert_allclose(out, F.T @ (ws + t) + b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("sigma", [1.0, 3.0])
def test_one_coordinate_step_is_the_exact_clipped_newton_step(sigma):
    """From alpha = 0 (gradient g = b = 0), one coordinate moves to clip(rho_j / (sigma (||f_j||^2 + gamma)), 0,
    C), and (ws, t, S, bias) move by sigma times the change of w = F alpha and b = gamma 1^T alpha."""
    buf, coef, shift, colsum, qii, rho, F = _problem(2)
    m, d = F.shape
    C, gamma = 0.3, 0.5
    for j in (0, 7, d - 1):
        s = _State(d, m)
        s.index[:] = np.roll(np.arange(d), -j)  # index[0] = j
        n_act, _, _, n_upd = _epoch(buf, coef, shift, colsum, qii, rho, s, C, gamma, n_active=1, sigma=sigma)
        want = min(max(rho[j] / (sigma * (qii[j] + gamma)), 0.0), C)
        assert n_act == 1 and n_upd == 1
        np.testing.assert_allclose(s.alpha[j], want, rtol=1e-12)
        assert np.count_nonzero(s.alpha) == 1
        np.testing.assert_allclose(s.ws + s.wt[0], sigma * F @ s.alpha, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(s.wt[1], s.ws.sum(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(s.bias[0], sigma * gamma * s.alpha.sum(), rtol=1e-12)


def test_epochs_keep_w_and_b_equal_to_their_dense_values_and_reach_the_dense_optimum():
    """Epochs (shrinking on, bias moving) keep w = F alpha, S = 1^T ws, b = gamma 1^T alpha, 0 <= alpha <= C;
    they reach the KKT point of the box QP, whose objective L-BFGS-B finds on the dense problem too."""
    buf, coef, shift, colsum, qii, rho, F = _problem(3)
    m, d = F.shape
    C, gamma = 1.0, 0.5
    s = _State(d, m)
    n_act, pg, eps = d, (np.inf, -np.inf), 0.1
    for _ in range(2000):
        n_act, pgmax, pgmin, _ = _epoch(buf, coef, shift, colsum, qii, rho, s, C, gamma, n_active=n_act, pg=pg)
        if pgmax - pgmin <= eps:  # LIBLINEAR's shrinking bookkeeping, as mmfs does it
            if n_act == d and eps < 1e-12:
                break
            if n_act == d:
                eps *= 0.1
            n_act, pg = d, (np.inf, -np.inf)
        else:
            pg = (pgmax if pgmax > 0 else np.inf, pgmin if pgmin < 0 else -np.inf)
    w = F @ s.alpha
    np.testing.assert_allclose(s.ws + s.wt[0], w, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(s.wt[1], s.ws.sum(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(s.bias[0], gamma * s.alpha.sum(), rtol=1e-12)
    assert np.all((s.alpha >= 0) & (s.alpha <= C))
    G = F.T @ w + gamma * s.alpha.sum() - rho  # the dense gradient of the dual
    tol = 1e-9
    assert np.all(G[s.alpha == 0] >= -tol) and np.all(G[s.alpha == C] <= tol)
    inside = (s.alpha > 0) & (s.alpha < C)
    assert inside.any() and np.all(np.abs(G[inside]) <= tol)
    Q = F.T @ F + gamma
    ref = minimize(lambda a: (0.5 * a @ Q @ a - rho @ a, Q @ a - rho), np.zeros(d), jac=True, method="L-BFGS-B",
                   bounds=[(0.0, C)] * d, options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 10_000})
    assert _dual(F, rho, gamma, s.alpha) <= ref.fun + 1e-10
    np.testing.assert_allclose(_dual(F, rho, gamma, s.alpha), ref.fun, rtol=1e-7)


def test_bias_is_held_when_not_updated():
    buf, coef, shift, colsum, qii, rho, F = _problem(4)
    m, d = F.shape
    s = _State(d, m)
    s.bias[0] = 0.25
    _epoch(buf, coef, shift, colsum, qii, rho, s, 1.0, 0.5, update_bias=False)
    assert s.bias[0] == 0.25 and s.alpha.any()
    np.testing.assert_allclose(s.ws + s.wt[0], F @ s.alpha, rtol=1e-10, atol=1e-12)


def test_shrinking_leaves_out_a_coordinate_at_a_bound_pointing_out_of_the_box():
    """alpha_j = 0 with G_j = g_j - rho_j above last epoch's largest projected gradient: moved past n_active,
    not updated; with pg_old = (inf, -inf) nothing is left out."""
    buf, coef, shift, colsum, qii, rho, F = _problem(5, d=6)
    m, d = F.shape
    rho = rho.copy()
    rho[2] = -5.0  # G_2 = g_2 + 5, far above 0.5, whatever the epoch did before it
    s = _State(d, m)
    n_act, _, _, n_upd = _epoch(buf, coef, shift, colsum, qii, rho, s, 1.0, 0.5, pg=(0.5, -0.5))
    assert n_act < d and 2 in s.index[n_act:] and s.alpha[2] == 0.0
    assert sorted(s.index) == list(range(d))
    s = _State(d, m)
    n_act, _, _, _ = _epoch(buf, coef, shift, colsum, qii, rho, s, 1.0, 0.5)
    assert n_act == d


def test_active_set_and_gap_terms_match_numpy():
    rng = np.random.default_rng(6)
    d, C = 200, 0.8
    g, rho = rng.standard_normal(d), rng.uniform(-1, 1, d)
    alpha = rng.choice([0.0, C, 0.3], d)
    for pgmax, pgmin in ((0.2, -0.2), (np.inf, -np.inf), (0.0, 0.0)):
        index = np.full(d, -1, dtype=np.int64)
        k = active_set(g, rho, alpha, C, pgmax, pgmin, index)
        G = g - rho
        keep = ~(((alpha <= 0) & (G > pgmax)) | ((alpha >= C) & (G < pgmin)))
        assert k == keep.sum()
        np.testing.assert_array_equal(index[:k], np.flatnonzero(keep))
    gap, sa, ra = gap_terms(g, rho, alpha, C)
    np.testing.assert_allclose(gap, np.sum(C * np.maximum(0.0, rho - g) + alpha * (g - rho)), rtol=1e-12)
    np.testing.assert_allclose(sa, alpha.sum(), rtol=1e-12)
    np.testing.assert_allclose(ra, rho @ alpha, rtol=1e-12)


def test_dcd_epoch_visit_orders_visit_every_active_coordinate_once():
    """The default call is unchanged (no ``order`` = ``order=0``, bit for bit); storage and block-random orders
    visit each active coordinate once and the solves reach the same dual optimum."""
    rng = np.random.default_rng(1)
    index = rng.permutation(1000).astype(np.int64)
    for order in (-1, 1, 7, 64, 5000):
        ix = index.copy()
        _block_order(ix, 600, 1000, order, np.array([np.uint64(3)], dtype=np.uint64))
        assert sorted(ix[:600]) == sorted(index[:600]) and sorted(ix[600:]) == sorted(index[600:])
        if order < 0:
            assert np.array_equal(ix[:600], np.sort(index[:600]))

    m, d = 300, 200
    A = sp.random_array((m, d), density=0.05, format="csc", dtype=np.float32, rng=rng)
    A.sort_indices()
    ip, ixs, dt = A.indptr.astype(np.int64), A.indices.astype(np.int32), A.data
    coef = 1.0 / np.maximum(np.sqrt(np.asarray((A.multiply(A)).sum(axis=0), dtype=np.float64)), 1e-3)
    shift, colsum = np.zeros(d), np.asarray(A.sum(axis=0), dtype=np.float64) * 1.0
    qii = coef**2 * np.asarray((A.multiply(A)).sum(axis=0), dtype=np.float64)
    rho = rng.uniform(0.05, 0.5, d)

    def solve(order, epochs=300, default=False):
        alpha, ws, wt, bias = np.zeros(d), np.zeros(m), np.zeros(2), np.zeros(1)
        index, r = np.arange(d, dtype=np.int64), np.array([np.uint64(5)], dtype=np.uint64)
        pg = np.array([np.inf, -np.inf])
        n_act = d
        for _ in range(epochs):
            args = (ip, ixs, dt, coef, shift, colsum, qii, rho, alpha, 1.0, 1.0, ws, wt, float(m), bias, True, index,
                    n_act, pg, r)
            n_act, pgmax, pgmin, _ = dcd_epoch(*args) if default else dcd_epoch(*args, order)
            n_act, pg = d, np.array([np.inf, -np.inf])  # no shrinking: the order alone differs
        g = np.empty(d)
        dcd_gradient(ip, ixs, dt, coef, shift, colsum, ws, wt, float(m), bias[0], g)
        gap, _, ra = gap_terms(g, rho, alpha, 1.0)
        obj = 0.5 * float(ws @ ws) + 0.5 * bias[0] ** 2 - ra
        return alpha, obj, gap

    a0, o0, g0 = solve(0, epochs=5, default=True)
    a1, o1, g1 = solve(0, epochs=5)
    assert np.array_equal(a0, a1) and o0 == o1
    ref = solve(0)[1]
    for order in (-1, 16, 64):
        _, obj, gap = solve(order)
        assert gap <= 1e-8 * max(abs(obj), 1.0)
        np.testing.assert_allclose(obj, ref, rtol=1e-9, atol=1e-12)


def test_dcd_start_is_the_gradient_the_gap_terms_and_the_working_set():
    """One sweep gives what the three kernels give apart (bit for bit), and the gradient against the dense product;
    the working set is every coordinate not at a bound with its exact gradient pointing out of the box."""
    buf, coef, shift, colsum, _, rho, F = _problem(8, m=80, d=120)
    m, d = F.shape
    rng = np.random.default_rng(9)
    C = 0.7
    ws, t, b = rng.standard_normal(m), 0.3, 0.1
    wt = np.array([t, ws.sum()])
    alpha = rng.choice([0.0, C, 0.2], d)
    g, index = np.full(d, np.nan), np.full(d, -1, dtype=np.int64)
    gap, sa, ra, k = dcd_start(*buf, coef, shift, colsum, ws, wt, float(m), b, rho, alpha, C, g, index)
    g2 = np.empty(d)
    dcd_gradient(*buf, coef, shift, colsum, ws, wt, float(m), b, g2)
    assert np.array_equal(g, g2)
    np.testing.assert_allclose(g, F.T @ (ws + t) + b, rtol=1e-10, atol=1e-10)
    assert (gap, sa, ra) == gap_terms(g2, rho, alpha, C)
    index2 = np.empty(d, dtype=np.int64)
    k2 = active_set(g2, rho, alpha, C, 0.0, -0.0, index2)
    G = g2 - rho
    assert k == k2 == np.sum(~(((alpha <= 0) & (G > 0)) | ((alpha >= C) & (G < 0)))) and 0 < k < d
    np.testing.assert_array_equal(index[:k], index2[:k2])


@pytest.mark.parametrize("b", [0.0, 0.25, -0.4])
def test_dcd_start_at_zero_reads_no_data_and_gives_the_sweeps_numbers(b):
    """At w = 0 (a cold start's first round) the start without the sweep gives the sweep's numbers, bit for bit:
    g = b (the dense product F^T 0 + b), the gap terms and the working set; with the data unreadable (NaN values,
    which the sweep would carry into g) it still does, so the nonzeros are not read."""
    buf, coef, shift, colsum, _, rho, F = _problem(8, m=80, d=120)
    m, d = F.shape
    C = 0.7
    alpha = np.random.default_rng(5).choice([0.0, C, 0.2], d)
    ws, wt = np.zeros(m), np.zeros(2)
    got = []
    for at_zero, data in ((False, buf[2]), (True, buf[2]), (True, np.full_like(buf[2], np.nan))):
        g, index = np.full(d, np.nan), np.full(d, -1, dtype=np.int64)
        terms = dcd_start(buf[0], buf[1], data, coef, shift, colsum, ws, wt, float(m), b, rho, alpha, C, g, index,
                          at_zero)
        got.append((g, terms, index[:terms[3]].copy()))
    np.testing.assert_array_equal(got[0][0], F.T @ ws + b)
    for g, terms, index in got[1:]:
        assert np.array_equal(g, got[0][0]) and terms == got[0][1]
        np.testing.assert_array_equal(index, got[0][2])


@pytest.mark.parametrize("standardize", [None, "scale", "zscore"])
def test_mmfs_geometry_sweep_equals_the_numpy_expressions(standardize):
    """The one-sweep geometry gives the NumPy expressions' numbers bit for bit, constant, empty-variance and
    rounding-negative features included, and for statistics over no rows."""
    from dufs.engine.stats import ColumnStats
    from dufs.methods.mmfs.problem import _geometry_numpy, _geometry_of

    rng = np.random.default_rng(3)
    d = 400
    s = rng.standard_normal(d) * 50
    ss = rng.uniform(0, 1e4, d)
    m2 = rng.uniform(0, 1e3, d)
    m2[:10] = -1e-13  # a centred sum of squares rounded below 0
    m2[10:20] = 0.0
    mn, mx = rng.uniform(-2, 0, d), rng.uniform(0, 2, d)
    mx[20:40] = mn[20:40]  # constant features
    for n_rows in (1234, 0):
        st = ColumnStats(n_rows, s, ss, np.zeros(d, dtype=np.int64), mn, mx, m2)
        got, want = _geometry_of(st, 1234, standardize, d), _geometry_numpy(st, 1234, standardize, d)
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
            assert np.array_equal(np.signbit(got[k]), np.signbit(want[k])), k
