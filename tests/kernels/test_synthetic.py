"""The synthetic generator's numba kernels (``dufs.kernels.synthetic``) on their own, against direct formulas and
SciPy."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dufs.kernels.synthetic import fill_power_law_rows, power_law_rank, row_dot_sparse_weights


def test_power_law_rank_is_the_inverse_cdf():
    n, s = 1000, 1.1
    span = (n + 1.0) ** (1 - s) - 1
    assert power_law_rank(0.0, n, 1 - s, span, np.log(n + 1.0)) == 0
    assert power_law_rank(1.0 - 1e-16, n, 1 - s, span, np.log(n + 1.0)) == n - 1
    # u at the CDF of x = 3 is rank 2
    u = (3.0 ** (1 - s) - 1) / span
    assert power_law_rank(u + 1e-12, n, 1 - s, span, np.log(n + 1.0)) == 2
    assert power_law_rank(0.5, n, 0.0, 0.0, np.log(n + 1.0)) == int(np.sqrt(n + 1.0)) - 1  # s = 1


def test_fill_rows_resumes_when_the_pool_runs_out():
    counts = np.array([5, 3, 4], dtype=np.int64)
    indptr = np.zeros(4, dtype=np.int64)
    indices = np.empty(12, dtype=np.int32)
    pool = np.linspace(0.0, 0.99, 7)
    law = (100, 0.0, 0.0, np.log(101.0))  # n = 100, s = 1
    row = fill_power_law_rows(counts, pool, 0, indptr, indices, *law, 1, 0, 4, 64)
    assert row == 1 and indptr[1] == 5  # the first row fitted, the second ran out
    pool = np.random.default_rng(0).random(500)
    row = fill_power_law_rows(counts, pool, row, indptr, indices, *law, 1, 0, 4, 64)
    assert row == 3
    np.testing.assert_array_equal(np.diff(indptr), counts)


def test_row_dot_sparse_weights_matches_scipy():
    rng = np.random.default_rng(0)
    X = sp.random_array((50, 40), density=0.2, format="csr", random_state=rng)
    X.sort_indices()
    ids = np.array([1, 5, 17, 39])
    w = rng.standard_normal(4)
    dense_w = np.zeros(40)
    dense_w[ids] = w
    got = row_dot_sparse_weights(X.indptr.astype(np.int64), X.indices.astype(np.int32), ids, w)
    np.testing.assert_allclose(got, (X != 0).astype(np.float64) @ dense_w)
