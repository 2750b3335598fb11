"""The per-cluster reductions against dense NumPy."""

import numpy as np
import pytest

from dufs.kernels.clusters import cluster_means, kmeans_term


@pytest.mark.parametrize("p", [1, 3, 10])
def test_cluster_means_and_kmeans_term_are_numpys(p):
    rng = np.random.default_rng(p)
    n, c = 500, 6
    Y = rng.standard_normal((n, p)) * 3.0 + 1.0
    labels = rng.integers(0, c - 1, size=n)  # cluster c - 1 stays empty
    C, counts = cluster_means(Y, labels, c)
    np.testing.assert_array_equal(counts, [np.sum(labels == k) for k in range(c)])
    for k in range(c - 1):
        np.testing.assert_allclose(C[k], Y[labels == k].mean(axis=0), rtol=1e-13, atol=1e-13)
    assert np.all(np.isnan(C[c - 1]))
    G = rng.standard_normal((c, p))
    ref = float(np.sum((Y - G[labels]) ** 2))
    assert kmeans_term(Y, labels, G) == pytest.approx(ref, rel=1e-12)
