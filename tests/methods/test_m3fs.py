"""M3FS, the faithful solver (paper 000): the SOCP steps against independent CVXPY formulations of (9) and (17),
Proposition 4 at the result, the closed-form sigma step against a generic convex solver, and the paper's iris
(Figure 1) and digits1v7 (Table 2) outcomes."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

cp = pytest.importorskip("cvxpy")

from dufs.errors import ParameterError  # noqa: E402
from dufs.evaluate import clustering_accuracy  # noqa: E402
from dufs.methods.m3fs.faithful import (  # noqa: E402
    _Master,
    _psd_factor,
    _rows,
    m3fs_faithful,
    most_violated,
    objective,
)
from dufs.methods.m3fs.problem import m3fs_laplacian, sigma_step  # noqa: E402


def _standardise(X):
    sd = X.std(axis=0)
    return (X - X.mean(axis=0)) / np.where(sd > 0, sd, 1.0)


def _blobs(n_per, centres, d, seed):
    rng = np.random.default_rng(seed)
    X = np.vstack([rng.normal(size=(n_per, d)) * 0.25 + np.r_[c, np.zeros(d - len(c))] for c in centres])
    y = np.repeat(np.arange(len(centres)), n_per)
    return _standardise(X), y


def _solve(prob):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        prob.solve(solver="CLARABEL", tol_gap_abs=1e-9, tol_gap_rel=1e-9, tol_feas=1e-9)
    if prob.status != "optimal":  # too tight for this instance: Clarabel's defaults (1e-8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            prob.solve(solver="CLARABEL")
    assert prob.status in ("optimal", "optimal_inaccurate")
    return prob.value


# ------------------------------------------------------------------------------------------ (c) sigma step
@pytest.mark.parametrize("seed", range(6))
def test_sigma_step_matches_a_generic_convex_solver(seed):
    rng = np.random.default_rng(seed)
    d = int(rng.integers(3, 12))
    M = int(rng.integers(1, 4))
    V = rng.normal(size=(M, d)) * rng.uniform(0.01, 3.0, size=d)
    V[:, rng.integers(d)] = 0.0
    m = float(rng.integers(1, d))
    a = np.einsum("pk,pk->k", V, V)
    s = cp.Variable(d)
    cost = cp.sum([cp.quad_over_lin(np.sqrt(a[k]), s[k]) for k in range(d)])
    best = _solve(cp.Problem(cp.Minimize(cost), [s >= 0, s <= 1, cp.sum(s) == m]))
    ours = sigma_step(V if M > 1 else V[0], m)
    assert ours.sum() == pytest.approx(m, rel=1e-12)
    assert np.all((ours >= 0) & (ours <= 1))
    val = float(np.sum(np.where(a > 0, a / np.where(ours > 0, ours, 1.0), 0.0)))
    assert val == pytest.approx(best, rel=1e-6)
    if np.count_nonzero(a) > m:  # otherwise any split of the spare mass over the a_k = 0 features is optimal
        assert np.abs(ours - s.value).max() < 1e-4


def test_sigma_step_edge_cases():
    assert np.array_equal(sigma_step(np.array([0.0, 3.0, 0.0, 1.0]), 2), [0.0, 1.0, 0.0, 1.0])
    np.testing.assert_allclose(sigma_step(np.array([0.0, 3.0, 0.0, 0.0]), 2), [1 / 3, 1.0, 1 / 3, 1 / 3])
    np.testing.assert_allclose(sigma_step(np.zeros(4), 2), [0.5] * 4)
    np.testing.assert_allclose(sigma_step(np.array([10.0, 1.0, 1.0]), 2), [1.0, 0.5, 0.5])
    with pytest.raises(ParameterError, match="'m' parameter of sigma_step"):
        sigma_step(np.ones(3), 4)


# ------------------------------------------------------------------------------------------ (a) master problem
def _independent_9(X, L, omega, z, C, lam, m, l_):
    """Problem (9) written directly: quad_over_lin terms, the n x n quadratic form with L, constraints from c."""
    n, d = X.shape
    v, b, xi, sg = cp.Variable(d), cp.Variable(), cp.Variable(), cp.Variable(d)
    f = X @ v + b
    cons = [xi >= 0, sg >= 0, sg <= 1, cp.sum(sg) == m, cp.sum(f) <= l_, cp.sum(f) >= -l_]
    for c in omega:
        cons.append(cp.sum(cp.multiply(c * z, f)) / n >= c.sum() / n - xi)
    reg = cp.sum([cp.quad_over_lin(v[k], sg[k]) for k in range(d)])
    obj = 0.5 * reg + C * xi + lam * cp.quad_form(f, cp.psd_wrap(L))
    return _solve(cp.Problem(cp.Minimize(obj), cons))


def _independent_17(X, L, omega, z, C, lam, m, l_, M):
    """The CCCP step (17) written directly per sample: F_iz - F_ir + [r == z] for c_i = e_r."""
    n, d = X.shape
    V, xi, sg = cp.Variable((M, d)), cp.Variable(), cp.Variable(d)
    F = X @ V.T
    cons = [xi >= 0, sg >= 0, sg <= 1, cp.sum(sg) == m]
    tot = cp.sum(F, axis=0)
    cons += [tot[p] - tot[q] <= l_ for p in range(M) for q in range(M) if p != q]
    for c in omega:
        terms = [F[i, z[i]] - F[i, c[i]] + float(c[i] == z[i]) for i in range(n) if c[i] >= 0]
        cons.append(cp.sum(cp.hstack(terms)) / n >= np.sum(c >= 0) / n - xi)
    reg = cp.sum([cp.quad_over_lin(V[:, k], sg[k]) for k in range(d)])
    man = cp.sum([cp.quad_form(F[:, p], cp.psd_wrap(L)) for p in range(M)])
    return _solve(cp.Problem(cp.Minimize(0.5 * reg + C * xi + lam * man), cons))


def _ours(X, L, omega, z, C, lam, m, l_, M):
    n, d = X.shape
    Aug = np.hstack([X, np.ones((n, 1))]) if M == 2 else X
    master = _Master(len(omega), d, M, _psd_factor(Aug.T @ L @ Aug), X.sum(axis=0), n, C, lam, m, l_)
    return master.solve(*_rows(X, list(omega), z, M))


@pytest.mark.parametrize("lam", [0.0, 0.05])
def test_two_class_socp_step_matches_independent_problem_9(lam):
    X, _ = _blobs(15, [[2.0, 0.0], [-2.0, 0.0]], 6, seed=1)
    n = X.shape[0]
    C, m, l_ = 5.0, 2, 0.1 * n
    res = m3fs_faithful(X, n_features=m, C=C, lambda_=lam, l=l_, graph="knn", n_neighbors=5)
    L = m3fs_laplacian(X, graph="knn", n_neighbors=5)
    omega, z = res.diagnostics["working_set"], res.diagnostics["last_z"]
    assert len(omega) >= 1
    ref = _independent_9(X, L, omega, z, C, lam, m, l_)
    assert _ours(X, L, omega, z, C, lam, m, l_, 2) == pytest.approx(ref, rel=1e-5)
    # at the CCCP fixed point (signs unchanged), the result's objective of (7) is the optimum of (9)
    f = X @ res.v + res.b
    if np.array_equal(np.where(f >= 0, 1.0, -1.0), z):
        assert res.objective == pytest.approx(ref, rel=1e-5)
    # the result's objective is (7) evaluated at its point
    reg = np.sum(np.where(res.v != 0, res.v**2 / np.where(res.sigma > 0, res.sigma, 1), 0.0))
    assert res.objective == pytest.approx(0.5 * reg + C * res.xi + lam * f @ L @ f, rel=1e-9)
    # a working set with a different sign pattern: still the same problem
    rng = np.random.default_rng(0)
    z2 = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    om2 = (rng.random((3, n)) < 0.6).astype(np.int64)
    assert _ours(X, L, om2, z2, C, lam, m, l_, 2) == pytest.approx(_independent_9(X, L, om2, z2, C, lam, m, l_),
                                                                 rel=1e-5)


def test_three_class_socp_step_matches_independent_problem_17():
    X, _ = _blobs(10, [[2.5, 0.0], [-2.5, 0.0], [0.0, 3.0]], 5, seed=2)
    n = X.shape[0]
    C, lam, m, l_, M = 5.0, 0.01, 2, 0.1 * n, 3
    L = m3fs_laplacian(X)
    res = m3fs_faithful(X, n_features=m, C=C, lambda_=lam, l=l_, n_clusters=M)
    omega, z = res.diagnostics["working_set"], res.diagnostics["last_z"]
    ref = _independent_17(X, L, omega, z, C, lam, m, l_, M)
    assert _ours(X, L, omega, z, C, lam, m, l_, M) == pytest.approx(ref, rel=1e-5)
    rng = np.random.default_rng(1)
    z2 = rng.integers(0, M, n)
    om2 = rng.integers(-1, M, (2, n))
    assert _ours(X, L, om2, z2, C, lam, m, l_, M) == pytest.approx(
        _independent_17(X, L, om2, z2, C, lam, m, l_, M), rel=1e-5)
    assert res.objective == pytest.approx(objective(X, L, res.v, 0.0, res.sigma, res.xi, C=C, lambda_=lam))


# ------------------------------------------------------------------------------------------ (b) Proposition 4
@pytest.mark.parametrize("M", [2, 3])
def test_result_satisfies_proposition_4(M):
    centres = [[4.0, 0.0], [-4.0, 0.0], [0.0, 6.0]][:M]
    X, y = _blobs(12, centres, 7, seed=3)
    n = X.shape[0]
    eps = 1e-2
    res = m3fs_faithful(X, n_features=2, C=5.0, lambda_=1e-3, epsilon=eps, n_clusters=M)
    assert res.diagnostics["converged"]
    assert res.diagnostics["prop4_violation"] <= 1e-9
    if M == 2:
        f = X @ res.v + res.b
        margin = np.abs(f)
        assert abs(f.sum()) <= res.diagnostics["l"] + 1e-6
    else:
        F = X @ res.v.T
        top2 = np.sort(F, axis=1)[:, -2:]
        margin = top2[:, 1] - top2[:, 0]
    # every c in {0,1}^n (or {0, e_1..e_M}^n): 1/n sum c_i margin_i >= 1/n sum c_i - (xi + eps); the worst c
    # is Proposition 3's / 8's, and random ones are checked too
    worst = np.sum(np.maximum(0.0, 1 - margin)) / n
    assert worst <= res.xi + eps + 1e-9
    rng = np.random.default_rng(0)
    for _ in range(200):
        c = rng.random(n) < 0.5
        assert np.sum(c * margin) / n >= c.sum() / n - (res.xi + eps) - 1e-9
    _, loss = most_violated(F if M > 2 else f, M)
    assert loss == pytest.approx(worst)
    assert clustering_accuracy(y, res.labels) == 1.0
    assert np.all((res.sigma >= 0) & (res.sigma <= 1)) and res.sigma.sum() == pytest.approx(2)


# ------------------------------------------------------------------------------------------ (d), (e) the paper
def test_iris_with_noise_selects_the_four_real_features():
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    rng = np.random.default_rng(0)
    X = np.hstack([_standardise(X), rng.normal(size=(150, 10))])
    res = m3fs_faithful(X, n_features=4, C=1.0, lambda_=0.0, n_clusters=3)
    assert sorted(res.selected.tolist()) == [0, 1, 2, 3]
    assert res.sigma[:4].min() > 0.5
    assert res.sigma[4:].max() < 1e-3 * res.sigma.max()
    assert res.diagnostics["converged"]


def test_digits1v7_ten_features_cluster_perfectly():
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    keep = (y == 1) | (y == 7)
    res = m3fs_faithful(_standardise(X[keep]), n_features=10, C=1.0, lambda_=1e-3)
    assert clustering_accuracy(y[keep], res.labels) == 1.0
    assert res.selected.shape == (10,)
    assert res.diagnostics["prop4_violation"] <= 0


# ------------------------------------------------------------------------------------------ parameters
@pytest.mark.parametrize(("kw", "match"), [
    ({"n_features": 0}, "'n_features' parameter of m3fs_faithful"),
    ({"n_features": 9}, "'n_features' parameter of m3fs_faithful"),
    ({"n_features": 2, "C": 0.0}, "'C' parameter"),
    ({"n_features": 2, "lambda_": -1.0}, "'lambda_' parameter"),
    ({"n_features": 2, "n_clusters": 1}, "'n_clusters' parameter"),
    ({"n_features": 2, "epsilon": 0}, "'epsilon' parameter"),
    ({"n_features": 2, "graph": "full"}, "'graph' parameter"),
])
def test_bad_parameters(kw, match):
    X = np.random.default_rng(0).normal(size=(10, 8))
    with pytest.raises(ParameterError, match=match):
        m3fs_faithful(X, **kw)
