"""Filter scores equal independent dense NumPy implementations of the papers' definitions on bundled real sets."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.neighbors import kneighbors_graph

from dufs.data.datasets import load
from dufs.engine import Matrix
from dufs.methods.filters import correlation_scores, fisher_scores, laplacian_scores, variance_scores


@pytest.fixture(scope="module", params=["basehock", "coil20"])
def real(request):
    X, y = load(request.param)
    if request.param == "coil20":
        X = X[::3]  # 480 samples
        y = y[::3]
    else:
        X = X[::3, :1500]  # both classes (the rows are sorted by class)
        y = y[::3]
    Xd = X.toarray() if sp.issparse(X) else np.asarray(X)
    return sp.csr_array(Xd), Xd, y.astype(np.float64)


def test_variance(real):
    X, Xd, _ = real
    np.testing.assert_allclose(variance_scores(Matrix(X, block_width=97)), Xd.var(axis=0), rtol=1e-10, atol=1e-12)


def _eta(Xd, y):
    """The correlation ratio as the root of R^2 of each feature's least-squares fit on the one-hot classes."""
    H = (y[:, None] == np.unique(y)[None, :]).astype(float)
    coef, *_ = np.linalg.lstsq(H, Xd, rcond=None)
    res = ((Xd - H @ coef) ** 2).sum(axis=0)
    tot = ((Xd - Xd.mean(axis=0)) ** 2).sum(axis=0)
    return np.where(tot > 1e-12 * np.maximum((Xd ** 2).sum(axis=0), 1e-300), np.sqrt(np.clip(1 - res / np.where(
        tot > 0, tot, 1), 0, 1)), 0.0)


def test_correlation(real):
    """|Pearson correlation| on two classes, the correlation ratio (root of R^2 on the class indicators) on more;
    the two agree on two classes."""
    X, Xd, y = real
    want = np.zeros(Xd.shape[1])
    for j in range(Xd.shape[1]):
        if Xd[:, j].std() > 0:
            want[j] = abs(np.corrcoef(Xd[:, j], y)[0, 1])
    if np.unique(y).size > 2:
        want = _eta(Xd, y)
    else:
        np.testing.assert_allclose(_eta(Xd, y), want, rtol=1e-7, atol=1e-9)
    got = correlation_scores(Matrix(X, block_width=211, standardize="zscore"), y)
    np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-9)


def test_correlation_with_a_continuous_target_is_pearson(real):
    X, Xd, _ = real
    t = np.random.default_rng(0).standard_normal(Xd.shape[0]) + Xd[:, :5].sum(axis=1)
    want = np.array([abs(np.corrcoef(Xd[:, j], t)[0, 1]) if Xd[:, j].std() > 0 else 0.0
                     for j in range(Xd.shape[1])])
    got = correlation_scores(Matrix(X, block_width=211), t)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_fisher(real):
    X, Xd, y = real
    mu = Xd.mean(axis=0)
    sb = np.zeros(Xd.shape[1])
    sw = np.zeros(Xd.shape[1])
    for c in np.unique(y):
        Xc = Xd[y == c]
        sb += len(Xc) * (Xc.mean(axis=0) - mu) ** 2
        sw += len(Xc) * Xc.var(axis=0)
    want = np.where(sw > 0, sb / np.where(sw > 0, sw, 1), np.where(sb > 0, np.inf, 0.0))
    got = fisher_scores(Matrix(X, block_width=128), y)
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-12)


def _eq3(Xd, Wd):
    Dd = np.diag(Wd.sum(axis=1))
    Ld = Dd - Wd
    one = np.ones(len(Xd))
    want = np.empty(Xd.shape[1])
    for j in range(Xd.shape[1]):
        f = Xd[:, j]
        ft = f - (f @ Dd @ one) / (one @ Dd @ one) * one  # He et al. 2005, eq. (3)
        den = ft @ Dd @ ft
        want[j] = (ft @ Ld @ ft) / den if den > 1e-12 * max(f @ Dd @ f, 1e-300) else np.inf
    return want


def _sk_graph(Xd):
    A = sp.csr_array(kneighbors_graph(Xd, 5, mode="connectivity", include_self=False))
    return A.maximum(A.T)


def test_laplacian_score_equals_eq3_in_sample_space(real):
    """On the same graph (text data has many tied distances, so kNN graphs may legitimately differ)."""
    X, Xd, _ = real
    W = _sk_graph(Xd)
    want = _eq3(Xd, W.toarray())
    got = laplacian_scores(Matrix(X, block_width=300), W)
    fin = np.isfinite(want)
    assert np.array_equal(fin, np.isfinite(got))
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-8, atol=1e-10)


def test_laplacian_score_default_graph_on_continuous_data():
    X, _ = load("coil20")
    Xd = np.asarray(X[::4])
    want = _eq3(Xd, _sk_graph(Xd).toarray())
    got = laplacian_scores(Matrix(sp.csr_array(Xd), block_width=256))
    fin = np.isfinite(want)
    assert np.array_equal(fin, np.isfinite(got))
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("method", ["variance", "correlation", "fisher"])
def test_many_features_keep_float32_scores_and_rank_the_head_in_float64(real, method):
    """Above dufs.engine.driver-features the driver holds the scores as float32, while the k best come from the
    blocks' float64 scores merged on the driver: the head is the dense reference's, by its float64 values."""
    import dask

    from dufs.methods.filters import correlation_ranked, fisher_ranked, variance_ranked

    X, Xd, y = real
    if method == "variance":
        want = Xd.var(axis=0)
    elif method == "fisher":
        want = np.asarray(fisher_scores(Matrix(X), y))  # checked against the dense formula in test_fisher
    else:
        want = _eta(Xd, y)
    ranked = {"variance": lambda M: variance_ranked(M, 40), "correlation": lambda M: correlation_ranked(M, y, 40),
              "fisher": lambda M: fisher_ranked(M, y, 40)}[method]
    with dask.config.set({"dufs.engine.driver-features": 0}):
        scores, top = ranked(Matrix(X, block_width=97, standardize="zscore"))
    assert scores.dtype == np.float32
    np.testing.assert_allclose(scores, want.astype(np.float32), rtol=1e-6, atol=1e-9)
    key = np.where(np.isnan(want), -np.inf, want)
    order = np.lexsort((np.arange(key.size), -np.round(key, 9)))
    np.testing.assert_array_equal(np.sort(np.round(key[top], 9))[::-1], np.round(key[order[:40]], 9))
