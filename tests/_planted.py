"""Small planted data sets shared by tests."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def planted_dense(seed=0, n=240, d=60):
    """Dense data, 3 groups of rows shifted on 4 features each (0-11), the rest noise."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    g = np.arange(n) % 3
    for k in range(3):
        X[g == k, 4 * k:4 * k + 4] += 3.0
    return X


def planted_counts(n, d, seed, density, n_big, big):
    """Sparse non-negative counts (lil): background at ``density`` times 3, 3 groups of rows sharing 6 features each
    (counts 1 + Poisson(0.3) on 35% of the group's rows), and ``n_big`` counts of ``big``."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    X = sp.random(n, d, density=density, random_state=seed, format="lil") * 3.0
    for g in range(3):
        rows = np.arange(g, n, 3)
        for j in range(6 * g, 6 * g + 6):
            hit = rows[rng.random(rows.size) < 0.35]
            X[hit, j] = 1.0 + rng.poisson(0.3, hit.size)
    hits = rng.choice(n * d, n_big, replace=False)
    X[hits // d, hits % d] = big
    return X, rng


def two_groups_sparse(n, d, seed, shifted):
    """n x d standard normal, the first half of the rows shifted by 2 on the first ``shifted`` columns, half the
    entries zeroed at random; CSC."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    X[: n // 2, :shifted] += 2.0
    X[rng.random((n, d)) < 0.5] = 0.0
    return sp.csc_array(X)


def near_pole_problem(seed=0, m=300):
    """A rank-one Q (two clusters, centred) whose second root lies within 1e-9 of the smallest pole, with diagonal
    values over eight decades (the search's eps, relative to the largest, is 4e-8: the root was left at its
    bracket's end, 3e-8 away, and the W step went to LOBPCG; a 40,000 x 80,000 store's W step did so every
    iteration)."""
    rng = np.random.default_rng(seed)
    u = rng.standard_normal(m) * 5.0
    u[0] = 2e-5  # the smallest diagonal value's row nearly out of Q
    Da = np.concatenate([[0.5 + 8e-10, 0.50007], 10.0 ** rng.uniform(2, 7.7, m - 2)])
    return np.column_stack([u, -u]), Da


def three_groups_sparse(n=300, d=800):
    """Three groups of 100 samples, two of them shifted on 10 features of their own: the PCA start's two components
    stand out of the noise, so its subspace iteration ends in about 25 iterations (one group shifted on 5
    features left no gap after the first component: 52 iterations, 104 of the run's 112 passes); UFCM then runs
    3 iterations, as it did on that data."""
    D = sp.random(n, d, density=0.03, random_state=1).toarray()
    D[:100, :10] += 0.5
    D[100:200, 10:20] += 0.5
    return sp.csc_array(D)
