"""The dense reference of tests/methods/greedy_paper.py is right: every greedy pick is the best candidate by the
objective recomputed from scratch (explicit inverses and determinants), and the criterion / objective identities it
reports hold; its kNN graph is scikit-learn's, its embedding SciPy's."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sla
import scipy.sparse as sp
from scipy.sparse.csgraph import laplacian as csgraph_laplacian

from tests.methods.greedy_paper import (
    inverse_scatter,
    jcfs_embedding_dense,
    jcfs_greedy_paper,
    jcfs_paper,
    knn_affinity,
    lapaofs_paper,
    lapdofs_paper,
    laplacian_dense,
)

REL = 1e-9


def _data(seed, n=40, d=20):
    rng = np.random.default_rng(seed)
    # a few correlated directions so that picks interact
    Z = rng.standard_normal((n, 4))
    X = Z @ rng.standard_normal((4, d)) + 0.5 * rng.standard_normal((n, d))
    return X


def _assert_best(values, pick, minimize=True, rel=REL):
    """``pick`` is the best candidate of ``values`` (a dict id -> value); exactly the argmin/argmax unless the
    runner-up is within rounding."""
    ids = np.array(sorted(values))
    v = np.array([values[i] for i in ids])
    if not minimize:
        v = -v
    best = v.min()
    scale = max(abs(best), 1.0)
    assert v[ids == pick][0] <= best + rel * scale
    gap = np.sort(v)[1] - best if v.size > 1 else np.inf
    if gap > 1e-7 * scale:
        assert ids[np.argmin(v)] == pick


def _H(X, B, S, lambda2):
    XS = X[:, S]
    return XS.T @ B @ XS + lambda2 * np.eye(len(S))


@pytest.mark.parametrize("seed,n,d,lam1,lam2", [(0, 40, 20, 0.01, 0.01), (1, 55, 18, 0.3, 0.05),
                                                 (2, 30, 25, 1.0, 1.0)])
def test_lapaofs_picks_minimise_the_trace_of_H_inverse(seed, n, d, lam1, lam2):
    X = _data(seed, n, d)
    W = knn_affinity(X, 4)
    k = min(12, d)
    res = lapaofs_paper(X, W, k, lam1, lam2)
    B = np.eye(n) + lam1 * laplacian_dense(W)
    M = lam2 * np.linalg.inv(B)
    S: list[int] = []
    prev = 0.0
    for t in range(k):
        vals = {g: np.trace(np.linalg.inv(_H(X, B, S + [g], lam2))) for g in range(d) if g not in S}
        p = int(res.order[t])
        _assert_best(vals, p, minimize=True)
        # the objective is Tr(H^-1), eq. (14) against the direct k x k inverse
        assert res.objective[t] == pytest.approx(vals[p], rel=REL)
        # the criterion is eq. (20) with an explicitly inverted A_t = M + X_S X_S^T
        A = M + X[:, S] @ X[:, S].T
        u = np.linalg.solve(A, X[:, p])
        direct = u @ M @ u / (1.0 + X[:, p] @ u)
        assert res.criterion[t] == pytest.approx(direct, rel=REL)
        # and the identity Tr(H_{S+g}^-1) - Tr(H_S^-1) = (1 - criterion) / lambda2
        assert vals[p] - prev == pytest.approx((1.0 - res.criterion[t]) / lam2, rel=1e-8, abs=1e-9 / lam2)
        prev = vals[p]
        S.append(p)
    assert len(set(res.order.tolist())) == k


@pytest.mark.parametrize("seed,n,d,lam1,lam2", [(3, 40, 20, 0.01, 0.01), (4, 60, 15, 0.5, 0.1)])
def test_lapdofs_picks_maximise_det_H(seed, n, d, lam1, lam2):
    X = _data(seed, n, d)
    W = knn_affinity(X, 5, weights="heat")
    k = 12
    res = lapdofs_paper(X, W, k, lam1, lam2)
    B = np.eye(n) + lam1 * laplacian_dense(W)
    M = lam2 * np.linalg.inv(B)
    S: list[int] = []
    for t in range(k):
        vals = {}
        for g in range(d):
            if g not in S:
                sign, ld = np.linalg.slogdet(_H(X, B, S + [g], lam2))
                assert sign > 0
                vals[g] = ld
        p = int(res.order[t])
        _assert_best(vals, p, minimize=False)
        assert res.objective[t] == pytest.approx(vals[p], rel=REL)
        A = M + X[:, S] @ X[:, S].T
        direct = X[:, p] @ np.linalg.solve(A, X[:, p])
        assert res.criterion[t] == pytest.approx(direct, rel=REL)
        # eq. (28): det H_{t+1} = lambda2 (1 + criterion) det H_t
        sa, la = np.linalg.slogdet(A + np.outer(X[:, p], X[:, p]))
        sm, lm = np.linalg.slogdet(M)
        assert res.objective[t] == pytest.approx((t + 1) * np.log(lam2) + la - lm, rel=1e-8)
        S.append(p)


def _orthonormal(rng, n, c):
    Q, _ = np.linalg.qr(rng.standard_normal((n, c)))
    return Q


@pytest.mark.parametrize("seed,n,d,c,gamma", [(5, 40, 20, 3, 1e-4), (6, 50, 25, 5, 1e-2), (7, 30, 16, 2, 1.0)])
def test_jcfs_greedy_picks_minimise_the_fisher_trace(seed, n, d, c, gamma):
    rng = np.random.default_rng(seed)
    X = _data(seed, n, d)
    Y = _orthonormal(rng, n, c)
    k = 12
    res = jcfs_greedy_paper(X, Y, k, gamma)
    S: list[int] = []
    prev = np.trace(Y.T @ Y) / gamma
    for t in range(k):
        vals = {}
        for g in range(d):
            if g not in S:
                XS = X[:, S + [g]]
                A = XS @ XS.T + gamma * np.eye(n)
                vals[g] = np.trace(Y.T @ sla.solve(A, Y, assume_a="pos"))
        p = int(res.order[t])
        _assert_best(vals, p, minimize=True)
        assert res.objective[t] == pytest.approx(vals[p], rel=REL)
        # criterion = eq. (14) with M_t inverted explicitly; and objective_{t} = objective_{t-1} - criterion
        Mt = np.linalg.inv(X[:, S] @ X[:, S].T + gamma * np.eye(n))
        u = Mt @ X[:, p]
        direct = (u @ Y) @ (Y.T @ u) / (1.0 + X[:, p] @ u)
        assert res.criterion[t] == pytest.approx(direct, rel=1e-8)
        assert prev - res.objective[t] == pytest.approx(res.criterion[t], rel=1e-8, abs=1e-9 * prev)
        prev = res.objective[t]
        S.append(p)


def test_ties_go_to_the_lowest_index():
    # orthonormal candidate columns and no graph: every candidate scores exactly the same at every step
    n, d, k = 12, 8, 5
    X = np.eye(n)[:, :d] * 2.0
    W = np.zeros((n, n))
    for f in (lapaofs_paper, lapdofs_paper):
        assert f(X, W, k).order.tolist() == list(range(k))
    Y = np.ones((n, 1)) / np.sqrt(n)
    assert jcfs_greedy_paper(X, Y, k).order.tolist() == list(range(k))
    # duplicated columns change nothing but the names of the picks (a pick's twin scores ~0 afterwards)
    X2 = _data(8, 30, 10)
    W2 = knn_affinity(X2, 4)
    base = lapdofs_paper(X2, W2, 6).order
    dup = lapdofs_paper(np.hstack([X2, X2[:, :3]]), W2, 6).order
    np.testing.assert_array_equal(np.where(dup >= 10, dup - 10, dup), base)


def test_zero_columns_and_sparse_input():
    X = _data(9, 36, 14)
    X[:, 3] = 0.0
    W = knn_affinity(X, 4)
    a = lapaofs_paper(X, W, 13)
    assert 3 not in a.order.tolist()
    b = lapaofs_paper(sp.csr_array(X), sp.csr_array(W), 13)
    np.testing.assert_array_equal(a.order, b.order)
    np.testing.assert_allclose(a.objective, b.objective, rtol=1e-12)


def _sk_graph(X, k, mode):
    from sklearn.neighbors import kneighbors_graph

    A = kneighbors_graph(X, k, mode=mode, include_self=False)
    return A


@pytest.mark.parametrize("seed,n,d,k", [(10, 40, 6, 4), (11, 60, 20, 5), (12, 35, 3, 1), (13, 50, 10, 9)])
def test_knn_affinity_is_sklearns_symmetrised_graph(seed, n, d, k):
    pytest.importorskip("sklearn")
    X = np.random.default_rng(seed).standard_normal((n, d))
    A = _sk_graph(X, k, "connectivity")
    expect = A.maximum(A.T).toarray()
    W = knn_affinity(X, k)
    np.testing.assert_array_equal(W, expect)
    assert np.all(np.diag(W) == 0) and np.array_equal(W, W.T)
    # heat weights: exp(-d^2 / t) on the same edges, t the mean squared distance of the kNN lists
    Ad = _sk_graph(X, k, "distance").tocoo()
    t = np.mean(Ad.data ** 2)
    E = sp.coo_array((np.exp(-Ad.data ** 2 / t), (Ad.row, Ad.col)), shape=(n, n)).tocsr()
    Wh = knn_affinity(X, k, weights="heat")
    np.testing.assert_allclose(Wh, E.maximum(E.T).toarray(), rtol=1e-10, atol=0)
    np.testing.assert_allclose(knn_affinity(X, k, weights="heat", t=2.5)[W > 0],
                               np.exp(-np.where(W > 0, _sqdist(X), 0) / 2.5)[W > 0], rtol=1e-12)


def _sqdist(X):
    return ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)


def test_knn_affinity_ties_go_to_the_lower_index():
    # sample 0 at 0 has samples 1 (at 1) and 2 (at -1) equally near: it takes 1; 2 and 3 are each other's nearest,
    # so the edge 0 ~ 2 exists only if the tie went to the higher index
    W = knn_affinity(np.array([[0.0], [1.0], [-1.0], [-1.5]]), 1)
    expect = np.zeros((4, 4))
    expect[0, 1] = expect[1, 0] = expect[2, 3] = expect[3, 2] = 1
    np.testing.assert_array_equal(W, expect)


@pytest.mark.parametrize("S", [[], [0, 3, 7], list(range(12))])
@pytest.mark.parametrize("lam,gamma", [(1e-4, 1e-4), (0.5, 0.1)])
def test_jcfs_embedding_equals_scipy_eigh(S, lam, gamma):
    X = _data(14, 45, 16)
    W = knn_affinity(X, 5)
    c = 4
    Y, vals = jcfs_embedding_dense(X, S, W, c, lam, gamma)
    L = csgraph_laplacian(W, normed=True)
    np.testing.assert_allclose(L, laplacian_dense(W, normed=True), atol=1e-14)
    XS = X[:, S]
    Minv = np.linalg.inv(XS @ XS.T + gamma * np.eye(45))
    np.testing.assert_allclose(inverse_scatter(X, S, gamma), Minv, rtol=0, atol=1e-8 * np.abs(Minv).max())
    K = L + lam * Minv
    K = (K + K.T) / 2
    ev = sla.eigh(K, eigvals_only=True, subset_by_index=[0, c - 1])
    np.testing.assert_allclose(vals, ev, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(Y.T @ Y, np.eye(c), atol=1e-12)
    np.testing.assert_allclose(K @ Y, Y * vals, atol=1e-8)


def test_jcfs_paper_alternates_until_the_selection_repeats():
    X = _data(15, 50, 20)
    W = knn_affinity(X, 5)
    lam, gamma, m, c = 1e-3, 1e-4, 6, 3
    res = jcfs_paper(X, W, m, c, lam, gamma, max_iter=20)
    # the first pass is the greedy step on the embedding of the empty selection (M = I / gamma)
    Y0, _ = jcfs_embedding_dense(X, [], W, c, lam, gamma)
    np.testing.assert_array_equal(res.selections[0], jcfs_greedy_paper(X, Y0, m, gamma).order)
    # every later pass uses the embedding of the previous selection
    for a, b in zip(res.selections, res.selections[1:], strict=False):
        Y, _ = jcfs_embedding_dense(X, a, W, c, lam, gamma)
        np.testing.assert_array_equal(b, jcfs_greedy_paper(X, Y, m, gamma).order)
    assert res.iterations == len(res.selections)
    if res.iterations < 20:
        assert set(res.selections[-1].tolist()) == set(res.selections[-2].tolist())
    np.testing.assert_array_equal(res.order, res.selections[-1])
    one = jcfs_paper(X, W, m, c, lam, gamma, max_iter=1)
    assert one.iterations == 1
    np.testing.assert_array_equal(one.order, res.selections[0])
