"""kNN graphs equal scikit-learn's kneighbors_graph, symmetrised as He et al. eq. (2)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.neighbors import kneighbors_graph

from dufs.data.datasets import load
from dufs.engine.graphs import knn_graph, laplacian
from dufs.errors import ParameterError


def _reference(X, k, heat_t=None):
    A = kneighbors_graph(X, k, mode="distance", include_self=False)
    A = sp.csr_array(A)
    if heat_t is None:
        A.data[:] = 1.0
    else:
        A.data = np.exp(-(A.data ** 2) / heat_t)
    return A.maximum(A.T)


@pytest.mark.parametrize("k", [1, 4, 5])
@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_binary_knn_equals_sklearn(k, kind):
    rng = np.random.default_rng(k)
    X = rng.standard_normal((230, 12))
    if kind == "sparse":
        X = sp.random_array((230, 40), density=0.3, rng=rng, format="csr")
    W = knn_graph(X, k, block_rows=64)
    R = _reference(X, k)
    assert abs(W - R).max() == 0
    assert (W != W.T).nnz == 0 and W.diagonal().max() == 0


def test_heat_knn_equals_sklearn_on_real_data():
    X, _ = load("coil20")
    X = X[:300]
    W = knn_graph(X, 5, weights="heat", t=50.0, block_rows=100)
    R = _reference(X, 5, heat_t=50.0)
    assert (W != 0).sum() == (R != 0).sum()
    np.testing.assert_allclose(W.toarray(), R.toarray(), rtol=1e-9, atol=1e-12)


def test_laplacians():
    rng = np.random.default_rng(0)
    W = knn_graph(rng.standard_normal((50, 3)), 3)
    L, d = laplacian(W)
    assert np.allclose(L.toarray(), np.diag(W.toarray().sum(1)) - W.toarray())
    Ln, _ = laplacian(W, normed=True)
    Dm = np.diag(1 / np.sqrt(d))
    assert np.allclose(Ln.toarray(), np.eye(50) - Dm @ W.toarray() @ Dm)


def test_bad_parameters():
    X = np.zeros((5, 2))
    with pytest.raises(ParameterError, match="'n_neighbors' parameter of knn_graph"):
        knn_graph(X, 5)
    with pytest.raises(ParameterError, match="'weights'"):
        knn_graph(X, 2, weights="cosine")
