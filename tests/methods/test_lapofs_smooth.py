"""LapAOFS and LapDOFS on sparse counts (docs/methods.md, "What they read"): the smooth design columns and the
normalised graph against dense NumPy references, the whole selection against the paper's own sample-space scheme
run on those columns (tests/methods/greedy_paper.py), and the planted features they recover."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import dufs
from dufs.data.synthetic import make_signature_counts
from dufs.engine import Matrix
from dufs.engine.graphs import anchor_graph
from dufs.methods.greedy.lapofs import normalized_graph, smooth_columns
from tests.methods.greedy_paper import knn_affinity, lapaofs_paper, lapdofs_paper

REF = {"lapaofs": lapaofs_paper, "lapdofs": lapdofs_paper}


def _counts(n=70, d=120, seed=0):
    """Sparse non-negative counts, about 5% nonzero (an empty and a constant column: the edge cases)."""
    rng = np.random.default_rng(seed)
    X = sp.random_array((n, d), density=0.03, rng=seed, format="lil")
    X[:, 0] = 0.0   # an empty column
    X[:, 1] = 2.0   # a constant one
    for i in range(n):  # two groups of rows, each raising its own four features
        for f in range(4 * (i % 2) + 2, 4 * (i % 2) + 6):
            if rng.random() < 0.7:
                X[i, f] = float(rng.integers(1, 4))
    return sp.csr_array(X)


def _smooth_dense(X, W):
    """(centre, coef): centre = X^T d / 1^T d, ||coef (f - centre)||^2 = f~^T W f~ / f^T L f (0 where that is not
    positive, and for constants)."""
    X, W = np.asarray(X.toarray() if sp.issparse(X) else X, dtype=np.float64), np.asarray(W, dtype=np.float64)
    d = W.sum(axis=1)
    L = np.diag(d) - W
    centre = X.T @ d / d.sum()
    Xt = X - centre[None, :]
    den = np.einsum("ij,i,ij->j", Xt, d, Xt)
    num = np.einsum("ij,ij->j", X, L @ X)
    ff = np.einsum("ij,ij->j", Xt, Xt)
    smooth = np.einsum("ij,ij->j", Xt, W @ Xt)  # f~^T W f~
    num = np.maximum(num, 1e-6 * den)
    coef = np.zeros(X.shape[1])
    ok = (den > 1e-9) & (smooth > 0)
    coef[ok] = np.sqrt(smooth[ok] / num[ok] / ff[ok])
    return centre, coef


def _normalized_dense(W):
    """D^-1/2 W D^-1/2."""
    s = 1.0 / np.sqrt(W.sum(axis=1))
    return s[:, None] * W * s[None, :]


def test_smooth_columns_match_a_dense_reference():
    X = _counts()
    W = knn_affinity(X.toarray(), 4)
    centre, coef = smooth_columns(Matrix(X, block_width=10), sp.csr_array(W))
    ref_c, ref_k = _smooth_dense(X, W)
    np.testing.assert_allclose(centre, ref_c, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(coef, ref_k, rtol=1e-10, atol=1e-14)
    assert coef[0] == 0.0 and coef[1] == 0.0  # the empty and the constant column
    # ||z||^2 is 1 / the Laplacian score - 1: the planted features (smooth on the two groups) lead
    Xd = X.toarray()
    energy = coef ** 2 * ((Xd - centre) ** 2).sum(axis=0)
    assert set(np.argsort(-energy)[:8]) == set(range(2, 10))


def test_smooth_columns_on_an_anchor_graph_match_its_dense_affinity():
    X = _counts(n=120, seed=1)
    G = anchor_graph(Matrix(X), 12, 3, embed_dim=8, random_state=0)
    Zh = G.Zh.toarray() if sp.issparse(G.Zh) else np.asarray(G.Zh)
    W = Zh @ np.diag(np.asarray(G.lam_inv, dtype=np.float64)) @ Zh.T
    centre, coef = smooth_columns(Matrix(X, block_width=16), G)
    ref_c, ref_k = _smooth_dense(X, W)
    np.testing.assert_allclose(centre, ref_c, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(coef, ref_k, rtol=1e-8, atol=1e-14)
    assert normalized_graph(G) is G  # degrees 1 already
    np.testing.assert_allclose(W.sum(axis=1), 1.0, rtol=1e-10)


def test_normalized_graph_matches_a_dense_reference():
    X = _counts(n=90, seed=2)
    W = knn_affinity(X.toarray(), 4)
    np.testing.assert_allclose(normalized_graph(sp.csr_array(W)).toarray(), _normalized_dense(W), rtol=1e-14,
                               atol=0)


@pytest.mark.parametrize("method", ["lapaofs", "lapdofs"])
def test_the_smooth_design_is_the_papers_scheme_on_the_smooth_columns(method):
    """``columns="smooth"`` picks what the paper's sample-space algorithm picks on the columns centred and scaled
    as :func:`_smooth_dense` says, with the Laplacian of D^-1/2 W D^-1/2."""
    X = _counts(n=80, seed=3)
    W = knn_affinity(X.toarray(), 4)  # any graph given: the same one for both
    sel = dufs.fit(X, method=method, n_features=12, W=sp.csr_array(W), client=False, columns="smooth")
    assert sel.diagnostics["columns"] == "smooth"
    centre, coef = _smooth_dense(X, W)
    ref = REF[method]((X.toarray() - centre) * coef, _normalized_dense(W), 12, 0.01, 0.01)
    np.testing.assert_array_equal(np.asarray(sel.indices), ref.order)
    np.testing.assert_allclose(sel.diagnostics["criterion"], ref.criterion, rtol=1e-8)


def test_the_papers_columns_are_the_default_even_on_counts():
    """The smooth columns are as good as the graph's clusters: on real text sets whose graph does not follow the
    classes (PCMAC) they were at chance, below variance, so the paper's design stays the default (test_defaults)."""
    for X in (_counts(), np.random.default_rng(0).standard_normal((60, 20))):
        sel = dufs.fit(X, method="lapaofs", n_features=3, client=False)
        assert sel.diagnostics["columns"] == "raw"


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("method", ["lapaofs", "lapdofs"])
def test_smooth_columns_find_the_planted_signature_features(method, seed):
    """Issue 58's kind of data, 2,000 x 4,000: the planted signature features of five clusters of unequal size.
    The smooth columns put most of them in the top 100, every cluster among them, well above ranking by variance;
    the paper's reading (raw columns, the default) does no better than variance."""
    X, _, planted = make_signature_counts(2000, 4000, 5, seed=seed)
    Xc = X.tocsc()
    mean = np.asarray(Xc.mean(axis=0)).ravel()
    var = np.asarray(Xc.multiply(Xc).mean(axis=0)).ravel() - mean ** 2
    by_variance = int(np.isin(planted, np.argsort(-var, kind="stable")[:100]).sum())
    sel = dufs.fit(X, method=method, n_features=100, client=False, columns="smooth")
    found = np.isin(planted, sel.indices)
    assert found.sum() >= 75 and found.sum() >= by_variance + 20, (found.sum(), by_variance)
    assert found.any(axis=1).all()
    paper = dufs.fit(X, method=method, n_features=100, client=False)
    assert np.isin(planted, paper.indices).sum() <= by_variance + 2
