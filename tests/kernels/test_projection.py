"""The anchor graph's hashed random projection preserves norms and distances as a Johnson-Lindenstrauss projection
should, checked statistically against the theory (not against its own output): for sparse signs of variance 1 / p
and fourth moment 3 / p^2, ||x R||^2 / ||x||^2 has mean 1 and variance 2 / p, and the JL tail bound holds."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dufs.kernels.projection import csr_embed, projection_table

P = 64
N_FEATURES = 29_890_095  # kddb's: the hash is of the global feature id, so R's rows there cost nothing


def _rows(n: int, seed: int, power_law: bool = False) -> sp.csr_array:
    """``n`` rows of 30 nonzeros over kddb's feature range, positive counts: feature ids uniform (rows that share
    almost no feature, so that their ratios are independent draws for one R), or power-law (kddb's hubs)."""
    rng = np.random.default_rng(seed)
    cols = (np.minimum((rng.pareto(0.8, size=(n, 30)) * 50).astype(np.int64), N_FEATURES - 1) if power_law
            else rng.integers(0, N_FEATURES, size=(n, 30)))
    cols = np.sort(cols, axis=1)
    vals = rng.integers(1, 5, size=(n, 30)).astype(np.float32)
    X = sp.csr_array((vals.ravel(), cols.ravel(), np.arange(0, 30 * n + 1, 30)), shape=(n, N_FEATURES))
    X.sum_duplicates()
    return X


def _ratio_checks(r: np.ndarray) -> None:
    n = r.shape[0]
    # mean 1 within 4 standard errors; variance 2 / p within 15% (the sample variance's own relative error at this
    # n is about 3%)
    assert abs(r.mean() - 1.0) < 4 * np.sqrt(2.0 / P / n), r.mean()
    assert abs(r.var() / (2.0 / P) - 1.0) < 0.15, r.var() * P / 2
    # the JL tail: P(|ratio - 1| > eps) <= 2 exp(-(eps^2 / 2 - eps^3 / 3) p / 2)
    for eps in (0.3, 0.5):
        bound = 2 * np.exp(-(eps ** 2 / 2 - eps ** 3 / 3) * P / 2)
        assert np.mean(np.abs(r - 1.0) > eps) <= bound, (eps, np.mean(np.abs(r - 1.0) > eps), bound)


def test_hashed_projection_preserves_norms():
    X = _rows(6000, 0)
    E = csr_embed(X.indptr, X.indices, X.data, P, seed=7)
    r = (E ** 2).sum(1) / np.asarray(X.multiply(X).sum(1)).ravel()
    _ratio_checks(r)


def test_hashed_projection_preserves_distances_and_is_linear():
    X = _rows(6001, 1)
    E = csr_embed(X.indptr, X.indices, X.data, P, seed=11)
    # E is X R for R's rows as projection_table gives them (a dense product over the touched features only)
    used = np.unique(X.indices)
    R = projection_table(used, P, 11)
    Xu = X[:, used]
    np.testing.assert_allclose(E, Xu @ R, rtol=1e-10, atol=1e-10)
    # pairs of rows: (x_i - x_j) R = E_i - E_j, so distances are preserved as norms are
    a, b = np.arange(0, 6000, 2), np.arange(1, 6001, 2)
    D = Xu[a] - Xu[b]
    r = ((E[a] - E[b]) ** 2).sum(1) / np.asarray(D.multiply(D).sum(1)).ravel()
    _ratio_checks(r)
    # two seeds give independent projections: their ratios are uncorrelated
    E2 = csr_embed(X.indptr, X.indices, X.data, P, seed=12)
    r1 = (E ** 2).sum(1) / np.asarray(X.multiply(X).sum(1)).ravel()
    r2 = (E2 ** 2).sum(1) / np.asarray(X.multiply(X).sum(1)).ravel()
    assert abs(np.corrcoef(r1, r2)[0, 1]) < 4 / np.sqrt(r1.shape[0])


def test_over_seeds_each_row_of_power_law_data_keeps_its_norm():
    """kddb's rows share hub features, so for one R their ratios are not independent: for a few fixed power-law
    rows the draws are over the seed instead (which also checks that seeds give independent projections)."""
    X = _rows(4, 2, power_law=True)
    sq = np.asarray(X.multiply(X).sum(1)).ravel()
    r = np.stack([(csr_embed(X.indptr, X.indices, X.data, P, seed=s) ** 2).sum(1) / sq for s in range(3000)])
    for i in range(X.shape[0]):
        _ratio_checks(r[:, i])
